// The mutants that break the checks themselves: the derived bound, the schedule emulation and its
// bound, the plugin ABI's rules, conform's checks, and the divergence tools, each with its row. A check
// that is never shown failing on a bug in its own logic might pass everything; these are those bugs.
#include <cstdint>
#include <span>
#include <string_view>

#include "mutants/mutants.hpp"

namespace dpcheck {

namespace {

constexpr std::uint32_t kAll16 = DPCHECK_DTYPE_BIT(DPCHECK_BFLOAT16) | DPCHECK_DTYPE_BIT(DPCHECK_FLOAT16);

// The schedule bound's gamma of a ring taken from a tree's depth.
void ring_depth_as_tree(const reference::ScheduleOptions& options, int world, double& gamma) {
  if (options.schedule != reference::AllreduceSchedule::ring) return;
  reference::ScheduleOptions tree = options;
  tree.schedule = reference::AllreduceSchedule::tree;
  gamma = reference::schedule_gamma(tree, world);
}

}  // namespace

// conform's own mutants are compared by name where conform makes the judgement they break.
bool mutant_conform_same_inputs(std::string_view mutant) { return mutant == "conform-same-inputs-every-rank"; }
bool mutant_conform_avg_allowance_16bit(std::string_view mutant) { return mutant == "conform-avg-allowance-16bit"; }
bool mutant_conform_kernel_whole_tiles(std::string_view mutant) { return mutant == "conform-kernel-whole-tiles"; }
bool mutant_conform_replay_drops_world_size(std::string_view mutant) {
  return mutant == "conform-replay-drops-world-size";
}

std::span<const MutantInfo> check_mutants() {
  static const MutantInfo rows[] = {
      {.name = "bound-without-kink-term",
       .caught_by = "bound_holds_for_any_summation_order",
       .bug =
           "the derived bound forgets that a ReLU within rounding of its kink may take either side in two float paths",
       .bound = [](reference::BoundOptions& o) { o.uncertain_kinks = false; }},
      {.name = "bound-three-times-loose",
       .caught_by = "bound_holds_for_any_summation_order",
       .bug = "every bound is three times what rounding needs: every check passes, and proves less",
       .bound = [](reference::BoundOptions& o) { o.looseness = 3; }},
      {.name = "bound-ring-depth-as-tree",
       .caught_by = "allreduce_schedules_within_bound",
       .bug =
           "the bound counts a ring's roundings as a double binary tree's, about 2 log2 N, where each chunk's partial "
           "sum "
           "is rounded at N - 1 hops: near enough up to 8 ranks, too tight past them",
       .scale = true,
       .schedule_gamma = ring_depth_as_tree},
      {.name = "schedule-halving-highest-bit-first",
       .caught_by = "allreduce_schedules_within_bound",
       .bug =
           "the halving-doubling emulation pairs the ranks that differ in the highest bit first, where MPICH and Gloo "
           "pair bit 0 first: the same depth and the same bound, other bits, so --schedule halving-doubling judges a "
           "correct library wrong and a wrong one right",
       .schedule = [](reference::ScheduleOptions& o) { o.halving_from_lowest_bit = false; }},
      {.name = "abi3-zero-op-mask-none",
       .caught_by = "plugin_abi_rules_hold",
       .bug =
           "an ABI-3 table whose op mask is 0 is read as taking no op, where plugin.h says a mask of 0 means ABI 1's "
           "ops: every all-reduce of such a plugin is refused",
       .plugin_rules =
           [](PluginRules& rules) {
             rules.ops = [](const dpcheck_comm_plugin_t& p) -> std::uint32_t {
               return p.abi < 3 ? DPCHECK_ABI1_OPS : p.ops;
             };
           }},
      {.name = "abi1-handed-16bit",
       .caught_by = "plugin_abi_rules_hold",
       .bug = "bfloat16 and float16 collectives are handed to a plugin of ABI 1, which knows no dtype past int64 "
              "(dpcheck_dtype_t's values 3 and 4 came with ABI 2)",
       .plugin_rules =
           [](PluginRules& rules) {
             rules.dtypes = [](const dpcheck_comm_plugin_t& p) -> std::uint32_t {
               return p.abi < 3 ? DPCHECK_ABI1_DTYPES | kAll16 : (p.dtypes ? p.dtypes : DPCHECK_ABI1_DTYPES);
             };
           }},
      {.name = "abi2-reads-past-table",
       .caught_by = "plugin_abi_rules_hold",
       .bug =
           "the masks are read from tables of ABI 2 as well (abi >= 2, not >= 3): past the end of the table, whatever "
           "memory follows it decides what the plugin is handed",
       .plugin_rules =
           [](PluginRules& rules) {
             rules.dtypes = [](const dpcheck_comm_plugin_t& p) -> std::uint32_t {
               if (p.abi == 1) return DPCHECK_ABI1_DTYPES;
               return p.dtypes ? p.dtypes : DPCHECK_ABI1_DTYPES;
             };
             rules.ops = [](const dpcheck_comm_plugin_t& p) -> std::uint32_t {
               return p.abi < 2 || p.ops == 0 ? DPCHECK_ABI1_OPS : p.ops;
             };
           }},
      {.name = "plugin-finalize-before-barrier",
       .caught_by = "plugin_abi_rules_hold",
       .bug =
           "a run's end finalizes each rank before the ranks' barrier, not after it: a rank's finalize may free what a "
           "peer still inside its last collective reads",
       .plugin_rules = [](PluginRules& rules) { rules.finalize_before_barrier = true; }},
      // conform's own judgement (conform/), by name: mutant_conform_same_inputs and the three beside it.
      {.name = "conform-same-inputs-every-rank",
       .caught_by = "conform_rows_catch_broken_communicators",
       .bug =
           "conform's same-bits and run-to-run checks draw the same random values on every rank, so ranks that sum in "
           "orders of their own agree anyway: the row passes a correct library and a broken one alike"},
      {.name = "conform-avg-allowance-16bit",
       .caught_by = "conform_rows_catch_broken_communicators",
       .bug =
           "conform's allowance for an average's rounding takes bfloat16's unit roundoff for every dtype: float32 and "
           "float64 averages may be off by a 16-bit rounding, as a scale of 1/N kept in bfloat16 leaves them"},
      {.name = "conform-replay-drops-world-size",
       .caught_by = "conform_rows_catch_broken_communicators",
       .bug = "a failing conform row's replay line leaves out --world-size, so run as printed it replays on conform's "
              "default worlds instead of the N ranks it failed on"},
      {.name = "conform-kernel-whole-tiles",
       .caught_by = "conform_rows_catch_broken_communicators",
       .bug = "conform's kernel checks draw every size as a whole number of tiles of 8, as a check written beside a "
              "kernel tiled by 8 would: a kernel that drops the tail of a dot product or of a vector passes every row"},
      {.name = "trace-digest-prefix",
       .caught_by = "divergence_tools_name_the_difference",
       .bug = "the trace hashes a tensor's (and an index list's) element count in bytes, not its size in bytes: the "
              "digest covers the first quarter of a tensor, so a difference late in it goes unseen",
       .parts = {.trace_digest_prefix = true}},
      // The divergence tools' own judgement (divergence/), compared by name there.
      {.name = "replay-same-place-ignores-element",
       .caught_by = "divergence_tools_name_the_difference",
       .bug = "replay's \"same place\" compares the kind, step and rank of the failures but not the element, so a "
              "failure elsewhere in the same tensor counts as reproduced"},
      {.name = "drift-judges-update-only",
       .caught_by = "divergence_tools_name_the_difference",
       .bug = "drift calls a step a bug only when the optimizer's update leaves the bound, so a bug in the gradient "
              "(whose update is right for the wrong gradient) is called rounding"},
      {.name = "bundle-precision-not-read-back",
       .caught_by = "divergence_tools_name_the_difference",
       .bug = "a bundle's recorded precision is not read back, so a bf16 or fp16 run's failing step replays in float32",
       .precision = "bf16"},
      {.name = "live-gradient-whole-batch-bound",
       .caught_by = "divergence_tools_name_the_difference",
       .bug =
           "train's live gradient check holds the all-reduced gradient to the whole batch's bound, which counts "
           "neither "
           "the shards' roundings nor a bf16 all-reduce's: a correct run with a bf16 all-reduce and "
           "--check-gradient-every fails (bf16 products show it too: their shards' deltas round at N times the whole "
           "batch's scale)",
       .precision = "bf16"},
      {.name = "live-finite-simulated-rank0",
       .caught_by = "divergence_tools_name_the_difference",
       .bug = "train's live finite check on simulated ranks judges on rank 0's pass, which holds copies of its own "
              "verdict "
              "in the places of the ranks still to come: a NaN on any other rank passes",
       .scale = true},
  };
  return rows;
}

}  // namespace dpcheck
