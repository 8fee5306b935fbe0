#include "reference/linear.hpp"

#include "src/error.hpp"

namespace dpcheck::reference {

Product linear_forward(const Matrix<double>& a, const Matrix<double>& w) {
  DPCHECK_ASSERT(a.cols() == w.cols());
  return {a * w.transpose(), a.cwiseAbs() * w.cwiseAbs().transpose()};
}

Product linear_weight_grad(const Matrix<double>& delta, const Matrix<double>& a) {
  DPCHECK_ASSERT(delta.rows() == a.rows());
  return {delta.transpose() * a, delta.cwiseAbs().transpose() * a.cwiseAbs()};
}

Product linear_input_grad(const Matrix<double>& delta, const Matrix<double>& w) {
  DPCHECK_ASSERT(delta.cols() == w.rows());
  return {delta * w, delta.cwiseAbs() * w.cwiseAbs()};
}

Matrix<double> to_matrix(std::span<const float> data, Eigen::Index rows, Eigen::Index cols) {
  DPCHECK_ASSERT(static_cast<Eigen::Index>(data.size()) == rows * cols);
  Matrix<double> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<double>(data[static_cast<std::size_t>(i)]);
  return m;
}

}  // namespace dpcheck::reference
