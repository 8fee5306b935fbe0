// The classes of shapes conform --kernels draws its cases from (conform_kernels_internal.hpp says what
// each holds and why), the drawing of case i of a check, and the smaller cases a failing one shrinks
// to. Split from conform_kernels.cpp, which runs the cases and reports the rows.
#include <algorithm>
#include <iterator>

#include "conform/conform_kernels_internal.hpp"
#include "src/rng.hpp"

namespace dpcheck {
namespace conform_kernels_detail {

namespace {

constexpr std::int64_t kTinyMax = 8;
constexpr std::int64_t kEdgeMax = 70;
constexpr std::int64_t kEdges[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 70};
constexpr std::int64_t kOddMin = 101, kOddMax = 999, kOddSmallMax = 99;
// The case with rows, in and out all large keeps them to 640: three products of 1024^3 take a naive
// kernel (and the reference) tens of seconds.
constexpr std::int64_t kAllLargeMax = 640;

// 2^k - 1, 2^k + 1 and 2^k + 3 for k = 7..10, those up to max_size.
std::vector<std::int64_t> past_powers_of_two(std::int64_t max_size) {
  std::vector<std::int64_t> sizes;
  for (int k = 7; k <= 10; ++k)
    for (const std::int64_t d : {-1, 1, 3})
      if ((std::int64_t{1} << k) + d <= max_size) sizes.push_back((std::int64_t{1} << k) + d);
  return sizes;
}

// Whether a class has a size up to max_size (a class without one is dropped).
bool fits(ShapeClass s, std::int64_t max_size) {
  switch (s) {
    case ShapeClass::odd: return max_size >= kOddMin;
    case ShapeClass::past_power_of_two: return !past_powers_of_two(max_size).empty();
    case ShapeClass::large: return max_size >= kLargeMin;
    default: return true;
  }
}

// The classes cases 1, 2, ... take in turn (case 0 has every size 1, a tiny case): a run of 30 has five or
// six of each and three empty batches. The length, 11, is odd, so that each class meets accumulate (odd
// cases) and write (even ones) in turn; a class a check does not draw gives its turn to the next one.
constexpr ShapeClass kRotation[] = {ShapeClass::tile_edges,
                                    ShapeClass::past_power_of_two,
                                    ShapeClass::empty_batch,
                                    ShapeClass::large,
                                    ShapeClass::odd,
                                    ShapeClass::tiny,
                                    ShapeClass::tile_edges,
                                    ShapeClass::large,
                                    ShapeClass::past_power_of_two,
                                    ShapeClass::odd,
                                    ShapeClass::tiny};

ShapeClass shape_class_of(int i, std::span<const Field> fields, std::int64_t max_size) {
  if (i == 0) return ShapeClass::tiny;
  const std::size_t slot = static_cast<std::size_t>(i - 1) % std::size(kRotation);
  for (std::size_t j = 0;; ++j) {
    const ShapeClass s = kRotation[(slot + j) % std::size(kRotation)];
    if (drawn_for(s, fields, max_size)) return s;  // tile edges always is
  }
}

std::int64_t uniform_size(std::uint64_t key, std::uint64_t stream, std::uint64_t index, std::int64_t lo,
                          std::int64_t hi) {
  return lo + static_cast<std::int64_t>(random_below(key, stream, index, static_cast<std::uint64_t>(hi - lo + 1)));
}

// An odd size in [lo, hi], lo odd.
std::int64_t odd_size(std::uint64_t key, std::uint64_t stream, std::uint64_t index, std::int64_t lo, std::int64_t hi) {
  return lo + 2 * uniform_size(key, stream, index, 0, (hi - lo) / 2);
}

// Sizes around tile and vector widths, and any size up to 70; none past max_size.
std::int64_t tile_edge_size(std::uint64_t key, std::uint64_t index, std::int64_t max_size) {
  if (random_below(key, 20, index, 2) == 0) {
    std::vector<std::int64_t> edges;
    for (std::int64_t e : kEdges)
      if (e <= max_size) edges.push_back(e);
    return edges[random_below(key, 21, index, edges.size())];
  }
  return uniform_size(key, 22, index, 1, std::min(kEdgeMax, max_size));
}

// The sizes of a case of class s (`all_large`: the run's case with every size large). Odd, past a power of
// two and large give one or two sizes (of three; one of one) their own kind and the others moderate ones,
// which keeps a case's cost to a few times 10^8 multiply-adds.
void draw_sizes(Case& c, ShapeClass s, std::span<const Field> fields, bool all_large, std::int64_t max_size,
                std::uint64_t key, std::uint64_t idx) {
  const std::vector<Field> sizes = size_fields(fields);
  const std::size_t dims = sizes.size();
  const auto index = [&](std::size_t d) { return idx * 8 + d; };
  // Which sizes are the class's own: a random one or two of them, in a random order.
  std::vector<bool> own(dims, false);
  std::size_t count = all_large ? dims : std::min<std::size_t>(dims, 1 + random_below(key, 23, idx, 2));
  std::vector<std::size_t> order(dims);
  for (std::size_t d = 0; d < dims; ++d) order[d] = d;
  for (std::size_t d = dims; d > 1; --d) std::swap(order[d - 1], order[random_below(key, 24, index(d), d)]);
  for (std::size_t d = 0; d < count; ++d) own[order[d]] = true;
  for (std::size_t d = 0; d < dims; ++d) {
    std::int64_t& v = *int_field(c, sizes[d]);
    switch (s) {
      case ShapeClass::tiny: v = uniform_size(key, 25, index(d), 1, std::min(kTinyMax, max_size)); break;
      case ShapeClass::tile_edges: v = tile_edge_size(key, index(d), max_size); break;
      case ShapeClass::odd:
        v = own[d] ? odd_size(key, 26, index(d), kOddMin, std::min(kOddMax, max_size))
                   : odd_size(key, 26, index(d), 1, std::min(kOddSmallMax, max_size));
        break;
      case ShapeClass::past_power_of_two: {
        const std::vector<std::int64_t> powers = past_powers_of_two(max_size);
        v = own[d] ? powers[random_below(key, 27, index(d), powers.size())] : tile_edge_size(key, index(d), max_size);
        break;
      }
      case ShapeClass::large: {
        const std::int64_t hi = all_large && dims == 3 ? std::min(kAllLargeMax, max_size) : max_size;
        v = own[d] ? uniform_size(key, 28, index(d), kLargeMin, hi) : tile_edge_size(key, index(d), max_size);
        break;
      }
      case ShapeClass::empty_batch:
        // Products of nothing: in and out cost only their dw, so any size up to the limit.
        if (sizes[d] == Field::rows) v = 0;
        else if (random_below(key, 29, index(d), 2) == 0) v = tile_edge_size(key, index(d), max_size);
        else v = uniform_size(key, 30, index(d), 1, max_size);
        break;
    }
  }
}

}  // namespace

std::string shape_class_name(ShapeClass s) {
  switch (s) {
    case ShapeClass::tiny: return "tiny";
    case ShapeClass::tile_edges: return "tile edges";
    case ShapeClass::odd: return "odd";
    case ShapeClass::past_power_of_two: return "past a power of two";
    case ShapeClass::large: return "large";
    case ShapeClass::empty_batch: return "rows = 0";
  }
  return "?";
}

// The sizes a check's shape has: rows, in and out (linear ops), rows and out (the loss), or n (vectors).
std::vector<Field> size_fields(std::span<const Field> fields) {
  std::vector<Field> sizes;
  for (Field f : fields)
    if (f == Field::rows || f == Field::in || f == Field::out || f == Field::n) sizes.push_back(f);
  return sizes;
}

bool drawn_for(ShapeClass s, std::span<const Field> fields, std::int64_t max_size) {
  return fits(s, max_size) && (s != ShapeClass::empty_batch || allows_empty_batch(fields));
}

// The class a replayed case falls in, by its sizes (a drawn case's is the one it was drawn from): rows = 0,
// then any size past a power of two, then the largest size's range (71-512 counting as odd's, the
// hundreds).
ShapeClass shape_class_of(const Case& c, std::span<const Field> fields) {
  const std::vector<std::int64_t> powers = past_powers_of_two(kMaxSizeLimit);
  std::int64_t largest = 0;
  bool past_power = false;
  for (Field f : size_fields(fields)) {
    const std::int64_t v = *int_field(c, f);
    largest = std::max(largest, v);
    past_power = past_power || std::find(powers.begin(), powers.end(), v) != powers.end();
  }
  if (allows_empty_batch(fields) && c.rows == 0) return ShapeClass::empty_batch;
  if (past_power) return ShapeClass::past_power_of_two;
  if (largest >= kLargeMin) return ShapeClass::large;
  if (largest > kEdgeMax) return ShapeClass::odd;
  return largest > kTinyMax ? ShapeClass::tile_edges : ShapeClass::tiny;
}

// Case i of a check: the first has every size 1; the others are drawn, their shapes from the class whose
// turn it is (shape_class_of).
Drawn draw_case(const OpCheck& check, std::uint64_t seed, int i, std::int64_t max_size) {
  const std::uint64_t key = mix_key(seed, static_cast<std::uint64_t>(check.op) + 1);
  const auto idx = static_cast<std::uint64_t>(i);
  Case c;
  c.seed = random_u64(key, 10, idx) >> 16;  // short enough to read and type
  if (i == 0) return {c, ShapeClass::tiny};
  const ShapeClass shape = shape_class_of(i, check.fields, max_size);
  bool first_large = shape == ShapeClass::large;
  for (int j = 1; j < i && first_large; ++j)
    first_large = shape_class_of(j, check.fields, max_size) != ShapeClass::large;
  draw_sizes(c, shape, check.fields, first_large, max_size, key, idx);
  c.offset = static_cast<std::int64_t>(random_below(key, 6, idx, 4));
  c.accumulate = static_cast<std::int64_t>(i % 2);  // both ways, in turn
  c.dx = random_below(key, 7, idx, 4) == 0 ? 0 : 1;
  c.act = i % 2 == 0 ? Activation::tanh : Activation::relu;
  c.loss = (i / 2) % 2 == 0 ? Loss::cross_entropy : Loss::mse;
  static constexpr double kScales[] = {1.0, 0.75, 4.0, 0.3};
  c.scale = kScales[random_below(key, 8, idx, std::size(kScales))];
  // Steps 1 to 12: the first step (momentum's buffer, Adam's largest correction) and later ones.
  c.step = 1 + static_cast<std::int64_t>(random_below(key, 9, idx, 12));
  static constexpr double kLr[] = {0.1, 0.01, 0.5, 1e-3};
  c.lr = kLr[random_below(key, 11, idx, std::size(kLr))];
  static constexpr double kMomentum[] = {0.9, 0.5, 0.99};
  c.momentum = kMomentum[random_below(key, 12, idx, std::size(kMomentum))];
  static constexpr double kBeta1[] = {0.9, 0.8, 0.5};
  static constexpr double kBeta2[] = {0.999, 0.99, 0.9};
  c.beta1 = kBeta1[random_below(key, 13, idx, std::size(kBeta1))];
  c.beta2 = kBeta2[random_below(key, 14, idx, std::size(kBeta2))];
  static constexpr double kEps[] = {1e-8, 1e-6, 1e-3};
  c.eps = kEps[random_below(key, 15, idx, std::size(kEps))];
  return {c, shape};
}

// Smaller cases than c, the simplest first: each size down to 1 (a linear op's rows to 0 before that: an
// empty batch), to half, and then ever closer below it (now - now/4, now - now/8, ..., now - 1), so that a
// bug that needs a size past some threshold (in > 512, say) shrinks to just past it in a few rounds of a
// few tries; offset 0; written rather than accumulated; an earlier step; scale 1.
std::vector<Case> shrinks_of(const Case& c, std::span<const Field> fields) {
  std::vector<Case> out;
  for (Field f : fields) {
    Case d = c;
    std::int64_t* v = int_field(d, f);
    if (f == Field::rows || f == Field::in || f == Field::out || f == Field::n || f == Field::step) {
      const std::int64_t now = *v;
      const std::int64_t least = f == Field::rows && allows_empty_batch(fields) ? 0 : 1;
      std::vector<std::int64_t> to = {least, 1, now / 2};
      for (std::int64_t gap = now / 4; gap >= 1; gap /= 2) to.push_back(now - gap);
      to.push_back(now - 1);
      std::vector<std::int64_t> tried;
      for (const std::int64_t t : to)
        if (t >= least && t < now && std::find(tried.begin(), tried.end(), t) == tried.end()) {
          tried.push_back(t);
          Case e = c;
          *int_field(e, f) = t;
          out.push_back(e);
        }
    } else if ((f == Field::offset || f == Field::accumulate) && *v != 0) {
      *v = 0;
      out.push_back(d);
    } else if (f == Field::scale && c.scale != 1) {
      d.scale = 1;
      out.push_back(d);
    }
  }
  return out;
}

}  // namespace conform_kernels_detail
}  // namespace dpcheck
