// The communicator half of dpcheck conform (properties/conform.hpp).
//
// The collectives are checked on inputs whose results are exact in any order of addition (small
// multiples of 1/4; in float64 and int64 also a high part float32 or a double could not carry; in
// bfloat16 and float16 small integers, exact even when rounded at every hop), so that a correct
// backend's results are known bit for bit whatever its algorithm, and compared bitwise on every rank.
// A plugin of ABI 1 has no 16-bit dtypes: their rows are skipped, saying so. Each buffer sits at an element offset inside a larger allocation whose guard elements
// must come back untouched, and one allocation per rank serves every case of a check, so that a
// backend caching something by address meets reuse. Counts run from 0 through N-1, N, N+1, primes,
// powers of two and their neighbours up to the largest buffer; the first failing case, in that
// order, is the minimal one. Exactness hides one failure: ranks that sum in different orders agree on
// exact inputs. So random inputs check that every rank holds the same bits, and that a second run
// gives them again.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <array>
#include <csignal>

#include "properties/common.hpp"
#include "properties/conform.hpp"
#include "properties/properties.hpp"
#include "src/comm/plugin_comm.hpp"
#include "src/cuda_plugin.hpp"
#include "src/error.hpp"
#include "src/hash.hpp"
#include "src/low_precision.hpp"
#include "src/plugin/plugin_loader.hpp"
#include "src/process.hpp"
#include "src/rng.hpp"

namespace dpcheck {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- cases --------------------------------------------------------------------------------------

struct CommCase {
  std::size_t count = 0;
  std::size_t offset = 0;  // elements past the start of the rank's allocation
  int root = -1;           // broadcast's root; -1 for the other collectives
  std::string text() const {
    return "count=" + std::to_string(count) + " offset=" + std::to_string(offset) +
           (root >= 0 ? " root=" + std::to_string(root) : std::string());
  }
};

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

// bfloat16 and float16 elements (src/dtype.hpp), and their conversions (src/low_precision.hpp).
template <class T> constexpr bool is_16bit_v = std::is_same_v<T, Bf16> || std::is_same_v<T, Fp16>;
template <class T> constexpr bool is_float_like_v = std::is_floating_point_v<T> || is_16bit_v<T>;
template <class H> float widen16(H h) {
  if constexpr (std::is_same_v<H, Bf16>) return bf16_bits_to_float(h.bits);
  else return fp16_bits_to_float(h.bits);
}
template <class H> H narrow16(float f) {
  if constexpr (std::is_same_v<H, Bf16>) return H{float_to_bf16_bits(f)};
  else return H{float_to_fp16_bits(f)};
}

// Small multiples of 1/4: any sum of up to 64 of them is exact in float32.
double small_value(int rank, std::size_t i) {
  return static_cast<double>(static_cast<long long>((i * 7 + static_cast<std::size_t>(rank) * 13) % 61) - 30) * 0.25;
}

// A 16-bit input, as the float32 value it holds. Sums: integers in [-k, k], with N k no more than the
// integers the format holds exactly (2^8 in bfloat16, 2^11 in float16), so that every partial sum in
// any order is exact, even one rounded to the format at every hop. min and max: small_value's
// quarters, exact in both. Either times a power of two per element (2^-6, 1, 2^4): a plugin that adds
// the patterns as integers, or drops the exponent, gets these wrong.
template <class H> float value16(int rank, std::size_t i, ReduceOp op, int n) {
  const float scale = i % 3 == 0 ? 0x1p-6f : i % 3 == 1 ? 1.0f : 0x1p4f;
  if (op == ReduceOp::min || op == ReduceOp::max) return static_cast<float>(small_value(rank, i)) * scale;
  const std::size_t k = (std::is_same_v<H, Bf16> ? 256u : 2048u) / static_cast<std::size_t>(std::max(n, 1));
  const auto v = static_cast<long long>((i * 7 + static_cast<std::size_t>(rank) * 13) % (2 * k + 1)) -
                 static_cast<long long>(k);
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
    return (std::ldexp(static_cast<double>((i + static_cast<std::size_t>(rank)) % 5), 30) + small_value(rank, i)) * scale;
  } else {
    const auto small = static_cast<std::int64_t>((i * 7 + static_cast<std::size_t>(rank) * 13) % 61) - 30;
    const std::int64_t high = (i + static_cast<std::size_t>(rank)) % 2 ? (std::int64_t{1} << (op == ReduceOp::avg ? 48 : 54)) : 0;
    return (high + small) * static_cast<std::int64_t>(scale);
  }
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

template <class T> std::string value_text(T v) {
  std::ostringstream s;
  if constexpr (is_16bit_v<T>) {
    s.precision(std::numeric_limits<float>::max_digits10);
    char bits[16];
    std::snprintf(bits, sizeof bits, "0x%04x", static_cast<unsigned>(v.bits));
    s << widen16(v) << " (bits " << bits << ")";
  } else {
    s.precision(std::numeric_limits<T>::max_digits10);
    s << v;
  }
  return s.str();
}

// What a rank fills what it does not expect to be written with: a NaN payload for floats (in both
// 16-bit formats 0xfe5a is one), a pattern for integers.
template <class T> T poison() {
  if constexpr (is_16bit_v<T>) return T{0xfe5a};
  else if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::quiet_NaN();
  else return static_cast<T>(0x5a5a5a5a5a5a5a5aLL);
}

constexpr std::size_t kGuard = 16;  // poisoned elements after every buffer

// One rank's allocation: offset + count + guard elements, reused by every case of a check. The checks
// fill and compare it on the host; a device-memory communicator gets a device copy (place), which is
// brought back whole, guards included (fetch).
template <class T> struct Arena {
  std::vector<T> data;
  std::size_t used = 0;
  void* device = nullptr;
  std::size_t device_elements = 0;
  const cuda::Plugin* gpu = nullptr;

  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() {
    if (device) gpu->device_free(device);
  }

  T* prepare(const CommCase& c, std::size_t count) {
    used = c.offset + count + kGuard;
    if (data.size() < used) data.resize(used);
    std::fill(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(used), poison<T>());
    return data.data() + c.offset;
  }
  // The pointer the communicator takes for the buffer prepare returned.
  T* place(Communicator& comm, const CommCase& c) {
    if (comm.memory_space() == MemorySpace::host) return data.data() + c.offset;
    if (device_elements < used) {
      gpu = &require_cuda();
      if (device) gpu->device_free(device);
      device = gpu->device_alloc(used * sizeof(T));
      if (!device) throw Error("conform: no device memory for " + std::to_string(used * sizeof(T)) + " bytes");
      device_elements = used;
    }
    comm.from_host(data.data(), device, used * sizeof(T));
    return static_cast<T*>(device) + c.offset;
  }
  void fetch(Communicator& comm) {
    if (comm.memory_space() != MemorySpace::host) comm.to_host(device, data.data(), used * sizeof(T));
  }
  // "" or what was written where it should not have been.
  std::string guards(const CommCase& c, std::size_t count) const {
    const T p = poison<T>();
    for (std::size_t i = 0; i < c.offset; ++i)
      if (std::memcmp(&data[i], &p, sizeof(T)) != 0) return "wrote before the buffer (element -" + std::to_string(c.offset - i) + ")";
    for (std::size_t i = 0; i < kGuard; ++i)
      if (std::memcmp(&data[c.offset + count + i], &p, sizeof(T)) != 0)
        return "wrote past the end of the buffer (element " + std::to_string(count + i) + " of " + std::to_string(count) + ")";
    return {};
  }
};

// A collective on a host vector, staged through the device when the communicator's buffers live there.
template <class T, class Call> void on_buffer(Communicator& comm, std::vector<T>& v, const Call& call) {
  Arena<T> arena;
  const CommCase whole{v.size(), 0, -1};
  std::copy(v.begin(), v.end(), arena.prepare(whole, v.size()));
  call(arena.place(comm, whole));
  arena.fetch(comm);
  std::copy_n(arena.data.begin(), v.size(), v.begin());
}

// "" or the first element of buf that differs bitwise from want(i).
template <class T, class Want> std::string compare(const T* buf, std::size_t count, const Want& want, const char* what) {
  for (std::size_t i = 0; i < count; ++i) {
    const T w = want(i);
    if (std::memcmp(&buf[i], &w, sizeof(T)) != 0)
      return std::string(what) + " element " + std::to_string(i) + " is " + value_text(buf[i]) + ", expected " +
             value_text(w);
  }
  return {};
}

// ---- one check: its cases run on every rank, the first failing one is the minimal case -------------

using CaseFn = std::function<std::string(Communicator&, const CommCase&)>;

struct CommCheck {
  std::string section, name, promise;
  std::vector<CommCase> cases;
  // Builds the rank's state (its arenas) and returns the function that runs one case on it.
  std::function<CaseFn()> make;
  std::string covered;  // the row's detail when it passes
};

ConformRow run_check(const Target& target, int n, const CommCheck& check, const ConformOptions& o) {
  ConformRow row;
  row.section = check.section;
  row.check = check.name;
  const auto t0 = Clock::now();
  std::mutex mutex;
  std::optional<std::size_t> failed_at;
  std::size_t in_flight = 0;
  std::string failure;
  try {
    run_world(target, n, [&](Communicator& comm) {
      const CaseFn run = check.make();
      for (std::size_t k = 0; k < check.cases.size(); ++k) {
        if (records(target, comm)) {
          std::lock_guard lock(mutex);
          in_flight = k;
        }
        const std::vector<std::string> all = allgather_strings(comm.host(), run(comm, check.cases[k]));
        for (std::size_t r = 0; r < all.size(); ++r) {
          if (all[r].empty()) continue;
          if (records(target, comm)) {
            std::lock_guard lock(mutex);
            failed_at = k;
            failure = "rank " + std::to_string(r) + ": " + all[r];
          }
          return;  // every rank saw the same texts: all stop here
        }
      }
    });
  } catch (const std::exception& e) {
    failed_at = in_flight;
    failure = e.what();
  }
  row.seconds = seconds_since(t0);
  if (!failed_at) {
    row.verdict = ConformVerdict::pass;
    row.detail = check.covered;
    return row;
  }
  row.verdict = ConformVerdict::fail;
  row.promise = check.promise;
  row.minimal = check.cases[*failed_at].text();
  row.detail = failure;
  row.replay = o.replay_prefix + (target.process_world ? std::string() : " --world-size " + std::to_string(n)) +
               " --check '" + check.name + "' --case '" + row.minimal + "'";
  row.detail = "N = " + std::to_string(n) + ", " + row.detail;
  return row;
}

std::string covered_text(const std::vector<CommCase>& cases, std::size_t element) {
  std::size_t most = 0;
  for (const CommCase& c : cases) most = std::max(most, c.count);
  return std::to_string(cases.size()) + " cases, counts 0.." + std::to_string(most) + " (" +
         std::to_string(most * element >> 20) + " MiB), offsets 0, 1, 3";
}

// ---- the checks ---------------------------------------------------------------------------------------

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
template <class T> std::string mean_within_rounding(const T* buf, std::size_t count, int n) {
  const long double nu = (n + 2) * unit_roundoff<T>();
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

template <class T> CommCheck allreduce_check(ReduceOp op, int n, const std::vector<CommCase>& cases) {
  CommCheck c;
  c.section = "collectives";
  c.name = "allreduce " + std::string(dtype_name(dtype_of<T>())) + " " + std::string(reduce_op_name(op));
  c.promise = op == ReduceOp::avg && is_float_like_v<T>
                  ? "every rank holds the mean: the exact sum over N, within the N + 2 roundings that dividing or "
                    "multiplying by 1/N before or after the sum may take, and nothing outside the buffer changes"
                  : "every rank holds the exact " + std::string(reduce_op_name(op)) + " (inputs whose " +
                        std::string(reduce_op_name(op)) + " is exact in any order" +
                        (is_16bit_v<T> ? ", even rounded to the format at every hop" : "") +
                        "), bit for bit, and nothing outside the buffer changes";
  c.cases = cases;
  c.covered = covered_text(cases, sizeof(T));
  c.make = [op, n] {
    auto arena = std::make_shared<Arena<T>>();
    return CaseFn([arena, op, n](Communicator& comm, const CommCase& k) {
      T* buf = arena->prepare(k, k.count);
      for (std::size_t i = 0; i < k.count; ++i) buf[i] = input_value<T>(comm.rank(), i, op, n);
      comm.allreduce(arena->place(comm, k), k.count, dtype_of<T>(), op);
      arena->fetch(comm);
      std::string bad = op == ReduceOp::avg && is_float_like_v<T>
                            ? mean_within_rounding(buf, k.count, n)
                            : compare(buf, k.count, [&](std::size_t i) { return expected_value<T>(i, op, n); }, "result");
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
      std::string bad = compare(buf, k.count, [&](std::size_t i) { return expected_value<float>(i, ReduceOp::sum, n) * n3; },
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
  c.promise = "every rank holds the root's buffer, from every root";
  for (const CommCase& k : counts)
    if (k.root >= 0)
      c.cases.push_back(k);  // one case given with --case
    else
      for (int root = 0; root < n; ++root) c.cases.push_back({k.count, k.offset, root});
  c.covered = covered_text(counts, sizeof(T)) + ", every root";
  c.make = [] {
    auto arena = std::make_shared<Arena<T>>();
    return CaseFn([arena](Communicator& comm, const CommCase& k) {
      T* buf = arena->prepare(k, k.count);
      if (comm.rank() == k.root)
        for (std::size_t i = 0; i < k.count; ++i) buf[i] = input_value<T>(k.root + 1, i, ReduceOp::sum, 1);
      comm.broadcast(arena->place(comm, k), k.count, dtype_of<T>(), k.root);
      arena->fetch(comm);
      std::string bad = compare(buf, k.count, [&](std::size_t i) { return input_value<T>(k.root + 1, i, ReduceOp::sum, 1); },
                                "received");
      return bad.empty() ? arena->guards(k, k.count) : bad;
    });
  };
  return c;
}

template <class T> CommCheck allgather_check(int n, const std::vector<CommCase>& cases) {
  CommCheck c;
  c.section = "collectives";
  c.name = "allgather " + std::string(dtype_name(dtype_of<T>()));
  c.promise = "rank r's block lands at r * count on every rank, in rank order";
  c.cases = cases;
  c.covered = covered_text(cases, sizeof(T));
  c.make = [n] {
    auto send_arena = std::make_shared<Arena<T>>();
    auto recv_arena = std::make_shared<Arena<T>>();
    return CaseFn([send_arena, recv_arena, n](Communicator& comm, const CommCase& k) {
      T* send = send_arena->prepare(k, k.count);
      for (std::size_t i = 0; i < k.count; ++i) send[i] = input_value<T>(comm.rank(), i, ReduceOp::sum, 1);
      const std::size_t total = k.count * static_cast<std::size_t>(n);
      T* recv = recv_arena->prepare(k, total);
      comm.allgather(send_arena->place(comm, k), recv_arena->place(comm, k), k.count, dtype_of<T>());
      recv_arena->fetch(comm);
      send_arena->fetch(comm);
      for (int r = 0; r < n; ++r) {
        const std::string what = "block " + std::to_string(r) + "'s";
        std::string bad = compare(recv + static_cast<std::size_t>(r) * k.count, k.count,
                                  [&](std::size_t i) { return input_value<T>(r, i, ReduceOp::sum, 1); }, what.c_str());
        if (!bad.empty()) return bad;
      }
      std::string bad = recv_arena->guards(k, total);
      return bad.empty() ? send_arena->guards(k, k.count) : bad;
    });
  };
  return c;
}

// Random inputs over many binades: a correct backend's ranks hold the same bits, and a second call
// on the same inputs gives them again.
template <class T> CommCheck identical_bits_check(ReduceOp op, bool twice, std::uint64_t seed, const std::vector<CommCase>& cases) {
  CommCheck c;
  c.section = "determinism";
  c.name = std::string(twice ? "run-to-run " : "same bits on every rank ") + std::string(dtype_name(dtype_of<T>())) +
           " " + std::string(reduce_op_name(op));
  c.promise = twice ? "the same inputs give the same bits on a second run"
                    : "every rank holds the same bits (random inputs, whose sum depends on the order)";
  c.cases = cases;
  c.covered = covered_text(cases, sizeof(T)) + ", random inputs over 2^-20..2^20";
  c.make = [op, twice, seed] {
    auto arena = std::make_shared<Arena<T>>();
    return CaseFn([arena, op, twice, seed](Communicator& comm, const CommCase& k) {
      T* buf = arena->prepare(k, k.count);
      const auto fill = [&] {
        const std::uint64_t key = mix_key(seed, k.count);
        const auto stream = static_cast<std::uint64_t>(comm.rank());
        for (std::size_t i = 0; i < k.count; ++i)
          buf[i] = static_cast<T>(std::ldexp(random_unit(key, stream, 2 * i) * 2 - 1,
                                             static_cast<int>(random_u64(key, stream, 2 * i + 1) % 41) - 20));
      };
      fill();
      comm.allreduce(arena->place(comm, k), k.count, dtype_of<T>(), op);
      arena->fetch(comm);
      const std::uint64_t first = hash_bytes(buf, k.count * sizeof(T));
      if (twice) {
        std::vector<T> kept(buf, buf + k.count);
        fill();
        comm.allreduce(arena->place(comm, k), k.count, dtype_of<T>(), op);
        arena->fetch(comm);
        return compare(buf, k.count, [&](std::size_t i) { return kept[i]; }, "second run's");
      }
      const std::vector<std::uint64_t> hashes = comm.host().allgather_value(first);
      for (std::size_t r = 0; r < hashes.size(); ++r)
        if (hashes[r] != hashes[0])
          return std::string("rank ") + std::to_string(r) + "'s result differs from rank 0's (hashes " +
                 std::to_string(hashes[r]) + " and " + std::to_string(hashes[0]) + ")";
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
      const int late = static_cast<int>((static_cast<std::size_t>(comm.rank()) + k.count) % static_cast<std::size_t>(comm.size()));
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
  c.promise = "the 900th call on a communicator is as right as the first, whatever came before it";
  c.cases = cases;
  c.covered = std::to_string(cases.size()) + " counts, " + std::to_string(calls) +
              " calls each: allreduce, broadcast from each root in turn, allgather";
  c.make = [n] {
    auto arena = std::make_shared<Arena<float>>();
    auto gathered = std::make_shared<Arena<float>>();
    return CaseFn([arena, gathered, n](Communicator& comm, const CommCase& k) -> std::string {
      for (int call = 0; call < calls; ++call) {
        float* buf = arena->prepare(k, k.count);
        std::string bad;
        const std::string at = "call " + std::to_string(call + 1) + " (";
        switch (call % 3) {
          case 0:
            for (std::size_t i = 0; i < k.count; ++i) buf[i] = input_value<float>(comm.rank(), i + call, ReduceOp::sum, n);
            comm.allreduce(arena->place(comm, k), k.count, DType::f32, ReduceOp::sum);
            arena->fetch(comm);
            bad = compare(buf, k.count, [&](std::size_t i) { return expected_value<float>(i + call, ReduceOp::sum, n); },
                          (at + "allreduce),").c_str());
            break;
          case 1: {
            const int root = (call / 3) % n;
            if (comm.rank() == root)
              for (std::size_t i = 0; i < k.count; ++i) buf[i] = input_value<float>(root, i + call, ReduceOp::sum, 1);
            comm.broadcast(arena->place(comm, k), k.count, DType::f32, root);
            arena->fetch(comm);
            bad = compare(buf, k.count, [&](std::size_t i) { return input_value<float>(root, i + call, ReduceOp::sum, 1); },
                          (at + "broadcast from " + std::to_string(root) + "),").c_str());
            break;
          }
          default: {
            for (std::size_t i = 0; i < k.count; ++i) buf[i] = input_value<float>(comm.rank(), i + call, ReduceOp::sum, 1);
            const std::size_t total = k.count * static_cast<std::size_t>(n);
            float* recv = gathered->prepare(k, total);
            comm.allgather(arena->place(comm, k), gathered->place(comm, k), k.count, DType::f32);
            gathered->fetch(comm);
            for (int r = 0; r < n && bad.empty(); ++r)
              bad = compare(recv + static_cast<std::size_t>(r) * k.count, k.count,
                            [&](std::size_t i) { return input_value<float>(r, i + call, ReduceOp::sum, 1); },
                            (at + "allgather), block " + std::to_string(r) + "'s").c_str());
            if (bad.empty()) bad = gathered->guards(k, total);
          }
        }
        if (bad.empty()) bad = arena->guards(k, k.count);
        if (!bad.empty()) return bad;
      }
      return {};
    });
  };
  return c;
}

// ---- the fingerprint: which order, and how wide, the backend adds -----------------------------------

// Candidate models of a backend's summation, evaluated on the probes in T.
template <class T> T fold_in_order(const std::vector<T>& x, const std::vector<int>& order) {
  T acc = x[static_cast<std::size_t>(order[0])];
  for (std::size_t k = 1; k < order.size(); ++k) acc = acc + x[static_cast<std::size_t>(order[k])];
  return acc;
}

template <class T> T fold_tree(const std::vector<T>& x, std::size_t lo, std::size_t hi) {
  if (hi - lo == 1) return x[lo];
  const std::size_t mid = lo + (hi - lo) / 2;
  return fold_tree(x, lo, mid) + fold_tree(x, mid, hi);
}

template <class T> std::string fingerprint(Communicator& comm, int n) {
  // Every ordered triple (a, b, c) of ranks: a holds B, b holds 1, c holds -B, the others 0. In T, the
  // 1 survives unless a's B and b's 1 meet before c's -B (or the backend adds wider than T).
  const T big = std::is_same_v<T, float> ? T(16777216.0) : T(9007199254740992.0);
  std::vector<std::array<int, 3>> triples;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      for (int c = 0; c < n; ++c)
        if (a != b && b != c && a != c) triples.push_back({a, b, c});
  std::vector<T> buf(triples.size());
  for (std::size_t e = 0; e < triples.size(); ++e) {
    const auto& t = triples[e];
    buf[e] = comm.rank() == t[0] ? big : comm.rank() == t[1] ? T(1) : comm.rank() == t[2] ? -big : T(0);
  }
  on_buffer(comm, buf, [&](T* placed) { comm.allreduce(placed, buf.size(), dtype_of<T>(), ReduceOp::sum); });

  const auto probe = [&](std::size_t e) {
    std::vector<T> x(static_cast<std::size_t>(n), T(0));
    x[static_cast<std::size_t>(triples[e][0])] = big;
    x[static_cast<std::size_t>(triples[e][1])] = T(1);
    x[static_cast<std::size_t>(triples[e][2])] = -big;
    return x;
  };
  std::vector<int> forward(static_cast<std::size_t>(n)), backward(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    forward[static_cast<std::size_t>(r)] = r;
    backward[static_cast<std::size_t>(r)] = n - 1 - r;
  }
  const auto chunk_of = [&](std::size_t e) {  // the chunk of element e when the buffer is cut in n
    const std::size_t count = triples.size(), per = count / static_cast<std::size_t>(n), extra = count % static_cast<std::size_t>(n);
    const std::size_t edge = extra * (per + 1);
    return static_cast<int>(e < edge ? e / (per + 1) : extra + (e - edge) / std::max<std::size_t>(per, 1));
  };
  struct Model {
    const char* name;
    std::function<T(std::size_t)> eval;
  };
  const std::vector<Model> models = {
      {"in rank order (0 + 1 + ... + N-1)", [&](std::size_t e) { return fold_in_order(probe(e), forward); }},
      {"in reverse rank order", [&](std::size_t e) { return fold_in_order(probe(e), backward); }},
      {"as a pairwise tree over the ranks", [&](std::size_t e) { return fold_tree(probe(e), 0, static_cast<std::size_t>(n)); }},
      {"around a ring, each chunk from its own rank (c, c+1, ...)",
       [&](std::size_t e) {
         std::vector<int> order;
         for (int k = 0; k < n; ++k) order.push_back((chunk_of(e) + k) % n);
         return fold_in_order(probe(e), order);
       }},
      {"around a ring, each chunk from the rank after it (c+1, c+2, ...)",
       [&](std::size_t e) {
         std::vector<int> order;
         for (int k = 0; k < n; ++k) order.push_back((chunk_of(e) + 1 + k) % n);
         return fold_in_order(probe(e), order);
       }},
      {"exactly (wider than the type, or compensated)", [&](std::size_t) { return T(1); }},
  };
  std::vector<std::string> fits;
  for (const Model& m : models) {
    bool all = true;
    for (std::size_t e = 0; e < triples.size() && all; ++e) {
      const T want = m.eval(e);
      all = std::memcmp(&want, &buf[e], sizeof(T)) == 0;
    }
    if (all) fits.emplace_back(m.name);
  }
  std::size_t lost = 0;
  for (T v : buf) lost += v == T(0);
  std::string text = std::string(dtype_name(dtype_of<T>())) + ": ";
  if (fits.empty())
    text += "no simple order fits (" + std::to_string(lost) + " of " + std::to_string(triples.size()) +
            " cancellation probes lost the 1)";
  else
    for (std::size_t k = 0; k < fits.size(); ++k) text += (k ? " or " : "sums ") + fits[k];
  return text;
}

ConformRow fingerprint_row(const Target& target, int n) {
  ConformRow row;
  row.section = "fingerprint";
  row.check = "summation order and width";
  row.verdict = ConformVerdict::info;
  if (n < 3) {
    row.detail = "needs 3 ranks or more (with fewer, every order of addition gives the same sum)";
    return row;
  }
  const auto t0 = Clock::now();
  std::mutex mutex;
  try {
    run_world(target, n, [&](Communicator& comm) {
      const std::string f32 = fingerprint<float>(comm, n), f64 = fingerprint<double>(comm, n);
      if (records(target, comm)) {
        std::lock_guard lock(mutex);
        row.detail = f32 + "; " + f64;
      }
    });
  } catch (const std::exception& e) {
    row.verdict = ConformVerdict::fail;
    row.promise = "the probes' all-reduce completes";
    row.detail = e.what();
  }
  row.seconds = seconds_since(t0);
  return row;
}

// ---- a rank that never arrives ---------------------------------------------------------------------------

ConformRow absent_rank_row(int n, const ConformOptions& o) {
  ConformRow row;
  row.section = "robustness";
  row.check = "a rank that never arrives";
  if (o.absent_rank_command.empty() || n < 2) {
    row.verdict = ConformVerdict::skip;
    row.detail = n < 2 ? "needs 2 ranks or more" : o.absent_rank_skip;
    return row;
  }
  const auto t0 = Clock::now();
  ChildOptions child;
  child.argv = o.absent_rank_command;
  child.input = ChildOptions::Input::null;
  child.out = ChildOptions::Output::capture;
  child.err = ChildOptions::Output::capture;
  child.timeout = o.timeout * 4 + std::chrono::seconds(10);
  child.new_process_group = true;
  child.timeout_signal = SIGKILL;
  const ChildResult r = run_child(child);
  row.seconds = seconds_since(t0);
  std::string said = r.out + r.err;
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  if (r.succeeded()) {
    row.verdict = ConformVerdict::pass;
    row.detail = said;
    return row;
  }
  row.verdict = ConformVerdict::fail;
  row.promise = "a collective that a rank never joins ends in an error within the timeout, not a hang";
  row.detail = said.empty() ? "the probe " + r.status_text() : said;
  row.minimal = "count=1024 offset=0";
  row.replay = o.replay_prefix + " --world-size " + std::to_string(n) + " --check '" + row.check + "'";
  return row;
}

}  // namespace

int conform_absent_rank_probe(const Target& target, int n) {
  std::mutex mutex;
  std::vector<std::string> ended(static_cast<std::size_t>(n));
  const auto t0 = Clock::now();
  // The waiting ranks' errors end the world; each is caught where it is thrown.
  try {
    run_world(target, n, [&](Communicator& comm) {
      std::string outcome;
      if (comm.rank() != n - 1) {
        std::vector<float> buf(1024, 1.0f);
        try {
          on_buffer(comm, buf, [&](float* placed) { comm.allreduce(placed, buf.size(), DType::f32, ReduceOp::sum); });
          outcome = "returned success";
        } catch (const std::exception& e) {
          char when[32];
          std::snprintf(when, sizeof when, "%.2f", seconds_since(t0));
          outcome = std::string("failed after ") + when + " s: " + e.what();
        }
      } else {
        outcome = "never called";
      }
      std::lock_guard lock(mutex);
      ended[static_cast<std::size_t>(comm.rank())] = outcome;
    });
  } catch (const std::exception&) {
    // The world's own teardown after the errors above; what each rank saw is recorded.
  }
  bool all_failed = true;
  std::string first;
  for (int r = 0; r + 1 < n; ++r) {
    const std::string& e = ended[static_cast<std::size_t>(r)];
    all_failed &= e.starts_with("failed");
    if (first.empty() || !e.starts_with("failed")) first = "rank " + std::to_string(r) + " " + (e.empty() ? "never ended" : e);
  }
  std::printf("%s%s\n", all_failed ? "every waiting rank's allreduce failed in time; e.g. " : "", first.c_str());
  return all_failed ? 0 : 1;
}

std::vector<std::string> conform_comm_checks() {
  constexpr const char* dtypes[] = {"float32", "float64", "int64", "bfloat16", "float16"};
  std::vector<std::string> names;
  for (const char* d : dtypes)
    for (const char* op : {"sum", "avg", "min", "max"}) names.push_back(std::string("allreduce ") + d + " " + op);
  names.push_back("allreduce buffer reused");
  for (const char* d : dtypes) names.push_back(std::string("broadcast ") + d);
  for (const char* d : dtypes) names.push_back(std::string("allgather ") + d);
  names.push_back("barrier");
  names.push_back("calls in a row");
  for (const char* d : {"float32", "float64"})
    for (const char* op : {"sum", "avg"}) {
      names.push_back(std::string("same bits on every rank ") + d + " " + op);
      names.push_back(std::string("run-to-run ") + d + " " + op);
    }
  names.push_back("a rank that never arrives");
  names.push_back("summation order and width");
  return names;
}

void check_conform_comm_selection(const std::string& check, const std::string& case_text) {
  if (!case_text.empty() && check.empty()) throw UsageError("--case needs --check: the case of which check?");
  if (check.empty()) return;
  if (check.starts_with("property ")) {
    (void)find_property(check.substr(std::string("property ").size()));
    if (!case_text.empty())
      throw UsageError("--case is for conform's own checks; a property's case replays with dpcheck verify --reproduce");
    return;
  }
  const std::vector<std::string> names = conform_comm_checks();
  if (std::find(names.begin(), names.end(), check) == names.end())
    throw UsageError("--check '" + check + "' is not a check of a communicator (see --list-checks)");
  if (!case_text.empty()) (void)parse_case(case_text, check.starts_with("broadcast"), check);
}

namespace {

constexpr std::size_t kAll = std::numeric_limits<std::size_t>::max();
constexpr std::size_t kSmall = std::size_t{1} << 20;  // elements: the cap of every check but sum's

// The check `name` for a world of n ranks, its counts capped at `cap` elements (and options.max_bytes),
// or the one case options.case_text gives. nullopt for a name that is not a collective check.
std::optional<CommCheck> make_check(const std::string& name, int n, std::size_t cap, const ConformOptions& o) {
  const auto cases = [&](std::size_t element, std::size_t limit, bool with_root) {
    if (!o.case_text.empty()) return std::vector<CommCase>{parse_case(o.case_text, with_root, name)};
    return cases_of(interesting_counts(n, std::min({cap, limit, o.max_bytes / element})));
  };
  const auto un = static_cast<std::size_t>(n);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
    const std::string suffix = " " + std::string(reduce_op_name(op));
    const std::size_t limit = op == ReduceOp::sum ? kAll : kSmall;
    if (name == "allreduce float32" + suffix) return allreduce_check<float>(op, n, cases(4, limit, false));
    if (name == "allreduce float64" + suffix) return allreduce_check<double>(op, n, cases(8, limit, false));
    if (name == "allreduce int64" + suffix) return allreduce_check<std::int64_t>(op, n, cases(8, limit, false));
    if (name == "allreduce bfloat16" + suffix) return allreduce_check<Bf16>(op, n, cases(2, limit, false));
    if (name == "allreduce float16" + suffix) return allreduce_check<Fp16>(op, n, cases(2, limit, false));
  }
  if (name == "allreduce buffer reused") return reuse_check(n, cases(4, kSmall, false));
  // Broadcast from every root multiplies the cases by n; a case given with --case keeps its root.
  if (name == "broadcast float32") return broadcast_check<float>(n, cases(4, kSmall, true));
  if (name == "broadcast float64") return broadcast_check<double>(n, cases(8, kSmall, true));
  if (name == "broadcast int64") return broadcast_check<std::int64_t>(n, cases(8, kSmall, true));
  if (name == "broadcast bfloat16") return broadcast_check<Bf16>(n, cases(2, kSmall, true));
  if (name == "broadcast float16") return broadcast_check<Fp16>(n, cases(2, kSmall, true));
  if (name == "allgather float32") return allgather_check<float>(n, cases(4 * un, kAll, false));
  if (name == "allgather float64") return allgather_check<double>(n, cases(8 * un, kAll, false));
  if (name == "allgather int64") return allgather_check<std::int64_t>(n, cases(8 * un, kAll, false));
  if (name == "allgather bfloat16") return allgather_check<Bf16>(n, cases(2 * un, kAll, false));
  if (name == "allgather float16") return allgather_check<Fp16>(n, cases(2 * un, kAll, false));
  if (name == "barrier") return barrier_check();
  if (name == "calls in a row") {
    if (!o.case_text.empty()) return calls_in_a_row_check(n, {parse_case(o.case_text, false, name)});
    std::vector<CommCase> few{{1, 0, -1}, {7, 1, -1}};
    if (cap >= 1021) few.push_back({1021, 3, -1});
    return calls_in_a_row_check(n, few);
  }
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg})
    for (bool twice : {false, true}) {
      const std::string prefix = twice ? "run-to-run " : "same bits on every rank ";
      const std::string suffix = " " + std::string(reduce_op_name(op));
      if (name == prefix + "float32" + suffix) return identical_bits_check<float>(op, twice, o.seed, cases(4, kSmall, false));
      if (name == prefix + "float64" + suffix) return identical_bits_check<double>(op, twice, o.seed, cases(8, kSmall, false));
    }
  return std::nullopt;
}

// A check over every world size: the smaller ones first (a failure there is the simpler case), each
// at counts up to 2^20 elements but the main world, which goes to options.max_bytes. The first
// failure is the row; a pass says what it covered.
ConformRow run_over_worlds(const Target& target, int main_world, const std::string& name, const ConformOptions& o) {
  std::vector<int> worlds = o.extra_world_sizes;
  worlds.push_back(main_world);
  std::sort(worlds.begin(), worlds.end());
  worlds.erase(std::unique(worlds.begin(), worlds.end()), worlds.end());
  ConformRow passed;
  double seconds = 0;
  std::string others;
  for (int n : worlds) {
    const std::optional<CommCheck> check = make_check(name, n, n == main_world ? kAll : kSmall, o);
    ConformRow row = run_check(target, n, *check, o);
    seconds += row.seconds;
    if (row.verdict == ConformVerdict::fail) {
      row.seconds = seconds;
      return row;
    }
    if (n == main_world)
      passed = row;
    else
      others += (others.empty() ? "" : ", ") + std::to_string(n);
  }
  passed.seconds = seconds;
  passed.detail = "N = " + std::to_string(main_world) + ": " + passed.detail +
                  (others.empty() ? std::string() : "; also N = " + others + " (counts to 2^20)");
  return passed;
}

// The 16-bit dtype a check's name ends in ("allreduce bfloat16 sum", "broadcast float16"), if any.
std::optional<DType> sixteen_bit_dtype(const std::string& name) {
  if (name.find(" bfloat16") != std::string::npos) return DType::bf16;
  if (name.find(" float16") != std::string::npos) return DType::f16;
  return std::nullopt;
}

// A check of a dtype newer than the plugin's ABI: skipped, saying why (a 16-bit collective on such a
// plugin is a UsageError, src/comm/plugin_comm.hpp).
ConformRow unsupported_dtype_row(const std::string& name, const dpcheck_comm_plugin_t& plugin, DType dtype) {
  ConformRow row;
  row.section = "collectives";
  row.check = name;
  row.verdict = ConformVerdict::skip;
  row.detail = "plugin ABI " + std::to_string(plugin.abi) + " has no " + std::string(dtype_name(dtype)) +
               ", which ABI 2 added: rebuild the plugin against this dpcheck's plugin.h (ABI " +
               std::to_string(DPCHECK_PLUGIN_ABI) + ")";
  return row;
}

}  // namespace

std::vector<ConformRow> conform_comm(const Target& target, int n, const ConformOptions& o) {
  check_conform_comm_selection(o.check, o.case_text);
  std::vector<ConformRow> rows;
  const auto emit = [&](ConformRow row) {
    if (o.on_row) o.on_row(row);
    rows.push_back(std::move(row));
  };
  const auto wanted = [&](const std::string& name) { return o.check.empty() || o.check == name; };
  const dpcheck_comm_plugin_t* plugin = looks_like_plugin_path(target.comm) ? &load_comm_plugin(target.comm) : nullptr;
  for (const std::string& name : conform_comm_checks()) {
    if (!wanted(name) || !make_check(name, n, kSmall, ConformOptions{})) continue;
    if (const std::optional<DType> dtype = sixteen_bit_dtype(name); plugin && dtype && !comm_plugin_has_dtype(*plugin, *dtype)) {
      emit(unsupported_dtype_row(name, *plugin, *dtype));
      continue;
    }
    // A replayed case runs on the world it failed on (the command line's) alone.
    if (!o.case_text.empty()) {
      emit(run_check(target, n, *make_check(name, n, kAll, o), o));
      continue;
    }
    emit(run_over_worlds(target, n, name, o));
  }
  if (wanted("a rank that never arrives")) emit(absent_rank_row(n, o));
  if (wanted("summation order and width")) emit(fingerprint_row(target, n));
  if (o.properties && (o.check.empty() || o.check.starts_with("property ")))
    for (ConformRow& row : conform_properties(target, o)) rows.push_back(std::move(row));  // on_row called there
  return rows;
}

}  // namespace dpcheck
