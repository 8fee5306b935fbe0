// Child processes (src/io/process.hpp): posix_spawn with the streams, environment and signal dispositions
// the caller asked for, then one loop that reads captured streams, watches the clock and reaps the child.
#include "src/io/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <set>

#include "src/io/files.hpp"

extern char** environ;

namespace dpcheck {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
using Input = ChildOptions::Input;
using Output = ChildOptions::Output;

[[noreturn]] void throw_errno(const char* what) {
  const int err = errno;
  throw Error(std::string(what) + ": " + std::strerror(err));
}

// This process's environment less the `unset` prefixes, with `set` added or replacing.
std::vector<std::string> child_environment(const ChildOptions& o) {
  std::set<std::string_view> replaced;
  for (const std::string& e : o.env_set) {
    if (e.find('=') == std::string::npos || e.front() == '=')
      throw Error("environment entry '" + e + "' for " + o.argv[0] + " is not NAME=VALUE");
    replaced.insert(env_name(e));
  }
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view name = env_name(*e);
    const bool dropped =
        std::any_of(o.env_unset.begin(), o.env_unset.end(), [&](const std::string& p) { return name.starts_with(p); });
    if (!replaced.contains(name) && !dropped) env.emplace_back(*e);
  }
  env.insert(env.end(), o.env_set.begin(), o.env_set.end());
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// A pipe whose ends are not 0, 1 or 2 (where this process has those closed), so that wiring one end to
// the child's standard stream cannot overwrite the other before it is wired. Both ends close on exec.
struct Pipe {
  FileDescriptor read, write;
};
Pipe make_pipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("cannot create a pipe");
  Pipe p{FileDescriptor(fds[0]), FileDescriptor(fds[1])};
  for (FileDescriptor* end : {&p.read, &p.write}) {
    if (end->get() > STDERR_FILENO) continue;
    const int moved = ::fcntl(end->get(), F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    if (moved < 0) throw_errno("cannot move a pipe's end");
    end->reset(moved);
  }
  return p;
}

// posix_spawn's file actions and attributes, destroyed however the start ends.
class SpawnSetup {
 public:
  SpawnSetup() {
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    ::posix_spawn_file_actions_destroy(&actions);
    ::posix_spawnattr_destroy(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
};

// waitpid, over EINTR: true once the child is reaped (`status` set), false while it runs (WNOHANG).
bool reap(pid_t pid, int flags, int& status) {
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, flags);
    if (r == pid) return true;
    if (r == 0) return false;
    if (errno != EINTR) throw_errno("waiting for a child process failed");
  }
}

// A captured stream: the pipe's read end until end of file, and where its bytes go.
struct Capture {
  FileDescriptor fd;
  std::string* sink = nullptr;

  void read_some() {
    char buf[65536];
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n > 0) {
      sink->append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      fd.reset();
    }
  }
};

// Milliseconds until `deadline` for poll(2): rounded up, so that a wake-up is never early.
int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, std::numeric_limits<int>::max()));
}

// How often a child's end is checked where the kernel offers no pidfd to wait on (before Linux 5.3).
constexpr int kReapPollMs = 20;

void wait_for(pid_t pid, const ChildOptions& o, Capture (&captures)[2], ChildResult& result) {
  const auto open = [&] { return captures[0].fd.is_open() || captures[1].fd.is_open(); };
  std::optional<Clock::time_point> deadline;
  if (o.timeout) deadline = Clock::now() + *o.timeout;
  // Readable when the child ends, so that one poll waits for the clock, the streams and the child.
  // Through syscall(2): Debian 12's <sys/pidfd.h> declares pidfd_open without C linkage.
  const FileDescriptor pidfd(deadline ? static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)) : -1);
  int status = 0;
  bool reaped = false;
  for (;;) {
    // Without a deadline nothing else can happen once the streams are closed: wait for the end.
    if (!reaped && (deadline || !open())) reaped = reap(pid, deadline ? WNOHANG : 0, status);
    // Past the deadline, whatever still holds a stream open (a grandchild) is not waited for.
    if (reaped && (!open() || result.timed_out)) break;
    if (deadline && !result.timed_out && Clock::now() >= *deadline) {
      // A reaped child's pid may belong to another process by now; its group cannot be reused while a
      // member lives.
      if (!reaped || o.new_process_group) ::kill(o.new_process_group ? -pid : pid, o.timeout_signal);
      result.timed_out = true;
      continue;
    }
    int wait_ms = deadline && !result.timed_out ? ms_until(*deadline) : -1;
    if (deadline && !reaped && !pidfd.is_open()) wait_ms = wait_ms < 0 ? kReapPollMs : std::min(wait_ms, kReapPollMs);
    pollfd fds[3];
    Capture* owner[3] = {};
    nfds_t n = 0;
    for (Capture& c : captures)
      if (c.fd.is_open()) {
        owner[n] = &c;
        fds[n++] = {c.fd.get(), POLLIN, 0};
      }
    if (deadline && !reaped && pidfd.is_open()) fds[n++] = {pidfd.get(), POLLIN, 0};
    if (::poll(fds, n, wait_ms) < 0 && errno != EINTR) throw_errno("poll");
    for (nfds_t i = 0; i < n; ++i)
      if (owner[i] != nullptr && (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) owner[i]->read_some();
  }
  // What was written before the end is still in the pipes; a writer that never stops is cut short.
  for (Capture& c : captures)
    for (int reads = 0; c.fd.is_open() && reads < 64; ++reads) {
      pollfd p{c.fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      c.read_some();
    }
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
}

}  // namespace

std::string exit_status_text(int exit_code, int signal) {
  if (signal != 0) {
    const char* name = ::strsignal(signal);
    return "was killed by signal " + std::to_string(signal) + (name != nullptr ? std::string(" (") + name + ")" : "");
  }
  return "exited with status " + std::to_string(exit_code);
}

std::string ChildResult::status_text() const { return exit_status_text(exit_code, signal); }

std::string_view env_name(std::string_view entry) { return entry.substr(0, entry.find('=')); }

ChildResult run_child(const ChildOptions& o) {
  if (o.argv.empty() || o.argv[0].empty()) throw Error("run_child: no program to run");
  if (o.out == Output::to_stdout) throw Error("run_child: standard output cannot go to itself");
  if (o.err == Output::file) throw Error("run_child: only standard output goes to a file");
  if (o.out == Output::file && o.output_file.empty()) throw Error("run_child: no output file named");

  ChildResult result;
  Capture captures[2];
  Pipe out_pipe, err_pipe;
  SpawnSetup setup;
  // Standard output first: standard error may be wired to it.
  if (o.out == Output::capture) {
    out_pipe = make_pipe();
    ::posix_spawn_file_actions_adddup2(&setup.actions, out_pipe.write.get(), STDOUT_FILENO);
  } else if (o.out == Output::file) {
    // Opened by the child, not here: an audited command's output file is no write of this process.
    ::posix_spawn_file_actions_addopen(&setup.actions, STDOUT_FILENO, o.output_file.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, new_file_mode);
  }
  if (o.err == Output::capture) {
    err_pipe = make_pipe();
    ::posix_spawn_file_actions_adddup2(&setup.actions, err_pipe.write.get(), STDERR_FILENO);
  } else if (o.err == Output::to_stdout) {
    ::posix_spawn_file_actions_adddup2(&setup.actions, STDOUT_FILENO, STDERR_FILENO);
  }
  if (o.input == Input::null)
    ::posix_spawn_file_actions_addopen(&setup.actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);

  sigset_t all, none;
  ::sigfillset(&all);  // glibc leaves out the signals it keeps for itself
  ::sigemptyset(&none);
  ::posix_spawnattr_setsigdefault(&setup.attr, &all);
  ::posix_spawnattr_setsigmask(&setup.attr, &none);
  short flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK;
  if (o.new_process_group) {
    ::posix_spawnattr_setpgroup(&setup.attr, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  ::posix_spawnattr_setflags(&setup.attr, flags);

  std::vector<std::string> args = o.argv;
  std::vector<char*> c_args = c_strings(args);
  const bool own_env = !o.env_set.empty() || !o.env_unset.empty();
  std::vector<std::string> env = own_env ? child_environment(o) : std::vector<std::string>{};
  std::vector<char*> c_env = c_strings(env);

  // Output buffered here would otherwise appear after the child's, on a stream they share.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  pid_t pid = 0;
  const auto spawn = o.search_path ? ::posix_spawnp : ::posix_spawn;
  const int rc = spawn(&pid, c_args[0], &setup.actions, &setup.attr, c_args.data(), own_env ? c_env.data() : environ);
  if (rc != 0) throw ChildStartError("cannot start " + o.argv[0] + ": " + std::strerror(rc), rc);
  // The child has its copies; ours would keep the pipes from ever reaching end of file.
  out_pipe.write.reset();
  err_pipe.write.reset();
  captures[0] = {std::move(out_pipe.read), &result.out};
  captures[1] = {std::move(err_pipe.read), &result.err};
  try {
    wait_for(pid, o, captures, result);
  } catch (...) {
    // Nobody would wait for it any more.
    ::kill(o.new_process_group ? -pid : pid, SIGKILL);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throw;
  }
  return result;
}

std::string find_in_path(std::string_view name) { return find_in_path({name}); }

std::string find_in_path(std::initializer_list<std::string_view> names) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return {};
  for (std::string_view rest = path;;) {
    const std::size_t colon = std::min(rest.find(':'), rest.size());
    const std::string_view dir = rest.substr(0, colon);
    for (std::string_view name : names) {
      if (name.empty() || name.find('/') != std::string_view::npos) continue;
      const fs::path candidate = fs::path(dir.empty() ? std::string_view(".") : dir) / name;
      std::error_code ec;
      if (fs::is_regular_file(candidate, ec) && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
    if (colon == rest.size()) return {};
    rest.remove_prefix(colon + 1);
  }
}

fs::path self_executable(std::error_code& ec) noexcept {
  try {
    return fs::read_symlink("/proc/self/exe", ec);
  } catch (const std::bad_alloc&) {
    ec = std::make_error_code(std::errc::not_enough_memory);
    return {};
  }
}

fs::path self_executable() {
  std::error_code ec;
  fs::path self = self_executable(ec);
  if (ec) throw Error("cannot find this program's path in /proc/self/exe: " + ec.message());
  return self;
}

}  // namespace dpcheck
