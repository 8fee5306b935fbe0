// The derived error bound (reference/bound.cpp): it must hold for every correct float32 path (no false
// alarms) and be tight enough that a different batch -- one example more or less -- lies outside it,
// at a batch of 4096 too; likewise its probabilistic form, its parts (kink, underflow), and the bound
// on the mean loss.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "properties/any_order.hpp"
#include "properties/scenario.hpp"
#include "reference/bound.hpp"
#include "src/rng.hpp"
#include "src/train/engine.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

struct EngineResult {
  std::vector<float> grad;
  double loss = 0;  // what forward_backward returns
};

// The CPU engine's whole-batch gradient and loss.
EngineResult engine_result(const ModelConfig& m, std::span<const float> params, const Batch& b) {
  auto engine = make_cpu_engine(m);
  engine->load_params(params);
  EngineResult r;
  r.loss = engine->forward_backward(b, 1.0f, false);
  r.grad.resize(engine->param_count());
  engine->store_grads(r.grad);
  return r;
}

// Model i of a fixed list: 1 to 3 layers, widths 1 to 64, the activations and losses in turn. A
// one-class cross-entropy has a zero gradient whatever the batch, so cross-entropy gets two classes
// or more.
ModelConfig listed_model(int i) {
  constexpr Activation kActivations[] = {Activation::relu, Activation::tanh, Activation::identity};
  const std::uint64_t key = mix_key(0xB0'0D, static_cast<std::uint64_t>(i));
  ModelConfig m;
  m.activation = kActivations[i % 3];
  m.loss = (i / 3) % 2 == 0 ? Loss::mse : Loss::cross_entropy;
  const int layers = 1 + (i / 6) % 3;
  for (int l = 0; l <= layers; ++l)
    m.dims.push_back(1 + static_cast<int>(random_below(key, 0, static_cast<std::uint64_t>(l), 64)));
  if (m.loss == Loss::cross_entropy) m.dims.back() = std::max(m.dims.back(), 2);
  return m;
}

std::string model_text(const ModelConfig& m) {
  return dims_string(m.dims) + " " + std::string(activation_name(m.activation)) + " " + std::string(loss_name(m.loss));
}

TEST(Gamma, MatchesHighamsDefinition) {
  EXPECT_DOUBLE_EQ(reference::gamma(1, 0x1p-24), 0x1p-24 / (1 - 0x1p-24));
  EXPECT_DOUBLE_EQ(reference::gamma(1000, 0x1p-24), 1000 * 0x1p-24 / (1 - 1000 * 0x1p-24));
  EXPECT_EQ(reference::gamma(0, 0x1p-24), 0.0);
  EXPECT_TRUE(std::isinf(reference::gamma(1 << 24, 0x1p-24)));
  EXPECT_TRUE(std::isinf(reference::gamma(2048, 0x1p-11)));
}

// Higham and Mary's gamma~_n = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1 with lambda = sqrt(2 ln(2n / p))
// / (1 - u), written out again here, and three values worked out separately (Python's math.expm1).
TEST(Gamma, ProbabilisticMatchesHighamAndMarysFormula) {
  struct Row {
    std::int64_t n;
    double u, p;
  };
  for (const Row& row : {Row{1, 0x1p-24, 1e-9}, Row{64, 0x1p-24, 1e-9}, Row{4102, 0x1p-24, 1e-9},
                         Row{100, 0x1p-11, 1e-6}, Row{1 << 20, 0x1p-24, 1e-3}, Row{7, 0x1p-8, 0.5}}) {
    const auto n = static_cast<double>(row.n);
    const double lambda = std::sqrt(-2.0 * std::log(row.p / (2.0 * n))) / (1.0 - row.u);
    const double want = std::exp(lambda * std::sqrt(n) * row.u + n * row.u * row.u / (1.0 - row.u)) - 1.0;
    const double got = reference::gamma_probabilistic(row.n, row.u, row.p);
    EXPECT_NEAR(got, want, 1e-8 * want) << "n " << row.n << " u " << row.u << " p " << row.p;
  }
  EXPECT_NEAR(reference::gamma_probabilistic(4096, 0x1p-24, 1e-9), 2.941776549397677e-05, 1e-14);
  EXPECT_NEAR(reference::gamma_probabilistic(1, 0x1p-24, 1e-9), 3.90093382704783e-07, 1e-19);
  EXPECT_NEAR(reference::gamma_probabilistic(100, 0x1p-11, 1e-6), 0.0306898214320358, 1e-13);
  EXPECT_EQ(reference::gamma_probabilistic(0, 0x1p-24, 1e-9), 0.0);
  // A smaller failure probability costs a larger bound.
  EXPECT_GT(reference::gamma_probabilistic(1000, 0x1p-24, 1e-12), reference::gamma_probabilistic(1000, 0x1p-24, 1e-6));
}

// To first order gamma~_n is lambda_n sqrt(n) u against gamma_n's n u: it is the smaller exactly when
// n > lambda_n^2 = 2 ln(2n / p) / (1 - u)^2, i.e. from 51 terms on at p = 1e-9 (37 at 1e-6, 22 at
// 1e-3). Below that -- the short dot products of narrow layers -- the "probabilistic" bound is the
// looser of the two.
TEST(Gamma, ProbabilisticIsBelowWorstCaseExceptForTinyN) {
  constexpr double u = 0x1p-24;
  for (double p : {1e-9, 1e-6, 1e-3}) {
    for (std::int64_t n = 1; n <= 5000; ++n) {
      const auto nn = static_cast<double>(n);
      const double lambda_sq = 2.0 * std::log(2.0 * nn / p) / ((1.0 - u) * (1.0 - u));
      const bool larger = reference::gamma_probabilistic(n, u, p) > reference::gamma(n, u);
      ASSERT_EQ(larger, nn < lambda_sq) << "n " << n << " p " << p;
    }
    for (std::int64_t n = 5000; n < (1 << 24) / 2; n *= 3)
      EXPECT_LT(reference::gamma_probabilistic(n, u, p), reference::gamma(n, u)) << "n " << n << " p " << p;
  }
  EXPECT_GT(reference::gamma_probabilistic(50, u, 1e-9), reference::gamma(50, u));
  EXPECT_LT(reference::gamma_probabilistic(51, u, 1e-9), reference::gamma(51, u));
  // At a batch of 4096 it is about 8 times smaller.
  EXPECT_LT(reference::gamma_probabilistic(4096, u, 1e-9), reference::gamma(4096, u) / 8);
  EXPECT_GT(reference::gamma_probabilistic(4096, u, 1e-9), reference::gamma(4096, u) / 9);
}

TEST(Gamma, GammaForFollowsTheOptions) {
  reference::BoundOptions options;
  for (std::int64_t n : {1, 17, 4102}) EXPECT_EQ(reference::gamma_for(n, options), reference::gamma(n, 0x1p-24));
  options.unit_roundoff = 0x1p-11;
  EXPECT_EQ(reference::gamma_for(300, options), reference::gamma(300, 0x1p-11));
  options.failure_probability = 1e-6;
  // The smaller of the two: the worst case for short sums (n below about lambda^2), the probabilistic
  // one beyond.
  for (std::int64_t n : {1, 17, 300})
    EXPECT_EQ(reference::gamma_for(n, options),
              std::min(reference::gamma(n, 0x1p-11), reference::gamma_probabilistic(n, 0x1p-11, 1e-6)));
  EXPECT_EQ(reference::gamma_for(1, options), reference::gamma(1, 0x1p-11));
  EXPECT_EQ(reference::gamma_for(300, options), reference::gamma_probabilistic(300, 0x1p-11, 1e-6));
  options.unit_roundoff = 0x1p-24;
  options.failure_probability = 1e-9;
  EXPECT_EQ(reference::gamma_for(4102, options), reference::gamma_probabilistic(4102, 0x1p-24, 1e-9));
}

// The float32 instantiation of the reference is a different float path (other loops, exp(z - lse)
// instead of exp(z - max) / sum): the bound must cover it as well as the engine.
RC_GTEST_PROP(GradientBound, HoldsForTheFloat32Reference, ()) {
  const auto [s, m, b, params] = draw_batch();
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
  const std::vector<float> g = engine_result(m, params, b.slice(0, size - 1)).grad;
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
  const std::vector<float> g = engine_result(m, params, b).grad;
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

// The reference takes the examples reference::kReferenceChunk at a time. A batch twice over has the
// same mean gradient, loss and per-parameter magnitudes (each sum over twice the examples, at half the
// weight) whatever the chunks fall on: 300 examples are one chunk and a part, 600 are two and a part.
TEST(GradientBound, ChunksOfExamplesAddUpToTheWholeBatch) {
  for (const Loss loss : {Loss::mse, Loss::cross_entropy}) {
    const ModelConfig m{{5, 7, 3}, Activation::relu, loss};
    const std::vector<float> params = init_params(m, 3);
    const Batch once = first_examples(m, 300, 9);
    const Batch parts[2] = {once, once};
    const Batch twice = concat(parts);
    ASSERT_GT(twice.size, 2 * reference::kReferenceChunk);
    reference::BoundOptions options;
    options.input_format = Precision::bf16;  // the rounded delta carries the whole batch's 1 / B too
    const auto a = reference::gradient_bound(m, params, once, options);
    const auto b = reference::gradient_bound(m, params, twice, options);
    EXPECT_NEAR(a.loss, b.loss, 1e-12 * std::abs(a.loss));
    ASSERT_EQ(a.magnitude.size(), b.magnitude.size());
    for (std::size_t i = 0; i < a.magnitude.size(); ++i) {
      EXPECT_NEAR(a.reference.grad[i], b.reference.grad[i], 1e-12 * a.magnitude[i]) << i;
      EXPECT_NEAR(a.magnitude[i], b.magnitude[i], 1e-12 * a.magnitude[i]) << i;
      EXPECT_NEAR(a.propagated[i], b.propagated[i], 1e-12 * a.magnitude[i]) << i;
    }
    EXPECT_EQ(2 * a.uncertain_units, b.uncertain_units);
  }
}

TEST(GradientBound, LargerUnitRoundoffGivesALargerBound) {
  ModelConfig m{{5, 6, 2}, Activation::tanh, Loss::cross_entropy};
  const auto params = init_params(m, 2);
  const Batch b = first_examples(m, 30, 2);
  reference::BoundOptions tf32;
  tf32.unit_roundoff = 0x1p-11;
  const auto f32 = reference::gradient_bound(m, params, b);
  const auto t32 = reference::gradient_bound(m, params, b, tf32);
  for (std::size_t i = 0; i < f32.propagated.size(); ++i) EXPECT_GT(t32.bound(i, 34), 100 * f32.bound(i, 34)) << i;
}

TEST(GradientBound, RoundingCounts) {
  // B terms (B - 1 additions and a product each), plus the six scale-factor roundings.
  EXPECT_EQ(reference::whole_batch_roundings(100), 106);
  // The largest share, the all-reduce over N ranks, the scale factors.
  EXPECT_EQ(reference::sharded_roundings(25, 4), 25 + 4 + 6);
}

// The ask: a one-sample drop in a batch of 4096 is caught by the worst-case bound or by the
// probabilistic one, while the correct gradient stays within both. At B = 4096 the drop moves an
// element by about |g_k - g| / B, with g_k the dropped example's own contribution and g the mean: the
// same order as the worst-case rounding allowance gamma_B * magnitude ~ B u * mean|g_k| (B u = 1/4096),
// so the worst-case bound sees it where the last example stands out from the mean by more than the
// mean magnitude at some element; the probabilistic gamma~_B (about lambda sqrt(B) u, 8 times smaller)
// has a margin of 8 more. Measured here: the worst-case bound alone catches all 24 cases (drop ratios
// 3.4 to 69; 5.7 to 377 under the probabilistic bound).
//
// The false-alarm rate that is stated: per dot product, the probabilistic bound fails with probability
// at most p = 1e-9 if the roundings are independent with mean zero (Higham and Mary's model, not a
// theorem about any order). Each case has P gradient elements (up to about 5,500 here), each the end
// of one batch reduction: P x 1e-9 per case, under 1e-5. Every forward and backward dot product of
// every example also enters the bounds through the carried terms, B x (the widths) of them, under 10^6
// here: a union bound over all of them gives under 1e-3 per case (0.009 summed over the 24 cases, which
// the test prints). The worst-case bound has no false alarms at all.
TEST(GradientBound, OneSampleDropInABatchOf4096IsCaughtByOneOfTheBounds) {
  constexpr std::int64_t batch = 4096;
  constexpr int cases = 24;
  constexpr double p = 1e-9;
  reference::BoundOptions probabilistic;
  probabilistic.failure_probability = p;
  const std::int64_t r = reference::whole_batch_roundings(batch);
  int worst_case_catches = 0, only_probabilistic_catches = 0;
  double reductions = 0, dot_products = 0;
  for (int i = 0; i < cases; ++i) {
    const ModelConfig m = listed_model(i);
    const auto seed = static_cast<std::uint64_t>(100 + i);
    SCOPED_TRACE("case " + std::to_string(i) + ": model " + model_text(m));
    const Batch b = first_examples(m, batch, seed);
    const std::vector<float> params = init_params(m, seed);
    const auto worst = reference::gradient_bound(m, params, b);
    const auto prob = reference::gradient_bound(m, params, b, probabilistic);
    const std::vector<float> full = engine_result(m, params, b).grad;
    const std::vector<float> dropped = engine_result(m, params, b.slice(0, batch - 1)).grad;
    const double full_w = reference::compare(full, worst, r).max_ratio;
    const double full_p = reference::compare(full, prob, r).max_ratio;
    const double drop_w = reference::compare(dropped, worst, r).max_ratio;
    const double drop_p = reference::compare(dropped, prob, r).max_ratio;
    EXPECT_LE(full_w, 1.0);
    EXPECT_LE(full_p, 1.0);
    EXPECT_TRUE(drop_w > 1.0 || drop_p > 1.0)
        << "drop ratios " << drop_w << " (worst case), " << drop_p << " (probabilistic)";
    worst_case_catches += drop_w > 1.0;
    only_probabilistic_catches += drop_w <= 1.0 && drop_p > 1.0;
    reductions += static_cast<double>(full.size());
    double widths = 0;
    for (std::size_t l = 1; l < m.dims.size(); ++l) widths += m.dims[l] + (l + 1 < m.dims.size() ? m.dims[l] : 0);
    dot_products += static_cast<double>(full.size()) + static_cast<double>(batch) * widths;
    std::printf("case %2d %-28s full %.3f / %.3f  dropped %.3f / %.3f (worst case / probabilistic)\n", i,
                model_text(m).c_str(), full_w, full_p, drop_w, drop_p);
  }
  std::printf(
      "a drop of one example in %lld: the worst-case bound catches %d of %d cases, only the probabilistic "
      "one %d; false alarms of the probabilistic bound over all cases: at most %.2g for the reductions, "
      "%.2g over every dot product\n",
      static_cast<long long>(batch), worst_case_catches, cases, only_probabilistic_catches, reductions * p,
      dot_products * p);
  EXPECT_EQ(worst_case_catches + only_probabilistic_catches, cases);
  EXPECT_GE(worst_case_catches, cases / 2);
  RecordProperty("worst_case_catches", worst_case_catches);
  RecordProperty("only_probabilistic_catches", only_probabilistic_catches);
}

// The parts of an element's bound: what it was carried in with, the batch reduction's own rounding
// (gamma_m * magnitude and an underflow allowance per rounding), the floor; the kink part is inside
// the carried part.
TEST(GradientBound, TermsAddUpToTheBound) {
  AnyOrderCase c;
  c.model = {{4, 6, 5, 3}, Activation::relu, Loss::cross_entropy};
  c.batch = 9;
  c.near_kink = true;
  c.seed = 21;
  const std::vector<float> params = any_order_params(c);
  const Batch b = any_order_batch(c);
  reference::BoundOptions probabilistic;
  probabilistic.failure_probability = 1e-9;
  for (const reference::BoundOptions& options : {reference::BoundOptions{}, probabilistic}) {
    const auto bound = reference::gradient_bound(c.model, params, b, options);
    ASSERT_GT(bound.uncertain_units, 0);
    for (std::int64_t m :
         {std::int64_t{1}, reference::whole_batch_roundings(b.size), reference::sharded_roundings(3, 3)})
      for (std::size_t i = 0; i < bound.magnitude.size(); ++i) {
        const reference::BoundTerms t = bound.terms(i, m);
        EXPECT_EQ(t.total(), bound.bound(i, m));
        EXPECT_EQ(t.total(), t.propagated + t.rounding + t.floor);
        EXPECT_EQ(t.propagated, bound.propagated[i]);
        EXPECT_EQ(t.kink, bound.kink[i]);
        EXPECT_EQ(t.floor, bound.floor[i]);
        EXPECT_DOUBLE_EQ(t.rounding, reference::gamma_for(m, options) * bound.magnitude[i] +
                                         2.0 * static_cast<double>(m) * 0x1p-150);
        EXPECT_LE(t.kink, t.propagated);
        EXPECT_GT(t.rounding, 0.0);
        EXPECT_GT(t.floor, 0.0);
      }
  }
}

TEST(GradientBound, KinkPartIsZeroWithoutUncertainUnits) {
  int relu_cases = 0;
  for (int i = 0; i < 12; ++i) {
    const ModelConfig m = listed_model(i);
    const auto seed = static_cast<std::uint64_t>(40 + i);
    const auto bound = reference::gradient_bound(m, init_params(m, seed), first_examples(m, 64, seed));
    if (m.activation != Activation::relu) {
      EXPECT_EQ(bound.uncertain_units, 0) << model_text(m);
    }
    if (bound.uncertain_units != 0) continue;
    relu_cases += m.activation == Activation::relu;
    for (double k : bound.kink) EXPECT_EQ(k, 0.0) << model_text(m);
  }
  EXPECT_GT(relu_cases, 0);  // ReLU models away from their kinks were among them
}

// any_order_params sets the bias of the first layer's unit 0 to cancel example 0's dot product, so that
// its pre-activation there is within rounding of 0. Its whole contribution then goes into the bound of
// the elements it feeds, and is most of the bound of that unit's own bias gradient.
TEST(GradientBound, KinkPartDominatesAtAUnitOnItsKink) {
  AnyOrderCase c;
  c.model = {{5, 6, 4}, Activation::relu, Loss::mse};
  c.batch = 8;
  c.near_kink = true;
  c.seed = 7;
  const std::vector<float> params = any_order_params(c);
  const Batch b = any_order_batch(c);
  const auto bound = reference::gradient_bound(c.model, params, b);
  EXPECT_EQ(bound.uncertain_units, 1);
  const ParamLayout layout(c.model);
  const std::int64_t r = reference::whole_batch_roundings(b.size);
  const std::size_t unit0_bias = layout.bias(0).offset;
  const reference::BoundTerms t = bound.terms(unit0_bias, r);
  EXPECT_GT(t.kink, 0.9 * t.total()) << t.describe();
  for (int i = 0; i < c.model.in_dim(); ++i)
    EXPECT_GT(bound.kink[layout.weight(0).offset + static_cast<std::size_t>(i)], 0.0) << i;
  // The other first-layer units are away from their kinks.
  for (std::size_t j = 1; j < layout.bias(0).size(); ++j) EXPECT_EQ(bound.kink[layout.bias(0).offset + j], 0.0) << j;
  // Without the kink term that element's bound is a fraction of it.
  reference::BoundOptions no_kinks;
  no_kinks.uncertain_kinks = false;
  EXPECT_LT(reference::gradient_bound(c.model, params, b, no_kinks).bound(unit0_bias, r), 0.1 * t.total());
  EXPECT_TRUE(reference::compare(engine_result(c.model, params, b).grad, bound, r).passed());
}

// Below the normal range an operation's error is absolute (up to half the smallest subnormal spacing),
// not relative: with inputs around 2^-137 and zero first-layer biases, the first layer's products are
// subnormal and its outputs carry errors of order 2^-150 on values of order 2^-137, 2^-13 relative.
// Outputs far from their targets (2^40) make delta large, which carries that error into the normal
// range of the gradient, beyond the floor's few subnormal spacings. The bound holds with the underflow
// term, and without it (underflow_unit = 0) it does not: the term is needed.
TEST(GradientBound, UnderflowTermCoversSubnormalInputs) {
  const ModelConfig m{{6, 5, 2}, Activation::identity, Loss::mse};
  std::vector<float> params = init_params(m, 5);
  const ParamLayout layout(m);
  for (std::size_t j = 0; j < layout.bias(0).size(); ++j) params[layout.bias(0).offset + j] = 0.0f;
  Batch b = first_examples(m, 8, 5);
  for (float& x : b.x) x = std::ldexp(x, -136);
  for (float& y : b.y) y = std::ldexp(y, 40);
  std::size_t subnormal = 0;
  for (float x : b.x) subnormal += std::fpclassify(x) == FP_SUBNORMAL;
  EXPECT_GT(subnormal, b.x.size() / 2);
  const std::int64_t r = reference::whole_batch_roundings(b.size);
  const std::vector<float> g = engine_result(m, params, b).grad;
  const auto bound = reference::gradient_bound(m, params, b);
  const reference::Comparison with = reference::compare(g, bound, r);
  EXPECT_TRUE(with.passed()) << "error ratio " << with.max_ratio << " at " << layout.describe_element(with.worst);
  reference::BoundOptions no_underflow;
  no_underflow.underflow_unit = 0;
  const reference::Comparison without = reference::compare(g, reference::gradient_bound(m, params, b, no_underflow), r);
  EXPECT_GT(without.max_ratio, 1.0)
      << "without the underflow term the bound still holds: the test no longer shows that it is needed";
  std::printf("subnormal inputs: error ratio %.3g with the underflow term, %.3g without (at %s)\n", with.max_ratio,
              without.max_ratio, layout.describe_element(without.worst).c_str());
}

// The loss a step reports: forward_backward's return value (a double sum of the float32 outputs' losses)
// and the float32 reference's loss (float32 throughout) against the float64 mean loss.
RC_GTEST_PROP(LossBound, HoldsForTheCpuEngineAndTheFloat32Reference, ()) {
  const auto [s, m, b, params] = draw_batch();
  const auto bound = reference::gradient_bound(m, params, b);
  const double engine_loss = engine_result(m, params, b).loss;
  const double f32_loss = reference::loss_and_gradient<float>(m, params, b).loss;
  RC_LOG() << "loss " << bound.loss << " bound " << bound.loss_bound << " engine error " << engine_loss - bound.loss
           << " float32 error " << f32_loss - bound.loss << "\n";
  RC_ASSERT(bound.loss_bound > 0.0);
  RC_ASSERT(std::abs(engine_loss - bound.loss) <= bound.loss_bound);
  RC_ASSERT(std::abs(f32_loss - bound.loss) <= bound.loss_bound);
}

// A mean of the shares' means is not the mean when the shares differ in size: with shares of 3 and 1
// examples it is off by (L_1 - L_3) / 4, the last example's loss against the first three's mean. The
// loss bound must see that in the large majority of cases (95% asserted; 240 of 240 when written); it
// can miss only where the two nearly agree.
TEST(LossBound, MeanOfUnequalSharesMeansIsCaught) {
  constexpr int cases = 240;
  int caught = 0;
  for (int i = 0; i < cases; ++i) {
    const ModelConfig m = listed_model(i);
    const auto seed = static_cast<std::uint64_t>(700 + i);
    const Batch b = first_examples(m, 4, seed);
    const std::vector<float> params = init_params(m, seed);
    const auto bound = reference::gradient_bound(m, params, b);
    EXPECT_LE(std::abs(engine_result(m, params, b).loss - bound.loss), bound.loss_bound) << model_text(m);
    const double mean_of_means =
        (engine_result(m, params, b.slice(0, 3)).loss + engine_result(m, params, b.slice(3, 4)).loss) / 2;
    caught += std::abs(mean_of_means - bound.loss) > bound.loss_bound;
  }
  std::printf("a mean of means (shares of 3 and 1) is caught in %d of %d cases\n", caught, cases);
  RecordProperty("mean_of_means_caught", caught);
  EXPECT_GE(caught, cases * 95 / 100);
}

// The carried term's worst case, constructed (mixed precision). A hidden activation whose float64 value
// v lies just above a rounding midpoint of the low format, by less than float32's half ulp, is
// computed by float32 arithmetic as the midpoint itself, which rounds to even: downwards, one ulp of
// the format away from the reference's R(v). Every example of the batch is built alike, so the flips
// add up with one sign at the next layer's weight gradient: the most that a value within its window
// can do. The output delta is a number of the format far from its boundaries, so its rounding is
// certain and the whole error is the flipped activation's, carried. The engine must take that path
// (its gradient one ulp of the format per example away), and the bound must cover it with a ratio just
// under 1: the carried term is an upper bound at its own worst case, and not a loose one.
TEST(GradientBound, CarriedTermCoversAndMeetsItsWorstCaseAtARoundingMidpoint) {
  const ModelConfig m{{1, 1, 1}, Activation::identity, Loss::mse};
  const ParamLayout layout(m);
  for (const Precision format : {Precision::bf16, Precision::fp16}) {
    SCOPED_TRACE(std::string(precision_name(format)));
    const double ulp = 2 * precision_unit_roundoff(format);  // the format's spacing in [1, 2)
    const double midpoint = 1 + ulp / 2;                     // ties to even: down to 1
    std::vector<float> params(layout.size());
    // x W1 = 2^-25, exact in either format and in float32; b1 the midpoint. v = midpoint + 2^-25, whose
    // float32 sum is the midpoint (float32's half ulp in [1, 2) is 2^-24).
    params[layout.weight(0).offset] = 0x1p-13f;
    params[layout.bias(0).offset] = static_cast<float>(midpoint);
    params[layout.weight(1).offset] = 1.0f;
    params[layout.bias(1).offset] = 0.0f;
    constexpr int kBatch = 4;
    Batch b;
    b.size = kBatch;
    b.in_dim = 1;
    b.out_dim = 1;
    // z2 - y = 64 on the reference's path: delta = 2 * 64 / 4 = 32, a number of both formats.
    const double reference_activation = 1 + ulp;
    b.x.assign(kBatch, 0x1p-12f);
    b.y.assign(kBatch, static_cast<float>(reference_activation - 64));
    reference::BoundOptions options;
    options.input_format = format;
    const auto bound = reference::gradient_bound(m, params, b, options);
    ASSERT_EQ(bound.reference.grad.size(), layout.size());
    EXPECT_GT(bound.uncertain_roundings, 0) << "the midpoint is within the activation's window";
    const std::size_t w2 = layout.weight(1).offset;
    // The reference's dW2 = sum of R(delta) R(v) = 4 * 32 * (1 + ulp); the flipped path's 4 * 32 * 1.
    EXPECT_EQ(bound.reference.grad[w2], kBatch * 32 * reference_activation);
    auto engine = make_cpu_engine(m, nullptr, EngineSpec{.precision = format});
    engine->load_params(params);
    engine->forward_backward(b, 1.0f, false);
    std::vector<float> g(engine->param_count());
    engine->store_grads(g);
    EXPECT_EQ(static_cast<double>(g[w2]), kBatch * 32.0) << "the engine's float32 sum lands on the midpoint";
    const std::int64_t r = reference::whole_batch_roundings(b.size);
    const reference::Comparison c = reference::compare(g, bound, r);
    const reference::BoundTerms t = bound.terms(w2, r);
    EXPECT_TRUE(c.passed()) << c.max_ratio << " " << t.describe();
    EXPECT_EQ(c.worst, w2);
    EXPECT_GT(c.max_ratio, 0.999) << t.describe();
    EXPECT_GT(t.propagated - t.kink, 0.999 * t.total()) << t.describe();
    std::printf("%s: error ratio %.6f at the flipped activation's weight gradient; %s\n",
                std::string(precision_name(format)).c_str(), c.max_ratio, t.describe().c_str());
  }
}

}  // namespace
}  // namespace dpcheck
