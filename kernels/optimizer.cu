// SGD, momentum and Adam on the GPU (kernels/optimizer.hpp), the same operations in the same order as
// the CPU optimizer (src/train/optimizer.cpp). Reference: reference/optimizer.cpp; test: tests/optimizer_test.cpp.
#include <cmath>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/cuda_memory.hpp"
#include "kernels/device.hpp"
#include "kernels/launch.hpp"
#include "kernels/optimizer.hpp"

namespace dpcheck::cuda {

namespace {

__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, long long n, float neg_lr) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    p[i] = p[i] + neg_lr * g[i];
}

__global__ void momentum_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ buf,
                                long long n, float neg_lr, float mu, bool first) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const float b = first ? g[i] : buf[i] * mu + g[i];
    buf[i] = b;
    p[i] = p[i] + neg_lr * b;
  }
}

__global__ void adam_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, long long n, float w1, float b2, float w2, float step_size,
                            float bc2_sqrt, float eps) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const float gi = g[i];
    const float mi = m[i] + w1 * (gi - m[i]);
    const float vi = v[i] * b2 + (w2 * gi) * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / bc2_sqrt + eps;
    p[i] = p[i] - step_size * (mi / denom);
  }
}

class CudaOptimizer final : public Optimizer {
 public:
  CudaOptimizer(const OptimizerConfig& config, std::size_t n, cudaStream_t stream,
                std::shared_ptr<const Kernels> kernels)
      : Optimizer(config, n), stream_(stream), memory_(stream), state_(state_size()), kernels_(std::move(kernels)) {
    if (state_.size() > 0) DPCHECK_CUDA_CHECK(cudaMemsetAsync(state_.get(), 0, state_.size() * sizeof(float), stream_));
  }

  MemorySpace memory_space() const override { return MemorySpace::device; }
  float* state() override { return state_.get(); }

  void store_state(std::span<float> host) const override {
    DPCHECK_ASSERT(host.size() == state_.size());
    memory_.copy_to_host(state_.get(), host.data(), host.size());
  }

  void load_state(std::span<const float> host, std::int64_t steps) override {
    DPCHECK_ASSERT(host.size() == state_.size());
    memory_.copy_from_host(host.data(), state_.get(), host.size());
    steps_ = steps;
  }

  void step(float* params, const float* grads) override {
    ++steps_;
    const auto n = static_cast<long long>(size_);
    // Scalars as PyTorch computes them: in double, then rounded to float32 for the kernel.
    const auto neg_lr = static_cast<float>(-config_.lr);
    if (kernels_) {
      // The plugin's step, where it has one: hyperparameters as the ABI takes them (doubles).
      const auto nn = static_cast<std::int64_t>(size_);
      const KernelOp op = config_.kind == OptimizerKind::sgd        ? KernelOp::sgd_step
                          : config_.kind == OptimizerKind::momentum ? KernelOp::momentum_step
                                                                    : KernelOp::adam_step;
      if (kernels_->provides(op)) {
        if (op == KernelOp::sgd_step) kernels_->sgd_step(params, grads, nn, config_.lr, stream_);
        if (op == KernelOp::momentum_step)
          kernels_->momentum_step(params, grads, state_.get(), nn, config_.lr, config_.momentum, steps_, stream_);
        if (op == KernelOp::adam_step)
          kernels_->adam_step(params, grads, state_.get(), state_.get() + size_, nn, config_.lr, config_.beta1,
                              config_.beta2, config_.eps, steps_, stream_);
        return;
      }
    }
    switch (config_.kind) {
      case OptimizerKind::sgd: sgd_update(params, grads, n, neg_lr, stream_); break;
      case OptimizerKind::momentum:
        momentum_update(params, grads, state_.get(), n, neg_lr, static_cast<float>(config_.momentum), steps_ == 1,
                        stream_);
        break;
      case OptimizerKind::adam: {
        const double t = static_cast<double>(steps_);
        const double bias_correction1 = 1.0 - std::pow(config_.beta1, t);
        const double bias_correction2 = 1.0 - std::pow(config_.beta2, t);
        adam_update(params, grads, state_.get(), state_.get() + size_, n, static_cast<float>(1.0 - config_.beta1),
                    static_cast<float>(config_.beta2), static_cast<float>(1.0 - config_.beta2),
                    static_cast<float>(config_.lr / bias_correction1), static_cast<float>(std::sqrt(bias_correction2)),
                    static_cast<float>(config_.eps), stream_);
        break;
      }
    }
  }

 private:
  cudaStream_t stream_;
  CudaMemory memory_;
  DeviceBuffer<float> state_;
  std::shared_ptr<const Kernels> kernels_;
};

}  // namespace

void sgd_update(float* p, const float* g, long long n, float neg_lr, cudaStream_t stream) {
  if (n == 0) return;
  sgd_kernel<<<grid_for(n), kBlock, 0, stream>>>(p, g, n, neg_lr);
  DPCHECK_LAUNCH_CHECK();
}

void momentum_update(float* p, const float* g, float* buf, long long n, float neg_lr, float mu, bool first,
                     cudaStream_t stream) {
  if (n == 0) return;
  momentum_kernel<<<grid_for(n), kBlock, 0, stream>>>(p, g, buf, n, neg_lr, mu, first);
  DPCHECK_LAUNCH_CHECK();
}

void adam_update(float* p, const float* g, float* m, float* v, long long n, float w1, float b2, float w2,
                 float step_size, float bc2_sqrt, float eps, cudaStream_t stream) {
  if (n == 0) return;
  adam_kernel<<<grid_for(n), kBlock, 0, stream>>>(p, g, m, v, n, w1, b2, w2, step_size, bc2_sqrt, eps);
  DPCHECK_LAUNCH_CHECK();
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, std::size_t size, cudaStream_t stream,
                                          std::shared_ptr<const Kernels> kernels) {
  config.validate();
  return std::make_unique<CudaOptimizer>(config, size, stream, std::move(kernels));
}

}  // namespace dpcheck::cuda
