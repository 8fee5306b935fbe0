#include "reference/loss.hpp"

#include <cmath>

#include "src/error.hpp"

namespace dpcheck::reference {

LossDelta mse_delta(const Matrix<double>& z, const Matrix<double>& y, double c) {
  DPCHECK_ASSERT(z.rows() == y.rows() && z.cols() == y.cols());
  LossDelta out;
  out.delta = (z - y) * c;
  out.row_loss.resize(static_cast<std::size_t>(z.rows()));
  for (Eigen::Index k = 0; k < z.rows(); ++k)
    out.row_loss[static_cast<std::size_t>(k)] = (z.row(k) - y.row(k)).squaredNorm();
  return out;
}

LossDelta softmax_xent_delta(const Matrix<double>& z, std::span<const std::int64_t> labels, double c) {
  DPCHECK_ASSERT(static_cast<Eigen::Index>(labels.size()) == z.rows());
  LossDelta out;
  out.delta.resize(z.rows(), z.cols());
  out.row_loss.resize(static_cast<std::size_t>(z.rows()));
  for (Eigen::Index k = 0; k < z.rows(); ++k) {
    const auto label = static_cast<Eigen::Index>(labels[static_cast<std::size_t>(k)]);
    DPCHECK_ASSERT(label >= 0 && label < z.cols());
    const double m = z.row(k).maxCoeff();
    double s = 0;
    for (Eigen::Index j = 0; j < z.cols(); ++j) s += std::exp(z(k, j) - m);
    const double logsumexp = m + std::log(s);
    for (Eigen::Index j = 0; j < z.cols(); ++j)
      out.delta(k, j) = c * (std::exp(z(k, j) - logsumexp) - (j == label ? 1.0 : 0.0));
    out.row_loss[static_cast<std::size_t>(k)] = logsumexp - z(k, label);
  }
  return out;
}

}  // namespace dpcheck::reference
