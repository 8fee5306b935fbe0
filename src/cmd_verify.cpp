// dpcheck verify: runs every property against a target (engine, communicator, optional mutant) and
// prints one table; for a failure, the minimal counterexample and the command that replays it.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "properties/mutants.hpp"
#include "properties/runner.hpp"
#include "src/cli_common.hpp"
#include "src/commands.hpp"
#include "src/error.hpp"
#include "src/files.hpp"

namespace dpcheck::cli {

namespace {

struct VerifyOptions {
  Target target;
  int cases = 100;
  std::uint64_t seed = 1;
  std::vector<std::string> only;  // --property
  std::string reproduce;
  std::string report, junit;
  bool list_mutants = false;
  bool world_size_given = false;
  double timeout_s = 60;
};

std::string ratio_text(const PropertyResult& r) {
  if (!r.has_error_ratio) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", r.max_error_ratio);
  return buf;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string replay_command(const VerifyOptions& o, const PropertyResult& r) {
  std::string cmd = "dpcheck verify --property " + r.name;
  if (o.target.engine != "cpu") cmd += " --engine " + o.target.engine;
  if (o.target.comm != "local") cmd = "mpirun -np " + std::to_string(o.target.process_world->size()) + " " + cmd + " --comm " + o.target.comm;
  if (!o.target.mutant.empty()) cmd += " --mutant " + o.target.mutant;
  if (o.target.world_size > 0 && !o.target.process_world) cmd += " --world-size " + std::to_string(o.target.world_size);
  return cmd + " --reproduce " + shell_quote(r.reproduce);
}

nlohmann::json to_json(const VerifyOptions& o, const std::vector<PropertyResult>& results, bool passed) {
  nlohmann::json props = nlohmann::json::array();
  for (const PropertyResult& r : results) {
    nlohmann::json p{{"name", r.name},
                     {"passed", r.passed},
                     {"skipped", r.skipped.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.skipped)},
                     {"cases", r.cases},
                     {"max_error_ratio", r.has_error_ratio ? nlohmann::json(r.max_error_ratio) : nlohmann::json(nullptr)},
                     {"seconds", r.seconds},
                     {"counterexample", r.passed ? nlohmann::json(nullptr) : nlohmann::json(r.counterexample)},
                     {"failure", r.passed ? nlohmann::json(nullptr) : nlohmann::json(r.failure)},
                     {"reproduce", r.reproduce.empty() ? nlohmann::json(nullptr) : nlohmann::json(replay_command(o, r))},
                     {"distribution", r.distribution}};
    props.push_back(std::move(p));
  }
  return {{"passed", passed},
          {"seed", o.seed},
          {"cases_per_property", o.cases},
          {"target",
           {{"engine", o.target.engine},
            {"comm", o.target.comm},
            {"mutant", o.target.mutant.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.target.mutant)},
            {"world_size", o.target.world_size > 0 ? nlohmann::json(o.target.world_size) : nlohmann::json("drawn")}}},
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
    << "<testsuites>\n<testsuite name=\"dpcheck verify (" << xml_escape(o.target.describe()) << ")\" tests=\""
    << results.size() << "\" failures=\"" << failures << "\" time=\"" << seconds << "\">\n";
  for (const PropertyResult& r : results) {
    x << "  <testcase classname=\"dpcheck.verify\" name=\"" << r.name << "\" time=\"" << r.seconds << "\">\n";
    if (!r.passed)
      x << "    <failure message=\"" << xml_escape(r.failure) << "\">" << xml_escape(r.counterexample) << "\n"
        << xml_escape(replay_command(o, r)) << "</failure>\n";
    x << "    <system-out>cases " << r.cases << ", max error ratio " << ratio_text(r) << "</system-out>\n";
    x << "  </testcase>\n";
  }
  x << "</testsuite>\n</testsuites>\n";
  return x.str();
}

int run_verify(VerifyOptions& o) {
  if (o.list_mutants) {
    if (is_printing_rank())
      for (const MutantInfo& m : mutants()) std::cout << m.name << "\n";
    return exit_ok;
  }
  if (o.cases < 1) throw UsageError("--cases must be at least 1");
  if (o.timeout_s <= 0) throw UsageError("--timeout must be positive");
  o.target.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.timeout_s * 1000));
  const int world = resolve_world(o.target, o.target.world_size, o.world_size_given);
  if (o.target.process_world) o.target.world_size = world;
  validate_target(o.target);
  std::vector<const PropertyDef*> selected;
  if (o.only.empty())
    for (const PropertyDef& p : properties()) selected.push_back(&p);
  else
    for (const std::string& name : o.only) selected.push_back(&find_property(name));
  if (!o.reproduce.empty() && selected.size() != 1)
    throw UsageError("--reproduce replays one property: name it with --property");
  if (!o.report.empty()) check_writable(o.report);
  if (!o.junit.empty()) check_writable(o.junit);
  // Every process must draw the same cases: rank 0's seed is everyone's.
  if (o.target.process_world) o.target.process_world->broadcast(&o.seed, 1, DType::u64, 0);

  // Under a launcher only rank 0 prints and writes reports; the others run the same cases silently.
  const bool printing = is_printing_rank();
  const auto say = [&](const std::string& text) {
    if (!printing) return;
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  };
  const auto row = [](const char* fmt, auto... args) {
    char buf[256];
    std::snprintf(buf, sizeof buf, fmt, args...);
    return std::string(buf);
  };
  const bool tty = printing && ::isatty(STDERR_FILENO);
  say("dpcheck verify: " + o.target.describe() + ", world size " +
      (o.target.world_size > 0 ? std::to_string(o.target.world_size) : std::string("drawn from 1-8")) + ", " +
      std::to_string(o.cases) + " cases per property, seed " + std::to_string(o.seed) + "\n\n");
  say(row("%-38s %6s %7s %16s %9s\n", "property", "cases", "passed", "max error ratio", "time"));

  std::vector<PropertyResult> results;
  bool all_passed = true;
  for (const PropertyDef* p : selected) {
    RunOptions ro;
    ro.cases = std::max(1, o.cases / p->case_divisor);
    ro.seed = o.seed;
    ro.reproduce = o.reproduce;
    if (tty)
      ro.progress = [&](std::int64_t cases, std::int64_t shrinks) {
        std::fprintf(stderr, "\r  %s: %lld cases%s", std::string(p->name).c_str(), static_cast<long long>(cases),
                     shrinks ? (", shrinking (" + std::to_string(shrinks) + ")").c_str() : "");
        std::fflush(stderr);
      };
    PropertyResult r = run_property(*p, o.target, ro);
    if (tty) std::fprintf(stderr, "\r\033[K");
    say(row("%-38s %6lld %7s %16s %7.2f s\n", r.name.c_str(), static_cast<long long>(r.cases),
            !r.skipped.empty() ? "skipped" : r.passed ? "yes" : "NO", ratio_text(r).c_str(), r.seconds));
    all_passed &= r.passed;
    results.push_back(std::move(r));
  }

  std::ostringstream details;
  for (const PropertyResult& r : results) {
    if (!r.skipped.empty()) details << "\n" << r.name << ": skipped: " << r.skipped << "\n";
    if (r.distribution.empty()) continue;
    details << "\n" << r.name << ":";
    for (const auto& [tag, count] : r.distribution) details << "\n  " << count << " of " << r.cases << " cases: " << tag;
    details << "\n";
  }
  for (const PropertyResult& r : results) {
    if (r.passed) continue;
    details << "\nFAILED " << r.name << " after " << r.cases << " passing cases, shrunk " << r.shrinks << " times\n"
            << "  minimal case: " << r.counterexample << "\n"
            << "  why: ";
    // Multi-line messages (a located replica difference) keep their own indentation.
    std::istringstream lines(r.failure);
    std::string line;
    bool first = true;
    while (std::getline(lines, line)) {
      details << (first ? "" : "       ") << line << "\n";
      first = false;
    }
    if (!r.reproduce.empty()) details << "  replay: " << replay_command(o, r) << "\n";
  }
  details << "\n" << (all_passed ? "all properties passed" : "some properties FAILED") << "\n";
  say(details.str());

  if (printing && !o.report.empty()) write_file_atomic(o.report, to_json(o, results, all_passed).dump(2) + "\n");
  if (printing && !o.junit.empty()) write_file_atomic(o.junit, to_junit(o, results));
  return all_passed ? exit_ok : exit_check_failed;
}

}  // namespace

Runner add_verify(CLI::App& app) {
  auto o = std::make_shared<VerifyOptions>();
  CLI::App* sub = app.add_subcommand("verify", "Run every property against the CPU engine and local backend "
                                               "(or the chosen target) and print one table");
  sub->add_option("--world-size", o->target.world_size, "Fix the number of ranks (default: each case draws 1-8)");
  sub->add_option("--cases", o->cases, "Cases per property (default 100)");
  sub->add_option("--seed", o->seed, "RapidCheck seed (default 1); the same seed runs the same cases");
  sub->add_option("--mutant", o->target.mutant, "Run against a deliberately broken part (see --list-mutants)");
  sub->add_option("--property", o->only, "Run only this property (repeatable)");
  sub->add_option("--reproduce", o->reproduce, "Replay the minimal case of an earlier failure (printed with it)");
  sub->add_option("--engine", o->target.engine, "Engine: cpu (default) or cuda");
  sub->add_option("--comm", o->target.comm,
                  "Communicator: local (threads, default) or mpi (under mpirun) for the cpu engine; cuda-local (replicas "
                  "on one GPU, default) or nccl for the cuda engine");
  sub->add_flag("--tf32", o->target.tf32, "cuda engine: TF32 matrix products (the bound uses u = 2^-11)");
  sub->add_option("--timeout", o->timeout_s, "Seconds a collective may wait for a peer (default 60)");
  sub->add_option("--report", o->report, "Write a JSON report to this file");
  sub->add_option("--junit", o->junit, "Write a JUnit XML report to this file");
  sub->add_flag("--list-mutants", o->list_mutants, "Print the mutants' names, one a line, and exit");
  return [o, sub] {
    o->world_size_given = sub->count("--world-size") > 0;
    if (sub->count("--comm") == 0) o->target.comm = default_comm(o->target.engine);
    return run_verify(*o);
  };
}

}  // namespace dpcheck::cli
