#include "properties/any_order.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <ostream>
#include <sstream>

#include "properties/common.hpp"
#include "src/rng.hpp"
#include "src/train/trainer.hpp"
#include "verdict/bounds.hpp"

namespace dpcheck {

namespace {

// ---- orders ------------------------------------------------------------------------------------

enum class Kind { sequential, reversed, pairwise, blocked, tree, magnitude };
constexpr const char* kKindNames[] = {"sequential", "reversed", "pairwise", "blocked", "random tree", "largest first"};

// How one family of sums is evaluated: the association, fused multiply-adds, and where the addend
// (a bias, or the gradient accumulated so far) joins.
struct Order {
  Kind kind = Kind::sequential;
  bool fma = false;
  int block = 4;
  bool addend_first = false;
  std::uint64_t key = 0;  // random trees
};

std::string describe(const Order& o) {
  std::string s = kKindNames[static_cast<int>(o.kind)];
  if (o.kind == Kind::blocked) s += " by " + std::to_string(o.block);
  if (o.fma) s += ", fma";
  if (o.addend_first) s += ", addend first";
  return s;
}

// The phases of one evaluation, each with its own order.
enum Phase {
  forward_phase,
  softmax_phase,
  weight_grad_phase,
  bias_grad_phase,
  backprop_phase,
  allreduce_phase,
  phases
};
constexpr const char* kPhaseNames[] = {"forward",       "softmax sum", "weight gradient",
                                       "bias gradient", "backward",    "all-reduce"};

// How one evaluation scales and reduces, besides its orders.
struct Plan {
  Order order[phases];
  bool scale_after = false;          // the micro-batch's weight multiplies its gradient, not its delta
  bool reciprocal_avg = false;       // the all-reduce multiplies by float(1/N) instead of dividing by N
  bool accumulate_in_place = false;  // micro-batches add their terms straight into the accumulated gradient

  std::string describe() const {
    std::string s;
    for (int p = 0; p < phases; ++p)
      s += (p ? "; " : "") + std::string(kPhaseNames[p]) + " " + dpcheck::describe(order[p]);
    if (scale_after) s += "; weights applied to the gradient";
    if (reciprocal_avg) s += "; average by the reciprocal";
    if (accumulate_in_place) s += "; micro-batches accumulated in place";
    return s;
  }
};

Plan draw_plan(std::uint64_t seed, int evaluation) {
  const std::uint64_t key = mix_key(seed, 0xA11'0DE5);
  std::uint64_t index = 0;
  const auto next = [&] { return random_u64(key, static_cast<std::uint64_t>(evaluation), index++); };
  Plan p;
  for (Order& o : p.order) {
    o.kind = static_cast<Kind>(next() % 6);
    o.fma = next() % 2 == 1;
    o.block = 2 + static_cast<int>(next() % 7);
    o.addend_first = next() % 2 == 1;
    o.key = next();
  }
  p.scale_after = next() % 2 == 1;
  p.reciprocal_avg = next() % 2 == 1;
  p.accumulate_in_place = next() % 2 == 1;
  return p;
}

// Sums sum_i a[i] * b[i] (or sum_i a[i] when b is empty), plus an addend, in the order. `salt` makes
// random trees differ from one element to the next.
class Summer {
 public:
  Summer(const Order& o, std::uint64_t salt) : o_(o), salt_(salt) {}

  float operator()(const std::vector<float>& a, const std::vector<float>& b, float addend, bool has_addend) {
    a_ = &a;
    b_ = b.empty() ? nullptr : &b;
    const std::size_t n = a.size();
    idx_.resize(n);
    std::iota(idx_.begin(), idx_.end(), std::size_t{0});
    if (o_.kind == Kind::reversed) std::reverse(idx_.begin(), idx_.end());
    if (o_.kind == Kind::magnitude)
      std::stable_sort(idx_.begin(), idx_.end(), [&](std::size_t x, std::size_t y) { return exact(x) > exact(y); });
    const bool first = has_addend && o_.addend_first;
    float acc = 0.0f;
    switch (o_.kind) {
      case Kind::sequential:
      case Kind::reversed:
      case Kind::magnitude: acc = run(0, n, first ? addend : 0.0f); break;
      case Kind::blocked: {
        acc = first ? addend : 0.0f;
        for (std::size_t lo = 0; lo < n; lo += static_cast<std::size_t>(o_.block))
          acc = acc + run(lo, std::min(n, lo + static_cast<std::size_t>(o_.block)), 0.0f);
        break;
      }
      case Kind::pairwise:
      case Kind::tree:
        acc = n == 0 ? 0.0f : tree(0, n);
        if (first) acc = addend + acc;
        break;
    }
    if (has_addend && !first) acc = acc + addend;
    return acc;
  }

 private:
  double exact(std::size_t i) const {
    return std::abs(static_cast<double>((*a_)[i]) * (b_ ? static_cast<double>((*b_)[i]) : 1.0));
  }
  float term(std::size_t i) const { return b_ ? (*a_)[i] * (*b_)[i] : (*a_)[i]; }

  // Terms idx[lo, hi) one after another into acc.
  float run(std::size_t lo, std::size_t hi, float acc) const {
    for (std::size_t k = lo; k < hi; ++k) {
      const std::size_t i = idx_[k];
      acc = o_.fma && b_ ? std::fma((*a_)[i], (*b_)[i], acc) : acc + term(i);
    }
    return acc;
  }

  float tree(std::size_t lo, std::size_t hi) {
    if (hi - lo == 1) return term(idx_[lo]);
    if (hi - lo == 2 && o_.fma && b_) return std::fma((*a_)[idx_[lo]], (*b_)[idx_[lo]], term(idx_[lo + 1]));
    std::size_t mid = lo + (hi - lo) / 2;
    if (o_.kind == Kind::tree) mid = lo + 1 + random_u64(o_.key, salt_, node_++) % (hi - lo - 1);
    const float left = tree(lo, mid);
    return left + tree(mid, hi);
  }

  Order o_;
  std::uint64_t salt_;
  std::uint64_t node_ = 0;
  const std::vector<float>* a_ = nullptr;
  const std::vector<float>* b_ = nullptr;
  std::vector<std::size_t> idx_;
};

std::uint64_t salt_of(int phase, std::size_t x, std::size_t y, std::size_t z) {
  return ((static_cast<std::uint64_t>(phase) * 1'000'003 + x) * 1'000'003 + y) * 1'000'003 + z;
}

// ---- the float32 MLP, evaluated in a plan's orders ---------------------------------------------------

class Evaluator {
 public:
  Evaluator(const ModelConfig& model, const std::vector<float>& params, const Plan& plan)
      : model_(model), layout_(model), params_(params), plan_(plan) {}

  // grads = (accumulated) + scale * d(mean loss over the batch)/d(params).
  void micro_batch(const Batch& batch, float scale, std::vector<float>& grads) {
    const int L = model_.layers();
    const auto n = static_cast<std::size_t>(batch.size);
    if (n == 0) return;
    // Forward, keeping every layer's input and pre-activation.
    std::vector<std::vector<std::vector<float>>> in(static_cast<std::size_t>(L)), z(static_cast<std::size_t>(L));
    std::vector<std::vector<float>> a(n);
    for (std::size_t k = 0; k < n; ++k)
      a[k].assign(batch.x.begin() + static_cast<std::ptrdiff_t>(k * static_cast<std::size_t>(batch.in_dim)),
                  batch.x.begin() + static_cast<std::ptrdiff_t>((k + 1) * static_cast<std::size_t>(batch.in_dim)));
    for (int l = 0; l < L; ++l) {
      const auto li = static_cast<std::size_t>(l);
      in[li] = a;
      z[li].assign(n, std::vector<float>(static_cast<std::size_t>(out_dim(l))));
      for (std::size_t k = 0; k < n; ++k)
        for (int j = 0; j < out_dim(l); ++j) {
          Summer sum(plan_.order[forward_phase], salt_of(forward_phase, li, k, static_cast<std::size_t>(j)));
          z[li][k][static_cast<std::size_t>(j)] = sum(a[k], weight_row(l, j), bias(l, j), true);
        }
      if (l + 1 < L)
        for (std::size_t k = 0; k < n; ++k) {
          a[k].resize(z[li][k].size());
          for (std::size_t j = 0; j < a[k].size(); ++j) a[k][j] = activate(z[li][k][j]);
        }
    }

    // delta = scale * d(mean loss)/d(output), with the micro-batch's weight in it or applied later.
    const float weight = plan_.scale_after ? 1.0f : scale;
    std::vector<std::vector<float>> delta = output_delta(z.back(), batch, weight);

    // Backward.
    for (int l = L - 1; l >= 0; --l) {
      const auto li = static_cast<std::size_t>(l);
      const int out = out_dim(l), fan_in = model_.dims[li];
      const Slice& ws = layout_.weight(l);
      const Slice& bs = layout_.bias(l);
      for (int j = 0; j < out; ++j) {
        std::vector<float> dj(n);
        for (std::size_t k = 0; k < n; ++k) dj[k] = delta[k][static_cast<std::size_t>(j)];
        for (int i = 0; i < fan_in; ++i) {
          std::vector<float> ai(n);
          for (std::size_t k = 0; k < n; ++k) ai[k] = in[li][k][static_cast<std::size_t>(i)];
          float& g = grads[ws.offset + static_cast<std::size_t>(j * fan_in + i)];
          g = accumulate(g, dj, ai, scale, weight_grad_phase, li, static_cast<std::size_t>(j),
                         static_cast<std::size_t>(i));
        }
        float& gb = grads[bs.offset + static_cast<std::size_t>(j)];
        gb = accumulate(gb, dj, {}, scale, bias_grad_phase, li, static_cast<std::size_t>(j), 0);
      }
      if (l == 0) break;
      std::vector<std::vector<float>> next(n, std::vector<float>(static_cast<std::size_t>(fan_in)));
      for (std::size_t k = 0; k < n; ++k)
        for (int i = 0; i < fan_in; ++i) {
          Summer sum(plan_.order[backprop_phase], salt_of(backprop_phase, li, k, static_cast<std::size_t>(i)));
          const float h = sum(delta[k], weight_column(l, i), 0.0f, false);
          const float zv = z[li - 1][k][static_cast<std::size_t>(i)];
          next[k][static_cast<std::size_t>(i)] = derivative_times(h, zv);
        }
      delta = std::move(next);
    }
  }

 private:
  int out_dim(int l) const { return model_.dims[static_cast<std::size_t>(l) + 1]; }
  std::vector<float> weight_row(int l, int j) const {
    const Slice& s = layout_.weight(l);
    const auto fan_in = static_cast<std::size_t>(model_.dims[static_cast<std::size_t>(l)]);
    const auto first = params_.begin() + static_cast<std::ptrdiff_t>(s.offset + static_cast<std::size_t>(j) * fan_in);
    return {first, first + static_cast<std::ptrdiff_t>(fan_in)};
  }
  std::vector<float> weight_column(int l, int i) const {
    const Slice& s = layout_.weight(l);
    const auto fan_in = static_cast<std::size_t>(model_.dims[static_cast<std::size_t>(l)]);
    std::vector<float> c(static_cast<std::size_t>(out_dim(l)));
    for (std::size_t j = 0; j < c.size(); ++j) c[j] = params_[s.offset + j * fan_in + static_cast<std::size_t>(i)];
    return c;
  }
  float bias(int l, int j) const { return params_[layout_.bias(l).offset + static_cast<std::size_t>(j)]; }

  float activate(float v) const {
    switch (model_.activation) {
      case Activation::relu: return v > 0.0f ? v : 0.0f;
      case Activation::tanh: return std::tanh(v);
      case Activation::identity: return v;
    }
    return v;
  }
  float derivative_times(float h, float zv) const {
    switch (model_.activation) {
      case Activation::relu: return zv > 0.0f ? h : 0.0f;
      case Activation::tanh: {
        const float t = std::tanh(zv);
        return h * (1.0f - t * t);
      }
      case Activation::identity: return h;
    }
    return h;
  }

  std::vector<std::vector<float>> output_delta(const std::vector<std::vector<float>>& z, const Batch& batch,
                                               float scale) {
    const std::size_t n = z.size(), d = z.empty() ? 0 : z[0].size();
    std::vector<std::vector<float>> delta(n, std::vector<float>(d));
    if (model_.loss == Loss::mse) {
      const auto c = static_cast<float>(2.0 * scale / (static_cast<double>(n) * static_cast<double>(d)));
      for (std::size_t k = 0; k < n; ++k)
        for (std::size_t j = 0; j < d; ++j) delta[k][j] = (z[k][j] - batch.y[k * d + j]) * c;
      return delta;
    }
    const auto c = static_cast<float>(scale / static_cast<double>(n));
    for (std::size_t k = 0; k < n; ++k) {
      const float m = *std::max_element(z[k].begin(), z[k].end());
      std::vector<float> e(d);
      for (std::size_t j = 0; j < d; ++j) e[j] = std::exp(z[k][j] - m);
      Summer sum(plan_.order[softmax_phase], salt_of(softmax_phase, k, 0, 0));
      const float s = sum(e, {}, 0.0f, false);
      const auto label = static_cast<std::size_t>(batch.labels[k]);
      for (std::size_t j = 0; j < d; ++j) delta[k][j] = (e[j] / s - (j == label ? 1.0f : 0.0f)) * c;
    }
    return delta;
  }

  // The accumulated value plus this micro-batch's sum of terms (times its weight when applied to the
  // gradient): summed apart and added, or in place with the accumulated value as the running sum.
  float accumulate(float acc, const std::vector<float>& a, const std::vector<float>& b, float scale, int phase,
                   std::size_t l, std::size_t j, std::size_t i) const {
    Summer sum(plan_.order[phase], salt_of(phase, l, j, i));
    if (plan_.scale_after) return acc + sum(a, b, 0.0f, false) * scale;
    if (plan_.accumulate_in_place) return sum(a, b, acc, true);
    return acc + sum(a, b, 0.0f, false);
  }

  const ModelConfig& model_;
  ParamLayout layout_;
  const std::vector<float>& params_;
  const Plan& plan_;
};

// The gradient of the batch split among `shares` ranks (contiguous, sizes as array_split) and each
// share into `micro` micro-batches, weighted as the trainer weights them, then all-reduced.
std::vector<float> evaluate(const AnyOrderCase& c, const std::vector<float>& params, const Batch& batch,
                            const Plan& plan, int shares, int micro) {
  const std::size_t count = params.size();
  std::vector<std::vector<float>> local(static_cast<std::size_t>(shares), std::vector<float>(count, 0.0f));
  Evaluator ev(c.model, params, plan);
  std::int64_t offset = 0;
  const std::vector<std::int64_t> share_sizes = split_sizes(batch.size, shares);
  for (int r = 0; r < shares; ++r) {
    const std::int64_t b = share_sizes[static_cast<std::size_t>(r)];
    const double share_weight = static_cast<double>(b) * shares / static_cast<double>(batch.size);
    std::int64_t micro_offset = offset;
    for (std::int64_t n : split_sizes(b, micro)) {
      if (n == 0) continue;
      const auto scale = static_cast<float>(share_weight * static_cast<double>(n) / static_cast<double>(b));
      ev.micro_batch(batch.slice(micro_offset, micro_offset + n), scale, local[static_cast<std::size_t>(r)]);
      micro_offset += n;
    }
    offset += b;
  }
  std::vector<float> out(count);
  const auto inverse = static_cast<float>(1.0 / shares);
  for (std::size_t i = 0; i < count; ++i) {
    std::vector<float> parts(static_cast<std::size_t>(shares));
    for (std::size_t r = 0; r < parts.size(); ++r) parts[r] = local[r][i];
    Summer sum(plan.order[allreduce_phase], salt_of(allreduce_phase, i, 0, 0));
    const float total = sum(parts, {}, 0.0f, false);
    out[i] = plan.reciprocal_avg ? total * inverse : total / static_cast<float>(shares);
  }
  return out;
}

}  // namespace

std::string AnyOrderCase::describe() const {
  std::ostringstream os;
  os << "model " << dims_string(model.dims) << " " << activation_name(model.activation) << " " << loss_name(model.loss)
     << " | batch " << batch << " | " << shares << (shares == 1 ? " share" : " shares") << " of " << micro
     << " micro-batches | inputs "
     << (spread == 0  ? std::string("synthetic")
         : spread > 0 ? "spread 2^+-" + std::to_string(spread)
                      : "tiny 2^" + std::to_string(spread - 25) + "..2^" + std::to_string(spread))
     << (near_kink ? " | a unit at its kink" : "") << " | " << orders << " orders | seed " << seed;
  return os.str();
}

void showValue(const AnyOrderCase& c, std::ostream& os) { os << c.describe(); }

rc::Gen<AnyOrderCase> gen_any_order_case() {
  return rc::gen::exec([] {
    // The same draws in the same order every case, the widths last (see gen_scenario).
    AnyOrderCase c;
    c.model.activation = *rc::gen::element(Activation::relu, Activation::tanh, Activation::identity);
    c.model.loss = *rc::gen::element(Loss::mse, Loss::cross_entropy);
    c.batch = *rc::gen::inRange<std::int64_t>(1, 13);
    c.shares = *rc::gen::inRange(1, 5);
    c.micro = *rc::gen::inRange(1, 4);
    c.spread = *rc::gen::element(0, 0, 4, 24, -115);
    const bool kink = *rc::gen::element(false, true);
    c.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
    const int layers = *rc::gen::inRange(1, 4);
    std::vector<int> widths(4);
    for (int& w : widths) w = *rc::gen::inRange(1, 7);
    c.model.dims.assign(widths.begin(), widths.begin() + layers + 1);
    c.near_kink = kink && c.model.activation == Activation::relu && layers > 1;
    return c;
  });
}

std::vector<float> any_order_params(const AnyOrderCase& c) {
  std::vector<float> params = init_params(c.model, c.seed);
  if (!c.near_kink) return params;
  // The first layer's unit 0 gets the bias that cancels example 0's dot product (rounded to float32),
  // so that its pre-activation there is within rounding of 0 and float paths may take either side.
  const Batch b = any_order_batch(c);
  const ParamLayout layout(c.model);
  const Slice& w = layout.weight(0);
  double dot = 0;
  for (int i = 0; i < c.model.dims[0]; ++i)
    dot += static_cast<double>(params[w.offset + static_cast<std::size_t>(i)]) *
           static_cast<double>(b.x[static_cast<std::size_t>(i)]);
  params[layout.bias(0).offset] = static_cast<float>(-dot);
  return params;
}

Batch any_order_batch(const AnyOrderCase& c) {
  const SyntheticDataset data(c.batch, c.model, c.seed);
  std::vector<std::int64_t> idx(static_cast<std::size_t>(c.batch));
  std::iota(idx.begin(), idx.end(), std::int64_t{0});
  Batch b = data.gather(idx);
  if (c.spread != 0) {
    // Full 24-bit mantissas, random signs, exponents spread over [lo, hi].
    const int lo = c.spread > 0 ? -c.spread : c.spread - 25, hi = c.spread > 0 ? c.spread : c.spread;
    const std::uint64_t key = mix_key(c.seed, 0x5B7EAD);
    for (std::size_t i = 0; i < b.x.size(); ++i) {
      const std::uint64_t r = random_u64(key, 0, i);
      const auto mantissa = static_cast<float>((r & 0xFFFFFF) | 0x800000) * 0x1p-24f;
      const int exponent = lo + static_cast<int>((r >> 24) % static_cast<std::uint64_t>(hi - lo + 1));
      b.x[i] = std::ldexp((r >> 40) & 1 ? -mantissa : mantissa, exponent);
    }
  }
  return b;
}

AnyOrderOutcome check_any_order(const AnyOrderCase& c, const reference::BoundOptions& options) {
  const std::vector<float> params = any_order_params(c);
  const Batch batch = any_order_batch(c);
  const reference::GradientBound bound = reference::gradient_bound(c.model, params, batch, options);
  const ParamLayout layout(c.model);
  AnyOrderOutcome o;
  o.uncertain_units = bound.uncertain_units;
  std::int64_t largest_share = 0;
  for (std::int64_t b : split_sizes(c.batch, c.shares)) largest_share = std::max(largest_share, b);
  const std::int64_t m_whole = reference::whole_batch_roundings(c.batch, options);
  const std::int64_t m_sharded = reference::sharded_roundings(largest_share, c.shares, options);
  for (int e = 0; e < c.orders; ++e) {
    const Plan plan = draw_plan(c.seed, e);
    for (const bool sharded : {false, true}) {
      const std::vector<float> g =
          sharded ? evaluate(c, params, batch, plan, c.shares, c.micro) : evaluate(c, params, batch, plan, 1, 1);
      const std::int64_t m = sharded ? m_sharded : m_whole;
      const reference::Comparison cmp = reference::compare(g, bound, m);
      // The same comparison with the elements that carry a kink term taken out (set to the value
      // their reference rounds to, which compare scores as rounding).
      std::vector<float> plain = g;
      for (std::size_t i = 0; i < g.size(); ++i)
        if (bound.kink[i] > 0) plain[i] = static_cast<float>(bound.reference.grad[i]);
      double& rounding = o.rounding_ratio[sharded ? 1 : 0];
      rounding = std::max(rounding, reference::compare(plain, bound, m).max_ratio);
      if (cmp.max_ratio <= o.max_ratio && !(o.worst.empty() && e == 0 && !sharded)) continue;
      o.max_ratio = cmp.max_ratio;
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s gradient at %s: float32 %.9g, float64 %.17g, error ratio %.6g (gamma_%lld); ",
                    sharded ? "sharded" : "whole-batch", layout.describe_element(cmp.worst).c_str(), cmp.worst_value,
                    cmp.worst_reference, cmp.max_ratio, static_cast<long long>(m));
      o.worst = buf + bound.terms(cmp.worst, m).describe() + "; orders: " + plan.describe();
    }
  }
  o.passed = o.max_ratio <= 1.0;
  return o;
}

void any_order_body(const Target& target, const CaseDraw& /*draw*/, CaseRecord& record) {
  const AnyOrderCase c = *gen_any_order_case();
  // The evaluations are plain float32 whatever the target's engine: the float32 model, with the
  // target's mutant (which may drop a term of the bound).
  reference::BoundOptions options;
  options.uncertain_kinks = bound_options(target).uncertain_kinks;
  options.looseness = bound_options(target).looseness;
  record.size = {c.batch, c.shares, c.model.layers(), *std::max_element(c.model.dims.begin(), c.model.dims.end())};
  const AnyOrderOutcome o = check_any_order(c, options);
  record.ratio = o.max_ratio;
  record.note = o.worst;
  record.tightness[0] = o.rounding_ratio[0];
  record.tightness[1] = o.rounding_ratio[1];
  RC_CLASSIFY(o.uncertain_units > 0, "a ReLU within rounding of its kink");
  RC_CLASSIFY(c.spread > 0, "inputs spread over many binades");
  RC_CLASSIFY(c.spread < 0, "subnormal inputs");
  if (!agree(target, o.passed)) fail_case("a correct float32 evaluation leaves the bound: " + o.worst);
}

}  // namespace dpcheck
