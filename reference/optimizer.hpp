// Reference optimizer steps with PyTorch's formulas (torch.optim.SGD, SGD with momentum, Adam; no
// weight decay), one element at a time in T. The float32 optimizers in src/train/optimizer.cpp and kernels/
// are checked against the float64 instantiation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "src/train/optimizer.hpp"

namespace dpcheck::reference {

template <class T> struct OptimizerState {
  std::vector<T> momentum_buffer;      // momentum
  std::vector<T> exp_avg, exp_avg_sq;  // adam
  std::int64_t steps = 0;
};

// One step: params -= update(grads), state updated; step t = state.steps + 1.
template <class T> void optimizer_step(const OptimizerConfig& config, std::span<T> params, std::span<const T> grads,
                                       OptimizerState<T>& state);

// One float32 optimizer step checked from the outside: the float64 formula applied to the float32
// inputs (parameters, gradient, state before the step), and for every output a bound on how far a
// correct float32 evaluation can land from it. Each operation of PyTorch's formula rounds once, in
// its order or an algebraic rearrangement of it (b1 m + (1 - b1) g, or m + (1 - b1)(g - m)), and
// scalars derived in double (lr / bias_correction1, sqrt(bias_correction2)) round once to float32.
// The bound is first order in u with generous operation counts; a wrong formula (a missing bias
// correction, eps inside the square root, dampened momentum) misses by far more.
struct OptimizerStepBound {
  std::vector<double> params, params_bound;  // expected parameters after the step, and the bound
  std::vector<double> state, state_bound;    // expected state blocks (Optimizer::state_names order)
};
OptimizerStepBound optimizer_step_bound(const OptimizerConfig& config, std::span<const float> params,
                                        std::span<const float> grads, std::span<const float> state,
                                        std::int64_t steps_before);

extern template void optimizer_step<float>(const OptimizerConfig&, std::span<float>, std::span<const float>,
                                           OptimizerState<float>&);
extern template void optimizer_step<double>(const OptimizerConfig&, std::span<double>, std::span<const double>,
                                            OptimizerState<double>&);

}  // namespace dpcheck::reference
