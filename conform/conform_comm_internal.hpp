// What the pieces of conform_comm (the communicator half of dpcheck conform) share: a case and a check,
// the arena a check's buffers sit in, and the functions one piece calls in another. Internal to
// conform/conform_comm*.cpp; nothing else includes it.
//
// The collectives are checked on inputs whose results are exact in any order of addition (small
// multiples of 1/4; in float64 and int64 also a high part float32 or a double could not carry; in
// bfloat16 and float16 small integers, exact even when rounded at every hop), so that a correct
// backend's results are known bit for bit whatever its algorithm, and compared bitwise on every rank.
// A plugin of ABI 1 has no 16-bit dtypes: their rows are skipped, saying so. Each buffer sits at an element offset
// inside a larger allocation whose guard elements must come back untouched, and one allocation per rank serves every
// case of a check, so that a backend caching something by address meets reuse. Counts run from 0 through N-1, N, N+1,
// primes, powers of two and their neighbours up to the largest buffer; the first failing case, in that order, is the
// minimal one. Exactness hides one failure: ranks that sum in different orders agree on exact inputs. So random inputs
// check that every rank holds the same bits, and that a second run gives them again.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "conform/conform.hpp"
#include "src/error.hpp"
#include "src/low_precision.hpp"
#include "src/target/cuda_plugin.hpp"
#include "src/target/plugin_comm.hpp"
#include "src/train/replica_check.hpp"

namespace dpcheck {
namespace conform_comm_detail {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0);  // conform_comm.cpp

// ---- cases (conform_comm_checks.cpp) -------------------------------------------------------------

struct CommCase {
  std::size_t count = 0;
  std::size_t offset = 0;  // elements past the start of the rank's allocation
  int root = -1;           // broadcast's root; -1 for the other collectives
  std::string text() const {
    return "count=" + std::to_string(count) + " offset=" + std::to_string(offset) +
           (root >= 0 ? " root=" + std::to_string(root) : std::string());
  }
};

// The case --case gives ("count=5 offset=1", with root=R for a broadcast), or a UsageError naming what
// `check` takes.
CommCase parse_case(const std::string& text, bool with_root, const std::string& check);

// ---- values: their text, the poison around them, the arena they sit in ---------------------------

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
      if (std::memcmp(&data[i], &p, sizeof(T)) != 0)
        return "wrote before the buffer (element -" + std::to_string(c.offset - i) + ")";
    for (std::size_t i = 0; i < kGuard; ++i)
      if (std::memcmp(&data[c.offset + count + i], &p, sizeof(T)) != 0)
        return "wrote past the end of the buffer (element " + std::to_string(count + i) + " of " +
               std::to_string(count) + ")";
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

// Where rank r's result (known to differ, by its hash) first differs from rank 0's: every rank's buffer
// gathered over dpcheck's own transport (collective: every rank calls it), the element, both values and
// how many ulps apart they are.
template <class T>
std::string first_rank_difference(Communicator& comm, const T* buf, std::size_t count, std::size_t r) {
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

// ---- one check ---------------------------------------------------------------------------------------

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

// A passing row's detail: how many cases, the largest count and its bytes, the offsets.
std::string covered_text(const std::vector<CommCase>& cases, std::size_t element);

// ---- making a check by its name (conform_comm_checks.cpp, conform_comm_schedule.cpp) --------------

constexpr std::size_t kAll = std::numeric_limits<std::size_t>::max();
constexpr std::size_t kSmall = std::size_t{1} << 20;  // elements: the cap of every check but sum's

// How far each run goes, in elements. --thorough: every check but the sums and allgathers to 2^20 on
// the main world, and every check to 2^20 on the other worlds. The quick default keeps every kind of
// case (tails, chunk edges, primes, the neighbours of powers of two, every world size) but stops
// sooner: 2^18 on the main world, 2^14 on the others; the sums and allgathers still reach --max-mib.
std::size_t small_cap(const ConformOptions& o);
std::size_t other_world_cap(const ConformOptions& o);

// The check `name` for a world of n ranks, its counts capped at `cap` elements (and options.max_bytes),
// or the one case options.case_text gives. nullopt for a name that is not a collective check.
std::optional<CommCheck> make_check(const std::string& name, int n, std::size_t cap, const ConformOptions& o);

// The cases of the check `name` on elements of `element` bytes: options.case_text's one case, or the
// interesting counts up to `cap`, `limit` and options.max_bytes, each at its offset.
std::vector<CommCase> check_cases(const std::string& name, int n, std::size_t cap, const ConformOptions& o,
                                  std::size_t element, std::size_t limit, bool with_root);

// make_check for the schedule checks ("schedule float32 sum"): nullopt without --schedule.
std::optional<CommCheck> make_schedule_check(const std::string& name, int n, std::size_t cap, const ConformOptions& o);

// ---- the fingerprint and a rank that never arrives (conform_comm_schedule.cpp) ---------------------

// The fingerprint's row (information): how the backend sums, from probes whose sum shows the order.
ConformRow fingerprint_row(const Target& target, int n, const dpcheck_comm_plugin_t* plugin, const ConformOptions& o);

// The absent-rank probe's row: options.absent_rank_command run as a child, which must end in an error
// within the timeout rather than hang (conform_absent_rank_probe is what it runs).
ConformRow absent_rank_row(int n, const ConformOptions& o);

}  // namespace conform_comm_detail
}  // namespace dpcheck
