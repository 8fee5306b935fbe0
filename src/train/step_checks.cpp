#include "src/train/step_checks.hpp"

#include <algorithm>
#include <cmath>

namespace dpcheck {

nlohmann::json StepFailure::to_json() const {
  return {{"kind", kind}, {"step", step}, {"rank", rank}, {"element", element}, {"message", message}};
}

std::string StepFailure::where() const {
  std::string s = "step " + std::to_string(step);
  if (rank >= 0) s += ", rank " + std::to_string(rank);
  if (!element.empty()) s += ", " + element;
  return s;
}

CheckedStep checked_step(Trainer& trainer) {
  CheckedStep c;
  try {
    c.result = trainer.step();
  } catch (const StepCheckFailed& e) {
    c.failure = e.failure;
    return c;
  }
  c.completed = true;
  // The loss is all-reduced, so every rank holds the same one. A NaN or an infinity spreads to every
  // parameter, identically on every rank, where the replica check cannot see it -- unless the loss
  // scaler passed the step over, which leaves the parameters as they were.
  if (!c.result.replicas.synchronized) c.failure = replica_failure(c.result.replicas);
  else if (!std::isfinite(c.result.loss) && !c.result.skipped) c.failure = loss_failure(c.result.step, c.result.loss);
  return c;
}

StepFailure replica_failure(const ReplicaReport& replicas) {
  StepFailure f;
  f.kind = "replicas";
  f.step = replicas.step;
  f.rank = replicas.minority.empty() ? -1 : replicas.minority.front();
  f.element = replicas.buffer + " " + replicas.element;
  const std::string text = replicas.describe();
  f.message = "replicas diverged: " + text.substr(0, text.find('\n'));
  return f;
}

StepFailure loss_failure(std::int64_t step, double loss) {
  StepFailure f;
  f.kind = "loss";
  f.step = step;
  f.element = "loss";
  f.message = "the loss at step " + std::to_string(step) + " is " + float_text(loss) +
              ", not finite (the run diverged, or --lr is too large); stopped, and nothing after it is checkpointed";
  return f;
}

bool has_non_finite(std::span<const float> values) {
  return std::any_of(values.begin(), values.end(), [](float v) { return !std::isfinite(v); });
}

StepFailure non_finite_state_failure(std::int64_t step, std::span<const float> params, std::span<const float> state,
                                     const ParamLayout& layout, const std::string& suffix) {
  StepFailure f;
  f.kind = "non-finite";
  f.step = step;
  const auto find = [](std::span<const float> v) {
    return static_cast<std::size_t>(std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); }) -
                                    v.begin());
  };
  float value = 0;
  if (const std::size_t i = find(params); i < params.size()) {
    f.element = "parameter " + layout.describe_element(i);
    value = params[i];
  } else if (const std::size_t j = find(state); j < state.size()) {
    f.element = "optimizer state of " + layout.describe_element(j % layout.size());
    value = state[j];
  }
  f.message =
      "after step " + std::to_string(step) + " " + f.element + " is " + float_text(value) + ", not finite" + suffix;
  return f;
}

}  // namespace dpcheck
