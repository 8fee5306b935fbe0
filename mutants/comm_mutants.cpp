// The mutants that break the gradient all-reduce: each a communicator that wraps the correct one,
// with its row.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

#include "mutants/mutants.hpp"
#include "src/comm/simulated_comm.hpp"
#include "src/low_precision.hpp"
#include "src/train/fault.hpp"

namespace dpcheck {

namespace {

template <class C> std::unique_ptr<Communicator> comm_of(Communicator& inner) { return std::make_unique<C>(inner); }

class SumNoAverage final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    inner_.allreduce(buf, count, dtype, op == ReduceOp::avg ? ReduceOp::sum : op);
  }
};

// Sums count elements of `all` (rank k's block at k * count) in `order`, into out, in T. bfloat16 and
// float16 are rounded to the format after every addition, as a ring that starts where it likes does
// (src/comm.hpp): summed in float32 and rounded once, another order would almost never change the
// result, and the mutant would break nothing.
template <class T> void sum_in_order(const T* all, std::size_t count, const std::vector<std::size_t>& order,
                                     ReduceOp op, DType dtype, T* out) {
  const auto n = order.size();
  for (std::size_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<T, std::uint16_t>) {
      const auto widen = [&](std::uint16_t h) {
        return dtype == DType::bf16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
      };
      const auto narrow = [&](float f) { return dtype == DType::bf16 ? float_to_bf16_bits(f) : float_to_fp16_bits(f); };
      std::uint16_t acc = all[order[0] * count + i];
      for (std::size_t k = 1; k < n; ++k) acc = narrow(widen(acc) + widen(all[order[k] * count + i]));
      out[i] = op == ReduceOp::avg ? narrow(widen(acc) / static_cast<float>(n)) : acc;
    } else {
      T acc = all[order[0] * count + i];
      for (std::size_t k = 1; k < n; ++k) acc += all[order[k] * count + i];
      out[i] = op == ReduceOp::avg ? acc / static_cast<T>(n) : acc;
    }
  }
}

class RankOrderSum final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if (dtype == DType::f32 && (op == ReduceOp::sum || op == ReduceOp::avg))
      reduce_from_own_rank(static_cast<float*>(buf), count, op, dtype);
    else if (dtype == DType::f64 && (op == ReduceOp::sum || op == ReduceOp::avg))
      reduce_from_own_rank(static_cast<double*>(buf), count, op, dtype);
    else if (is_16bit_float(dtype) && (op == ReduceOp::sum || op == ReduceOp::avg))
      reduce_from_own_rank(static_cast<std::uint16_t*>(buf), count, op, dtype);
    else inner_.allreduce(buf, count, dtype, op);
  }

 private:
  // Works on host copies (staged from and back to the device for GPU backends), gathered through the
  // host communicator.
  template <class T> void reduce_from_own_rank(T* buf, std::size_t count, ReduceOp op, DType dtype) {
    const auto n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
    std::vector<T> mine(count), all(count * n);
    inner_.to_host(buf, mine.data(), count * sizeof(T));
    inner_.host().allgather(mine.data(), all.data(), count, dtype);
    std::vector<std::size_t> order(n);
    for (std::size_t k = 0; k < n; ++k) order[k] = (me + k) % n;
    sum_in_order(all.data(), count, order, op, dtype, mine.data());
    inner_.from_host(mine.data(), buf, count * sizeof(T));
  }
};

// Large calls leave their last element as this rank had it, as a bug in a backend's path for large
// messages would.
class LargeMessageTailCommunicator final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    const std::vector<std::size_t> t = inner_.algorithm_thresholds(dtype);
    if (t.empty() || count <= *std::max_element(t.begin(), t.end()) || count == 0)
      return inner_.allreduce(buf, count, dtype, op);
    const std::size_t esize = dtype_size(dtype);
    unsigned char* last = static_cast<unsigned char*>(buf) + (count - 1) * esize;
    std::vector<unsigned char> kept(esize);
    inner_.to_host(last, kept.data(), esize);
    inner_.allreduce(buf, count, dtype, op);
    inner_.from_host(kept.data(), last, esize);
  }
};

// Sums float32 and 16-bit all-reduces in the order the ranks arrive (after a little jitter, as real
// arrival times have): every rank receives the same bits, but two runs of the same training differ.
class ArrivalOrderCommunicator final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if ((dtype != DType::f32 && !is_16bit_float(dtype)) || (op != ReduceOp::sum && op != ReduceOp::avg) || size() < 3)
      return inner_.allreduce(buf, count, dtype, op);
    static thread_local std::mt19937 jitter{std::random_device{}()};
    std::this_thread::sleep_for(std::chrono::microseconds(jitter() % 300));
    const auto stamp = static_cast<std::int64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    const std::vector<std::int64_t> stamps = inner_.host().allgather_value(stamp);
    std::vector<std::size_t> order(stamps.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return stamps[a] != stamps[b] ? stamps[a] < stamps[b] : a < b; });
    if (dtype == DType::f32) reduce_in(order, static_cast<float*>(buf), count, op, dtype);
    else reduce_in(order, static_cast<std::uint16_t*>(buf), count, op, dtype);
  }

 private:
  template <class T>
  void reduce_in(const std::vector<std::size_t>& order, T* buf, std::size_t count, ReduceOp op, DType dtype) {
    const auto n = static_cast<std::size_t>(size());
    std::vector<T> mine(count), all(count * n);
    inner_.to_host(buf, mine.data(), count * sizeof(T));
    inner_.host().allgather(mine.data(), all.data(), count, dtype);
    sum_in_order(all.data(), count, order, op, dtype, mine.data());
    inner_.from_host(mine.data(), buf, count * sizeof(T));
  }
};

// The float32 all-reduce, then its result rounded to bf16.
class SilentBf16Communicator final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    inner_.allreduce(buf, count, dtype, op);
    if (dtype != DType::f32) return;
    std::vector<float> host(count);
    to_host(buf, host.data(), count * sizeof(float));
    for (float& v : host) v = round_to_precision(v, Precision::bf16);
    from_host(host.data(), buf, count * sizeof(float));
  }
};

// A schedule that leaves out or misweighs some ranks' parts. What it computes comes to each rank's
// float32 buffer entering a correct sum or average times a factor of the rank and the element (0 for a
// part never added), so the wrapper scales its own buffer so and forwards the call: one rank at a time,
// as simulated ranks play them, at any N.
class MisweighingCommunicator : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    // Simulated ranks past their passes are one replica standing for all: no rank's part to change.
    const SimulatedComm* played = simulated();
    if (dtype != DType::f32 || (op != ReduceOp::sum && op != ReduceOp::avg) || (played && !played->passing()) ||
        !misweighs(count))
      return inner_.allreduce(buf, count, dtype, op);
    std::vector<float> host(count);
    to_host(buf, host.data(), count * sizeof(float));
    for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<float>(host[i] * part(i, count));
    from_host(host.data(), buf, count * sizeof(float));
    inner_.allreduce(buf, count, dtype, op);
  }

 protected:
  static constexpr int kNode = 8;                       // ranks of a node, or of a group
  virtual bool misweighs(std::size_t count) const = 0;  // whether this rank's part changes in this call
  virtual double part(std::size_t i, std::size_t count) const = 0;
};

// Nodes of 8 ranks; the tree across nodes is built for the largest power of two not above their count,
// and the node it leaves over is never joined but through its first rank's link, which the tree lacks.
class TreeDropsRankCommunicator final : public MisweighingCommunicator {
 public:
  using MisweighingCommunicator::MisweighingCommunicator;

 protected:
  bool misweighs(std::size_t) const override {
    const int nodes = (size() + kNode - 1) / kNode;
    return nodes > 1 && !std::has_single_bit(static_cast<unsigned>(nodes)) && rank() == kNode * (nodes - 1);
  }
  double part(std::size_t, std::size_t) const override { return 0; }
};

// The mean of the group means: rank r's part weighs N / (groups * |its group|) of a true average's.
class GroupMeansCommunicator final : public MisweighingCommunicator {
 public:
  using MisweighingCommunicator::MisweighingCommunicator;

 protected:
  bool misweighs(std::size_t) const override { return size() % kNode != 0 && size() > kNode; }
  double part(std::size_t, std::size_t) const override {
    const int groups = (size() + kNode - 1) / kNode;
    const int mine = rank() / kNode == groups - 1 ? size() - kNode * (groups - 1) : kNode;
    return static_cast<double>(size()) / (static_cast<double>(groups) * mine);
  }
};

// Chunk c holds elements [c count / N, (c + 1) count / N); its reduction never adds rank c's part.
class RingChunkOffByOneCommunicator final : public MisweighingCommunicator {
 public:
  using MisweighingCommunicator::MisweighingCommunicator;

 protected:
  bool misweighs(std::size_t count) const override {
    return size() > 1 && chunk(rank() + 1, count) > chunk(rank(), count);
  }
  double part(std::size_t i, std::size_t count) const override {
    return i >= chunk(rank(), count) && i < chunk(rank() + 1, count) ? 0 : 1;
  }

 private:
  std::size_t chunk(int c, std::size_t count) const {
    const auto n = static_cast<unsigned long long>(size());
    return static_cast<std::size_t>(static_cast<unsigned long long>(c) * count / n);
  }
};

// The second gradient all-reduce leaves the last element of rank 0's result at its own input.
std::unique_ptr<Communicator> corrupt_one(Communicator& inner) {
  Fault f;
  f.step = 1;
  f.rank = 0;
  f.element = std::numeric_limits<std::size_t>::max();  // the last: the output layer's last bias
  f.kind = FaultKind::keep_input;
  return fault_communicator(inner, f);
}

}  // namespace

std::span<const MutantInfo> comm_mutants() {
  static const MutantInfo rows[] = {
      {.name = "allreduce-sum-no-average",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug = "the all-reduce sums the gradients but never divides by the world size",
       .parts = {.communicator = comm_of<SumNoAverage>}},
      {.name = "allreduce-rank-order",
       .caught_by = "replicas_bitwise_synchronized",
       .bug = "each rank sums the all-reduce starting from its own rank, so the last bits differ between ranks",
       .parts = {.communicator = comm_of<RankOrderSum>}},
      {.name = "allreduce-large-message-tail",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug = "an all-reduce larger than the backend's largest algorithm threshold leaves its last element unreduced",
       .wide_minimal_case = true,
       .parts = {.communicator = comm_of<LargeMessageTailCommunicator>}},
      {.name = "allreduce-arrival-order",
       .caught_by = "checkpoint_resume_bitwise",
       .bug = "the all-reduce sums the ranks in the order they arrive, so every rank agrees but runs differ from each "
              "other",
       .parts = {.communicator = comm_of<ArrivalOrderCommunicator>}},
      {.name = "allreduce-corrupt-one",
       .caught_by = "replicas_bitwise_synchronized",
       .bug = "the second gradient all-reduce leaves one element (the last) of rank 0's result at rank 0's own input, "
              "unreduced",
       .parts = {.communicator = corrupt_one}},
      {.name = "allreduce-bf16-silently",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug = "the gradient all-reduce rounds its result to bf16, as a backend that halves its traffic unasked does, "
              "while "
              "the bound assumes float32",
       .precision = "bf16",
       .parts = {.communicator = comm_of<SilentBf16Communicator>}},
      {.name = "allreduce-tree-drops-rank",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug =
           "the all-reduce chains the ranks of each node of 8 and joins the nodes in a binary tree built for a power "
           "of two: when the node count is not one (65 ranks, 1000), the last node's first rank is never added",
       .scale = true,
       .parts = {.communicator = comm_of<TreeDropsRankCommunicator>}},
      {.name = "allreduce-hierarchical-group-means",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug = "the hierarchical all-reduce averages within each group of 8 ranks, then averages the group means: right "
              "while every group is full, wrong when N is no multiple of 8 (63, 65, 1000)",
       .scale = true,
       .parts = {.communicator = comm_of<GroupMeansCommunicator>}},
      {.name = "allreduce-ring-chunk-start-off-by-one",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug =
           "the ring's reduce-scatter starts chunk c at rank c + 1 instead of rank c and stops after N - 1 ranks, so "
           "chunk c never receives rank c's part",
       .parts = {.communicator = comm_of<RingChunkOffByOneCommunicator>}},
  };
  return rows;
}

}  // namespace dpcheck
