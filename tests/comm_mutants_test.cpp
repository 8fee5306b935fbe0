// The communicator mutants that sum in an order of their own (mutants/comm_mutants.cpp) on bfloat16 and
// float16 all-reduces, which the gradient all-reduce may run in: they must break those too, not pass
// them through to the correct backend. allreduce-rank-order starts each rank's sum at its own buffer,
// so the ranks disagree; allreduce-arrival-order sums in one order on every rank, so they agree, but
// not with the backend's rank order. float32 is the kill matrix's (tests/kill_matrix_test.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mutants/mutants.hpp"
#include "src/comm/local_comm.hpp"
#include "tests/comm_conformance.hpp"

namespace dpcheck {
namespace {

using namespace std::chrono_literals;

constexpr int kRanks = 4;
constexpr std::size_t kLen = 2000;

// Every rank's result of a sum of awkward values through `mutant` (empty: the local backend alone).
template <class H> std::vector<std::vector<H>> sums(const char* mutant) {
  std::vector<std::vector<H>> out(kRanks);
  std::mutex mu;
  run_local(
      kRanks,
      [&](Communicator& local) {
        std::unique_ptr<Communicator> wrapped = *mutant ? find_mutant(mutant)->parts.communicator(local) : nullptr;
        Communicator& c = wrapped ? *wrapped : local;
        std::vector<H> buf = conformance::awkward_values<H>(c.rank(), kLen);
        c.allreduce(std::span<H>(buf), ReduceOp::sum);
        const std::lock_guard lock(mu);
        out[static_cast<std::size_t>(c.rank())] = std::move(buf);
      },
      30s);
  return out;
}

template <class H> bool same(const std::vector<H>& a, const std::vector<H>& b) {
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(H)) == 0;
}

template <class H> void check_rank_order() {
  const auto got = sums<H>("allreduce-rank-order");
  int disagree = 0;
  for (int r = 1; r < kRanks; ++r) disagree += !same(got[static_cast<std::size_t>(r)], got[0]);
  EXPECT_GT(disagree, 0) << dtype_name(dtype_of<H>()) << ": every rank has rank 0's bits";
}

template <class H> void check_arrival_order() {
  const auto correct = sums<H>(""), got = sums<H>("allreduce-arrival-order");
  for (int r = 1; r < kRanks; ++r)
    EXPECT_TRUE(same(got[static_cast<std::size_t>(r)], got[0])) << dtype_name(dtype_of<H>()) << " rank " << r;
  EXPECT_FALSE(same(got[0], correct[0])) << dtype_name(dtype_of<H>()) << ": the backend's bits";
}

TEST(CommMutants, RankOrderBreaksSixteenBitSums) {
  check_rank_order<Bf16>();
  check_rank_order<Fp16>();
}

TEST(CommMutants, ArrivalOrderGivesEveryRankTheSameOtherSixteenBitSum) {
  check_arrival_order<Bf16>();
  check_arrival_order<Fp16>();
}

// The conformance suite (conform's checks, as the backends' tests run them) fails each communicator
// mutant at a check its bug breaks: the suite can fail, through the same path that passes the backends.
struct SuiteKill {
  const char* mutant;
  const char* check;
};

class CommMutantsSuite : public testing::TestWithParam<SuiteKill> {};

TEST_P(CommMutantsSuite, TheConformanceSuiteFailsTheMutant) {
  const SuiteKill k = GetParam();
  std::vector<std::string> failures(kRanks);
  run_local(
      kRanks,
      [&](Communicator& local) {
        const std::unique_ptr<Communicator> wrapped = find_mutant(k.mutant)->parts.communicator(local);
        failures[static_cast<std::size_t>(local.rank())] =
            run_conform_comm_check(*wrapped, k.check, conformance::suite_options());
      },
      30s);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_FALSE(failures[static_cast<std::size_t>(r)].empty())
        << k.mutant << " passed " << k.check << " on rank " << r;
    EXPECT_EQ(failures[static_cast<std::size_t>(r)], failures[0]) << "the ranks disagree on the verdict";
  }
  // The correct backend passes the same check.
  run_local(
      kRanks,
      [&](Communicator& c) {
        EXPECT_EQ(run_conform_comm_check(c, k.check, conformance::suite_options()), "") << k.check;
      },
      30s);
}

const SuiteKill kSuiteKills[] = {
    {"allreduce-sum-no-average", "allreduce float32 avg"},
    {"allreduce-rank-order", "same bits on every rank float32 sum"},
    {"allreduce-rank-order", "float sum is the serial fixed-order sum"},
    {"allreduce-large-message-tail", "allreduce float32 sum"},
    {"allreduce-arrival-order", "float sum is the serial fixed-order sum"},
    {"allreduce-corrupt-one", "allreduce float32 sum"},
};

INSTANTIATE_TEST_SUITE_P(CommMutants, CommMutantsSuite, testing::ValuesIn(kSuiteKills),
                         [](const testing::TestParamInfo<SuiteKill>& p) {
                           return std::to_string(p.index) + "_" + conformance::test_name(p.param.mutant);
                         });

}  // namespace
}  // namespace dpcheck
