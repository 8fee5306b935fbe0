// The reference MLP: the whole batch at once, in the textbook form, templated on the scalar so that
// the same lines run in float64 (what every check compares against) and float32. Written to be checked
// by eye against PyTorch's definitions, not to be fast:
//
//   z_l = a_{l-1} W_l^T + b_l,   a_l = act(z_l) (l < L),   output z_L
//   mse           L = mean over b and j of (z_L - y)^2             dL/dz_L = 2 (z_L - y) / (B * out)
//   cross-entropy L = mean over b of logsumexp(z_L) - z_L[label]   dL/dz_L = (softmax(z_L) - onehot) / B
//   dW_l = delta_l^T a_{l-1},   db_l = column sums of delta_l,   delta_{l-1} = (delta_l W_l) .* act'(z_{l-1})
//
// Mixed precision (autocast) is the same model with R, rounding to the low format, on every input of a
// matrix product:  z_l = R(a_{l-1}) R(W_l)^T + b_l,  dW_l = R(delta_l)^T R(a_{l-1}),
// delta_{l-1} = (R(delta_l) R(W_l)) .* act'(z_{l-1}); the bias gradient sums the unrounded delta. The
// backward pass runs on the loss times a scale (a loss scaler's), so delta is rounded as s delta.
#pragma once

#include <Eigen/Core>
#include <span>
#include <vector>

#include "src/low_precision.hpp"
#include "src/train/data.hpp"
#include "src/train/model.hpp"

namespace dpcheck::reference {

template <class T> using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T> using RowVector = Eigen::Matrix<T, 1, Eigen::Dynamic>;

template <class T> struct Gradient {
  T loss = 0;
  std::vector<T> grad;  // flat, in the parameter layout
};

// v rounded to the format, to nearest with ties to even, within the format's range (its subnormals
// included; beyond its largest finite value by half an ulp or more: an infinity). Computed in double
// with frexp and nearbyint, apart from the engine's bit-level conversion (src/low_precision.hpp), so
// that the two are not one piece of arithmetic on both sides of a check.
double round_to_format(double v, Precision format);

// How a matrix product's inputs are rounded: the format, and the loss scale the delta is rounded at.
struct ProductRounding {
  Precision format = Precision::fp32;
  double delta_scale = 1;
  bool active() const { return format != Precision::fp32; }
};

// Examples the reference (this gradient and the bound's, reference/bound.hpp) takes at a time: its memory
// is a chunk's activations, so that a simulated world's global batch of thousands costs no more.
inline constexpr Eigen::Index kReferenceChunk = 256;

// Mean loss and its gradient over the whole batch, with every operation in T. The float32 parameters
// and inputs convert to T exactly. An empty batch has loss 0 and gradient 0. With `rounding`, the
// products' inputs are rounded as above (their results, and everything else, are computed in T). The
// examples are taken kReferenceChunk at a time, each chunk's sums added to the total.
template <class T> Gradient<T> loss_and_gradient(const ModelConfig& model, std::span<const float> params,
                                                 const Batch& batch, const ProductRounding& rounding = {});

// The model's weights and biases as T matrices.
template <class T> std::vector<Matrix<T>> weights(const ModelConfig& model, std::span<const float> params);
template <class T> std::vector<RowVector<T>> biases(const ModelConfig& model, std::span<const float> params);

extern template Gradient<float> loss_and_gradient<float>(const ModelConfig&, std::span<const float>, const Batch&,
                                                         const ProductRounding&);
extern template Gradient<double> loss_and_gradient<double>(const ModelConfig&, std::span<const float>, const Batch&,
                                                           const ProductRounding&);

}  // namespace dpcheck::reference
