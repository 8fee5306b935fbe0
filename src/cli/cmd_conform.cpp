// dpcheck conform: does a user's communicator or kernel plugin keep the promises? One table of checks
// (conform/conform.hpp), printed row by row as each is decided, then each failure with the promise
// that broke, its minimal case and the command that replays it; JSON and JUnit reports like verify's.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "conform/conform.hpp"
#include "conform/conform_run.hpp"
#include "properties/conform_rows.hpp"
#include "properties/properties.hpp"
#include "reference/allreduce_schedule.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/io/process.hpp"
#include "src/plugin/plugin_loader.hpp"
#include "src/report/html.hpp"

namespace dpcheck::cli {

namespace {

struct ConformCliOptions {
  TargetOptions target_options{4};
  Target target;  // from target_options, its world resolved
  int cases = 30;
  SeedOption seed_option{1};
  std::string check, case_text;
  bool no_properties = false;
  bool list_checks = false;
  bool absent_rank_probe = false;  // hidden: the child half of "a rank that never arrives"
  std::string schedule;            // --schedule
  bool allreduce_only = false;     // --allreduce-only
  double max_mib = 64;
  int max_size = 1024;
  bool thorough = false;
  bool max_size_given = false, max_mib_given = false;
  std::string report, junit, html;
  bool quiet = false;
};

// The plugin under test as the reports title it: its path, and its table's name and version.
// "what it declares: dtypes ...; all-reduce ops ...\n" for a communicator plugin, "" otherwise.
std::string capabilities_line(const ConformCliOptions& o) {
  for (const PluginIdentity& p : target_plugins(o.target))
    if (p.option == "--comm") return "what it declares: " + p.capabilities + "\n";
  return "";
}

std::string plugin_title(const ConformCliOptions& o) {
  const std::string path = o.target.kernels.empty() ? o.target.backend->name : o.target.kernels;
  for (const PluginIdentity& p : target_plugins(o.target))
    if (p.path == path && (p.option == "--kernels") == !o.target.kernels.empty())
      return path + ", '" + p.name + "'" + (p.version.empty() ? std::string() : " " + p.version) + ", plugin ABI " +
             std::to_string(p.abi);
  // A built-in backend: MPI's own collectives name the library, and the algorithm when one is forced.
  if (const Backend& row = *o.target.backend; row.mpi != MpiUse::none) {
    std::string title = path;
    if (const std::string v = mpi_library_version(); !v.empty()) title += ", " + v;
    const char* dynamic = std::getenv("OMPI_MCA_coll_tuned_use_dynamic_rules");
    const char* algorithm = std::getenv("OMPI_MCA_coll_tuned_allreduce_algorithm");
    if (row.mpi == MpiUse::collectives && dynamic && algorithm && std::string(dynamic) != "0")
      title += ", coll_tuned_allreduce_algorithm " + std::string(algorithm);
    return title;
  }
  return path;
}

nlohmann::json to_json(const ConformCliOptions& o, std::uint64_t seed, int world, const std::vector<ConformRow>& rows,
                       bool passed) {
  nlohmann::json plugin{{"kind", o.target.kernels.empty() ? "comm" : "kernels"},
                        {"path", o.target.kernels.empty() ? o.target.backend->name : o.target.kernels},
                        {"engine", o.target.engine->name},
                        {"name", nullptr},
                        {"version", nullptr},
                        {"abi", nullptr}};
  // The plugin's own name, version and ABI (and a communicator's dtypes and ops), as its table says.
  for (const nlohmann::json& p : plugins_json(o.target))
    if (p["option"] == (o.target.kernels.empty() ? "--comm" : "--kernels"))
      for (const char* key : {"name", "version", "abi", "dtypes", "ops"})
        if (p.contains(key)) plugin[key] = p[key];
  return {{"passed", passed}, {"seed", seed},        {"thorough", o.thorough},
          {"plugin", plugin}, {"world_size", world}, {"checks", conform_rows_json(rows)}};
}

std::string to_junit(const ConformCliOptions& o, const std::vector<ConformRow>& rows) {
  std::size_t failures = 0, skipped = 0;
  double total = 0;
  for (const ConformRow& r : rows) {
    failures += r.verdict == ConformVerdict::fail;
    skipped += r.verdict == ConformVerdict::skip || r.verdict == ConformVerdict::unsupported;
    total += r.seconds;
  }
  std::ostringstream x;
  x << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites>\n<testsuite name=\"dpcheck conform ("
    << xml_escape(plugin_title(o)) << ")\" tests=\"" << rows.size() << "\" failures=\"" << failures << "\" skipped=\""
    << skipped << "\" time=\"" << total << "\">\n"
    << plugins_junit(o.target);
  for (const ConformRow& r : rows) {
    x << "  <testcase classname=\"dpcheck.conform." << xml_escape(r.section) << "\" name=\"" << xml_escape(r.check)
      << "\" time=\"" << r.seconds << "\">\n";
    if (r.verdict == ConformVerdict::skip) x << "    <skipped message=\"" << xml_escape(r.detail) << "\"/>\n";
    if (r.verdict == ConformVerdict::unsupported)
      x << "    <skipped message=\"unsupported: " << xml_escape(r.detail) << "\"/>\n";
    if (r.verdict == ConformVerdict::fail)
      x << "    <failure message=\"" << xml_escape(r.promise) << "\">" << xml_escape(r.detail)
        << "\nminimal case: " << xml_escape(r.minimal) << "\nreplay: " << xml_escape(r.replay) << "</failure>\n";
    x << "    <system-out>" << xml_escape(r.detail) << "</system-out>\n  </testcase>\n";
  }
  x << "</testsuite>\n</testsuites>\n";
  return x.str();
}

// Refuses what cannot run (UsageError), before any output; sets the target's timeout, precision and
// world, and returns the world size.
int check_conform_request(ConformCliOptions& o) {
  const bool kernels = !o.target_options.kernels.empty();
  const bool comm_given = o.target_options.given("--comm");
  if (kernels && comm_given)
    throw UsageError("conform checks one plugin at a time: give --comm PATH or --kernels PATH, not both");
  if (!kernels && !comm_given)
    throw UsageError("conform needs a plugin: --comm PATH (a communicator) or --kernels PATH (kernels)");
  o.target = o.target_options.target();
  // A built-in backend is checked as a plugin is: mpi-native under mpirun is MPI's own collectives, whose
  // algorithm Open MPI's MCA parameters choose (docs: "MPI's own all-reduce").
  if (!kernels && o.target.backend->engine_default)
    throw UsageError("--comm " + o.target.backend->name +
                     ": conform checks a communicator other than dpcheck's default; give "
                     "the path to a plugin's shared object (e.g. ./libmy_comm.so) or another backend (mpi-native)");
  if (o.cases < 1) throw UsageError("--cases must be at least 1");
  if (!(o.max_mib >= 0 && o.max_mib <= 4096)) throw UsageError("--max-mib must be in [0, 4096]");
  if (o.max_size < 1 || o.max_size > 4096) throw UsageError("--max-size must be in [1, 4096]");
  if (o.max_size_given && !kernels)
    throw UsageError("--max-size is for kernel plugins (--kernels); a communicator's buffers take --max-mib");
  if (!kernels)
    check_conform_comm_selection(o.check, o.case_text, o.no_properties ? nullptr : &conform_property_rows());
  if (!o.schedule.empty()) {
    if (kernels) throw UsageError("--schedule is for a communicator (--comm): a kernel plugin has no all-reduce");
    (void)reference::parse_schedule(o.schedule);
  }
  if (o.allreduce_only && kernels)
    throw UsageError("--allreduce-only is for a communicator (--comm): a kernel plugin has no all-reduce");
  if (o.allreduce_only && !o.check.empty() && !o.check.starts_with("property ") && !is_allreduce_check(o.check))
    throw UsageError("--allreduce-only with --check '" + o.check + "': that check is not one of the all-reduce's");
  if (o.check.starts_with("schedule ") && o.schedule.empty())
    throw UsageError("--check '" + o.check + "' needs --schedule NAME, the schedule the communicator claims");
  const bool world_size_given = o.target_options.given("--world-size");
  const int world = resolve_world(o.target, o.target_options.world_size, world_size_given);
  // A world size given (or the launcher's) is the world of every row, verify's properties included.
  o.target.world_size = o.target.process_world || world_size_given ? world : 0;
  // What the plugin does not declare is reported row by row ("unsupported"), not refused.
  validate_target(o.target, GradientAllreduce::not_required);
  return world;
}

// Refuses a run too large for this machine, or an output path that cannot be written, before any output.
void check_conform_resources(const ConformCliOptions& o, int world) {
  RunSize run;
  run.world_size = world;
  run.ranks_are_threads = !o.target.process_world;
  check_run_size(run);
  if (const std::size_t count = o.target.kernels.empty() ? conform_case_count(o.check, o.case_text) : 0) {
    // Each rank holds its input, its output (an allgather's is N times the count), the expected values
    // and a copy, in elements of up to 8 bytes: refused here rather than failing dpcheck's own
    // allocation midway, which would read as the plugin's fault.
    const double ranks_here = o.target.process_world ? 1.0 : world;
    require_memory(static_cast<double>(count) * 8.0 * ranks_here * (world + 3.0),
                   "--case '" + o.case_text + "' (count " + std::to_string(count) + ")");
  }
  check_on_writing_rank([&] {
    if (!o.report.empty()) check_output_path(o.report, "--report");
    if (!o.junit.empty()) check_output_path(o.junit, "--junit");
    if (!o.html.empty()) check_output_path(o.html, "--html");
  });
}

ConformRequest conform_request(const ConformCliOptions& o) {
  ConformRequest r;
  r.seed = o.seed_option.value();
  r.cases = o.cases;
  r.check = o.check;
  r.case_text = o.case_text;
  r.properties = o.no_properties ? nullptr : &conform_property_rows();
  r.thorough = o.thorough;
  r.max_mib = o.max_mib;
  r.max_mib_given = o.max_mib_given;
  r.max_size = o.max_size;
  r.max_size_given = o.max_size_given;
  r.world_size_given = o.target_options.given("--world-size");
  r.schedule = o.schedule;
  r.allreduce_only = o.allreduce_only;
  return r;
}

// The lines above the table: the plugin, the world, the seed (and a communicator's capabilities).
std::string conform_header(const ConformCliOptions& o, int world, std::uint64_t seed) {
  const bool kernels = !o.target.kernels.empty();
  return "dpcheck conform: " + std::string(kernels ? "kernels " : "communicator ") + plugin_title(o) + " (engine " +
         std::string(o.target.engine->name) + "), " +
         (kernels
              ? std::string("properties with ") + (o.target.world_size > 0 ? std::to_string(world) : "1-8") + " ranks"
              : "world size " + std::to_string(world) + (o.target.process_world ? " (processes)" : " (threads)")) +
         ", seed " + std::to_string(seed) + (o.thorough ? ", thorough" : "") + "\n" +
         (kernels ? std::string() : capabilities_line(o)) + "\n";
}

// Runs the suite, printing each row as it is decided (the header waits for the first row, so that a
// refused --check or --case prints its one line alone) and a progress line on a terminal.
std::vector<ConformRow> run_and_print_rows(const ConformCliOptions& o, int world, ConformOptions& co,
                                           const std::function<void(const std::string&)>& say) {
  const std::string header = conform_header(o, world, co.seed);
  bool headed = false;
  Progress progress(is_printing_rank() && Progress::wanted(o.quiet));
  std::size_t decided = 0;
  const auto elapsed = [&] {
    char s[32];
    std::snprintf(s, sizeof s, "%.1f s", progress.seconds());
    return std::string(s);
  };
  if (progress.enabled())
    co.on_cases = [&](const std::string& check, std::int64_t cases, std::int64_t total) {
      progress.update("  [" + std::to_string(decided + 1) + "] " + check + ": " +
                      std::to_string(std::min(cases, total)) + " of " + std::to_string(total) + " cases, " + elapsed());
    };
  co.on_row = [&](const ConformRow& r) {
    progress.done();
    if (!headed) {
      say(header);
      say(conform_table_head());
      headed = true;
    }
    say(conform_table_line(r));
    ++decided;
    progress.update("  " + std::to_string(decided) + " checks decided, " + elapsed());
  };
  progress.update("  running the first check, " + elapsed());
  std::vector<ConformRow> rows = run_conform_suite(o.target, world, co);
  progress.done();
  return rows;
}

int run_conform(ConformCliOptions& o) {
  const bool kernels = !o.target.kernels.empty();
  if (o.list_checks) {
    if (is_printing_rank()) {
      for (const std::string& c : kernels ? conform_kernel_checks() : conform_comm_checks()) std::cout << c << "\n";
      for (const PropertyDef& p : properties()) std::cout << "property " << p.name << "\n";
    }
    return exit_ok;
  }
  const int world = check_conform_request(o);
  if (o.absent_rank_probe) return conform_absent_rank_probe(o.target, world);
  check_conform_resources(o, world);
  ConformOptions co = conform_options(o.target, world, conform_request(o));

  const bool printing = is_printing_rank();
  const auto say = [&](const std::string& text) {
    if (!printing) return;
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  };
  const std::vector<ConformRow> rows = run_and_print_rows(o, world, co, say);
  const ConformSummary summary = conform_summary(rows);
  if (rows.empty()) throw UsageError("--check '" + o.check + "' matched no check (see --list-checks)");
  say(summary.text);
  if (printing && (!o.report.empty() || !o.html.empty())) {
    const nlohmann::json report = to_json(o, co.seed, world, rows, summary.passed);
    if (!o.report.empty()) write_file_atomic(o.report, report.dump(2) + "\n");
    if (!o.html.empty()) write_file_atomic(o.html, html::conform_page(report));
  }
  if (printing && !o.junit.empty()) write_file_atomic(o.junit, to_junit(o, rows));
  return summary.passed ? exit_ok : exit_check_failed;
}

}  // namespace

Runner add_conform(CLI::App& app) {
  auto o = std::make_shared<ConformCliOptions>();
  CLI::App* sub = app.add_subcommand(
      "conform",
      "Check that a plugin keeps dpcheck's promises: a communicator's (--comm ./libmine.so) collectives on exact "
      "and random inputs, how it sums, a missing rank; a kernel plugin's (--kernels) ops against the float64 "
      "reference; then every property of verify with the plugin in place");
  namespace f = target_option;
  TargetOptions& t = o->target_options;
  t.add_to(*sub, f::comm | f::kernels | f::precision | f::engine | f::world_size | f::timeout);
  t.reword("--comm", "The communicator plugin: a path to its shared object");
  t.reword("--precision",
           "fp32 (default), bf16 or fp16: verify's properties run with the plugin in the engine at this "
           "precision (its linear ops then receive inputs rounded to the format); the per-op checks are "
           "float32 ops as ever");
  t.reword("--engine", engine_option_help() +
                           ": the one whose buffers are where the plugin takes them (host or device "
                           "memory)");
  t.reword("--world-size",
           "Ranks, as threads of this process (default 4, with the collectives also on 1, 2, 3, 5 and 8 "
           "ranks; given, that world alone; under mpirun, its processes)");
  sub->add_option("--cases", o->cases,
                  "Cases per property of verify, and drawn shapes per kernel check (a quarter of them for the "
                  "determinism checks) (default 30)");
  o->seed_option.add_to(*sub, "Seed of the random inputs and of the properties' cases");
  std::string schedules;
  for (const reference::ScheduleRow& row : reference::allreduce_schedules())
    schedules += (schedules.empty() ? "" : ", ") + std::string(row.name);
  std::string libraries;
  for (const reference::LibrarySchedule& row : reference::library_schedules())
    libraries += (libraries.empty() ? "" : ", ") + std::string(row.name);
  sub->add_option(
      "--schedule", o->schedule,
      "The all-reduce schedule the communicator claims, one of " + schedules +
          " (hierarchical:G for groups of G ranks, 8 without), or a library's algorithm with the switch it "
          "makes by size (" +
          libraries +
          "): its all-reduce's bits are checked against the schedule's "
          "emulation, bit for bit, in every format and op it takes. Where a library leaves the schedule for "
          "another one's exact bits at some sizes, the row says 'switches' and where");
  sub->add_flag("--allreduce-only", o->allreduce_only,
                "Only the all-reduce's checks (exact sums in every dtype and op, the buffer reused, same bits, "
                "run-to-run, --schedule's, the fingerprint): for a library whose variables choose its all-reduce's "
                "algorithm alone, such as MPI's");
  sub->add_option("--check", o->check, "Run this check alone (see --list-checks)");
  sub->add_option("--case", o->case_text,
                  "With --check: run this case alone, as a failure prints it (\"count=5 offset=1\")");
  sub->add_flag("--no-properties", o->no_properties, "Skip verify's properties (the plugin's own checks only)");
  sub->add_option("--max-mib", o->max_mib,
                  "The largest buffer a collective check passes, in MiB (default 16; 64 with --thorough)");
  sub->add_option("--max-size", o->max_size,
                  "Kernel plugins: the largest dimension (rows, in, out) a drawn shape reaches (default 1024)");
  sub->add_flag("--thorough", o->thorough,
                "The full sweep: buffers to 64 MiB, every count on every world size (the default is a quick first "
                "verdict, fit to run on every change)");
  sub->add_option("--report", o->report, "Write a JSON report to this file");
  sub->add_option("--junit", o->junit, "Write a JUnit XML report to this file");
  sub->add_option("--html", o->html,
                  "Write an HTML page to this file: every check's row and verdict, each failure with its promise, "
                  "minimal case and replay line (self-contained)");
  sub->add_flag("--quiet", o->quiet, "No progress line on standard error (shown only on a terminal)");
  sub->add_flag("--list-checks", o->list_checks, "Print the checks' names, one a line, and exit");
  sub->add_flag("--absent-rank-probe", o->absent_rank_probe)->group("");
  return [o, sub] {
    o->max_size_given = sub->count("--max-size") > 0;
    o->max_mib_given = sub->count("--max-mib") > 0;
    return run_conform(*o);
  };
}

}  // namespace dpcheck::cli
