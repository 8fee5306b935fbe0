// Mutants: deliberately broken parts, one bug each, selectable by name. A check that cannot fail
// proves nothing, so every property has at least one mutant aimed at it, and the kill-matrix test
// (tests/kill_matrix_test.cpp) requires each mutant to be caught by its property and shrunk to a
// small case, while the correct implementation passes everything.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "reference/allreduce_schedule.hpp"
#include "reference/bound.hpp"
#include "src/target/mutant_hooks.hpp"
#include "src/target/plugin_comm.hpp"

namespace dpcheck {

// One mutant, whole: its name, the property aimed at it, the bug in words, what it needs to show, and
// the hooks that build the parts it breaks. A row is all there is to a mutant: verify, the kill matrix
// (tests/kill_matrix_test.cpp) and the list of mutants read the rows (docs/mutants.md shows one added).
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
  // The trainer's parts it breaks: communicator, sampler, optimizer, engine, the trainer's seams, writer.
  MutantParts parts = {};
  // The checks' own parts it breaks: the derived bound, the schedule emulation and its bound, the plugin
  // ABI's rules. (Mutants of conform's, the divergence tools' and the write audit's own judgement are
  // compared by name where that judgement is made: those checks hold the broken line beside the right one.)
  void (*bound)(reference::BoundOptions& options) = nullptr;
  void (*schedule)(reference::ScheduleOptions& options) = nullptr;
  void (*schedule_gamma)(const reference::ScheduleOptions& options, int world, double& gamma) = nullptr;
  void (*plugin_rules)(PluginRules& rules) = nullptr;
};

// The rows, by the part they break (mutants/comm_mutants.cpp, data_mutants.cpp, step_mutants.cpp,
// file_mutants.cpp, check_mutants.cpp); mutants() is all of them.
std::span<const MutantInfo> comm_mutants();
std::span<const MutantInfo> data_mutants();
std::span<const MutantInfo> step_mutants();
std::span<const MutantInfo> file_mutants();
std::span<const MutantInfo> check_mutants();

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

// The table as the core sees it (src/target/mutant_hooks.hpp's MutantTable).
MutantTraits mutant_traits(std::string_view name);  // UsageError for an unknown name (require_known_mutant)
// The parts that `name` breaks; none for "" and for a name no row has.
const MutantParts& mutant_parts(std::string_view name);

// The checks' own parts, from the row of `mutant` (no change for "" or a mutant that leaves them alone).
void mutant_bound_options(std::string_view mutant, reference::BoundOptions& options);
// The plugin ABI's mutants (plugin_abi_rules_hold): the broken rule a plugin's communicator applies in
// place of plugin.h's; the rules themselves for any other.
PluginRules mutant_plugin_rules(std::string_view mutant);
void mutant_schedule_options(std::string_view mutant, reference::ScheduleOptions& options);
void mutant_schedule_gamma(std::string_view mutant, const reference::ScheduleOptions& options, int world,
                           double& gamma);
// conform's mutants of its own checks (conform/): the same-bits and run-to-run checks draw the same
// random values on every rank; an average's rounding allowed with bfloat16's unit roundoff; every drawn
// kernel size a multiple of 8; a failing row's replay line without its --world-size.
bool mutant_conform_same_inputs(std::string_view mutant);
bool mutant_conform_avg_allowance_16bit(std::string_view mutant);
bool mutant_conform_kernel_whole_tiles(std::string_view mutant);
bool mutant_conform_replay_drops_world_size(std::string_view mutant);

}  // namespace dpcheck
