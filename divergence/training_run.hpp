// A training run with its checks, as `dpcheck train` runs it: every rank steps the trainer, the replica
// check and the loss are judged after every step, the live checks (LiveCheckOptions) watch inside it,
// and rank 0 logs, traces and checkpoints through the RankZeroWriter. On the first failure every rank
// stops at the same step, and rank 0 leaves a repro bundle that `dpcheck replay` runs again.
//
// Each step is judged by checked_step (divergence.hpp), as replay_step and through it drift judge theirs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "divergence/divergence.hpp"
#include "src/target/target.hpp"

#include <nlohmann/json.hpp>

namespace dpcheck {

struct TrainingRunOptions {
  std::string checkpoint_dir;  // "" none; else rank 0 writes checkpoints there
  int checkpoint_every = 0;    // every K steps (0: only at the end)
  int keep = 2;                // checkpoints kept
  std::string log;             // one JSON line a step (rank 0); "" none
  std::string trace;           // a value-level trace (rank 0); "" none
  LiveCheckOptions checks;
  bool bundle = true;  // leave a repro bundle when a check fails
  std::string bundle_dir = ".";
  std::string x, y;                       // the data files, for the bundle; "" for synthetic data
  std::vector<std::string> command_line;  // for the bundle
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

// Trains `config` on `world` ranks of `target` over `data`, from `params`, or from `resume` when given,
// to config.steps. Every rank ends at the same step.
TrainingOutcome run_training(const Target& target, const TrainConfig& config, int world, const Dataset& data,
                             const std::vector<float>& params, const std::optional<Checkpoint>& resume,
                             const TrainingRunOptions& options, TrainingRunListener& listener);

}  // namespace dpcheck
