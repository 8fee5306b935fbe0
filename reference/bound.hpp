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
//   whole backward contribution is added to the bound (an "uncertain unit").
// For a gradient element g = sum over examples of delta * a, the bound is then
//   propagated + gamma_m * magnitude,   magnitude = sum over examples of |delta^| |a^|,
// with m the roundings each term meets in the batch reduction of that path: B on the whole batch;
// the largest micro-batch + micro-batches + N when shards are reduced and all-reduced; plus a few for
// the scale factors (1/B, shard weights) wherever an implementation applies them.
// The bound scales with the magnitudes, never with |g|, so cancellation cannot make it too tight.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "reference/mlp.hpp"

namespace dpcheck::reference {

struct BoundOptions {
  double unit_roundoff = 0x1p-24;  // float32; tf32 and fp16 2^-11, bf16 2^-8
  double exp_error = 8;            // relative error of the engine's exp, in units of u (4 ulp; CUDA's expf: 2)
  double tanh_error = 8;           // relative error of the engine's tanh, in units of u (4 ulp)
  std::int64_t slack_roundings = 4;  // scale factors applied somewhere on the path
  // Extra relative error of every term of a matrix product, in units of u: 0 when the product's inputs
  // are used as they are; 4 for TF32, whose inputs lose their low mantissa bits (up to 2u each when
  // truncated rather than rounded).
  std::int64_t product_input_roundings = 0;
};

double gamma(std::int64_t n, double u);  // n u / (1 - n u); +infinity once n u >= 1

struct GradientBound {
  Gradient<double> reference;     // the float64 whole-batch gradient
  std::vector<double> propagated;  // error carried in from forward and backward, per element
  std::vector<double> magnitude;   // sum over examples of |delta^| |a^| (|delta^| for a bias)
  std::vector<double> floor;       // float64 reference error and float32 underflow, per element
  std::int64_t uncertain_units = 0;  // (example, unit) pairs within rounding of a ReLU kink
  BoundOptions options;

  // Bound on |g_float32[i] - g_exact[i]| for a path whose batch reduction takes m roundings per term.
  double bound(std::size_t i, std::int64_t m) const;
};

GradientBound gradient_bound(const ModelConfig& model, std::span<const float> params, const Batch& batch,
                             const BoundOptions& options = {});

// Roundings per term of the batch reduction (see above).
std::int64_t whole_batch_roundings(std::int64_t batch, const BoundOptions& options = {});
std::int64_t sharded_roundings(std::int64_t largest_micro_batch, std::int64_t micro_batches, int world_size,
                               const BoundOptions& options = {});

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
