// conform's "properties" section: every property of verify against a target, one row each.
#include <algorithm>
#include <chrono>

#include "properties/conform.hpp"
#include "properties/runner.hpp"

namespace dpcheck {

std::vector<ConformRow> conform_properties(const Target& target, const ConformOptions& options) {
  std::vector<ConformRow> rows;
  for (const PropertyDef& p : properties()) {
    if (!options.check.empty() && p.name != options.check) continue;
    RunOptions ro;
    ro.cases = std::max(1, options.cases / p.case_divisor);
    ro.seed = options.seed;
    ro.reproduce = options.check.empty() ? std::string() : options.case_text;
    const PropertyResult r = run_property(p, target, ro);
    ConformRow row;
    row.section = "properties";
    row.check = r.name;
    row.verdict = !r.skipped.empty() ? ConformVerdict::skip : r.passed ? ConformVerdict::pass : ConformVerdict::fail;
    row.detail = !r.skipped.empty() ? r.skipped : std::to_string(r.cases) + " cases" +
                 (r.has_error_ratio ? ", largest error ratio " + std::to_string(r.max_error_ratio) : std::string()) +
                 (r.passed ? std::string() : "; " + r.failure);
    row.promise = std::string(p.promise);
    row.minimal = r.counterexample;
    if (!r.passed && !r.reproduce.empty()) row.replay = replay_command(target, r.reproduce);
    row.seconds = r.seconds;
    if (options.on_row) options.on_row(row);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace dpcheck
