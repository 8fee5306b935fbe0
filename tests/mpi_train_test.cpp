// dpcheck across processes, through mpirun: training, bit-identical resume after the processes have
// ended, and dead or stuck ranks, which must end the job within the timeout with an error naming the
// collective and the rank -- never a hang. Skips, with the reason, where mpirun or MPI is missing.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int status = -1;
  std::string out;
  double seconds = 0;
};

// Runs a shell command with a hard limit, so that a hang fails the test instead of the suite.
Outcome run(const std::string& cmd, int limit_s = 120) {
  Outcome o;
  const auto start = std::chrono::steady_clock::now();
  const std::string guarded = "timeout -s KILL " + std::to_string(limit_s) + " " + cmd + " 2>&1";
  FILE* p = ::popen(guarded.c_str(), "r");
  if (!p) return o;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) o.out.append(buf, n);
  const int st = ::pclose(p);
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

std::string mpirun(int np) {
  return std::string(DPCHECK_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " + std::to_string(np) + " " +
         DPCHECK_BINARY;
}

class MpiTrain : public testing::Test {
 protected:
  void SetUp() override {
    if (!DPCHECK_HAS_MPI) GTEST_SKIP() << "this build has no MPI backend";
    if (::access(DPCHECK_MPIEXEC, X_OK) != 0) GTEST_SKIP() << "no MPI launcher at " << DPCHECK_MPIEXEC;
    dir_ = fs::temp_directory_path() / ("dpcheck_mpi_train_" + std::to_string(::getpid()) + "_" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  fs::path dir_;
};

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

const std::string kTrain =
    " train --comm mpi --model 6,9,3 --loss cross-entropy --batch 22 --dataset-size 44 --policy uneven "
    "--optimizer adam --lr 0.01 --seed 3";

TEST_F(MpiTrain, TrainsAcrossProcessesWithEveryCheck) {
  const Outcome o = run(mpirun(4) + kTrain + " --steps 4");
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("4 ranks"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("all steps passed the replica check"), std::string::npos) << o.out;
  // Only rank 0 prints: one line a step.
  std::size_t steps = 0;
  for (std::size_t at = o.out.find("step    "); at != std::string::npos; at = o.out.find("step    ", at + 1)) ++steps;
  EXPECT_EQ(steps, 4u) << o.out;
}

TEST_F(MpiTrain, ADesyncStopsEveryProcess) {
  const Outcome o = run(mpirun(3) + kTrain + " --steps 4 --mutant optimizer-rank-perturb");
  EXPECT_NE(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("replicas differ after step 0"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("rank 2"), std::string::npos) << o.out;
}

// T steps straight against t steps, the processes ending, and a resume from the files to T.
TEST_F(MpiTrain, ResumeAfterTheProcessesEndedIsBitwiseEqual) {
  const fs::path straight = dir_ / "straight", split = dir_ / "split";
  ASSERT_EQ(run(mpirun(2) + kTrain + " --steps 5 --checkpoint-dir " + straight.string()).status, 0);
  const Outcome first = run(mpirun(2) + kTrain + " --steps 2 --checkpoint-dir " + split.string());
  ASSERT_EQ(first.status, 0) << first.out;
  const Outcome second = run(mpirun(2) + kTrain + " --steps 5 --resume " + split.string() + " --checkpoint-dir " + split.string());
  ASSERT_EQ(second.status, 0) << second.out;
  EXPECT_NE(second.out.find("resuming from"), std::string::npos) << second.out;
  const fs::path a = straight / "step-00000005", b = split / "step-00000005";
  int files = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    const std::string name = e.path().filename().string();
    if (name == "manifest.json") continue;  // records the same numbers; compared through the files
    EXPECT_EQ(read(e.path()), read(b / name)) << name;
    ++files;
  }
  EXPECT_EQ(files, 6);  // 2 weights, 2 biases, exp_avg, exp_avg_sq
  // Resuming with another configuration is refused.
  const Outcome bad = run(mpirun(2) + kTrain + " --steps 6 --batch 20 --resume " + split.string());
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("batch"), std::string::npos) << bad.out;
}

TEST_F(MpiTrain, AStuckRankEndsTheJobWithinTheTimeoutNamingTheCollectiveAndTheRank) {
  const Outcome o = run(mpirun(3) + kTrain + " --steps 6 --timeout 2 --inject-fault stall --fault-rank 1 --fault-step 2", 60);
  EXPECT_NE(o.status, 0) << o.out;
  EXPECT_LT(o.seconds, 30.0) << o.out;
  EXPECT_NE(o.out.find("timed out"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("allreduce"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("rank 1"), std::string::npos) << o.out;
}

// By default Open MPI ends the whole job as soon as a process dies, and says which rank. Told not to,
// the surviving ranks end on their own within the timeout, naming the collective and the dead rank.
TEST_F(MpiTrain, AKilledRankEndsTheJobNamingTheRank) {
  const std::string fault = kTrain + " --steps 6 --timeout 3 --inject-fault kill --fault-rank 2 --fault-step 1";
  const Outcome o = run(mpirun(3) + fault, 60);
  EXPECT_NE(o.status, 0) << o.out;
  EXPECT_LT(o.seconds, 30.0) << o.out;
  EXPECT_NE(o.out.find("rank 2"), std::string::npos) << o.out;

  const Outcome own = run("env OMPI_MCA_orte_abort_on_non_zero_status=0 " + mpirun(3) + fault, 60);
  EXPECT_NE(own.status, 0) << own.out;
  EXPECT_LT(own.seconds, 30.0) << own.out;
  EXPECT_NE(own.out.find("allreduce timed out"), std::string::npos) << own.out;
  EXPECT_NE(own.out.find("no message from rank 2"), std::string::npos) << own.out;
}

TEST_F(MpiTrain, VerifyRunsEveryPropertyAcrossProcesses) {
  const Outcome o = run(mpirun(3) + " verify --comm mpi --cases 20", 300);
  EXPECT_EQ(o.status, 0) << o.out;
  EXPECT_NE(o.out.find("world size 3"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("all properties passed"), std::string::npos) << o.out;
  const Outcome bad = run(mpirun(3) + " verify --comm mpi --cases 20 --mutant allreduce-rank-order", 300);
  EXPECT_EQ(bad.status, 1) << bad.out;
  EXPECT_NE(bad.out.find("replay: mpirun -np 3 dpcheck verify"), std::string::npos) << bad.out;
}

}  // namespace

namespace {

// The write audit around a real multi-process run: a non-zero rank that opens a log of its own is
// named with its path; the correct writer passes.
TEST_F(MpiTrain, AuditCatchesASideChannelLogNamingTheRankAndThePath) {
  const std::string train = kTrain + " --steps 2 --checkpoint-dir " + (dir_ / "ckpt").string() + " --log " +
                            (dir_ / "log.jsonl").string();
  const std::string audit = std::string(DPCHECK_BINARY) + " audit -- ";
  const Outcome clean = run(audit + mpirun(4) + train);
  EXPECT_EQ(clean.status, 0) << clean.out;
  EXPECT_NE(clean.out.find("verdict: passed"), std::string::npos) << clean.out;
  const Outcome bad = run(audit + mpirun(4) + train + " --mutant side-channel-log");
  EXPECT_EQ(bad.status, 1) << bad.out;
  for (int r = 1; r < 4; ++r)
    EXPECT_NE(bad.out.find("rank " + std::to_string(r) + " (pid"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find((dir_ / "log.jsonl.rank1").string()), std::string::npos) << bad.out;
}

}  // namespace
