// The checks that `dpcheck train` adds to a training run (src/train/training_run.hpp), on every rank:
// the live checks (LiveCheckOptions) inside each step, the value-level trace (--trace), and on the
// first failure the repro bundle that `dpcheck replay` runs again.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "divergence/divergence.hpp"
#include "divergence/trace.hpp"
#include "src/target/target.hpp"
#include "src/train/training_run.hpp"

#include <nlohmann/json.hpp>

namespace dpcheck {

struct TrainingCheckOptions {
  std::string trace;  // a value-level trace (rank 0); "" none
  LiveCheckOptions live;
  bool bundle = true;  // leave a repro bundle when a check fails
  std::string bundle_dir = ".";
  std::string x, y;                       // the data files, for the bundle; "" for synthetic data
  std::vector<std::string> command_line;  // for the bundle
};

// One rank's checks. Made on the rank's communicator of the target's world before its trainer: with a
// trace, the trainer talks through comm(), the recorder's wrapper, which sees its data collectives.
class TrainingChecks final : public RunChecks {
 public:
  TrainingChecks(const Target& target, const TrainConfig& config, int world, const TrainingCheckOptions& options,
                 Communicator& world_comm);

  Communicator& comm() { return comm_; }

  void start(Trainer& trainer) override;
  void before_step(Trainer& trainer) override;
  const nlohmann::json& last() const override { return live_.last(); }
  void after_step(Trainer& trainer, std::int64_t step, const CheckedStep& c) override;
  bool bundles() const override { return o_.bundle; }
  std::string leave_bundle(Trainer& trainer, const StepFailure& failure) override;
  void flush() override;

 private:
  const Target& target_;
  const TrainConfig& t_;
  int world_;
  const TrainingCheckOptions& o_;
  std::vector<std::string> state_names_;
  TraceRecorder recorder_;
  std::optional<TracingCommunicator> traced_;
  Communicator& comm_;
  LiveChecks live_;
  StepObservers observers_;
  std::unique_ptr<RankZeroWriter> trace_writer_;
  // Rank 0 of a run that leaves a bundle keeps the state before each step, and the one the run began
  // from, for the bundle that a failing step leaves.
  const bool keeps_states_;
  Checkpoint before_, start_;
};

}  // namespace dpcheck
