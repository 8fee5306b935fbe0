#include "python/torch_checks.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "reference/bound.hpp"
#include "src/error.hpp"
#include "src/low_precision.hpp"
#include "src/train/replica_check.hpp"

namespace dpcheck::torchjob {

namespace {

// "1/12" for a weight near the reciprocal of a whole number, else the number itself.
std::string weight_text(double w) {
  char buf[48];
  if (w > 0 && std::abs(1 / w - 1) < 1e-6) return "1";
  if (w > 0 && std::abs(1 / w - std::round(1 / w)) < 1e-6 * (1 / w))
    std::snprintf(buf, sizeof buf, "1/%.0f", std::round(1 / w));
  else std::snprintf(buf, sizeof buf, "%.6g", w);
  return buf;
}

// Fits the gradient as sum_p c_p S_p, S_p the float64 sum of part p's example gradients, and fills each
// part's weight c_p and the fit's relative residual.
void fit_weights(const GradientInput& in, GradientJudgement& j) {
  const std::size_t n = in.gradient.size(), k = in.parts.size();
  std::vector<std::vector<double>> sums(k);
  std::map<int, int> seen;  // micro-batches so far per rank
  for (std::size_t p = 0; p < k; ++p) {
    const Batch& b = in.parts[p].batch;
    PartWeight w;
    w.rank = in.parts[p].rank;
    w.micro_batch = seen[w.rank]++;
    w.examples = b.size;
    j.weights.push_back(w);
    sums[p].assign(n, 0.0);
    if (b.size == 0) continue;
    const reference::Gradient<double> g = reference::loss_and_gradient<double>(in.model, in.params, b);
    // The reference's loss is a mean over the part (and, for mse, its outputs): its sum over the part is
    // b times it.
    for (std::size_t i = 0; i < n; ++i) sums[p][i] = g.grad[i] * static_cast<double>(b.size);
  }
  Eigen::MatrixXd normal = Eigen::MatrixXd::Zero(static_cast<Eigen::Index>(k), static_cast<Eigen::Index>(k));
  Eigen::VectorXd rhs = Eigen::VectorXd::Zero(static_cast<Eigen::Index>(k));
  double norm = 0;
  for (std::size_t i = 0; i < n; ++i) norm += static_cast<double>(in.gradient[i]) * in.gradient[i];
  for (std::size_t a = 0; a < k; ++a) {
    for (std::size_t b = a; b < k; ++b) {
      double s = 0;
      for (std::size_t i = 0; i < n; ++i) s += sums[a][i] * sums[b][i];
      normal(static_cast<Eigen::Index>(a), static_cast<Eigen::Index>(b)) = s;
      normal(static_cast<Eigen::Index>(b), static_cast<Eigen::Index>(a)) = s;
    }
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) s += sums[a][i] * in.gradient[i];
    rhs(static_cast<Eigen::Index>(a)) = s;
  }
  const Eigen::VectorXd c = normal.completeOrthogonalDecomposition().solve(rhs);
  double residual = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double fitted = 0;
    for (std::size_t p = 0; p < k; ++p) fitted += c(static_cast<Eigen::Index>(p)) * sums[p][i];
    residual += (in.gradient[i] - fitted) * (in.gradient[i] - fitted);
  }
  j.fit_residual = norm > 0 ? std::sqrt(residual / norm) : std::sqrt(residual);
  const double expected = 1.0 / static_cast<double>(j.batch);
  for (std::size_t p = 0; p < k; ++p) {
    j.weights[p].weight = c(static_cast<Eigen::Index>(p));
    if (j.weights[p].examples > 0 && std::abs(j.weights[p].weight - expected) > 1e-3 * expected)
      j.weights_differ = true;
  }
}

std::string weights_text(const GradientJudgement& j) {
  std::string s;
  // Micro-batches are named where some rank gave more than one part.
  const bool several =
      std::any_of(j.weights.begin(), j.weights.end(), [](const PartWeight& w) { return w.micro_batch > 0; });
  for (const PartWeight& w : j.weights) {
    if (w.examples == 0) continue;
    s += (s.empty() ? "" : "; ") + std::string("rank ") + std::to_string(w.rank);
    if (several) s += " micro-batch " + std::to_string(w.micro_batch);
    s += " (" + std::to_string(w.examples) + (w.examples == 1 ? " example) " : " examples) ") + weight_text(w.weight);
  }
  return s;
}

}  // namespace

GradientJudgement judge_gradient(const GradientInput& in) {
  in.model.validate();
  const ParamLayout layout(in.model);
  if (in.params.size() != layout.size() || in.gradient.size() != layout.size())
    throw UsageError("the parameters and the gradient must hold the model's " + std::to_string(layout.size()) +
                     " elements");
  if (in.parts.empty()) throw UsageError("no rank recorded a batch for the checked step");
  if (in.world_size < 1) throw UsageError("the world size must be at least 1");
  GradientJudgement j;
  std::vector<Batch> batches;
  std::map<int, std::int64_t> share;
  for (const GradientPart& p : in.parts) {
    batches.push_back(p.batch);
    share[p.rank] += p.batch.size;
  }
  const Batch whole = concat(batches);
  j.batch = whole.size;
  if (j.batch == 0) throw UsageError("the checked step's batches hold no example");
  for (const auto& [rank, size] : share) j.largest_share = std::max(j.largest_share, size);

  const reference::BoundOptions options;
  const reference::GradientBound bound = reference::gradient_bound(in.model, in.params, whole, options);
  j.roundings = reference::sharded_roundings(j.largest_share, in.world_size, options);
  const reference::Comparison cmp = reference::compare(in.gradient, bound, j.roundings);
  j.ratio = cmp.max_ratio;
  j.passed = cmp.passed();
  j.element = layout.describe_element(cmp.worst);
  j.value = cmp.worst_value;
  j.reference = cmp.worst_reference;
  j.bound = cmp.worst_bound;
  j.bound_terms = bound.terms(cmp.worst, j.roundings).describe();
  fit_weights(in, j);

  char head[320];
  std::snprintf(head, sizeof head,
                "the all-reduced gradient against the float64 gradient of the whole batch of %lld examples on %d "
                "ranks: error ratio %.3g at %s (value %s, float64 %s, bound %.3g)",
                static_cast<long long>(j.batch), in.world_size, j.ratio, j.element.c_str(), float_text(j.value).c_str(),
                float_text(j.reference).c_str(), j.bound);
  std::string text = head;
  const std::string whole_weight = weight_text(1.0 / static_cast<double>(j.batch));
  // One weight for every example, not 1 / B: the gradient scaled as a whole.
  double lo = INFINITY, hi = -INFINITY;
  for (const PartWeight& w : j.weights)
    if (w.examples > 0) {
      lo = std::min(lo, w.weight);
      hi = std::max(hi, w.weight);
    }
  const bool uniform = hi - lo <= 1e-6 * std::abs(hi);
  if (j.weights_differ && j.fit_residual < 1e-3 && uniform)
    text += "; every example weighs " + weight_text(hi) + " where the whole batch's mean weighs each " + whole_weight +
            ": the gradient is scaled as a whole (a loss summed rather than averaged, a scale left on it, or "
            "gradient clipping before the check)";
  else if (j.weights_differ && j.fit_residual < 1e-3)
    text += "; the examples' weights differ: " + weights_text(j) + ", where the whole batch's mean weighs each " +
            whole_weight;
  else if (!j.passed) {
    char fit[96];
    std::snprintf(fit, sizeof fit, "%.3g", j.fit_residual);
    text += "; no weighting of the ranks' batches explains it (fit residual " + std::string(fit) + ")";
  } else text += "; every example weighs " + whole_weight;
  j.message = text;
  return j;
}

namespace {

struct DTypeInfo {
  std::size_t size = 4;
  int float_width = 0;  // 16, 32, 64 for a float; 0 for an integer
  bool is_signed = true;
  bool bf16 = false;
};

DTypeInfo dtype_info(const std::string& dtype) {
  static const std::map<std::string, DTypeInfo> table = {
      {"float32", {4, 32, true, false}}, {"float64", {8, 64, true, false}}, {"float16", {2, 16, true, false}},
      {"bfloat16", {2, 16, true, true}}, {"int64", {8, 0, true, false}},    {"int32", {4, 0, true, false}},
      {"int16", {2, 0, true, false}},    {"int8", {1, 0, true, false}},     {"uint8", {1, 0, false, false}},
      {"bool", {1, 0, false, false}}};
  const auto it = table.find(dtype);
  if (it == table.end()) throw UsageError("a tensor of dtype " + dtype + " cannot be compared element by element");
  return it->second;
}

std::uint64_t load_bits(const char* p, std::size_t size) {
  std::uint64_t v = 0;
  std::memcpy(&v, p, size);  // little-endian: the low bytes
  return v;
}

double as_double(std::uint64_t bits, const DTypeInfo& t) {
  switch (t.float_width) {
    case 64: return std::bit_cast<double>(bits);
    case 32: return std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    case 16:
      if (t.bf16) return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
      return static_cast<double>(fp16_bits_to_float(static_cast<std::uint16_t>(bits)));
    default: break;
  }
  if (!t.is_signed) return static_cast<double>(bits);
  const int shift = 64 - static_cast<int>(8 * t.size);
  return static_cast<double>(static_cast<std::int64_t>(bits << shift) >> shift);
}

std::string value_text(std::uint64_t bits, const DTypeInfo& t) {
  char buf[64];
  if (t.float_width == 0) {
    std::snprintf(buf, sizeof buf, "%.0f", as_double(bits, t));
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%s (0x%0*llx)", float_text(as_double(bits, t)).c_str(), t.float_width / 4,
                static_cast<unsigned long long>(bits));
  return buf;
}

std::string index_text(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  if (shape.empty()) return "";
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  std::string s = "[";
  for (std::size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
  return s + "]";
}

}  // namespace

TensorDifference locate_difference(const std::string& dtype, const std::vector<std::string_view>& ranks,
                                   const std::vector<std::int64_t>& shape) {
  const DTypeInfo t = dtype_info(dtype);
  TensorDifference d;
  if (ranks.empty()) return d;
  const std::size_t bytes = ranks[0].size();
  for (const std::string_view r : ranks)
    if (r.size() != bytes)
      throw UsageError("the ranks' copies of a tensor differ in size (" + std::to_string(r.size()) + " and " +
                       std::to_string(bytes) + " bytes)");
  const std::size_t count = bytes / t.size;
  std::int64_t first = -1;
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t base = load_bits(ranks[0].data() + i * t.size, t.size);
    for (std::size_t r = 1; r < ranks.size(); ++r)
      if (load_bits(ranks[r].data() + i * t.size, t.size) != base) {
        if (first < 0) first = static_cast<std::int64_t>(i);
        ++d.differing;
        break;
      }
  }
  if (first < 0) return d;
  d.differs = true;
  d.flat_index = first;
  d.index = count > 1 || !shape.empty() ? index_text(first, shape) : "";
  std::vector<std::uint64_t> bits;
  for (const std::string_view r : ranks) {
    bits.push_back(load_bits(r.data() + static_cast<std::size_t>(first) * t.size, t.size));
    d.values.push_back(as_double(bits.back(), t));
    d.texts.push_back(value_text(bits.back(), t));
  }
  const ElementVote vote = vote_element(bits, [&](std::uint64_t a, std::uint64_t b) -> std::uint64_t {
    if (t.float_width != 0) return ulp_distance_bits(a, b, t.float_width);
    const double x = as_double(a, t), y = as_double(b, t);
    return static_cast<std::uint64_t>(std::abs(x - y));
  });
  d.minority = vote.minority;
  d.distance = vote.max_distance;
  d.unit = t.float_width != 0 ? "ulp" : "";
  return d;
}

}  // namespace dpcheck::torchjob
