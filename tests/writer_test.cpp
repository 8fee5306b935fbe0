// The RankZeroWriter (src/writer.cpp): checkpoints that load back bit for bit, that are either whole
// or ignored, that survive a SIGKILL of the writing process at any moment, and a log of JSON lines.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "properties/target.hpp"
#include "src/error.hpp"
#include "src/local_comm.hpp"
#include "src/writer.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;

class Writer : public testing::Test {
 protected:
  const ScratchDir scratch_;
  const fs::path dir_ = scratch_.path();
};

TrainConfig small_config(OptimizerKind kind) {
  TrainConfig c;
  c.model = {{5, 7, 3}, Activation::tanh, Loss::cross_entropy};
  c.batch = 12;
  c.steps = 3;
  c.optimizer.kind = kind;
  c.seed = 11;
  return c;
}

// Trains `steps` steps on one local rank and returns the trainer's checkpoint.
Checkpoint trained(const TrainConfig& c, int steps) {
  Checkpoint out;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  run_local(1, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(Target{}, c, comm, data);
    while (rt.trainer->next_step() < steps) rt.trainer->step();
    out = rt.trainer->checkpoint();
  });
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_F(Writer, CheckpointLoadsBackBitForBit) {
  const TrainConfig c = small_config(OptimizerKind::adam);
  const Checkpoint saved = trained(c, 2);
  fs::path where;
  run_local(1, [&](Communicator& comm) { where = RankZeroWriter(comm, dir_, {}).save(saved, c.model); });
  EXPECT_EQ(where, dir_ / "step-00000002");
  EXPECT_TRUE(fs::exists(where / "manifest.json"));
  EXPECT_TRUE(fs::exists(where / "layers.0.weight.npy"));
  EXPECT_TRUE(fs::exists(where / "optimizer.exp_avg_sq.npy"));
  const Checkpoint loaded = load_checkpoint(dir_, c.model);
  EXPECT_EQ(loaded.step, 2);
  EXPECT_EQ(loaded.optimizer_steps, 2);
  EXPECT_EQ(loaded.state_names, saved.state_names);
  EXPECT_TRUE(same_bits(loaded.params, saved.params));
  EXPECT_TRUE(same_bits(loaded.optimizer_state, saved.optimizer_state));
  EXPECT_EQ(loaded.config, saved.config);
  EXPECT_EQ(c.resume_mismatch(loaded.config, 1), "");
  TrainConfig other = c;
  other.batch = 16;
  EXPECT_NE(other.resume_mismatch(loaded.config, 1).find("batch"), std::string::npos);
  EXPECT_NE(c.resume_mismatch(loaded.config, 2).find("world_size"), std::string::npos);
}

TEST_F(Writer, OnlyRankZeroWritesAndEveryRankCanReadAfterSave) {
  const TrainConfig c = small_config(OptimizerKind::momentum);
  const Checkpoint saved = trained(c, 1);
  run_local(4, [&](Communicator& comm) {
    RankZeroWriter w(comm, dir_, dir_ / ("log" + std::to_string(comm.rank()) + ".jsonl"));
    const fs::path p = w.save(saved, c.model);
    EXPECT_EQ(p.empty(), comm.rank() != 0);
    w.log({{"rank", comm.rank()}});
    // save() ends with a barrier: the checkpoint is complete for every rank now.
    EXPECT_EQ(load_checkpoint(dir_, c.model).step, 1);
  });
  EXPECT_TRUE(fs::exists(dir_ / "log0.jsonl"));
  for (int r = 1; r < 4; ++r) EXPECT_FALSE(fs::exists(dir_ / ("log" + std::to_string(r) + ".jsonl"))) << r;
}

TEST_F(Writer, KeepsTheNewestAndSkipsIncompleteOrCorruptOnes) {
  const TrainConfig c = small_config(OptimizerKind::sgd);
  run_local(1, [&](Communicator& comm) {
    RankZeroWriter w(comm, dir_, {}, 2);
    for (int s = 1; s <= 4; ++s) {
      Checkpoint ck = trained(c, 0);
      ck.step = s;
      w.save(ck, c.model);
    }
  });
  EXPECT_FALSE(fs::exists(dir_ / "step-00000002"));
  EXPECT_TRUE(fs::exists(dir_ / "step-00000003"));
  EXPECT_EQ(load_checkpoint(dir_, c.model).step, 4);

  // A flipped byte in the newest: it no longer matches its manifest, and the one before loads.
  {
    std::fstream f(dir_ / "step-00000004" / "layers.1.bias.npy", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  std::vector<std::string> skipped;
  EXPECT_EQ(load_checkpoint(dir_, c.model, &skipped).step, 3);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("layers.1.bias.npy"), std::string::npos) << skipped[0];

  // No manifest: incomplete. A file missing: incomplete.
  fs::remove(dir_ / "step-00000003" / "manifest.json");
  EXPECT_THROW(load_checkpoint(dir_, c.model), UsageError);
  EXPECT_THROW(load_checkpoint(dir_ / "nowhere", c.model), UsageError);
}

TEST_F(Writer, AbandonedTemporaryDirectoriesAreIgnoredAndCleaned) {
  const TrainConfig c = small_config(OptimizerKind::sgd);
  // A writer that died (its pid no longer exists) left half a checkpoint behind.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  const fs::path stale = dir_ / (".step-00000009.tmp-" + std::to_string(child));
  fs::create_directories(stale);
  std::ofstream(stale / "layers.0.weight.npy") << "half";
  run_local(1, [&](Communicator& comm) { RankZeroWriter(comm, dir_, {}).save(trained(c, 1), c.model); });
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(load_checkpoint(dir_, c.model).step, 1);
}

TEST_F(Writer, LogIsOneJsonObjectALine) {
  run_local(1, [&](Communicator& comm) {
    RankZeroWriter w(comm, {}, dir_ / "log.jsonl");
    for (int i = 0; i < 3; ++i) w.log({{"step", i}, {"loss", 0.5 * i}});
    w.flush();
  });
  std::ifstream f(dir_ / "log.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"].get<int>(), n++);
  }
  EXPECT_EQ(n, 3);
}

// SIGKILL the writing process at random moments while it checkpoints every step, 50 times. Whatever
// load_checkpoint() accepts afterwards must be exactly what an uninterrupted run wrote at that step:
// no half-written checkpoint may ever load.
TEST_F(Writer, KilledWhileCheckpointingLeavesOnlyWholeCheckpoints) {
  const std::string dpcheck = DPCHECK_BINARY;
  const std::string flags = "train --model 64,128,64 --batch 16 --steps 30 --optimizer adam --seed 5 --checkpoint-every 1";
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
  std::printf("50 kills within %.0f ms: %d in the middle of writing a checkpoint; %d left a loadable checkpoint, "
              "%d were killed before the first one\n", kill_window_us / 1000.0, mid_write, loaded, none);
  EXPECT_GT(mid_write, 5);  // the kills did land while checkpoints were being written
  EXPECT_GT(loaded, 10);
}

}  // namespace
}  // namespace dpcheck
