#include "reference/activation.hpp"

#include <cmath>

#include "src/error.hpp"

namespace dpcheck::reference {

BiasActivation bias_activation_forward(const Matrix<double>& z, const RowVector<double>& bias, Activation act) {
  DPCHECK_ASSERT(z.cols() == bias.size());
  BiasActivation out;
  out.z = z;
  out.z.rowwise() += bias;
  out.a = out.z.unaryExpr([act](double v) {
    switch (act) {
      case Activation::relu: return v > 0 ? v : 0.0;
      case Activation::tanh: return std::tanh(v);
      case Activation::identity: return v;
    }
    return v;
  });
  return out;
}

Matrix<double> activation_backward(const Matrix<double>& h, const Matrix<double>& z, const Matrix<double>& a,
                                   Activation act) {
  DPCHECK_ASSERT(h.rows() == z.rows() && h.cols() == z.cols() && a.rows() == z.rows() && a.cols() == z.cols());
  Matrix<double> delta(h.rows(), h.cols());
  for (Eigen::Index i = 0; i < h.size(); ++i) {
    const double hv = h.data()[i];
    switch (act) {
      case Activation::relu: delta.data()[i] = z.data()[i] > 0 ? hv : 0.0; break;
      case Activation::tanh: delta.data()[i] = hv * (1.0 - a.data()[i] * a.data()[i]); break;
      case Activation::identity: delta.data()[i] = hv; break;
    }
  }
  return delta;
}

RowVector<double> column_sums(const Matrix<double>& delta) { return delta.colwise().sum(); }

RowVector<double> column_magnitudes(const Matrix<double>& delta) { return delta.cwiseAbs().colwise().sum(); }

}  // namespace dpcheck::reference
