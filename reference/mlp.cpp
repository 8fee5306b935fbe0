#include "reference/mlp.hpp"

#include <algorithm>
#include <cmath>

namespace dpcheck::reference {

double round_to_format(double v, Precision format) {
  if (format == Precision::fp32 || v == 0 || !std::isfinite(v)) return v;
  // Significant bits, the exponent of the smallest subnormal's spacing, and the largest finite value.
  const int bits = format == Precision::bf16 ? 8 : 11;
  const int min_quantum = format == Precision::bf16 ? -133 : -24;
  const double largest = format == Precision::bf16 ? 0x1.FEp127 : 65504.0;
  int e = 0;
  std::frexp(v, &e);  // |v| = m 2^e, m in [0.5, 1): the spacing of a `bits`-bit significand is 2^(e - bits)
  const int quantum = std::max(e - bits, min_quantum);
  const double r = std::ldexp(std::nearbyint(std::ldexp(v, -quantum)), quantum);  // the default mode: ties to even
  // Beyond the largest finite value, halfway to the next power of two's ulp rounds up to infinity.
  const double overflow = largest + std::ldexp(1.0, (format == Precision::bf16 ? 127 : 15) - bits);
  if (std::abs(v) >= overflow) return std::copysign(INFINITY, v);
  return r;
}

template <class T> std::vector<Matrix<T>> weights(const ModelConfig& model, std::span<const float> params) {
  const ParamLayout layout(model);
  std::vector<Matrix<T>> w;
  for (int l = 0; l < model.layers(); ++l) {
    const Slice& s = layout.weight(l);
    Matrix<T> m(s.shape[0], s.shape[1]);
    for (Eigen::Index i = 0; i < m.rows(); ++i)
      for (Eigen::Index j = 0; j < m.cols(); ++j)
        m(i, j) = static_cast<T>(params[s.offset + static_cast<std::size_t>(i * m.cols() + j)]);
    w.push_back(std::move(m));
  }
  return w;
}

template <class T> std::vector<RowVector<T>> biases(const ModelConfig& model, std::span<const float> params) {
  const ParamLayout layout(model);
  std::vector<RowVector<T>> b;
  for (int l = 0; l < model.layers(); ++l) {
    const Slice& s = layout.bias(l);
    RowVector<T> v(s.shape[0]);
    for (Eigen::Index i = 0; i < v.size(); ++i) v(i) = static_cast<T>(params[s.offset + static_cast<std::size_t>(i)]);
    b.push_back(std::move(v));
  }
  return b;
}

namespace {

template <class T> T activation(Activation act, T z) {
  switch (act) {
    case Activation::relu: return z > 0 ? z : T(0);
    case Activation::tanh: return std::tanh(z);
    case Activation::identity: return z;
  }
  return z;
}

// d act / dz, written in terms of z (PyTorch's relu has derivative 0 at 0).
template <class T> T activation_derivative(Activation act, T z) {
  switch (act) {
    case Activation::relu: return z > 0 ? T(1) : T(0);
    case Activation::tanh: return 1 - std::tanh(z) * std::tanh(z);
    case Activation::identity: return T(1);
  }
  return T(1);
}

}  // namespace

namespace {

// R of the header: the matrix rounded to the format (at `scale`: R(scale m) / scale), or as it is.
template <class T> Matrix<T> product_input(const Matrix<T>& m, const ProductRounding& r, double scale = 1) {
  if (!r.active()) return m;
  return m.unaryExpr(
      [&](T v) { return static_cast<T>(round_to_format(static_cast<double>(v) * scale, r.format) / scale); });
}

}  // namespace

template <class T> Gradient<T> loss_and_gradient(const ModelConfig& model, std::span<const float> params,
                                                 const Batch& batch, const ProductRounding& rounding) {
  const ParamLayout layout(model);
  Gradient<T> out;
  out.grad.assign(layout.size(), T(0));
  const Eigen::Index B = batch.size;
  if (B == 0) return out;
  const int L = model.layers();
  std::vector<Matrix<T>> W = weights<T>(model, params);
  for (Matrix<T>& w : W) w = product_input(w, rounding);
  const std::vector<RowVector<T>> b = biases<T>(model, params);
  const Eigen::Index D = model.out_dim();

  // The examples a chunk at a time (kReferenceChunk), each chunk's gradient added to the sum: the memory
  // of a chunk's activations, whatever the batch. Every scale (1 / B) is the whole batch's.
  for (Eigen::Index k0 = 0; k0 < B; k0 += kReferenceChunk) {
    const Eigen::Index C = std::min<Eigen::Index>(kReferenceChunk, B - k0);
    // Forward. a[0] is the input; z[l] and a[l] belong to layer l (1-based).
    std::vector<Matrix<T>> a(static_cast<std::size_t>(L) + 1), z(static_cast<std::size_t>(L) + 1);
    a[0] = Matrix<T>(C, model.in_dim());
    for (Eigen::Index k = 0; k < C; ++k)
      for (Eigen::Index j = 0; j < a[0].cols(); ++j)
        a[0](k, j) = static_cast<T>(batch.x[static_cast<std::size_t>((k0 + k) * a[0].cols() + j)]);
    for (std::size_t l = 1; l <= static_cast<std::size_t>(L); ++l) {
      z[l] = product_input(a[l - 1], rounding) * W[l - 1].transpose();
      z[l].rowwise() += b[l - 1];
      a[l] = l < static_cast<std::size_t>(L)
                 ? Matrix<T>(z[l].unaryExpr([&](T v) { return activation(model.activation, v); }))
                 : z[l];
    }

    // Loss and delta = dL/dz at the output.
    const Matrix<T>& out_z = z[static_cast<std::size_t>(L)];
    Matrix<T> delta(C, D);
    if (model.loss == Loss::mse) {
      for (Eigen::Index k = 0; k < C; ++k)
        for (Eigen::Index j = 0; j < D; ++j) {
          const T e = out_z(k, j) - static_cast<T>(batch.y[static_cast<std::size_t>((k0 + k) * D + j)]);
          out.loss += e * e;
          delta(k, j) = 2 * e / static_cast<T>(B * D);
        }
    } else {
      for (Eigen::Index k = 0; k < C; ++k) {
        const T m = out_z.row(k).maxCoeff();
        T s = 0;
        for (Eigen::Index j = 0; j < D; ++j) s += std::exp(out_z(k, j) - m);
        const T logsumexp = m + std::log(s);
        const auto label = static_cast<Eigen::Index>(batch.labels[static_cast<std::size_t>(k0 + k)]);
        out.loss += logsumexp - out_z(k, label);
        for (Eigen::Index j = 0; j < D; ++j)
          delta(k, j) = (std::exp(out_z(k, j) - logsumexp) - (j == label ? T(1) : T(0))) / static_cast<T>(B);
      }
    }

    // Backward.
    for (std::size_t l = static_cast<std::size_t>(L); l >= 1; --l) {
      const Matrix<T> rounded_delta = product_input(delta, rounding, rounding.delta_scale);
      const Matrix<T> gw = rounded_delta.transpose() * product_input(a[l - 1], rounding);
      const RowVector<T> gb = delta.colwise().sum();
      const Slice& ws = layout.weight(static_cast<int>(l) - 1);
      const Slice& bs = layout.bias(static_cast<int>(l) - 1);
      for (Eigen::Index i = 0; i < gw.rows(); ++i)
        for (Eigen::Index j = 0; j < gw.cols(); ++j)
          out.grad[ws.offset + static_cast<std::size_t>(i * gw.cols() + j)] += gw(i, j);
      for (Eigen::Index i = 0; i < gb.size(); ++i) out.grad[bs.offset + static_cast<std::size_t>(i)] += gb(i);
      if (l > 1) {
        const Matrix<T> h = rounded_delta * W[l - 1];
        delta = h.binaryExpr(z[l - 1], [&](T hv, T zv) { return hv * activation_derivative(model.activation, zv); });
      }
    }
  }
  out.loss /= model.loss == Loss::mse ? static_cast<T>(B * D) : static_cast<T>(B);
  return out;
}

template std::vector<Matrix<float>> weights<float>(const ModelConfig&, std::span<const float>);
template std::vector<Matrix<double>> weights<double>(const ModelConfig&, std::span<const float>);
template std::vector<RowVector<float>> biases<float>(const ModelConfig&, std::span<const float>);
template std::vector<RowVector<double>> biases<double>(const ModelConfig&, std::span<const float>);
template Gradient<float> loss_and_gradient<float>(const ModelConfig&, std::span<const float>, const Batch&,
                                                  const ProductRounding&);
template Gradient<double> loss_and_gradient<double>(const ModelConfig&, std::span<const float>, const Batch&,
                                                    const ProductRounding&);

}  // namespace dpcheck::reference
