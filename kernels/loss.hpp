// The losses' gradients with respect to the output, scaled, and the per-example losses.
// Reference: reference/loss.cpp; test: tests/loss_test.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dpcheck::cuda {

// delta = c (z - y), elementwise over rows x cols. When row_loss is not null it receives, per row, the
// sum over columns of (z - y)^2 in float64.
void mse_delta(const float* z, const float* y, float* delta, int rows, int cols, float c, double* row_loss,
               cudaStream_t stream);

// Per row: p = exp(z - max) / sum, delta = c (p - onehot(label)), in the same order of operations as the
// CPU engine; row_loss (if not null) receives log(sum exp(z - max)) + max - z[label] in float64.
void softmax_xent_delta(const float* z, const std::int64_t* labels, float* delta, int rows, int cols, float c,
                        double* row_loss, cudaStream_t stream);

}  // namespace dpcheck::cuda
