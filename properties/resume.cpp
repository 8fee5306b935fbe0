// checkpoint_resume_bitwise: train t steps (t anywhere in an epoch), checkpoint through the
// RankZeroWriter, tear every rank's state down, resume from the files alone and continue to T: the
// parameters, the optimizer state and the step counts must be the bits of T steps trained straight.
// Two runs of the same scenario are compared, so a run-to-run difference (a reduction whose order
// depends on timing) fails here too; the runner then says how often.
#include <bit>
#include <mutex>

#include "properties/common.hpp"
#include "src/train/replica_check.hpp"

namespace dpcheck {

void resume_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  ScenarioSpace space = space_for(target, draw);
  space.min_steps = 2;
  space.min_at_step = 1;
  const Scenario s = *gen_scenario(space);
  record.size = size_of(s);
  const ResumeOutcome o = check_checkpoint_resume(s, target);
  RC_CLASSIFY(s.train.optimizer.kind != OptimizerKind::sgd, "optimizer with state");
  RC_CLASSIFY(s.train.data_size() > s.train.batch, "epochs of several steps");
  if (!agree(target, o.passed)) fail_case(o.message.empty() ? "another rank's resumed state differs" : o.message);
}

ResumeOutcome check_checkpoint_resume(const Scenario& s, const Target& target) {
  const int stop_at = s.at_step;
  const TrainConfig& c = s.train;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  std::vector<Checkpoint> straight, resumed;
  std::mutex mu;
  const auto keep = [&](std::vector<Checkpoint>& into, Checkpoint&& ck) {
    const std::lock_guard<std::mutex> lock(mu);
    into.push_back(std::move(ck));
  };
  run_world(target, s.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    while (rt.trainer->next_step() < c.steps) rt.trainer->step();
    if (records(target, comm)) keep(straight, rt.trainer->checkpoint());
  });

  const std::filesystem::path dir = make_scratch(target, "resume");
  ResumeOutcome o;
  try {
    run_world(target, s.world_size, [&](Communicator& comm) {
      RankTrainer rt = make_rank_trainer(target, c, comm, data);
      while (rt.trainer->next_step() < stop_at) rt.trainer->step();
      make_writer(target, comm, dir, {})->save(rt.trainer->checkpoint(), c.model);
    });
    // Everything the first run held is gone; only the files carry the state across.
    run_world(target, s.world_size, [&](Communicator& comm) {
      RankTrainer rt = make_rank_trainer(target, c, comm, data);
      rt.trainer->restore(load_checkpoint(dir, c.model));
      while (rt.trainer->next_step() < c.steps) rt.trainer->step();
      if (records(target, comm)) keep(resumed, rt.trainer->checkpoint());
    });
  } catch (...) {
    remove_scratch(target, dir);
    throw;
  }
  remove_scratch(target, dir);

  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b, std::size_t* at) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) {
        *at = i;
        return false;
      }
    return true;
  };
  const ParamLayout layout(c.model);
  const auto value_text = [](float got, float want) {
    return float_bits_text(got) + " where the run that never stopped has " + float_bits_text(want) + " (" +
           std::to_string(ulp_distance(got, want)) + " ulp apart)";
  };
  const std::string after =
      "after resuming at step " + std::to_string(stop_at) + " and training to step " + std::to_string(c.steps) + ", ";
  for (std::size_t r = 0; r < straight.size() && o.passed; ++r) {
    std::size_t at = 0;
    const Checkpoint& a = straight[r];
    const Checkpoint& b = resumed[r];
    if (!same_bits(a.params, b.params, &at))
      o.message = after + "parameter " + layout.describe_element(at) + " is " + value_text(b.params[at], a.params[at]);
    else if (!same_bits(a.optimizer_state, b.optimizer_state, &at))
      o.message = after + "optimizer state " + a.state_names[at / a.params.size()] + " at " +
                  layout.describe_element(at % a.params.size()) + " is " +
                  value_text(b.optimizer_state[at], a.optimizer_state[at]);
    else if (a.optimizer_steps != b.optimizer_steps)
      o.message = after + "the optimizer counts " + std::to_string(b.optimizer_steps) + " steps instead of " +
                  std::to_string(a.optimizer_steps);
    else if (a.loss_scaler != b.loss_scaler)
      o.message = after + "the loss scaler's state (scale, counter, skipped steps) differs from the straight run's";
    else if (a.step != b.step)
      o.message = after + "the trainer is at step " + std::to_string(b.step) + " instead of " + std::to_string(a.step);
    o.passed = o.message.empty();
  }
  return o;
}

}  // namespace dpcheck
