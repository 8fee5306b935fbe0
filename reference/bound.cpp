#include "reference/bound.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "src/error.hpp"

namespace dpcheck::reference {

namespace {

using M = Matrix<double>;

enum class Kink : unsigned char { active, inactive, uncertain };

// A product input rounded to the low format (bound.hpp, "Mixed precision"): each value v of `value`,
// with bound E of `error`, becomes R(v) with bound 0 when v - E and v + E round alike, else with bound
// R(v + E) - R(v - E). At `scale` the rounding is R(scale v) / scale. The bound is widened by a few
// float64 ulps of v, since the reference and this pass evaluate v in float64 in their own orders.
struct RoundedInput {
  Matrix<double> value, error;
};

RoundedInput round_input(const Matrix<double>& value, const Matrix<double>& error, const ProductRounding& r,
                         double scale, std::int64_t& uncertain) {
  if (!r.active()) return {value, error};
  RoundedInput out{Matrix<double>(value.rows(), value.cols()), Matrix<double>(value.rows(), value.cols())};
  for (Eigen::Index i = 0; i < value.size(); ++i) {
    const double v = value.data()[i] * scale;
    // Exact values (the weights, the inputs) are rounded as they are; a computed one's window is widened
    // by a few float64 ulps of v (the two evaluations' own difference) and 16u of its bound (second-order
    // terms the first-order bound leaves out).
    const double e0 = error.data()[i] * scale;
    const double e = e0 > 0 ? e0 * (1 + 0x1p-20) + std::abs(v) * 0x1p-48 : 0.0;
    const double lo = round_to_format(v - e, r.format), hi = round_to_format(v + e, r.format);
    out.value.data()[i] = round_to_format(v, r.format) / scale;
    if (lo == hi) {
      out.error.data()[i] = 0;
    } else {
      out.error.data()[i] = (hi - lo) / scale;
      ++uncertain;
    }
  }
  return out;
}

// Forward state of one layer for every example: value, error bound, and for a ReLU which side of the
// kink each unit is certainly on.
struct LayerState {
  M z, ez;                 // pre-activation and its error bound
  M a, ea;                 // activation and its error bound (unused for the output layer)
  std::vector<Kink> kink;  // ReLU only, row-major like z
};

}  // namespace

double gamma(std::int64_t n, double u) {
  const double nu = static_cast<double>(n) * u;
  return nu < 1.0 ? nu / (1.0 - nu) : std::numeric_limits<double>::infinity();
}

double gamma_probabilistic(std::int64_t n, double u, double failure_probability) {
  if (n <= 0) return 0.0;
  const double nn = static_cast<double>(n);
  const double lambda = std::sqrt(2.0 * std::log(2.0 * nn / failure_probability)) / (1.0 - u);
  return std::expm1(lambda * std::sqrt(nn) * u + nn * u * u / (1.0 - u));
}

double gamma_for(std::int64_t n, const BoundOptions& options) {
  const double worst = gamma(n, options.unit_roundoff);
  // For short sums (n below about lambda^2, some 50 terms at 1e-9) the probabilistic gamma is the larger;
  // the worst case holds always, so the smaller of the two is still a bound with that probability.
  return options.failure_probability > 0
             ? std::min(worst, gamma_probabilistic(n, options.unit_roundoff, options.failure_probability))
             : worst;
}

std::string BoundTerms::describe() const {
  const double t = total();
  const auto pct = [t](double v) { return t > 0 ? 100.0 * v / t : 0.0; };
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "bound %.3g = %.1f%% kink (whole contribution of units within rounding of a ReLU kink) + %.1f%% "
                "carried from other layers + %.1f%% the reduction's own rounding + %.1f%% floor",
                t, pct(kink), pct(propagated - kink), pct(rounding), pct(floor));
  return buf;
}

std::int64_t whole_batch_roundings(std::int64_t batch, const BoundOptions& options) {
  return batch + options.slack_roundings + options.product_input_roundings;
}

std::int64_t sharded_roundings(std::int64_t largest_share, int world_size, const BoundOptions& options) {
  return largest_share + world_size + options.slack_roundings + options.product_input_roundings;
}

double GradientBound::bound(std::size_t i, std::int64_t m) const { return terms(i, m).total(); }

BoundTerms GradientBound::terms(std::size_t i, std::int64_t m) const {
  // Each of the m roundings may also underflow.
  const double k = options.looseness;
  const double g = gamma_for(m, options);
  const double low = gamma(options.allreduce_roundings, options.unit_roundoff);
  // A bf16 all-reduce's N + 1 roundings may each fall below bf16's normal range: (N + 1) 2^-134 more,
  // which is allreduce_roundings (2^16 (N + 1)) times 2^-150.
  const double low_underflow = static_cast<double>(options.allreduce_roundings) * 0x1p-150;
  return {
      k * propagated[i], k * kink[i],
      k * ((g + low * (1 + g)) * magnitude[i] + 2.0 * static_cast<double>(m) * options.underflow_unit + low_underflow),
      k * floor[i]};
}

GradientBound gradient_bound(const ModelConfig& model, std::span<const float> params, const Batch& batch,
                             const BoundOptions& options) {
  const double u = options.unit_roundoff;
  const ParamLayout layout(model);
  GradientBound out;
  out.options = options;
  const ProductRounding rounding{options.input_format, options.delta_scale};
  out.reference = loss_and_gradient<double>(model, params, batch, rounding);
  out.propagated.assign(layout.size(), 0.0);
  out.kink.assign(layout.size(), 0.0);
  out.magnitude.assign(layout.size(), 0.0);
  out.floor.assign(layout.size(), 0.0);
  out.loss = out.reference.loss;
  const Eigen::Index B = batch.size;
  if (B == 0) return out;
  const auto g = [&options](std::int64_t n) { return gamma_for(n, options); };
  // A loss scale below 1 makes the backward pass's values smaller, and float32 underflow relatively larger
  // once unscaled.
  const double eta = options.underflow_unit / std::min(1.0, options.delta_scale);

  const int L = model.layers();
  std::vector<M> W = weights<double>(model, params);
  for (M& w : W) w = round_input(w, M::Zero(w.rows(), w.cols()), rounding, 1, out.uncertain_roundings).value;
  const std::vector<RowVector<double>> b = biases<double>(model, params);

  const Eigen::Index D = model.out_dim();
  // The loss's error carried from the outputs, and its magnitude, summed over the examples.
  double loss_carried = 0, loss_magnitude = 0;
  // The examples a chunk at a time (kReferenceChunk, as loss_and_gradient): the sums over examples add
  // up chunk by chunk; every scale (1 / B) and every count of roundings is the whole batch's.
  for (Eigen::Index k0 = 0; k0 < B; k0 += kReferenceChunk) {
    const Eigen::Index C = std::min<Eigen::Index>(kReferenceChunk, B - k0);
    // ---- forward: values and error bounds, layer by layer ----
    M x(C, model.in_dim());
    const std::size_t x_at = static_cast<std::size_t>(k0 * model.in_dim());
    for (Eigen::Index k = 0; k < x.size(); ++k)
      x.data()[k] = static_cast<double>(batch.x[x_at + static_cast<std::size_t>(k)]);
    std::vector<LayerState> s(static_cast<std::size_t>(L));
    // Per layer, the product's input as the engine's product sees it (rounded, with mixed precision).
    std::vector<RoundedInput> in(static_cast<std::size_t>(L));
    for (std::size_t l = 0; l < static_cast<std::size_t>(L); ++l) {
      in[l] = round_input(l == 0 ? x : s[l - 1].a, l == 0 ? M::Zero(x.rows(), x.cols()) : s[l - 1].ea, rounding, 1,
                          out.uncertain_roundings);
      const M& a_in = in[l].value;
      const M& ea_in = in[l].error;
      const M absW = W[l].cwiseAbs();
      LayerState& st = s[l];
      st.z = a_in * W[l].transpose();
      st.z.rowwise() += b[l];
      // Terms of the float dot product (plus the bias), bounded by |a^| <= |a| + E_a.
      M terms = (a_in.cwiseAbs() + ea_in) * absW.transpose();
      terms.rowwise() += b[l].cwiseAbs();
      const auto fan_in = static_cast<std::int64_t>(W[l].cols());
      st.ez = ea_in * absW.transpose() + g(fan_in + 1 + options.product_input_roundings) * terms;
      st.ez.array() += 2.0 * static_cast<double>(fan_in + 1) * eta;  // each product and sum may underflow
      if (static_cast<int>(l) + 1 == L) break;

      st.a.resize(st.z.rows(), st.z.cols());
      st.ea.resize(st.z.rows(), st.z.cols());
      if (model.activation == Activation::relu) st.kink.resize(static_cast<std::size_t>(st.z.size()));
      for (Eigen::Index i = 0; i < st.z.size(); ++i) {
        const double z = st.z.data()[i], ez = st.ez.data()[i];
        double& a = st.a.data()[i];
        double& ea = st.ea.data()[i];
        switch (model.activation) {
          case Activation::relu: {
            const Kink k = z > ez ? Kink::active : z < -ez ? Kink::inactive : Kink::uncertain;
            st.kink[static_cast<std::size_t>(i)] = k;
            if (k == Kink::uncertain) ++out.uncertain_units;
            a = z > 0 ? z : 0.0;
            ea = k == Kink::inactive ? 0.0 : ez;  // ReLU is 1-Lipschitz
            break;
          }
          case Activation::tanh: {
            a = std::tanh(z);
            // Largest derivative on [z - ez, z + ez]: at the point nearest 0.
            const double t = std::tanh(std::max(0.0, std::abs(z) - ez));
            const double slope = 1.0 - t * t;
            ea = slope * ez + options.tanh_error * u * (std::abs(a) + slope * ez) + eta;
            break;
          }
          case Activation::identity:
            a = z;
            ea = ez;
            break;
        }
      }
    }

    // ---- loss: delta = dL/dz at the output and its bound ----
    const LayerState& last = s.back();
    M delta(C, D), edelta(C, D);
    // The loss from the float32 outputs: their error carried through (per example), and the loss's own
    // roundings if it is evaluated in float32 (differences, squares or logsumexp, and sums over the D
    // outputs and the B examples, in any order).
    if (model.loss == Loss::mse) {
      const double c = 2.0 / (static_cast<double>(B) * static_cast<double>(D));
      for (Eigen::Index k = 0; k < C; ++k)
        for (Eigen::Index j = 0; j < D; ++j) {
          const double diff = last.z(k, j) - static_cast<double>(batch.y[static_cast<std::size_t>((k0 + k) * D + j)]);
          const double ez = last.ez(k, j);
          delta(k, j) = c * diff;
          edelta(k, j) = c * (ez + u * (std::abs(diff) + ez) + eta) + eta;  // the subtraction rounds once
          loss_carried += (2 * std::abs(diff) + ez) * ez;
          loss_magnitude += (std::abs(diff) + ez) * (std::abs(diff) + ez);
        }
    } else {
      const double inv_b = 1.0 / static_cast<double>(B);
      for (Eigen::Index k = 0; k < C; ++k) {
        const double m = last.z.row(k).maxCoeff();
        const double max_ez = last.ez.row(k).maxCoeff();
        double sum = 0.0;
        for (Eigen::Index j = 0; j < D; ++j) sum += std::exp(last.z(k, j) - m);
        // Relative rounding of exp's argument z - max (its own error grows with |z - max|), of exp, of the
        // sum of exps (weighted by each term's share p_j), and of the division.
        double sum_rel = g(D);
        std::vector<double> p(static_cast<std::size_t>(D)), arg_rel(static_cast<std::size_t>(D));
        for (Eigen::Index j = 0; j < D; ++j) {
          const auto jj = static_cast<std::size_t>(j);
          p[jj] = std::exp(last.z(k, j) - m) / sum;
          arg_rel[jj] = u * (std::abs(last.z(k, j) - m) + 2 * max_ez) + options.exp_error * u;
          sum_rel += p[jj] * arg_rel[jj];
        }
        const auto label = static_cast<Eigen::Index>(batch.labels[static_cast<std::size_t>(k0 + k)]);
        // logsumexp is 1-Lipschitz in the max norm, so the outputs' error moves it by at most max_ez; its
        // own roundings: the sum's relative error, log's, and the two additions (m - z[label]).
        const double lse = m + std::log(sum);
        double max_arg = 0;
        for (Eigen::Index j = 0; j < D; ++j) max_arg = std::max(max_arg, std::abs(last.z(k, j) - m));
        loss_carried += max_ez + last.ez(k, label);
        const double own = 1.01 * sum_rel + u * max_arg + u * std::abs(std::log(sum)) +
                           2 * u * (std::abs(lse) + std::abs(last.z(k, label)) + max_ez);
        loss_carried += own;
        loss_magnitude += std::abs(lse - last.z(k, label)) + own + max_ez + last.ez(k, label);
        for (Eigen::Index j = 0; j < D; ++j) {
          const auto jj = static_cast<std::size_t>(j);
          // softmax moves by at most a factor exp(|dz_j| + max|dz|) when the logits move.
          const double ep = p[jj] * std::expm1(last.ez(k, j) + max_ez + arg_rel[jj] + 1.01 * sum_rel + u);
          const double diff = p[jj] - (j == label ? 1.0 : 0.0);
          delta(k, j) = diff * inv_b;
          edelta(k, j) = (ep + u * (std::abs(diff) + ep) + 2 * eta) * inv_b + eta;
        }
      }
    }
    // With mixed precision the output delta is rounded, so its error must include the scale factor's: the
    // engine multiplies by a coefficient rounded from (loss scale, share and micro-batch weights) / n in
    // up to two roundings, and rounds the product once.
    if (rounding.active()) edelta += (3 * u) * delta.cwiseAbs();
    // The part of edelta that units within rounding of a ReLU kink contribute (none at the output).
    M edelta_kink = M::Zero(C, D);

    // ---- backward: gradient bounds, then delta for the layer below ----
    for (std::size_t l = static_cast<std::size_t>(L); l-- > 0;) {
      const M& a_in = in[l].value;
      const M& ea_in = in[l].error;
      // The products take delta rounded (at the loss scale); the bias gradient sums it as it is. A
      // rounding made certain leaves no error, but the kink share of what remains is kept as it was.
      const RoundedInput rd = round_input(delta, edelta, rounding, options.delta_scale, out.uncertain_roundings);
      const M& pdelta = rd.value;
      const M& pedelta = rd.error;
      const M pedelta_kink = rounding.active() ? pedelta.cwiseMin(edelta_kink) : edelta_kink;
      const M va = a_in.cwiseAbs() + ea_in;           // bounds |a^|
      const M vdelta = delta.cwiseAbs() + edelta;     // bounds |delta^|
      const M vpdelta = pdelta.cwiseAbs() + pedelta;  // bounds |R(delta)^|
      const M prop_w = pdelta.cwiseAbs().transpose() * ea_in + pedelta.transpose() * va;
      const M mag_w = vpdelta.transpose() * va;
      const RowVector<double> prop_b = edelta.colwise().sum();
      const RowVector<double> mag_b = vdelta.colwise().sum();
      const M kink_w = pedelta_kink.transpose() * va;
      const RowVector<double> kink_b = edelta_kink.colwise().sum();
      const Slice& ws = layout.weight(static_cast<int>(l));
      const Slice& bs = layout.bias(static_cast<int>(l));
      for (Eigen::Index i = 0; i < mag_w.size(); ++i) {
        out.propagated[ws.offset + static_cast<std::size_t>(i)] += prop_w.data()[i];
        out.kink[ws.offset + static_cast<std::size_t>(i)] += kink_w.data()[i];
        out.magnitude[ws.offset + static_cast<std::size_t>(i)] += mag_w.data()[i];
      }
      for (Eigen::Index i = 0; i < mag_b.size(); ++i) {
        out.propagated[bs.offset + static_cast<std::size_t>(i)] += prop_b(i);
        out.kink[bs.offset + static_cast<std::size_t>(i)] += kink_b(i);
        out.magnitude[bs.offset + static_cast<std::size_t>(i)] += mag_b(i);
      }
      if (l == 0) break;

      // h = delta W, a dot product over this layer's outputs; then the activation's derivative below.
      const M absW = W[l].cwiseAbs();
      const M h = pdelta * W[l];
      M eh = pedelta * absW + g(W[l].rows() + options.product_input_roundings) * (vpdelta * absW);
      eh.array() += 2.0 * static_cast<double>(W[l].rows()) * eta;
      const M eh_kink = pedelta_kink * absW;
      const LayerState& below = s[l - 1];
      M next(h.rows(), h.cols()), enext(h.rows(), h.cols()), enext_kink(h.rows(), h.cols());
      for (Eigen::Index i = 0; i < h.size(); ++i) {
        const double hv = h.data()[i], ehv = eh.data()[i], ehv_kink = eh_kink.data()[i];
        double& d = next.data()[i];
        double& e = enext.data()[i];
        double& ek = enext_kink.data()[i];
        switch (model.activation) {
          case Activation::relu: {
            Kink k = below.kink[static_cast<std::size_t>(i)];
            if (k == Kink::uncertain && !options.uncertain_kinks)
              k = below.z.data()[i] > 0 ? Kink::active : Kink::inactive;
            switch (k) {
              case Kink::active:
                d = hv;
                e = ehv;
                ek = ehv_kink;
                break;
              case Kink::inactive:
                d = 0.0;
                e = 0.0;
                ek = 0.0;
                break;
              // Either path may pass h or drop it: the whole contribution is uncertain.
              case Kink::uncertain:
                d = below.z.data()[i] > 0 ? hv : 0.0;
                e = std::abs(hv) + ehv;
                ek = e;
                break;
            }
            break;
          }
          case Activation::tanh: {
            const double a = below.a.data()[i], ea = below.ea.data()[i];
            const double va_i = std::abs(a) + ea;
            const double sv = 1.0 - a * a;
            const double esq = (2 * std::abs(a) + ea) * ea;  // |a^2 - a'^2|
            // 1 - a*a: the product and the subtraction each round once.
            const double es = esq + u * va_i * va_i + u * (std::abs(sv) + esq + u * va_i * va_i);
            d = hv * sv;
            e = std::abs(hv) * es + std::abs(sv) * ehv + ehv * es + u * (std::abs(hv) + ehv) * (std::abs(sv) + es) +
                3 * eta;
            ek = std::min(e, ehv_kink * (std::abs(sv) + es) * (1 + u));
            break;
          }
          case Activation::identity:
            d = hv;
            e = ehv;
            ek = ehv_kink;
            break;
        }
      }
      delta = std::move(next);
      edelta = std::move(enext);
      edelta_kink = std::move(enext_kink);
    }
  }
  if (model.loss == Loss::mse) {
    const double bd = static_cast<double>(B) * static_cast<double>(D);
    out.loss_bound =
        loss_carried / bd + g(D + B + 2) * loss_magnitude / bd + 2.0 * static_cast<double>(D + B + 2) * eta;
  } else {
    const double inv_b = 1.0 / static_cast<double>(B);
    out.loss_bound = loss_carried * inv_b + g(B) * loss_magnitude * inv_b + 2.0 * static_cast<double>(D + B + 4) * eta;
  }

  // The float64 reference is itself rounded (negligibly, but a bound should not pretend otherwise), and
  // float32 underflow loses up to one subnormal spacing per operation on the way.
  std::int64_t depth = B + 16;
  for (int d : model.dims) depth += d;
  const double ref_rel = gamma(depth, 0x1p-53) * 4;
  const double underflow = 8.0 * static_cast<double>(depth) * options.underflow_unit;
  for (std::size_t i = 0; i < out.floor.size(); ++i)
    out.floor[i] = ref_rel * (out.magnitude[i] + out.propagated[i]) + underflow;
  out.loss_bound += ref_rel * (std::abs(out.loss) + out.loss_bound) + underflow;
  // Where the magnitudes overflow (inf times a zero share gives NaN), the rounding is unbounded: say so
  // with infinity rather than a NaN that compares false with everything.
  const double inf = std::numeric_limits<double>::infinity();
  for (std::vector<double>* v : {&out.propagated, &out.kink, &out.magnitude, &out.floor})
    for (double& value : *v)
      if (std::isnan(value)) value = inf;
  if (std::isnan(out.loss_bound)) out.loss_bound = inf;
  return out;
}

Comparison compare(std::span<const float> grad, const GradientBound& bound, std::int64_t m, double scale) {
  DPCHECK_ASSERT(grad.size() == bound.reference.grad.size());
  Comparison c;
  for (std::size_t i = 0; i < grad.size(); ++i) {
    const double value = static_cast<double>(grad[i]) * scale;
    const double ref = bound.reference.grad[i];
    const double err = std::abs(value - ref);
    const double bnd = bound.bound(i, m);
    double ratio;
    if (!std::isfinite(value)) ratio = std::numeric_limits<double>::infinity();
    else if (err == 0.0 || std::isinf(bnd))
      ratio = 0.0;  // an infinite bound (magnitudes beyond double's range) claims nothing
    else ratio = bnd > 0 ? err / bnd : std::numeric_limits<double>::infinity();
    if (std::isfinite(err)) c.max_error = std::max(c.max_error, err);
    else c.max_error = std::numeric_limits<double>::infinity();
    if (i == 0 || ratio > c.max_ratio) {
      c.max_ratio = ratio;
      c.worst = i;
      c.worst_value = value;
      c.worst_reference = ref;
      c.worst_bound = bnd;
    }
  }
  return c;
}

}  // namespace dpcheck::reference
