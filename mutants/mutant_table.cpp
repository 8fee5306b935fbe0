// The table of mutants (mutants/mutants.hpp): one row each, its name, the property aimed at it, the
// bug in words, and what it needs to show (an engine, a precision, a wide or large case, scale). The
// parts each one breaks are built by the hooks in mutants/mutants.cpp. A file of its own, so that the
// table reads as the list it is.
#include <array>
#include <span>
#include <string>
#include <string_view>

#include "mutants/mutants.hpp"
#include "src/builtin_names.hpp"
#include "src/error.hpp"

namespace dpcheck {

namespace {

constexpr std::array<MutantInfo, 64> kMutants{{
    {.name = "allreduce-sum-no-average",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "the all-reduce sums the gradients but never divides by the world size"},
    {.name = "allreduce-rank-order",
     .caught_by = "replicas_bitwise_synchronized",
     .bug = "each rank sums the all-reduce starting from its own rank, so the last bits differ between ranks"},
    {.name = "mean-of-means",
     .caught_by = "uneven_shares_match_whole_batch",
     .bug = "every rank's mean gradient gets the same weight, however many examples its share holds"},
    {.name = "drop-one-sample",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "the last rank leaves the last example of its share out of the forward pass"},
    {.name = "accumulate-sum-of-means",
     .caught_by = "accumulation_matches_whole_batch",
     .bug = "gradient accumulation adds the micro-batches' mean gradients without dividing by their number"},
    {.name = "sampler-rank-seed",
     .caught_by = "sampler_shards_disjoint",
     .bug = "each rank shuffles with seed + rank instead of the shared seed"},
    {.name = "sampler-off-by-one",
     .caught_by = "sampler_shards_disjoint",
     .bug = "each rank after the first starts its share one example early, repeating its neighbour's last example "
            "and leaving out its own last"},
    {.name = "optimizer-rank-perturb",
     .caught_by = "replicas_bitwise_synchronized",
     .bug = "the last rank's learning rate is one ULP larger than everyone else's",
     .wide_minimal_case = true},
    {.name = "writer-all-ranks",
     .caught_by = "only_rank0_writes",
     .bug = "the checkpoint writer does not check the rank: every rank writes"},
    {.name = "side-channel-log",
     .caught_by = "only_rank0_writes",
     .bug = "every rank but 0 fopen()s a log file of its own, bypassing the writer"},
    {.name = "resume-skips-optimizer-state",
     .caught_by = "checkpoint_resume_bitwise",
     .bug = "resuming restores the parameters and the step but starts the optimizer state afresh"},
    {.name = "bias-grad-atomic",
     .caught_by = "checkpoint_resume_bitwise",
     .bug = "the bias-gradient kernel adds with atomicAdd, so the order -- and the last bits -- change from run to run",
     .engine = builtin::cuda},
    {.name = "bias-grad-skip-tail",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "the bias-gradient kernel never writes the last column when the width is not a multiple of its tile",
     .engine = builtin::cuda},
    {.name = "sampler-epoch-frozen",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug =
         "the trainer never advances the sampler's epoch: every epoch visits the examples in the first epoch's order"},
    {.name = "short-last-step-dropped",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug =
         "an epoch has floor(share / slice) steps, so a short last step is never taken and its examples never trained"},
    {.name = "resume-restarts-epoch",
     .caught_by = "checkpoint_resume_bitwise",
     .bug = "resuming from a checkpoint taken mid-epoch starts that epoch over instead of continuing it"},
    {.name = "loss-mean-of-rank-means",
     .caught_by = "reported_loss_is_global_mean",
     .bug = "the reported loss averages the ranks' mean losses, whatever their shares' sizes"},
    {.name = "adam-step-count-stuck",
     .caught_by = "optimizer_update_matches_formula",
     .bug = "Adam's step count never advances, so every step uses the first step's bias corrections",
     .engine = builtin::cpu},
    {.name = "momentum-dampened",
     .caught_by = "optimizer_update_matches_formula",
     .bug = "SGD momentum keeps an average, buf = m buf + (1 - m) grad, instead of PyTorch's buf = m buf + grad",
     .engine = builtin::cpu},
    {.name = "allreduce-large-message-tail",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "an all-reduce larger than the backend's largest algorithm threshold leaves its last element unreduced",
     .wide_minimal_case = true},
    {.name = "allreduce-arrival-order",
     .caught_by = "checkpoint_resume_bitwise",
     .bug = "the all-reduce sums the ranks in the order they arrive, so every rank agrees but runs differ from each "
            "other"},
    {.name = "resume-cleanup-every-rank",
     .caught_by = "only_rank0_writes",
     .bug = "every rank deletes the checkpoints that do not verify once training starts, not rank 0 alone"},
    {.name = "rank-nan-gradient",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "from step 1 on, the last rank's local gradient picks up a NaN (as an uninitialised buffer or a bad kernel "
            "leaves "
            "one) before the all-reduce spreads it to every replica"},
    {.name = "allreduce-corrupt-one",
     .caught_by = "replicas_bitwise_synchronized",
     .bug = "the second gradient all-reduce leaves one element (the last) of rank 0's result at rank 0's own input, "
            "unreduced"},
    {.name = "bf16-accumulate",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "the matrix products round every partial sum to bf16, as a kernel with a 16-bit accumulator does, where "
            "autocast accumulates in float32",
     .engine = builtin::cpu,
     .precision = "bf16"},
    {.name = "allreduce-bf16-silently",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug =
         "the gradient all-reduce rounds its result to bf16, as a backend that halves its traffic unasked does, while "
         "the bound assumes float32",
     .precision = "bf16"},
    {.name = "fp16-no-scaling",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "the backward pass ignores the loss scaler and runs at scale 1, so fp16 deltas below 2^-14 lose their bits "
            "(and the smallest underflow to zero) where the scaled ones keep them",
     .wide_minimal_case = true,
     .precision = "fp16",
     .large_minimal_case = true},
    {.name = "unscale-after-allreduce",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "each rank scales its loss by a scale of its own (rank r: the scaler's times 2^r, as scalers restored from "
            "different checkpoints have) and unscales after the all-reduce by its own",
     .precision = "fp16"},
    {.name = "scaler-local-skip",
     .caught_by = "replicas_survive_overflow",
     .bug = "each rank decides from its own local gradient whether to skip a step, without agreeing: the rank that "
            "overflowed skips, the others step with the non-finite average",
     .precision = "fp16"},
    {.name = "bucket-boundary-off-by-one",
     .caught_by = "bucketing_preserves_bits",
     .bug = "each gradient bucket's all-reduce stops one element short, so the last element of every bucket keeps the "
            "rank's own gradient"},
    {.name = "bucket-reduced-before-ready",
     .caught_by = "bucketing_preserves_bits",
     .bug =
         "a bucket starts once the layer above its lowest one is done (the first bucket before the backward pass), so "
         "it is reduced from the values its last layer held before this step wrote them",
     .engine = builtin::cpu},
    {.name = "bound-without-kink-term",
     .caught_by = "bound_holds_for_any_summation_order",
     .bug =
         "the derived bound forgets that a ReLU within rounding of its kink may take either side in two float paths"},
    {.name = "bound-three-times-loose",
     .caught_by = "bound_holds_for_any_summation_order",
     .bug = "every bound is three times what rounding needs: every check passes, and proves less"},
    {.name = "scaler-growth-late",
     .caught_by = "loss_scaler_follows_gradscaler",
     .bug =
         "the loss scaler compares its count of good steps with the growth interval before counting the step, so the "
         "scale grows one good step late"},
    {.name = "scaler-backoff-keeps-count",
     .caught_by = "loss_scaler_follows_gradscaler",
     .bug =
         "a skipped step backs the scale off but leaves the count of good steps where it was, so the next growth comes "
         "early"},
    {.name = "warmup-one-step-early",
     .caught_by = "lr_schedule_follows_goyal",
     .bug = "the warm-up counts steps from 1: every step takes the next step's rate, and the full rate comes a step "
            "early"},
    {.name = "warmup-forgets-scaling",
     .caught_by = "lr_schedule_follows_goyal",
     .bug = "once the warm-up is over the learning rate falls back to --lr instead of staying at the linearly scaled "
            "rate"},
    {.name = "shuffle-sattolo",
     .caught_by = "shuffle_follows_recipe",
     .bug =
         "the shuffle draws each swap partner from [0, i) instead of [0, i] (Sattolo's algorithm): every order is one "
         "cycle, no example ever keeps its place, and the shares are still disjoint and covering"},
    {.name = "shuffle-modulo",
     .caught_by = "shuffle_follows_recipe",
     .bug = "the shuffle reduces 64 random bits modulo i + 1 instead of the recipe's multiply-and-reject: a valid, "
            "nearly unbiased permutation, but not the one another loader following the recipe draws"},
    // The write audit's own judgement (src/audit/audit_preload.cpp, "mutants"): the audit library in every
    // audited process takes the mutant from the property (audit::AuditOptions::mutant).
    {.name = "audit-rdwr-not-a-write",
     .caught_by = "audit_sees_every_write",
     .bug = "the write audit takes an open with O_RDWR but no O_CREAT, O_TRUNC or O_APPEND for a read, missing an "
            "in-place rewrite and a shared writable mmap"},
    {.name = "audit-fopen-plus-ignored",
     .caught_by = "audit_sees_every_write",
     .bug = "the write audit takes every fopen mode that starts with 'r' for a read, \"r+\" included"},
    // The divergence tools' own (properties/tools.cpp).
    {.name = "trace-digest-prefix",
     .caught_by = "divergence_tools_name_the_difference",
     .bug = "the trace hashes a tensor's (and an index list's) element count in bytes, not its size in bytes: the "
            "digest covers the first quarter of a tensor, so a difference late in it goes unseen"},
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
         "train's live gradient check holds the all-reduced gradient to the whole batch's bound, which counts neither "
         "the shards' roundings nor a bf16 all-reduce's: a correct run with a bf16 all-reduce and "
         "--check-gradient-every fails (bf16 products show it too: their shards' deltas round at N times the whole "
         "batch's scale)",
     .precision = "bf16"},
    {.name = "live-finite-simulated-rank0",
     .caught_by = "divergence_tools_name_the_difference",
     .bug =
         "train's live finite check on simulated ranks judges on rank 0's pass, which holds copies of its own verdict "
         "in the places of the ranks still to come: a NaN on any other rank passes",
     .scale = true},
    {.name = "abi3-zero-op-mask-none",
     .caught_by = "plugin_abi_rules_hold",
     .bug = "an ABI-3 table whose op mask is 0 is read as taking no op, where plugin.h says a mask of 0 means ABI 1's "
            "ops: every all-reduce of such a plugin is refused"},
    {.name = "abi1-handed-16bit",
     .caught_by = "plugin_abi_rules_hold",
     .bug = "bfloat16 and float16 collectives are handed to a plugin of ABI 1, which knows no dtype past int64 "
            "(dpcheck_dtype_t's values 3 and 4 came with ABI 2)"},
    {.name = "abi2-reads-past-table",
     .caught_by = "plugin_abi_rules_hold",
     .bug = "the masks are read from tables of ABI 2 as well (abi >= 2, not >= 3): past the end of the table, whatever "
            "memory follows it decides what the plugin is handed"},
    {.name = "plugin-finalize-before-barrier",
     .caught_by = "plugin_abi_rules_hold",
     .bug =
         "a run's end finalizes each rank before the ranks' barrier, not after it: a rank's finalize may free what a "
         "peer still inside its last collective reads"},
    {.name = "audit-openat-unrecorded",
     .caught_by = "audit_sees_every_write",
     .bug = "the write audit interposes openat but records nothing for it, as if programs called only open"},
    // Bugs that only scale shows (MutantInfo::scale): verify's scale class of worlds finds them.
    {.name = "sampler-index-32bit",
     .caught_by = "sampler_shards_disjoint",
     .bug = "the sampler computes a share's positions in 32-bit integers, as code written for data sets that fit an "
            "int does: past 2^31 examples a position wraps negative",
     .scale = true},
    {.name = "allreduce-tree-drops-rank",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "the all-reduce chains the ranks of each node of 8 and joins the nodes in a binary tree built for a power "
            "of two: when the node count is not one (65 ranks, 1000), the last node's first rank is never added",
     .scale = true},
    {.name = "allreduce-hierarchical-group-means",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "the hierarchical all-reduce averages within each group of 8 ranks, then averages the group means: right "
            "while every group is full, wrong when N is no multiple of 8 (63, 65, 1000)",
     .scale = true},
    {.name = "allreduce-ring-chunk-start-off-by-one",
     .caught_by = "gradient_average_matches_whole_batch",
     .bug = "the ring's reduce-scatter starts chunk c at rank c + 1 instead of rank c and stops after N - 1 ranks, so "
            "chunk c never receives rank c's part"},
    {.name = "bound-ring-depth-as-tree",
     .caught_by = "allreduce_schedules_within_bound",
     .bug = "the bound counts a ring's roundings as a double binary tree's, about 2 log2 N, where each chunk's partial "
            "sum "
            "is rounded at N - 1 hops: near enough up to 8 ranks, too tight past them",
     .scale = true},
    {.name = "schedule-halving-highest-bit-first",
     .caught_by = "allreduce_schedules_within_bound",
     .bug = "the halving-doubling emulation pairs the ranks that differ in the highest bit first, where MPICH and Gloo "
            "pair bit 0 first: the same depth and the same bound, other bits, so --schedule halving-doubling judges a "
            "correct library wrong and a wrong one right"},
    {.name = "conform-same-inputs-every-rank",
     .caught_by = "conform_rows_catch_broken_communicators",
     .bug = "conform's same-bits and run-to-run checks draw the same random values on every rank, so ranks that sum in "
            "orders of their own agree anyway: the row passes a correct library and a broken one alike"},
    {.name = "conform-avg-allowance-16bit",
     .caught_by = "conform_rows_catch_broken_communicators",
     .bug = "conform's allowance for an average's rounding takes bfloat16's unit roundoff for every dtype: float32 and "
            "float64 averages may be off by a 16-bit rounding, as a scale of 1/N kept in bfloat16 leaves them"},
    {.name = "conform-replay-drops-world-size",
     .caught_by = "conform_rows_catch_broken_communicators",
     .bug = "a failing conform row's replay line leaves out --world-size, so run as printed it replays on conform's "
            "default worlds instead of the N ranks it failed on"},
    {.name = "conform-kernel-whole-tiles",
     .caught_by = "conform_rows_catch_broken_communicators",
     .bug = "conform's kernel checks draw every size as a whole number of tiles of 8, as a check written beside a "
            "kernel tiled by 8 would: a kernel that drops the tail of a dot product or of a vector passes every row"},
    {.name = "trainer-slot-32bit",
     .caught_by = "share_weights_match_global_batch",
     .bug =
         "the trainer computes a step's slot of a share in 32-bit integers: past 2^31 examples a share (a data set of "
         "tokens over few ranks) wraps negative, and the rank trains on the wrong examples or none",
     .scale = true},
    {.name = "share-weight-float32",
     .caught_by = "share_weights_match_global_batch",
     .bug = "the share weight b_r N / B is computed from counts held in float32, as a global batch counted in a float "
            "tensor is: exact up to 2^24 examples, past that B and b_r N round before the division",
     .scale = true},
}};

}  // namespace

std::span<const MutantInfo> mutants() { return kMutants; }

std::string audit_mutant(std::string_view mutant) {
  return mutant.starts_with("audit-") && find_mutant(mutant) != nullptr ? std::string(mutant) : std::string();
}

const MutantInfo* find_mutant(std::string_view name) {
  for (const MutantInfo& m : kMutants)
    if (m.name == name) return &m;
  return nullptr;
}

void require_known_mutant(std::string_view name) {
  if (name.empty() || find_mutant(name)) return;
  std::string names;
  for (const MutantInfo& m : kMutants) names += (names.empty() ? "" : ", ") + std::string(m.name);
  throw UsageError("unknown mutant '" + std::string(name) + "' (known: " + names + ")");
}

}  // namespace dpcheck
