// Reference optimizer steps with PyTorch's formulas (torch.optim.SGD, SGD with momentum, Adam; no
// weight decay), one element at a time in T. The float32 optimizers in src/optimizer.cpp and kernels/
// are checked against the float64 instantiation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "src/optimizer.hpp"

namespace dpcheck::reference {

template <class T>
struct OptimizerState {
  std::vector<T> momentum_buffer;  // momentum
  std::vector<T> exp_avg, exp_avg_sq;  // adam
  std::int64_t steps = 0;
};

// One step: params -= update(grads), state updated; step t = state.steps + 1.
template <class T>
void optimizer_step(const OptimizerConfig& config, std::span<T> params, std::span<const T> grads,
                    OptimizerState<T>& state);

extern template void optimizer_step<float>(const OptimizerConfig&, std::span<float>, std::span<const float>,
                                           OptimizerState<float>&);
extern template void optimizer_step<double>(const OptimizerConfig&, std::span<double>, std::span<const double>,
                                            OptimizerState<double>&);

}  // namespace dpcheck::reference
