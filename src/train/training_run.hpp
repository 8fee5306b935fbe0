// A training run as `dpcheck train` runs it, one rank's part: the rank steps the trainer to
// config.steps, each step is judged by checked_step (the replica check and the loss) and by the checks
// the run adds inside it (RunChecks), rank 0 logs a line a step and checkpoints through the
// RankZeroWriter, and on the first failure every rank stops at the same step. What the checks add --
// the live checks, the trace, the repro bundle -- is divergence/run_checks.hpp's; the CLI puts the two
// together on every rank of the target's world.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/comm.hpp"
#include "src/train/checkpoint.hpp"
#include "src/train/engine.hpp"
#include "src/train/step_checks.hpp"
#include "src/train/trainer.hpp"
#include "src/train/writer.hpp"

namespace dpcheck {

struct TrainingRunOptions {
  std::string checkpoint_dir;  // "" none; else rank 0 writes checkpoints there
  int checkpoint_every = 0;    // every K steps (0: only at the end)
  int keep = 2;                // checkpoints kept
  std::string log;             // one JSON line a step (rank 0); "" none
  // Testing the dead-rank paths: "kill" (SIGKILL) or "stall" (stop answering) on fault_rank at fault_step.
  std::string fault;
  int fault_rank = 1;
  std::int64_t fault_step = 0;
};

// What rank 0 is told as the run goes, for the command to print.
class TrainingRunListener {
 public:
  virtual ~TrainingRunListener() = default;
  // A step that completed, with the live checks that ran at it ({} when none).
  virtual void step_done(const StepResult& result, const nlohmann::json& checks) = 0;
  // A line to print: a failing step's message, a checkpoint written, the bundle of a timeout.
  virtual void line(const std::string& text) = 0;
  // Ranks as threads, and one stopped answering: the stuck thread can neither be stopped nor joined,
  // so the process must end here with `message` (the timeout's). Must not return.
  [[noreturn]] virtual void end_process(const std::string& message) = 0;
};

struct TrainingOutcome {
  bool passed = true;
  std::string failure;                             // rank 0's account: what failed, and the bundle or why there is none
  nlohmann::json steps = nlohmann::json::array();  // rank 0's steps, for a report
};

// What the ranks of one run share: the verdict (every rank sees the same reports, losses and
// parameters, so every rank stops at the same place; rank 0 says why), and the hand-over of a timeout
// among threads. One for the whole world, made before its ranks start.
struct TrainingShared {
  std::atomic<bool> passed{true};
  std::string failure;
  // A timeout among threads: 1 while rank 0 leaves its bundle, 2 when done; one thread reports it.
  std::atomic<int> timeout_bundle{0};
  std::atomic<bool> timeout_reported{false};
  nlohmann::json steps = nlohmann::json::array();

  TrainingOutcome outcome() const;
};

// What the checks above the trainer add to one rank's run. Every rank holds one.
class RunChecks {
 public:
  virtual ~RunChecks() = default;
  // Once, before the first step, the trainer loaded or restored.
  virtual void start(Trainer& trainer) = 0;
  // Before each step.
  virtual void before_step(Trainer& trainer) = 0;
  // The checks that ran inside the last step, for its log line and rank 0's row ({} when none).
  virtual const nlohmann::json& last() const = 0;
  // After each step, whether it completed or a check stopped it.
  virtual void after_step(Trainer& trainer, std::int64_t step, const CheckedStep& step_result) = 0;
  // Whether a failure leaves a repro bundle (rank 0 writes it; the others wait for it at a barrier).
  virtual bool bundles() const = 0;
  // Rank 0, on a failure: leaves the bundle, and says where it is and how to replay it, or why there is
  // none ("\nrepro bundle DIR; replay it with: ..." or "\nno repro bundle: ...").
  virtual std::string leave_bundle(Trainer& trainer, const StepFailure& failure) = 0;
  // Writes out what the checks buffer (the trace), as the run stops.
  virtual void flush() = 0;
};

// One rank's parts for the run, made by the caller on the rank's communicator.
struct RankRunParts {
  Communicator& comm;  // the one the trainer talks through
  Trainer& trainer;
  Engine& engine;
  RankZeroWriter& writer;  // --checkpoint-dir and --log
  // Whether the ranks are a launcher's processes (a stuck peer ends them all), else threads of this
  // process (a stuck one ends the process); and how long a collective waits.
  bool ranks_are_processes = false;
  std::chrono::milliseconds timeout = Communicator::default_timeout;
};

// Trains this rank from `params`, or from `resume` when given, to config.steps.
void run_rank(const TrainConfig& config, const TrainingRunOptions& options, RankRunParts parts, RunChecks& checks,
              TrainingRunListener& listener, TrainingShared& shared, const std::vector<float>& params,
              const std::optional<Checkpoint>& resume);

}  // namespace dpcheck
