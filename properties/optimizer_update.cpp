// optimizer_update_matches_formula: the replica check only says that ranks agree, so an optimizer
// that every rank gets wrong the same way (a missing bias correction, eps inside the square root,
// dampened momentum) would pass everything else. Here every step of every rank is held against
// PyTorch's formula evaluated in float64 from the same float32 inputs -- the parameters, the
// all-reduced gradient and the state before the step -- within a derived float32 bound
// (reference::optimizer_step_bound), and the step count must advance by one.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "properties/common.hpp"
#include "reference/optimizer.hpp"
#include "reference/training_rules.hpp"
#include "src/train/replica_check.hpp"

namespace dpcheck {

void optimizer_update_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  step_check_body(target, draw, record, check_optimizer_update, "another rank's update left the formula's bound",
                  [](const Scenario& s) {
                    RC_CLASSIFY(s.train.optimizer.kind == OptimizerKind::adam, "adam");
                    RC_CLASSIFY(s.train.optimizer.kind == OptimizerKind::momentum, "momentum");
                  });
}

StepOutcome check_optimizer_update(const Scenario& s, const Target& target) {
  const TrainConfig& c = s.train;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  const ParamLayout layout(c.model);
  const OptimizerConfig config = c.optimizer_for(s.world_size);
  StepOutcome o;
  // Each rank's worst element and first error, chosen from in rank order afterwards: which thread
  // finishes first must not change the case a report shows (replicas tie on every element).
  std::vector<WorstElement> worst_of(static_cast<std::size_t>(s.world_size));
  std::vector<std::string> step_error_of(static_cast<std::size_t>(s.world_size));
  run_world(target, s.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    const std::size_t n = rt.engine->param_count(), k = rt.optimizer->state_size();
    const std::vector<std::string> names = rt.optimizer->state_names();
    std::vector<float> p0(n), p1(n), g(n), st0(k), st1(k);
    WorstElement mine;
    std::string my_step_error;
    for (int step = 0; step < c.steps; ++step) {
      rt.engine->store_params(p0);
      rt.optimizer->store_state(st0);
      const std::int64_t t0 = rt.optimizer->steps();
      const bool skipped = rt.trainer->step().skipped;
      rt.engine->store_grads(g);
      rt.engine->store_params(p1);
      rt.optimizer->store_state(st1);
      if (skipped) {
        // A step the loss scaler skips must leave the parameters, the state and the count as they were.
        if (my_step_error.empty() &&
            (std::memcmp(p0.data(), p1.data(), n * sizeof(float)) != 0 ||
             // (SGD has no state: memcmp may not take its null data)
             (k > 0 && std::memcmp(st0.data(), st1.data(), k * sizeof(float)) != 0) || rt.optimizer->steps() != t0))
          my_step_error = "rank " + std::to_string(comm.rank()) + " step " + std::to_string(step) +
                          ": the loss scaler skipped the step, but the parameters, the optimizer state or its step "
                          "count changed";
        continue;
      }
      if (rt.optimizer->steps() != t0 + 1 && my_step_error.empty())
        my_step_error = "rank " + std::to_string(comm.rank()) + " step " + std::to_string(step) +
                        ": the optimizer counts " + std::to_string(rt.optimizer->steps()) + " steps after its step " +
                        std::to_string(t0 + 1);
      OptimizerConfig at_step = config;
      // The rate of this step by Goyal et al.'s rule, restated (reference/training_rules.hpp).
      at_step.lr = reference::goyal_lr(c.optimizer.lr, c.linear_scaling, c.warmup_steps, step, s.world_size);
      const reference::OptimizerStepBound want = reference::optimizer_step_bound(at_step, p0, g, st0, t0);
      const std::string at = "rank " + std::to_string(comm.rank()) + ", step " + std::to_string(step) + ": ";
      worst_against_formula(
          p1, want.params, want.params_bound, at + "parameter",
          [&](std::size_t i) { return layout.describe_element(i); }, mine);
      worst_against_formula(
          st1, want.state, want.state_bound, at + "optimizer state",
          [&](std::size_t i) { return names[i / n] + " at " + layout.describe_element(i % n); }, mine);
    }
    worst_of[static_cast<std::size_t>(comm.rank())] = std::move(mine);
    step_error_of[static_cast<std::size_t>(comm.rank())] = std::move(my_step_error);
  });
  WorstElement worst;
  std::string step_error;
  for (std::size_t r = 0; r < worst_of.size(); ++r) {
    if (worst_of[r].ratio > worst.ratio || worst.where.empty()) worst = worst_of[r];
    if (step_error.empty()) step_error = step_error_of[r];
  }
  o.ratio = worst.ratio;
  o.note = worst.where;
  if (!step_error.empty()) o.message = step_error;
  else if (worst.ratio > 1.0) o.message = worst.where + ": the update leaves the bound of PyTorch's formula";
  o.passed = o.message.empty();
  return o;
}

}  // namespace dpcheck
