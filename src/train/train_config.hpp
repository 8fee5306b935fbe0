// TrainConfig: what a training run is (model, batch, steps, optimizer, sampler, loss scaling, the
// all-reduce's dtype, buckets), how it is checked, and what a checkpoint records of it. The trainer
// (src/train/trainer.hpp) runs one; the writer (src/train/writer.hpp) records and reads one back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "src/dtype.hpp"
#include "src/train/loss_scaler.hpp"
#include "src/train/model.hpp"
#include "src/train/optimizer.hpp"
#include "src/train/sampler.hpp"

namespace dpcheck {

// --allreduce-dtype: "fp32" (DType::f32) or "bf16" (DType::bf16); else UsageError naming the option.
DType parse_allreduce_dtype(std::string_view name);
std::string_view allreduce_dtype_name(DType dtype);

struct TrainConfig {
  ModelConfig model;
  std::int64_t batch = 32;        // global batch per step
  std::int64_t dataset_size = 0;  // 0: the same as batch
  int steps = 1;
  int accumulate = 1;  // micro-batches per rank per step
  OptimizerConfig optimizer;
  bool linear_scaling = false;  // learning rate x world size (Goyal et al., 2017)
  // Goyal et al.'s gradual warm-up: over the first warmup_steps steps the learning rate rises in equal
  // steps from lr to the linearly scaled lr x N (step t < K: lr (1 + (N - 1) t / K)), then stays there.
  std::int64_t warmup_steps = 0;
  bool shuffle = true;
  Split split = Split::strided;
  Policy policy = Policy::pad;
  std::uint64_t seed = 0;         // parameters, synthetic data and shuffle
  LossScalerConfig loss_scaling;  // --loss-scale: none, or dynamic (GradScaler's semantics)
  // --allreduce-dtype: the gradient all-reduce in float32, or in bfloat16 (each rank's gradient rounded
  // to bf16, reduced by the communicator in that dtype, and read back as float32), as frameworks do to
  // halve the traffic.
  DType allreduce_dtype = DType::f32;
  // --bucket-mb: the gradient all-reduced in buckets of at most this many MiB, each started as soon as
  // the backward pass has produced it (src/train/bucketing.hpp); 0: one all-reduce after the backward pass.
  // Not recorded in checkpoints: with a backend that reduces in rank order it changes no bit.
  double bucket_mb = 0;

  std::int64_t data_size() const { return dataset_size > 0 ? dataset_size : batch; }
  SamplerConfig sampler(int world_size) const;
  OptimizerConfig optimizer_for(int world_size) const;    // with the linear scaling rule applied
  double lr_at(std::int64_t step, int world_size) const;  // with the warm-up as well
  // Steps in an epoch: each rank walks its share in slices of ceil(batch / N) examples, and the epoch
  // lasts as long as the largest share, rank 0's (shares are equal, or the first ranks hold one more).
  std::int64_t steps_per_epoch(int world_size) const;
  void validate(int world_size) const;  // throws UsageError

  // What a checkpoint records of the run, and what must match to resume from one: everything but the
  // number of steps. `resume_mismatch` names the first difference, or returns "" when they agree.
  nlohmann::json to_json(int world_size) const;
  std::string resume_mismatch(const nlohmann::json& saved, int world_size) const;
};

}  // namespace dpcheck
