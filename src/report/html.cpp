// The HTML pages of src/report/html.hpp. A page is built as text: a head with the style sheet, then
// sections of tables, preformatted text and SVG charts. Charts map data to pixels themselves (Chart)
// and write each datum beside its shape, exactly as the report holds it, so that the picture can be
// checked against the numbers.
#include "src/report/html.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "src/error.hpp"

namespace dpcheck::html {

using nlohmann::json;

namespace {

// ---- text ---------------------------------------------------------------------------------------

// The shortest text that reads back as the same double: what a data-* attribute holds.
std::string exact(double v) {
  char buf[40];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::string("nan");
}

std::string shown(double v, const char* fmt = "%.3g") {
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// Three digits, or six where three would round a ratio just under the bound up to it (as verify prints).
std::string ratio_shown(double v) { return v >= 0.9995 && v <= 1.0 ? shown(v, "%.6f") : shown(v); }

std::string percent(double share) { return shown(100 * share, "%.0f%%"); }

std::string bytes_shown(double b) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return shown(b, "%.4g") + " " + units[u];
}

// ` name="value"`, the value escaped.
std::string attr(std::string_view name, std::string_view value) {
  return " " + std::string(name) + "=\"" + escape(value) + "\"";
}
std::string attr(std::string_view name, double value) { return attr(name, exact(value)); }
std::string px(double v) { return shown(v, "%.2f"); }

std::string tag(std::string_view name, std::string_view text, std::string_view cls = {}) {
  return "<" + std::string(name) + (cls.empty() ? "" : attr("class", cls)) + ">" + escape(text) + "</" +
         std::string(name) + ">";
}

// A report's value as a table cell shows it.
std::string value_text(const json& v) {
  if (v.is_null()) return "-";
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_number_integer()) return v.dump();
  if (v.is_number()) return shown(v.get<double>(), "%.4g");
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    std::string s;
    for (const json& e : v) s += (s.empty() ? "" : ",") + value_text(e);
    return s;
  }
  return v.dump();
}

// ---- the report's fields ------------------------------------------------------------------------

bool has(const json& j, const char* key) { return j.is_object() && j.contains(key) && !j.at(key).is_null(); }

std::optional<double> opt_number(const json& j, const char* key) {
  if (!has(j, key)) return std::nullopt;
  return j.at(key).get<double>();
}

std::string opt_string(const json& j, const char* key) {
  if (!has(j, key)) return {};
  const json& v = j.at(key);
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// ---- the page -----------------------------------------------------------------------------------

const char* const kStyle = R"(
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; max-width: 72em; color: #1f2328; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #d0d7de; padding-bottom: 0.2em; }
h3 { font-size: 1em; margin-bottom: 0.3em; }
.pass { color: #1a7f37; }
.fail { color: #cf222e; font-weight: bold; }
.skip, .info, .unsupported { color: #6e7781; }
.verdict { font-size: 0.9em; padding: 0.1em 0.5em; border-radius: 0.3em; border: 1px solid currentColor; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 0.15em 0.7em; border-bottom: 1px solid #d8dee4; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.text { white-space: pre-wrap; }
pre { background: #f6f8fa; padding: 0.6em; white-space: pre-wrap; word-break: break-word; }
.note { color: #57606a; }
svg { display: block; margin: 0.4em 0; }
svg text { font-size: 11px; fill: #57606a; }
svg text.title { font-size: 12px; fill: #1f2328; font-weight: bold; }
svg .frame { fill: none; stroke: #8c959f; }
svg .grid { stroke: #eaeef2; }
svg .bar { fill: #4c78a8; }
svg .marker { stroke: #cf222e; stroke-width: 1.5; stroke-dasharray: 5 3; }
svg polyline { fill: none; stroke-width: 1.5; }
svg .ideal { stroke: #8c959f; stroke-dasharray: 2 3; }
svg .s0 { stroke: #4c78a8; fill: #4c78a8; }
svg .s1 { stroke: #f58518; fill: #f58518; }
svg .s2 { stroke: #54a24b; fill: #54a24b; }
svg .s3 { stroke: #b279a2; fill: #b279a2; }
svg .s4 { stroke: #e45756; fill: #e45756; }
svg .s5 { stroke: #72b7b2; fill: #72b7b2; }
svg .s6 { stroke: #9d755d; fill: #9d755d; }
svg .s7 { stroke: #bab0ac; fill: #bab0ac; }
svg polyline.s0, svg polyline.s1, svg polyline.s2, svg polyline.s3, svg polyline.s4, svg polyline.s5,
svg polyline.s6, svg polyline.s7 { fill: none; }
svg .skipped { stroke: #bf8700; stroke-width: 2; }
svg .identical { fill: #1a7f37; }
svg .diverged { fill: #cf222e; }
svg .track { fill: #eaeef2; }
svg .share { fill: #4c78a8; }
)";

std::string page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>" + escape(title) +
         "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n" + body +
         "<p class=\"note\">Written by dpcheck " DPCHECK_VERSION " from its JSON report.</p>\n</body>\n</html>\n";
}

std::string verdict_badge(bool passed, std::string_view pass_word = "passed", std::string_view fail_word = "FAILED") {
  return "<span" + attr("class", passed ? "verdict pass" : "verdict fail") + ">" +
         escape(passed ? pass_word : fail_word) + "</span>";
}

struct Cell {
  std::string html;  // already escaped
  std::string cls;   // "num" right-aligns, "text" keeps line breaks
};
Cell text_cell(std::string_view s, std::string cls = {}) { return {escape(s), std::move(cls)}; }
Cell num_cell(std::string_view s) { return {escape(s), "num"}; }

std::string table(const std::vector<std::string>& head, const std::vector<std::vector<Cell>>& rows) {
  std::string t = "<table>\n";
  if (std::any_of(head.begin(), head.end(), [](const std::string& h) { return !h.empty(); })) {
    t += "<tr>";
    for (const std::string& h : head) t += tag("th", h);
    t += "</tr>\n";
  }
  for (const std::vector<Cell>& row : rows) {
    t += "<tr>";
    for (const Cell& c : row) t += "<td" + (c.cls.empty() ? std::string() : attr("class", c.cls)) + ">" + c.html + "</td>";
    t += "</tr>\n";
  }
  return t + "</table>\n";
}

// Name / value rows of an object's fields (a nested object's fields as parent.child).
void flatten(const json& j, const std::string& prefix, std::vector<std::vector<Cell>>& rows) {
  for (const auto& [key, value] : j.items()) {
    if (value.is_object()) {
      flatten(value, prefix + key + ".", rows);
    } else {
      rows.push_back({text_cell(prefix + key), text_cell(value_text(value), "text")});
    }
  }
}
std::string fields_table(const json& j) {
  std::vector<std::vector<Cell>> rows;
  if (j.is_object()) flatten(j, "", rows);
  return rows.empty() ? std::string() : table({"field", "value"}, rows);
}

std::string pre(std::string_view text) { return "<pre>" + escape(text) + "</pre>\n"; }

// ---- charts -------------------------------------------------------------------------------------

struct Axis {
  std::string label;
  double lo = 0, hi = 1;
  double log_base = 0;  // 0: linear
  std::string (*format)(double) = nullptr;
};

// An axis spanning `values` (and `include`): linear with 5% to spare, from 0 when `from_zero`; or
// logarithmic in `log_base`, widened to whole powers (values <= 0 left out).
Axis fit_axis(std::string label, std::vector<double> values, double log_base = 0, bool from_zero = false) {
  Axis a;
  a.label = std::move(label);
  a.log_base = log_base;
  if (log_base > 0) {
    std::erase_if(values, [](double v) { return !(v > 0); });
    if (values.empty()) values = {1};
    const auto [mn, mx] = std::minmax_element(values.begin(), values.end());
    const double k = std::log(log_base);
    a.lo = std::pow(log_base, std::floor(std::log(*mn) / k + 1e-9));
    a.hi = std::pow(log_base, std::ceil(std::log(*mx) / k - 1e-9));
    if (a.hi <= a.lo) a.hi = a.lo * log_base;
    return a;
  }
  if (from_zero) values.push_back(0);
  if (values.empty()) values = {0, 1};
  const auto [mn, mx] = std::minmax_element(values.begin(), values.end());
  a.lo = *mn;
  a.hi = *mx;
  if (a.hi <= a.lo) {
    const double pad = a.lo == 0 ? 1 : std::fabs(a.lo) * 0.5;
    a.lo -= pad;
    a.hi += pad;
    if (from_zero && *mn >= 0) a.lo = 0;
    return a;
  }
  const double pad = 0.05 * (a.hi - a.lo);
  a.hi += pad;
  if (!(from_zero && a.lo == 0)) a.lo -= pad;
  return a;
}

std::vector<double> ticks(const Axis& a) {
  std::vector<double> t;
  if (a.log_base > 0) {
    const double k = std::log(a.log_base);
    const int first = static_cast<int>(std::ceil(std::log(a.lo) / k - 1e-9));
    const int last = static_cast<int>(std::floor(std::log(a.hi) / k + 1e-9));
    const int stride = std::max(1, (last - first + 1) / 10);
    for (int e = first; e <= last; e += stride) t.push_back(std::pow(a.log_base, e));
    return t;
  }
  const double raw = (a.hi - a.lo) / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {2.0, 5.0, 10.0})
    if (step < raw) step = m * mag;
  for (double v = std::ceil(a.lo / step) * step; v <= a.hi + 1e-9 * step; v += step)
    t.push_back(std::fabs(v) < 1e-12 * step ? 0 : v);
  return t;
}

std::string tick_label(const Axis& a, double v) { return a.format ? a.format(v) : shown(v, "%.3g"); }

class Chart {
 public:
  Chart(std::string title, Axis x, Axis y, int width = 680, int height = 280)
      : title_(std::move(title)), x_(std::move(x)), y_(std::move(y)), width_(width), height_(height) {}

  double x(double v) const { return kLeft + fraction(x_, v) * (width_ - kLeft - kRight); }
  double y(double v) const { return height_ - kBottom - fraction(y_, v) * (height_ - kTop - kBottom); }
  double bottom() const { return height_ - kBottom; }
  double top() const { return kTop; }

  // A shape and its data attributes (already written with attr()).
  void point(double vx, double vy, const std::string& cls, const std::string& data, const std::string& tip) {
    body_ += "<circle" + attr("class", cls) + attr("cx", px(x(vx))) + attr("cy", px(y(vy))) + " r=\"3\"" + data + ">" +
             tag("title", tip) + "</circle>\n";
  }
  void polyline(const std::vector<std::pair<double, double>>& pts, const std::string& cls, const std::string& data = {}) {
    if (pts.size() < 2) return;
    std::string p;
    for (const auto& [vx, vy] : pts) p += (p.empty() ? "" : " ") + px(x(vx)) + "," + px(y(vy));
    body_ += "<polyline" + attr("class", cls) + attr("points", p) + data + "/>\n";
  }
  void bar(double lo, double hi, double count, const std::string& data, const std::string& tip) {
    const double x0 = x(lo), x1 = x(hi), y0 = y(count);
    body_ += "<rect class=\"bar\"" + attr("x", px(x0 + 0.5)) + attr("y", px(y0)) +
             attr("width", px(std::max(0.5, x1 - x0 - 1))) + attr("height", px(bottom() - y0)) + data + ">" +
             tag("title", tip) + "</rect>\n";
  }
  // A dashed line across the plot at x = v (a bound, a break-even N), labelled at its top.
  void marker_x(double v, const std::string& label, const std::string& data) {
    body_ += "<line class=\"marker\"" + attr("x1", px(x(v))) + attr("x2", px(x(v))) + attr("y1", px(top())) +
             attr("y2", px(bottom())) + data + "/>\n";
    body_ += "<text" + attr("x", px(x(v) + 3)) + attr("y", px(top() + 11)) + ">" + escape(label) + "</text>\n";
  }
  void marker_y(double v, const std::string& label, const std::string& data) {
    body_ += "<line class=\"marker\"" + attr("x1", px(x(x_.lo))) + attr("x2", px(x(x_.hi))) + attr("y1", px(y(v))) +
             attr("y2", px(y(v))) + data + "/>\n";
    body_ += "<text" + attr("x", px(x(x_.hi) - 4)) + attr("y", px(y(v) - 3)) + " text-anchor=\"end\">" + escape(label) +
             "</text>\n";
  }
  void raw(const std::string& svg) { body_ += svg; }
  void legend(const std::string& name, const std::string& cls) { legend_.emplace_back(name, cls); }

  std::string svg() const {
    const int h = height_ + (legend_.empty() ? 0 : 18 * static_cast<int>((legend_.size() + 3) / 4));
    std::string s = "<svg class=\"chart\"" + attr("width", width_) + attr("height", h) +
                    attr("viewBox", "0 0 " + std::to_string(width_) + " " + std::to_string(h)) + " role=\"img\"" +
                    attr("aria-label", title_) + ">\n";
    s += "<text class=\"title\"" + attr("x", kLeft) + " y=\"14\">" + escape(title_) + "</text>\n";
    for (double t : ticks(x_)) {
      s += "<line class=\"grid\"" + attr("x1", px(x(t))) + attr("x2", px(x(t))) + attr("y1", px(top())) +
           attr("y2", px(bottom())) + "/>\n";
      s += "<text" + attr("x", px(x(t))) + attr("y", px(bottom() + 14)) + " text-anchor=\"middle\">" +
           escape(tick_label(x_, t)) + "</text>\n";
    }
    for (double t : ticks(y_)) {
      s += "<line class=\"grid\"" + attr("x1", px(x(x_.lo))) + attr("x2", px(x(x_.hi))) + attr("y1", px(y(t))) +
           attr("y2", px(y(t))) + "/>\n";
      s += "<text" + attr("x", px(kLeft - 5)) + attr("y", px(y(t) + 4)) + " text-anchor=\"end\">" +
           escape(tick_label(y_, t)) + "</text>\n";
    }
    s += "<rect class=\"frame\"" + attr("x", kLeft) + attr("y", kTop) + attr("width", width_ - kLeft - kRight) +
         attr("height", height_ - kTop - kBottom) + "/>\n";
    s += body_;
    s += "<text" + attr("x", px(kLeft + (width_ - kLeft - kRight) / 2.0)) + attr("y", height_ - 6) +
         " text-anchor=\"middle\">" + escape(x_.label) + "</text>\n";
    s += "<text" + attr("transform", "translate(12," + px(kTop + (height_ - kTop - kBottom) / 2.0) + ") rotate(-90)") +
         " text-anchor=\"middle\">" + escape(y_.label) + "</text>\n";
    for (std::size_t i = 0; i < legend_.size(); ++i) {
      const double lx = kLeft + static_cast<double>(i % 4) * 150, ly = height_ + 8 + 18.0 * static_cast<double>(i / 4);
      s += "<rect" + attr("class", legend_[i].second) + attr("x", px(lx)) + attr("y", px(ly)) +
           " width=\"12\" height=\"8\"/>\n";
      s += "<text" + attr("x", px(lx + 16)) + attr("y", px(ly + 8)) + ">" + escape(legend_[i].first) + "</text>\n";
    }
    return s + "</svg>\n";
  }

 private:
  static constexpr int kLeft = 58, kRight = 16, kTop = 24, kBottom = 40;

  static double fraction(const Axis& a, double v) {
    if (a.log_base > 0) return (std::log(v) - std::log(a.lo)) / (std::log(a.hi) - std::log(a.lo));
    return (v - a.lo) / (a.hi - a.lo);
  }

  std::string title_;
  Axis x_, y_;
  int width_, height_;
  std::string body_;
  std::vector<std::pair<std::string, std::string>> legend_;
};

std::string integer_label(double v) { return shown(v, "%.0f"); }
std::string bytes_label(double v) { return bytes_shown(v); }

// The power probe's share (caught of probed) as a bar, with the share required marked.
std::string share_bar(double caught, double probed, double required) {
  const double w = 320, share = probed > 0 ? caught / probed : 0;
  std::string s = "<svg class=\"share-bar\" width=\"340\" height=\"30\" viewBox=\"0 0 340 30\" role=\"img\"" +
                  attr("aria-label", "power " + percent(share)) + ">\n";
  s += "<rect class=\"track\" x=\"0\" y=\"8\"" + attr("width", w) + " height=\"14\"/>\n";
  s += "<rect class=\"share\" x=\"0\" y=\"8\"" + attr("width", px(w * std::clamp(share, 0.0, 1.0))) +
       " height=\"14\"" + attr("data-caught", caught) + attr("data-probed", probed) + attr("data-share", share) + ">" +
       tag("title", exact(caught) + " of " + exact(probed) + " probes caught") + "</rect>\n";
  s += "<line class=\"marker\"" + attr("x1", px(w * required)) + attr("x2", px(w * required)) +
       " y1=\"2\" y2=\"28\"" + attr("data-required", required) + "/>\n";
  return s + "</svg>\n";
}

// Series colours cycle through .s0 ... .s7.
std::string series_class(std::size_t i) { return "s" + std::to_string(i % 8); }

// The page's body, under a report error caught and named.
template <class F>
std::string drawn(const char* what, F body) {
  try {
    return body();
  } catch (const json::exception& e) {
    throw Error(std::string("cannot draw the ") + what + " report: " + e.what());
  }
}

// ---- verify -------------------------------------------------------------------------------------

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
    const std::size_t bar = std::min<std::size_t>(static_cast<std::size_t>(std::max<std::ptrdiff_t>(it - edges.begin() - 1, 0)),
                                                  kHistogramBars - 1);
    ++counts[bar];
  }
  const std::int64_t most = *std::max_element(counts.begin(), counts.end());
  Axis x{"error ratio (observed error / derived bound; at most 1 passes)", 0, top};
  Axis y = fit_axis("cases", {static_cast<double>(most)}, 0, true);
  y.format = integer_label;
  Chart c("error ratio of each passing case (" + std::to_string(r.size()) + " cases)", x, y);
  for (std::size_t i = 0; i < counts.size(); ++i) {
    c.bar(edges[i], edges[i + 1], static_cast<double>(counts[i]),
          attr("data-lo", edges[i]) + attr("data-hi", edges[i + 1]) + attr("data-count", static_cast<double>(counts[i])),
          std::to_string(counts[i]) + (counts[i] == 1 ? " case" : " cases") + " with ratio in [" + shown(edges[i]) + ", " + shown(edges[i + 1]) +
              (i + 1 == counts.size() ? "]" : ")"));
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
  if (const auto r = opt_number(p, "max_error_ratio")) facts.push_back({text_cell("largest error ratio"), num_cell(ratio_shown(*r))});
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

// ---- train and bench scaling --------------------------------------------------------------------

// Points of one series (x, y where y is present), drawn as circles joined where consecutive.
struct Series {
  std::string key, name;
  std::vector<std::pair<double, double>> points;
  std::vector<std::vector<std::pair<double, double>>> runs;  // unbroken stretches
};

void add_series(Chart& c, const Series& s, std::size_t colour, const std::string& extra = {}) {
  const std::string cls = series_class(colour);
  for (const auto& run : s.runs) c.polyline(run, cls, attr("data-series", s.key));
  for (const auto& [x, y] : s.points)
    c.point(x, y, cls, attr("data-series", s.key) + attr("data-x", x) + attr("data-y", y) + extra,
            s.name + ": " + shown(x, "%.6g") + ", " + shown(y, "%.6g"));
  c.legend(s.name, cls);
}

Series series_of(const json& rows, const char* x_key, const char* y_key, std::string name) {
  Series s{y_key, std::move(name), {}, {}};
  std::vector<std::pair<double, double>> run;
  for (const json& r : rows) {
    const auto y = opt_number(r, y_key);
    if (!y) {
      if (!run.empty()) s.runs.push_back(std::move(run));
      run.clear();
      continue;
    }
    const double x = r.at(x_key).get<double>();
    s.points.emplace_back(x, *y);
    run.emplace_back(x, *y);
  }
  if (!run.empty()) s.runs.push_back(std::move(run));
  return s;
}

std::vector<double> ys(const std::vector<Series>& all) {
  std::vector<double> v;
  for (const Series& s : all)
    for (const auto& p : s.points) v.push_back(p.second);
  return v;
}

// A logarithmic axis in base 10 when positive values spread over more than a hundredfold.
double log_base_for(const std::vector<double>& v) {
  if (v.empty() || *std::min_element(v.begin(), v.end()) <= 0) return 0;
  const auto [mn, mx] = std::minmax_element(v.begin(), v.end());
  return *mx / *mn > 100 ? 10 : 0;
}

std::string step_strip(const json& steps, const Axis& x) {
  // One mark per step on the loss curve's step axis: green where every replica was bitwise identical.
  const double width = 680, left = 58, right = 16, h = 22;
  const double span = x.hi - x.lo, plot = width - left - right;
  const double w = std::max(1.0, plot / std::max<double>(1, static_cast<double>(steps.size())));
  std::string s = "<svg class=\"strip\" width=\"680\" height=\"44\" viewBox=\"0 0 680 44\" role=\"img\" "
                  "aria-label=\"replica check per step\">\n";
  s += "<text class=\"title\" x=\"58\" y=\"12\">replicas bitwise identical after each step (green) or diverged (red)</text>\n";
  for (const json& st : steps) {
    const double step = st.at("step").get<double>();
    const bool same = st.at("replicas_identical").get<bool>();
    const double cx = left + (step - x.lo) / span * plot;
    s += "<rect" + attr("class", same ? "identical" : "diverged") + attr("x", px(cx - w / 2)) + " y=\"18\"" +
         attr("width", px(w)) + attr("height", px(h)) + attr("data-step", step) +
         attr("data-identical", same ? "true" : "false") + ">" +
         tag("title", "step " + exact(step) + (same ? ": identical" : ": diverged")) + "</rect>\n";
  }
  return s + "</svg>\n";
}

}  // namespace

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        if (c < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') out += "\xEF\xBF\xBD";
        else if (c == 0x7f) out += "\xEF\xBF\xBD";
        else out += ch;
    }
  }
  return out;
}

std::string verify_page(const json& report) {
  return drawn("verify", [&] {
    const bool passed = report.at("passed").get<bool>();
    const json& target = report.at("target");
    const json& props = report.at("properties");
    std::string b = "<h1>dpcheck verify " + verdict_badge(passed, "all properties passed", "some properties FAILED") +
                    "</h1>\n";
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
      rows.push_back({{"<a" + attr("href", "#p" + std::to_string(i)) + ">" + escape(p.at("name").get<std::string>()) + "</a>", ""},
                      {escape(!skipped.empty() ? "skipped" : ok ? "yes" : "NO"), !skipped.empty() ? "skip" : ok ? "pass" : "fail"},
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

std::string conform_page(const json& report) {
  return drawn("conform", [&] {
    const bool passed = report.at("passed").get<bool>();
    const json& plugin = report.at("plugin");
    const json& checks = report.at("checks");
    std::string b = "<h1>dpcheck conform " +
                    verdict_badge(passed, "the plugin kept every promise checked", "the plugin broke a promise") + "</h1>\n";
    b += "<p>" + escape(opt_string(plugin, "kind") == "kernels" ? "kernels " : "communicator ") +
         escape(opt_string(plugin, "path")) +
         (opt_string(plugin, "name").empty()
              ? std::string()
              : ", '" + escape(opt_string(plugin, "name")) + "'" +
                    (opt_string(plugin, "version").empty() ? "" : " " + escape(opt_string(plugin, "version")))) +
         " (engine " + escape(opt_string(plugin, "engine")) + "), world size " +
         escape(value_text(report.at("world_size"))) + ", seed " + escape(value_text(report.at("seed"))) + "</p>\n";
    std::map<std::string, int> tally;
    for (const json& c : checks) ++tally[c.at("verdict").get<std::string>()];
    std::string counts;
    for (const auto& [verdict, n] : tally) counts += (counts.empty() ? "" : ", ") + std::to_string(n) + " " + verdict;
    b += "<p>" + escape(std::to_string(checks.size()) + " checks: " + counts) + "</p>\n";

    std::vector<std::vector<Cell>> rows;
    std::size_t i = 0;
    for (const json& c : checks) {
      const std::string verdict = c.at("verdict").get<std::string>();
      const std::string name = c.at("check").get<std::string>();
      rows.push_back({text_cell(opt_string(c, "section")),
                      verdict == "fail" ? Cell{"<a" + attr("href", "#f" + std::to_string(i)) + ">" + escape(name) + "</a>", ""}
                                        : text_cell(name),
                      text_cell(verdict == "fail" ? "FAIL" : verdict, verdict),
                      num_cell(has(c, "seconds") ? shown(c.at("seconds").get<double>(), "%.2f s") : "-"),
                      text_cell(opt_string(c, "detail"), "text")});
      ++i;
    }
    b += table({"section", "check", "verdict", "time", "detail"}, rows);
    i = 0;
    for (const json& c : checks) {
      if (c.at("verdict").get<std::string>() == "fail") {
        b += "<section" + attr("id", "f" + std::to_string(i)) + attr("data-check", c.at("check").get<std::string>()) +
             ">\n<h2>" + escape(c.at("check").get<std::string>()) + " " + verdict_badge(false) + "</h2>\n";
        b += "<p>promise: " + escape(opt_string(c, "promise")) + "</p>\n";
        b += "<p>minimal case</p>\n" + pre(opt_string(c, "minimal_case"));
        b += "<p>why</p>\n" + pre(opt_string(c, "detail"));
        b += "<p>replay</p>\n" + pre(opt_string(c, "replay")) + "</section>\n";
      }
      ++i;
    }
    return page("dpcheck conform: " + std::string(passed ? "passed" : "FAILED"), b);
  });
}

std::string train_page(const json& report) {
  return drawn("train", [&] {
    const bool passed = report.at("passed").get<bool>();
    const json& steps = report.at("steps");
    std::string b = "<h1>dpcheck train " + verdict_badge(passed, "every check passed on every step", "a check FAILED") +
                    "</h1>\n";
    b += "<p>" + escape(std::to_string(steps.size())) + " steps</p>\n";
    if (has(report, "failure")) {
      const json& f = report.at("failure");
      b += "<section id=\"failure\">\n<h2 class=\"fail\">failure</h2>\n";
      if (f.is_object()) {
        for (const auto& [key, value] : f.items())
          b += "<p>" + escape(key) + "</p>\n" + pre(value.is_string() ? value.get<std::string>() : value.dump(2));
      } else {
        b += pre(f.is_string() ? f.get<std::string>() : f.dump(2));
      }
      b += "</section>\n";
    }

    std::vector<double> step_values;
    for (const json& st : steps) step_values.push_back(st.at("step").get<double>());
    Axis x = fit_axis("step", step_values);
    x.format = integer_label;

    b += "<h2>loss</h2>\n";
    const Series loss = series_of(steps, "step", "loss", "loss");
    if (loss.points.empty()) {
      b += "<p class=\"note\">no step reported a loss</p>\n";
    } else {
      const std::vector<double> lv = ys({loss});
      const double base = log_base_for(lv);
      Chart c("loss against step", x, fit_axis(base > 0 ? "loss (log scale)" : "loss", lv, base));
      add_series(c, loss, 0);
      bool any_skipped = false;
      for (const json& st : steps)
        if (st.at("skipped").get<bool>()) {
          const double sx = st.at("step").get<double>();
          c.raw("<line class=\"skipped\"" + attr("x1", px(c.x(sx))) + attr("x2", px(c.x(sx))) +
                attr("y1", px(c.bottom() - 8)) + attr("y2", px(c.bottom())) + attr("data-step", sx) + "/>\n");
          any_skipped = true;
        }
      if (any_skipped) c.legend("step skipped by the loss scaler", "skipped");
      b += c.svg();
    }
    // The loss scale only when it moved: a dynamic scaler's halvings and growths.
    bool scale_moved = false;
    for (const json& st : steps)
      scale_moved |= has(st, "loss_scale") && has(steps.at(0), "loss_scale") &&
                     st.at("loss_scale").get<double>() != steps.at(0).at("loss_scale").get<double>();
    if (scale_moved) {
      const Series scale = series_of(steps, "step", "loss_scale", "loss scale");
      Axis y = fit_axis("loss scale", ys({scale}), 2);
      Chart c("loss scale against step", x, y);
      add_series(c, scale, 1);
      b += c.svg();
    }

    b += "<h2>live gradient check</h2>\n";
    const Series grad = series_of(steps, "step", "gradient_error_ratio", "gradient error ratio");
    if (grad.points.empty()) {
      b += "<p class=\"note\">the gradient was not checked on any step</p>\n";
    } else {
      std::vector<double> gv = ys({grad});
      gv.push_back(1);
      Chart c("error ratio of the all-reduced gradient against the float64 reference (at most 1 passes)", x,
              fit_axis("error ratio", gv, 0, true));
      add_series(c, grad, 2);
      c.marker_y(1, "bound", attr("data-y", 1.0));
      b += c.svg();
      b += "<p class=\"note\">checked on " + std::to_string(grad.points.size()) + " of " + std::to_string(steps.size()) +
           " steps</p>\n";
    }

    b += "<h2>replica check</h2>\n";
    std::size_t diverged = 0;
    for (const json& st : steps) diverged += st.at("replicas_identical").get<bool>() ? 0 : 1;
    b += step_strip(steps, x);
    b += "<p>" + escape(diverged == 0 ? "every replica bitwise identical after every step"
                                      : std::to_string(diverged) + " of " + std::to_string(steps.size()) +
                                            " steps left the replicas different") +
         "</p>\n";

    b += "<h2>run</h2>\n<h3>target</h3>\n" + fields_table(report.at("target")) + "<h3>configuration</h3>\n" +
         fields_table(report.at("config"));
    return page("dpcheck train: " + std::string(passed ? "passed" : "FAILED"), b);
  });
}

std::string scaling_page(const json& report) {
  return drawn("bench scaling", [&] {
    const json& rows = report.at("rows");
    std::string b = "<h1>dpcheck bench scaling</h1>\n";
    b += "<p>model " + escape(opt_string(report, "model")) + ", batch " + escape(value_text(report.at("batch"))) +
         ", engine " + escape(opt_string(report, "engine")) + ", communicator " + escape(opt_string(report, "comm")) +
         "; " + escape(bytes_shown(report.at("gradient_bytes").get<double>())) + " of gradient, buckets of " +
         escape(value_text(report.at("bucket_mb"))) + " MiB</p>\n";
    if (has(report, "fit")) {
      const json& f = report.at("fit");
      const double beta = f.at("beta_gbs").get<double>();
      b += "<p>all-reduce fit, a ring's 2(N-1) alpha + 2(N-1)/N S / beta: alpha " +
           escape(shown(f.at("alpha_us").get<double>())) + " us, beta " +
           (beta > 0 ? escape(shown(beta)) + " GB/s" : std::string("unbounded")) + " (rms relative error " +
           escape(percent(f.at("rms_relative_error").get<double>())) + ")</p>\n";
    }

    std::vector<double> ranks;
    for (const json& r : rows) ranks.push_back(r.at("ranks").get<double>());
    const json& be = report.at("break_even");
    std::vector<double> xs = ranks;
    for (const char* k : {"predicted", "measured"})
      if (const auto n = opt_number(be, k)) xs.push_back(*n);
    const bool spread = !xs.empty() && *std::min_element(xs.begin(), xs.end()) > 0 &&
                        *std::max_element(xs.begin(), xs.end()) / *std::min_element(xs.begin(), xs.end()) >= 4;
    Axis x = fit_axis("ranks N", xs, spread ? 2 : 0);
    x.format = integer_label;

    const std::vector<Series> speedups{series_of(rows, "ranks", "speedup_predicted", "predicted"),
                                       series_of(rows, "ranks", "speedup_predicted_overlap", "predicted, overlapped"),
                                       series_of(rows, "ranks", "speedup_measured", "measured"),
                                       series_of(rows, "ranks", "speedup_measured_bucketed", "measured, bucketed")};
    std::vector<double> yv = ys(speedups);
    std::vector<std::pair<double, double>> ideal;
    for (double n : ranks) {
      ideal.emplace_back(n, n);
      yv.push_back(n);
    }
    b += "<h2>speed-up against N</h2>\n";
    Chart c("speed-up over one rank against the number of ranks", x, fit_axis("speed-up", yv, 0, true));
    c.polyline(ideal, "ideal", attr("data-series", "ideal"));
    c.legend("ideal (N)", "ideal");
    for (std::size_t i = 0; i < speedups.size(); ++i)
      if (!speedups[i].points.empty()) add_series(c, speedups[i], i);
    for (const char* k : {"predicted", "measured"})
      if (const auto n = opt_number(be, k))
        c.marker_x(*n, std::string("break-even ") + k + " N=" + exact(*n), attr("data-break-even", k) + attr("data-x", *n));
    b += c.svg();
    std::string even;
    for (const char* k : {"predicted", "measured"})
      even += std::string(even.empty() ? "" : "; ") + k + " " + (has(be, k) ? "N = " + value_text(be.at(k)) : "none in range");
    b += "<p>break-even (where the speed-up first exceeds 1): " + escape(even) + "</p>\n";

    const std::vector<Series> times{series_of(rows, "ranks", "compute_ms", "compute"),
                                    series_of(rows, "ranks", "allreduce_ms", "all-reduce, measured"),
                                    series_of(rows, "ranks", "allreduce_fit_ms", "all-reduce, fit"),
                                    series_of(rows, "ranks", "predicted_ms", "step, predicted"),
                                    series_of(rows, "ranks", "measured_ms", "step, measured"),
                                    series_of(rows, "ranks", "measured_bucketed_ms", "step, measured, bucketed")};
    Chart t("time a step against the number of ranks", x, fit_axis("ms", ys(times), 0, true));
    for (std::size_t i = 0; i < times.size(); ++i)
      if (!times[i].points.empty()) add_series(t, times[i], i);
    b += "<h2>time a step</h2>\n" + t.svg();

    std::vector<std::string> head;
    std::vector<std::vector<Cell>> cells;
    for (const json& r : rows) {
      if (head.empty())
        for (const auto& [k, v] : r.items()) head.push_back(k);
      std::vector<Cell> row;
      for (const std::string& k : head) row.push_back(num_cell(r.contains(k) ? value_text(r.at(k)) : "-"));
      cells.push_back(std::move(row));
    }
    b += "<h2>rows</h2>\n" + table(head, cells);
    return page("dpcheck bench scaling", b);
  });
}

std::string bench_page(const json& report, std::string_view title) {
  return drawn(std::string(title).c_str(), [&] {
    std::string b = "<h1>dpcheck " + escape(title) + "</h1>\n";
    const json* rows = nullptr;
    json single = json::array();
    if (report.is_array()) {
      rows = &report;
    } else if (report.is_object() && report.contains("rows") && report.at("rows").is_array()) {
      rows = &report.at("rows");
      json fields = json::object();
      for (const auto& [k, v] : report.items())
        if (k != "rows" && !v.is_array()) fields[k] = v;
      b += fields_table(fields);
      for (const auto& [k, v] : report.items())
        if (k != "rows" && v.is_array() && !v.empty()) {
          b += "<h3>" + escape(k) + "</h3>\n<ul>\n";
          for (const json& e : v) b += "<li>" + escape(value_text(e)) + "</li>\n";
          b += "</ul>\n";
        }
    } else {
      single.push_back(report);
      rows = &single;
    }

    // Columns: every key of every row, in the order first seen.
    std::vector<std::string> head;
    for (const json& r : *rows)
      for (const auto& [k, v] : r.items())
        if (std::find(head.begin(), head.end(), k) == head.end()) head.push_back(k);
    std::vector<std::vector<Cell>> cells;
    for (const json& r : *rows) {
      std::vector<Cell> row;
      for (const std::string& k : head) {
        const json v = r.contains(k) ? r.at(k) : json(nullptr);
        row.push_back(v.is_number() ? num_cell(value_text(v)) : text_cell(value_text(v)));
      }
      cells.push_back(std::move(row));
    }

    bool plotted = !rows->empty();
    for (const json& r : *rows) plotted &= has(r, "bytes") && has(r, "busbw_gbs");
    if (plotted) {
      // One series per backend and N, in the order the table lists them.
      std::vector<std::pair<std::string, Series>> series;
      for (const json& r : *rows) {
        const std::string backend = opt_string(r, "backend");
        const std::string n = has(r, "ranks") ? value_text(r.at("ranks")) : "";
        const std::string key = backend + " N=" + n;
        auto it = std::find_if(series.begin(), series.end(), [&](const auto& s) { return s.first == key; });
        if (it == series.end()) {
          series.push_back({key, Series{key, key, {}, {}}});
          it = std::prev(series.end());
        }
        const double bytes = r.at("bytes").get<double>(), busbw = r.at("busbw_gbs").get<double>();
        it->second.points.emplace_back(bytes, busbw);
      }
      std::vector<double> xs, yv;
      for (const auto& [key, s] : series)
        for (const auto& [bx, by] : s.points) {
          xs.push_back(bx);
          yv.push_back(by);
        }
      Axis x = fit_axis("message size", xs, 2);
      x.format = bytes_label;
      Chart c("bus bandwidth against message size", x, fit_axis("busbw (GB/s)", yv, 0, true), 680, 320);
      std::size_t i = 0;
      for (auto& [key, s] : series) {
        std::sort(s.points.begin(), s.points.end());
        s.runs = {s.points};
        std::size_t cut = key.rfind(" N=");
        add_series(c, s, i++, attr("data-backend", key.substr(0, cut)) + attr("data-ranks", key.substr(cut + 3)));
      }
      b += c.svg();
    }
    b += "<h2>rows</h2>\n" + table(head, cells);
    return page("dpcheck " + std::string(title), b);
  });
}

std::string bench_page(const nlohmann::ordered_json& report, std::string_view title) {
  return bench_page(json::parse(report.dump()), title);
}

}  // namespace dpcheck::html
