// The linear layer's matrix products (kernels/linear.hpp). Reference: reference/linear.cpp, which states
// the same three products on Eigen matrices in float64; test: tests/linear_test.cpp.
//
// cuBLAS is column-major. A row-major r x c matrix is, to cuBLAS, the column-major c x r matrix of its
// transpose, with leading dimension c; each product below is written for those transposes.
#include "kernels/cuda_check.hpp"
#include "kernels/linear.hpp"

namespace dpcheck::cuda {

void linear_forward(cublasHandle_t h, const float* a, const float* w, float* z, int rows, int in, int out) {
  // z^T (out x rows) = W (out x in) a^T (in x rows); W's column-major view is W^T (in x out), so op T.
  const float one = 1.0f, zero = 0.0f;
  DPCHECK_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, w, in, a, in, &zero, z, out));
}

void linear_weight_grad(cublasHandle_t h, const float* delta, const float* a, float* gw, int rows, int in, int out,
                        bool accumulate) {
  // gw^T (in x out) = a^T (in x rows) delta (rows x out); delta's column-major view is delta^T, so op T.
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  DPCHECK_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, in, out, rows, &one, a, in, delta, out, &beta, gw, in));
}

void linear_input_grad(cublasHandle_t h, const float* delta, const float* w, float* hgrad, int rows, int in, int out) {
  // h^T (in x rows) = W^T (in x out) delta^T (out x rows): both column-major views as they are.
  const float one = 1.0f, zero = 0.0f;
  DPCHECK_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, in, rows, out, &one, w, in, delta, out, &zero, hgrad, in));
}

}  // namespace dpcheck::cuda
