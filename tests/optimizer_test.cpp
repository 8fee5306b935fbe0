// Tests for src/train/optimizer (the float32 CPU optimizers) against PyTorch's formulas: closed forms worked
// by hand for the first steps, several steps against the float64 reference (reference/optimizer)
// within a rounding bound carried element by element beside it, single steps from drawn inputs against
// reference::optimizer_step_bound (which must also reject dampened momentum, a step count stuck at 1
// and eps inside the square root), the state's names and blocks, and a stored-and-reloaded optimizer
// that continues bit for bit like one that was never interrupted. With CUDA, the GPU optimizers
// (kernels/optimizer.cu) face the same reference with the same bound, and must repeat themselves bit
// for bit.
#include "src/train/optimizer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "reference/optimizer.hpp"
#include "src/error.hpp"
#include "src/rng.hpp"
#include "tests/test_support.hpp"

#if DPCHECK_HAVE_CUDA
#include "kernels/device.hpp"
#include "kernels/optimizer.hpp"
#include "tests/gpu_test_support.hpp"
#endif

namespace dpcheck {
namespace {

constexpr OptimizerKind kKinds[] = {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::adam};
constexpr double u = 0x1p-24;  // float32 unit roundoff

OptimizerConfig config_of(OptimizerKind kind, float lr) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = lr;
  return c;
}

// Values in [-1, 1) scaled by 2^-k, k cycling through 0..27, so that some gradients are far below
// Adam's eps (1e-8 is about 2^-26.6) and some are of order one. Fixed by (seed, stream).
std::vector<float> spread_values(std::size_t n, std::uint64_t seed, std::uint64_t stream) {
  const std::uint64_t key = mix_key(seed, 0x0971);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::ldexp(random_symmetric(key, stream, i), -static_cast<int>(i % 28));
  return v;
}

std::vector<float> unit_values(std::size_t n, std::uint64_t seed, std::uint64_t stream) {
  const std::uint64_t key = mix_key(seed, 0x0972);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = random_symmetric(key, stream, i);
  return v;
}

// ---- names and configuration ----------------------------------------------------------------------

TEST(OptimizerNames, RoundTripAndUnknownNames) {
  for (OptimizerKind k : kKinds) EXPECT_EQ(parse_optimizer(optimizer_name(k)), k);
  EXPECT_EQ(optimizer_name(OptimizerKind::sgd), "sgd");
  EXPECT_EQ(optimizer_name(OptimizerKind::momentum), "momentum");
  EXPECT_EQ(optimizer_name(OptimizerKind::adam), "adam");
  for (const char* bad : {"", "SGD", "adamw", "sgd "}) EXPECT_THROW(parse_optimizer(bad), UsageError) << bad;
  try {
    parse_optimizer("lamb");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("lamb"), std::string::npos) << e.what();
  }
}

TEST(OptimizerConfigCheck, RejectsNegativeNanOrInfiniteLearningRate) {
  for (OptimizerKind k : kKinds) {
    for (float lr : {-0.01f, -std::numeric_limits<float>::min(), std::numeric_limits<float>::quiet_NaN(),
                     std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
      EXPECT_THROW(make_cpu_optimizer(config_of(k, lr), 4), UsageError) << optimizer_name(k) << " lr " << lr;
    EXPECT_NO_THROW(make_cpu_optimizer(config_of(k, 0.0f), 4));
    EXPECT_NO_THROW(make_cpu_optimizer(config_of(k, 0.5f), 4));
  }
}

// torch.optim.SGD raises ValueError for momentum < 0 and torch.optim.Adam for betas outside [0, 1) or
// eps < 0 (NaN betas and eps fail those comparisons too). Accepting them would be worse than a crash:
// beta1 = 1 makes bias_correction1 zero, so every parameter becomes inf or NaN -- on every rank alike,
// which the replica check cannot see.
TEST(OptimizerConfigCheck, RejectsHyperparametersPytorchRejects) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  OptimizerConfig mom = config_of(OptimizerKind::momentum, 0.1f);
  mom.momentum = -0.5f;
  EXPECT_THROW(make_cpu_optimizer(mom, 4), UsageError) << "momentum -0.5";
  for (float beta : {1.0f, 1.5f, -0.1f, nan}) {
    OptimizerConfig a = config_of(OptimizerKind::adam, 0.1f);
    a.beta1 = beta;
    EXPECT_THROW(make_cpu_optimizer(a, 4), UsageError) << "beta1 " << beta;
    a = config_of(OptimizerKind::adam, 0.1f);
    a.beta2 = beta;
    EXPECT_THROW(make_cpu_optimizer(a, 4), UsageError) << "beta2 " << beta;
  }
  for (float eps : {-1e-8f, nan}) {
    OptimizerConfig a = config_of(OptimizerKind::adam, 0.1f);
    a.eps = eps;
    EXPECT_THROW(make_cpu_optimizer(a, 4), UsageError) << "eps " << eps;
  }
  // What PyTorch accepts stays accepted: momentum 0, beta 0, eps 0.
  OptimizerConfig edge = config_of(OptimizerKind::adam, 0.1f);
  edge.beta1 = 0.0f;
  edge.beta2 = 0.0f;
  edge.eps = 0.0f;
  EXPECT_NO_THROW(make_cpu_optimizer(edge, 4));
  mom.momentum = 0.0f;
  EXPECT_NO_THROW(make_cpu_optimizer(mom, 4));
}

// Every field is checked whichever optimizer is chosen (a bad --momentum is never carried along
// silently), and "finite" means finite in float32, where the optimizers compute: 1e39 would be inf.
TEST(OptimizerConfigCheck, ChecksEveryFieldAndFloat32Range) {
  const double inf = std::numeric_limits<double>::infinity();
  const struct {
    void (*set)(OptimizerConfig&, double);
    double value;
    const char* words;
  } cases[] = {
      {[](OptimizerConfig& c, double v) { c.lr = v; }, 1e39, "--lr"},
      {[](OptimizerConfig& c, double v) { c.lr = v; }, -inf, "--lr"},
      {[](OptimizerConfig& c, double v) { c.momentum = v; }, std::nan(""), "--momentum"},
      {[](OptimizerConfig& c, double v) { c.momentum = v; }, 1e300, "--momentum"},
      {[](OptimizerConfig& c, double v) { c.beta1 = v; }, inf, "beta1"},
      {[](OptimizerConfig& c, double v) { c.beta2 = v; }, 1.0, "beta2"},
      {[](OptimizerConfig& c, double v) { c.eps = v; }, 1e39, "eps"},
  };
  for (OptimizerKind k : kKinds) {
    for (const auto& c : cases) {
      OptimizerConfig config = config_of(k, 0.1f);
      c.set(config, c.value);
      try {
        config.validate();
        ADD_FAILURE() << optimizer_name(k) << " accepted " << c.words << " " << c.value;
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find(c.words), std::string::npos) << e.what();
      }
    }
  }
  OptimizerConfig largest = config_of(OptimizerKind::adam, 0.1f);
  largest.lr = std::numeric_limits<float>::max();
  largest.momentum = std::numeric_limits<float>::max();
  EXPECT_NO_THROW(largest.validate());
}

TEST(OptimizerState, NamesAndSizesPerKind) {
  const std::size_t n = 7;
  const auto sgd = make_cpu_optimizer(config_of(OptimizerKind::sgd, 0.1f), n);
  const auto mom = make_cpu_optimizer(config_of(OptimizerKind::momentum, 0.1f), n);
  const auto adam = make_cpu_optimizer(config_of(OptimizerKind::adam, 0.1f), n);
  EXPECT_EQ(sgd->state_names(), std::vector<std::string>{});
  EXPECT_EQ(mom->state_names(), std::vector<std::string>{"momentum_buffer"});
  EXPECT_EQ(adam->state_names(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(sgd->state_size(), 0u);
  EXPECT_EQ(mom->state_size(), n);
  EXPECT_EQ(adam->state_size(), 2 * n);
  for (const auto* o : {sgd.get(), mom.get(), adam.get()}) {
    EXPECT_EQ(o->size(), n);
    EXPECT_EQ(o->steps(), 0);
    EXPECT_EQ(o->memory_space(), MemorySpace::host);
  }
  // PyTorch starts every buffer at zero.
  std::vector<float> state(2 * n, -1.0f);
  adam->store_state(state);
  EXPECT_EQ(state, std::vector<float>(2 * n, 0.0f));
}

// ---- closed forms ---------------------------------------------------------------------------------

TEST(OptimizerClosedForm, SgdStepIsExactlyParamMinusLrTimesGrad) {
  // Powers of two and short mantissas: lr * g and p - lr * g are exact in float32.
  std::vector<float> p{1.0f, -2.0f, 0.5f, 3.0f, 0.0f};
  const std::vector<float> g{0.25f, 1.0f, -2.0f, 0.125f, -0.75f};
  const auto opt = make_cpu_optimizer(config_of(OptimizerKind::sgd, 0.5f), p.size());
  opt->step(p.data(), g.data());
  EXPECT_EQ(p, (std::vector<float>{0.875f, -2.5f, 1.5f, 2.9375f, 0.375f}));
  EXPECT_EQ(opt->steps(), 1);
  opt->step(p.data(), g.data());
  EXPECT_EQ(p, (std::vector<float>{0.75f, -3.0f, 2.5f, 2.875f, 0.75f}));
  EXPECT_EQ(opt->steps(), 2);
}

TEST(OptimizerClosedForm, MomentumFirstBufferIsTheGradientThenMuBufPlusGrad) {
  // PyTorch: buf = grad on the first step (not (1 - dampening) * grad or mu * 0 + grad, which agree
  // here only because dampening is 0), then buf = mu * buf + grad. mu = 0.5, lr = 0.25: all exact.
  OptimizerConfig c = config_of(OptimizerKind::momentum, 0.25f);
  c.momentum = 0.5f;
  std::vector<float> p{1.0f, -1.0f, 2.0f};
  const std::vector<float> g1{1.0f, 2.0f, -4.0f}, g2{0.5f, -1.0f, 1.0f};
  const auto opt = make_cpu_optimizer(c, p.size());
  std::vector<float> buf(3);

  opt->step(p.data(), g1.data());
  opt->store_state(buf);
  EXPECT_EQ(buf, g1);
  EXPECT_EQ(p, (std::vector<float>{0.75f, -1.5f, 3.0f}));

  opt->step(p.data(), g2.data());
  opt->store_state(buf);
  EXPECT_EQ(buf, (std::vector<float>{1.0f, 0.0f, -1.0f}));  // 0.5 * g1 + g2
  EXPECT_EQ(p, (std::vector<float>{0.5f, -1.5f, 3.25f}));
}

TEST(OptimizerClosedForm, AdamFirstStepMovesByLrTimesSignOfGrad) {
  // After one step m_hat = g and v_hat = g^2, so the update is lr * g / (|g| + eps): lr * sign(g)
  // for |g| >> eps, and lr * g / (2 eps) at |g| = eps. The float32 path takes about ten roundings
  // (state, sqrt, the bias corrections, division, the product), so 16 u relative covers it.
  const float lr = 0.01f;
  OptimizerConfig c = config_of(OptimizerKind::adam, lr);
  const std::vector<float> g{1.0f, -0.5f, 3e-3f, -7.0f, 1e-8f, -2e-8f, 0.0f};
  std::vector<float> p(g.size(), 0.0f);
  const auto opt = make_cpu_optimizer(c, p.size());
  opt->step(p.data(), g.data());
  const double eps = c.eps;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double gi = g[i];
    const double expected = -static_cast<double>(lr) * gi / (std::abs(gi) + eps);
    EXPECT_NEAR(p[i], expected, 16 * u * std::abs(expected)) << "g = " << gi;
  }
  EXPECT_NEAR(p[0], -lr, 16 * u * lr);
  EXPECT_NEAR(p[3], lr, 16 * u * lr);
  EXPECT_EQ(p[6], 0.0f);  // no gradient, no movement (0 / eps)

  // The state after one step: exp_avg = (1 - beta1) g, exp_avg_sq = (1 - beta2) g^2.
  std::vector<float> state(2 * g.size());
  opt->store_state(state);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double m = (1.0 - static_cast<double>(c.beta1)) * g[i];
    const double v = (1.0 - static_cast<double>(c.beta2)) * g[i] * g[i];
    EXPECT_NEAR(state[i], m, 2 * u * std::abs(m)) << i;
    EXPECT_NEAR(state[g.size() + i], v, 4 * u * v) << i;
  }
}

TEST(OptimizerClosedForm, ZeroLearningRateLeavesParamsButAdvancesState) {
  for (OptimizerKind k : kKinds) {
    SCOPED_TRACE(std::string(optimizer_name(k)));
    std::vector<float> p = unit_values(16, 1, 0);
    const std::vector<float> before = p, g = unit_values(16, 1, 1);
    const auto opt = make_cpu_optimizer(config_of(k, 0.0f), p.size());
    opt->step(p.data(), g.data());
    EXPECT_EQ(p, before);
    EXPECT_EQ(opt->steps(), 1);
  }
}

// ---- against the float64 reference ----------------------------------------------------------------

// First-order bound on |float32 - exact| for every parameter and state element, carried beside the
// float64 reference step by step. Each float32 operation x (op) y is exact times (1 + d), |d| <= u,
// and an error already in an operand passes through with the operation's own factor:
//   sgd       p' = p + (-lr g)              E_p += u (lr |g| + |p'|)
//   momentum  b' = b mu + g (b' = g first)  E_b  = mu E_b + u (mu |b| + |b'|)
//             p' = p + (-lr b')             E_p += lr E_b + u (lr |b'| + |p'|)
//   adam      m' = m + w1 (g - m)           E_m  = b1 E_m + u (2 w1 (|g| + |m|) + |m'|)
//             v' = v b2 + w2 g g            E_v  = b2 E_v + 3 u v'          (all terms >= 0)
//             d  = sqrt(v') / sqrt(bc2) + eps: relative error E_v / (2 v') + 4 u
//             p' = p - lr/bc1 (m' / d)      E_p += lr/bc1 (E_m + |m'| (rel_d + 3 u)) / d + u |p'|
// (the scalars bc1, bc2 and w = 1 - beta are the same in both paths: the betas are float32 and
// 1 - beta is exact in float32 for the defaults). The check allows twice the bound, which covers
// the second-order terms and the float64 reference's own rounding (2^-53 relative) many times over.
// A fused multiply-add (nvcc contracts p + (-lr) g and the like into one) only drops a rounding, so
// the same bound holds for the GPU kernels; their sqrt and division are IEEE (no fast math).
struct ErrorBound {
  std::vector<double> p, m, v;
};

void advance_bound(const OptimizerConfig& c, std::int64_t t, const std::vector<float>& g,
                   const std::vector<double>& p_new, const reference::OptimizerState<double>& before,
                   const reference::OptimizerState<double>& after, ErrorBound& e) {
  const double lr = c.lr;
  const std::size_t n = g.size();
  for (std::size_t i = 0; i < n; ++i) {
    const double gi = std::abs(static_cast<double>(g[i])), pi = std::abs(p_new[i]);
    switch (c.kind) {
      case OptimizerKind::sgd: e.p[i] += u * (lr * gi + pi); break;
      case OptimizerKind::momentum: {
        const double mu = c.momentum, b_new = std::abs(after.momentum_buffer[i]);
        e.m[i] = t == 1 ? 0.0 : mu * e.m[i] + u * (mu * std::abs(before.momentum_buffer[i]) + b_new);
        e.p[i] += lr * e.m[i] + u * (lr * b_new + pi);
        break;
      }
      case OptimizerKind::adam: {
        const double b1 = c.beta1, b2 = c.beta2, w1 = 1.0 - b1;
        const double m_old = t == 1 ? 0.0 : std::abs(before.exp_avg[i]);
        const double m_new = std::abs(after.exp_avg[i]), v_new = after.exp_avg_sq[i];
        e.m[i] = b1 * e.m[i] + u * (2 * w1 * (gi + m_old) + m_new);
        e.v[i] = b2 * e.v[i] + 3 * u * v_new;
        const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
        const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
        const double d = std::sqrt(v_new / bc2) + static_cast<double>(c.eps);
        const double rel_d = (v_new > 0 ? e.v[i] / (2 * v_new) : 0.0) + 4 * u;
        e.p[i] += lr / bc1 * (e.m[i] + m_new * (rel_d + 3 * u)) / d + u * pi;
        break;
      }
    }
  }
}

struct RunResult {
  std::vector<float> params, state;
  std::vector<double> ref_params, ref_state;
  ErrorBound bound;
};

// A float32 optimizer with its buffers wherever it keeps them: steps on host vectors, however it gets
// them there and back.
class Stepper {
 public:
  virtual ~Stepper() = default;
  virtual void step(std::vector<float>& params, const std::vector<float>& grads) = 0;
  virtual std::vector<float> state() const = 0;
};
using MakeStepper = std::function<std::unique_ptr<Stepper>(const OptimizerConfig&, std::size_t)>;

class CpuStepper final : public Stepper {
 public:
  CpuStepper(const OptimizerConfig& config, std::size_t n) : opt_(make_cpu_optimizer(config, n)) {}
  void step(std::vector<float>& params, const std::vector<float>& grads) override {
    opt_->step(params.data(), grads.data());
  }
  std::vector<float> state() const override {
    std::vector<float> s(opt_->state_size());
    opt_->store_state(s);
    return s;
  }

 private:
  std::unique_ptr<Optimizer> opt_;
};

std::unique_ptr<Stepper> cpu_stepper(const OptimizerConfig& config, std::size_t n) {
  return std::make_unique<CpuStepper>(config, n);
}

// `steps` steps of the float32 optimizer and of the float64 reference (run with `ref_config`) from
// the same float32 parameters and gradients.
RunResult run_against_reference(const OptimizerConfig& config, const OptimizerConfig& ref_config, std::size_t n,
                                int steps, const MakeStepper& make = cpu_stepper) {
  RunResult r;
  r.params = unit_values(n, 3, 100);
  r.ref_params.assign(r.params.begin(), r.params.end());
  r.bound = {std::vector<double>(n, 0.0), std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  const auto opt = make(config, n);
  reference::OptimizerState<double> state;
  for (int t = 1; t <= steps; ++t) {
    const std::vector<float> g = spread_values(n, 3, static_cast<std::uint64_t>(t));
    const std::vector<double> g64(g.begin(), g.end());
    opt->step(r.params, g);
    const reference::OptimizerState<double> before = state;
    reference::optimizer_step<double>(ref_config, r.ref_params, g64, state);
    advance_bound(config, t, g, r.ref_params, before, state, r.bound);
  }
  r.state = opt->state();
  r.ref_state.insert(r.ref_state.end(), state.momentum_buffer.begin(), state.momentum_buffer.end());
  r.ref_state.insert(r.ref_state.end(), state.exp_avg.begin(), state.exp_avg.end());
  r.ref_state.insert(r.ref_state.end(), state.exp_avg_sq.begin(), state.exp_avg_sq.end());
  return r;
}

// Largest |float32 - reference| / (2 * bound) over the parameters and the state.
double worst_ratio(const RunResult& r, OptimizerKind kind) {
  double worst = 0;
  const std::size_t n = r.params.size();
  const auto ratio = [](double err, double bound) {
    return err == 0 ? 0.0 : bound == 0 ? std::numeric_limits<double>::infinity() : err / (2 * bound);
  };
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, ratio(std::abs(r.params[i] - r.ref_params[i]), r.bound.p[i]));
    if (kind == OptimizerKind::momentum)
      worst = std::max(worst, ratio(std::abs(r.state[i] - r.ref_state[i]), r.bound.m[i]));
    if (kind == OptimizerKind::adam) {
      worst = std::max(worst, ratio(std::abs(r.state[i] - r.ref_state[i]), r.bound.m[i]));
      worst = std::max(worst, ratio(std::abs(r.state[n + i] - r.ref_state[n + i]), r.bound.v[i]));
    }
  }
  return worst;
}

TEST(OptimizerVsReference, SeveralStepsWithinDerivedRoundingBound) {
  const std::size_t n = 280;  // ten of each gradient scale 2^0 .. 2^-27
  const int steps = 6;
  for (OptimizerKind k : kKinds) {
    SCOPED_TRACE(std::string(optimizer_name(k)));
    OptimizerConfig c = config_of(k, k == OptimizerKind::adam ? 0.01f : 0.1f);
    const RunResult r = run_against_reference(c, c, n, steps);
    ASSERT_EQ(r.state.size(), r.ref_state.size());
    const double ratio = worst_ratio(r, k);
    EXPECT_LE(ratio, 1.0);
    // The error ratio goes into the XML report (--gtest_output=xml), as every check reports it.
    RecordProperty("error_ratio_" + std::string(optimizer_name(k)), std::to_string(ratio));
    // The parameters moved: the comparison is not between two copies of the starting point.
    std::size_t moved = 0;
    const std::vector<float> start = unit_values(n, 3, 100);
    for (std::size_t i = 0; i < n; ++i) moved += r.params[i] != start[i];
    EXPECT_GT(moved, n / 2);
  }
}

TEST(OptimizerVsReference, BoundCatchesLearningRateOffByOnePartInTenThousand) {
  // The same comparison against a reference run with lr (1 + 1e-4) must fail: the bound is tight
  // enough to see a wrong update, not just a wrong sign.
  for (OptimizerKind k : kKinds) {
    SCOPED_TRACE(std::string(optimizer_name(k)));
    const OptimizerConfig c = config_of(k, k == OptimizerKind::adam ? 0.01f : 0.1f);
    OptimizerConfig off = c;
    off.lr = static_cast<float>(static_cast<double>(c.lr) * (1 + 1e-4));
    EXPECT_GT(worst_ratio(run_against_reference(c, off, 280, 6), k), 1.0);
  }
}

TEST(OptimizerVsReference, MomentumAndBetasOtherThanDefaults) {
  OptimizerConfig mom = config_of(OptimizerKind::momentum, 0.03f);
  mom.momentum = 0.5f;
  EXPECT_LE(worst_ratio(run_against_reference(mom, mom, 140, 5), mom.kind), 1.0);
  OptimizerConfig adam = config_of(OptimizerKind::adam, 0.002f);
  adam.beta1 = 0.5f;  // 1 - beta exact in float32, as the bound assumes
  adam.beta2 = 0.75f;
  adam.eps = 1e-6f;
  EXPECT_LE(worst_ratio(run_against_reference(adam, adam, 140, 5), adam.kind), 1.0);
}

// ---- one step against reference::optimizer_step_bound ------------------------------------------------

// One optimizer step's inputs, drawn: the hyperparameters, the step count before it, and parameters,
// gradients and state over many binades. A third of Adam's elements get a second moment whose
// bias-corrected square root is within a factor 8 of eps, where eps and sqrt(v) weigh alike in the
// denominator.
struct StepInput {
  OptimizerConfig config;
  std::int64_t steps_before = 0;
  std::vector<float> params, grads, state;
};

float scaled(std::uint64_t key, std::uint64_t stream, std::size_t i, int lo, int hi) {
  const int k = lo + static_cast<int>(random_below(key, stream + 100, i, static_cast<std::uint64_t>(hi - lo + 1)));
  return std::ldexp(random_symmetric(key, stream, i), k);
}

// The state blocks for in.config.kind after in.steps_before steps: zero for a fresh optimizer.
void draw_state(StepInput& in, std::uint64_t key) {
  const OptimizerConfig& c = in.config;
  const std::size_t n = in.params.size();
  const std::size_t blocks = c.kind == OptimizerKind::sgd ? 0 : c.kind == OptimizerKind::momentum ? 1 : 2;
  in.state.assign(blocks * n, 0.0f);
  if (in.steps_before == 0) return;
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(in.steps_before + 1));
  for (std::size_t i = 0; i < n; ++i) {
    if (blocks >= 1) in.state[i] = scaled(key, 3, i, -30, 4);
    if (blocks == 2) {
      // sqrt(v / bc2): within a factor 8 of eps for every third element, anywhere in 2^-30 .. 2^4 otherwise.
      const double near_eps = std::ldexp(std::abs(random_symmetric(key, 4, i)) + 0.5, static_cast<int>(i % 7) - 3);
      const double root = i % 3 == 0 ? c.eps * near_eps : std::abs(scaled(key, 4, i, -30, 4));
      in.state[n + i] = static_cast<float>(root * root * bc2);
    }
  }
}

StepInput draw_step_input(std::uint64_t seed) {
  constexpr double kLr[] = {1e-5, 1e-3, 0.01, 0.1, 0.37, 1.0};
  constexpr double kMomentum[] = {0.0, 0.5, 0.9, 0.99, 0.123};
  constexpr double kBeta1[] = {0.9, 0.5, 0.0, 0.99, 0.8};
  constexpr double kBeta2[] = {0.999, 0.99, 0.5, 0.9999, 0.0};
  constexpr double kEps[] = {1e-8, 1e-6, 1e-3, 0.1};
  constexpr std::int64_t kSteps[] = {0, 1, 2, 3, 10, 100, 1000, 100000};
  const std::uint64_t key = mix_key(seed, 0x5743);
  const auto pick = [&](std::uint64_t what, std::size_t n) {
    return static_cast<std::size_t>(random_below(key, 0, what, n));
  };
  StepInput in;
  OptimizerConfig& c = in.config;
  c.kind = kKinds[pick(0, 3)];
  c.lr = kLr[pick(1, std::size(kLr))];
  c.momentum = kMomentum[pick(2, std::size(kMomentum))];
  c.beta1 = kBeta1[pick(3, std::size(kBeta1))];
  c.beta2 = kBeta2[pick(4, std::size(kBeta2))];
  c.eps = kEps[pick(5, std::size(kEps))];
  in.steps_before = kSteps[pick(6, std::size(kSteps))];
  for (std::size_t i = 0; i < 48; ++i) {
    in.params.push_back(scaled(key, 1, i, -8, 4));
    in.grads.push_back(scaled(key, 2, i, -30, 4));
  }
  draw_state(in, key);
  return in;
}

std::string describe(const StepInput& in) {
  const OptimizerConfig& c = in.config;
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s lr %g momentum %g betas %g %g eps %g, %lld steps before",
                std::string(optimizer_name(c.kind)).c_str(), c.lr, c.momentum, c.beta1, c.beta2, c.eps,
                static_cast<long long>(in.steps_before));
  return buf;
}

// The largest error ratio of a step's parameters and state against the bound.
double step_ratio(const reference::OptimizerStepBound& want, std::span<const double> params,
                  std::span<const double> state) {
  double worst = 0;
  for (std::size_t i = 0; i < params.size(); ++i)
    worst = std::max(worst, error_ratio(params[i], want.params[i], want.params_bound[i]));
  for (std::size_t i = 0; i < state.size(); ++i)
    worst = std::max(worst, error_ratio(state[i], want.state[i], want.state_bound[i]));
  return worst;
}

reference::OptimizerStepBound bound_of(const StepInput& in) {
  return reference::optimizer_step_bound(in.config, in.params, in.grads, in.state, in.steps_before);
}

// The parameter bound is met to within 0.2% where the new parameter lies just above a power of two: its
// last rounding is then half an ulp, u |p'|, all of the bound's own allowance for it. A ratio near 1 is
// that, and not a missing term.
TEST(OptimizerStepBound, HoldsForTheCpuOptimizerOverDrawnSteps) {
  constexpr int cases = 20000;
  double worst = 0;
  for (int k = 0; k < cases; ++k) {
    const StepInput in = draw_step_input(static_cast<std::uint64_t>(k));
    const auto opt = make_cpu_optimizer(in.config, in.params.size());
    opt->load_state(in.state, in.steps_before);
    std::vector<float> p = in.params;
    opt->step(p.data(), in.grads.data());
    std::vector<float> st(opt->state_size());
    opt->store_state(st);
    EXPECT_EQ(opt->steps(), in.steps_before + 1);
    const std::vector<double> p64(p.begin(), p.end()), st64(st.begin(), st.end());
    const double ratio = step_ratio(bound_of(in), p64, st64);
    EXPECT_LE(ratio, 1.0) << "case " << k << ": " << describe(in);
    worst = std::max(worst, ratio);
  }
  std::printf("largest error ratio over %d drawn steps: %.3g\n", cases, worst);
  RecordProperty("error_ratio", std::to_string(worst));
  EXPECT_GT(worst, 0.0);  // the float32 steps were not all exact
}

// Wrong formulas, evaluated in double from the same float32 inputs (what a float32 implementation of
// them approximates, far closer than the bound):
//   momentum with dampening       buf = mu buf + (1 - mu) g   (PyTorch's dampening = momentum)
//   Adam with its step count stuck at 1 (bias corrections 1 - beta, every step)
//   Adam with eps inside the square root, sqrt(v_hat + eps)
// and the right ones by the same hand, which must stay within the bound (so that what the wrong ones
// miss by is the mistake, not the hand). Each was caught in 1000 of the 1000 drawn steps when written.
struct StepByHand {
  std::vector<double> params, state;
};

StepByHand momentum_by_hand(const StepInput& in, bool dampened) {
  const double mu = in.config.momentum;
  const std::size_t n = in.params.size();
  StepByHand out;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = in.grads[i];
    const double b = in.steps_before == 0 ? g : mu * in.state[i] + (dampened ? 1.0 - mu : 1.0) * g;
    out.state.push_back(b);
    out.params.push_back(in.params[i] - in.config.lr * b);
  }
  return out;
}

StepByHand adam_by_hand(const StepInput& in, bool stuck_at_one, bool eps_inside) {
  const OptimizerConfig& c = in.config;
  const std::size_t n = in.params.size();
  const double t = stuck_at_one ? 1.0 : static_cast<double>(in.steps_before + 1);
  const double bc1 = 1.0 - std::pow(c.beta1, t), bc2 = 1.0 - std::pow(c.beta2, t);
  StepByHand out;
  out.state.resize(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const double g = in.grads[i];
    const double m = c.beta1 * in.state[i] + (1.0 - c.beta1) * g;
    const double v = c.beta2 * in.state[n + i] + (1.0 - c.beta2) * g * g;
    out.state[i] = m;
    out.state[n + i] = v;
    const double den = eps_inside ? std::sqrt(v / bc2 + c.eps) : std::sqrt(v / bc2) + c.eps;
    out.params.push_back(in.params[i] - c.lr / bc1 * m / den);
  }
  return out;
}

// The same draws where the mistakes change the formula: at least one step before (at the first step
// dampening and the bias corrections change nothing), momentum above 0 (where dampening is 1 - 0), and
// not both betas 0 (where both bias corrections are 1 at every step).
StepInput draw_mutant_input(std::uint64_t seed, OptimizerKind kind) {
  StepInput in = draw_step_input(seed);
  in.config.kind = kind;
  if (in.config.momentum == 0.0) in.config.momentum = 0.9;
  if (in.config.beta1 == 0.0 && in.config.beta2 == 0.0) in.config.beta1 = 0.9;
  if (in.steps_before == 0) in.steps_before = 1 + static_cast<std::int64_t>(seed % 5);
  draw_state(in, mix_key(seed, 0x5744));
  return in;
}

TEST(OptimizerStepBound, CatchesDampenedMomentumAStuckStepCountAndEpsInsideTheRoot) {
  constexpr int cases = 1000;
  int dampened = 0, stuck = 0, eps_inside = 0;
  for (int k = 0; k < cases; ++k) {
    const auto seed = static_cast<std::uint64_t>(50'000 + k);
    const StepInput mom = draw_mutant_input(seed, OptimizerKind::momentum);
    const auto mom_bound = bound_of(mom);
    const StepByHand right_mom = momentum_by_hand(mom, false);
    ASSERT_LE(step_ratio(mom_bound, right_mom.params, right_mom.state), 1.0) << describe(mom);
    const StepByHand damp = momentum_by_hand(mom, true);
    dampened += step_ratio(mom_bound, damp.params, damp.state) > 1.0;

    const StepInput adam = draw_mutant_input(seed, OptimizerKind::adam);
    const auto adam_bound = bound_of(adam);
    const StepByHand right_adam = adam_by_hand(adam, false, false);
    ASSERT_LE(step_ratio(adam_bound, right_adam.params, right_adam.state), 1.0) << describe(adam);
    const StepByHand stuck_step = adam_by_hand(adam, true, false);
    stuck += step_ratio(adam_bound, stuck_step.params, stuck_step.state) > 1.0;
    const StepByHand inside = adam_by_hand(adam, false, true);
    eps_inside += step_ratio(adam_bound, inside.params, inside.state) > 1.0;
  }
  std::printf(
      "of %d drawn steps, the bound catches dampened momentum in %d, Adam's step count stuck at 1 in %d, "
      "eps inside the square root in %d\n",
      cases, dampened, stuck, eps_inside);
  RecordProperty("dampened_caught", dampened);
  RecordProperty("stuck_step_caught", stuck);
  RecordProperty("eps_inside_caught", eps_inside);
  EXPECT_GE(dampened, cases * 99 / 100);
  EXPECT_GE(stuck, cases * 99 / 100);
  EXPECT_GE(eps_inside, cases * 99 / 100);
}

// ---- state round trip -----------------------------------------------------------------------------

TEST(OptimizerState, StoreLoadContinuesBitwiseLikeAnUninterruptedRun) {
  const std::size_t n = 64;
  for (OptimizerKind k : kKinds) {
    SCOPED_TRACE(std::string(optimizer_name(k)));
    const OptimizerConfig c = config_of(k, 0.05f);
    std::vector<std::vector<float>> grads;
    for (std::uint64_t t = 0; t < 3; ++t) grads.push_back(spread_values(n, 9, t));

    std::vector<float> straight = unit_values(n, 9, 50);
    const auto a = make_cpu_optimizer(c, n);
    for (const auto& g : grads) a->step(straight.data(), g.data());

    std::vector<float> resumed = unit_values(n, 9, 50);
    const auto first = make_cpu_optimizer(c, n);
    first->step(resumed.data(), grads[0].data());
    std::vector<float> saved(first->state_size());
    first->store_state(saved);
    const auto second = make_cpu_optimizer(c, n);
    second->load_state(saved, first->steps());
    EXPECT_EQ(second->steps(), 1);
    for (std::size_t t = 1; t < 3; ++t) second->step(resumed.data(), grads[t].data());

    EXPECT_EQ(resumed, straight);
    EXPECT_EQ(second->steps(), a->steps());
    std::vector<float> sa(a->state_size()), sb(second->state_size());
    a->store_state(sa);
    second->store_state(sb);
    EXPECT_EQ(sa, sb);
    if (k != OptimizerKind::sgd) {
      EXPECT_NE(sa, std::vector<float>(sa.size(), 0.0f));  // the state is not trivially equal
      // Loading the state without its step count is a different run (momentum would restart its
      // buffer, Adam's bias corrections would restart), which the round trip must not hide.
      std::vector<float> restarted = unit_values(n, 9, 50);
      const auto third = make_cpu_optimizer(c, n);
      third->step(restarted.data(), grads[0].data());
      const auto fourth = make_cpu_optimizer(c, n);
      fourth->load_state(saved, 0);
      for (std::size_t t = 1; t < 3; ++t) fourth->step(restarted.data(), grads[t].data());
      EXPECT_NE(restarted, straight);
    }
  }
}

TEST(OptimizerState, StateIsWhereTheStepReadsIt) {
  // state() is the live buffer: a perturbation there changes the next update (what the replica
  // check relies on when it hashes state() directly).
  const std::size_t n = 4;
  OptimizerConfig c = config_of(OptimizerKind::momentum, 0.5f);
  c.momentum = 0.5f;
  std::vector<float> p(n, 0.0f);
  const std::vector<float> g(n, 1.0f);
  const auto opt = make_cpu_optimizer(c, n);
  opt->step(p.data(), g.data());  // buf = 1, p = -0.5
  opt->state()[2] = 3.0f;
  opt->step(p.data(), g.data());  // buf = 0.5 buf + 1
  EXPECT_EQ(p, (std::vector<float>{-1.25f, -1.25f, -1.75f, -1.25f}));
}

#if DPCHECK_HAVE_CUDA

// ---- the GPU optimizers (kernels/optimizer.cu) ----------------------------------------------------

// The CUDA optimizer on device copies of the parameters and gradients, on its own stream.
class GpuStepper final : public Stepper {
 public:
  GpuStepper(const OptimizerConfig& config, std::size_t n)
      : n_(n), params_(n), grads_(n), opt_(cuda::make_optimizer(config, n, stream_.get())) {}
  void step(std::vector<float>& params, const std::vector<float>& grads) override {
    const cudaStream_t s = stream_.get();
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(params_.get(), params.data(), n_ * sizeof(float), cudaMemcpyHostToDevice, s));
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(grads_.get(), grads.data(), n_ * sizeof(float), cudaMemcpyHostToDevice, s));
    opt_->step(params_.get(), grads_.get());
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(params.data(), params_.get(), n_ * sizeof(float), cudaMemcpyDeviceToHost, s));
    stream_.synchronize();
  }
  std::vector<float> state() const override {
    std::vector<float> s(opt_->state_size());
    opt_->store_state(s);
    return s;
  }
  Optimizer& optimizer() { return *opt_; }

 private:
  std::size_t n_;
  cuda::Stream stream_;
  cuda::DeviceBuffer<float> params_, grads_;
  std::unique_ptr<Optimizer> opt_;
};

std::unique_ptr<Stepper> gpu_stepper(const OptimizerConfig& config, std::size_t n) {
  return std::make_unique<GpuStepper>(config, n);
}

TEST(OptimizerGpu, StateStartsAtZeroOnTheDevice) {
  DPCHECK_REQUIRE_GPU();
  for (OptimizerKind k : kKinds) {
    GpuStepper g(config_of(k, 0.1f), 7);
    EXPECT_EQ(g.optimizer().memory_space(), MemorySpace::device);
    EXPECT_EQ(g.optimizer().steps(), 0);
    EXPECT_EQ(g.state(), std::vector<float>(g.optimizer().state_size(), 0.0f)) << optimizer_name(k);
  }
}

TEST(OptimizerGpu, SeveralStepsWithinDerivedRoundingBound) {
  DPCHECK_REQUIRE_GPU();
  const std::size_t n = 280;
  for (OptimizerKind k : kKinds) {
    SCOPED_TRACE(std::string(optimizer_name(k)));
    const OptimizerConfig c = config_of(k, k == OptimizerKind::adam ? 0.01f : 0.1f);
    const RunResult r = run_against_reference(c, c, n, 6, gpu_stepper);
    ASSERT_EQ(r.state.size(), r.ref_state.size());
    const double ratio = worst_ratio(r, k);
    EXPECT_LE(ratio, 1.0);
    RecordProperty("error_ratio_" + std::string(optimizer_name(k)), std::to_string(ratio));
    std::size_t moved = 0;
    const std::vector<float> start = unit_values(n, 3, 100);
    for (std::size_t i = 0; i < n; ++i) moved += r.params[i] != start[i];
    EXPECT_GT(moved, n / 2);
  }
}

TEST(OptimizerGpu, BoundCatchesLearningRateOffByOnePartInTenThousand) {
  DPCHECK_REQUIRE_GPU();
  for (OptimizerKind k : kKinds) {
    SCOPED_TRACE(std::string(optimizer_name(k)));
    const OptimizerConfig c = config_of(k, k == OptimizerKind::adam ? 0.01f : 0.1f);
    OptimizerConfig off = c;
    off.lr = static_cast<float>(static_cast<double>(c.lr) * (1 + 1e-4));
    EXPECT_GT(worst_ratio(run_against_reference(c, off, 280, 6, gpu_stepper), k), 1.0);
  }
}

TEST(OptimizerGpu, MomentumAndBetasOtherThanDefaults) {
  DPCHECK_REQUIRE_GPU();
  OptimizerConfig mom = config_of(OptimizerKind::momentum, 0.03f);
  mom.momentum = 0.5f;
  EXPECT_LE(worst_ratio(run_against_reference(mom, mom, 140, 5, gpu_stepper), mom.kind), 1.0);
  OptimizerConfig adam = config_of(OptimizerKind::adam, 0.002f);
  adam.beta1 = 0.5f;
  adam.beta2 = 0.75f;
  adam.eps = 1e-6f;
  EXPECT_LE(worst_ratio(run_against_reference(adam, adam, 140, 5, gpu_stepper), adam.kind), 1.0);
}

// Replicas step their own copies of the optimizer: the same inputs must give the same bits, every time,
// and a stored and reloaded state must continue exactly like the uninterrupted run.
TEST(OptimizerGpu, RepeatsItselfBitForBitAndResumesFromItsState) {
  DPCHECK_REQUIRE_GPU();
  const std::size_t n = 1000;
  for (OptimizerKind k : kKinds) {
    SCOPED_TRACE(std::string(optimizer_name(k)));
    const OptimizerConfig c = config_of(k, 0.05f);
    std::vector<std::vector<float>> grads;
    for (std::uint64_t t = 0; t < 4; ++t) grads.push_back(spread_values(n, 12, t));
    std::vector<float> first = unit_values(n, 12, 50), second = first;
    GpuStepper a(c, n), b(c, n);
    for (const auto& g : grads) a.step(first, g);
    for (const auto& g : grads) b.step(second, g);
    EXPECT_EQ(std::memcmp(first.data(), second.data(), n * sizeof(float)), 0);
    EXPECT_EQ(a.state(), b.state());

    std::vector<float> resumed = unit_values(n, 12, 50);
    GpuStepper head(c, n), tail(c, n);
    head.step(resumed, grads[0]);
    tail.optimizer().load_state(head.state(), head.optimizer().steps());
    for (std::size_t t = 1; t < grads.size(); ++t) tail.step(resumed, grads[t]);
    EXPECT_EQ(std::memcmp(resumed.data(), first.data(), n * sizeof(float)), 0);
    EXPECT_EQ(tail.state(), a.state());
    EXPECT_EQ(tail.optimizer().steps(), a.optimizer().steps());
  }
}

#endif  // DPCHECK_HAVE_CUDA

}  // namespace
}  // namespace dpcheck
