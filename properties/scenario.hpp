// Scenarios: the random training configurations the properties draw, and their generators. Every
// draw goes through RapidCheck, so a failing scenario shrinks towards fewer layers, narrower layers,
// smaller batches, fewer ranks and the first choice of every option.
#pragma once

#include <algorithm>
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
  // Drawn from the scale class (ScenarioSpace::scale_worlds): the case runs on simulated ranks
  // (properties/common.hpp, target_for_case), whatever threads the target's backend would start.
  bool simulated = false;
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
// What verify's options fix or widen of the cases that every property draws: verify --model (every
// training scenario's layer widths), --thorough (scenarios from a wider space: worlds of 1-16 ranks on
// thread backends, 1-5 layers, up to 12 steps), and the formats each case of a training property draws
// where neither --precision nor --allreduce-dtype was given (a failing case shrinks towards the first;
// empty: the target's own in every case). The property runner holds it beside the Target (RunOptions).
struct CaseDraw {
  std::vector<int> model_dims;
  bool thorough = false;
  std::vector<Precision> precisions;
  std::vector<DType> allreduce_dtypes;
};

struct ScenarioSpace {
  int world_size = 0;      // > 0: every scenario uses it (a process launcher fixed it)
  int min_world_size = 1;  // otherwise drawn in [min_world_size, max_world_size]
  int max_world_size = 8;
  int max_layers = 4;
  int max_width = 64;
  std::int64_t max_batch = 512;
  bool uneven_only = false;  // policy uneven with a batch that N does not divide (when N > 1)
  bool accumulate = false;   // 2 to 4 micro-batches per rank instead of 1
  int min_steps = 1;         // steps are drawn in [min_steps, max_steps]
  int max_steps = 7;         // with data sets up to 3 batches, two epochs or more
  int min_at_step = 0;       // at_step is drawn in [min_at_step, steps - 1]
  // Element counts at which the communicator under test changes its algorithm, for a world of the
  // given size (Communicator::algorithm_thresholds); the model's parameter count is drawn on both sides
  // of each, so that every run takes every path.
  std::function<std::vector<std::size_t>(int world_size)> thresholds;
  // Every scenario's loss scaler (none, or dynamic for fp16 targets: then with a growth interval of 2,
  // so that a few steps both back off and grow the scale).
  LossScalerConfig loss_scaling;
  DType allreduce_dtype = DType::f32;  // the gradient all-reduce's (--allreduce-dtype)
  std::vector<int> dims;               // non-empty: every scenario's layer widths (verify --model), none drawn
  // The scale class: in one case of `scale_one_in` (0: none) the world is one of these sizes, with a
  // model of at most two layers of at most 4 units, at most two steps, and a batch under 2N (so that
  // shares hold 0, 1 or 2 examples and some go empty). Such a case runs on simulated ranks.
  std::vector<int> scale_worlds;
  int scale_one_in = 0;
};

// The world sizes of the scale class: around the powers of two where schedules change shape (63, 64,
// 65; 255, 256), a world that is no power of two (1000), and the largest worlds users run (1024, 4096).
inline const std::vector<int>& scale_class_worlds() {
  static const std::vector<int> worlds{63, 64, 65, 255, 256, 1000, 1024, 4096};
  return worlds;
}

rc::Gen<Scenario> gen_scenario(const ScenarioSpace& space);

// RapidCheck scales a range with the case's size, so early cases draw near its start: right for widths
// and batches (small cases first), wrong for what every case should cover whatever its size (which step,
// how many steps, which side of a threshold). Those draw from the whole range, and still shrink.
template <class T> rc::Gen<T> uniform(rc::Gen<T> g) { return rc::gen::resize(100, std::move(g)); }

// An index in [0, n), uniform whatever the case's size, that shrinks by trying every smaller index,
// smallest first. RapidCheck's integers shrink by halving the distance to 0, which from the index of
// 1000 ranks tries those of 63, 255 and 256 but never 65: a bug that 65 shows and they do not would
// keep its 1000 ranks.
inline rc::Gen<std::size_t> index_below(std::size_t n) {
  return [n](const rc::Random& random, int) {
    rc::Random r = random;
    return rc::shrinkable::shrinkRecur(static_cast<std::size_t>(r.next() % std::max<std::size_t>(n, 1)),
                                       [](std::size_t i) { return rc::seq::range<std::size_t>(0, i); });
  };
}

// Sampler scenarios: data set sizes from 0, up to 64 ranks, several epochs.
struct SamplerScenario {
  SamplerConfig sampler;
  int epochs = 1;
  bool simulated = false;  // drawn from the scale class: played on simulated ranks
  std::string describe() const;
};

void showValue(const SamplerScenario& s, std::ostream& os);

// Data sets past this many examples are too large to count example by example: the sampler property
// asks for a few places of every share instead (check_sampler).
inline constexpr std::int64_t kCountableExamples = std::int64_t{1} << 24;

// With `scale_one_in` > 0 (and no fixed world), one case in that many draws its world from
// scale_class_worlds() and a data set of up to 3N examples, or in half of those cases an unshuffled one
// past 2^31 examples, where 32-bit indices wrap.
rc::Gen<SamplerScenario> gen_sampler_scenario(int fixed_world_size, int max_world_size = 64, int scale_one_in = 0);

}  // namespace dpcheck
