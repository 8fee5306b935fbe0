// Every property, through RapidCheck's GoogleTest glue, against the correct CPU engine and local
// backend. RC_PARAMS (e.g. RC_PARAMS="max_success=1000 seed=7") sets the cases and the seed.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <random>

#include "mutants/mutants.hpp"
#include "properties/properties.hpp"
#include "properties/runner.hpp"
#include "properties/scenario.hpp"
#include "src/comm/simulated_comm.hpp"
#include "src/error.hpp"
#include "src/train/data.hpp"

namespace dpcheck {
namespace {

void check_property(std::string_view name) {
  const PropertyDef& p = find_property(name);
  int cases = 0;
  const Target target;
  rc::detail::checkGTest([&] {
    CaseRecord record;
    p.body(target, {}, record);
    ++cases;
  });
  EXPECT_GT(cases, 0);
}

TEST(Properties, gradient_average_matches_whole_batch) { check_property("gradient_average_matches_whole_batch"); }
TEST(Properties, replicas_bitwise_synchronized) { check_property("replicas_bitwise_synchronized"); }
TEST(Properties, sampler_shards_disjoint) { check_property("sampler_shards_disjoint"); }
TEST(Properties, accumulation_matches_whole_batch) { check_property("accumulation_matches_whole_batch"); }
TEST(Properties, uneven_shares_match_whole_batch) { check_property("uneven_shares_match_whole_batch"); }
TEST(Properties, checkpoint_resume_bitwise) { check_property("checkpoint_resume_bitwise"); }
TEST(Properties, optimizer_update_matches_formula) { check_property("optimizer_update_matches_formula"); }
TEST(Properties, reported_loss_is_global_mean) { check_property("reported_loss_is_global_mean"); }
TEST(Properties, bucketing_preserves_bits) { check_property("bucketing_preserves_bits"); }
TEST(Properties, bound_holds_for_any_summation_order) { check_property("bound_holds_for_any_summation_order"); }
TEST(Properties, shuffle_follows_recipe) { check_property("shuffle_follows_recipe"); }
TEST(Properties, loss_scaler_follows_gradscaler) { check_property("loss_scaler_follows_gradscaler"); }
TEST(Properties, lr_schedule_follows_goyal) { check_property("lr_schedule_follows_goyal"); }
TEST(Properties, divergence_tools_name_the_difference) { check_property("divergence_tools_name_the_difference"); }
// Its cases launch processes under the write audit (about a second each), so it runs a tenth of the
// cases, as `dpcheck verify` runs it.
TEST(Properties, only_rank0_writes) {
  const PropertyDef& p = find_property("only_rank0_writes");
  if (const std::string why = p.unavailable(Target{}); !why.empty()) GTEST_SKIP() << why;
  RunOptions options;
  options.cases = 100 / p.case_divisor;
  options.seed = static_cast<std::uint64_t>(std::random_device{}());
  const PropertyResult r = run_property(p, Target{}, options);
  EXPECT_TRUE(r.passed) << "seed " << options.seed << ": " << r.failure << "\n" << r.counterexample;
  EXPECT_EQ(r.cases, options.cases);
}

// The write audit under planted writes of every kind: each case is one launch, so it runs a 25th of the
// cases, as `dpcheck verify` runs it.
TEST(Properties, audit_sees_every_write) {
  const PropertyDef& p = find_property("audit_sees_every_write");
  if (const std::string why = p.unavailable(Target{}); !why.empty()) GTEST_SKIP() << why;
  RunOptions options;
  options.cases = 100 / p.case_divisor;
  options.seed = static_cast<std::uint64_t>(std::random_device{}());
  const PropertyResult r = run_property(p, Target{}, options);
  EXPECT_TRUE(r.passed) << "seed " << options.seed << ": " << r.failure << "\n" << r.counterexample;
  EXPECT_EQ(r.cases, options.cases);
}

TEST(Properties, allreduce_schedules_within_bound) { check_property("allreduce_schedules_within_bound"); }
TEST(Properties, share_weights_match_global_batch) { check_property("share_weights_match_global_batch"); }
TEST(Properties, conform_rows_catch_broken_communicators) { check_property("conform_rows_catch_broken_communicators"); }
TEST(Properties, plugin_abi_rules_hold) { check_property("plugin_abi_rules_hold"); }

// The scale class: with one case in one drawn from it, every scenario has a world of the class, a model
// of at most two layers of 4 units, at most two steps and a batch under 2N (at least N for drop-last);
// a fixed world turns it off.
TEST(Properties, TheScaleClassDrawsLargeWorldsWithSmallModels) {
  ScenarioSpace space;
  space.scale_worlds = scale_class_worlds();
  space.scale_one_in = 1;
  int cases = 0;
  rc::detail::checkGTest([&] {
    const Scenario s = *gen_scenario(space);
    RC_ASSERT(s.simulated);
    RC_ASSERT(std::find(space.scale_worlds.begin(), space.scale_worlds.end(), s.world_size) !=
              space.scale_worlds.end());
    RC_ASSERT(s.train.model.layers() <= 2);
    RC_ASSERT(*std::max_element(s.train.model.dims.begin(), s.train.model.dims.end()) <= 4);
    RC_ASSERT(s.train.steps <= 2 && s.at_step < s.train.steps);
    RC_ASSERT(s.train.batch >= (s.train.policy == Policy::drop_last ? s.world_size : 1));
    RC_ASSERT(s.train.batch < 2 * s.world_size);
    ++cases;
  });
  EXPECT_GT(cases, 0);
  space.world_size = 3;
  rc::detail::checkGTest([&] { RC_ASSERT(!(*gen_scenario(space)).simulated); });
}

// The sampler's cases past 2^24 examples are checked place by place: the correct sampler passes, and one
// whose positions are 32-bit integers fails past 2^31 (and passes below it), naming the place.
TEST(Properties, TheSamplerPastTwoToTheThirtyOneIsCheckedPlaceByPlace) {
  register_mutants();
  SamplerScenario s;
  s.simulated = true;
  s.sampler.world_size = 1000;
  s.sampler.shuffle = false;
  Target broken;
  broken.mutant = "sampler-index-32bit";
  for (const Split split : {Split::strided, Split::contiguous})
    for (const Policy policy : {Policy::pad, Policy::drop_last, Policy::uneven}) {
      s.sampler.split = split;
      s.sampler.policy = policy;
      s.sampler.dataset_size = (std::int64_t{1} << 31) + 12345;
      EXPECT_TRUE(check_sampler(s, Target{}).passed) << s.describe();
      const SamplerOutcome o = check_sampler(s, broken);
      EXPECT_FALSE(o.passed) << s.describe();
      EXPECT_NE(o.message.find("where the " + std::string(split_name(split)) + " split"), std::string::npos)
          << o.message;
      s.sampler.dataset_size = (std::int64_t{1} << 31) - 4096;
      EXPECT_TRUE(check_sampler(s, broken).passed) << s.describe();
    }
}

// Rank 0's scale for its one micro-batch at step 0, where the data set is one global batch of `examples`
// split unevenly over `world` simulated ranks.
float rank0_scale(const Target& target, std::int64_t examples, int world) {
  TrainConfig c;
  c.model.dims = {1, 1};
  c.batch = examples;
  c.shuffle = false;
  c.policy = Policy::uneven;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  SimulatedComm comm(world);
  const RankTrainer rt = make_rank_trainer(target, c, comm, data);
  const Trainer::Slot s = rt.trainer->slot(0, 0);
  return rt.trainer->micro_batch_scale(s.end - s.begin, s.end - s.begin, s.end - s.begin, examples);
}

// share-weight-float32 is a bug of scale: its counts are exact in float32 below 2^24 examples, so its
// scales are the trainer's bits there, and past 2^24 they are not.
TEST(Properties, Float32CountsAreRightBelow2To24AndWrongPastIt) {
  Target broken;
  broken.backend = find_backend("simulated");
  broken.mutant = "share-weight-float32";
  Target right = broken;
  right.mutant.clear();
  for (const int world : {2, 3, 63, 4096})
    for (const std::int64_t examples : {std::int64_t{4097}, std::int64_t{12345677}, (std::int64_t{1} << 24) - 1})
      EXPECT_EQ(rank0_scale(broken, examples, world), rank0_scale(right, examples, world))
          << examples << " over " << world;
  // B = 2^24 + 153 rounds to 2^24 + 152 in float32; rank 0's 8388685 examples times 2 stay exact.
  const float want = static_cast<float>(16777370.0 / 16777369.0);
  EXPECT_EQ(rank0_scale(right, 16777369, 2), want);
  EXPECT_NE(rank0_scale(broken, 16777369, 2), want);
}

TEST(Properties, EveryPropertyIsListedAndHasAMutantAimedAtIt) {
  ASSERT_EQ(properties().size(), 21u);
  for (const PropertyDef& p : properties()) {
    EXPECT_NO_THROW(find_property(p.name));
    int aimed = 0;
    for (const MutantInfo& m : mutants()) aimed += m.caught_by == p.name ? 1 : 0;
    EXPECT_GE(aimed, 1) << p.name << " has no mutant aimed at it";
  }
  for (const MutantInfo& m : mutants()) EXPECT_NO_THROW(find_property(m.caught_by)) << m.name;
  EXPECT_THROW(find_property("no_such_property"), UsageError);
}

// What a failed run under mpirun printed, reduced to dpcheck's own account: its error lines, never the
// launcher's boilerplate around them.
TEST(Properties, ARunsFailureReasonIsDpchecksOwnWordsNotTheLaunchers) {
  const std::string open_mpi =
      "step 0 loss 0.25\n"
      "dpcheck: error: replicas diverged: replicas differ after step 0: first difference in layers.0.weight[0, 0]\n"
      "-------------------------------------------------------\n"
      "Primary job  terminated normally, but 1 process returned\n"
      "a non-zero exit code. Per user-direction, the job has been aborted.\n"
      "-------------------------------------------------------\n"
      "--------------------------------------------------------------------------\n"
      "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
      "the job to be terminated. The first process to do so was:\n\n"
      "  Process name: [[7375,1],1]\n"
      "  Exit code:    1\n"
      "--------------------------------------------------------------------------\n";
  EXPECT_EQ(
      run_failure_reason(open_mpi),
      "dpcheck: error: replicas diverged: replicas differ after step 0: first difference in layers.0.weight[0, 0]");
  // Without an error line of dpcheck's, the last lines that are not the launcher's.
  EXPECT_EQ(run_failure_reason("a\nb\nc\nd\n-----\nPrimary job  terminated normally, but 1 process returned\n"),
            "b | c | d");
  EXPECT_EQ(run_failure_reason("-----\n  Exit code:    1\n"), "");
}

}  // namespace
}  // namespace dpcheck
