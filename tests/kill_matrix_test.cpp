// The kill matrix: every property against every mutant. Each mutant must be caught by the property
// aimed at it, with a counterexample shrunk to a small case; the correct implementation must pass
// every property. A check that no mutant can make fail would prove nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>

#include "mutants/mutants.hpp"
#include "properties/runner.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

constexpr int kCases = 100;
constexpr std::uint64_t kSeed = 20261129;

// Properties whose cases launch processes run fewer cases (case_divisor). Against a mutant aimed at
// another property a property runs a tenth of its cases, unshrunk (or, if its cases launch processes,
// none): that cell of the matrix is shown, not judged, and full runs of every other property made each
// row cost two and a half times as much (resume-cleanup-every-rank: 64 s of CPU time, 26 s with a tenth).
RunOptions options(const PropertyDef& p, bool aimed = true) {
  RunOptions o;
  o.cases = std::max(1, kCases / p.case_divisor / (aimed ? 1 : 10));
  o.seed = kSeed;
  o.shrink = aimed;
  return o;
}

TEST(KillMatrix, CorrectImplementationPassesEveryProperty) {
  for (const PropertyDef& p : properties()) {
    const PropertyResult r = run_property(p, Target{}, options(p));
    EXPECT_TRUE(r.passed) << p.name << ": " << r.failure << "\n" << r.counterexample;
    if (!r.skipped.empty()) {
      std::printf("%s skipped: %s\n", std::string(p.name).c_str(), r.skipped.c_str());
      continue;
    }
    EXPECT_EQ(r.cases, options(p).cases) << p.name;
    // The run-level floors hold on correct code, and are judged: a check with a power share must have
    // probed enough cases to be held to it, and one with a tightness floor must come that close to
    // its bound on some case (else a loosened bound would pass here unseen).
    if (p.min_power > 0) {
      EXPECT_GE(r.probed, min_probed_cases) << p.name;
      EXPECT_GE(r.power(), p.min_power) << p.name << ": " << r.probe_caught << " of " << r.probed;
    }
    if (p.min_tightness > 0) {
      EXPECT_GE(r.cases, min_tightness_cases) << p.name;
      EXPECT_GE(std::max(r.tightness[0], r.tightness[1]), 0.0) << p.name << ": no path measured";
      for (const double t : r.tightness)
        if (t >= 0) {
          EXPECT_GE(t, p.min_tightness) << p.name;
        }
    }
  }
}

class KillMatrix : public testing::TestWithParam<MutantInfo> {};

}  // namespace

// GoogleTest names a parameter by printing it.
void PrintTo(const MutantInfo& m, std::ostream* os) { *os << m.name; }

namespace {

TEST_P(KillMatrix, MutantIsCaughtByItsPropertyAndShrunk) {
  const MutantInfo& m = GetParam();
  // Mutants of a GPU kernel need the cuda engine: tests/gpu_properties_test.cpp runs them on a GPU.
  if (!m.engine.empty() && m.engine != "cpu") GTEST_SKIP() << m.name << " breaks the " << m.engine << " engine";
  Target target;
  target.mutant = std::string(m.name);
  if (!m.precision.empty()) target.precision = parse_precision(m.precision);
  std::string row = std::string(m.name) + ":";
  bool caught_by_aimed = false;
  for (const PropertyDef& p : properties()) {
    const bool aimed = p.name == m.caught_by;
    // A property whose cases launch processes runs only where it is aimed: a tenth of its cases is still
    // a launch of every rank, a second or more, for a cell that is shown and not judged.
    if (!aimed && p.case_divisor > 1) {
      row += " " + std::string(p.name) + "=not run";
      continue;
    }
    const PropertyResult r = run_property(p, target, options(p, aimed));
    row += std::string(" ") + std::string(p.name) +
           (!r.skipped.empty() ? "=skipped"
            : r.passed         ? "=survived"
                               : "=KILLED");
    if (!aimed) continue;
    if (!r.skipped.empty()) GTEST_SKIP() << p.name << " cannot run here: " << r.skipped;
    caught_by_aimed = !r.passed;
    ASSERT_FALSE(r.passed) << m.name << " survived " << p.name;
    if (r.counterexample.empty()) {
      // A verdict on the whole run (a check that lost its power, a bound grown loose): no case to shrink.
      EXPECT_TRUE(r.failure.find("lost its power") != std::string::npos ||
                  r.failure.find("grown loose") != std::string::npos)
          << r.failure;
      continue;
    }
    // Shrunk: a handful of examples, ranks and units is enough to show any of these bugs.
    const CaseRecord::Size& s = r.failure_size;
    if (m.scale) {
      // A bug of scale keeps the world (and, for the sampler, the data set) it needs: the smallest world
      // of the scale class that shows it.
      EXPECT_LE(s.world_size, 65) << r.counterexample;
    } else {
      EXPECT_LE(s.examples, m.large_minimal_case ? 64 : 16) << r.counterexample;
      EXPECT_LE(s.world_size, 4) << r.counterexample;
    }
    EXPECT_LE(s.layers, m.large_minimal_case ? 4 : 2) << r.counterexample;
    if (!m.wide_minimal_case) {
      EXPECT_LE(s.widest, 32) << r.counterexample;
    }
    EXPECT_FALSE(r.reproduce.empty());
    // The reproduce string replays exactly the minimal case, which fails again. A failure that comes and
    // goes (a sum in arrival order) is replayed as its replay command does (failure_replay), many times:
    // its minimal case fails in some runs only (40-90% of them, measured).
    RunOptions replay = options(p);
    replay.reproduce = r.reproduce;
    if (r.flaky()) replay.reruns = comes_and_goes_reruns;
    const PropertyResult again = run_property(p, target, replay);
    EXPECT_FALSE(again.passed);
    EXPECT_EQ(again.counterexample, r.counterexample);
  }
  std::printf("%s\n", row.c_str());
  EXPECT_TRUE(caught_by_aimed);
}

INSTANTIATE_TEST_SUITE_P(AllMutants, KillMatrix, testing::ValuesIn(mutants().begin(), mutants().end()),
                         [](const testing::TestParamInfo<MutantInfo>& param) {
                           return test_case_name(param.param.name);
                         });

}  // namespace
}  // namespace dpcheck
