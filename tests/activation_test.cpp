// Bias + activation forward and the activation's backward: the float64 reference
// (reference/activation.cpp) checked on the CPU by hand and against reference/mlp.cpp's whole-model
// gradient, and the kernels (kernels/activation.cu) checked against the reference on the GPU.
//
// The bound, per element, u = 2^-24 (inputs are float32, exact in float64):
//   z + b         one rounding:                          |err| <= u |z + b|
//   relu, identity of the rounded sum, no rounding of their own: the same
//   tanh          the sum's error passes through tanh (slope <= 1), plus tanhf's own error (CUDA: at most
//                 2 ulp; allowed 4 ulp = 8 u relative, BoundOptions::tanh_error):
//                                                        |err| <= u |z + b| + 8 u (|tanh(z + b)| + u |z + b|)
//   backward      relu and identity pass or drop h exactly: |err| = 0; tanh: h (1 - a a), with the
//                 product a a, the subtraction and the product with h rounding once each (fused or not):
//                                                        |err| <= gamma_3 |h| (a^2 + |1 - a^2|)
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "reference/activation.hpp"
#include "reference/bound.hpp"
#include "reference/linear.hpp"
#include "reference/loss.hpp"
#include "reference/mlp.hpp"
#include "src/rng.hpp"
#include "tests/test_support.hpp"

#if DPCHECK_HAVE_CUDA
#include "kernels/activation.hpp"
#include "kernels/device.hpp"
#include "tests/gpu_test_support.hpp"
#endif

namespace dpcheck {
namespace {

using reference::Matrix;
using reference::RowVector;
[[maybe_unused]] constexpr double u32 = 0x1p-24;
constexpr Activation kActivations[] = {Activation::relu, Activation::tanh, Activation::identity};

// ---- the reference on the CPU ------------------------------------------------------------------------

TEST(ActivationReference, ForwardAndBackwardByHand) {
  Matrix<double> z(2, 3);
  z << -1.5, 0.0, 2.0, 0.25, -0.0, -3.0;
  RowVector<double> b(3);
  b << 0.5, 0.0, -1.0;
  const auto relu = reference::bias_activation_forward(z, b, Activation::relu);
  Matrix<double> want(2, 3);
  want << -1.0, 0.0, 1.0, 0.75, 0.0, -4.0;
  EXPECT_EQ(relu.z, want);
  Matrix<double> want_a(2, 3);
  want_a << 0.0, 0.0, 1.0, 0.75, 0.0, 0.0;
  EXPECT_EQ(relu.a, want_a);
  EXPECT_EQ(reference::bias_activation_forward(z, b, Activation::identity).a, want);
  const auto tanh = reference::bias_activation_forward(z, b, Activation::tanh);
  for (Eigen::Index i = 0; i < want.size(); ++i) EXPECT_EQ(tanh.a.data()[i], std::tanh(want.data()[i]));

  Matrix<double> h(2, 3);
  h << 3.0, 5.0, 7.0, -2.0, 4.0, 8.0;
  Matrix<double> relu_back(2, 3);
  relu_back << 0.0, 0.0, 7.0, -2.0, 0.0, 0.0;  // derivative 0 at z = 0, as PyTorch's
  EXPECT_EQ(reference::activation_backward(h, relu.z, relu.a, Activation::relu), relu_back);
  EXPECT_EQ(reference::activation_backward(h, relu.z, relu.a, Activation::identity), h);
  // tanh's derivative from the activation that was stored, whatever z says.
  Matrix<double> a(2, 3);
  a << 0.5, 0.0, -1.0, 0.25, 0.75, 1.0;
  Matrix<double> tanh_back(2, 3);
  tanh_back << 3.0 * 0.75, 5.0, 0.0, -2.0 * (1 - 0.0625), 4.0 * (1 - 0.5625), 0.0;
  EXPECT_EQ(reference::activation_backward(h, relu.z, a, Activation::tanh), tanh_back);

  RowVector<double> sums(3), mags(3);
  sums << 1.0, 9.0, 15.0;
  mags << 5.0, 9.0, 15.0;
  EXPECT_EQ(reference::column_sums(h), sums);
  EXPECT_EQ(reference::column_magnitudes(h), mags);
  EXPECT_EQ(reference::column_sums(Matrix<double>(0, 4)), RowVector<double>::Zero(4));  // an empty batch
}

// The per-layer references (linear, bias + activation, loss, column sums), composed into a whole
// model, give reference/mlp.cpp's gradient for every activation and loss.
TEST(ActivationReference, ComposeToTheWholeModelGradient) {
  for (const std::vector<int>& dims : {std::vector<int>{4, 1}, std::vector<int>{3, 5, 2}, std::vector<int>{6, 4, 7, 3}})
    for (const Activation act : kActivations)
      for (const Loss loss : {Loss::mse, Loss::cross_entropy}) {
        const ModelConfig model{dims, act, loss};
        SCOPED_TRACE(dims_string(dims) + " " + std::string(activation_name(act)) + " " + std::string(loss_name(loss)));
        const std::vector<float> params = init_params(model, 7);
        const Batch batch = first_examples(model, 13, 7);
        const auto w = reference::weights<double>(model, params);
        const auto b = reference::biases<double>(model, params);
        const auto L = static_cast<std::size_t>(model.layers());
        const auto B = static_cast<double>(batch.size);
        std::vector<Matrix<double>> z(L), a{reference::to_matrix(batch.x, batch.size, model.in_dim())};
        for (std::size_t l = 0; l < L; ++l) {
          const auto f = reference::bias_activation_forward(reference::linear_forward(a.back(), w[l]).value, b[l],
                                                            l + 1 < L ? act : Activation::identity);
          z[l] = f.z;
          a.push_back(f.a);
        }
        const reference::LossDelta out =
            loss == Loss::mse
                ? reference::mse_delta(z.back(), reference::to_matrix(batch.y, batch.size, model.out_dim()),
                                       2.0 / (B * model.out_dim()))
                : reference::softmax_xent_delta(z.back(), batch.labels, 1.0 / B);
        Matrix<double> delta = out.delta;
        const ParamLayout layout(model);
        std::vector<double> grad(layout.size());
        for (std::size_t l = L; l-- > 0;) {
          const Matrix<double> gw = reference::linear_weight_grad(delta, a[l]).value;
          const RowVector<double> gb = reference::column_sums(delta);
          const int li = static_cast<int>(l);
          for (Eigen::Index i = 0; i < gw.size(); ++i)
            grad[layout.weight(li).offset + static_cast<std::size_t>(i)] = gw.data()[i];
          for (Eigen::Index i = 0; i < gb.size(); ++i)
            grad[layout.bias(li).offset + static_cast<std::size_t>(i)] = gb(i);
          if (l > 0)
            delta =
                reference::activation_backward(reference::linear_input_grad(delta, w[l]).value, z[l - 1], a[l], act);
        }
        const auto want = reference::loss_and_gradient<double>(model, params, batch);
        for (std::size_t i = 0; i < grad.size(); ++i)
          EXPECT_NEAR(grad[i], want.grad[i], 1e-12 * (1 + std::abs(want.grad[i]))) << layout.describe_element(i);
      }
}

#if DPCHECK_HAVE_CUDA

// ---- the kernels on the GPU ----------------------------------------------------------------------------

// Values in [-1, 1) times 2^e, e in [-4, 4]; with `zeros`, about one in eight is exactly +0 or -0, so
// that ReLU meets its kink.
std::vector<float> random_floats(std::size_t n, std::uint64_t seed, std::uint64_t stream, bool zeros = false) {
  const std::uint64_t key = mix_key(seed, 0xac71);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = random_u64(key, stream + 1000, i);
    v[i] = zeros && r % 8 == 0 ? (r % 16 == 0 ? -0.0f : 0.0f)
                               : std::ldexp(random_symmetric(key, stream, i), static_cast<int>(r % 9) - 4);
  }
  return v;
}

rc::Gen<int> gen_dim() {
  return rc::gen::oneOf(rc::gen::element(1, 3, 17, 31, 32, 33, 127, 128, 129, 257), rc::gen::inRange(1, 301));
}

// Largest error / bound; infinite for a NaN or for an error where the bound is 0.
double worst_ratio(std::span<const float> got, const Matrix<double>& want, const Matrix<double>& bound) {
  double worst = 0;
  for (Eigen::Index i = 0; i < want.size(); ++i) {
    worst = std::max(worst, error_ratio(got[static_cast<std::size_t>(i)], want.data()[i], bound.data()[i]));
  }
  return worst;
}

TEST(ActivationGpu, BiasActivationForwardWithinDerivedBound) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  rc::detail::checkGTest([&] {
    const int rows = *gen_dim(), cols = *gen_dim();
    const Activation act = *rc::gen::element(Activation::relu, Activation::tanh, Activation::identity);
    const bool with_a = *rc::gen::arbitrary<bool>();
    const auto seed = *rc::gen::arbitrary<std::uint32_t>();
    const auto n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    const std::vector<float> z = random_floats(n, seed, 1, true),
                             bias = random_floats(static_cast<std::size_t>(cols), seed, 2);
    const auto dz = upload(z, s), db = upload(bias, s);
    cuda::DeviceBuffer<float> da(n);
    poison(da, n, s);
    cuda::bias_activation_forward(dz.get(), with_a ? da.get() : nullptr, db.get(), rows, cols, act, s);
    const std::vector<float> z_out = download(dz, n, s), a_out = download(da, n, s);

    const RowVector<double> b64 = reference::to_matrix(bias, 1, cols).row(0);
    const auto want = reference::bias_activation_forward(reference::to_matrix(z, rows, cols), b64, act);
    const Matrix<double> ez = u32 * want.z.cwiseAbs();
    const Matrix<double> ea =
        act == Activation::tanh ? Matrix<double>(ez + 8 * u32 * (want.a.cwiseAbs() + u32 * want.z.cwiseAbs())) : ez;
    const double qz = worst_ratio(z_out, want.z, ez);
    RC_LOG() << rows << "x" << cols << " " << activation_name(act) << ": error ratio z " << qz << "\n";
    RC_ASSERT(qz <= 1.0);
    if (with_a) {
      const double qa = worst_ratio(a_out, want.a, ea);
      RC_LOG() << "error ratio a " << qa << "\n";
      RC_ASSERT(qa <= 1.0);
    } else {
      // No activation asked for: the buffer is left alone (still the poison everywhere).
      RC_ASSERT(std::all_of(a_out.begin(), a_out.end(), [](float v) { return std::isnan(v); }));
    }
  });
}

TEST(ActivationGpu, BackwardWithinDerivedBound) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  rc::detail::checkGTest([&] {
    const int rows = *gen_dim(), cols = *gen_dim();
    const Activation act = *rc::gen::element(Activation::relu, Activation::tanh, Activation::identity);
    const auto seed = *rc::gen::arbitrary<std::uint32_t>();
    const auto n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    const std::vector<float> h = random_floats(n, seed, 1), z = random_floats(n, seed, 2, true);
    std::vector<float> a(n);
    for (std::size_t i = 0; i < n; ++i)
      a[i] = act == Activation::relu ? std::max(z[i], 0.0f) : act == Activation::tanh ? std::tanh(z[i]) : z[i];
    const auto dh = upload(h, s), dz = upload(z, s), da = upload(a, s);
    cuda::DeviceBuffer<float> dd(n);
    poison(dd, n, s);
    cuda::activation_backward(dh.get(), dz.get(), da.get(), dd.get(), rows, cols, act, s);
    const std::vector<float> delta = download(dd, n, s);

    const Matrix<double> H = reference::to_matrix(h, rows, cols), A = reference::to_matrix(a, rows, cols);
    const Matrix<double> want = reference::activation_backward(H, reference::to_matrix(z, rows, cols), A, act);
    Matrix<double> bound = Matrix<double>::Zero(rows, cols);  // relu and identity are exact
    if (act == Activation::tanh) {
      const Matrix<double> a2 = A.cwiseProduct(A);
      const Matrix<double> s1 = (Matrix<double>::Ones(rows, cols) - a2).cwiseAbs();
      bound = reference::gamma(3, u32) * H.cwiseAbs().cwiseProduct(a2 + s1);
    }
    const double q = worst_ratio(delta, want, bound);
    RC_LOG() << rows << "x" << cols << " " << activation_name(act) << ": error ratio " << q << "\n";
    RC_ASSERT(q <= 1.0);
  });
}

#endif  // DPCHECK_HAVE_CUDA

}  // namespace
}  // namespace dpcheck
