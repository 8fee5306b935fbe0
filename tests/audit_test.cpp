// The write audit for real: tests/audit_writer.cpp's program makes each kind of write-intent call under
// the audit library (with RANK=0, RANK=1, no rank, and under mpirun), and the records, the judgement
// and `dpcheck audit` are checked against what it did.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "src/audit/audit.hpp"
#include "src/audit/planted.hpp"
#include "src/error.hpp"
#include "src/io/process.hpp"
#include "tests/test_support.hpp"

namespace dpcheck::audit {
namespace {

namespace fs = std::filesystem;

const char* const launcher_rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK"};

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The dpcheck binary with `args`.
CommandResult run_binary(const std::string& args) { return run_command(std::string(DPCHECK_BINARY) + " " + args); }

std::string report_text(const std::vector<std::string>& argv, const RunResult& run, const AllowList& allow) {
  std::ostringstream s;
  print_report(s, argv, run, allow, offending(run.log.records, allow));
  return s.str();
}

std::vector<std::string> mpirun(int np) {
  return {"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(np)};
}

class Audit : public testing::Test {
 protected:
  void SetUp() override {
    // The test's own launcher variables, if any, would outrank RANK in the writer.
    for (const char* var : launcher_rank_vars) ::unsetenv(var);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // The writer with `args` under the audit; `env` holds NAME=VALUE entries for it.
  static RunResult writer(const std::vector<std::string>& args, const std::vector<std::string>& env) {
    std::vector<std::string> argv{DPCHECK_AUDIT_WRITER};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_audited(argv, env, DPCHECK_AUDIT_LIBRARY_FILE);
  }

  // Canonical: recorded paths are built on the kernel's working directory, which has no symbolic links.
  const ScratchDir scratch_;
  const fs::path dir_ = scratch_.path();
};

// ---- recording -------------------------------------------------------------------------------------------

struct Expected {
  std::string call;
  std::string path;
  std::string to = {};
};

TEST_F(Audit, EveryInterposedCallIsRecordedWithRankCallAndAbsolutePath) {
  const std::string d = path("d");
  fs::create_directories(d);
  const auto in = [&](const std::string& name) { return d + "/" + name; };
  // clang-format off
  const std::vector<std::string> ops = {
      "open", in("a"),            "open64", in("b"),           "openat", d, "c",          "openat64", d, "e",
      "creat", in("f"),           "creat64", in("g"),          "__open_2", in("a"),       "__open64_2", in("b"),
      "__openat_2", d, "c",       "__openat64_2", d, "e",      "tmpfile", d,
      "fopen", in("h"),           "fopen64", in("i"),          "freopen", in("j"),        "freopen64", in("k"),
      "freopen-same", in("h"),
      "rename", in("a"), in("a2"), "renameat", d, "b", "b2",   "renameat2", d, "c", "c2",
      "link", in("a2"), in("l1"), "linkat", d, "e", "l2",      "symlink", "some/target", in("s1"),
      "symlinkat", "other", d, "s2",
      "unlink", in("l1"),         "unlinkat", d, "l2",         "remove", in("s1"),
      "mkdir", in("m1"),          "mkdirat", d, "m2",          "rmdir", in("m1"),
      "truncate", in("f"),        "truncate64", in("g"),       "mkfifo", in("p1"),        "mkfifoat", d, "p2",
      "mkstemp", in("t1XXXXXX"),  "mkstemp64", in("t2XXXXXX"), "mkostemp", in("t3XXXXXX"),
      "mkostemp64", in("t4XXXXXX"), "mkstemps", in("t5XXXXXX.x"), "mkstemps64", in("t6XXXXXX.x"),
      "mkostemps", in("t7XXXXXX.x"), "mkostemps64", in("t8XXXXXX.x"), "mkdtemp", in("t9XXXXXX"),
  };
  const std::vector<Expected> expected = {
      {"open", in("a")},          {"open64", in("b")},         {"openat", in("c")},       {"openat64", in("e")},
      {"creat", in("f")},         {"creat64", in("g")},        {"__open_2", in("a")},     {"__open64_2", in("b")},
      {"__openat_2", in("c")},    {"__openat64_2", in("e")},   {"open", d},
      {"fopen", in("h")},         {"fopen64", in("i")},        {"freopen", in("j")},      {"freopen64", in("k")},
      {"freopen", in("h")},
      {"rename", in("a"), in("a2")}, {"renameat", in("b"), in("b2")}, {"renameat2", in("c"), in("c2")},
      {"link", in("a2"), in("l1")}, {"linkat", in("e"), in("l2")}, {"symlink", in("s1")},
      {"symlinkat", in("s2")},
      {"unlink", in("l1")},       {"unlinkat", in("l2")},      {"remove", in("s1")},
      {"mkdir", in("m1")},        {"mkdirat", in("m2")},       {"rmdir", in("m1")},
      {"truncate", in("f")},      {"truncate64", in("g")},     {"mkfifo", in("p1")},      {"mkfifoat", in("p2")},
      {"mkstemp", in("t1")},      {"mkstemp64", in("t2")},     {"mkostemp", in("t3")},
      {"mkostemp64", in("t4")},   {"mkstemps", in("t5")},      {"mkstemps64", in("t6")},
      {"mkostemps", in("t7")},    {"mkostemps64", in("t8")},   {"mkdtemp", in("t9")},
  };
  // clang-format on
  const RunResult run = writer(ops, {"RANK=1"});
  ASSERT_TRUE(run.succeeded()) << run.status_text();
  ASSERT_EQ(run.log.processes.size(), 1u);
  EXPECT_EQ(run.log.processes[0].rank, 1);
  EXPECT_TRUE(run.log.unreadable.empty());
  ASSERT_EQ(run.log.records.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const Record& r = run.log.records[i];
    const Expected& e = expected[i];
    SCOPED_TRACE("record " + std::to_string(i) + ": " + e.call + " " + e.path);
    EXPECT_EQ(r.rank, 1);
    EXPECT_EQ(r.pid, run.log.processes[0].pid);
    EXPECT_EQ(r.exe, DPCHECK_AUDIT_WRITER);
    EXPECT_EQ(r.call, e.call);
    EXPECT_EQ(r.result, "ok");
    EXPECT_FALSE(r.truncated);
    if (e.call.starts_with("mk") && e.call.find("temp") != std::string::npos) {
      // The name the call chose, not the template.
      EXPECT_TRUE(r.path.starts_with(e.path)) << r.path;
      EXPECT_EQ(r.path.find("XXXXXX"), std::string::npos) << r.path;
    } else {
      EXPECT_EQ(r.path, e.path);
    }
    EXPECT_EQ(r.to, e.to);
  }
  // The flags and modes read as the program wrote them.
  const std::vector<Record>& rs = run.log.records;
  EXPECT_EQ(rs[0].flags, "O_WRONLY|O_CREAT|O_TRUNC");
  EXPECT_EQ(rs[0].mode, "0644");
  EXPECT_EQ(rs[6].flags, "O_WRONLY|O_APPEND");
  EXPECT_EQ(rs[6].mode, "");
  EXPECT_EQ(rs[10].flags, "O_WRONLY|O_TMPFILE");
  EXPECT_EQ(rs[10].mode, "0600");
  EXPECT_EQ(rs[11].flags, "w");
  EXPECT_EQ(rs[15].flags, "a");
  EXPECT_EQ(rs[18].flags, "RENAME_NOREPLACE");
  EXPECT_EQ(rs[21].target, "some/target");
  EXPECT_EQ(rs[26].mode, "0755");
  EXPECT_EQ(rs[30].flags, "length=7");
  EXPECT_EQ(rs[35].flags, "O_RDWR|O_CREAT|O_EXCL|O_CLOEXEC");

  // Every function the library exports was exercised.
  std::set<std::string> calls;
  for (const Record& r : rs) calls.insert(r.call);
  EXPECT_EQ(calls.size(), 40u);

  // Rank 1 wrote outside every allowed path, so each of these calls offends.
  EXPECT_EQ(offending(rs, default_allow_list()).size(), rs.size());
}

TEST_F(Audit, ReadOnlyOpensLeaveNoRecord) {
  const std::string f = path("r.txt");
  std::ofstream(f) << "x";
  const RunResult run = writer({"read", f, "read-at", dir_.string(), "r.txt", "read-fortified", f, "fopen-mode", f, "r",
                                "fopen-mode", f, "rb", "fopen-mode", f, "re", "fopen-mode", f, "r+"},
                               {"RANK=1"});
  ASSERT_TRUE(run.succeeded()) << run.status_text();
  // The library was loaded and did record: only the last open ("r+") writes.
  ASSERT_EQ(run.log.processes.size(), 1u);
  ASSERT_EQ(run.log.records.size(), 1u);
  EXPECT_EQ(run.log.records[0].call, "fopen");
  EXPECT_EQ(run.log.records[0].flags, "r+");
}

// The mutants of the audit's judgement (audit_preload.cpp) reach the library only through
// AuditOptions::mutant, which a property sets: a DPCHECK_AUDIT_MUTANT in the environment of whoever runs
// an audit is removed, so it cannot weaken a user's audit. Each mutant, once set, loses exactly its call.
TEST_F(Audit, MutantsReachTheLibraryOnlyThroughTheOptions) {
  const std::string f = path("m.txt");
  std::ofstream(f) << "x";
  const std::vector<std::string> argv{DPCHECK_AUDIT_WRITER, "__open64_2", f, "fopen-mode", f, "r+", "openat",
                                      dir_.string(),        "n.txt"};
  const auto calls = [&](const std::string& mutant, bool in_environment) {
    AuditOptions options;
    options.extra_env = {"RANK=1"};
    if (in_environment) options.extra_env.push_back("DPCHECK_AUDIT_MUTANT=" + mutant);
    else options.mutant = mutant;
    options.library = DPCHECK_AUDIT_LIBRARY_FILE;
    const RunResult run = run_audited(argv, options);
    EXPECT_TRUE(run.succeeded()) << run.status_text();
    std::vector<std::string> out;
    for (const Record& r : run.log.records) out.push_back(r.call + " " + r.flags);
    return out;
  };
  using V = std::vector<std::string>;
  const V all{"__open64_2 O_RDWR", "fopen r+", "openat O_WRONLY|O_CREAT|O_TRUNC"};
  EXPECT_EQ(calls("", false), all);
  ::setenv("DPCHECK_AUDIT_MUTANT", "audit-rdwr-not-a-write", 1);
  EXPECT_EQ(calls("", false), all);
  ::unsetenv("DPCHECK_AUDIT_MUTANT");
  EXPECT_EQ(calls("audit-rdwr-not-a-write", true), all);
  EXPECT_EQ(calls("audit-rdwr-not-a-write", false), (V{"fopen r+", "openat O_WRONLY|O_CREAT|O_TRUNC"}));
  EXPECT_EQ(calls("audit-fopen-plus-ignored", false), (V{"__open64_2 O_RDWR", "openat O_WRONLY|O_CREAT|O_TRUNC"}));
  EXPECT_EQ(calls("audit-openat-unrecorded", false), (V{"__open64_2 O_RDWR", "fopen r+"}));
}

// The planted calls of audit_sees_every_write: a plan's text form reads back as itself, bad forms are
// refused naming the argument, and no call is made in a directory the property did not prepare.
TEST(AuditPlants, TextReadsBackAndBadPlansAndDirectoriesAreRefused) {
  for (const PlantKind& k : plant_kinds()) {
    const Plant p{3, std::string(k.name), true, "sub/7-a b:\xc3\xa9"};
    const Plant q = parse_plant(plant_text(p));
    EXPECT_EQ(q.rank, p.rank);
    EXPECT_EQ(q.kind, p.kind);
    EXPECT_EQ(q.relative, p.relative);
    EXPECT_EQ(q.name, p.name);
  }
  for (const char* bad :
       {"1:open-rdwr:abs", "x:open-rdwr:abs:f", "-1:open-rdwr:abs:f", "1:no-such-kind:abs:f", "1:open-rdwr:both:f",
        "1:open-rdwr:abs:", "1:open-rdwr:abs:/etc/f", "1:open-rdwr:abs:a/../../f", "1:open-rdwr:abs:d/"})
    EXPECT_THROW(parse_plant(bad), UsageError) << bad;

  const ScratchDir scratch;
  const std::vector<Plant> plants{{0, "open-create", false, "made"}};
  EXPECT_THROW(make_plants(scratch.path(), plants, 0), UsageError);
  EXPECT_FALSE(fs::exists(scratch.path() / "made"));
  prepare_plants(scratch.path(), plants);
  make_plants(scratch.path(), plants, 1);  // not rank 1's
  EXPECT_FALSE(fs::exists(scratch.path() / "made"));
  make_plants(scratch.path(), plants, 0);
  EXPECT_TRUE(fs::exists(scratch.path() / "made"));
}

TEST_F(Audit, RelativePathsAreMadeAbsolute) {
  fs::create_directories(path("sub"));
  const RunResult run =
      writer({"--quiet", "cd", dir_.string(), "creat", "rel.txt", "creat", "sub/../x.txt", "creat", "./sub/./y.txt",
              "openat", ".", "z", "rename", "rel.txt", "sub//rel2.txt", "mkdir", "sub/new/.."},
             {"RANK=1"});
  ASSERT_EQ(run.log.records.size(), 6u);
  const std::vector<Record>& rs = run.log.records;
  EXPECT_EQ(rs[0].path, path("rel.txt"));
  EXPECT_EQ(rs[1].path, path("x.txt"));
  EXPECT_EQ(rs[2].path, path("sub/y.txt"));
  EXPECT_EQ(rs[3].path, path("z"));
  EXPECT_EQ(rs[4].path, path("rel.txt"));
  EXPECT_EQ(rs[4].to, path("sub/rel2.txt"));
  // ".." is taken by name; the call itself failed (sub/new does not exist), and is recorded as tried.
  EXPECT_EQ(rs[5].path, path("sub"));
  EXPECT_EQ(rs[5].result, "ENOENT");
}

TEST_F(Audit, NestedFopenThroughOpenGivesOneRecord) {
  // The stand-in library's fopen calls open(), which resolves to the audit library's open: the inner
  // call must not be recorded a second time. --expect-shim shows the stand-in really ran.
  const std::string preload = std::string(DPCHECK_AUDIT_LIBRARY_FILE) + ":" + DPCHECK_AUDIT_SHIM_LIBRARY;
  const RunResult run = writer({"--expect-shim", "fopen", path("n.txt")}, {"RANK=1", "LD_PRELOAD=" + preload});
  ASSERT_TRUE(run.succeeded()) << run.status_text();
  ASSERT_EQ(run.log.records.size(), 1u);
  EXPECT_EQ(run.log.records[0].call, "fopen");
  EXPECT_EQ(run.log.records[0].path, path("n.txt"));
}

TEST_F(Audit, ClearingTheEnvironmentLosesNeitherRecordsNorRank) {
  const RunResult run = writer({"clearenv", "creat", path("after.txt")}, {"RANK=1"});
  ASSERT_TRUE(run.succeeded()) << run.status_text();
  ASSERT_EQ(run.log.records.size(), 1u);
  EXPECT_EQ(run.log.records[0].rank, 1);
  EXPECT_EQ(run.log.records[0].path, path("after.txt"));
}

TEST_F(Audit, ConcurrentThreadsLeaveWholeRecords) {
  const RunResult run =
      writer({"--quiet", "--threads", "4", "--repeat", "250", "open", path("t.txt"), "mkdir", path("m")}, {"RANK=1"});
  // mkdir fails with EEXIST after the first: still one record a call.
  EXPECT_TRUE(run.log.unreadable.empty());
  ASSERT_EQ(run.log.records.size(), 2000u);
  for (const Record& r : run.log.records) {
    EXPECT_EQ(r.rank, 1);
    EXPECT_TRUE(r.path == path("t.txt") || r.path == path("m")) << r.path;
  }
}

TEST_F(Audit, LongPathsAreCutToFitOneRecord) {
  std::string deep = dir_.string();
  while (deep.size() < 3500) deep += "/" + std::string(200, 'q');
  const RunResult run = writer({"--quiet", "open", deep, "rename", deep, deep + "x"}, {"RANK=1"});
  EXPECT_TRUE(run.log.unreadable.empty());
  ASSERT_EQ(run.log.records.size(), 2u);
  for (const Record& r : run.log.records) {
    EXPECT_TRUE(r.truncated);
    EXPECT_TRUE(deep.starts_with(r.path)) << "a cut path is a prefix of the real one";
    EXPECT_GT(r.path.size(), 1000u);
  }
  EXPECT_EQ(run.log.records[0].result, "ENOENT");
  // A cut path is never allowed on the strength of a prefix it might not really have.
  AllowList allow = default_allow_list();
  allow.push_back(user_allowance(run.log.records[0].path));
  EXPECT_EQ(offending(run.log.records, allow).size(), 2u);
  allow.push_back(user_allowance(dir_.string()));
  EXPECT_TRUE(offending(run.log.records, allow).empty());
}

TEST_F(Audit, TheAuditLogIsNeverRecorded) {
  const RunResult run = writer({"--repeat", "20", "creat", path("x"), "unlink", path("x")}, {"RANK=1"});
  ASSERT_TRUE(run.succeeded()) << run.status_text();
  ASSERT_EQ(run.log.records.size(), 40u);  // so the log was written to, 41 times with the start record
  for (const Record& r : run.log.records) {
    EXPECT_NE(r.path, run.log_path.string());
    EXPECT_EQ(r.path.find("dpcheck-audit-"), std::string::npos) << r.path;
  }
  EXPECT_FALSE(fs::exists(run.log_path)) << "the log is removed after reading";
}

// ---- judging -----------------------------------------------------------------------------------------------

TEST_F(Audit, DevNullAndProcSelfAreAllowed) {
  const RunResult run =
      writer({"--quiet", "fopen-mode", "/dev/null", "w", "open", "/dev/null", "fopen-mode", "/proc/self/comm", "w"},
             {"RANK=1"});
  ASSERT_EQ(run.log.records.size(), 3u);
  const AllowList allow = default_allow_list();
  EXPECT_TRUE(offending(run.log.records, allow).empty()) << report_text({"writer"}, run, allow);
  EXPECT_EQ(allowed_by("fopen", run.log.records[0].path, allow)->prefix, "/dev");
  EXPECT_EQ(allowed_by("fopen", run.log.records[2].path, allow)->prefix, "/proc");
  EXPECT_EQ(allowed_by("open", "/dev/shm/segment", allow)->prefix, "/dev/shm");
  EXPECT_EQ(allowed_by("open", "/sys/class/x", allow)->prefix, "/sys");
}

TEST(AuditAllowList, PrefixesRespectDirectoryBoundaries) {
  AllowList allow = {user_allowance("/data/")};
  EXPECT_EQ(allow[0].prefix, "/data");
  EXPECT_NE(allowed_by("open", "/data", allow), nullptr);
  EXPECT_NE(allowed_by("open", "/data/x/y", allow), nullptr);
  EXPECT_EQ(allowed_by("open", "/database", allow), nullptr);
  EXPECT_EQ(allowed_by("open", "/database/x", allow), nullptr);
  EXPECT_EQ(allowed_by("open", "/dat", allow), nullptr);
  EXPECT_EQ(allowed_by("open", "/", allow), nullptr);
  EXPECT_EQ(allowed_by("open", "data/x", allow), nullptr) << "a relative path is never allowed";
  // mkdir -p on the way to an allowed directory, and nothing else above it.
  EXPECT_NE(allowed_by("mkdir", "/", allow), nullptr);
  EXPECT_EQ(allowed_by("creat", "/", allow), nullptr);
  EXPECT_EQ(allowed_by("mkdir", "/dat", allow), nullptr);
  // A relative --allow is taken from the working directory, and normalized.
  const Allowance rel = user_allowance("out/../logs");
  EXPECT_EQ(rel.prefix, (fs::current_path() / "logs").string());
  EXPECT_NE(allowed_by("open", "/x", {user_allowance("/")}), nullptr);
  // Rename and link are judged on both names.
  Record r;
  r.rank = 1;
  r.call = "rename";
  r.path = "/data/a";
  r.to = "/database/a";
  EXPECT_EQ(offending(std::vector<Record>{r}, allow).size(), 1u);
  r.to = "/data/b";
  EXPECT_TRUE(offending(std::vector<Record>{r}, allow).empty());
}

TEST_F(Audit, AllowedDirectoryDoesNotAllowItsNeighbour) {
  fs::create_directories(path("data"));
  fs::create_directories(path("database"));
  const RunResult run = writer({"creat", path("data/ok.txt"), "creat", path("database/bad.txt")}, {"RANK=1"});
  AllowList allow = default_allow_list();
  allow.push_back(user_allowance(path("data")));
  const std::vector<Record> bad = offending(run.log.records, allow);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].path, path("database/bad.txt"));
}

TEST_F(Audit, NonZeroRankWriteFailsNamingRankAndPath) {
  const RunResult run = writer({"creat", path("ckpt.bin")}, {"RANK=1"});
  const AllowList allow = default_allow_list();
  const std::vector<Record> bad = offending(run.log.records, allow);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].rank, 1);
  EXPECT_EQ(bad[0].path, path("ckpt.bin"));
  const std::string text = report_text({"writer"}, run, allow);
  EXPECT_NE(text.find("verdict: FAILED"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 (pid " + std::to_string(bad[0].pid)), std::string::npos) << text;
  EXPECT_NE(text.find("creat " + path("ckpt.bin")), std::string::npos) << text;
}

TEST_F(Audit, RankZeroWritesPass) {
  const RunResult run = writer({"creat", path("ckpt.bin"), "mkdir", path("logs")}, {"RANK=0"});
  ASSERT_EQ(run.log.records.size(), 2u);
  EXPECT_EQ(run.log.records[0].rank, 0);
  const AllowList allow = default_allow_list();
  EXPECT_TRUE(offending(run.log.records, allow).empty());
  const std::string text = report_text({"writer"}, run, allow);
  EXPECT_NE(text.find("verdict: passed"), std::string::npos) << text;
  EXPECT_NE(text.find(path("ckpt.bin")), std::string::npos) << "rank 0's writes are listed too";
}

TEST_F(Audit, ProcessesWithNoRankAreReportedButNotJudged) {
  const RunResult run = writer({"creat", path("x")}, {});
  ASSERT_EQ(run.log.records.size(), 1u);
  EXPECT_FALSE(run.log.records[0].rank.has_value());
  EXPECT_TRUE(offending(run.log.records, default_allow_list()).empty());
  const std::string text = report_text({"writer"}, run, default_allow_list());
  EXPECT_NE(text.find("no rank: 1 write-intent call, not judged"), std::string::npos) << text;
  EXPECT_NE(text.find("no audited process had a rank"), std::string::npos) << text;
}

TEST(AuditLog, LinesThatAreNotRecordsAreKept) {
  const Log log = parse_log(
      "{\"event\":\"start\",\"rank\":3,\"pid\":7,\"ppid\":1,\"exe\":\"/bin/x\","
      "\"launcher_dirs\":{\"OMPI_MCA_orte_jobfam_session_dir\":\"/tmp/ompi.h.0/pid.5\"}}\n"
      "{\"event\":\"write\",\"rank\":null,\"pid\":7,\"call\":\"open\",\"path\":\"/a\"}\n"
      "{\"event\":\"wri\n");
  ASSERT_EQ(log.processes.size(), 1u);
  EXPECT_EQ(log.processes[0].rank, 3);
  ASSERT_EQ(log.records.size(), 1u);
  EXPECT_FALSE(log.records[0].rank.has_value());
  ASSERT_EQ(log.unreadable.size(), 1u);
  const AllowList launcher = launcher_allowances(log);
  ASSERT_EQ(launcher.size(), 1u);
  EXPECT_EQ(launcher[0].prefix, "/tmp/ompi.h.0/pid.5");
  // A launcher directory that is a shared temporary directory is never taken.
  EXPECT_TRUE(launcher_allowances(parse_log("{\"event\":\"start\",\"rank\":1,\"pid\":1,"
                                            "\"launcher_dirs\":{\"PMIX_SERVER_TMPDIR\":\"/tmp\"}}\n"))
                  .empty());
}

// ---- under a real launcher ------------------------------------------------------------------------------

class AuditMpi : public Audit {
 protected:
  void SetUp() override {
    if (find_in_path("mpirun").empty()) GTEST_SKIP() << "mpirun is not on PATH";
    Audit::SetUp();
  }
  // MPI_Init in the writer makes Open MPI's own rank-side files, so the launcher allowance is exercised.
  static std::vector<std::string> writer_args(int only_rank) {
    std::vector<std::string> a{DPCHECK_AUDIT_WRITER};
    if (DPCHECK_AUDIT_WRITER_HAS_MPI) a.emplace_back("--mpi");
    a.insert(a.end(), {"--only-rank", std::to_string(only_rank)});
    return a;
  }
};

TEST_F(AuditMpi, RankOneWritingAFileIsCaught) {
  std::vector<std::string> argv = mpirun(2);
  for (const std::string& a : writer_args(1)) argv.push_back(a);
  argv.insert(argv.end(), {"creat", path("rank1.txt")});
  const RunResult run = run_audited(argv, {}, DPCHECK_AUDIT_LIBRARY_FILE);
  ASSERT_TRUE(run.succeeded()) << run.status_text();
  AllowList allow = default_allow_list();
  const AllowList launcher = launcher_allowances(run.log);
  allow.insert(allow.end(), launcher.begin(), launcher.end());
  const std::vector<Record> bad = offending(run.log.records, allow);
  ASSERT_EQ(bad.size(), 1u) << report_text(argv, run, allow);
  EXPECT_EQ(bad[0].rank, 1);
  EXPECT_EQ(bad[0].path, path("rank1.txt"));
  EXPECT_EQ(bad[0].call, "creat");
  // Both ranks and the launcher itself were audited.
  std::set<int> ranks;
  std::size_t no_rank = 0;
  for (const Process& p : run.log.processes) {
    if (p.rank) ranks.insert(*p.rank);
    else ++no_rank;
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  EXPECT_GE(no_rank, 1u);
}

TEST_F(AuditMpi, OnlyRankZeroWritingPasses) {
  std::vector<std::string> argv = mpirun(2);
  for (const std::string& a : writer_args(0)) argv.push_back(a);
  argv.insert(argv.end(), {"creat", path("rank0.txt")});
  const RunResult run = run_audited(argv, {}, DPCHECK_AUDIT_LIBRARY_FILE);
  ASSERT_TRUE(run.succeeded()) << run.status_text();
  AllowList allow = default_allow_list();
  const AllowList launcher = launcher_allowances(run.log);
  allow.insert(allow.end(), launcher.begin(), launcher.end());
  EXPECT_TRUE(offending(run.log.records, allow).empty()) << report_text(argv, run, allow);
  EXPECT_TRUE(std::any_of(run.log.records.begin(), run.log.records.end(),
                          [&](const Record& r) { return r.rank == 0 && r.path == path("rank0.txt"); }));
  if (!DPCHECK_AUDIT_WRITER_HAS_MPI)
    GTEST_SKIP() << "audit_writer was built without MPI: Open MPI wrote nothing on the ranks";
  // Open MPI's own files on rank 1 are what the launcher allowance is for: without it they offend.
  ASSERT_FALSE(launcher.empty());
  EXPECT_FALSE(offending(run.log.records, default_allow_list()).empty());
  for (const Allowance& a : launcher) {
    EXPECT_NE(a.prefix, "/tmp") << "never all of /tmp";
    EXPECT_GE(std::count(a.prefix.begin(), a.prefix.end(), '/'), 2) << a.prefix;
  }
}

// ---- the dpcheck command -----------------------------------------------------------------------------------

TEST_F(Audit, CommandExitsOneNamingRankAndPath) {
  const CommandResult r =
      run_binary("audit -- env RANK=1 " + std::string(DPCHECK_AUDIT_WRITER) + " creat " + shell_quote(path("x.bin")));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("verdict: FAILED"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("creat " + path("x.bin")), std::string::npos) << r.output;
}

TEST_F(Audit, CommandExitsZeroForRankZeroAndForAllowedPaths) {
  const std::string w = DPCHECK_AUDIT_WRITER;
  CommandResult r = run_binary("audit -- env RANK=0 " + w + " creat " + shell_quote(path("x.bin")));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("verdict: passed"), std::string::npos) << r.output;
  r = run_binary("audit --allow " + shell_quote(dir_.string()) + " --json " + shell_quote(path("r.json")) +
                 " -- env RANK=1 " + w + " creat " + shell_quote(path("y.bin")));
  EXPECT_EQ(r.status, 0) << r.output;
  std::ifstream f(path("r.json"));
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_TRUE(j["passed"].get<bool>());
  EXPECT_TRUE(j["offending"].empty());
}

TEST_F(Audit, CommandJsonNamesTheOffence) {
  const CommandResult r = run_binary("audit --json " + shell_quote(path("r.json")) + " -- env RANK=1 " +
                                     std::string(DPCHECK_AUDIT_WRITER) + " mkdir " + shell_quote(path("out")));
  EXPECT_EQ(r.status, 1) << r.output;
  std::ifstream f(path("r.json"));
  const nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_FALSE(j["passed"].get<bool>());
  ASSERT_EQ(j["offending"].size(), 1u);
  EXPECT_EQ(j["offending"][0]["rank"], 1);
  EXPECT_EQ(j["offending"][0]["path"], path("out"));
  EXPECT_EQ(j["offending"][0]["call"], "mkdir");
}

TEST_F(Audit, CommandUsageErrorsExitTwo) {
  for (const char* args :
       {"audit", "audit --bogus -- true", "audit -- /nonexistent/program", "audit --allow -- true"}) {
    const CommandResult r = run_binary(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_TRUE(r.output.starts_with("dpcheck: error: ")) << args << "\n" << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << args << "\n" << r.output;
  }
}

TEST_F(Audit, CommandThatFailsIsReported) {
  const CommandResult r = run_binary("audit -- false");
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("the command exited with status 1"), std::string::npos) << r.output;
}

TEST_F(AuditMpi, CommandCatchesRankOneUnderMpirun) {
  std::string cmd = "audit --";
  for (const std::string& a : mpirun(2)) cmd += " " + a;
  for (const std::string& a : writer_args(1)) cmd += " " + a;
  cmd += " creat " + shell_quote(path("r1.txt"));
  const CommandResult r = run_binary(cmd);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("creat " + path("r1.txt")), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dpcheck::audit
