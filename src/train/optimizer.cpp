#include "src/train/optimizer.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "src/choice.hpp"
#include "src/error.hpp"
#include "src/io/memory_service.hpp"
#include "src/plugin/kernel_plugin.hpp"

namespace dpcheck {

std::string_view optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::momentum: return "momentum";
    case OptimizerKind::adam: return "adam";
  }
  return "?";
}

OptimizerKind parse_optimizer(std::string_view name) {
  return parse_choice(name, {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::adam}, optimizer_name,
                      "optimizer");
}

void OptimizerConfig::validate() const {
  // Every field, whichever optimizer uses it, so that a bad value is never silently carried along. The
  // float32 optimizers round each one to float32, so "finite" means finite there: 1e300 would be inf.
  const auto check = [](double v, std::string_view name, bool ok, std::string_view range) {
    if (ok && std::abs(v) <= std::numeric_limits<float>::max()) return;
    char got[32];
    std::snprintf(got, sizeof got, "%.9g", v);
    throw UsageError(std::string(name) + " must be " + std::string(range) + ", got " + got);
  };
  check(lr, "the learning rate (--lr)", lr >= 0.0, "a finite float32 number >= 0");
  check(momentum, "momentum (--momentum)", momentum >= 0.0, "a finite float32 number >= 0");
  // beta1 = 1 would make the first bias correction 0 and every parameter NaN -- identically on every
  // rank, so the replica check could not notice.
  check(beta1, "Adam's beta1", beta1 >= 0.0 && beta1 < 1.0, "in [0, 1)");
  check(beta2, "Adam's beta2", beta2 >= 0.0 && beta2 < 1.0, "in [0, 1)");
  check(eps, "Adam's eps", eps >= 0.0, "a finite float32 number >= 0");
}

std::vector<std::string> Optimizer::state_names() const {
  switch (config_.kind) {
    case OptimizerKind::sgd: return {};
    case OptimizerKind::momentum: return {"momentum_buffer"};
    case OptimizerKind::adam: return {"exp_avg", "exp_avg_sq"};
  }
  return {};
}

namespace {

class CpuOptimizer final : public Optimizer {
 public:
  CpuOptimizer(const OptimizerConfig& config, std::size_t n, std::shared_ptr<const Kernels> kernels)
      : Optimizer(config, n), kernels_(std::move(kernels)) {
    state_.assign(state_size(), 0.0f);
  }

  MemorySpace memory_space() const override { return MemorySpace::host; }
  float* state() override { return state_.data(); }

  void store_state(std::span<float> host) const override {
    DPCHECK_ASSERT(host.size() == state_.size());
    host_memory().copy_to_host(state_.data(), host.data(), host.size());
  }

  void load_state(std::span<const float> host, std::int64_t steps) override {
    DPCHECK_ASSERT(host.size() == state_.size());
    host_memory().copy_from_host(host.data(), state_.data(), host.size());
    steps_ = steps;
  }

  void step(float* p, const float* g) override {
    ++steps_;
    if (plugin_step(p, g)) return;
    const std::size_t n = size_;
    const auto neg_lr = static_cast<float>(-config_.lr);
    switch (config_.kind) {
      case OptimizerKind::sgd:  // param.add_(grad, alpha=-lr)
        for (std::size_t i = 0; i < n; ++i) p[i] = p[i] + neg_lr * g[i];
        break;
      case OptimizerKind::momentum: {  // buf = grad (first step) or momentum * buf + grad
        float* buf = state_.data();
        const auto mu = static_cast<float>(config_.momentum);
        for (std::size_t i = 0; i < n; ++i) {
          buf[i] = steps_ == 1 ? g[i] : buf[i] * mu + g[i];
          p[i] = p[i] + neg_lr * buf[i];
        }
        break;
      }
      case OptimizerKind::adam: {
        float* m = state_.data();
        float* v = m + n;
        const double t = static_cast<double>(steps_);
        // The scalar factors are computed in double, as PyTorch computes them in Python floats.
        const double bias_correction1 = 1.0 - std::pow(config_.beta1, t);
        const double bias_correction2 = 1.0 - std::pow(config_.beta2, t);
        const float step_size = static_cast<float>(config_.lr / bias_correction1);
        const float bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
        const auto w1 = static_cast<float>(1.0 - config_.beta1), b2 = static_cast<float>(config_.beta2);
        const auto w2 = static_cast<float>(1.0 - config_.beta2);
        const auto eps = static_cast<float>(config_.eps);
        for (std::size_t i = 0; i < n; ++i) {
          m[i] = m[i] + w1 * (g[i] - m[i]);       // exp_avg.lerp_(grad, 1 - beta1)
          v[i] = v[i] * b2 + (w2 * g[i]) * g[i];  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
          const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
          p[i] = p[i] - step_size * (m[i] / denom);  // param.addcdiv_(exp_avg, denom, -step_size)
        }
        break;
      }
    }
  }

 private:
  // The plugin's step for this optimizer, if it has one; false when the step is dpcheck's own.
  bool plugin_step(float* p, const float* g) {
    if (!kernels_) return false;
    const auto n = static_cast<std::int64_t>(size_);
    const OptimizerConfig& c = config_;
    switch (c.kind) {
      case OptimizerKind::sgd:
        if (!kernels_->provides(KernelOp::sgd_step)) return false;
        kernels_->sgd_step(p, g, n, c.lr);
        return true;
      case OptimizerKind::momentum:
        if (!kernels_->provides(KernelOp::momentum_step)) return false;
        kernels_->momentum_step(p, g, state_.data(), n, c.lr, c.momentum, steps_);
        return true;
      case OptimizerKind::adam:
        if (!kernels_->provides(KernelOp::adam_step)) return false;
        kernels_->adam_step(p, g, state_.data(), state_.data() + size_, n, c.lr, c.beta1, c.beta2, c.eps, steps_);
        return true;
    }
    return false;
  }

  std::shared_ptr<const Kernels> kernels_;  // null: dpcheck's own steps
  std::vector<float> state_;
};

}  // namespace

std::unique_ptr<Optimizer> make_cpu_optimizer(const OptimizerConfig& config, std::size_t size,
                                              std::shared_ptr<const Kernels> kernels) {
  config.validate();
  return std::make_unique<CpuOptimizer>(config, size, std::move(kernels));
}

}  // namespace dpcheck
