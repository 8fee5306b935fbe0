#include "reference/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "src/error.hpp"

namespace dpcheck::reference {

template <class T> void optimizer_step(const OptimizerConfig& config, std::span<T> params, std::span<const T> grads,
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

OptimizerStepBound optimizer_step_bound(const OptimizerConfig& config, std::span<const float> params,
                                        std::span<const float> grads, std::span<const float> state,
                                        std::int64_t steps_before) {
  const std::size_t n = params.size();
  DPCHECK_ASSERT(grads.size() == n);
  constexpr double u = 0x1p-24;
  // Every value below is within a few ulp of a double computation from float32 inputs; the float64
  // evaluation itself is off by a few units of 2^-53, which the floor covers.
  const auto g = [](int k) { return k * u / (1 - k * u); };
  const auto floor = [](double magnitude) { return 16 * 0x1p-53 * magnitude + 0x1p-149 * 8; };
  OptimizerStepBound out;
  out.params.resize(n);
  out.params_bound.resize(n);
  const double lr = config.lr;
  switch (config.kind) {
    case OptimizerKind::sgd:
      DPCHECK_ASSERT(state.empty());
      for (std::size_t i = 0; i < n; ++i) {
        const double p = params[i], upd = lr * grads[i];
        out.params[i] = p - upd;
        out.params_bound[i] = g(3) * (std::abs(p) + std::abs(upd)) + floor(std::abs(p) + std::abs(upd));
      }
      return out;
    case OptimizerKind::momentum: {
      DPCHECK_ASSERT(state.size() == n);
      out.state.resize(n);
      out.state_bound.resize(n);
      const double mu = config.momentum;
      for (std::size_t i = 0; i < n; ++i) {
        const double gr = grads[i], b0 = state[i];
        const double b = steps_before == 0 ? gr : mu * b0 + gr;
        const double eb = steps_before == 0 ? 0.0 : g(3) * (mu * std::abs(b0) + std::abs(gr));
        out.state[i] = b;
        out.state_bound[i] = eb + floor(std::abs(b) + eb);
        const double p = params[i], upd = lr * b;
        out.params[i] = p - upd;
        out.params_bound[i] = std::abs(lr) * eb * (1 + g(2)) +
                              g(3) * (std::abs(p) + std::abs(upd) + std::abs(lr) * eb) +
                              floor(std::abs(p) + std::abs(upd));
      }
      return out;
    }
    case OptimizerKind::adam: {
      DPCHECK_ASSERT(state.size() == 2 * n);
      out.state.resize(2 * n);
      out.state_bound.resize(2 * n);
      const double b1 = config.beta1, b2 = config.beta2, eps = config.eps;
      const double t = static_cast<double>(steps_before + 1);
      const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      const double step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
      for (std::size_t i = 0; i < n; ++i) {
        const double gr = grads[i], m0 = state[i], v0 = state[n + i];
        const double m = b1 * m0 + (1 - b1) * gr;
        const double em = g(4) * (std::abs(m0) + (1 - b1) * (std::abs(gr) + std::abs(m0)));
        const double v = b2 * v0 + (1 - b2) * gr * gr;
        const double ev = g(5) * (b2 * std::abs(v0) + (1 - b2) * gr * gr);
        out.state[i] = m;
        out.state_bound[i] = em + floor(std::abs(m) + em);
        out.state[n + i] = v;
        out.state_bound[n + i] = ev + floor(std::abs(v) + ev);
        // sqrt of a value known to within ev: sqrt(v + e) - sqrt(v) <= min(sqrt(e), e / sqrt(v)).
        const double sv = std::sqrt(std::max(v, 0.0));
        const double esv = sv > 0 ? std::min(std::sqrt(ev), ev / sv) : std::sqrt(ev);
        const double den = sv / bc2_sqrt + eps;
        const double eden = (esv + g(2) * sv) / bc2_sqrt * (1 + g(2)) + g(2) * (sv / bc2_sqrt) + g(2) * eps + u * den;
        const double q = m / den;
        // m / den with both known to within their bounds (den - eden > 0 unless v and eps are both ~0).
        const double den_lo = den - eden;
        const double eq = den_lo > 0 ? (em + std::abs(m) * eden / den_lo) / den_lo + u * std::abs(q)
                                     : std::numeric_limits<double>::infinity();
        const double upd = step_size * q;
        const double eupd = std::abs(step_size) * eq * (1 + g(2)) + g(2) * std::abs(upd);
        const double p = params[i];
        out.params[i] = p - upd;
        out.params_bound[i] = eupd + u * (std::abs(p) + std::abs(upd) + eupd) + floor(std::abs(p) + std::abs(upd));
      }
      return out;
    }
  }
  return out;
}

template void optimizer_step<float>(const OptimizerConfig&, std::span<float>, std::span<const float>,
                                    OptimizerState<float>&);
template void optimizer_step<double>(const OptimizerConfig&, std::span<double>, std::span<const double>,
                                     OptimizerState<double>&);

}  // namespace dpcheck::reference
