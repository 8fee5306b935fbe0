#include "src/train/train_config.hpp"

#include <algorithm>
#include <string>

#include "src/choice.hpp"
#include "src/error.hpp"
#include "src/train/bucketing.hpp"

namespace dpcheck {

std::string_view allreduce_dtype_name(DType dtype) { return dtype == DType::bf16 ? "bf16" : "fp32"; }

DType parse_allreduce_dtype(std::string_view name) {
  return parse_choice(name, {DType::f32, DType::bf16}, allreduce_dtype_name, "--allreduce-dtype");
}

SamplerConfig TrainConfig::sampler(int world_size) const {
  SamplerConfig s;
  s.dataset_size = data_size();
  s.world_size = world_size;
  s.shuffle = shuffle;
  s.seed = seed;
  s.split = split;
  s.policy = policy;
  return s;
}

std::int64_t TrainConfig::steps_per_epoch(int world_size) const {
  const DistributedSampler sampler(this->sampler(world_size));
  const std::int64_t slice = (batch + world_size - 1) / world_size;
  return std::max<std::int64_t>(1, (sampler.share_size(0) + slice - 1) / slice);
}

OptimizerConfig TrainConfig::optimizer_for(int world_size) const {
  OptimizerConfig o = optimizer;
  if (linear_scaling) o.lr *= world_size;
  return o;
}

double TrainConfig::lr_at(std::int64_t step, int world_size) const {
  const double target = optimizer_for(world_size).lr;
  if (step >= warmup_steps) return target;
  return optimizer.lr + (target - optimizer.lr) * static_cast<double>(step) / static_cast<double>(warmup_steps);
}

void TrainConfig::validate(int world_size) const {
  model.validate();
  if (world_size < 1) throw UsageError("world size must be at least 1");
  if (batch < 1) throw UsageError("batch size must be at least 1");
  if (dataset_size < 0) throw UsageError("data set size must be at least 1 (or 0 for one batch)");
  optimizer.validate();
  if (steps < 1) throw UsageError("steps must be at least 1");
  if (accumulate < 1) throw UsageError("accumulate must be at least 1");
  loss_scaling.validate();
  if (warmup_steps < 0) throw UsageError("--warmup-steps must be at least 0");
  if (bucket_mb != 0) bucket_elements(bucket_mb);  // UsageError for a negative or unusable size
  if (warmup_steps > 0 && !linear_scaling)
    throw UsageError(
        "--warmup-steps ramps the learning rate from --lr up to the linearly scaled one (Goyal et al.): "
        "it needs --linear-scaling");
  if (allreduce_dtype != DType::f32 && allreduce_dtype != DType::bf16)
    throw UsageError("the gradient all-reduce runs in float32 or bfloat16");
  if (policy == Policy::drop_last && data_size() < world_size)
    throw UsageError("with drop-last, the data set (" + std::to_string(data_size()) +
                     " examples) must hold at least one example per rank (world size " + std::to_string(world_size) +
                     "): every share would be empty");
}

nlohmann::json TrainConfig::to_json(int world_size) const {
  nlohmann::json j = {{"model", dims_string(model.dims)},
                      {"activation", activation_name(model.activation)},
                      {"loss", loss_name(model.loss)},
                      {"batch", batch},
                      {"dataset_size", data_size()},
                      {"accumulate", accumulate},
                      {"optimizer", optimizer_name(optimizer.kind)},
                      {"lr", optimizer.lr},
                      {"momentum", optimizer.momentum},
                      {"beta1", optimizer.beta1},
                      {"beta2", optimizer.beta2},
                      {"eps", optimizer.eps},
                      {"linear_scaling", linear_scaling},
                      {"shuffle", shuffle},
                      {"split", split_name(split)},
                      {"policy", policy_name(policy)},
                      {"seed", seed},
                      {"world_size", world_size}};
  // Only a run that scales its loss records the scaler, so that checkpoints written before there was
  // one still resume a run without one.
  if (warmup_steps > 0) j["warmup_steps"] = warmup_steps;
  if (allreduce_dtype != DType::f32) j["allreduce_dtype"] = std::string(allreduce_dtype_name(allreduce_dtype));
  // Recorded so that a repro bundle replays with the same buckets (a ring may reduce an element
  // differently wherever it falls in a call), but not held against a resume: see resume_mismatch.
  if (bucket_mb > 0) j["bucket_mb"] = bucket_mb;
  if (loss_scaling.enabled()) {
    j["loss_scale"] = std::string(loss_scaling_name(loss_scaling.kind));
    j["loss_scale_init"] = loss_scaling.init_scale;
    j["loss_scale_interval"] = loss_scaling.growth_interval;
  }
  return j;
}

std::string TrainConfig::resume_mismatch(const nlohmann::json& saved, int world_size) const {
  // The buckets are how the gradient travels, not what it is: with a backend that reduces in rank order
  // they change no bit (bucketing_preserves_bits), so a run may resume with other buckets, or none.
  const auto ignored = [](const std::string& key) { return key == "bucket_mb"; };
  const nlohmann::json now = to_json(world_size);
  for (const auto& [key, value] : now.items()) {
    if (ignored(key)) continue;
    if (!saved.contains(key)) return "the checkpoint does not record " + key;
    if (saved.at(key) != value)
      return "the checkpoint was written with " + key + " " + saved.at(key).dump() + ", this run has " + value.dump();
  }
  // Options recorded only when set (a loss scaler, a warm-up, a bf16 all-reduce) that this run lacks.
  if (saved.is_object())
    for (const auto& [key, value] : saved.items())
      if (!now.contains(key) && !ignored(key))
        return "the checkpoint was written with " + key + " " + value.dump() + ", this run has none";
  return "";
}

}  // namespace dpcheck
