// The properties: library functions that check the promises of data-parallel training against a
// Target. Each draws its inputs through RapidCheck, so the same code runs from GoogleTest
// (tests/properties_test.cpp) and from `dpcheck verify` (properties/runner.hpp), and shrinks on failure.
// Scenarios draw data sets of one to three batches and the step a check looks at anywhere in an epoch.
//
//   gradient_average_matches_whole_batch  the all-reduced shard gradient of a drawn step, and the
//                                         whole-batch float32 gradient, each within the derived bound of
//                                         the float64 one, for the step's examples restated on their own;
//                                         and one example dropped must leave the bound (power)
//   replicas_bitwise_synchronized         every step, every optimizer: identical parameters and state
//   sampler_shards_disjoint               shares disjoint apart from the reported padding, covering the
//                                         data apart from at most N-1 dropped, sized as the policy says
//   accumulation_matches_whole_batch      as the first, with 2 to 4 micro-batches per rank
//   uneven_shares_match_whole_batch       as the first, with shares of different sizes
//   only_rank0_writes                     processes under the write audit, fresh and resumed (past a
//                                         corrupt newest checkpoint): no rank but 0 writes, runs succeed
//   checkpoint_resume_bitwise             t steps (mid-epoch too), checkpoint, resume from the files, on
//                                         to T: the same bits as T steps straight
//   optimizer_update_matches_formula      every step's update and optimizer state within a derived bound
//                                         of PyTorch's formula evaluated in float64 from the same inputs
//   reported_loss_is_global_mean          the loss a step reports is the mean over the global batch
//                                         within its bound (not a mean of rank means)
//   bucketing_preserves_bits              the gradient all-reduced in buckets of a drawn size (splitting
//                                         tensors too), each started as the backward pass produces it:
//                                         the bits of one all-reduce, every step
//   bound_holds_for_any_summation_order   the bound itself: float32 gradients of small cases evaluated in
//                                         many summation orders, with and without FMA, never exceed it
//   audit_sees_every_write                the write audit itself: writes of every kind it claims to see,
//                                         planted by ranks other than 0 in one launch, each reported with
//                                         its rank, path and call; rank 0's and reads not reported
//   divergence_tools_name_the_difference  (properties/tools.cpp)
//   allreduce_schedules_within_bound      every schedule's emulated all-reduce within the bound of its
//                                         depth, at 1 to 4096 ranks, in float32, bf16 and fp16 (and tight),
//                                         and the bits of the algorithm written message by message
//   conform_rows_catch_broken_communicators  conform's own rows: each fails the defect meant for it, at a
//                                         case that fails again alone, and passes correct communicators
//                                         and kernels (its kernels: a dot product or a vector whose tail
//                                         is dropped, a dot product in another order)
//   plugin_abi_rules_hold                 a plugin's communicator hands each table of ABI 1, 2, 3 what it
//                                         declares, refuses the rest, and finalizes after the barrier
//   share_weights_match_global_batch      every rank's slot of its share and its scale for every
//                                         micro-batch, n N / B rounded once, at shares past 2^31
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "properties/scenario.hpp"
#include "reference/bound.hpp"
#include "src/target/target.hpp"

namespace dpcheck {

// What one case of a property measured; the runner (properties/runner.hpp) gathers them into the
// property's result: the largest error ratios, the closest call, the power of the check, and for a
// failure the size of the minimal case.
struct CaseRecord {
  // The case's largest error over the worst-case bound (the verdict's measure; passing needs <= 1), and
  // over the probabilistic bound (reported beside it, never the verdict). Negative: not measured.
  double ratio = -1;
  double probabilistic_ratio = -1;
  // Where the ratio was largest and what the bound there is made of, for the closest-call report.
  std::string note;
  // The power probe: the same case with one example dropped, against the same bound. Its ratio must
  // exceed 1 (caught) in the property's stated share of cases. Negative: not probed in this case.
  double probe_ratio = -1;
  // Tightness, for the property that tests the bound itself: the case's largest error over the bound
  // where the bound is rounding alone (no kink term), on the whole-batch and the sharded path.
  // Negative: not measured.
  double tightness[2] = {-1, -1};
  struct Size {
    std::int64_t examples = 0;  // batch, or data set size
    int world_size = 0;
    int layers = 0;
    int widest = 0;
  } size;
  // The case failed before the promise could be judged (what it runs failed for another reason, which
  // the failure says): reports must not blame the property's promise.
  bool not_judged = false;
};

struct PropertyDef {
  std::string_view name;
  std::string_view promise;
  // One case: draws a scenario with *gen from the space that `draw` fixes or widens (verify's --model
  // and --thorough), checks it on the target, records into the record, and fails through fail_case
  // with a message that locates the problem.
  void (*body)(const Target& target, const CaseDraw& draw, CaseRecord& record);
  // Properties whose cases launch processes are slower: they run cases / case_divisor cases.
  int case_divisor = 1;
  // Why the property cannot run against this target or on this machine; nullptr or "" when it can.
  std::string (*unavailable)(const Target& target) = nullptr;
  // The share of probed cases in which the dropped example must be caught; 0 for properties that
  // do not probe. A run below it fails: a check that can no longer tell a batch from the batch
  // without one of its examples has lost its power, however green it looks.
  double min_power = 0;
  // For tightness: over a run, the largest rounding-only ratio on each path must reach this, or the
  // bound has grown looser than rounding needs (0: not judged).
  double min_tightness = 0;
  // Whether its cases call the target's plugins (a communicator's collectives, a kernel plugin's ops).
  // conform leaves out one that does not: it would check dpcheck, not the plugin.
  bool calls_plugins = true;
  // Whether its cases train drawn scenarios, so that each case draws the target's formats
  // (CaseDraw::precisions, allreduce_dtypes) where the user fixed none.
  bool draws_formats = false;
  // Whether its promise can be checked on simulated ranks (--comm simulated, src/comm/simulated_comm.hpp),
  // which play every rank's part on one replica: what it checks holds of the world's sums, shares and
  // one replica's updates, not of N replicas staying alike or of N processes' files.
  bool simulates = false;
  // What tightness measures on each of its two paths, for reports and JSON keys ("whole batch",
  // "sharded"); "" for a path the property does not measure.
  std::string_view tightness_paths[2] = {"whole batch", "sharded"};
};

// The failure probability per dot product of the probabilistic bound that the properties report beside
// the worst-case one (reference/bound.hpp).
inline constexpr double kProbabilisticFailure = 1e-9;

// How often the training properties that hold on simulated ranks draw a case of the scale class
// (ScenarioSpace::scale_worlds): one case in 16 where the target's ranks are threads of the local
// backend (or already simulated) and no world is fixed; one in 2 against a mutant that only scale shows
// (MutantInfo::scale); 0 (never) elsewhere: a process backend, a plugin or a device cannot be simulated.
int scale_one_in(const Target& target);

// Fails the current case with a message of our own (RC_FAIL would prefix it with its own location).
[[noreturn]] void fail_case(const std::string& message);

std::span<const PropertyDef> properties();
const PropertyDef& find_property(std::string_view name);  // UsageError listing the names

// The checks behind the properties, for one scenario; exposed for tests and for `dpcheck grad`.
struct GradientOutcome {
  bool passed = true;
  double sharded_ratio = 0;        // all-reduced gradient: max error / bound
  double whole_ratio = 0;          // whole-batch float32 gradient: max error / bound
  double probabilistic_ratio = 0;  // the larger of the two over the probabilistic bound
  double share_ratio = 0;          // rank 0's share alone against the whole-batch reference (non-vacuity)
  double probe_ratio = -1;         // the whole batch without its last example (power); -1: not probed
  std::int64_t uncertain_units = 0;
  std::size_t parameters = 0;
  bool overflowed = false;  // the loss scaler found the step's gradient non-finite: every rank passed it over
  std::string message;      // why it failed
  std::string note;         // where the ratio was largest, and the bound's terms there
};
GradientOutcome check_sharded_gradient(const Scenario& scenario, const Target& target);

// The same check on any data and parameters (what `dpcheck grad` runs): step `at_step` of a run of
// `train` on `world_size` ranks over `data`, from `params` (nullptr: init_params(train.model, train.seed)).
struct GradientRun {
  TrainConfig train;
  int world_size = 1;
  std::int64_t at_step = 0;
  const Dataset* data = nullptr;
  const std::vector<float>* params = nullptr;
};
// What the check computed, for a report of it: the gradients beside the float64 reference and the bound.
struct GradientDetail {
  std::vector<float> averaged, whole;      // the all-reduced gradient; the engine's whole-batch gradient
  std::vector<std::vector<float>> shares;  // each rank's share alone, through the same engine
  std::vector<std::int64_t> share_sizes;
  reference::GradientBound bound;  // the whole batch's reference and bound
  // The all-reduced path's: with mixed precision its deltas round at N times the scale, and a bf16
  // all-reduce adds its roundings (the same as `bound` otherwise).
  reference::GradientBound bound_sharded;
  std::int64_t m_sharded = 0, m_whole = 0;  // roundings per term of each path (the bound's gamma_m)
  reference::Comparison sharded, whole_cmp;
};
GradientOutcome check_sharded_gradient(const GradientRun& run, const Target& target, GradientDetail* detail = nullptr);

struct ReplicaOutcome {
  bool passed = true;
  bool parameters_moved = false;
  std::int64_t skipped_steps = 0;  // steps the loss scaler skipped (rank 0's count)
  std::string message;
};
// With `poisoned`, the examples at those indices have inputs (and mse targets) of 1e36: a rank whose
// share holds one finds its scaled gradient non-finite, as a corrupt or outlying example makes it.
ReplicaOutcome check_replica_sync(const Scenario& scenario, const Target& target,
                                  const std::vector<std::int64_t>& poisoned = {});

struct ResumeOutcome {
  bool passed = true;
  std::string message;
};
// Trains T steps straight; separately trains scenario.at_step < T steps, checkpoints through the
// RankZeroWriter, tears every rank's state down, resumes from the files and continues to T: the final
// parameters, optimizer state and step counts must be bitwise equal.
ResumeOutcome check_checkpoint_resume(const Scenario& scenario, const Target& target);

struct BucketingOutcome {
  bool passed = true;
  bool overlapped = false;     // the buckets started during the backward pass (a communication thread)
  std::size_t buckets = 0;     // buckets per step
  bool splits_tensor = false;  // some bucket boundary falls inside a weight or a bias
  std::string message;
};
// Trains the scenario twice: with one all-reduce after the backward pass, and with the gradient in
// buckets of `bucket_elements` float32 elements started as the backward pass produces them: every
// step's loss, and the parameters, optimizer state and scaler after every step, must be the same bits.
BucketingOutcome check_bucketing(const Scenario& scenario, const Target& target, std::size_t bucket_elements);
// Why the target's communicator cannot promise it: its reduction of an element may depend on the
// element's place in the call; "" when it reduces in rank order.
std::string bucketing_unavailable(const Target& target);

struct WriteAuditOutcome {
  bool passed = true;
  // A run failed before its writes could be judged (the launch, the training itself): the failure is
  // not a write, and the message says what it was.
  bool not_judged = false;
  std::int64_t rank0_files = 0;  // distinct files rank 0 wrote (non-vacuity: it did write)
  std::string message;
};

// dpcheck's own account of why a run under a launcher failed, from what it printed: its error lines, or
// else its last lines that are not the launcher's boilerplate ("Primary job terminated normally, ...").
std::string run_failure_reason(const std::string& output);
// Runs the scenario as separate processes (mpirun, --comm mpi) with checkpoints every step and a log,
// under the write audit: rank 0 must have written the log (and, when training finished, the final
// checkpoint), and no other rank may have written outside the allowed paths. With resume_at > 0 the
// run stops there and a second audited run resumes it to the end (first corrupting the newest
// checkpoint when corrupt_newest, so the resumed run must skip it). Every run must succeed.
WriteAuditOutcome check_rank0_writes(const Scenario& scenario, const Target& target, int resume_at = 0,
                                     bool corrupt_newest = false);

// mpirun or mpiexec from PATH, or "" when there is none.
std::string find_mpi_launcher();
// The environment a property's own launch adds for the launcher: Open MPI refuses root and more ranks
// than cores without the first three (other launchers ignore them); and when a rank exits non-zero,
// mpirun ends the others at once instead of waiting a second before SIGTERM and another before SIGKILL.
// A failing case's launch took two seconds more, and shrinking one launches dozens.
std::vector<std::string> launcher_env();
// The dpcheck executable that processes of a property run: $DPCHECK_BINARY, this process if it is the
// dpcheck command (whatever its file is called: the command says so with this_process_is_dpcheck, as
// an installed or copied binary may be renamed), else the dpcheck beside the audit library of this build
// (for test programs).
std::string dpcheck_executable();
void this_process_is_dpcheck();

struct SamplerOutcome {
  bool passed = true;
  std::string message;
};
SamplerOutcome check_sampler(const SamplerScenario& scenario, const Target& target);

struct StepOutcome {
  bool passed = true;
  double ratio = 0;  // largest error / bound
  std::string message, note;
};
// Every step of the scenario: the update and the new optimizer state against PyTorch's formula in
// float64 from the same float32 inputs (parameters, all-reduced gradient, state before the step).
StepOutcome check_optimizer_update(const Scenario& scenario, const Target& target);
// The loss reported for step scenario.at_step against the float64 mean over that step's global batch.
StepOutcome check_reported_loss(const Scenario& scenario, const Target& target);

}  // namespace dpcheck
