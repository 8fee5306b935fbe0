// Dynamic loss scaling with the semantics of PyTorch's torch.amp.GradScaler: the loss (in practice
// its gradient at the output) is multiplied by a power-of-two scale before the backward pass, so that
// small fp16 gradients do not underflow; the gradient is unscaled (multiplied by 1 / scale, exactly)
// before the optimizer step. A step whose gradient holds an infinity or a NaN is skipped -- neither
// the parameters nor the optimizer state change, nor its step count -- and the scale is multiplied by
// the backoff factor; after `growth_interval` good steps in a row it is multiplied by the growth
// factor. Data-parallel training must take the skip decision on every rank together: the trainer
// reduces every rank's "found inf" with a max before anyone decides (src/train/trainer.cpp), and the scale
// and its counter are part of the replica check and of checkpoints.
#pragma once

#include <cstdint>
#include <string_view>

namespace dpcheck {

enum class LossScaling : std::uint8_t { none, dynamic };
std::string_view loss_scaling_name(LossScaling s);      // "none", "dynamic"
LossScaling parse_loss_scaling(std::string_view name);  // those; else UsageError naming --loss-scale

struct LossScalerConfig {
  LossScaling kind = LossScaling::none;
  double init_scale = 65536;  // GradScaler's 2^16
  double growth_factor = 2;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  bool enabled() const { return kind == LossScaling::dynamic; }
  // UsageError unless the scale is a power of two in [2^-24, 2^64] (so that scaling and unscaling are
  // exact), the factors are 2 and 1/2 or another power of two, and the interval is at least 1.
  void validate() const;
};

struct LossScalerState {
  float scale = 1;                  // 1 when loss scaling is off
  std::int64_t growth_tracker = 0;  // good steps since the last change of scale
  std::int64_t skipped = 0;         // steps skipped for a non-finite gradient, since training began
  bool operator==(const LossScalerState&) const = default;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config);
  bool enabled() const { return config_.enabled(); }
  float scale() const { return state_.scale; }
  const LossScalerState& state() const { return state_; }
  void restore(const LossScalerState& state) { state_ = state; }
  // After a step: found_inf (agreed by every rank) skips it and backs off, else counts towards growth.
  void update(bool found_inf);

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace dpcheck
