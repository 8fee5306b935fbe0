// RankZeroWriter: the only sanctioned way for training to write files. Rank 0 writes; every other rank
// returns without touching the file system. (The write audit, src/audit/audit.hpp, checks that promise at the
// system-call level instead of trusting this class.)
//
// Checkpoints are directories: DIR/step-00000012/ holds one .npy per parameter tensor (PyTorch's names),
// one per optimizer state block (optimizer.exp_avg.npy, flat), and manifest.json, written last, which
// records the step, the sampler position, the configuration and every file's size and XXH3 hash. Each
// file goes through a temporary file, fsync and rename; the whole directory is built under a temporary
// name and renamed into place, then the parent directory is fsynced. A process killed at any point
// leaves either the previous checkpoints alone or the new one complete.
//
// A checkpoint is input like any other, so the reader trusts nothing in it: every manifest field must
// have its type and range and agree with the others (the step with the epoch and the position in it, the
// optimizer's steps with the step, the file list with the recorded model and optimizer), and every file
// must be a regular file (no symbolic link is followed, no FIFO opened for long) with the recorded size,
// hash, dtype and shape, holding finite values. A checkpoint that fails any of it is skipped with the
// reason, and the reasons are reported.
//
// The log is JSON lines, one record a line, each appended with a single write(2), to a regular file only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/train/loss_scaler.hpp"

#include <nlohmann/json.hpp>

#include "src/comm.hpp"
#include "src/train/checkpoint.hpp"
#include "src/train/model.hpp"

namespace dpcheck {

struct TrainConfig;  // src/train/train_config.hpp

class RankZeroWriter {
 public:
  // Either path may be empty (no checkpoints, or no log).
  RankZeroWriter(Communicator& comm, std::filesystem::path checkpoint_dir, std::filesystem::path log_path,
                 int keep = 2);
  virtual ~RankZeroWriter();
  RankZeroWriter(const RankZeroWriter&) = delete;
  RankZeroWriter& operator=(const RankZeroWriter&) = delete;

  // Writes the checkpoint (rank 0) and keeps the newest `keep` of them. Returns its directory, or an
  // empty path on ranks that do not write. A collective (every rank may read the checkpoint once it
  // returns), unless `collective` is false: then rank 0 alone calls it (a peer may be gone). When rank 0
  // cannot write it, every rank throws: rank 0 its own error, the others an Error naming rank 0 and its
  // reason, so that no rank waits for one that has left.
  std::filesystem::path save(const Checkpoint& checkpoint, const ModelConfig& model, bool collective = true);
  // Appends one JSON line to the log (rank 0). The first call opens the log: UsageError naming the path
  // if it is anything but a regular file (a FIFO would block the open, or every write, forever).
  virtual void log(const nlohmann::json& record);
  // fsyncs the log.
  void flush();
  // The log's first write truncates it instead of appending (a trace: one run a file).
  void start_log_fresh() { log_truncate_ = true; }

  // Writes `contents` to `path` (rank 0), through a temporary file, fsync and rename, creating the
  // directory if needed: a bundle's manifest and index lists.
  void write_text(const std::filesystem::path& path, std::string_view contents);
  // Renames a directory this writer built under a temporary name into place (rank 0), then fsyncs
  // the parent. Error if `to` exists: nothing is replaced.
  void publish_dir(const std::filesystem::path& from, const std::filesystem::path& to);
  // Removes from `dir` the temporary directories (".<name>.tmp-<pid>") of writers whose process is gone,
  // killed mid-write (rank 0): a bundle cut off when a launcher ended the job, say.
  void remove_abandoned_in(const std::filesystem::path& dir) const;

  const std::filesystem::path& checkpoint_dir() const { return checkpoint_dir_; }
  const std::filesystem::path& log_path() const { return log_path_; }

 protected:
  // Whether this rank writes. Mutants override it.
  virtual bool writes() const { return comm_.rank() == 0; }
  Communicator& comm_;

 private:
  std::filesystem::path checkpoint_dir_, log_path_;
  int keep_;
  int log_fd_ = -1;
  bool log_truncate_ = false;
};

// "step-00000012"
std::string checkpoint_name(std::int64_t step);

// A recorded configuration (TrainConfig::to_json's form) back as a TrainConfig and its world size,
// every field checked; it must be one that to_json could have written. UsageError with the reason.
std::pair<TrainConfig, int> recorded_config(const nlohmann::json& json);

// What a manifest.json says, checked against itself but not yet against any file.
struct Manifest {
  struct File {
    std::string name;  // "layers.0.weight.npy", "optimizer.exp_avg.npy"
    std::uint64_t bytes = 0;
    std::uint64_t xxh3 = 0;
  };
  std::int64_t step = 0, epoch = 0, step_in_epoch = 0;
  std::int64_t steps_per_epoch = 1;  // follows from the recorded configuration
  std::int64_t optimizer_steps = 0;
  std::optional<LossScalerState> loss_scaler;  // present exactly when the configuration scales its loss
  std::vector<std::string> state_names;
  nlohmann::json config;    // as recorded (TrainConfig::to_json)
  ModelConfig model;        // the recorded model
  std::vector<File> files;  // the model's tensors in layout order, then the optimizer's state blocks
};

// Parses and checks manifest text: every field present with its JSON type (integers as integers, in
// [0, 2^53) or the field's own range), no field unknown or given twice, the configuration one a run
// could have, epoch and step_in_epoch agreeing with step, the optimizer's steps equal to step and its
// state blocks those of the recorded optimizer, and the file list exactly the recorded model's tensors
// and those blocks. Throws UsageError with the reason, e.g. "\"step\" is 1e+30, not an integer in
// [0, 2^53)". Needs no file, so a fuzz target can drive it.
Manifest parse_manifest(std::string_view text);

// Reads and verifies one checkpoint directory against `model`; nullopt if anything is wrong, with `why`
// set to "step-00000012: <reason>".
std::optional<Checkpoint> read_checkpoint(const std::filesystem::path& step_dir, const ModelConfig& model,
                                          std::string* why = nullptr);

// The step-NNNNNNNN entries of a checkpoint directory, newest first (not yet read or checked).
std::vector<std::pair<std::int64_t, std::filesystem::path>> checkpoint_steps(const std::filesystem::path& dir);

// The newest checkpoint under dir that read_checkpoint accepts. Each newer one skipped is reported in
// `skipped` (if given) as "step-00000012: <reason>". Throws UsageError when none is usable, naming every
// candidate and why it was skipped. With at_most_step, only checkpoints of that step or before are
// candidates.
Checkpoint load_checkpoint(const std::filesystem::path& dir, const ModelConfig& model,
                           std::vector<std::string>* skipped = nullptr,
                           std::int64_t at_most_step = std::numeric_limits<std::int64_t>::max());

}  // namespace dpcheck
