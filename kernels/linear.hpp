// The linear layer's three matrix products through cuBLAS SGEMM, for row-major tensors laid out as
// PyTorch lays them out (weight out x in). Reference: reference/linear.cpp; test: tests/linear_test.cpp.
#pragma once

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>

#include "src/low_precision.hpp"

namespace dpcheck::cuda {

// z (rows x out) = a (rows x in) W^T
void linear_forward(cublasHandle_t h, const float* a, const float* w, float* z, int rows, int in, int out);
// gw (out x in) = delta^T (out x rows) a (rows x in), added to gw when accumulate
void linear_weight_grad(cublasHandle_t h, const float* delta, const float* a, float* gw, int rows, int in, int out,
                        bool accumulate);
// h (rows x in) = delta (rows x out) W
void linear_input_grad(cublasHandle_t h, const float* delta, const float* w, float* hgrad, int rows, int in, int out);

// Mixed precision (--precision bf16 or fp16): the same three products through cublasGemmEx on inputs
// already rounded to the format (16-bit patterns, CUDA_R_16BF or CUDA_R_16F), accumulated in float32
// (CUBLAS_COMPUTE_32F) into float32 outputs, as autocast runs them.
void linear_forward_low(cublasHandle_t h, const std::uint16_t* a, const std::uint16_t* w, float* z, int rows, int in,
                        int out, Precision p);
void linear_weight_grad_low(cublasHandle_t h, const std::uint16_t* delta, const std::uint16_t* a, float* gw, int rows,
                            int in, int out, bool accumulate, Precision p);
void linear_input_grad_low(cublasHandle_t h, const std::uint16_t* delta, const std::uint16_t* w, float* hgrad, int rows,
                           int in, int out, Precision p);
// dst[i] = src[i] rounded to the format, to nearest with ties to even (as src/low_precision.hpp does).
void round_to_low(const float* src, std::uint16_t* dst, std::size_t n, Precision p, cudaStream_t s);

}  // namespace dpcheck::cuda
