// The kill matrix across processes: `dpcheck verify --comm mpi` under mpirun, every CPU mutant against
// the property aimed at it (of a property whose cases launch processes themselves, the first mutant). Each must be
// caught (exit 1, a FAILED line) with a small minimal case and a replay line which, run through mpirun as printed,
// fails again with the same case; the correct implementation must pass every property. Mutants come from the mutant
// table, so a new one is covered without an edit here. Skips, with the reason, where mpirun or MPI is missing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "mutants/mutants.hpp"
#include "properties/properties.hpp"
#include "properties/runner.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

// Three ranks: a sum in arrival order or from each rank's own place only changes bits with three or
// more addends.
constexpr int kRanks = 3;
constexpr int kCases = 40;  // the file's cases take two to three minutes, one after another, on two cores
// Properties whose cases launch processes run cases / case_divisor of them; their rows get this many
// cases at least (only_rank0_writes: resume-cleanup-every-rank shows only when a resumed run meets a
// corrupt checkpoint, a third of that property's cases).
constexpr int kMinLaunchingCases = 10;
constexpr std::uint64_t kSeed = 20261129;
constexpr int kLimitS = 540;  // per dpcheck launch: a hang fails the test instead of stalling the suite

// mpirun as the replay line's "mpirun" stands for, here: as root, more ranks than cores, and Open MPI's
// all-reduce spared the slow first touch of fresh memory (BUILD-NOTES).
std::string launcher() {
  return std::string("env MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 ") + DPCHECK_MPIEXEC +
         " --allow-run-as-root --oversubscribe";
}

std::string verify_command(const std::string& flags) {
  return launcher() + " -np " + std::to_string(kRanks) + " " + DPCHECK_BINARY + " verify --comm mpi --seed " +
         std::to_string(kSeed) + flags;
}

// The lines of `output` that follow `head` (found at a line start), the first after it and the rest
// while indented under it, joined by newlines; nullopt when no line starts with `head`.
std::optional<std::string> block_after(const std::string& output, const std::string& head) {
  std::istringstream lines(output);
  std::string line, block;
  bool inside = false;
  while (std::getline(lines, line)) {
    if (!inside) {
      if (line.rfind(head, 0) != 0) continue;
      inside = true;
      block = line.substr(head.size());
    } else if (line.size() > head.size() && line.find_first_not_of(' ') == head.size()) {
      block += "\n" + line.substr(head.size());
    } else {
      break;
    }
  }
  return inside ? std::optional<std::string>(block) : std::nullopt;
}

// The size of a minimal case, read from its description: examples (or what a case without examples
// shrinks, see case_size), layers and widest layer (0 when the case has no model, as a sampler case).
struct CaseSize {
  std::int64_t examples = -1;
  int layers = 0;
  std::int64_t widest = 0;
};

// The digits and commas that follow the first `key` in `text` found where `at_line_start` allows
// (at the text's or a line's start only, when set); empty when there is none.
std::string number_after(const std::string& text, const std::string& key, bool at_line_start = false) {
  for (std::size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    if (at_line_start && at != 0 && text[at - 1] != '\n') continue;
    const std::size_t from = at + key.size();
    const std::size_t to = text.find_first_not_of("0123456789,", from);
    std::string digits = text.substr(from, to == std::string::npos ? std::string::npos : to - from);
    if (!digits.empty() && digits.front() != ',') return digits;
  }
  return {};
}

std::optional<CaseSize> case_size(const std::string& text) {
  CaseSize s;
  const std::string dims_text = number_after(text, "model ");
  if (dims_text.find(',') != std::string::npos) {
    std::stringstream dims(dims_text);
    std::vector<std::int64_t> d;
    for (std::string w; std::getline(dims, w, ',');)
      if (!w.empty()) d.push_back(std::stoll(w));
    s.layers = static_cast<int>(d.size()) - 1;
    s.widest = *std::max_element(d.begin(), d.end());
  }
  // A training scenario: "batch B of N"; a summation-order case: "batch B |"; a sampler case: "data N".
  for (std::size_t at = text.find("batch "); s.examples < 0 && at != std::string::npos;
       at = text.find("batch ", at + 1)) {
    const std::string b = number_after(text.substr(at), "batch ");
    if (b.empty() || b.find(',') != std::string::npos) continue;
    const std::string after = text.substr(at + 6 + b.size());
    if (after.rfind(" of ", 0) == 0) {
      const std::string n = number_after(after, " of ");
      if (!n.empty() && n.find(',') == std::string::npos) s.examples = std::stoll(n);
    } else if (after.rfind(" |", 0) == 0) {
      s.examples = std::stoll(b);
    }
  }
  if (s.examples < 0) {
    const std::string n = number_after(text, "data ", /*at_line_start=*/true);
    if (!n.empty() && n.find(',') == std::string::npos) s.examples = std::stoll(n);
  }
  // Cases with no examples are sized by what they shrink: a case of planted writes
  // (audit_sees_every_write) by its calls, "2 ranks, N planted calls: ..."; a schedule case
  // (allreduce_schedules_within_bound) by its elements, "... of 4 ranks, N element(s), ..."; a case of
  // conform's rows (conform_rows_catch_broken_communicators) by its world, "... on N ranks, row '...'", and
  // so is a case of plugin tables (plugin_abi_rules_hold), "ABI 3, dtypes 0x1, ops 0x0, N ranks: ...".
  for (const char* key : {" planted call", " element", " ranks, row '", " ranks: "}) {
    const std::size_t at = text.find(key);
    if (s.examples >= 0 || at == std::string::npos || at == 0) continue;
    const std::size_t from = text.find_last_not_of("0123456789", at - 1) + 1;
    if (from < at) s.examples = std::stoll(text.substr(from, at - from));
  }
  if (s.examples < 0) return std::nullopt;
  return s;
}

bool has_mpi(std::string& why) {
  if (!DPCHECK_HAS_MPI) why = "this build has no MPI backend";
  else if (::access(DPCHECK_MPIEXEC, X_OK) != 0) why = std::string("no MPI launcher at ") + DPCHECK_MPIEXEC;
  return why.empty();
}

bool is_cpu_mutant(const MutantInfo& m) { return m.engine.empty() || m.engine == "cpu"; }

TEST(MpiVerify, CorrectImplementationPassesEveryProperty) {
  if (std::string why; !has_mpi(why)) GTEST_SKIP() << why;
  const CommandResult o = run_command(verify_command(" --cases " + std::to_string(kCases)), kLimitS);
  std::printf("correct implementation: exit %d in %.1f s\n", o.status, o.seconds);
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("world size " + std::to_string(kRanks)), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("all properties passed"), std::string::npos) << o.output;
  // Every property ran; none was skipped (the launcher is here, so only_rank0_writes can run).
  for (const PropertyDef& p : properties())
    EXPECT_NE(o.output.find(std::string(p.name) + " "), std::string::npos) << p.name;
  EXPECT_EQ(o.output.find("skipped"), std::string::npos) << o.output;
}

class MpiVerify : public testing::TestWithParam<MutantInfo> {};

}  // namespace

// GoogleTest names a parameter by printing it.
void PrintTo(const MutantInfo& m, std::ostream* os) { *os << m.name; }

namespace {

TEST_P(MpiVerify, MutantIsCaughtShrunkAndReplayedThroughMpirun) {
  const MutantInfo& m = GetParam();
  if (!is_cpu_mutant(m)) GTEST_SKIP() << m.name << " breaks the " << m.engine << " engine";
  // The scale class runs on simulated ranks, which a launcher's world of 3 processes is not.
  if (m.scale) GTEST_SKIP() << m.name << " shows only at scale, which kill_matrix_test reaches on simulated ranks";
  if (std::string why; !has_mpi(why)) GTEST_SKIP() << why;
  const std::string name(m.name), property(m.caught_by);
  const PropertyDef& def = find_property(property);
  // A property whose cases launch processes of their own (only_rank0_writes, audit_sees_every_write: each
  // case is its own mpirun jobs) catches its mutants in processes in the kill matrix already; under an
  // outer mpirun the first mutant aimed at it stands for the others.
  if (def.case_divisor > 1) {
    const auto first = std::find_if(mutants().begin(), mutants().end(),
                                    [&](const MutantInfo& other) { return other.caught_by == m.caught_by; });
    if (first->name != m.name)
      GTEST_SKIP() << property << " launches its own processes, and kill_matrix_test catches " << name << " there; "
                   << first->name << " runs it under mpirun";
  }
  // Enough cases for the run-level floors to be judged (power, tightness).
  const int cases = std::max({kCases, kMinLaunchingCases * def.case_divisor,
                              def.min_tightness > 0 ? static_cast<int>(min_tightness_cases) : 0,
                              def.min_power > 0 ? static_cast<int>(min_probed_cases) : 0});

  // The formats fixed (the mutant's precision, or float32): drawn formats shift every case's draws, and
  // the minimal-case sizes below are judged on this seed's cases (cli_test checks the drawn formats).
  const std::string precision =
      " --precision " + std::string(m.precision.empty() ? "fp32" : m.precision) + " --allreduce-dtype fp32";
  const CommandResult o = run_command(
      verify_command(" --cases " + std::to_string(cases) + precision + " --mutant " + name + " --property " + property),
      kLimitS);
  EXPECT_EQ(o.status, 1) << o.output;
  const std::string failed = "FAILED " + property + " after ";
  ASSERT_NE(o.output.find("\n" + failed), std::string::npos) << name << " survived " << property << ":\n" << o.output;
  const std::optional<std::string> minimal = block_after(o.output, "  minimal case: ");
  if (!minimal) {
    // A verdict on the whole run (a check that lost its power, a bound grown loose): no case to shrink.
    EXPECT_TRUE(o.output.find("lost its power") != std::string::npos ||
                o.output.find("grown loose") != std::string::npos)
        << o.output;
    return;
  }

  // Shrunk: a handful of examples and units is enough to show any of these bugs (a one-ulp learning
  // rate may need some thirty parameters before any of their bits differ).
  const std::optional<CaseSize> size = case_size(*minimal);
  ASSERT_TRUE(size) << "cannot read the size of the minimal case: " << *minimal;
  EXPECT_LE(size->examples, m.large_minimal_case ? 64 : 16) << *minimal;
  EXPECT_LE(size->layers, m.large_minimal_case ? 4 : 2) << *minimal;
  if (!m.wide_minimal_case) {
    EXPECT_LE(size->widest, 32) << *minimal;
  }

  // The replay line names this launch exactly: mpirun with the same ranks, the backend and the mutant.
  // A failure that comes and goes (a sum in arrival order) says so in it, and the command runs the case
  // as many times as verify allows, so that a case failing even one run in fifty fails again but once in
  // 10^8: "replay (it fails k of n runs: the command runs it 1000 times): ... --reruns 1000".
  const std::optional<std::string> replay_line = block_after(o.output, "  replay");
  ASSERT_TRUE(replay_line.has_value()) << o.output;
  const bool comes_and_goes = replay_line->rfind(" (it fails ", 0) == 0;
  // The command follows the first ": " after the parenthesis, if there is one ("runs: the" is inside it).
  const std::size_t colon = comes_and_goes ? replay_line->find("): ") + 1 : replay_line->find(": ");
  ASSERT_TRUE(colon == (comes_and_goes ? replay_line->find(')') + 1 : 0)) << o.output;
  const std::string printed = replay_line->substr(colon + 2, replay_line->find('\n') - colon - 2);
  const std::string printed_launch = "mpirun -np " + std::to_string(kRanks) + " dpcheck";
  // A mutant of one precision's path names its precision alone: verify draws no format for it.
  const std::string rest = " verify --comm mpi --precision " + std::string(m.precision.empty() ? "fp32" : m.precision) +
                           (m.precision.empty() ? " --allreduce-dtype fp32" : "") + " --mutant " + name +
                           " --reproduce '";
  ASSERT_EQ(printed.rfind(printed_launch + rest, 0), 0u) << printed;

  // Run as printed, with this build's launcher and binary in place of "mpirun" and "dpcheck".
  const std::string reruns = " --reruns 1000";
  if (comes_and_goes) {
    EXPECT_EQ(printed.size() >= reruns.size() ? printed.substr(printed.size() - reruns.size()) : printed, reruns);
  }
  const std::string command =
      launcher() + " -np " + std::to_string(kRanks) + " " + DPCHECK_BINARY + printed.substr(printed_launch.size());
  const CommandResult again = run_command(command, kLimitS);
  EXPECT_EQ(again.status, 1) << command << "\n" << again.output;
  EXPECT_NE(again.output.find("one replayed case"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("\nFAILED " + property + " after "), std::string::npos) << command << "\n"
                                                                                      << again.output;
  EXPECT_EQ(block_after(again.output, "  minimal case: "), minimal) << command << "\n" << again.output;

  std::printf("%s: caught by %s%s, minimal case %s (examples %lld, layers %d, widest %lld), %.1f s; replay %.1f s\n",
              name.c_str(), property.c_str(), comes_and_goes ? " (a failure that comes and goes)" : "",
              minimal->c_str(), static_cast<long long>(size->examples), size->layers,
              static_cast<long long>(size->widest), o.seconds, again.seconds);
}

INSTANTIATE_TEST_SUITE_P(AllMutants, MpiVerify, testing::ValuesIn(mutants().begin(), mutants().end()),
                         [](const testing::TestParamInfo<MutantInfo>& param) {
                           return test_case_name(param.param.name);
                         });

}  // namespace
}  // namespace dpcheck
