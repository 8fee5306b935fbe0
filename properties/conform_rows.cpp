// verify's properties as rows of `dpcheck conform` (properties/conform_rows.hpp).
#include "properties/conform_rows.hpp"

#include <algorithm>
#include <cstdio>

#include "properties/properties.hpp"
#include "properties/runner.hpp"

namespace dpcheck {

namespace {

std::vector<ConformRow> run_properties(const Target& target, const ConformOptions& o) {
  std::vector<ConformRow> rows;
  // A communicator without the gradient all-reduce cannot train: every property would stop at its
  // first step, so none runs, and each row says why.
  const std::string cannot_train = gradient_allreduce_unsupported(target);
  for (const PropertyDef& p : properties()) {
    const std::string check = "property " + std::string(p.name);
    if (!o.check.empty() && o.check != check) continue;
    if (!p.calls_plugins) {
      ConformRow row;
      row.section = "properties";
      row.check = check;
      row.verdict = ConformVerdict::skip;
      row.detail = "calls no plugin (its ranks compare over dpcheck's own transport): verify checks it";
      if (o.on_row) o.on_row(row);
      rows.push_back(std::move(row));
      continue;
    }
    if (!cannot_train.empty()) {
      ConformRow row;
      row.section = "properties";
      row.check = check;
      row.verdict = ConformVerdict::unsupported;
      row.detail = "the plugin says so: " + cannot_train;
      if (o.on_row) o.on_row(row);
      rows.push_back(std::move(row));
      continue;
    }
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
      // A case that failed before its promise could be judged blames what failed, not the promise.
      row.promise = r.not_judged ? "what the property runs completes, so that its promise can be judged (this "
                                   "failure is not a break of: " +
                                       std::string(p.promise) + ")"
                                 : std::string(p.promise);
      row.detail = r.failure +
                   (r.flaky() ? " (fails " + std::to_string(r.failing_runs) + " of " + std::to_string(r.runs) + " runs)"
                              : std::string());
      // A verdict over all the cases (the check's power, the bound's tightness, too many discards) has
      // no one case to replay: the row's own check replays it.
      row.minimal = r.counterexample.empty()
                        ? "none: the verdict is over all " + std::to_string(r.cases) + " cases, not one"
                        : r.counterexample;
      row.replay =
          r.reproduce.empty() ? o.replay_prefix + " --check '" + check + "'" : failure_replay(target, ro.draw, r);
    }
    if (o.on_row) o.on_row(row);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

const PropertyRows& conform_property_rows() {
  static const PropertyRows rows = [] {
    PropertyRows r;
    for (const PropertyDef& p : properties()) r.checks.push_back("property " + std::string(p.name));
    r.run = run_properties;
    return r;
  }();
  return rows;
}

}  // namespace dpcheck
