// Reports people would rather look at: one self-contained HTML page from a command's JSON report.
// A page carries its own CSS and draws its plots as inline SVG; it fetches nothing (no script, font,
// image or stylesheet, no src and no href but #anchors to its own sections), so that it can be mailed,
// attached to a CI run or opened from a bundle years later and look the same.
//
// Every page is well-formed XML as well as HTML (each tag closed, every text escaped), so a test can
// parse it with any XML reader, and every plotted datum rides on its SVG element as attributes, read
// from the report and written back exactly (shortest round-trip digits):
//   histogram bars   <rect class="bar" data-lo=".." data-hi=".." data-count=".."/>  (lo <= x < hi; the
//                    last bar also holds x == hi)
//   points           <circle data-series=".." data-x=".." data-y=".."/>
//   markers          <line class="marker" data-x=".."/> or data-y
// so the page can be checked against the report it came from.
//
// Each function takes the report its command writes (the schemas below) and returns the page; Error
// when the report lacks a field the page needs or holds one of the wrong type.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dpcheck::html {

// `dpcheck verify --report`: per property its verdict, cases, largest error ratio, tightness, the
// histogram of the per-case error ratios ("error_ratios") with the bound marked at 1, the power
// probe's share (power.caught of power.probed) against the share required, the closest call, and for
// a failure the minimal case, the located difference (the failure text) and the replay command.
std::string verify_page(const nlohmann::json& report);

// `dpcheck conform --report`: every check's row and verdict, then each failure with the promise that
// broke, its minimal case and the line that replays it.
std::string conform_page(const nlohmann::json& report);

// A training run: {"command": "train", "target": {..}, "config": {..}, "passed": bool,
// "failure": null | {..}, "steps": [{"step": int, "loss": number | null, "skipped": bool,
// "loss_scale": number, "replicas_identical": bool, "gradient_error_ratio": number | null}]}.
// The loss curve (skipped steps marked), the live gradient check's error ratio per step with the bound
// at 1, the replica check as a strip of identical / diverged marks, and the failure.
std::string train_page(const nlohmann::json& report);

// `dpcheck bench scaling`: {"command": "bench scaling", "model", "batch", "engine", "comm",
// "gradient_bytes", "bucket_mb", "fit": {"alpha_us", "beta_gbs", "rms_relative_error"}, "rows": [{"ranks",
// "compute_ms", "allreduce_ms", "allreduce_fit_ms", "predicted_ms", "predicted_overlap_ms", "measured_ms",
// "measured_bucketed_ms", "speedup_predicted", "speedup_predicted_overlap", "speedup_measured",
// "speedup_measured_bucketed", "model_error", "exposed_comm_ms", "exposed_comm_bucketed_ms"}],
// "break_even": {"predicted": int | null, "measured": int | null}} (a null where not measured).
// Speed-up against N, measured and predicted, with and without overlap where present, the ideal line,
// the break-even N marked; the rows as a table.
std::string scaling_page(const nlohmann::json& report);

// Any other bench table (`bench allreduce --json`, `bench step --json`, `bench hash --json`,
// `bench trace --json`): the report's scalar fields, its rows as a table (an array of rows, an object
// with "rows", or one flat object as a single row), and where the rows carry "bytes" and "busbw_gbs"
// (bench allreduce) a plot of busbw against size, one series per backend and N. `title` heads the
// page, e.g. "bench allreduce".
std::string bench_page(const nlohmann::json& report, std::string_view title);
// The same from allreduce_json's ordered report (src/bench/bench.hpp).
std::string bench_page(const nlohmann::ordered_json& report, std::string_view title);

// Text for HTML/XML: & < > " ' as entities; control characters other than tab, newline and carriage
// return (which XML 1.0 forbids) as U+FFFD.
std::string escape(std::string_view text);

}  // namespace dpcheck::html
