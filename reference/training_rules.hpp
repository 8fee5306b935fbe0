// The trainer's stateful rules, restated from their definitions with none of the trainer's code
// (src/train/loss_scaler.*, TrainConfig::lr_at), so that a wrong rule shared by every rank -- which every
// rank-against-rank or run-against-run property passes -- disagrees with these. The properties
// loss_scaler_follows_gradscaler and lr_schedule_follows_goyal compare the trainer's state with them
// after every step.
#pragma once

#include <cstdint>

namespace dpcheck::reference {

// torch.amp.GradScaler's update (torch._amp_update_scale_): after a step whose gradient held an
// infinity or a NaN, the scale is multiplied by the backoff factor and the count of good steps starts
// again; after a good step the count grows, and when it reaches the growth interval the scale is
// multiplied by the growth factor and the count starts again. The scale is a float32 and the products
// are float32 products. dpcheck's one documented difference: the scale stays within [2^-24, 2^64] (where
// GradScaler would let it reach 0 or leave a growth that overflows undone), so that scaling stays exact.
// A skipped step changes neither the parameters nor the optimizer's state or step count.
struct GradScalerModel {
  float scale = 65536;
  float growth_factor = 2;
  float backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;

  std::int64_t good_steps = 0;  // GradScaler's _growth_tracker
  std::int64_t skipped = 0;     // steps passed over since training began
  std::int64_t optimizer_steps = 0;

  void after_step(bool found_inf);
};

// The learning rate of step t (from 0) on world_size ranks: lr, times world_size with the linear
// scaling rule (Goyal et al., 2017); with a gradual warm-up of K steps it rises linearly from lr at
// t = 0 towards lr x world_size, reaching it at t = K: lr (1 + (world_size - 1) t / K) for t < K.
double goyal_lr(double lr, bool linear_scaling, std::int64_t warmup_steps, std::int64_t t, int world_size);

}  // namespace dpcheck::reference
