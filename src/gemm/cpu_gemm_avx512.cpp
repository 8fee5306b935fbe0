// The CPU engine's GEMM on AVX-512 F, VL, DQ and BW with FMA:
// src/gemm/cpu_gemm_kernel.inc under this file's flags (CMakeLists.txt).
#define DPCHECK_GEMM_EIGEN EigenIsaAvx512
#define DPCHECK_GEMM_ENTRY gemm_avx512
#include "src/gemm/cpu_gemm_kernel.inc"
