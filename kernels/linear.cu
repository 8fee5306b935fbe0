// The linear layer's matrix products (kernels/linear.hpp). Reference: reference/linear.cpp, which states
// the same three products on Eigen matrices in float64; test: tests/linear_test.cpp.
//
// cuBLAS is column-major. A row-major r x c matrix is, to cuBLAS, the column-major c x r matrix of its
// transpose, with leading dimension c; each product below is written for those transposes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cublas_library.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/launch.hpp"
#include "kernels/linear.hpp"

namespace dpcheck::cuda {

void linear_forward(cublasHandle_t h, const float* a, const float* w, float* z, int rows, int in, int out) {
  // z^T (out x rows) = W (out x in) a^T (in x rows); W's column-major view is W^T (in x out), so op T.
  const float one = 1.0f, zero = 0.0f;
  DPCHECK_CUBLAS_CHECK(cublas().Sgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, w, in, a, in, &zero, z, out));
}

void linear_weight_grad(cublasHandle_t h, const float* delta, const float* a, float* gw, int rows, int in, int out,
                        bool accumulate) {
  // gw^T (in x out) = a^T (in x rows) delta (rows x out); delta's column-major view is delta^T, so op T.
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  DPCHECK_CUBLAS_CHECK(
      cublas().Sgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, &one, a, in, delta, out, &beta, gw, in));
}

void linear_input_grad(cublasHandle_t h, const float* delta, const float* w, float* hgrad, int rows, int in, int out) {
  // h^T (in x rows) = W^T (in x out) delta^T (out x rows): both column-major views as they are.
  const float one = 1.0f, zero = 0.0f;
  DPCHECK_CUBLAS_CHECK(
      cublas().Sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, &one, w, in, delta, out, &zero, hgrad, in));
}

// ---- mixed precision ----------------------------------------------------------------------------

namespace {

cudaDataType_t data_type(Precision p) { return p == Precision::bf16 ? CUDA_R_16BF : CUDA_R_16F; }

// C (m x n, column-major, float32) = alpha op(A) op(B) + beta C with 16-bit A and B, float32 accumulation.
void gemm_low(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* a, int lda,
              const void* b, int ldb, float beta, float* c, int ldc, Precision p) {
  const float one = 1.0f;
  DPCHECK_CUBLAS_CHECK(cublas().GemmEx(h, ta, tb, m, n, k, &one, a, data_type(p), lda, b, data_type(p), ldb, &beta, c,
                                       CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

__global__ void round_bf16_kernel(const float* src, __nv_bfloat16* dst, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(blockDim.x) * gridDim.x)
    dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void round_fp16_kernel(const float* src, __half* dst, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(blockDim.x) * gridDim.x)
    dst[i] = __float2half_rn(src[i]);
}

}  // namespace

// The same transposes as the float32 products above.
void linear_forward_low(cublasHandle_t h, const std::uint16_t* a, const std::uint16_t* w, float* z, int rows, int in,
                        int out, Precision p) {
  gemm_low(h, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, w, in, a, in, 0.0f, z, out, p);
}

void linear_weight_grad_low(cublasHandle_t h, const std::uint16_t* delta, const std::uint16_t* a, float* gw, int rows,
                            int in, int out, bool accumulate, Precision p) {
  gemm_low(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, a, in, delta, out, accumulate ? 1.0f : 0.0f, gw, in, p);
}

void linear_input_grad_low(cublasHandle_t h, const std::uint16_t* delta, const std::uint16_t* w, float* hgrad, int rows,
                           int in, int out, Precision p) {
  gemm_low(h, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, w, in, delta, out, 0.0f, hgrad, in, p);
}

void round_to_low(const float* src, std::uint16_t* dst, std::size_t n, Precision p, cudaStream_t s) {
  if (n == 0) return;
  const auto count = static_cast<long long>(n);
  if (p == Precision::bf16)
    round_bf16_kernel<<<grid_for(count), kBlock, 0, s>>>(src, reinterpret_cast<__nv_bfloat16*>(dst), count);
  else round_fp16_kernel<<<grid_for(count), kBlock, 0, s>>>(src, reinterpret_cast<__half*>(dst), count);
  DPCHECK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dpcheck::cuda
