// The gradient properties: gradient_average_matches_whole_batch, accumulation_matches_whole_batch and
// uneven_shares_match_whole_batch. A case trains a drawn scenario up to a drawn step (anywhere in an
// epoch), takes that step's all-reduced gradient, and checks it -- and the same engine's gradient of the
// whole global batch at once -- against the float64 reference within the derived bound. Which examples
// the step's global batch holds is restated on its own (reference/schedule.hpp), not asked of the
// trainer under test.
//
// Each case also measures the check's power: the same engine's gradient of the global batch without
// its last example, against the same bound. It must leave the bound in the property's stated share of
// cases (PropertyDef::min_power), so a bound grown loose fails the run instead of passing everything.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "properties/common.hpp"
#include "reference/bound.hpp"
#include "reference/schedule.hpp"
#include "verdict/bounds.hpp"

namespace dpcheck {

namespace {

// "all-reduced gradient at layers.2.weight[20, 23]: float32 -5.87e-07, float64 1.62e-06, error 2.2e-06,
// ratio 0.999 (gamma_75); bound 2.21e-06 = 99.9% kink ...; 2 units within rounding of a ReLU kink"
std::string describe(std::string_view path, const reference::Comparison& c, const reference::GradientBound& bound,
                     const ParamLayout& layout, std::int64_t roundings) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%.*s gradient at %s: float32 %.9g, float64 reference %.17g, error %.3g, error ratio %.6g "
                "(gamma_%lld); ",
                static_cast<int>(path.size()), path.data(), layout.describe_element(c.worst).c_str(), c.worst_value,
                c.worst_reference, std::abs(c.worst_value - c.worst_reference), c.max_ratio,
                static_cast<long long>(roundings));
  std::string text = buf + bound.terms(c.worst, roundings).describe();
  if (bound.uncertain_units > 0)
    text += "; " + std::to_string(bound.uncertain_units) + " (example, unit) pairs within rounding of a ReLU kink";
  return text;
}

std::vector<float> gradient_of(Engine& engine, const Batch& batch, float scale = 1.0f) {
  std::vector<float> g(engine.param_count());
  engine.forward_backward(batch, scale, false);
  engine.store_grads(g);
  return g;
}

void gradient_body(const Target& target, CaseRecord& record, const ScenarioSpace& space) {
  const Scenario s = *gen_scenario(space);
  record.size = size_of(s);
  const GradientOutcome o = check_sharded_gradient(s, target_for_case(target, s.simulated));
  record.ratio = std::max(o.sharded_ratio, o.whole_ratio);
  record.probabilistic_ratio = o.probabilistic_ratio;
  // Not probed at scale: one example of thousands lies within the bound of thousands of roundings, so
  // dropping it says nothing of the check's power (the worlds of 1 to 8 measure that).
  record.probe_ratio = s.simulated ? -1 : o.probe_ratio;
  RC_CLASSIFY(s.simulated, "the scale class: " + std::to_string(s.world_size) + " simulated ranks");
  record.note = o.note;
  RC_CLASSIFY(o.share_ratio > 1.0, "one share alone lies outside the bound");
  RC_CLASSIFY(o.uncertain_units > 0, "a ReLU within rounding of its kink");
  if (space.thresholds) {
    const std::vector<std::size_t> t = space.thresholds(s.world_size);
    RC_CLASSIFY(!t.empty() && o.parameters > *std::max_element(t.begin(), t.end()),
                "gradient beyond every algorithm threshold of the communicator");
  }
  RC_CLASSIFY(s.at_step > 0, "checked after training steps");
  RC_CLASSIFY(o.overflowed, "the checked step overflowed: every rank passed it over");
  if (!agree(target, o.passed))
    fail_case(o.message.empty() ? "another rank found the gradient outside the bound" : o.message);
}

}  // namespace

void gradient_average_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  ScenarioSpace space = space_for(target, draw);
  add_scale_class(space, target);
  gradient_body(target, record, space);
}

void accumulation_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  ScenarioSpace space = space_for(target, draw);
  add_scale_class(space, target);
  space.accumulate = true;
  gradient_body(target, record, space);
}

void uneven_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  ScenarioSpace space = space_for(target, draw);
  add_scale_class(space, target);
  space.uneven_only = true;
  gradient_body(target, record, space);
}

GradientOutcome check_sharded_gradient(const Scenario& s, const Target& target) {
  const SyntheticDataset data(s.train.data_size(), s.train.model, s.train.seed);
  GradientRun run;
  run.train = s.train;
  run.world_size = s.world_size;
  run.at_step = s.at_step;
  run.data = &data;
  return check_sharded_gradient(run, target);
}

GradientOutcome check_sharded_gradient(const GradientRun& run, const Target& target, GradientDetail* detail) {
  const TrainConfig& c = run.train;
  const Dataset& data = *run.data;
  std::vector<float> averaged, params;
  float loss_scale = 1;
  bool overflowed = false;
  run_world(target, run.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    if (run.params) rt.engine->load_params(*run.params);
    while (rt.trainer->next_step() < run.at_step) rt.trainer->step();
    std::vector<float> p(rt.engine->param_count());
    rt.engine->store_params(p);
    rt.trainer->compute_gradient(run.at_step);
    if (!records(target, comm)) return;
    overflowed = rt.trainer->found_inf();
    averaged.resize(rt.engine->param_count());
    rt.engine->store_grads(averaged);
    params = std::move(p);
    loss_scale = rt.trainer->scaler().scale();
  });

  // A step the loss scaler passes over has no gradient to check: the skip itself is what the replica
  // and optimizer properties hold to account (replicas_survive_overflow, optimizer_update_matches_formula).
  if (overflowed) {
    GradientOutcome o;
    o.overflowed = true;
    o.parameters = ParamLayout(c.model).size();
    return o;
  }
  const DistributedSampler sampler(c.sampler(run.world_size));
  const reference::StepExamples step = reference::step_examples(c, sampler, run.at_step);
  const Batch whole = data.gather(step.global());
  reference::BoundOptions options = bound_options(target, c);
  options.delta_scale = loss_scale;  // the backward pass ran at the scaler's scale
  reference::BoundOptions probabilistic = options;
  probabilistic.failure_probability = kProbabilisticFailure;
  const reference::GradientBound bound = reference::gradient_bound(c.model, params, whole, options);
  const reference::GradientBound bound_p = reference::gradient_bound(c.model, params, whole, probabilistic);
  // With mixed precision the shards' deltas are rounded at N times the whole batch's scale (bound.hpp):
  // the same model unless N is a power of two, so the sharded path may have a reference of its own.
  const reference::GradientBound bound_sharded = sharded_gradient_bound(bound, c.model, params, whole, run.world_size);
  const reference::GradientBound bound_sharded_p =
      sharded_gradient_bound(bound_p, c.model, params, whole, run.world_size);
  const ParamLayout layout(c.model);
  GradientOutcome o;
  o.uncertain_units = bound.uncertain_units;
  o.parameters = layout.size();

  const std::int64_t m_sharded = reference::sharded_roundings(step.largest_share(), run.world_size, options);
  const reference::Comparison sharded = reference::compare(averaged, bound_sharded, m_sharded);
  o.sharded_ratio = sharded.max_ratio;

  // The same engine on the whole batch at once.
  const std::unique_ptr<Engine> engine = make_engine(target, c.model);
  engine->load_params(params);
  // At the scaler's scale, as the trainer runs it, and unscaled (exactly) in the comparison.
  const double unscale = 1.0 / loss_scale;
  const std::vector<float> g = gradient_of(*engine, whole, loss_scale);
  const std::int64_t m_whole = reference::whole_batch_roundings(whole.size, options);
  const reference::Comparison whole_cmp = reference::compare(g, bound, m_whole, unscale);
  o.whole_ratio = whole_cmp.max_ratio;
  o.probabilistic_ratio = std::max(reference::compare(averaged, bound_sharded_p, m_sharded).max_ratio,
                                   reference::compare(g, bound_p, m_whole, unscale).max_ratio);
  o.note = sharded.max_ratio >= whole_cmp.max_ratio ? describe("all-reduced", sharded, bound_sharded, layout, m_sharded)
                                                    : describe("whole-batch", whole_cmp, bound, layout, m_whole);

  // Each rank's share alone, through the same engine (rank 0's only, unless the caller wants them all).
  // Rank 0's is a different batch: it lands outside the bound unless the check is too loose to tell
  // batches apart.
  std::vector<std::vector<float>> shares;
  for (std::size_t r = 0; r < (detail ? step.ranks.size() : 1); ++r)
    shares.push_back(step.ranks[r].empty() ? std::vector<float>(layout.size(), 0.0f)
                                           : gradient_of(*engine, data.gather(step.ranks[r]), loss_scale));
  for (std::vector<float>& share : shares)
    for (float& v : share) v = static_cast<float>(v * unscale);
  if (!step.ranks[0].empty()) o.share_ratio = reference::compare(shares[0], bound, m_sharded).max_ratio;
  // The power probe: the batch without its last example. A one-class cross-entropy has a zero
  // gradient whatever the batch, so there is nothing to tell apart. With mixed precision the probe
  // keeps the whole batch's weight per example ((B - 1) / B of the mean over B - 1), so that its deltas
  // round as the reference's do and only the missing example tells it apart.
  if (whole.size >= 2 && !(c.model.loss == Loss::cross_entropy && c.model.out_dim() == 1)) {
    const float probe_scale =
        options.input_format == Precision::fp32
            ? 1.0f
            : static_cast<float>(static_cast<double>(whole.size - 1) / static_cast<double>(whole.size));
    o.probe_ratio = reference::compare(gradient_of(*engine, whole.slice(0, whole.size - 1), probe_scale * loss_scale),
                                       bound, m_sharded, unscale)
                        .max_ratio;
  }

  o.passed = sharded.passed() && whole_cmp.passed();
  if (!sharded.passed())
    o.message = "the " + describe("all-reduced", sharded, bound_sharded, layout, m_sharded) + "; it exceeds the bound";
  else if (!whole_cmp.passed() && !std::isfinite(whole_cmp.worst_reference) && std::isfinite(sharded.worst_value)) {
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "at the loss scale the scaler holds (%g), the whole batch's gradient overflows at %s",
                  static_cast<double>(loss_scale), layout.describe_element(whole_cmp.worst).c_str());
    o.message =
        std::string(buf) +
        " (the float64 reference is not finite there either), yet the trainer's all-reduced gradient is finite: "
        "its backward pass did not run at the scaler's scale";
  } else if (!whole_cmp.passed())
    o.message = "the " + describe("whole-batch", whole_cmp, bound, layout, m_whole) + "; it exceeds the bound";
  if (detail) {
    for (const std::vector<std::int64_t>& share : step.ranks)
      detail->share_sizes.push_back(static_cast<std::int64_t>(share.size()));
    detail->shares = std::move(shares);
    detail->m_sharded = m_sharded;
    detail->m_whole = m_whole;
    detail->sharded = sharded;
    detail->whole_cmp = whole_cmp;
    detail->averaged = std::move(averaged);
    detail->whole = g;
    for (float& v : detail->whole) v = static_cast<float>(v * unscale);
    detail->bound = bound;
    detail->bound_sharded = bound_sharded;
  }
  return o;
}

}  // namespace dpcheck
