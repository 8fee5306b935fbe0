#include "reference/allreduce_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "src/error.hpp"

namespace dpcheck::reference {

namespace {

constexpr ScheduleRow kSchedules[] = {
    {AllreduceSchedule::rank_order, "rank-order",
     "rank 0's buffer plus rank 1's, plus rank 2's, ... in float32, rounded once (dpcheck's local and mpi)"},
    {AllreduceSchedule::ring, "ring", "chunk c starts at rank c and is rounded at every hop around the ring"},
    {AllreduceSchedule::tree, "tree", "NCCL's double binary tree, each half of the buffer up one of the two trees"},
    {AllreduceSchedule::halving_doubling, "halving-doubling",
     "recursive halving and doubling (Rabenseifner), as MPICH and Gloo reduce"},
    {AllreduceSchedule::hierarchical, "hierarchical",
     "a ring within groups of consecutive ranks, then across the groups"},
    {AllreduceSchedule::linear, "linear",
     "rank N-1's buffer plus rank N-2's, ... plus rank 0's, each addition rounded (Open MPI's basic_linear)"},
};

// Open MPI 4.1.x, ompi/mca/coll/base/coll_base_allreduce.c: the ring's "count less than size - use
// recursive doubling" (recursive doubling pairs ranks as halving-doubling does, the odd rank of each
// extra pair first adding the even one), and Rabenseifner's "count < nprocs_pof2" to basic_linear.
// Segmented ring forced with no segment size runs as the ring (COLL_BASE_COMPUTED_SEGCOUNT leaves one
// segment, and a count below size * segcount goes to the ring).
constexpr LibrarySchedule kLibrarySchedules[] = {
    {"open-mpi-ring", AllreduceSchedule::ring, SwitchRule::count_below_world, AllreduceSchedule::halving_doubling,
     "Open MPI's ring (and segmented ring): ring; below N elements, recursive doubling (halving-doubling's bits)"},
    {"open-mpi-rabenseifner", AllreduceSchedule::halving_doubling, SwitchRule::count_below_pof2,
     AllreduceSchedule::linear,
     "Open MPI's Rabenseifner: halving-doubling; below the largest power of two up to N elements, basic_linear"},
};

// a + b as a kernel of the format adds: in float32, rounded to the format.
float add(float a, float b, Precision format) { return round_to_precision(a + b, format); }

// The ring's sum of element i of `x` (one value per rank of the ring) for the chunk c it lies in:
// x[c] + x[c + 1] + ... around the ring, rounded at every hop.
float ring_sum(const std::vector<float>& x, std::size_t c, Precision format) {
  const std::size_t n = x.size();
  float acc = x[c];
  for (std::size_t k = 1; k < n; ++k) acc = add(acc, x[(c + k) % n], format);
  return acc;
}

int nccl_btree_parent(int world, int rank) {
  if (rank == 0) return -1;
  int bit = 1;
  while ((bit & rank) == 0) bit <<= 1;  // the lowest set bit
  const int up = (rank ^ bit) | (bit << 1);
  return up < world ? up : rank ^ bit;
}

// The order in which a tree's ranks finish their partial sums (children before their parent), and
// each rank's children in ascending rank.
struct TreeOrder {
  std::vector<int> post_order;
  std::vector<std::vector<int>> children;
};

TreeOrder tree_order(const std::vector<int>& parent) {
  const int world = static_cast<int>(parent.size());
  TreeOrder t;
  t.children.resize(parent.size());
  int root = -1;
  for (int r = 0; r < world; ++r) {
    if (parent[r] < 0) root = r;
    else t.children[parent[r]].push_back(r);  // ascending, as r ascends
  }
  // Depth first from the root, each rank after its children.
  std::vector<std::pair<int, std::size_t>> stack{{root, 0}};
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < t.children[node].size()) {
      const int child = t.children[node][next++];
      stack.emplace_back(child, 0);
    } else {
      t.post_order.push_back(node);
      stack.pop_back();
    }
  }
  return t;
}

float finish(float sum, const ScheduleOptions& o, std::size_t world) {
  return o.average ? round_to_precision(sum / static_cast<float>(world), o.format) : sum;
}

}  // namespace

std::size_t chunk_of(std::size_t i, std::size_t n, std::size_t parts) {
  const std::size_t q = n / parts, r = n % parts;
  return i < r * (q + 1) ? i / (q + 1) : r + (i - r * (q + 1)) / q;
}

std::span<const ScheduleRow> allreduce_schedules() { return kSchedules; }
std::span<const LibrarySchedule> library_schedules() { return kLibrarySchedules; }

namespace {

std::string every_schedule_name() {
  std::string names;
  for (const ScheduleRow& row : kSchedules) names += (names.empty() ? "" : ", ") + std::string(row.name);
  for (const LibrarySchedule& row : kLibrarySchedules) names += ", " + std::string(row.name);
  return names;
}

std::size_t largest_power_of_two_up_to(std::size_t n) {
  std::size_t p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

}  // namespace

const ScheduleRow& find_schedule(std::string_view name) {
  for (const ScheduleRow& row : kSchedules)
    if (row.name == name) return row;
  throw UsageError("--schedule " + std::string(name) + ": no such schedule (choose " + every_schedule_name() + ")");
}

ScheduleOptions schedule_at(const ScheduleOptions& options, int world, std::size_t count) {
  ScheduleOptions o = options;
  o.library = nullptr;
  if (!options.library) return o;
  const auto n = static_cast<std::size_t>(std::max(world, 1));
  const bool below = (options.library->rule == SwitchRule::count_below_world && count < n) ||
                     (options.library->rule == SwitchRule::count_below_pof2 && count < largest_power_of_two_up_to(n));
  if (below) o.schedule = options.library->below;
  return o;
}

std::string switch_text(const ScheduleOptions& options, int world) {
  if (!options.library || options.library->rule == SwitchRule::none) return "";
  const auto n = static_cast<std::size_t>(std::max(world, 1));
  const std::size_t below = options.library->rule == SwitchRule::count_below_world ? n : largest_power_of_two_up_to(n);
  return "below " + std::to_string(below) + (below == 1 ? " element" : " elements");
}

std::string_view schedule_name(AllreduceSchedule s) {
  for (const ScheduleRow& row : kSchedules)
    if (row.schedule == s) return row.name;
  return "?";
}

ScheduleOptions parse_schedule(std::string_view text) {
  ScheduleOptions o;
  for (const LibrarySchedule& row : kLibrarySchedules)
    if (row.name == text) {
      o.schedule = row.schedule;
      o.library = &row;
      return o;
    }
  const std::size_t colon = text.find(':');
  for (const LibrarySchedule& row : kLibrarySchedules)
    if (row.name == text.substr(0, colon))
      throw UsageError("--schedule " + std::string(text) + ": only hierarchical takes a group size (hierarchical:G)");
  o.schedule = find_schedule(text.substr(0, colon)).schedule;
  if (colon == std::string_view::npos) return o;
  const std::string group(text.substr(colon + 1));
  if (o.schedule != AllreduceSchedule::hierarchical)
    throw UsageError("--schedule " + std::string(text) + ": only hierarchical takes a group size (hierarchical:G)");
  const bool digits = !group.empty() && group.size() <= 6 &&
                      std::all_of(group.begin(), group.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || std::stoi(group) < 1)
    throw UsageError("--schedule " + std::string(text) + ": the group size must be a whole number from 1 to 999999");
  o.group_size = std::stoi(group);
  return o;
}

std::string schedule_text(const ScheduleOptions& o) {
  if (o.library) return std::string(o.library->name);
  std::string text(schedule_name(o.schedule));
  if (o.schedule == AllreduceSchedule::hierarchical) text += ":" + std::to_string(o.group_size);
  return text;
}

ScheduleDepth schedule_depth(const ScheduleOptions& o, int world) {
  if (world < 1) throw Error("schedule_depth: no ranks");
  if (o.library) {
    ScheduleOptions own = o, below = o;
    own.library = below.library = nullptr;
    below.schedule = o.library->below;
    const ScheduleDepth a = schedule_depth(own, world), b = schedule_depth(below, world);
    const auto nu = [](const ScheduleDepth& d, Precision f) {
      return static_cast<double>(d.format) * precision_unit_roundoff(f) + static_cast<double>(d.float32) * 0x1p-24;
    };
    return nu(a, o.format) >= nu(b, o.format) ? a : b;
  }
  const bool fp32 = o.format == Precision::fp32;
  ScheduleDepth d;
  switch (o.schedule) {
    case AllreduceSchedule::rank_order:
      d.format = fp32 ? 0 : 1;
      d.float32 = world - 1;
      break;
    case AllreduceSchedule::ring:
    case AllreduceSchedule::linear: d.format = world - 1; break;
    case AllreduceSchedule::tree: {
      // A rank's partial sum: its own value, then each child's partial sum added and rounded in turn.
      const DoubleTree tree = double_binary_tree(world);
      for (const std::vector<int>& parent : tree.parent) {
        const TreeOrder t = tree_order(parent);
        std::vector<std::int64_t> depth(static_cast<std::size_t>(world), 0);
        for (const int node : t.post_order) {
          std::int64_t acc = 0;
          for (const int child : t.children[node]) acc = std::max(acc, depth[child]) + 1;
          depth[node] = acc;
        }
        d.format = std::max(d.format, depth[t.post_order.back()]);
      }
      break;
    }
    case AllreduceSchedule::halving_doubling: {
      int p = 1, steps = 0;
      while (p * 2 <= world) p *= 2, ++steps;
      d.format = steps + (p < world ? 1 : 0);
      break;
    }
    case AllreduceSchedule::hierarchical: {
      const int g = std::max(1, std::min(o.group_size, world)), groups = (world + g - 1) / g;
      d.format = (g - 1) + (groups - 1);
      break;
    }
  }
  if (o.average) {
    d.float32 += 1;
    if (!fp32 && o.schedule != AllreduceSchedule::rank_order) d.format += 1;
  }
  return d;
}

double schedule_gamma(const ScheduleOptions& o, int world) {
  const ScheduleDepth d = schedule_depth(o, world);
  const double nu =
      static_cast<double>(d.format) * precision_unit_roundoff(o.format) + static_cast<double>(d.float32) * 0x1p-24;
  return nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
}

ScheduleError measure_schedule_error(const ScheduleOptions& o, std::span<const std::vector<float>> inputs) {
  const std::vector<float> got = emulate_allreduce(o, inputs);
  const auto world = static_cast<int>(inputs.size());
  ScheduleError e;
  e.bound = schedule_gamma(o, world);
  double total = 0;
  std::size_t counted = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double exact = 0, magnitude = 0;
    for (const std::vector<float>& in : inputs) exact += in[i], magnitude += std::abs(in[i]);
    if (magnitude == 0) continue;
    const double error = std::abs(static_cast<double>(got[i]) - (o.average ? exact / world : exact)) /
                         (o.average ? magnitude / world : magnitude);
    e.max = std::max(e.max, error);
    total += error;
    ++counted;
  }
  e.mean = counted ? total / static_cast<double>(counted) : 0;
  return e;
}

DoubleTree double_binary_tree(int world) {
  DoubleTree t;
  for (int r = 0; r < world; ++r) {
    t.parent[0].push_back(nccl_btree_parent(world, r));
    if (world % 2 == 1) {
      const int u = nccl_btree_parent(world, (r - 1 + world) % world);  // tree 0 shifted by one rank
      t.parent[1].push_back(u < 0 ? -1 : (u + 1) % world);
    } else {
      const int u = nccl_btree_parent(world, world - 1 - r);  // tree 0 mirrored
      t.parent[1].push_back(u < 0 ? -1 : world - 1 - u);
    }
  }
  return t;
}

std::vector<float> emulate_allreduce(const ScheduleOptions& o, std::span<const std::vector<float>> inputs) {
  const std::size_t world = inputs.size();
  if (world == 0) throw Error("emulate_allreduce: no ranks");
  const std::size_t n = inputs[0].size();
  for (const std::vector<float>& in : inputs)
    if (in.size() != n) throw Error("emulate_allreduce: the ranks' buffers differ in length");
  if (o.library) return emulate_allreduce(schedule_at(o, static_cast<int>(world), n), inputs);
  std::vector<float> out(n);
  std::vector<float> x(world);  // one element of every rank
  const auto gather = [&](std::size_t i) {
    for (std::size_t r = 0; r < world; ++r) x[r] = inputs[r][i];
  };
  switch (o.schedule) {
    case AllreduceSchedule::rank_order:
      for (std::size_t i = 0; i < n; ++i) {
        float acc = inputs[0][i];
        for (std::size_t r = 1; r < world; ++r) acc += inputs[r][i];
        if (o.average) acc /= static_cast<float>(world);
        out[i] = round_to_precision(acc, o.format);
      }
      return out;
    case AllreduceSchedule::ring: {
      const std::size_t slice = o.slice_elements == 0 ? std::max<std::size_t>(n, 1) : o.slice_elements;
      for (std::size_t i = 0; i < n; ++i) {
        const std::size_t start = i / slice * slice, len = std::min(slice, n - start);
        gather(i);
        out[i] = finish(ring_sum(x, chunk_of(i - start, len, world), o.format), o, world);
      }
      return out;
    }
    case AllreduceSchedule::tree: {
      const DoubleTree tree = double_binary_tree(static_cast<int>(world));
      const TreeOrder order[2] = {tree_order(tree.parent[0]), tree_order(tree.parent[1])};
      const std::size_t half = (n + 1) / 2;
      std::vector<float> partial(world);
      for (std::size_t i = 0; i < n; ++i) {
        const TreeOrder& t = order[i < half ? 0 : 1];
        for (const int node : t.post_order) {
          float acc = inputs[node][i];
          for (const int child : t.children[node]) acc = add(acc, partial[child], o.format);
          partial[node] = acc;
        }
        out[i] = finish(partial[t.post_order.back()], o, world);
      }
      return out;
    }
    case AllreduceSchedule::halving_doubling: {
      std::size_t p = 1;
      while (p * 2 <= world) p *= 2;
      const std::size_t rem = world - p;
      std::vector<float> v(p);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t k = 0; k < p; ++k)
          v[k] = k < rem ? add(inputs[2 * k + 1][i], inputs[2 * k][i], o.format) : inputs[k + rem][i];
        if (o.halving_from_lowest_bit)
          for (std::size_t mask = 1; mask < p; mask *= 2)
            for (std::size_t k = 0; k < p; k += 2 * mask) v[k] = add(v[k], v[k + mask], o.format);
        else
          for (std::size_t mask = p / 2; mask >= 1; mask /= 2)
            for (std::size_t k = 0; k < mask; ++k) v[k] = add(v[k], v[k + mask], o.format);
        out[i] = finish(v[0], o, world);
      }
      return out;
    }
    case AllreduceSchedule::hierarchical: {
      if (o.group_size < 1) throw Error("emulate_allreduce: a group of fewer than one rank");
      const std::size_t g = static_cast<std::size_t>(o.group_size), groups = (world + g - 1) / g;
      std::vector<float> members, sums(groups);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t k = 0; k < groups; ++k) {
          const std::size_t first = k * g, size = std::min(g, world - first);
          members.assign(size, 0.0f);
          for (std::size_t m = 0; m < size; ++m) members[m] = inputs[first + m][i];
          sums[k] = ring_sum(members, chunk_of(i, n, size), o.format);
        }
        out[i] = finish(ring_sum(sums, chunk_of(i, n, groups), o.format), o, world);
      }
      return out;
    }
    case AllreduceSchedule::linear:
      for (std::size_t i = 0; i < n; ++i) {
        float acc = inputs[world - 1][i];
        for (std::size_t r = world - 1; r-- > 0;) acc = add(acc, inputs[r][i], o.format);
        out[i] = finish(acc, o, world);
      }
      return out;
  }
  return out;
}

}  // namespace dpcheck::reference
