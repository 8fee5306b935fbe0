#include "src/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "src/choice.hpp"
#include "src/comm/simulated_comm.hpp"
#include "src/error.hpp"
#include "src/low_precision.hpp"

namespace dpcheck {

std::vector<std::int64_t> split_sizes(std::int64_t n, std::int64_t parts) {
  DPCHECK_ASSERT(n >= 0 && parts >= 1);
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(parts), n / parts);
  for (std::int64_t i = 0; i < n % parts; ++i) ++sizes[static_cast<std::size_t>(i)];
  return sizes;
}

Trainer::Trainer(const TrainConfig& config, Communicator& comm, Engine& engine, Optimizer& optimizer,
                 const DistributedSampler& sampler, const Dataset& data, TrainerHooks hooks)
    : config_(config),
      hooks_(std::move(hooks)),
      comm_(comm),
      engine_(engine),
      optimizer_(optimizer),
      sampler_(sampler),
      data_(data),
      scaler_(config.loss_scaling) {
  const int world = comm.size();
  config_.validate(world);
  DPCHECK_ASSERT(sampler.config().world_size == world);
  DPCHECK_ASSERT(sampler.config().dataset_size == data.size());
  DPCHECK_ASSERT(engine.param_count() == optimizer.size());
  slice_ = (config_.batch + world - 1) / world;
  steps_per_epoch_ = config_.steps_per_epoch(world);
  if (config_.allreduce_dtype != DType::f32 &&
      (engine.memory_space() != MemorySpace::host || comm.memory_space() != MemorySpace::host))
    throw UsageError("--allreduce-dtype bf16 runs with the cpu engine and a host communicator; the " +
                     std::string(engine.name()) + " engine's gradient lives on the device");
}

Trainer::Slot Trainer::slot(int rank, std::int64_t step) const {
  const std::int64_t share = sampler_.share_size(rank);
  Slot s;
  s.epoch = step / steps_per_epoch_;
  s.begin = std::min(share, (step % steps_per_epoch_) * slice_);
  s.end = std::min(share, s.begin + slice_);
  return hooks_.slot ? hooks_.slot(*this, rank, step, s) : s;
}

std::int64_t Trainer::global_batch(std::int64_t step) const {
  // Every simulated rank's pass asks again: kept for the last step asked, so that a step costs O(N).
  if (step == global_batch_step_) return global_batch_;
  std::int64_t total = 0;
  for (int r = 0; r < comm_.size(); ++r) {
    const Slot s = slot(r, step);
    total += s.end - s.begin;
  }
  global_batch_step_ = step;
  global_batch_ = total;
  return total;
}

std::vector<std::int64_t> Trainer::rank_indices(int rank, std::int64_t step) const {
  const Slot s = slot(rank, step);
  const std::vector<std::int64_t> share = sampler_.indices(rank, s.epoch);
  return {share.begin() + s.begin, share.begin() + s.end};
}

std::vector<std::int64_t> Trainer::global_indices(std::int64_t step) const {
  std::vector<std::int64_t> all;
  for (int r = 0; r < comm_.size(); ++r) {
    const std::vector<std::int64_t> mine = rank_indices(r, step);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all;
}

std::int64_t Trainer::largest_micro_batch(std::int64_t step) const {
  std::int64_t largest = 0;
  for (int r = 0; r < comm_.size(); ++r) {
    const Slot s = slot(r, step);
    largest = std::max(largest, (s.end - s.begin + config_.accumulate - 1) / config_.accumulate);
  }
  return largest;
}

std::vector<std::int64_t> Trainer::local_indices(std::int64_t step) const {
  std::vector<std::int64_t> idx = rank_indices(rank(), step);
  return hooks_.local_indices ? hooks_.local_indices(*this, step, std::move(idx)) : idx;
}

Batch Trainer::local_batch(std::int64_t step) const {
  Batch batch = data_.gather(local_indices(step));
  return hooks_.local_batch ? hooks_.local_batch(*this, step, std::move(batch)) : batch;
}

double Trainer::share_weight(std::int64_t share, std::int64_t global, int world) const {
  if (hooks_.share_weight) return hooks_.share_weight(share, global, world);
  return static_cast<double>(share) * world / static_cast<double>(global);
}

double Trainer::micro_batch_weight(std::int64_t micro, std::int64_t share) const {
  if (hooks_.micro_batch_weight) return hooks_.micro_batch_weight(micro, share);
  return static_cast<double>(micro) / static_cast<double>(share);
}

float Trainer::micro_batch_scale(std::int64_t micro, std::int64_t examples, std::int64_t share, std::int64_t global,
                                 float loss_scale) const {
  const double weight = share_weight(share, global, comm_.size());
  return static_cast<float>(weight * micro_batch_weight(micro, examples) * loss_scale);
}

double Trainer::compute_gradient(std::int64_t step) {
  SimulatedComm* simulated = comm_.simulated();
  if (!simulated) return rank_gradient(step);
  // Simulated ranks (src/comm/simulated_comm.hpp): every rank's pass in turn, on this one replica. Each
  // pass folds its gradient, loss and verdicts into the collectives' partial results; the last pass
  // receives the results, and its found_inf and loss are the world's.
  // The all-reduced gradient exists once the last rank has passed: an observer sees it then, as the
  // replica (rank 0), not at each pass (where the earlier ranks hold their own gradients).
  double loss = 0;
  passes_ = true;
  try {
    for (int r = 0; r < simulated->size(); ++r) {
      simulated->play(r);
      loss = rank_gradient(step);
    }
  } catch (...) {
    passes_ = false;
    simulated->abandon();
    throw;
  }
  passes_ = false;
  simulated->replicate();
  if (observer_) observer_->reduced_gradient(*this, step);
  return loss;
}

double Trainer::rank_gradient(std::int64_t step) {
  const Slot s = slot(comm_.rank(), step);
  const std::int64_t share = s.end - s.begin;
  const std::int64_t global = global_batch(step);
  if (global == 0) throw Error("step " + std::to_string(step) + " has an empty global batch");
  const Batch batch = local_batch(step);
  const float loss_scale = scaler_.enabled() ? applied_loss_scale() : 1.0f;

  if (config_.bucket_mb > 0 && !reducer_) {
    // A communication thread where the communicator takes calls from one, and the engine's gradient is
    // on the host (copied at the hook) or has a staging of its own (a device's, ordered by events).
    std::vector<GradientBucket> buckets = gradient_buckets(bucket_elements(config_.bucket_mb));
    std::unique_ptr<BucketStaging> staging;
    if (comm_.callable_from_any_thread() && config_.allreduce_dtype == DType::f32 &&
        engine_.memory_space() == comm_.memory_space())
      staging = engine_.make_bucket_staging(buckets.size());
    const bool threaded =
        comm_.callable_from_any_thread() &&
        (staging || (engine_.memory_space() == MemorySpace::host && comm_.memory_space() == MemorySpace::host));
    reducer_ = std::make_unique<BucketReducer>(comm_, std::move(buckets), config_.allreduce_dtype, threaded,
                                               std::move(staging));
  }
  if (reducer_) reducer_->begin(engine_.grads());
  // The buckets start during the last micro-batch's backward pass, each once its layers are final;
  // an observer may talk over the communicator at local_gradient, so with one they start after it.
  const bool overlap = buckets_overlap();
  const int layers = engine_.model().layers();
  const auto launch_ready = [&](int completed) {
    while (reducer_->next() < reducer_->buckets().size() &&
           bucket_ready(reducer_->buckets()[reducer_->next()], completed))
      reducer_->launch(reducer_->next());
  };
  struct HookReset {
    Engine& engine;
    ~HookReset() { engine.set_layer_ready_hook(nullptr); }
  };

  // Each micro-batch's mean gradient enters with weight n_j / b_r within the rank, so one scale
  // factor per micro-batch carries both the accumulation and the rank's share.
  const auto started = std::chrono::steady_clock::now();
  const std::vector<std::int64_t> micro = split_sizes(batch.size, config_.accumulate);
  const auto last = std::find_if(micro.rbegin(), micro.rend(), [](std::int64_t n) { return n > 0; });
  const std::size_t last_micro =
      last == micro.rend() ? micro.size() : static_cast<std::size_t>(micro.rend() - last) - 1;
  double loss_sum = 0.0;
  std::int64_t offset = 0;
  bool first = true;
  for (std::size_t j = 0; j < micro.size(); ++j) {
    const std::int64_t n = micro[j];
    if (n == 0) continue;
    const float scale = micro_batch_scale(n, batch.size, share, global, loss_scale);
    const HookReset reset{engine_};
    if (overlap && j == last_micro) {
      launch_ready(layers);
      engine_.set_layer_ready_hook(launch_ready);
    }
    loss_sum += static_cast<double>(n) * engine_.forward_backward(batch.slice(offset, offset + n), scale, !first);
    offset += n;
    first = false;
  }
  if (first) engine_.zero_grads();  // nothing to train on: contribute zeros, but still take part

  if (hooks_.local_gradient_ready) hooks_.local_gradient_ready(*this, step);
  const bool local_inf = scaler_.enabled() && gradient_non_finite();
  if (observer_) observer_->local_gradient(*this, step, loss_sum, share);
  engine_.synchronize();
  const auto computed = std::chrono::steady_clock::now();
  compute_seconds_ = std::chrono::duration<double>(computed - started).count();
  if (reducer_) reducer_->finish();
  else allreduce_gradient();
  engine_.synchronize();
  exposed_comm_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - computed).count();
  found_inf_ = false;
  if (scaler_.enabled()) {
    found_inf_ = agree_found_inf(local_inf, gradient_non_finite());
    if (!found_inf_) scale_gradient(1.0f / loss_scale);
  }
  if (observer_ && !passes_) observer_->reduced_gradient(*this, step);
  return global_mean_loss(loss_sum, share, global);
}

std::vector<GradientBucket> Trainer::gradient_buckets(std::size_t cap) const {
  std::vector<GradientBucket> buckets = plan_buckets(ParamLayout(engine_.model()), cap);
  return hooks_.gradient_buckets ? hooks_.gradient_buckets(std::move(buckets)) : buckets;
}

void Trainer::allreduce_gradient() {
  const std::size_t n = engine_.param_count();
  if (config_.allreduce_dtype == DType::f32) {
    comm_.allreduce(engine_.grads(), n, DType::f32, ReduceOp::avg);
    return;
  }
  low_grads_.resize(n);
  float* g = engine_.grads();
  for (std::size_t i = 0; i < n; ++i) low_grads_[i].bits = float_to_bf16_bits(g[i]);
  comm_.allreduce(low_grads_.data(), n, DType::bf16, ReduceOp::avg);
  for (std::size_t i = 0; i < n; ++i) g[i] = bf16_bits_to_float(low_grads_[i].bits);
}

bool Trainer::agree_found_inf(bool local_inf, bool reduced_inf) {
  if (hooks_.agree_found_inf) return hooks_.agree_found_inf(*this, local_inf, reduced_inf);
  std::int64_t found = local_inf || reduced_inf ? 1 : 0;
  comm_.host().allreduce(&found, 1, DType::i64, ReduceOp::max);
  return found != 0;
}

namespace {

bool any_non_finite(const float* v, std::size_t n) {
  bool bad = false;
  for (std::size_t i = 0; i < n; ++i) bad |= !std::isfinite(v[i]);
  return bad;
}

}  // namespace

bool Trainer::gradient_non_finite() {
  const std::size_t n = engine_.param_count();
  engine_.synchronize();
  if (engine_.memory_space() == MemorySpace::host) return any_non_finite(engine_.grads(), n);
  host_copy_.resize(n);
  engine_.store_grads(host_copy_);
  return any_non_finite(host_copy_.data(), n);
}

void Trainer::scale_gradient(float factor) {
  const std::size_t n = engine_.param_count();
  engine_.synchronize();
  if (engine_.memory_space() == MemorySpace::host) {
    float* g = engine_.grads();
    for (std::size_t i = 0; i < n; ++i) g[i] *= factor;
    return;
  }
  host_copy_.resize(n);
  engine_.store_grads(host_copy_);
  for (float& v : host_copy_) v *= factor;
  engine_.memory().copy_from_host(host_copy_.data(), engine_.grads(), n);
}

double Trainer::global_mean_loss(double local_loss_sum, std::int64_t local_examples, std::int64_t global) {
  if (hooks_.global_mean_loss) return hooks_.global_mean_loss(*this, local_loss_sum, local_examples, global);
  comm_.host().allreduce(&local_loss_sum, 1, DType::f64, ReduceOp::sum);
  return local_loss_sum / static_cast<double>(global);
}

Checkpoint Trainer::checkpoint() const {
  Checkpoint c;
  checkpoint_into(c);
  return c;
}

void Trainer::checkpoint_into(Checkpoint& c) const {
  c.step = next_step_;
  c.epoch = next_step_ / steps_per_epoch_;
  c.step_in_epoch = next_step_ % steps_per_epoch_;
  c.params.resize(engine_.param_count());
  engine_.store_params(c.params);
  c.state_names = optimizer_.state_names();
  c.optimizer_state.resize(optimizer_.state_size());
  optimizer_.store_state(c.optimizer_state);
  c.optimizer_steps = optimizer_.steps();
  c.config = config_.to_json(comm_.size());
  c.loss_scaler = scaler_.enabled() ? std::optional(scaler_.state()) : std::nullopt;
}

void Trainer::restore(const Checkpoint& c) {
  if (c.params.size() != engine_.param_count())
    throw UsageError("the checkpoint holds " + std::to_string(c.params.size()) + " parameters, the model has " +
                     std::to_string(engine_.param_count()));
  if (c.state_names != optimizer_.state_names())
    throw UsageError("the checkpoint's optimizer state does not fit " +
                     std::string(optimizer_name(optimizer_.config().kind)));
  if (scaler_.enabled() != c.loss_scaler.has_value())
    throw UsageError(scaler_.enabled() ? "the checkpoint has no loss scaler state, and this run scales the loss"
                                       : "the checkpoint holds a loss scaler's state, and this run has none");
  engine_.load_params(c.params);
  optimizer_.load_state(c.optimizer_state, c.optimizer_steps);
  if (c.loss_scaler) scaler_.restore(*c.loss_scaler);
  next_step_ = c.step;
  if (hooks_.restored) hooks_.restored(*this, c);
}

StepResult Trainer::step() {
  StepResult r;
  r.step = next_step_;
  r.global_batch = global_batch(r.step);
  r.loss = compute_gradient(r.step);
  // A skipped step leaves the parameters, the optimizer state and its step count as they were.
  r.skipped = found_inf_;
  if (config_.warmup_steps > 0)
    optimizer_.set_lr(hooks_.warmup_lr ? hooks_.warmup_lr(*this, r.step) : config_.lr_at(r.step, comm_.size()));
  if (!found_inf_) optimizer_.step(engine_.params(), engine_.grads());
  if (hooks_.update_loss_scaler) hooks_.update_loss_scaler(*this, found_inf_);
  else scaler_.update(found_inf_);
  r.loss_scale = scaler_.scale();
  r.compute_seconds = compute_seconds_;
  r.exposed_comm_seconds = exposed_comm_seconds_;
  if (reducer_) {
    r.buckets = reducer_->buckets().size();
    r.buckets_overlapped = reducer_->launched_early();
    r.buckets_may_overlap = buckets_overlap();
  }
  if (hooks_.update_done) hooks_.update_done(*this, r.step);
  if (observer_) observer_->updated(*this, r.step);
  r.replicas = check_replicas(comm_, engine_, optimizer_, r.step, scaler_.enabled() ? &scaler_.state() : nullptr);
  ++next_step_;
  return r;
}

}  // namespace dpcheck
