// The losses' gradients with respect to the output, scaled by c, and the per-row losses, in float64:
// the reference of kernels/loss.cu (test: tests/loss_test.cpp). reference/mlp.cpp computes the same
// inside the whole model, with c = 2 / (rows * cols) for mse and 1 / rows for cross-entropy.
//
//   mse            delta = c (z - y)                      row loss = sum over columns of (z - y)^2
//   cross-entropy  delta = c (softmax(z) - onehot(label))  row loss = logsumexp(z) - z[label]
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "reference/mlp.hpp"

namespace dpcheck::reference {

struct LossDelta {
  Matrix<double> delta;
  std::vector<double> row_loss;
};

LossDelta mse_delta(const Matrix<double>& z, const Matrix<double>& y, double c);

// Labels are class indices in [0, cols).
LossDelta softmax_xent_delta(const Matrix<double>& z, std::span<const std::int64_t> labels, double c);

}  // namespace dpcheck::reference
