// The RankZeroWriter (src/train/writer.cpp): checkpoints that load back bit for bit, that are either whole
// or ignored, that are refused with the reason when any field or file is wrong, and a log of JSON lines
// that is a regular file or nothing. The cases that run the dpcheck command (a SIGKILL of `dpcheck train`
// while it checkpoints, its refusal of a FIFO as --log) are in writer_command_test.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include "src/comm/local_comm.hpp"
#include "src/error.hpp"
#include "src/io/hash.hpp"
#include "src/io/npy.hpp"
#include "src/target/target.hpp"
#include "src/train/writer.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

namespace fs = std::filesystem;

class Writer : public ScratchTest {};

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

// --bucket-mb is recorded, so that a bundle replays with the same buckets, and read back; a resume may
// change it (it changes no bit with a rank-order backend); a recorded size --bucket-mb would refuse is
// refused, naming the field.
TEST(RecordedConfig, BucketsAreRecordedReadBackAndFreeOnResume) {
  TrainConfig c = small_config(OptimizerKind::sgd);
  EXPECT_FALSE(c.to_json(2).contains("bucket_mb"));
  c.bucket_mb = 0.25;
  const nlohmann::json j = c.to_json(2);
  ASSERT_TRUE(j.contains("bucket_mb"));
  const auto [back, world] = recorded_config(j);
  EXPECT_EQ(world, 2);
  EXPECT_EQ(back.bucket_mb, 0.25);
  TrainConfig none = c;
  none.bucket_mb = 0;
  EXPECT_EQ(none.resume_mismatch(j, 2), "");
  EXPECT_EQ(c.resume_mismatch(none.to_json(2), 2), "");
  TrainConfig other = c;
  other.bucket_mb = 4;
  EXPECT_EQ(other.resume_mismatch(j, 2), "");
  for (const double bad : {-1.0, 4e6}) {
    nlohmann::json b = j;
    b["bucket_mb"] = bad;
    try {
      recorded_config(b);
      ADD_FAILURE() << "bucket_mb " << bad << " accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--bucket-mb"), std::string::npos) << e.what();
    }
  }
  nlohmann::json text = j;
  text["bucket_mb"] = "1";
  EXPECT_THROW(recorded_config(text), UsageError);
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
    for (int s = 1; s <= 4; ++s) w.save(trained(c, s), c.model);
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

// ---- a checkpoint is never trusted --------------------------------------------------------------

nlohmann::json read_manifest(const fs::path& step) { return nlohmann::json::parse(read_file(step / "manifest.json")); }

void write_manifest(const fs::path& step, const nlohmann::json& m) {
  std::ofstream(step / "manifest.json", std::ios::trunc) << m.dump(2) << "\n";
}

void edit_manifest(const fs::path& step, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json m = read_manifest(step);
  edit(m);
  write_manifest(step, m);
}

// Records a file's present size and hash in the manifest, so that only the defect planted in its
// contents is left to find.
void rehash(const fs::path& step, const std::string& file) {
  const std::string bytes = read_file(step / file);
  char hex[20];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash_bytes(bytes.data(), bytes.size())));
  edit_manifest(step, [&](nlohmann::json& m) { m["files"][file] = {{"bytes", bytes.size()}, {"xxh3", hex}}; });
}

// Rewrites a tensor file (float32, or float64) after `edit`, with a matching manifest entry.
void rewrite_tensor(const fs::path& step, const std::string& file, const std::function<void(std::vector<float>&)>& edit,
                    std::optional<std::vector<std::int64_t>> shape = std::nullopt, bool as_float64 = false) {
  const NpyArray a = read_npy(step / file);
  std::vector<float> v = a.as_float32();
  edit(v);
  const std::vector<std::int64_t> s = shape.value_or(a.shape);
  if (as_float64) {
    const std::vector<double> d(v.begin(), v.end());
    write_npy(step / file, s, std::span<const double>(d));
  } else {
    write_npy(step / file, s, std::span<const float>(v));
  }
  rehash(step, file);
}

void set_step(nlohmann::json& m, const nlohmann::json& value) { m["step"] = value; }

struct Corruption {
  const char* name;
  std::function<void(const fs::path& step)> corrupt;
  std::vector<std::string> reason;  // each must appear in the reason given
  std::vector<int> read_as = {};    // read with another model's dimensions
};

// A checkpoint of a run with 3 steps an epoch (36 examples, batch 12, one rank), taken after 4 steps:
// step 4 is step 1 of epoch 1, and Adam keeps exp_avg and exp_avg_sq.
class Corrupt : public Writer {
 protected:
  void SetUp() override {
    config_ = small_config(OptimizerKind::adam);
    config_.dataset_size = 36;
    run_local(1, [&](Communicator& comm) {
      RankZeroWriter(comm, dir_ / "good", {}).save(trained(config_, 4), config_.model);
    });
  }
  TrainConfig config_;
};

TEST_F(Corrupt, EveryDefectIsRefusedWithItsReason) {
  const std::string name = "step-00000004";
  {
    std::string why;
    const auto good = read_checkpoint(dir_ / "good" / name, config_.model, &why);
    ASSERT_TRUE(good.has_value()) << why;  // the untouched copy loads: every refusal below is the defect's
    EXPECT_EQ(good->epoch, 1);
    EXPECT_EQ(good->step_in_epoch, 1);
  }
  const auto flip_last_byte = [](const fs::path& p) {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char c = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x40));
  };
  const auto move_out = [](const fs::path& step, const std::string& file) {
    const fs::path elsewhere = step.parent_path() / ("moved-" + file);
    fs::rename(step / file, elsewhere);
    return elsewhere;
  };
  const std::vector<Corruption> table = {
      {"bad JSON",
       [](const fs::path& s) { std::ofstream(s / "manifest.json", std::ios::trunc) << "{\"format\": dpcheck}"; },
       {"manifest.json: not valid JSON"}},
      {"truncated JSON",
       [](const fs::path& s) {
         const std::string text = read_file(s / "manifest.json");
         std::ofstream(s / "manifest.json", std::ios::trunc) << text.substr(0, text.find('\n', text.size() / 2));
       },
       {"manifest.json: not valid JSON", "end of input"}},
      {"not a JSON object",
       [](const fs::path& s) { std::ofstream(s / "manifest.json", std::ios::trunc) << "[4]"; },
       {"manifest.json: the manifest is [4], not a JSON object"}},
      {"missing manifest", [](const fs::path& s) { fs::remove(s / "manifest.json"); }, {"manifest.json is missing"}},
      {"missing file",
       [](const fs::path& s) { fs::remove(s / "layers.1.bias.npy"); },
       {"layers.1.bias.npy is missing"}},
      {"unlisted extra file",
       [](const fs::path& s) { fs::copy_file(s / "layers.1.bias.npy", s / "layers.2.bias.npy"); },
       {"layers.2.bias.npy is not listed in the manifest"}},
      {"extra file listed",
       [](const fs::path& s) {
         fs::copy_file(s / "optimizer.exp_avg.npy", s / "optimizer.momentum_buffer.npy");
         rehash(s, "optimizer.momentum_buffer.npy");
       },
       {"\"files\" lists \"optimizer.momentum_buffer.npy\", which is no tensor of model 5,7,3 with adam"}},
      {"wrong size",
       [](const fs::path& s) { std::ofstream(s / "layers.0.weight.npy", std::ios::app) << 'x'; },
       {"layers.0.weight.npy has ", " bytes, the manifest says "}},
      {"hash mismatch",
       [&](const fs::path& s) { flip_last_byte(s / "layers.1.bias.npy"); },
       {"layers.1.bias.npy: hash does not match the manifest"}},
      {"wrong shape",
       [](const fs::path& s) {
         rewrite_tensor(
             s, "layers.0.weight.npy", [](auto&) {}, std::vector<std::int64_t>{5, 7});
       },
       {"layers.0.weight.npy has shape (5, 7), the model needs (7, 5)"}},
      {"wrong dtype",
       [](const fs::path& s) {
         rewrite_tensor(
             s, "layers.0.bias.npy", [](auto&) {}, std::nullopt, true);
       },
       {"layers.0.bias.npy holds float64, not float32"}},
      {"not a .npy file",
       [](const fs::path& s) {
         std::ofstream(s / "layers.0.bias.npy", std::ios::trunc) << "not numpy";
         rehash(s, "layers.0.bias.npy");
       },
       {"layers.0.bias.npy: not a .npy file"}},
      {"other model dims", [](const fs::path&) {}, {"written for model 5,7,3, this run has 5,8,3"}, {5, 8, 3}},
      {"other optimizer",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["config"]["optimizer"] = "momentum"; }); },
       {"\"optimizer.state\" is [\"exp_avg\",\"exp_avg_sq\"], but momentum keeps [\"momentum_buffer\"]"}},
      {"a state block left out",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["optimizer"]["state"] = {"exp_avg"}; }); },
       {"\"optimizer.state\" is [\"exp_avg\"], but adam keeps"}},
      {"step 1e30",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { set_step(m, 1e30); }); },
       {"\"step\" is 1e+30, not an integer in [0, 2^53)"}},
      {"step -1",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { set_step(m, -1); }); },
       {"\"step\" is -1, not an integer in [0, 2^53)"}},
      {"step 2.5",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { set_step(m, 2.5); }); },
       {"\"step\" is 2.5, not an integer"}},
      {"step \"3\"",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { set_step(m, "3"); }); },
       {"\"step\" is \"3\", not an integer"}},
      {"step true",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { set_step(m, true); }); },
       {"\"step\" is true, not an integer"}},
      {"step 2^53",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { set_step(m, std::int64_t{1} << 53); }); },
       {"\"step\" is 9007199254740992, not an integer in [0, 2^53)"}},
      {"step missing",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m.erase("step"); }); },
       {"\"step\" is missing"}},
      {"epoch -1",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["epoch"] = -1; }); },
       {"\"epoch\" is -1, not an integer in [0, 2^53)"}},
      {"step_in_epoch 999",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["step_in_epoch"] = 999; }); },
       {"\"step_in_epoch\" is 999, beyond the end of an epoch (the recorded configuration has 3 steps an epoch)"}},
      {"epoch and step disagree",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["epoch"] = 0; }); },
       {"\"epoch\" 0 and \"step_in_epoch\" 1 do not agree with \"step\" 4, which is step 1 of epoch 1"}},
      {"optimizer steps -1",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["optimizer"]["steps"] = -1; }); },
       {"\"optimizer.steps\" is -1, not an integer in [0, 2^53)"}},
      {"optimizer steps not the step",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["optimizer"]["steps"] = 3; }); },
       {"\"optimizer.steps\" is 3 after 4 steps"}},
      {"NaN parameter",
       [](const fs::path& s) {
         rewrite_tensor(s, "layers.1.weight.npy", [](auto& v) { v[8] = std::numeric_limits<float>::quiet_NaN(); });
       },
       {"layers.1.weight.npy holds nan at layers.1.weight[1, 1], not a finite number"}},
      {"Inf state",
       [](const fs::path& s) {
         rewrite_tensor(s, "optimizer.exp_avg.npy", [](auto& v) { v[35] = std::numeric_limits<float>::infinity(); });
       },
       {"optimizer.exp_avg.npy holds inf at layers.0.bias[0], not a finite number"}},
      {"negative exp_avg_sq",
       [](const fs::path& s) { rewrite_tensor(s, "optimizer.exp_avg_sq.npy", [](auto& v) { v[44] = -1; }); },
       {"optimizer.exp_avg_sq.npy holds -1 at layers.1.weight[0, 2]: a running mean of squares is never negative"}},
      {"unknown format",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["format"] = "pytorch"; }); },
       {"\"format\" is \"pytorch\", not \"dpcheck-checkpoint\""}},
      {"unknown version",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["version"] = 2; }); },
       {"\"version\" is 2: this dpcheck reads version 1"}},
      {"unknown field",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["note"] = "x"; }); },
       {"\"note\" is not a field of a dpcheck checkpoint manifest"}},
      {"field given twice",
       [](const fs::path& s) {
         std::string text = read_file(s / "manifest.json");
         text.insert(text.find('{') + 1, "\"step\": 7,");
         std::ofstream(s / "manifest.json", std::ios::trunc) << text;
       },
       {"\"step\" is given twice"}},
      {"config field missing",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["config"].erase("seed"); }); },
       {"\"config.seed\" is missing"}},
      {"config world size 0",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["config"]["world_size"] = 0; }); },
       {"\"config.world_size\" is 0, not an integer in [1, 2^31)"}},
      {"config model misspelt",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["config"]["model"] = "5,07,3"; }); },
       {"\"config.model\" is \"5,07,3\", which dpcheck writes as \"5,7,3\""}},
      {"file left out of the list",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["files"].erase("layers.1.bias.npy"); }); },
       {"\"files\" lists 5 files, but model 5,7,3 with adam keeps 6 tensors"}},
      {"bad hash text",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["files"]["layers.0.bias.npy"]["xxh3"] = "xyz"; }); },
       {"\"files[layers.0.bias.npy].xxh3\" is \"xyz\", not 16 lower-case hexadecimal digits"}},
      {"size 1e30",
       [](const fs::path& s) { edit_manifest(s, [](auto& m) { m["files"]["layers.0.bias.npy"]["bytes"] = 1e30; }); },
       {"\"files[layers.0.bias.npy].bytes\" is 1e+30, not an integer in [0, 2^53)"}},
      {"step not the directory's",
       [](const fs::path& s) {
         edit_manifest(s, [](auto& m) {
           m["step"] = 5;
           m["step_in_epoch"] = 2;
           m["optimizer"]["steps"] = 5;
         });
       },
       {"manifest.json records step 5, not the step the directory is named for"}},
      {"symbolic link in place of a file",
       [&](const fs::path& s) { fs::create_symlink(move_out(s, "layers.0.bias.npy"), s / "layers.0.bias.npy"); },
       {"layers.0.bias.npy is a symbolic link, not a regular file"}},
      {"FIFO in place of a file",
       [](const fs::path& s) {
         fs::remove(s / "optimizer.exp_avg.npy");
         ASSERT_EQ(::mkfifo((s / "optimizer.exp_avg.npy").c_str(), 0600), 0);
       },
       {"optimizer.exp_avg.npy is a FIFO, not a regular file"}},
      {"FIFO in place of the manifest",
       [](const fs::path& s) {
         fs::remove(s / "manifest.json");
         ASSERT_EQ(::mkfifo((s / "manifest.json").c_str(), 0600), 0);
       },
       {"manifest.json is a FIFO, not a regular file"}},
      {"directory in place of a file",
       [](const fs::path& s) {
         fs::remove(s / "layers.0.weight.npy");
         fs::create_directory(s / "layers.0.weight.npy");
       },
       {"layers.0.weight.npy is a directory, not a regular file"}},
      {"symbolic link in place of the checkpoint",
       [](const fs::path& s) {
         fs::rename(s, s.parent_path() / "real");
         fs::create_directory_symlink(s.parent_path() / "real", s);
       },
       {"step-00000004: a symbolic link, not a directory"}},
  };
  ASSERT_GE(table.size(), 24u);
  int row = 0;
  for (const Corruption& c : table) {
    SCOPED_TRACE(c.name);
    const fs::path dir = dir_ / ("row" + std::to_string(row++));
    fs::create_directories(dir);
    fs::copy(dir_ / "good", dir, fs::copy_options::recursive);
    c.corrupt(dir / name);
    ModelConfig model = config_.model;
    if (!c.read_as.empty()) model.dims = c.read_as;

    std::string why;
    const auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(read_checkpoint(dir / name, model, &why).has_value());
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));  // a FIFO must not block
    EXPECT_EQ(why.rfind(name + ": ", 0), 0u) << why;
    for (const std::string& r : c.reason) EXPECT_NE(why.find(r), std::string::npos) << why;

    // The only candidate: the refusal names it and says why.
    try {
      load_checkpoint(dir, model);
      ADD_FAILURE() << "loaded";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), "no usable checkpoint in " + dir.string() + ": " + why);
    }
  }
}

TEST_F(Corrupt, ParseManifestNeedsNoFiles) {
  const std::string text = read_file(dir_ / "good" / "step-00000004" / "manifest.json");
  const Manifest m = parse_manifest(text);
  EXPECT_EQ(m.step, 4);
  EXPECT_EQ(m.epoch, 1);
  EXPECT_EQ(m.step_in_epoch, 1);
  EXPECT_EQ(m.steps_per_epoch, 3);
  EXPECT_EQ(m.optimizer_steps, 4);
  EXPECT_EQ(m.model.dims, config_.model.dims);
  EXPECT_EQ(m.state_names, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  ASSERT_EQ(m.files.size(), 6u);
  EXPECT_EQ(m.files.front().name, "layers.0.weight.npy");
  EXPECT_EQ(m.files.back().name, "optimizer.exp_avg_sq.npy");
  for (const std::string& bad :
       std::vector<std::string>{"", "null", "{}", "[]", "1e30", "\"step\"", text.substr(0, text.size() - 3)}) {
    try {
      parse_manifest(bad);
      ADD_FAILURE() << bad;
    } catch (const UsageError& e) {
      EXPECT_GT(std::strlen(e.what()), 0u);
    }
  }
}

TEST_F(Corrupt, TheNewestIsSkippedWithItsReasonAndTheOlderLoads) {
  run_local(
      1, [&](Communicator& comm) { RankZeroWriter(comm, dir_ / "good", {}).save(trained(config_, 2), config_.model); });
  const fs::path newest = dir_ / "good" / "step-00000004";
  rewrite_tensor(newest, "layers.0.bias.npy", [](auto& v) { v[3] = std::numeric_limits<float>::quiet_NaN(); });
  std::vector<std::string> skipped;
  const Checkpoint c = load_checkpoint(dir_ / "good", config_.model, &skipped);
  EXPECT_EQ(c.step, 2);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0], "step-00000004: layers.0.bias.npy holds nan at layers.0.bias[3], not a finite number");

  // Both unusable: both are named, newest first, each with its reason.
  fs::remove(dir_ / "good" / "step-00000002" / "optimizer.exp_avg_sq.npy");
  try {
    load_checkpoint(dir_ / "good", config_.model);
    ADD_FAILURE() << "loaded";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "no usable checkpoint in " + (dir_ / "good").string() + ": " + skipped[0] +
                                         "; step-00000002: optimizer.exp_avg_sq.npy is missing");
  }
  fs::remove_all(dir_ / "good" / "step-00000002");
  fs::remove_all(newest);
  try {
    load_checkpoint(dir_ / "good", config_.model);
    ADD_FAILURE() << "loaded";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("holds no step-NNNNNNNN directory"), std::string::npos) << e.what();
  }
}

// The writer writes nothing its reader would refuse: a checkpoint whose fields disagree is a bug in
// the caller, reported when it is saved.
TEST_F(Writer, ACheckpointTheReaderWouldRefuseIsNotWritten) {
  const TrainConfig c = small_config(OptimizerKind::momentum);
  Checkpoint bad = trained(c, 2);
  bad.optimizer_steps = 1;
  run_local(1, [&](Communicator& comm) {
    try {
      RankZeroWriter(comm, dir_, {}).save(bad, c.model);
      ADD_FAILURE() << "saved";
    } catch (const UsageError& e) {
      ADD_FAILURE() << "a UsageError: " << e.what();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("\"optimizer.steps\" is 1 after 2 steps"), std::string::npos) << e.what();
    }
  });
  EXPECT_TRUE(fs::is_empty(dir_));
}

// The same refusal among four ranks: every rank ends at once with rank 0's reason, none is left in
// save()'s barrier or at the next collective (which, with rank 0 gone on, matched another call and
// left the others to the timeout).
TEST_F(Writer, ACheckpointRankZeroCannotWriteEndsTheSaveOnEveryRank) {
  const TrainConfig c = small_config(OptimizerKind::momentum);
  Checkpoint bad = trained(c, 2);
  bad.optimizer_steps = 1;
  std::vector<std::string> said(4);
  const auto start = std::chrono::steady_clock::now();
  run_local(
      4,
      [&](Communicator& comm) {
        try {
          RankZeroWriter(comm, dir_, {}).save(bad, c.model);
        } catch (const Error& e) {
          said[static_cast<std::size_t>(comm.rank())] = e.what();
        }
        // Every rank is still in step with the others: the next collective is the same call everywhere.
        comm.host().barrier();
      },
      std::chrono::milliseconds(20000));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(said[0].find("\"optimizer.steps\" is 1 after 2 steps"), std::string::npos) << said[0];
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(said[static_cast<std::size_t>(r)].rfind("rank 0: cannot write checkpoint", 0), 0u)
        << said[static_cast<std::size_t>(r)];
    EXPECT_NE(said[static_cast<std::size_t>(r)].find("\"optimizer.steps\" is 1 after 2 steps"), std::string::npos);
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

// Pruning and removing abandoned temporary directories are writes: a rank that does not write (every
// rank but 0) leaves them alone. The same scene with the writing rank shows the cleanup does happen.
class SilentWriter final : public RankZeroWriter {
 public:
  using RankZeroWriter::RankZeroWriter;

 protected:
  bool writes() const override { return false; }
};

TEST_F(Writer, OnlyTheWritingRankPrunesOrRemovesAbandonedDirectories) {
  const TrainConfig c = small_config(OptimizerKind::sgd);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  const auto scene = [&](const fs::path& dir) {
    run_local(1, [&](Communicator& comm) {
      RankZeroWriter w(comm, dir, {}, 3);
      for (int s = 1; s <= 3; ++s) w.save(trained(c, s), c.model);
    });
    fs::create_directories(dir / (".step-00000009.tmp-" + std::to_string(child)));
  };
  const Checkpoint fourth = trained(c, 4);
  scene(dir_ / "silent");
  run_local(3, [&](Communicator& comm) {
    EXPECT_TRUE(SilentWriter(comm, dir_ / "silent", {}, 1).save(fourth, c.model).empty());
  });
  for (const char* left : {"step-00000001", "step-00000002", "step-00000003"})
    EXPECT_TRUE(fs::exists(dir_ / "silent" / left)) << left;
  EXPECT_FALSE(fs::exists(dir_ / "silent" / "step-00000004"));
  EXPECT_TRUE(fs::exists(dir_ / "silent" / (".step-00000009.tmp-" + std::to_string(child))));

  scene(dir_ / "written");
  run_local(3, [&](Communicator& comm) { RankZeroWriter(comm, dir_ / "written", {}, 1).save(fourth, c.model); });
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_ / "written")) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"step-00000004"});
}

// A run resumed from an older checkpoint (the newer ones unusable) keeps what it writes: --keep counts
// the checkpoint just written first, then the newest others.
TEST_F(Writer, PruningNeverRemovesTheCheckpointJustWritten) {
  const TrainConfig c = small_config(OptimizerKind::sgd);
  run_local(1, [&](Communicator& comm) {
    RankZeroWriter w(comm, dir_, {}, 2);
    for (int s : {5, 6}) w.save(trained(c, s), c.model);
    w.save(trained(c, 3), c.model);
  });
  EXPECT_TRUE(fs::exists(dir_ / "step-00000003"));
  EXPECT_TRUE(fs::exists(dir_ / "step-00000006"));
  EXPECT_FALSE(fs::exists(dir_ / "step-00000005"));
}

// A FIFO as the log would block the open until a reader comes: it is refused at once, naming the path.
// Run in a child under an alarm, so that a regression fails the test instead of hanging the suite.
// The FIFO appears after the writer is constructed (which checks too), so that log() must check for itself.
class FifoAfterConstruction final : public RankZeroWriter {
 public:
  FifoAfterConstruction(Communicator& comm, const fs::path& log) : RankZeroWriter(comm, {}, log) {
    if (::mkfifo(log.c_str(), 0600) != 0) throw Error("mkfifo failed");
  }
};

TEST_F(Writer, AFifoAsTheLogIsRefusedPromptly) {
  const fs::path fifo = dir_ / "log.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(10);
    std::string said = "no error";
    try {
      run_local(1, [&](Communicator& comm) { FifoAfterConstruction(comm, dir_ / "later.fifo").log({{"step", 0}}); });
    } catch (const UsageError& e) {
      said = e.what();
    } catch (const std::exception& e) {
      said = std::string("not a UsageError: ") + e.what();
    }
    (void)!::write(pipe_fds[1], said.data(), said.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "the writer blocked on the FIFO (killed by signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(said, "log " + (dir_ / "later.fifo").string() + " is a FIFO, not a regular file");

  // The constructor refuses it already (before any training step), and a directory the same way; a
  // regular file still takes the log.
  run_local(1, [&](Communicator& comm) {
    EXPECT_THROW(RankZeroWriter(comm, {}, fifo), UsageError);
    EXPECT_THROW(RankZeroWriter(comm, {}, dir_), UsageError);
    RankZeroWriter(comm, {}, dir_ / "log.jsonl").log({{"step", 0}});
  });
  EXPECT_EQ(read_file(dir_ / "log.jsonl"), "{\"step\":0}\n");
  // (The command's refusal: writer_command_test.cpp.)
}

}  // namespace
}  // namespace dpcheck
