// The derived error bound (reference/bound.cpp): it must hold for every correct float32 path (no false
// alarms) and be tight enough that a different batch -- one example more or less -- lies outside it.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <limits>

#include "properties/scenario.hpp"
#include "reference/bound.hpp"
#include "src/engine.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

TEST(Gamma, MatchesHighamsDefinition) {
  EXPECT_DOUBLE_EQ(reference::gamma(1, 0x1p-24), 0x1p-24 / (1 - 0x1p-24));
  EXPECT_DOUBLE_EQ(reference::gamma(1000, 0x1p-24), 1000 * 0x1p-24 / (1 - 1000 * 0x1p-24));
  EXPECT_EQ(reference::gamma(0, 0x1p-24), 0.0);
  EXPECT_TRUE(std::isinf(reference::gamma(1 << 24, 0x1p-24)));
  EXPECT_TRUE(std::isinf(reference::gamma(2048, 0x1p-11)));
}

// The float32 instantiation of the reference is a different float path (other loops, exp(z - lse)
// instead of exp(z - max) / sum): the bound must cover it as well as the engine.
RC_GTEST_PROP(GradientBound, HoldsForTheFloat32Reference, ()) {
  ScenarioSpace space;
  space.world_size = 1;
  const Scenario s = *gen_scenario(space);
  const ModelConfig& m = s.train.model;
  const Batch b = first_examples(m, s.train.batch, s.train.seed);
  const std::vector<float> params = init_params(m, s.train.seed);
  const auto bound = reference::gradient_bound(m, params, b);
  const auto g32 = reference::loss_and_gradient<float>(m, params, b);
  const auto cmp = reference::compare(g32.grad, bound, reference::whole_batch_roundings(b.size));
  RC_LOG() << "error ratio " << cmp.max_ratio << "\n";
  RC_ASSERT(cmp.passed());
}

// One example left out (rescaled to the same mean) is a different gradient: it must fall outside the
// bound wherever the examples' gradients differ at all.
RC_GTEST_PROP(GradientBound, RejectsABatchMissingOneExample, ()) {
  ScenarioSpace space;
  space.world_size = 1;
  const Scenario s = *gen_scenario(space);
  ModelConfig m = s.train.model;
  m.dims.back() = std::max(m.dims.back(), 2);  // one class gives a zero gradient: nothing to tell apart
  const std::int64_t size = std::max<std::int64_t>(2, s.train.batch);
  const Batch b = first_examples(m, size, s.train.seed);
  const std::vector<float> params = init_params(m, s.train.seed);
  const auto bound = reference::gradient_bound(m, params, b);
  auto engine = make_cpu_engine(m);
  engine->load_params(params);
  engine->forward_backward(b.slice(0, size - 1), 1.0f, false);
  std::vector<float> g(engine->param_count());
  engine->store_grads(g);
  const auto cmp = reference::compare(g, bound, reference::whole_batch_roundings(size));
  RC_LOG() << "error ratio " << cmp.max_ratio << "\n";
  RC_ASSERT(cmp.max_ratio > 1.0);
}

TEST(GradientBound, ComparisonFailsJustOutsideAndPassesJustInside) {
  ModelConfig m{{6, 8, 3}, Activation::tanh, Loss::mse};
  const auto params = init_params(m, 9);
  const Batch b = first_examples(m, 40, 9);
  const auto bound = reference::gradient_bound(m, params, b);
  const std::int64_t r = reference::whole_batch_roundings(b.size);
  for (std::size_t i : {std::size_t{0}, std::size_t{17}, bound.reference.grad.size() - 1}) {
    std::vector<double> g = bound.reference.grad;
    g[i] += 1.5 * bound.bound(i, r);
    EXPECT_FALSE(reference::compare(to_float(g), bound, r).passed()) << i;
    EXPECT_EQ(reference::compare(to_float(g), bound, r).worst, i);
    g[i] = bound.reference.grad[i] + 0.5 * bound.bound(i, r);
    // Rounding the perturbed reference to float32 adds at most half an ulp, far below half the bound.
    EXPECT_TRUE(reference::compare(to_float(g), bound, r).passed()) << i;
  }
}

TEST(GradientBound, NanAndInfinityFail) {
  ModelConfig m{{2, 2}, Activation::identity, Loss::mse};
  const auto params = init_params(m, 1);
  const Batch b = first_examples(m, 4, 1);
  const auto bound = reference::gradient_bound(m, params, b);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> g = to_float(bound.reference.grad);
    g[1] = bad;
    const auto cmp = reference::compare(g, bound, reference::whole_batch_roundings(b.size));
    EXPECT_FALSE(cmp.passed());
    EXPECT_EQ(cmp.worst, 1u);
  }
}

TEST(GradientBound, ReluExactlyAtItsKinkIsUncertainAndCovered) {
  // Input 0 and zero first-layer biases put every hidden pre-activation exactly at the kink.
  ModelConfig m{{3, 4, 2}, Activation::relu, Loss::mse};
  std::vector<float> params = init_params(m, 3);
  const ParamLayout layout(m);
  for (std::size_t i = 0; i < layout.bias(0).size(); ++i) params[layout.bias(0).offset + i] = 0.0f;
  Batch b = first_examples(m, 8, 3);
  for (int j = 0; j < 3; ++j) b.x[static_cast<std::size_t>(j)] = 0.0f;  // example 0
  const auto bound = reference::gradient_bound(m, params, b);
  EXPECT_EQ(bound.uncertain_units, 4);
  auto engine = make_cpu_engine(m);
  engine->load_params(params);
  engine->forward_backward(b, 1.0f, false);
  std::vector<float> g(engine->param_count());
  engine->store_grads(g);
  EXPECT_TRUE(reference::compare(g, bound, reference::whole_batch_roundings(b.size)).passed());
  // Had unit j taken the other side (derivative 1 at 0), example 0 would have added its back-propagated
  // error h_j / 1 to the first-layer bias gradient, with h = delta_out W_1 and, since a = relu(0) = 0,
  // delta_out = 2 (b_1 - y_0) / (B * out). The bound there must cover that whole contribution.
  const Slice& w1 = layout.weight(1);
  const Slice& b1 = layout.bias(1);
  const double batch = static_cast<double>(b.size), out = 2.0;
  for (std::size_t j = 0; j < layout.bias(0).size(); ++j) {
    double h = 0;
    for (std::size_t i = 0; i < 2; ++i)
      h += 2.0 * (static_cast<double>(params[b1.offset + i]) - static_cast<double>(b.y[i])) / (batch * out) *
           static_cast<double>(params[w1.offset + i * 4 + j]);
    EXPECT_GT(std::abs(h), 0.0);
    EXPECT_GE(bound.bound(layout.bias(0).offset + j, reference::whole_batch_roundings(b.size)), std::abs(h)) << j;
  }
}

TEST(GradientBound, ScalesWithMagnitudesNotWithTheGradient) {
  // Two examples whose contributions cancel: x and -x with targets -y and y under an identity model
  // without bias effect give a gradient near 0, while every term is large.
  ModelConfig m{{1, 1}, Activation::identity, Loss::mse};
  const std::vector<float> params{3.0f, 0.0f};
  Batch b;
  b.size = 2;
  b.in_dim = 1;
  b.out_dim = 1;
  b.x = {1000.0f, -1000.0f};
  b.y = {-5.0f, 5.0f};
  const auto bound = reference::gradient_bound(m, params, b);
  // dL/dw = (2/2) sum (w x - y) x = 2 * (3000 + 5) * 1000: not cancelling; the bias gradient is
  // sum (w x - y) = 0 exactly, yet its bound must still reflect |w x - y| ~ 3000.
  EXPECT_EQ(bound.reference.grad[1], 0.0);
  EXPECT_GT(bound.bound(1, reference::whole_batch_roundings(2)), 3000.0 * 0x1p-24);
  EXPECT_GT(bound.magnitude[1], 3000.0);
}

TEST(GradientBound, LargerUnitRoundoffGivesALargerBound) {
  ModelConfig m{{5, 6, 2}, Activation::tanh, Loss::cross_entropy};
  const auto params = init_params(m, 2);
  const Batch b = first_examples(m, 30, 2);
  reference::BoundOptions tf32;
  tf32.unit_roundoff = 0x1p-11;
  const auto f32 = reference::gradient_bound(m, params, b);
  const auto t32 = reference::gradient_bound(m, params, b, tf32);
  for (std::size_t i = 0; i < f32.propagated.size(); ++i)
    EXPECT_GT(t32.bound(i, 34), 100 * f32.bound(i, 34)) << i;
}

TEST(GradientBound, RoundingCounts) {
  // B terms (B - 1 additions and a product each), plus the six scale-factor roundings.
  EXPECT_EQ(reference::whole_batch_roundings(100), 106);
  // The largest share, the all-reduce over N ranks, the scale factors.
  EXPECT_EQ(reference::sharded_roundings(25, 4), 25 + 4 + 6);
}

}  // namespace
}  // namespace dpcheck
