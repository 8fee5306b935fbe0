// Mutants as the core sees them: hooks through which the mutant table (mutants/mutants.hpp)
// swaps a deliberately broken part into what a Target builds. The core names no mutant. It hands the
// name to the table's hooks, and each returns nullptr (or its input unchanged) when that mutant does
// not break that part, so that the correct part is used.
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

struct MutantTable {
  // The row of `name`; UsageError "unknown mutant 'x' (known: ...)" when no row has it.
  MutantTraits (*require)(std::string_view name) = nullptr;
  // Sets the broken engine part the mutant asks for (a kernel, a way of accumulating).
  void (*engine_spec)(std::string_view mutant, EngineSpec& spec) = nullptr;
  std::unique_ptr<Communicator> (*communicator)(std::string_view mutant, Communicator& inner) = nullptr;
  OptimizerConfig (*optimizer_config)(std::string_view mutant, OptimizerConfig config, int rank,
                                      int world_size) = nullptr;
  // The optimizer itself, wrapped when the mutant breaks its formula (a host engine's optimizer).
  std::unique_ptr<Optimizer> (*optimizer)(std::string_view mutant, std::unique_ptr<Optimizer> optimizer) = nullptr;
  std::unique_ptr<DistributedSampler> (*sampler)(std::string_view mutant, const SamplerConfig& config) = nullptr;
  std::unique_ptr<Trainer> (*trainer)(std::string_view mutant, const TrainConfig& config, Communicator& comm,
                                      Engine& engine, Optimizer& optimizer, const DistributedSampler& sampler,
                                      const Dataset& data) = nullptr;
  std::unique_ptr<RankZeroWriter> (*writer)(std::string_view mutant, Communicator& comm,
                                            const std::filesystem::path& checkpoint_dir,
                                            const std::filesystem::path& log_path, int keep) = nullptr;
  // Whether the trace digests only a prefix of each buffer (TraceRecorder::set_digest_prefix).
  bool (*trace_digest_prefix)(std::string_view mutant) = nullptr;
};

// Sets the program's mutant table: once; the same table again changes nothing, another is an Error.
void register_mutant_table(const MutantTable& table);
// The program's table. Error when none was registered: a program that runs targets with mutants calls
// register_mutants() (mutants/mutants.hpp) first, so that a missed registration fails loudly
// instead of quietly running the correct parts.
const MutantTable& mutant_table();

}  // namespace dpcheck
