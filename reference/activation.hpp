// Bias and activation, forward and backward, and the bias gradient (column sums), in float64 on
// row-major (rows x cols) matrices, as reference/mlp.cpp applies them inside the whole model. The
// reference of kernels/activation.cu and kernels/bias_grad.cu; tests: tests/activation_test.cpp and
// tests/bias_grad_test.cpp.
#pragma once

#include "reference/mlp.hpp"

namespace dpcheck::reference {

struct BiasActivation {
  Matrix<double> z;  // z + bias, broadcast over rows
  Matrix<double> a;  // act(z + bias)
};

BiasActivation bias_activation_forward(const Matrix<double>& z, const RowVector<double>& bias, Activation act);

// delta = h * act'(z). ReLU's derivative is 0 at 0 (PyTorch's); tanh's is taken from the stored
// activation as 1 - a^2, as PyTorch's backward and the engines take it, so `a` must be act(z).
Matrix<double> activation_backward(const Matrix<double>& h, const Matrix<double>& z, const Matrix<double>& a,
                                   Activation act);

// The bias gradient: the sum of each column over the rows; and each column's sum of |terms|, the
// magnitude its rounding error is bounded by.
RowVector<double> column_sums(const Matrix<double>& delta);
RowVector<double> column_magnitudes(const Matrix<double>& delta);

}  // namespace dpcheck::reference
