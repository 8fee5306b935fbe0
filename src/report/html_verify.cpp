// The page of `dpcheck verify --report` (src/report/html.hpp): a row per property, then a section per
// property with its facts, the histogram of its error ratios, the power probe's share, the closest call
// and, for a failure, the minimal case and the line that replays it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/report/html.hpp"
#include "src/report/html_internal.hpp"

namespace dpcheck::html {
namespace detail {

namespace {

// Three digits, or six where three would round a ratio just under the bound up to it (as verify prints).
std::string ratio_shown(double v) { return v >= 0.9995 && v <= 1.0 ? shown(v, "%.6f") : shown(v); }

constexpr int kHistogramBars = 40;

std::string ratio_histogram(const json& ratios) {
  std::vector<double> r;
  for (const json& v : ratios) r.push_back(v.get<double>());
  const double top = std::max(1.0, r.empty() ? 1.0 : *std::max_element(r.begin(), r.end()));
  std::vector<double> edges(kHistogramBars + 1);
  for (int i = 0; i <= kHistogramBars; ++i) edges[static_cast<std::size_t>(i)] = top * i / kHistogramBars;
  std::vector<std::int64_t> counts(kHistogramBars, 0);
  for (double v : r) {
    // lo <= v < hi; the last bar also holds v == top.
    const auto it = std::upper_bound(edges.begin(), edges.end(), v);
    const std::size_t bar = std::min<std::size_t>(
        static_cast<std::size_t>(std::max<std::ptrdiff_t>(it - edges.begin() - 1, 0)), kHistogramBars - 1);
    ++counts[bar];
  }
  const std::int64_t most = *std::max_element(counts.begin(), counts.end());
  Axis x{"error ratio (observed error / derived bound; at most 1 passes)", 0, top};
  Axis y = fit_axis("cases", {static_cast<double>(most)}, 0, true);
  y.format = integer_label;
  Chart c("error ratio of each passing case (" + std::to_string(r.size()) + " cases)", x, y);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    c.bar(
        edges[i], edges[i + 1], static_cast<double>(counts[i]),
        attr("data-lo", edges[i]) + attr("data-hi", edges[i + 1]) + attr("data-count", static_cast<double>(counts[i])),
        std::to_string(counts[i]) + (counts[i] == 1 ? " case" : " cases") + " with ratio in [" + shown(edges[i]) +
            ", " + shown(edges[i + 1]) + (i + 1 == counts.size() ? "]" : ")"));
  }
  c.marker_x(1, "bound", attr("data-x", 1.0));
  return c.svg();
}

std::string verify_property(const json& p, std::size_t index) {
  const std::string name = p.at("name").get<std::string>();
  const bool passed = p.at("passed").get<bool>();
  const std::string skipped = opt_string(p, "skipped");
  std::string s = "<section" + attr("id", "p" + std::to_string(index)) + attr("data-property", name) + ">\n<h2>" +
                  escape(name) + " " +
                  (skipped.empty() ? verdict_badge(passed) : "<span class=\"verdict skip\">skipped</span>") + "</h2>\n";
  if (!skipped.empty()) return s + "<p>" + escape(skipped) + "</p>\n</section>\n";

  std::vector<std::vector<Cell>> facts{{text_cell("cases passed"), num_cell(value_text(p.at("cases")))}};
  if (const auto r = opt_number(p, "max_error_ratio"))
    facts.push_back({text_cell("largest error ratio"), num_cell(ratio_shown(*r))});
  if (const auto r = opt_number(p, "max_probabilistic_ratio"))
    facts.push_back({text_cell("largest probabilistic ratio (reported, never the verdict)"), num_cell(shown(*r))});
  if (has(p, "tightness")) {
    // One entry a path it measured ("whole_batch", "sharded", "chains"), and the floor.
    const json& t = p.at("tightness");
    std::string paths;
    for (const auto& [key, value] : t.items()) {
      if (key == "required" || !value.is_number()) continue;
      std::string path = key;
      std::replace(path.begin(), path.end(), '_', ' ');
      paths += (paths.empty() ? "" : ", ") + ratio_shown(value.get<double>()) + " " + path;
    }
    facts.push_back({text_cell("tightness: plain rounding came to"),
                     text_cell(paths + " (at least " + shown(t.at("required").get<double>()) + " required)")});
  }
  if (const auto sec = opt_number(p, "seconds")) facts.push_back({text_cell("time"), num_cell(shown(*sec, "%.2f s"))});
  s += table({"", ""}, facts);

  if (has(p, "error_ratios") && !p.at("error_ratios").empty()) s += ratio_histogram(p.at("error_ratios"));
  if (has(p, "power")) {
    const json& pw = p.at("power");
    const double caught = pw.at("caught").get<double>(), probed = pw.at("probed").get<double>();
    const double required = pw.at("required").get<double>();
    s += "<h3>non-vacuity: one example dropped must leave the bound</h3>\n";
    s += share_bar(caught, probed, required);
    s += "<p>caught in " + escape(exact(caught)) + " of " + escape(exact(probed)) + " probed cases (" +
         escape(percent(probed > 0 ? caught / probed : 0)) + "; at least " + escape(percent(required)) + " required)";
    if (const auto w = opt_number(pw, "weakest_probe_ratio"))
      s += "; the weakest drop came to " + escape(shown(*w)) + " times the bound";
    s += "</p>\n";
  }
  if (has(p, "closest_call") && passed) {
    const json& c = p.at("closest_call");
    s += "<h3>closest call: error ratio " + escape(ratio_shown(c.at("error_ratio").get<double>())) + "</h3>\n";
    s += "<p>where</p>\n" + pre(opt_string(c, "where")) + "<p>case</p>\n" + pre(opt_string(c, "case")) +
         "<p>replay</p>\n" + pre(opt_string(c, "replay"));
  }
  if (has(p, "distribution") && !p.at("distribution").empty()) {
    std::vector<std::vector<Cell>> rows;
    for (const auto& [tag_text, count] : p.at("distribution").items())
      rows.push_back({num_cell(value_text(count)), text_cell(tag_text)});
    s += "<h3>how the cases were distributed</h3>\n" + table({"cases", "kind"}, rows);
  }
  if (!passed) {
    s += "<h3 class=\"fail\">failure</h3>\n";
    if (has(p, "runs")) {
      const json& runs = p.at("runs");
      s += "<p>the minimal case fails " + escape(value_text(runs.at("failing"))) + " of " +
           escape(value_text(runs.at("total"))) + " runs" +
           (has(p, "flaky") && p.at("flaky").get<bool>() ? " (a failure that comes and goes)" : "") + "</p>\n";
    }
    if (has(p, "counterexample") && !opt_string(p, "counterexample").empty())
      s += "<p>minimal case</p>\n" + pre(opt_string(p, "counterexample"));
    s += "<p>why (the located difference)</p>\n" + pre(opt_string(p, "failure"));
    if (has(p, "reproduce")) s += "<p>replay</p>\n" + pre(opt_string(p, "reproduce"));
  }
  return s + "</section>\n";
}

}  // namespace

}  // namespace detail

std::string verify_page(const nlohmann::json& report) {
  using namespace detail;
  return drawn("verify", [&] {
    const bool passed = report.at("passed").get<bool>();
    const json& target = report.at("target");
    const json& props = report.at("properties");
    std::string b =
        "<h1>dpcheck verify " + verdict_badge(passed, "all properties passed", "some properties FAILED") + "</h1>\n";
    b += "<p>engine " + escape(opt_string(target, "engine")) + ", communicator " + escape(opt_string(target, "comm")) +
         (!opt_string(target, "mutant").empty() ? ", mutant " + escape(opt_string(target, "mutant")) : std::string()) +
         ", world size " + escape(has(target, "world_size") ? value_text(target.at("world_size")) : "-") + "; " +
         escape(value_text(report.at("cases_per_property"))) + " cases per property, seed " +
         escape(value_text(report.at("seed"))) + "</p>\n";

    std::vector<std::vector<Cell>> rows;
    std::size_t i = 0;
    for (const json& p : props) {
      const std::string skipped = opt_string(p, "skipped");
      const bool ok = p.at("passed").get<bool>();
      const auto ratio = opt_number(p, "max_error_ratio");
      std::string power = "-";
      if (has(p, "power")) power = percent(p.at("power").at("share").get<double>());
      rows.push_back(
          {{"<a" + attr("href", "#p" + std::to_string(i)) + ">" + escape(p.at("name").get<std::string>()) + "</a>", ""},
           {escape(!skipped.empty() ? "skipped"
                   : ok             ? "yes"
                                    : "NO"),
            !skipped.empty() ? "skip"
            : ok             ? "pass"
                             : "fail"},
           num_cell(value_text(p.at("cases"))),
           num_cell(ratio ? ratio_shown(*ratio) : "-"),
           num_cell(power),
           num_cell(has(p, "seconds") ? shown(p.at("seconds").get<double>(), "%.2f s") : "-")});
      ++i;
    }
    b += table({"property", "passed", "cases", "error ratio", "power", "time"}, rows);
    i = 0;
    for (const json& p : props) b += verify_property(p, i++);
    return page("dpcheck verify: " + std::string(passed ? "passed" : "FAILED"), b);
  });
}

}  // namespace dpcheck::html
