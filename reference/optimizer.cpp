#include "reference/optimizer.hpp"

#include <cmath>

#include "src/error.hpp"

namespace dpcheck::reference {

template <class T>
void optimizer_step(const OptimizerConfig& config, std::span<T> params, std::span<const T> grads,
                    OptimizerState<T>& state) {
  DPCHECK_ASSERT(params.size() == grads.size());
  const std::size_t n = params.size();
  const T lr = static_cast<T>(config.lr);
  state.steps += 1;
  switch (config.kind) {
    case OptimizerKind::sgd:
      for (std::size_t i = 0; i < n; ++i) params[i] -= lr * grads[i];
      return;
    case OptimizerKind::momentum: {
      const T mu = static_cast<T>(config.momentum);
      if (state.steps == 1) state.momentum_buffer.assign(grads.begin(), grads.end());
      else
        for (std::size_t i = 0; i < n; ++i) state.momentum_buffer[i] = mu * state.momentum_buffer[i] + grads[i];
      for (std::size_t i = 0; i < n; ++i) params[i] -= lr * state.momentum_buffer[i];
      return;
    }
    case OptimizerKind::adam: {
      const T b1 = static_cast<T>(config.beta1), b2 = static_cast<T>(config.beta2), eps = static_cast<T>(config.eps);
      if (state.steps == 1) {
        state.exp_avg.assign(n, T(0));
        state.exp_avg_sq.assign(n, T(0));
      }
      const T t = static_cast<T>(state.steps);
      const T bias_correction1 = 1 - std::pow(b1, t);
      const T bias_correction2 = 1 - std::pow(b2, t);
      for (std::size_t i = 0; i < n; ++i) {
        T& m = state.exp_avg[i];
        T& v = state.exp_avg_sq[i];
        m = b1 * m + (1 - b1) * grads[i];
        v = b2 * v + (1 - b2) * grads[i] * grads[i];
        const T m_hat = m / bias_correction1;
        const T v_hat = v / bias_correction2;
        // PyTorch adds eps to sqrt(v) / sqrt(bias_correction2), i.e. to sqrt(v_hat).
        params[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
      }
      return;
    }
  }
}

template void optimizer_step<float>(const OptimizerConfig&, std::span<float>, std::span<const float>, OptimizerState<float>&);
template void optimizer_step<double>(const OptimizerConfig&, std::span<double>, std::span<const double>,
                                     OptimizerState<double>&);

}  // namespace dpcheck::reference
