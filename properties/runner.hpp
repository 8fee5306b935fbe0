// Runs a property through RapidCheck with an explicit seed and case count, and returns what
// `dpcheck verify` reports: the verdict, the cases run, the largest error ratio, and for a failure the
// minimal counterexample and the string that replays exactly that case.
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
  std::string reproduce;  // "reproduce=..." from an earlier failure: replays its minimal case only
  bool shrink = true;
  // Called after each case and each shrink step tried (for a progress line).
  std::function<void(std::int64_t cases, std::int64_t shrinks)> progress;
};

struct PropertyResult {
  std::string name;
  bool passed = false;
  std::string skipped;         // why the property did not run (it counts as passed)
  std::int64_t cases = 0;      // cases that passed before the verdict
  std::int64_t shrinks = 0;    // shrink steps that still failed
  double max_error_ratio = 0;
  bool has_error_ratio = false;
  double seconds = 0;
  std::string failure;         // why the minimal case failed
  std::string counterexample;  // the minimal case
  std::string reproduce;       // pass to RunOptions::reproduce (or --reproduce) to replay it
  CaseStats::Size failure_size;
  std::map<std::string, int> distribution;  // classification tags -> cases
};

PropertyResult run_property(const PropertyDef& property, const Target& target, const RunOptions& options);

}  // namespace dpcheck
