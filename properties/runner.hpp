// Runs a property with an explicit seed and case count and returns what `dpcheck verify` reports: the
// verdict, the cases run, the largest error ratios, the closest call (the passing case nearest the
// bound, with the token that replays it), the power of the check, and for a failure the minimal
// counterexample, how often it fails when run again, and the token that replays it.
//
// The search and the shrinking are dpcheck's own loop over RapidCheck's generators (the same case sizes
// and random splits as RapidCheck's), so that a failing case can be run again before it is shrunk: a
// failure that comes and goes (a reduction whose order depends on which thread arrives first) is
// reported as "fails k of n runs", and while shrinking, a smaller case counts as failing if any of its
// n runs fails, so the minimal case still fails.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "properties/properties.hpp"

namespace dpcheck {

struct RunOptions {
  int cases = 100;
  std::uint64_t seed = 0;
  std::string reproduce;  // a case token printed with an earlier result: runs that one case only
  bool shrink = true;
  int reruns = 5;  // runs of a failing case, to tell a steady failure from one that comes and goes
  // Called after each case and each shrink step tried (for a progress line).
  std::function<void(std::int64_t cases, std::int64_t shrinks)> progress;
  // A PluginFault (a plugin's call that returned an error) ends the run instead of failing the case:
  // the plugin could not be checked, which is not a broken property (verify: exit 3).
  bool plugin_fault_ends_run = false;
  // What verify fixes or widens of the cases (--model, --thorough, the formats drawn per case).
  CaseDraw draw;
};

// The passing case whose error came nearest the bound.
struct ClosestCall {
  double ratio = -1;      // its error ratio (worst-case bound); negative: none measured
  std::string note;       // where, and what the bound there is made of
  std::string example;    // the case
  std::string reproduce;  // case token for RunOptions::reproduce (or --reproduce)
};

struct PropertyResult {
  std::string name;
  bool passed = false;
  std::string skipped;         // why the property did not run (it counts as passed)
  std::int64_t cases = 0;      // cases that passed before the verdict
  std::int64_t shrinks = 0;    // shrink steps that still failed
  double max_error_ratio = 0;  // over the cases run, worst-case bound
  bool has_error_ratio = false;
  double max_probabilistic_ratio = 0;  // the same errors over the probabilistic bound
  bool has_probabilistic_ratio = false;
  ClosestCall closest;
  // Each passing case's error ratio (worst-case bound), in the order the cases ran: the spread behind
  // max_error_ratio, for a histogram. Empty for a property that measures none.
  std::vector<double> error_ratios;
  // The power probe (one example dropped): cases probed, cases in which the bound caught it, and the
  // smallest probe ratio seen (how close a drop came to passing unnoticed).
  std::int64_t probed = 0, probe_caught = 0;
  double weakest_probe = 0;
  double min_power = 0;  // the share the property requires
  // Tightness (see CaseRecord): the largest rounding-only ratio on the whole-batch and sharded paths.
  double tightness[2] = {-1, -1};
  double min_tightness = 0;
  std::string_view tightness_paths[2];  // PropertyDef::tightness_paths
  // "0.213 (whole batch) and 0.197 (sharded)": each measured path's tightness and name, joined by `and`.
  std::string tightness_text(std::string_view and_word = " and ") const;
  double seconds = 0;
  std::string failure;             // why the minimal case failed
  std::string counterexample;      // the minimal case
  std::string reproduce;           // case token of the minimal case
  int failing_runs = 0, runs = 0;  // the minimal case failed failing_runs of runs times
  bool replayed = false;           // this result replays one case (RunOptions::reproduce)
  CaseRecord::Size failure_size;
  bool not_judged = false;                  // the failure is not of the promise (CaseRecord::not_judged)
  std::map<std::string, int> distribution;  // classification tags -> cases

  bool flaky() const { return !passed && runs > 0 && failing_runs < runs; }
  double power() const { return probed > 0 ? static_cast<double>(probe_caught) / static_cast<double>(probed) : 0; }
};

// The fewest probed cases for which a power share below min_power fails the run, and the fewest cases
// for which tightness below min_tightness does (fewer are reported but too few to judge).
inline constexpr std::int64_t min_probed_cases = 20;
inline constexpr std::int64_t min_tightness_cases = 50;

PropertyResult run_property(const PropertyDef& property, const Target& target, const RunOptions& options);

// The property a case token belongs to (UsageError if the token is damaged or names no property).
const PropertyDef& case_token_property(const std::string& token);

// The command that reproduces one case of a property on this target: `dpcheck verify` with the engine,
// communicator, kernels, mutant and world size the target was run with (the defaults left out), the --model and
// --thorough of `draw`, prefixed by its row's launcher when the ranks are a launcher's processes, and
// --reproduce with the token (shell-quoted).
std::string reproduce_command(const Target& target, const CaseDraw& draw, const std::string& token);

// A failure that comes and goes is replayed as many times as verify allows (--reruns): the shrinker keeps a
// smaller case that failed in any one of its runs, so a minimal case may fail one run in twenty or fewer,
// and its run takes milliseconds (a case that launches processes is run twice at most).
inline constexpr int comes_and_goes_reruns = 1000;

// The command that replays a failure's minimal case (reproduce_command), ending in --reruns
// comes_and_goes_reruns when the failure comes and goes, so that as printed it fails again.
std::string failure_replay(const Target& target, const CaseDraw& draw, const PropertyResult& result);

}  // namespace dpcheck
