// Tests for src/train/trainer: how a step is cut out of the sampler's shares (slots, global batch, steps
// per epoch, worked out by hand for each policy), that the all-reduced gradient is the gradient of
// the mean loss over the global batch (bitwise for one rank, within the derived rounding bound of
// the float64 reference otherwise), that its loss is the example-weighted mean of the shard losses,
// and that step() keeps every replica identical. Ranks run as threads through run_local.
//
// And src/train/training_run: one rank's part of a training run, with the checks it is given. Every
// rank steps to the end, logging a line a step and checkpointing on rank 0; on a failure, whether the
// trainer's own check finds it after the step (replicas that differ) or a check inside the step stops it
// (StepCheckFailed on every rank), every rank stops at the same step, rank 0 alone leaves the bundle,
// and its account says so. Those ranks run as threads of the local backend, through run_world.
#include "src/train/trainer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "reference/bound.hpp"
#include "src/comm/local_comm.hpp"
#include "src/error.hpp"
#include "src/target/target.hpp"
#include "src/train/training_run.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

using Indices = std::vector<std::int64_t>;

constexpr Split kSplits[] = {Split::strided, Split::contiguous};
constexpr Policy kPolicies[] = {Policy::pad, Policy::drop_last, Policy::uneven};

TrainConfig config_of(std::int64_t batch, std::int64_t dataset_size, Policy policy, Split split = Split::strided,
                      Loss loss = Loss::mse) {
  TrainConfig c;
  c.model.dims = {3, 5, 2};
  c.model.activation = Activation::tanh;
  c.model.loss = loss;
  c.batch = batch;
  c.dataset_size = dataset_size;
  c.policy = policy;
  c.split = split;
  c.seed = 17;
  c.optimizer.kind = OptimizerKind::sgd;
  c.optimizer.lr = 0.1f;
  return c;
}

std::string describe(const TrainConfig& c, int world) {
  return "N=" + std::to_string(world) + " batch=" + std::to_string(c.batch) + " data=" + std::to_string(c.data_size()) +
         " " + std::string(split_name(c.split)) + " " + std::string(policy_name(c.policy)) +
         " accumulate=" + std::to_string(c.accumulate) + " " + std::string(loss_name(c.model.loss));
}

// Everything one rank owns, built the way the dpcheck command builds it: the same seed gives every
// rank the same parameters and data with no communication.
struct Rank {
  SyntheticDataset data;
  DistributedSampler sampler;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Optimizer> optimizer;
  Trainer trainer;

  Rank(const TrainConfig& c, Communicator& comm)
      : data(c.data_size(), c.model, c.seed),
        sampler(c.sampler(comm.size())),
        engine(loaded_engine(c)),
        optimizer(make_cpu_optimizer(c.optimizer_for(comm.size()), engine->param_count())),
        trainer(c, comm, *engine, *optimizer, sampler, data) {}

  static std::unique_ptr<Engine> loaded_engine(const TrainConfig& c) {
    auto e = make_cpu_engine(c.model);
    e->load_params(init_params(c.model, c.seed));
    return e;
  }

  std::vector<float> grads() const {
    std::vector<float> g(engine->param_count());
    engine->store_grads(g);
    return g;
  }
  std::vector<float> params() const {
    std::vector<float> p(engine->param_count());
    engine->store_params(p);
    return p;
  }
};

// Runs fn on every rank of a local world; results go into per-rank slots of the caller's vectors.
void run_ranks(const TrainConfig& c, int world, const std::function<void(Rank&)>& fn) {
  run_local(world, [&](Communicator& comm) {
    Rank rank(c, comm);
    fn(rank);
  });
}

std::size_t at(int rank) { return static_cast<std::size_t>(rank); }

// ---- split_sizes ----------------------------------------------------------------------------------

TEST(SplitSizes, MatchesNumpyArraySplit) {
  EXPECT_EQ(split_sizes(10, 3), (Indices{4, 3, 3}));
  EXPECT_EQ(split_sizes(2, 4), (Indices{1, 1, 0, 0}));
  EXPECT_EQ(split_sizes(0, 2), (Indices{0, 0}));
  EXPECT_EQ(split_sizes(9, 3), (Indices{3, 3, 3}));
  EXPECT_EQ(split_sizes(7, 1), (Indices{7}));
  EXPECT_EQ(split_sizes(11, 4), (Indices{3, 3, 3, 2}));
  EXPECT_THROW(split_sizes(-1, 2), Error);
  EXPECT_THROW(split_sizes(3, 0), Error);
}

// ---- configuration --------------------------------------------------------------------------------

TEST(TrainConfigCheck, ValidateRejectsEmptyOrZeroSizes) {
  const TrainConfig good = config_of(10, 0, Policy::pad);
  EXPECT_NO_THROW(good.validate(4));
  auto with = [&](const std::function<void(TrainConfig&)>& change) {
    TrainConfig c = good;
    change(c);
    return c;
  };
  EXPECT_THROW(with([](TrainConfig& c) { c.batch = 0; }).validate(1), UsageError);
  EXPECT_THROW(with([](TrainConfig& c) { c.batch = -3; }).validate(1), UsageError);
  EXPECT_THROW(with([](TrainConfig& c) { c.steps = 0; }).validate(1), UsageError);
  EXPECT_THROW(with([](TrainConfig& c) { c.accumulate = 0; }).validate(1), UsageError);
  EXPECT_THROW(with([](TrainConfig& c) { c.dataset_size = -1; }).validate(1), UsageError);
  EXPECT_THROW(with([](TrainConfig& c) { c.model.dims = {3}; }).validate(1), UsageError);
  EXPECT_THROW(good.validate(0), UsageError);
  EXPECT_EQ(good.data_size(), 10);
  EXPECT_EQ(with([](TrainConfig& c) { c.dataset_size = 25; }).data_size(), 25);
}

TEST(TrainConfigCheck, DropLastNeedsAnExamplePerRank) {
  const TrainConfig c = config_of(3, 0, Policy::drop_last);
  try {
    c.validate(4);
    FAIL() << "drop-last with 3 examples on 4 ranks was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("drop-last"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(c.validate(3));
  // Pad and uneven give every rank something (a repeat, or an empty share that still takes part).
  EXPECT_NO_THROW(config_of(3, 0, Policy::pad).validate(4));
  EXPECT_NO_THROW(config_of(3, 0, Policy::uneven).validate(4));
}

TEST(TrainConfigCheck, LinearScalingMultipliesLrByWorldSizeOnlyWhenEnabled) {
  TrainConfig c = config_of(8, 0, Policy::pad);
  c.optimizer.lr = 0.01;
  EXPECT_EQ(c.optimizer_for(4).lr, 0.01);
  c.linear_scaling = true;
  EXPECT_EQ(c.optimizer_for(4).lr, 0.04);
  EXPECT_EQ(c.optimizer_for(1).lr, 0.01);
  EXPECT_EQ(c.optimizer_for(8).kind, c.optimizer.kind);
}

TEST(TrainConfigCheck, SamplerConfigFollowsTheTrainConfig) {
  TrainConfig c = config_of(8, 30, Policy::uneven, Split::contiguous);
  c.shuffle = false;
  const SamplerConfig s = c.sampler(3);
  EXPECT_EQ(s.dataset_size, 30);
  EXPECT_EQ(s.world_size, 3);
  EXPECT_FALSE(s.shuffle);
  EXPECT_EQ(s.seed, c.seed);
  EXPECT_EQ(s.split, Split::contiguous);
  EXPECT_EQ(s.policy, Policy::uneven);
}

// ---- slots, global batch, epochs ------------------------------------------------------------------

TEST(TrainerSlots, GlobalBatchAndSlotSizesPerPolicy) {
  // Batch 10 on 4 ranks, the data set one batch: pad to 12 (3 each), drop to 8 (2 each), or keep
  // 10 as 3, 3, 2, 2 -- whichever the split.
  const int world = 4;
  struct Case {
    Policy policy;
    std::int64_t global;
    Indices slots;
  };
  for (const Case& k : {Case{Policy::pad, 12, {3, 3, 3, 3}}, Case{Policy::drop_last, 8, {2, 2, 2, 2}},
                        Case{Policy::uneven, 10, {3, 3, 2, 2}}}) {
    for (Split split : kSplits) {
      const TrainConfig c = config_of(10, 0, k.policy, split);
      SCOPED_TRACE(describe(c, world));
      std::vector<std::int64_t> global(world), local(world);
      std::vector<Indices> slots(world);
      run_ranks(c, world, [&](Rank& r) {
        const int me = r.trainer.rank();
        global[at(me)] = r.trainer.global_batch(0);
        local[at(me)] = static_cast<std::int64_t>(r.trainer.local_indices(0).size());
        for (int q = 0; q < world; ++q) {
          const Trainer::Slot s = r.trainer.slot(q, 0);
          EXPECT_EQ(s.epoch, 0);
          EXPECT_EQ(s.begin, 0);
          slots[at(me)].push_back(s.end - s.begin);
        }
      });
      for (int q = 0; q < world; ++q) {
        EXPECT_EQ(global[at(q)], k.global);
        EXPECT_EQ(slots[at(q)], k.slots);
        EXPECT_EQ(local[at(q)], k.slots[at(q)]);
      }
    }
  }
}

TEST(TrainerSlots, StepsPerEpochAndEveryExampleOncePerEpochWhenUneven) {
  // 40 examples, batch 10, 2 ranks: shares of 20 taken 5 at a time, so 4 steps an epoch.
  const TrainConfig c = config_of(10, 40, Policy::uneven);
  std::vector<std::vector<Indices>> global_by_step(2);
  run_ranks(c, 2, [&](Rank& r) {
    for (std::int64_t step = 0; step < 12; ++step) {
      for (int q = 0; q < 2; ++q) {
        const Trainer::Slot s = r.trainer.slot(q, step);
        EXPECT_EQ(s.epoch, step / 4) << "step " << step;
        EXPECT_EQ(s.begin, (step % 4) * 5) << "step " << step;
        EXPECT_EQ(s.end, (step % 4) * 5 + 5) << "step " << step;
      }
      EXPECT_EQ(r.trainer.global_batch(step), 10);
      global_by_step[at(r.trainer.rank())].push_back(r.trainer.global_indices(step));
    }
  });
  Indices all(40);
  std::iota(all.begin(), all.end(), 0);
  for (int epoch = 0; epoch < 3; ++epoch) {
    Indices seen;
    for (int s = 4 * epoch; s < 4 * epoch + 4; ++s)
      seen.insert(seen.end(), global_by_step[0][at(s)].begin(), global_by_step[0][at(s)].end());
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, all) << "epoch " << epoch;
  }
  // A new epoch is a new shuffle.
  EXPECT_NE(global_by_step[0][0], global_by_step[0][4]);
  EXPECT_EQ(global_by_step[0], global_by_step[1]);
}

TEST(TrainerSlots, UnevenSharesEndWithAShortStep) {
  // 40 examples on 3 ranks: shares 14, 13, 13 taken ceil(10/3) = 4 at a time: 4 steps of 12, 12,
  // 12 and 2 + 1 + 1 = 4, and every example once per epoch for either split.
  for (Split split : kSplits) {
    const TrainConfig c = config_of(10, 40, Policy::uneven, split);
    SCOPED_TRACE(describe(c, 3));
    std::vector<Indices> batches(3);
    std::vector<Indices> seen(3);
    run_ranks(c, 3, [&](Rank& r) {
      for (std::int64_t step = 0; step < 4; ++step) {
        batches[at(r.trainer.rank())].push_back(r.trainer.global_batch(step));
        const Indices g = r.trainer.global_indices(step);
        seen[at(r.trainer.rank())].insert(seen[at(r.trainer.rank())].end(), g.begin(), g.end());
      }
      EXPECT_EQ(r.trainer.slot(0, 4).epoch, 1);
    });
    Indices all(40);
    std::iota(all.begin(), all.end(), 0);
    for (int q = 0; q < 3; ++q) {
      EXPECT_EQ(batches[at(q)], (Indices{12, 12, 12, 4}));
      std::sort(seen[at(q)].begin(), seen[at(q)].end());
      EXPECT_EQ(seen[at(q)], all);
    }
  }
}

TEST(TrainerSlots, GlobalIndicesIsEveryRanksLocalIndicesInRankOrder) {
  const int world = 3;
  for (Policy policy : kPolicies) {
    for (Split split : kSplits) {
      const TrainConfig c = config_of(7, 20, policy, split);
      SCOPED_TRACE(describe(c, world));
      const int steps = 8;  // more than an epoch
      std::vector<std::vector<Indices>> local(world), global(world);
      run_ranks(c, world, [&](Rank& r) {
        for (std::int64_t s = 0; s < steps; ++s) {
          local[at(r.trainer.rank())].push_back(r.trainer.local_indices(s));
          global[at(r.trainer.rank())].push_back(r.trainer.global_indices(s));
          EXPECT_EQ(static_cast<std::int64_t>(global[at(r.trainer.rank())].back().size()), r.trainer.global_batch(s));
        }
      });
      for (int s = 0; s < steps; ++s) {
        Indices joined;
        for (int q = 0; q < world; ++q)
          joined.insert(joined.end(), local[at(q)][at(s)].begin(), local[at(q)][at(s)].end());
        EXPECT_FALSE(joined.empty()) << "step " << s;
        for (int q = 0; q < world; ++q) EXPECT_EQ(global[at(q)][at(s)], joined) << "rank " << q << " step " << s;
      }
    }
  }
}

TEST(TrainerSlots, LargestMicroBatchIsTheCeilingOverRanks) {
  // Uneven batch 10 on 4 ranks: slots 3, 3, 2, 2.
  for (const auto& [accumulate, largest] : {std::pair{1, 3}, std::pair{2, 2}, std::pair{3, 1}, std::pair{5, 1}}) {
    TrainConfig c = config_of(10, 0, Policy::uneven);
    c.accumulate = accumulate;
    std::vector<std::int64_t> got(4);
    run_ranks(c, 4, [&](Rank& r) { got[at(r.trainer.rank())] = r.trainer.largest_micro_batch(0); });
    EXPECT_EQ(got, Indices(4, largest)) << "accumulate " << accumulate;
  }
}

// ---- compute_gradient -----------------------------------------------------------------------------

TEST(TrainerGradient, SingleRankEqualsTheEngineWholeBatchGradientBitwise) {
  // N = 1 and one micro-batch: the shard weight is 1 and avg divides by 1, both exact.
  for (Loss loss : {Loss::mse, Loss::cross_entropy}) {
    const TrainConfig c = config_of(12, 30, Policy::pad, Split::strided, loss);
    SCOPED_TRACE(describe(c, 1));
    run_ranks(c, 1, [&](Rank& r) {
      for (std::int64_t step : {0, 1, 2}) {
        const double got_loss = r.trainer.compute_gradient(step);
        const std::vector<float> got = r.grads();
        const auto direct = Rank::loaded_engine(c);
        const double want_loss = direct->forward_backward(r.data.gather(r.trainer.global_indices(step)), 1.0f, false);
        std::vector<float> want(direct->param_count());
        direct->store_grads(want);
        EXPECT_EQ(got, want) << "step " << step;
        EXPECT_EQ(got_loss, want_loss) << "step " << step;
        EXPECT_NE(want, std::vector<float>(want.size(), 0.0f));
      }
    });
  }
}

TEST(TrainerGradient, BitwiseIdenticalOnEveryRank) {
  const int world = 3;
  for (Loss loss : {Loss::mse, Loss::cross_entropy}) {
    TrainConfig c = config_of(10, 0, Policy::uneven, Split::contiguous, loss);
    c.accumulate = 2;
    SCOPED_TRACE(describe(c, world));
    std::vector<std::vector<float>> grads(world);
    std::vector<double> losses(world);
    run_ranks(c, world, [&](Rank& r) {
      losses[at(r.trainer.rank())] = r.trainer.compute_gradient(0);
      grads[at(r.trainer.rank())] = r.grads();
    });
    EXPECT_NE(grads[0], std::vector<float>(grads[0].size(), 0.0f));
    for (int q = 1; q < world; ++q) {
      EXPECT_EQ(grads[at(q)], grads[0]) << "rank " << q;
      EXPECT_EQ(losses[at(q)], losses[0]) << "rank " << q;
    }
  }
}

// The all-reduced gradient of `c` on `world` ranks at step 0, and the bound on its error from the
// float64 reference of the global batch: m counts the roundings of the sharded path.
struct ShardedGradient {
  std::vector<float> grad;
  std::int64_t roundings = 0;
  Indices global;
};

ShardedGradient sharded_gradient(const TrainConfig& c, int world) {
  ShardedGradient out;
  run_ranks(c, world, [&](Rank& r) {
    r.trainer.compute_gradient(0);
    if (r.trainer.rank() != 0) return;
    out.grad = r.grads();
    out.global = r.trainer.global_indices(0);
    std::int64_t largest_share = 0;
    for (int q = 0; q < world; ++q) {
      const Trainer::Slot slot = r.trainer.slot(q, 0);
      largest_share = std::max(largest_share, slot.end - slot.begin);
    }
    out.roundings = reference::sharded_roundings(largest_share, world);
  });
  return out;
}

TEST(TrainerGradient, AccumulationStaysWithinTheDerivedBoundOfOneMicroBatch) {
  // Splitting a shard into k micro-batches changes only the order of the float32 sums, so both
  // gradients lie within their rounding bounds of the float64 reference, and of each other within
  // the sum of the two bounds. Cases include unequal shares and ranks with nothing to train on.
  struct Case {
    std::int64_t batch, data;
    int world;
    Policy policy;
    Loss loss;
  };
  for (const Case& k : {Case{16, 0, 2, Policy::pad, Loss::mse}, Case{10, 0, 3, Policy::uneven, Loss::cross_entropy},
                        Case{10, 0, 3, Policy::pad, Loss::mse}, Case{2, 0, 4, Policy::uneven, Loss::mse},
                        Case{9, 0, 1, Policy::pad, Loss::cross_entropy}}) {
    TrainConfig c1 = config_of(k.batch, k.data, k.policy, Split::strided, k.loss);
    TrainConfig ck = c1;
    ck.accumulate = 3;
    SCOPED_TRACE(describe(ck, k.world));
    const ShardedGradient one = sharded_gradient(c1, k.world), many = sharded_gradient(ck, k.world);
    ASSERT_EQ(one.global, many.global);

    const SyntheticDataset data(c1.data_size(), c1.model, c1.seed);
    const std::vector<float> params = init_params(c1.model, c1.seed);
    const reference::GradientBound bound = reference::gradient_bound(c1.model, params, data.gather(one.global));
    const reference::Comparison cmp_one = reference::compare(one.grad, bound, one.roundings);
    const reference::Comparison cmp_many = reference::compare(many.grad, bound, many.roundings);
    EXPECT_TRUE(cmp_one.passed()) << "error ratio " << cmp_one.max_ratio << " at " << cmp_one.worst;
    EXPECT_TRUE(cmp_many.passed()) << "error ratio " << cmp_many.max_ratio << " at " << cmp_many.worst;

    double largest_grad = 0, largest_bound = 0;
    for (std::size_t i = 0; i < one.grad.size(); ++i) {
      const double b = bound.bound(i, one.roundings) + bound.bound(i, many.roundings);
      EXPECT_LE(std::abs(static_cast<double>(one.grad[i]) - many.grad[i]), b) << "element " << i;
      largest_grad = std::max(largest_grad, std::abs(bound.reference.grad[i]));
      largest_bound = std::max(largest_bound, b);
    }
    // The tolerance is tight: far below the gradient itself, so a wrong weight would show.
    EXPECT_LT(largest_bound, 1e-4 * largest_grad);
  }
}

TEST(TrainerGradient, LossIsTheExampleWeightedMeanOfShardLosses) {
  // Uneven batch 10 on 4 ranks (shares 3, 3, 2, 2) and pad batch 10 on 4 (3 each, two repeats):
  // the loss is sum_r b_r L_r / B, with L_r the engine's mean loss on rank r's examples.
  for (Policy policy : {Policy::uneven, Policy::pad}) {
    for (Loss loss : {Loss::mse, Loss::cross_entropy}) {
      const TrainConfig c = config_of(10, 0, policy, Split::strided, loss);
      const int world = 4;
      SCOPED_TRACE(describe(c, world));
      std::vector<double> trainer_loss(world), shard_loss(world);
      std::vector<std::int64_t> share(world), global(world);
      run_ranks(c, world, [&](Rank& r) {
        const int me = r.trainer.rank();
        const Indices idx = r.trainer.local_indices(0);
        share[at(me)] = static_cast<std::int64_t>(idx.size());
        global[at(me)] = r.trainer.global_batch(0);
        shard_loss[at(me)] = Rank::loaded_engine(c)->forward_backward(r.data.gather(idx), 1.0f, false);
        trainer_loss[at(me)] = r.trainer.compute_gradient(0);
      });
      double weighted = 0, unweighted = 0;
      for (int q = 0; q < world; ++q) {
        weighted += static_cast<double>(share[at(q)]) * shard_loss[at(q)];
        unweighted += shard_loss[at(q)];
      }
      weighted /= static_cast<double>(global[0]);
      unweighted /= world;
      // The same float64 products summed in the same rank order; allow a few roundings of the sum.
      for (int q = 0; q < world; ++q)
        EXPECT_NEAR(trainer_loss[at(q)], weighted, 8 * 0x1p-53 * weighted) << "rank " << q;
      // Unequal shares make the weighting matter: the plain mean of the shard losses is different.
      if (policy == Policy::uneven) {
        EXPECT_GT(std::abs(weighted - unweighted), 1e-9 * weighted);
      }
    }
  }
}

// ---- step -----------------------------------------------------------------------------------------

TEST(TrainerStep, AdvancesAndReturnsASynchronizedReplicaReport) {
  TrainConfig c = config_of(9, 27, Policy::uneven, Split::strided, Loss::cross_entropy);
  c.optimizer.kind = OptimizerKind::momentum;
  const int world = 3;
  const std::vector<float> start = init_params(c.model, c.seed);
  std::vector<std::vector<StepResult>> results(world);
  std::vector<std::vector<float>> params(world);
  std::vector<std::int64_t> next(world), expected_global(world);
  run_ranks(c, world, [&](Rank& r) {
    const int me = r.trainer.rank();
    EXPECT_EQ(r.trainer.next_step(), 0);
    expected_global[at(me)] = r.trainer.global_batch(2);
    for (int s = 0; s < 3; ++s) results[at(me)].push_back(r.trainer.step());
    next[at(me)] = r.trainer.next_step();
    params[at(me)] = r.params();
  });
  for (int q = 0; q < world; ++q) {
    SCOPED_TRACE("rank " + std::to_string(q));
    EXPECT_EQ(next[at(q)], 3);
    ASSERT_EQ(results[at(q)].size(), 3u);
    for (std::int64_t s = 0; s < 3; ++s) {
      const StepResult& r = results[at(q)][at(static_cast<int>(s))];
      EXPECT_EQ(r.step, s);
      EXPECT_EQ(r.global_batch, 9);
      EXPECT_TRUE(std::isfinite(r.loss) && r.loss > 0);
      EXPECT_EQ(r.loss, results[0][at(static_cast<int>(s))].loss);
      EXPECT_TRUE(r.replicas.synchronized) << r.replicas.describe();
      EXPECT_EQ(r.replicas.step, s);
      ASSERT_EQ(r.replicas.hashes.size(), static_cast<std::size_t>(world));
      EXPECT_EQ(r.replicas.hashes, std::vector<std::uint64_t>(world, r.replicas.hashes[0]));
      EXPECT_EQ(r.replicas.optimizer_steps, std::vector<std::int64_t>(world, s + 1));
    }
    EXPECT_EQ(expected_global[at(q)], 9);
    EXPECT_EQ(params[at(q)], params[0]);
  }
  EXPECT_NE(params[0], start);
  // Each step changes the state, so the hashes of successive steps differ.
  EXPECT_NE(results[0][0].replicas.hashes[0], results[0][1].replicas.hashes[0]);
}

TEST(TrainerStep, SingleRankSgdStepIsParamsMinusLrTimesWholeBatchGradient) {
  const TrainConfig c = config_of(8, 0, Policy::pad);
  run_ranks(c, 1, [&](Rank& r) {
    r.trainer.set_next_step(5);
    const auto direct = Rank::loaded_engine(c);
    direct->forward_backward(r.data.gather(r.trainer.global_indices(5)), 1.0f, false);
    std::vector<float> expected(direct->param_count()), g(direct->param_count());
    direct->store_params(expected);
    direct->store_grads(g);
    for (std::size_t i = 0; i < expected.size(); ++i)
      expected[i] = expected[i] + static_cast<float>(-c.optimizer.lr) * g[i];

    const StepResult result = r.trainer.step();
    EXPECT_EQ(result.step, 5);
    EXPECT_EQ(r.trainer.next_step(), 6);
    EXPECT_EQ(r.params(), expected);
    EXPECT_EQ(r.optimizer->steps(), 1);
  });
}

// ---- the training run ----------------------------------------------------------------------------

namespace fs = std::filesystem;

// What one rank's checks were asked, and a check inside the step that fails at `fail_at` on every rank.
class RecordingChecks final : public RunChecks, public StepObserver {
 public:
  explicit RecordingChecks(bool bundles, std::int64_t fail_at = -1) : bundles_(bundles), fail_at_(fail_at) {}

  void start(Trainer& trainer) override {
    ++starts;
    if (fail_at_ >= 0) trainer.set_observer(this);
  }
  void before_step(Trainer&) override { ++befores; }
  const nlohmann::json& last() const override { return last_; }
  void after_step(Trainer&, std::int64_t step, const CheckedStep& c) override {
    steps.push_back(step);
    completed.push_back(c.completed);
  }
  bool bundles() const override { return bundles_; }
  std::string leave_bundle(Trainer&, const StepFailure& f) override {
    ++bundles_left;
    return "\nbundle of " + f.kind + " at step " + std::to_string(f.step);
  }
  void flush() override { ++flushes; }
  void local_gradient(Trainer&, std::int64_t step, double, std::int64_t) override {
    if (step != fail_at_) return;
    StepFailure f;
    f.kind = "non-finite";
    f.step = step;
    f.message = "planted at step " + std::to_string(step);
    throw StepCheckFailed(f);
  }

  int starts = 0, befores = 0, bundles_left = 0, flushes = 0;
  std::vector<std::int64_t> steps;
  std::vector<bool> completed;

 private:
  bool bundles_;
  std::int64_t fail_at_;
  nlohmann::json last_ = nlohmann::json::object();
};

class Lines final : public TrainingRunListener {
 public:
  void step_done(const StepResult& r, const nlohmann::json&) override {
    const std::lock_guard<std::mutex> lock(mu_);
    done.push_back(r.step);
  }
  void line(const std::string& text) override {
    const std::lock_guard<std::mutex> lock(mu_);
    lines.push_back(text);
  }
  [[noreturn]] void end_process(const std::string& message) override { throw Error("end_process: " + message); }

  std::vector<std::int64_t> done;
  std::vector<std::string> lines;

 private:
  std::mutex mu_;
};

TrainConfig small_run(std::int64_t steps) {
  TrainConfig c;
  c.model = ModelConfig{{4, 8, 3}, Activation::relu, Loss::mse};
  c.batch = 12;
  c.steps = steps;
  return c;
}

struct World {
  TrainingShared shared;
  std::vector<RecordingChecks> checks;
  Lines listener;
};

// Trains `config` on `world` ranks of `target`; each rank's checks are checks[rank].
void train(const Target& target, const TrainConfig& config, const TrainingRunOptions& options, World& w) {
  const SyntheticDataset data(config.data_size(), config.model, config.seed);
  const std::vector<float> params = init_params(config.model, config.seed);
  run_world(target, static_cast<int>(w.checks.size()), [&](Communicator& comm) {
    const RankTrainer rt = make_rank_trainer(target, config, comm, data);
    const auto writer = make_writer(target, comm, options.checkpoint_dir, options.log, options.keep);
    run_rank(config, options,
             {.comm = comm, .trainer = *rt.trainer, .engine = *rt.engine, .writer = *writer, .timeout = target.timeout},
             w.checks[comm.rank()], w.listener, w.shared, params, std::nullopt);
  });
}

std::size_t lines_in(const fs::path& file) {
  std::ifstream in(file);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

TEST(TrainingRun, EveryRankStepsToTheEndLoggingAndCheckpointingOnRankZero) {
  const ScratchDir dir;
  TrainingRunOptions o;
  o.checkpoint_dir = (dir.path() / "ckpt").string();
  o.checkpoint_every = 2;
  o.log = (dir.path() / "log.jsonl").string();
  World w;
  w.checks.assign(3, RecordingChecks(true));
  train(Target{}, small_run(4), o, w);
  const TrainingOutcome out = w.shared.outcome();
  EXPECT_TRUE(out.passed) << out.failure;
  EXPECT_EQ(out.steps.size(), 4u);
  EXPECT_EQ(w.listener.done, (std::vector<std::int64_t>{0, 1, 2, 3}));  // rank 0's, once each
  for (const RecordingChecks& c : w.checks) {
    EXPECT_EQ(c.starts, 1);
    EXPECT_EQ(c.befores, 4);
    EXPECT_EQ(c.steps, (std::vector<std::int64_t>{0, 1, 2, 3}));
    EXPECT_EQ(c.bundles_left, 0);
  }
  EXPECT_EQ(lines_in(o.log), 4u);
  EXPECT_TRUE(fs::exists(fs::path(o.checkpoint_dir) / "step-00000002"));
  EXPECT_TRUE(fs::exists(fs::path(o.checkpoint_dir) / "step-00000004"));
  EXPECT_EQ(w.listener.lines.size(), 2u);  // the two checkpoints
}

// Replicas that differ after the step: the step's row and log line, then every rank stops there, and
// rank 0 alone leaves the bundle, whose words end its account.
TEST(TrainingRun, ATrainerCheckStopsEveryRankAtTheSameStepWithOneBundle) {
  Target target;
  target.mutant = "allreduce-rank-order";
  World w;
  w.checks.assign(3, RecordingChecks(true));
  train(target, small_run(5), {}, w);
  const TrainingOutcome out = w.shared.outcome();
  ASSERT_FALSE(out.passed);
  EXPECT_TRUE(out.failure.starts_with("replicas diverged")) << out.failure;
  const std::int64_t at = w.checks[0].steps.back();
  EXPECT_TRUE(out.failure.ends_with("\nbundle of replicas at step " + std::to_string(at))) << out.failure;
  for (std::size_t r = 0; r < w.checks.size(); ++r) {
    EXPECT_EQ(w.checks[r].steps.back(), at) << "rank " << r;
    EXPECT_TRUE(w.checks[r].completed.back()) << "rank " << r;
    EXPECT_EQ(w.checks[r].bundles_left, r == 0 ? 1 : 0) << "rank " << r;
  }
  EXPECT_EQ(w.listener.done.back(), at);
  EXPECT_EQ(out.steps.size(), static_cast<std::size_t>(at + 1));
}

// A check inside the step that stops it on every rank: no row for the step, its message printed, a
// failure line logged, and without bundles nobody leaves one (and nobody waits for one).
TEST(TrainingRun, ACheckInsideTheStepStopsItOnEveryRank) {
  const ScratchDir dir;
  TrainingRunOptions o;
  o.log = (dir.path() / "log.jsonl").string();
  World w;
  w.checks.assign(2, RecordingChecks(false, 2));
  train(Target{}, small_run(5), o, w);
  const TrainingOutcome out = w.shared.outcome();
  ASSERT_FALSE(out.passed);
  EXPECT_EQ(out.failure, "planted at step 2");
  EXPECT_EQ(out.steps.size(), 2u);
  for (const RecordingChecks& c : w.checks) {
    EXPECT_EQ(c.steps, (std::vector<std::int64_t>{0, 1, 2}));
    EXPECT_EQ(c.completed, (std::vector<bool>{true, true, false}));
    EXPECT_EQ(c.bundles_left, 0);
    EXPECT_GE(c.flushes, 1);
  }
  EXPECT_EQ(w.listener.lines, (std::vector<std::string>{"planted at step 2"}));
  EXPECT_EQ(lines_in(o.log), 3u);
}

}  // namespace
}  // namespace dpcheck
