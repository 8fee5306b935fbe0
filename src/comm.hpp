// The Communicator: how ranks exchange data. Every collective is in place or into a caller's buffer,
// counts are in elements, and every call ends within timeout() -- with a TimeoutError naming the call
// and the rank -- rather than hang on a dead or stuck peer.
//
// Backends: "local" (ranks as threads of one process, src/comm/local_comm.hpp), "mpi" (one process per
// rank), and the GPU ones under kernels/; each is a row of the table in src/target/backends.hpp. Buffers live in
// memory_space(): host pointers for the CPU backends, device pointers for the GPU ones.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/dtype.hpp"

namespace dpcheck {

enum class ReduceOp { sum, avg, min, max };

class SimulatedComm;
std::string_view reduce_op_name(ReduceOp op);

class Communicator {
 public:
  static constexpr std::chrono::milliseconds default_timeout{60'000};

  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;
  virtual MemorySpace memory_space() const { return MemorySpace::host; }

  // buf holds count elements on every rank; afterwards every rank holds the same, bitwise identical,
  // reduction. avg is the sum divided by size(), for the floating dtypes only. min and max are for
  // integer verdicts and counts.
  //
  // bfloat16 and float16 (16-bit patterns, src/dtype.hpp): each element's reduction converts every
  // input to float32 (exactly), accumulates in float32 in the backend's order, and rounds to the
  // 16-bit format once, at the end (round to nearest, ties to even; src/low_precision.hpp); avg
  // divides the float32 sum by size() before that one rounding, and min and max return one of the
  // inputs. So a sum is the 16-bit rounding of the float32 sum: local, mpi and cuda-local give the
  // same bits for the same inputs. Two backends cannot keep the sum in float32 between ranks, and
  // round more often: nccl (and a plugin around NCCL) rounds to the 16-bit format at every hop of its
  // ring, N - 1 roundings, with avg as that sum divided by N and rounded again; mpi-native (MPI's own
  // MPI_Allreduce with a user-defined operation over the 16-bit patterns) rounds at every combination
  // in MPI's tree. That is why the error bound of a 16-bit all-reduce allows N + 1 roundings in the
  // format's unit roundoff (2^-8 for bfloat16, 2^-11 for float16), not one.
  virtual void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) = 0;
  // Copies root's count elements into buf on every other rank.
  virtual void broadcast(void* buf, std::size_t count, DType dtype, int root) = 0;
  // send holds count elements; recv receives size()*count, rank r's block at offset r*count.
  virtual void allgather(const void* send, void* recv, std::size_t count, DType dtype) = 0;
  virtual void barrier() = 0;

  // Element counts (of this dtype, on this many ranks) at which the backend switches algorithm: a call
  // of more elements than a threshold takes another path than one of fewer. Checks draw sizes on both
  // sides of each, so that every run exercises every path. Empty when the backend has one path.
  virtual std::vector<std::size_t> algorithm_thresholds(DType /*dtype*/) const { return {}; }

  // A communicator over the same ranks that takes host buffers, for the small control messages
  // (hashes, verdicts, counts) that the trainer and checks exchange. Host backends return themselves.
  virtual Communicator& host() { return *this; }

  // Whether every rank's buffers are addressable from every other rank (ranks as threads of one
  // process), so that a check may compare replicas in place instead of gathering copies.
  virtual bool shares_address_space() const { return false; }

  // Whether this communicator's calls may come from a thread other than the one that made it (one call
  // at a time, each ordered after the last by the caller), as a bucketed all-reduce's communication
  // thread makes them. False unless the backend says so.
  virtual bool callable_from_any_thread() const { return false; }

  // The simulated world behind this communicator (src/comm/simulated_comm.hpp), whose ranks the trainer
  // plays one at a time; nullptr for real ranks.
  virtual SimulatedComm* simulated() { return nullptr; }
  // Device backends queue their work on this stream (a cudaStream_t), after the engine's work.
  virtual void set_stream(void* /*stream*/) {}

  // Copies between memory_space() and the host: memcpy for host backends.
  virtual void to_host(const void* src, void* dst, std::size_t bytes);
  virtual void from_host(const void* src, void* dst, std::size_t bytes);

  std::chrono::milliseconds timeout() const { return timeout_; }
  virtual void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  template <class T> void allreduce(std::span<T> buf, ReduceOp op) {
    allreduce(buf.data(), buf.size(), dtype_of<T>(), op);
  }
  template <class T> void broadcast(std::span<T> buf, int root) {
    broadcast(buf.data(), buf.size(), dtype_of<T>(), root);
  }
  template <class T> void allgather(std::span<const T> send, std::span<T> recv) {
    allgather(send.data(), recv.data(), send.size(), dtype_of<T>());
  }
  // One value from every rank, in rank order (host buffers).
  template <class T> std::vector<T> allgather_value(T value);
  // The AND of a verdict over all ranks, so that every rank takes the same branch afterwards.
  bool all(bool verdict);
  // allgather_strings on this (host) communicator: two all-gathers, the lengths then the texts padded to
  // the longest. Simulated ranks keep the texts as the ranks are played instead (the longest is not
  // known until the last rank).
  virtual std::vector<std::string> gather_strings(const std::string& mine);

 private:
  std::chrono::milliseconds timeout_ = default_timeout;
};

template <class T> std::vector<T> Communicator::allgather_value(T value) {
  Communicator& h = host();
  std::vector<T> all(static_cast<std::size_t>(h.size()));
  h.allgather(&value, all.data(), 1, dtype_of<T>());
  return all;
}

// Every rank's text, in rank order, gathered on every rank over a host communicator (two all-gathers:
// the lengths, then the texts padded to the longest).
std::vector<std::string> allgather_strings(Communicator& host, const std::string& mine);

// Forwards every call to another communicator; wrappers (the mutants that break a collective, the
// trace's recorder) override the calls they change.
class ForwardingCommunicator : public Communicator {
 public:
  explicit ForwardingCommunicator(Communicator& inner) : inner_(inner) { Communicator::set_timeout(inner.timeout()); }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string_view backend() const override { return inner_.backend(); }
  MemorySpace memory_space() const override { return inner_.memory_space(); }
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    inner_.allreduce(buf, count, dtype, op);
  }
  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    inner_.broadcast(buf, count, dtype, root);
  }
  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    inner_.allgather(send, recv, count, dtype);
  }
  void barrier() override { inner_.barrier(); }
  std::vector<std::size_t> algorithm_thresholds(DType dtype) const override {
    return inner_.algorithm_thresholds(dtype);
  }
  Communicator& host() override { return inner_.host(); }
  bool shares_address_space() const override { return inner_.shares_address_space(); }
  bool callable_from_any_thread() const override { return inner_.callable_from_any_thread(); }
  SimulatedComm* simulated() override { return inner_.simulated(); }
  std::vector<std::string> gather_strings(const std::string& mine) override { return inner_.gather_strings(mine); }
  void set_stream(void* stream) override { inner_.set_stream(stream); }
  void to_host(const void* src, void* dst, std::size_t bytes) override { inner_.to_host(src, dst, bytes); }
  void from_host(const void* src, void* dst, std::size_t bytes) override { inner_.from_host(src, dst, bytes); }
  void set_timeout(std::chrono::milliseconds t) override {
    Communicator::set_timeout(t);
    inner_.set_timeout(t);
  }

 protected:
  Communicator& inner_;
};

}  // namespace dpcheck
