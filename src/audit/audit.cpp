// The write audit's reading, judging, running and reporting side (see src/audit/audit.hpp); the recording side
// is the preload library, src/audit/audit_preload.cpp.
#include "src/audit/audit.hpp"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "src/error.hpp"
#include "src/io/json_limits.hpp"
#include "src/io/process.hpp"

namespace dpcheck::audit {

namespace fs = std::filesystem;

namespace {

std::optional<int> rank_of(const nlohmann::json& j) {
  const auto it = j.find("rank");
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int>();
}

std::string text_of(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

long number_of(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<long>() : 0;
}

// Strips trailing separators so that "/data/" and "/data" are one prefix.
std::string without_trailing_slash(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string normal(std::string_view p) { return without_trailing_slash(fs::path(p).lexically_normal().string()); }

// Whether `path` is `prefix` or lies below it, at a directory boundary. `strict`: only below it.
bool covers(std::string_view prefix, std::string_view path, bool strict = false) {
  if (prefix == "/") return path.size() > 1 || (!strict && path == "/");
  if (!path.starts_with(prefix)) return false;
  if (path.size() == prefix.size()) return !strict;
  return path[prefix.size()] == '/';
}

bool is_mkdir(std::string_view call) { return call == "mkdir" || call == "mkdirat" || call == "mkdtemp"; }

nlohmann::json rank_json(const std::optional<int>& rank) { return rank ? nlohmann::json(*rank) : nlohmann::json(); }

}  // namespace

// ---- records -------------------------------------------------------------------------------------------

std::vector<std::string_view> Record::written() const {
  std::vector<std::string_view> out{path};
  if (!to.empty()) out.emplace_back(to);
  return out;
}

Log parse_log(std::string_view text) {
  Log log;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    // A line nested past any real record is malformed like any other (and parsing it would overflow the stack).
    const nlohmann::json j =
        json_too_deep(line) ? nlohmann::json() : nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string event = j.is_object() ? text_of(j, "event") : std::string();
    if (event == "start") {
      Process p;
      p.rank = rank_of(j);
      p.pid = number_of(j, "pid");
      p.ppid = number_of(j, "ppid");
      p.exe = text_of(j, "exe");
      if (const auto dirs = j.find("launcher_dirs"); dirs != j.end() && dirs->is_object())
        for (const auto& [var, dir] : dirs->items())
          if (dir.is_string()) p.launcher_dirs.emplace_back(var, dir.get<std::string>());
      log.processes.push_back(std::move(p));
    } else if (event == "write" && j.contains("call") && j.contains("path")) {
      Record r;
      r.rank = rank_of(j);
      r.pid = number_of(j, "pid");
      r.exe = text_of(j, "exe");
      r.call = text_of(j, "call");
      r.path = text_of(j, "path");
      r.to = text_of(j, "to");
      r.target = text_of(j, "target");
      r.flags = text_of(j, "flags");
      r.mode = text_of(j, "mode");
      r.result = text_of(j, "result");
      r.truncated = j.value("truncated", false);
      log.records.push_back(std::move(r));
    } else {
      log.unreadable.emplace_back(line);
    }
  }
  return log;
}

// ---- the judgement --------------------------------------------------------------------------------------

AllowList default_allow_list() {
  return {
      {"/dev/shm", "shared memory of communication libraries (MPI, NCCL)"},
      {"/proc", "the kernel's process interface (/proc/self/...)"},
      {"/sys", "the kernel's device and driver settings"},
      {"/dev", "devices (/dev/null, GPUs, terminals)"},
  };
}

AllowList launcher_allowances(const Log& log) {
  // Directories that belong to everyone, never to one run.
  std::set<std::string> shared = {"/var/tmp", "/usr/tmp", "/dev/shm"};
  if (const char* tmpdir = std::getenv("TMPDIR"); tmpdir != nullptr && tmpdir[0] == '/') shared.insert(normal(tmpdir));
  AllowList out;
  for (const Process& p : log.processes) {
    if (!p.rank) continue;
    for (const auto& [var, dir] : p.launcher_dirs) {
      if (dir.empty() || dir[0] != '/') continue;
      const std::string d = normal(dir);
      const auto depth = std::count(d.begin(), d.end(), '/');
      if (depth < 2 || shared.contains(d)) continue;
      if (std::any_of(out.begin(), out.end(), [&](const Allowance& a) { return a.prefix == d; })) continue;
      const std::string who = var.starts_with("OMPI_") ? "Open MPI's session directory of this run"
                                                       : "the PMIx server's directory of this run";
      out.push_back({d, who + " (" + var + " of the ranks)"});
    }
  }
  return out;
}

Allowance user_allowance(std::string_view path) {
  if (path.empty()) throw UsageError("--allow needs a path");
  std::error_code ec;
  const fs::path abs = fs::absolute(fs::path(path), ec);
  if (ec) throw UsageError("--allow " + std::string(path) + ": " + ec.message());
  return {normal(abs.string()), "--allow"};
}

namespace {

// `strict` (for a path cut to fit its record): the path must lie below a prefix, not be the prefix
// itself nor lie above it.
const Allowance* find_allowance(std::string_view call, std::string_view path, const AllowList& allow, bool strict) {
  if (path.empty() || path[0] != '/') return nullptr;  // a path whose base was unknown is never allowed
  for (const Allowance& a : allow)
    if (covers(a.prefix, path, strict)) return &a;
  if (is_mkdir(call) && !strict)
    for (const Allowance& a : allow)
      if (covers(path, a.prefix)) return &a;
  return nullptr;
}

// The first path of `r` that no allowance covers, or nullptr. A path that was cut to fit a record is
// allowed only if what is left already lies strictly inside an allowed prefix: the cut may have
// removed the rest of a name ("/data" of "/database").
const std::string* unallowed_path(const Record& r, const AllowList& allow) {
  for (const std::string* p : {&r.path, &r.to}) {
    if (p == &r.to && p->empty()) continue;
    if (find_allowance(r.call, *p, allow, r.truncated) == nullptr) return p;
  }
  return nullptr;
}

}  // namespace

const Allowance* allowed_by(std::string_view call, std::string_view path, const AllowList& allow) {
  return find_allowance(call, path, allow, /*strict=*/false);
}

std::vector<Record> offending(std::span<const Record> records, const AllowList& allow) {
  std::vector<Record> out;
  for (const Record& r : records)
    if (r.rank && *r.rank != 0 && unallowed_path(r, allow) != nullptr) out.push_back(r);
  return out;
}

// ---- running -------------------------------------------------------------------------------------------

std::string RunResult::status_text() const {
  return (timed_out ? "did not end within its timeout and " : "") + exit_status_text(exit_code, signal);
}

fs::path find_library() {
  if (const char* env = std::getenv("DPCHECK_AUDIT_LIBRARY"); env != nullptr && *env != '\0') {
    if (!fs::exists(env)) throw Error(std::string("DPCHECK_AUDIT_LIBRARY names ") + env + ", which does not exist");
    return fs::absolute(env);
  }
  std::error_code ec;
  const fs::path exe = self_executable(ec);
  if (!ec) {
    const fs::path beside = exe.parent_path() / "libdpcheck_audit.so";
    if (fs::exists(beside)) return beside;
  }
#ifdef DPCHECK_AUDIT_BUILD_LIBRARY
  if (fs::exists(DPCHECK_AUDIT_BUILD_LIBRARY)) return DPCHECK_AUDIT_BUILD_LIBRARY;
#endif
  throw Error("cannot find the audit library libdpcheck_audit.so beside " +
              (ec ? std::string("this program") : exe.string()) + "; set DPCHECK_AUDIT_LIBRARY to its path");
}

namespace {

// Removes the log however the run ends.
class TempLog {
 public:
  TempLog() {
    std::string name = (fs::temp_directory_path() / "dpcheck-audit-XXXXXX.jsonl").string();
    const int fd = ::mkstemps(name.data(), 6);
    if (fd < 0) throw Error("cannot create the audit log " + name + ": " + std::strerror(errno));
    ::close(fd);
    path_ = name;
  }
  ~TempLog() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  TempLog(const TempLog&) = delete;
  TempLog& operator=(const TempLog&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// LD_PRELOAD with the library added at the end, unless it is already there (an audit within an audit).
std::string preload_with(const std::string& existing, const std::string& library) {
  std::stringstream entries(existing);
  std::string entry;
  while (entries >> entry) {
    std::size_t start = 0;
    while (start <= entry.size()) {
      const std::size_t end = std::min(entry.find(':', start), entry.size());
      if (entry.substr(start, end - start) == library) return existing;
      start = end + 1;
    }
  }
  return existing.empty() ? library : existing + ":" + library;
}

}  // namespace

RunResult run_audited(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                      const fs::path& library) {
  AuditOptions options;
  options.extra_env = extra_env;
  options.library = library;
  return run_audited(argv, options);
}

RunResult run_audited(const std::vector<std::string>& argv, const AuditOptions& options) {
  const std::vector<std::string>& extra_env = options.extra_env;
  const fs::path& library = options.library;
  if (argv.empty() || argv[0].empty()) throw UsageError("no command to audit");
  for (const std::string& e : extra_env)
    if (e.find('=') == std::string::npos || e.front() == '=')
      throw UsageError("environment entry '" + e + "' is not NAME=VALUE");
  const fs::path lib = library.empty() ? find_library() : fs::absolute(library);
  if (!fs::exists(lib)) throw Error("the audit library " + lib.string() + " does not exist");
  // The dynamic loader splits LD_PRELOAD at spaces and colons.
  if (lib.string().find_first_of(": \t") != std::string::npos)
    throw Error("the audit library's path " + lib.string() + " has a space or colon, which LD_PRELOAD cannot carry");

  TempLog log;
  std::string existing_preload;
  if (const char* p = std::getenv("LD_PRELOAD"); p != nullptr) existing_preload = p;
  for (const std::string& e : extra_env)
    if (env_name(e) == "LD_PRELOAD") existing_preload = e.substr(e.find('=') + 1);
  ChildOptions child;
  child.argv = argv;
  child.search_path = true;
  child.env_set = extra_env;
  std::erase_if(child.env_set, [](const std::string& e) {
    return env_name(e) == "LD_PRELOAD" || env_name(e) == "DPCHECK_AUDIT_MUTANT";
  });
  child.env_set.push_back("LD_PRELOAD=" + preload_with(existing_preload, lib.string()));
  child.env_set.push_back("DPCHECK_AUDIT_LOG=" + log.path().string());
  child.env_unset = options.unset;
  if (options.mutant.empty()) child.env_unset.push_back("DPCHECK_AUDIT_MUTANT");
  else child.env_set.push_back("DPCHECK_AUDIT_MUTANT=" + options.mutant);
  // The output file is opened by the child before the audit library is loaded: not a record.
  if (!options.output.empty()) {
    child.out = ChildOptions::Output::file;
    child.err = ChildOptions::Output::to_stdout;
    child.output_file = options.output;
  }
  if (options.timeout) {
    child.timeout = options.timeout;
    child.new_process_group = true;
  }
  ChildResult ended;
  try {
    ended = run_child(child);
  } catch (const ChildStartError& e) {
    throw UsageError("cannot run '" + argv[0] + "': " + std::strerror(e.error()));
  }

  RunResult result;
  result.log_path = log.path();
  result.exit_code = ended.exit_code;
  result.signal = ended.signal;
  result.timed_out = ended.timed_out;
  std::ifstream in(log.path(), std::ios::binary);
  if (!in) throw Error("cannot read the audit log " + log.path().string());
  std::stringstream text;
  text << in.rdbuf();
  result.log = parse_log(text.str());
  return result;
}

// ---- the report ------------------------------------------------------------------------------------------

namespace {

std::string command_text(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) {
    if (!out.empty()) out += ' ';
    const bool plain =
        !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") ==
                          std::string::npos;
    if (plain) {
      out += a;
    } else {
      out += '\'';
      for (char c : a) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
      out += '\'';
    }
  }
  return out;
}

// What one call did, in one line: call, path(s), flags, mode, and the error if it failed.
std::string call_text(const Record& r) {
  std::string out = r.call;
  if (out.size() < 10) out.resize(10, ' ');
  out += " " + r.path;
  if (!r.to.empty()) out += " -> " + r.to;
  if (!r.target.empty()) out += " (link to " + r.target + ")";
  if (!r.flags.empty()) out += "  " + r.flags;
  if (!r.mode.empty()) out += "  mode " + r.mode;
  if (!r.result.empty() && r.result != "ok") out += "  failed: " + r.result;
  if (r.truncated) out += "  (path cut to fit the record)";
  return out;
}

// The first few processes by name and pid; a shell script can start dozens.
std::string process_list(const std::vector<const Process*>& ps) {
  constexpr std::size_t shown = 8;
  std::string out;
  for (std::size_t i = 0; i < ps.size() && i < shown; ++i) {
    if (!out.empty()) out += ", ";
    out += fs::path(ps[i]->exe).filename().string() + " (pid " + std::to_string(ps[i]->pid) + ")";
  }
  if (ps.size() > shown) out += " and " + std::to_string(ps.size() - shown) + " more";
  return out;
}

}  // namespace

void print_report(std::ostream& out, const std::vector<std::string>& argv, const RunResult& run, const AllowList& allow,
                  std::span<const Record> offenders) {
  const Log& log = run.log;
  out << "\n==== dpcheck audit: " << command_text(argv) << "\n";
  out << "the command " << run.status_text() << "\n";

  // Groups: ranks in order, then no rank (keyed by the largest int so that it comes last).
  const auto key = [](const std::optional<int>& rank) { return rank ? *rank : std::numeric_limits<int>::max(); };
  std::map<int, std::vector<const Process*>> processes;
  for (const Process& p : log.processes) processes[key(p.rank)].push_back(&p);
  std::map<int, std::vector<const Record*>> records;
  for (const Record& r : log.records) records[key(r.rank)].push_back(&r);
  std::set<int> groups;
  for (const auto& [k, v] : processes) groups.insert(k);
  for (const auto& [k, v] : records) groups.insert(k);

  std::size_t ranked = 0;
  for (const Process& p : log.processes) ranked += p.rank ? 1 : 0;
  out << "audited " << log.processes.size() << " process" << (log.processes.size() == 1 ? "" : "es") << ": " << ranked
      << " with a rank, " << log.processes.size() - ranked << " with no rank\n";

  for (const int g : groups) {
    const std::vector<const Record*>& rs = records[g];
    const std::vector<const Process*>& ps = processes[g];
    const bool no_rank = g == std::numeric_limits<int>::max();
    std::size_t bad = 0;
    for (const Record* r : rs) bad += (!no_rank && g != 0 && unallowed_path(*r, allow) != nullptr) ? 1 : 0;
    out << "\n"
        << (no_rank ? std::string("no rank") : "rank " + std::to_string(g)) << ": " << rs.size() << " write-intent call"
        << (rs.size() == 1 ? "" : "s");
    if (no_rank) out << ", not judged (the launcher, its daemons, helpers)";
    else if (g == 0) out << ", not judged (rank 0 may write)";
    else out << ", " << bad << " outside the allowed paths";
    if (!ps.empty()) out << "\n  processes: " << process_list(ps);
    out << "\n";

    // Repeated identical calls (a log appended to every step) are shown once, with their count. The pid
    // tells processes apart where there are several (a forked child has no start record of its own).
    std::set<long> pids;
    for (const Record* r : rs) pids.insert(r->pid);
    std::vector<std::pair<std::string, std::size_t>> lines;
    std::map<std::string, std::size_t> index;
    for (const Record* r : rs) {
      std::string line = call_text(*r);
      if (pids.size() > 1) line += "  pid " + std::to_string(r->pid);
      if (!no_rank && g != 0) {
        const std::string* p = unallowed_path(*r, allow);
        if (p != nullptr) {
          line += "  NOT ALLOWED";
          if (!r->to.empty()) line += " (" + *p + ")";
        } else {
          const Allowance* a = allowed_by(r->call, r->path, allow);
          if (a != nullptr && !covers(a->prefix, r->path)) line += "  allowed: on the way to " + a->prefix;
          else if (a != nullptr) line += "  allowed: " + a->prefix;
        }
      }
      const auto [it, fresh] = index.emplace(line, lines.size());
      if (fresh) lines.emplace_back(line, 1);
      else ++lines[it->second].second;
    }
    for (const auto& [line, count] : lines)
      out << "  " << line << (count > 1 ? "  (" + std::to_string(count) + " times)" : "") << "\n";
  }

  out << "\nallowed for ranks other than 0:\n";
  std::size_t width = 0;
  for (const Allowance& a : allow) width = std::max(width, a.prefix.size());
  for (const Allowance& a : allow)
    out << "  " << a.prefix << std::string(width - a.prefix.size() + 2, ' ') << a.reason << "\n";
  out << "  and mkdir of the directories above these, which mkdir -p makes on the way\n";
  if (!log.unreadable.empty())
    out << "\nwarning: " << log.unreadable.size()
        << " line(s) of the audit log are not records, e.g.: " << log.unreadable.front().substr(0, 200) << "\n";

  out << "\n";
  if (!offenders.empty()) {
    out << "verdict: FAILED: " << offenders.size() << " write-intent call" << (offenders.size() == 1 ? "" : "s")
        << " by ranks other than 0 outside the allowed paths:\n";
    for (const Record& r : offenders) {
      const std::string* p = unallowed_path(r, allow);
      out << "  rank " << *r.rank << " (pid " << r.pid << ", " << r.exe << "): " << r.call << " "
          << (p != nullptr ? *p : r.path) << "\n";
    }
  } else if (log.processes.empty()) {
    out << "verdict: nothing was audited: no process loaded the audit library (a statically linked program, "
           "or one that clears LD_PRELOAD)\n";
  } else {
    std::set<int> ranks;
    for (const Process& p : log.processes)
      if (p.rank) ranks.insert(*p.rank);
    if (ranks.empty()) {
      out << "verdict: passed, but no audited process had a rank (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or "
             "RANK), so no write was judged\n";
    } else {
      std::string seen;
      for (const int r : ranks) seen += (seen.empty() ? "" : ", ") + std::to_string(r);
      out << "verdict: passed: no rank other than 0 wrote outside the allowed paths (ranks seen: " << seen << ")";
      if (!run.succeeded()) out << ", for what ran before the command failed";
      out << "\n";
    }
  }
  if (!run.succeeded())
    out << "note: the command " << run.status_text() << "; the audit covers only what it did before it ended\n";
}

nlohmann::json report_json(const std::vector<std::string>& argv, const RunResult& run, const AllowList& allow,
                           std::span<const Record> offenders) {
  const auto record_json = [&](const Record& r) {
    nlohmann::json j = {{"rank", rank_json(r.rank)},
                        {"pid", r.pid},
                        {"exe", r.exe},
                        {"call", r.call},
                        {"path", r.path},
                        {"flags", r.flags},
                        {"mode", r.mode},
                        {"result", r.result},
                        {"truncated", r.truncated}};
    if (!r.to.empty()) j["to"] = r.to;
    if (!r.target.empty()) j["target"] = r.target;
    if (r.rank && *r.rank != 0) {
      const std::string* p = unallowed_path(r, allow);
      const Allowance* a = allowed_by(r.call, r.path, allow);
      j["allowed_by"] = p == nullptr && a != nullptr ? nlohmann::json(a->prefix) : nlohmann::json();
    }
    return j;
  };
  nlohmann::json j;
  j["passed"] = offenders.empty();
  j["command"] = argv;
  j["exit_code"] = run.signal == 0 ? nlohmann::json(run.exit_code) : nlohmann::json();
  j["signal"] = run.signal != 0 ? nlohmann::json(run.signal) : nlohmann::json();
  j["command_succeeded"] = run.succeeded();
  j["processes"] = nlohmann::json::array();
  for (const Process& p : run.log.processes)
    j["processes"].push_back({{"rank", rank_json(p.rank)}, {"pid", p.pid}, {"ppid", p.ppid}, {"exe", p.exe}});
  j["records"] = nlohmann::json::array();
  for (const Record& r : run.log.records) j["records"].push_back(record_json(r));
  j["allowed"] = nlohmann::json::array();
  for (const Allowance& a : allow) j["allowed"].push_back({{"prefix", a.prefix}, {"reason", a.reason}});
  j["offending"] = nlohmann::json::array();
  for (const Record& r : offenders) j["offending"].push_back(record_json(r));
  j["unreadable_lines"] = run.log.unreadable.size();
  return j;
}

}  // namespace dpcheck::audit
