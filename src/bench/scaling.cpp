#include "src/bench/scaling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "src/error.hpp"

namespace dpcheck::scaling {

double AlphaBeta::seconds(int ranks, double bytes) const {
  if (ranks <= 1) return 0;
  const double hops = 2.0 * (ranks - 1);
  return hops * alpha + (beta > 0 ? hops / ranks * bytes / beta : 0);
}

double AlphaBeta::tree_seconds(int ranks, double bytes) const {
  if (ranks <= 1) return 0;
  int depth = 0;
  while ((1 << depth) < ranks) ++depth;
  return 2.0 * depth * alpha + (beta > 0 ? 2.0 * bytes / beta : 0);
}

AlphaBetaFit fit_alpha_beta(std::span<const AllreduceSample> samples) {
  // t ~ alpha u + g v, u = 2(N - 1), v = 2(N - 1)/N S, g = 1/beta; each equation divided by t, so that
  // the residuals are relative errors.
  double aa = 0, ab = 0, bb = 0, a1 = 0, b1 = 0;
  std::size_t used = 0;
  for (const AllreduceSample& s : samples) {
    if (s.ranks <= 1 || !(s.seconds > 0)) continue;
    const double u = 2.0 * (s.ranks - 1) / s.seconds;
    const double v = 2.0 * (s.ranks - 1) / s.ranks * s.bytes / s.seconds;
    aa += u * u;
    ab += u * v;
    bb += v * v;
    a1 += u;
    b1 += v;
    ++used;
  }
  if (used < 2) throw Error("fitting the all-reduce's alpha-beta model takes two timed sizes on two ranks or more");
  const auto residual = [&](double alpha, double g) {
    double sum = 0;
    for (const AllreduceSample& s : samples) {
      if (s.ranks <= 1 || !(s.seconds > 0)) continue;
      const double fit = 2.0 * (s.ranks - 1) * alpha + 2.0 * (s.ranks - 1) / s.ranks * s.bytes * g;
      sum += (fit - s.seconds) * (fit - s.seconds) / (s.seconds * s.seconds);
    }
    return sum;
  };
  // The unconstrained solution when it is feasible; else the better of alpha alone and bandwidth alone.
  double best_alpha = aa > 0 ? a1 / aa : 0, best_g = 0;
  double best = residual(best_alpha, best_g);
  if (const double g = bb > 0 ? b1 / bb : 0; residual(0, g) < best) {
    best_alpha = 0;
    best_g = g;
    best = residual(0, g);
  }
  const double det = aa * bb - ab * ab;
  if (det > 0) {
    const double alpha = (a1 * bb - b1 * ab) / det;
    const double g = (aa * b1 - ab * a1) / det;
    if (alpha >= 0 && g >= 0 && residual(alpha, g) <= best) {
      best_alpha = alpha;
      best_g = g;
      best = residual(alpha, g);
    }
  }
  AlphaBetaFit f;
  f.model.alpha = best_alpha;
  f.model.beta = best_g > 0 ? 1.0 / best_g : 0;
  f.samples = used;
  f.rms_relative_error = std::sqrt(best / static_cast<double>(used));
  return f;
}

ComputeShape mlp_shape(const ModelConfig& model, std::size_t bucket_cap) {
  const ParamLayout layout(model);
  const int layers = model.layers();
  // Per layer: in x out multiply-adds a product; the forward pass one product, the backward pass two
  // (the weight gradient and the delta passed down), one for the first layer.
  std::vector<double> backward(static_cast<std::size_t>(layers));
  double forward = 0, total_backward = 0;
  for (int l = 0; l < layers; ++l) {
    const double size =
        static_cast<double>(model.dims[static_cast<std::size_t>(l)]) * model.dims[static_cast<std::size_t>(l) + 1];
    forward += size;
    backward[static_cast<std::size_t>(l)] = (l == 0 ? 1 : 2) * size;
    total_backward += backward[static_cast<std::size_t>(l)];
  }
  ComputeShape shape;
  shape.forward_fraction = forward / (forward + total_backward);
  for (const GradientBucket& b : plan_buckets(layout, bucket_cap)) {
    // Done once every layer above b.ready_layer has had its backward pass, and that layer its weight
    // gradient (the engine says so before it passes the delta down).
    double done = static_cast<double>(model.dims[static_cast<std::size_t>(b.ready_layer)]) *
                  model.dims[static_cast<std::size_t>(b.ready_layer) + 1];
    for (int l = layers - 1; l > b.ready_layer; --l) done += backward[static_cast<std::size_t>(l)];
    shape.bucket_bytes.push_back(static_cast<double>(b.hi - b.lo) * sizeof(float));
    shape.bucket_ready.push_back(done / total_backward);
  }
  return shape;
}

ComputeShape single_bucket(double forward_fraction, double gradient_bytes) {
  ComputeShape shape;
  shape.forward_fraction = forward_fraction;
  shape.bucket_bytes = {gradient_bytes};
  shape.bucket_ready = {1.0};
  return shape;
}

double overlapped_step(double compute, const ComputeShape& shape, std::span<const double> bucket_seconds) {
  DPCHECK_ASSERT(bucket_seconds.size() == shape.bucket_ready.size());
  const double forward = compute * shape.forward_fraction;
  const double backward = compute - forward;
  double done = forward;
  for (std::size_t j = 0; j < bucket_seconds.size(); ++j)
    done = std::max(done, forward + shape.bucket_ready[j] * backward) + bucket_seconds[j];
  return std::max(compute, done);
}

std::vector<Prediction> predict(std::span<const int> ranks, std::span<const double> compute,
                                std::span<const double> allreduce, const ComputeShape& shape, double alpha) {
  DPCHECK_ASSERT(!ranks.empty() && ranks[0] == 1 && compute.size() == ranks.size() && allreduce.size() == ranks.size());
  const double total_bytes = std::accumulate(shape.bucket_bytes.begin(), shape.bucket_bytes.end(), 0.0);
  std::vector<Prediction> rows;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    Prediction p;
    p.ranks = ranks[i];
    p.compute = compute[i];
    p.allreduce = p.ranks > 1 ? allreduce[i] : 0;
    p.step = p.compute + p.allreduce;
    // Each bucket: its messages' latency, and its bytes' share of the bandwidth part of A(N).
    const double latency = p.ranks > 1 ? 2.0 * (p.ranks - 1) * alpha : 0;
    const double bandwidth = std::max(0.0, p.allreduce - latency);
    std::vector<double> seconds;
    for (double bytes : shape.bucket_bytes)
      seconds.push_back(p.ranks > 1 ? latency + (total_bytes > 0 ? bandwidth * bytes / total_bytes : 0) : 0);
    p.step_overlap = overlapped_step(p.compute, shape, seconds);
    p.exposed = p.step - p.compute;
    p.exposed_overlap = p.step_overlap - p.compute;
    rows.push_back(p);
  }
  for (Prediction& p : rows) {
    p.speedup = p.step > 0 ? rows[0].step / p.step : 0;
    p.speedup_overlap = p.step_overlap > 0 ? rows[0].step / p.step_overlap : 0;
  }
  return rows;
}

std::optional<int> break_even(std::span<const Prediction> rows, bool overlap) {
  for (const Prediction& p : rows)
    if (p.ranks > 1 && (overlap ? p.exposed_overlap : p.exposed) >= p.compute) return p.ranks;
  return std::nullopt;
}

}  // namespace dpcheck::scaling
