// Mutants: deliberately broken parts, one bug each, selectable by name. A check that cannot fail
// proves nothing, so every property has at least one mutant aimed at it, and the kill-matrix test
// (tests/kill_matrix_test.cpp) requires each mutant to be caught by its property and shrunk to a
// small case, while the correct implementation passes everything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "src/comm.hpp"
#include "src/optimizer.hpp"
#include "src/sampler.hpp"
#include "src/trainer.hpp"
#include "src/writer.hpp"

namespace dpcheck {

struct MutantInfo {
  std::string_view name;
  std::string_view caught_by;  // the property aimed at it
  std::string_view bug;        // what is broken
  std::string_view engine = {};  // the engine whose part it breaks, when only one has it ("cuda")
  // The bug shows only in a wide model -- beyond a communicator's algorithm thresholds, or with enough
  // elements that a one-ulp difference reaches a bit -- so its minimal case keeps the width it needs.
  bool wide_minimal_case = false;
  // The precision whose path it breaks, when it needs one ("bf16", "fp16"): verify runs it with
  // --precision that.
  std::string_view precision = {};
  // The bug shows only where a value falls below a format's normal range (an fp16 delta under 2^-14),
  // which takes many examples, outputs or layers: its minimal case keeps them (and the width).
  bool large_minimal_case = false;
};

std::span<const MutantInfo> mutants();
const MutantInfo* find_mutant(std::string_view name);  // nullptr when unknown
void require_known_mutant(std::string_view name);      // UsageError listing the names
// The mutant for the write audit's library (audit::AuditOptions::mutant) when `mutant` breaks the audit's
// own judgement (the rows named audit-...), else "".
std::string audit_mutant(std::string_view mutant);

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
// A trainer whose fault.rank takes the fault at step fault.step: in its examples, its local gradient
// before the all-reduce, or its parameters or optimizer state after the update (not all-reduce faults:
// fault_communicator).
std::unique_ptr<Trainer> fault_trainer(const Fault& fault, const TrainConfig& config, Communicator& comm, Engine& engine,
                                       Optimizer& optimizer, const DistributedSampler& sampler, const Dataset& data);

// Hooks for target.cpp. Each returns nullptr (or its input unchanged) when the mutant does not break
// that part, so the correct part is used.
std::unique_ptr<Communicator> mutant_communicator(std::string_view mutant, Communicator& inner);
std::unique_ptr<DistributedSampler> mutant_sampler(std::string_view mutant, const SamplerConfig& config);
// The optimizer itself, wrapped when the mutant breaks its formula.
std::unique_ptr<Optimizer> mutant_optimizer(std::string_view mutant, std::unique_ptr<Optimizer> optimizer);
OptimizerConfig mutant_optimizer_config(std::string_view mutant, OptimizerConfig config, int rank, int world_size);
std::unique_ptr<Trainer> mutant_trainer(std::string_view mutant, const TrainConfig& config, Communicator& comm,
                                        Engine& engine, Optimizer& optimizer, const DistributedSampler& sampler,
                                        const Dataset& data);
std::unique_ptr<RankZeroWriter> mutant_writer(std::string_view mutant, Communicator& comm,
                                              const std::filesystem::path& checkpoint_dir,
                                              const std::filesystem::path& log_path, int keep);

}  // namespace dpcheck
