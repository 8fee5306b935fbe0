// dpcheck conform --kernels: each op a kernel plugin provides, against the float64 reference within the
// derived bound (reference/kernel_bound.hpp, reference/optimizer.hpp), on drawn shapes, buffers a few
// floats off their allocation's alignment, and outputs filled with a NaN before each call so that an
// element the kernel never writes cannot pass (and guard elements around each buffer, so that one written
// outside it is caught too). Accumulating outputs are checked both ways. Every op runs each case twice
// more for run-to-run bitwise determinism. A failing case is shrunk (each size and option in turn, while
// it still fails) to the minimal case that `--check NAME --case TEXT` replays alone. Then verify's
// properties run with the plugin's kernels.
//
// Each drawn case belongs to one class of shapes, since kernels (BLAS libraries above all) switch code
// paths with size and their bugs live on the paths small shapes never take:
//   tiny                 every size 1-8, below one vector of floats;
//   tile edges           sizes just around the widths kernels tile by (15-17, 31-33, 63-65) and any up to 70;
//   odd                  one or two sizes odd in the hundreds (101-999), the others odd below 100;
//   past a power of two  one or two sizes of 2^k - 1, 2^k + 1 or 2^k + 3 for k = 7..10, where blocked and
//                        threaded paths leave a remainder of one;
//   large                one or two sizes in 513 up to the size limit, the others moderate (the first
//                        large case of a run has every size past 512, rows, in and out each 513-640);
//   rows = 0             an empty batch for the linear ops: y has no elements, dw and db come back zero
//                        (written) or exactly as they were (accumulated).
// A class's other sizes are moderate (tile edges; odd ones for the odd class), so that a case costs a few
// times 10^8 multiply-adds at most even in a naive kernel. ConformOptions::max_kernel_size caps every drawn size: a
// class shrinks to it or, with no size left below it, is dropped (the row's detail says so) and its turns
// go to the next class. Vectors (n) and the loss's rows and columns take the same classes but rows = 0.
// Each row reports the largest error ratio of each class.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "conform/conform.hpp"
#include "properties/bounds.hpp"
#include "properties/mutants.hpp"
#include "properties/properties.hpp"
#include "reference/kernel_bound.hpp"
#include "reference/optimizer.hpp"
#include "src/error.hpp"
#include "src/plugin/kernel_plugin.hpp"
#include "src/rng.hpp"

namespace dpcheck {

namespace {

using Clock = std::chrono::steady_clock;
using reference::Expected;

// ---- cases -----------------------------------------------------------------------------------------

// One call's inputs: the sizes and options that matter to the op (the others keep their defaults), and
// the seed its values are drawn from.
struct Case {
  std::int64_t rows = 1, in = 1, out = 1, n = 1, accumulate = 0, dx = 1, step = 1, offset = 0;
  Activation act = Activation::relu;
  Loss loss = Loss::mse;
  double scale = 1, lr = 0.1, momentum = 0.9, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::uint64_t seed = 0;
};

enum class Field { rows, in, out, n, accumulate, dx, step, offset, act, loss, scale, lr, momentum, beta1, beta2, eps, seed };

std::string_view field_name(Field f) {
  switch (f) {
    case Field::rows: return "rows";
    case Field::in: return "in";
    case Field::out: return "out";
    case Field::n: return "n";
    case Field::accumulate: return "accumulate";
    case Field::dx: return "dx";
    case Field::step: return "step";
    case Field::offset: return "offset";
    case Field::act: return "act";
    case Field::loss: return "loss";
    case Field::scale: return "scale";
    case Field::lr: return "lr";
    case Field::momentum: return "momentum";
    case Field::beta1: return "beta1";
    case Field::beta2: return "beta2";
    case Field::eps: return "eps";
    case Field::seed: return "seed";
  }
  return "?";
}

std::int64_t* int_field(Case& c, Field f) {
  switch (f) {
    case Field::rows: return &c.rows;
    case Field::in: return &c.in;
    case Field::out: return &c.out;
    case Field::n: return &c.n;
    case Field::accumulate: return &c.accumulate;
    case Field::dx: return &c.dx;
    case Field::step: return &c.step;
    case Field::offset: return &c.offset;
    default: return nullptr;
  }
}

const std::int64_t* int_field(const Case& c, Field f) { return int_field(const_cast<Case&>(c), f); }

double* real_field(Case& c, Field f) {
  switch (f) {
    case Field::scale: return &c.scale;
    case Field::lr: return &c.lr;
    case Field::momentum: return &c.momentum;
    case Field::beta1: return &c.beta1;
    case Field::beta2: return &c.beta2;
    case Field::eps: return &c.eps;
    default: return nullptr;
  }
}

// The shortest decimal that reads back as the same double.
std::string real_text(double v) {
  char buf[32];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string case_text(Case c, std::span<const Field> fields) {
  std::string out;
  for (Field f : fields) {
    std::string value;
    if (const std::int64_t* i = int_field(c, f)) value = std::to_string(*i);
    else if (const double* r = real_field(c, f)) value = real_text(*r);
    else if (f == Field::act) value = c.act == Activation::relu ? "relu" : "tanh";
    else if (f == Field::loss) value = c.loss == Loss::mse ? "mse" : "cross_entropy";
    else value = std::to_string(c.seed);
    out += (out.empty() ? "" : " ") + std::string(field_name(f)) + "=" + value;
  }
  return out;
}

// Whether a check's rows may be 0 (an empty batch): a linear op's may, a loss over no rows has no mean.
bool allows_empty_batch(std::span<const Field> fields) {
  return std::find(fields.begin(), fields.end(), Field::in) != fields.end();
}

// The limits a case must keep: sizes at least 1 (rows at least 0 where `empty_batch`) and small enough to
// allocate, flags 0 or 1.
void check_case(const Case& c, const std::string& what, bool empty_batch) {
  const auto size = [&](std::int64_t v, std::string_view name, std::int64_t least = 1) {
    if (v < least || v > (1 << 20))
      throw UsageError(what + ": " + std::string(name) + " must be in [" + std::to_string(least) + ", 1048576]");
  };
  size(c.rows, "rows", empty_batch ? 0 : 1);
  size(c.in, "in");
  size(c.out, "out");
  size(c.n, "n");
  size(c.step, "step");
  if (c.rows * c.in > (1 << 24) || c.rows * c.out > (1 << 24) || c.out * c.in > (1 << 24))
    throw UsageError(what + ": the matrices are too big (at most 2^24 elements)");
  if (c.accumulate != 0 && c.accumulate != 1) throw UsageError(what + ": accumulate must be 0 or 1");
  if (c.dx != 0 && c.dx != 1) throw UsageError(what + ": dx must be 0 or 1");
  if (c.offset < 0 || c.offset > 64) throw UsageError(what + ": offset must be in [0, 64]");
  OptimizerConfig o;
  o.lr = c.lr;
  o.momentum = c.momentum;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.validate();
  if (!std::isfinite(c.scale) || std::abs(c.scale) > 1e30) throw UsageError(what + ": scale must be finite");
}

Case parse_case(const std::string& text, std::span<const Field> fields, const std::string& check) {
  const std::string what = "--case '" + text + "' (of " + check + ")";
  std::string names;
  for (Field f : fields) names += (names.empty() ? "" : " ") + std::string(field_name(f));
  Case c;
  std::istringstream words(text);
  std::string word;
  bool any = false;
  while (words >> word) {
    any = true;
    const auto eq = word.find('=');
    const std::string key = word.substr(0, eq), value = eq == std::string::npos ? "" : word.substr(eq + 1);
    const auto f = std::find_if(fields.begin(), fields.end(), [&](Field x) { return field_name(x) == key; });
    if (eq == std::string::npos || value.empty() || f == fields.end())
      throw UsageError(what + ": '" + word + "' is not NAME=VALUE with NAME one of: " + names);
    const auto bad = [&] { return UsageError(what + ": '" + word + "' has a value " + key + " cannot take"); };
    if (std::int64_t* i = int_field(c, *f)) {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), *i);
      if (ec != std::errc() || end != value.data() + value.size()) throw bad();
    } else if (double* r = real_field(c, *f)) {
      char* end = nullptr;
      *r = std::strtod(value.c_str(), &end);
      if (*end != '\0' || !std::isfinite(*r)) throw bad();
    } else if (*f == Field::act) {
      if (value != "relu" && value != "tanh") throw bad();
      c.act = value == "relu" ? Activation::relu : Activation::tanh;
    } else if (*f == Field::loss) {
      if (value != "mse" && value != "cross_entropy") throw bad();
      c.loss = value == "mse" ? Loss::mse : Loss::cross_entropy;
    } else {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), c.seed);
      if (ec != std::errc() || end != value.data() + value.size()) throw bad();
    }
  }
  if (!any) throw UsageError(what + ": empty (give NAME=VALUE pairs: " + names + ")");
  check_case(c, what, allows_empty_batch(fields));
  return c;
}

// ---- buffers ---------------------------------------------------------------------------------------

// A NaN whose payload no arithmetic produces: an output element that still holds it was never written.
constexpr std::uint32_t kPoisonBits = 0x7fc0dead;
float poison() {
  float f;
  std::memcpy(&f, &kPoisonBits, sizeof f);
  return f;
}
constexpr std::int64_t kTailGuard = 8;  // elements after a buffer that must stay untouched

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

// Values in [-1, 1) times 2^e, e in [-4, 4]: several binades, far from underflow; `spread` scales them.
std::vector<float> draw_values(std::int64_t n, std::uint64_t seed, std::uint64_t stream, float spread = 1) {
  const std::uint64_t key = mix_key(seed, 0xc0f0);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = spread * std::ldexp(random_symmetric(key, stream, i), static_cast<int>(random_u64(key, stream + 1000, i) % 9) - 4);
  return v;
}

// ---- running one case --------------------------------------------------------------------------------

// What one call did: the largest error ratio, the first reason it fails (empty: it passes), and every
// output's bits, for the determinism check.
struct Run {
  double ratio = 0;
  std::string why;
  std::vector<unsigned char> bits;

  void keep_bits(const void* p, std::size_t bytes) {
    const auto* b = static_cast<const unsigned char*>(p);
    bits.insert(bits.end(), b, b + bytes);
  }

  // Compares an output with its expected values; `cols` > 0 names elements [row, col].
  void compare(std::string_view name, const Buffer& got, const Expected& want, std::int64_t cols) {
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

  void compare_loss(double got, double want, double bound) {
    keep_bits(&got, sizeof got);
    const double q = error_ratio(got, want, bound);
    ratio = std::max(ratio, q);
    if (q > 1 && why.empty())
      why = "the mean loss = " + real_text(got) + ", expected " + real_text(want) + " within " + real_text(bound) +
            " (error ratio " + real_text(q) + ")";
  }

  static double error_ratio(double got, double want, double bound) {
    if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
    const double err = std::abs(got - want);
    if (err == 0) return 0;
    return bound > 0 ? err / bound : std::numeric_limits<double>::infinity();
  }
};

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
  for (std::size_t i = 0; i < xv.size(); ++i) yv[i] = c.act == Activation::relu ? std::max(xv[i], 0.0f) : std::tanh(xv[i]);
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
    return Expected{std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(i * n), v.begin() + static_cast<std::ptrdiff_t>((i + 1) * n)),
                    std::vector<double>(b.begin() + static_cast<std::ptrdiff_t>(i * n), b.begin() + static_cast<std::ptrdiff_t>((i + 1) * n))};
  };
  r.compare("p", p, Expected{want.params, want.params_bound}, 0);
  if (blocks > 0) r.compare(kind == OptimizerKind::momentum ? "buf" : "m", s0, block(want.state, want.state_bound, 0), 0);
  if (blocks > 1) r.compare("v", s1, block(want.state, want.state_bound, 1), 0);
  return r;
}

// ---- the checks --------------------------------------------------------------------------------------

using Runner = Run (*)(const Kernels&, const Case&, const reference::BoundOptions&);

struct OpCheck {
  KernelOp op;
  std::vector<Field> fields;  // what its case text holds, in this order
  std::string_view promise;
  Runner run;
};

std::vector<OpCheck> op_checks() {
  using F = Field;
  return {
      {KernelOp::linear_forward, {F::rows, F::in, F::out, F::offset, F::seed},
       "y = x w^T + b, every element within the derived bound and written", run_linear_forward},
      {KernelOp::linear_backward, {F::rows, F::in, F::out, F::accumulate, F::dx, F::offset, F::seed},
       "dx = dy w, dw (+)= dy^T x, db (+)= column sums of dy (added when accumulate is 1, written when 0), "
       "within the derived bound",
       run_linear_backward},
      {KernelOp::activation_forward, {F::act, F::n, F::offset, F::seed},
       "y = relu(x) exactly, y = tanh(x) within the derived bound", run_activation_forward},
      {KernelOp::activation_backward, {F::act, F::n, F::offset, F::seed},
       "dx = dy where x > 0 else 0 (relu, exactly), dx = dy (1 - y^2) (tanh) within the derived bound",
       run_activation_backward},
      {KernelOp::loss_forward_backward, {F::loss, F::rows, F::out, F::scale, F::offset, F::seed},
       "dout = scale d(mean loss)/d(out) and the mean loss (mse; softmax cross-entropy, PyTorch's), within the "
       "derived bound",
       run_loss},
      {KernelOp::sgd_step, {F::n, F::lr, F::offset, F::seed}, "p -= lr g (PyTorch's SGD) within the derived bound",
       [](const Kernels& k, const Case& c, const reference::BoundOptions&) {
         return run_optimizer(k, c, OptimizerKind::sgd);
       }},
      {KernelOp::momentum_step, {F::n, F::step, F::lr, F::momentum, F::offset, F::seed},
       "buf = g on step 1, else momentum buf + g; p -= lr buf (PyTorch's SGD with momentum), within the derived "
       "bound",
       [](const Kernels& k, const Case& c, const reference::BoundOptions&) {
         return run_optimizer(k, c, OptimizerKind::momentum);
       }},
      {KernelOp::adam_step, {F::n, F::step, F::lr, F::beta1, F::beta2, F::eps, F::offset, F::seed},
       "PyTorch's Adam with bias corrections 1 - beta^step, within the derived bound",
       [](const Kernels& k, const Case& c, const reference::BoundOptions&) {
         return run_optimizer(k, c, OptimizerKind::adam);
       }},
  };
}

// ---- shapes ------------------------------------------------------------------------------------------

// The classes of shapes a case is drawn from (the file's header says what each holds and why).
enum class ShapeClass { tiny, tile_edges, odd, past_power_of_two, large, empty_batch };
constexpr ShapeClass kShapeClasses[] = {ShapeClass::tiny, ShapeClass::tile_edges, ShapeClass::odd,
                                        ShapeClass::past_power_of_two, ShapeClass::large, ShapeClass::empty_batch};

std::string shape_class_name(ShapeClass s) {
  switch (s) {
    case ShapeClass::tiny: return "tiny";
    case ShapeClass::tile_edges: return "tile edges";
    case ShapeClass::odd: return "odd";
    case ShapeClass::past_power_of_two: return "past a power of two";
    case ShapeClass::large: return "large";
    case ShapeClass::empty_batch: return "rows = 0";
  }
  return "?";
}

constexpr std::int64_t kTinyMax = 8;
constexpr std::int64_t kEdgeMax = 70;
constexpr std::int64_t kEdges[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 70};
constexpr std::int64_t kOddMin = 101, kOddMax = 999, kOddSmallMax = 99;
constexpr std::int64_t kLargeMin = 513;
// The case with rows, in and out all large keeps them to 640: three products of 1024^3 take a naive
// kernel (and the reference) tens of seconds.
constexpr std::int64_t kAllLargeMax = 640;
// The most max_kernel_size may be: two sizes at it keep a matrix within check_case's 2^24 elements, so
// that every drawn case replays.
constexpr std::int64_t kMaxSizeLimit = 4096;

// The sizes a check's shape has: rows, in and out (linear ops), rows and out (the loss), or n (vectors).
std::vector<Field> size_fields(std::span<const Field> fields) {
  std::vector<Field> sizes;
  for (Field f : fields)
    if (f == Field::rows || f == Field::in || f == Field::out || f == Field::n) sizes.push_back(f);
  return sizes;
}

// 2^k - 1, 2^k + 1 and 2^k + 3 for k = 7..10, those up to max_size.
std::vector<std::int64_t> past_powers_of_two(std::int64_t max_size) {
  std::vector<std::int64_t> sizes;
  for (int k = 7; k <= 10; ++k)
    for (const std::int64_t d : {-1, 1, 3})
      if ((std::int64_t{1} << k) + d <= max_size) sizes.push_back((std::int64_t{1} << k) + d);
  return sizes;
}

// Whether a class has a size up to max_size (a class without one is dropped).
bool fits(ShapeClass s, std::int64_t max_size) {
  switch (s) {
    case ShapeClass::odd: return max_size >= kOddMin;
    case ShapeClass::past_power_of_two: return !past_powers_of_two(max_size).empty();
    case ShapeClass::large: return max_size >= kLargeMin;
    default: return true;
  }
}

bool drawn_for(ShapeClass s, std::span<const Field> fields, std::int64_t max_size) {
  return fits(s, max_size) && (s != ShapeClass::empty_batch || allows_empty_batch(fields));
}

// The classes cases 1, 2, ... take in turn (case 0 has every size 1, a tiny case): a run of 30 has five or
// six of each and three empty batches. The length, 11, is odd, so that each class meets accumulate (odd
// cases) and write (even ones) in turn; a class a check does not draw gives its turn to the next one.
constexpr ShapeClass kRotation[] = {ShapeClass::tile_edges, ShapeClass::past_power_of_two, ShapeClass::empty_batch,
                                    ShapeClass::large, ShapeClass::odd, ShapeClass::tiny, ShapeClass::tile_edges,
                                    ShapeClass::large, ShapeClass::past_power_of_two, ShapeClass::odd, ShapeClass::tiny};

ShapeClass shape_class_of(int i, std::span<const Field> fields, std::int64_t max_size) {
  if (i == 0) return ShapeClass::tiny;
  const std::size_t slot = static_cast<std::size_t>(i - 1) % std::size(kRotation);
  for (std::size_t j = 0;; ++j) {
    const ShapeClass s = kRotation[(slot + j) % std::size(kRotation)];
    if (drawn_for(s, fields, max_size)) return s;  // tile edges always is
  }
}

// The class a replayed case falls in, by its sizes (a drawn case's is the one it was drawn from): rows = 0,
// then any size past a power of two, then the largest size's range (71-512 counting as odd's, the
// hundreds).
ShapeClass shape_class_of(const Case& c, std::span<const Field> fields) {
  const std::vector<std::int64_t> powers = past_powers_of_two(kMaxSizeLimit);
  std::int64_t largest = 0;
  bool past_power = false;
  for (Field f : size_fields(fields)) {
    const std::int64_t v = *int_field(c, f);
    largest = std::max(largest, v);
    past_power = past_power || std::find(powers.begin(), powers.end(), v) != powers.end();
  }
  if (allows_empty_batch(fields) && c.rows == 0) return ShapeClass::empty_batch;
  if (past_power) return ShapeClass::past_power_of_two;
  if (largest >= kLargeMin) return ShapeClass::large;
  if (largest > kEdgeMax) return ShapeClass::odd;
  return largest > kTinyMax ? ShapeClass::tile_edges : ShapeClass::tiny;
}

std::int64_t uniform_size(std::uint64_t key, std::uint64_t stream, std::uint64_t index, std::int64_t lo,
                          std::int64_t hi) {
  return lo + static_cast<std::int64_t>(random_below(key, stream, index, static_cast<std::uint64_t>(hi - lo + 1)));
}

// An odd size in [lo, hi], lo odd.
std::int64_t odd_size(std::uint64_t key, std::uint64_t stream, std::uint64_t index, std::int64_t lo,
                      std::int64_t hi) {
  return lo + 2 * uniform_size(key, stream, index, 0, (hi - lo) / 2);
}

// Sizes around tile and vector widths, and any size up to 70; none past max_size.
std::int64_t tile_edge_size(std::uint64_t key, std::uint64_t index, std::int64_t max_size) {
  if (random_below(key, 20, index, 2) == 0) {
    std::vector<std::int64_t> edges;
    for (std::int64_t e : kEdges)
      if (e <= max_size) edges.push_back(e);
    return edges[random_below(key, 21, index, edges.size())];
  }
  return uniform_size(key, 22, index, 1, std::min(kEdgeMax, max_size));
}

// The sizes of a case of class s (`all_large`: the run's case with every size large). Odd, past a power of
// two and large give one or two sizes (of three; one of one) their own kind and the others moderate ones,
// which keeps a case's cost to a few times 10^8 multiply-adds.
void draw_sizes(Case& c, ShapeClass s, std::span<const Field> fields, bool all_large, std::int64_t max_size,
                std::uint64_t key, std::uint64_t idx) {
  const std::vector<Field> sizes = size_fields(fields);
  const std::size_t dims = sizes.size();
  const auto index = [&](std::size_t d) { return idx * 8 + d; };
  // Which sizes are the class's own: a random one or two of them, in a random order.
  std::vector<bool> own(dims, false);
  std::size_t count = all_large ? dims : std::min<std::size_t>(dims, 1 + random_below(key, 23, idx, 2));
  std::vector<std::size_t> order(dims);
  for (std::size_t d = 0; d < dims; ++d) order[d] = d;
  for (std::size_t d = dims; d > 1; --d) std::swap(order[d - 1], order[random_below(key, 24, index(d), d)]);
  for (std::size_t d = 0; d < count; ++d) own[order[d]] = true;
  for (std::size_t d = 0; d < dims; ++d) {
    std::int64_t& v = *int_field(c, sizes[d]);
    switch (s) {
      case ShapeClass::tiny: v = uniform_size(key, 25, index(d), 1, std::min(kTinyMax, max_size)); break;
      case ShapeClass::tile_edges: v = tile_edge_size(key, index(d), max_size); break;
      case ShapeClass::odd:
        v = own[d] ? odd_size(key, 26, index(d), kOddMin, std::min(kOddMax, max_size))
                   : odd_size(key, 26, index(d), 1, std::min(kOddSmallMax, max_size));
        break;
      case ShapeClass::past_power_of_two: {
        const std::vector<std::int64_t> powers = past_powers_of_two(max_size);
        v = own[d] ? powers[random_below(key, 27, index(d), powers.size())] : tile_edge_size(key, index(d), max_size);
        break;
      }
      case ShapeClass::large: {
        const std::int64_t hi = all_large && dims == 3 ? std::min(kAllLargeMax, max_size) : max_size;
        v = own[d] ? uniform_size(key, 28, index(d), kLargeMin, hi) : tile_edge_size(key, index(d), max_size);
        break;
      }
      case ShapeClass::empty_batch:
        // Products of nothing: in and out cost only their dw, so any size up to the limit.
        if (sizes[d] == Field::rows) v = 0;
        else if (random_below(key, 29, index(d), 2) == 0) v = tile_edge_size(key, index(d), max_size);
        else v = uniform_size(key, 30, index(d), 1, max_size);
        break;
    }
  }
}

struct Drawn {
  Case c;
  ShapeClass shape;
};

// Case i of a check: the first has every size 1; the others are drawn, their shapes from the class whose
// turn it is (shape_class_of).
Drawn draw_case(const OpCheck& check, std::uint64_t seed, int i, std::int64_t max_size) {
  const std::uint64_t key = mix_key(seed, static_cast<std::uint64_t>(check.op) + 1);
  const auto idx = static_cast<std::uint64_t>(i);
  Case c;
  c.seed = random_u64(key, 10, idx) >> 16;  // short enough to read and type
  if (i == 0) return {c, ShapeClass::tiny};
  const ShapeClass shape = shape_class_of(i, check.fields, max_size);
  bool first_large = shape == ShapeClass::large;
  for (int j = 1; j < i && first_large; ++j)
    first_large = shape_class_of(j, check.fields, max_size) != ShapeClass::large;
  draw_sizes(c, shape, check.fields, first_large, max_size, key, idx);
  c.offset = static_cast<std::int64_t>(random_below(key, 6, idx, 4));
  c.accumulate = static_cast<std::int64_t>(i % 2);  // both ways, in turn
  c.dx = random_below(key, 7, idx, 4) == 0 ? 0 : 1;
  c.act = i % 2 == 0 ? Activation::tanh : Activation::relu;
  c.loss = (i / 2) % 2 == 0 ? Loss::cross_entropy : Loss::mse;
  static constexpr double kScales[] = {1.0, 0.75, 4.0, 0.3};
  c.scale = kScales[random_below(key, 8, idx, std::size(kScales))];
  // Steps 1 to 12: the first step (momentum's buffer, Adam's largest correction) and later ones.
  c.step = 1 + static_cast<std::int64_t>(random_below(key, 9, idx, 12));
  static constexpr double kLr[] = {0.1, 0.01, 0.5, 1e-3};
  c.lr = kLr[random_below(key, 11, idx, std::size(kLr))];
  static constexpr double kMomentum[] = {0.9, 0.5, 0.99};
  c.momentum = kMomentum[random_below(key, 12, idx, std::size(kMomentum))];
  static constexpr double kBeta1[] = {0.9, 0.8, 0.5};
  static constexpr double kBeta2[] = {0.999, 0.99, 0.9};
  c.beta1 = kBeta1[random_below(key, 13, idx, std::size(kBeta1))];
  c.beta2 = kBeta2[random_below(key, 14, idx, std::size(kBeta2))];
  static constexpr double kEps[] = {1e-8, 1e-6, 1e-3};
  c.eps = kEps[random_below(key, 15, idx, std::size(kEps))];
  return {c, shape};
}

// Smaller cases than c, the simplest first: each size down to 1 (a linear op's rows to 0 before that: an
// empty batch), to half, and then ever closer below it (now - now/4, now - now/8, ..., now - 1), so that a
// bug that needs a size past some threshold (in > 512, say) shrinks to just past it in a few rounds of a
// few tries; offset 0; written rather than accumulated; an earlier step; scale 1.
std::vector<Case> shrinks_of(const Case& c, std::span<const Field> fields) {
  std::vector<Case> out;
  for (Field f : fields) {
    Case d = c;
    std::int64_t* v = int_field(d, f);
    if (f == Field::rows || f == Field::in || f == Field::out || f == Field::n || f == Field::step) {
      const std::int64_t now = *v;
      const std::int64_t least = f == Field::rows && allows_empty_batch(fields) ? 0 : 1;
      std::vector<std::int64_t> to = {least, 1, now / 2};
      for (std::int64_t gap = now / 4; gap >= 1; gap /= 2) to.push_back(now - gap);
      to.push_back(now - 1);
      std::vector<std::int64_t> tried;
      for (const std::int64_t t : to)
        if (t >= least && t < now && std::find(tried.begin(), tried.end(), t) == tried.end()) {
          tried.push_back(t);
          Case e = c;
          *int_field(e, f) = t;
          out.push_back(e);
        }
    } else if ((f == Field::offset || f == Field::accumulate) && *v != 0) {
      *v = 0;
      out.push_back(d);
    } else if (f == Field::scale && c.scale != 1) {
      d.scale = 1;
      out.push_back(d);
    }
  }
  return out;
}

// Whether a case fails its check: the op's promise, or (determinism) two runs that agree bit for bit.
struct Verdict {
  bool failed = false;
  double ratio = 0;
  std::string why;
};

Verdict judge(const OpCheck& check, bool determinism, const Kernels& k, const Case& c, const reference::BoundOptions& bo) {
  const Run first = check.run(k, c, bo);
  if (!determinism) return {!first.why.empty() || !(first.ratio <= 1), first.ratio, first.why};
  const Run second = check.run(k, c, bo);  // fresh buffers at other addresses
  if (first.bits == second.bits) return {false, first.ratio, ""};
  std::size_t byte = 0;
  while (byte < first.bits.size() && byte < second.bits.size() && first.bits[byte] == second.bits[byte]) ++byte;
  return {true, first.ratio,
          "two runs on the same inputs differ (first at output byte " + std::to_string(byte) + " of " +
              std::to_string(first.bits.size()) + ")"};
}

struct Shrunk {
  Case c;
  Verdict v;
};

Shrunk shrink(const OpCheck& check, bool determinism, const Kernels& k, Shrunk failing, const reference::BoundOptions& bo) {
  for (int tries = 0; tries < 400;) {
    bool smaller = false;
    for (const Case& candidate : shrinks_of(failing.c, check.fields)) {
      ++tries;
      const Verdict v = judge(check, determinism, k, candidate, bo);
      if (v.failed) {
        failing = {candidate, v};
        smaller = true;
        break;
      }
    }
    if (!smaller) break;
  }
  return failing;
}

std::string ratio_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, std::isfinite(r) ? "%.3g" : "%g", r);
  return buf;
}

std::string check_name(const OpCheck& check, bool determinism) {
  return std::string(kernel_op_name(check.op)) + (determinism ? " determinism" : "");
}

// The class with the largest ratio of all (none when every ratio is 0).
std::string worst_class(const std::map<std::string, double>& ratios) {
  std::string worst;
  double largest = 0;
  for (const auto& [name, ratio] : ratios)
    if (ratio > largest) {
      largest = ratio;
      worst = name;
    }
  return worst;
}

// What the drawn cases covered, for a passing row: the cases of each class, the classes the size limit
// dropped, the range of each size.
std::string coverage(const OpCheck& check, const std::vector<Drawn>& cases, std::int64_t max_size) {
  const std::vector<Field> sizes = size_fields(check.fields);
  std::string text = std::to_string(cases.size()) + " cases:";
  std::string dropped;
  bool first = true;
  for (ShapeClass s : kShapeClasses) {
    if (!drawn_for(s, check.fields, max_size)) {
      if (s != ShapeClass::empty_batch || allows_empty_batch(check.fields))
        dropped += (dropped.empty() ? "" : ", ") + shape_class_name(s);
      continue;
    }
    const auto n = std::count_if(cases.begin(), cases.end(), [&](const Drawn& d) { return d.shape == s; });
    if (n == 0) continue;
    text += (first ? " " : ", ") + shape_class_name(s) + " " + std::to_string(n);
    first = false;
    const auto all_large = [](const Drawn& d) {
      return d.c.rows >= kLargeMin && d.c.in >= kLargeMin && d.c.out >= kLargeMin;
    };
    if (s == ShapeClass::large && sizes.size() == 3 && std::any_of(cases.begin(), cases.end(), all_large))
      text += " (one with rows, in and out past 512)";
  }
  if (!dropped.empty()) text += " (max size " + std::to_string(max_size) + ": no " + dropped + ")";
  text += ";";
  for (Field f : sizes) {
    std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = 0;
    for (const Drawn& d : cases) {
      lo = std::min(lo, *int_field(d.c, f));
      hi = std::max(hi, *int_field(d.c, f));
    }
    // The loss's out is its columns.
    const std::string name = f == Field::out && sizes.size() == 2 ? "cols" : std::string(field_name(f));
    text += " " + name + " " + std::to_string(lo) + "-" + std::to_string(hi);
  }
  const auto has = [&](Field f) { return std::find(check.fields.begin(), check.fields.end(), f) != check.fields.end(); };
  std::int64_t step = 0;
  for (const Drawn& d : cases) step = std::max(step, d.c.step);
  if (has(Field::step)) text += ", steps 1-" + std::to_string(step);
  if (has(Field::accumulate)) text += ", accumulate 0 and 1";
  if (has(Field::act)) text += ", relu and tanh";
  if (has(Field::loss)) text += ", mse and cross-entropy";
  return text + ", offsets 0-3, outputs poisoned";
}

ConformRow check_row(const OpCheck& check, bool determinism, const Kernels& k, const ConformOptions& options,
                     const reference::BoundOptions& bo) {
  const auto start = Clock::now();
  ConformRow row;
  row.section = "kernels";
  row.check = check_name(check, determinism);
  row.promise = determinism ? "the same inputs give the same bits, run after run" : std::string(check.promise);
  const auto fail = [&](const Shrunk& s) {
    row.verdict = ConformVerdict::fail;
    row.minimal = case_text(s.c, check.fields);
    row.detail = s.v.why + (determinism ? "" : "; largest error ratio over the outputs " + ratio_text(s.v.ratio));
    row.replay = options.replay_prefix + " --check '" + row.check + "' --case '" + row.minimal + "'";
  };
  // The largest ratio of each class (the determinism rows compare bits, not ratios).
  const auto note_ratio = [&](ShapeClass s, double ratio) {
    if (determinism) return;
    double& largest = row.ratio_by_shape_class[shape_class_name(s)];
    largest = std::max(largest, ratio);
  };
  if (!options.case_text.empty()) {
    const Case c = parse_case(options.case_text, check.fields, row.check);
    const ShapeClass shape = shape_class_of(c, check.fields);
    const Verdict v = judge(check, determinism, k, c, bo);
    note_ratio(shape, v.ratio);
    if (v.failed)
      fail({c, v});
    else
      row.detail = "the case passes" +
                   (determinism ? std::string(": two runs agree bit for bit")
                                : ": error ratio " + ratio_text(v.ratio) + " (" + shape_class_name(shape) + ")");
  } else {
    // Determinism reruns fewer cases: a kernel that depends on a counter or an address shows it at once.
    const int cases = std::max(1, determinism ? options.cases / 4 : options.cases);
    const std::int64_t max_size = options.max_kernel_size;
    std::vector<Drawn> drawn;
    double worst = 0;
    for (int i = 0; i < cases; ++i) {
      Drawn d = draw_case(check, options.seed, i, max_size);
      if (mutant_conform_kernel_whole_tiles(options.mutant))
        for (Field f : size_fields(check.fields)) {
          std::int64_t& v = *int_field(d.c, f);
          v = (v + 7) / 8 * 8;
        }
      drawn.push_back(d);
      const Verdict v = judge(check, determinism, k, d.c, bo);
      note_ratio(d.shape, v.ratio);
      if (v.failed) {
        fail(shrink(check, determinism, k, {d.c, v}, bo));
        row.detail += " (case " + std::to_string(i + 1) + " of " + std::to_string(cases) + ", " +
                      shape_class_name(d.shape) + ", shrunk)";
        break;
      }
      worst = std::max(worst, v.ratio);
    }
    if (row.verdict == ConformVerdict::pass) {
      row.detail = coverage(check, drawn, max_size);
      if (determinism) {
        row.detail += ", each run twice: bitwise identical";
      } else {
        const std::string where = worst_class(row.ratio_by_shape_class);
        row.detail += "; largest error ratio " + ratio_text(worst) + (where.empty() ? "" : " (" + where + ")");
      }
    }
  }
  row.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return row;
}

}  // namespace

std::vector<std::string> conform_kernel_checks() {
  std::vector<std::string> names;
  for (bool determinism : {false, true})
    for (const OpCheck& check : op_checks()) names.push_back(check_name(check, determinism));
  return names;
}

std::vector<ConformRow> conform_kernels(const Target& target, const ConformOptions& options) {
  if (target.kernels.empty()) throw UsageError("conform_kernels needs a kernel plugin (--kernels PATH)");
  const KernelPlugin& plugin = load_kernel_plugin(target.kernels);
  require_kernels_for_engine(plugin, find_engine(target.engine));
  if (options.cases < 1) throw UsageError("--cases must be at least 1");
  if (options.max_kernel_size < 1 || options.max_kernel_size > kMaxSizeLimit)
    throw UsageError("--max-size must be in [1, " + std::to_string(kMaxSizeLimit) +
                     "] (the kernel checks' largest size; got " + std::to_string(options.max_kernel_size) + ")");
  const std::vector<OpCheck> checks = op_checks();

  // --check: one of these rows, or one of verify's properties.
  const OpCheck* only = nullptr;
  bool only_determinism = false;
  if (!options.check.empty()) {
    for (const OpCheck& c : checks)
      for (bool d : {false, true})
        if (check_name(c, d) == options.check) {
          only = &c;
          only_determinism = d;
        }
    if (!only) {
      const auto props = properties();
      const bool is_property = std::any_of(props.begin(), props.end(), [&](const PropertyDef& p) {
        return "property " + std::string(p.name) == options.check;
      });
      if (!is_property) {
        std::string names;
        for (const OpCheck& c : checks) names += (names.empty() ? "" : ", ") + check_name(c, false) + ", " + check_name(c, true);
        throw UsageError("--check '" + options.check + "' is no check of conform --kernels (its kernel checks: " + names +
                         "; or 'property <name>' for a property of verify)");
      }
      return conform_properties(target, options);
    }
    if (!plugin.provides(only->op))
      throw UsageError("--check '" + options.check + "': plugin '" + std::string(plugin.name()) + "' provides no " +
                       std::string(kernel_op_name(only->op)));
  } else if (!options.case_text.empty()) {
    throw UsageError("--case needs --check: the check whose case it is");
  }

  std::vector<ConformRow> rows;
  const auto add = [&](ConformRow row) {
    if (options.on_row) options.on_row(row);
    rows.push_back(std::move(row));
  };
  if (plugin.memory() == DPCHECK_CUDA) {
    // The per-op checks fill and read host buffers; a device plugin's ops meet dpcheck's checks through
    // the cuda engine, in verify's properties.
    for (const OpCheck& check : checks) {
      if (only && only != &check) continue;
      ConformRow row;
      row.section = "kernels";
      row.check = check_name(check, only_determinism);
      row.verdict = ConformVerdict::skip;
      row.detail = "a device plugin: its ops are checked in the cuda engine by verify's properties below, not one "
                   "by one (the per-op checks stage host buffers only)";
      add(std::move(row));
    }
    if (options.properties && !only)
      for (ConformRow& row : conform_properties(target, options)) rows.push_back(std::move(row));
    return rows;
  }
  const Kernels kernels(plugin, -1, options.timeout);
  const reference::BoundOptions bo = bound_options(target);
  if (only) {
    add(check_row(*only, only_determinism, kernels, options, bo));
    return rows;
  }
  for (bool determinism : {false, true})
    for (const OpCheck& check : checks) {
      if (!plugin.provides(check.op)) {
        if (determinism) continue;
        ConformRow row;
        row.section = "kernels";
        row.check = check_name(check, false);
        row.verdict = ConformVerdict::skip;
        row.detail = "not provided (NULL): dpcheck's own kernel runs";
        add(std::move(row));
        continue;
      }
      add(check_row(check, determinism, kernels, options, bo));
    }
  if (options.properties)
    for (ConformRow& row : conform_properties(target, options)) rows.push_back(std::move(row));
  return rows;
}

}  // namespace dpcheck
