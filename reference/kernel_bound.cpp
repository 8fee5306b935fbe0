// Expected outputs and derived bounds of single kernel operations (reference/kernel_bound.hpp).
#include "reference/kernel_bound.hpp"

#include <algorithm>
#include <cmath>

#include "src/error.hpp"

namespace dpcheck::reference {

namespace {

// gamma for k roundings, as the options choose it, and loosened as they say.
double g(std::int64_t k, const BoundOptions& o) { return o.looseness * gamma_for(k, o); }

// The float64 reference's own rounding for a computation of depth k over terms of this magnitude, and
// float32 underflow in k operations.
double floor_of(double magnitude, std::int64_t k, const BoundOptions& o) {
  return 4 * gamma(k + 16, 0x1p-53) * magnitude + 2.0 * static_cast<double>(k) * o.underflow_unit;
}

std::size_t at(std::int64_t i) { return static_cast<std::size_t>(i); }

void resize(Expected& e, std::int64_t n) {
  e.value.assign(at(n), 0.0);
  e.bound.assign(at(n), 0.0);
}

// The columns one pass of add_products updates per row of a: a whole block is a constant trip count,
// which GCC vectorizes at -O2, and 4 rows of 256 sums and magnitudes stay in the first-level cache.
constexpr std::int64_t kBlockRows = 4, kBlockCols = 256;

// sum[col] += a b[col] and magnitude[col] += |a b[col]| over `width` columns, each column its own sum.
inline void add_row(double a, const float* __restrict b, double* __restrict sum, double* __restrict magnitude,
                    std::int64_t width) {
  for (std::int64_t col = 0; col < width; ++col) {
    const double t = a * double{b[col]};
    sum[col] += t;
    magnitude[col] += std::abs(t);
  }
}

// For an m x n result whose sums and magnitudes hold their first terms already: element (r, col) adds
// the terms a(r, p) b[p, col] for p = 0, 1, ..., depth - 1, in that order, and their magnitudes; a(r, p)
// is a[r * a_row + p * a_col] (so that a transpose needs no copy), b is depth x n, row-major. Every
// element's sum is the plain triple loop's, term by term: the loops only visit the elements a block at a
// time (each column a lane of its own, never summed with another), so that a 1024^3 product takes about a
// second (the plain loops' strided reads took several), and no result changes with the blocking.
void add_products(const float* a, std::int64_t a_row, std::int64_t a_col, const float* b, std::int64_t m,
                  std::int64_t depth, std::int64_t n, std::vector<double>& sum, std::vector<double>& magnitude) {
  DPCHECK_ASSERT(sum.size() == at(m * n) && magnitude.size() == at(m * n));
  for (std::int64_t r0 = 0; r0 < m; r0 += kBlockRows) {
    const std::int64_t r1 = std::min(r0 + kBlockRows, m);
    for (std::int64_t c0 = 0; c0 < n; c0 += kBlockCols) {
      const std::int64_t width = std::min(kBlockCols, n - c0);
      for (std::int64_t p = 0; p < depth; ++p)
        for (std::int64_t r = r0; r < r1; ++r) {
          const double ar = a[r * a_row + p * a_col];
          double* s = sum.data() + r * n + c0;
          double* g = magnitude.data() + r * n + c0;
          if (width == kBlockCols) add_row(ar, b + p * n + c0, s, g, kBlockCols);
          else add_row(ar, b + p * n + c0, s, g, width);
        }
    }
  }
}

}  // namespace

Expected linear_forward_expected(std::span<const float> x, std::span<const float> w, std::span<const float> b,
                                 std::int64_t rows, std::int64_t in, std::int64_t out, const BoundOptions& options) {
  DPCHECK_ASSERT(x.size() == at(rows * in) && w.size() == at(out * in) && b.size() == at(out));
  Expected e;
  resize(e, rows * out);
  // x w^T, each sum b[j] + x[i, 0] w[j, 0] + x[i, 1] w[j, 1] + ...: w transposed (an exact copy) so that
  // the terms of a row of y read a row of it.
  std::vector<float> wt(at(in * out));
  for (std::int64_t j = 0; j < out; ++j)
    for (std::int64_t k = 0; k < in; ++k) wt[at(k * out + j)] = w[at(j * in + k)];
  std::vector<double> magnitude(at(rows * out));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < out; ++j) {
      e.value[at(i * out + j)] = b[at(j)];
      magnitude[at(i * out + j)] = std::abs(double{b[at(j)]});
    }
  add_products(x.data(), in, 1, wt.data(), rows, in, out, e.value, magnitude);
  for (std::size_t i = 0; i < e.bound.size(); ++i)
    e.bound[i] = g(in + 1, options) * magnitude[i] + floor_of(magnitude[i], in + 1, options);
  return e;
}

LinearBackwardExpected linear_backward_expected(std::span<const float> x, std::span<const float> w,
                                                std::span<const float> dy, std::span<const float> old_dw,
                                                std::span<const float> old_db, std::int64_t rows, std::int64_t in,
                                                std::int64_t out, const BoundOptions& options) {
  DPCHECK_ASSERT(x.size() == at(rows * in) && w.size() == at(out * in) && dy.size() == at(rows * out));
  DPCHECK_ASSERT(old_dw.empty() == old_db.empty());
  const bool accumulate = !old_dw.empty();
  DPCHECK_ASSERT(!accumulate || (old_dw.size() == at(out * in) && old_db.size() == at(out)));
  LinearBackwardExpected e;
  resize(e.dx, rows * in);
  resize(e.dw, out * in);
  resize(e.db, out);
  // dx = dy w: out terms each, dy[i, 0] w[0, k] + dy[i, 1] w[1, k] + ...
  std::vector<double> magnitude(at(rows * in));
  add_products(dy.data(), out, 1, w.data(), rows, out, in, e.dx.value, magnitude);
  for (std::size_t i = 0; i < magnitude.size(); ++i)
    e.dx.bound[i] = g(out, options) * magnitude[i] + floor_of(magnitude[i], out, options);
  // dw = old + dy^T x and db = old + column sums: rows terms each, one more for the old value. With no rows
  // there is nothing to add: the old value (or zero) must come back untouched, so the bound is 0.
  const std::int64_t terms = rows + (accumulate ? 1 : 0);
  const auto bound = [&](double m) { return rows == 0 ? 0.0 : g(terms, options) * m + floor_of(m, terms, options); };
  magnitude.assign(at(out * in), 0.0);
  if (accumulate)
    for (std::size_t i = 0; i < magnitude.size(); ++i) {
      e.dw.value[i] = old_dw[i];
      magnitude[i] = std::abs(double{old_dw[i]});
    }
  // dw[j, k] = old + dy[0, j] x[0, k] + dy[1, j] x[1, k] + ...: dy read transposed.
  add_products(dy.data(), 1, out, x.data(), out, rows, in, e.dw.value, magnitude);
  for (std::size_t i = 0; i < magnitude.size(); ++i) e.dw.bound[i] = bound(magnitude[i]);
  for (std::int64_t j = 0; j < out; ++j) {
    const double old = accumulate ? double{old_db[at(j)]} : 0.0;
    double sum = old, db_magnitude = std::abs(old);
    for (std::int64_t i = 0; i < rows; ++i) {
      sum += double{dy[at(i * out + j)]};
      db_magnitude += std::abs(double{dy[at(i * out + j)]});
    }
    e.db.value[at(j)] = sum;
    e.db.bound[at(j)] = bound(db_magnitude);
  }
  return e;
}

Expected activation_forward_expected(Activation act, std::span<const float> x, const BoundOptions& options) {
  Expected e;
  resize(e, static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    switch (act) {
      case Activation::relu: e.value[i] = v > 0 ? v : 0.0; break;  // exact
      case Activation::identity: e.value[i] = v; break;
      case Activation::tanh:
        e.value[i] = std::tanh(v);
        e.bound[i] = options.looseness * options.tanh_error * options.unit_roundoff * std::abs(e.value[i]) +
                     floor_of(std::abs(e.value[i]), 1, options);
        break;
    }
  }
  return e;
}

Expected activation_backward_expected(Activation act, std::span<const float> x, std::span<const float> y,
                                      std::span<const float> dy, const BoundOptions& options) {
  DPCHECK_ASSERT(x.size() == y.size() && x.size() == dy.size());
  Expected e;
  resize(e, static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double h = dy[i], a = y[i];
    switch (act) {
      case Activation::relu: e.value[i] = x[i] > 0 ? h : 0.0; break;  // passes or drops dy exactly
      case Activation::identity: e.value[i] = h; break;
      case Activation::tanh: {
        // dy (1 - y y): the product y y, the subtraction and the product with dy round once each.
        e.value[i] = h * (1.0 - a * a);
        const double magnitude = std::abs(h) * (a * a + std::abs(1.0 - a * a));
        e.bound[i] = g(3, options) * magnitude + floor_of(magnitude, 3, options);
        break;
      }
    }
  }
  return e;
}

LossExpected mse_expected(std::span<const float> out, std::span<const float> target, std::int64_t rows,
                          std::int64_t cols, double scale, const BoundOptions& options) {
  DPCHECK_ASSERT(out.size() == at(rows * cols) && target.size() == out.size());
  LossExpected e;
  resize(e.dout, rows * cols);
  const std::int64_t n = rows * cols;
  const double c = 2.0 * scale / static_cast<double>(n);
  // fl(z - y) and the product with c, whose own roundings (2, scale, rows cols) are the slack.
  const std::int64_t k = 2 + options.slack_roundings;
  double squares = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double diff = double{out[at(i)]} - double{target[at(i)]};
    e.dout.value[at(i)] = c * diff;
    const double magnitude = std::abs(c * diff);
    e.dout.bound[at(i)] = g(k, options) * magnitude + floor_of(magnitude, k, options);
    squares += diff * diff;
  }
  // The mean of n squares of rounded differences, summed in any order, then divided.
  e.loss = squares / static_cast<double>(n);
  const std::int64_t m = n + 2 + options.slack_roundings;
  e.loss_bound = g(m, options) * e.loss + floor_of(e.loss, m, options);
  return e;
}

LossExpected cross_entropy_expected(std::span<const float> out, std::span<const std::int64_t> labels, std::int64_t rows,
                                    std::int64_t cols, double scale, const BoundOptions& options) {
  DPCHECK_ASSERT(out.size() == at(rows * cols) && labels.size() == at(rows));
  const double u = options.unit_roundoff, eta = options.underflow_unit, k = options.looseness;
  LossExpected e;
  resize(e.dout, rows * cols);
  const double c = scale / static_cast<double>(rows);
  double loss = 0, carried = 0, magnitude = 0;
  std::vector<double> p(at(cols)), arg_rel(at(cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* z = out.data() + r * cols;
    const double m = *std::max_element(z, z + cols);
    double sum = 0;
    for (std::int64_t j = 0; j < cols; ++j) sum += std::exp(double{z[j]} - m);
    // Relative error of each exp (its argument's rounding, which grows with |z - max|, and exp's own), of
    // the sum of exps weighted by each term's share, and of the division (reference/bound.cpp).
    double sum_rel = gamma_for(cols, options), max_arg = 0;
    for (std::int64_t j = 0; j < cols; ++j) {
      const double arg = std::abs(double{z[j]} - m);
      p[at(j)] = std::exp(double{z[j]} - m) / sum;
      arg_rel[at(j)] = u * arg + options.exp_error * u;
      sum_rel += p[at(j)] * arg_rel[at(j)];
      max_arg = std::max(max_arg, arg);
    }
    const std::int64_t label = labels[at(r)];
    DPCHECK_ASSERT(label >= 0 && label < cols);
    for (std::int64_t j = 0; j < cols; ++j) {
      const double ep = p[at(j)] * std::expm1(arg_rel[at(j)] + 1.01 * sum_rel + u) + 8 * eta;
      const double diff = p[at(j)] - (j == label ? 1.0 : 0.0);
      e.dout.value[at(r * cols + j)] = c * diff;
      // p - onehot, the product with c, and c's own roundings (the slack).
      e.dout.bound[at(r * cols + j)] =
          k * std::abs(c) * (ep + gamma_for(3 + options.slack_roundings, options) * (std::abs(diff) + ep)) +
          floor_of(std::abs(c) * (std::abs(diff) + ep), cols, options) + 4 * eta;
    }
    // The row's loss, logsumexp - z[label]: the sum's and the exps' error, log's own, two additions.
    const double lse = m + std::log(sum);
    const double row = lse - double{z[label]};
    const double own = 1.01 * sum_rel + u * max_arg + options.exp_error * u * std::abs(std::log(sum)) +
                       2 * u * (std::abs(lse) + std::abs(double{z[label]}));
    loss += row;
    carried += own;
    magnitude += std::abs(row) + own;
  }
  const auto rows_d = static_cast<double>(rows);
  e.loss = loss / rows_d;
  e.loss_bound = k * (carried / rows_d + gamma_for(rows + options.slack_roundings, options) * magnitude / rows_d) +
                 floor_of(magnitude / rows_d, rows + cols + 4, options);
  return e;
}

}  // namespace dpcheck::reference
