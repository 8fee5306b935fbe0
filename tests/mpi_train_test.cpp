// dpcheck across processes, through mpirun: training, bit-identical resume after the processes have
// ended, and dead or stuck ranks, which must end the job within the timeout with an error naming the
// collective and the rank -- never a hang. Skips, with the reason, where mpirun or MPI is missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;

// Every command has a hard limit, so that a hang fails the test instead of the suite.
CommandResult run(const std::string& cmd, int limit_s = 120) { return run_command(cmd, limit_s); }

std::string mpirun(int np) {
  return std::string(DPCHECK_MPIEXEC) + " --allow-run-as-root --oversubscribe -np " + std::to_string(np) + " " +
         DPCHECK_BINARY;
}

class MpiTrain : public testing::Test {
 protected:
  void SetUp() override {
    if (!DPCHECK_HAS_MPI) GTEST_SKIP() << "this build has no MPI backend";
    if (::access(DPCHECK_MPIEXEC, X_OK) != 0) GTEST_SKIP() << "no MPI launcher at " << DPCHECK_MPIEXEC;
  }
  const ScratchDir scratch_;
  const fs::path dir_ = scratch_.path();
};

const std::string kTrain =
    " train --comm mpi --model 6,9,3 --loss cross-entropy --batch 22 --dataset-size 44 --policy uneven "
    "--optimizer adam --lr 0.01 --seed 3";

TEST_F(MpiTrain, TrainsAcrossProcessesWithEveryCheck) {
  const CommandResult o = run(mpirun(4) + kTrain + " --steps 4");
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("4 ranks"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("all steps passed the replica check"), std::string::npos) << o.output;
  // Only rank 0 prints: one line a step.
  std::size_t steps = 0;
  for (std::size_t at = o.output.find("step    "); at != std::string::npos; at = o.output.find("step    ", at + 1))
    ++steps;
  EXPECT_EQ(steps, 4u) << o.output;
}

TEST_F(MpiTrain, ADesyncStopsEveryProcess) {
  const CommandResult o =
      run(mpirun(3) + kTrain + " --steps 4 --mutant optimizer-rank-perturb --bundle-dir " + dir_.string());
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("replicas differ after step 0"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("rank 2"), std::string::npos) << o.output;
}

// T steps straight against t steps, the processes ending, and a resume from the files to T.
TEST_F(MpiTrain, ResumeAfterTheProcessesEndedIsBitwiseEqual) {
  const fs::path straight = dir_ / "straight", split = dir_ / "split";
  ASSERT_EQ(run(mpirun(2) + kTrain + " --steps 5 --checkpoint-dir " + straight.string()).status, 0);
  const CommandResult first = run(mpirun(2) + kTrain + " --steps 2 --checkpoint-dir " + split.string());
  ASSERT_EQ(first.status, 0) << first.output;
  const CommandResult second =
      run(mpirun(2) + kTrain + " --steps 5 --resume " + split.string() + " --checkpoint-dir " + split.string());
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("resuming from"), std::string::npos) << second.output;
  const fs::path a = straight / "step-00000005", b = split / "step-00000005";
  int files = 0;
  for (const auto& e : fs::directory_iterator(a)) {
    const std::string name = e.path().filename().string();
    if (name == "manifest.json") continue;  // records the same numbers; compared through the files
    EXPECT_EQ(read_file(e.path()), read_file(b / name)) << name;
    ++files;
  }
  EXPECT_EQ(files, 6);  // 2 weights, 2 biases, exp_avg, exp_avg_sq
  // Resuming with another configuration is refused.
  const CommandResult bad = run(mpirun(2) + kTrain + " --steps 6 --batch 20 --resume " + split.string());
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("batch"), std::string::npos) << bad.output;
}

TEST_F(MpiTrain, AStuckRankEndsTheJobWithinTheTimeoutNamingTheCollectiveAndTheRank) {
  const CommandResult o =
      run(mpirun(3) + kTrain +
              " --steps 6 --timeout 2 --inject-fault stall --fault-rank 1 --fault-step 2 --bundle-dir " + dir_.string(),
          60);
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 30.0) << o.output;
  EXPECT_NE(o.output.find("timed out"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("allreduce"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("rank 1"), std::string::npos) << o.output;
}

// By default Open MPI ends the whole job as soon as a process dies, and says which rank. Told not to,
// the surviving ranks end on their own within the timeout, naming the collective and the dead rank.
TEST_F(MpiTrain, AKilledRankEndsTheJobNamingTheRank) {
  const std::string fault =
      kTrain + " --steps 6 --timeout 3 --inject-fault kill --fault-rank 2 --fault-step 1 --bundle-dir " + dir_.string();
  const CommandResult o = run(mpirun(3) + fault, 60);
  EXPECT_NE(o.status, 0) << o.output;
  EXPECT_LT(o.seconds, 30.0) << o.output;
  EXPECT_NE(o.output.find("rank 2"), std::string::npos) << o.output;

  const CommandResult own = run("env OMPI_MCA_orte_abort_on_non_zero_status=0 " + mpirun(3) + fault, 60);
  EXPECT_NE(own.status, 0) << own.output;
  EXPECT_LT(own.seconds, 30.0) << own.output;
  EXPECT_NE(own.output.find("allreduce timed out"), std::string::npos) << own.output;
  EXPECT_NE(own.output.find("no message from rank 2"), std::string::npos) << own.output;
}

// Bad input that one rank meets alone -- here a --comm plugin missing from its working directory, as a
// file missing on its host is -- is named by that rank within seconds, and the job exits 2, instead of
// the others waiting out --timeout in their first collective. Bad input every rank meets is said once.
TEST_F(MpiTrain, BadInputOfOneRankAloneIsNamedByItWithinSeconds) {
  const fs::path has = dir_ / "has", lacks = dir_ / "lacks";
  fs::create_directories(has);
  fs::create_directories(lacks);
  fs::copy_file(DPCHECK_COMM_PLUGIN, has / "p.so");
  const std::string args = " train --model 6,9,3 --steps 1 --timeout 60 --comm ./p.so";
  const std::string launcher = std::string(DPCHECK_MPIEXEC) + " --allow-run-as-root --oversubscribe";
  const CommandResult alone = run(launcher + " -np 1 -wdir " + has.string() + " " + DPCHECK_BINARY + args +
                                      " : -np 1 -wdir " + lacks.string() + " " + DPCHECK_BINARY + args,
                                  60);
  EXPECT_EQ(alone.status, 2) << alone.output;
  EXPECT_LT(alone.seconds, 30.0) << alone.output;
  EXPECT_NE(alone.output.find("dpcheck: error: rank 1: --comm ./p.so: no such file"), std::string::npos)
      << alone.output;
  EXPECT_EQ(alone.output.find("timed out"), std::string::npos) << alone.output;

  const CommandResult every = run(mpirun(3) + " train --comm mpi --steps 1", 60);
  EXPECT_EQ(every.status, 2) << every.output;
  EXPECT_LT(every.seconds, 30.0) << every.output;
  const std::size_t said = every.output.find("dpcheck: error: --model is required");
  ASSERT_NE(said, std::string::npos) << every.output;
  EXPECT_EQ(every.output.find("dpcheck: error:", said + 1), std::string::npos) << every.output;
}

}  // namespace

namespace {

// The write audit around a real multi-process run: a non-zero rank that opens a log of its own is
// named with its path; the correct writer passes.
TEST_F(MpiTrain, AuditCatchesASideChannelLogNamingTheRankAndThePath) {
  const std::string train =
      kTrain + " --steps 2 --checkpoint-dir " + (dir_ / "ckpt").string() + " --log " + (dir_ / "log.jsonl").string();
  const std::string audit = std::string(DPCHECK_BINARY) + " audit -- ";
  const CommandResult clean = run(audit + mpirun(4) + train);
  EXPECT_EQ(clean.status, 0) << clean.output;
  EXPECT_NE(clean.output.find("verdict: passed"), std::string::npos) << clean.output;
  const CommandResult bad = run(audit + mpirun(4) + train + " --mutant side-channel-log");
  EXPECT_EQ(bad.status, 1) << bad.output;
  for (int r = 1; r < 4; ++r)
    EXPECT_NE(bad.output.find("rank " + std::to_string(r) + " (pid"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find((dir_ / "log.jsonl.rank1").string()), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace dpcheck
