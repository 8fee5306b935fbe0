// The HTML pages (src/report/html.hpp) read back as XML: every plotted datum against the report it came
// from (histogram bars against the per-case error ratios, points against rows and steps, markers at the
// report's N), the failure texts as written, and nothing on the page that fetches from anywhere.
// verify's and conform's reports come from real runs of the dpcheck binary, which also writes the page;
// the train and bench reports are built in the schemas their commands write.
#include <gtest/gtest.h>
#include <tinyxml2.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "src/bench/bench.hpp"
#include "src/report/html.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

using nlohmann::json;
using tinyxml2::XMLDocument;
using tinyxml2::XMLElement;

CommandResult run(const std::string& args) { return run_command(std::string(DPCHECK_BINARY) + " " + args, 600); }

std::unique_ptr<XMLDocument> parse(const std::string& page) {
  auto doc = std::make_unique<XMLDocument>();
  doc->Parse(page.c_str(), page.size());
  EXPECT_FALSE(doc->Error()) << doc->ErrorStr() << "\n" << page.substr(0, 2000);
  return doc;
}

// Every element under `e` (itself included) named `name` (any name when empty) that has attribute
// `with` (when given), in document order.
void collect(const XMLElement* e, const std::string& name, const char* with, std::vector<const XMLElement*>& out) {
  for (; e != nullptr; e = e->NextSiblingElement()) {
    if ((name.empty() || name == e->Name()) && (with == nullptr || e->Attribute(with) != nullptr)) out.push_back(e);
    collect(e->FirstChildElement(), name, with, out);
  }
}
std::vector<const XMLElement*> find(const XMLElement* root, const std::string& name, const char* with = nullptr) {
  std::vector<const XMLElement*> out;
  if (root != nullptr) collect(root->FirstChildElement(), name, with, out);
  return out;
}
std::vector<const XMLElement*> find(const XMLDocument& doc, const std::string& name, const char* with = nullptr) {
  std::vector<const XMLElement*> out;
  collect(doc.RootElement(), name, with, out);
  return out;
}

double number(const XMLElement* e, const char* name) {
  const char* v = e->Attribute(name);
  EXPECT_NE(v, nullptr) << e->Name() << " has no " << name;
  return v != nullptr ? std::stod(v) : std::nan("");
}
std::string text_of(const XMLElement* e, const char* name) {
  const char* v = e->Attribute(name);
  return v != nullptr ? v : "";
}

// The section whose attribute `key` is `value`.
const XMLElement* section(const XMLDocument& doc, const char* key, const std::string& value) {
  for (const XMLElement* s : find(doc, "section", key))
    if (text_of(s, key) == value) return s;
  ADD_FAILURE() << "no section with " << key << "=" << value;
  return nullptr;
}

// The texts of the <pre> elements under `root`, as the parser reads them back (entities undone).
std::vector<std::string> pre_texts(const XMLElement* root) {
  std::vector<std::string> out;
  for (const XMLElement* p : find(root, "pre")) out.push_back(p->GetText() != nullptr ? p->GetText() : "");
  return out;
}
bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Nothing that a browser would fetch: no script, stylesheet link, image, frame or object, no src, no
// href but to an id on the page, no url() or @import in the style, no address of any scheme.
void expect_self_contained(const XMLDocument& doc, const std::string& page) {
  for (const char* s : {"http:", "https:", "url(", "@import", "file:", "data:", "<script"})
    EXPECT_EQ(page.find(s), std::string::npos) << s;
  std::set<std::string> ids;
  for (const XMLElement* e : find(doc, "", "id")) ids.insert(e->Attribute("id"));
  std::vector<const XMLElement*> all{doc.RootElement()};
  collect(doc.RootElement()->FirstChildElement(), "", nullptr, all);
  static const std::set<std::string> fetching{"script", "link",  "img",   "image",  "iframe", "frame", "object",
                                              "embed",  "audio", "video", "source", "use",    "base",  "form"};
  for (const XMLElement* e : all) {
    EXPECT_EQ(fetching.count(e->Name()), 0u) << e->Name();
    for (const tinyxml2::XMLAttribute* a = e->FirstAttribute(); a != nullptr; a = a->Next()) {
      const std::string n = a->Name(), v = a->Value();
      EXPECT_NE(n, "src") << e->Name();
      if (n == "href" || n.ends_with(":href")) {
        ASSERT_FALSE(v.empty());
        EXPECT_EQ(v[0], '#') << v;
        EXPECT_EQ(ids.count(v.substr(1)), 1u) << v << " names no id on the page";
      }
    }
  }
  EXPECT_EQ(std::string(doc.RootElement()->Name()), "html");
}

// The points of one series: (data-x, data-y) of its circles, in document order.
std::vector<std::pair<double, double>> points(const XMLElement* root, const std::string& series) {
  std::vector<std::pair<double, double>> out;
  for (const XMLElement* c : find(root, "circle", "data-series"))
    if (text_of(c, "data-series") == series) out.emplace_back(number(c, "data-x"), number(c, "data-y"));
  return out;
}
std::vector<std::pair<double, double>> points(const XMLDocument& doc, const std::string& series) {
  return points(doc.RootElement(), series);
}

// The histogram under `root` holds `ratios`: bars [lo, hi) (the last [lo, hi]) that tile the range
// from 0, counts that sum to the cases and each equal to the ratios in its bar, and the bound at 1.
void expect_histogram_of(const XMLElement* root, const json& ratios) {
  std::vector<const XMLElement*> bars;
  for (const XMLElement* r : find(root, "rect", "data-count")) bars.push_back(r);
  ASSERT_FALSE(bars.empty());
  double sum = 0;
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const double lo = number(bars[i], "data-lo"), hi = number(bars[i], "data-hi");
    const bool last = i + 1 == bars.size();
    EXPECT_EQ(lo, i == 0 ? 0.0 : number(bars[i - 1], "data-hi"));
    EXPECT_LT(lo, hi);
    double in = 0;
    for (const json& r : ratios) {
      const double v = r.get<double>();
      in += (lo <= v && (v < hi || (last && v == hi))) ? 1 : 0;
    }
    EXPECT_EQ(number(bars[i], "data-count"), in) << "bar [" << lo << ", " << hi << ")";
    sum += number(bars[i], "data-count");
  }
  EXPECT_EQ(sum, static_cast<double>(ratios.size()));
  EXPECT_GE(number(bars.back(), "data-hi"), 1.0);
  bool bound = false;
  for (const XMLElement* l : find(root, "line", "data-x")) bound |= number(l, "data-x") == 1.0;
  EXPECT_TRUE(bound) << "no marker at the bound";
}

class HtmlReport : public testing::Test {
 protected:
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  const ScratchDir dir_;
};

TEST(HtmlEscape, EveryMarkupCharacterBecomesAnEntity) {
  EXPECT_EQ(html::escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(html::escape(std::string("x\x1by\tz\n")), "x\xEF\xBF\xBDy\tz\n");
}

TEST_F(HtmlReport, VerifyPageDrawsEachCaseRatioAndThePower) {
  const CommandResult r =
      run("verify --cases 60 --property gradient_average_matches_whole_batch --property "
          "sampler_shards_disjoint --report " +
          path("r.json") + " --html " + path("r.html"));
  ASSERT_EQ(r.status, 0) << r.output;
  const json report = json::parse(read_file(path("r.json")));
  const std::string page = read_file(path("r.html"));
  EXPECT_EQ(page, html::verify_page(report)) << "the command writes the library's page of its report";
  const auto doc = parse(page);
  expect_self_contained(*doc, page);

  const json& grad = report["properties"][0];
  ASSERT_EQ(grad["name"], "gradient_average_matches_whole_batch");
  // Every passing case measured a ratio: the histogram holds them all.
  ASSERT_EQ(grad["error_ratios"].size(), grad["cases"].get<std::size_t>());
  double largest = 0;
  for (const json& v : grad["error_ratios"]) largest = std::max(largest, v.get<double>());
  EXPECT_NEAR(largest, grad["max_error_ratio"].get<double>(), 1e-3 * grad["max_error_ratio"].get<double>());
  const XMLElement* g = section(*doc, "data-property", "gradient_average_matches_whole_batch");
  expect_histogram_of(g, grad["error_ratios"]);
  const auto share = find(g, "rect", "data-caught");
  ASSERT_EQ(share.size(), 1u);
  EXPECT_EQ(number(share[0], "data-caught"), grad["power"]["caught"].get<double>());
  EXPECT_EQ(number(share[0], "data-probed"), grad["power"]["probed"].get<double>());
  const auto required = find(g, "line", "data-required");
  ASSERT_EQ(required.size(), 1u);
  EXPECT_EQ(number(required[0], "data-required"), grad["power"]["required"].get<double>());
  EXPECT_TRUE(contains(pre_texts(g), grad["closest_call"]["replay"].get<std::string>()));

  // A property that measures no ratio draws no histogram.
  const XMLElement* s = section(*doc, "data-property", "sampler_shards_disjoint");
  EXPECT_TRUE(report["properties"][1]["error_ratios"].empty());
  EXPECT_TRUE(find(s, "rect", "data-count").empty());
}

TEST_F(HtmlReport, VerifyPageShowsAFailureWithItsMinimalCaseAndReplay) {
  const CommandResult r =
      run("verify --cases 20 --reruns 1 --mutant allreduce-sum-no-average --property "
          "gradient_average_matches_whole_batch --report " +
          path("r.json") + " --html " + path("r.html"));
  ASSERT_EQ(r.status, 1) << r.output;
  const json report = json::parse(read_file(path("r.json")));
  const std::string page = read_file(path("r.html"));
  EXPECT_EQ(page, html::verify_page(report));
  const auto doc = parse(page);
  expect_self_contained(*doc, page);
  const json& p = report["properties"][0];
  ASSERT_FALSE(p["passed"].get<bool>());
  const XMLElement* sec = section(*doc, "data-property", p["name"].get<std::string>());
  const std::vector<std::string> texts = pre_texts(sec);
  EXPECT_TRUE(contains(texts, p["counterexample"].get<std::string>()));
  EXPECT_TRUE(contains(texts, p["failure"].get<std::string>()));
  EXPECT_TRUE(contains(texts, p["reproduce"].get<std::string>()));
  if (!p["error_ratios"].empty()) expect_histogram_of(sec, p["error_ratios"]);
}

TEST_F(HtmlReport, ConformPageListsEveryCheckAndEachFailure) {
  const CommandResult r =
      run(std::string("conform --comm ") + DPCHECK_RING_PLUGIN +
          " --world-size 2 --no-properties --max-mib 1 --report " + path("c.json") + " --html " + path("c.html"));
  ASSERT_EQ(r.status, 0) << r.output;
  json report = json::parse(read_file(path("c.json")));
  std::string page = read_file(path("c.html"));
  EXPECT_EQ(page, html::conform_page(report));
  auto doc = parse(page);
  expect_self_contained(*doc, page);
  // One table row per check (and the header row), each with its verdict.
  std::vector<const XMLElement*> rows = find(*doc, "tr");
  ASSERT_EQ(rows.size(), report["checks"].size() + 1);

  // A failure whose texts carry markup: escaped on the page, read back whole.
  json& c = report["checks"][0];
  c["verdict"] = "fail";
  c["promise"] = "every rank holds the exact sum <& \"quoted\" 'too'>";
  c["minimal_case"] = "count=5 offset=1";
  c["detail"] = "rank 1 holds <script>alert(1)</script> at element 3";
  c["replay"] = "dpcheck conform --comm ./lib.so --check 'allreduce float32 sum' --case 'count=5 offset=1'";
  report["passed"] = false;
  page = html::conform_page(report);
  doc = parse(page);
  expect_self_contained(*doc, page);
  const XMLElement* f = section(*doc, "data-check", c["check"].get<std::string>());
  const std::vector<std::string> texts = pre_texts(f);
  for (const char* k : {"minimal_case", "detail", "replay"}) EXPECT_TRUE(contains(texts, c[k].get<std::string>())) << k;
  EXPECT_NE(page.find("&lt;script&gt;"), std::string::npos);
}

json train_report() {
  json steps = json::array();
  for (int s = 0; s < 24; ++s) {
    const bool skipped = s == 5 || s == 6;
    json step{{"step", s},
              {"loss", skipped ? json(nullptr) : json(2.5 * std::exp(-0.1 * s) + 0.01 * (s % 3))},
              {"skipped", skipped},
              {"loss_scale", s < 5 ? 65536.0 : 32768.0},
              {"replicas_identical", s != 23},
              {"gradient_error_ratio", s % 4 == 0 ? json(0.05 + 0.01 * s) : json(nullptr)}};
    steps.push_back(step);
  }
  return {{"command", "train"},
          {"target", {{"engine", "cpu"}, {"comm", "local"}, {"world_size", 4}, {"mutant", "optimizer-rank-perturb"}}},
          {"config", {{"model", "8,16,4"}, {"batch", 32}, {"optimizer", "adam"}, {"lr", 1e-3}}},
          {"passed", false},
          {"failure",
           {{"step", 23}, {"what", "replicas differ: layers.0.weight[3] is 0.5 on rank 0 and 0.50000006 on rank 2"}}},
          {"steps", steps}};
}

TEST(HtmlTrain, EveryStepIsPlottedAsTheReportHoldsIt) {
  const json report = train_report();
  const std::string page = html::train_page(report);
  const auto doc = parse(page);
  expect_self_contained(*doc, page);
  std::vector<std::pair<double, double>> loss, ratio;
  std::vector<double> skipped;
  for (const json& s : report["steps"]) {
    if (!s["loss"].is_null()) loss.emplace_back(s["step"].get<double>(), s["loss"].get<double>());
    if (!s["gradient_error_ratio"].is_null())
      ratio.emplace_back(s["step"].get<double>(), s["gradient_error_ratio"].get<double>());
    if (s["skipped"].get<bool>()) skipped.push_back(s["step"].get<double>());
  }
  EXPECT_EQ(points(*doc, "loss"), loss);
  EXPECT_EQ(points(*doc, "gradient_error_ratio"), ratio);
  std::vector<double> marked;
  for (const XMLElement* l : find(*doc, "line", "data-step")) marked.push_back(number(l, "data-step"));
  EXPECT_EQ(marked, skipped);
  bool bound = false;
  for (const XMLElement* l : find(*doc, "line", "data-y")) bound |= number(l, "data-y") == 1.0;
  EXPECT_TRUE(bound);
  // The replica strip: one mark per step, diverged where the report says so.
  const std::vector<const XMLElement*> marks = find(*doc, "rect", "data-identical");
  ASSERT_EQ(marks.size(), report["steps"].size());
  for (std::size_t i = 0; i < marks.size(); ++i) {
    EXPECT_EQ(number(marks[i], "data-step"), report["steps"][i]["step"].get<double>());
    EXPECT_EQ(text_of(marks[i], "data-identical") == "true", report["steps"][i]["replicas_identical"].get<bool>());
    EXPECT_EQ(text_of(marks[i], "class"),
              report["steps"][i]["replicas_identical"].get<bool>() ? "identical" : "diverged");
  }
  EXPECT_TRUE(contains(pre_texts(doc->RootElement()), report["failure"]["what"].get<std::string>()));
}

// The pages `dpcheck train --html` and `dpcheck bench scaling --html` write are the library's pages of
// the reports written beside them, and plot exactly what those hold.
TEST_F(HtmlReport, TrainWritesThePageOfItsReport) {
  const CommandResult r =
      run("train --model 6,12,3 --batch 12 --steps 4 --world-size 2 --check-gradient-every 2 "
          "--bucket-mb 0.0001 --report " +
          path("t.json") + " --html " + path("t.html"));
  ASSERT_EQ(r.status, 0) << r.output;
  const json report = json::parse(read_file(path("t.json")));
  const std::string page = read_file(path("t.html"));
  EXPECT_EQ(page, html::train_page(report));
  const auto doc = parse(page);
  expect_self_contained(*doc, page);
  ASSERT_EQ(report["steps"].size(), 4u);
  std::vector<std::pair<double, double>> loss, ratio;
  for (const json& s : report["steps"]) {
    loss.emplace_back(s["step"].get<double>(), s["loss"].get<double>());
    if (!s["gradient_error_ratio"].is_null())
      ratio.emplace_back(s["step"].get<double>(), s["gradient_error_ratio"].get<double>());
  }
  EXPECT_EQ(points(*doc, "loss"), loss);
  EXPECT_EQ(ratio.size(), 2u);  // steps 0 and 2
  EXPECT_EQ(points(*doc, "gradient_error_ratio"), ratio);
  EXPECT_TRUE(report["passed"].get<bool>());
}

TEST_F(HtmlReport, BenchScalingWritesThePageOfItsReport) {
  const CommandResult r =
      run("bench scaling --model 6,12,3 --batch 8 --world-size 2 --steps 1 --warmup 0 "
          "--bucket-mb 0.0001 --json " +
          path("s.json") + " --html " + path("s.html"));
  ASSERT_EQ(r.status, 0) << r.output;
  const json report = json::parse(read_file(path("s.json")));
  const std::string page = read_file(path("s.html"));
  EXPECT_EQ(page, html::scaling_page(report));
  const auto doc = parse(page);
  expect_self_contained(*doc, page);
  ASSERT_EQ(report["rows"].size(), 2u);
  std::vector<std::pair<double, double>> measured;
  for (const json& row : report["rows"])
    measured.emplace_back(row["ranks"].get<double>(), row["speedup_measured"].get<double>());
  EXPECT_EQ(points(*doc, "speedup_measured"), measured);
  EXPECT_EQ(report["rows"][0]["speedup_measured"].get<double>(), 1.0);
}

TEST(HtmlTrain, AReportMissingItsStepsIsAnErrorNamingIt) {
  json report = train_report();
  report.erase("steps");
  try {
    html::train_page(report);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("steps"), std::string::npos) << e.what();
  }
}

json scaling_report() {
  json rows = json::array();
  const double compute = 40;
  for (int n : {1, 2, 4, 8, 16}) {
    const double comm = n == 1 ? 0 : 6 + 2.0 * n;
    const bool measured = n <= 8;
    rows.push_back(
        {{"ranks", n},
         {"compute_ms", compute / n},
         {"allreduce_ms", n == 1 || !measured ? json(nullptr) : json(comm * 1.1)},
         {"allreduce_fit_ms", n == 1 ? json(nullptr) : json(comm)},
         {"predicted_ms", compute / n + comm},
         {"predicted_overlap_ms", std::max(compute / n, comm)},
         {"measured_ms", measured ? json(compute / n + comm * 1.1) : json(nullptr)},
         {"measured_bucketed_ms", measured ? json(compute / n + comm * 0.8) : json(nullptr)},
         {"speedup_predicted", compute / (compute / n + comm)},
         {"speedup_predicted_overlap", compute / std::max(compute / n, comm)},
         {"speedup_measured", measured ? json(compute / (compute / n + comm * 1.1)) : json(nullptr)},
         {"speedup_measured_bucketed", measured ? json(compute / (compute / n + comm * 0.8)) : json(nullptr)},
         {"model_error", measured ? json(0.1) : json(nullptr)},
         {"exposed_comm_ms", measured ? json(comm) : json(nullptr)},
         {"exposed_comm_bucketed_ms", measured ? json(comm * 0.5) : json(nullptr)}});
  }
  return {{"command", "bench scaling"},
          {"model", "784,256,10"},
          {"batch", 256},
          {"engine", "cpu"},
          {"comm", "local"},
          {"gradient_bytes", 814120},
          {"bucket_mb", 25},
          {"fit", {{"alpha_us", 12.5}, {"beta_gbs", 4.2}, {"rms_relative_error", 0.07}}},
          {"rows", rows},
          {"break_even", {{"predicted", 2}, {"measured", nullptr}}}};
}

TEST(HtmlScaling, EverySpeedUpPointIsTheRowsAndTheBreakEvenSitsAtN) {
  const json report = scaling_report();
  const std::string page = html::scaling_page(report);
  const auto doc = parse(page);
  expect_self_contained(*doc, page);
  for (const char* series :
       {"speedup_predicted", "speedup_predicted_overlap", "speedup_measured", "speedup_measured_bucketed"}) {
    std::vector<std::pair<double, double>> expected;
    for (const json& r : report["rows"])
      if (!r[series].is_null()) expected.emplace_back(r["ranks"].get<double>(), r[series].get<double>());
    EXPECT_FALSE(expected.empty());
    EXPECT_EQ(points(*doc, series), expected) << series;
  }
  std::map<std::string, double> marks;
  for (const XMLElement* l : find(*doc, "line", "data-break-even"))
    marks[text_of(l, "data-break-even")] = number(l, "data-x");
  EXPECT_EQ(marks, (std::map<std::string, double>{{"predicted", 2.0}}));
  bool ideal = false;
  for (const XMLElement* p : find(*doc, "polyline", "data-series")) ideal |= text_of(p, "data-series") == "ideal";
  EXPECT_TRUE(ideal);
}

TEST(HtmlBench, AllreduceBusbwIsPlottedPerBackendAndN) {
  std::vector<bench::AllreduceRow> rows;
  for (const char* backend : {"local", "MPI_Allreduce"})
    for (int n : {2, 4})
      for (std::size_t bytes : {std::size_t{4096}, std::size_t{1} << 20, std::size_t{64} << 20}) {
        bench::AllreduceRow r;
        r.backend = backend;
        r.ranks = n;
        r.bytes = bytes;
        r.count = bytes / 4;
        r.iters = 10;
        r.time_us = static_cast<double>(bytes) / 1e3 + 5 * n;
        r.algbw_gbs = static_cast<double>(bytes) / (r.time_us * 1e3);
        r.busbw_gbs = r.algbw_gbs * 2 * (n - 1) / n;
        rows.push_back(r);
      }
  bench::MemcpyBaseline baseline{std::size_t{64} << 20, 2, 15, 28.5};
  const nlohmann::ordered_json report = bench::allreduce_json(baseline, rows, {"mpi: not built <with MPI>"});
  const std::string page = html::bench_page(report, "bench allreduce");
  const auto doc = parse(page);
  expect_self_contained(*doc, page);
  std::vector<const XMLElement*> circles = find(*doc, "circle", "data-backend");
  ASSERT_EQ(circles.size(), rows.size());
  std::multiset<std::tuple<std::string, double, double, double>> drawn, expected;
  for (const XMLElement* c : circles)
    drawn.emplace(text_of(c, "data-backend"), std::stod(text_of(c, "data-ranks")), number(c, "data-x"),
                  number(c, "data-y"));
  for (const bench::AllreduceRow& r : rows)
    expected.emplace(r.backend, r.ranks, static_cast<double>(r.bytes), r.busbw_gbs);
  EXPECT_EQ(drawn, expected);
  // The rows' table (after the report's fields): a header row and one row per result.
  const std::vector<const XMLElement*> tables = find(*doc, "table");
  ASSERT_FALSE(tables.empty());
  EXPECT_EQ(find(tables.back(), "tr").size(), rows.size() + 1);
  EXPECT_NE(page.find("&lt;with MPI&gt;"), std::string::npos);
}

TEST(HtmlBench, OtherBenchTablesAreTables) {
  const json step = json::array({{{"dims", {784, 256, 10}},
                                  {"batch", 256},
                                  {"eager_ms", 0.31},
                                  {"graph_ms", 0.2},
                                  {"torch_ms", 0.25},
                                  {"ratio", 0.8},
                                  {"goal", 1.0},
                                  {"tflops", 3.1},
                                  {"same_bits", true},
                                  {"torch_note", ""}}});
  const json hash{{"bytes", 1 << 26}, {"hash_ms", 1.2},   {"hash_gbs", 55.0},
                  {"copy_ms", 0.9},   {"copy_gbs", 70.0}, {"ratio", 0.78}};
  const json trace{{"model", "784,256,10"}, {"batch", 256},     {"world_size", 4},
                   {"engine", "cpu"},       {"step_s", 0.01},   {"traced_step_s", 0.0104},
                   {"overhead", 0.04},      {"line_bytes", 900}};
  for (const auto& [report, title] : {std::pair{step, "bench step"}, {hash, "bench hash"}, {trace, "bench trace"}}) {
    const std::string page = html::bench_page(report, title);
    const auto doc = parse(page);
    expect_self_contained(*doc, page);
    const std::vector<const XMLElement*> rows = find(*doc, "tr");
    ASSERT_EQ(rows.size(), 2u) << title;  // the header and the one row
    EXPECT_EQ(find(rows[0], "th").size(), report.is_array() ? report[0].size() : report.size()) << title;
    EXPECT_TRUE(find(*doc, "circle").empty()) << title;
  }
}

}  // namespace
}  // namespace dpcheck
