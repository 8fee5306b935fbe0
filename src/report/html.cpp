// The HTML pages of src/report/html.hpp: what every page shares. The text and attribute helpers, the
// readers of a report's fields, the page frame (the head with its style sheet) and its tables, and escape().
// The pages themselves and their charts live in src/report/html_<topic>.cpp, each kept to one topic.
#include "src/report/html.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <system_error>
#include <utility>
#include <vector>

#include "src/report/html_internal.hpp"

namespace dpcheck::html {
namespace detail {

// ---- text ---------------------------------------------------------------------------------------

// The shortest text that reads back as the same double: what a data-* attribute holds.
std::string exact(double v) {
  char buf[40];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::string("nan");
}

std::string shown(double v, const char* fmt) {
  char buf[48];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

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

std::string tag(std::string_view name, std::string_view text, std::string_view cls) {
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

namespace {

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

// fields_table's rows, a nested object's fields as parent.child.
void flatten(const json& j, const std::string& prefix, std::vector<std::vector<Cell>>& rows) {
  for (const auto& [key, value] : j.items()) {
    if (value.is_object()) {
      flatten(value, prefix + key + ".", rows);
    } else {
      rows.push_back({text_cell(prefix + key), text_cell(value_text(value), "text")});
    }
  }
}

}  // namespace

std::string page(const std::string& title, const std::string& body) {
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>" + escape(title) +
         "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n" + body +
         "<p class=\"note\">Written by dpcheck " DPCHECK_VERSION " from its JSON report.</p>\n</body>\n</html>\n";
}

std::string verdict_badge(bool passed, std::string_view pass_word, std::string_view fail_word) {
  return "<span" + attr("class", passed ? "verdict pass" : "verdict fail") + ">" +
         escape(passed ? pass_word : fail_word) + "</span>";
}

Cell text_cell(std::string_view s, std::string cls) { return {escape(s), std::move(cls)}; }
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
    for (const Cell& c : row)
      t += "<td" + (c.cls.empty() ? std::string() : attr("class", c.cls)) + ">" + c.html + "</td>";
    t += "</tr>\n";
  }
  return t + "</table>\n";
}

std::string fields_table(const json& j) {
  std::vector<std::vector<Cell>> rows;
  if (j.is_object()) flatten(j, "", rows);
  return rows.empty() ? std::string() : table({"field", "value"}, rows);
}

std::string pre(std::string_view text) { return "<pre>" + escape(text) + "</pre>\n"; }

}  // namespace detail

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

}  // namespace dpcheck::html
