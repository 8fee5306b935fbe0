// The page of a training run's report (src/report/html.hpp): the loss curve with the skipped steps
// marked, the loss scale where it moved, the live gradient check against its bound, and the replica check
// as a strip of one mark a step.
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "src/report/html.hpp"
#include "src/report/html_internal.hpp"

namespace dpcheck::html {
namespace detail {

namespace {

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
  std::string s =
      "<svg class=\"strip\" width=\"680\" height=\"44\" viewBox=\"0 0 680 44\" role=\"img\" "
      "aria-label=\"replica check per step\">\n";
  s += "<text class=\"title\" x=\"58\" y=\"12\">replicas bitwise identical after each step (green) or diverged "
       "(red)</text>\n";
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

}  // namespace detail

std::string train_page(const nlohmann::json& report) {
  using namespace detail;
  return drawn("train", [&] {
    const bool passed = report.at("passed").get<bool>();
    const json& steps = report.at("steps");
    std::string b =
        "<h1>dpcheck train " + verdict_badge(passed, "every check passed on every step", "a check FAILED") + "</h1>\n";
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
      b += "<p class=\"note\">checked on " + std::to_string(grad.points.size()) + " of " +
           std::to_string(steps.size()) + " steps</p>\n";
    }

    b += "<h2>replica check</h2>\n";
    std::size_t diverged = 0;
    for (const json& st : steps) diverged += st.at("replicas_identical").get<bool>() ? 0 : 1;
    b += step_strip(steps, x);
    b += "<p>" +
         escape(diverged == 0 ? "every replica bitwise identical after every step"
                              : std::to_string(diverged) + " of " + std::to_string(steps.size()) +
                                    " steps left the replicas different") +
         "</p>\n";

    b += "<h2>run</h2>\n<h3>target</h3>\n" + fields_table(report.at("target")) + "<h3>configuration</h3>\n" +
         fields_table(report.at("config"));
    return page("dpcheck train: " + std::string(passed ? "passed" : "FAILED"), b);
  });
}

}  // namespace dpcheck::html
