// The linear layer's three matrix products in float64, on row-major matrices laid out as PyTorch lays
// them out (weight out x in), each beside its magnitude: the sum of |terms| of every output element,
// which is what a dot product's rounding error is bounded by (Higham, section 3.1: any order of n
// terms is within gamma_n * sum |terms| of exact). The reference of kernels/linear.cu; its test is
// tests/linear_test.cpp. reference/mlp.cpp computes the same products inline for a whole model.
//
//   forward       z  (rows x out) = a (rows x in)  W^T
//   weight grad   gW (out x in)   = delta^T (out x rows) a (rows x in)
//   input grad    h  (rows x in)  = delta (rows x out) W (out x in)
#pragma once

#include <span>

#include "reference/mlp.hpp"

namespace dpcheck::reference {

// A product and, element by element, the sum of the absolute values of the terms it adds up.
struct Product {
  Matrix<double> value;
  Matrix<double> magnitude;
};

Product linear_forward(const Matrix<double>& a, const Matrix<double>& w);
Product linear_weight_grad(const Matrix<double>& delta, const Matrix<double>& a);
Product linear_input_grad(const Matrix<double>& delta, const Matrix<double>& w);

// A row-major float32 buffer of rows x cols as a float64 matrix (every float32 converts exactly).
Matrix<double> to_matrix(std::span<const float> data, Eigen::Index rows, Eigen::Index cols);

}  // namespace dpcheck::reference
