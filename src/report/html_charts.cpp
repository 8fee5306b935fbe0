// The SVG charts the pages draw: the axes fitted to the data, the Chart that maps data to pixels and
// writes each datum beside its shape, the power probe's share bar, and the series of points that the
// train and bench pages plot. Split from src/report/html.cpp so that the pages' files hold pages only.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "src/report/html.hpp"
#include "src/report/html_internal.hpp"

namespace dpcheck::html::detail {

namespace {

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

// Series colours cycle through .s0 ... .s7.
std::string series_class(std::size_t i) { return "s" + std::to_string(i % 8); }

}  // namespace

// ---- axes ---------------------------------------------------------------------------------------

Axis fit_axis(std::string label, std::vector<double> values, double log_base, bool from_zero) {
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

// ---- the chart ----------------------------------------------------------------------------------

double Chart::fraction(const Axis& a, double v) {
  if (a.log_base > 0) return (std::log(v) - std::log(a.lo)) / (std::log(a.hi) - std::log(a.lo));
  return (v - a.lo) / (a.hi - a.lo);
}

void Chart::point(double vx, double vy, const std::string& cls, const std::string& data, const std::string& tip) {
  body_ += "<circle" + attr("class", cls) + attr("cx", px(x(vx))) + attr("cy", px(y(vy))) + " r=\"3\"" + data + ">" +
           tag("title", tip) + "</circle>\n";
}

void Chart::polyline(const std::vector<std::pair<double, double>>& pts, const std::string& cls,
                     const std::string& data) {
  if (pts.size() < 2) return;
  std::string p;
  for (const auto& [vx, vy] : pts) p += (p.empty() ? "" : " ") + px(x(vx)) + "," + px(y(vy));
  body_ += "<polyline" + attr("class", cls) + attr("points", p) + data + "/>\n";
}

void Chart::bar(double lo, double hi, double count, const std::string& data, const std::string& tip) {
  const double x0 = x(lo), x1 = x(hi), y0 = y(count);
  body_ += "<rect class=\"bar\"" + attr("x", px(x0 + 0.5)) + attr("y", px(y0)) +
           attr("width", px(std::max(0.5, x1 - x0 - 1))) + attr("height", px(bottom() - y0)) + data + ">" +
           tag("title", tip) + "</rect>\n";
}

void Chart::marker_x(double v, const std::string& label, const std::string& data) {
  body_ += "<line class=\"marker\"" + attr("x1", px(x(v))) + attr("x2", px(x(v))) + attr("y1", px(top())) +
           attr("y2", px(bottom())) + data + "/>\n";
  body_ += "<text" + attr("x", px(x(v) + 3)) + attr("y", px(top() + 11)) + ">" + escape(label) + "</text>\n";
}

void Chart::marker_y(double v, const std::string& label, const std::string& data) {
  body_ += "<line class=\"marker\"" + attr("x1", px(x(x_.lo))) + attr("x2", px(x(x_.hi))) + attr("y1", px(y(v))) +
           attr("y2", px(y(v))) + data + "/>\n";
  body_ += "<text" + attr("x", px(x(x_.hi) - 4)) + attr("y", px(y(v) - 3)) + " text-anchor=\"end\">" + escape(label) +
           "</text>\n";
}

std::string Chart::svg() const {
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

std::string integer_label(double v) { return shown(v, "%.0f"); }
std::string bytes_label(double v) { return bytes_shown(v); }

// The power probe's share (caught of probed) as a bar, with the share required marked.
std::string share_bar(double caught, double probed, double required) {
  const double w = 320, share = probed > 0 ? caught / probed : 0;
  std::string s = "<svg class=\"share-bar\" width=\"340\" height=\"30\" viewBox=\"0 0 340 30\" role=\"img\"" +
                  attr("aria-label", "power " + percent(share)) + ">\n";
  s += "<rect class=\"track\" x=\"0\" y=\"8\"" + attr("width", w) + " height=\"14\"/>\n";
  s += "<rect class=\"share\" x=\"0\" y=\"8\"" + attr("width", px(w * std::clamp(share, 0.0, 1.0))) + " height=\"14\"" +
       attr("data-caught", caught) + attr("data-probed", probed) + attr("data-share", share) + ">" +
       tag("title", exact(caught) + " of " + exact(probed) + " probes caught") + "</rect>\n";
  s += "<line class=\"marker\"" + attr("x1", px(w * required)) + attr("x2", px(w * required)) + " y1=\"2\" y2=\"28\"" +
       attr("data-required", required) + "/>\n";
  return s + "</svg>\n";
}

// ---- series -------------------------------------------------------------------------------------

void add_series(Chart& c, const Series& s, std::size_t colour, const std::string& extra) {
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

}  // namespace dpcheck::html::detail
