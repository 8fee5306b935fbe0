// The engine's operations one at a time, as a kernel plugin implements them (include/dpcheck/plugin.h):
// the float64 value of every output from the float32 inputs (exact in float64), and the derived bound
// on how far a correct float32 evaluation, in any order, can land from it. Used by `dpcheck conform`.
//
// Each bound follows the derivation of reference/bound.hpp for one operation with exact inputs:
//   a sum of k terms (a dot product, a column sum, a mean) in any order: gamma_k * sum |terms|;
//   accumulating into an old value adds one term;
//   exp and tanh: BoundOptions::exp_error / tanh_error units of u relative, besides their argument's;
//   scale factors (2 / (rows cols), 1 / rows, the caller's scale) may be rounded and applied in any
//   order: slack_roundings roundings more;
//   every operation below the normal range: up to underflow_unit absolute;
//   the float64 reference's own rounding: 4 gamma_{k+16} at 2^-53 of the magnitude.
// ReLU and its derivative are exact (bound 0): any difference is an error. So are dw and db of an empty
// batch (rows = 0): with nothing to add, the old value (accumulating) or zero comes back untouched.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "reference/bound.hpp"
#include "src/train/model.hpp"

namespace dpcheck::reference {

// Expected outputs and, element by element, the bound on a correct float32 result's distance from them.
struct Expected {
  std::vector<double> value, bound;
};

// y = x w^T + b: x rows x in, w out x in, b out.
Expected linear_forward_expected(std::span<const float> x, std::span<const float> w, std::span<const float> b,
                                 std::int64_t rows, std::int64_t in, std::int64_t out,
                                 const BoundOptions& options = {});

// dx = dy w; dw = old_dw + dy^T x; db = old_db + column sums of dy. Empty olds: written, not accumulated.
struct LinearBackwardExpected {
  Expected dx, dw, db;
};
LinearBackwardExpected linear_backward_expected(std::span<const float> x, std::span<const float> w,
                                                std::span<const float> dy, std::span<const float> old_dw,
                                                std::span<const float> old_db, std::int64_t rows, std::int64_t in,
                                                std::int64_t out, const BoundOptions& options = {});

// y = f(x) (relu or tanh), and dx = dy f'(x) with y = f(x) given (tanh' = 1 - y^2, relu' = [x > 0]).
Expected activation_forward_expected(Activation act, std::span<const float> x, const BoundOptions& options = {});
Expected activation_backward_expected(Activation act, std::span<const float> x, std::span<const float> y,
                                      std::span<const float> dy, const BoundOptions& options = {});

// dout = scale d(mean loss)/d(out) and the mean loss (mse over rows x cols, cross-entropy over rows with
// int64 labels), out rows x cols.
struct LossExpected {
  Expected dout;
  double loss = 0, loss_bound = 0;
};
LossExpected mse_expected(std::span<const float> out, std::span<const float> target, std::int64_t rows,
                          std::int64_t cols, double scale, const BoundOptions& options = {});
LossExpected cross_entropy_expected(std::span<const float> out, std::span<const std::int64_t> labels, std::int64_t rows,
                                    std::int64_t cols, double scale, const BoundOptions& options = {});

}  // namespace dpcheck::reference
