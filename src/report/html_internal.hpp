// What the pages of src/report/html.hpp share: the text and attribute helpers, the readers of a report's
// fields, the page frame with its tables (src/report/html.cpp) and the SVG charts (src/report/html_charts.cpp).
// Internal to src/report/html*.cpp: nothing else includes it.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/error.hpp"

namespace dpcheck::html::detail {

using nlohmann::json;

// ---- text (src/report/html.cpp) ------------------------------------------------------------------

// The shortest text that reads back as the same double: what a data-* attribute holds.
std::string exact(double v);
std::string shown(double v, const char* fmt = "%.3g");
std::string percent(double share);
std::string bytes_shown(double b);

// ` name="value"`, the value escaped.
std::string attr(std::string_view name, std::string_view value);
std::string attr(std::string_view name, double value);
std::string px(double v);
std::string tag(std::string_view name, std::string_view text, std::string_view cls = {});

// A report's value as a table cell shows it.
std::string value_text(const json& v);

// ---- the report's fields (src/report/html.cpp) ---------------------------------------------------

bool has(const json& j, const char* key);
std::optional<double> opt_number(const json& j, const char* key);
std::string opt_string(const json& j, const char* key);

// ---- the page (src/report/html.cpp) --------------------------------------------------------------

std::string page(const std::string& title, const std::string& body);
std::string verdict_badge(bool passed, std::string_view pass_word = "passed", std::string_view fail_word = "FAILED");

struct Cell {
  std::string html;  // already escaped
  std::string cls;   // "num" right-aligns, "text" keeps line breaks
};
Cell text_cell(std::string_view s, std::string cls = {});
Cell num_cell(std::string_view s);

std::string table(const std::vector<std::string>& head, const std::vector<std::vector<Cell>>& rows);
// Name / value rows of an object's fields (a nested object's fields as parent.child).
std::string fields_table(const json& j);
std::string pre(std::string_view text);

// The page's body, under a report error caught and named.
template <class F> std::string drawn(const char* what, F body) {
  try {
    return body();
  } catch (const json::exception& e) {
    throw Error(std::string("cannot draw the ") + what + " report: " + e.what());
  }
}

// ---- charts (src/report/html_charts.cpp) ---------------------------------------------------------

struct Axis {
  std::string label;
  double lo = 0, hi = 1;
  double log_base = 0;  // 0: linear
  std::string (*format)(double) = nullptr;
};

// An axis spanning `values` (and `include`): linear with 5% to spare, from 0 when `from_zero`; or
// logarithmic in `log_base`, widened to whole powers (values <= 0 left out).
Axis fit_axis(std::string label, std::vector<double> values, double log_base = 0, bool from_zero = false);

class Chart {
 public:
  Chart(std::string title, Axis x, Axis y, int width = 680, int height = 280)
      : title_(std::move(title)), x_(std::move(x)), y_(std::move(y)), width_(width), height_(height) {}

  double x(double v) const { return kLeft + fraction(x_, v) * (width_ - kLeft - kRight); }
  double y(double v) const { return height_ - kBottom - fraction(y_, v) * (height_ - kTop - kBottom); }
  double bottom() const { return height_ - kBottom; }
  double top() const { return kTop; }

  // A shape and its data attributes (already written with attr()).
  void point(double vx, double vy, const std::string& cls, const std::string& data, const std::string& tip);
  void polyline(const std::vector<std::pair<double, double>>& pts, const std::string& cls,
                const std::string& data = {});
  void bar(double lo, double hi, double count, const std::string& data, const std::string& tip);
  // A dashed line across the plot at x = v (a bound, a break-even N), labelled at its top.
  void marker_x(double v, const std::string& label, const std::string& data);
  void marker_y(double v, const std::string& label, const std::string& data);
  void raw(const std::string& svg) { body_ += svg; }
  void legend(const std::string& name, const std::string& cls) { legend_.emplace_back(name, cls); }

  std::string svg() const;

 private:
  static constexpr int kLeft = 58, kRight = 16, kTop = 24, kBottom = 40;

  static double fraction(const Axis& a, double v);

  std::string title_;
  Axis x_, y_;
  int width_, height_;
  std::string body_;
  std::vector<std::pair<std::string, std::string>> legend_;
};

std::string integer_label(double v);
std::string bytes_label(double v);

// The power probe's share (caught of probed) as a bar, with the share required marked.
std::string share_bar(double caught, double probed, double required);

// Points of one series (x, y where y is present), drawn as circles joined where consecutive.
struct Series {
  std::string key, name;
  std::vector<std::pair<double, double>> points;
  std::vector<std::vector<std::pair<double, double>>> runs;  // unbroken stretches
};

void add_series(Chart& c, const Series& s, std::size_t colour, const std::string& extra = {});
Series series_of(const json& rows, const char* x_key, const char* y_key, std::string name);
std::vector<double> ys(const std::vector<Series>& all);

}  // namespace dpcheck::html::detail
