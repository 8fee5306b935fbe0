// Mixed precision (--precision bf16 and fp16, --allreduce-dtype bf16) and the loss scaler: the bound
// is tight (some correct case comes within a small factor of it, none beyond) and still tells a batch
// without one of its examples apart at B up to 512; every property holds on the correct trainer in each
// precision; the scaler follows GradScaler's rules; checkpoints keep its state.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/detail/Utility.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>

#include "mutants/mutants.hpp"
#include "properties/common.hpp"
#include "properties/runner.hpp"
#include "src/error.hpp"
#include "src/train/loss_scaler.hpp"

namespace dpcheck {
namespace {

Target target_in(Precision p, DType allreduce = DType::f32) {
  Target t;
  t.precision = p;
  t.allreduce_dtype = allreduce;
  return t;
}

// The largest error ratio over many correct cases: at most 1 (the bound holds) and, at the worst
// element of the worst case, within a small factor of 1 (the bound is not loose). Measured here:
// bf16 0.99 to 0.9998 and fp16 0.90 to 0.996 over 100 to 300 cases (seeds 1 to 11): the worst case is
// a rounding boundary within an activation's or a delta's error, whose width the bound then carries
// whole. How near the nearest case comes is a tail of the draw: over 41 seeds of 100 cases, bf16's
// worst ratio ran from 0.70 to 0.9998 and fp16's from 0.63 to 0.999, and one seed left bf16 at 0.46.
// So tightness is a search: blocks of 100 cases, each under its own seed derived from the run's,
// until some case reaches `floor`, at most kTightnessBlocks of them; a bound twice too loose keeps
// every block under 0.5 and still fails. Every case of every block must keep the bound.
constexpr int kTightnessBlocks = 5;

void expect_tight(Precision p, DType allreduce, double floor) {
  const Target target = target_in(p, allreduce);
  double worst = 0;
  int cases = 0, probed = 0, caught = 0, blocks = 0;
  const std::string name = std::string("tight ") + std::string(precision_name(p));
  const rc::detail::TestParams run = rc::detail::configuration().testParams;
  while (blocks < kTightnessBlocks && (blocks == 0 || worst < floor)) {
    rc::detail::TestParams params = run;
    params.seed = rc::detail::avalanche(run.seed + static_cast<std::uint64_t>(blocks));
    ++blocks;
    rc::detail::TestMetadata metadata;
    metadata.id = metadata.description = name + " (block " + std::to_string(blocks) + ")";
    const rc::detail::TestResult result = rc::detail::checkTestable(
        [&] {
          const Scenario s = *gen_scenario(space_for(target, {}));
          const GradientOutcome o = check_sharded_gradient(s, target);
          RC_ASSERT(o.passed);
          worst = std::max({worst, o.sharded_ratio, o.whole_ratio});
          ++cases;
          if (o.probe_ratio >= 0) {
            ++probed;
            caught += o.probe_ratio > 1 ? 1 : 0;
          }
        },
        metadata, params);
    std::ostringstream message;
    rc::detail::printResultMessage(result, message);
    EXPECT_TRUE(result.template is<rc::detail::SuccessResult>()) << metadata.description << ": " << message.str();
    if (!result.template is<rc::detail::SuccessResult>()) return;
  }
  std::printf(
      "%s (all-reduce %s): worst error ratio %.4f over %d cases in %d block(s); the dropped example left the "
      "bound in %d of %d\n",
      std::string(precision_name(p)).c_str(), std::string(allreduce_dtype_name(allreduce)).c_str(), worst, cases,
      blocks, caught, probed);
  EXPECT_LE(worst, 1.0);
  EXPECT_GE(worst, floor) << "the bound has grown loose: no case of " << blocks << " blocks came within " << floor;
  EXPECT_GE(caught, probed * 9 / 10) << "the check lost its power";
}

TEST(MixedPrecision, Bf16BoundIsTight) { expect_tight(Precision::bf16, DType::f32, 0.5); }
TEST(MixedPrecision, Fp16BoundIsTight) { expect_tight(Precision::fp16, DType::f32, 0.5); }
// A bf16 all-reduce's bound holds for any order of its roundings, so on this backend (one rounding at
// the end) it is looser by design: only "holds" is asked of it here.
TEST(MixedPrecision, Bf16AllReduceBoundHolds) { expect_tight(Precision::bf16, DType::bf16, 0.0); }

// A batch of B examples and the same batch without its last: the bound must tell them apart at every
// B up to 512, in each precision, on one rank and on four.
TEST(MixedPrecision, ADroppedExampleLeavesTheBoundUpTo512) {
  for (Precision p : {Precision::bf16, Precision::fp16})
    for (std::int64_t batch : {8, 64, 512})
      for (int world : {1, 4}) {
        Scenario s;
        s.train.model = ModelConfig{{32, 64, 10}, Activation::relu, Loss::cross_entropy};
        s.train.batch = batch;
        s.train.seed = 7;
        s.train.loss_scaling.kind = p == Precision::fp16 ? LossScaling::dynamic : LossScaling::none;
        s.train.loss_scaling.init_scale = 1024;
        s.world_size = world;
        const GradientOutcome o = check_sharded_gradient(s, target_in(p));
        EXPECT_TRUE(o.passed) << o.message;
        EXPECT_GT(o.probe_ratio, 1.0) << precision_name(p) << " B=" << batch << " N=" << world;
        std::printf("%s B=%lld N=%d: correct %.3g of the bound; without the last example %.3g\n",
                    std::string(precision_name(p)).c_str(), static_cast<long long>(batch), world,
                    std::max(o.sharded_ratio, o.whole_ratio), o.probe_ratio);
      }
}

// Every property passes on the correct trainer in each precision (fp16 with its loss scaler).
TEST(MixedPrecision, EveryPropertyPassesInEachPrecision) {
  for (Precision p : {Precision::bf16, Precision::fp16}) {
    for (const PropertyDef& def : properties()) {
      RunOptions o;
      o.cases = std::max(1, 60 / def.case_divisor);
      o.seed = 20261201;
      const PropertyResult r = run_property(def, target_in(p), o);
      if (!r.skipped.empty()) continue;
      EXPECT_TRUE(r.passed) << precision_name(p) << " " << def.name << ": " << r.failure << "\n" << r.counterexample;
    }
  }
}

TEST(LossScaler, FollowsGradScalersRules) {
  LossScalerConfig c;
  c.kind = LossScaling::dynamic;
  c.growth_interval = 3;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 65536.0f);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0f);
  s.update(false);  // the third good step in a row doubles it
  EXPECT_EQ(s.scale(), 131072.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  s.update(false);
  s.update(true);  // an overflow halves it and restarts the count
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.state().growth_tracker, 0);
  EXPECT_EQ(s.state().skipped, 1);
  LossScaler off(LossScalerConfig{});
  off.update(true);
  EXPECT_EQ(off.scale(), 1.0f);
  EXPECT_EQ(off.state().skipped, 0);
  // Backing off stops at 2^-24, where every scaling is still exact.
  c.init_scale = 0x1p-23;
  LossScaler low(c);
  low.update(true);
  low.update(true);
  EXPECT_EQ(low.scale(), 0x1p-24f);
}

TEST(LossScaler, RefusesScalesThatAreNotExact) {
  LossScalerConfig c;
  c.kind = LossScaling::dynamic;
  for (double bad : {3.0, 0.0, -2.0, 0x1p-30, 0x1p70, static_cast<double>(INFINITY), static_cast<double>(NAN)}) {
    c.init_scale = bad;
    EXPECT_THROW(c.validate(), UsageError) << bad;
  }
  c.init_scale = 8;
  c.growth_interval = 0;
  EXPECT_THROW(c.validate(), UsageError);
  c.growth_interval = 1;
  EXPECT_NO_THROW(c.validate());
  EXPECT_THROW(parse_loss_scaling("static"), UsageError);
}

// A step that overflows on one rank only is skipped on every rank; the mutant that lets each rank
// decide alone desyncs them at that very step.
TEST(LossScaler, OneRanksOverflowSkipsTheStepEverywhere) {
  Scenario s;
  s.train.model = ModelConfig{{4, 6, 3}, Activation::relu, Loss::mse};
  s.train.batch = 8;
  s.train.steps = 3;
  s.train.loss_scaling.kind = LossScaling::dynamic;
  s.world_size = 4;
  const Target fp16 = target_in(Precision::fp16);
  const ReplicaOutcome ok = check_replica_sync(s, fp16, {5});
  EXPECT_TRUE(ok.passed) << ok.message;
  EXPECT_GE(ok.skipped_steps, 1);
  Target broken = fp16;
  broken.mutant = "scaler-local-skip";
  const ReplicaOutcome bad = check_replica_sync(s, broken, {5});
  EXPECT_FALSE(bad.passed);
  EXPECT_NE(bad.message.find("loss scaler"), std::string::npos) << bad.message;
}

// Goyal et al.'s gradual warm-up: from lr to lr x N in equal steps over K steps, then lr x N; the
// optimizer runs each step at that rate.
TEST(ScalingRules, WarmupRisesInEqualStepsToTheLinearlyScaledRate) {
  TrainConfig c;
  c.model = ModelConfig{{3, 2}, Activation::identity, Loss::mse};
  c.batch = 8;
  c.steps = 6;
  c.optimizer.lr = 0.1;
  c.linear_scaling = true;
  c.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(c.lr_at(0, 4), 0.1);
  EXPECT_DOUBLE_EQ(c.lr_at(2, 4), 0.1 + 0.3 * 2 / 4);
  EXPECT_DOUBLE_EQ(c.lr_at(4, 4), 0.4);
  EXPECT_DOUBLE_EQ(c.lr_at(100, 4), 0.4);
  EXPECT_DOUBLE_EQ(c.lr_at(3, 1), 0.1);  // one rank: nothing to warm up to
  TrainConfig no_scaling = c;
  no_scaling.linear_scaling = false;
  EXPECT_THROW(no_scaling.validate(4), UsageError);
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  std::vector<double> seen;
  run_world(Target{}, 4, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(Target{}, c, comm, data);
    std::vector<double> mine;
    for (int s = 0; s < c.steps; ++s) {
      rt.trainer->step();
      mine.push_back(rt.optimizer->config().lr);
    }
    if (comm.rank() == 0) seen = mine;
  });
  ASSERT_EQ(seen.size(), 6u);
  for (int s = 0; s < 6; ++s) EXPECT_DOUBLE_EQ(seen[static_cast<std::size_t>(s)], c.lr_at(s, 4)) << s;
}

// The accumulation equivalence: k micro-batches on N ranks take the gradient of the same global batch
// as N k ranks, each path within its own derived bound of the one float64 reference.
TEST(ScalingRules, AccumulateOnNRanksMatchesNkRanks) {
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    Scenario accumulated;
    accumulated.train.model = ModelConfig{{6, 12, 4}, Activation::tanh, Loss::mse};
    accumulated.train.batch = 24;
    accumulated.train.accumulate = 3;
    accumulated.world_size = 2;
    Scenario wide = accumulated;
    wide.train.accumulate = 1;
    wide.world_size = 6;
    const GradientOutcome a = check_sharded_gradient(accumulated, target_in(p));
    const GradientOutcome w = check_sharded_gradient(wide, target_in(p));
    EXPECT_TRUE(a.passed) << a.message;
    EXPECT_TRUE(w.passed) << w.message;
  }
}

}  // namespace
}  // namespace dpcheck
