// The promises only dpcheck's own backends make (conform/conform_comm_backends.hpp).
//
// Expected values are closed forms (rank i contributes a known function of i and the element index),
// checked exactly on every rank. bfloat16 and float16 sums are of small integers, which the formats
// hold exactly in any order of addition, compared bit for bit; one check shows the single rounding at
// the end that src/comm.hpp promises. A check never returns early between collectives, even after a
// failure: under MPI a rank that skipped a call would leave its peers waiting for it, so failures are
// collected, one per buffer, and returned at the end.
#include "conform/conform_comm_backends.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <sstream>
#include <thread>
#include <type_traits>

#include "src/error.hpp"
#include "src/low_precision.hpp"

namespace dpcheck::backend_checks {

namespace {

using BackendClock = std::chrono::steady_clock;

double seconds_from(BackendClock::time_point t0) {
  return std::chrono::duration<double>(BackendClock::now() - t0).count();
}

// What went wrong on this rank, each failure a line; the first few are returned.
class Failures {
 public:
  void add(const std::string& what) { lines_.push_back(what); }
  void expect(bool ok, const std::string& what) {
    if (!ok) add(what);
  }
  std::string text() const {
    std::string s;
    for (std::size_t i = 0; i < lines_.size() && i < 4; ++i) s += (i > 0 ? "; " : "") + lines_[i];
    if (lines_.size() > 4) s += "; and " + std::to_string(lines_.size() - 4) + " more";
    return s;
  }

 private:
  std::vector<std::string> lines_;
};

// "rank 3" or "ranks 0, 2, 3", as the backends write it.
std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::vector<int> all_ranks_but(int n, int skip) {
  std::vector<int> r;
  for (int i = 0; i < n; ++i)
    if (i != skip) r.push_back(i);
  return r;
}

template <class T> std::string shown(T v) {
  std::ostringstream s;
  if constexpr (is_16bit_v<T>) s << widen16(v) << " (bits 0x" << std::hex << v.bits << ")";
  else s << +v;
  return s.str();
}

// Lengths that hit every corner of the slicing: empty, shorter than N, odd, not divisible by N,
// exactly one 64-byte block, several 4 KiB chunks with a ragged tail.
std::vector<std::size_t> lengths_of(int n) {
  const auto un = static_cast<std::size_t>(n);
  return {0, 1, un - 1, un, un + 1, 7, 16, 17, 1000, 4099};
}

// Compares got[j] with want(j) for every j; one failure per buffer, naming the first wrong element
// and how many there are.
template <class T, class Want>
void expect_elements(Failures& f, std::span<const T> got, Want want, const std::string& what) {
  std::size_t wrong = 0, first = 0;
  for (std::size_t j = 0; j < got.size(); ++j) {
    if (got[j] == want(j)) continue;
    if (wrong++ == 0) first = j;
  }
  if (wrong > 0)
    f.add(what + ": " + std::to_string(wrong) + " of " + std::to_string(got.size()) + " elements wrong, the first at " +
          std::to_string(first) + ": got " + shown(got[first]) + ", want " + shown(want(first)));
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
int rank_holding(int residue, int n, std::size_t j) {
  const auto jn = static_cast<int>(j % static_cast<std::size_t>(n));
  return ((residue - jn) % n + n) % n;
}

std::string label(DType t, std::size_t len) { return std::string(dtype_name(t)) + " len " + std::to_string(len); }

template <class T> void check_sum_min_max(Failures& f, Communicator& c, std::size_t len) {
  const int n = c.size(), r = c.rank();
  const std::string what = label(dtype_of<T>(), len);
  std::vector<T> buf(len);
  for (std::size_t j = 0; j < len; ++j) buf[j] = contribution<T>(r, j);
  c.allreduce(std::span<T>(buf), ReduceOp::sum);
  const auto un = static_cast<std::size_t>(n);
  expect_elements<T>(
      f, buf, [&](std::size_t j) { return static_cast<T>(un * j + 1000 * (un * (un - 1) / 2)); }, what + " sum");

  for (std::size_t j = 0; j < len; ++j) buf[j] = minmax_value<T>(r, n, j);
  c.allreduce(std::span<T>(buf), ReduceOp::min);
  expect_elements<T>(
      f, buf, [&](std::size_t j) { return minmax_value<T>(rank_holding(0, n, j), n, j); }, what + " min");

  for (std::size_t j = 0; j < len; ++j) buf[j] = minmax_value<T>(r, n, j);
  c.allreduce(std::span<T>(buf), ReduceOp::max);
  expect_elements<T>(
      f, buf, [&](std::size_t j) { return minmax_value<T>(rank_holding(n - 1, n, j), n, j); }, what + " max");
}

template <class T> void check_avg(Failures& f, Communicator& c, std::size_t len) {
  const int n = c.size();
  std::vector<T> buf(len);
  for (std::size_t j = 0; j < len; ++j) buf[j] = contribution<T>(c.rank(), j);
  c.allreduce(std::span<T>(buf), ReduceOp::avg);
  // The mean j + 500(N-1) is exact in binary, and so is the sum it is divided from.
  expect_elements<T>(
      f, buf, [&](std::size_t j) { return static_cast<T>(j) + static_cast<T>(500 * (n - 1)); },
      label(dtype_of<T>(), len) + " avg");
}

// Random floats over many binades, so that the order of additions changes the rounded result. A pure
// function of (rank, len): any rank can compute every rank's input.
template <class T> std::vector<T> awkward(int rank, std::size_t len) {
  std::mt19937_64 gen(1234 + static_cast<std::uint64_t>(rank));
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> expo(-30, 30);
  std::vector<T> v(len);
  for (T& x : v) x = static_cast<T>(std::ldexp(mant(gen), expo(gen)));
  return v;
}

// The fixed-order sum ((b0 + b1) + b2) + ... of every rank's awkward values, computed serially; with
// average, divided by N afterwards, as avg does.
template <class T> std::vector<T> fixed_order_sum(int n, std::size_t len, bool average) {
  std::vector<T> want = awkward<T>(0, len);
  for (int r = 1; r < n; ++r) {
    const std::vector<T> b = awkward<T>(r, len);
    for (std::size_t j = 0; j < len; ++j) want[j] += b[j];
  }
  if (average)
    for (T& x : want) x = x / static_cast<T>(n);
  return want;
}

template <class T> void check_bitwise_fixed_order(Failures& f, Communicator& c, std::size_t len) {
  const int n = c.size();
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    std::vector<T> buf = awkward<T>(c.rank(), len);
    c.allreduce(std::span<T>(buf), op);
    const std::vector<T> want = fixed_order_sum<T>(n, len, op == ReduceOp::avg);
    f.expect(std::memcmp(buf.data(), want.data(), len * sizeof(T)) == 0,
             std::string(dtype_name(dtype_of<T>())) + " " + std::string(reduce_op_name(op)) + " len " +
                 std::to_string(len) + ": the result differs from the serial fixed-order sum");
  }
  // Shows the check could fail: summing in another order gives different bits somewhere.
  if (n >= 3 && c.rank() == 0) {
    std::vector<T> reversed = awkward<T>(n - 1, len);
    for (int r = n - 2; r >= 0; --r) {
      const std::vector<T> b = awkward<T>(r, len);
      for (std::size_t j = 0; j < len; ++j) reversed[j] += b[j];
    }
    const std::vector<T> want = fixed_order_sum<T>(n, len, false);
    f.expect(std::memcmp(reversed.data(), want.data(), len * sizeof(T)) != 0,
             "the check cannot fail: the reverse order gives the same bits");
  }
}

// ---- bfloat16 and float16 -------------------------------------------------------------------------

// The largest integer below which every integer is exact: 2^8 in bfloat16, 2^11 in float16.
template <class H> constexpr int exact_integers() { return std::is_same_v<H, Bf16> ? 256 : 2048; }

template <class H> void expect_bits(Failures& f, std::span<const H> got, const std::function<H(std::size_t)>& want,
                                    const std::string& what) {
  expect_elements<H>(f, got, want, what);
}

// The power of two that scales element j on every rank, so that the checks meet large and small
// exponents (a backend that adds the patterns as integers, or drops the exponent, fails).
float scale16(std::size_t j) { return j % 3 == 0 ? 0x1p-6f : j % 3 == 1 ? 1.0f : 0x1p4f; }

// Rank i's element j for the sums: an integer in [-k, k], k = exact_integers / N, times scale16(j), so
// that every partial sum in any order, and the sum, are exact in the format (|partial| <= N k).
template <class H> float contribution16(int rank, int n, std::size_t j) {
  const int k = exact_integers<H>() / n;
  const auto v =
      static_cast<int>((static_cast<std::size_t>(rank) * 7 + j * 3) % static_cast<std::size_t>(2 * k + 1)) - k;
  return static_cast<float>(v) * scale16(j);
}

// The exact sum of every rank's contribution16 at j (float32 holds it: fewer than 2^24).
template <class H> float exact_sum16(int n, std::size_t j) {
  float sum = 0;
  for (int r = 0; r < n; ++r) sum += contribution16<H>(r, n, j);
  return sum;
}

template <class H> void check_16bit_exact(Failures& f, Communicator& c, std::size_t len) {
  const int n = c.size(), r = c.rank();
  const std::string what = label(dtype_of<H>(), len);
  std::vector<H> buf(len);
  for (std::size_t j = 0; j < len; ++j) buf[j] = narrow16<H>(contribution16<H>(r, n, j));
  c.allreduce(std::span<H>(buf), ReduceOp::sum);
  expect_bits<H>(
      f, buf, [&](std::size_t j) { return narrow16<H>(exact_sum16<H>(n, j)); }, what + " sum");

  // avg: the exact float32 sum divided by N in float32, then rounded once.
  for (std::size_t j = 0; j < len; ++j) buf[j] = narrow16<H>(contribution16<H>(r, n, j));
  c.allreduce(std::span<H>(buf), ReduceOp::avg);
  expect_bits<H>(
      f, buf, [&](std::size_t j) { return narrow16<H>(exact_sum16<H>(n, j) / static_cast<float>(n)); }, what + " avg");

  // min and max over minmax_value's small integers (either sign), scaled: exact, and one of the inputs.
  const auto mm = [&](int rank, std::size_t j) {
    return narrow16<H>(static_cast<float>(minmax_value<std::int32_t>(rank, n, j) % 64) * scale16(j));
  };
  for (const ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
    for (std::size_t j = 0; j < len; ++j) buf[j] = mm(r, j);
    c.allreduce(std::span<H>(buf), op);
    expect_bits<H>(
        f, buf,
        [&](std::size_t j) {
          H best = mm(0, j);
          for (int q = 1; q < n; ++q) {
            const H v = mm(q, j);
            if (op == ReduceOp::min ? widen16(v) < widen16(best) : widen16(v) > widen16(best)) best = v;
          }
          return best;
        },
        what + " " + std::string(reduce_op_name(op)));
  }
}

// Rank 0 holds 2^8 + 2(j mod 8) in bfloat16 (2^11 + 2(j mod 8) in float16), where the format's spacing
// is 2, and every other rank holds 1: the float32 sum 2^8 + 2(j mod 8) + N - 1 rounds to the format
// once, to nearest, ties to even (N = 2: 257 gives 256, 259 gives 260). Rounding after every addition
// in rank order would lose every 1 (257 rounds back to 256 each time), which rank 0 shows for N >= 3.
template <class H> float rounding_input(int rank, std::size_t j) {
  return rank == 0 ? static_cast<float>(exact_integers<H>() + 2 * static_cast<int>(j % 8)) : 1.0f;
}

template <class H> void check_16bit_rounds_once(Failures& f, Communicator& c) {
  const int n = c.size();
  constexpr std::size_t len = 40;
  const std::string what(dtype_name(dtype_of<H>()));
  const auto float_sum = [&](std::size_t j) {
    float sum = 0;
    for (int r = 0; r < n; ++r) sum += rounding_input<H>(r, j);
    return sum;  // exact: a small integer
  };
  for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    std::vector<H> buf(len);
    for (std::size_t j = 0; j < len; ++j) buf[j] = narrow16<H>(rounding_input<H>(c.rank(), j));
    c.allreduce(std::span<H>(buf), op);
    expect_bits<H>(
        f, buf,
        [&](std::size_t j) {
          return narrow16<H>(op == ReduceOp::avg ? float_sum(j) / static_cast<float>(n) : float_sum(j));
        },
        what + " " + std::string(reduce_op_name(op)) + ": not the float32 sum rounded once");
  }
  // The example of round to nearest, ties to even, that the comment above gives.
  const auto bits = [](int v) { return narrow16<H>(static_cast<float>(v)).bits; };
  f.expect(bits(exact_integers<H>() + 1) == bits(exact_integers<H>()), what + ": 2^k + 1 does not round to 2^k");
  f.expect(bits(exact_integers<H>() + 3) == bits(exact_integers<H>() + 4),
           what + ": 2^k + 3 does not round to 2^k + 4");
  // Shows the check could fail: rounding after every addition gives other bits.
  if (n >= 3 && c.rank() == 0) {
    std::size_t differ = 0;
    for (std::size_t j = 0; j < len; ++j) {
      H acc = narrow16<H>(rounding_input<H>(0, j));
      for (int r = 1; r < n; ++r) acc = narrow16<H>(widen16(acc) + rounding_input<H>(r, j));
      differ += !(acc == narrow16<H>(float_sum(j)));
    }
    f.expect(differ > 0, what + ": the check cannot fail: rounding at every addition gives the same bits");
  }
}

// ---- the checks -----------------------------------------------------------------------------------

std::string rank_and_size(Communicator& c) {
  Failures f;
  f.expect(c.rank() >= 0 && c.rank() < c.size(),
           "rank " + std::to_string(c.rank()) + " is outside [0, " + std::to_string(c.size()) + ")");
  const std::vector<std::int32_t> ranks = c.allgather_value<std::int32_t>(c.rank());
  expect_elements<std::int32_t>(
      f, ranks, [](std::size_t j) { return static_cast<std::int32_t>(j); }, "ranks in rank order");
  return f.text();
}

std::string allreduce_sum_min_max_every_type(Communicator& c) {
  Failures f;
  for (std::size_t len : lengths_of(c.size())) {
    check_sum_min_max<float>(f, c, len);
    check_sum_min_max<double>(f, c, len);
    check_sum_min_max<std::int32_t>(f, c, len);
    check_sum_min_max<std::int64_t>(f, c, len);
    check_sum_min_max<std::uint64_t>(f, c, len);
  }
  return f.text();
}

std::string allreduce_avg_divides_the_sum_by_n(Communicator& c) {
  Failures f;
  for (std::size_t len : lengths_of(c.size())) {
    check_avg<float>(f, c, len);
    check_avg<double>(f, c, len);
  }
  return f.text();
}

std::string signed_integer_sum_wraps(Communicator& c) {
  std::int32_t v = std::numeric_limits<std::int32_t>::max();
  c.allreduce(std::span<std::int32_t>(&v, 1), ReduceOp::sum);
  const auto want = static_cast<std::int32_t>(static_cast<std::uint32_t>(std::numeric_limits<std::int32_t>::max()) *
                                              static_cast<std::uint32_t>(c.size()));
  if (v == want) return {};
  return "N times the largest int32 is " + std::to_string(v) + ", want " + std::to_string(want);
}

std::string float_sum_is_bitwise_the_fixed_order_sum(Communicator& c) {
  Failures f;
  for (std::size_t len : {std::size_t{37}, std::size_t{5000}}) {
    check_bitwise_fixed_order<float>(f, c, len);
    check_bitwise_fixed_order<double>(f, c, len);
  }
  return f.text();
}

std::string sixteen_bit_sums_are_exact_on_small_integers(Communicator& c) {
  Failures f;
  std::vector<std::size_t> lengths = lengths_of(c.size());
  lengths.push_back(100'003);  // slices of several chunks and a tail
  for (std::size_t len : lengths) {
    check_16bit_exact<Bf16>(f, c, len);
    check_16bit_exact<Fp16>(f, c, len);
  }
  return f.text();
}

std::string sixteen_bit_sum_is_rounded_once_at_the_end(Communicator& c) {
  Failures f;
  check_16bit_rounds_once<Bf16>(f, c);
  check_16bit_rounds_once<Fp16>(f, c);
  return f.text();
}

// Bytes, a dtype dpcheck's own messages travel in, broadcast from every root and gathered in rank order.
std::string bytes_broadcast_and_allgather(Communicator& c) {
  Failures f;
  const int n = c.size();
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t len : lengths_of(n)) {
    for (int root = 0; root < n; ++root) {
      std::vector<std::uint8_t> bytes(len);
      for (std::size_t j = 0; j < len; ++j) bytes[j] = static_cast<std::uint8_t>(c.rank() * 31 + static_cast<int>(j));
      c.broadcast(std::span<std::uint8_t>(bytes), root);
      expect_elements<std::uint8_t>(
          f, bytes, [&](std::size_t j) { return static_cast<std::uint8_t>(root * 31 + static_cast<int>(j)); },
          "broadcast root " + std::to_string(root) + " len " + std::to_string(len));
    }
  }
  // 9000 elements are past the size that backends may send along with the call's description.
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{67}, std::size_t{9000}}) {
    std::vector<std::uint8_t> send(len), recv(un * len, 0xff);
    for (std::size_t j = 0; j < len; ++j) send[j] = static_cast<std::uint8_t>(c.rank() * 16 + static_cast<int>(j));
    c.allgather(std::span<const std::uint8_t>(send), std::span<std::uint8_t>(recv));
    expect_elements<std::uint8_t>(
        f, recv, [&](std::size_t i) { return static_cast<std::uint8_t>(i / len * 16 + i % len); },
        "allgather len " + std::to_string(len));
  }
  return f.text();
}

std::string allgather_in_place_from_own_block(Communicator& c) {
  Failures f;
  constexpr std::size_t len = 3;
  const auto un = static_cast<std::size_t>(c.size());
  std::vector<std::int32_t> recv(un * len, -1);
  std::int32_t* mine = recv.data() + static_cast<std::size_t>(c.rank()) * len;
  for (std::size_t j = 0; j < len; ++j) mine[j] = c.rank() * 10 + static_cast<int>(j);
  c.allgather(mine, recv.data(), len, DType::i32);
  expect_elements<std::int32_t>(
      f, recv, [](std::size_t i) { return static_cast<std::int32_t>(i / len * 10 + i % len); }, "gathered");
  return f.text();
}

std::string zero_length_collectives(Communicator& c) {
  c.allreduce(nullptr, 0, DType::f32, ReduceOp::sum);
  c.broadcast(nullptr, 0, DType::f64, 0);
  c.allgather(nullptr, nullptr, 0, DType::u8);
  c.barrier();
  return {};
}

std::string all_and_allgather_value(Communicator& c) {
  Failures f;
  const int n = c.size();
  f.expect(c.all(true), "all(true) is false");
  f.expect(!c.all(c.rank() != n - 1), "all() is true with the last rank's false");
  f.expect(!c.all(c.rank() != 0), "all() is true with rank 0's false");

  const std::vector<std::int32_t> got = c.allgather_value<std::int32_t>(c.rank() * 10 - 3);
  expect_elements<std::int32_t>(
      f, got, [](std::size_t r) { return static_cast<std::int32_t>(r) * 10 - 3; }, "allgather_value int32");
  f.expect(got.size() == static_cast<std::size_t>(n), "allgather_value gave " + std::to_string(got.size()) + " values");

  const std::vector<double> dv = c.allgather_value<double>(0.5 + c.rank());
  expect_elements<double>(
      f, dv, [](std::size_t r) { return 0.5 + static_cast<double>(r); }, "allgather_value float64");
  return f.text();
}

// fn must throw an Error; a failure naming `what` when it does not.
template <class Fn> void expect_error(Failures& f, const Fn& fn, const std::string& what) {
  try {
    fn();
    f.add(what + " did not throw");
  } catch (const Error&) {
  }
}

std::string unsupported_reductions_throw_on_every_rank(Communicator& c) {
  Failures f;
  std::vector<std::uint8_t> bytes(4, 1);
  expect_error(
      f, [&] { c.allreduce(std::span<std::uint8_t>(bytes), ReduceOp::sum); }, "a sum of uint8");
  std::vector<std::int32_t> ints(4, 1);
  try {
    c.allreduce(std::span<std::int32_t>(ints), ReduceOp::avg);
    f.add("avg of int32 did not throw");
  } catch (const Error& e) {
    f.expect(std::string(e.what()).find("avg") != std::string::npos,
             "avg of int32: the error does not say avg: " + std::string(e.what()));
  }
  std::vector<float> v(4, 1.0f);
  expect_error(
      f, [&] { c.broadcast(std::span<float>(v), c.size()); }, "a broadcast from root N");
  expect_error(
      f, [&] { c.broadcast(std::span<float>(v), -1); }, "a broadcast from root -1");
  // The world is still usable afterwards.
  c.allreduce(std::span<float>(v), ReduceOp::sum);
  f.expect(v[0] == static_cast<float>(c.size()), "the sum after the refusals is " + std::to_string(v[0]));
  return f.text();
}

void expect_in(Failures& f, const std::string& message, const std::string& part) {
  f.expect(message.find(part) != std::string::npos, "'" + part + "' not in: " + message);
}

std::string count_mismatch_throws_on_every_rank(Communicator& c) {
  const int n = c.size();
  if (n < 2) return {};  // one rank cannot disagree with itself
  Failures f;
  const int odd = n / 2;
  std::vector<float> buf(c.rank() == odd ? 7 : 8, 1.0f);
  const auto t0 = BackendClock::now();
  try {
    c.allreduce(std::span<float>(buf), ReduceOp::sum);
    f.add("counts 7 and 8 did not throw");
  } catch (const TimeoutError& e) {
    f.add("a mismatch must not look like a timeout: " + std::string(e.what()));
  } catch (const Error& e) {
    const std::string m = e.what();
    expect_in(f, m, "allreduce on rank " + std::to_string(c.rank()));
    expect_in(f, m, ranks_text(all_ranks_but(n, odd)) + " called allreduce(count 8, float32, sum)");
    expect_in(f, m, ranks_text({odd}) + " called allreduce(count 7, float32, sum)");
  }
  const double took = seconds_from(t0);
  f.expect(took < 2.0, "the mismatch took " + std::to_string(took) + " s to report");
  // Ranks that agree go on working.
  c.allreduce(std::span<float>(buf.data(), 7), ReduceOp::sum);
  f.expect(buf[0] == static_cast<float>(n), "the sum after the mismatch is " + std::to_string(buf[0]));
  return f.text();
}

std::string different_collectives_or_roots_are_a_mismatch(Communicator& c) {
  const int n = c.size();
  if (n < 2) return {};
  Failures f;
  std::vector<double> buf(4, 1.0);
  try {
    c.broadcast(std::span<double>(buf), c.rank() == n - 1 ? 1 : 0);
    f.add("roots differ but broadcast did not throw");
  } catch (const Error& e) {
    expect_in(f, e.what(), ranks_text({n - 1}) + " called broadcast(count 4, float64, root 1)");
  }
  try {
    if (c.rank() == 0) c.barrier();
    else c.allreduce(std::span<double>(buf), ReduceOp::max);
    f.add("barrier against allreduce did not throw");
  } catch (const Error& e) {
    expect_in(f, e.what(), "rank 0 called barrier()");
    expect_in(f, e.what(), ranks_text(all_ranks_but(n, 0)) + " called allreduce(count 4, float64, max)");
  }
  try {  // the same count and element size, another op
    c.allreduce(std::span<double>(buf), c.rank() == 0 ? ReduceOp::min : ReduceOp::sum);
    f.add("ops differ but allreduce did not throw");
  } catch (const Error& e) {
    expect_in(f, e.what(), "rank 0 called allreduce(count 4, float64, min)");
  }
  try {  // bfloat16 against float16: the same count and element size
    std::vector<Bf16> b(4, narrow16<Bf16>(1.0f));
    std::vector<Fp16> h(4, narrow16<Fp16>(1.0f));
    if (c.rank() == 0) c.allreduce(std::span<Fp16>(h), ReduceOp::sum);
    else c.allreduce(std::span<Bf16>(b), ReduceOp::sum);
    f.add("bfloat16 against float16 did not throw");
  } catch (const Error& e) {
    expect_in(f, e.what(), "rank 0 called allreduce(count 4, float16, sum)");
    expect_in(f, e.what(), ranks_text(all_ranks_but(n, 0)) + " called allreduce(count 4, bfloat16, sum)");
  }
  try {  // the same count and element size, another dtype
    std::vector<std::int64_t> ints(4, 1);
    if (c.rank() == n - 1) c.allreduce(std::span<std::int64_t>(ints), ReduceOp::sum);
    else c.allreduce(std::span<double>(buf), ReduceOp::sum);
    f.add("dtypes differ but allreduce did not throw");
  } catch (const Error& e) {
    expect_in(f, e.what(), ranks_text({n - 1}) + " called allreduce(count 4, int64, sum)");
  }
  c.barrier();
  return f.text();
}

}  // namespace

}  // namespace dpcheck::backend_checks

namespace dpcheck {

const std::vector<BackendCommCheck>& backend_comm_checks() {
  using namespace backend_checks;
  static const std::vector<BackendCommCheck> checks{
      {"rank and size", "every rank's number is in [0, N), and allgather_value gathers them in rank order",
       rank_and_size},
      {"allreduce sum, min and max of every dtype",
       "float32, float64, int32, int64 and uint64 sums, minima and maxima are exact, with the extremes on other "
       "ranks at every element and values across the sign boundary",
       allreduce_sum_min_max_every_type},
      {"allreduce avg is the sum divided by N", "avg of float32 and float64 is the exact sum divided by N",
       allreduce_avg_divides_the_sum_by_n},
      {"signed integer sum wraps", "an int32 sum wraps around as two's complement does", signed_integer_sum_wraps},
      {"float sum is the serial fixed-order sum",
       "a float32 or float64 sum or avg is bit for bit ((b0 + b1) + b2) + ..., in rank order",
       float_sum_is_bitwise_the_fixed_order_sum},
      {"16-bit sums are exact on small integers",
       "bfloat16 and float16 sums, avgs (the float32 sum over N, rounded once), minima and maxima are exact",
       sixteen_bit_sums_are_exact_on_small_integers},
      {"16-bit sum is rounded once at the end",
       "a bfloat16 or float16 sum or avg is the float32 sum rounded to the format once",
       sixteen_bit_sum_is_rounded_once_at_the_end},
      {"uint8 broadcast and allgather", "bytes move from every root, and gather in rank order",
       bytes_broadcast_and_allgather},
      {"allgather in place", "an allgather whose send block is its own block of the receive buffer gathers",
       allgather_in_place_from_own_block},
      {"zero-length calls", "calls of no elements, with null buffers, complete", zero_length_collectives},
      {"all and allgather_value", "all() is the AND of every rank's verdict; allgather_value gathers in rank order",
       all_and_allgather_value},
      {"unsupported reductions throw on every rank",
       "a sum of bytes, an avg of integers and a root outside the world are an Error on every rank, and the world "
       "stays usable",
       unsupported_reductions_throw_on_every_rank},
      {"a count mismatch throws on every rank naming the ranks",
       "ranks that pass different counts get an Error (not a timeout) naming which rank called what",
       count_mismatch_throws_on_every_rank},
      {"different collectives or roots are a mismatch",
       "ranks that call different collectives, roots, ops or dtypes get an Error naming which rank called what",
       different_collectives_or_roots_are_a_mismatch},
  };
  return checks;
}

}  // namespace dpcheck
