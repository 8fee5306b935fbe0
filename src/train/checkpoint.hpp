// Checkpoint: one rank's training state at a step boundary, as the trainer takes it (Trainer::checkpoint)
// and restores it, and as the writer (src/train/writer.hpp) saves and reads it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/train/loss_scaler.hpp"

namespace dpcheck {

struct Checkpoint {
  std::int64_t step = 0;           // steps completed: training resumes at this step
  std::int64_t epoch = 0;          // the sampler's epoch at `step`
  std::int64_t step_in_epoch = 0;  // and the step's position within it
  std::vector<float> params;
  std::vector<std::string> state_names;  // optimizer state blocks, each params.size() long
  std::vector<float> optimizer_state;
  std::int64_t optimizer_steps = 0;            // the step count less the steps a loss scaler skipped
  nlohmann::json config;                       // the run's configuration (TrainConfig and world size)
  std::optional<LossScalerState> loss_scaler;  // a run that scales its loss: the scaler's state
};

}  // namespace dpcheck
