// Tests for src/bench/scaling: the speed-up model against the project's first question, worked by hand
// (400 ms of compute a step on one device, 25 ms for an all-reduce), the ring's alpha-beta model and
// its fit, and the overlap of buckets with the backward pass; and the table bench scaling prints of its
// report (src/bench/scaling_run.hpp).
#include "src/bench/scaling.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "src/bench/scaling_run.hpp"

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
  const std::vector<Prediction> rows =
      predict(seed.ranks, seed.compute, seed.allreduce, single_bucket(1.0 / 3.0, 1), 0);
  const auto row = [&](int n) { return rows[static_cast<std::size_t>(n - 1)]; };
  // T(N) = 400/N + 25 ms.
  EXPECT_DOUBLE_EQ(row(1).step, 0.400);
  EXPECT_DOUBLE_EQ(row(2).step, 0.225);
  EXPECT_DOUBLE_EQ(row(4).step, 0.125);
  EXPECT_DOUBLE_EQ(row(8).step, 0.075);
  EXPECT_DOUBLE_EQ(row(16).step, 0.050);
  EXPECT_NEAR(row(2).speedup, 400.0 / 225.0, 1e-12);  // 1.78
  EXPECT_NEAR(row(4).speedup, 3.2, 1e-12);
  EXPECT_NEAR(row(8).speedup, 16.0 / 3.0, 1e-12);  // 5.33
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
  EXPECT_DOUBLE_EQ(overlapped_step(1.0, s, a), 1.0);  // 0.25 + max(0.75, 0.5)
  const std::vector<double> b{1.0};
  EXPECT_DOUBLE_EQ(overlapped_step(1.0, s, b), 1.25);  // 0.25 + 1.0
}

TEST(AlphaBeta, RingTimes) {
  const AlphaBeta ab{10e-6, 1e9};
  EXPECT_DOUBLE_EQ(ab.seconds(1, 1e6), 0);
  // N = 4, 1 MB: 6 messages of 10 us, and 6/4 MB at 1 GB/s.
  EXPECT_NEAR(ab.seconds(4, 1e6), 60e-6 + 1.5e-3, 1e-15);
}

// The double binary tree: 2 ceil(log2 N) messages and the whole buffer twice at any N. The ring wins
// small worlds on bandwidth, the tree large ones on latency.
TEST(AlphaBeta, TreeTimesAndWhereTheTreeOvertakesTheRing) {
  const AlphaBeta ab{10e-6, 1e9};
  EXPECT_DOUBLE_EQ(ab.tree_seconds(1, 1e6), 0);
  EXPECT_NEAR(ab.tree_seconds(2, 1e6), 20e-6 + 2e-3, 1e-15);
  EXPECT_NEAR(ab.tree_seconds(5, 1e6), 60e-6 + 2e-3, 1e-15);
  EXPECT_NEAR(ab.tree_seconds(4096, 1e6), 240e-6 + 2e-3, 1e-15);
  EXPECT_LT(ab.seconds(8, 1e6), ab.tree_seconds(8, 1e6));        // 140 us + 1.75 ms against 60 us + 2 ms
  EXPECT_GT(ab.seconds(4096, 1e6), ab.tree_seconds(4096, 1e6));  // 81.9 ms + 2 ms against 0.24 ms + 2 ms
  int crossover = 2;
  while (ab.seconds(crossover, 1e6) <= ab.tree_seconds(crossover, 1e6)) ++crossover;
  EXPECT_EQ(crossover, 13);  // 240 us + 1.846 ms against 80 us + 2 ms
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

// The table of a report of three worlds as bench scaling prints it, beyond-the-sweep break-even and
// all: a report of a run on the development machine and the lines printed for it.
TEST(ScalingReport, PrintsTheReportAsATable) {
  const nlohmann::json report = nlohmann::json::parse(R"json({
 "batch": 32,
 "break_even": {
  "measured": 3,
  "predicted": 5
 },
 "bucket_mb": 1.0,
 "comm": "local",
 "command": "bench scaling",
 "engine": "cpu",
 "fit": {
  "alpha_us": 10.121025796450006,
  "beta_gbs": 15.23392928339034,
  "rms_relative_error": 0.10409856406792611,
  "samples": 10
 },
 "gradient_bytes": 264448,
 "model": "64,512,64",
 "rows": [
  {
   "allreduce_fit_ms": null,
   "allreduce_ms": null,
   "buckets": 1,
   "buckets_overlapped": 1,
   "compute_ms": 0.227484,
   "exposed_comm_bucketed_ms": 0.0,
   "exposed_comm_ms": 0.0,
   "measured_bucketed_ms": 0.362071,
   "measured_ms": 0.22518000000000002,
   "model_error": 0.9898718151606267,
   "model_error_overlap": 1.5916328181322643,
   "predicted_ms": 0.227484,
   "predicted_overlap_ms": 0.227484,
   "ranks": 1,
   "speedup_measured": 1.0,
   "speedup_measured_bucketed": 0.6219222196751466,
   "speedup_predicted": 1.0,
   "speedup_predicted_overlap": 1.0
  },
  {
   "allreduce_fit_ms": 0.037601197423275466,
   "allreduce_ms": 0.03754292,
   "buckets": 1,
   "buckets_overlapped": 1,
   "compute_ms": 0.12953699999999999,
   "exposed_comm_bucketed_ms": 0.046819,
   "exposed_comm_ms": 0.048753,
   "measured_bucketed_ms": 0.318608,
   "measured_ms": 0.26254099999999997,
   "model_error": 1.5708019115170788,
   "model_error_overlap": 1.9062548532405739,
   "predicted_ms": 0.16713819742327546,
   "predicted_overlap_ms": 0.16713819742327546,
   "ranks": 2,
   "speedup_measured": 0.857694607699369,
   "speedup_measured_bucketed": 0.7067619143273238,
   "speedup_predicted": 1.361053328964052,
   "speedup_predicted_overlap": 1.361053328964052
  },
  {
   "allreduce_fit_ms": 0.06362963095963398,
   "allreduce_ms": 0.06341532500000001,
   "buckets": 1,
   "buckets_overlapped": 1,
   "compute_ms": 0.142312,
   "exposed_comm_bucketed_ms": 0.197146,
   "exposed_comm_ms": 0.17430300000000004,
   "measured_bucketed_ms": 0.507398,
   "measured_ms": 0.439438,
   "model_error": 2.1337987756644163,
   "model_error_overlap": 2.4637951910726286,
   "predicted_ms": 0.20594163095963394,
   "predicted_overlap_ms": 0.20594163095963394,
   "ranks": 3,
   "speedup_measured": 0.5124272366067568,
   "speedup_measured_bucketed": 0.4437936294585315,
   "speedup_predicted": 1.1046042460671224,
   "speedup_predicted_overlap": 1.1046042460671224
  }
 ]
})json");
  const std::string expected =
      R"text(dpcheck bench scaling: model 64,512,64, batch 32, engine cpu, comm local; gradient 0.26 MB; buckets of 1 MiB
all-reduce, ring alpha-beta fit over 10 timings (N = 2..3): alpha 10.1 us, beta 15.23 GB/s, rms relative error 10%
times in ms per step; error = measured / predicted; exposed = communication the step did not hide
   N   compute    allred       fit |   predict  measured  error  S pred  S meas |   overlap  bucketed  error  S pred  S meas |  exposed  exp.bkt
   1      0.23       nan       nan |      0.23      0.23   0.99    1.00    1.00 |      0.23      0.36   1.59    1.00    0.62 |     0.00     0.00
   2      0.13      0.04      0.04 |      0.17      0.26   1.57    1.36    0.86 |      0.17      0.32   1.91    1.36    0.71 |     0.05     0.05
   3      0.14      0.06      0.06 |      0.21      0.44   2.13    1.10    0.51 |      0.21      0.51   2.46    1.10    0.44 |     0.17     0.20
break-even (exposed all-reduce >= compute): predicted N = 5 (beyond the sweep: c0 + c1/N and the fit), measured N = 3
)text";
  std::ostringstream out;
  print_report(out, report);
  EXPECT_EQ(out.str(), expected);
}

}  // namespace
}  // namespace dpcheck::scaling
