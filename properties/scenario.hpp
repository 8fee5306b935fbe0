// Scenarios: the random training configurations the properties draw, and their generators. Every
// draw goes through RapidCheck, so a failing scenario shrinks towards fewer layers, narrower layers,
// smaller batches, fewer ranks and the first choice of every option.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <rapidcheck.h>

#include "src/train/trainer.hpp"

namespace dpcheck {

struct Scenario {
  TrainConfig train;  // model, batch, data set size, steps, accumulate, optimizer, shuffle, split, policy, seed
  int world_size = 1;
  // The step a check looks at, anywhere in an epoch: the gradient or the loss of that step (after
  // training the steps before it), or the step count at which training is checkpointed and resumed.
  int at_step = 0;

  // "model 4,16,1 relu mse | batch 12 of 30 | world 3 strided uneven shuffled | adam lr 0.01 | 2 steps
  // ..., at step 1 | seed 5"
  std::string describe() const;
  // The dpcheck train flags that run this scenario.
  std::string train_flags() const;
};

void showValue(const Scenario& s, std::ostream& os);  // how RapidCheck prints a counterexample

// What a generator may draw.
struct ScenarioSpace {
  int world_size = 0;         // > 0: every scenario uses it (a process launcher fixed it)
  int min_world_size = 1;     // otherwise drawn in [min_world_size, max_world_size]
  int max_world_size = 8;
  int max_layers = 4;
  int max_width = 64;
  std::int64_t max_batch = 512;
  bool uneven_only = false;   // policy uneven with a batch that N does not divide (when N > 1)
  bool accumulate = false;    // 2 to 4 micro-batches per rank instead of 1
  int min_steps = 1;          // steps are drawn in [min_steps, max_steps]
  int max_steps = 7;          // with data sets up to 3 batches, two epochs or more
  int min_at_step = 0;        // at_step is drawn in [min_at_step, steps - 1]
  // Element counts at which the communicator under test changes its algorithm, for a world of the
  // given size (Communicator::algorithm_thresholds); the model's parameter count is drawn on both sides
  // of each, so that every run takes every path.
  std::function<std::vector<std::size_t>(int world_size)> thresholds;
  // Every scenario's loss scaler (none, or dynamic for fp16 targets: then with a growth interval of 2,
  // so that a few steps both back off and grow the scale).
  LossScalerConfig loss_scaling;
  DType allreduce_dtype = DType::f32;  // the gradient all-reduce's (--allreduce-dtype)
  std::vector<int> dims;  // non-empty: every scenario's layer widths (verify --model), none drawn
};


rc::Gen<Scenario> gen_scenario(const ScenarioSpace& space);

// RapidCheck scales a range with the case's size, so early cases draw near its start: right for widths
// and batches (small cases first), wrong for what every case should cover whatever its size (which step,
// how many steps, which side of a threshold). Those draw from the whole range, and still shrink.
template <class T>
rc::Gen<T> uniform(rc::Gen<T> g) {
  return rc::gen::resize(100, std::move(g));
}

// Sampler scenarios: data set sizes from 0, up to 64 ranks, several epochs.
struct SamplerScenario {
  SamplerConfig sampler;
  int epochs = 1;
  std::string describe() const;
};

void showValue(const SamplerScenario& s, std::ostream& os);

rc::Gen<SamplerScenario> gen_sampler_scenario(int fixed_world_size, int max_world_size = 64);

}  // namespace dpcheck
