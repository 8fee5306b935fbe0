// Tests of the "local" Communicator (src/local_comm.cpp) with closed-form expected values: rank i
// contributes a known function of (i, j), and every rank checks the exact result, for world sizes 1
// to 8, every dtype and op, and lengths that are zero, odd, shorter than N and not divisible by N.
// Failure paths (a missing rank, mismatched calls, a throwing rank) must end in an error, not a hang.
// The allreduce benchmark (src/bench.cpp) gets a short smoke run here too.
#include "src/local_comm.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "src/bench.hpp"
#include "src/error.hpp"

namespace dpcheck {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr int max_ranks = 8;

// Lengths that hit every corner of the slicing: empty, shorter than N, odd, not divisible by N,
// exactly one 64-byte block, several 4 KiB chunks with a ragged tail.
std::vector<std::size_t> lengths_for(int n) {
  const auto un = static_cast<std::size_t>(n);
  return {0, 1, un - 1, un, un + 1, 7, 16, 17, 1000, 4099};
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Rank i's element j for the sum and avg tests: the exact sum is N*j + 1000*N(N-1)/2, a small
// integer, so float32 holds it exactly whatever the order.
template <class T> T contribution(int rank, std::size_t j) {
  return static_cast<T>(static_cast<std::size_t>(rank) * 1000 + j);
}

// Rank i's element j for min and max: m = (i + j) mod N is rank i's place in the order at j, so the
// minimum and the maximum sit on different ranks for different j. Ranks in the upper half are shifted
// across the sign boundary (past 2^63 for uint64; the lower half negative for the signed and float
// types), so a comparison of the wrong signedness gets the order wrong.
template <class T> T minmax_value(int rank, int n, std::size_t j) {
  const auto un = static_cast<std::size_t>(n);
  const std::size_t m = (static_cast<std::size_t>(rank) + j) % un;
  const bool upper = 2 * m >= un;
  const auto v = static_cast<std::int64_t>(j * un + m);
  if constexpr (std::is_same_v<T, std::uint64_t>)
    return upper ? (std::uint64_t{1} << 63) + static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  return static_cast<T>(upper ? v : v - (std::int64_t{1} << 20));
}

// The rank whose (i + j) mod N equals residue, i.e. whose minmax_value holds the minimum (residue 0)
// or the maximum (residue N-1) at element j.
int rank_holding(int residue, int n, std::size_t j) {
  const auto jn = static_cast<int>(j % static_cast<std::size_t>(n));
  return ((residue - jn) % n + n) % n;
}

template <class T> void check_sum_min_max(Communicator& c, std::size_t len) {
  const int n = c.size(), r = c.rank();
  std::vector<T> buf(len);
  for (std::size_t j = 0; j < len; ++j) buf[j] = contribution<T>(r, j);
  c.allreduce(std::span<T>(buf), ReduceOp::sum);
  for (std::size_t j = 0; j < len; ++j) {
    const T want =
        static_cast<T>(static_cast<std::size_t>(n) * j + 1000 * static_cast<std::size_t>(n * (n - 1) / 2));
    ASSERT_EQ(buf[j], want) << dtype_name(dtype_of<T>()) << " sum, N=" << n << " len=" << len << " j=" << j;
  }

  for (std::size_t j = 0; j < len; ++j) buf[j] = minmax_value<T>(r, n, j);
  c.allreduce(std::span<T>(buf), ReduceOp::min);
  for (std::size_t j = 0; j < len; ++j)
    ASSERT_EQ(buf[j], minmax_value<T>(rank_holding(0, n, j), n, j))
        << dtype_name(dtype_of<T>()) << " min, N=" << n << " len=" << len << " j=" << j;

  for (std::size_t j = 0; j < len; ++j) buf[j] = minmax_value<T>(r, n, j);
  c.allreduce(std::span<T>(buf), ReduceOp::max);
  for (std::size_t j = 0; j < len; ++j)
    ASSERT_EQ(buf[j], minmax_value<T>(rank_holding(n - 1, n, j), n, j))
        << dtype_name(dtype_of<T>()) << " max, N=" << n << " len=" << len << " j=" << j;
}

template <class T> void check_avg(Communicator& c, std::size_t len) {
  const int n = c.size(), r = c.rank();
  std::vector<T> buf(len);
  for (std::size_t j = 0; j < len; ++j) buf[j] = contribution<T>(r, j);
  c.allreduce(std::span<T>(buf), ReduceOp::avg);
  // The mean j + 500(N-1) is exact in binary, and so is the sum it is divided from.
  for (std::size_t j = 0; j < len; ++j)
    ASSERT_EQ(buf[j], static_cast<T>(j) + static_cast<T>(500 * (n - 1))) << "avg, N=" << n << " len=" << len;
}

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

TEST(LocalComm, AllreduceSumMinMaxEveryIntegerAndFloatType) {
  for (int n = 1; n <= max_ranks; ++n) {
    run_local(n, [&](Communicator& c) {
      for (std::size_t len : lengths_for(n)) {
        check_sum_min_max<float>(c, len);
        check_sum_min_max<double>(c, len);
        check_sum_min_max<std::int32_t>(c, len);
        check_sum_min_max<std::int64_t>(c, len);
        check_sum_min_max<std::uint64_t>(c, len);
      }
    });
  }
}

TEST(LocalComm, AllreduceAvgDividesTheSumByN) {
  for (int n = 1; n <= max_ranks; ++n) {
    run_local(n, [&](Communicator& c) {
      for (std::size_t len : lengths_for(n)) {
        check_avg<float>(c, len);
        check_avg<double>(c, len);
      }
    });
  }
}

TEST(LocalComm, AllreduceOfManyChunksPerSlice) {
  // Slices of several 4 KiB chunks plus a tail, where the vectorised and the scalar loop both run.
  constexpr std::size_t len = 100'003;
  for (int n : {2, 3}) {
    run_local(n, [&](Communicator& c) {
      std::vector<float> buf(len);
      for (std::size_t j = 0; j < len; ++j)
        buf[j] = static_cast<float>(j % 1000 + static_cast<std::size_t>(c.rank()));
      c.allreduce(std::span<float>(buf), ReduceOp::sum);
      for (std::size_t j = 0; j < len; ++j)
        ASSERT_EQ(buf[j], static_cast<float>(static_cast<std::size_t>(n) * (j % 1000) +
                                             static_cast<std::size_t>(n * (n - 1) / 2)));
    });
  }
}

TEST(LocalComm, SignedIntegerSumWrapsInsteadOfTrapping) {
  run_local(2, [](Communicator& c) {
    std::int32_t v = std::numeric_limits<std::int32_t>::max();
    c.allreduce(std::span<std::int32_t>(&v, 1), ReduceOp::sum);
    EXPECT_EQ(v, -2);
  });
}

// Random floats over many binades, so that the order of additions changes the rounded result.
template <class T> std::vector<T> awkward_values(int rank, std::size_t len) {
  std::mt19937_64 gen(1234 + static_cast<std::uint64_t>(rank));
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> expo(-30, 30);
  std::vector<T> v(len);
  for (T& x : v) x = static_cast<T>(std::ldexp(mant(gen), expo(gen)));
  return v;
}

template <class T> void check_bitwise_identical(int n, std::size_t len) {
  std::vector<std::vector<T>> results(static_cast<std::size_t>(n));
  run_local(n, [&](Communicator& c) {
    std::vector<T> buf = awkward_values<T>(c.rank(), len);
    c.allreduce(std::span<T>(buf), ReduceOp::sum);
    results[static_cast<std::size_t>(c.rank())] = std::move(buf);  // each rank writes its own entry
  });
  // The fixed order, computed serially: ((b0 + b1) + b2) + ...
  std::vector<T> want = awkward_values<T>(0, len), reversed = awkward_values<T>(n - 1, len);
  for (int r = 1; r < n; ++r) {
    const std::vector<T> b = awkward_values<T>(r, len), rb = awkward_values<T>(n - 1 - r, len);
    for (std::size_t j = 0; j < len; ++j) {
      want[j] += b[j];
      reversed[j] += rb[j];
    }
  }
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(std::memcmp(results[static_cast<std::size_t>(r)].data(), want.data(), len * sizeof(T)), 0)
        << dtype_name(dtype_of<T>()) << " N=" << n << ": rank " << r << " differs from the fixed-order sum";
  // Shows the check could fail: summing in another order gives different bits somewhere.
  if (n >= 3) {
    EXPECT_NE(std::memcmp(reversed.data(), want.data(), len * sizeof(T)), 0) << "N=" << n;
  }
}

TEST(LocalComm, FloatSumIsBitwiseIdenticalOnEveryRankAndInRankOrder) {
  for (int n = 1; n <= max_ranks; ++n) {
    for (std::size_t len : {std::size_t{37}, std::size_t{5000}}) {
      check_bitwise_identical<float>(n, len);
      check_bitwise_identical<double>(n, len);
    }
  }
}

TEST(LocalComm, BroadcastFromEveryRoot) {
  for (int n = 1; n <= max_ranks; ++n) {
    run_local(n, [&](Communicator& c) {
      for (int root = 0; root < n; ++root) {
        for (std::size_t len : lengths_for(n)) {
          std::vector<std::int64_t> buf(len);
          for (std::size_t j = 0; j < len; ++j) buf[j] = contribution<std::int64_t>(c.rank(), j);
          c.broadcast(std::span<std::int64_t>(buf), root);
          for (std::size_t j = 0; j < len; ++j)
            ASSERT_EQ(buf[j], contribution<std::int64_t>(root, j))
                << "N=" << n << " root=" << root << " len=" << len;

          std::vector<std::uint8_t> bytes(len);
          for (std::size_t j = 0; j < len; ++j)
            bytes[j] = static_cast<std::uint8_t>(c.rank() * 31 + static_cast<int>(j));
          c.broadcast(std::span<std::uint8_t>(bytes), root);
          for (std::size_t j = 0; j < len; ++j)
            ASSERT_EQ(bytes[j], static_cast<std::uint8_t>(root * 31 + static_cast<int>(j)));
        }
      }
    });
  }
}

TEST(LocalComm, AllgatherPlacesRankBlocksInRankOrder) {
  for (int n = 1; n <= max_ranks; ++n) {
    run_local(n, [&](Communicator& c) {
      const auto un = static_cast<std::size_t>(n);
      for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{67}}) {
        std::vector<float> send(len), recv(un * len, -1.0f);
        for (std::size_t j = 0; j < len; ++j) send[j] = contribution<float>(c.rank(), j);
        c.allgather(std::span<const float>(send), std::span<float>(recv));
        for (std::size_t r = 0; r < un; ++r)
          for (std::size_t j = 0; j < len; ++j)
            ASSERT_EQ(recv[r * len + j], contribution<float>(static_cast<int>(r), j))
                << "N=" << n << " len=" << len;

        std::vector<std::uint8_t> bsend(len), brecv(un * len, 0xff);
        for (std::size_t j = 0; j < len; ++j)
          bsend[j] = static_cast<std::uint8_t>(c.rank() * 16 + static_cast<int>(j));
        c.allgather(std::span<const std::uint8_t>(bsend), std::span<std::uint8_t>(brecv));
        for (std::size_t r = 0; r < un; ++r)
          for (std::size_t j = 0; j < len; ++j)
            ASSERT_EQ(brecv[r * len + j], static_cast<std::uint8_t>(r * 16 + j));
      }
    });
  }
}

TEST(LocalComm, AllgatherInPlaceFromOwnBlock) {
  run_local(4, [](Communicator& c) {
    constexpr std::size_t len = 3;
    std::vector<std::int32_t> recv(4 * len, -1);
    std::int32_t* mine = recv.data() + static_cast<std::size_t>(c.rank()) * len;
    for (std::size_t j = 0; j < len; ++j) mine[j] = c.rank() * 10 + static_cast<int>(j);
    c.allgather(mine, recv.data(), len, DType::i32);
    for (std::size_t i = 0; i < recv.size(); ++i)
      ASSERT_EQ(recv[i], static_cast<std::int32_t>(i / len * 10 + i % len));
  });
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

TEST(LocalComm, ZeroLengthCollectives) {
  for (int n = 1; n <= 4; ++n) {
    run_local(n, [](Communicator& c) {
      c.allreduce(nullptr, 0, DType::f32, ReduceOp::sum);
      c.broadcast(nullptr, 0, DType::f64, 0);
      c.allgather(nullptr, nullptr, 0, DType::u8);
      c.barrier();
    });
  }
}

TEST(LocalComm, AllAndAllgatherValueThroughTheLocalBackend) {
  for (int n = 1; n <= max_ranks; ++n) {
    run_local(n, [&](Communicator& c) {
      EXPECT_TRUE(c.all(true));
      EXPECT_EQ(c.all(c.rank() != n - 1), false);
      EXPECT_EQ(c.all(c.rank() != 0), false);

      const std::vector<std::int32_t> got = c.allgather_value<std::int32_t>(c.rank() * 10 - 3);
      ASSERT_EQ(got.size(), static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) EXPECT_EQ(got[static_cast<std::size_t>(r)], r * 10 - 3);

      const std::vector<double> dv = c.allgather_value<double>(0.5 + c.rank());
      for (int r = 0; r < n; ++r) EXPECT_EQ(dv[static_cast<std::size_t>(r)], 0.5 + r);
    });
  }
}

TEST(LocalComm, UnsupportedReductionsThrowOnEveryRank) {
  std::atomic<int> threw{0};
  run_local(3, [&](Communicator& c) {
    std::vector<std::uint8_t> bytes(4, 1);
    EXPECT_THROW(c.allreduce(std::span<std::uint8_t>(bytes), ReduceOp::sum), Error);
    std::vector<std::int32_t> ints(4, 1);
    try {
      c.allreduce(std::span<std::int32_t>(ints), ReduceOp::avg);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("avg"), std::string::npos) << e.what();
      threw.fetch_add(1);
    }
    std::vector<float> f(4, 1.0f);
    EXPECT_THROW(c.broadcast(std::span<float>(f), 3), Error);
    // The world is still usable afterwards.
    c.allreduce(std::span<float>(f), ReduceOp::sum);
    EXPECT_EQ(f[0], 3.0f);
  });
  EXPECT_EQ(threw.load(), 3);
}

TEST(LocalComm, CountMismatchThrowsOnEveryRankNamingTheRanks) {
  constexpr int n = 4;
  std::vector<std::string> messages(n);
  const auto t0 = Clock::now();
  run_local(n, [&](Communicator& c) {
    std::vector<float> buf(c.rank() == 2 ? 7 : 8, 1.0f);
    try {
      c.allreduce(std::span<float>(buf), ReduceOp::sum);
      ADD_FAILURE() << "rank " << c.rank() << " did not throw";
    } catch (const Error& e) {
      messages[static_cast<std::size_t>(c.rank())] = e.what();
    }
    // Ranks that agree go on working.
    c.allreduce(std::span<float>(buf.data(), 7), ReduceOp::sum);
    EXPECT_EQ(buf[0], 4.0f);
  });
  EXPECT_LT(seconds_since(t0), 2.0);
  for (int r = 0; r < n; ++r) {
    const std::string& m = messages[static_cast<std::size_t>(r)];
    EXPECT_NE(m.find("allreduce on rank " + std::to_string(r)), std::string::npos) << m;
    EXPECT_NE(m.find("ranks 0, 1, 3 called allreduce(count 8, float32, sum)"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 2 called allreduce(count 7, float32, sum)"), std::string::npos) << m;
  }
}

TEST(LocalComm, DifferentCollectivesOrRootsAreAMismatch) {
  std::vector<std::string> messages(3);
  run_local(3, [&](Communicator& c) {
    std::vector<double> buf(4, 1.0);
    EXPECT_THROW(c.broadcast(std::span<double>(buf), c.rank() == 1 ? 1 : 0), Error);
    try {
      if (c.rank() == 0)
        c.barrier();
      else
        c.allreduce(std::span<double>(buf), ReduceOp::max);
    } catch (const Error& e) {
      messages[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("rank 0 called barrier()"), std::string::npos) << m;
    EXPECT_NE(m.find("ranks 1, 2 called allreduce(count 4, float64, max)"), std::string::npos) << m;
  }
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
  const std::vector<bench::AllreduceRow> rows = bench::bench_allreduce(bench::local_backend(), cfg, base);
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
  EXPECT_THROW(bench::bench_allreduce(bench::local_backend(), cfg, base), UsageError);
}

}  // namespace
}  // namespace dpcheck
