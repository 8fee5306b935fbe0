// The Communicator conformance suite: what every backend must do, written once against the interface
// (src/comm.hpp) and run by each backend's test on its own worlds -- tests/local_comm_test.cpp for
// N = 1..8 ranks as threads, tests/mpi_comm_test.cpp on the world mpirun started.
//
// Expected values are closed forms (rank i contributes a known function of i and the element index),
// checked exactly on every rank. bfloat16 and float16 sums are of small integers, which the formats
// hold exactly in any order of addition, compared bit for bit; one check shows the single rounding at
// the end that src/comm.hpp promises. A check never returns early between collectives, even after a
// failure: under MPI a rank that skipped a call would leave its peers waiting for it, so failures are
// counted and reported once per buffer instead of stopping at the first (no ASSERT_* here).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "src/comm.hpp"
#include "src/error.hpp"
#include "src/low_precision.hpp"

namespace dpcheck::conformance {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// "N=4 rank 2": every failure says which world and rank saw it (GoogleTest's traces do not cross into
// the local backend's rank threads).
inline std::string where(const Communicator& c) {
  return "N=" + std::to_string(c.size()) + " rank " + std::to_string(c.rank());
}

// "rank 3" or "ranks 0, 2, 3", as the backends write it.
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

inline std::vector<int> ranks_except(int n, int skip) {
  std::vector<int> r;
  for (int i = 0; i < n; ++i)
    if (i != skip) r.push_back(i);
  return r;
}

template <class T> constexpr bool is_16bit_v = std::is_same_v<T, Bf16> || std::is_same_v<T, Fp16>;

// The 16-bit formats' conversions (src/low_precision.hpp), by element type.
template <class H> float widen(H h) {
  if constexpr (std::is_same_v<H, Bf16>) return bf16_bits_to_float(h.bits);
  else return fp16_bits_to_float(h.bits);
}
template <class H> H narrow(float f) {
  if constexpr (std::is_same_v<H, Bf16>) return H{float_to_bf16_bits(f)};
  else return H{float_to_fp16_bits(f)};
}

// Lengths that hit every corner of the slicing: empty, shorter than N, odd, not divisible by N,
// exactly one 64-byte block, several 4 KiB chunks with a ragged tail.
inline std::vector<std::size_t> lengths_for(int n) {
  const auto un = static_cast<std::size_t>(n);
  return {0, 1, un - 1, un, un + 1, 7, 16, 17, 1000, 4099};
}

// Compares got[j] with want(j) for every j; one failure per buffer, naming the first wrong element
// and how many there are.
template <class T, class Want>
void expect_elements(std::span<const T> got, Want want, const std::string& what) {
  std::size_t wrong = 0, first = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    if (got[j] == want(j)) continue;
    if (wrong++ == 0) first = j;
  }
  if (wrong > 0)
    ADD_FAILURE() << what << ": " << wrong << " of " << got.size() << " elements wrong, the first at " << first
                  << ": got " << +got[first] << ", want " << +want(first);
}

// Rank i's element j for the sum and avg checks: the exact sum is N*j + 1000*N(N-1)/2, a small
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
inline int rank_holding(int residue, int n, std::size_t j) {
  const auto jn = static_cast<int>(j % static_cast<std::size_t>(n));
  return ((residue - jn) % n + n) % n;
}

template <class T> void check_sum_min_max(Communicator& c, std::size_t len) {
  const int n = c.size(), r = c.rank();
  const std::string what = where(c) + " " + std::string(dtype_name(dtype_of<T>())) + " len " + std::to_string(len);
  std::vector<T> buf(len);
  for (std::size_t j = 0; j < len; ++j) buf[j] = contribution<T>(r, j);
  c.allreduce(std::span<T>(buf), ReduceOp::sum);
  const auto un = static_cast<std::size_t>(n);
  expect_elements<T>(buf, [&](std::size_t j) { return static_cast<T>(un * j + 1000 * (un * (un - 1) / 2)); },
                     what + " sum");

  for (std::size_t j = 0; j < len; ++j) buf[j] = minmax_value<T>(r, n, j);
  c.allreduce(std::span<T>(buf), ReduceOp::min);
  expect_elements<T>(buf, [&](std::size_t j) { return minmax_value<T>(rank_holding(0, n, j), n, j); }, what + " min");

  for (std::size_t j = 0; j < len; ++j) buf[j] = minmax_value<T>(r, n, j);
  c.allreduce(std::span<T>(buf), ReduceOp::max);
  expect_elements<T>(buf, [&](std::size_t j) { return minmax_value<T>(rank_holding(n - 1, n, j), n, j); },
                     what + " max");
}

template <class T> void check_avg(Communicator& c, std::size_t len) {
  const int n = c.size();
  std::vector<T> buf(len);
  for (std::size_t j = 0; j < len; ++j) buf[j] = contribution<T>(c.rank(), j);
  c.allreduce(std::span<T>(buf), ReduceOp::avg);
  // The mean j + 500(N-1) is exact in binary, and so is the sum it is divided from.
  expect_elements<T>(buf, [&](std::size_t j) { return static_cast<T>(j) + static_cast<T>(500 * (n - 1)); },
                     where(c) + " " + std::string(dtype_name(dtype_of<T>())) + " avg len " + std::to_string(len));
}

// Random floats over many binades, so that the order of additions changes the rounded result. A pure
// function of (rank, len): any rank can compute every rank's input. For the 16-bit formats, rounded to
// the format, over binades it holds (float16's up to 2^10, so that sums of 8 stay finite).
template <class T> std::vector<T> awkward_values(int rank, std::size_t len) {
  std::mt19937_64 gen(1234 + static_cast<std::uint64_t>(rank));
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  const int range = std::is_same_v<T, Fp16> ? 10 : 30;
  std::uniform_int_distribution<int> expo(-range, range);
  std::vector<T> v(len);
  for (T& x : v) {
    const double d = std::ldexp(mant(gen), expo(gen));
    if constexpr (is_16bit_v<T>) x = narrow<T>(static_cast<float>(d));
    else x = static_cast<T>(d);
  }
  return v;
}

// The fixed-order sum ((b0 + b1) + b2) + ... of every rank's awkward_values, computed serially; with
// average, divided by N afterwards, as avg does.
template <class T> std::vector<T> fixed_order_sum(int n, std::size_t len, bool average) {
  std::vector<T> want = awkward_values<T>(0, len);
  for (int r = 1; r < n; ++r) {
    const std::vector<T> b = awkward_values<T>(r, len);
    for (std::size_t j = 0; j < len; ++j) want[j] += b[j];
  }
  if (average)
    for (T& x : want) x = x / static_cast<T>(n);
  return want;
}

template <class T> void check_bitwise_fixed_order(Communicator& c, std::size_t len) {
  const int n = c.size();
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    std::vector<T> buf = awkward_values<T>(c.rank(), len);
    c.allreduce(std::span<T>(buf), op);
    const std::vector<T> want = fixed_order_sum<T>(n, len, op == ReduceOp::avg);
    EXPECT_EQ(std::memcmp(buf.data(), want.data(), len * sizeof(T)), 0)
        << where(c) << " " << dtype_name(dtype_of<T>()) << " " << reduce_op_name(op) << " len " << len
        << ": the result differs from the serial fixed-order sum";
  }
  // Shows the check could fail: summing in another order gives different bits somewhere.
  if (n >= 3 && c.rank() == 0) {
    std::vector<T> reversed = awkward_values<T>(n - 1, len);
    for (int r = n - 2; r >= 0; --r) {
      const std::vector<T> b = awkward_values<T>(r, len);
      for (std::size_t j = 0; j < len; ++j) reversed[j] += b[j];
    }
    const std::vector<T> want = fixed_order_sum<T>(n, len, false);
    EXPECT_NE(std::memcmp(reversed.data(), want.data(), len * sizeof(T)), 0) << where(c);
  }
}

// ---- bfloat16 and float16 -------------------------------------------------------------------------

// The largest integer below which every integer is exact: 2^8 in bfloat16, 2^11 in float16.
template <class H> constexpr int exact_integers() { return std::is_same_v<H, Bf16> ? 256 : 2048; }

template <class H> void expect_bits(std::span<const H> got, const std::function<H(std::size_t)>& want,
                                     const std::string& what) {
  std::size_t wrong = 0, first = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    if (got[j] == want(j)) continue;
    if (wrong++ == 0) first = j;
  }
  if (wrong > 0)
    ADD_FAILURE() << what << ": " << wrong << " of " << got.size() << " elements wrong, the first at " << first
                  << ": got " << widen(got[first]) << " (bits 0x" << std::hex << got[first].bits << "), want "
                  << std::dec << widen(want(first)) << " (bits 0x" << std::hex << want(first).bits << ")" << std::dec;
}

// The power of two that scales element j on every rank, so that the checks meet large and small
// exponents (a backend that adds the patterns as integers, or drops the exponent, fails).
inline float scale16(std::size_t j) { return j % 3 == 0 ? 0x1p-6f : j % 3 == 1 ? 1.0f : 0x1p4f; }

// Rank i's element j for the sums: an integer in [-k, k], k = exact_integers / N, times scale16(j), so
// that every partial sum in any order, and the sum, are exact in the format (|partial| <= N k).
template <class H> float contribution16(int rank, int n, std::size_t j) {
  const int k = exact_integers<H>() / n;
  const auto v = static_cast<int>((static_cast<std::size_t>(rank) * 7 + j * 3) % static_cast<std::size_t>(2 * k + 1)) - k;
  return static_cast<float>(v) * scale16(j);
}

// The exact sum of every rank's contribution16 at j (float32 holds it: fewer than 2^24).
template <class H> float exact_sum16(int n, std::size_t j) {
  float sum = 0;
  for (int r = 0; r < n; ++r) sum += contribution16<H>(r, n, j);
  return sum;
}

template <class H> void check_16bit_exact(Communicator& c, std::size_t len) {
  const int n = c.size(), r = c.rank();
  const std::string what = where(c) + " " + std::string(dtype_name(dtype_of<H>())) + " len " + std::to_string(len);
  std::vector<H> buf(len);
  for (std::size_t j = 0; j < len; ++j) buf[j] = narrow<H>(contribution16<H>(r, n, j));
  c.allreduce(std::span<H>(buf), ReduceOp::sum);
  expect_bits<H>(buf, [&](std::size_t j) { return narrow<H>(exact_sum16<H>(n, j)); }, what + " sum");

  // avg: the exact float32 sum divided by N in float32, then rounded once.
  for (std::size_t j = 0; j < len; ++j) buf[j] = narrow<H>(contribution16<H>(r, n, j));
  c.allreduce(std::span<H>(buf), ReduceOp::avg);
  expect_bits<H>(buf, [&](std::size_t j) { return narrow<H>(exact_sum16<H>(n, j) / static_cast<float>(n)); },
                 what + " avg");

  // min and max over minmax_value's small integers (either sign), scaled: exact, and one of the inputs.
  const auto mm = [&](int rank, std::size_t j) {
    return narrow<H>(static_cast<float>(minmax_value<std::int32_t>(rank, n, j) % 64) * scale16(j));
  };
  for (const ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
    for (std::size_t j = 0; j < len; ++j) buf[j] = mm(r, j);
    c.allreduce(std::span<H>(buf), op);
    expect_bits<H>(buf, [&](std::size_t j) {
      H best = mm(0, j);
      for (int q = 1; q < n; ++q) {
        const H v = mm(q, j);
        if (op == ReduceOp::min ? widen(v) < widen(best) : widen(v) > widen(best)) best = v;
      }
      return best;
    }, what + " " + std::string(reduce_op_name(op)));
  }
}

inline void allreduce_16bit_sums_are_exact_on_small_integers(Communicator& c) {
  std::vector<std::size_t> lengths = lengths_for(c.size());
  lengths.push_back(100'003);  // slices of several chunks and a tail
  for (std::size_t len : lengths) {
    check_16bit_exact<Bf16>(c, len);
    check_16bit_exact<Fp16>(c, len);
  }
}

// Rank 0 holds 2^8 + 2(j mod 8) in bfloat16 (2^11 + 2(j mod 8) in float16), where the format's spacing
// is 2, and every other rank holds 1: the float32 sum 2^8 + 2(j mod 8) + N - 1 rounds to the format
// once, to nearest, ties to even (N = 2: 257 gives 256, 259 gives 260). Rounding after every addition
// in rank order would lose every 1 (257 rounds back to 256 each time), which rank 0 shows for N >= 3.
template <class H> float rounding_input(int rank, std::size_t j) {
  return rank == 0 ? static_cast<float>(exact_integers<H>() + 2 * static_cast<int>(j % 8)) : 1.0f;
}

template <class H> void check_16bit_rounds_once(Communicator& c) {
  const int n = c.size();
  constexpr std::size_t len = 40;
  const std::string what = where(c) + " " + std::string(dtype_name(dtype_of<H>()));
  const auto float_sum = [&](std::size_t j) {
    float sum = 0;
    for (int r = 0; r < n; ++r) sum += rounding_input<H>(r, j);
    return sum;  // exact: a small integer
  };
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    std::vector<H> buf(len);
    for (std::size_t j = 0; j < len; ++j) buf[j] = narrow<H>(rounding_input<H>(c.rank(), j));
    c.allreduce(std::span<H>(buf), op);
    expect_bits<H>(buf, [&](std::size_t j) {
      return narrow<H>(op == ReduceOp::avg ? float_sum(j) / static_cast<float>(n) : float_sum(j));
    }, what + " " + std::string(reduce_op_name(op)) + ": not the float32 sum rounded once");
  }
  // The example of round to nearest, ties to even, that the comment above gives.
  EXPECT_EQ(narrow<H>(static_cast<float>(exact_integers<H>() + 1)).bits, narrow<H>(static_cast<float>(exact_integers<H>())).bits);
  EXPECT_EQ(narrow<H>(static_cast<float>(exact_integers<H>() + 3)).bits, narrow<H>(static_cast<float>(exact_integers<H>() + 4)).bits);
  // Shows the check could fail: rounding after every addition gives other bits.
  if (n >= 3 && c.rank() == 0) {
    std::size_t differ = 0;
    for (std::size_t j = 0; j < len; ++j) {
      H acc = narrow<H>(rounding_input<H>(0, j));
      for (int r = 1; r < n; ++r) acc = narrow<H>(widen(acc) + rounding_input<H>(r, j));
      differ += !(acc == narrow<H>(float_sum(j)));
    }
    EXPECT_GT(differ, 0u) << what;
  }
}

inline void allreduce_16bit_sum_is_rounded_once_at_the_end(Communicator& c) {
  check_16bit_rounds_once<Bf16>(c);
  check_16bit_rounds_once<Fp16>(c);
}

// Broadcast and allgather move 16-bit patterns untouched, whatever they mean: NaNs with payloads,
// negative zero, subnormals, infinities (a backend that converts on the way changes some).
template <class H> H pattern16(int rank, std::size_t j) {
  return H{static_cast<std::uint16_t>(static_cast<std::size_t>(rank) * 40503u + j * 2654435761u)};
}

template <class H> void check_16bit_moves(Communicator& c) {
  const int n = c.size();
  const auto un = static_cast<std::size_t>(n);
  const std::string type(dtype_name(dtype_of<H>()));
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{33}, std::size_t{9000}}) {
    for (int root = 0; root < n; ++root) {
      std::vector<H> buf(len);
      for (std::size_t j = 0; j < len; ++j) buf[j] = pattern16<H>(c.rank(), j);
      c.broadcast(std::span<H>(buf), root);
      expect_bits<H>(buf, [&](std::size_t j) { return pattern16<H>(root, j); },
                     where(c) + " " + type + " broadcast root " + std::to_string(root) + " len " + std::to_string(len));
    }
    std::vector<H> send(len), recv(un * len, H{0xFFFF});
    for (std::size_t j = 0; j < len; ++j) send[j] = pattern16<H>(c.rank(), j);
    c.allgather(std::span<const H>(send), std::span<H>(recv));
    expect_bits<H>(recv, [&](std::size_t i) { return pattern16<H>(static_cast<int>(i / len), i % len); },
                   where(c) + " " + type + " allgather len " + std::to_string(len));
  }
}

inline void broadcast_and_allgather_move_16bit_patterns(Communicator& c) {
  check_16bit_moves<Bf16>(c);
  check_16bit_moves<Fp16>(c);
}

// ---- the checks -----------------------------------------------------------------------------------

inline void rank_and_size(Communicator& c) {
  EXPECT_GE(c.rank(), 0) << where(c);
  EXPECT_LT(c.rank(), c.size()) << where(c);
  EXPECT_EQ(c.memory_space(), MemorySpace::host) << where(c);
  EXPECT_EQ(&c.host(), &c) << where(c);
  const std::vector<std::int32_t> ranks = c.allgather_value<std::int32_t>(c.rank());
  expect_elements<std::int32_t>(ranks, [](std::size_t j) { return static_cast<std::int32_t>(j); },
                                where(c) + " ranks in rank order");
}

inline void allreduce_sum_min_max_every_type(Communicator& c) {
  for (std::size_t len : lengths_for(c.size())) {
    check_sum_min_max<float>(c, len);
    check_sum_min_max<double>(c, len);
    check_sum_min_max<std::int32_t>(c, len);
    check_sum_min_max<std::int64_t>(c, len);
    check_sum_min_max<std::uint64_t>(c, len);
  }
}

inline void allreduce_avg_divides_the_sum_by_n(Communicator& c) {
  for (std::size_t len : lengths_for(c.size())) {
    check_avg<float>(c, len);
    check_avg<double>(c, len);
  }
}

inline void allreduce_of_many_chunks(Communicator& c) {
  // Slices of several 4 KiB chunks plus a tail, where the vectorised and the scalar loop both run.
  constexpr std::size_t len = 100'003;
  const auto n = static_cast<std::size_t>(c.size());
  std::vector<float> buf(len);
  for (std::size_t j = 0; j < len; ++j) buf[j] = static_cast<float>(j % 1000 + static_cast<std::size_t>(c.rank()));
  c.allreduce(std::span<float>(buf), ReduceOp::sum);
  expect_elements<float>(buf, [&](std::size_t j) { return static_cast<float>(n * (j % 1000) + n * (n - 1) / 2); },
                         where(c) + " float32 sum of 100003");
}

inline void signed_integer_sum_wraps(Communicator& c) {
  std::int32_t v = std::numeric_limits<std::int32_t>::max();
  c.allreduce(std::span<std::int32_t>(&v, 1), ReduceOp::sum);
  const auto want = static_cast<std::int32_t>(static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max()) *
                                              static_cast<std::uint32_t>(c.size()));
  EXPECT_EQ(v, want) << where(c);
}

inline void float_sum_is_bitwise_the_fixed_order_sum(Communicator& c) {
  for (std::size_t len : {std::size_t{37}, std::size_t{5000}}) {
    check_bitwise_fixed_order<float>(c, len);
    check_bitwise_fixed_order<double>(c, len);
  }
}

inline void broadcast_from_every_root(Communicator& c) {
  const int n = c.size();
  for (int root = 0; root < n; ++root) {
    for (std::size_t len : lengths_for(n)) {
      const std::string what = where(c) + " root " + std::to_string(root) + " len " + std::to_string(len);
      std::vector<std::int64_t> buf(len);
      for (std::size_t j = 0; j < len; ++j) buf[j] = contribution<std::int64_t>(c.rank(), j);
      c.broadcast(std::span<std::int64_t>(buf), root);
      expect_elements<std::int64_t>(buf, [&](std::size_t j) { return contribution<std::int64_t>(root, j); },
                                    what + " int64");

      std::vector<std::uint8_t> bytes(len);
      for (std::size_t j = 0; j < len; ++j) bytes[j] = static_cast<std::uint8_t>(c.rank() * 31 + static_cast<int>(j));
      c.broadcast(std::span<std::uint8_t>(bytes), root);
      expect_elements<std::uint8_t>(
          bytes, [&](std::size_t j) { return static_cast<std::uint8_t>(root * 31 + static_cast<int>(j)); },
          what + " uint8");
    }
  }
}

inline void allgather_places_rank_blocks_in_rank_order(Communicator& c) {
  const auto un = static_cast<std::size_t>(c.size());
  // 9000 elements are past the size that backends may send along with the call's description.
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{67}, std::size_t{9000}}) {
    const std::string what = where(c) + " len " + std::to_string(len);
    std::vector<float> send(len), recv(un * len, -1.0f);
    for (std::size_t j = 0; j < len; ++j) send[j] = contribution<float>(c.rank(), j);
    c.allgather(std::span<const float>(send), std::span<float>(recv));
    expect_elements<float>(recv, [&](std::size_t i) { return contribution<float>(static_cast<int>(i / len), i % len); },
                           what + " float32");

    std::vector<std::uint8_t> bsend(len), brecv(un * len, 0xff);
    for (std::size_t j = 0; j < len; ++j) bsend[j] = static_cast<std::uint8_t>(c.rank() * 16 + static_cast<int>(j));
    c.allgather(std::span<const std::uint8_t>(bsend), std::span<std::uint8_t>(brecv));
    expect_elements<std::uint8_t>(
        brecv, [&](std::size_t i) { return static_cast<std::uint8_t>(i / len * 16 + i % len); }, what + " uint8");
  }
}

inline void allgather_in_place_from_own_block(Communicator& c) {
  constexpr std::size_t len = 3;
  const auto un = static_cast<std::size_t>(c.size());
  std::vector<std::int32_t> recv(un * len, -1);
  std::int32_t* mine = recv.data() + static_cast<std::size_t>(c.rank()) * len;
  for (std::size_t j = 0; j < len; ++j) mine[j] = c.rank() * 10 + static_cast<int>(j);
  c.allgather(mine, recv.data(), len, DType::i32);
  expect_elements<std::int32_t>(recv, [](std::size_t i) { return static_cast<std::int32_t>(i / len * 10 + i % len); },
                                where(c));
}

inline void barrier_waits_for_the_last_rank(Communicator& c) {
  // The last rank arrives 100 ms after the others; nobody may leave before it came. The first barrier
  // lines the ranks up; the margin allows for ranks leaving it some milliseconds apart.
  using namespace std::chrono_literals;
  const int n = c.size();
  c.barrier();
  const auto t0 = Clock::now();
  if (c.rank() == n - 1) std::this_thread::sleep_for(100ms);
  c.barrier();
  if (n > 1) {
    EXPECT_GE(seconds_since(t0), 0.05) << where(c) << " left the barrier before the last rank arrived";
  }
}

inline void zero_length_collectives(Communicator& c) {
  c.allreduce(nullptr, 0, DType::f32, ReduceOp::sum);
  c.broadcast(nullptr, 0, DType::f64, 0);
  c.allgather(nullptr, nullptr, 0, DType::u8);
  c.barrier();
}

inline void all_and_allgather_value(Communicator& c) {
  const int n = c.size();
  EXPECT_TRUE(c.all(true)) << where(c);
  EXPECT_FALSE(c.all(c.rank() != n - 1)) << where(c);
  EXPECT_FALSE(c.all(c.rank() != 0)) << where(c);

  const std::vector<std::int32_t> got = c.allgather_value<std::int32_t>(c.rank() * 10 - 3);
  expect_elements<std::int32_t>(got, [](std::size_t r) { return static_cast<std::int32_t>(r) * 10 - 3; }, where(c));
  EXPECT_EQ(got.size(), static_cast<std::size_t>(n)) << where(c);

  const std::vector<double> dv = c.allgather_value<double>(0.5 + c.rank());
  expect_elements<double>(dv, [](std::size_t r) { return 0.5 + static_cast<double>(r); }, where(c));
}

inline void unsupported_reductions_throw_on_every_rank(Communicator& c) {
  std::vector<std::uint8_t> bytes(4, 1);
  EXPECT_THROW(c.allreduce(std::span<std::uint8_t>(bytes), ReduceOp::sum), Error) << where(c);
  std::vector<std::int32_t> ints(4, 1);
  try {
    c.allreduce(std::span<std::int32_t>(ints), ReduceOp::avg);
    ADD_FAILURE() << where(c) << ": avg of int32 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("avg"), std::string::npos) << where(c) << ": " << e.what();
  }
  std::vector<float> f(4, 1.0f);
  EXPECT_THROW(c.broadcast(std::span<float>(f), c.size()), Error) << where(c);
  EXPECT_THROW(c.broadcast(std::span<float>(f), -1), Error) << where(c);
  // The world is still usable afterwards.
  c.allreduce(std::span<float>(f), ReduceOp::sum);
  EXPECT_EQ(f[0], static_cast<float>(c.size())) << where(c);
}

inline void count_mismatch_throws_on_every_rank(Communicator& c) {
  const int n = c.size();
  if (n < 2) return;  // one rank cannot disagree with itself
  const int odd = n / 2;
  std::vector<float> buf(c.rank() == odd ? 7 : 8, 1.0f);
  const auto t0 = Clock::now();
  try {
    c.allreduce(std::span<float>(buf), ReduceOp::sum);
    ADD_FAILURE() << where(c) << ": did not throw";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << where(c) << ": a mismatch must not look like a timeout: " << e.what();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("allreduce on rank " + std::to_string(c.rank())), std::string::npos) << m;
    EXPECT_NE(m.find(rank_list(ranks_except(n, odd)) + " called allreduce(count 8, float32, sum)"), std::string::npos)
        << m;
    EXPECT_NE(m.find(rank_list({odd}) + " called allreduce(count 7, float32, sum)"), std::string::npos) << m;
  }
  EXPECT_LT(seconds_since(t0), 2.0) << where(c);
  // Ranks that agree go on working.
  c.allreduce(std::span<float>(buf.data(), 7), ReduceOp::sum);
  EXPECT_EQ(buf[0], static_cast<float>(n)) << where(c);
}

inline void different_collectives_or_roots_are_a_mismatch(Communicator& c) {
  const int n = c.size();
  if (n < 2) return;
  std::vector<double> buf(4, 1.0);
  try {
    c.broadcast(std::span<double>(buf), c.rank() == n - 1 ? 1 : 0);
    ADD_FAILURE() << where(c) << ": roots differ but broadcast did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(rank_list({n - 1}) + " called broadcast(count 4, float64, root 1)"), std::string::npos) << m;
  }
  try {
    if (c.rank() == 0)
      c.barrier();
    else
      c.allreduce(std::span<double>(buf), ReduceOp::max);
    ADD_FAILURE() << where(c) << ": barrier against allreduce did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 0 called barrier()"), std::string::npos) << m;
    EXPECT_NE(m.find(rank_list(ranks_except(n, 0)) + " called allreduce(count 4, float64, max)"), std::string::npos)
        << m;
  }
  try {  // the same count and element size, another op
    c.allreduce(std::span<double>(buf), c.rank() == 0 ? ReduceOp::min : ReduceOp::sum);
    ADD_FAILURE() << where(c) << ": ops differ but allreduce did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 0 called allreduce(count 4, float64, min)"), std::string::npos) << m;
  }
  try {  // bfloat16 against float16: the same count and element size
    std::vector<Bf16> b(4, narrow<Bf16>(1.0f));
    std::vector<Fp16> h(4, narrow<Fp16>(1.0f));
    if (c.rank() == 0)
      c.allreduce(std::span<Fp16>(h), ReduceOp::sum);
    else
      c.allreduce(std::span<Bf16>(b), ReduceOp::sum);
    ADD_FAILURE() << where(c) << ": bfloat16 against float16 did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 0 called allreduce(count 4, float16, sum)"), std::string::npos) << m;
    EXPECT_NE(m.find(rank_list(ranks_except(n, 0)) + " called allreduce(count 4, bfloat16, sum)"), std::string::npos)
        << m;
  }
  try {  // the same count and element size, another dtype
    std::vector<std::int64_t> ints(4, 1);
    if (c.rank() == n - 1)
      c.allreduce(std::span<std::int64_t>(ints), ReduceOp::sum);
    else
      c.allreduce(std::span<double>(buf), ReduceOp::sum);
    ADD_FAILURE() << where(c) << ": dtypes differ but allreduce did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(rank_list({n - 1}) + " called allreduce(count 4, int64, sum)"), std::string::npos) << m;
  }
  c.barrier();
}

// ---- the list each backend's test instantiates ---------------------------------------------------

struct ConformanceCheck {
  const char* name;  // the GoogleTest parameter name
  void (*run)(Communicator&);
};

inline void PrintTo(const ConformanceCheck& check, std::ostream* os) { *os << check.name; }

inline const std::vector<ConformanceCheck>& conformance_checks() {
  static const std::vector<ConformanceCheck> checks{
      {"RankAndSize", rank_and_size},
      {"AllreduceSumMinMaxEveryType", allreduce_sum_min_max_every_type},
      {"AllreduceAvgDividesTheSumByN", allreduce_avg_divides_the_sum_by_n},
      {"AllreduceOfManyChunksPerSlice", allreduce_of_many_chunks},
      {"SignedIntegerSumWraps", signed_integer_sum_wraps},
      {"FloatSumIsBitwiseTheFixedOrderSum", float_sum_is_bitwise_the_fixed_order_sum},
      {"SixteenBitSumsAreExactOnSmallIntegers", allreduce_16bit_sums_are_exact_on_small_integers},
      {"SixteenBitSumIsRoundedOnceAtTheEnd", allreduce_16bit_sum_is_rounded_once_at_the_end},
      {"SixteenBitBroadcastAndAllgatherMoveThePatterns", broadcast_and_allgather_move_16bit_patterns},
      {"BroadcastFromEveryRoot", broadcast_from_every_root},
      {"AllgatherPlacesRankBlocksInRankOrder", allgather_places_rank_blocks_in_rank_order},
      {"AllgatherInPlaceFromOwnBlock", allgather_in_place_from_own_block},
      {"BarrierWaitsForTheLastRank", barrier_waits_for_the_last_rank},
      {"ZeroLengthCollectives", zero_length_collectives},
      {"AllAndAllgatherValue", all_and_allgather_value},
      {"UnsupportedReductionsThrowOnEveryRank", unsupported_reductions_throw_on_every_rank},
      {"CountMismatchThrowsOnEveryRankNamingTheRanks", count_mismatch_throws_on_every_rank},
      {"DifferentCollectivesOrRootsAreAMismatch", different_collectives_or_roots_are_a_mismatch},
  };
  return checks;
}

inline std::string check_name(const testing::TestParamInfo<ConformanceCheck>& info) { return info.param.name; }

}  // namespace dpcheck::conformance
