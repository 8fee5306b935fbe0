// `dpcheck audit`: runs a command (usually an MPI launch of a training program) with the write-audit
// library preloaded into every process, then prints every write-intent call grouped by rank and judges
// them: only rank 0 may write outside the allowed paths (src/audit/audit.hpp).
#include <signal.h>
#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "src/audit/audit.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"

namespace dpcheck::cli {

namespace {

struct AuditArgs {
  std::vector<std::string> allow;
  std::string json;
  std::vector<std::string> command;
};

// Ctrl-C while the command runs goes to the command (it shares the terminal's process group); the
// audit waits for it to end and still reports what it did.
class IgnoreInterrupts {
 public:
  IgnoreInterrupts() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGINT, &ignore, &int_);
    ::sigaction(SIGQUIT, &ignore, &quit_);
  }
  ~IgnoreInterrupts() {
    ::sigaction(SIGINT, &int_, nullptr);
    ::sigaction(SIGQUIT, &quit_, nullptr);
  }
  IgnoreInterrupts(const IgnoreInterrupts&) = delete;
  IgnoreInterrupts& operator=(const IgnoreInterrupts&) = delete;

 private:
  struct sigaction int_ {};
  struct sigaction quit_ {};
};

int run_audit(const AuditArgs& args) {
  if (args.command.empty())
    throw UsageError("no command to audit: dpcheck audit [--allow PATH]... [--json FILE] -- COMMAND ARGS...");
  audit::AllowList allow = audit::default_allow_list();
  for (const std::string& a : args.allow) {
    // The parser would take the "--" that starts the command as --allow's value.
    if (a.starts_with("-")) throw UsageError("--allow needs a path, got '" + a + "'");
    allow.push_back(audit::user_allowance(a));
  }
  if (!args.json.empty()) check_output_path(args.json, "--json");

  audit::RunResult run;
  {
    IgnoreInterrupts ignore;
    run = audit::run_audited(args.command);
  }
  for (audit::Allowance& a : audit::launcher_allowances(run.log)) allow.push_back(std::move(a));
  const std::vector<audit::Record> offenders = audit::offending(run.log.records, allow);

  audit::print_report(std::cout, args.command, run, allow, offenders);
  std::cout.flush();
  if (!args.json.empty())
    write_file_atomic(args.json, audit::report_json(args.command, run, allow, offenders).dump(2) + "\n");

  if (!offenders.empty()) return exit_check_failed;
  if (run.log.processes.empty()) {
    print_error("no process loaded the audit library, so nothing was audited");
    return exit_runtime_error;
  }
  if (!run.log.unreadable.empty()) {
    print_error("the audit log has lines that are not records; a write may have gone unseen");
    return exit_runtime_error;
  }
  if (!run.succeeded()) {
    print_error("the command " + run.status_text() +
                "; no rank other than 0 wrote outside the allowed paths before it ended");
    return exit_runtime_error;
  }
  return exit_ok;
}

}  // namespace

Runner add_audit(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "audit",
      "Run a command with every file write recorded, and check that only rank 0 writes. Every process the\n"
      "command starts (launcher, daemons, ranks) loads an LD_PRELOAD library that records each call that\n"
      "creates, opens for writing, renames, links, truncates or removes a file, with the process's rank\n"
      "(OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or RANK). The report lists every such call by rank.\n"
      "Ranks other than 0 may write only below the allowed paths: /dev/shm, /proc, /sys, /dev, the\n"
      "launcher's own directory of this run (Open MPI's session directory, from the ranks' environment;\n"
      "never all of /tmp), and --allow paths. Processes with no rank are listed but not judged.\n"
      "Not seen: statically linked programs, programs that clear LD_PRELOAD, raw system calls.");
  sub->footer(
      "Exit status: 0 the command succeeded and no rank other than 0 wrote outside the allowed paths;\n"
      "1 a rank other than 0 did (whether or not the command succeeded); 2 bad usage, or the command\n"
      "could not be started; 3 the command failed (non-zero status or a signal) with a clean audit of\n"
      "what it did -- a run that did not finish has not shown that it keeps the promise -- or no\n"
      "process loaded the audit library.\n"
      "Example: dpcheck audit --allow /scratch/logs -- mpirun -np 4 ./train --out /scratch/ckpt");
  auto args = std::make_shared<AuditArgs>();
  sub->add_option("--allow", args->allow,
                  "Also allow writes below PATH for every rank (repeatable; a directory boundary: /data "
                  "does not allow /database)")
      ->type_name("PATH")
      ->allow_extra_args(false);
  sub->add_option("--json", args->json, "Also write the report as JSON to FILE")->type_name("FILE");
  sub->add_option("COMMAND", args->command, "The command to audit and its arguments, after --")->type_name("ARGS");
  return [args]() -> int { return run_audit(*args); };
}

}  // namespace dpcheck::cli
