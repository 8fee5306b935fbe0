// The speed-up model of data-parallel training: compute against communication (`dpcheck bench
// scaling`).
//
// On N ranks a step computes a share of B/N examples, C(N), and all-reduces the gradient, A(N). With
// no overlap it takes T(N) = C(N) + A(N) (T(1) = C(1): one rank all-reduces nothing), and the speed-up
// is T(1) / T(N). The all-reduce follows the alpha-beta model of a ring (Thakur, Rabenseifner and Gropp
// 2005; Patarasuk and Yuan 2009): 2(N - 1) messages of latency alpha, and each rank sends and receives
// 2(N - 1)/N of the S bytes at bandwidth beta,
//
//   A(N) = 2(N - 1) alpha + 2(N - 1)/N * S / beta.
//
// With buckets (src/train/bucketing.hpp) the all-reduce overlaps the backward pass: bucket j is ready once
// the backward pass has done its share r_j of the work, and the buckets are reduced one after the
// other, so bucket j ends at c_j = max(c_{j-1}, F + r_j W) + A_j(N), with F the forward pass, W the
// backward pass and A_j the all-reduce of bucket j; the step ends at max(F + W, c_last). Forward and
// backward are told apart by their products: a layer's forward pass is one product, its backward pass
// two (one for the first layer, which passes no gradient on), all of the same size; a layer's gradient
// is final after the first of its two, the weight gradient.
//
// Break-even: the smallest N at which the communication the step does not hide is at least its compute,
// A(N) >= C(N) (exposed >= C(N) with overlap). Past it the step is mostly communication, and the
// speed-up can never reach C(1) / A for an all-reduce of A.
//
// The project's first question, as a worked answer (tests/scaling_test.cpp): 400 ms of compute a step on
// one device and 25 ms for an all-reduce give T(N) = 400/N + 25 ms; speed-ups 1.78, 3.2, 5.33 and 8 on
// 2, 4, 8 and 16 devices, never past 400/25 = 16; break-even at N = 16, where the all-reduce takes as
// long as the 25 ms of compute. Overlapped with a backward pass of two thirds of the compute, the
// all-reduce hides entirely up to N = 10 and the break-even moves to N = 27.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "src/train/bucketing.hpp"
#include "src/train/model.hpp"

namespace dpcheck::scaling {

struct AlphaBeta {
  double alpha = 0;  // seconds per message
  double beta = 0;   // bytes per second; 0: bandwidth costs nothing (infinite)
  // A ring all-reduce of `bytes` on `ranks` ranks; 0 on one rank.
  double seconds(int ranks, double bytes) const;
  // A double binary tree's (NCCL's tree; Sanders, Speck and Traeff, "Two-tree algorithms for full
  // bandwidth broadcast, reduction and scan", Parallel Computing 35, 2009): a reduction up each tree and
  // a broadcast down it, pipelined, 2 ceil(log2 N) messages of latency alpha; each rank sends and
  // receives the whole buffer twice (inner in one tree, a leaf in the other), 2 S / beta. The ring's
  // latency grows with N and the tree's with log N, at a little more bandwidth: the tree wins at scale.
  double tree_seconds(int ranks, double bytes) const;
};

struct AllreduceSample {
  int ranks = 0;
  double bytes = 0;
  double seconds = 0;
};

struct AlphaBetaFit {
  AlphaBeta model;
  double rms_relative_error = 0;  // sqrt(mean((fit - measured) / measured)^2) over the samples
  std::size_t samples = 0;
};

// alpha and 1/beta by least squares over the samples' relative errors (so that small and large
// messages weigh alike), neither below zero. Samples on one rank are left out. Error when fewer than
// two samples remain, or none of them has a positive time.
AlphaBetaFit fit_alpha_beta(std::span<const AllreduceSample> samples);

// How a step's compute divides: the forward pass's share of it, and for each bucket (in the order they
// are reduced) the share of the backward pass done when it is ready.
struct ComputeShape {
  double forward_fraction = 1.0 / 3.0;
  std::vector<double> bucket_bytes;
  std::vector<double> bucket_ready;  // in [0, 1], non-decreasing
};

// The shape of an MLP's step, from its products' sizes: its forward share, and its buckets of at most
// `bucket_cap` elements (plan_buckets), each ready when its lowest layer's backward pass is done.
ComputeShape mlp_shape(const ModelConfig& model, std::size_t bucket_cap);
// The same with the all-reduce after the whole backward pass: one bucket, ready at its end.
ComputeShape single_bucket(double forward_fraction, double gradient_bytes);

// The step of `compute` seconds whose buckets take these seconds each to all-reduce, each started once
// it is ready and the one before it is done (no overlap when the only bucket is ready at the end of the
// backward pass).
double overlapped_step(double compute, const ComputeShape& shape, std::span<const double> bucket_seconds);

struct Prediction {
  int ranks = 0;
  double compute = 0;    // C(N), seconds
  double allreduce = 0;  // A(N), seconds (0 on one rank)
  double step = 0;       // C + A
  double step_overlap = 0;
  double speedup = 0;  // T(1) / T(N), T(1) being rows[0]'s step: the one-rank step
  double speedup_overlap = 0;
  double exposed = 0, exposed_overlap = 0;  // the step minus its compute
};

// Rows for each N of `ranks` (which must start at 1), from each N's compute time and all-reduce time of
// the whole gradient (compute[i] and allreduce[i] belong to ranks[i]), and for the overlap the compute's
// shape and the all-reduce's latency alpha: each bucket pays the 2(N - 1) alpha of its messages and its
// share of the rest of A(N), in proportion to its bytes.
std::vector<Prediction> predict(std::span<const int> ranks, std::span<const double> compute,
                                std::span<const double> allreduce, const ComputeShape& shape, double alpha);

// The smallest N among the rows at which the exposed communication is at least the compute (overlap:
// with the overlapped step's); nullopt when no row reaches it.
std::optional<int> break_even(std::span<const Prediction> rows, bool overlap = false);

}  // namespace dpcheck::scaling
