// Tests of the "mpi" Communicator (src/comm/mpi_comm.cpp), run by ctest under mpirun with 2 and 4 processes:
// the conformance suite (tests/comm_conformance.hpp) on the MPI world, the same bits as the local
// backend for the same inputs, MPI's own collectives (the benchmark baseline), and a rank that never
// makes a call, which must end its peers' call with a TimeoutError naming it, not a hang.
//
// Every rank runs every test. Rank 0 prints GoogleTest's output; the other ranks print only their
// failures, each line marked with the rank. The exit status is the AND of every rank's verdict, the
// same on all of them, so mpirun's status is the suite's.
#include "src/comm/mpi_comm.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/local_comm.hpp"
#include "src/error.hpp"
#include "tests/comm_conformance.hpp"

namespace dpcheck {
namespace {

using namespace std::chrono_literals;
using conformance::Clock;
using conformance::seconds_since;

MpiSession* g_session = nullptr;

Communicator& world() { return g_session->world(); }

class Conformance : public testing::TestWithParam<conformance::ConformanceCheck> {};

TEST_P(Conformance, OnTheMpiWorld) { GetParam().run(world()); }

INSTANTIATE_TEST_SUITE_P(MpiComm, Conformance, testing::ValuesIn(conformance::conformance_checks()),
                         conformance::check_name);

TEST(MpiComm, IsTheMpiBackendOverEveryProcess) {
  EXPECT_EQ(world().backend(), "mpi");
  EXPECT_TRUE(mpi_available());
  EXPECT_TRUE(launched_by_mpi());
}

// The same awkward inputs through this world and through a local world of the same size (threads in
// this process): the results must be the same bits, for sums and averages.
template <class T> void check_same_bits_as_local(std::size_t len) {
  Communicator& c = world();
  const int n = c.size();
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    std::vector<T> mine = conformance::awkward_values<T>(c.rank(), len);
    c.allreduce(std::span<T>(mine), op);
    std::vector<std::vector<T>> local(static_cast<std::size_t>(n));
    run_local(n, [&](Communicator& lc) {
      std::vector<T> buf = conformance::awkward_values<T>(lc.rank(), len);
      lc.allreduce(std::span<T>(buf), op);
      local[static_cast<std::size_t>(lc.rank())] = std::move(buf);  // each thread its own entry
    });
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(std::memcmp(mine.data(), local[static_cast<std::size_t>(r)].data(), len * sizeof(T)), 0)
          << conformance::where(c) << " " << dtype_name(dtype_of<T>()) << " " << reduce_op_name(op) << " len " << len
          << ": differs from local rank " << r;
  }
}

TEST(MpiComm, SameBitsAsTheLocalBackend) {
  for (std::size_t len : {std::size_t{1}, std::size_t{37}, std::size_t{5000}, std::size_t{100'003}}) {
    check_same_bits_as_local<float>(len);
    check_same_bits_as_local<double>(len);
    check_same_bits_as_local<Bf16>(len);
    check_same_bits_as_local<Fp16>(len);
  }
}

TEST(MpiComm, NativeCollectivesAgreeWithTheClosedForms) {
  const std::unique_ptr<Communicator> native = make_mpi_native_communicator();
  Communicator& c = *native;
  EXPECT_EQ(c.backend(), "mpi-native");
  EXPECT_EQ(c.size(), world().size());
  EXPECT_EQ(c.rank(), world().rank());
  // 16-bit sums of small integers are exact even rounded at every combination, as MPI's tree with the
  // user-defined operations does (src/comm/mpi_native_comm.cpp); the patterns move untouched.
  for (const char* check :
       {"rank and size", "allreduce sum, min and max of every dtype", "allreduce avg is the sum divided by N",
        "broadcast int64", "allgather float32", "uint8 broadcast and allgather", "allgather in place",
        "all and allgather_value", "16-bit sums are exact on small integers", "broadcast bfloat16", "broadcast float16",
        "allgather bfloat16", "allgather float16"})
    conformance::run_check(c, check);
}

TEST(MpiComm, ACommunicatorOfItsOwnKeepsItsOwnSequence) {
  // Calls on a second communicator interleave with world()'s without their messages mixing.
  const std::unique_ptr<Communicator> other = make_mpi_communicator();
  EXPECT_EQ(other->backend(), "mpi");
  for (int k = 0; k < 20; ++k) {
    std::int64_t a = world().rank() + k, b = 100 * other->rank() + k;
    world().allreduce(std::span<std::int64_t>(&a, 1), ReduceOp::max);
    other->allreduce(std::span<std::int64_t>(&b, 1), ReduceOp::min);
    EXPECT_EQ(a, world().size() - 1 + k);
    EXPECT_EQ(b, k);
  }
}

// Rank N-1 never makes the call. The timeout is on a communicator of its own, so world() stays usable
// for the verdict; and since a rank that never calls has posted nothing, the waiting ranks' cancelled
// receives and small, already delivered descriptions leave nothing that MPI_Finalize would wait for.
// It runs last all the same, to leave nothing behind for other tests: GoogleTest runs plain TESTs
// first and parameterized suites afterwards in the order they are defined, so this is one, defined
// after the conformance suite, with the timeout as its parameter.
class MissingRank : public testing::TestWithParam<int> {};

// "rank 0" or "ranks 0, 1, 2": the first k ranks.
std::string rank_list_text(int k) {
  std::vector<int> ranks;
  for (int i = 0; i < k; ++i) ranks.push_back(i);
  return conformance::rank_list(ranks);
}

TEST_P(MissingRank, EndsThePeersCallWithATimeoutNamingIt) {
  const std::unique_ptr<Communicator> comm = make_mpi_communicator();
  comm->set_timeout(std::chrono::milliseconds(GetParam()));
  const double timeout_s = GetParam() / 1000.0;
  char after[32];
  std::snprintf(after, sizeof after, "after %.2f s", timeout_s);
  const int n = comm->size(), r = comm->rank(), missing = n - 1;
  if (n < 2) GTEST_SKIP() << "needs two processes";
  if (r == missing) {
    // Comes long after the others gave up: its call finds nobody to take its messages, and times out
    // in turn. Its own messages then stay unmatched, which MPI_Finalize must survive.
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * GetParam()));
    std::vector<float> buf(1024, 1.0f);
    try {
      comm->allreduce(std::span<float>(buf), ReduceOp::sum);
      ADD_FAILURE() << "rank " << r << ": allreduce returned although the others had given up";
    } catch (const TimeoutError& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("allreduce timed out on rank " + std::to_string(r), 0), 0u) << m;
      EXPECT_NE(m.find(rank_list_text(n - 1) + " did not receive"), std::string::npos) << m;
    }
  } else {
    std::vector<float> buf(1024, 1.0f);
    std::string message;
    const auto t0 = Clock::now();
    try {
      comm->allreduce(std::span<float>(buf), ReduceOp::sum);
      ADD_FAILURE() << "rank " << r << ": allreduce returned without rank " << missing;
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    const double waited = seconds_since(t0);
    EXPECT_GE(waited, 0.9 * timeout_s) << "rank " << r;
    EXPECT_LT(waited, 5.0) << "rank " << r;
    EXPECT_EQ(message.rfind("allreduce timed out on rank " + std::to_string(r) + " " + std::string(after), 0), 0u)
        << message;
    EXPECT_NE(message.find("no message from rank " + std::to_string(missing)), std::string::npos) << message;
    if (r == 0) std::printf("[ timeout  ] rank 0 saw: %s\n", message.c_str());

    // The communicator stays broken: a later call fails at once instead of waiting out another timeout.
    const auto t1 = Clock::now();
    try {
      comm->barrier();
      ADD_FAILURE() << "rank " << r << ": barrier after the timeout returned";
    } catch (const TimeoutError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("barrier on rank " + std::to_string(r) + " abandoned: allreduce timed out"), std::string::npos)
          << m;
    }
    EXPECT_LT(seconds_since(t1), 0.1) << "rank " << r;
  }
  // world() was not involved, and still works for everyone.
  EXPECT_TRUE(world().all(true));
}

INSTANTIATE_TEST_SUITE_P(MpiComm, MissingRank, testing::Values(500),
                         [](const testing::TestParamInfo<int>& p) { return std::to_string(p.param) + "ms"; });

// Other ranks' failures, each line marked with the rank; everything else stays quiet.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::string text = result.message();
    std::string marked;
    for (std::size_t start = 0; start < text.size();) {
      const std::size_t end = std::min(text.find('\n', start), text.size());
      marked += "[rank " + std::to_string(rank_) + "]   " + text.substr(start, end - start) + "\n";
      start = end + 1;
    }
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), marked.c_str());
    std::fflush(stderr);
  }

  void OnTestEnd(const testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(), info.name());
    std::fflush(stderr);
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace dpcheck

int main(int argc, char** argv) {
  using namespace dpcheck;
  MpiSession session(&argc, &argv);
  g_session = &session;
  testing::InitGoogleTest(&argc, argv);
  // A peer that dies or falls behind shows up within a minute at most, not ctest's whole timeout.
  session.world().set_timeout(std::chrono::seconds(30));

  const int rank = session.world().rank();
  if (rank != 0) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }

  const bool passed = RUN_ALL_TESTS() == 0;
  std::fflush(stdout);
  try {
    const bool all_passed = session.world().all(passed);
    if (rank == 0 && passed && !all_passed) std::printf("[  FAILED  ] on another rank (see its [rank N] lines)\n");
    return all_passed ? 0 : 1;
  } catch (const std::exception& e) {
    // The world itself broke (a rank died or stopped answering): end every rank, not just this one.
    std::fprintf(stderr, "[rank %d] the verdict could not be gathered: %s\n", rank, e.what());
    std::fflush(stderr);
    session.abort(1);
  }
}
