// The write audit: checks the promise that only rank 0 writes files without trusting the code that
// writes. A command runs with the audit library (src/audit/audit_preload.cpp) preloaded into every process it
// starts; the library records each write-intent call (open for writing, creat, fopen "w", rename,
// unlink, mkdir, truncate, link, symlink, ...) with the rank the launcher gave the process. This file
// reads those records and judges them: a process with a rank other than 0 may write only inside the
// allowed paths. Used by `dpcheck audit` (src/cli/cmd_audit.cpp) and by properties that run training under
// a real launcher.
#pragma once

#include <chrono>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dpcheck::audit {

// A process the audit library was loaded into (its "start" record).
struct Process {
  std::optional<int> rank;  // none: the launcher, its daemons, anything started outside a rank
  long pid = 0;
  long ppid = 0;
  std::string exe;
  // The launcher's per-job directories named in the process's environment, by variable:
  // OMPI_MCA_orte_jobfam_session_dir (Open MPI 4), PMIX_SERVER_TMPDIR (any PMIx launcher).
  std::vector<std::pair<std::string, std::string>> launcher_dirs;
};

// One write-intent call, as the program made it.
struct Record {
  std::optional<int> rank;  // from OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or RANK; none if unset
  long pid = 0;
  std::string exe;
  std::string call;        // the C library function: "openat", "fopen", "rename", "__open_2", ...
  std::string path;        // absolute, with "." and ".." taken by name, symbolic links not followed
  std::string to;          // the second name written by rename and link; empty for other calls
  std::string target;      // a symbolic link's text (not itself a path written); empty for other calls
  std::string flags;       // readable: "O_WRONLY|O_CREAT|O_TRUNC", fopen's mode "w", "AT_REMOVEDIR", ...
  std::string mode;        // creation mode in octal ("0644"); empty when the call creates nothing
  std::string result;      // "ok", or the error's name ("ENOENT"): a failed attempt is still an attempt
  bool truncated = false;  // a path was too long for one record and was cut

  // The paths this call writes: path, and `to` when there is one.
  std::vector<std::string_view> written() const;
};

struct Log {
  std::vector<Process> processes;
  std::vector<Record> records;
  std::vector<std::string> unreadable;  // lines that are not records: reported, never dropped silently
};

// One JSON object a line (the format written by the audit library).
Log parse_log(std::string_view text);

// ---- the judgement ---------------------------------------------------------------------------------

struct Allowance {
  std::string prefix;  // absolute, normal, no trailing '/': allows itself and everything below it
  std::string reason;
};
using AllowList = std::vector<Allowance>;

// /dev/shm, /proc, /sys and /dev: what communication libraries and the system legitimately touch.
AllowList default_allow_list();

// The launcher's per-job directories of this run, as the ranks' environments name them (Open MPI keeps
// its session files there: PMIx shared-memory stores, per-rank directories). A directory that is a
// shared temporary directory itself (/tmp, /var/tmp, $TMPDIR, anything one level below /) is never
// allowed this way.
AllowList launcher_allowances(const Log& log);

// An --allow argument as an allowance: made absolute against the working directory, normalized.
// UsageError for an empty path.
Allowance user_allowance(std::string_view path);

// The allowance that covers `path` for `call`, or nullptr. A prefix covers itself and what lies below it
// at a directory boundary (/data covers /data/x, never /database). mkdir of a directory above an
// allowed one is also allowed: creating the way to it (mkdir -p) changes nothing outside it.
const Allowance* allowed_by(std::string_view call, std::string_view path, const AllowList& allow);

// The records of processes with a rank other than 0 that write a path no allowance covers. Processes
// with no rank (the launcher and its daemons) are reported but never judged.
std::vector<Record> offending(std::span<const Record> records, const AllowList& allow);

// ---- running a command under the audit ----------------------------------------------------------------

struct RunResult {
  Log log;
  std::filesystem::path log_path;  // where the records were collected (already removed)
  int exit_code = -1;              // the command's exit status, when it exited
  int signal = 0;                  // the signal that ended it, or 0
  bool timed_out = false;          // AuditOptions::timeout passed first, and the command was stopped

  bool succeeded() const { return signal == 0 && exit_code == 0 && !timed_out; }
  std::string status_text() const;  // "exited with status 0", "was killed by signal 9 (Killed)"
};

// The audit library: $DPCHECK_AUDIT_LIBRARY, else libdpcheck_audit.so beside the running executable,
// else the one this build made. Error if none exists.
std::filesystem::path find_library();

// Runs argv (argv[0] looked up on PATH) with the audit library preloaded (appended to any LD_PRELOAD)
// and waits for it; its standard streams are this process's. `extra_env` holds NAME=VALUE entries that
// are added to, or replace entries of, this process's environment for the command. `library` empty:
// find_library(). UsageError if the command cannot be started; Error if the records cannot be read.
RunResult run_audited(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {},
                      const std::filesystem::path& library = {});

// The same, for a caller that runs commands of its own (a property): `unset` removes variables whose
// names start with one of its prefixes (a launcher started from inside an MPI job must not inherit that
// job's OMPI_ and PMIX_ variables), and `output`, when set, receives the command's stdout and stderr.
// `mutant` names a deliberately broken judgement of the audit library (audit_preload.cpp, "mutants"),
// for a property that must catch it; every other run, `dpcheck audit`'s included, removes
// DPCHECK_AUDIT_MUTANT from the command's environment, so no user's audit runs broken.
struct AuditOptions {
  std::vector<std::string> extra_env;
  std::vector<std::string> unset;
  std::filesystem::path output;
  std::filesystem::path library;
  std::string mutant;
  // When set, the command (a group of its own: a launcher and its ranks) is sent SIGTERM after this long
  // and RunResult::timed_out says so; unset, it is waited for however long it runs.
  std::optional<std::chrono::milliseconds> timeout;
};
RunResult run_audited(const std::vector<std::string>& argv, const AuditOptions& options);

// ---- the report ------------------------------------------------------------------------------------------

// Every write-intent call grouped by rank (0, 1, ..., then processes with no rank), the allow-list, and
// the verdict with every offending call named by rank and path.
void print_report(std::ostream& out, const std::vector<std::string>& argv, const RunResult& run, const AllowList& allow,
                  std::span<const Record> offenders);

nlohmann::json report_json(const std::vector<std::string>& argv, const RunResult& run, const AllowList& allow,
                           std::span<const Record> offenders);

}  // namespace dpcheck::audit
