// The divergence tools held to their promises, each against planted faults:
//   (two runs that differ by one planted fault, diffed, replayed and drifted: the property
//     divergence_tools_name_the_difference, properties/tools.cpp)
//   live_gradient_check_catches: with --check-gradient-every 1, each gradient mutant fails training at
//     the very step where the offline property (check_sharded_gradient) first fails, and never where it
//     passes;
//   replay_reproduces_failure: for every mutant that `train` with its live checks hits, the bundle it
//     leaves replays to the same verdict at the same element, bit for bit, and a replay without the
//     mutant passes;
//   rounding or bug (dpcheck drift): two runs of one seed on 2 and 3 ranks drift apart by rounding, and
//     a third with a planted bug is named at its first step out of the bound.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "divergence/diff.hpp"
#include "divergence/divergence.hpp"
#include "divergence/trace.hpp"
#include "mutants/mutants.hpp"
#include "properties/common.hpp"
#include "properties/properties.hpp"
#include "properties/scenario.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {

// GoogleTest names a parameter by printing it.
void PrintTo(const MutantInfo& m, std::ostream* os) { *os << m.name; }

namespace {

namespace fs = std::filesystem;

// The step at which live training with --check-gradient-every 1 fails (-1: it does not).
std::int64_t live_failing_step(const Scenario& s, const Target& target) {
  const SyntheticDataset data(s.train.data_size(), s.train.model, s.train.seed);
  std::int64_t failed = -1;
  std::mutex mu;
  run_world(target, s.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, s.train, comm, data);
    LiveCheckOptions o;
    o.gradient_every = 1;
    LiveChecks checks(target, o);
    rt.trainer->set_observer(&checks);
    try {
      while (rt.trainer->next_step() < s.train.steps) rt.trainer->step();
    } catch (const StepCheckFailed& e) {
      const std::lock_guard<std::mutex> lock(mu);
      failed = e.failure.step;
    }
  });
  return failed;
}

class LiveGradientCheck : public testing::TestWithParam<MutantInfo> {};

TEST_P(LiveGradientCheck, CatchesAtTheFirstStepThePropertyFails) {
  const MutantInfo& m = GetParam();
  Target target;
  target.mutant = std::string(m.name);
  if (!m.precision.empty()) target.precision = parse_precision(m.precision);
  int caught = 0;
  bool ok = true;
  // Some bugs show in one case of eight or fewer (a world of the shape a schedule breaks, a shuffled
  // second epoch): under the sanitizers' 25 cases a run can draw none. The property runs again, with
  // fresh cases, up to eight times before the test says the bug was never caught.
  for (int run = 0; run < 8 && ok && caught == 0; ++run)
    ok = rc::check(std::string("live_gradient_check_catches ") + std::string(m.name), [&] {
      ScenarioSpace space = space_for(target, {});  // the precision's loss scaler
      space.max_world_size = 4;
      space.max_layers = 2;
      space.max_width = 12;
      space.max_batch = 24;
      // Every case runs four steps (the scale class two): an epoch holds at most three (a data set of one to
      // three batches), so each case crosses into a second epoch, where a bug of the epoch (a sampler left at
      // epoch 0) shows.
      space.min_steps = 4;
      space.max_steps = 4;
      space.uneven_only = m.caught_by == "uneven_shares_match_whole_batch";
      space.accumulate = m.caught_by == "accumulation_matches_whole_batch";
      // A bug of scale: every world from the scale class, on simulated ranks (live checks run there too).
      if (m.scale) {
        space.scale_worlds = scale_class_worlds();
        space.scale_one_in = 1;
      }
      Scenario s = *gen_scenario(space);
      Target on = target;
      if (s.simulated) on.backend = find_backend("simulated");
      std::int64_t offline = -1;
      for (int k = 0; k < s.train.steps && offline < 0; ++k) {
        s.at_step = k;
        if (!check_sharded_gradient(s, on).passed) offline = k;
      }
      const std::int64_t live = live_failing_step(s, on);
      RC_CLASSIFY(live < 0, "not exercised");
      RC_CLASSIFY(live == 0, "caught at step 0");
      RC_CLASSIFY(live > 0, "caught after step 0");
      RC_ASSERT(live == offline);
      if (live >= 0) ++caught;
    });
  EXPECT_TRUE(ok);
  EXPECT_GT(caught, 0) << m.name << " was never caught";
}

std::vector<MutantInfo> gradient_mutants() {
  std::vector<MutantInfo> out;
  for (const MutantInfo& m : mutants())
    if ((m.caught_by == "gradient_average_matches_whole_batch" || m.caught_by == "uneven_shares_match_whole_batch" ||
         m.caught_by == "accumulation_matches_whole_batch") &&
        (m.engine.empty() || m.engine == "cpu") && !m.wide_minimal_case)
      out.push_back(m);
  return out;
}

INSTANTIATE_TEST_SUITE_P(GradientMutants, LiveGradientCheck, testing::ValuesIn(gradient_mutants()),
                         [](const testing::TestParamInfo<MutantInfo>& p) { return test_case_name(p.param.name); });

// One training run as a user would start it, with every live check on.
CommandResult train(const fs::path& dir, const std::string& mutant) {
  const MutantInfo* m = find_mutant(mutant);
  const std::string precision = m && !m->precision.empty() ? " --precision " + std::string(m->precision) : "";
  return run_command(std::string(DPCHECK_BINARY) +
                         " train --model 6,8,3 --batch 10 --dataset-size 13 --policy uneven --world-size 3 --steps 4"
                         " --optimizer adam --check-finite --check-gradient-every 1 --bundle-dir " +
                         dir.string() + " --mutant " + mutant + precision,
                     120);
}

// A bundle cut off mid-write (a launcher ended the job while rank 0 wrote it) leaves its temporary
// directory; the next bundle written there removes it, and nothing whose writer still runs, nor a file.
TEST(Divergence, ABundleCutOffMidWriteIsRemovedByTheNextOne) {
  const ScratchDir scratch;
  const fs::path dir = scratch.path();
  long pid_max = 0;
  std::ifstream("/proc/sys/kernel/pid_max") >> pid_max;
  ASSERT_GT(pid_max, 0);
  const std::string gone = std::to_string(pid_max + 1);  // no process has it
  const fs::path abandoned = dir / (".dpcheck-bundle-step-00000001.tmp-" + gone);
  const fs::path running = dir / (".dpcheck-bundle-step-00000002.tmp-" + std::to_string(::getpid()));
  const fs::path file = dir / (".notes.tmp-" + gone);
  fs::create_directories(abandoned / "checkpoint");
  fs::create_directories(running);
  std::ofstream(file) << "kept\n";
  const CommandResult r = train(dir, "allreduce-sum-no-average");
  ASSERT_EQ(r.status, 1) << r.output;
  EXPECT_FALSE(fs::exists(abandoned)) << r.output;
  EXPECT_TRUE(fs::exists(running));
  EXPECT_TRUE(fs::exists(file));
}

TEST(Divergence, ReplayReproducesFailure) {
  std::vector<std::string> hit;
  for (const MutantInfo& m : mutants()) {
    if (!m.engine.empty() && m.engine != "cpu") continue;
    const ScratchDir dir;
    const CommandResult run = train(dir.path(), std::string(m.name));
    ASSERT_TRUE(run.status == 0 || run.status == 1) << m.name << "\n" << run.output;
    if (run.status == 0) continue;
    std::vector<fs::path> bundles;
    for (const auto& e : fs::directory_iterator(dir.path())) bundles.push_back(e.path());
    ASSERT_EQ(bundles.size(), 1u) << m.name << ": one failure, one bundle\n" << run.output;
    EXPECT_NE(run.output.find("replay it with: dpcheck replay " + bundles[0].string()), std::string::npos)
        << run.output;
    const CommandResult again = run_command(std::string(DPCHECK_BINARY) + " replay " + bundles[0].string(), 120);
    EXPECT_EQ(again.status, 1) << m.name << "\n" << again.output;
    EXPECT_NE(again.output.find("reproduced bit for bit"), std::string::npos) << m.name << "\n" << again.output;
    const CommandResult without =
        run_command(std::string(DPCHECK_BINARY) + " replay " + bundles[0].string() + " --mutant none", 120);
    EXPECT_EQ(without.status, 0) << m.name << "\n" << without.output;
    EXPECT_NE(without.output.find("the replay target passes"), std::string::npos) << m.name << "\n" << without.output;
    hit.push_back(std::string(m.name));
  }
  std::string names;
  for (const std::string& h : hit) names += " " + h;
  std::printf("mutants train hits, each replayed bit for bit:%s\n", names.c_str());
  for (const char* must : {"rank-nan-gradient", "allreduce-corrupt-one", "drop-one-sample", "mean-of-means",
                           "allreduce-rank-order", "optimizer-rank-perturb", "sampler-off-by-one"})
    EXPECT_NE(std::find(hit.begin(), hit.end(), must), hit.end()) << must << " was not hit";
}

// The bundle records the buckets: without them the broken bucket never runs and the replay would pass.
TEST(Divergence, ABucketedRunReplaysWithItsBuckets) {
  const ScratchDir dir;
  const CommandResult run =
      run_command(std::string(DPCHECK_BINARY) +
                      " train --model 8,16,4 --batch 8 --world-size 2 --steps 3 --bucket-mb 0.0005"
                      " --mutant bucket-boundary-off-by-one --bundle-dir " +
                      dir.path().string(),
                  60);
  EXPECT_EQ(run.status, 1) << run.output;
  const fs::path bundle = dir.path() / "dpcheck-bundle-step-00000000";
  ASSERT_TRUE(fs::is_directory(bundle)) << run.output;
  EXPECT_EQ(read_bundle(bundle).start.config.value("bucket_mb", 0.0), 0.0005);
  const CommandResult again = run_command(std::string(DPCHECK_BINARY) + " replay " + bundle.string(), 60);
  EXPECT_EQ(again.status, 1) << again.output;
  EXPECT_NE(again.output.find("reproduced bit for bit"), std::string::npos) << again.output;
}

TEST(Divergence, CheckFiniteNamesTheRankBeforeTheAllReduce) {
  const ScratchDir dir;
  const CommandResult run = train(dir.path(), "rank-nan-gradient");
  EXPECT_EQ(run.status, 1) << run.output;
  EXPECT_NE(
      run.output.find("step 1: rank 2: its local gradient at layers.0.weight[0, 0] is nan, before the all-reduce"),
      std::string::npos)
      << run.output;
  // Attributed on replay: the local gradient of rank 2 is the first phase out of the bound.
  std::vector<fs::path> bundles;
  for (const auto& e : fs::directory_iterator(dir.path())) bundles.push_back(e.path());
  ASSERT_EQ(bundles.size(), 1u);
  const CommandResult again = run_command(std::string(DPCHECK_BINARY) + " replay " + bundles[0].string(), 120);
  EXPECT_NE(again.output.find("first phase out of the bound: local gradient on rank 2 at layers.0.weight[0, 0]"),
            std::string::npos)
      << again.output;
}

TEST(Divergence, AStuckRankAmongThreadsEndsTheRunWithinTheTimeoutLeavingABundle) {
  const ScratchDir dir;
  const CommandResult run = run_command(std::string(DPCHECK_BINARY) +
                                            " train --model 6,8,3 --batch 12 --world-size 3 --steps 4 --timeout 2"
                                            " --inject-fault stall --fault-rank 1 --fault-step 2 --bundle-dir " +
                                            dir.path().string(),
                                        60);
  EXPECT_EQ(run.status, 3) << run.output;
  EXPECT_LT(run.seconds, 20) << run.output;
  EXPECT_NE(run.output.find("rank 1 did not arrive"), std::string::npos) << run.output;
  const fs::path bundle = dir.path() / "dpcheck-bundle-step-00000002";
  ASSERT_TRUE(fs::is_regular_file(bundle / "manifest.json")) << run.output;
  const Bundle b = read_bundle(bundle);
  EXPECT_EQ(b.manifest.failure.kind, "timeout");
  EXPECT_EQ(b.before.step, 2);
  EXPECT_EQ(b.start.step, 0);
}

// A run that diverges: the state before the failing step already holds an infinity, which no checkpoint
// reader accepts, so the replay starts from the bundle's start and still gives the same verdict.
TEST(Divergence, ADivergedRunReplaysFromItsStart) {
  const ScratchDir dir;
  const CommandResult run =
      run_command(std::string(DPCHECK_BINARY) + " train --model 4,3 --batch 8 --steps 3 --lr 1e38" +
                      " --world-size 2 --bundle-dir " + dir.path().string(),
                  60);
  EXPECT_EQ(run.status, 1) << run.output;
  const fs::path bundle = dir.path() / "dpcheck-bundle-step-00000002";
  ASSERT_TRUE(fs::is_directory(bundle)) << run.output;
  const CommandResult again = run_command(std::string(DPCHECK_BINARY) + " replay " + bundle.string(), 60);
  EXPECT_EQ(again.status, 1) << again.output;
  EXPECT_NE(again.output.find("replaying from the run's start, step 0"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("reproduced bit for bit"), std::string::npos) << again.output;
}

TEST(Divergence, ReplayOfACheckpointDirectoryAtAStep) {
  const ScratchDir dir;
  const std::string ckpt = (dir.path() / "ckpt").string();
  const CommandResult run =
      run_command(std::string(DPCHECK_BINARY) +
                      " train --model 6,8,3 --batch 12 --world-size 2 --steps 3 --checkpoint-every 1"
                      " --checkpoint-dir " +
                      ckpt + " --keep 5",
                  120);
  ASSERT_EQ(run.status, 0) << run.output;
  const CommandResult replay = run_command(std::string(DPCHECK_BINARY) + " replay " + ckpt + " --step 2", 120);
  EXPECT_EQ(replay.status, 0) << replay.output;
  EXPECT_NE(replay.output.find("step 2 on 2 ranks"), std::string::npos) << replay.output;
  EXPECT_NE(replay.output.find("every phase stays within the bound"), std::string::npos) << replay.output;
  // With a mutant that breaks the step, the same replay names the phase.
  const CommandResult broken =
      run_command(std::string(DPCHECK_BINARY) + " replay " + ckpt + " --step 2 --mutant drop-one-sample", 120);
  EXPECT_EQ(broken.status, 1) << broken.output;
  EXPECT_NE(broken.output.find("first phase out of the bound: local gradient on rank 1"), std::string::npos)
      << broken.output;
}

// Three runs of one seed with their checkpoints and traces: on 2 ranks, on 3, and on 3 with a bug that
// shows only when shares differ in size.
TEST(Divergence, DriftTellsRoundingFromABug) {
  const ScratchDir dir;
  const auto train_run = [&](const std::string& name, int ranks, const std::string& extra) {
    const std::string d = (dir.path() / name).string();
    const CommandResult r =
        run_command(std::string(DPCHECK_BINARY) + " train --model 8,16,4 --batch 25 --steps 4 --policy uneven" +
                        " --world-size " + std::to_string(ranks) + " --checkpoint-every 1 --keep 10" +
                        " --checkpoint-dir " + d + " --trace " + d + ".jsonl" + extra,
                    120);
    ASSERT_EQ(r.status, 0) << r.output;
  };
  train_run("two", 2, "");
  train_run("three", 3, "");
  train_run("broken", 3, " --mutant mean-of-means");
  const std::string bin = std::string(DPCHECK_BINARY) + " drift ";
  const std::string two = (dir.path() / "two").string(), three = (dir.path() / "three").string(),
                    broken = (dir.path() / "broken").string();
  const CommandResult rounding =
      run_command(bin + two + " " + three + " --trace-a " + two + ".jsonl --trace-b " + three + ".jsonl", 120);
  EXPECT_EQ(rounding.status, 0) << rounding.output;
  EXPECT_NE(rounding.output.find("rounding, amplified by training"), std::string::npos) << rounding.output;
  const CommandResult bug =
      run_command(bin + two + " " + broken + " --trace-a " + two + ".jsonl --trace-b " + broken + ".jsonl", 120);
  EXPECT_EQ(bug.status, 1) << bug.output;
  EXPECT_NE(bug.output.find("bug: step 1 of B leaves the bound from its own parameters (local gradient on rank 0"),
            std::string::npos)
      << bug.output;
  EXPECT_NE(bug.output.find("replay it with: dpcheck replay " + broken + " --step 1 --mutant mean-of-means"),
            std::string::npos)
      << bug.output;
  // Without the trace that names its target, the broken run's steps do not replay to its bits.
  const CommandResult undecided = run_command(bin + two + " " + broken, 120);
  EXPECT_EQ(undecided.status, 1) << undecided.output;
  EXPECT_NE(undecided.output.find("not decided: step 1 of B"), std::string::npos) << undecided.output;
}

}  // namespace
}  // namespace dpcheck
