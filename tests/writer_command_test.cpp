// The RankZeroWriter through the dpcheck command: checkpoints that survive a SIGKILL of `dpcheck train`
// at any moment, and a FIFO as --log refused with exit status 2. Apart from writer_test.cpp, whose cases
// need no dpcheck binary, so that the ThreadSanitizer stage builds that program without the CLI.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "src/error.hpp"
#include "src/train/writer.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;

class Writer : public ScratchTest {};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// SIGKILL the writing process at random moments while it checkpoints every step, 50 times. Whatever
// load_checkpoint() accepts afterwards must be exactly what an uninterrupted run wrote at that step:
// no half-written checkpoint may ever load.
TEST_F(Writer, KilledWhileCheckpointingLeavesOnlyWholeCheckpoints) {
  const std::string dpcheck = DPCHECK_BINARY;
  const std::string flags =
      "train --model 64,128,64 --batch 16 --steps 30 --optimizer adam --seed 5 --checkpoint-every 1";
  const fs::path truth = dir_ / "truth";
  const auto started = std::chrono::steady_clock::now();
  const CommandResult uninterrupted =
      run_command(dpcheck + " " + flags + " --keep 100 --checkpoint-dir " + truth.string());
  ASSERT_EQ(uninterrupted.status, 0) << uninterrupted.output;
  // The kills are spread over the uninterrupted run's length, so that they land throughout the run on a
  // fast machine and a slow one (or a sanitizer build) alike.
  const auto run_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started);
  const int kill_window_us = static_cast<int>(std::max<std::int64_t>(run_us.count(), 50'000));
  const ModelConfig model{{64, 128, 64}, Activation::relu, Loss::mse};
  std::map<std::int64_t, Checkpoint> expected;
  for (int s = 1; s <= 30; ++s) {
    std::string why;
    auto ck = read_checkpoint(truth / checkpoint_name(s), model, &why);
    ASSERT_TRUE(ck.has_value()) << why;
    expected[s] = *ck;
  }

  std::mt19937 rng(12345);
  int loaded = 0, none = 0, mid_write = 0;
  for (int round = 0; round < 50; ++round) {
    const fs::path dir = dir_ / ("killed" + std::to_string(round));
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const std::string cmd = dpcheck + " " + flags + " --checkpoint-dir " + dir.string() + " > /dev/null";
      ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, kill_window_us)(rng)));
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    if (!fs::exists(dir)) {
      ++none;
      continue;
    }
    // Every directory that reads as complete must hold exactly the uninterrupted run's bits.
    bool half_written = false;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      half_written |= name.rfind(".step-", 0) == 0;
      if (name.rfind("step-", 0) != 0) continue;
      std::string why;
      const auto ck = read_checkpoint(e.path(), model, &why);
      if (!ck) continue;
      const Checkpoint& want = expected.at(ck->step);
      EXPECT_TRUE(same_bits(ck->params, want.params)) << name << " in round " << round;
      EXPECT_TRUE(same_bits(ck->optimizer_state, want.optimizer_state)) << name << " in round " << round;
    }
    mid_write += half_written ? 1 : 0;
    try {
      const Checkpoint ck = load_checkpoint(dir, model);
      EXPECT_TRUE(same_bits(ck.params, expected.at(ck.step).params));
      ++loaded;
    } catch (const UsageError&) {
      ++none;  // killed before the first checkpoint was complete
    }
  }
  std::printf(
      "50 kills within %.0f ms: %d in the middle of writing a checkpoint; %d left a loadable checkpoint, "
      "%d were killed before the first one\n",
      kill_window_us / 1000.0, mid_write, loaded, none);
  EXPECT_GT(mid_write, 5);  // the kills did land while checkpoints were being written
  EXPECT_GT(loaded, 10);
}

// A FIFO as the log would block the open until a reader comes: the command refuses it with exit status 2
// and one line naming the path, not a hang (writer_test.cpp holds the writer's own refusals).
TEST_F(Writer, TheCommandRefusesAFifoAsTheLog) {
  const fs::path fifo = dir_ / "log.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CommandResult r =
      run_command(std::string(DPCHECK_BINARY) + " train --model 4,3 --batch 4 --log " + fifo.string(), 60);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find(fifo.string()), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dpcheck
