// The bias gradient: column sums of delta (rows x cols), reduced in a fixed order -- no atomics -- so
// that the same input gives the same bits on every run. Reference: reference/activation.cpp (the column
// sum beside the bias); test: tests/bias_grad_test.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "src/bias_grad_kernel.hpp"

namespace dpcheck::cuda {

// Rows summed by one block of the first pass. Taller tensors are cut into chunks of this many rows, summed
// chunk by chunk into a workspace, and the chunks' sums added in chunk order by a second pass: more
// blocks at work, and still one fixed order.
inline constexpr int kBiasGradChunk = 512;

// Floats of workspace bias_grad needs for a tensor of this shape (0 when one chunk suffices).
std::size_t bias_grad_workspace(int rows, int cols);

// gb = column sums of delta (gb += when accumulate).
void bias_grad(const float* delta, float* gb, int rows, int cols, bool accumulate, float* workspace,
               cudaStream_t stream, BiasGradKernel kernel = BiasGradKernel::ordered);

}  // namespace dpcheck::cuda
