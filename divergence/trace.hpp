// The value-level flight recorder behind `train --trace FILE`. Where a collective recorder says which
// calls ran, this one says what they carried: per step and per rank, an order-sensitive digest (XXH3-64
// of the bytes, on the host) of the step's example indices, of each tensor of the local gradient before
// the all-reduce, of the gradient after it, of the parameters and of the optimizer state after the step;
// every data collective in call order with each rank's input and output digest; and per tensor the
// numbers that let a diff say how far apart two values are (largest |x| and sum over the finite
// elements, and the count of the others). Two runs that should agree bit for bit can then be diffed to
// the first step, phase, rank and tensor where they part (divergence/diff.hpp).
//
// The file is JSON lines: a header (configuration, target, tensor and state names), then one line a
// step. Every rank records its own part; at the end of the step the parts are gathered to rank 0, which
// writes the line through the RankZeroWriter.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/comm.hpp"
#include "src/train/model.hpp"
#include "src/train/trainer.hpp"

namespace dpcheck {

inline constexpr int kTraceVersion = 1;

struct TensorSummary {
  std::uint64_t digest = 0;  // XXH3-64 of the float32 bytes
  double max_abs = 0;        // over the finite elements
  double sum = 0;            // over the finite elements
  std::int64_t non_finite = 0;
};
TensorSummary summarize(std::span<const float> values);
nlohmann::json to_json(const TensorSummary& s);
// "00ff..." : 16 lower-case hex digits.
std::string digest_hex(std::uint64_t digest);

// One data collective as one rank saw it.
struct CollectiveRecord {
  std::int64_t seq = 0;  // calls on this communicator since the run began
  std::string call;      // allreduce | broadcast | allgather
  std::string op;        // allreduce's reduction; empty otherwise
  DType dtype = DType::f32;
  std::size_t count = 0;
  std::uint64_t in = 0, out = 0;
};

// The recorder: a StepObserver for the trainer's phases, and the communicator wrapper that sees the
// data collectives (the trainer's, not the control messages that go through host()).
class TraceRecorder final : public StepObserver {
 public:
  TraceRecorder(const ModelConfig& model, std::vector<std::string> state_names);

  void local_gradient(Trainer& trainer, std::int64_t step, double loss_sum, std::int64_t examples) override;
  void reduced_gradient(Trainer& trainer, std::int64_t step) override;
  void updated(Trainer& trainer, std::int64_t step) override;

  // Called by the communicator wrapper around every data collective.
  void record(CollectiveRecord record) { calls_.push_back(std::move(record)); }
  std::int64_t next_seq() { return seq_++; }

  // Digests only a prefix of each buffer: the broken digests of a mutant (trace_digest_prefix of
  // src/target/target.hpp says when).
  void set_digest_prefix(bool prefix) { prefix_digest_ = prefix; }

  // This rank's part of the step's line.
  nlohmann::json rank_part(int rank) const;

  // A collective: gathers every rank's part over `host`. On rank 0, the step's line with `extra` merged
  // in ("loss", "checks"); elsewhere null. Clears the step's records on every rank.
  nlohmann::json finish_step(Communicator& host, std::int64_t step, nlohmann::json extra);

 private:
  std::vector<TensorSummary> tensors(const float* flat, std::size_t n) const;
  // The engine's gradient buffer, through a host copy when it lives on a device.
  std::vector<TensorSummary> gradient_tensors(Engine& engine);

  ParamLayout layout_;
  std::vector<std::string> state_names_;
  std::vector<float> host_;  // a host copy, when the engine's buffers live elsewhere
  std::int64_t indices_count_ = 0;
  std::uint64_t indices_digest_ = 0;
  std::vector<TensorSummary> local_, reduced_, params_;
  std::vector<std::vector<TensorSummary>> state_;
  std::vector<CollectiveRecord> calls_;
  std::int64_t seq_ = 0;
  bool prefix_digest_ = false;
};

// Forwards every call to `inner` and records each data collective, with digests of its input and
// output buffers, into the recorder. host() stays the inner one's: control messages are not traced.
class TracingCommunicator final : public ForwardingCommunicator {
 public:
  TracingCommunicator(Communicator& inner, TraceRecorder& recorder)
      : ForwardingCommunicator(inner), recorder_(recorder) {}
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, std::size_t count, DType dtype, int root) override;
  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override;

 private:
  std::uint64_t digest(const void* buf, std::size_t bytes);
  TraceRecorder& recorder_;
  std::vector<unsigned char> staging_;
};

// The header line: what a diff needs to say whether two runs had the same configuration.
nlohmann::json trace_header(const nlohmann::json& config, const nlohmann::json& target, int world_size,
                            const ModelConfig& model, const std::vector<std::string>& state_names);

// Whether `observers` is empty, one, or several, the trainer takes one: this calls each in order.
class StepObservers final : public StepObserver {
 public:
  void add(StepObserver* o) { list_.push_back(o); }
  bool empty() const { return list_.empty(); }
  void local_gradient(Trainer& t, std::int64_t step, double loss_sum, std::int64_t examples) override {
    for (StepObserver* o : list_) o->local_gradient(t, step, loss_sum, examples);
  }
  void reduced_gradient(Trainer& t, std::int64_t step) override {
    for (StepObserver* o : list_) o->reduced_gradient(t, step);
  }
  void updated(Trainer& t, std::int64_t step) override {
    for (StepObserver* o : list_) o->updated(t, step);
  }

 private:
  std::vector<StepObserver*> list_;
};

}  // namespace dpcheck
