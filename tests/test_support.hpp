// Helpers that several test files share: the first examples of a synthetic data set as one batch, a
// shell command run with its output and exit status, a fresh directory per test, and a whole file read
// into a string. Header-only; every test executable includes what it uses.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "properties/scenario.hpp"
#include "src/io/process.hpp"
#include "src/train/data.hpp"

namespace dpcheck {

// One element's error over its bound: 0 when exact, infinite for a value that is not finite (an
// unwritten, poisoned element) or for an error where the bound is 0.
inline double error_ratio(double got, double want, double bound) {
  const double err = std::abs(got - want);
  if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
  if (err == 0) return 0;
  return bound > 0 ? err / bound : std::numeric_limits<double>::infinity();
}

// Examples 0 .. n-1 of the synthetic data set of n examples for `model` drawn with `seed`.
inline Batch first_examples(const ModelConfig& model, std::int64_t n, std::uint64_t seed) {
  const SyntheticDataset data(n, model, seed);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) idx[static_cast<std::size_t>(i)] = i;
  return data.gather(idx);
}

// One drawn case on one rank (inside a RapidCheck property): a scenario's model, the first examples of
// its batch and its initial parameters.
struct DrawnBatch {
  Scenario scenario;
  ModelConfig model;
  Batch batch;
  std::vector<float> params;
};
inline DrawnBatch draw_batch(std::int64_t max_batch = ScenarioSpace{}.max_batch) {
  ScenarioSpace space;
  space.world_size = 1;
  space.max_batch = max_batch;
  DrawnBatch d;
  d.scenario = *gen_scenario(space);
  d.model = d.scenario.train.model;
  d.batch = first_examples(d.model, d.scenario.train.batch, d.scenario.train.seed);
  d.params = init_params(d.model, d.scenario.train.seed);
  return d;
}

struct CommandResult {
  int status = -1;     // the exit status; -1 when the shell could not be started or was killed by a signal
  std::string output;  // stdout and stderr together
  double seconds = 0;  // wall time
};

// Runs `cmd` through the shell. With a limit, the shell and everything it started are killed
// (SIGKILL, to their process group, as `timeout -s KILL` does) after `limit_s` seconds, and the status
// is 137, so that a hang fails the test instead of stalling the suite.
inline CommandResult run_command(const std::string& cmd, int limit_s = 0) {
  CommandResult r;
  const auto start = std::chrono::steady_clock::now();
  ChildOptions child;
  child.argv = {"/bin/sh", "-c", cmd};
  child.out = ChildOptions::Output::capture;
  child.err = ChildOptions::Output::to_stdout;
  if (limit_s > 0) {
    child.timeout = std::chrono::seconds(limit_s);
    child.timeout_signal = SIGKILL;
    child.new_process_group = true;
  }
  try {
    const ChildResult ran = run_child(child);
    r.output = ran.out;
    r.status = ran.timed_out ? 128 + SIGKILL : ran.signal != 0 ? -1 : ran.exit_code;
  } catch (const ChildStartError&) {
    return r;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// A name as GoogleTest accepts it for a parameterized case: '-' (as in mutant names) becomes '_'.
inline std::string test_case_name(std::string_view name) {
  std::string out(name);
  for (char& c : out)
    if (c == '-') c = '_';
  return out;
}

// The whole file, byte for byte; empty if it cannot be opened. Read in blocks: the tests are compiled
// at -O0, where a character iterator took seconds over the 33 MiB files of the bad-input tests.
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string out;
  char block[1 << 16];
  while (in.read(block, sizeof block) || in.gcount() > 0) out.append(block, static_cast<std::size_t>(in.gcount()));
  return out;
}

// A fresh, empty directory <tmp>/dpcheck_<suite>_<test>_<pid> for the running test, removed with
// everything in it (write permission restored first) when it goes out of scope. Create it while a test
// runs: in the test body, a fixture's constructor or SetUp. The path is canonical, since the kernel
// reports paths without symbolic links.
class ScratchDir {
 public:
  ScratchDir() {
    const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "dpcheck_";
    name += t != nullptr ? std::string(t->test_suite_name()) + "_" + t->name() : std::string("no_test");
    name += "_" + std::to_string(::getpid());
    for (char& c : name)
      if (c == '/') c = '_';  // parameterized suites and tests carry a '/'
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
    path_ = std::filesystem::canonical(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// A fixture whose every test has a fresh ScratchDir of its own, dir_.
class ScratchTest : public testing::Test {
 protected:
  const ScratchDir scratch_;
  const std::filesystem::path dir_ = scratch_.path();
};

// Runs f, which must throw E; returns the message.
template <class E, class F> std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong exception type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "did not throw";
  return {};
}

}  // namespace dpcheck
