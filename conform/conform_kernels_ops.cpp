// Running one case of each op: host buffers poisoned around and inside, the plugin's kernel called on
// them, and its outputs held to the float64 reference within the derived bound; then the table of op
// checks. Split from conform_kernels.cpp, which draws the cases and reports the rows.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "conform/conform_kernels_internal.hpp"
#include "reference/kernel_bound.hpp"
#include "reference/optimizer.hpp"
#include "src/plugin/kernel_plugin.hpp"
#include "src/rng.hpp"

namespace dpcheck {
namespace conform_kernels_detail {

// ---- buffers ---------------------------------------------------------------------------------------

namespace {

// A NaN whose payload no arithmetic produces: an output element that still holds it was never written.
constexpr std::uint32_t kPoisonBits = 0x7fc0dead;
float poison() {
  float f;
  std::memcpy(&f, &kPoisonBits, sizeof f);
  return f;
}
constexpr std::int64_t kTailGuard = 8;  // elements after a buffer that must stay untouched

// Values in [-1, 1) times 2^e, e in [-4, 4]: several binades, far from underflow; `spread` scales them.
std::vector<float> draw_values(std::int64_t n, std::uint64_t seed, std::uint64_t stream, float spread = 1) {
  const std::uint64_t key = mix_key(seed, 0xc0f0);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = spread *
           std::ldexp(random_symmetric(key, stream, i), static_cast<int>(random_u64(key, stream + 1000, i) % 9) - 4);
  return v;
}

}  // namespace

// A buffer of n floats `offset` floats into an allocation of its own, guard elements around it poisoned.
class Buffer {
 public:
  Buffer(std::int64_t n, std::int64_t offset)
      : n_(n), offset_(offset), storage_(static_cast<std::size_t>(offset + n + kTailGuard), poison()) {}
  float* data() { return storage_.data() + offset_; }
  const float* data() const { return storage_.data() + offset_; }
  std::span<const float> span() const { return {data(), static_cast<std::size_t>(n_)}; }
  std::int64_t size() const { return n_; }
  void fill(std::span<const float> values) { std::copy(values.begin(), values.end(), data()); }
  // The first element outside the buffer that is no longer the poison (negative: before its start);
  // kNone when none is.
  static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min();
  std::int64_t written_outside() const {
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(storage_.size()); ++i) {
      if (i >= offset_ && i < offset_ + n_) continue;
      if (std::memcmp(&storage_[static_cast<std::size_t>(i)], &kPoisonBits, sizeof(float)) != 0) return i - offset_;
    }
    return kNone;
  }

 private:
  std::int64_t n_, offset_;
  std::vector<float> storage_;
};

// ---- running one case --------------------------------------------------------------------------------

void Run::keep_bits(const void* p, std::size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  bits.insert(bits.end(), b, b + bytes);
}

void Run::compare(std::string_view name, const Buffer& got, const Expected& want, std::int64_t cols) {
  keep_bits(got.data(), static_cast<std::size_t>(got.size()) * sizeof(float));
  const auto element = [&](std::int64_t i) {
    return std::string(name) + (cols > 0 ? "[" + std::to_string(i / cols) + "," + std::to_string(i % cols) + "]"
                                         : "[" + std::to_string(i) + "]");
  };
  if (const std::int64_t outside = got.written_outside(); outside != Buffer::kNone && why.empty())
    why = "wrote " + std::string(name) + "[" + std::to_string(outside) + "] (flat), outside its " +
          std::to_string(got.size()) + " elements";
  std::int64_t worst = -1;
  double worst_ratio = 0;
  for (std::int64_t i = 0; i < got.size(); ++i) {
    const float g = got.data()[i];
    const auto ii = static_cast<std::size_t>(i);
    if (std::memcmp(&g, &kPoisonBits, sizeof g) == 0) {
      if (why.empty()) why = element(i) + " was never written (it still holds the NaN put there before the call)";
      ratio = std::numeric_limits<double>::infinity();
      return;
    }
    const double q = error_ratio(g, want.value[ii], want.bound[ii]);
    if (worst < 0 || q > worst_ratio) {
      worst = i;
      worst_ratio = q;
    }
  }
  ratio = std::max(ratio, worst_ratio);
  if (worst >= 0 && worst_ratio > 1 && why.empty()) {
    const auto w = static_cast<std::size_t>(worst);
    why = element(worst) + " = " + real_text(got.data()[worst]) + ", expected " + real_text(want.value[w]) +
          " within " + real_text(want.bound[w]) + " (error ratio " + real_text(worst_ratio) + ")";
  }
}

void Run::compare_loss(double got, double want, double bound) {
  keep_bits(&got, sizeof got);
  const double q = error_ratio(got, want, bound);
  ratio = std::max(ratio, q);
  if (q > 1 && why.empty())
    why = "the mean loss = " + real_text(got) + ", expected " + real_text(want) + " within " + real_text(bound) +
          " (error ratio " + real_text(q) + ")";
}

double Run::error_ratio(double got, double want, double bound) {
  if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
  const double err = std::abs(got - want);
  if (err == 0) return 0;
  return bound > 0 ? err / bound : std::numeric_limits<double>::infinity();
}

namespace {

// The key of a case's values: its seed, mixed with nothing else, so that its text alone replays it.
Run run_linear_forward(const Kernels& k, const Case& c, const reference::BoundOptions& bo) {
  const auto xv = draw_values(c.rows * c.in, c.seed, 1), wv = draw_values(c.out * c.in, c.seed, 2);
  const auto bv = draw_values(c.out, c.seed, 3);
  Buffer x(c.rows * c.in, c.offset), w(c.out * c.in, c.offset), b(c.out, c.offset), y(c.rows * c.out, c.offset);
  x.fill(xv);
  w.fill(wv);
  b.fill(bv);
  k.linear_forward(x.data(), w.data(), b.data(), y.data(), c.rows, c.in, c.out);
  Run r;
  r.compare("y", y, reference::linear_forward_expected(xv, wv, bv, c.rows, c.in, c.out, bo), c.out);
  return r;
}

Run run_linear_backward(const Kernels& k, const Case& c, const reference::BoundOptions& bo) {
  const auto xv = draw_values(c.rows * c.in, c.seed, 1), wv = draw_values(c.out * c.in, c.seed, 2);
  const auto dyv = draw_values(c.rows * c.out, c.seed, 3);
  const auto old_dw = draw_values(c.out * c.in, c.seed, 4), old_db = draw_values(c.out, c.seed, 5);
  Buffer x(c.rows * c.in, c.offset), w(c.out * c.in, c.offset), dy(c.rows * c.out, c.offset);
  Buffer dx(c.rows * c.in, c.offset), dw(c.out * c.in, c.offset), db(c.out, c.offset);
  x.fill(xv);
  w.fill(wv);
  dy.fill(dyv);
  if (c.accumulate) {
    dw.fill(old_dw);
    db.fill(old_db);
  }
  k.linear_backward(x.data(), w.data(), dy.data(), c.dx ? dx.data() : nullptr, dw.data(), db.data(), c.rows, c.in,
                    c.out, c.accumulate != 0);
  const reference::LinearBackwardExpected want = reference::linear_backward_expected(
      xv, wv, dyv, c.accumulate ? std::span<const float>(old_dw) : std::span<const float>(),
      c.accumulate ? std::span<const float>(old_db) : std::span<const float>(), c.rows, c.in, c.out, bo);
  Run r;
  r.compare("dw", dw, want.dw, c.in);
  r.compare("db", db, want.db, 0);
  if (c.dx) r.compare("dx", dx, want.dx, c.in);
  // With dx NULL, the kernel has nowhere to write it: the buffer must still be all poison.
  else if (std::any_of(dx.span().begin(), dx.span().end(), [](float v) { return !std::isnan(v); }) && r.why.empty())
    r.why = "dx was written through a buffer dpcheck did not pass (dx is NULL)";
  return r;
}

Run run_activation_forward(const Kernels& k, const Case& c, const reference::BoundOptions& bo) {
  const auto xv = draw_values(c.n, c.seed, 1, c.act == Activation::tanh ? 2.0f : 1.0f);
  Buffer x(c.n, c.offset), y(c.n, c.offset);
  x.fill(xv);
  k.activation_forward(c.act, x.data(), y.data(), c.n);
  Run r;
  r.compare("y", y, reference::activation_forward_expected(c.act, xv, bo), 0);
  return r;
}

Run run_activation_backward(const Kernels& k, const Case& c, const reference::BoundOptions& bo) {
  std::vector<float> xv = draw_values(c.n, c.seed, 1, c.act == Activation::tanh ? 2.0f : 1.0f);
  // Zeros too: relu' is 0 there.
  for (std::size_t i = 3; i < xv.size(); i += 7) xv[i] = 0.0f;
  std::vector<float> yv(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i)
    yv[i] = c.act == Activation::relu ? std::max(xv[i], 0.0f) : std::tanh(xv[i]);
  const auto dyv = draw_values(c.n, c.seed, 2);
  Buffer x(c.n, c.offset), y(c.n, c.offset), dy(c.n, c.offset), dx(c.n, c.offset);
  x.fill(xv);
  y.fill(yv);
  dy.fill(dyv);
  k.activation_backward(c.act, x.data(), y.data(), dy.data(), dx.data(), c.n);
  Run r;
  r.compare("dx", dx, reference::activation_backward_expected(c.act, xv, yv, dyv, bo), 0);
  return r;
}

Run run_loss(const Kernels& k, const Case& c, const reference::BoundOptions& bo) {
  const float spread = (c.seed & 1) ? 8.0f : 1.0f;  // large logits saturate softmax
  const auto outv = draw_values(c.rows * c.out, c.seed, 1, spread);
  Buffer out(c.rows * c.out, c.offset), dout(c.rows * c.out, c.offset);
  out.fill(outv);
  const auto scale = static_cast<float>(c.scale);
  Run r;
  if (c.loss == Loss::mse) {
    const auto tv = draw_values(c.rows * c.out, c.seed, 2);
    Buffer t(c.rows * c.out, c.offset);
    t.fill(tv);
    const double loss = k.loss_forward_backward(Loss::mse, out.data(), t.data(), dout.data(), c.rows, c.out, scale);
    const reference::LossExpected want = reference::mse_expected(outv, tv, c.rows, c.out, scale, bo);
    r.compare("dout", dout, want.dout, c.out);
    r.compare_loss(loss, want.loss, want.loss_bound);
  } else {
    std::vector<std::int64_t> labels(static_cast<std::size_t>(c.rows));
    const std::uint64_t key = mix_key(c.seed, 0x1abe1);
    for (std::size_t i = 0; i < labels.size(); ++i)
      labels[i] = static_cast<std::int64_t>(random_below(key, 1, i, static_cast<std::uint64_t>(c.out)));
    if (!labels.empty()) labels.back() = c.out - 1;  // the last class, on the last row
    const double loss =
        k.loss_forward_backward(Loss::cross_entropy, out.data(), labels.data(), dout.data(), c.rows, c.out, scale);
    const reference::LossExpected want = reference::cross_entropy_expected(outv, labels, c.rows, c.out, scale, bo);
    r.compare("dout", dout, want.dout, c.out);
    r.compare_loss(loss, want.loss, want.loss_bound);
  }
  return r;
}

// One optimizer step at step count c.step, from parameters, gradient and state drawn from the seed
// (at step 1 the momentum buffer holds values the step must ignore).
// (optimizer_step_bound derives its bound for float32 itself).
Run run_optimizer(const Kernels& k, const Case& c, OptimizerKind kind) {
  OptimizerConfig config;
  config.kind = kind;
  config.lr = c.lr;
  config.momentum = c.momentum;
  config.beta1 = c.beta1;
  config.beta2 = c.beta2;
  config.eps = c.eps;
  const auto pv = draw_values(c.n, c.seed, 1), gv = draw_values(c.n, c.seed, 2);
  std::vector<float> state;
  const int blocks = kind == OptimizerKind::sgd ? 0 : kind == OptimizerKind::momentum ? 1 : 2;
  for (int b = 0; b < blocks; ++b) {
    std::vector<float> s = draw_values(c.n, c.seed, 3 + static_cast<std::uint64_t>(b));
    if (b == 1)  // exp_avg_sq is a mean of squares
      for (float& v : s) v = v * v;
    state.insert(state.end(), s.begin(), s.end());
  }
  const reference::OptimizerStepBound want = reference::optimizer_step_bound(config, pv, gv, state, c.step - 1);
  Buffer p(c.n, c.offset), g(c.n, c.offset), s0(c.n, c.offset), s1(c.n, c.offset);
  p.fill(pv);
  g.fill(gv);
  if (blocks > 0) s0.fill(std::span<const float>(state).subspan(0, static_cast<std::size_t>(c.n)));
  if (blocks > 1) s1.fill(std::span<const float>(state).subspan(static_cast<std::size_t>(c.n)));
  switch (kind) {
    case OptimizerKind::sgd: k.sgd_step(p.data(), g.data(), c.n, c.lr); break;
    case OptimizerKind::momentum: k.momentum_step(p.data(), g.data(), s0.data(), c.n, c.lr, c.momentum, c.step); break;
    case OptimizerKind::adam:
      k.adam_step(p.data(), g.data(), s0.data(), s1.data(), c.n, c.lr, c.beta1, c.beta2, c.eps, c.step);
      break;
  }
  Run r;
  const auto block = [&](const std::vector<double>& v, const std::vector<double>& b, std::size_t i) {
    const auto n = static_cast<std::size_t>(c.n);
    return Expected{std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(i * n),
                                        v.begin() + static_cast<std::ptrdiff_t>((i + 1) * n)),
                    std::vector<double>(b.begin() + static_cast<std::ptrdiff_t>(i * n),
                                        b.begin() + static_cast<std::ptrdiff_t>((i + 1) * n))};
  };
  r.compare("p", p, Expected{want.params, want.params_bound}, 0);
  if (blocks > 0)
    r.compare(kind == OptimizerKind::momentum ? "buf" : "m", s0, block(want.state, want.state_bound, 0), 0);
  if (blocks > 1) r.compare("v", s1, block(want.state, want.state_bound, 1), 0);
  return r;
}

}  // namespace

// ---- the checks --------------------------------------------------------------------------------------

std::vector<OpCheck> op_checks() {
  using F = Field;
  return {
      {KernelOp::linear_forward,
       {F::rows, F::in, F::out, F::offset, F::seed},
       "y = x w^T + b, every element within the derived bound and written",
       run_linear_forward},
      {KernelOp::linear_backward,
       {F::rows, F::in, F::out, F::accumulate, F::dx, F::offset, F::seed},
       "dx = dy w, dw (+)= dy^T x, db (+)= column sums of dy (added when accumulate is 1, written when 0), "
       "within the derived bound",
       run_linear_backward},
      {KernelOp::activation_forward,
       {F::act, F::n, F::offset, F::seed},
       "y = relu(x) exactly, y = tanh(x) within the derived bound",
       run_activation_forward},
      {KernelOp::activation_backward,
       {F::act, F::n, F::offset, F::seed},
       "dx = dy where x > 0 else 0 (relu, exactly), dx = dy (1 - y^2) (tanh) within the derived bound",
       run_activation_backward},
      {KernelOp::loss_forward_backward,
       {F::loss, F::rows, F::out, F::scale, F::offset, F::seed},
       "dout = scale d(mean loss)/d(out) and the mean loss (mse; softmax cross-entropy, PyTorch's), within the "
       "derived bound",
       run_loss},
      {KernelOp::sgd_step,
       {F::n, F::lr, F::offset, F::seed},
       "p -= lr g (PyTorch's SGD) within the derived bound",
       [](const Kernels& k, const Case& c, const reference::BoundOptions&) {
         return run_optimizer(k, c, OptimizerKind::sgd);
       }},
      {KernelOp::momentum_step,
       {F::n, F::step, F::lr, F::momentum, F::offset, F::seed},
       "buf = g on step 1, else momentum buf + g; p -= lr buf (PyTorch's SGD with momentum), within the derived "
       "bound",
       [](const Kernels& k, const Case& c, const reference::BoundOptions&) {
         return run_optimizer(k, c, OptimizerKind::momentum);
       }},
      {KernelOp::adam_step,
       {F::n, F::step, F::lr, F::beta1, F::beta2, F::eps, F::offset, F::seed},
       "PyTorch's Adam with bias corrections 1 - beta^step, within the derived bound",
       [](const Kernels& k, const Case& c, const reference::BoundOptions&) {
         return run_optimizer(k, c, OptimizerKind::adam);
       }},
  };
}

}  // namespace conform_kernels_detail
}  // namespace dpcheck
