// Reproducing and attributing a divergence found during training.
//
// Live checks (`train --check-finite`, `--check-gradient-every K`) watch every step from inside the
// trainer: a NaN or an infinity in a rank's loss or local gradient is caught before the all-reduce
// spreads it to every replica, and at every K-th step the all-reduced gradient is held against the
// float64 reference of the whole global batch within the derived bound (the first property, on real
// training), beside the same engine's gradient of that batch at once.
//
// When a check fails (those two, the replica check, a loss that is not finite, a timeout), rank 0 writes
// a repro bundle: the configuration, the command line, the target, the checkpoint taken before the
// failing step, every rank's example indices of that step, the trace so far, and the failure itself
// (its kind, step, rank and element). `dpcheck replay BUNDLE` runs that step again from the checkpoint
// with the same checks, and says whether it fails the same way, bit for bit; on another target
// (`--engine cpu --comm local`) it attributes: each phase of the step on each rank against the float64
// reference -- local gradient, all-reduced gradient, optimizer update, replica bits -- and the first
// phase that leaves the bound.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "divergence/backend_record.hpp"
#include "src/error.hpp"
#include "src/target/target.hpp"
#include "src/train/step_checks.hpp"
#include "src/train/trainer.hpp"

namespace dpcheck {

// A StepFailure as StepFailure::to_json writes it (a bundle's "failure"); UsageError naming the field.
StepFailure step_failure_from_json(const nlohmann::json& j);
// The same verdict at the same place: kind, step, rank and element (the mutant
// "replay-same-place-ignores-element" leaves the element out; any other name keeps it).
bool same_place(const StepFailure& a, const StepFailure& b, std::string_view mutant = {});

struct LiveCheckOptions {
  bool finite = false;     // --check-finite
  int gradient_every = 0;  // --check-gradient-every K (0: never)
};

// The live checks as a StepObserver. Every rank must hold one (they agree over comm.host()).
class LiveChecks final : public StepObserver {
 public:
  LiveChecks(const Target& target, LiveCheckOptions options);

  void local_gradient(Trainer& trainer, std::int64_t step, double loss_sum, std::int64_t examples) override;
  void reduced_gradient(Trainer& trainer, std::int64_t step) override;

  // The checks that ran at the last step, for the log and the trace: {"finite": true,
  // "gradient_ratio": 0.31, "whole_batch_ratio": 0.2}; empty when none ran.
  const nlohmann::json& last() const { return last_; }
  void clear() { last_ = nlohmann::json::object(); }

 private:
  Target target_;
  LiveCheckOptions options_;
  std::unique_ptr<Engine> whole_;  // rank 0's engine for the whole batch, made at the first check
  nlohmann::json last_ = nlohmann::json::object();
};

// The all-reduced gradient of a step against the float64 reference of its global batch, and the same
// engine's gradient of that batch at once: the error ratios (at most 1 passes) and the worst element.
struct LiveGradientCheck {
  double ratio = 0;              // all-reduced
  double whole_batch_ratio = 0;  // the same engine on the whole batch
  std::string element;           // where the larger ratio is
  std::string message;           // set when a ratio is over 1
};
LiveGradientCheck check_step_gradient(const Target& target, Trainer& trainer, std::int64_t step,
                                      std::span<const float> params, std::span<const float> reduced,
                                      Engine* whole_engine);

// ---- bundles -------------------------------------------------------------------------------------

inline constexpr int kBundleVersion = 1;

// What a bundle records besides its checkpoint.
struct BundleManifest {
  TrainConfig config;
  int world_size = 1;
  TargetRecord target;  // engine, comm, kernels, mutant, tf32, precision, timeout, by name
  LiveCheckOptions checks;
  std::vector<std::string> command_line;
  std::string x, y;            // --x / --y as absolute paths, or empty for synthetic data
  std::string x_xxh3, y_xxh3;  // their hashes when written
  std::string version;         // dpcheck's
  StepFailure failure;
  std::vector<std::vector<std::int64_t>> indices;  // per rank, the failing step's examples
  // The plugins' files and tables and the variables that choose the algorithm (backend_record.hpp);
  // nullopt in a bundle written before dpcheck recorded them, and for write_bundle to record.
  std::optional<BackendRecord> backend;

  nlohmann::json to_json() const;
  static BundleManifest from_json(const nlohmann::json& j);  // UsageError naming what is wrong
};

// A fresh bundle directory name under `parent` for a failure at `step`: dpcheck-bundle-step-00000012,
// then -2, -3, ... when one exists (nothing is replaced).
std::filesystem::path fresh_bundle_path(const std::filesystem::path& parent, std::int64_t step);

// Writes the bundle through the target's RankZeroWriter (rank 0 writes: a temporary directory renamed
// into place); `trace` is the trace file so far ("" when none). A collective, unless `collective` is
// false (a peer may be gone): then rank 0 alone calls it.
// `start` is the state the run began from (its step 0, or the step it resumed at): a failure that
// depends on more than the step's own inputs (a communicator's call count) replays from there.
// A manifest without a backend record gets the target's (record_backend).
void write_bundle(const Target& target, Communicator& comm, const std::filesystem::path& path,
                  const BundleManifest& manifest, const Checkpoint& before, const Checkpoint& start,
                  const std::filesystem::path& trace, bool collective = true);

// XXH3-64 of a file's bytes, as 16 hex digits (the data files a bundle names).
std::string file_xxh3(const std::filesystem::path& path);

// "dpcheck replay BUNDLE", with the target's launcher in front when its ranks are processes, and in
// front of that the variables `backend` recorded (recorded_env_prefix), so that the line replays the
// algorithm the run ran: "DPCHECK_GLOO_ALGORITHM=ring dpcheck replay BUNDLE".
std::string bundle_replay_command(const Target& target, const std::filesystem::path& bundle,
                                  const BackendRecord* backend = nullptr);

struct Bundle {
  std::filesystem::path dir;
  BundleManifest manifest;
  Checkpoint before;
  Checkpoint start;
  // Set when the state before the step is not a checkpoint dpcheck reads (it holds a NaN or an
  // infinity: the run had diverged before the failing step); `before` is then the run's start.
  std::string before_unreadable;
};
// Reads and checks a bundle directory; UsageError naming the file and the reason.
Bundle read_bundle(const std::filesystem::path& dir);

// ---- replay and attribution ----------------------------------------------------------------------

// One phase of the step on one rank against the float64 reference.
struct PhaseRatio {
  std::string phase;  // "data" | "local gradient" | "all-reduce" | "optimizer" | "replicas"
  int rank = 0;
  double ratio = 0;  // error / bound at the worst element (data and replicas: 0 agree, inf differ)
  std::string element;
};

struct ReplayResult {
  std::optional<StepFailure> failure;  // what the step's checks found on the replay target
  std::vector<PhaseRatio> phases;      // phase x rank, in phase order
  std::string first_out_of_bound;      // "all-reduce on rank 1", or "" when every phase holds
  double loss = 0;
  std::vector<float> params_after, state_after;  // rank 0's, when the step ran to its end
};

struct ReplayInput {
  TrainConfig config;
  int world_size = 1;
  LiveCheckOptions checks;
  Checkpoint before;      // the state training starts from (the bundle's: just before `step`)
  std::int64_t step = 0;  // the step replayed, at or after before.step
  const Dataset* data = nullptr;
  std::vector<std::vector<std::int64_t>> indices;  // recorded per-rank examples (empty: not recorded)
};

// Trains on `target` from the checkpoint up to `input.step`, runs that step with the given checks, and
// measures every phase of it on every rank against the float64 reference.
ReplayResult replay_step(const Target& target, const ReplayInput& input);

// What replay says of a recorded failure from the replayed step's: the same verdict at the same place
// with the same message, at the same place with other values, or not reproduced (no failure, or one
// elsewhere). `mutant` is the replay target's (same_place).
enum class ReplayVerdict { bit_for_bit, same_place, not_reproduced };
ReplayVerdict replay_verdict(const StepFailure& recorded, const std::optional<StepFailure>& replayed,
                             std::string_view mutant = {});

// ---- rounding or bug ----------------------------------------------------------------------------

// A --checkpoint-dir directory: its recorded configuration and world size, and its checkpoints by step.
struct CheckpointRun {
  std::filesystem::path dir;
  TrainConfig config;
  int world_size = 1;
  std::vector<std::int64_t> steps;  // ascending
};
// UsageError naming the directory when it holds no checkpoint whose manifest reads.
CheckpointRun read_checkpoint_run(const std::filesystem::path& dir);

// One step of two runs: for each, its update from its own parameters replayed on the target and held
// against the float64 reference, and whether the replay gives the bits the run recorded next.
struct DriftStep {
  std::int64_t step = 0;
  double ratio[2] = {0, 0};            // the largest error ratio of any phase on any rank
  std::string where[2];                // the first phase out of the bound, or ""
  bool same_bits[2] = {false, false};  // replayed parameters and state == the run's next checkpoint
  std::uint64_t apart_ulp = 0;         // largest distance between the two runs' parameters after the step
};

struct DriftReport {
  std::vector<DriftStep> steps;
  int bug_run = -1;  // 0 or 1: the run whose step left the bound first; -1: none did
  std::int64_t bug_step = -1;
  std::string bug_where;
  int unreproduced_run = -1;  // a run whose recorded step the target does not give bit for bit
  std::int64_t unreproduced_step = -1;
};

// For every step s at which both runs hold checkpoints s and s + 1 (from `from` on): replays run k's
// step s from its checkpoint on targets[k] with its own configuration and world size, over data[k].
DriftReport rounding_or_bug(const Target targets[2], const CheckpointRun runs[2], const Dataset* const data[2],
                            std::int64_t from = 0);

}  // namespace dpcheck
