// replicas_bitwise_synchronized: every step, every optimizer, every replica's parameters and optimizer
// state bitwise identical -- by the trainer's own replica check each step, and independently by a
// gather of every rank's final bytes, so a replica check that misses a difference is caught too.
#include <algorithm>
#include <bit>
#include <mutex>

#include "properties/common.hpp"

namespace dpcheck {

void replicas_body(const Target& target, CaseRecord& record) {
  const Scenario s = *gen_scenario(space_for(target));
  record.size = size_of(s);
  const ReplicaOutcome o = check_replica_sync(s, target);
  RC_CLASSIFY(!o.parameters_moved, "parameters never moved");
  if (!agree(target, o.passed)) fail_case(o.message.empty() ? "another rank found the replicas out of sync" : o.message);
}

ReplicaOutcome check_replica_sync(const Scenario& s, const Target& target) {
  const TrainConfig& c = s.train;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
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
    const std::size_t total = n + rt.optimizer->state_size();
    std::vector<float> mine(total);
    rt.engine->store_params(std::span<float>(mine.data(), n));
    rt.optimizer->store_state(std::span<float>(mine.data() + n, rt.optimizer->state_size()));
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
