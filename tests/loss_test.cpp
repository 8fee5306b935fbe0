// The losses' output gradients and per-row losses: the float64 reference (reference/loss.cpp) checked
// on the CPU by hand and against reference/mlp.cpp's whole-model gradient and loss, and the kernels
// (kernels/loss.cu) checked against the reference on the GPU.
//
// The bounds, per element, u = 2^-24, c the float32 scale the kernel is given:
//   mse delta      fl(fl(z - y) c): two roundings            |err| <= gamma_2 |c| |z - y|
//   softmax delta  per row, m = max z (exact); e_j = expf(z_j - m), whose argument rounds (relative
//                  error u |z_j - m| after exp) and whose own error is at most 2 ulp (allowed 8 u, as
//                  BoundOptions::exp_error); s = sum of e_j (gamma_D, weighted by the shares p_j);
//                  p_j = e_j / s one rounding; so |p'_j - p_j| <= ep_j = p_j expm1(rel_j + 1.01 rel_s + u).
//                  Then p - onehot and the product with c round once each:
//                                                            |err| <= |c| (ep_j + gamma_3 (|p_j - onehot_j| + ep_j))
//                  plus underflow: an exp below float32's range flushes, a few subnormal spacings 2^-149.
//   row losses     in float64 on both sides: a sum of D terms, an exp or a log, a few additions, so
//                  within 4 gamma_{D+8} (u = 2^-53) of the terms' magnitudes -- a float32 computation
//                  anywhere on the way would be a million times outside.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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
#include "kernels/device.hpp"
#include "kernels/loss.hpp"
#include "tests/gpu_test_support.hpp"
#endif

namespace dpcheck {
namespace {

using reference::Matrix;
[[maybe_unused]] constexpr double u32 = 0x1p-24, u64 = 0x1p-53;

// ---- the reference on the CPU ------------------------------------------------------------------------

TEST(LossReference, ClosedForms) {
  Matrix<double> z(2, 3), y(2, 3);
  z << 1.0, 2.0, -1.0, 0.5, 0.5, 0.5;
  y << 1.0, 0.0, 1.0, 0.5, 1.5, -0.5;
  const auto mse = reference::mse_delta(z, y, 0.25);
  Matrix<double> want(2, 3);
  want << 0.0, 0.5, -0.5, 0.0, -0.25, 0.25;
  EXPECT_EQ(mse.delta, want);
  EXPECT_EQ(mse.row_loss, (std::vector<double>{8.0, 2.0}));

  // Equal logits: softmax is 1/D, the loss log D, whatever the label; a huge logit neither overflows
  // nor loses the others.
  Matrix<double> e(2, 4);
  e << 3.0, 3.0, 3.0, 3.0, 1000.0, 0.0, 0.0, 0.0;
  const std::vector<std::int64_t> labels{2, 1};
  const auto xent = reference::softmax_xent_delta(e, labels, 0.5);
  for (int j = 0; j < 4; ++j) EXPECT_DOUBLE_EQ(xent.delta(0, j), 0.5 * (0.25 - (j == 2 ? 1.0 : 0.0))) << j;
  EXPECT_DOUBLE_EQ(xent.row_loss[0], std::log(4.0));
  EXPECT_DOUBLE_EQ(xent.row_loss[1], 1000.0);
  EXPECT_DOUBLE_EQ(xent.delta(1, 0), 0.5);
  EXPECT_DOUBLE_EQ(xent.delta(1, 1), -0.5);
  EXPECT_TRUE(std::isfinite(xent.delta(1, 2)));
}

// One linear layer with each loss: the loss reference's delta, pushed through the weight product and
// the column sums, is reference/mlp.cpp's gradient, and its row losses average to mlp's loss.
TEST(LossReference, ComposeToTheWholeModelGradientAndLoss) {
  for (const std::vector<int>& dims : {std::vector<int>{1, 1}, std::vector<int>{4, 3}, std::vector<int>{7, 10}})
    for (const Loss loss : {Loss::mse, Loss::cross_entropy}) {
      const ModelConfig model{dims, Activation::identity, loss};
      SCOPED_TRACE(dims_string(dims) + " " + std::string(loss_name(loss)));
      const std::vector<float> params = init_params(model, 3);
      const Batch batch = first_examples(model, 9, 3);
      const Matrix<double> x = reference::to_matrix(batch.x, batch.size, model.in_dim());
      Matrix<double> z = reference::linear_forward(x, reference::weights<double>(model, params)[0]).value;
      z.rowwise() += reference::biases<double>(model, params)[0];
      const auto B = static_cast<double>(batch.size), D = static_cast<double>(model.out_dim());
      const reference::LossDelta out =
          loss == Loss::mse
              ? reference::mse_delta(z, reference::to_matrix(batch.y, batch.size, model.out_dim()), 2.0 / (B * D))
              : reference::softmax_xent_delta(z, batch.labels, 1.0 / B);
      const Matrix<double> gw = reference::linear_weight_grad(out.delta, x).value;
      const reference::RowVector<double> gb = reference::column_sums(out.delta);
      const auto want = reference::loss_and_gradient<double>(model, params, batch);
      const ParamLayout layout(model);
      for (Eigen::Index i = 0; i < gw.size(); ++i)
        EXPECT_NEAR(gw.data()[i], want.grad[static_cast<std::size_t>(i)], 1e-12) << i;
      for (Eigen::Index i = 0; i < gb.size(); ++i)
        EXPECT_NEAR(gb(i), want.grad[layout.bias(0).offset + static_cast<std::size_t>(i)], 1e-12) << i;
      double total = 0;
      for (double r : out.row_loss) total += r;
      EXPECT_NEAR(total / (loss == Loss::mse ? B * D : B), want.loss, 1e-12 * (1 + want.loss));
    }
}

#if DPCHECK_HAVE_CUDA

// ---- the kernels on the GPU ----------------------------------------------------------------------------

// Values in [-1, 1) times 2^e, e in [-4, 4], times `scale`.
std::vector<float> random_floats(std::size_t n, std::uint64_t seed, std::uint64_t stream, float scale = 1.0f) {
  const std::uint64_t key = mix_key(seed, 0x1055);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = scale *
           std::ldexp(random_symmetric(key, stream, i), static_cast<int>(random_u64(key, stream + 1000, i) % 9) - 4);
  return v;
}

std::vector<std::int64_t> random_labels(std::size_t n, int classes, std::uint64_t seed) {
  const std::uint64_t key = mix_key(seed, 0x1abe);
  std::vector<std::int64_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::int64_t>(random_below(key, 0, i, static_cast<std::uint64_t>(classes)));
  return v;
}

rc::Gen<int> gen_dim() {
  return rc::gen::oneOf(rc::gen::element(1, 2, 3, 10, 17, 31, 32, 33, 127, 257), rc::gen::inRange(1, 301));
}

// Largest error / bound; infinite for a NaN or for an error where the bound is 0.
template <class Got, class Want, class Bound>
double worst_ratio(const Got& got, const Want& want, const Bound& bound, std::size_t n) {
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    worst = std::max(worst, error_ratio(static_cast<double>(got[i]), want(i), bound(i)));
  }
  return worst;
}

TEST(LossGpu, MseDeltaAndRowLossWithinDerivedBound) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  rc::detail::checkGTest([&] {
    const int rows = *gen_dim(), cols = *gen_dim();
    const bool want_loss = *rc::gen::arbitrary<bool>();
    const auto seed = *rc::gen::arbitrary<std::uint32_t>();
    const auto n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    const std::vector<float> z = random_floats(n, seed, 1), y = random_floats(n, seed, 2);
    // The engine's c, with a scale (a shard weight, a power of two or not).
    const float scale = *rc::gen::element(1.0f, 0.75f, 4.0f);
    const auto c = static_cast<float>(2.0 * scale / (static_cast<double>(rows) * cols));
    const auto dz = upload(z, s), dy = upload(y, s);
    cuda::DeviceBuffer<float> dd(n);
    cuda::DeviceBuffer<double> dl(static_cast<std::size_t>(rows));
    poison(dd, n, s);
    poison(dl, static_cast<std::size_t>(rows), s);
    cuda::mse_delta(dz.get(), dy.get(), dd.get(), rows, cols, c, want_loss ? dl.get() : nullptr, s);
    const std::vector<float> delta = download(dd, n, s);
    const std::vector<double> row_loss = download(dl, static_cast<std::size_t>(rows), s);

    const Matrix<double> Z = reference::to_matrix(z, rows, cols), Y = reference::to_matrix(y, rows, cols);
    const reference::LossDelta want = reference::mse_delta(Z, Y, c);
    const double qd = worst_ratio(
        delta, [&](std::size_t i) { return want.delta.data()[i]; },
        [&](std::size_t i) {
          return reference::gamma(2, u32) * std::abs(double{c}) * std::abs(Z.data()[i] - Y.data()[i]);
        },
        n);
    RC_LOG() << rows << "x" << cols << ": delta error ratio " << qd << "\n";
    RC_ASSERT(qd <= 1.0);
    if (want_loss) {
      const double ql = worst_ratio(
          row_loss, [&](std::size_t k) { return want.row_loss[k]; },
          [&](std::size_t k) { return 4 * reference::gamma(cols + 8, u64) * want.row_loss[k]; },
          static_cast<std::size_t>(rows));
      RC_LOG() << "row loss error ratio " << ql << "\n";
      RC_ASSERT(ql <= 1.0);
    } else {
      RC_ASSERT(std::all_of(row_loss.begin(), row_loss.end(), [](double v) { return std::isnan(v); }));
    }
  });
}

TEST(LossGpu, SoftmaxCrossEntropyDeltaAndRowLossWithinDerivedBound) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  rc::detail::checkGTest([&] {
    const int rows = *gen_dim(), cols = *gen_dim();
    const bool want_loss = *rc::gen::arbitrary<bool>();
    const auto seed = *rc::gen::arbitrary<std::uint32_t>();
    // Large logits too: softmax then saturates, and exps below float32's range flush to zero.
    const float spread = *rc::gen::element(1.0f, 8.0f, 64.0f);
    const auto n = static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols);
    const std::vector<float> z = random_floats(n, seed, 1, spread);
    const std::vector<std::int64_t> labels = random_labels(static_cast<std::size_t>(rows), cols, seed);
    const auto c = static_cast<float>(*rc::gen::element(1.0, 0.75, 4.0) / rows);
    const auto dz = upload(z, s);
    const auto dlab = upload(labels, s);
    cuda::DeviceBuffer<float> dd(n);
    cuda::DeviceBuffer<double> dl(static_cast<std::size_t>(rows));
    poison(dd, n, s);
    poison(dl, static_cast<std::size_t>(rows), s);
    cuda::softmax_xent_delta(dz.get(), dlab.get(), dd.get(), rows, cols, c, want_loss ? dl.get() : nullptr, s);
    const std::vector<float> delta = download(dd, n, s);
    const std::vector<double> row_loss = download(dl, static_cast<std::size_t>(rows), s);

    const Matrix<double> Z = reference::to_matrix(z, rows, cols);
    const reference::LossDelta want = reference::softmax_xent_delta(Z, labels, c);
    // The bound of every delta element, row by row (see the top of the file).
    Matrix<double> bound(rows, cols);
    std::vector<double> loss_bound(static_cast<std::size_t>(rows));
    const double cc = std::abs(double{c});
    for (Eigen::Index k = 0; k < rows; ++k) {
      const double m = Z.row(k).maxCoeff();
      double sum = 0;
      for (Eigen::Index j = 0; j < cols; ++j) sum += std::exp(Z(k, j) - m);
      double rel_s = reference::gamma(cols, u32);
      std::vector<double> p(static_cast<std::size_t>(cols)), rel(static_cast<std::size_t>(cols));
      for (Eigen::Index j = 0; j < cols; ++j) {
        const auto jj = static_cast<std::size_t>(j);
        p[jj] = std::exp(Z(k, j) - m) / sum;
        rel[jj] = u32 * std::abs(Z(k, j) - m) + 8 * u32;
        rel_s += p[jj] * rel[jj];
      }
      const auto label = static_cast<Eigen::Index>(labels[static_cast<std::size_t>(k)]);
      for (Eigen::Index j = 0; j < cols; ++j) {
        const auto jj = static_cast<std::size_t>(j);
        const double ep = p[jj] * std::expm1(rel[jj] + 1.01 * rel_s + u32) + 4 * 0x1p-149;
        const double diff = std::abs(p[jj] - (j == label ? 1.0 : 0.0));
        bound(k, j) = cc * (ep + reference::gamma(3, u32) * (diff + ep)) + 0x1p-148;
      }
      loss_bound[static_cast<std::size_t>(k)] =
          4 * reference::gamma(cols + 8, u64) * (1 + std::abs(std::log(sum)) + std::abs(m) + std::abs(Z(k, label)));
    }
    const double qd = worst_ratio(
        delta, [&](std::size_t i) { return want.delta.data()[i]; }, [&](std::size_t i) { return bound.data()[i]; }, n);
    RC_LOG() << rows << "x" << cols << " logits x" << spread << ": delta error ratio " << qd << "\n";
    RC_ASSERT(qd <= 1.0);
    if (want_loss) {
      const double ql = worst_ratio(
          row_loss, [&](std::size_t k) { return want.row_loss[k]; }, [&](std::size_t k) { return loss_bound[k]; },
          static_cast<std::size_t>(rows));
      RC_LOG() << "row loss error ratio " << ql << "\n";
      RC_ASSERT(ql <= 1.0);
    } else {
      RC_ASSERT(std::all_of(row_loss.begin(), row_loss.end(), [](double v) { return std::isnan(v); }));
    }
  });
}

// The softmax rows sum to one up to rounding, so the delta of a row sums to 0 when c is 1: a check
// of the kernel that owes nothing to the reference. With |z| <= 16, every p_j is within
// (40 u + rel_s + u) p_j of exact (see the top), so the row's sum is within about (81 u + gamma_D) of 0,
// plus a rounding of each subtraction: gamma_{D+100} (1 + sum |delta|) covers it.
TEST(LossGpu, SoftmaxDeltaRowsSumToZero) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  const int rows = 37, cols = 129;
  const std::vector<float> z = random_floats(static_cast<std::size_t>(rows * cols), 11, 1);
  const std::vector<std::int64_t> labels = random_labels(rows, cols, 11);
  const auto dz = upload(z, s);
  const auto dlab = upload(labels, s);
  cuda::DeviceBuffer<float> dd(static_cast<std::size_t>(rows * cols));
  poison(dd, static_cast<std::size_t>(rows * cols), s);
  cuda::softmax_xent_delta(dz.get(), dlab.get(), dd.get(), rows, cols, 1.0f, nullptr, s);
  const std::vector<float> delta = download(dd, static_cast<std::size_t>(rows * cols), s);
  for (int k = 0; k < rows; ++k) {
    double sum = 0, mag = 0;
    for (int j = 0; j < cols; ++j) {
      sum += delta[static_cast<std::size_t>(k * cols + j)];
      mag += std::abs(delta[static_cast<std::size_t>(k * cols + j)]);
    }
    EXPECT_LE(std::abs(sum), reference::gamma(cols + 100, u32) * (1 + mag)) << "row " << k;
    EXPECT_LE(delta[static_cast<std::size_t>(k * cols + labels[static_cast<std::size_t>(k)])], 0.0f) << "row " << k;
  }
}

#endif  // DPCHECK_HAVE_CUDA

}  // namespace
}  // namespace dpcheck
