// dpcheck conform against communicator plugins: the ring example and a correct plugin keep every
// promise; each plugin of tests/plugins/comm/broken_comm.c breaks one, and conform must fail it at the
// check that promise belongs to, with a minimal case whose replay command fails again on its own (the
// kill matrix of the plugin checks). A plugin of ABI 1 passes with its 16-bit rows skipped. Also: the
// ring passes verify as threads and under mpirun, and a plugin that crashes or never returns ends the
// run (exit 3) with a message naming the call, leaving no report behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
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
    {"float64-unwired", "allreduce float64 sum", "count=0 "},
    {"some-ranks-turn", "run-to-run float32 sum", ""},
};

class ConformComm : public ::testing::TestWithParam<Broken> {};

TEST_P(ConformComm, FailsTheBrokenPromiseWithAMinimalCaseThatReplays) {
  const Broken& b = GetParam();
  Scratch s;
  const fs::path report = s.dir / "r.json";
  const auto r = dpcheck::run_command(
      kDpcheck + " conform --comm " + plugin(b.name) + kQuick + " --report " + report.string(), 300);
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
    const auto r = dpcheck::run_command(
        kDpcheck + " conform --comm " + so + kQuick + " --junit " + (s.dir / "j.xml").string(), 300);
    EXPECT_EQ(r.status, 0) << so << "\n" << r.output;
    EXPECT_NE(r.output.find("kept every promise"), std::string::npos) << r.output;
    const std::string junit = dpcheck::read_file(s.dir / "j.xml");
    EXPECT_EQ(junit.find("<failure"), std::string::npos);
    EXPECT_NE(junit.find("a rank that never arrives"), std::string::npos);
  }
}

// --schedule: the ring example gives the ring schedule's bits (reference/allreduce_schedule.hpp) in
// every format and op, on 4 ranks and on 1, 2, 3, 5 and 8, and the fingerprint names it; claimed as a
// tree, its first float32 sum that differs fails, naming the element and both values, with a replay.
TEST(ConformComm, TheRingExampleHasTheRingsBitsAndFailsAsAClaimedTree) {
  Scratch s;
  const auto ok =
      dpcheck::run_command(kDpcheck + " conform --comm " + kRing +
                               " --no-properties --allreduce-only --max-mib 1 --timeout 5 --schedule ring --report " +
                               (s.dir / "r.json").string(),
                           300);
  ASSERT_EQ(ok.status, 0) << ok.output;
  const nlohmann::json report = read_json(s.dir / "r.json");
  int schedule_rows = 0;
  for (const nlohmann::json& row : report["checks"]) {
    const std::string check = row["check"].get<std::string>();
    if (check.starts_with("schedule ")) {
      ++schedule_rows;
      EXPECT_EQ(row["verdict"], "pass") << check;
      EXPECT_NE(row["detail"].get<std::string>().find("also N = 1, 2, 3, 5, 8"), std::string::npos) << row.dump();
    }
    if (check == "summation order and width") {
      EXPECT_NE(row["detail"].get<std::string>().find("the bits of the ring schedule"), std::string::npos)
          << row.dump();
    }
  }
  EXPECT_EQ(schedule_rows, 6);

  const auto bad = dpcheck::run_command(
      kDpcheck + " conform --comm " + kRing + kQuick + " --schedule tree --check 'schedule float32 sum'", 300);
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("FAILED schedule float32 sum"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find(", the tree schedule gives "), std::string::npos) << bad.output;
  const std::size_t replay = bad.output.find("replay: dpcheck conform --comm ");
  ASSERT_NE(replay, std::string::npos) << bad.output;
  const std::string line = bad.output.substr(replay, bad.output.find('\n', replay) - replay);
  EXPECT_NE(line.find(" --schedule tree"), std::string::npos) << line;
  EXPECT_NE(line.find(" --check 'schedule float32 sum' --case 'count="), std::string::npos) << line;
}

// A plugin of ABI 1 still loads and keeps its promises; its bfloat16 and float16 rows are unsupported
// ("the plugin says so", naming the ABI), since dpcheck never passes it those dtypes. So are they for a
// source written for ABI 2 and recompiled unchanged against ABI 3's header: its masks are 0.
TEST(ConformComm, PluginsThatDoNotDeclareSixteenBitFloatsAreNotHandedThem) {
  for (const std::string name : {"abi-1", "unchanged-source"}) {
    SCOPED_TRACE(name);
    Scratch s;
    const fs::path report = s.dir / "r.json";
    const auto r = dpcheck::run_command(
        kDpcheck + " conform --comm " + plugin(name) + kQuick + " --report " + report.string(), 300);
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("checks not run: unsupported, the plugin says so"), std::string::npos) << r.output;
    const nlohmann::json j = read_json(report);
    int unsupported = 0, passed = 0;
    for (const auto& c : j["checks"]) {
      const std::string check = c["check"];
      const bool sixteen = check.find("bfloat16") != std::string::npos || check.find("float16") != std::string::npos;
      if (!sixteen) {
        passed += c["verdict"] == "pass";
        continue;
      }
      ++unsupported;
      EXPECT_EQ(c["verdict"], "unsupported") << check;
      const std::string detail = c["detail"];
      EXPECT_TRUE(detail.starts_with("the plugin says so: ")) << detail;
      if (name == "abi-1") EXPECT_NE(detail.find("plugin ABI 1, which has no"), std::string::npos) << detail;
      else EXPECT_NE(detail.find("it declares dtypes float32, float64, int64;"), std::string::npos) << detail;
    }
    // allreduce (4 ops), broadcast, allgather, same bits and run-to-run (sum and avg), in each format
    EXPECT_EQ(unsupported, 20);
    EXPECT_GT(passed, 20);
  }
}

// A plugin that declares float32 sums alone: every other row is unsupported, and so are verify's
// properties, which need the gradient all-reduce (an avg); nothing it lacks is called, nothing fails.
TEST(ConformComm, WhatAPluginDoesNotDeclareIsUnsupportedNotFailed) {
  Scratch s;
  const fs::path report = s.dir / "r.json", junit = s.dir / "j.xml";
  const auto r = dpcheck::run_command(kDpcheck + " conform --comm " + plugin("float32-sum") +
                                          " --world-size 3 --max-mib 1 --timeout 2 --cases 3 --report " +
                                          report.string() + " --junit " + junit.string(),
                                      300);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("what it declares: dtypes float32; all-reduce ops sum"), std::string::npos) << r.output;
  const nlohmann::json j = read_json(report);
  std::map<std::string, std::string> verdict;
  for (const auto& c : j["checks"]) verdict[c["check"]] = c["verdict"];
  EXPECT_EQ(verdict["allreduce float32 sum"], "pass");
  EXPECT_EQ(verdict["same bits on every rank float32 sum"], "pass");
  EXPECT_EQ(verdict["barrier"], "pass");
  for (const char* c : {"allreduce float32 avg", "allreduce float64 sum", "broadcast float64", "allgather int64",
                        "run-to-run float32 avg", "property gradient_average_matches_whole_batch"})
    EXPECT_EQ(verdict[c], "unsupported") << c;
  for (const auto& c : j["checks"]) EXPECT_NE(c["verdict"], "fail") << c["check"];
  EXPECT_EQ(j["plugin"]["dtypes"], nlohmann::json::array({"float32"}));
  EXPECT_EQ(j["plugin"]["ops"], nlohmann::json::array({"sum"}));
  const std::string x = dpcheck::read_file(junit);
  EXPECT_NE(x.find("<skipped message=\"unsupported: the plugin says so: "), std::string::npos);
  EXPECT_EQ(x.find("<failure"), std::string::npos);
}

// The table's name, version and ABI are in the header, the JSON and the JUnit (they were only in errors).
TEST(ConformComm, ReportsNameThePluginAndItsVersion) {
  Scratch s;
  const fs::path report = s.dir / "r.json", junit = s.dir / "j.xml";
  const auto r = dpcheck::run_command(kDpcheck + " conform --comm " + kRing + kQuick +
                                          " --check 'allreduce float32 sum' --report " + report.string() + " --junit " +
                                          junit.string(),
                                      120);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("'ring' example 1.0, plugin ABI 3"), std::string::npos) << r.output;
  const nlohmann::json j = read_json(report);
  EXPECT_EQ(j["plugin"]["name"], "ring");
  EXPECT_EQ(j["plugin"]["version"], "example 1.0");
  EXPECT_EQ(j["plugin"]["abi"], 3);
  const std::string x = dpcheck::read_file(junit);
  EXPECT_NE(x.find("'ring' example 1.0"), std::string::npos) << x;
  EXPECT_NE(x.find("<property name=\"comm_plugin\" value=\"ring\"/>"), std::string::npos) << x;
  EXPECT_NE(x.find("<property name=\"comm_plugin_version\" value=\"example 1.0\"/>"), std::string::npos) << x;
  // verify names it too.
  const fs::path vreport = s.dir / "v.json";
  const auto v = dpcheck::run_command(kDpcheck + " verify --comm " + kRing + " --world-size 2 --cases 2" +
                                          " --property sampler_shards_disjoint --report " + vreport.string(),
                                      120);
  EXPECT_EQ(v.status, 0) << v.output;
  EXPECT_NE(v.output.find("plugin 'ring' example 1.0, ABI 3"), std::string::npos) << v.output;
  const nlohmann::json vj = read_json(vreport);
  ASSERT_EQ(vj["target"]["plugins"].size(), 1u);
  EXPECT_EQ(vj["target"]["plugins"][0]["name"], "ring");
  EXPECT_EQ(vj["target"]["plugins"][0]["version"], "example 1.0");
}

// A row that fails with the plugin's own error has a minimal case and a replay line like any other:
// the fingerprint's float64 probes meet a plugin that declares float64 but returns "not implemented".
TEST(ConformComm, ARowFailedByThePluginsOwnErrorHasAMinimalCaseAndAReplay) {
  Scratch s;
  const fs::path report = s.dir / "r.json";
  const auto r = dpcheck::run_command(
      kDpcheck + " conform --comm " + plugin("float64-unwired") + kQuick + " --report " + report.string(), 300);
  EXPECT_EQ(r.status, 1) << r.output;
  const nlohmann::json j = read_json(report);
  bool fingerprint = false;
  for (const auto& c : j["checks"]) {
    if (c["verdict"] != "fail") continue;
    const std::string check = c["check"];
    EXPECT_FALSE(c["minimal_case"].is_null() || c["minimal_case"].get<std::string>().empty()) << check;
    EXPECT_FALSE(c["replay"].is_null() || c["replay"].get<std::string>().empty()) << check;
    EXPECT_NE(c["detail"].get<std::string>().find("float64 is not implemented"), std::string::npos) << check;
    if (check != "summation order and width") continue;
    fingerprint = true;
    std::string replay = c["replay"];
    ASSERT_TRUE(replay.starts_with("dpcheck conform ")) << replay;
    replay = kDpcheck + replay.substr(std::string("dpcheck").size());
    const auto again = dpcheck::run_command(replay, 120);
    EXPECT_EQ(again.status, 1) << replay << "\n" << again.output;
    EXPECT_NE(again.output.find("FAILED summation order and width"), std::string::npos) << again.output;
  }
  EXPECT_TRUE(fingerprint) << r.output;
}

// A library that gives some ranks a new result and not others (some-ranks-turn: every rank but rank 0
// sums from itself every other call) fails the run-to-run row with the difference a rank saw, and no
// rank times out: the ranks that saw none go on to calls that the others must make too. (When a rank
// stopped at its own first difference, the others waited in a call it never made, until --timeout.)
TEST(ConformComm, RanksThatSeeANewResultAndRanksThatDoNotMakeTheSameCalls) {
  Scratch s;
  const fs::path report = s.dir / "r.json";
  const auto r = dpcheck::run_command(kDpcheck + " conform --comm " + plugin("some-ranks-turn") + kQuick +
                                          " --check 'run-to-run float32 sum' --report " + report.string(),
                                      300);
  ASSERT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(r.output.find("timed out"), std::string::npos) << r.output;
  const nlohmann::json j = read_json(report);
  ASSERT_EQ(j["checks"].size(), 1u) << j.dump();
  const nlohmann::json& row = j["checks"][0];
  EXPECT_EQ(row["verdict"], "fail") << row.dump();
  const std::string detail = row["detail"];
  EXPECT_NE(detail.find("run's element"), std::string::npos) << detail;
  EXPECT_EQ(detail.find("rank 0:"), std::string::npos) << detail;
}

// --world-size N is the world of every row, verify's properties included: their minimal cases and
// replay lines say N (they were drawn, and shrank to 3, whatever N was).
TEST(ConformComm, TheGivenWorldSizeIsThePropertiesWorldToo) {
  Scratch s;
  const fs::path report = s.dir / "r.json";
  const auto r = dpcheck::run_command(kDpcheck + " conform --comm " + plugin("power-of-two") +
                                          " --world-size 5 --cases 10 --timeout 5 --check 'property "
                                          "gradient_average_matches_whole_batch' --report " +
                                          report.string(),
                                      300);
  EXPECT_EQ(r.status, 1) << r.output;
  const nlohmann::json j = read_json(report);
  ASSERT_EQ(j["checks"].size(), 1u);
  const auto& row = j["checks"][0];
  EXPECT_EQ(row["verdict"], "fail");
  EXPECT_NE(row["minimal_case"].get<std::string>().find("| world 5 "), std::string::npos) << row["minimal_case"];
  EXPECT_NE(row["replay"].get<std::string>().find("--world-size 5 "), std::string::npos) << row["replay"];
}

// Without --world-size the collectives also run on 1, 2, 3, 5 and 8 ranks: an algorithm written for
// powers of two passes on 4 and fails on 3, which the replay line names.
TEST(ConformComm, AnAlgorithmForPowersOfTwoFailsOnThreeRanks) {
  const std::string quick = " --no-properties --max-mib 1 --timeout 2 --check 'allreduce float32 sum'";
  const auto four =
      dpcheck::run_command(kDpcheck + " conform --comm " + plugin("power-of-two") + " --world-size 4" + quick, 120);
  EXPECT_EQ(four.status, 0) << four.output;
  const auto all = dpcheck::run_command(kDpcheck + " conform --comm " + plugin("power-of-two") + quick, 120);
  EXPECT_EQ(all.status, 1) << all.output;
  EXPECT_NE(all.output.find("--world-size 3 --check 'allreduce float32 sum' --case 'count=1 "), std::string::npos)
      << all.output;
}

// Multiplying by a rounded 1/N (NCCL's ncclAvg) is within rounding of the mean: not a broken promise.
TEST(ConformComm, AnAverageByTheReciprocalPasses) {
  const auto r = dpcheck::run_command(
      kDpcheck + " conform --comm " + plugin("avg-by-reciprocal") + " --no-properties --max-mib 1 --timeout 2", 300);
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
  const auto r =
      dpcheck::run_command(kDpcheck + " conform --comm " + kRing + " --world-size 3 --max-mib 1 --cases 5", 600);
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
  const auto mpi = dpcheck::run_command(std::string(DPCHECK_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 4 " +
                                            kDpcheck + " verify --comm " + kRing + " --cases 5",
                                        600);
  EXPECT_EQ(mpi.status, 0) << mpi.output;
  EXPECT_NE(mpi.output.find("all properties passed"), std::string::npos) << mpi.output;
#else
  GTEST_SKIP() << "this build has no MPI: the mpirun half did not run";
#endif
}

// When the audited training fails for another reason (here the replicas diverge: each rank sums in its
// own order), only_rank0_writes fails saying that reason, marked as not judged, and blames no write:
// not the launcher's boilerplate ("Primary job terminated ...") that used to be all it said.
TEST(PluginComm, TheWriteAuditBlamesNoWriteWhenTheRunFailsForAnotherReason) {
#if DPCHECK_HAS_MPI
  Scratch s;
  const fs::path report = s.dir / "r.json";
  const auto r = dpcheck::run_command(
      kDpcheck + " verify --comm " + plugin("own-order") +
          " --world-size 3 --property only_rank0_writes --cases 30 --reruns 1 --report " + report.string(),
      600);
  ASSERT_EQ(r.status, 1) << r.output;
  const nlohmann::json j = read_json(report);
  const auto& p = j["properties"][0];
  EXPECT_TRUE(p["not_judged"].get<bool>()) << r.output;
  const std::string why = p["failure"];
  EXPECT_TRUE(why.starts_with("not a write: ")) << why;
  EXPECT_NE(why.find("replicas diverged"), std::string::npos) << why;
  EXPECT_NE(why.find("the audit saw no write by another rank"), std::string::npos) << why;
  EXPECT_EQ(why.find("Primary job"), std::string::npos) << why;
  EXPECT_NE(r.output.find("the promise itself is not shown broken"), std::string::npos) << r.output;
#else
  GTEST_SKIP() << "this build has no MPI: the write audit needs separate processes";
#endif
}

// MPI's own collectives are a backend (--comm mpi-native) that conform checks as it checks a plugin, the
// algorithm forced through Open MPI's MCA parameters and named in the header.
TEST(ConformComm, MpisOwnAllreduceIsCheckedWithTheAlgorithmItWasForcedTo) {
#if DPCHECK_HAS_MPI
  const auto r = dpcheck::run_command(std::string("env OMPI_MCA_coll_tuned_use_dynamic_rules=1 "
                                                  "OMPI_MCA_coll_tuned_allreduce_algorithm=6 ") +
                                          DPCHECK_MPIEXEC + " --allow-run-as-root --oversubscribe -np 3 " + kDpcheck +
                                          " conform --comm mpi-native --no-properties --max-mib 1",
                                      300);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("communicator mpi-native, Open MPI"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("coll_tuned_allreduce_algorithm 6"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kept every promise"), std::string::npos) << r.output;
#else
  GTEST_SKIP() << "this build has no MPI";
#endif
}

// --allreduce-only runs the all-reduce's checks and the fingerprint, and nothing of the broadcast,
// all-gather or barrier (a library's variables that choose its all-reduce change nothing else).
TEST(ConformComm, AllreduceOnlyRunsTheAllreducesChecksAlone) {
  Scratch s;
  const auto r = dpcheck::run_command(
      kDpcheck + " conform --comm " + kRing + kQuick + " --allreduce-only --report " + (s.dir / "r.json").string(),
      300);
  ASSERT_EQ(r.status, 0) << r.output;
  std::map<std::string, int> by_kind;
  const nlohmann::json report = read_json(s.dir / "r.json");
  for (const nlohmann::json& row : report["checks"]) {
    const std::string check = row["check"];
    ++by_kind[check.substr(0, check.find(' '))];
  }
  EXPECT_EQ(by_kind["allreduce"], 21) << r.output;  // 5 dtypes x 4 ops, and the buffer reused
  EXPECT_EQ(by_kind["same"], 8) << r.output;
  EXPECT_EQ(by_kind["run-to-run"], 8) << r.output;
  EXPECT_EQ(by_kind["summation"], 1) << r.output;
  EXPECT_EQ(by_kind["broadcast"] + by_kind["allgather"] + by_kind["barrier"] + by_kind["calls"], 0) << r.output;
}

// Open MPI's ring hands a call of fewer elements than ranks to recursive doubling. Claimed as a plain
// ring, the schedule row says so ("switches", exit 0) instead of failing the library; claimed as
// open-mpi-ring, which models the switch, every count drawn is exact. A ring claimed of basic_linear,
// which never follows it, still fails.
TEST(ConformComm, ALibrarysSwitchByCountIsNamedNotFailed) {
#if DPCHECK_HAS_MPI
  const auto forced = [](int algorithm, int n, const std::string& schedule) {
    return dpcheck::run_command("env OMPI_MCA_coll_tuned_use_dynamic_rules=1 OMPI_MCA_coll_tuned_allreduce_algorithm=" +
                                    std::to_string(algorithm) + " " + DPCHECK_MPIEXEC +
                                    " --allow-run-as-root --oversubscribe -np " + std::to_string(n) + " " + kDpcheck +
                                    " conform --comm mpi-native --no-properties --schedule " + schedule +
                                    " --check 'schedule float32 sum'",
                                300);
  };
  const auto ring = forced(4, 4, "ring");
  EXPECT_EQ(ring.status, 0) << ring.output;
  EXPECT_NE(ring.output.find("switches"), std::string::npos) << ring.output;
  EXPECT_NE(ring.output.find("the library does not follow ring at count 3: it switches to halving-doubling"),
            std::string::npos)
      << ring.output;
  const auto modelled = forced(4, 4, "open-mpi-ring");
  EXPECT_EQ(modelled.status, 0) << modelled.output;
  EXPECT_EQ(modelled.output.find("switches"), std::string::npos) << modelled.output;
  const auto linear = forced(1, 4, "ring");
  EXPECT_EQ(linear.status, 1) << linear.output;
  EXPECT_NE(linear.output.find("FAILED schedule float32 sum"), std::string::npos) << linear.output;
  EXPECT_NE(linear.output.find("it follows linear, not ring"), std::string::npos) << linear.output;
#else
  GTEST_SKIP() << "this build has no MPI";
#endif
}

// The same command built against MPICH (dpcheck-mpich) judges MPICH's own all-reduce under its
// launcher, the algorithm chosen by MPICH's control variables; its replay lines name the launcher, the
// program and the variables.
TEST(ConformComm, MpichsOwnAllreduceIsCheckedByTheMpichBuild) {
#ifdef DPCHECK_MPICH_BINARY
  const auto r = dpcheck::run_command(std::string("env MPIR_CVAR_DEVICE_COLLECTIVES=none "
                                                  "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=recursive_doubling "
                                                  "mpiexec.mpich -n 3 ") +
                                          DPCHECK_MPICH_BINARY +
                                          " conform --comm mpi-native --no-properties --schedule halving-doubling "
                                          "--check 'schedule float32 sum'",
                                      300);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("communicator mpi-native, MPICH"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kept every promise"), std::string::npos) << r.output;
  // A ring claimed of it fails, with a replay line for MPICH's launcher and program.
  const auto bad = dpcheck::run_command(std::string("env MPIR_CVAR_DEVICE_COLLECTIVES=none "
                                                    "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=recursive_doubling "
                                                    "mpiexec.mpich -n 3 ") +
                                            DPCHECK_MPICH_BINARY +
                                            " conform --comm mpi-native --no-properties --schedule ring "
                                            "--check 'schedule float32 sum'",
                                        300);
  EXPECT_EQ(bad.status, 1) << bad.output;
  // The variables that chose the algorithm go in front, so that the line replays it.
  EXPECT_NE(
      bad.output.find("replay: MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=recursive_doubling "
                      "MPIR_CVAR_DEVICE_COLLECTIVES=none mpiexec.mpich -n 3 dpcheck-mpich conform --comm mpi-native"),
      std::string::npos)
      << bad.output;
#else
  GTEST_SKIP() << "this build has no dpcheck-mpich (MPICH's development files were not found)";
#endif
}

TEST(PluginComm, ACrashEndsTheRunNamingTheCallAndLeavesNoReport) {
  Scratch s;
  const fs::path report = s.dir / "r.json";
  const auto r = dpcheck::run_command(
      kDpcheck + " verify --comm " + plugin("crash") + " --world-size 2 --cases 3 --report " + report.string(), 120);
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
