// Simulated ranks: a world of N ranks that one thread plays, one rank at a time, so that a step of
// 4,096 ranks costs the memory of one replica and the reduction's partial results, not N replicas.
//
// The trainer (src/train/trainer.cpp) plays each rank's part of a step in turn: rank 0's gradient pass,
// then rank 1's, ... Every collective of a pass folds the rank's buffer into that call's partial result,
// in rank order, as the local backend reduces ((g_0 + g_1) + g_2) + ...; the last rank's pass completes
// each call and receives the result, bit for bit what `local` gives the same buffers. An earlier rank's
// call returns its own buffer unchanged: its pass goes on with the values it had, and nothing it computes
// after a collective is kept (the trainer keeps only the last pass's outcome).
//
// After the passes the world is one replica standing for all: every rank would hold the same parameters,
// optimizer state and scaler, so a call acts as if every rank passed this replica's buffer (avg and min
// and max of identical values, a sum of N copies in rank order, an all-gather of N copies). The replica
// check therefore cannot fail here: replica synchronisation, like the write audit, needs real ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/comm.hpp"
#include "src/comm/collective.hpp"

namespace dpcheck {

class SimulatedComm final : public Communicator {
 public:
  // Ranks 1 to 2^20: a world is a loop, not threads or memory.
  static constexpr int max_world = 1 << 20;
  explicit SimulatedComm(int world_size);

  // The rank being played (0 once the passes are over: the replica speaks for the world as rank 0).
  int rank() const override { return passing_ ? rank_ : 0; }
  int size() const override { return world_; }
  std::string_view backend() const override { return "simulated"; }
  SimulatedComm* simulated() override { return this; }

  // Plays `rank` from here on; its calls fold in the order it makes them. Rank 0 starts a round of
  // passes (the partial results of the last round are dropped); the ranks are played in order.
  void play(int rank);
  // The passes are over: calls act on the one replica (see above).
  void replicate();
  // A pass ended with an exception (a check that failed, a fault): the round is dropped unfinished and
  // calls act on the replica, so that what handles the failure (a bundle, a report) may still call.
  void abandon();
  bool passing() const { return passing_; }

  using Communicator::allgather;
  using Communicator::allreduce;
  using Communicator::broadcast;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override;
  void broadcast(void* buf, std::size_t count, DType dtype, int root) override;
  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override;
  void barrier() override;
  // allgather_strings (src/comm.hpp) while the ranks are played: the strings so far, and this rank's in
  // every later place, as allgather gives blocks. (The two-call exchange of sizes then padded bytes
  // cannot be played: each pass would see another largest size and make another call.)
  std::vector<std::string> gather_strings(const std::string& mine) override;

  // The most bytes that the partial results of one round of passes held (for the memory figures: they
  // grow with the calls of one pass, not with N).
  std::size_t peak_partial_bytes() const { return peak_bytes_; }

 private:
  // One call of a round: what rank 0 asked for, and the partial result of the ranks played so far.
  struct Call {
    CallDesc desc;
    std::vector<std::byte> acc;        // the accumulator (float32 for the 16-bit formats), or all-gathered blocks
    std::vector<std::string> strings;  // allgather_strings's, one a rank
  };
  // The call this pass is at, checked against what rank 0 asked for (the ranks' calls must agree).
  Call& next_call(const CallDesc& desc);
  void replicated_allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op);

  int world_;
  int rank_ = 0;
  bool passing_ = false;
  std::size_t next_ = 0;     // index of this pass's next call in calls_
  std::vector<Call> calls_;  // the round's calls, in the order every pass makes them
  std::size_t peak_bytes_ = 0;
};

}  // namespace dpcheck
