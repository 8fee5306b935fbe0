// Tests for src/bench/scaling: the speed-up model against the project's first question, worked by hand
// (400 ms of compute a step on one device, 25 ms for an all-reduce), the ring's alpha-beta model and
// its fit, and the overlap of buckets with the backward pass.
#include "src/bench/scaling.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "src/error.hpp"

namespace dpcheck::scaling {
namespace {

// N = 1..32; C(N) = 400/N ms, A = 25 ms on two devices or more.
struct Seed {
  std::vector<int> ranks;
  std::vector<double> compute, allreduce;
  Seed() {
    for (int n = 1; n <= 32; ++n) {
      ranks.push_back(n);
      compute.push_back(0.400 / n);
      allreduce.push_back(0.025);
    }
  }
};

// A backward pass of two thirds of the compute, its gradient in many equal buckets ready one after the
// other: as fine-grained an overlap as there is.
ComputeShape fine_buckets(int k) {
  ComputeShape s;
  s.forward_fraction = 1.0 / 3.0;
  for (int j = 0; j < k; ++j) {
    s.bucket_bytes.push_back(1.0);
    s.bucket_ready.push_back(static_cast<double>(j + 1) / k);
  }
  return s;
}

TEST(SpeedupModel, TheSeedsWorkedAnswer) {
  const Seed seed;
  const std::vector<Prediction> rows = predict(seed.ranks, seed.compute, seed.allreduce, single_bucket(1.0 / 3.0, 1), 0);
  const auto row = [&](int n) { return rows[static_cast<std::size_t>(n - 1)]; };
  // T(N) = 400/N + 25 ms.
  EXPECT_DOUBLE_EQ(row(1).step, 0.400);
  EXPECT_DOUBLE_EQ(row(2).step, 0.225);
  EXPECT_DOUBLE_EQ(row(4).step, 0.125);
  EXPECT_DOUBLE_EQ(row(8).step, 0.075);
  EXPECT_DOUBLE_EQ(row(16).step, 0.050);
  EXPECT_NEAR(row(2).speedup, 400.0 / 225.0, 1e-12);  // 1.78
  EXPECT_NEAR(row(4).speedup, 3.2, 1e-12);
  EXPECT_NEAR(row(8).speedup, 16.0 / 3.0, 1e-12);     // 5.33
  EXPECT_NEAR(row(16).speedup, 8.0, 1e-12);
  // Never past C / A = 16, however many devices.
  for (const Prediction& p : rows) EXPECT_LT(p.speedup, 16.0);
  // Break-even at 16 devices: 25 ms of compute each, and 25 ms of all-reduce.
  EXPECT_EQ(break_even(rows), 16);
  // With the all-reduce after the whole backward pass, overlap changes nothing.
  for (const Prediction& p : rows) EXPECT_DOUBLE_EQ(p.step_overlap, p.step);
}

TEST(SpeedupModel, TheSeedOverlappedWithTheBackwardPass) {
  const Seed seed;
  const int k = 10000;
  const std::vector<Prediction> rows = predict(seed.ranks, seed.compute, seed.allreduce, fine_buckets(k), 0);
  const auto row = [&](int n) { return rows[static_cast<std::size_t>(n - 1)]; };
  // T(N) = F + max(W, A): F = C/3, W = 2C/3. Up to N = 10 the backward pass (26.7 ms) hides the 25 ms,
  // all but the last bucket's 25/k ms.
  for (int n = 2; n <= 10; ++n) EXPECT_NEAR(row(n).exposed_overlap, 0.025 / k, 1e-12) << n;
  EXPECT_NEAR(row(11).exposed_overlap, 0.025 - 2.0 / 3.0 * 0.400 / 11, 0.025 / k + 1e-12);
  EXPECT_NEAR(row(16).step_overlap, 0.400 / 16 / 3 + 0.025, 0.025 / k + 1e-12);  // 33.3 ms
  EXPECT_NEAR(row(16).speedup_overlap, 12.0, 0.01);
  // Break-even moves from 16 to 27: the first N with A - 2C/3 >= C, N >= 5/3 * 400/25 = 26.7.
  EXPECT_EQ(break_even(rows, true), 27);
}

TEST(SpeedupModel, OneBucketReadyAtTheStartHidesNothingBehindTheForwardPass) {
  // A bucket ready before any backward work starts as the forward pass ends: F + max(W, A).
  ComputeShape s;
  s.forward_fraction = 0.25;
  s.bucket_bytes = {4};
  s.bucket_ready = {0};
  const std::vector<double> a{0.5};
  EXPECT_DOUBLE_EQ(overlapped_step(1.0, s, a), 1.0);    // 0.25 + max(0.75, 0.5)
  const std::vector<double> b{1.0};
  EXPECT_DOUBLE_EQ(overlapped_step(1.0, s, b), 1.25);   // 0.25 + 1.0
}

TEST(AlphaBeta, RingTimes) {
  const AlphaBeta ab{10e-6, 1e9};
  EXPECT_DOUBLE_EQ(ab.seconds(1, 1e6), 0);
  // N = 4, 1 MB: 6 messages of 10 us, and 6/4 MB at 1 GB/s.
  EXPECT_NEAR(ab.seconds(4, 1e6), 60e-6 + 1.5e-3, 1e-15);
}

TEST(AlphaBeta, FitRecoversTheModelFromItsOwnTimes) {
  const AlphaBeta truth{25e-6, 3e9};
  std::vector<AllreduceSample> samples;
  for (int n : {1, 2, 3, 4, 8})
    for (double bytes : {4e3, 1e5, 1e6, 6e7}) samples.push_back({n, bytes, truth.seconds(n, bytes)});
  const AlphaBetaFit f = fit_alpha_beta(samples);
  EXPECT_NEAR(f.model.alpha, truth.alpha, 1e-12);
  EXPECT_NEAR(f.model.beta / truth.beta, 1.0, 1e-9);
  EXPECT_LT(f.rms_relative_error, 1e-9);
  EXPECT_EQ(f.samples, 16u);  // N = 1 left out
}

TEST(AlphaBeta, FitKeepsBothTermsNonNegative) {
  // Times that fall with size would need a negative bandwidth term: the fit keeps latency alone.
  const std::vector<AllreduceSample> samples{{2, 1e3, 2e-3}, {2, 1e6, 1e-3}, {4, 1e6, 1.5e-3}};
  const AlphaBetaFit f = fit_alpha_beta(samples);
  EXPECT_GE(f.model.alpha, 0);
  EXPECT_GE(f.model.beta, 0);
  EXPECT_GT(f.rms_relative_error, 0.1);
}

TEST(AlphaBeta, FitNeedsTwoSamples) {
  const std::vector<AllreduceSample> one{{2, 1e3, 1e-5}, {1, 1e6, 1e-3}};
  EXPECT_THROW(fit_alpha_beta(one), Error);
}

TEST(MlpShape, ForwardIsOneProductBackwardTwo) {
  ModelConfig m;
  m.dims = {10, 20, 30};
  // Products 200 and 600: forward 800, backward 200 + 1200 = 1400.
  const ComputeShape s = mlp_shape(m, 1u << 20);
  EXPECT_NEAR(s.forward_fraction, 800.0 / 2200.0, 1e-15);
  ASSERT_EQ(s.bucket_bytes.size(), 1u);
  EXPECT_DOUBLE_EQ(s.bucket_bytes[0], (220.0 + 630.0) * 4);
  EXPECT_DOUBLE_EQ(s.bucket_ready[0], 1.0);
  // Buckets of 630 elements: the last layer's weight and bias first, ready after its weight gradient,
  // 600 of 1400 (its delta for the layer below, the other 600, comes after).
  const ComputeShape b = mlp_shape(m, 630);
  ASSERT_EQ(b.bucket_bytes.size(), 2u);
  EXPECT_NEAR(b.bucket_ready[0], 600.0 / 1400.0, 1e-15);
  EXPECT_DOUBLE_EQ(b.bucket_ready[1], 1.0);
}

}  // namespace
}  // namespace dpcheck::scaling
