// The linear layer's three matrix products through cuBLAS SGEMM, for row-major tensors laid out as
// PyTorch lays them out (weight out x in). Reference: reference/linear.cpp; test: tests/linear_test.cpp.
#pragma once

#include <cublas_v2.h>

namespace dpcheck::cuda {

// z (rows x out) = a (rows x in) W^T
void linear_forward(cublasHandle_t h, const float* a, const float* w, float* z, int rows, int in, int out);
// gw (out x in) = delta^T (out x rows) a (rows x in), added to gw when accumulate
void linear_weight_grad(cublasHandle_t h, const float* delta, const float* a, float* gw, int rows, int in, int out,
                        bool accumulate);
// h (rows x in) = delta (rows x out) W
void linear_input_grad(cublasHandle_t h, const float* delta, const float* w, float* hgrad, int rows, int in, int out);

}  // namespace dpcheck::cuda
