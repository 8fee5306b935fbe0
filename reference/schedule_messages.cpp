// The all-reduce schedules message by message (reference/schedule_messages.hpp).
#include "reference/schedule_messages.hpp"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "src/error.hpp"

namespace dpcheck::reference {

namespace {

using Buffers = std::vector<std::vector<float>>;

float add_in(float a, float b, Precision f) { return round_to_precision(a + b, f); }

std::size_t chunk_begin(std::size_t n, std::size_t parts, std::size_t c) {
  return n / parts * c + std::min(c, n % parts);
}

// The ring all-reduce as the comm_ring example runs it: in step s of the reduce-scatter, rank r passes
// chunk r - s to rank r + 1, which adds it to its own; then the finished chunks go around.
void ring_in_place(Buffers& buf, Precision f, bool average, std::size_t slice_elements) {
  const std::size_t n = buf.size(), len_all = buf[0].size();
  const std::size_t slice = slice_elements == 0 ? std::max<std::size_t>(len_all, 1) : slice_elements;
  for (std::size_t base = 0; base < len_all; base += slice) {
    const std::size_t len = std::min(slice, len_all - base);
    const auto chunk = [&](std::size_t c) {
      return std::pair{base + chunk_begin(len, n, c), base + chunk_begin(len, n, c + 1)};
    };
    for (std::size_t s = 0; s + 1 < n; ++s) {
      Buffers sent(n);
      for (std::size_t r = 0; r < n; ++r) {
        const auto [b, e] = chunk((r + n - s % n) % n);
        sent[r].assign(buf[r].begin() + static_cast<std::ptrdiff_t>(b),
                       buf[r].begin() + static_cast<std::ptrdiff_t>(e));
      }
      for (std::size_t r = 0; r < n; ++r) {
        const std::size_t to = (r + 1) % n;
        const auto [b, e] = chunk((r + n - s % n) % n);
        for (std::size_t i = b; i < e; ++i) buf[to][i] = add_in(buf[to][i], sent[r][i - b], f);
      }
    }
    if (average)
      for (std::size_t r = 0; r < n; ++r) {
        const auto [b, e] = chunk((r + 1) % n);
        for (std::size_t i = b; i < e; ++i) buf[r][i] = round_to_precision(buf[r][i] / static_cast<float>(n), f);
      }
    for (std::size_t s = 0; s + 1 < n; ++s) {
      Buffers next = buf;
      for (std::size_t r = 0; r < n; ++r) {
        const auto [b, e] = chunk((r + 1 + n - s % n) % n);
        for (std::size_t i = b; i < e; ++i) next[(r + 1) % n][i] = buf[r][i];
      }
      buf = std::move(next);
    }
  }
}

// NCCL's binary tree as its ncclGetBtree writes it: a rank's children from its lowest set bit.
void btree_children(int world, int rank, int& d0, int& d1) {
  int bit = 1;
  while (bit < world && (bit & rank) == 0) bit <<= 1;
  if (rank == 0) {
    d0 = -1;
    d1 = world > 1 ? bit >> 1 : -1;
    return;
  }
  int low = bit >> 1;
  d0 = low == 0 ? -1 : rank - low;
  d1 = low == 0 ? -1 : rank + low;
  while (d1 >= world) {  // the nearest child in range, halving the distance
    low >>= 1;
    d1 = low == 0 ? -1 : rank + low;
  }
}

}  // namespace

void nccl_tree_children(int world, int tree, int rank, int& a, int& b) {
  if (tree == 0) return btree_children(world, rank, a, b);
  if (world % 2 == 1) {
    btree_children(world, (rank - 1 + world) % world, a, b);
    a = a < 0 ? -1 : (a + 1) % world;
    b = b < 0 ? -1 : (b + 1) % world;
  } else {
    btree_children(world, world - 1 - rank, a, b);
    a = a < 0 ? -1 : world - 1 - a;
    b = b < 0 ? -1 : world - 1 - b;
  }
}

namespace {

// The partial sum a rank sends up: its own value plus its children's, the lower-ranked child first.
float tree_up(const Buffers& in, int tree, int rank, std::size_t i, Precision f) {
  const int world = static_cast<int>(in.size());
  int a = -1, b = -1;
  nccl_tree_children(world, tree, rank, a, b);
  if (a > b) std::swap(a, b);
  float acc = in[rank][i];
  for (const int child : {a, b})
    if (child >= 0) acc = add_in(acc, tree_up(in, tree, child, i, f), f);
  return acc;
}

std::vector<float> tree_allreduce(const Buffers& in, Precision f, bool average) {
  const int world = static_cast<int>(in.size());
  const std::size_t n = in[0].size(), half = (n + 1) / 2;
  const int roots[2] = {0, world % 2 == 1 ? (world > 1 ? 1 : 0) : world - 1};
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int t = i < half ? 0 : 1;
    const float s = tree_up(in, t, roots[t], i, f);
    out[i] = average ? round_to_precision(s / static_cast<float>(world), f) : s;
  }
  return out;
}

// MPICH's all-reduce for long messages: pairs fold a non-power-of-two world first, then a
// reduce-scatter by recursive halving over blocks with their counts and displacements, and an
// all-gather by recursive doubling.
void halving_doubling_in_place(Buffers& buf, Precision f, bool average) {
  const int world = static_cast<int>(buf.size());
  const std::size_t n = buf[0].size();
  int pof2 = 1;
  while (pof2 * 2 <= world) pof2 *= 2;
  const int rem = world - pof2;
  for (int r = 0; r < 2 * rem; r += 2)
    for (std::size_t i = 0; i < n; ++i) buf[r + 1][i] = add_in(buf[r + 1][i], buf[r][i], f);
  const auto real = [&](int newrank) { return newrank < rem ? newrank * 2 + 1 : newrank + rem; };
  std::vector<std::size_t> cnts(pof2), disps(pof2);
  for (int k = 0; k < pof2; ++k) cnts[k] = n / pof2 + (static_cast<std::size_t>(k) < n % pof2 ? 1 : 0);
  for (int k = 1; k < pof2; ++k) disps[k] = disps[k - 1] + cnts[k - 1];
  std::vector<int> send_idx(pof2, 0), recv_idx(pof2, 0), last_idx(pof2, pof2);
  for (int mask = 1; mask < pof2; mask <<= 1) {
    const Buffers before = buf;
    for (int nr = 0; nr < pof2; ++nr) {
      const int partner = nr ^ mask;
      if (nr < partner) send_idx[nr] = recv_idx[nr] + pof2 / (mask * 2);
      else recv_idx[nr] = send_idx[nr] + pof2 / (mask * 2);
      // The half it keeps: blocks [recv_idx, send_idx) for the lower of the pair, [recv_idx, last_idx)
      // for the upper.
      const int keep_to = nr < partner ? send_idx[nr] : last_idx[nr];
      for (int blk = recv_idx[nr]; blk < keep_to; ++blk)
        for (std::size_t i = disps[blk]; i < disps[blk] + cnts[blk]; ++i)
          buf[real(nr)][i] = add_in(before[real(nr)][i], before[real(partner)][i], f);
    }
    for (int nr = 0; nr < pof2; ++nr) {
      send_idx[nr] = recv_idx[nr];
      if (mask * 2 < pof2) last_idx[nr] = recv_idx[nr] + pof2 / (mask * 2);
    }
  }
  // Each new rank now holds the whole sum of one block, recv_idx (all of them in a world of one); the
  // all-gather by recursive doubling copies them.
  std::vector<float> result = buf[real(0)];
  if (pof2 > 1)
    for (int nr = 0; nr < pof2; ++nr) {
      const int blk = recv_idx[nr];
      for (std::size_t i = disps[blk]; i < disps[blk] + cnts[blk]; ++i) result[i] = buf[real(nr)][i];
    }
  for (float& v : result) v = average ? round_to_precision(v / static_cast<float>(world), f) : v;
  for (auto& b : buf) b = result;
}

std::vector<float> hierarchical_allreduce(const Buffers& in, Precision f, bool average, int group) {
  const std::size_t world = in.size(), g = static_cast<std::size_t>(group);
  Buffers sums;
  for (std::size_t first = 0; first < world; first += g) {
    Buffers members(in.begin() + static_cast<std::ptrdiff_t>(first),
                    in.begin() + static_cast<std::ptrdiff_t>(std::min(world, first + g)));
    ring_in_place(members, f, false, 0);
    sums.push_back(members[0]);
  }
  ring_in_place(sums, f, false, 0);
  std::vector<float> out = sums[0];
  if (average)
    for (float& v : out) v = round_to_precision(v / static_cast<float>(world), f);
  return out;
}

// Open MPI's basic_linear: rank 0 takes rank N-1's buffer, then receives each lower rank's in turn and
// folds its own in at its turn (acc = x_i op acc), then broadcasts.
std::vector<float> linear_reduce_to_zero(const Buffers& in, Precision f, bool average) {
  std::vector<float> acc = in.back();
  for (std::size_t r = in.size() - 1; r-- > 0;)
    for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = round_to_precision(in[r][i] + acc[i], f);
  if (average)
    for (float& v : acc) v = round_to_precision(v / static_cast<float>(in.size()), f);
  return acc;
}

std::vector<float> by_messages(const ScheduleOptions& o, Buffers in) {
  switch (o.schedule) {
    case AllreduceSchedule::rank_order: {
      std::vector<float> out(in[0].size());
      for (std::size_t i = 0; i < out.size(); ++i) {
        float acc = 0;
        for (std::size_t r = 0; r < in.size(); ++r) acc = r == 0 ? in[r][i] : acc + in[r][i];
        out[i] = round_to_precision(o.average ? acc / static_cast<float>(in.size()) : acc, o.format);
      }
      return out;
    }
    case AllreduceSchedule::ring: ring_in_place(in, o.format, o.average, o.slice_elements); return in[0];
    case AllreduceSchedule::tree: return tree_allreduce(in, o.format, o.average);
    case AllreduceSchedule::halving_doubling: halving_doubling_in_place(in, o.format, o.average); return in[0];
    case AllreduceSchedule::hierarchical: return hierarchical_allreduce(in, o.format, o.average, o.group_size);
    case AllreduceSchedule::linear: return linear_reduce_to_zero(in, o.format, o.average);
  }
  return {};
}

}  // namespace

std::vector<float> allreduce_by_messages(const ScheduleOptions& options, std::span<const std::vector<float>> inputs) {
  if (inputs.empty()) throw Error("allreduce_by_messages: no ranks");
  const std::size_t n = inputs[0].size();
  for (const std::vector<float>& in : inputs)
    if (in.size() != n) throw Error("allreduce_by_messages: the ranks' buffers differ in length");
  const ScheduleOptions o = options.library ? schedule_at(options, static_cast<int>(inputs.size()), n) : options;
  return by_messages(o, Buffers(inputs.begin(), inputs.end()));
}

}  // namespace dpcheck::reference
