// What `dpcheck conform` does between parsing and printing (conform/conform_run.hpp).
#include "conform/conform_run.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "divergence/backend_record.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/io/process.hpp"
#include "src/train/replica_check.hpp"

namespace dpcheck {

namespace {

// The variables set in this run that choose the backend's algorithm (a plugin's own list, an MPI
// backend's collective variables: divergence/backend_record.hpp), as they go in front of a command:
// "DPCHECK_GLOO_ALGORITHM=ring ", so that a replay line runs the algorithm the row ran.
std::string algorithm_env(const Target& target) {
  BackendRecord backend = record_backend(target);
  for (PluginRecord& p : backend.plugins) std::erase_if(p.env, [](const auto& v) { return !v.second; });
  return recorded_env_prefix(backend);
}

// "dpcheck conform --comm ./libmine.so ...": the command line that replays a case, to which a row adds
// its world size (communicator checks), --check and --case.
std::string replay_prefix(const Target& target, int world, const ConformRequest& r, std::uint64_t seed) {
  const bool kernels = !target.kernels.empty();
  std::string prefix = algorithm_env(target);
  prefix += target.process_world ? target.backend->launch_prefix(world) : std::string();
  prefix += dpcheck_program() + " conform";
  if (target.engine != &default_engine_row()) prefix += " --engine " + std::string(target.engine->name);
  prefix += kernels ? " --kernels " + shell_word(target.kernels) : " --comm " + shell_word(target.backend->name);
  // Communicator checks add the world size they failed on; kernels' properties add none.
  if (kernels && r.world_size_given) prefix += " --world-size " + std::to_string(world);
  if (!r.schedule.empty()) prefix += " --schedule " + r.schedule;
  if (r.thorough) prefix += " --thorough";
  if (r.max_mib_given) prefix += " --max-mib " + float_text(r.max_mib);
  if (r.max_size_given) prefix += " --max-size " + std::to_string(r.max_size);
  if (seed != 1) prefix += " --seed " + std::to_string(seed);
  return prefix;
}

}  // namespace

ConformOptions conform_options(const Target& target, int world, const ConformRequest& r) {
  const bool kernels = !target.kernels.empty();
  ConformOptions co;
  co.seed = r.seed;
  if (target.process_world) target.process_world->broadcast(&co.seed, 1, DType::u64, 0);
  co.cases = r.cases;
  co.timeout = target.timeout;
  co.check = r.check;
  co.case_text = r.case_text;
  co.properties = r.properties;
  co.thorough = r.thorough;
  co.schedule = r.schedule;
  co.allreduce_only = r.allreduce_only;
  // The quick default stops at 16 MiB, --thorough at 64; --max-mib sets it either way.
  co.max_bytes = static_cast<std::size_t>((r.max_mib_given ? r.max_mib : r.thorough ? 64.0 : 16.0) * 1024 * 1024);
  co.max_kernel_size = r.max_size;
  // Without --world-size the collectives run on several worlds of threads, so that an algorithm that
  // only works for some N (a tree for powers of two, a ring for N > 2) meets the others.
  if (!kernels && !r.world_size_given && !target.process_world) co.extra_world_sizes = {1, 2, 3, 5, 8};
  co.replay_prefix = replay_prefix(target, world, r, co.seed);
  if (kernels) {
    co.absent_rank_skip = "a communicator's check";
  } else if (target.process_world) {
    co.absent_rank_skip = "runs only with the ranks as threads (run conform without a launcher)";
  } else {
    // The probe runs in a child: a plugin that hangs there ends the child (the watchdog), not this run.
    const auto probe_timeout = std::min(co.timeout, std::chrono::milliseconds(5000));
    co.absent_rank_command = {self_executable().string(),
                              "conform",
                              "--engine",
                              std::string(target.engine->name),
                              "--comm",
                              target.backend->name,
                              "--world-size",
                              std::to_string(world),
                              "--timeout",
                              float_text(static_cast<double>(probe_timeout.count()) / 1000.0),
                              "--absent-rank-probe"};
  }
  return co;
}

std::vector<ConformRow> run_conform_suite(const Target& target, int world, const ConformOptions& o) {
  return target.kernels.empty() ? conform_comm(target, world, o) : conform_kernels(target, o);
}

std::string conform_table_head() {
  char line[512];
  std::snprintf(line, sizeof line, "%-12s %-50s %-11s %9s  %s\n", "section", "check", "", "time", "detail");
  return line;
}

std::string conform_table_line(const ConformRow& r) {
  std::string detail = r.detail.size() > 110 ? r.detail.substr(0, 107) + "..." : r.detail;
  if (const auto nl = detail.find('\n'); nl != std::string::npos) detail = detail.substr(0, nl) + " ...";
  char line[512];
  std::snprintf(line, sizeof line, "%-12s %-50s %-11s %7.2f s  %s\n", r.section.c_str(), r.check.c_str(),
                std::string(conform_verdict_name(r.verdict)).c_str(), r.seconds, detail.c_str());
  return line;
}

ConformSummary conform_summary(const std::vector<ConformRow>& rows) {
  ConformSummary s;
  std::size_t unsupported = 0;
  for (const ConformRow& r : rows) unsupported += r.verdict == ConformVerdict::unsupported;
  std::ostringstream details;
  for (const ConformRow& r : rows)
    if (r.verdict == ConformVerdict::info || r.verdict == ConformVerdict::switches)
      details << "\n"
              << r.check << (r.verdict == ConformVerdict::switches ? " (switches): " : ": ") << r.detail << "\n";
  for (const ConformRow& r : rows) {
    if (r.verdict != ConformVerdict::fail) continue;
    s.passed = false;
    details << "\nFAILED " << r.check << "\n  promise: " << r.promise << "\n  minimal case: " << r.minimal
            << "\n  why: " << r.detail << "\n  replay: " << r.replay << "\n";
  }
  details << "\n" << (s.passed ? "the plugin kept every promise checked" : "the plugin broke a promise");
  if (unsupported > 0)
    details << " (" << unsupported << (unsupported == 1 ? " check" : " checks")
            << " not run: unsupported, the plugin says so)";
  details << "\n";
  s.text = details.str();
  return s;
}

nlohmann::json conform_rows_json(const std::vector<ConformRow>& rows) {
  nlohmann::json checks = nlohmann::json::array();
  const auto or_null = [](const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); };
  for (const ConformRow& r : rows) {
    nlohmann::json classes = nlohmann::json::object();
    for (const auto& [name, ratio] : r.ratio_by_shape_class) classes[name] = ratio;
    checks.push_back(
        {{"section", r.section},
         {"check", r.check},
         {"verdict",
          r.verdict == ConformVerdict::fail ? std::string("fail") : std::string(conform_verdict_name(r.verdict))},
         {"detail", r.detail},
         {"promise", or_null(r.promise)},
         {"minimal_case", or_null(r.minimal)},
         {"replay", or_null(r.replay)},
         {"largest_ratio_by_shape_class", r.ratio_by_shape_class.empty() ? nlohmann::json(nullptr) : classes},
         {"seconds", r.seconds}});
  }
  return checks;
}

}  // namespace dpcheck
