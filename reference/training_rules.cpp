#include "reference/training_rules.hpp"

#include <algorithm>

namespace dpcheck::reference {

void GradScalerModel::after_step(bool found_inf) {
  if (found_inf) {
    scale = std::max(scale * backoff_factor, 0x1p-24f);
    good_steps = 0;
    ++skipped;
    return;
  }
  ++optimizer_steps;
  if (good_steps + 1 < growth_interval) {
    ++good_steps;
    return;
  }
  scale = std::min(scale * growth_factor, 0x1p64f);
  good_steps = 0;
}

double goyal_lr(double lr, bool linear_scaling, std::int64_t warmup_steps, std::int64_t t, int world_size) {
  const double n = linear_scaling ? world_size : 1;
  if (warmup_steps <= 0 || t >= warmup_steps) return lr * n;
  return lr * (1.0 + (n - 1.0) * static_cast<double>(t) / static_cast<double>(warmup_steps));
}

}  // namespace dpcheck::reference
