// only_rank0_writes: `dpcheck train` as separate processes under mpirun, with a checkpoint every step
// and a log, under the write audit (src/audit/audit.hpp), which records every write-intent system call with
// its rank. A case trains from scratch, or stops partway and resumes in a second audited run -- after
// corrupting the newest checkpoint in some cases, so that the resumed run must skip it -- since the
// code that runs on resume (loading, skipping, pruning, cleaning up) writes too. No rank but 0 may
// write outside the allowed paths, rank 0 must have written the log and the final checkpoint, and
// every run must succeed: a run that fails has not shown what it would have written.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

#include "mutants/mutants.hpp"
#include "properties/common.hpp"
#include "src/audit/audit.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/io/process.hpp"

namespace dpcheck {

namespace {

// Flips the last byte of the first parameter file of the newest checkpoint in dir; false if none.
bool corrupt_newest_checkpoint(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::path newest;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind("step-", 0) == 0 && e.path().filename() > newest.filename())
      newest = e.path();
  if (newest.empty()) return false;
  const std::filesystem::path file = newest / "layers.0.weight.npy";
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  if (!f) return false;
  f.seekg(-1, std::ios::end);
  const char c = static_cast<char>(f.get());
  f.seekp(-1, std::ios::end);
  f.put(static_cast<char>(c ^ 0x5a));
  return static_cast<bool>(f);
}

}  // namespace

namespace {

// A third of the cases each: train from scratch; stop and resume; stop, corrupt the newest checkpoint
// and resume (which must skip it for the one before). Shrinks towards a fresh run.
enum class Mode { fresh, resumed, resumed_past_corrupt };

struct AuditCase {
  Scenario scenario;
  Mode mode = Mode::fresh;
};

void showValue(const AuditCase& c, std::ostream& os) {
  os << c.scenario.describe() << " | "
     << (c.mode == Mode::fresh     ? "trained from scratch"
         : c.mode == Mode::resumed ? "stopped and resumed"
                                   : "stopped, newest checkpoint corrupted, resumed");
}

rc::Gen<AuditCase> gen_audit_case(const ScenarioSpace& base) {
  return rc::gen::exec([base] {
    AuditCase c;
    c.mode = static_cast<Mode>(*rc::gen::resize(100, rc::gen::inRange(0, 3)));
    ScenarioSpace space = base;
    if (c.mode != Mode::fresh) {
      // Stopping at step 2 or later leaves two checkpoints (--keep 2), so one can be corrupt.
      space.min_steps = 3;
      space.min_at_step = 2;
    }
    c.scenario = *gen_scenario(space);
    if (c.mode == Mode::fresh) c.scenario.at_step = 0;
    return c;
  });
}

}  // namespace

void rank0_writes_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  ScenarioSpace space = space_for(target, draw);
  space.min_world_size = 2;  // processes: a few, each costs a start-up
  space.max_world_size = 4;
  space.max_batch = 64;
  space.max_steps = 4;
  space.thresholds = nullptr;
  const AuditCase c = *gen_audit_case(space);
  const Scenario& s = c.scenario;
  const bool corrupt = c.mode == Mode::resumed_past_corrupt;
  record.size = size_of(s);
  // One process launches and audits the training runs; with processes of our own, rank 0 does it and
  // tells the others the verdict.
  WriteAuditOutcome o;
  if (!target.process_world || target.process_world->rank() == 0) o = check_rank0_writes(s, target, s.at_step, corrupt);
  if (target.process_world) {
    std::int64_t verdict[3] = {o.passed ? 1 : 0, o.rank0_files, o.not_judged ? 1 : 0};
    target.process_world->broadcast(verdict, 3, DType::i64, 0);
    o.passed = verdict[0] == 1;
    o.rank0_files = verdict[1];
    o.not_judged = verdict[2] == 1;
  }
  RC_TAG(std::string("rank 0 wrote ") + (o.rank0_files >= 10 ? "10 or more" : std::to_string(o.rank0_files)) +
         " files");
  RC_CLASSIFY(s.at_step > 0, corrupt ? "resumed past a corrupt checkpoint" : "resumed");
  record.not_judged = o.not_judged;
  if (!o.passed) fail_case(o.message.empty() ? "rank 0 found a write by another rank" : o.message);
}

std::string rank0_writes_unavailable(const Target&) {
  if (!mpi_available()) return "this build has no MPI backend, and the audit needs separate processes";
  if (find_mpi_launcher().empty()) return "no mpirun or mpiexec on PATH";
  return "";
}

std::string find_mpi_launcher() { return find_in_path({"mpirun", "mpiexec"}); }

std::vector<std::string> launcher_env() {
  return {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "OMPI_MCA_rmaps_base_oversubscribe=1",
          "OMPI_MCA_odls_base_sigkill_timeout=0"};
}

std::string run_failure_reason(const std::string& output) {
  // What launchers print around a failing rank (Open MPI's mpirun, MPICH's mpiexec): never the reason.
  static constexpr std::string_view boilerplate[] = {"Primary job",
                                                     "a non-zero exit code",
                                                     "mpirun ",
                                                     "mpiexec ",
                                                     "the job to be terminated",
                                                     "Process name:",
                                                     "Exit code:",
                                                     "MPI_ABORT",
                                                     "with errorcode",
                                                     "NOTE: invoking",
                                                     "You may or may not see",
                                                     "exactly when Open MPI",
                                                     "process returned",
                                                     "Per user-direction",
                                                     "BAD TERMINATION",
                                                     "=   ",
                                                     "YOUR APPLICATION TERMINATED"};
  std::vector<std::string> errors, others;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line.find_first_not_of("-=* \t") == std::string::npos) continue;
    line = line.substr(first);
    if (std::any_of(std::begin(boilerplate), std::end(boilerplate),
                    [&](std::string_view b) { return line.find(b) != std::string::npos; }))
      continue;
    (line.starts_with("dpcheck: error") || line.starts_with("dpcheck: ") ? errors : others).push_back(line);
  }
  const std::vector<std::string>& kept = errors.empty() ? others : errors;
  std::string out;
  for (std::size_t i = kept.size() > 3 ? kept.size() - 3 : 0; i < kept.size(); ++i)
    out += (out.empty() ? "" : " | ") + kept[i];
  return out.size() > 400 ? out.substr(0, 397) + "..." : out;
}

namespace {
std::atomic<bool> self_is_dpcheck{false};
}  // namespace

void this_process_is_dpcheck() { self_is_dpcheck = true; }

std::string dpcheck_executable() {
  if (const char* env = std::getenv("DPCHECK_BINARY"); env && *env) return env;
  std::error_code ec;
  const std::filesystem::path self = self_executable(ec);
  if (!ec && (self_is_dpcheck || self.filename() == "dpcheck")) return self.string();
  return (audit::find_library().parent_path() / "dpcheck").string();
}

WriteAuditOutcome check_rank0_writes(const Scenario& s, const Target& target, int resume_at, bool corrupt_newest) {
  WriteAuditOutcome o;
  const std::filesystem::path dir = make_scratch(Target{}, "audit", false);
  const std::filesystem::path log = dir / "log.jsonl", checkpoints = dir / "checkpoints", output = dir / "output.txt";

  // One audited run of `steps` steps; the reason it fails the property, if it does.
  const auto audited_run = [&](int steps, bool resume, const std::string& which) -> std::optional<std::string> {
    Scenario run_scenario = s;
    run_scenario.train.steps = steps;
    std::vector<std::string> argv{find_mpi_launcher(), "-np", std::to_string(s.world_size), dpcheck_executable(),
                                  "train"};
    std::stringstream flags(run_scenario.train_flags());
    for (std::string f; flags >> f;) argv.push_back(f);
    // The target's own communicator where it runs under the launcher (a plugin that writes a file on
    // every rank breaks the promise too), dpcheck's process backend (mpi) otherwise.
    // The audited argv names no --engine: it trains on the default engine, whose communicators these are.
    const bool own_comm = target.engine == &default_engine_row() && target.backend->may_run_under_launcher();
    const Backend* row = own_comm ? target.backend : process_backend(default_engine_row());
    argv.insert(argv.end(), {"--comm", row ? row->name : std::string(), "--checkpoint-dir", checkpoints.string(),
                             "--checkpoint-every", "1", "--log", log.string(), "--timeout", "60",
                             // A run that fails a check leaves its bundle in the scratch folder, not in the
                             // user's working directory.
                             "--bundle-dir", (dir / "bundles").string()});
    if (resume) argv.insert(argv.end(), {"--resume", checkpoints.string()});
    if (!target.mutant.empty()) argv.insert(argv.end(), {"--mutant", target.mutant});
    // A kernel plugin runs in every rank's process: one that writes a file breaks the promise too.
    if (!target.kernels.empty()) argv.insert(argv.end(), {"--kernels", target.kernels});
    if (target.precision != Precision::fp32)
      argv.insert(argv.end(), {"--precision", std::string(precision_name(target.precision))});

    audit::AuditOptions options;
    options.extra_env = launcher_env();
    // Launched from inside an MPI job, the new launcher must not think it belongs to this one.
    if (target.process_world)
      options.unset = {"OMPI_COMM_WORLD", "OMPI_MCA_", "PMIX_", "PMI_", "OMPI_FILE", "OMPI_UNIVERSE"};
    options.output = output;
    // A mutant of the audit's own judgement breaks this audit too: only_rank0_writes trusts the audit,
    // and audit_sees_every_write is the property that must notice.
    options.mutant = audit_mutant(target.mutant);
    const audit::RunResult run = audit::run_audited(argv, options);

    std::set<std::string> rank0_paths;
    for (const audit::Record& r : run.log.records)
      if (r.rank == 0 && r.result == "ok")
        for (std::string_view p : r.written())
          if (std::string_view(p).rfind(dir.string(), 0) == 0) rank0_paths.emplace(p);
    o.rank0_files += static_cast<std::int64_t>(rank0_paths.size());

    audit::AllowList allow = audit::default_allow_list();
    const audit::AllowList launcher = audit::launcher_allowances(run.log);
    allow.insert(allow.end(), launcher.begin(), launcher.end());
    const std::vector<audit::Record> bad = audit::offending(run.log.records, allow);

    const auto tail = [&](std::size_t most) {
      std::ifstream f(output);
      std::stringstream ss;
      ss << f.rdbuf();
      const std::string text = ss.str();
      return text.size() > most ? "..." + text.substr(text.size() - most) : text;
    };
    if (!bad.empty())
      return "in the " + which + " run, " + std::to_string(bad.size()) +
             " write-intent calls by ranks other than 0 outside the allowed paths; first: rank " +
             std::to_string(*bad[0].rank) + " " + bad[0].call + " " + bad[0].path +
             (bad[0].to.empty() ? "" : " -> " + bad[0].to);
    if (run.signal != 0 || run.exit_code != 0) {
      // Not a write: the run itself failed, and its writes cannot be judged. Say what failed.
      o.not_judged = true;
      const std::string reason = run_failure_reason(tail(16384));
      return "not a write: the " + which + " run " + run.status_text() + " before its writes could be judged" +
             (reason.empty() ? std::string() : " (dpcheck said: " + reason + ")") +
             "; the audit saw no write by another rank";
    }
    if (!rank0_paths.contains(log.string()))
      return "in the " + which + " run, rank 0 never wrote the log " + log.string() + " (the audit saw " +
             std::to_string(rank0_paths.size()) + " files from rank 0)";
    if (std::none_of(rank0_paths.begin(), rank0_paths.end(),
                     [](const std::string& p) { return p.ends_with("/manifest.json"); }))
      return "the " + which + " run finished but rank 0 never wrote a checkpoint manifest";
    return std::nullopt;
  };

  std::optional<std::string> why;
  o.not_judged = false;
  if (resume_at > 0 && resume_at < s.train.steps) {
    why = audited_run(resume_at, false, "first");
    if (!why && corrupt_newest && !corrupt_newest_checkpoint(checkpoints))
      why = "the first run left no checkpoint to corrupt in " + checkpoints.string();
    if (!why)
      why = audited_run(s.train.steps, true, corrupt_newest ? "resumed (newest checkpoint corrupt)" : "resumed");
  } else {
    why = audited_run(s.train.steps, false, "training");
  }
  o.message = why.value_or("");
  o.passed = o.message.empty();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return o;
}

}  // namespace dpcheck
