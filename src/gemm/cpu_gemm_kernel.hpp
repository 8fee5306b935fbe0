// The entry points of the per-instruction-set GEMM files (src/gemm/cpu_gemm_kernel.inc, compiled by
// src/gemm/cpu_gemm_baseline.cpp, cpu_gemm_avx2.cpp and cpu_gemm_avx512.cpp), called only by src/gemm/cpu_gemm.cpp.
// Nothing here may name an Eigen type: each of those files renames Eigen's namespace.
#pragma once

#include <cstddef>

namespace dpcheck::cpu::kernel {

// c = (accumulate ? c : 0) + op(a) * op(b) on one thread; the shapes as in dpcheck::cpu::gemm
// (src/gemm/cpu_gemm.hpp), each matrix row-major with its own row stride (ld*), so that a call can take a
// block of rows or columns of a larger product.
struct GemmCall {
  bool trans_a = false, trans_b = false, accumulate = false;
  std::ptrdiff_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  std::ptrdiff_t lda = 0;
  const float* b = nullptr;
  std::ptrdiff_t ldb = 0;
  float* c = nullptr;
  std::ptrdiff_t ldc = 0;
};

void gemm_baseline(const GemmCall& call);
void gemm_avx2(const GemmCall& call);    // only where DPCHECK_GEMM_AVX2 is defined
void gemm_avx512(const GemmCall& call);  // only where DPCHECK_GEMM_AVX512 is defined

}  // namespace dpcheck::cpu::kernel
