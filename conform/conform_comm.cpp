// The communicator half of dpcheck conform (conform/conform.hpp).
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
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <iterator>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <array>
#include <csignal>

#include "conform/conform.hpp"
#include "conform/conform_comm_backends.hpp"
#include "properties/common.hpp"
#include "properties/mutants.hpp"
#include "properties/properties.hpp"
#include "reference/allreduce_schedule.hpp"
#include "src/error.hpp"
#include "src/io/hash.hpp"
#include "src/io/process.hpp"
#include "src/low_precision.hpp"
#include "src/plugin/cuda_plugin.hpp"
#include "src/plugin/plugin_comm.hpp"
#include "src/plugin/plugin_loader.hpp"
#include "src/rng.hpp"
#include "src/train/replica_check.hpp"

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

// What rank r sends at element i in a broadcast or an allgather: input_value's sum inputs; in the 16-bit
// formats any pattern, whatever it means (NaNs with payloads, negative zero, subnormals, infinities), so
// that a backend that converts on the way changes some.
template <class T> T moved_value(int rank, std::size_t i) {
  if constexpr (is_16bit_v<T>)
    return T{static_cast<std::uint16_t>(static_cast<std::size_t>(rank) * 40503u + i * 2654435761u)};
  else
    return input_value<T>(rank, i, ReduceOp::sum, 1);
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

// How far apart two values are, for a failure's text: " (3 ulps apart)" for floats of any width (in
// the format's own units in the last place), " (off by 5)" for integers; "" for a NaN or infinity.
template <class T> std::string distance_text(T got, T want) {
  std::uint64_t ulps = 0;
  if constexpr (is_16bit_v<T>) {
    if (!std::isfinite(widen16(got)) || !std::isfinite(widen16(want))) return "";
    // Sign and magnitude onto one line of integers, as ulp_distance does for float32.
    const auto ordered = [](std::uint16_t b) -> std::int64_t { return b & 0x8000u ? -std::int64_t(b & 0x7fffu) : b; };
    const std::int64_t d = ordered(got.bits) - ordered(want.bits);
    ulps = static_cast<std::uint64_t>(d < 0 ? -d : d);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(got) || !std::isfinite(want)) return "";
    ulps = ulp_distance(got, want);
  } else {
    const auto d = static_cast<long double>(got) - static_cast<long double>(want);
    std::ostringstream s;
    s << " (off by " << static_cast<long long>(d) << ")";
    return s.str();
  }
  return " (" + std::to_string(ulps) + (ulps == 1 ? " ulp" : " ulps") + " apart)";
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
             value_text(w) + distance_text(buf[i], w);
  }
  return {};
}

// ---- one check: its cases run on every rank, the first failing one is the minimal case -------------

using CaseFn = std::function<std::string(Communicator&, const CommCase&)>;

// A check's verdict on its cases taken together: a failure at case `at`, or a switch, with its words.
struct CheckConclusion {
  bool failed = false;
  std::size_t at = 0;
  std::string what;
};

struct CommCheck {
  std::string section, name, promise;
  std::vector<CommCase> cases;
  // Builds the rank's state (its arenas) and returns the function that runs one case on it.
  std::function<CaseFn()> make;
  std::string covered;  // the row's detail when it passes
  // What it asks of the plugin (include/dpcheck/plugin.h, "Capabilities"): collectives of `dtype`, and
  // all-reduces of `op` where set. The barrier asks for neither.
  std::optional<DType> dtype;
  std::optional<ReduceOp> op;
  // Where every case passed: a last word on the whole run, from what its cases saw on the recording
  // rank (the schedule check's switches): nullopt keeps the pass.
  std::function<std::optional<CheckConclusion>()> conclude;
};

// The minimal case of a row whose world failed before its first case ran (the plugin's init, say).
constexpr const char* kBeforeFirstCase = "none: it failed before its first case, as the ranks started";

// The world size a row's replay line names (none under a launcher, whose -np says it). The mutant
// conform-replay-drops-world-size leaves it out: the line then replays on conform's default worlds.
std::string world_flag(const Target& target, int n, const ConformOptions& o) {
  if (mutant_conform_replay_drops_world_size(o.mutant)) return "";
  return target.process_world ? std::string() : " --world-size " + std::to_string(n);
}

// A check's row on a world of n ranks: passed, or failed at case `failed_at` (none: before its first
// case) for `failure`.
ConformRow check_row(const Target& target, int n, const CommCheck& check, const ConformOptions& o, bool failed,
                     std::optional<std::size_t> failed_at, const std::string& failure, double seconds) {
  ConformRow row;
  row.section = check.section;
  row.check = check.name;
  row.seconds = seconds;
  if (!failed) {
    row.verdict = ConformVerdict::pass;
    row.detail = check.covered;
    return row;
  }
  row.verdict = ConformVerdict::fail;
  row.detail = "N = " + std::to_string(n) + ", " + failure;
  if (!failed_at) {
    row.promise = "the plugin's communicator starts on every rank";
    row.minimal = kBeforeFirstCase;
    row.replay = o.replay_prefix + world_flag(target, n, o) + " --check '" + check.name + "'";
    return row;
  }
  row.promise = check.promise;
  row.minimal = check.cases[*failed_at].text();
  row.replay = o.replay_prefix + world_flag(target, n, o) + " --check '" + check.name + "' --case '" + row.minimal + "'";
  return row;
}

// Where a check failed: the case, and the first failing rank's words.
struct CaseFailure {
  std::size_t at = 0;
  std::string what;
};

// The cases of `check` in turn on this rank (collective: every rank calls it), stopping at the first case
// that fails on any rank; every rank returns the same. `starting` is told each case before it runs.
std::optional<CaseFailure> run_cases(Communicator& comm, const CommCheck& check,
                                     const std::function<void(std::size_t)>& starting) {
  const CaseFn run = check.make();
  for (std::size_t k = 0; k < check.cases.size(); ++k) {
    starting(k);
    const std::vector<std::string> all = allgather_strings(comm.host(), run(comm, check.cases[k]));
    for (std::size_t r = 0; r < all.size(); ++r)
      if (!all[r].empty()) return CaseFailure{k, "rank " + std::to_string(r) + ": " + all[r]};  // every rank saw the same texts
  }
  return std::nullopt;
}

// The checks on one world of n ranks, in the order given, each check's cases in turn, on one
// communicator: a plugin's start-up (a TCP mesh, an NCCL communicator) is paid once a world, not once a
// check. Each check's row goes to `done` (on the thread of the rank that records) as it is decided. A
// check that ends in an exception (the plugin's own error, a timeout) ends that communicator, and the
// checks after it run on a new one. Returns why the rest cannot run, or "": the ranks did not start
// (the first check's row says so), or the launcher's world broke (a plugin left messages behind).
std::string run_checks_on_world(const Target& target, int n, const std::vector<const CommCheck*>& checks,
                                const ConformOptions& o, const std::function<void(std::size_t, ConformRow)>& done) {
  std::size_t next = 0;
  while (next < checks.size()) {
    std::mutex mutex;
    std::optional<std::size_t> current, in_flight;  // the check and case in progress (none: not begun)
    Clock::time_point started = Clock::now();
    bool finished = false;
    try {
      run_world(target, n, [&](Communicator& comm) {
        const bool recording = records(target, comm);
        for (std::size_t c = next; c < checks.size(); ++c) {
          const CommCheck& check = *checks[c];
          if (recording) {
            std::lock_guard lock(mutex);
            current = c;
            in_flight.reset();
            started = Clock::now();
          }
          const std::optional<CaseFailure> failed = run_cases(comm, check, [&](std::size_t k) {
            if (recording) {
              std::lock_guard lock(mutex);
              in_flight = k;
            }
          });
          if (recording && failed) {
            done(c, check_row(target, n, check, o, true, failed->at, failed->what, seconds_since(started)));
          } else if (recording) {
            const std::optional<CheckConclusion> last = check.conclude ? check.conclude() : std::nullopt;
            ConformRow row = check_row(target, n, check, o, last && last->failed, last ? std::optional(last->at) : std::nullopt,
                                       last ? last->what : "", seconds_since(started));
            if (last && !last->failed) {
              row.verdict = ConformVerdict::switches;
              row.detail = "N = " + std::to_string(n) + ", " + last->what;
            }
            done(c, row);
          }
        }
        if (recording) {
          std::lock_guard lock(mutex);
          finished = true;
        }
      });
      next = checks.size();
    } catch (const std::exception& e) {
      if (finished) throw;  // every check was decided: an error at the end of the world is the run's own
      if (!current) {
        done(next, check_row(target, n, *checks[next], o, true, std::nullopt, e.what(), seconds_since(started)));
        return "the plugin's communicator did not start at '" + checks[next]->name + "' (its failure says why)";
      }
      done(*current, check_row(target, n, *checks[*current], o, true, in_flight.value_or(0), e.what(),
                               seconds_since(started)));
      next = *current + 1;
      if (target.process_world) {
        try {
          target.process_world->barrier();
        } catch (const std::exception&) {
          return "the ranks' world broke at '" + checks[*current]->name + "' (its failure says why)";
        }
      }
    }
  }
  return "";
}

std::string covered_text(const std::vector<CommCase>& cases, std::size_t element) {
  std::size_t most = 0;
  for (const CommCase& c : cases) most = std::max(most, c.count);
  const std::size_t bytes = most * element;
  const std::string size = bytes >= (std::size_t{1} << 20) ? std::to_string(bytes >> 20) + " MiB"
                                                            : std::to_string(bytes >> 10) + " KiB";
  return std::to_string(cases.size()) + " cases, counts 0.." + std::to_string(most) + " (" + size +
         "), offsets 0, 1, 3";
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
  c.dtype = dtype_of<T>();
  c.promise = std::string("every rank holds the root's buffer, from every root") +
              (is_16bit_v<T> ? ", bit for bit, whatever the patterns mean (NaN payloads, -0, subnormals, infinities)" : "");
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
        for (std::size_t i = 0; i < k.count; ++i) buf[i] = moved_value<T>(k.root + 1, i);
      comm.broadcast(arena->place(comm, k), k.count, dtype_of<T>(), k.root);
      arena->fetch(comm);
      std::string bad = compare(buf, k.count, [&](std::size_t i) { return moved_value<T>(k.root + 1, i); },
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
  c.dtype = dtype_of<T>();
  c.promise = std::string("rank r's block lands at r * count on every rank, in rank order") +
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
        std::string bad = compare(recv + static_cast<std::size_t>(r) * k.count, k.count,
                                  [&](std::size_t i) { return moved_value<T>(r, i); }, what.c_str());
        if (!bad.empty()) return bad;
      }
      std::string bad = recv_arena->guards(k, total);
      return bad.empty() ? send_arena->guards(k, k.count) : bad;
    });
  };
  return c;
}

// Where rank r's result (known to differ, by its hash) first differs from rank 0's: every rank's buffer
// gathered over dpcheck's own transport (collective: every rank calls it), the element, both values and
// how many ulps apart they are.
template <class T> std::string first_rank_difference(Communicator& comm, const T* buf, std::size_t count, std::size_t r) {
  std::vector<T> all(count * static_cast<std::size_t>(comm.size()));
  comm.host().allgather(buf, all.data(), count * sizeof(T), DType::u8);
  const T* zero = all.data();
  const T* other = all.data() + r * count;
  for (std::size_t i = 0; i < count; ++i)
    if (std::memcmp(&zero[i], &other[i], sizeof(T)) != 0)
      return "rank " + std::to_string(r) + "'s result differs from rank 0's: element " + std::to_string(i) + " is " +
             value_text(other[i]) + " on rank " + std::to_string(r) + ", " + value_text(zero[i]) + " on rank 0" +
             distance_text(other[i], zero[i]);
  return "rank " + std::to_string(r) + "'s result hashes differently from rank 0's";
}

// Rank `stream`'s random input at element i: over 2^-20..2^20 in float32 and float64; in bfloat16 and
// float16 over 2^-8..2^7, where a sum of a few thousand ranks stays inside float16's range and every
// value inside its normal one, so that the order of the additions shows in the last bits.
template <class T> T random_input(std::uint64_t key, std::uint64_t stream, std::size_t i) {
  const double unit = random_unit(key, stream, 2 * i) * 2 - 1;
  const std::uint64_t bits = random_u64(key, stream, 2 * i + 1);
  if constexpr (is_16bit_v<T>) return narrow16<T>(static_cast<float>(std::ldexp(unit, static_cast<int>(bits % 16) - 8)));
  else return static_cast<T>(std::ldexp(unit, static_cast<int>(bits % 41) - 20));
}

// Random inputs over many binades: a correct backend's ranks hold the same bits, and a second call
// on the same inputs gives them again. The cases' counts rise, so the first that fails is the minimal
// one, in the 16-bit formats as in float32 and float64.
// The largest count at which run-to-run calls the all-reduce N more times rather than once more.
constexpr std::size_t kRunToRunAllRotations = 1024;

template <class T>
CommCheck identical_bits_check(ReduceOp op, bool twice, std::uint64_t seed, const std::vector<CommCase>& cases,
                               bool same_inputs) {
  CommCheck c;
  c.section = "determinism";
  c.name = std::string(twice ? "run-to-run " : "same bits on every rank ") + std::string(dtype_name(dtype_of<T>())) +
           " " + std::string(reduce_op_name(op));
  c.dtype = dtype_of<T>();
  c.op = op;
  c.promise = twice ? "the same inputs give the same bits on every later run (N more up to 1024 elements, one above)"
                    : "every rank holds the same bits (random inputs, whose sum depends on the order)";
  c.cases = cases;
  c.covered = covered_text(cases, sizeof(T)) + (is_16bit_v<T> ? ", random inputs over 2^-8..2^7" : ", random inputs over 2^-20..2^20");
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
          first_bad = compare(buf, k.count, [&](std::size_t i) { return kept[i]; }, run.c_str());
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

// ---- the schedule a backend claims (--schedule) ---------------------------------------------------

template <class T> constexpr Precision format_of() {
  if constexpr (std::is_same_v<T, Bf16>) return Precision::bf16;
  else if constexpr (std::is_same_v<T, Fp16>) return Precision::fp16;
  else return Precision::fp32;
}

template <class T> T of_float(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return narrow16<T>(v);
}

// What rank r contributes at element i of a schedule case: a value of the format over 2^-6..2^7, either
// sign, so that the grouping of the additions shows in the last bits of the sum.
float schedule_input(std::uint64_t key, int rank, std::size_t i, Precision format) {
  const auto stream = static_cast<std::uint64_t>(rank);
  const std::uint64_t bits = random_u64(key, stream, 2 * i + 1);
  const double v = std::ldexp(1 + random_unit(key, stream, 2 * i), static_cast<int>(bits % 13) - 6);
  return round_to_precision(static_cast<float>((bits >> 32) & 1 ? -v : v), format);
}

// Every rank's inputs of a case, as each rank computes them for itself.
std::vector<std::vector<float>> schedule_inputs(std::uint64_t key, int n, std::size_t count, Precision format) {
  std::vector<std::vector<float>> in(static_cast<std::size_t>(n), std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) in[static_cast<std::size_t>(r)][i] = schedule_input(key, r, i, format);
  return in;
}

// Every schedule dpcheck emulates in `format` (sum or avg), hierarchical with every group size from 2 to
// N - 1, or to `most_group` (the fingerprint's candidates, and where a switch may go, with groups to 8:
// rank 0 emulates each on every case).
std::vector<reference::ScheduleOptions> emulated_schedules(int n, Precision format, bool average,
                                                           int most_group = std::numeric_limits<int>::max()) {
  std::vector<reference::ScheduleOptions> out;
  for (const reference::ScheduleRow& row : reference::allreduce_schedules()) {
    reference::ScheduleOptions o;
    o.schedule = row.schedule;
    o.format = format;
    o.average = average;
    if (row.schedule != reference::AllreduceSchedule::hierarchical) {
      out.push_back(o);
      continue;
    }
    for (int g = 2; g < n && g <= most_group; ++g) {
      o.group_size = g;
      out.push_back(o);
    }
  }
  return out;
}

// "2 to 3", "7", "2, 5 and 9": counts for a report.
std::string counts_text(std::vector<std::size_t> counts) {
  std::sort(counts.begin(), counts.end());
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  if (counts.size() == 1) return std::to_string(counts[0]);
  if (counts.back() - counts.front() + 1 == counts.size())
    return std::to_string(counts.front()) + " to " + std::to_string(counts.back());
  std::string text;
  for (std::size_t k = 0; k < counts.size(); ++k)
    text += (k == 0 ? "" : k + 1 == counts.size() ? " and " : ", ") + std::to_string(counts[k]);
  return text;
}

// What one case of a schedule check saw: whether the claimed schedule's bits came back, and which
// other emulated schedules' bits equal what came back.
struct ScheduleSeen {
  std::size_t count = 0;
  bool claimed = false;
  std::set<std::string> others;
  std::string difference;  // where the claimed schedule's bits were left: "element 1 is ..., the ring schedule gives ..."
};

// The cases rank 0 saw, for the check's conclusion (rank 0 alone classifies them: every rank holds the
// same bits by then, and the other ranks go on to the next case instead of emulating every schedule).
struct ScheduleLog {
  std::mutex mutex;
  std::map<int, std::shared_ptr<std::vector<ScheduleSeen>>> by_rank;
};

// The run's cases taken together. A call that left the claimed schedule but gave another's bits
// exactly is a switch when the claimed schedule was followed, where it is told apart from that other
// one, at every count on one side of those calls (a switch by size); anything else fails.
std::optional<CheckConclusion> conclude_schedule(const std::vector<ScheduleSeen>& seen, const std::string& claimed) {
  std::vector<std::size_t> left;  // the cases that left the claimed schedule
  for (std::size_t k = 0; k < seen.size(); ++k)
    if (!seen[k].claimed) left.push_back(k);
  if (left.empty()) return std::nullopt;
  std::set<std::string> targets = seen[left[0]].others;
  for (std::size_t k : left) {
    std::set<std::string> both;
    std::set_intersection(targets.begin(), targets.end(), seen[k].others.begin(), seen[k].others.end(),
                          std::inserter(both, both.begin()));
    targets = both;
  }
  std::vector<std::size_t> left_counts;
  for (std::size_t k : left) left_counts.push_back(seen[k].count);
  const std::size_t first = left[0];
  const std::string prefix = "rank 0: " + seen[first].difference + "; ";
  if (targets.empty())
    return CheckConclusion{true, first,
                           prefix + "the calls that leave it (counts " + counts_text(left_counts) +
                               ") give no one other schedule's bits, so this is no switch of algorithm"};
  // Each target on its own: the claim must hold, where it is told apart from that target, at every
  // count on one side of the calls that left it.
  bool none_told_apart = true;
  for (const std::string& target : targets) {
    std::vector<std::size_t> kept;  // counts where the claim held and the target gives other bits
    for (const ScheduleSeen& c : seen)
      if (c.claimed && !c.others.contains(target)) kept.push_back(c.count);
    if (kept.empty()) continue;
    none_told_apart = false;
    const auto extremes = std::minmax_element(kept.begin(), kept.end());
    const std::size_t low = *extremes.first, high = *extremes.second;  // clang 14 captures no structured binding
    const bool below = std::all_of(left_counts.begin(), left_counts.end(), [&](std::size_t c) { return c < low; });
    const bool above = std::all_of(left_counts.begin(), left_counts.end(), [&](std::size_t c) { return c > high; });
    if (!below && !above) continue;
    return CheckConclusion{false, 0,
                           "the library does not follow " + claimed + " at count" + (left_counts.size() == 1 ? " " : "s ") +
                               counts_text(left_counts) + ": it switches to " + target +
                               " there (its bits at every element); " + claimed +
                               "'s own bits, told apart from those, at every count drawn " +
                               (below ? "from " + std::to_string(low) + " up" : "up to " + std::to_string(high))};
  }
  std::string names;  // "halving-doubling", or "halving-doubling or hierarchical:2"
  for (const std::string& t : targets) names += (names.empty() ? "" : " or ") + t;
  if (none_told_apart)
    return CheckConclusion{true, first,
                           prefix + "the all-reduce gives the bits of the " + names + " schedule at every count drawn, and " +
                               claimed + "'s only where they agree: it follows " + names + ", not " + claimed};
  return CheckConclusion{true, first,
                         prefix + "it gives " + names + "'s bits at counts " + counts_text(left_counts) + " and " + claimed +
                             "'s at counts on both sides of them, which is no switch by size"};
}

// The backend's bits against the schedule's emulation (reference/allreduce_schedule.hpp): every rank
// must hold the same bits, and they must be the schedule's, or, where the library switches algorithm
// by size, another emulated schedule's exactly (conclude_schedule). A call that gives no emulated
// schedule's bits fails at once, naming the first element that differs, with both values.
template <class T> CommCheck schedule_check(ReduceOp op, reference::ScheduleOptions schedule, std::uint64_t seed, int n,
                                           const std::vector<CommCase>& cases) {
  schedule.format = format_of<T>();
  schedule.average = op == ReduceOp::avg;
  const std::string name = reference::schedule_text(schedule);
  CommCheck c;
  c.section = "schedule";
  c.name = "schedule " + std::string(dtype_name(dtype_of<T>())) + " " + std::string(reduce_op_name(op));
  c.dtype = dtype_of<T>();
  c.op = op;
  c.promise = "the all-reduce gives the bits of the schedule it claims, " + name +
              " (random inputs, whose sum depends on the grouping of the additions)";
  c.cases = cases;
  c.covered = covered_text(cases, sizeof(T)) + ", random inputs over 2^-6..2^7, bit for bit against the " + name +
              " schedule's emulation";
  auto log = std::make_shared<ScheduleLog>();
  c.make = [op, schedule, seed, n, name, log] {
    auto arena = std::make_shared<Arena<T>>();
    auto mine = std::make_shared<std::vector<ScheduleSeen>>();
    return CaseFn([arena, mine, log, op, schedule, seed, n, name](Communicator& comm, const CommCase& k) -> std::string {
      if (mine->empty()) {
        std::lock_guard lock(log->mutex);
        log->by_rank[comm.rank()] = mine;
      }
      T* buf = arena->prepare(k, k.count);
      const std::vector<std::vector<float>> in = schedule_inputs(mix_key(seed ^ 0x5c4edu, k.count), n, k.count, schedule.format);
      for (std::size_t i = 0; i < k.count; ++i) buf[i] = of_float<T>(in[static_cast<std::size_t>(comm.rank())][i]);
      comm.allreduce(arena->place(comm, k), k.count, dtype_of<T>(), op);
      arena->fetch(comm);
      const std::vector<std::uint64_t> hashes = comm.host().allgather_value(hash_bytes(buf, k.count * sizeof(T)));
      for (std::size_t r = 0; r < hashes.size(); ++r)
        if (hashes[r] != hashes[0]) return first_rank_difference(comm, buf, k.count, r);
      if (comm.rank() != 0) return arena->guards(k, k.count);
      const auto same = [&](const std::vector<float>& want) {
        for (std::size_t i = 0; i < k.count; ++i) {
          const T w = of_float<T>(want[i]);
          if (std::memcmp(&buf[i], &w, sizeof(T)) != 0) return i;
        }
        return k.count;
      };
      ScheduleSeen seen;
      seen.count = k.count;
      const std::vector<float> want = reference::emulate_allreduce(schedule, in);
      const std::size_t differs = same(want);
      seen.claimed = differs == k.count;
      for (const reference::ScheduleOptions& other : emulated_schedules(n, schedule.format, schedule.average, 8))
        if (same(reference::emulate_allreduce(other, in)) == k.count) seen.others.insert(reference::schedule_text(other));
      seen.others.erase(name);
      if (!seen.claimed) {
        const T w = of_float<T>(want[differs]);
        seen.difference = "element " + std::to_string(differs) + " is " + value_text(buf[differs]) + ", the " + name +
                          " schedule gives " + value_text(w) + distance_text(buf[differs], w);
        if (seen.others.empty()) return seen.difference + " (nor are the bits those of another schedule dpcheck emulates)";
      }
      mine->push_back(std::move(seen));
      return arena->guards(k, k.count);
    });
  };
  c.conclude = [log, name]() -> std::optional<CheckConclusion> {
    std::lock_guard lock(log->mutex);
    if (log->by_rank.empty()) return std::nullopt;
    return conclude_schedule(*log->by_rank.begin()->second, name);
  };
  return c;
}

// The schedules whose bits a float32 sum of random inputs matches, for the fingerprint: "ring",
// "tree or halving-doubling", or "none of rank-order, ring, ...". Hierarchical is tried with every group
// size from 2 to N - 1.
std::string schedule_fingerprint(Communicator& comm, int n, std::uint64_t seed) {
  const std::size_t count = 64 * static_cast<std::size_t>(n) + 7;
  const std::vector<std::vector<float>> in = schedule_inputs(mix_key(seed ^ 0xf1a9u, count), n, count, Precision::fp32);
  std::vector<float> buf = in[static_cast<std::size_t>(comm.rank())];
  on_buffer(comm, buf, [&](float* placed) { comm.allreduce(placed, buf.size(), DType::f32, ReduceOp::sum); });
  std::string fits, tried;
  for (const reference::ScheduleOptions& o : emulated_schedules(n, Precision::fp32, false)) {
    const std::string text = reference::schedule_text(o);
    tried += (tried.empty() ? "" : ", ") + text;
    if (std::memcmp(reference::emulate_allreduce(o, in).data(), buf.data(), count * sizeof(float)) == 0)
      fits += (fits.empty() ? "" : " or ") + text;
  }
  return fits.empty() ? "random inputs: the bits of no schedule dpcheck emulates (" + tried + ")"
                      : "random inputs: the bits of the " + fits + " schedule";
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

// The probes in float32, and in float64 where the plugin takes float64 sums (a plugin that declares no
// float32 sum gets an "unsupported" row before this runs).
ConformRow fingerprint_row(const Target& target, int n, const dpcheck_comm_plugin_t* plugin, const ConformOptions& o) {
  ConformRow row;
  row.section = "fingerprint";
  row.check = "summation order and width";
  row.verdict = ConformVerdict::info;
  if (n < 3) {
    row.detail = "needs 3 ranks or more (with fewer, every order of addition gives the same sum)";
    return row;
  }
  const bool f64 = !plugin || comm_plugin_supports(*plugin, DType::f64, ReduceOp::sum);
  const auto t0 = Clock::now();
  std::mutex mutex;
  try {
    run_world(target, n, [&](Communicator& comm) {
      std::string text = fingerprint<float>(comm, n);
      if (f64) text += "; " + fingerprint<double>(comm, n);
      text += "; " + schedule_fingerprint(comm, n, o.seed);
      if (records(target, comm)) {
        std::lock_guard lock(mutex);
        row.detail = text;
      }
    });
  } catch (const std::exception& e) {
    const std::size_t probes = static_cast<std::size_t>(n) * static_cast<std::size_t>(n - 1) * static_cast<std::size_t>(n - 2);
    row.verdict = ConformVerdict::fail;
    row.promise = "the probes' all-reduce completes";
    row.detail = "N = " + std::to_string(n) + ", " + e.what();
    row.minimal = "the probes' all-reduce sum of " + std::to_string(probes) + " elements (float32" +
                  (f64 ? std::string(", then float64") : std::string()) + "), the check's one case";
    row.replay = o.replay_prefix + (target.process_world ? std::string() : " --world-size " + std::to_string(n)) +
                 " --check '" + row.check + "'";
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
  for (const char* d : {"float32", "float64", "bfloat16", "float16"})
    for (const char* op : {"sum", "avg"}) {
      names.push_back(std::string("same bits on every rank ") + d + " " + op);
      names.push_back(std::string("run-to-run ") + d + " " + op);
    }
  // With --schedule: the bits of the schedule the backend claims.
  for (const char* d : {"float32", "bfloat16", "float16"})
    for (const char* op : {"sum", "avg"}) names.push_back(std::string("schedule ") + d + " " + op);
  names.push_back("a rank that never arrives");
  names.push_back("summation order and width");
  return names;
}

bool is_allreduce_check(const std::string& name) {
  return name.starts_with("allreduce ") || name.starts_with("same bits on every rank ") || name.starts_with("run-to-run ") ||
         name.starts_with("schedule ") || name == "summation order and width";
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

std::size_t conform_case_count(const std::string& check, const std::string& case_text) {
  if (case_text.empty() || check.empty() || check.starts_with("property ")) return 0;
  return parse_case(case_text, check.starts_with("broadcast"), check).count;
}

namespace {

constexpr std::size_t kAll = std::numeric_limits<std::size_t>::max();
constexpr std::size_t kSmall = std::size_t{1} << 20;  // elements: the cap of every check but sum's

// How far each run goes, in elements. --thorough: every check but the sums and allgathers to 2^20 on
// the main world, and every check to 2^20 on the other worlds. The quick default keeps every kind of
// case (tails, chunk edges, primes, the neighbours of powers of two, every world size) but stops
// sooner: 2^18 on the main world, 2^14 on the others; the sums and allgathers still reach --max-mib.
std::size_t small_cap(const ConformOptions& o) { return o.thorough ? kSmall : std::size_t{1} << 18; }
std::size_t other_world_cap(const ConformOptions& o) { return o.thorough ? kSmall : std::size_t{1} << 14; }
int log2_of(std::size_t power) { return std::countr_zero(power); }

// The check `name` for a world of n ranks, its counts capped at `cap` elements (and options.max_bytes),
// or the one case options.case_text gives. nullopt for a name that is not a collective check.
std::optional<CommCheck> make_check(const std::string& name, int n, std::size_t cap, const ConformOptions& o) {
  const auto cases = [&](std::size_t element, std::size_t limit, bool with_root) {
    if (!o.case_text.empty()) return std::vector<CommCase>{parse_case(o.case_text, with_root, name)};
    return cases_of(interesting_counts(n, std::min({cap, limit, o.max_bytes / element})));
  };
  const auto un = static_cast<std::size_t>(n);
  const std::size_t small = small_cap(o);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max}) {
    const std::string suffix = " " + std::string(reduce_op_name(op));
    const std::size_t limit = op == ReduceOp::sum ? kAll : small;
    const bool allowance_16bit = mutant_conform_avg_allowance_16bit(o.mutant);
    if (name == "allreduce float32" + suffix) return allreduce_check<float>(op, n, cases(4, limit, false), allowance_16bit);
    if (name == "allreduce float64" + suffix) return allreduce_check<double>(op, n, cases(8, limit, false), allowance_16bit);
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
  if (name.starts_with("schedule ")) {
    if (o.schedule.empty()) return std::nullopt;
    const reference::ScheduleOptions schedule = reference::parse_schedule(o.schedule);
    // Each rank computes every rank's inputs and the emulation: counts to 2^16.
    const std::size_t limit = std::size_t{1} << 16;
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      const std::string suffix = " " + std::string(reduce_op_name(op));
      if (name == "schedule float32" + suffix) return schedule_check<float>(op, schedule, o.seed, n, cases(4, limit, false));
      if (name == "schedule bfloat16" + suffix) return schedule_check<Bf16>(op, schedule, o.seed, n, cases(2, limit, false));
      if (name == "schedule float16" + suffix) return schedule_check<Fp16>(op, schedule, o.seed, n, cases(2, limit, false));
    }
  }
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
      if (name == prefix + "float32" + suffix) return identical_bits_check<float>(op, twice, o.seed, cases(4, small, false), same_inputs);
      if (name == prefix + "float64" + suffix) return identical_bits_check<double>(op, twice, o.seed, cases(8, small, false), same_inputs);
      if (name == prefix + "bfloat16" + suffix) return identical_bits_check<Bf16>(op, twice, o.seed, cases(2, small, false), same_inputs);
      if (name == prefix + "float16" + suffix) return identical_bits_check<Fp16>(op, twice, o.seed, cases(2, small, false), same_inputs);
    }
  return std::nullopt;
}

// A check of something the plugin does not declare (include/dpcheck/plugin.h, "Capabilities"): not
// run, neither a pass nor a failure. "" when the plugin takes what the check asks.
std::string unsupported_reason(const dpcheck_comm_plugin_t& plugin, const std::string& path, const CommCheck& check) {
  if (!check.dtype) return "";
  if (check.op ? comm_plugin_supports(plugin, *check.dtype, *check.op) : comm_plugin_has_dtype(plugin, *check.dtype))
    return "";
  return comm_plugin_lacks(plugin, path, *check.dtype, check.op);
}

// What the fingerprint and the absent-rank probe ask: a float32 sum.
CommCheck fingerprint_needs() {
  CommCheck c;
  c.dtype = DType::f32;
  c.op = ReduceOp::sum;
  return c;
}

ConformRow unsupported_row(std::string section, std::string name, const std::string& why) {
  ConformRow row;
  row.section = std::move(section);
  row.check = std::move(name);
  row.verdict = ConformVerdict::unsupported;
  row.detail = "the plugin says so: " + why;
  return row;
}

}  // namespace

std::vector<std::string> conform_comm_suite() {
  std::vector<std::string> names;
  // Not the absent rank (a world of its own) nor the fingerprint (information); not an avg of int64,
  // which a plugin may declare and dpcheck's own backends refuse ("unsupported reductions throw"); not
  // the schedule checks, which need the schedule a backend claims.
  for (const std::string& name : conform_comm_checks())
    if (name != "a rank that never arrives" && name != "summation order and width" && name != "allreduce int64 avg" &&
        !name.starts_with("schedule "))
      names.push_back(name);
  for (const BackendCommCheck& b : backend_comm_checks()) names.emplace_back(b.name);
  return names;
}

std::string run_conform_comm_check(Communicator& comm, const std::string& name, const ConformOptions& o,
                                   std::string* replay) {
  const std::optional<CommCheck> check = make_check(name, comm.size(), kAll, o);
  if (!check) throw UsageError("'" + name + "' is not a check of conform_comm_suite()");
  // The row `dpcheck conform` prints for a failure at case `at` (ranks as threads).
  const auto replay_of = [&](std::size_t at, const std::string& what) {
    if (replay && comm.rank() == 0) *replay = check_row(Target{}, comm.size(), *check, o, true, at, what, 0).replay;
  };
  const std::optional<CaseFailure> failed = run_cases(comm, *check, [](std::size_t) {});
  if (failed) {
    replay_of(failed->at, failed->what);
    return "case " + check->cases[failed->at].text() + ", " + failed->what + " (the promise: " + check->promise + ")";
  }
  if (!check->conclude) return "";
  // The cases taken together (a schedule followed at some counts only): rank 0 recorded them, and its
  // word is every rank's. A switch by size is no failure.
  std::string concluded;
  if (comm.rank() == 0)
    if (const std::optional<CheckConclusion> c = check->conclude(); c && c->failed) {
      concluded = "case " + check->cases[c->at].text() + ", " + c->what + " (the promise: " + check->promise + ")";
      replay_of(c->at, c->what);
    }
  return allgather_strings(comm.host(), concluded)[0];
}

std::vector<ConformRow> conform_comm(const Target& target, int n, const ConformOptions& o) {
  check_conform_comm_selection(o.check, o.case_text);
  std::vector<ConformRow> rows;
  const auto emit = [&](ConformRow row) {
    if (o.on_row) o.on_row(row);
    rows.push_back(std::move(row));
  };
  const auto wanted = [&](const std::string& name) {
    if (o.allreduce_only && !name.starts_with("property ") && !is_allreduce_check(name)) return false;
    return o.check.empty() || o.check == name;
  };
  const dpcheck_comm_plugin_t* plugin = looks_like_plugin_path(target.comm) ? &load_comm_plugin(target.comm) : nullptr;
  // Once the ranks cannot start (the plugin's init fails) or the launcher's world is broken (a plugin
  // left messages behind), the later rows would fail for that same reason: they are not run, and say
  // which row to read.
  std::string stopped;
  const auto not_run_row = [&](const std::string& section, const std::string& name) {
    ConformRow row;
    row.section = section;
    row.check = name;
    row.verdict = ConformVerdict::skip;
    row.detail = "not run: " + stopped;
    return row;
  };
  const auto not_run = [&](const std::string& section, const std::string& name) { emit(not_run_row(section, name)); };

  // Every collective check, in order: its row when decided without running (unsupported), else its
  // check on the main world. A replayed case runs on the world it failed on (the command line's) alone.
  struct Slot {
    std::string name;
    std::optional<CommCheck> check;    // the main world's
    std::optional<ConformRow> row;     // decided
    double seconds = 0;                // on the other worlds
    std::vector<int> worlds;           // the other worlds it passed on
    std::string switched;              // the first other world's switch, "N = 8, the library does not ..."
  };
  std::vector<Slot> slots;
  for (const std::string& name : conform_comm_checks()) {
    if (!wanted(name)) continue;
    std::optional<CommCheck> check = make_check(name, n, kAll, o);
    if (!check) continue;
    Slot slot{name, std::nullopt, std::nullopt, 0, {}, {}};
    if (const std::string why = plugin ? unsupported_reason(*plugin, target.comm, *check) : ""; !why.empty())
      slot.row = unsupported_row(check->section, name, why);
    else
      slot.check = std::move(check);
    slots.push_back(std::move(slot));
  }
  std::size_t emitted = 0;
  const auto emit_ready = [&] {
    for (; emitted < slots.size() && slots[emitted].row; ++emitted) emit(*slots[emitted].row);
  };

  if (o.case_text.empty()) {
    // The other worlds first, smaller first (a failure there is the simpler case), at counts up to
    // other_world_cap; a check's first failure is its row. The quick default makes its 900 calls in a row
    // on the main world alone: what wraps there wraps in any world.
    std::vector<int> others = o.extra_world_sizes;
    std::sort(others.begin(), others.end());
    others.erase(std::unique(others.begin(), others.end()), others.end());
    others.erase(std::remove(others.begin(), others.end(), n), others.end());
    for (int w : others) {
      if (!stopped.empty()) break;
      std::vector<CommCheck> here;
      std::vector<std::size_t> slot_of;
      for (std::size_t i = 0; i < slots.size(); ++i) {
        if (slots[i].row || (!o.thorough && slots[i].name == "calls in a row")) continue;
        here.push_back(*make_check(slots[i].name, w, other_world_cap(o), o));
        slot_of.push_back(i);
      }
      std::vector<const CommCheck*> pointers;
      for (const CommCheck& c : here) pointers.push_back(&c);
      stopped = run_checks_on_world(target, w, pointers, o, [&](std::size_t k, ConformRow row) {
        Slot& slot = slots[slot_of[k]];
        slot.seconds += row.seconds;
        if (row.verdict == ConformVerdict::fail) {
          row.seconds = slot.seconds;
          slot.row = std::move(row);
        } else {
          if (row.verdict == ConformVerdict::switches && slot.switched.empty()) slot.switched = row.detail;
          slot.worlds.push_back(w);
        }
      });
    }
  }
  // Then the main world, each row printed as it is decided.
  if (stopped.empty()) {
    std::vector<const CommCheck*> pointers;
    std::vector<std::size_t> slot_of;
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (!slots[i].row) {
        pointers.push_back(&*slots[i].check);
        slot_of.push_back(i);
      }
    stopped = run_checks_on_world(target, n, pointers, o, [&](std::size_t k, ConformRow row) {
      Slot& slot = slots[slot_of[k]];
      row.seconds += slot.seconds;
      // A switch on another world is the row's word where the main world found none.
      if (row.verdict == ConformVerdict::pass && !slot.switched.empty()) {
        row.verdict = ConformVerdict::switches;
        row.detail = slot.switched + " (the main world, N = " + std::to_string(n) + ", follows the schedule throughout)";
      } else if (row.verdict == ConformVerdict::pass && !slot.worlds.empty()) {
        std::string others;
        for (int w : slot.worlds) others += (others.empty() ? "" : ", ") + std::to_string(w);
        row.detail = "N = " + std::to_string(n) + ": " + row.detail + "; also N = " + others + " (counts to 2^" +
                     std::to_string(log2_of(other_world_cap(o))) + ")";
      } else if (row.verdict == ConformVerdict::pass) {
        row.detail = "N = " + std::to_string(n) + ": " + row.detail;
      }
      slot.row = std::move(row);
      emit_ready();
    });
  }
  for (Slot& slot : slots)
    if (!slot.row) slot.row = not_run_row(slot.check->section, slot.name);
  emit_ready();
  if (wanted("a rank that never arrives")) {
    const std::string why = plugin ? unsupported_reason(*plugin, target.comm, fingerprint_needs()) : "";
    if (!why.empty()) emit(unsupported_row("robustness", "a rank that never arrives", why));
    else if (!stopped.empty()) not_run("robustness", "a rank that never arrives");
    else emit(absent_rank_row(n, o));
  }
  if (wanted("summation order and width")) {
    const std::string why = plugin ? unsupported_reason(*plugin, target.comm, fingerprint_needs()) : "";
    if (!why.empty()) emit(unsupported_row("fingerprint", "summation order and width", why));
    else if (!stopped.empty()) not_run("fingerprint", "summation order and width");
    else emit(fingerprint_row(target, n, plugin, o));
  }
  if (o.properties && (o.check.empty() || o.check.starts_with("property "))) {
    if (!stopped.empty()) {
      for (const PropertyDef& p : properties())
        if (wanted("property " + std::string(p.name))) not_run("properties", "property " + std::string(p.name));
    } else {
      for (ConformRow& row : conform_properties(target, o)) rows.push_back(std::move(row));  // on_row called there
    }
  }
  return rows;
}

}  // namespace dpcheck
