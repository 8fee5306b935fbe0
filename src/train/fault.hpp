// Fault injection: one planted difference at a chosen step, rank, buffer and element. A Target may carry
// one (Target::fault): the divergence tools' property plants them to hold diff, replay and drift to
// locating exactly them, and several mutants are faults. So they live in the core, beside the trainer
// and communicator they wrap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "src/comm.hpp"
#include "src/io/memory_service.hpp"
#include "src/train/trainer.hpp"

namespace dpcheck {

// Fault injection, like Megatron's error injector: one element of one buffer changed at one step, so
// that a check or a trace diff can be held to locating exactly it: the lowest mantissa bit flipped
// (the smallest change there is), a NaN, a change no rounding makes (a quarter of max(|v|, 1) added:
// a bug), or (all-reduce only) the element left as this rank's own input, as a reduction that skips
// one chunk on one rank leaves it. A data fault replaces one example of the rank's step with the next
// one of the data set, whatever the kind.
enum class FaultKind { flip_low_bit, nan, keep_input, bug };
// Where the fault goes: the rank's examples, its local gradient before the all-reduce, the output of
// the all-reduce, its parameters after the optimizer step, or its optimizer state after it.
enum class FaultPhase { data, local_gradient, all_reduce, update, optimizer_state };
std::string_view fault_phase_name(FaultPhase phase);  // "data", "local gradient", ..., "optimizer state"
struct Fault {
  // The training step (local gradient only: below 0, every step from -step on); all-reduce: the data
  // call's sequence number on the communicator, from 0 (the step, without buckets, from step 0).
  std::int64_t step = 0;
  int rank = 0;
  // The flat element of the buffer, or the position in the step's examples (data); beyond the buffer:
  // its last element.
  std::size_t element = 0;
  FaultKind kind = FaultKind::flip_low_bit;
  FaultPhase phase = FaultPhase::local_gradient;

  bool operator==(const Fault&) const = default;
  std::string describe() const;  // "a flipped low bit in the local gradient of rank 1 at step 2, element 7"
};
// Changes element fault.element of n floats in `memory`'s space (one float copied out and back).
void inject_fault(const MemoryService& memory, float* buf, std::size_t n, const Fault& fault);
// The output of data all-reduce number fault.step (counted from 0 on this communicator) on fault.rank.
std::unique_ptr<Communicator> fault_communicator(Communicator& inner, const Fault& fault);
// The hooks (TrainerHooks) through which fault.rank takes the fault at step fault.step: in its examples,
// its local gradient before the all-reduce, or its parameters or optimizer state after the update. None
// for an all-reduce fault (fault_communicator).
TrainerHooks fault_hooks(const Fault& fault);

}  // namespace dpcheck
