// dpcheck conform against communicator plugins: the ring example and a correct plugin keep every
// promise; each plugin of tests/plugins/comm/broken_comm.c breaks one, and conform must fail it at the
// check that promise belongs to, with a minimal case whose replay command fails again on its own (the
// kill matrix of the plugin checks). A plugin of ABI 1 passes with its 16-bit rows skipped. Also: the
// ring passes verify as threads and under mpirun, and a plugin that crashes or never returns ends the
// run (exit 3) with a message naming the call, leaving no report behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/test_support.hpp"

namespace {

namespace fs = std::filesystem;

const std::string kDpcheck = DPCHECK_BINARY;
const std::string kPlugins = DPCHECK_COMM_PLUGIN_DIR;
const std::string kRing = DPCHECK_RING_PLUGIN;

std::string plugin(const std::string& name) { return kPlugins + "/libdpcheck_comm_" + name + ".so"; }

struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("dpcheck-conform-" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(dir); }
  ~Scratch() { fs::remove_all(dir); }
};

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(dpcheck::read_file(p)); }

// conform's quick form: the plugin's own checks on 4 threads, buffers up to 1 MiB.
const std::string kQuick = " --world-size 4 --no-properties --max-mib 1 --timeout 2";

struct Broken {
  const char* name;
  const char* check;  // the check that must fail
  const char* count;  // the minimal case's count, when the bug fixes it ("" when it depends on the draw)
};

const Broken kBroken[] = {
    {"vector-tail", "allreduce float32 sum", "count=5 "},
    {"narrow-float64", "allreduce float64 sum", "count=1 "},
    {"int64-avg", "allreduce int64 avg", "count=1 "},
    {"block-order", "allgather float32", "count=1 "},
    {"broadcast-root", "broadcast float32", "count=1 "},
    {"large-message", "allreduce float32 sum", "count=65537 "},
    {"own-order", "same bits on every rank float32 sum", ""},
    {"run-to-run", "run-to-run float32 sum", ""},
    {"hang", "a rank that never arrives", ""},
    {"sequence-wrap", "calls in a row", "count=1 "},
    {"half-as-bfloat16", "allreduce float16 sum", "count=1 "},
};

class ConformComm : public ::testing::TestWithParam<Broken> {};

TEST_P(ConformComm, FailsTheBrokenPromiseWithAMinimalCaseThatReplays) {
  const Broken& b = GetParam();
  Scratch s;
  const fs::path report = s.dir / "r.json";
  const auto r = dpcheck::run_command(kDpcheck + " conform --comm " + plugin(b.name) + kQuick + " --report " +
                                                report.string(),
                                            300);
  ASSERT_EQ(r.status, 1) << r.output;
  const nlohmann::json j = read_json(report);
  EXPECT_FALSE(j["passed"].get<bool>());
  const nlohmann::json* row = nullptr;
  for (const auto& c : j["checks"])
    if (c["check"] == b.check) row = &c;
  ASSERT_NE(row, nullptr) << "no row " << b.check;
  ASSERT_EQ((*row)["verdict"], "fail") << r.output;
  EXPECT_FALSE((*row)["promise"].get<std::string>().empty());
  const std::string minimal = (*row)["minimal_case"].get<std::string>();
  EXPECT_TRUE(minimal.starts_with(b.count)) << minimal;
  // The replay line runs that one case, and it fails again.
  std::string replay = (*row)["replay"].get<std::string>();
  ASSERT_TRUE(replay.starts_with("dpcheck conform ")) << replay;
  replay = kDpcheck + replay.substr(std::string("dpcheck").size()) + " --timeout 2";
  const auto again = dpcheck::run_command(replay, 120);
  EXPECT_EQ(again.status, 1) << replay << "\n" << again.output;
  EXPECT_NE(again.output.find("FAILED " + std::string(b.check)), std::string::npos) << again.output;
}

INSTANTIATE_TEST_SUITE_P(Plugins, ConformComm, ::testing::ValuesIn(kBroken),
                         [](const auto& p) { return dpcheck::test_case_name(p.param.name); });

TEST(ConformComm, CorrectPluginsKeepEveryPromise) {
  for (const std::string& so : {kRing, plugin("correct")}) {
    Scratch s;
    const auto r = dpcheck::run_command(kDpcheck + " conform --comm " + so + kQuick + " --junit " +
                                                  (s.dir / "j.xml").string(),
                                              300);
    EXPECT_EQ(r.status, 0) << so << "\n" << r.output;
    EXPECT_NE(r.output.find("kept every promise"), std::string::npos) << r.output;
    const std::string junit = dpcheck::read_file(s.dir / "j.xml");
    EXPECT_EQ(junit.find("<failure"), std::string::npos);
    EXPECT_NE(junit.find("a rank that never arrives"), std::string::npos);
  }
}

// A plugin of ABI 1 still loads and keeps its promises; its bfloat16 and float16 rows are skipped,
// naming both ABIs, since dpcheck never passes it those dtypes.
TEST(ConformComm, AnAbiOnePluginSkipsTheSixteenBitChecksSayingWhy) {
  Scratch s;
  const fs::path report = s.dir / "r.json";
  const auto r = dpcheck::run_command(kDpcheck + " conform --comm " + plugin("abi-1") + kQuick + " --report " +
                                          report.string(),
                                      300);
  EXPECT_EQ(r.status, 0) << r.output;
  const nlohmann::json j = read_json(report);
  int skipped = 0, passed = 0;
  for (const auto& c : j["checks"]) {
    const std::string name = c["check"];
    const bool sixteen = name.find("bfloat16") != std::string::npos || name.find("float16") != std::string::npos;
    if (!sixteen) {
      passed += c["verdict"] != "skip";
      continue;
    }
    ++skipped;
    EXPECT_EQ(c["verdict"], "skip") << name;
    const std::string detail = c["detail"];
    EXPECT_NE(detail.find("plugin ABI 1 has no " + std::string(name.find("bfloat16") != std::string::npos ? "bfloat16" : "float16")),
              std::string::npos) << detail;
    EXPECT_NE(detail.find("ABI 2"), std::string::npos) << detail;
  }
  EXPECT_EQ(skipped, 12);  // allreduce (4 ops), broadcast and allgather, in each format
  EXPECT_GT(passed, 20);
}

// Without --world-size the collectives also run on 1, 2, 3, 5 and 8 ranks: an algorithm written for
// powers of two passes on 4 and fails on 3, which the replay line names.
TEST(ConformComm, AnAlgorithmForPowersOfTwoFailsOnThreeRanks) {
  const std::string quick = " --no-properties --max-mib 1 --timeout 2 --check 'allreduce float32 sum'";
  const auto four = dpcheck::run_command(kDpcheck + " conform --comm " + plugin("power-of-two") + " --world-size 4" + quick, 120);
  EXPECT_EQ(four.status, 0) << four.output;
  const auto all = dpcheck::run_command(kDpcheck + " conform --comm " + plugin("power-of-two") + quick, 120);
  EXPECT_EQ(all.status, 1) << all.output;
  EXPECT_NE(all.output.find("--world-size 3 --check 'allreduce float32 sum' --case 'count=1 "), std::string::npos)
      << all.output;
}

// Multiplying by a rounded 1/N (NCCL's ncclAvg) is within rounding of the mean: not a broken promise.
TEST(ConformComm, AnAverageByTheReciprocalPasses) {
  const auto r = dpcheck::run_command(kDpcheck + " conform --comm " + plugin("avg-by-reciprocal") +
                                          " --no-properties --max-mib 1 --timeout 2",
                                      300);
  EXPECT_EQ(r.status, 0) << r.output;
}

TEST(ConformComm, FingerprintTellsTheRingFromRankOrder) {
  const auto ring = dpcheck::run_command(
      kDpcheck + " conform --comm " + kRing + kQuick + " --check 'summation order and width'", 120);
  EXPECT_EQ(ring.status, 0) << ring.output;
  EXPECT_NE(ring.output.find("float32: sums around a ring"), std::string::npos) << ring.output;
  const auto ordered = dpcheck::run_command(
      kDpcheck + " conform --comm " + plugin("correct") + kQuick + " --check 'summation order and width'", 120);
  EXPECT_EQ(ordered.status, 0) << ordered.output;
  EXPECT_NE(ordered.output.find("float32: sums in rank order"), std::string::npos) << ordered.output;
}

TEST(ConformComm, RunsVerifysPropertiesWithThePlugin) {
  const auto r = dpcheck::run_command(
      kDpcheck + " conform --comm " + kRing + " --world-size 3 --max-mib 1 --cases 5", 600);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("property gradient_average_matches_whole_batch"), std::string::npos) << r.output;
  // A plugin whose ranks disagree fails verify's replica property as well as conform's own check.
  const auto own = dpcheck::run_command(kDpcheck + " verify --comm " + plugin("own-order") +
                                                  " --world-size 3 --cases 20 --property replicas_bitwise_synchronized",
                                              300);
  EXPECT_EQ(own.status, 1) << own.output;
}

TEST(PluginComm, RingPassesVerifyAsThreadsAndUnderMpirun) {
  const auto threads = dpcheck::run_command(kDpcheck + " verify --comm " + kRing + " --cases 10", 600);
  EXPECT_EQ(threads.status, 0) << threads.output;
#if DPCHECK_HAS_MPI
  const auto mpi = dpcheck::run_command(std::string(DPCHECK_MPIEXEC) +
                                                  " --allow-run-as-root --oversubscribe -np 4 " + kDpcheck +
                                                  " verify --comm " + kRing + " --cases 5",
                                              600);
  EXPECT_EQ(mpi.status, 0) << mpi.output;
  EXPECT_NE(mpi.output.find("all properties passed"), std::string::npos) << mpi.output;
#else
  GTEST_SKIP() << "this build has no MPI: the mpirun half did not run";
#endif
}

TEST(PluginComm, ACrashEndsTheRunNamingTheCallAndLeavesNoReport) {
  Scratch s;
  const fs::path report = s.dir / "r.json";
  const auto r = dpcheck::run_command(kDpcheck + " verify --comm " + plugin("crash") +
                                                " --world-size 2 --cases 3 --report " + report.string(),
                                            120);
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("plugin 'broken' allreduce on rank"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("crashed"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(report));
}

TEST(PluginComm, ACallThatNeverReturnsEndsTheRunWithinTheTimeout) {
  Scratch s;
  const fs::path report = s.dir / "r.json";
  const auto r = dpcheck::run_command(kDpcheck + " verify --comm " + plugin("stall") +
                                                " --world-size 2 --cases 3 --timeout 2 --report " + report.string(),
                                            60);
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("plugin 'broken' allreduce on rank 1 has not returned within 2 s"), std::string::npos)
      << r.output;
  EXPECT_LT(r.seconds, 20);
  EXPECT_FALSE(fs::exists(report));
}

}  // namespace
