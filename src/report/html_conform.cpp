// The page of `dpcheck conform --report` (src/report/html.hpp): the plugin, every check's row and
// verdict, then a section per failure with the promise that broke, its minimal case and its replay line.
#include <map>
#include <string>
#include <vector>

#include "src/report/html.hpp"
#include "src/report/html_internal.hpp"

namespace dpcheck::html {

std::string conform_page(const nlohmann::json& report) {
  using namespace detail;
  return drawn("conform", [&] {
    const bool passed = report.at("passed").get<bool>();
    const json& plugin = report.at("plugin");
    const json& checks = report.at("checks");
    std::string b = "<h1>dpcheck conform " +
                    verdict_badge(passed, "the plugin kept every promise checked", "the plugin broke a promise") +
                    "</h1>\n";
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
                      verdict == "fail"
                          ? Cell{"<a" + attr("href", "#f" + std::to_string(i)) + ">" + escape(name) + "</a>", ""}
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

}  // namespace dpcheck::html
