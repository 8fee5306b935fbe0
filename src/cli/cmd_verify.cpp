// dpcheck verify: runs every property against a target (engine, communicator, optional mutant) and
// prints one table; for a failure, the minimal counterexample and the command that replays it.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mutants/mutants.hpp"
#include "properties/runner.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/report/html.hpp"

namespace dpcheck::cli {

namespace {

struct VerifyOptions {
  TargetOptions target_options{0};
  Target target;  // from target_options
  CaseDraw draw;  // --model, --thorough and the formats the cases draw
  int cases = 100;
  bool cases_given = false;  // --cases
  SeedOption seed_option{1};
  std::uint64_t seed = 1;
  std::vector<std::string> only;  // --property
  std::string reproduce;
  bool reproduce_given = false;
  int reruns = 5;
  std::string model;  // --model
  std::string report, junit, html;
  bool quiet = false;
  bool list_mutants = false;
  bool describe_mutants = false;
};

// The formats verify draws per case where no option fixes them (precision_drawable,
// allreduce_dtype_drawable); a mutant of one precision's path runs in that precision, so that a plain
// --mutant reaches its bug.
void choose_formats(VerifyOptions& o) {
  Target& t = o.target;
  const bool precision_given = o.target_options.given("--precision");
  const MutantInfo* m = t.mutant.empty() ? nullptr : find_mutant(t.mutant);
  if (!precision_given && m && !m->precision.empty()) t.precision = parse_precision(m->precision);
  if (!precision_given && precision_drawable(t))
    o.draw.precisions = {Precision::fp32, Precision::bf16, Precision::fp16};
  if (!o.target_options.given("--allreduce-dtype") && allreduce_dtype_drawable(t))
    o.draw.allreduce_dtypes = {DType::f32, DType::bf16};
}

std::string number(double v, const char* fmt = "%.3g") {
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// Three digits, or six where three would round a ratio just under the bound to 1.
std::string ratio(double v) { return v >= 0.9995 && v <= 1.0 ? number(v, "%.6f") : number(v); }
std::string ratio_text(const PropertyResult& r) { return r.has_error_ratio ? ratio(r.max_error_ratio) : "-"; }
std::string probabilistic_text(const PropertyResult& r) {
  return r.has_probabilistic_ratio ? number(r.max_probabilistic_ratio) : "-";
}
std::string power_text(const PropertyResult& r) { return r.probed > 0 ? number(100 * r.power(), "%.0f%%") : "-"; }

std::string runs_text(const PropertyResult& r) {
  return "fails " + std::to_string(r.failing_runs) + " of " + std::to_string(r.runs) + " runs";
}

nlohmann::json optional_number(bool has, double v) { return has ? nlohmann::json(v) : nlohmann::json(nullptr); }

// Each case's error ratio in four significant digits: enough for a histogram, and a report of a few
// thousand cases stays a few tens of kilobytes a property.
nlohmann::json rounded(const std::vector<double>& ratios) {
  nlohmann::json a = nlohmann::json::array();
  for (double v : ratios) a.push_back(std::isfinite(v) ? std::stod(number(v, "%.4g")) : v);
  return a;
}

nlohmann::json to_json(const VerifyOptions& o, const std::vector<PropertyResult>& results, bool passed) {
  nlohmann::json props = nlohmann::json::array();
  for (const PropertyResult& r : results) {
    nlohmann::json p{{"name", r.name},
                     {"passed", r.passed},
                     {"skipped", r.skipped.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.skipped)},
                     {"cases", r.cases},
                     {"max_error_ratio", optional_number(r.has_error_ratio, r.max_error_ratio)},
                     {"max_probabilistic_ratio", optional_number(r.has_probabilistic_ratio, r.max_probabilistic_ratio)},
                     {"seconds", r.seconds},
                     {"counterexample", r.passed ? nlohmann::json(nullptr) : nlohmann::json(r.counterexample)},
                     {"failure", r.passed ? nlohmann::json(nullptr) : nlohmann::json(r.failure)},
                     {"not_judged", !r.passed && r.not_judged},
                     {"reproduce", r.reproduce.empty() ? nlohmann::json(nullptr)
                                                       : nlohmann::json(failure_replay(o.target, o.draw, r))},
                     {"runs", r.runs > 0 ? nlohmann::json({{"failing", r.failing_runs}, {"total", r.runs}})
                                         : nlohmann::json(nullptr)},
                     {"flaky", r.flaky()},
                     {"replayed", r.replayed},
                     {"distribution", r.distribution},
                     {"error_ratios", rounded(r.error_ratios)}};
    p["power"] = r.probed > 0 ? nlohmann::json({{"probed", r.probed},
                                                {"caught", r.probe_caught},
                                                {"share", r.power()},
                                                {"required", r.min_power},
                                                {"weakest_probe_ratio", r.weakest_probe}})
                              : nlohmann::json(nullptr);
    p["tightness"] = nlohmann::json(nullptr);
    for (int path = 0; path < 2; ++path) {
      if (r.tightness[path] < 0 || r.tightness_paths[path].empty()) continue;
      std::string key(r.tightness_paths[path]);
      std::replace(key.begin(), key.end(), ' ', '_');
      p["tightness"][key] = r.tightness[path];
      p["tightness"]["required"] = r.min_tightness;
    }
    p["closest_call"] = r.closest.ratio >= 0
                            ? nlohmann::json({{"error_ratio", r.closest.ratio},
                                              {"where", r.closest.note},
                                              {"case", r.closest.example},
                                              {"replay", reproduce_command(o.target, o.draw, r.closest.reproduce)}})
                            : nlohmann::json(nullptr);
    props.push_back(std::move(p));
  }
  nlohmann::json target = target_to_json(o.target);
  target["world_size"] = o.target.world_size > 0 ? nlohmann::json(o.target.world_size) : nlohmann::json("drawn");
  target["plugins"] = plugins_json(o.target);
  return {{"passed", passed},
          {"seed", o.seed},
          {"cases_per_property", o.cases},
          {"probabilistic_failure_probability_per_dot_product", kProbabilisticFailure},
          {"target", target},
          {"properties", props}};
}

std::string to_junit(const VerifyOptions& o, const std::vector<PropertyResult>& results) {
  int failures = 0;
  double seconds = 0;
  for (const PropertyResult& r : results) {
    failures += r.passed ? 0 : 1;
    seconds += r.seconds;
  }
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<testsuites>\n<testsuite name=\"dpcheck verify ("
    << xml_escape(o.target.describe(o.draw.precisions, o.draw.allreduce_dtypes) + plugins_text(o.target))
    << ")\" tests=\"" << results.size() << "\" failures=\"" << failures << "\" time=\"" << seconds << "\">\n"
    << plugins_junit(o.target);
  const auto property = [&](const std::string& name, const std::string& value) {
    x << "      <property name=\"" << name << "\" value=\"" << xml_escape(value) << "\"/>\n";
  };
  for (const PropertyResult& r : results) {
    x << "  <testcase classname=\"dpcheck.verify\" name=\"" << r.name << "\" time=\"" << r.seconds << "\">\n";
    x << "    <properties>\n";
    property("cases", std::to_string(r.cases));
    property("max_error_ratio", ratio_text(r));
    property("max_probabilistic_ratio", probabilistic_text(r));
    if (!r.tightness_text().empty()) property("tightness", r.tightness_text(", "));
    if (r.probed > 0) {
      property("power", std::to_string(r.probe_caught) + " of " + std::to_string(r.probed));
      property("power_required", number(100 * r.min_power, "%.0f%%"));
    }
    if (r.closest.ratio >= 0) {
      property("closest_call_ratio", number(r.closest.ratio, "%.4g"));
      property("closest_call_where", r.closest.note);
      property("closest_call_case", r.closest.example);
      property("closest_call_replay", reproduce_command(o.target, o.draw, r.closest.reproduce));
    }
    if (r.runs > 0 && !r.passed) property("runs", runs_text(r));
    x << "    </properties>\n";
    if (!r.skipped.empty()) x << "    <skipped message=\"" << xml_escape(r.skipped) << "\"/>\n";
    if (!r.passed)
      x << "    <failure message=\"" << xml_escape(r.failure) << "\">" << xml_escape(r.counterexample) << "\n"
        << xml_escape(r.reproduce.empty() ? std::string() : failure_replay(o.target, o.draw, r)) << "</failure>\n";
    x << "    <system-out>cases " << r.cases << ", max error ratio " << ratio_text(r) << "</system-out>\n";
    x << "  </testcase>\n";
  }
  x << "</testsuite>\n</testsuites>\n";
  return x.str();
}

// A message of several lines, its first after `head` and the rest indented under it.
std::string indented(const std::string& head, const std::string& text) {
  std::string out;
  std::istringstream lines(text);
  std::string line;
  bool first = true;
  while (std::getline(lines, line)) {
    out += (first ? head : std::string(head.size(), ' ')) + line + "\n";
    first = false;
  }
  return first ? head + "\n" : out;
}

// Target, world and formats from the options; each rank loads its own plugin.
void prepare_target(VerifyOptions& o) {
  o.target = o.target_options.resolved();
  if (!o.model.empty()) o.draw.model_dims = parse_dims(o.model, "--model");
  // Each rank loads its own plugin: one that fails on one rank stops every rank at once.
  agree_on_rank_inputs([&] {
    choose_formats(o);
    validate_target(o.target);
  });
  // A bf16 all-reduce the bound cannot check on the fixed world: refused before any case, not failed in one.
  if (std::string why = allreduce_bound_refusal(o.target, o.target.allreduce_dtype, fixed_world(o.target));
      !why.empty())
    throw UsageError(why);
  if (o.target_options.given("--world-size") || !o.draw.model_dims.empty()) {
    // The cases draw small models unless --model fixes one; the ranks themselves must fit (threads, and
    // their replicas), and the model with a batch of 512 (the most a case draws) in three.
    RunSize run;
    run.world_size = o.target.world_size > 0 ? o.target.world_size : o.draw.thorough ? 16 : 8;
    run.model.dims = o.draw.model_dims;
    if (!run.model.dims.empty()) {
      run.batch = 512;
      run.dataset = 3 * 512;
    }
    run.ranks_are_threads = !o.target.process_world && !o.target.backend->simulated;
    check_run_size(run);
  }
  // A simulated world's case trains every rank's share, N examples a step at least: past 64 ranks the
  // default is 6400 / N cases per property, at least 10 (10 at 4096 ranks, about half a minute).
  if (!o.cases_given && o.target.backend->simulated && o.target.world_size > 64)
    o.cases = std::max(10, 6400 / o.target.world_size);
}

std::vector<const PropertyDef*> select_properties(const VerifyOptions& o) {
  std::vector<const PropertyDef*> selected;
  if (o.reproduce_given) {
    // The token names its property: --property may repeat it, never contradict it.
    if (o.reproduce.empty()) throw UsageError("--reproduce is empty: give the string printed after --reproduce");
    const PropertyDef& p = case_token_property(o.reproduce);
    if (o.only.size() > 1 || (o.only.size() == 1 && o.only[0] != p.name))
      throw UsageError("the --reproduce string replays a case of " + std::string(p.name) + ", not of " +
                       (o.only.empty() ? std::string("another property") : o.only[0]));
    selected.push_back(&p);
  } else if (o.only.empty()) {
    for (const PropertyDef& p : properties()) selected.push_back(&p);
  } else {
    for (const std::string& name : o.only) selected.push_back(&find_property(name));
  }
  return selected;
}

std::string row(const char* fmt, auto... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return std::string(buf);
}

// Runs the properties in order, each row printed (by `say`) as it ends, with a progress line.
std::vector<PropertyResult> run_properties(const VerifyOptions& o, const std::vector<const PropertyDef*>& selected,
                                           const std::function<void(const std::string&)>& say, Progress& progress) {
  std::vector<PropertyResult> results;
  for (const PropertyDef* p : selected) {
    const std::string at = "  [" + std::to_string(results.size() + 1) + "/" + std::to_string(selected.size()) + "] " +
                           std::string(p->name) + ": ";
    RunOptions ro;
    ro.cases = std::max(1, o.cases / p->case_divisor);
    ro.seed = o.seed;
    ro.reproduce = o.reproduce;
    ro.reruns = o.reruns;
    ro.plugin_fault_ends_run = true;
    ro.draw = o.draw;
    if (progress.enabled())
      ro.progress = [&](std::int64_t cases, std::int64_t shrinks) {
        progress.update(at + std::to_string(std::min<std::int64_t>(cases, ro.cases)) + " of " +
                        std::to_string(ro.cases) + " cases" +
                        (shrinks ? ", shrinking (" + std::to_string(shrinks) + ")" : std::string()) + ", " +
                        number(progress.seconds(), "%.1f") + " s");
      };
    progress.update(at + "0 of " + std::to_string(ro.cases) + " cases, " + number(progress.seconds(), "%.1f") + " s");
    PropertyResult r = run_property(*p, o.target, ro);
    progress.done();
    say(row("%-38s %6lld %7s %12s %12s %6s %7.2f s\n", r.name.c_str(), static_cast<long long>(r.cases),
            !r.skipped.empty() ? "skipped"
            : r.passed         ? "yes"
                               : "NO",
            ratio_text(r).c_str(), probabilistic_text(r).c_str(), power_text(r).c_str(), r.seconds));
    results.push_back(std::move(r));
  }

  return results;
}

// How often each class of case was reached, per property.
void describe_classes(std::ostream& details, const std::vector<PropertyResult>& results) {
  for (const PropertyResult& r : results) {
    if (!r.skipped.empty()) details << "\n" << r.name << ": skipped: " << r.skipped << "\n";
    if (r.distribution.empty()) continue;
    details << "\n" << r.name << ":";
    // One line a class (the report's distribution keeps their combinations): how often each was reached.
    std::map<std::string, int> per_class;
    for (const auto& [key, count] : r.distribution)
      for (std::size_t start = 0; start <= key.size();) {
        const std::size_t end = std::min(key.find("; ", start), key.size());
        per_class[key.substr(start, end - start)] += count;
        start = end + 2;
      }
    for (const auto& [tag, count] : per_class) details << "\n  " << count << " of " << r.cases << " cases: " << tag;
    details << "\n";
  }
}

void describe_closest_calls(std::ostream& details, const VerifyOptions& o, const std::vector<PropertyResult>& results) {
  bool any_closest = false;
  for (const PropertyResult& r : results) {
    if (r.closest.ratio < 0 || !r.passed) continue;
    if (!any_closest)
      details << "\nclosest calls (the passing case nearest its bound; the probabilistic ratio uses a failure "
                 "probability of "
              << number(kProbabilisticFailure, "%g") << " per dot product):\n";
    any_closest = true;
    details << "  " << r.name << ": error ratio " << ratio(r.closest.ratio)
            << (r.replayed ? " (the replayed case passes, " + std::to_string(r.runs) + " of " + std::to_string(r.runs) +
                                 " runs)"
                           : "")
            << "\n"
            << indented("    where: ", r.closest.note) << indented("    case:  ", r.closest.example)
            << "    replay: " << reproduce_command(o.target, o.draw, r.closest.reproduce) << "\n";
  }
}

void describe_tightness_and_power(std::ostream& details, const std::vector<PropertyResult>& results) {
  for (const PropertyResult& r : results) {
    if (r.tightness_text().empty()) continue;
    details << "\n"
            << r.name << ": tightness: the largest error ratio of plain rounding (no kink term) was "
            << r.tightness_text() << "; at least " << number(r.min_tightness) << " required over "
            << min_tightness_cases << " cases or more\n";
  }
  for (const PropertyResult& r : results) {
    if (r.probed == 0) continue;
    details << "\n"
            << r.name << ": power: one example dropped left the bound in " << r.probe_caught << " of " << r.probed
            << " cases (" << power_text(r) << ", at least " << number(100 * r.min_power, "%.0f%%")
            << " required); the weakest drop came to " << number(r.weakest_probe) << " times the bound\n";
  }
}

void describe_failures(std::ostream& details, const VerifyOptions& o, const std::vector<PropertyResult>& results) {
  for (const PropertyResult& r : results) {
    if (r.passed) continue;
    details << "\nFAILED " << r.name << " after " << r.cases << " passing cases";
    if (!r.reproduce.empty()) details << ", shrunk " << r.shrinks << " times";
    if (r.runs > 0)
      details << "; the minimal case " << runs_text(r) << (r.flaky() ? " (a failure that comes and goes)" : "");
    details << "\n";
    if (r.not_judged)
      details << "  (what the property runs failed before its promise could be judged: the promise itself is not "
                 "shown broken)\n";
    if (!r.counterexample.empty()) details << indented("  minimal case: ", r.counterexample);
    details << indented("  why: ", r.failure);
    if (!r.reproduce.empty())
      details << "  replay"
              << (r.flaky() ? " (it " + runs_text(r) + ": the command runs it " +
                                  std::to_string(comes_and_goes_reruns) + " times)"
                            : "")
              << ": " << failure_replay(o.target, o.draw, r) << "\n";
  }
}

// The mutants' rows as a Markdown table: what each needs to show, the property aimed at it, its bug.
void describe_mutants(std::ostream& out) {
  out << "| mutant | needs | caught by | the bug |\n| --- | --- | --- | --- |\n";
  for (const MutantInfo& m : mutants()) {
    std::string needs;
    const auto add = [&](const std::string& what) { needs += (needs.empty() ? "" : ", ") + what; };
    if (!m.engine.empty()) add("`--engine " + std::string(m.engine) + "`");
    if (!m.precision.empty()) add("`--precision " + std::string(m.precision) + "`");
    if (m.scale) add("scale");
    out << "| `" << m.name << "` | " << needs << " | " << m.caught_by << " | " << m.bug << " |\n";
  }
}

int run_verify(VerifyOptions& o) {
  if (o.list_mutants || o.describe_mutants) {
    if (!is_printing_rank()) return exit_ok;
    if (o.describe_mutants) describe_mutants(std::cout);
    else
      for (const MutantInfo& m : mutants()) std::cout << m.name << "\n";
    return exit_ok;
  }
  if (o.cases < 1) throw UsageError("--cases must be at least 1");
  if (o.reruns < 1 || o.reruns > 1000) throw UsageError("--reruns must be in [1, 1000]");
  o.seed = o.seed_option.value();
  prepare_target(o);
  const std::vector<const PropertyDef*> selected = select_properties(o);
  check_on_writing_rank([&] {
    if (!o.report.empty()) check_output_path(o.report, "--report");
    if (!o.junit.empty()) check_output_path(o.junit, "--junit");
    if (!o.html.empty()) check_output_path(o.html, "--html");
  });
  // Every process must draw the same cases: rank 0's seed is everyone's.
  if (o.target.process_world) o.target.process_world->broadcast(&o.seed, 1, DType::u64, 0);

  // Under a launcher only rank 0 prints and writes reports; the others run the same cases silently.
  const bool printing = is_printing_rank();
  const auto say = [&](const std::string& text) {
    if (!printing) return;
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  };
  Progress progress(printing && Progress::wanted(o.quiet));
  say("dpcheck verify: " + o.target.describe(o.draw.precisions, o.draw.allreduce_dtypes) + plugins_text(o.target) +
      ", world size " +
      (o.target.world_size > 0 ? std::to_string(o.target.world_size)
                               : std::string(o.draw.thorough ? "drawn from 1-16 (thorough)" : "drawn from 1-8")) +
      (o.target.world_size == 0 && scale_one_in(o.target) > 0 ? " and the scale class" : "") + ", " +
      (o.reproduce_given ? std::string("one replayed case") : std::to_string(o.cases) + " cases per property") +
      ", seed " + std::to_string(o.seed) + "\n\n");
  say(row("%-38s %6s %7s %12s %12s %6s %9s\n", "property", "cases", "passed", "error ratio", "prob. ratio", "power",
          "time"));
  const std::vector<PropertyResult> results = run_properties(o, selected, say, progress);
  bool all_passed = true;
  for (const PropertyResult& r : results) all_passed &= r.passed;

  std::ostringstream details;
  describe_classes(details, results);
  describe_closest_calls(details, o, results);
  describe_tightness_and_power(details, results);
  describe_failures(details, o, results);
  details << "\n" << (all_passed ? "all properties passed" : "some properties FAILED") << "\n";
  say(details.str());

  if (printing && (!o.report.empty() || !o.html.empty())) {
    const nlohmann::json report = to_json(o, results, all_passed);
    if (!o.report.empty()) write_file_atomic(o.report, report.dump(2) + "\n");
    if (!o.html.empty()) write_file_atomic(o.html, html::verify_page(report));
  }
  if (printing && !o.junit.empty()) write_file_atomic(o.junit, to_junit(o, results));
  return all_passed ? exit_ok : exit_check_failed;
}

}  // namespace

Runner add_verify(CLI::App& app) {
  auto o = std::make_shared<VerifyOptions>();
  CLI::App* sub = app.add_subcommand("verify",
                                     "Run every property against the CPU engine and local backend "
                                     "(or the chosen target) and print one table");
  sub->footer(
      "What the cases draw (each property's case-class lines show how often each was reached):\n"
      "  every training property  the model (1-4 layers, widths, relu/tanh/identity, mse/cross-entropy), the\n"
      "                           batch and a data set of 1-3 batches, the world size (1-8), the split\n"
      "                           (strided, contiguous), the policy (pad, drop-last, uneven), shuffling, the\n"
      "                           optimizer (sgd, momentum at 0.9, 0.5, 0.99 or 0, adam) and its rate,\n"
      "                           steps (1-7), the step checked, the seed, sizes on both sides of the\n"
      "                           communicator's algorithm thresholds; on the cpu engine, unless fixed by\n"
      "                           an option, the precision (fp32, bf16, fp16 with dynamic loss scaling)\n"
      "                           and the all-reduce dtype (fp32, bf16)\n"
      "  accumulation             2-4 micro-batches per rank (bucketing too)\n"
      "  checkpoint resume        the step at which training is checkpointed and resumed\n"
      "  buckets                  the bucket size (one element, splitting a weight, a whole layer or more)\n"
      "  loss scaler              overflow patterns on a drawn rank, growth intervals, factors, first\n"
      "                           scales, and a resume at any step (mid-interval too)\n"
      "  learning-rate schedule   --warmup-steps 0-6 and --linear-scaling\n"
      "  shuffle                  64-bit seeds and epochs up to 2^40\n"
      "  divergence tools         one planted difference: its phase (examples, local gradient, all-reduce,\n"
      "                           update, optimizer state), step, rank and element (often a tensor's last);\n"
      "                           a replay with the same fault or one moved in rank, element or kind;\n"
      "                           drift across two world sizes, with a bug in either run or none\n"
      "  scale class              on the local backend, one case in 16 of the gradient, loss and sampler\n"
      "                           properties: 63, 64, 65, 255, 256, 1000, 1024 or 4096 simulated ranks,\n"
      "                           small models, batches under 2N; the sampler's data sets past 2^31 too\n"
      "  all-reduce schedules     the schedule, format, sum or avg, 1-8 ranks or (one case in 4) 63-4096,\n"
      "                           values spread over magnitudes or chains of half spacings\n"
      "  share weights            1-8 ranks or 63-4096, data sets to 3N, past 2^24 and past 2^31, shares\n"
      "                           past 2^31, the policy and split, the step, 1-4 micro-batches, loss\n"
      "                           scales 1 to 2^24\n"
      "  --thorough               world sizes 1-16, 1-5 layers, up to 12 steps, 500 cases\n"
      "A mutant of one precision's path runs in that precision unless --precision is given.\n"
      "Exit status: 0 every property passed; 1 a property failed (with its minimal case and replay line);\n"
      "2 bad usage; 3 a runtime fault (a plugin's error, a launcher's).");
  sub->add_option("--cases", o->cases,
                  "Cases per property (default 100; 500 with --thorough; on more than 64 simulated ranks 6400 / N, "
                  "at least 10)");
  sub->add_flag("--thorough", o->draw.thorough,
                "Draw harder: 500 cases per property unless --cases says otherwise, from a wider space (world sizes "
                "1-16, 1-5 layers, up to 12 steps); minutes where the default takes seconds");
  o->seed_option.add_to(*sub, "RapidCheck seed; the same seed runs the same cases");
  sub->add_option("--property", o->only, "Run only this property (repeatable)");
  sub->add_option("--reproduce", o->reproduce,
                  "Replay one case: the minimal case of a failure, or a closest call (the string printed with it)");
  sub->add_option("--reruns", o->reruns,
                  "Runs of a failing case, to tell a steady failure from one that comes and goes (default 5)");
  sub->add_option("--model", o->model,
                  "Fix every training scenario's layer widths, input first (e.g. 64,64,10); the rest is still drawn");
  o->target_options.add_to(*sub, target_option::training);
  o->target_options.reword("--world-size", "Fix the number of ranks (default: each case draws 1-8)");
  o->target_options.reword("--mutant", "Run against a deliberately broken part (see --list-mutants)");
  sub->add_option("--report", o->report, "Write a JSON report to this file");
  sub->add_option("--junit", o->junit, "Write a JUnit XML report to this file");
  sub->add_option("--html", o->html,
                  "Write an HTML page to this file: the table, each property's error ratios as a histogram, its "
                  "power and closest call, each failure with its minimal case and replay line (self-contained)");
  sub->add_flag("--quiet", o->quiet, "No progress line on standard error (shown only on a terminal)");
  sub->add_flag("--list-mutants", o->list_mutants, "Print the mutants' names, one a line, and exit");
  sub->add_flag("--describe-mutants", o->describe_mutants,
                "Print every mutant as a Markdown table (what it needs, the property aimed at it, its bug), and exit")
      ->excludes("--list-mutants");
  return [o, sub] {
    o->reproduce_given = sub->count("--reproduce") > 0;
    o->cases_given = sub->count("--cases") > 0;
    if (o->draw.thorough && !o->cases_given) o->cases = 500;
    return run_verify(*o);
  };
}

}  // namespace dpcheck::cli
