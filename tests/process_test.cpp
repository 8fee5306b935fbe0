// run_child, find_in_path and self_executable (src/io/process.hpp): exit status and signal, both streams
// captured without a stall, a timeout that signals the child (or its whole group), the environment
// and signal dispositions a child starts with, and what happens when a program is not there.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "src/error.hpp"
#include "src/io/process.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// `script` run by /bin/sh, both streams captured.
ChildOptions shell(const std::string& script) {
  ChildOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.out = o.err = ChildOptions::Output::capture;
  return o;
}

// Sets an environment variable for one test; restores the old value (or its absence) afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(RunChild, CapturesBothStreamsAndTheExitStatus) {
  const ChildResult r = run_child(shell("echo out; echo err >&2; exit 3"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.signal, 0);
  EXPECT_FALSE(r.timed_out);
  EXPECT_FALSE(r.succeeded());
  EXPECT_EQ(r.shell_status(), 3);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(r.status_text(), "exited with status 3");
  EXPECT_TRUE(run_child(shell("true")).succeeded());
}

TEST(RunChild, SaysWhichSignalEndedTheChild) {
  const ChildResult r = run_child(shell("kill -KILL $$"));
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_EQ(r.shell_status(), 128 + SIGKILL);
  EXPECT_NE(r.status_text().find("killed by signal 9"), std::string::npos) << r.status_text();
}

// More than a pipe holds (64 KiB) on each stream, stderr first: reading one stream at a time would
// leave the child blocked on the other.
TEST(RunChild, ReadsBothStreamsTogether) {
  const ChildResult r =
      run_child(shell("head -c 1000000 /dev/zero | tr '\\0' e >&2; head -c 700000 /dev/zero | tr '\\0' o"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.err, std::string(1000000, 'e'));
  EXPECT_EQ(r.out, std::string(700000, 'o'));
}

TEST(RunChild, StopsAChildThatOutlivesItsTimeout) {
  ChildOptions o = shell("echo started; exec sleep 30");
  o.timeout = 500ms;
  const auto t0 = Clock::now();
  const ChildResult r = run_child(o);
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.signal, SIGTERM);
  EXPECT_EQ(r.shell_status(), 128 + SIGTERM);
  EXPECT_EQ(r.out, "started\n");  // what it wrote before the end is kept

  ChildOptions quick = shell("exit 0");
  quick.timeout = 30s;
  const ChildResult q = run_child(quick);
  EXPECT_FALSE(q.timed_out);
  EXPECT_TRUE(q.succeeded());
}

// Without streams to read, the timeout still holds: the child's end is waited for with the clock.
TEST(RunChild, TimesOutAChildWhoseStreamsAreNotCaptured) {
  ChildOptions o;
  o.argv = {"/bin/sh", "-c", "exec sleep 30"};
  o.timeout = 300ms;
  o.timeout_signal = SIGKILL;
  const auto t0 = Clock::now();
  const ChildResult r = run_child(o);
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.signal, SIGKILL);
}

// With its own process group, the timeout's signal reaches what the child started, too: a grandchild
// that would have written a file a second later never does.
TEST(RunChild, ATimeoutInItsOwnGroupStopsGrandchildren) {
  ScratchDir dir;
  const fs::path late = dir / "late";
  ChildOptions o = shell("(sleep 1; echo late > '" + late.string() + "') & sleep 30");
  o.timeout = 200ms;
  o.timeout_signal = SIGKILL;
  o.new_process_group = true;
  const ChildResult r = run_child(o);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.signal, SIGKILL);
  ::sleep(2);
  EXPECT_FALSE(fs::exists(late));
}

// A grandchild that keeps the captured stream open does not keep run_child waiting past the timeout.
TEST(RunChild, AStreamHeldOpenByAGrandchildDoesNotOutliveTheTimeout) {
  ChildOptions o = shell("sleep 5 & exit 0");
  o.timeout = 500ms;
  const auto t0 = Clock::now();
  const ChildResult r = run_child(o);
  EXPECT_LT(seconds_since(t0), 4.0);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, 0);
}

TEST(RunChild, ReadsStandardInputFromDevNullWhenAsked) {
  ChildOptions o = shell("cat; echo done");
  o.input = ChildOptions::Input::null;
  const ChildResult r = run_child(o);
  EXPECT_EQ(r.out, "done\n");
}

TEST(RunChild, SendsStandardErrorWhereStandardOutputGoes) {
  ChildOptions o = shell("echo one; echo two >&2; echo three");
  o.err = ChildOptions::Output::to_stdout;
  const ChildResult r = run_child(o);
  EXPECT_EQ(r.out, "one\ntwo\nthree\n");
  EXPECT_EQ(r.err, "");

  ScratchDir dir;
  const fs::path file = dir / "output.txt";
  std::ofstream(file) << "an earlier, longer output that must not survive\n";
  ChildOptions to_file = shell("echo a; echo b >&2");
  to_file.out = ChildOptions::Output::file;
  to_file.err = ChildOptions::Output::to_stdout;
  to_file.output_file = file;
  const ChildResult f = run_child(to_file);
  EXPECT_TRUE(f.succeeded());
  EXPECT_EQ(f.out, "");
  EXPECT_EQ(read_file(file), "a\nb\n");

  to_file.output_file = dir / "no-such-dir" / "output.txt";
  EXPECT_THROW(run_child(to_file), ChildStartError);
}

TEST(RunChild, AddsReplacesAndDropsEnvironmentVariables) {
  const ScopedEnv dropped("DPCHECK_PROCESS_TEST_DROPPED", "was here");
  const ScopedEnv replaced("DPCHECK_PROCESS_TEST_REPLACED", "old");
  const ScopedEnv kept("DPCHECK_KEPT_BY_PROCESS_TEST", "kept");
  ChildOptions o = shell(
      "echo \"${DPCHECK_PROCESS_TEST_DROPPED-unset} $DPCHECK_PROCESS_TEST_REPLACED $DPCHECK_PROCESS_TEST_ADDED "
      "$DPCHECK_KEPT_BY_PROCESS_TEST\"; env | grep -c '^DPCHECK_PROCESS_TEST_REPLACED='");
  o.env_set = {"DPCHECK_PROCESS_TEST_REPLACED=new", "DPCHECK_PROCESS_TEST_ADDED=added"};
  o.env_unset = {"DPCHECK_PROCESS_TEST_D"};
  EXPECT_EQ(run_child(o).out, "unset new added kept\n1\n");

  // Without changes the child sees this process's environment as it is.
  EXPECT_EQ(run_child(shell("echo $DPCHECK_PROCESS_TEST_DROPPED")).out, "was here\n");

  o.env_set = {"NOT_AN_ENTRY"};
  EXPECT_THROW(run_child(o), Error);
}

// A signal this process ignores or blocks while it waits (as `dpcheck audit` ignores SIGINT) is at its
// default in the child, so that the child can still be stopped by it.
TEST(RunChild, StartsTheChildWithDefaultSignals) {
  struct sigaction ignore {
  }, old_action{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGTERM, &ignore, &old_action);
  sigset_t block, old_mask;
  ::sigemptyset(&block);
  ::sigaddset(&block, SIGUSR1);
  ::pthread_sigmask(SIG_BLOCK, &block, &old_mask);
  const ChildResult term = run_child(shell("kill -TERM $$; echo survived"));
  const ChildResult usr1 = run_child(shell("kill -USR1 $$; echo survived"));
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  ::sigaction(SIGTERM, &old_action, nullptr);
  EXPECT_EQ(term.signal, SIGTERM) << term.out;
  EXPECT_EQ(usr1.signal, SIGUSR1) << usr1.out;
}

TEST(RunChild, AProgramThatIsNotThereCannotStart) {
  ChildOptions o;
  o.argv = {"/no/such/program"};
  try {
    run_child(o);
    ADD_FAILURE() << "started a program that does not exist";
  } catch (const ChildStartError& e) {
    EXPECT_EQ(e.error(), ENOENT);
    EXPECT_NE(std::string(e.what()).find("cannot start /no/such/program"), std::string::npos) << e.what();
  }
  // A name is looked up on PATH only when asked; a name that is nowhere cannot start either way.
  o.argv = {"sh", "-c", "exit 4"};
  EXPECT_THROW(run_child(o), ChildStartError);
  o.search_path = true;
  EXPECT_EQ(run_child(o).exit_code, 4);
  o.argv = {"no-such-program-dpcheck"};
  EXPECT_THROW(run_child(o), ChildStartError);
  o.argv = {};
  EXPECT_THROW(run_child(o), Error);
}

TEST(FindInPath, FindsExecutableRegularFilesOnly) {
  const std::string sh = find_in_path("sh");
  ASSERT_FALSE(sh.empty());
  EXPECT_EQ(::access(sh.c_str(), X_OK), 0);
  EXPECT_EQ(fs::path(sh).filename(), "sh");
  EXPECT_TRUE(find_in_path("no-such-program-dpcheck").empty());
  EXPECT_TRUE(find_in_path("bin/sh").empty());  // a path, not a name to search for
  EXPECT_TRUE(find_in_path("").empty());

  ScratchDir dir;
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b" / "subdir");
  const auto make = [](const fs::path& p, fs::perms perms) {
    std::ofstream(p) << "#!/bin/sh\n";
    fs::permissions(p, perms);
  };
  make(dir / "a" / "mpiexec", fs::perms::owner_all);
  make(dir / "b" / "mpirun", fs::perms::owner_all);
  make(dir / "b" / "data", fs::perms::owner_read | fs::perms::owner_write);
  const ScopedEnv path("PATH", ((dir / "a").string() + ":" + (dir / "b").string()).c_str());
  EXPECT_EQ(find_in_path("mpirun"), (dir / "b" / "mpirun").string());
  EXPECT_TRUE(find_in_path("data").empty());    // no execute bit, which even root needs
  EXPECT_TRUE(find_in_path("subdir").empty());  // a directory is no program
  // Several names: the first directory holding any of them wins.
  EXPECT_EQ(find_in_path({"mpirun", "mpiexec"}), (dir / "a" / "mpiexec").string());
  {
    const ScopedEnv unset("PATH", nullptr);
    EXPECT_TRUE(find_in_path("sh").empty());
  }
}

TEST(FindInPath, AnEmptyEntryIsTheWorkingDirectory) {
  ScratchDir dir;
  std::ofstream(dir / "tool") << "#!/bin/sh\n";
  fs::permissions(dir / "tool", fs::perms::owner_all);
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  std::string found;
  {
    const ScopedEnv path("PATH", "/nonexistent-dpcheck::/also-nonexistent");
    found = find_in_path("tool");
  }
  fs::current_path(cwd);
  EXPECT_EQ(found, "./tool");
}

TEST(SelfExecutable, IsThisTestProgram) {
  const fs::path self = self_executable();
  EXPECT_TRUE(self.is_absolute());
  EXPECT_EQ(self.filename(), "process_test");
  std::error_code ec;
  EXPECT_EQ(self_executable(ec), self);
  EXPECT_FALSE(ec);
}

}  // namespace
}  // namespace dpcheck
