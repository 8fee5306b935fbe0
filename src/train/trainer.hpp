// The data-parallel step, per rank:
//
//   sampler -> this rank's examples for the step -> engine forward/backward over k micro-batches
//   -> gradient weighted by the rank's share of the global batch -> all-reduce (avg)
//   -> optimizer step -> replica check
//
// Shares may differ in size (the uneven policy, or the last step of an epoch), so rank r's gradient
// g_r (the mean over its b_r examples) enters the average with weight b_r N / B, B = sum of b_r: the
// all-reduce avg then yields sum_r (b_r / B) g_r, the gradient of the mean loss over the whole global
// batch. Every rank knows every share's size from the sampler alone, so the weights need no message.
//
// Steps and epochs: each rank walks its share of the epoch in slices of ceil(batch / N) examples; an
// epoch has ceil(largest share / slice) steps. By default the data set is exactly one global batch,
// so every step is a fresh epoch (a new shuffle) over the same examples.
//
// With a loss scaler (src/train/loss_scaler.hpp), each rank's backward pass runs at the scale, the gradient
// is all-reduced scaled, and every rank reports whether its local gradient or the all-reduced one
// holds a non-finite value; the max over ranks decides, on every rank alike, whether the step is
// skipped. A taken step unscales the gradient (exactly: the scale is a power of two) before the
// optimizer sees it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "src/comm.hpp"
#include "src/train/bucketing.hpp"
#include "src/train/checkpoint.hpp"
#include "src/train/data.hpp"
#include "src/train/engine.hpp"
#include "src/train/loss_scaler.hpp"
#include "src/train/optimizer.hpp"
#include "src/train/replica_check.hpp"
#include "src/train/sampler.hpp"
#include "src/train/train_config.hpp"

namespace dpcheck {

class Trainer;

// Watches a step at its phases: the trace (train --trace) and the live checks (--check-finite,
// --check-gradient-every). Every rank calls each hook at the same point of the same step, so a hook may
// exchange messages over comm().host(); a hook that throws must throw on every rank (agree first), so
// that every rank leaves the step together.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // The rank's gradient is in engine().grads(), weighted for the all-reduce, which has not run yet;
  // loss_sum is the sum of the losses of its `examples` examples.
  virtual void local_gradient(Trainer& /*trainer*/, std::int64_t /*step*/, double /*loss_sum*/,
                              std::int64_t /*examples*/) {}
  // The all-reduced gradient is in engine().grads(); the parameters are still those before the step.
  virtual void reduced_gradient(Trainer& /*trainer*/, std::int64_t /*step*/) {}
  // After the optimizer step, before the replica check.
  virtual void updated(Trainer& /*trainer*/, std::int64_t /*step*/) {}
};

// Which slice of a rank's share a step takes: [begin, end) into sampler.indices(rank, epoch).
struct StepSlot {
  std::int64_t epoch = 0;
  std::int64_t begin = 0, end = 0;
};

// The trainer's seams: each hook, when set, replaces or amends one decision of the step, and the
// trainer keeps its own where none is set. The correct trainer has none; fault injection
// (src/train/fault.hpp) and the mutants (mutants/) set them. A hook that is handed `correct` gets the
// trainer's own answer, to change or to ignore. Hooks that exchange messages (global_mean_loss,
// agree_found_inf) are collectives: every rank calls them at the same point.
struct TrainerHooks {
  std::function<StepSlot(const Trainer&, int rank, std::int64_t step, StepSlot correct)> slot = {};
  // This rank's examples at a step (rank_indices of its own rank).
  std::function<std::vector<std::int64_t>(const Trainer&, std::int64_t step, std::vector<std::int64_t> correct)>
      local_indices = {};
  // The examples this rank feeds its engine at a step (local_indices, gathered from the data).
  std::function<Batch(const Trainer&, std::int64_t step, Batch correct)> local_batch = {};
  // Weight of a rank's mean gradient in the all-reduce avg (share * N / global).
  std::function<double(std::int64_t share, std::int64_t global, int world)> share_weight = {};
  // Weight of a micro-batch's mean gradient within the rank's mean (micro / share).
  std::function<double(std::int64_t micro, std::int64_t share)> micro_batch_weight = {};
  // Called when the rank's local gradient is whole, before the observer sees it and before the
  // all-reduce. With this hook the buckets start once it has run, not during the backward pass.
  std::function<void(Trainer&, std::int64_t step)> local_gradient_ready = {};
  // Called after the optimizer step, before the observer sees it and before the replica check.
  std::function<void(Trainer&, std::int64_t step)> update_done = {};
  // The mean loss over the global batch from this rank's sum of per-example losses (a collective).
  std::function<double(Trainer&, double local_loss_sum, std::int64_t local_examples, std::int64_t global)>
      global_mean_loss = {};
  // The scale this rank's backward pass runs at and its gradient is unscaled by (the scaler's).
  std::function<float(const Trainer&)> loss_scale = {};
  // Whether the step is skipped, from this rank's view (a collective: the max over ranks).
  std::function<bool(Trainer&, bool local_inf, bool reduced_inf)> agree_found_inf = {};
  // The buckets of at most a cap of elements, in the order they are all-reduced (plan_buckets).
  std::function<std::vector<GradientBucket>(std::vector<GradientBucket> correct)> gradient_buckets = {};
  // Whether bucket b may start once the backward pass has finished layer `completed` and those above.
  std::function<bool(const GradientBucket& b, int completed)> bucket_ready = {};
  // The loss scaler's update after a step, every rank alike (LossScaler::update).
  std::function<void(Trainer&, bool found_inf)> update_loss_scaler = {};
  // The learning rate of a step under a warm-up (TrainConfig::lr_at).
  std::function<double(const Trainer&, std::int64_t step)> warmup_lr = {};
  // Called when restore() has loaded a checkpoint.
  std::function<void(Trainer&, const Checkpoint&)> restored = {};
};

struct StepResult {
  std::int64_t step = 0;
  double loss = 0;  // mean loss over the global batch (before the update)
  std::int64_t global_batch = 0;
  bool skipped = false;  // the loss scaler found a non-finite gradient: no update was taken
  float loss_scale = 1;  // the scaler's scale after the step (1 without one)
  // Wall-clock seconds of the forward and backward passes, and of the gradient all-reduce that they did
  // not hide (all of it without buckets; with them, the wait once the backward pass has returned).
  double compute_seconds = 0;
  double exposed_comm_seconds = 0;
  // With buckets: how many, and how many of them started during the backward pass; and whether they
  // could (a communication thread, a trainer without an observer that does not change the gradient).
  std::size_t buckets = 0, buckets_overlapped = 0;
  bool buckets_may_overlap = false;
  ReplicaReport replicas;
};

class Trainer final {
 public:
  Trainer(const TrainConfig& config, Communicator& comm, Engine& engine, Optimizer& optimizer,
          const DistributedSampler& sampler, const Dataset& data, TrainerHooks hooks = {});

  using Slot = StepSlot;
  Slot slot(int rank, std::int64_t step) const;
  std::int64_t global_batch(std::int64_t step) const;
  // The sampler's examples of any rank at a step: its slot of its share.
  std::vector<std::int64_t> rank_indices(int rank, std::int64_t step) const;
  // This rank's examples at a step: rank_indices of this rank (a fault's hook changes one).
  std::vector<std::int64_t> local_indices(std::int64_t step) const;

  // Every rank's examples at a step, concatenated in rank order: the global batch that the all-reduced
  // gradient must equal the gradient of. Computed from the sampler alone, with no communication.
  std::vector<std::int64_t> global_indices(std::int64_t step) const;

  // The largest micro-batch any rank uses at a step (array_split of a slice into `accumulate` parts).
  std::int64_t largest_micro_batch(std::int64_t step) const;

  // The factor by which a rank's engine scales the mean gradient of a micro-batch of `micro` of its
  // `examples` examples, where its slot holds `share` of the step's `global` examples: the share weight
  // share N / global times the micro-batch weight micro / examples and the loss scale, computed in
  // float64 and rounded once to float32. After the all-reduce's average every example then weighs
  // loss_scale / global, to within that one rounding (share_weights_match_global_batch holds it there).
  float micro_batch_scale(std::int64_t micro, std::int64_t examples, std::int64_t share, std::int64_t global,
                          float loss_scale = 1) const;

  // Leaves the all-reduced gradient of step's global batch in engine.grads(); returns the mean loss.
  // With a loss scaler the gradient is unscaled, unless some rank found a non-finite value: then
  // found_inf() is true on every rank and the gradient is left as the all-reduce made it.
  // On a simulated world (Communicator::simulated) this one trainer plays every rank's part in turn.
  double compute_gradient(std::int64_t step);
  bool found_inf() const { return found_inf_; }
  const LossScaler& scaler() const { return scaler_; }
  LossScaler& scaler() { return scaler_; }

  // compute_gradient, the optimizer update and the replica check; advances the step counter.
  StepResult step();

  std::int64_t next_step() const { return next_step_; }
  void set_next_step(std::int64_t s) { next_step_ = s; }
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }

  // Everything needed to continue bit for bit: parameters, optimizer state and steps, the next step.
  Checkpoint checkpoint() const;
  // The same into `c`, reusing its buffers (a snapshot before every step costs a copy, no allocation).
  void checkpoint_into(Checkpoint& c) const;
  // Continues from a checkpoint (UsageError if it does not fit this trainer's model and optimizer).
  void restore(const Checkpoint& checkpoint);

  const TrainConfig& config() const { return config_; }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }
  Communicator& comm() { return comm_; }
  const DistributedSampler& sampler() const { return sampler_; }
  Engine& engine() { return engine_; }
  Optimizer& optimizer() { return optimizer_; }
  const Dataset& data() const { return data_; }

  // Hooks called at each phase of every step (nullptr: none). Not owned.
  void set_observer(StepObserver* observer) { observer_ = observer; }

 private:
  double share_weight(std::int64_t share, std::int64_t global, int world) const;
  double micro_batch_weight(std::int64_t micro, std::int64_t share) const;
  Batch local_batch(std::int64_t step) const;
  double global_mean_loss(double local_loss_sum, std::int64_t local_examples, std::int64_t global);
  float applied_loss_scale() const { return hooks_.loss_scale ? hooks_.loss_scale(*this) : scaler_.scale(); }
  bool agree_found_inf(bool local_inf, bool reduced_inf);
  std::vector<GradientBucket> gradient_buckets(std::size_t cap) const;
  bool bucket_ready(const GradientBucket& b, int completed) const {
    return hooks_.bucket_ready ? hooks_.bucket_ready(b, completed) : completed <= b.ready_layer;
  }
  // Whether the buckets start during the last micro-batch's backward pass: a communication thread, no
  // observer (it may talk over the communicator at local_gradient) and no hook that changes the local
  // gradient once it is whole (its buckets start when that is done).
  bool buckets_overlap() const {
    return reducer_ && reducer_->threaded() && !observer_ && !hooks_.local_gradient_ready;
  }
  // Whether the engine's gradient holds an infinity or a NaN.
  bool gradient_non_finite();
  // Multiplies the engine's gradient by factor (a power of two: exact).
  void scale_gradient(float factor);
  // The gradient all-reduce (avg) in config().allreduce_dtype.
  void allreduce_gradient();
  // compute_gradient of this rank (the rank being played, on a simulated world).
  double rank_gradient(std::int64_t step);

  TrainConfig config_;
  TrainerHooks hooks_;
  Communicator& comm_;
  Engine& engine_;
  Optimizer& optimizer_;
  const DistributedSampler& sampler_;
  const Dataset& data_;
  std::int64_t slice_ = 1;
  std::int64_t steps_per_epoch_ = 1;
  std::int64_t next_step_ = 0;
  mutable std::int64_t global_batch_step_ = -1, global_batch_ = 0;  // global_batch's last answer
  bool passes_ = false;  // simulated ranks: compute_gradient is playing them, one rank_gradient each
  StepObserver* observer_ = nullptr;
  LossScaler scaler_;
  bool found_inf_ = false;
  std::vector<float> host_copy_;                           // a device engine's gradient, for the scaler's checks
  std::vector<Bf16> low_grads_;                            // the gradient in bf16, for --allreduce-dtype bf16
  std::unique_ptr<BucketReducer> reducer_;                 // --bucket-mb; made at the first step
  double compute_seconds_ = 0, exposed_comm_seconds_ = 0;  // the last compute_gradient's
};

// array_split: n into `parts` sizes differing by at most one, larger first.
std::vector<std::int64_t> split_sizes(std::int64_t n, std::int64_t parts);

}  // namespace dpcheck
