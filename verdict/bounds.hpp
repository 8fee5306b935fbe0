// The derived bound's parameters for a target: the unit roundoff and error model of its float path,
// and how sharding the batch over N ranks changes them. Properties and `dpcheck grad` hold results to
// these; the core's Target knows nothing of bounds.
#pragma once

#include <span>

#include "reference/bound.hpp"
#include "src/target/target.hpp"
#include "src/train/model.hpp"
#include "src/train/train_config.hpp"

namespace dpcheck {

// The unit roundoff and error model of the target's float path, for the derived bound.
reference::BoundOptions bound_options(const Target& target);
// The same for the all-reduced gradient of world_size shards: with mixed precision its deltas are
// rounded at world_size times the whole batch's scale, and a bf16 all-reduce adds its roundings
// (reference/bound.hpp).
reference::BoundOptions sharded_bound_options(reference::BoundOptions options, int world_size);
// bound_options for a run of `config`: its gradient all-reduce's dtype is the configuration's.
reference::BoundOptions bound_options(const Target& target, const TrainConfig& config);
// The bound of the all-reduced gradient of world_size shards, from the whole batch's (made by
// gradient_bound from these parameters and batch): `whole` itself when nothing differs, `whole` with
// the all-reduce's roundings when only those do, else one computed at the shards' delta scale.
reference::GradientBound sharded_gradient_bound(const reference::GradientBound& whole, const ModelConfig& model,
                                                std::span<const float> params, const Batch& batch, int world_size);

}  // namespace dpcheck
