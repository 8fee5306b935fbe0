// The collective checks, each with the cases it runs and the values whose results it knows: all-reduce
// of every dtype and op, a buffer reused, broadcast, all-gather, the same bits on every rank and from run
// to run, the barrier, calls in a row and dpcheck's own backends' promises; and make_check, which builds
// a check by its name for conform_comm.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "conform/conform_comm_backends.hpp"
#include "conform/conform_comm_internal.hpp"
#include "mutants/mutants.hpp"
#include "src/error.hpp"
#include "src/io/hash.hpp"
#include "src/low_precision.hpp"
#include "src/rng.hpp"

namespace dpcheck {
namespace conform_comm_detail {

// ---- cases --------------------------------------------------------------------------------------

CommCase parse_case(const std::string& text, bool with_root, const std::string& check) {
  CommCase c;
  bool has_count = false;
  std::istringstream in(text);
  for (std::string item; in >> item;) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    std::size_t used = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (value.empty() || used != value.size() || value[0] == '-')
      throw UsageError("--case '" + text + "': '" + item + "' is not key=number");
    if (key == "count") {
      c.count = v;
      has_count = true;
    } else if (key == "offset" && v < 64) {
      c.offset = v;
    } else if (key == "root" && with_root && v < 1u << 20) {
      c.root = static_cast<int>(v);
    } else {
      throw UsageError("--case '" + text + "': '" + item + "' is not a case of " + check + " (count=N offset=0..63" +
                       (with_root ? " root=R" : "") + ")");
    }
  }
  if (!has_count) throw UsageError("--case '" + text + "' names no count=");
  if (with_root && c.root < 0) c.root = 0;
  return c;
}

namespace {

// Counts that meet a backend's edges: none, one, around the world size and its multiples, primes (no
// chunking divides them), powers of two and their neighbours (internal thresholds sit there), up to
// `most`.
std::vector<std::size_t> interesting_counts(int n, std::size_t most) {
  const auto un = static_cast<std::size_t>(n);
  std::set<std::size_t> counts{0, 1, 2, 3, 5, 7, 13, 31, 61, 127, 251, 509, 1021, 4093, 65521, 1048573};
  for (std::size_t k : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{17}}) {
    counts.insert(k * un - 1);
    counts.insert(k * un);
    counts.insert(k * un + 1);
  }
  for (int p = 4; p <= 26; p += 2) {
    const std::size_t two = std::size_t{1} << p;
    counts.insert({two - 1, two, two + 1, two + un + 1});
  }
  counts.insert(most);
  std::vector<std::size_t> out;
  for (std::size_t c : counts)
    if (c <= most) out.push_back(c);
  return out;
}

// Each count at offsets 0, 1 and 3 in turn (the largest at 0).
std::vector<CommCase> cases_of(const std::vector<std::size_t>& counts) {
  std::vector<CommCase> cases;
  constexpr std::size_t offsets[] = {0, 1, 3};
  for (std::size_t k = 0; k < counts.size(); ++k)
    cases.push_back({counts[k], k + 1 == counts.size() ? 0 : offsets[k % 3], -1});
  return cases;
}

// ---- values whose reductions are exact ------------------------------------------------------------

// Floating elements, bfloat16 and float16 among them (src/dtype.hpp, src/low_precision.hpp).
template <class T> constexpr bool is_float_like_v = std::is_floating_point_v<T> || is_16bit_v<T>;

// Small multiples of 1/4: any sum of up to 64 of them is exact in float32.
double small_value(int rank, std::size_t i) {
  return static_cast<double>(static_cast<long long>((i * 7 + static_cast<std::size_t>(rank) * 13) % 61) - 30) * 0.25;
}

// min and max of 16-bit formats: patterns drawn over the format's whole range of normal numbers, both
// signs, every binade (no zero, whose sign min and max may take either way; no subnormal; no infinity or
// NaN). Their min and max are exact in any order, and so many pairs of values meet that a plugin which
// keeps a stale value for some of them (an assignment that compares before it stores, say) shows it.
template <class H> float random_normal16(int rank, std::size_t i) {
  constexpr std::uint16_t exponent = std::is_same_v<H, Bf16> ? 0x7f80 : 0x7c00;
  constexpr std::uint16_t lowest = exponent & static_cast<std::uint16_t>(-exponent);  // the exponent's low bit
  auto bits = static_cast<std::uint16_t>(random_u64(mix_key(0x3116, static_cast<std::uint64_t>(rank)), 1, i));
  if ((bits & exponent) == 0) bits = static_cast<std::uint16_t>(bits | lowest);
  if ((bits & exponent) == exponent) bits = static_cast<std::uint16_t>(bits & ~lowest);
  return widen16(H{bits});
}

// A 16-bit input, as the float32 value it holds. Sums: integers in [-k, k], with N k no more than the
// integers the format holds exactly (2^8 in bfloat16, 2^11 in float16), so that every partial sum in
// any order is exact, even one rounded to the format at every hop, times a power of two per element
// (2^-6, 1, 2^4): a plugin that adds the patterns as integers, or drops the exponent, gets these wrong.
// min and max: random_normal16.
template <class H> float value16(int rank, std::size_t i, ReduceOp op, int n) {
  const float scale = i % 3 == 0 ? 0x1p-6f : i % 3 == 1 ? 1.0f : 0x1p4f;
  if (op == ReduceOp::min || op == ReduceOp::max) return random_normal16<H>(rank, i);
  const std::size_t k = (std::is_same_v<H, Bf16> ? 256u : 2048u) / static_cast<std::size_t>(std::max(n, 1));
  const auto v =
      static_cast<long long>((i * 7 + static_cast<std::size_t>(rank) * 13) % (2 * k + 1)) - static_cast<long long>(k);
  return static_cast<float>(v) * scale;
}

// The value rank r contributes at element i; for avg a multiple of the world size, so that the mean is
// exact too. float64 adds a high part beyond float32's precision, int64 one beyond a double's.
template <class T> T input_value(int rank, std::size_t i, ReduceOp op, int n) {
  const double scale = op == ReduceOp::avg ? n : 1;
  if constexpr (is_16bit_v<T>) {
    return narrow16<T>(value16<T>(rank, i, op, n));  // avg is checked within rounding: no multiple of n
  } else if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(small_value(rank, i) * scale);
  } else if constexpr (std::is_same_v<T, double>) {
    return (std::ldexp(static_cast<double>((i + static_cast<std::size_t>(rank)) % 5), 30) + small_value(rank, i)) *
           scale;
  } else {
    const auto small = static_cast<std::int64_t>((i * 7 + static_cast<std::size_t>(rank) * 13) % 61) - 30;
    const std::int64_t high =
        (i + static_cast<std::size_t>(rank)) % 2 ? (std::int64_t{1} << (op == ReduceOp::avg ? 48 : 54)) : 0;
    return (high + small) * static_cast<std::int64_t>(scale);
  }
}

// What rank r sends at element i in a broadcast or an allgather: input_value's sum inputs; in the 16-bit
// formats any pattern, whatever it means (NaNs with payloads, negative zero, subnormals, infinities), so
// that a backend that converts on the way changes some.
template <class T> T moved_value(int rank, std::size_t i) {
  if constexpr (is_16bit_v<T>)
    return T{static_cast<std::uint16_t>(static_cast<std::size_t>(rank) * 40503u + i * 2654435761u)};
  else return input_value<T>(rank, i, ReduceOp::sum, 1);
}

template <class T> T expected_value(std::size_t i, ReduceOp op, int n) {
  if constexpr (is_16bit_v<T>) {
    float acc = value16<T>(0, i, op, n);  // the float32 value of the input
    for (int r = 1; r < n; ++r) {
      const float v = value16<T>(r, i, op, n);
      acc = op == ReduceOp::min ? std::min(acc, v) : op == ReduceOp::max ? std::max(acc, v) : acc + v;  // exact
    }
    return narrow16<T>(acc);  // exact too: min and max give back an input's bits
  } else {
    T acc = input_value<T>(0, i, op, n);
    for (int r = 1; r < n; ++r) {
      const T v = input_value<T>(r, i, op, n);
      if (op == ReduceOp::min) acc = std::min(acc, v);
      else if (op == ReduceOp::max) acc = std::max(acc, v);
      else acc = acc + v;  // exact by construction
    }
    if (op == ReduceOp::avg) acc = static_cast<T>(acc / static_cast<T>(n));
    return acc;
  }
}

// "" or the first element of buf that differs bitwise from want(i).
template <class T, class Want>
std::string compare(const T* buf, std::size_t count, const Want& want, const char* what) {
  for (std::size_t i = 0; i < count; ++i) {
    const T w = want(i);
    if (std::memcmp(&buf[i], &w, sizeof(T)) != 0)
      return std::string(what) + " element " + std::to_string(i) + " is " + value_text(buf[i]) + ", expected " +
             value_text(w) + distance_text(buf[i], w);
  }
  return {};
}

}  // namespace

// ---- the checks ---------------------------------------------------------------------------------------

std::string covered_text(const std::vector<CommCase>& cases, std::size_t element) {
  std::size_t most = 0;
  for (const CommCase& c : cases) most = std::max(most, c.count);
  const std::size_t bytes = most * element;
  const std::string size =
      bytes >= (std::size_t{1} << 20) ? std::to_string(bytes >> 20) + " MiB" : std::to_string(bytes >> 10) + " KiB";
  return std::to_string(cases.size()) + " cases, counts 0.." + std::to_string(most) + " (" + size +
         "), offsets 0, 1, 3";
}

namespace {

template <class T> long double as_long_double(T v) {
  if constexpr (is_16bit_v<T>) return widen16(v);
  else return v;
}

// The unit roundoff of T's format: 2^-24 for float32, 2^-53 for float64, 2^-8 for bfloat16, 2^-11 for
// float16.
template <class T> long double unit_roundoff() {
  if constexpr (std::is_same_v<T, Bf16>) return 0x1p-8L;
  else if constexpr (std::is_same_v<T, Fp16>) return 0x1p-11L;
  else return std::numeric_limits<T>::epsilon() / 2;
}

// avg of floats: the exact sum divided by N, or multiplied by a rounded 1/N, before or after the sum
// (NCCL's ncclAvg multiplies each input by 1/N), and for the 16-bit formats rounded to the format once
// or at every hop: within N + 2 roundings of the exact mean, |x| summed (gamma_{N+2}, Higham 3.1).
// Exact for N a power of two in float32 and float64, where every way is exact.
// (The mutant conform-avg-allowance-16bit takes bfloat16's unit roundoff for every dtype.)
template <class T> std::string mean_within_rounding(const T* buf, std::size_t count, int n, bool allowance_16bit) {
  const long double nu = (n + 2) * (allowance_16bit ? unit_roundoff<Bf16>() : unit_roundoff<T>());
  const long double gamma = nu < 1 ? nu / (1 - nu) : std::numeric_limits<long double>::infinity();
  for (std::size_t i = 0; i < count; ++i) {
    long double sum = 0, magnitude = 0;
    for (int r = 0; r < n; ++r) {
      const long double v = as_long_double(input_value<T>(r, i, ReduceOp::avg, n));
      sum += v;
      magnitude += std::fabs(v);
    }
    const long double mean = sum / n, allowed = gamma * magnitude / n;
    if (!(std::fabs(as_long_double(buf[i]) - mean) <= allowed))
      return "result element " + std::to_string(i) + " is " + value_text(buf[i]) + ", the mean is " +
             value_text(static_cast<double>(mean)) + " (allowed " + value_text(static_cast<double>(allowed)) + ")";
  }
  return {};
}

template <class T>
CommCheck allreduce_check(ReduceOp op, int n, const std::vector<CommCase>& cases, bool allowance_16bit = false) {
  CommCheck c;
  c.section = "collectives";
  c.name = "allreduce " + std::string(dtype_name(dtype_of<T>())) + " " + std::string(reduce_op_name(op));
  c.dtype = dtype_of<T>();
  c.op = op;
  c.promise = op == ReduceOp::avg && is_float_like_v<T>
                  ? "every rank holds the mean: the exact sum over N, within the N + 2 roundings that dividing or "
                    "multiplying by 1/N before or after the sum may take, and nothing outside the buffer changes"
                  : "every rank holds the exact " + std::string(reduce_op_name(op)) + " (inputs whose " +
                        std::string(reduce_op_name(op)) + " is exact in any order" +
                        (is_16bit_v<T> ? ", even rounded to the format at every hop" : "") +
                        "), bit for bit, and nothing outside the buffer changes";
  c.cases = cases;
  c.covered = covered_text(cases, sizeof(T));
  c.make = [op, n, allowance_16bit] {
    auto arena = std::make_shared<Arena<T>>();
    return CaseFn([arena, op, n, allowance_16bit](Communicator& comm, const CommCase& k) {
      T* buf = arena->prepare(k, k.count);
      for (std::size_t i = 0; i < k.count; ++i) buf[i] = input_value<T>(comm.rank(), i, op, n);
      comm.allreduce(arena->place(comm, k), k.count, dtype_of<T>(), op);
      arena->fetch(comm);
      std::string bad = op == ReduceOp::avg && is_float_like_v<T>
                            ? mean_within_rounding(buf, k.count, n, allowance_16bit)
                            : compare(
                                  buf, k.count, [&](std::size_t i) { return expected_value<T>(i, op, n); }, "result");
      return bad.empty() ? arena->guards(k, k.count) : bad;
    });
  };
  return c;
}

// The result of one call fed to the next, on the same buffer: a backend that keeps something by
// address (a registration, a cached copy) must see the new contents.
CommCheck reuse_check(int n, const std::vector<CommCase>& cases) {
  CommCheck c;
  c.section = "collectives";
  c.name = "allreduce buffer reused";
  c.dtype = DType::f32;
  c.op = ReduceOp::sum;
  c.promise = "a buffer passed again holds its new contents: the second sum of a sum is exact";
  c.cases = cases;
  c.covered = covered_text(cases, sizeof(float)) + ", three calls each";
  c.make = [n] {
    auto arena = std::make_shared<Arena<float>>();
    return CaseFn([arena, n](Communicator& comm, const CommCase& k) {
      float* buf = arena->prepare(k, k.count);
      for (std::size_t i = 0; i < k.count; ++i) buf[i] = input_value<float>(comm.rank(), i, ReduceOp::sum, n);
      float* placed = arena->place(comm, k);
      for (int call = 0; call < 3; ++call) comm.allreduce(placed, k.count, DType::f32, ReduceOp::sum);
      arena->fetch(comm);
      // Each call multiplies by n: exact while n^2 * 480 stays below 2^24.
      const auto n3 = static_cast<float>(n) * static_cast<float>(n);
      std::string bad = compare(
          buf, k.count, [&](std::size_t i) { return expected_value<float>(i, ReduceOp::sum, n) * n3; },
          "after three calls,");
      return bad.empty() ? arena->guards(k, k.count) : bad;
    });
  };
  return c;
}

template <class T> CommCheck broadcast_check(int n, const std::vector<CommCase>& counts) {
  CommCheck c;
  c.section = "collectives";
  c.name = "broadcast " + std::string(dtype_name(dtype_of<T>()));
  c.dtype = dtype_of<T>();
  c.promise =
      std::string("every rank holds the root's buffer, from every root") +
      (is_16bit_v<T> ? ", bit for bit, whatever the patterns mean (NaN payloads, -0, subnormals, infinities)" : "");
  for (const CommCase& k : counts)
    if (k.root >= 0) c.cases.push_back(k);  // one case given with --case
    else
      for (int root = 0; root < n; ++root) c.cases.push_back({k.count, k.offset, root});
  c.covered = covered_text(counts, sizeof(T)) + ", every root";
  c.make = [] {
    auto arena = std::make_shared<Arena<T>>();
    return CaseFn([arena](Communicator& comm, const CommCase& k) {
      T* buf = arena->prepare(k, k.count);
      if (comm.rank() == k.root)
        for (std::size_t i = 0; i < k.count; ++i) buf[i] = moved_value<T>(k.root + 1, i);
      comm.broadcast(arena->place(comm, k), k.count, dtype_of<T>(), k.root);
      arena->fetch(comm);
      std::string bad = compare(
          buf, k.count, [&](std::size_t i) { return moved_value<T>(k.root + 1, i); }, "received");
      return bad.empty() ? arena->guards(k, k.count) : bad;
    });
  };
  return c;
}

template <class T> CommCheck allgather_check(int n, const std::vector<CommCase>& cases) {
  CommCheck c;
  c.section = "collectives";
  c.name = "allgather " + std::string(dtype_name(dtype_of<T>()));
  c.dtype = dtype_of<T>();
  c.promise =
      std::string("rank r's block lands at r * count on every rank, in rank order") +
      (is_16bit_v<T> ? ", bit for bit, whatever the patterns mean (NaN payloads, -0, subnormals, infinities)" : "");
  c.cases = cases;
  c.covered = covered_text(cases, sizeof(T));
  c.make = [n] {
    auto send_arena = std::make_shared<Arena<T>>();
    auto recv_arena = std::make_shared<Arena<T>>();
    return CaseFn([send_arena, recv_arena, n](Communicator& comm, const CommCase& k) {
      T* send = send_arena->prepare(k, k.count);
      for (std::size_t i = 0; i < k.count; ++i) send[i] = moved_value<T>(comm.rank(), i);
      const std::size_t total = k.count * static_cast<std::size_t>(n);
      T* recv = recv_arena->prepare(k, total);
      comm.allgather(send_arena->place(comm, k), recv_arena->place(comm, k), k.count, dtype_of<T>());
      recv_arena->fetch(comm);
      send_arena->fetch(comm);
      for (int r = 0; r < n; ++r) {
        const std::string what = "block " + std::to_string(r) + "'s";
        std::string bad = compare(
            recv + static_cast<std::size_t>(r) * k.count, k.count, [&](std::size_t i) { return moved_value<T>(r, i); },
            what.c_str());
        if (!bad.empty()) return bad;
      }
      std::string bad = recv_arena->guards(k, total);
      return bad.empty() ? send_arena->guards(k, k.count) : bad;
    });
  };
  return c;
}

// Rank `stream`'s random input at element i: over 2^-20..2^20 in float32 and float64; in bfloat16 and
// float16 over 2^-8..2^7, where a sum of a few thousand ranks stays inside float16's range and every
// value inside its normal one, so that the order of the additions shows in the last bits.
template <class T> T random_input(std::uint64_t key, std::uint64_t stream, std::size_t i) {
  const double unit = random_unit(key, stream, 2 * i) * 2 - 1;
  const std::uint64_t bits = random_u64(key, stream, 2 * i + 1);
  if constexpr (is_16bit_v<T>)
    return narrow16<T>(static_cast<float>(std::ldexp(unit, static_cast<int>(bits % 16) - 8)));
  else return static_cast<T>(std::ldexp(unit, static_cast<int>(bits % 41) - 20));
}

// Random inputs over many binades: a correct backend's ranks hold the same bits, and a second call
// on the same inputs gives them again. The cases' counts rise, so the first that fails is the minimal
// one, in the 16-bit formats as in float32 and float64.
// The largest count at which run-to-run calls the all-reduce N more times rather than once more.
constexpr std::size_t kRunToRunAllRotations = 1024;

template <class T> CommCheck identical_bits_check(ReduceOp op, bool twice, std::uint64_t seed,
                                                  const std::vector<CommCase>& cases, bool same_inputs) {
  CommCheck c;
  c.section = "determinism";
  c.name = std::string(twice ? "run-to-run " : "same bits on every rank ") + std::string(dtype_name(dtype_of<T>())) +
           " " + std::string(reduce_op_name(op));
  c.dtype = dtype_of<T>();
  c.op = op;
  c.promise = twice ? "the same inputs give the same bits on every later run (N more up to 1024 elements, one above)"
                    : "every rank holds the same bits (random inputs, whose sum depends on the order)";
  c.cases = cases;
  c.covered = covered_text(cases, sizeof(T)) +
              (is_16bit_v<T> ? ", random inputs over 2^-8..2^7" : ", random inputs over 2^-20..2^20");
  c.make = [op, twice, seed, same_inputs] {
    auto arena = std::make_shared<Arena<T>>();
    return CaseFn([arena, op, twice, seed, same_inputs](Communicator& comm, const CommCase& k) {
      T* buf = arena->prepare(k, k.count);
      const auto fill = [&] {
        const std::uint64_t key = mix_key(seed, k.count);
        // Each rank its own values (the same on every rank would sum alike in any order).
        const auto stream = same_inputs ? std::uint64_t{0} : static_cast<std::uint64_t>(comm.rank());
        for (std::size_t i = 0; i < k.count; ++i) buf[i] = random_input<T>(key, stream, i);
      };
      fill();
      comm.allreduce(arena->place(comm, k), k.count, dtype_of<T>(), op);
      arena->fetch(comm);
      const std::uint64_t first = hash_bytes(buf, k.count * sizeof(T));
      if (twice) {
        // Up to 1024 elements, N more calls: an order that turns with each call (by one rank, as a ring
        // that starts where the last call ended) meets every rotation in any N + 1 calls, so the case fails
        // alike in the whole run and replayed alone. (Such an order shows at the small counts, which come
        // first; above them one more call.)
        // Every rank makes all N calls, whatever it saw: a rank that stopped at its own first difference
        // would leave the others waiting in a call it never makes (MPICH's recursive exchange gives some
        // ranks a new result and not others), and the row would read as the library's hang.
        const std::vector<T> kept(buf, buf + k.count);
        const int more = k.count <= kRunToRunAllRotations ? comm.size() : 1;
        std::string first_bad;
        for (int again = 1; again <= more; ++again) {
          fill();
          comm.allreduce(arena->place(comm, k), k.count, dtype_of<T>(), op);
          arena->fetch(comm);
          if (!first_bad.empty()) continue;
          const std::string run = again == 1 ? "second run's" : "run " + std::to_string(again + 1) + "'s";
          first_bad = compare(
              buf, k.count, [&](std::size_t i) { return kept[i]; }, run.c_str());
        }
        return first_bad.empty() ? arena->guards(k, k.count) : first_bad;
      }
      const std::vector<std::uint64_t> hashes = comm.host().allgather_value(first);
      for (std::size_t r = 0; r < hashes.size(); ++r)
        if (hashes[r] != hashes[0]) return first_rank_difference(comm, buf, k.count, r);
      return arena->guards(k, k.count);
    });
  };
  return c;
}

// Ranks arrive at the barrier at staggered times; none may leave before the last has arrived.
CommCheck barrier_check() {
  CommCheck c;
  c.section = "collectives";
  c.name = "barrier";
  c.promise = "no rank leaves the barrier before the last one has entered it";
  c.cases = {{0, 0, -1}, {1, 0, -1}, {2, 0, -1}};
  c.covered = "3 rounds, ranks arriving 20 ms apart";
  c.make = [] {
    return CaseFn([](Communicator& comm, const CommCase& k) -> std::string {
      // Round k: rank (r + k) mod n arrives last.
      const int late =
          static_cast<int>((static_cast<std::size_t>(comm.rank()) + k.count) % static_cast<std::size_t>(comm.size()));
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * late));
      const double in = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
      comm.barrier();
      const double out = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
      const std::vector<double> ins = comm.host().allgather_value(in), outs = comm.host().allgather_value(out);
      const double last_in = *std::max_element(ins.begin(), ins.end());
      if (out < last_in)
        return "left the barrier " + value_text((last_in - out) * 1e3) + " ms before rank " +
               std::to_string(std::max_element(ins.begin(), ins.end()) - ins.begin()) + " entered it";
      return {};
    });
  };
  return c;
}

// Many calls on one communicator, the three collectives interleaved: a sequence number or a slot
// index that wraps (after 256 calls, say), or scratch state one collective leaves for another, shows
// here and not in checks of a few dozen calls each.
CommCheck calls_in_a_row_check(int n, const std::vector<CommCase>& cases) {
  constexpr int calls = 900;
  CommCheck c;
  c.section = "collectives";
  c.name = "calls in a row";
  c.dtype = DType::f32;
  c.op = ReduceOp::sum;
  c.promise = "the 900th call on a communicator is as right as the first, whatever came before it";
  c.cases = cases;
  c.covered = std::to_string(cases.size()) + " counts, " + std::to_string(calls) +
              " calls each: allreduce, broadcast from each root in turn, allgather";
  c.make = [n] {
    auto arena = std::make_shared<Arena<float>>();
    auto gathered = std::make_shared<Arena<float>>();
    return CaseFn([arena, gathered, n](Communicator& comm, const CommCase& k) -> std::string {
      // Every rank makes all the calls and keeps its first difference: a rank that stopped at it would
      // leave the others waiting in a call it never makes.
      std::string first_bad;
      for (int call = 0; call < calls; ++call) {
        float* buf = arena->prepare(k, k.count);
        std::string bad;
        const std::string at = "call " + std::to_string(call + 1) + " (";
        switch (call % 3) {
          case 0:
            for (std::size_t i = 0; i < k.count; ++i)
              buf[i] = input_value<float>(comm.rank(), i + call, ReduceOp::sum, n);
            comm.allreduce(arena->place(comm, k), k.count, DType::f32, ReduceOp::sum);
            arena->fetch(comm);
            bad = compare(
                buf, k.count, [&](std::size_t i) { return expected_value<float>(i + call, ReduceOp::sum, n); },
                (at + "allreduce),").c_str());
            break;
          case 1: {
            const int root = (call / 3) % n;
            if (comm.rank() == root)
              for (std::size_t i = 0; i < k.count; ++i) buf[i] = input_value<float>(root, i + call, ReduceOp::sum, 1);
            comm.broadcast(arena->place(comm, k), k.count, DType::f32, root);
            arena->fetch(comm);
            bad = compare(
                buf, k.count, [&](std::size_t i) { return input_value<float>(root, i + call, ReduceOp::sum, 1); },
                (at + "broadcast from " + std::to_string(root) + "),").c_str());
            break;
          }
          default: {
            for (std::size_t i = 0; i < k.count; ++i)
              buf[i] = input_value<float>(comm.rank(), i + call, ReduceOp::sum, 1);
            const std::size_t total = k.count * static_cast<std::size_t>(n);
            float* recv = gathered->prepare(k, total);
            comm.allgather(arena->place(comm, k), gathered->place(comm, k), k.count, DType::f32);
            gathered->fetch(comm);
            for (int r = 0; r < n && bad.empty(); ++r)
              bad = compare(
                  recv + static_cast<std::size_t>(r) * k.count, k.count,
                  [&](std::size_t i) { return input_value<float>(r, i + call, ReduceOp::sum, 1); },
                  (at + "allgather), block " + std::to_string(r) + "'s").c_str());
            if (bad.empty()) bad = gathered->guards(k, total);
          }
        }
        if (bad.empty()) bad = arena->guards(k, k.count);
        if (first_bad.empty()) first_bad = bad;
      }
      return first_bad;
    });
  };
  return c;
}

// One of dpcheck's own backends' promises (conform/conform_comm_backends.hpp): one case, the whole check.
CommCheck backend_check(const BackendCommCheck& b) {
  CommCheck c;
  c.section = "backends";
  c.name = b.name;
  c.promise = b.promise;
  c.cases = {{0, 0, -1}};
  c.covered = "the whole check";
  c.make = [run = b.run] { return CaseFn([run](Communicator& comm, const CommCase&) { return run(comm); }); };
  return c;
}

}  // namespace

// ---- making a check by its name ---------------------------------------------------------------------

std::size_t small_cap(const ConformOptions& o) { return o.thorough ? kSmall : std::size_t{1} << 18; }
std::size_t other_world_cap(const ConformOptions& o) { return o.thorough ? kSmall : std::size_t{1} << 14; }

std::vector<CommCase> check_cases(const std::string& name, int n, std::size_t cap, const ConformOptions& o,
                                  std::size_t element, std::size_t limit, bool with_root) {
  if (!o.case_text.empty()) return std::vector<CommCase>{parse_case(o.case_text, with_root, name)};
  return cases_of(interesting_counts(n, std::min({cap, limit, o.max_bytes / element})));
}

std::optional<CommCheck> make_check(const std::string& name, int n, std::size_t cap, const ConformOptions& o) {
  const auto cases = [&](std::size_t element, std::size_t limit, bool with_root) {
    return check_cases(name, n, cap, o, element, limit, with_root);
  };
  const auto un = static_cast<std::size_t>(n);
  const std::size_t small = small_cap(o);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
    const std::string suffix = " " + std::string(reduce_op_name(op));
    const std::size_t limit = op == ReduceOp::sum ? kAll : small;
    const bool allowance_16bit = mutant_conform_avg_allowance_16bit(o.mutant);
    if (name == "allreduce float32" + suffix)
      return allreduce_check<float>(op, n, cases(4, limit, false), allowance_16bit);
    if (name == "allreduce float64" + suffix)
      return allreduce_check<double>(op, n, cases(8, limit, false), allowance_16bit);
    if (name == "allreduce int64" + suffix) return allreduce_check<std::int64_t>(op, n, cases(8, limit, false));
    if (name == "allreduce bfloat16" + suffix) return allreduce_check<Bf16>(op, n, cases(2, limit, false));
    if (name == "allreduce float16" + suffix) return allreduce_check<Fp16>(op, n, cases(2, limit, false));
  }
  if (name == "allreduce buffer reused") return reuse_check(n, cases(4, small, false));
  // Broadcast from every root multiplies the cases by n; a case given with --case keeps its root.
  if (name == "broadcast float32") return broadcast_check<float>(n, cases(4, small, true));
  if (name == "broadcast float64") return broadcast_check<double>(n, cases(8, small, true));
  if (name == "broadcast int64") return broadcast_check<std::int64_t>(n, cases(8, small, true));
  if (name == "broadcast bfloat16") return broadcast_check<Bf16>(n, cases(2, small, true));
  if (name == "broadcast float16") return broadcast_check<Fp16>(n, cases(2, small, true));
  if (name == "allgather float32") return allgather_check<float>(n, cases(4 * un, kAll, false));
  if (name == "allgather float64") return allgather_check<double>(n, cases(8 * un, kAll, false));
  if (name == "allgather int64") return allgather_check<std::int64_t>(n, cases(8 * un, kAll, false));
  if (name == "allgather bfloat16") return allgather_check<Bf16>(n, cases(2 * un, kAll, false));
  if (name == "allgather float16") return allgather_check<Fp16>(n, cases(2 * un, kAll, false));
  if (name.starts_with("schedule "))
    if (std::optional<CommCheck> c = make_schedule_check(name, n, cap, o)) return c;
  if (name == "barrier") return barrier_check();
  for (const BackendCommCheck& b : backend_comm_checks())
    if (name == b.name) return backend_check(b);
  if (name == "calls in a row") {
    if (!o.case_text.empty()) return calls_in_a_row_check(n, {parse_case(o.case_text, false, name)});
    std::vector<CommCase> few{{1, 0, -1}, {7, 1, -1}};
    if (cap >= 1021) few.push_back({1021, 3, -1});
    return calls_in_a_row_check(n, few);
  }
  const bool same_inputs = mutant_conform_same_inputs(o.mutant);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
    for (bool twice : {false, true}) {
      const std::string prefix = twice ? "run-to-run " : "same bits on every rank ";
      const std::string suffix = " " + std::string(reduce_op_name(op));
      if (name == prefix + "float32" + suffix)
        return identical_bits_check<float>(op, twice, o.seed, cases(4, small, false), same_inputs);
      if (name == prefix + "float64" + suffix)
        return identical_bits_check<double>(op, twice, o.seed, cases(8, small, false), same_inputs);
      if (name == prefix + "bfloat16" + suffix)
        return identical_bits_check<Bf16>(op, twice, o.seed, cases(2, small, false), same_inputs);
      if (name == prefix + "float16" + suffix)
        return identical_bits_check<Fp16>(op, twice, o.seed, cases(2, small, false), same_inputs);
    }
  return std::nullopt;
}

}  // namespace conform_comm_detail
}  // namespace dpcheck
