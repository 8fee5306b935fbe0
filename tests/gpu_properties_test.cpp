// Every property (properties/properties.hpp), through RapidCheck, against the GPU target: the cuda
// engine with the cuda-local communicator (N replicas on one GPU), in pedantic float32 and in TF32 (the
// bound's u = 2^-11); and the kill matrix on the GPU: every mutant, the generic ones and those that
// break a CUDA kernel, must be caught by the property aimed at it, with a replay string that reproduces
// the same counterexample. GPU time is scarce, so each property runs 50 cases, not verify's 100.
//
// The target goes through the CUDA plugin (src/target/target.cpp, src/target/cuda_plugin.cpp), as `dpcheck
// verify --engine cuda` does; without the plugin or a device every test here skips with the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "mutants/mutants.hpp"
#include "properties/runner.hpp"
#include "src/error.hpp"
#include "src/target/target.hpp"
#include "tests/target_support.hpp"

namespace dpcheck {

// GoogleTest names a mutant parameter by printing it.
void PrintTo(const MutantInfo& m, std::ostream* os);

namespace {

constexpr int kCases = 50;
constexpr std::uint64_t kSeed = 20261130;

Target gpu_target(bool tf32 = false, std::string mutant = {}) {
  Target t = resolve_target({.engine = "cuda", .comm = "cuda-local"});
  t.tf32 = tf32;
  t.mutant = std::move(mutant);
  return t;
}

RunOptions options(const PropertyDef& p) {
  RunOptions o;
  o.cases = std::max(1, kCases / p.case_divisor);
  o.seed = kSeed;
  return o;
}

// ---- the correct implementation passes every property -----------------------------------------------

struct PropertyCase {
  std::string_view name;
  bool tf32 = false;
};
void PrintTo(const PropertyCase& c, std::ostream* os) { *os << c.name << (c.tf32 ? " tf32" : ""); }

// Every property in float32; in TF32 those that run the engine (the sampler's shares and the write
// audit's processes do not: TF32 could change nothing there).
std::vector<PropertyCase> property_cases() {
  std::vector<PropertyCase> cases;
  for (const PropertyDef& p : properties()) cases.push_back({p.name, false});
  for (const PropertyDef& p : properties())
    if (p.name != "sampler_shards_disjoint" && p.name != "only_rank0_writes") cases.push_back({p.name, true});
  return cases;
}

class OnCudaLocal : public testing::TestWithParam<PropertyCase> {};

TEST_P(OnCudaLocal, CorrectImplementationPasses) {
  const Target target = gpu_target(GetParam().tf32);
  if (const std::string why = target_unavailable(target); !why.empty()) GTEST_SKIP() << why;
  const PropertyDef& p = find_property(GetParam().name);
  const PropertyResult r = run_property(p, target, options(p));
  if (!r.skipped.empty()) GTEST_SKIP() << p.name << " cannot run here: " << r.skipped;
  EXPECT_TRUE(r.passed) << target.describe() << ": " << r.failure << "\n"
                        << r.counterexample << "\nreplay: " << r.reproduce;
  EXPECT_EQ(r.cases, options(p).cases);
  if (r.has_error_ratio) {
    RecordProperty("max_error_ratio", std::to_string(r.max_error_ratio));
    std::printf("%s on %s: max error ratio %.3g\n", std::string(p.name).c_str(), target.describe().c_str(),
                r.max_error_ratio);
  }
}

INSTANTIATE_TEST_SUITE_P(GpuProperties, OnCudaLocal, testing::ValuesIn(property_cases()),
                         [](const testing::TestParamInfo<PropertyCase>& param) {
                           return std::string(param.param.name) + (param.param.tf32 ? "_tf32" : "_fp32");
                         });

// ---- the kill matrix on the GPU ---------------------------------------------------------------------

// Mutants whose bug depends on the scheduler: a case fails only when the atomics' order happened to
// differ, so a smaller case that passed may still hold the bug, and a replay may pass. For them the
// catch is required; the shrunk size and a failing replay are reported, not required.
bool nondeterministic(std::string_view mutant) { return mutant == "bias-grad-atomic"; }

class GpuKillMatrix : public testing::TestWithParam<MutantInfo> {};

TEST_P(GpuKillMatrix, MutantIsCaughtByItsPropertyOnTheGpu) {
  const MutantInfo& m = GetParam();
  const Target target = gpu_target(false, std::string(m.name));
  if (const std::string why = target_unavailable(target); !why.empty()) GTEST_SKIP() << why;
  const PropertyDef& p = find_property(m.caught_by);
  const PropertyResult r = run_property(p, target, options(p));
  if (!r.skipped.empty()) GTEST_SKIP() << p.name << " cannot run here: " << r.skipped;
  ASSERT_FALSE(r.passed) << m.name << " survived " << p.name << " on " << target.describe();
  EXPECT_FALSE(r.reproduce.empty());
  const CaseRecord::Size& s = r.failure_size;
  std::printf("%s: caught by %s after %lld cases, shrunk to %lld examples, %d ranks, %d layers, width %d\n",
              std::string(m.name).c_str(), std::string(p.name).c_str(), static_cast<long long>(r.cases),
              static_cast<long long>(s.examples), s.world_size, s.layers, s.widest);
  if (!nondeterministic(m.name)) {
    // Shrunk: a handful of examples, ranks and units shows any of these bugs (as on the CPU).
    EXPECT_LE(s.examples, 16) << r.counterexample;
    EXPECT_LE(s.world_size, 4) << r.counterexample;
    EXPECT_LE(s.layers, 2) << r.counterexample;
    EXPECT_LE(s.widest, 8) << r.counterexample;
  }
  // The replay string reproduces exactly the minimal case.
  RunOptions replay = options(p);
  replay.reproduce = r.reproduce;
  const PropertyResult again = run_property(p, target, replay);
  if (!again.passed) {
    EXPECT_EQ(again.counterexample, r.counterexample);
  } else if (nondeterministic(m.name)) {
    std::printf("%s: the replay of %s passed this time (the atomics' order agreed)\n", std::string(m.name).c_str(),
                r.counterexample.c_str());
  } else {
    ADD_FAILURE() << "the replay of " << m.name << "'s counterexample passed: " << r.counterexample;
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuKillMatrix, testing::ValuesIn(mutants().begin(), mutants().end()),
                         [](const testing::TestParamInfo<MutantInfo>& param) {
                           std::string name(param.param.name);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace

void PrintTo(const MutantInfo& m, std::ostream* os) { *os << m.name; }

}  // namespace dpcheck
