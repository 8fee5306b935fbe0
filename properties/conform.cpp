// What conform shares between its communicator and kernel halves: the verdicts' names, and verify's
// properties run as conform rows (properties/conform.hpp).
#include "properties/conform.hpp"

#include <cstdio>

#include "properties/properties.hpp"
#include "properties/runner.hpp"

namespace dpcheck {

std::string_view conform_verdict_name(ConformVerdict v) {
  switch (v) {
    case ConformVerdict::pass: return "pass";
    case ConformVerdict::fail: return "FAIL";
    case ConformVerdict::info: return "info";
    case ConformVerdict::skip: return "skip";
  }
  return "?";
}

std::vector<ConformRow> conform_properties(const Target& target, const ConformOptions& o) {
  std::vector<ConformRow> rows;
  for (const PropertyDef& p : properties()) {
    const std::string check = "property " + std::string(p.name);
    if (!o.check.empty() && o.check != check) continue;
    RunOptions ro;
    ro.cases = std::max(1, o.cases / p.case_divisor);
    ro.seed = o.seed;
    if (o.on_cases) ro.progress = [&](std::int64_t cases, std::int64_t) { o.on_cases(check, cases, ro.cases); };
    const PropertyResult r = run_property(p, target, ro);
    ConformRow row;
    row.section = "properties";
    row.check = check;
    row.seconds = r.seconds;
    char ratio[64] = "";
    if (r.has_error_ratio) std::snprintf(ratio, sizeof ratio, ", largest error ratio %.3g", r.max_error_ratio);
    if (!r.skipped.empty()) {
      row.verdict = ConformVerdict::skip;
      row.detail = r.skipped;
    } else if (r.passed) {
      row.verdict = ConformVerdict::pass;
      row.detail = std::to_string(r.cases) + " cases" + ratio;
    } else {
      row.verdict = ConformVerdict::fail;
      row.promise = std::string(p.promise);
      row.detail = r.failure + (r.flaky() ? " (fails " + std::to_string(r.failing_runs) + " of " +
                                                std::to_string(r.runs) + " runs)"
                                          : std::string());
      row.minimal = r.counterexample;
      row.replay = replay_command(target, r.reproduce);
    }
    if (o.on_row) o.on_row(row);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace dpcheck
