// Tests of the "local" Communicator (src/comm/local_comm.cpp). The backend-independent checks are the
// conformance suite (tests/comm_conformance.hpp), run here on every world size from 1 to 8; this file
// adds what only threads in one process can show: a barrier watched through shared memory, a missing
// rank that times out, run_local's error handling and LocalWorld::abort. Failure paths must end in an
// error, not a hang. The allreduce benchmark (src/bench/bench.cpp) gets a short smoke run here too.
#include "src/comm/local_comm.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "src/bench/allreduce_run.hpp"
#include "src/bench/bench.hpp"
#include "src/error.hpp"
#include "src/target/backends.hpp"
#include "tests/comm_conformance.hpp"

namespace dpcheck {
namespace {

using namespace std::chrono_literals;
using conformance::Clock;
using conformance::seconds_since;

constexpr int max_ranks = 8;

class Conformance : public testing::TestWithParam<conformance::ConformanceCheck> {};

TEST_P(Conformance, OnWorldSizes1To8) {
  for (int n = 1; n <= max_ranks; ++n) run_local(n, GetParam().run, 30s);
}

INSTANTIATE_TEST_SUITE_P(LocalComm, Conformance, testing::ValuesIn(conformance::conformance_checks()),
                         conformance::check_name);

TEST(LocalComm, ReportsRankSizeAndBackend) {
  std::atomic<int> seen{0};
  run_local(3, [&](Communicator& c) {
    EXPECT_EQ(c.size(), 3);
    EXPECT_EQ(c.backend(), "local");
    EXPECT_EQ(c.memory_space(), MemorySpace::host);
    EXPECT_EQ(&c.host(), &c);
    seen.fetch_or(1 << c.rank());
  });
  EXPECT_EQ(seen.load(), 0b111);
}

TEST(LocalComm, BarrierHoldsEveryRankUntilAllArrive) {
  constexpr int n = 5, rounds = 50;
  std::atomic<int> arrived{0};
  run_local(n, [&](Communicator& c) {
    for (int k = 1; k <= rounds; ++k) {
      arrived.fetch_add(1);
      c.barrier();
      ASSERT_GE(arrived.load(), k * n) << "rank " << c.rank() << " left barrier " << k << " early";
      c.barrier();  // nobody starts the next round's increment before everyone has checked
    }
  });
}

TEST(LocalComm, MissingRankTimesOutInsteadOfHanging) {
  constexpr int n = 4;
  std::vector<std::string> messages(n);
  std::vector<int> timed_out(n, 0);
  std::vector<double> waited(n, 0.0);
  const auto t0 = Clock::now();
  run_local(
      n,
      [&](Communicator& c) {
        const auto r = static_cast<std::size_t>(c.rank());
        if (c.rank() == 3) return;  // never arrives
        std::vector<float> buf(16, 1.0f);
        const auto start = Clock::now();
        try {
          c.allreduce(std::span<float>(buf), ReduceOp::sum);
        } catch (const TimeoutError& e) {
          timed_out[r] = 1;
          messages[r] = e.what();
        }
        waited[r] = seconds_since(start);
        // The world stays broken: a later call fails at once rather than waiting out another timeout.
        try {
          c.barrier();
          ADD_FAILURE() << "rank " << r << ": barrier after the timeout returned";
        } catch (const Error& e) {
          const std::string m = e.what();
          EXPECT_NE(m.find("barrier on rank " + std::to_string(r) + " abandoned: allreduce timed out"),
                    std::string::npos)
              << m;
        }
      },
      200ms);
  EXPECT_LT(seconds_since(t0), 3.0);
  bool named_by_waiter = false;
  for (int r = 0; r < 3; ++r) {
    const std::string& m = messages[static_cast<std::size_t>(r)];
    EXPECT_EQ(timed_out[static_cast<std::size_t>(r)], 1) << "rank " << r;
    EXPECT_GE(waited[static_cast<std::size_t>(r)], 0.15) << "rank " << r;
    EXPECT_LT(waited[static_cast<std::size_t>(r)], 2.0) << "rank " << r;
    EXPECT_NE(m.find("rank 3 did not arrive"), std::string::npos) << m;
    EXPECT_NE(m.find("after 0.20 s"), std::string::npos) << m;
    named_by_waiter |= m.rfind("allreduce timed out on rank " + std::to_string(r), 0) == 0;
  }
  EXPECT_TRUE(named_by_waiter) << "no rank reported its own timeout";
}

TEST(LocalComm, RunLocalRethrowsTheTimeoutThatStartedTheFailure) {
  const auto t0 = Clock::now();
  try {
    run_local(
        3,
        [](Communicator& c) {
          if (c.rank() != 1) c.barrier();
        },
        100ms);
    FAIL() << "run_local returned normally";
  } catch (const TimeoutError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("barrier timed out on rank ", 0), 0u) << m;
    EXPECT_NE(m.find("rank 1 did not arrive"), std::string::npos) << m;
  }
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(LocalComm, RunLocalRethrowsTheOriginalExceptionAndStopsThePeers) {
  constexpr int n = 4;
  std::vector<std::string> peer_errors(n);
  const auto t0 = Clock::now();
  try {
    run_local(n, [&](Communicator& c) {  // default 60 s timeout: only the abort can end this quickly
      c.barrier();
      if (c.rank() == 2) throw std::runtime_error("boom");
      std::vector<float> buf(8, 1.0f);
      try {
        c.allreduce(std::span<float>(buf), ReduceOp::sum);
      } catch (const Error& e) {
        peer_errors[static_cast<std::size_t>(c.rank())] = e.what();
        throw;
      }
    });
    FAIL() << "run_local returned normally";
  } catch (const Error& e) {
    FAIL() << "rethrew a peer's error instead of the original: " << e.what();
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom");
  }
  EXPECT_LT(seconds_since(t0), 3.0);
  for (int r : {0, 1, 3}) {
    const std::string& m = peer_errors[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find("rank 2 failed: boom"), std::string::npos) << "rank " << r << ": " << m;
  }
}

TEST(LocalComm, RunLocalReturnsNormallyWhenNoRankThrows) {
  std::atomic<int> done{0};
  EXPECT_NO_THROW(run_local(6, [&](Communicator& c) {
    c.barrier();
    done.fetch_add(1);
  }));
  EXPECT_EQ(done.load(), 6);
}

TEST(LocalComm, AbortWakesARankBlockedInACollective) {
  LocalWorld world(2);  // default 60 s timeout
  std::string message;
  const auto t0 = Clock::now();
  std::thread waiter([&] {
    try {
      world.comm(0).barrier();
    } catch (const Error& e) {
      message = e.what();
    }
  });
  std::this_thread::sleep_for(20ms);
  world.abort(1, "stopped by the test");
  waiter.join();
  EXPECT_LT(seconds_since(t0), 2.0);
  EXPECT_NE(message.find("barrier on rank 0"), std::string::npos) << message;
  EXPECT_NE(message.find("rank 1 failed: stopped by the test"), std::string::npos) << message;
  EXPECT_THROW(world.comm(2), Error);
  EXPECT_THROW(LocalWorld(0), Error);
}

// ---- the allreduce benchmark ------------------------------------------------------------------------

TEST(Bench, ParsesSizesAndRanks) {
  EXPECT_EQ(bench::parse_size("4096"), 4096u);
  EXPECT_EQ(bench::parse_size("4K"), 4096u);
  EXPECT_EQ(bench::parse_size("4k"), 4096u);
  EXPECT_EQ(bench::parse_size("1M"), std::size_t{1} << 20);
  EXPECT_EQ(bench::parse_size("2G"), std::size_t{2} << 30);
  EXPECT_EQ(bench::parse_sizes("4K,1M,64M"), (std::vector<std::size_t>{4096, 1 << 20, 64 << 20}));
  EXPECT_EQ(bench::parse_ranks("2,4"), (std::vector<int>{2, 4}));
  for (const char* bad : {"", "4X", "0", "-4K", "K", "4KK", "1.5M", "99999999999999999999"})
    EXPECT_THROW(bench::parse_size(bad), UsageError) << "'" << bad << "'";
  EXPECT_THROW(bench::parse_sizes("4K,,1M"), UsageError);
  for (const char* bad : {"", "0", "-2", "2,x", "2,,4", "100000"})
    EXPECT_THROW(bench::parse_ranks(bad), UsageError) << "'" << bad << "'";
}

TEST(Bench, SmallAllreduceRunFindsNoWrongElements) {
  bench::AllreduceConfig cfg;
  cfg.sizes = {4, 4096, 1 << 18};
  cfg.ranks = {1, 3};
  cfg.iters = 4;
  cfg.warmup = 1;
  const bench::MemcpyBaseline base = bench::measure_memcpy(1 << 20, 2, 3);
  EXPECT_GT(base.gbs, 0.0);
  const std::vector<bench::AllreduceRow> rows =
      bench::bench_allreduce(bench::thread_backend(*find_backend("local"), "local"), cfg, base);
  ASSERT_EQ(rows.size(), 6u);
  for (const bench::AllreduceRow& row : rows) {
    EXPECT_EQ(row.backend, "local");
    EXPECT_EQ(row.count * 4, row.bytes);
    EXPECT_EQ(row.wrong, 0u);
    EXPECT_GT(row.time_us, 0.0);
    EXPECT_GT(row.traffic_gbs, 0.0);
  }
  std::ostringstream table;
  bench::print_allreduce_table(table, base, rows);
  EXPECT_NE(table.str().find("#wrong"), std::string::npos);
  EXPECT_EQ(bench::allreduce_json(base, rows)["rows"].size(), 6u);

  cfg.sizes = {6};  // not a whole number of float32 elements
  EXPECT_THROW(bench::bench_allreduce(bench::thread_backend(*find_backend("local"), "local"), cfg, base), UsageError);
}

// bench allreduce's backends are rows of the backend table (Backend::bench): local, mpi and mpi-native,
// whose rows are named MPI_Allreduce; --backends takes any of their names, in either case.
TEST(Bench, AllreduceBackendsAreRowsOfTheTable) {
  const auto names = [](std::string_view list) {
    std::vector<std::string> out;
    for (const Backend* row : parse_allreduce_backends(list)) out.push_back(row->name);
    return out;
  };
  EXPECT_EQ(names("local,MPI"), (std::vector<std::string>{"local", "mpi"}));
  EXPECT_EQ(names("Native"), (std::vector<std::string>{"mpi-native"}));
  EXPECT_EQ(names("mpi_allreduce,local,MPI-NATIVE"), (std::vector<std::string>{"local", "mpi-native"}));
  EXPECT_EQ(names("mpi,local,mpi"), (std::vector<std::string>{"local", "mpi"}));
  for (const char* bad : {"bogus", "nccl", "cuda-local", "local,", ""}) {
    try {
      parse_allreduce_backends(bad);
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("(choose from local, mpi, MPI_Allreduce)"), std::string::npos) << e.what();
    }
  }
  std::vector<std::string> all;
  for (const Backend* row : allreduce_backends()) all.push_back(allreduce_name(*row));
  EXPECT_EQ(all, (std::vector<std::string>{"local", "mpi", "MPI_Allreduce"}));
  EXPECT_EQ(allreduce_process_names(), (std::vector<std::string>{"mpi", "MPI_Allreduce"}));
  EXPECT_EQ(allreduce_help(*find_backend("mpi")), find_backend("mpi")->help);
}

// How a worker process hands its rows to the parent.
TEST(Bench, RowsSurviveTheirJsonForm) {
  bench::AllreduceRow row;
  row.backend = "mpi";
  row.ranks = 4;
  row.bytes = 4096;
  row.count = 1024;
  row.iters = 17;
  row.time_us = 12.5;
  row.algbw_gbs = 0.25;
  row.busbw_gbs = 0.375;
  row.traffic_gbs = 2.5;
  row.memcpy_ratio = 0.125;
  row.wrong = 3;
  const bench::MemcpyBaseline base;
  const std::string text = bench::allreduce_json(base, {row, row}, {"a note"}).dump();
  const std::vector<bench::AllreduceRow> back = bench::allreduce_rows_from_json(nlohmann::json::parse(text));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].backend, "mpi");
  EXPECT_EQ(back[1].ranks, 4);
  EXPECT_EQ(back[1].bytes, 4096u);
  EXPECT_EQ(back[1].iters, 17);
  EXPECT_EQ(back[1].time_us, 12.5);
  EXPECT_EQ(back[1].busbw_gbs, 0.375);
  EXPECT_EQ(back[1].wrong, 3u);
  nlohmann::json broken = nlohmann::json::parse(text);
  broken["rows"][0].erase("time_us");
  EXPECT_THROW(bench::allreduce_rows_from_json(broken), Error);

  std::ostringstream table;
  bench::print_allreduce_table(table, base, back, {"mpi rows skipped: a reason"});
  EXPECT_NE(table.str().find("# note: mpi rows skipped: a reason"), std::string::npos) << table.str();
}

#ifdef DPCHECK_BINARY
TEST(Bench, MpiRowsComeBackFromWorkersUnderMpirun) {
  bench::AllreduceConfig cfg;
  cfg.sizes = {4096, 1 << 16};
  cfg.ranks = {2, 3};
  cfg.iters = 5;
  cfg.warmup = 1;
  bench::MemcpyBaseline base;
  base.gbs = 10.0;
  const bench::MpiWorkerLaunch launch{DPCHECK_MPIRUN, DPCHECK_BINARY, std::chrono::seconds(120)};
  const std::vector<bench::AllreduceRow> rows =
      bench::allreduce_rows_via_mpirun(launch, {"mpi", "MPI_Allreduce"}, cfg, base);
  ASSERT_EQ(rows.size(), 8u);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const bench::AllreduceRow& row = rows[i];
    EXPECT_EQ(row.ranks, i < 4 ? 2 : 3);
    EXPECT_EQ(row.backend, i % 4 < 2 ? "mpi" : "MPI_Allreduce");
    EXPECT_EQ(row.bytes, cfg.sizes[i % 2]);
    EXPECT_EQ(row.iters, 5);
    EXPECT_EQ(row.wrong, 0u);
    EXPECT_GT(row.time_us, 0.0);
    EXPECT_DOUBLE_EQ(row.memcpy_ratio, row.traffic_gbs / base.gbs);
  }

  // A launcher that fails is an Error that shows what it said.
  const bench::MpiWorkerLaunch broken{"/bin/false", DPCHECK_BINARY, std::chrono::seconds(10)};
  try {
    bench::allreduce_rows_via_mpirun(broken, {"mpi"}, cfg, base);
    ADD_FAILURE() << "a failing launcher gave rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exited with status 1"), std::string::npos) << e.what();
  }
}
#endif

}  // namespace
}  // namespace dpcheck
