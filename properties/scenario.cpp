#include "properties/scenario.hpp"

#include <algorithm>
#include <ostream>
#include <sstream>

namespace dpcheck {

namespace {

std::string lr_string(double lr) {
  std::ostringstream os;
  os << lr;
  return os.str();
}

}  // namespace

std::string Scenario::describe() const {
  const TrainConfig& t = train;
  std::ostringstream os;
  os << "model " << dims_string(t.model.dims) << " " << activation_name(t.model.activation) << " "
     << loss_name(t.model.loss) << " | batch " << t.batch << " of " << t.data_size() << " | world " << world_size << " "
     << split_name(t.split) << " " << policy_name(t.policy) << (t.shuffle ? " shuffled" : " in order") << " | "
     << optimizer_name(t.optimizer.kind)
     << (t.optimizer.kind == OptimizerKind::momentum ? " " + lr_string(t.optimizer.momentum) : std::string()) << " lr "
     << lr_string(t.optimizer.lr) << " | " << t.steps << (t.steps == 1 ? " step" : " steps") << ", accumulate "
     << t.accumulate << ", at step " << at_step << " | seed " << t.seed;
  if (simulated) os << " | simulated ranks";
  if (t.allreduce_dtype != DType::f32) os << " | all-reduce in " << allreduce_dtype_name(t.allreduce_dtype);
  if (t.loss_scaling.enabled()) {
    const LossScalerConfig& l = t.loss_scaling;
    os << " | loss scale from " << l.init_scale << ", x" << l.growth_factor << " every " << l.growth_interval
       << " good steps, x" << l.backoff_factor << " on overflow";
  }
  if (t.linear_scaling) os << " | lr x world size";
  if (t.warmup_steps > 0) os << " | " << t.warmup_steps << "-step warm-up";
  if (t.bucket_mb > 0) os << " | buckets of " << t.bucket_mb << " MiB";
  return os.str();
}

std::string Scenario::train_flags() const {
  const TrainConfig& t = train;
  std::ostringstream os;
  os << "--model " << dims_string(t.model.dims) << " --activation " << activation_name(t.model.activation) << " --loss "
     << loss_name(t.model.loss) << " --batch " << t.batch << " --dataset-size " << t.data_size() << " --world-size "
     << world_size << " --split " << split_name(t.split) << " --policy " << policy_name(t.policy)
     << (t.shuffle ? "" : " --no-shuffle") << " --optimizer " << optimizer_name(t.optimizer.kind)
     << (t.optimizer.kind == OptimizerKind::momentum ? " --momentum " + lr_string(t.optimizer.momentum) : std::string())
     << " --lr " << lr_string(t.optimizer.lr) << " --steps " << t.steps << " --accumulate " << t.accumulate
     << " --seed " << t.seed;
  if (t.allreduce_dtype != DType::f32) os << " --allreduce-dtype " << allreduce_dtype_name(t.allreduce_dtype);
  if (t.loss_scaling.enabled())
    os << " --loss-scale dynamic --loss-scale-init " << t.loss_scaling.init_scale << " --loss-scale-interval "
       << t.loss_scaling.growth_interval;
  if (t.linear_scaling) os << " --linear-scaling";
  if (t.warmup_steps > 0) os << " --warmup-steps " << t.warmup_steps;
  if (t.bucket_mb > 0) os << " --bucket-mb " << t.bucket_mb;
  return os.str();
}

void showValue(const Scenario& s, std::ostream& os) { os << s.describe(); }

namespace {

// Widens the first hidden layer (the input, for one layer) until the model has more than `count`
// parameters, so that one all-reduce of its gradient crosses that threshold.
void grow_past(std::vector<int>& dims, std::size_t count) {
  int& width = dims.size() > 2 ? dims[1] : dims[0];
  std::size_t base = 0, per_unit = 0;  // parameter count = base + per_unit * width
  const std::size_t w = static_cast<std::size_t>(width);
  width = 0;
  base = static_cast<std::size_t>(parameter_count(dims));
  width = 1;
  per_unit = static_cast<std::size_t>(parameter_count(dims)) - base;
  width = static_cast<int>(std::max(w, (count - std::min(count, base)) / per_unit + 1));
}

}  // namespace

rc::Gen<Scenario> gen_scenario(const ScenarioSpace& space) {
  return rc::gen::exec([space] {
    // Every case makes the same draws in the same order, the variable-length ones (the widths) last
    // and always as many as the most layers: RapidCheck shrinks one draw at a time and replays the
    // rest by position, so a draw that changed how many came after it would scramble them and stop
    // the shrinking short of the small case.
    Scenario s;
    TrainConfig& t = s.train;
    t.model.activation = *rc::gen::element(Activation::relu, Activation::tanh, Activation::identity);
    t.model.loss = *rc::gen::element(Loss::mse, Loss::cross_entropy);
    s.world_size =
        space.world_size > 0 ? space.world_size : *rc::gen::inRange(space.min_world_size, space.max_world_size + 1);
    const std::int64_t n = s.world_size;
    t.policy = space.uneven_only ? Policy::uneven : *rc::gen::element(Policy::uneven, Policy::pad, Policy::drop_last);
    if (space.uneven_only && n > 1) {
      // B = q N + r with 0 < r < N, so shares differ in size.
      const std::int64_t q = *rc::gen::inRange<std::int64_t>(0, std::max<std::int64_t>(1, space.max_batch / n));
      const std::int64_t r = *rc::gen::inRange<std::int64_t>(1, n);
      t.batch = q * n + r;
    } else {
      // drop-last needs an example per rank.
      const std::int64_t least = t.policy == Policy::drop_last ? n : 1;
      t.batch = *rc::gen::inRange<std::int64_t>(least, std::max(least, space.max_batch) + 1);
    }
    // From one batch to three, not only whole batches, so epochs have several steps and a short last
    // one. (With uneven shares drawn, the data set stays one batch: every step is then a whole epoch
    // whose shares differ in size.)
    const std::int64_t extra = *uniform(rc::gen::inRange<std::int64_t>(0, 2 * t.batch + 1));
    t.dataset_size = space.uneven_only ? t.batch : t.batch + extra;
    t.split = *rc::gen::element(Split::strided, Split::contiguous);
    t.shuffle = *rc::gen::element(false, true);
    t.optimizer.kind = *rc::gen::element(OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::adam);
    t.optimizer.lr = *rc::gen::element(0.1, 0.01, 0.001);
    t.steps = *uniform(rc::gen::inRange(space.min_steps, std::max(space.min_steps, space.max_steps) + 1));
    s.at_step = *uniform(rc::gen::inRange(std::min(space.min_at_step, t.steps - 1), t.steps));
    const int accumulate = *rc::gen::inRange(2, 5);
    t.accumulate = space.accumulate ? accumulate : 1;
    t.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
    t.loss_scaling = space.loss_scaling;
    // A scaler's first scale: GradScaler's 2^16 (which small cases overflow at first), 2^8 or 1. Drawn
    // only when the space scales its loss, so every case of a run still makes the same draws.
    if (space.loss_scaling.enabled()) t.loss_scaling.init_scale = *rc::gen::element(65536.0, 256.0, 1.0);
    // Which side of the communicator's thresholds the gradient falls on: the first choice (shrinking
    // towards it) keeps the drawn widths; choice i > 0 grows the model past threshold i.
    std::vector<std::size_t> limits;
    if (space.thresholds) limits = space.thresholds(s.world_size);
    std::sort(limits.begin(), limits.end());
    limits.erase(std::unique(limits.begin(), limits.end()), limits.end());
    const auto past = *uniform(rc::gen::inRange<std::size_t>(0, limits.size() + 1));
    const int layers = *rc::gen::inRange(1, space.max_layers + 1);
    std::vector<int> widths(static_cast<std::size_t>(space.max_layers) + 1);
    for (int& w : widths) w = *rc::gen::inRange(1, space.max_width + 1);
    t.model.dims.assign(widths.begin(), widths.begin() + layers + 1);
    // A model the user fixed stays as it is (its draws are still made, so that the others keep their places).
    if (!space.dims.empty()) t.model.dims = space.dims;
    else if (past > 0) grow_past(t.model.dims, limits[past - 1]);
    t.allreduce_dtype = space.allreduce_dtype;
    // Momentum's coefficient: PyTorch's usual 0.9, one that forgets fast, one that barely forgets, and
    // 0 (plain SGD through the momentum path). Drawn last, so that earlier draws keep their positions.
    t.optimizer.momentum = *rc::gen::element(0.9, 0.5, 0.99, 0.0);
    // The scale class, drawn last for the same reason (and always, so that every case makes the same
    // draws). The pick shrinks towards the worlds of 1 to 8, the world towards 63, the batch towards
    // its least.
    const int scale_pick = *uniform(rc::gen::inRange(0, std::max(1, space.scale_one_in)));
    const std::size_t scale_world = *index_below(space.scale_worlds.size());
    const auto scale_batch = *uniform(rc::gen::inRange<std::int64_t>(0, std::int64_t{1} << 20));
    if (space.world_size == 0 && space.scale_one_in > 0 && !space.scale_worlds.empty() &&
        scale_pick == space.scale_one_in - 1) {
      s.simulated = true;
      s.world_size = space.scale_worlds[scale_world];
      const std::int64_t world = s.world_size;
      if (space.uneven_only) {
        // B = q N + r with q in {0, 1} and 0 < r < N.
        t.batch = (scale_batch / (world - 1)) % 2 * world + 1 + scale_batch % (world - 1);
        t.dataset_size = t.batch;
      } else {
        const std::int64_t least = t.policy == Policy::drop_last ? world : 1;
        t.batch = least + scale_batch % (2 * world - least);
        t.dataset_size = t.batch + extra % (t.batch + 1);
      }
      t.steps = std::min(t.steps, 2);
      s.at_step = std::min(s.at_step, t.steps - 1);
      if (space.dims.empty()) {
        t.model.dims.assign(widths.begin(), widths.begin() + std::min(layers, 2) + 1);
        for (int& w : t.model.dims) w = 1 + (w - 1) % 4;
      }
    }
    return s;
  });
}

std::string SamplerScenario::describe() const {
  std::ostringstream os;
  os << "data " << sampler.dataset_size << " | world " << sampler.world_size << " " << split_name(sampler.split) << " "
     << policy_name(sampler.policy) << (sampler.shuffle ? " shuffled" : " in order") << " | seed " << sampler.seed
     << " | " << epochs << (epochs == 1 ? " epoch" : " epochs");
  if (simulated) os << " | simulated ranks";
  return os.str();
}

void showValue(const SamplerScenario& s, std::ostream& os) { os << s.describe(); }

rc::Gen<SamplerScenario> gen_sampler_scenario(int fixed_world_size, int max_world_size, int scale_one_in) {
  return rc::gen::exec([fixed_world_size, max_world_size, scale_one_in] {
    SamplerScenario s;
    s.sampler.dataset_size = *rc::gen::inRange<std::int64_t>(0, 1001);
    s.sampler.world_size = fixed_world_size > 0 ? fixed_world_size : *rc::gen::inRange(1, max_world_size + 1);
    s.sampler.split = *rc::gen::element(Split::strided, Split::contiguous);
    s.sampler.policy = *rc::gen::element(Policy::uneven, Policy::pad, Policy::drop_last);
    s.sampler.shuffle = *rc::gen::element(false, true);
    s.sampler.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
    s.epochs = *rc::gen::inRange(1, 4);
    // The scale class, drawn last and always (see gen_scenario).
    const std::vector<int>& worlds = scale_class_worlds();
    const int scale_pick = *uniform(rc::gen::inRange(0, std::max(1, scale_one_in)));
    const std::size_t scale_world = *index_below(worlds.size());
    const auto scale_data = *uniform(rc::gen::inRange<std::int64_t>(0, std::int64_t{1} << 20));
    const bool huge = *rc::gen::element(false, true);
    if (fixed_world_size <= 0 && scale_one_in > 0 && scale_pick == scale_one_in - 1) {
      s.simulated = true;
      s.sampler.world_size = worlds[scale_world];
      const std::int64_t world = s.sampler.world_size;
      if (huge) {
        // From 2^20 short of 2^31 to 2^32: positions on both sides of 2^31, in order (a shuffle would
        // have to list them all).
        s.sampler.dataset_size = (std::int64_t{1} << 31) - (std::int64_t{1} << 20) + scale_data * 2049;
        s.sampler.shuffle = false;
      } else {
        s.sampler.dataset_size = scale_data % (3 * world + 1);
      }
    }
    return s;
  });
}

}  // namespace dpcheck
