// Optimizers over flat buffers, with PyTorch's update formulas (torch.optim.SGD with and without
// momentum, torch.optim.Adam; no weight decay, no dampening, no Nesterov). The state -- momentum
// buffer, or Adam's exp_avg and exp_avg_sq, and the step count -- is part of what the replica check
// compares, since replicas whose parameters agree but whose state differs diverge at the next step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/dtype.hpp"

namespace dpcheck {

class Kernels;  // src/plugin/kernel_plugin.hpp

enum class OptimizerKind { sgd, momentum, adam };
std::string_view optimizer_name(OptimizerKind k);
OptimizerKind parse_optimizer(std::string_view name);  // sgd | momentum | adam; else UsageError

// Hyperparameters are doubles, as PyTorch's are Python floats; the float32 optimizers round them (and
// scalars derived from them, such as 1 - beta1) to float32 where PyTorch's kernels do.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::sgd;
  double lr = 0.01;
  double momentum = 0.9;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;

  void validate() const;  // PyTorch's checks; UsageError
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual MemorySpace memory_space() const = 0;
  const OptimizerConfig& config() const { return config_; }
  // The learning rate of the steps from now on (a schedule: --warmup-steps).
  virtual void set_lr(double lr) { config_.lr = lr; }

  // params -= update(grads); both hold size() elements in memory_space().
  virtual void step(float* params, const float* grads) = 0;

  std::size_t size() const { return size_; }
  std::int64_t steps() const { return steps_; }

  // The state as named blocks of size() elements each, stored one after another in state().
  std::vector<std::string> state_names() const;
  std::size_t state_size() const { return state_names().size() * size_; }
  virtual float* state() = 0;                                 // memory_space()
  virtual void store_state(std::span<float> host) const = 0;  // state_size() elements
  virtual void load_state(std::span<const float> host, std::int64_t steps) = 0;

 protected:
  Optimizer(const OptimizerConfig& config, std::size_t size) : config_(config), size_(size) {}
  OptimizerConfig config_;
  std::size_t size_;
  std::int64_t steps_ = 0;
};

// With `kernels`, the step runs the plugin's sgd_step, momentum_step or adam_step when it provides it.
std::unique_ptr<Optimizer> make_cpu_optimizer(const OptimizerConfig& config, std::size_t size,
                                              std::shared_ptr<const Kernels> kernels = nullptr);

}  // namespace dpcheck
