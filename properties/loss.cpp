// reported_loss_is_global_mean: the loss a step reports (what users plot, and compare across world
// sizes) must be the mean over the step's global batch, whatever the shares' sizes: not a mean of the
// ranks' means. It is held against the float64 mean loss of the step's examples (restated on their
// own, reference/schedule.hpp) within the loss's derived bound (reference::GradientBound::loss_bound).
#include <cmath>
#include <cstdio>

#include "properties/common.hpp"
#include "reference/bound.hpp"
#include "reference/schedule.hpp"
#include "verdict/bounds.hpp"

namespace dpcheck {

void loss_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  step_check_body(target, draw, record, check_reported_loss, "another rank's reported loss left the bound", nullptr,
                  /*scale=*/true);
}

StepOutcome check_reported_loss(const Scenario& s, const Target& target) {
  const TrainConfig& c = s.train;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  double loss = 0;
  std::vector<float> params;
  run_world(target, s.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    while (rt.trainer->next_step() < s.at_step) rt.trainer->step();
    std::vector<float> p(rt.engine->param_count());
    rt.engine->store_params(p);
    const StepResult r = rt.trainer->step();
    if (!records(target, comm)) return;
    loss = r.loss;
    params = std::move(p);
  });
  const DistributedSampler sampler(c.sampler(s.world_size));
  const reference::StepExamples step = reference::step_examples(c, sampler, s.at_step);
  const reference::GradientBound bound =
      reference::gradient_bound(c.model, params, data.gather(step.global()), bound_options(target));
  const double err = std::abs(loss - bound.loss);
  StepOutcome o;
  o.ratio = !std::isfinite(loss) ? INFINITY : err == 0 ? 0.0 : bound.loss_bound > 0 ? err / bound.loss_bound : INFINITY;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %d reports loss %.17g; the mean over its %zu examples is %.17g (error %.3g, bound %.3g, error "
                "ratio %.4g)",
                s.at_step, loss, step.global().size(), bound.loss, err, bound.loss_bound, o.ratio);
  o.note = buf;
  o.passed = o.ratio <= 1.0;
  if (!o.passed) o.message = o.note;
  return o;
}

}  // namespace dpcheck
