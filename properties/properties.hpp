// The properties: library functions that check the promises of data-parallel training against a
// Target. Each draws its inputs through RapidCheck, so the same code runs from GoogleTest
// (tests/properties_test.cpp) and from `dpcheck verify` (properties/runner.hpp), and shrinks on failure.
//
//   gradient_average_matches_whole_batch  the all-reduced shard gradient, and the whole-batch float32
//                                         gradient, each within the derived bound of the float64 one
//   replicas_bitwise_synchronized         every step, every optimizer: identical parameters and state
//   sampler_shards_disjoint               shares disjoint apart from the reported padding, covering the
//                                         data apart from at most N-1 dropped, sized as the policy says
//   accumulation_matches_whole_batch      as the first, with 2 to 4 micro-batches per rank
//   uneven_shares_match_whole_batch       as the first, with shares of different sizes
//   checkpoint_resume_bitwise             t steps, checkpoint, resume from the files, on to T: the same
//                                         bits as T steps straight
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "properties/scenario.hpp"
#include "properties/target.hpp"

namespace dpcheck {

// What the cases of one run of a property measured. The last failing case is, after shrinking, the
// minimal counterexample, so its size is what the kill matrix calls "shrunk to a small case".
struct CaseStats {
  std::int64_t cases = 0;
  double max_error_ratio = 0;  // largest error / bound over the cases (gradient properties)
  bool has_error_ratio = false;
  struct Size {
    std::int64_t examples = 0;  // batch, or data set size
    int world_size = 0;
    int layers = 0;
    int widest = 0;
  } last_failure;
};

struct PropertyDef {
  std::string_view name;
  std::string_view promise;
  // One case: draws a scenario with *gen, checks it on the target, records into stats, and fails
  // through RC_FAIL with a message that locates the problem.
  void (*body)(const Target& target, CaseStats& stats);
  // Properties whose cases launch processes are slower: they run cases / case_divisor cases.
  int case_divisor = 1;
  // Why the property cannot run against this target or on this machine; nullptr or "" when it can.
  std::string (*unavailable)(const Target& target) = nullptr;
};

std::span<const PropertyDef> properties();
const PropertyDef& find_property(std::string_view name);  // UsageError listing the names

// The checks behind the properties, for one scenario; exposed for tests and for `dpcheck grad`.
struct GradientOutcome {
  bool passed = true;
  double sharded_ratio = 0;   // all-reduced gradient: max error / bound
  double whole_ratio = 0;     // whole-batch float32 gradient: max error / bound
  double share_ratio = 0;     // rank 0's share alone against the whole-batch reference (non-vacuity)
  std::int64_t uncertain_units = 0;
  std::string message;
};
GradientOutcome check_sharded_gradient(const Scenario& scenario, const Target& target);

struct ReplicaOutcome {
  bool passed = true;
  bool parameters_moved = false;
  std::string message;
};
ReplicaOutcome check_replica_sync(const Scenario& scenario, const Target& target);

struct ResumeOutcome {
  bool passed = true;
  std::string message;
};
// Trains T steps straight; separately trains t < T steps, checkpoints through the RankZeroWriter,
// tears every rank's state down, resumes from the files and continues to T: the final parameters,
// optimizer state and step counts must be bitwise equal.
ResumeOutcome check_checkpoint_resume(const Scenario& scenario, int stop_at, const Target& target);

struct WriteAuditOutcome {
  bool passed = true;
  std::int64_t rank0_files = 0;  // distinct files rank 0 wrote (non-vacuity: it did write)
  std::string message;
};
// Runs the scenario as separate processes (mpirun, --comm mpi) with checkpoints every step and a log,
// under the write audit: rank 0 must have written the log (and, when training finished, the final
// checkpoint), and no other rank may have written outside the allowed paths.
WriteAuditOutcome check_rank0_writes(const Scenario& scenario, const Target& target);

// mpirun or mpiexec from PATH, or "" when there is none.
std::string find_mpi_launcher();
// The dpcheck executable that processes of a property run: $DPCHECK_BINARY, this process if it is
// dpcheck, else the dpcheck beside the audit library of this build.
std::string dpcheck_executable();

struct SamplerOutcome {
  bool passed = true;
  std::string message;
};
SamplerOutcome check_sampler(const SamplerScenario& scenario, const Target& target);

}  // namespace dpcheck
