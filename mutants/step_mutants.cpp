// The mutants that break a step's arithmetic once the gradient is in: the optimizer, the engine's
// kernels, the loss scaler, the buckets, the warm-up and a NaN on one rank, each with its row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "mutants/mutants.hpp"
#include "src/builtin_names.hpp"
#include "src/train/fault.hpp"

namespace dpcheck {

namespace {

// Wraps the correct optimizer and breaks its formula from the outside (host memory only).
enum class FormulaSlip {
  dampened,    // buf = m buf + (1 - m) g is PyTorch's recurrence fed (1 - m) g
  first_step,  // the optimizer is told every step is its first
};
template <OptimizerKind kind, FormulaSlip slip> class FormulaMutantOptimizer final : public Optimizer {
 public:
  explicit FormulaMutantOptimizer(std::unique_ptr<Optimizer> inner)
      : Optimizer(inner->config(), inner->size()), inner_(std::move(inner)) {}
  MemorySpace memory_space() const override { return inner_->memory_space(); }
  void set_lr(double lr) override {
    Optimizer::set_lr(lr);
    inner_->set_lr(lr);
  }
  float* state() override { return inner_->state(); }
  void store_state(std::span<float> host) const override { inner_->store_state(host); }
  void load_state(std::span<const float> host, std::int64_t steps) override {
    inner_->load_state(host, steps);
    steps_ = steps;
  }
  void step(float* params, const float* grads) override {
    ++steps_;
    if constexpr (slip == FormulaSlip::dampened) {
      scaled_.assign(grads, grads + size_);
      for (float& v : scaled_) v *= static_cast<float>(1.0 - config_.momentum);
      inner_->step(params, scaled_.data());
    } else {
      state_.resize(inner_->state_size());
      inner_->store_state(state_);
      inner_->load_state(state_, 0);
      inner_->step(params, grads);
    }
  }

  // The optimizer of `kind` wrapped; any other as it is.
  static std::unique_ptr<Optimizer> wrap(std::unique_ptr<Optimizer> optimizer) {
    if (optimizer->config().kind != kind) return optimizer;
    return std::make_unique<FormulaMutantOptimizer>(std::move(optimizer));
  }

 private:
  std::unique_ptr<Optimizer> inner_;
  std::vector<float> scaled_, state_;
};

// GradScaler's update written with the count compared before it is incremented.
void scaler_growth_late(Trainer& t, bool found_inf) {
  if (found_inf || !t.scaler().enabled()) return t.scaler().update(found_inf);
  LossScalerState s = t.scaler().state();
  if (s.growth_tracker++ == t.config().loss_scaling.growth_interval) {
    s.scale = std::min(s.scale * static_cast<float>(t.config().loss_scaling.growth_factor), 0x1p64f);
    s.growth_tracker = 0;
  }
  t.scaler().restore(s);
}

// A backoff that forgets to start the count of good steps again.
void scaler_backoff_keeps_count(Trainer& t, bool found_inf) {
  if (!found_inf || !t.scaler().enabled()) return t.scaler().update(found_inf);
  LossScalerState s = t.scaler().state();
  s.scale = std::max(s.scale * static_cast<float>(t.config().loss_scaling.backoff_factor), 0x1p-24f);
  ++s.skipped;
  t.scaler().restore(s);
}

// From step 1 on, the last rank's local gradient takes a NaN in its first element.
void nan_on_last_rank(Trainer& t, std::int64_t step) {
  if (step < 1 || t.rank() != t.world_size() - 1) return;
  Fault f;
  f.step = step;
  f.rank = t.rank();
  f.element = 0;
  f.kind = FaultKind::nan;
  inject_fault(t.engine().memory(), t.engine().grads(), t.engine().param_count(), f);
}

}  // namespace

std::span<const MutantInfo> step_mutants() {
  static const MutantInfo rows[] = {
      {.name = "optimizer-rank-perturb",
       .caught_by = "replicas_bitwise_synchronized",
       .bug = "the last rank's learning rate is one ULP larger than everyone else's",
       .wide_minimal_case = true,
       .parts = {.optimizer_config =
                     [](OptimizerConfig& c, int rank, int world) {
                       // One float32 ULP on the last rank.
                       if (world > 1 && rank == world - 1) c.lr = std::nextafter(static_cast<float>(c.lr), INFINITY);
                     }}},
      {.name = "momentum-dampened",
       .caught_by = "optimizer_update_matches_formula",
       .bug = "SGD momentum keeps an average, buf = m buf + (1 - m) grad, instead of PyTorch's buf = m buf + grad",
       .engine = builtin::cpu,
       .parts = {.optimizer = FormulaMutantOptimizer<OptimizerKind::momentum, FormulaSlip::dampened>::wrap}},
      {.name = "adam-step-count-stuck",
       .caught_by = "optimizer_update_matches_formula",
       .bug = "Adam's step count never advances, so every step uses the first step's bias corrections",
       .engine = builtin::cpu,
       .parts = {.optimizer = FormulaMutantOptimizer<OptimizerKind::adam, FormulaSlip::first_step>::wrap}},
      {.name = "bias-grad-atomic",
       .caught_by = "checkpoint_resume_bitwise",
       .bug =
           "the bias-gradient kernel adds with atomicAdd, so the order -- and the last bits -- change from run to run",
       .engine = builtin::cuda,
       .parts = {.engine_spec = [](EngineSpec& s) { s.bias_grad = cuda::BiasGradKernel::atomic; }}},
      {.name = "bias-grad-skip-tail",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug = "the bias-gradient kernel never writes the last column when the width is not a multiple of its tile",
       .engine = builtin::cuda,
       .parts = {.engine_spec = [](EngineSpec& s) { s.bias_grad = cuda::BiasGradKernel::skip_tail; }}},
      {.name = "bf16-accumulate",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug = "the matrix products round every partial sum to bf16, as a kernel with a 16-bit accumulator does, where "
              "autocast accumulates in float32",
       .engine = builtin::cpu,
       .precision = "bf16",
       .parts = {.engine_spec = [](EngineSpec& s) { s.accumulate_in_low_precision = true; }}},
      {.name = "fp16-no-scaling",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug =
           "the backward pass ignores the loss scaler and runs at scale 1, so fp16 deltas below 2^-14 lose their bits "
           "(and the smallest underflow to zero) where the scaled ones keep them",
       .wide_minimal_case = true,
       .precision = "fp16",
       .large_minimal_case = true,
       .parts = {.trainer = {.loss_scale = [](const Trainer&) { return 1.0f; }}}},
      {.name = "unscale-after-allreduce",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug =
           "each rank scales its loss by a scale of its own (rank r: the scaler's times 2^r, as scalers restored from "
           "different checkpoints have) and unscales after the all-reduce by its own",
       .precision = "fp16",
       .parts = {.trainer = {.loss_scale = [](const Trainer& t) { return std::ldexp(t.scaler().scale(), t.rank()); }}}},
      {.name = "scaler-local-skip",
       .caught_by = "replicas_survive_overflow",
       .bug = "each rank decides from its own local gradient whether to skip a step, without agreeing: the rank that "
              "overflowed skips, the others step with the non-finite average",
       .precision = "fp16",
       .parts = {.trainer = {.agree_found_inf = [](Trainer&, bool local_inf, bool) { return local_inf; }}}},
      {.name = "scaler-growth-late",
       .caught_by = "loss_scaler_follows_gradscaler",
       .bug =
           "the loss scaler compares its count of good steps with the growth interval before counting the step, so the "
           "scale grows one good step late",
       .parts = {.trainer = {.update_loss_scaler = scaler_growth_late}}},
      {.name = "scaler-backoff-keeps-count",
       .caught_by = "loss_scaler_follows_gradscaler",
       .bug = "a skipped step backs the scale off but leaves the count of good steps where it was, so the next growth "
              "comes "
              "early",
       .parts = {.trainer = {.update_loss_scaler = scaler_backoff_keeps_count}}},
      {.name = "bucket-boundary-off-by-one",
       .caught_by = "bucketing_preserves_bits",
       .bug =
           "each gradient bucket's all-reduce stops one element short, so the last element of every bucket keeps the "
           "rank's own gradient",
       .parts = {.trainer = {.gradient_buckets =
                                 [](std::vector<GradientBucket> buckets) {
                                   for (GradientBucket& b : buckets) b.hi = std::max(b.lo, b.hi - 1);
                                   return buckets;
                                 }}}},
      {.name = "bucket-reduced-before-ready",
       .caught_by = "bucketing_preserves_bits",
       .bug = "a bucket starts once the layer above its lowest one is done (the first bucket before the backward "
              "pass), so "
              "it is reduced from the values its last layer held before this step wrote them",
       .engine = builtin::cpu,
       .parts = {.trainer = {.bucket_ready = [](const GradientBucket& b,
                                                int completed) { return completed <= b.ready_layer + 1; }}}},
      {.name = "warmup-one-step-early",
       .caught_by = "lr_schedule_follows_goyal",
       .bug = "the warm-up counts steps from 1: every step takes the next step's rate, and the full rate comes a step "
              "early",
       .parts = {.trainer = {.warmup_lr =
                                 [](const Trainer& t, std::int64_t step) {
                                   return t.config().lr_at(step + 1, t.world_size());
                                 }}}},
      {.name = "warmup-forgets-scaling",
       .caught_by = "lr_schedule_follows_goyal",
       .bug = "once the warm-up is over the learning rate falls back to --lr instead of staying at the linearly scaled "
              "rate",
       .parts = {.trainer = {.warmup_lr =
                                 [](const Trainer& t, std::int64_t step) {
                                   return step >= t.config().warmup_steps ? t.config().optimizer.lr
                                                                          : t.config().lr_at(step, t.world_size());
                                 }}}},
      {.name = "rank-nan-gradient",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug =
           "from step 1 on, the last rank's local gradient picks up a NaN (as an uninitialised buffer or a bad kernel "
           "leaves "
           "one) before the all-reduce spreads it to every replica",
       .parts = {.trainer = {.local_gradient_ready = nan_on_last_rank}}},
  };
  return rows;
}

}  // namespace dpcheck
