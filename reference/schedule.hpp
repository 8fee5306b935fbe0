// Which examples every rank trains on at a step, restated from the definition (src/train/trainer.hpp: each
// rank walks its share of the epoch in slices of ceil(batch / N) examples; an epoch has
// ceil(largest share / slice) steps, the last of them possibly short) with none of the trainer's code,
// so that a trainer that walks its epochs wrongly -- never advancing the sampler's epoch, dropping a
// short last step, restarting an epoch on resume -- cannot agree with itself. The shares come from the
// DistributedSampler, which sampler_shards_disjoint checks on its own.
#pragma once

#include <cstdint>
#include <vector>

#include "src/train/sampler.hpp"
#include "src/train/train_config.hpp"

namespace dpcheck::reference {

struct StepExamples {
  std::int64_t epoch = 0;
  std::int64_t steps_per_epoch = 1;
  std::vector<std::vector<std::int64_t>> ranks;  // each rank's examples at the step, in its order

  std::vector<std::int64_t> global() const;  // concatenated in rank order
  std::int64_t largest_share() const;
};

// The same definition from the shares' sizes alone: where each rank's slice of its share lies at a
// step, [begin, end), so that a data set of 2^40 examples costs N, not the examples.
struct StepSlots {
  std::int64_t epoch = 0;
  std::int64_t steps_per_epoch = 1;
  std::int64_t first = 0, slice = 1;     // every share's slice starts at first and holds up to slice
  std::vector<std::int64_t> begin, end;  // per rank, into its share of the epoch: the slice cut to the share

  std::int64_t global() const;  // the global batch: the slices' sizes added
};

// `step` of a run of `config` on the sampler's ranks (the sampler must have been built from
// config.sampler(world_size)).
StepSlots step_slots(const TrainConfig& config, const DistributedSampler& sampler, std::int64_t step);

// The examples of `step`: each rank's slot (step_slots) of its share.
StepExamples step_examples(const TrainConfig& config, const DistributedSampler& sampler, std::int64_t step);

}  // namespace dpcheck::reference
