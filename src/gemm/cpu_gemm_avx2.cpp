// The CPU engine's GEMM on AVX2 with FMA (-mavx2 -mfma):
// src/gemm/cpu_gemm_kernel.inc under this file's flags (CMakeLists.txt).
#define DPCHECK_GEMM_EIGEN EigenIsaAvx2
#define DPCHECK_GEMM_ENTRY gemm_avx2
#include "src/gemm/cpu_gemm_kernel.inc"
