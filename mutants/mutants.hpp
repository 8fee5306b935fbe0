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

#include "reference/bound.hpp"
#include "src/comm.hpp"
#include "src/target/mutant_hooks.hpp"
#include "src/train/fault.hpp"
#include "src/train/optimizer.hpp"
#include "src/train/sampler.hpp"
#include "src/train/trainer.hpp"
#include "src/train/writer.hpp"

namespace dpcheck {

struct PluginRules;  // src/target/plugin_comm.hpp

struct MutantInfo {
  std::string_view name;
  std::string_view caught_by;    // the property aimed at it
  std::string_view bug;          // what is broken
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
  // The bug shows only at scale (a world of the scale class, a data set past 2^31 examples): verify
  // draws the scale class in half the cases against it, and its minimal case keeps the world it needs.
  bool scale = false;
};

std::span<const MutantInfo> mutants();
const MutantInfo* find_mutant(std::string_view name);  // nullptr when unknown
void require_known_mutant(std::string_view name);      // UsageError listing the names
// The mutant for the write audit's library (audit::AuditOptions::mutant) when `mutant` breaks the audit's
// own judgement (the rows named audit-...), else "".
std::string audit_mutant(std::string_view mutant);

// Registers this table's hooks as the program's mutant table (src/target/mutant_hooks.hpp), through which
// a Target builds its broken parts; idempotent. The dpcheck command, the property runner and the test
// programs call it before they run a target.
void register_mutants();

// The table's hooks (src/target/mutant_hooks.hpp's MutantTable). Each returns nullptr (or its input unchanged)
// when the mutant does not break that part, so the correct part is used.
MutantTraits mutant_traits(std::string_view name);  // UsageError for an unknown name (require_known_mutant)
void mutant_engine_spec(std::string_view mutant, EngineSpec& spec);
bool mutant_trace_digest_prefix(std::string_view mutant);
// The bound mutants: the derived bound without its kink term, or three times as loose.
void mutant_bound_options(std::string_view mutant, reference::BoundOptions& options);
// The plugin ABI's mutants (plugin_abi_rules_hold): the broken rule a plugin's communicator applies in
// place of plugin.h's; the rules themselves for any other.
PluginRules mutant_plugin_rules(std::string_view mutant);
// conform's mutant of its own checks: the same-bits and run-to-run checks draw the same random values on
// every rank, so ranks that sum in different orders still agree.
bool mutant_conform_same_inputs(std::string_view mutant);
// conform's mutant of its allowance: an average's rounding allowed with bfloat16's unit roundoff.
bool mutant_conform_avg_allowance_16bit(std::string_view mutant);
// conform's mutant of its kernel checks' shapes: every drawn size a multiple of 8.
bool mutant_conform_kernel_whole_tiles(std::string_view mutant);
// conform's mutant of its replay lines: a failing row's line without its --world-size.
bool mutant_conform_replay_drops_world_size(std::string_view mutant);
// The schedule emulation's mutant: halving-doubling's pairs from the highest bit down.
void mutant_schedule_options(std::string_view mutant, reference::ScheduleOptions& options);
// The schedule-bound mutant: a ring's gamma from a tree's depth.
void mutant_schedule_gamma(std::string_view mutant, const reference::ScheduleOptions& options, int world,
                           double& gamma);
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
