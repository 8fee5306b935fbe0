// The CPU engine's GEMM on the target's baseline instruction set (SSE2 on x86-64), for any CPU:
// src/gemm/cpu_gemm_kernel.inc under this file's flags (CMakeLists.txt).
#define DPCHECK_GEMM_EIGEN EigenIsaBaseline
#define DPCHECK_GEMM_ENTRY gemm_baseline
#include "src/gemm/cpu_gemm_kernel.inc"
