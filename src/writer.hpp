// RankZeroWriter: the only sanctioned way for training to write files. Rank 0 writes; every other rank
// returns without touching the file system. (The write audit, src/audit.hpp, checks that promise at the
// system-call level instead of trusting this class.)
//
// Checkpoints are directories: DIR/step-00000012/ holds one .npy per parameter tensor (PyTorch's names),
// one per optimizer state block (optimizer.exp_avg.npy, flat), and manifest.json, written last, which
// records the step, the sampler position, the configuration and every file's size and XXH3 hash. Each
// file goes through a temporary file, fsync and rename; the whole directory is built under a temporary
// name and renamed into place, then the parent directory is fsynced. A process killed at any point
// leaves either the previous checkpoints alone or the new one complete: load_checkpoint() accepts only
// a directory whose manifest exists and whose files all match it.
//
// The log is JSON lines, one record a line, each appended with a single write(2).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/comm.hpp"
#include "src/model.hpp"

namespace dpcheck {

struct Checkpoint {
  std::int64_t step = 0;             // steps completed: training resumes at this step
  std::int64_t epoch = 0;            // the sampler's epoch at `step`
  std::int64_t step_in_epoch = 0;    // and the step's position within it
  std::vector<float> params;
  std::vector<std::string> state_names;  // optimizer state blocks, each params.size() long
  std::vector<float> optimizer_state;
  std::int64_t optimizer_steps = 0;
  nlohmann::json config;             // the run's configuration (TrainConfig and world size)
};

class RankZeroWriter {
 public:
  // Either path may be empty (no checkpoints, or no log).
  RankZeroWriter(Communicator& comm, std::filesystem::path checkpoint_dir, std::filesystem::path log_path,
                 int keep = 2);
  virtual ~RankZeroWriter();
  RankZeroWriter(const RankZeroWriter&) = delete;
  RankZeroWriter& operator=(const RankZeroWriter&) = delete;

  // Writes the checkpoint (rank 0) and keeps the newest `keep` of them. Returns its directory, or an
  // empty path on ranks that do not write.
  std::filesystem::path save(const Checkpoint& checkpoint, const ModelConfig& model);
  // Appends one JSON line to the log (rank 0).
  virtual void log(const nlohmann::json& record);
  // fsyncs the log.
  void flush();

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
};

// "step-00000012"
std::string checkpoint_name(std::int64_t step);

// The newest complete checkpoint under dir: every file listed in its manifest present with the
// recorded size and hash. Incomplete or corrupt ones are skipped (and named in `skipped`, if given).
// Throws UsageError when there is none.
Checkpoint load_checkpoint(const std::filesystem::path& dir, const ModelConfig& model,
                           std::vector<std::string>* skipped = nullptr);

// Reads and verifies one checkpoint directory; nullopt (with the reason) if it is incomplete or corrupt.
std::optional<Checkpoint> read_checkpoint(const std::filesystem::path& step_dir, const ModelConfig& model,
                                          std::string* why = nullptr);

}  // namespace dpcheck
