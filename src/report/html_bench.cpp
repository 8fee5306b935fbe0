// The bench pages (src/report/html.hpp): `dpcheck bench scaling`, its speed-up and step time against N
// with the break-even marked, and any other bench table, its fields and rows with busbw plotted against
// message size where the rows carry it.
#include <algorithm>
#include <cstddef>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/report/html.hpp"
#include "src/report/html_internal.hpp"

namespace dpcheck::html {

std::string scaling_page(const nlohmann::json& report) {
  using namespace detail;
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
        c.marker_x(*n, std::string("break-even ") + k + " N=" + exact(*n),
                   attr("data-break-even", k) + attr("data-x", *n));
    b += c.svg();
    std::string even;
    for (const char* k : {"predicted", "measured"})
      even += std::string(even.empty() ? "" : "; ") + k + " " +
              (has(be, k) ? "N = " + value_text(be.at(k)) : "none in range");
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

std::string bench_page(const nlohmann::json& report, std::string_view title) {
  using namespace detail;
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
  return bench_page(nlohmann::json::parse(report.dump()), title);
}

}  // namespace dpcheck::html
