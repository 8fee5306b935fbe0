// The Communicator conformance suite for the tests: the checks of conform/conform_comm.cpp
// (conform_comm_suite: the checks `dpcheck conform` runs against a plugin, and the promises only
// dpcheck's own backends make), one GoogleTest test per check, run by each backend's test on its own
// worlds -- tests/local_comm_test.cpp for N = 1..8 ranks as threads, tests/mpi_comm_test.cpp on the
// world mpirun started, the GPU backends' tests through a wrapper that stages host buffers. A check is
// written once, in conform/, and runs both here and in `dpcheck conform`.
//
// A check runs on every rank and returns, on every rank alike, "" or its first failing case and what
// the first failing rank saw; rank 0 reports it as a GoogleTest failure. The one check here is of the
// tests' own wrappers (a host-memory communicator is its own host), not a promise a plugin makes.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "conform/conform.hpp"
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

// Random floats over many binades, so that the order of additions changes the rounded result. A pure
// function of (rank, len): any rank can compute every rank's input. For the 16-bit formats, rounded to
// the format, over binades it holds (float16's up to 2^10, so that sums of 8 stay finite). The tests
// that compare one backend's bits with another's, or a mutant's with the backend's, sum these.
template <class T> std::vector<T> awkward_values(int rank, std::size_t len) {
  std::mt19937_64 gen(1234 + static_cast<std::uint64_t>(rank));
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  const int range = std::is_same_v<T, Fp16> ? 10 : 30;
  std::uniform_int_distribution<int> expo(-range, range);
  std::vector<T> v(len);
  for (T& x : v) {
    const double d = std::ldexp(mant(gen), expo(gen));
    if constexpr (is_16bit_v<T>) x = narrow16<T>(static_cast<float>(d));
    else x = static_cast<T>(d);
  }
  return v;
}

// ---- the suite ------------------------------------------------------------------------------------

// The options the tests run conform's checks with: buffers up to 64 KiB, past the host backends' last
// algorithm threshold (N chunks of 4 KiB: 32 KiB at 8 ranks; src/comm/collective.cpp) with every count
// around it, the quick sweep, the default seed. (Each test runs its check on 8 worlds; 512 KiB took
// eight times as long for the same thresholds.)
inline ConformOptions suite_options() {
  ConformOptions o;
  o.max_bytes = std::size_t{64} << 10;
  return o;
}

// Runs conform's check `check` on c (every rank calls it); rank 0 reports a failure.
inline void run_check(Communicator& c, const std::string& check) {
  const std::string failure = run_conform_comm_check(c, check, suite_options());
  if (!failure.empty() && c.rank() == 0) ADD_FAILURE() << where(c) << ", " << check << ": " << failure;
}

// The tests' own wrappers: a host-memory communicator is its own host (the GPU backends' tests run the
// suite through a wrapper that is one).
inline void host_memory_and_its_own_host(Communicator& c) {
  EXPECT_EQ(c.memory_space(), MemorySpace::host) << where(c);
  EXPECT_EQ(&c.host(), &c) << where(c);
}

struct ConformanceCheck {
  std::string name;   // the GoogleTest parameter name: "AllreduceFloat32Sum"
  std::string check;  // conform's name of the check ("allreduce float32 sum"); empty for a test-only one
  std::function<void(Communicator&)> run;
};

inline void PrintTo(const ConformanceCheck& check, std::ostream* os) { *os << check.name; }

// "allreduce float32 sum" -> "AllreduceFloat32Sum"; "16-bit sums ..." -> "SixteenBitSums..."
inline std::string test_name(const std::string& check) {
  std::string name;
  bool upper = true;
  std::string text = check.starts_with("16-bit") ? "sixteen bit" + check.substr(6) : check;
  for (const char ch : text) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) {
      upper = true;
      continue;
    }
    name += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch;
    upper = false;
  }
  return name;
}

// Every check of conform_comm_suite(), then the test-only one.
inline const std::vector<ConformanceCheck>& conformance_checks() {
  static const std::vector<ConformanceCheck> checks = [] {
    std::vector<ConformanceCheck> all;
    for (const std::string& check : conform_comm_suite())
      all.push_back({test_name(check), check, [check](Communicator& c) { run_check(c, check); }});
    all.push_back({"HostMemoryAndItsOwnHost", "", host_memory_and_its_own_host});
    return all;
  }();
  return checks;
}

inline std::string check_name(const testing::TestParamInfo<ConformanceCheck>& info) { return info.param.name; }

}  // namespace dpcheck::conformance
