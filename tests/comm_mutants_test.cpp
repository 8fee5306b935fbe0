// The communicator mutants that sum in an order of their own (properties/mutants.cpp) on bfloat16 and
// float16 all-reduces, which the gradient all-reduce may run in: they must break those too, not pass
// them through to the correct backend. allreduce-rank-order starts each rank's sum at its own buffer,
// so the ranks disagree; allreduce-arrival-order sums in one order on every rank, so they agree, but
// not with the backend's rank order. float32 is the kill matrix's (tests/kill_matrix_test.cpp).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <vector>

#include "properties/mutants.hpp"
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
  run_local(kRanks, [&](Communicator& local) {
    std::unique_ptr<Communicator> wrapped = *mutant ? mutant_communicator(mutant, local) : nullptr;
    Communicator& c = wrapped ? *wrapped : local;
    std::vector<H> buf = conformance::awkward_values<H>(c.rank(), kLen);
    c.allreduce(std::span<H>(buf), ReduceOp::sum);
    const std::lock_guard lock(mu);
    out[static_cast<std::size_t>(c.rank())] = std::move(buf);
  }, 30s);
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

}  // namespace
}  // namespace dpcheck
