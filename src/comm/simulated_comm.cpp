#include "src/comm/simulated_comm.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "src/error.hpp"
#include "src/low_precision.hpp"

namespace dpcheck {

// (A namespace of its own: unity builds compile this file beside others with helpers of these names.)
namespace simulated_fold {
namespace {

bool is_16bit(DType d) { return d == DType::bf16 || d == DType::f16; }

float widen(DType d, std::uint16_t h) { return d == DType::bf16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h); }
std::uint16_t narrow(DType d, float f) { return d == DType::bf16 ? float_to_bf16_bits(f) : float_to_fp16_bits(f); }

// The accumulator's element size: the 16-bit formats accumulate in float32, as the host backends do.
std::size_t acc_size(DType d) { return is_16bit(d) ? sizeof(float) : dtype_size(d); }

// The op a fold applies: avg sums, and divides once, at the end.
ReduceOp fold_op(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

// acc = op(acc, x), element by element, in the accumulator's type.
void fold(std::vector<std::byte>& acc, const void* x, std::size_t count, DType dtype, ReduceOp op) {
  if (!is_16bit(dtype)) {
    const void* in[2] = {acc.data(), x};
    void* out[1] = {acc.data()};
    reduce_in_rank_order(in, 2, out, 1, 0, count, dtype, fold_op(op));
    return;
  }
  auto* a = reinterpret_cast<float*>(acc.data());
  const auto* h = static_cast<const std::uint16_t*>(x);
  for (std::size_t i = 0; i < count; ++i) {
    const float v = widen(dtype, h[i]);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: a[i] = a[i] + v; break;
      case ReduceOp::min: a[i] = v < a[i] ? v : a[i]; break;
      case ReduceOp::max: a[i] = a[i] < v ? v : a[i]; break;
    }
  }
}

// The accumulator from rank 0's buffer (widened for the 16-bit formats).
void start(std::vector<std::byte>& acc, const void* x, std::size_t count, DType dtype) {
  acc.resize(count * acc_size(dtype));
  if (!is_16bit(dtype)) {
    if (count > 0) std::memcpy(acc.data(), x, count * dtype_size(dtype));
    return;
  }
  auto* a = reinterpret_cast<float*>(acc.data());
  const auto* h = static_cast<const std::uint16_t*>(x);
  for (std::size_t i = 0; i < count; ++i) a[i] = widen(dtype, h[i]);
}

// The result into buf: divided by n for avg (in the accumulator's type, as reduce_in_rank_order
// divides), rounded once to a 16-bit format.
void finish(const std::vector<std::byte>& acc, void* buf, std::size_t count, DType dtype, ReduceOp op, int n) {
  if (is_16bit(dtype)) {
    const auto* a = reinterpret_cast<const float*>(acc.data());
    auto* h = static_cast<std::uint16_t*>(buf);
    const auto d = static_cast<float>(n);
    for (std::size_t i = 0; i < count; ++i) h[i] = narrow(dtype, op == ReduceOp::avg ? a[i] / d : a[i]);
    return;
  }
  if (count > 0) std::memcpy(buf, acc.data(), count * dtype_size(dtype));
  if (op != ReduceOp::avg) return;
  if (dtype == DType::f32) {
    auto* v = static_cast<float*>(buf);
    const auto d = static_cast<float>(n);
    for (std::size_t i = 0; i < count; ++i) v[i] = v[i] / d;
  } else {
    auto* v = static_cast<double*>(buf);
    const auto d = static_cast<double>(n);
    for (std::size_t i = 0; i < count; ++i) v[i] = v[i] / d;
  }
}

}  // namespace
}  // namespace simulated_fold

SimulatedComm::SimulatedComm(int world_size) : world_(world_size) {
  if (world_size < 1 || world_size > max_world)
    throw UsageError("a simulated world has 1 to " + std::to_string(max_world) + " ranks, not " +
                     std::to_string(world_size));
}

void SimulatedComm::play(int rank) {
  DPCHECK_ASSERT(rank >= 0 && rank < world_);
  if (rank == 0) {
    calls_.clear();
  } else if (!passing_ || rank != rank_ + 1) {
    throw Error("simulated ranks are played in order: rank " + std::to_string(rank) + " after " +
                (passing_ ? "rank " + std::to_string(rank_) : std::string("the replica")));
  } else if (next_ != calls_.size()) {
    throw Error("simulated rank " + std::to_string(rank_) + " made " + std::to_string(next_) +
                " collective calls, rank 0 made " + std::to_string(calls_.size()));
  }
  rank_ = rank;
  passing_ = true;
  next_ = 0;
}

void SimulatedComm::replicate() {
  if (passing_ && next_ != calls_.size())
    throw Error("simulated rank " + std::to_string(rank_) + " made " + std::to_string(next_) +
                " collective calls, rank 0 made " + std::to_string(calls_.size()));
  passing_ = false;
  std::size_t bytes = 0;
  for (const Call& c : calls_) bytes += c.acc.capacity();
  peak_bytes_ = std::max(peak_bytes_, bytes);
  calls_.clear();
}

void SimulatedComm::abandon() {
  passing_ = false;
  calls_.clear();
}

SimulatedComm::Call& SimulatedComm::next_call(const CallDesc& desc) {
  if (rank_ == 0) {
    const CallDesc descs[1] = {desc};
    const std::uint8_t no_null[1] = {0};
    if (const std::string why = check_calls(descs, no_null); !why.empty())
      throw UsageError(call_on_rank(desc.kind, 0) + ": " + why);
    calls_.push_back(Call{desc, {}, {}});
    ++next_;
    return calls_.back();
  }
  if (next_ >= calls_.size())
    throw Error(call_on_rank(desc.kind, rank_) + ": " + describe(desc) + " is this rank's call " +
                std::to_string(next_ + 1) + "; rank 0 made " + std::to_string(calls_.size()));
  Call& c = calls_[next_];
  if (!(c.desc == desc))
    throw Error(call_on_rank(desc.kind, rank_) + ": " + describe(desc) + " where rank 0 called " + describe(c.desc) +
                " (call " + std::to_string(next_ + 1) + " of the step)");
  ++next_;
  return c;
}

void SimulatedComm::allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  if (!passing_) return replicated_allreduce(buf, count, dtype, op);
  Call& c = next_call(CallDesc{CallKind::allreduce, count, dtype, op, 0});
  if (rank_ == 0) simulated_fold::start(c.acc, buf, count, dtype);
  else simulated_fold::fold(c.acc, buf, count, dtype, op);
  if (rank_ == world_ - 1) simulated_fold::finish(c.acc, buf, count, dtype, op, world_);
}

void SimulatedComm::replicated_allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) {
  const CallDesc descs[1] = {CallDesc{CallKind::allreduce, count, dtype, op, 0}};
  const std::uint8_t no_null[1] = {0};
  if (const std::string why = check_calls(descs, no_null); !why.empty())
    throw UsageError(call_on_rank(CallKind::allreduce, 0) + ": " + why);
  // min and max of copies: the value itself. A sum or an average: N copies added in rank order, as the
  // world's ranks would add them (N x, rounded at each addition, is not always the same bits).
  if (op == ReduceOp::min || op == ReduceOp::max) return;
  std::vector<std::byte> acc;
  simulated_fold::start(acc, buf, count, dtype);
  for (int r = 1; r < world_; ++r) simulated_fold::fold(acc, buf, count, dtype, op);
  simulated_fold::finish(acc, buf, count, dtype, op, world_);
}

void SimulatedComm::broadcast(void* buf, std::size_t count, DType dtype, int root) {
  if (root < 0 || root >= world_)
    throw UsageError(call_on_rank(CallKind::broadcast, rank()) + ": root " + std::to_string(root) + " of a world of " +
                     std::to_string(world_) + " ranks");
  if (!passing_) return;  // every copy is this one
  Call& c = next_call(CallDesc{CallKind::broadcast, count, dtype, ReduceOp::sum, root});
  const std::size_t bytes = count * dtype_size(dtype);
  if (rank_ == root) c.acc.assign(static_cast<const std::byte*>(buf), static_cast<const std::byte*>(buf) + bytes);
  // A rank played before the root keeps its buffer (the root's is not known yet); the last rank gets it.
  if (rank_ == world_ - 1 && bytes > 0) std::memcpy(buf, c.acc.data(), bytes);
}

void SimulatedComm::allgather(const void* send, void* recv, std::size_t count, DType dtype) {
  const std::size_t bytes = count * dtype_size(dtype);
  auto* out = static_cast<std::byte*>(recv);
  if (!passing_) {
    for (int r = 0; r < world_; ++r)
      if (bytes > 0 && out + static_cast<std::size_t>(r) * bytes != send)
        std::memmove(out + static_cast<std::size_t>(r) * bytes, send, bytes);
    return;
  }
  Call& c = next_call(CallDesc{CallKind::allgather, count, dtype, ReduceOp::sum, 0});
  // Every rank's block is kept until the last rank: N blocks, for the small messages that ranks gather.
  if (rank_ == 0) c.acc.resize(bytes * static_cast<std::size_t>(world_));
  if (bytes > 0) std::memcpy(c.acc.data() + static_cast<std::size_t>(rank_) * bytes, send, bytes);
  if (bytes == 0) return;
  // Earlier ranks see the blocks gathered so far, and their own in every later place.
  if (rank_ == world_ - 1) {
    std::memcpy(recv, c.acc.data(), c.acc.size());
  } else {
    std::memcpy(recv, c.acc.data(), bytes * static_cast<std::size_t>(rank_ + 1));
    for (int r = rank_ + 1; r < world_; ++r) std::memcpy(out + static_cast<std::size_t>(r) * bytes, send, bytes);
  }
}

std::vector<std::string> SimulatedComm::gather_strings(const std::string& mine) {
  if (!passing_) return Communicator::gather_strings(mine);
  Call& c = next_call(CallDesc{CallKind::allgather, 0, DType::u8, ReduceOp::sum, 0});
  if (rank_ == 0) c.strings.assign(static_cast<std::size_t>(world_), std::string());
  c.strings[static_cast<std::size_t>(rank_)] = mine;
  std::vector<std::string> out(c.strings.begin(), c.strings.begin() + rank_ + 1);
  out.resize(static_cast<std::size_t>(world_), mine);
  return out;
}

void SimulatedComm::barrier() {
  if (passing_) next_call(CallDesc{CallKind::barrier, 0, DType::u8, ReduceOp::sum, 0});
}

}  // namespace dpcheck
