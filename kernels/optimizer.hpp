// Optimizer updates on the GPU with PyTorch's formulas, elementwise over flat buffers, and the
// Optimizer they make up. Reference: reference/optimizer.cpp; test: tests/optimizer_test.cpp.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "src/plugin/kernel_plugin.hpp"
#include "src/train/optimizer.hpp"

namespace dpcheck::cuda {

void sgd_update(float* p, const float* g, long long n, float neg_lr, cudaStream_t stream);
void momentum_update(float* p, const float* g, float* buf, long long n, float neg_lr, float mu, bool first,
                     cudaStream_t stream);
void adam_update(float* p, const float* g, float* m, float* v, long long n, float w1, float b2, float w2,
                 float step_size, float bc2_sqrt, float eps, cudaStream_t stream);

// The Optimizer on device buffers, enqueued on `stream` (the engine's, so that it follows the backward
// pass and the all-reduce without a host synchronization).
// With `kernels`, the steps the plugin provides run instead of these kernels, on the same stream.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, std::size_t size, cudaStream_t stream,
                                          std::shared_ptr<const Kernels> kernels = nullptr);

}  // namespace dpcheck::cuda
