// replicas_bitwise_synchronized: every step, every optimizer, every replica's parameters and optimizer
// state bitwise identical -- by the trainer's own replica check each step, and independently by a
// gather of every rank's final bytes, so a replica check that misses a difference is caught too.
//
// replicas_survive_overflow: the same with a dynamic loss scaler and drawn examples whose values
// overflow on the rank that holds them (the scaled gradient, or in fp16 the forward pass already). Every rank must skip
// exactly the steps that overflowed somewhere, so the parameters, the optimizer state and the scaler's scale, counter
// and skipped steps stay bitwise identical; a rank that decides from its own gradient alone leaves the others for good.
#include <algorithm>
#include <bit>
#include <mutex>

#include "properties/common.hpp"

namespace dpcheck {

namespace {

// Examples at the poisoned indices carry 1e36 in every input and mse target; the rest are the inner
// data set's.
class PoisonedDataset final : public Dataset {
 public:
  PoisonedDataset(const Dataset& inner, std::vector<std::int64_t> poisoned)
      : inner_(inner), poisoned_(std::move(poisoned)) {}
  std::int64_t size() const override { return inner_.size(); }
  int in_dim() const override { return inner_.in_dim(); }
  int out_dim() const override { return inner_.out_dim(); }
  Loss loss() const override { return inner_.loss(); }
  void example(std::int64_t index, float* x, float* y, std::int64_t* label) const override {
    inner_.example(index, x, y, label);
    if (std::find(poisoned_.begin(), poisoned_.end(), index) == poisoned_.end()) return;
    std::fill_n(x, in_dim(), 1e36f);
    if (y) std::fill_n(y, out_dim(), -1e36f);
  }

 private:
  const Dataset& inner_;
  std::vector<std::int64_t> poisoned_;
};

}  // namespace

void overflow_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  ScenarioSpace space = space_for(target, draw);
  space.loss_scaling.kind = LossScaling::dynamic;
  space.loss_scaling.growth_interval = 2;
  space.min_steps = 2;
  const Scenario s = *gen_scenario(space);
  record.size = size_of(s);
  // One or two examples, anywhere in the data set: the ranks and steps that meet them follow from the
  // sampler.
  std::vector<std::int64_t> poisoned{*rc::gen::inRange<std::int64_t>(0, s.train.data_size())};
  if (*rc::gen::inRange(0, 2) == 1) poisoned.push_back(*rc::gen::inRange<std::int64_t>(0, s.train.data_size()));
  const ReplicaOutcome o = check_replica_sync(s, target, poisoned);
  RC_CLASSIFY(o.skipped_steps > 0, "some step overflowed and every rank passed it over");
  RC_CLASSIFY(o.skipped_steps == 0, "no step overflowed (the poisoned example's gradient stayed finite)");
  if (!agree(target, o.passed))
    fail_case(o.message.empty() ? "another rank found the replicas out of sync" : o.message);
}

void replicas_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  const Scenario s = *gen_scenario(space_for(target, draw));
  record.size = size_of(s);
  const ReplicaOutcome o = check_replica_sync(s, target);
  RC_CLASSIFY(!o.parameters_moved, "parameters never moved");
  if (!agree(target, o.passed))
    fail_case(o.message.empty() ? "another rank found the replicas out of sync" : o.message);
}

ReplicaOutcome check_replica_sync(const Scenario& s, const Target& target, const std::vector<std::int64_t>& poisoned) {
  const TrainConfig& c = s.train;
  const SyntheticDataset synthetic(c.data_size(), c.model, c.seed);
  const PoisonedDataset data(synthetic, poisoned);
  ReplicaOutcome o;
  std::mutex mu;
  run_world(target, s.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    const std::size_t n = rt.engine->param_count();
    std::vector<float> initial(n);
    rt.engine->store_params(initial);
    bool hash_says_synced = true;
    std::string first_report;
    for (int step = 0; step < c.steps && hash_says_synced; ++step) {
      const StepResult r = rt.trainer->step();
      if (!r.replicas.synchronized) {
        hash_says_synced = false;
        first_report = r.replicas.describe();
      }
    }
    // Independently of the hashes: gather everyone's final parameters and state and compare bytes,
    // so that a replica check that misses a difference is caught too.
    // The scaler's state rides along as three more floats' worth of bits.
    const std::size_t total = n + rt.optimizer->state_size() + 3;
    std::vector<float> mine(total);
    rt.engine->store_params(std::span<float>(mine.data(), n));
    rt.optimizer->store_state(std::span<float>(mine.data() + n, rt.optimizer->state_size()));
    const LossScalerState& scaler = rt.trainer->scaler().state();
    mine[total - 3] = scaler.scale;
    mine[total - 2] = std::bit_cast<float>(static_cast<std::uint32_t>(scaler.growth_tracker));
    mine[total - 1] = std::bit_cast<float>(static_cast<std::uint32_t>(scaler.skipped));
    std::vector<float> all(total * static_cast<std::size_t>(comm.size()));
    comm.host().allgather(mine.data(), all.data(), total, DType::f32);
    bool bytes_equal = true;
    for (std::size_t r = 1; r < static_cast<std::size_t>(comm.size()); ++r)
      bytes_equal &= std::equal(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(total),
                                all.begin() + static_cast<std::ptrdiff_t>(r * total), [](float a, float b) {
                                  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
                                });
    if (!records(target, comm)) return;
    const std::lock_guard<std::mutex> lock(mu);
    o.parameters_moved = !std::equal(initial.begin(), initial.end(), mine.begin());
    o.skipped_steps = scaler.skipped;
    if (!hash_says_synced) {
      o.passed = false;
      o.message = first_report;
    } else if (!bytes_equal) {
      o.passed = false;
      o.message = "the replica check reported identical replicas, but their bytes differ";
    }
  });
  return o;
}

}  // namespace dpcheck
