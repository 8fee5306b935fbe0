#include "src/train/loss_scaler.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "src/choice.hpp"

namespace dpcheck {

std::string_view loss_scaling_name(LossScaling s) { return s == LossScaling::dynamic ? "dynamic" : "none"; }

LossScaling parse_loss_scaling(std::string_view name) {
  return parse_choice(name, {LossScaling::none, LossScaling::dynamic}, loss_scaling_name, "--loss-scale");
}

namespace {

bool power_of_two(double v, int lo, int hi) {
  if (!(v > 0) || !std::isfinite(v)) return false;
  int e = 0;
  return std::frexp(v, &e) == 0.5 && e - 1 >= lo && e - 1 <= hi;
}

}  // namespace

void LossScalerConfig::validate() const {
  if (!enabled()) return;
  if (!power_of_two(init_scale, -24, 64))
    throw UsageError("--loss-scale-init must be a power of two from 2^-24 to 2^64 (so that scaling is exact), not " +
                     std::to_string(init_scale));
  if (!power_of_two(growth_factor, 1, 8) || !power_of_two(backoff_factor, -8, -1))
    throw UsageError(
        "the loss scaler's growth factor must be a power of two from 2 to 256 and its backoff one from "
        "1/256 to 1/2");
  if (growth_interval < 1 || growth_interval > (std::int64_t{1} << 40))
    throw UsageError("--loss-scale-interval must be from 1 to 2^40 steps");
}

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  if (enabled()) state_.scale = static_cast<float>(config.init_scale);
}

void LossScaler::update(bool found_inf) {
  if (!enabled()) return;
  if (found_inf) {
    // GradScaler multiplies in float32 and lets the scale reach 0 or infinity; dpcheck keeps it within
    // the normal floats, where every scaling stays exact.
    state_.scale = std::max(state_.scale * static_cast<float>(config_.backoff_factor), 0x1p-24f);
    state_.growth_tracker = 0;
    ++state_.skipped;
    return;
  }
  if (++state_.growth_tracker == config_.growth_interval) {
    state_.scale = std::min(state_.scale * static_cast<float>(config_.growth_factor), 0x1p64f);
    state_.growth_tracker = 0;
  }
}

}  // namespace dpcheck
