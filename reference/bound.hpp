// The derived error bound (DESIGN.md, "Tolerance"). A float32 gradient differs from the exact one only
// by rounding; this file bounds that rounding per element, from the data, so that a check can say
// "error beyond this is not rounding" instead of trusting a hand-picked rtol.
//
// A magnitude pass runs beside the float64 reference. For every intermediate value q of every example
// it carries an absolute bound E_q on |q_float32 - q_exact| that holds for any summation order:
//   a dot product of n terms in any order is within gamma_n * sum|terms| (Higham, Accuracy and
//   Stability of Numerical Algorithms, 2nd ed., section 3.1), gamma_n = n u / (1 - n u);
//   an input error propagates through |W| (linear layers), through the largest derivative on the
//   interval it spans (tanh, exp), and unchanged through a ReLU;
//   a ReLU whose input lies within its own bound of 0 may take either side in two float paths, so its
//   whole backward contribution is added to the bound (an "uncertain unit");
//   below the normal range an operation's error is absolute: each product and each sum adds up to
//   half the smallest subnormal spacing (eta = 2^-150 for float32) besides its relative error.
// For a gradient element g = sum over examples of delta * a, the bound is then
//   propagated + gamma_m * magnitude + 2 m eta,   magnitude = sum over examples of |delta^| |a^|,
// with m the roundings each term meets in the batch reduction of that path: B on the whole batch;
// the largest micro-batch + micro-batches + N when shards are reduced and all-reduced; plus a few for
// the scale factors (1/B, shard weights) wherever an implementation applies them.
// The bound scales with the magnitudes, never with |g|, so cancellation cannot make it too tight.
//
// The probabilistic variant (Higham and Mary, "A new approach to probabilistic rounding error analysis",
// SIAM J. Sci. Comput. 41(5), 2019, Theorem 3.1) replaces every gamma_n by
//   gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1,
// which bounds a dot product of n terms with probability at least 1 - 2n exp(-lambda^2 (1 - u)^2 / 2)
// when the rounding errors are independent and of mean zero. lambda is chosen per n so that this
// failure probability is the stated one for each dot product (an element's bound combines several: its
// batch reduction and the fan-ins it is carried through, so its own failure probability is up to that
// many times larger). Where gamma_n is the smaller (short sums), it is used. The probabilistic bound is
// reported beside the worst-case one and is never the verdict: its model of independent errors is an
// assumption, not a theorem about any order.
//
// Mixed precision (input_format bf16 or fp16; reference/mlp.hpp defines the model). The weights and
// the inputs are float32 values known exactly, so their rounding is part of the model: the reference
// rounds them as the engine does, and they carry no error. An activation or a delta is rounded after
// float32 arithmetic has moved it by up to its bound E from the float64 value v: if no rounding
// boundary of the format lies within [v - E, v + E], the engine's value rounds to the same number as
// v, exactly, and the error is gone; if one does (the analogue of a ReLU within rounding of its kink),
// the rounded value may be either neighbour, and its error is the width R(v + E) - R(v - E). Products
// of two bf16 or two fp16 numbers are exact in float32, so the products' own rounding is the float32
// accumulation's, as without mixed precision. The bound is then as tight as float32's wherever the
// roundings are certain, which is what lets it tell a dropped example, or a product accumulated in
// bf16, from rounding.
//
// Where the bound is nearly met. The kink term is the whole contribution of a unit whose ReLU input is
// within rounding of 0, because the two float paths may take different sides of the kink; when they
// do, the error at the elements it feeds is that contribution almost exactly, so the error ratio there
// is 1 less the relative size of the other terms (0.998 and above is usual). That is the bound doing
// its job at a discontinuity, not a missing term. `terms` splits an element's bound so a report can
// say which part it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "reference/allreduce_schedule.hpp"
#include "reference/mlp.hpp"

namespace dpcheck::reference {

struct BoundOptions {
  double unit_roundoff = 0x1p-24;  // float32; tf32 and fp16 2^-11, bf16 2^-8
  double exp_error = 8;            // relative error of the engine's exp, in units of u (4 ulp; CUDA's expf: 2)
  double tanh_error = 8;           // relative error of the engine's tanh, in units of u (4 ulp)
  // Roundings of the scale factors on a term's path: the loss coefficient (rounded, and its product),
  // the share and micro-batch weight (rounded, and its product), and the average over ranks (a
  // division, or a rounded reciprocal and its product). The trainer uses four of these six.
  std::int64_t slack_roundings = 6;
  // Extra relative error of every term of a matrix product, in units of u: 0 when the product's inputs
  // are used as they are; 4 for TF32, whose inputs lose their low mantissa bits (up to 2u each when
  // truncated rather than rounded).
  std::int64_t product_input_roundings = 0;
  // --precision: the format every matrix product's inputs are rounded to (above), and the scale the
  // delta is rounded at (as delta_scale * delta). That is the loss scale on the whole batch, and N times
  // it on a path of N shards: the trainer's weights make each example's delta N / B of its loss's
  // gradient there, where the whole batch's is 1 / B. For N a power of two the two round alike (away
  // from the format's subnormals and overflow).
  Precision input_format = Precision::fp32;
  double delta_scale = 1;
  // --allreduce-dtype bf16: the all-reduce rounds each rank's gradient to bf16, then adds the ranks'
  // gradients as its schedule does, rounding to bf16 where the schedule rounds (NCCL's ring: each of
  // its N - 1 hops and the average, so N + 1 roundings of bf16's unit roundoff in all; dpcheck's host
  // backends: once, after float32's N - 1 additions). allreduce_roundings counts them in units of u
  // (2^16 each for bf16; set for the all-reduced path by sharded_bound_options from the schedule's
  // depth); they enter the bound in the worst case even in the probabilistic variant, as one rounding
  // each is no sum of many small ones.
  Precision allreduce_format = Precision::fp32;
  std::int64_t allreduce_roundings = 0;
  // The all-reduce's schedule, where its backend reduces in one (reference/allreduce_schedule.hpp:
  // dpcheck's own host backends add in float32 in rank order and round once). None: any order, each
  // addition rounded, whose deepest path is a chain's N - 1 additions.
  std::optional<AllreduceSchedule> allreduce_schedule;
  // Half the spacing of the smallest subnormals: below the normal range an operation's error is
  // absolute, up to this, besides its relative error u (2^-150 for float32 and TF32, 2^-134 for bf16,
  // 2^-25 for fp16). Every operation in the magnitude pass adds it.
  double underflow_unit = 0x1p-150;
  // 0: the worst-case bound (gamma_n). In (0, 1): the probabilistic bound, with this probability that
  // any one dot product's error exceeds it (see above).
  double failure_probability = 0;
  // The kink term (see above). Off only in the mutant that shows the adversarial property notices a
  // missing term; a bound without it raises false alarms.
  bool uncertain_kinks = true;
  // The whole bound times this: above 1 only in the mutant that shows a loosened bound fails verify.
  double looseness = 1;
};

double gamma(std::int64_t n, double u);  // n u / (1 - n u); +infinity once n u >= 1
// gamma~_n(lambda) with lambda = sqrt(2 ln(2n / p)) / (1 - u): the probabilistic counterpart.
double gamma_probabilistic(std::int64_t n, double u, double failure_probability);
// gamma or gamma_probabilistic, as the options say.
double gamma_for(std::int64_t n, const BoundOptions& options);

// An element's bound split into its parts.
struct BoundTerms {
  double propagated = 0;  // carried in from forward and backward
  double kink = 0;        // the part of `propagated` due to units within rounding of a ReLU kink
  double rounding = 0;    // gamma_m * magnitude: the batch reduction's own rounding
  double floor = 0;       // float64 reference error and float32 underflow
  double total() const { return propagated + rounding + floor; }
  // "bound 2.2e-06 = 99.9% kink (whole contribution of a unit at a ReLU kink) + 0.0% carried + 0.1% rounding"
  std::string describe() const;
};

struct GradientBound {
  Gradient<double> reference;            // the float64 whole-batch gradient
  std::vector<double> propagated;        // error carried in from forward and backward, per element
  std::vector<double> kink;              // the part of propagated that uncertain ReLU units contribute
  std::vector<double> magnitude;         // sum over examples of |delta^| |a^| (|delta^| for a bias)
  std::vector<double> floor;             // float64 reference error and float32 underflow, per element
  std::int64_t uncertain_units = 0;      // (example, unit) pairs within rounding of a ReLU kink
  std::int64_t uncertain_roundings = 0;  // product inputs within their bound of a rounding boundary
  BoundOptions options;

  // Bound on |g_float32[i] - g_exact[i]| for a path whose batch reduction takes m roundings per term.
  double bound(std::size_t i, std::int64_t m) const;
  BoundTerms terms(std::size_t i, std::int64_t m) const;

  // The mean loss: the float64 value and a bound on the error of any float32 evaluation of it from
  // the float32 outputs (the outputs' own error carried through, and the loss's own roundings).
  double loss = 0;
  double loss_bound = 0;
};

GradientBound gradient_bound(const ModelConfig& model, std::span<const float> params, const Batch& batch,
                             const BoundOptions& options = {});

// Roundings per term of the batch reduction (see above): a sum of n terms in any association rounds
// each term at most n - 1 times, and its product once. Whole batch: B; sharded: the largest share (its
// micro-batches summed apart and added, or accumulated in place: either way a sum of its terms) and
// N - 1 in the all-reduce, plus one. Both add slack_roundings for the scale factors. (A bf16
// all-reduce's roundings are BoundOptions::allreduce_roundings.)
std::int64_t whole_batch_roundings(std::int64_t batch, const BoundOptions& options = {});
std::int64_t sharded_roundings(std::int64_t largest_share, int world_size, const BoundOptions& options = {});

// How a float32 gradient compares with the reference: the largest error, the largest error / bound
// (the error ratio; the check passes when it is at most 1), and where it was largest.
struct Comparison {
  double max_error = 0;
  double max_ratio = 0;
  std::size_t worst = 0;  // element with the largest ratio
  double worst_value = 0, worst_reference = 0, worst_bound = 0;
  bool passed() const { return max_ratio <= 1.0; }
};

// NaN or infinity in grad is an infinite ratio. With scale, grad is multiplied by it (in double) first.
Comparison compare(std::span<const float> grad, const GradientBound& bound, std::int64_t m, double scale = 1.0);

}  // namespace dpcheck::reference
