// Bias and activation, forward and backward, elementwise over row-major (rows x cols) tensors.
// Reference: reference/activation.cpp; test: tests/activation_test.cpp.
#pragma once

#include <cuda_runtime.h>

#include "src/train/model.hpp"

namespace dpcheck::cuda {

// z += bias (broadcast over rows); then a = act(z) when a is not null. In place on z.
void bias_activation_forward(float* z, float* a, const float* bias, int rows, int cols, Activation act,
                             cudaStream_t stream);

// delta = h * act'(z), with tanh' taken from the stored activation a as 1 - a^2 (as PyTorch does) and
// ReLU's derivative 0 at 0.
void activation_backward(const float* h, const float* z, const float* a, float* delta, int rows, int cols,
                         Activation act, cudaStream_t stream);

}  // namespace dpcheck::cuda
