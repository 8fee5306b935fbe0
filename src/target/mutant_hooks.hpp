// Mutants as the core sees them: the parts through which the mutant table (mutants/mutants.hpp)
// swaps a deliberately broken part into what a Target builds. The core names no mutant. It asks the
// table for the named mutant's parts, and uses the correct part wherever that mutant leaves a hook
// empty.
#pragma once

#include <filesystem>
#include <memory>
#include <string_view>

#include "src/comm.hpp"
#include "src/engine_spec.hpp"
#include "src/train/optimizer.hpp"
#include "src/train/sampler.hpp"
#include "src/train/trainer.hpp"
#include "src/train/writer.hpp"

namespace dpcheck {

// What a mutant's row says of where it applies.
struct MutantTraits {
  std::string_view engine;     // the only engine whose part it breaks ("cuda"); empty: any
  std::string_view precision;  // the precision whose path it breaks ("bf16"); empty: any
};

// The parts a mutant breaks, each a hook that builds or edits the broken part; a hook left empty keeps
// the correct part. One mutant's row holds them all (mutants/).
struct MutantParts {
  // Sets the broken engine part (a kernel, a way of accumulating).
  void (*engine_spec)(EngineSpec& spec) = nullptr;
  // A communicator that wraps the correct one.
  std::unique_ptr<Communicator> (*communicator)(Communicator& inner) = nullptr;
  // Edits the optimizer's configuration on one rank of a world.
  void (*optimizer_config)(OptimizerConfig& config, int rank, int world_size) = nullptr;
  // The optimizer itself, wrapped when the mutant breaks its formula (a host engine's optimizer); an
  // optimizer it does not break comes back unchanged.
  std::unique_ptr<Optimizer> (*optimizer)(std::unique_ptr<Optimizer> optimizer) = nullptr;
  std::unique_ptr<DistributedSampler> (*sampler)(const SamplerConfig& config) = nullptr;
  // The trainer's seams it replaces.
  TrainerHooks trainer = {};
  std::unique_ptr<RankZeroWriter> (*writer)(Communicator& comm, const std::filesystem::path& checkpoint_dir,
                                            const std::filesystem::path& log_path, int keep) = nullptr;
  // The trace digests only a prefix of each buffer (TraceRecorder::set_digest_prefix).
  bool trace_digest_prefix = false;
};

struct MutantTable {
  // The row of `name`; UsageError "unknown mutant 'x' (known: ...)" when no row has it.
  MutantTraits (*require)(std::string_view name) = nullptr;
  // The parts that `name` breaks (require first).
  const MutantParts& (*parts)(std::string_view name) = nullptr;
};

// Sets the program's mutant table: once; the same table again changes nothing, another is an Error.
void register_mutant_table(const MutantTable& table);
// The program's table. Error when none was registered: a program that runs targets with mutants calls
// register_mutants() (mutants/mutants.hpp) first, so that a missed registration fails loudly
// instead of quietly running the correct parts.
const MutantTable& mutant_table();

}  // namespace dpcheck
