// The property runner (properties/runner.hpp), on properties of its own whose verdicts the tests
// control: a closest call replays to the same case; a replay of a case that no longer fails is a pass
// that says so; a damaged token, or one of another property, is refused; shrinking reaches the minimal
// case; a failure that comes and goes is reported with how often it failed; and the power and
// tightness floors fail a run whose check has gone weak. Also the replay command for every backend.
#include <gtest/gtest.h>

#include <string>

#include "properties/case_token.hpp"
#include "properties/runner.hpp"
#include "src/comm/local_comm.hpp"
#include "src/error.hpp"

namespace dpcheck {
namespace {

// What the test properties do, set by each test (the bodies are plain functions).
struct Behaviour {
  int fail_from = 1000;    // a drawn x in [0, 1000) fails from here on
  bool alternate = false;  // failing cases fail on every other run only
  double probe = -1;       // the probe ratio every case records
  double tightness = -1;   // the tightness every case records on both paths
  int runs = 0;
};
Behaviour g;

void body(const Target&, const CaseDraw&, CaseRecord& record) {
  const int x = *rc::gen::inRange(0, 1000);
  record.ratio = x / 1000.0;
  record.note = "x = " + std::to_string(x);
  record.probe_ratio = g.probe;
  record.tightness[0] = record.tightness[1] = g.tightness;
  const bool fails = x >= g.fail_from && (!g.alternate || ++g.runs % 2 == 0);
  if (fails) fail_case("x = " + std::to_string(x) + " is too large");
}

PropertyDef test_property(double min_power = 0, double min_tightness = 0) {
  return {"gradient_average_matches_whole_batch", "a test property", body, 1, nullptr, min_power, min_tightness};
}

RunOptions options(int cases = 100) {
  RunOptions o;
  o.cases = cases;
  o.seed = 11;
  return o;
}

class Runner : public testing::Test {
 protected:
  void SetUp() override { g = Behaviour{}; }
};

TEST_F(Runner, TheClosestCallReplaysToTheSameCase) {
  const PropertyResult r = run_property(test_property(), Target{}, options());
  ASSERT_TRUE(r.passed);
  EXPECT_EQ(r.closest.ratio, r.max_error_ratio);
  EXPECT_GT(r.closest.ratio, 0.5);  // a hundred draws from [0, 1000) (RapidCheck scales them with the case size)
  RunOptions replay = options();
  replay.reproduce = r.closest.reproduce;
  const PropertyResult again = run_property(test_property(), Target{}, replay);
  EXPECT_TRUE(again.passed);
  EXPECT_TRUE(again.replayed);
  EXPECT_EQ(again.cases, 1);
  EXPECT_EQ(again.closest.ratio, r.closest.ratio);
  EXPECT_EQ(again.closest.note, r.closest.note);
}

TEST_F(Runner, ShrinkingReachesTheSmallestFailingCaseAndItsTokenReplaysIt) {
  g.fail_from = 137;
  const PropertyResult r = run_property(test_property(), Target{}, options());
  ASSERT_FALSE(r.passed);
  EXPECT_EQ(r.failure, "x = 137 is too large");
  EXPECT_EQ(r.failing_runs, 5);
  EXPECT_EQ(r.runs, 5);
  EXPECT_FALSE(r.flaky());
  // A steady failure's replay command runs the case as verify's default does.
  EXPECT_EQ(failure_replay(Target{}, {}, r), reproduce_command(Target{}, {}, r.reproduce));
  RunOptions replay = options();
  replay.reproduce = r.reproduce;
  const PropertyResult again = run_property(test_property(), Target{}, replay);
  EXPECT_FALSE(again.passed);
  EXPECT_EQ(again.failure, r.failure);
  // After a fix the same token replays a pass, and says so.
  g.fail_from = 1000;
  const PropertyResult fixed = run_property(test_property(), Target{}, replay);
  EXPECT_TRUE(fixed.passed);
  EXPECT_TRUE(fixed.replayed);
  EXPECT_EQ(fixed.closest.note, "x = 137");
}

TEST_F(Runner, AFailureThatComesAndGoesIsReportedAsSuch) {
  g.fail_from = 500;
  g.alternate = true;
  const PropertyResult r = run_property(test_property(), Target{}, options());
  ASSERT_FALSE(r.passed);
  EXPECT_TRUE(r.flaky());
  EXPECT_GT(r.failing_runs, 0);
  EXPECT_LT(r.failing_runs, r.runs);
  // Shrinking still reached the smallest failing x: a candidate counts if any of its runs fails.
  EXPECT_EQ(r.failure, "x = 500 is too large");
  // Its replay command runs the case often enough to fail again as printed.
  EXPECT_EQ(failure_replay(Target{}, {}, r), reproduce_command(Target{}, {}, r.reproduce) + " --reruns 1000");
}

TEST_F(Runner, DamagedTokensAndTokensOfAnotherPropertyAreRefused) {
  g.fail_from = 300;
  const PropertyResult r = run_property(test_property(), Target{}, options());
  ASSERT_FALSE(r.reproduce.empty());
  EXPECT_EQ(decode_case_token(r.reproduce).property, "gradient_average_matches_whole_batch");
  for (std::size_t at : {std::size_t{0}, r.reproduce.size() / 2, r.reproduce.size() - 1}) {
    std::string bad = r.reproduce;
    bad[at] = bad[at] == 'x' ? 'y' : 'x';
    RunOptions replay = options();
    replay.reproduce = bad;
    EXPECT_THROW(run_property(test_property(), Target{}, replay), UsageError) << bad;
  }
  EXPECT_THROW(decode_case_token(""), UsageError);
  EXPECT_THROW(decode_case_token("a:b"), UsageError);
  PropertyDef other = test_property();
  other.name = "replicas_bitwise_synchronized";
  RunOptions replay = options();
  replay.reproduce = r.reproduce;
  EXPECT_THROW(run_property(other, Target{}, replay), UsageError);
}

TEST_F(Runner, TokensRoundTrip) {
  rc::Random random(1234);
  random.split();
  const CaseToken t{"checkpoint_resume_bitwise", {random, 42, {3, 0, 1, 7}}};
  const CaseToken back = decode_case_token(encode_case_token(t));
  EXPECT_EQ(back.property, t.property);
  EXPECT_EQ(back.reproduce, t.reproduce);
}

TEST_F(Runner, ACheckThatLostItsPowerFails) {
  g.probe = 0.5;  // the dropped example is never caught
  const PropertyResult weak = run_property(test_property(0.9), Target{}, options());
  EXPECT_FALSE(weak.passed);
  EXPECT_EQ(weak.probed, 100);
  EXPECT_EQ(weak.probe_caught, 0);
  EXPECT_NE(weak.failure.find("lost its power"), std::string::npos) << weak.failure;
  g.probe = 2;
  const PropertyResult strong = run_property(test_property(0.9), Target{}, options());
  EXPECT_TRUE(strong.passed) << strong.failure;
  EXPECT_EQ(strong.power(), 1.0);
  // Too few probed cases to judge: reported, not failed.
  g.probe = 0.5;
  EXPECT_TRUE(run_property(test_property(0.9), Target{}, options(min_probed_cases - 1)).passed);
}

TEST_F(Runner, ABoundGrownLooseFails) {
  g.tightness = 0.05;
  const PropertyResult loose = run_property(test_property(0, 0.12), Target{}, options());
  EXPECT_FALSE(loose.passed);
  EXPECT_NE(loose.failure.find("grown loose"), std::string::npos) << loose.failure;
  g.tightness = 0.3;
  EXPECT_TRUE(run_property(test_property(0, 0.12), Target{}, options()).passed);
}

// Every backend's replay line: a process backend starts under its launcher with the launcher's world;
// a thread backend names its world size when one was fixed; a GPU engine's default communicator is
// implied. (A backend with no process world must not be asked for one.)
TEST(ReplayCommand, EveryBackend) {
  const std::string t = "p:c:0";
  Target local;
  // Formats fixed at their defaults are named: verify would otherwise draw them per case.
  EXPECT_EQ(reproduce_command(local, {}, t),
            "dpcheck verify --precision fp32 --allreduce-dtype fp32 --reproduce 'p:c:0'");
  CaseDraw drawn;
  drawn.precisions = {Precision::fp32, Precision::bf16};
  drawn.allreduce_dtypes = {DType::f32, DType::bf16};
  EXPECT_EQ(reproduce_command(local, drawn, t), "dpcheck verify --reproduce 'p:c:0'");
  // verify's --model and --thorough, which the case token alone does not hold, come from the draw.
  CaseDraw wider;
  wider.model_dims = {8, 4, 2};
  wider.thorough = true;
  EXPECT_EQ(reproduce_command(local, wider, t),
            "dpcheck verify --precision fp32 --allreduce-dtype fp32 --model 8,4,2 --thorough --reproduce 'p:c:0'");
  Target fp16_mutant;
  fp16_mutant.mutant = "fp16-no-scaling";
  fp16_mutant.precision = Precision::fp16;
  EXPECT_EQ(reproduce_command(fp16_mutant, {}, t),
            "dpcheck verify --precision fp16 --mutant fp16-no-scaling --reproduce 'p:c:0'");
  local.world_size = 4;
  local.mutant = "allreduce-rank-order";
  EXPECT_EQ(reproduce_command(local, {}, t),
            "dpcheck verify --precision fp32 --allreduce-dtype fp32 --mutant allreduce-rank-order --world-size 4 "
            "--reproduce 'p:c:0'");
  LocalWorld world(3);
  Target mpi;
  mpi.backend = find_backend("mpi");
  mpi.process_world = &world.comm(0);
  mpi.world_size = 3;
  EXPECT_EQ(reproduce_command(mpi, {}, t),
            "mpirun -np 3 dpcheck verify --comm mpi --precision fp32 --allreduce-dtype fp32 --reproduce 'p:c:0'");
  Target cuda_local;
  cuda_local = resolve_target({.engine = "cuda", .comm = "cuda-local"});
  cuda_local.world_size = 2;
  EXPECT_EQ(reproduce_command(cuda_local, {}, t), "dpcheck verify --engine cuda --world-size 2 --reproduce 'p:c:0'");
  Target nccl_threads = cuda_local;
  nccl_threads.backend = find_backend("nccl");
  nccl_threads.tf32 = true;
  EXPECT_EQ(reproduce_command(nccl_threads, {}, t),
            "dpcheck verify --engine cuda --comm nccl --tf32 --world-size 2 --reproduce 'p:c:0'");
  Target nccl_processes = nccl_threads;
  nccl_processes.process_world = &world.comm(0);
  EXPECT_EQ(reproduce_command(nccl_processes, {}, t),
            "mpirun -np 3 dpcheck verify --engine cuda --comm nccl --tf32 --reproduce 'p:c:0'");
  EXPECT_EQ(reproduce_command(local, {}, "it's"),
            "dpcheck verify --precision fp32 --allreduce-dtype fp32 --mutant allreduce-rank-order --world-size 4 "
            "--reproduce 'it'\\''s'");
}

// The value of `flag` among the words of a command line, or "" when the flag is absent.
std::string flag_value(const std::string& line, const std::string& flag) {
  const std::size_t at = line.find(" " + flag + " ");
  if (at == std::string::npos) return {};
  const std::size_t from = at + flag.size() + 2;
  return line.substr(from, line.find(' ', from) - from);
}

// Every row of the backend table, as it runs (ranks as threads, a launcher's processes, or either): the
// replay line starts with the row's launcher exactly when the ranks were the launcher's processes, names
// the world size only when they were threads, and its --engine and --comm (or their defaults) lead back
// to the same row.
TEST(ReplayCommand, EveryRowOfTheBackendTable) {
  LocalWorld launcher(3);
  const std::string t = "p:c:0";
  int lines = 0;
  for (const Backend& b : backends()) {
    for (const bool processes : {false, true}) {
      if (processes ? !b.may_run_under_launcher() : !b.ranks_as_threads()) continue;
      Target target;
      target.engine = &find_engine(b.engine);
      target.backend = &b;
      target.mutant = "allreduce-rank-order";
      target.world_size = processes ? 3 : 2;
      if (processes) target.process_world = &launcher.comm(0);
      const std::string line = reproduce_command(target, {}, t);
      SCOPED_TRACE(b.name + (processes ? " under a launcher" : " as threads") + ": " + line);
      ++lines;
      const std::string rest = processes ? line.substr(b.launch_prefix(3).size()) : line;
      if (processes) {
        EXPECT_EQ(line.rfind(b.launcher + " 3 dpcheck verify ", 0), 0u);
      }
      EXPECT_EQ(rest.rfind("dpcheck verify ", 0), 0u);
      EXPECT_EQ(rest.find("mpirun"), std::string::npos);
      EXPECT_EQ(flag_value(line, "--world-size"), processes ? "" : "2");
      EXPECT_EQ(flag_value(line, "--mutant"), "allreduce-rank-order");
      EXPECT_TRUE(line.ends_with(" --reproduce 'p:c:0'"));
      // Read back as verify reads it: the defaults where a flag is absent.
      std::string engine = flag_value(line, "--engine");
      if (engine.empty()) engine = default_engine();
      EXPECT_EQ(resolve_target({.engine = engine, .comm = flag_value(line, "--comm")}).backend, &b);
      EXPECT_EQ(flag_value(line, "--engine").empty(), b.engine == default_engine());
      EXPECT_EQ(flag_value(line, "--comm").empty(), b.engine_default);
    }
  }
  // local, simulated, mpi, mpi-native and cuda-local one way each; nccl both ways.
  EXPECT_EQ(lines, 7);
}

}  // namespace
}  // namespace dpcheck
