// The float64 reference MLP (reference/mlp.cpp) against closed forms and central differences: the
// reference is what every other check trusts, so it is checked against calculus, not against itself.
#include <gtest/gtest.h>

#include <cmath>

#include "reference/mlp.hpp"
#include "src/rng.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

TEST(ReferenceMlp, LinearMseMatchesClosedForm) {
  // z = w0 x0 + w1 x1 + b, L = mean (z - y)^2, dL/dw_j = 2/B sum (z - y) x_j, dL/db = 2/B sum (z - y).
  ModelConfig m{{2, 1}, Activation::identity, Loss::mse};
  const std::vector<float> params{0.5f, -0.25f, 0.125f};
  Batch b;
  b.size = 2;
  b.in_dim = 2;
  b.out_dim = 1;
  b.x = {1.0f, 2.0f, -3.0f, 0.5f};
  b.y = {1.0f, -1.0f};
  const double z0 = 0.5 * 1 - 0.25 * 2 + 0.125, z1 = 0.5 * -3 - 0.25 * 0.5 + 0.125;
  const double e0 = z0 - 1, e1 = z1 + 1;
  const auto g = reference::loss_and_gradient<double>(m, params, b);
  EXPECT_DOUBLE_EQ(g.loss, (e0 * e0 + e1 * e1) / 2);
  EXPECT_DOUBLE_EQ(g.grad[0], (e0 * 1 + e1 * -3));
  EXPECT_DOUBLE_EQ(g.grad[1], (e0 * 2 + e1 * 0.5));
  EXPECT_DOUBLE_EQ(g.grad[2], (e0 + e1));
}

TEST(ReferenceMlp, CrossEntropyMatchesClosedForm) {
  // One example, logits z = b (no weight contribution since x = 0): L = logsumexp(b) - b[label].
  ModelConfig m{{1, 3}, Activation::identity, Loss::cross_entropy};
  const std::vector<float> params{0.1f, 0.2f, 0.3f, 1.0f, 2.0f, 0.5f};  // weights (3x1), bias (3)
  Batch b;
  b.size = 1;
  b.in_dim = 1;
  b.out_dim = 3;
  b.loss = Loss::cross_entropy;
  b.x = {0.0f};
  b.labels = {1};
  const double s = std::exp(1.0) + std::exp(2.0) + std::exp(0.5);
  const auto g = reference::loss_and_gradient<double>(m, params, b);
  EXPECT_NEAR(g.loss, std::log(s) - 2.0, 1e-15);
  EXPECT_NEAR(g.grad[3], std::exp(1.0) / s, 1e-15);
  EXPECT_NEAR(g.grad[4], std::exp(2.0) / s - 1.0, 1e-15);
  EXPECT_NEAR(g.grad[5], std::exp(0.5) / s, 1e-15);
  EXPECT_EQ(g.grad[0], 0.0);  // x = 0: no weight gradient
}

TEST(ReferenceMlp, EmptyBatchHasZeroLossAndGradient) {
  ModelConfig m{{3, 4, 2}, Activation::relu, Loss::mse};
  Batch b;
  b.in_dim = 3;
  b.out_dim = 2;
  const auto g = reference::loss_and_gradient<double>(m, init_params(m, 1), b);
  EXPECT_EQ(g.loss, 0.0);
  for (double v : g.grad) EXPECT_EQ(v, 0.0);
}

TEST(ReferenceMlp, CrossEntropyOutputBiasGradientSumsToZero) {
  // sum_j (softmax_j - onehot_j) = 0 for every example, so the output bias gradient sums to 0.
  ModelConfig m{{5, 7, 4}, Activation::tanh, Loss::cross_entropy};
  const auto params = init_params(m, 3);
  const auto g = reference::loss_and_gradient<double>(m, params, first_examples(m, 17, 3));
  const ParamLayout layout(m);
  double sum = 0, magnitude = 0;
  for (std::size_t i = 0; i < layout.bias(1).size(); ++i) {
    sum += g.grad[layout.bias(1).offset + i];
    magnitude += std::abs(g.grad[layout.bias(1).offset + i]);
  }
  EXPECT_GT(magnitude, 1e-3);
  EXPECT_NEAR(sum, 0.0, 1e-15);
}

// Central differences of the float64 loss. The reference takes float32 parameters, so the step is a
// float32 one, h = 2^-20 (exactly representable next to parameters of magnitude below 1): truncation
// error O(h^2 L''') ~ 1e-12, rounding error ~ 1e-16 |L| / h ~ 1e-10, both far under the tolerance.
// A ReLU kink crossed within one step would break the derivative; with h this small and these seeds
// none is.
class ReferenceFiniteDifferences : public testing::TestWithParam<std::tuple<Activation, Loss>> {};

TEST_P(ReferenceFiniteDifferences, GradientMatchesDerivativeOfLoss) {
  const auto [act, loss] = GetParam();
  for (std::uint64_t seed = 0; seed < 6; ++seed) {
    ModelConfig m{{4, 6, 5, 3}, act, loss};
    m.dims[0] = 1 + static_cast<int>(seed % 4);
    std::vector<float> params = init_params(m, seed);
    const Batch b = first_examples(m, 9, seed);
    const auto g = reference::loss_and_gradient<double>(m, params, b);
    const ParamLayout layout(m);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const float p = params[i];
      const float up = p + 0x1p-20f, down = p - 0x1p-20f;
      params[i] = up;
      const double lu = reference::loss_and_gradient<double>(m, params, b).loss;
      params[i] = down;
      const double ld = reference::loss_and_gradient<double>(m, params, b).loss;
      params[i] = p;
      const double fd = (lu - ld) / (static_cast<double>(up) - static_cast<double>(down));
      EXPECT_NEAR(g.grad[i], fd, 1e-8 + 1e-6 * std::abs(fd)) << layout.describe_element(i) << " seed " << seed;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllActivationsAndLosses, ReferenceFiniteDifferences,
                         testing::Combine(testing::Values(Activation::relu, Activation::tanh, Activation::identity),
                                          testing::Values(Loss::mse, Loss::cross_entropy)));

TEST(ReferenceMlp, Float32InstantiationIsCloseToFloat64) {
  ModelConfig m{{8, 16, 4}, Activation::tanh, Loss::cross_entropy};
  const auto params = init_params(m, 5);
  const Batch b = first_examples(m, 64, 5);
  const auto g64 = reference::loss_and_gradient<double>(m, params, b);
  const auto g32 = reference::loss_and_gradient<float>(m, params, b);
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < g64.grad.size(); ++i) {
    worst = std::max(worst, std::abs(g64.grad[i] - static_cast<double>(g32.grad[i])));
    scale = std::max(scale, std::abs(g64.grad[i]));
  }
  EXPECT_GT(scale, 0.0);
  EXPECT_LT(worst, 1e-5 * scale);
  EXPECT_GT(worst, 0.0);  // they are different computations
}

}  // namespace
}  // namespace dpcheck
