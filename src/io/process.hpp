// Other programs, started and waited for: the one way dpcheck runs a child process (mpirun and its
// workers, an audited command, the PyTorch baseline, a test's command line), and finds one on PATH or
// itself on disk. No shell is involved: argv is passed as it is.
//
// Every child starts with every signal at its default action and none blocked, whatever the caller
// ignores or blocks while it waits (`dpcheck audit` ignores SIGINT, which a child must not inherit; a
// child that ignored the timeout's SIGTERM would never stop). Captured streams are read together, so
// that a child filling one pipe while the other is read cannot stall.
#pragma once

#include <chrono>
#include <csignal>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "src/error.hpp"

namespace dpcheck {

struct ChildOptions {
  // argv[0] is a path, or with search_path a name looked up on PATH as execvp does.
  std::vector<std::string> argv;
  bool search_path = false;

  // The environment: this process's, less the variables whose names start with one of `env_unset`
  // (a launcher started inside an MPI job must not inherit that job's OMPI_ and PMIX_ variables), with
  // the NAME=VALUE entries of `env_set` added or replacing those of the same name.
  std::vector<std::string> env_set;
  std::vector<std::string> env_unset;

  enum class Input { inherit, null };  // null: /dev/null, so a child can never wait on a terminal
  enum class Output {
    inherit,    // this process's stream
    capture,    // into ChildResult::out or ::err
    file,       // stdout only: `output_file`, created (new_file_mode) or truncated by the child itself
    to_stdout,  // stderr only: wherever stdout goes, interleaved as written
  };
  Input input = Input::inherit;
  Output out = Output::inherit;
  Output err = Output::inherit;
  std::filesystem::path output_file;

  // After `timeout` the child is sent `timeout_signal` (SIGTERM, which mpirun passes on to its
  // ranks) and waited for. With new_process_group the child leads a group of its own and the signal
  // goes to the whole group, grandchildren too, as timeout(1) does; a child that should see the
  // terminal's Ctrl-C stays in this process's group (the default).
  std::optional<std::chrono::milliseconds> timeout;
  int timeout_signal = SIGTERM;
  bool new_process_group = false;
};

struct ChildResult {
  int exit_code = -1;      // its exit status, when it exited
  int signal = 0;          // the signal that ended it, or 0
  bool timed_out = false;  // the timeout passed first: the child, if still running, was signalled
  std::string out, err;    // what it wrote on captured streams

  bool succeeded() const { return signal == 0 && exit_code == 0; }
  // As a shell's $? has it: the exit status, or 128 + the signal's number.
  int shell_status() const { return signal != 0 ? 128 + signal : exit_code; }
  std::string status_text() const;  // "exited with status 3", "was killed by signal 15 (Terminated)"
};

// "exited with status 3" or "was killed by signal 9 (Killed)": signal 0 means it exited.
std::string exit_status_text(int exit_code, int signal);

// The child could not be started: no such program, not executable, an output file that cannot be
// opened. `error` is the errno value.
class ChildStartError : public Error {
 public:
  ChildStartError(const std::string& what, int error) : Error(what), error_(error) {}
  int error() const { return error_; }

 private:
  int error_;
};

// Starts the child, waits for it to end (and, for captured streams, for them to close), and says how
// it ended. ChildStartError when it cannot be started (the message names argv[0] and the reason);
// Error when waiting for it fails.
ChildResult run_child(const ChildOptions& options);

// The full path of the first executable regular file named `name` in a directory of PATH (an empty
// entry is the working directory), or "" when there is none, PATH is unset, or `name` holds a '/' (a
// path, not a name to search for). With several names, the first directory that holds any of them
// wins, and within a directory the names are tried in the order given.
std::string find_in_path(std::string_view name);
std::string find_in_path(std::initializer_list<std::string_view> names);

// This program's own executable, from /proc/self/exe: Error (or `ec` set, and an empty path) when the
// kernel cannot say.
std::filesystem::path self_executable();
std::filesystem::path self_executable(std::error_code& ec) noexcept;

// The NAME of a NAME=VALUE environment entry (all of it when there is no '=').
std::string_view env_name(std::string_view entry);

}  // namespace dpcheck
