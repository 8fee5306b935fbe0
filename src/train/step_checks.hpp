// The trainer's own checks after a step, and what a failed check found: the replicas that differ, a
// loss that is not finite, parameters or optimizer state that are not finite, or (thrown from inside
// the step by a check that watches it, divergence/divergence.hpp's live checks) anything else. train,
// replay and drift judge a step by checked_step; a failure is a StepFailure, which the log, the trace
// and a repro bundle record.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "src/error.hpp"
#include "src/train/model.hpp"
#include "src/train/replica_check.hpp"
#include "src/train/trainer.hpp"

namespace dpcheck {

// What a failed check found, and where.
struct StepFailure {
  std::string kind;  // "non-finite" | "gradient-bound" | "replicas" | "loss" | "timeout"
  std::int64_t step = 0;
  int rank = -1;        // the rank it names; -1: every rank (a bound, a loss) or none
  std::string element;  // "layers.0.weight[3, 1]", "loss", or "" (a timeout)
  std::string message;  // the full text

  // {"kind", "step", "rank", "element", "message"} (read back by divergence.hpp's step_failure_from_json).
  nlohmann::json to_json() const;
  std::string where() const;  // "step 3, rank 1, layers.0.weight[3, 1]"
};

// The failures the trainer's own checks find after a step, as train and replay both report them.
StepFailure replica_failure(const ReplicaReport& replicas);
StepFailure loss_failure(std::int64_t step, double loss);
// A parameter or optimizer state element that is not finite after the step (the first one; state is
// params.size() per block, may be empty); kind "non-finite", every rank. `suffix` ends the message.
StepFailure non_finite_state_failure(std::int64_t step, std::span<const float> params, std::span<const float> state,
                                     const ParamLayout& layout, const std::string& suffix);
// Whether any of them is not finite.
bool has_non_finite(std::span<const float> values);

// Thrown on every rank at once by a check inside the step that failed.
class StepCheckFailed : public Error {
 public:
  explicit StepCheckFailed(StepFailure f) : Error(f.message), failure(std::move(f)) {}
  StepFailure failure;
};

// One step and the trainer's own checks after it. `completed` is false when a check inside the step
// stopped it (StepCheckFailed, on every rank at once); otherwise `result` holds the step, and `failure`
// the replicas that differ or a loss that is not finite (unless the loss scaler passed the step over,
// which leaves the parameters as they were). A timeout propagates as TimeoutError.
struct CheckedStep {
  bool completed = false;
  StepResult result;
  std::optional<StepFailure> failure;
};
CheckedStep checked_step(Trainer& trainer);

}  // namespace dpcheck
