// A target is what the properties run against: which engine, which communicator backend, and which
// mutant (a deliberately broken part) if any. The same property code runs from GoogleTest and from
// `dpcheck verify` against whatever backend a user brings.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/comm.hpp"
#include "src/target/backends.hpp"
#include "src/train/engine.hpp"
#include "src/train/fault.hpp"
#include "src/train/optimizer.hpp"
#include "src/train/sampler.hpp"
#include "src/train/trainer.hpp"
#include "src/train/writer.hpp"

#include <nlohmann/json_fwd.hpp>

namespace dpcheck {

struct Target {
  // --engine and --comm, as the rows of the backend table (src/target/backends.hpp) that they name, and
  // that go together: resolve_target looks the names up once, where a command reads its options or a
  // file's record, and everything past it reads the rows.
  const EngineRow* engine = &default_engine_row();
  const Backend* backend = &default_backend(*engine);
  std::string mutant;                     // empty: the correct implementation
  std::string kernels;                    // --kernels: a kernel plugin's path; empty: the engine's own kernels
  int world_size = 0;                     // > 0: every case uses it; 0: each case draws one (thread backends)
  bool tf32 = false;                      // cuda engine: TF32 matrix products
  Precision precision = Precision::fp32;  // --precision: the matrix products' input format
  DType allreduce_dtype = DType::f32;     // --allreduce-dtype: the gradient all-reduce's (verify's scenarios)
  std::chrono::milliseconds timeout = Communicator::default_timeout;
  // A fault planted by a property that holds the divergence tools to locating it (properties/tools.cpp):
  // run_world's communicator takes an all-reduce fault, make_rank_trainer's trainer any other. An
  // all-reduce fault counts the calls of each run_world from 0.
  std::optional<Fault> fault;
  // Process backends: this process's communicator over all ranks; each case runs on every process.
  Communicator* process_world = nullptr;

  // "engine cpu, comm local, mutant none" ("engine cpu (bf16), ..."); with the formats that verify draws
  // per case in place of the fixed ones, "engine cpu (fp32, bf16 drawn per case), comm local, all-reduce
  // in fp32 or bf16 drawn per case, ...".
  std::string describe(const std::vector<Precision>& drawn_precisions = {},
                       const std::vector<DType>& drawn_allreduce_dtypes = {}) const;
};

// A target by name, as a command's options give it or a file records it: what a repro bundle or a
// trace says it ran, which replay and drift may run on another target, or on this one once
// resolve_target has found its rows again (a bundle's plugin may be gone from this machine, and replay
// --comm take its place).
struct TargetRecord {
  std::string engine{default_engine()};
  std::string comm{};  // "" where no --comm was given: the engine's default
  std::string kernels{}, mutant{};
  bool tf32 = false;
  Precision precision = Precision::fp32;
  std::chrono::milliseconds timeout = Communicator::default_timeout;
  bool operator==(const TargetRecord&) const = default;
};
TargetRecord target_record(const Target& target);
// The rows that `record` names, with its other fields: the one lookup by name of a target's engine and
// communicator outside the backend table. UsageError for an unknown engine or --comm, or two that do not
// go together (backend_for); a communicator plugin's path loads it.
Target resolve_target(const TargetRecord& record);
// `target` with the record's fields but its engine and communicator (kernels, mutant, tf32, precision,
// timeout): a target read back from a file whose rows are already known.
Target with_recorded_fields(Target target, const TargetRecord& record);

// A target as every file that records one writes it (train's trace and report, a repro bundle, verify's
// report): {"engine", "comm", "kernels", "mutant" ("" for none), "tf32", "precision"}. A bundle adds
// "timeout_ms", and verify's report "world_size" and "plugins", beside these.
nlohmann::json target_to_json(const TargetRecord& target);
inline nlohmann::json target_to_json(const Target& target) { return target_to_json(target_record(target)); }
// The same fields back into a record (the timeout keeps its default). A file written before
// --precision has none: fp32. UsageError naming the field, with `where` in front of its name
// ("\"target.tf32\" is missing", "\"target.engine\" is 3, not a string").
TargetRecord target_from_json(const nlohmann::json& j, const std::string& where = "target.");

// A plugin the target runs, as reports name it: the option and path it was given with, and what its
// table says of itself.
struct PluginIdentity {
  std::string option;        // "--comm" or "--kernels"
  std::string path;          // as given
  std::string name;          // the table's name
  std::string version;       // the table's version (plugin ABI 3 and later); "" when none
  unsigned abi = 0;          // the table's plugin ABI
  std::string capabilities;  // a communicator's dtypes and ops ("dtypes float32, ...; all-reduce ops sum, ...")
  std::vector<std::string> dtypes, ops;  // the same, as lists
  // "plugin 'gloo ring' Gloo 0.5.0, ABI 3 (./libgloo.so)"
  std::string text() const;
  // {"option", "path", "name", "version" (null: none), "abi"}, and a communicator's "dtypes" and "ops":
  // the reports' plugins, and a bundle's record of them.
  nlohmann::json to_json() const;
};

// The target's plugins: its communicator's (when --comm is a path) and its kernels' (when --kernels is
// given), loading them if need be.
std::vector<PluginIdentity> target_plugins(const Target& target);

// Checks that the engine's and backend's rows go together (require_same_engine), that the mutant is
// known and suits them, that a backend that needs a launcher has one, that a GPU engine has a device,
// that a kernel plugin loads and suits the engine, and that a communicator plugin declares the gradient
// all-reduce (avg of target.allreduce_dtype) that training needs; UsageError otherwise ("no CUDA device:
// <the runtime's reason>"). conform, which reports what a plugin lacks row by row, leaves the last check
// out.
enum class GradientAllreduce { required, not_required };
void validate_target(const Target& target, GradientAllreduce gradient = GradientAllreduce::required);

// Whether verify draws the precision, or the all-reduce's dtype, per case where no option fixes it: on
// the cpu engine (no --tf32), the precision with its own kernels, the dtype where the communicator
// takes a bf16 all-reduce and the bound still checks one on the target's world (allreduce_bound_refusal);
// neither for a mutant of one precision's path, which runs in that precision.
bool precision_drawable(const Target& target);
bool allreduce_dtype_drawable(const Target& target);

// "" when the target's communicator takes the gradient all-reduce training does (avg of
// target.allreduce_dtype), else why not, naming the plugin, the dtype and the remedy.
std::string gradient_allreduce_unsupported(const Target& target);

// The element counts at which the target's communicator changes algorithm for a world of this size
// (its row's thresholds, float32), so that scenarios can be drawn on both sides.
std::vector<std::size_t> comm_thresholds(const Target& target, int world_size);

// What starts the target's ranks when they are a launcher's processes ("mpirun -np 4 "), else "".
std::string launch_prefix(const Target& target);

// The world every case runs on: the launcher's processes, or --world-size; 0 where each case draws one.
inline int fixed_world(const Target& target) {
  return target.process_world ? target.process_world->size() : target.world_size;
}

// `text` as one shell word, in single quotes.
std::string shell_quoted(const std::string& text);
// `text` as one shell word: as it is when no shell would change it (a name, a plain path), else quoted.
std::string shell_word(const std::string& text);

// Runs fn once for every rank of a world of world_size ranks, through the target's row: as threads of
// this process, or on this process's rank alone when the ranks are the launcher's processes (whose
// number must equal world_size). The communicator fn receives has the mutant's wrapper, if the mutant
// breaks communication.
void run_world(const Target& target, int world_size, const std::function<void(Communicator&)>& fn);

// With target.kernels, the engine (and the optimizer) run the plugin's ops, on a handle of their own
// initialised for `rank` (-1: none, in messages).
std::unique_ptr<Engine> make_engine(const Target& target, const ModelConfig& model, int rank = -1);
// The optimizer queues its work on the engine's stream (nullptr on the CPU).
std::unique_ptr<Optimizer> make_optimizer(const Target& target, const OptimizerConfig& config, std::size_t size,
                                          int rank, int world_size, void* stream = nullptr);
std::unique_ptr<DistributedSampler> make_sampler(const Target& target, const SamplerConfig& config);

// The parts of one rank's trainer, owned together.
struct RankTrainer {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<DistributedSampler> sampler;
  std::unique_ptr<Trainer> trainer;
};

// The writer for this rank (rank 0 writes, unless the mutant breaks that).
std::unique_ptr<RankZeroWriter> make_writer(const Target& target, Communicator& comm,
                                            const std::filesystem::path& checkpoint_dir,
                                            const std::filesystem::path& log_path, int keep = 2);

// Why an all-reduce in `dtype` on `world` ranks leaves the gradient bound nothing to check, or "" when
// it does not: bf16 past 64 ranks through a backend that names no reduction schedule, whose N + 1
// roundings would reach a quarter of every gradient (dpcheck's host backends round once).
std::string allreduce_bound_refusal(const Target& target, DType dtype, int world);
// UsageError with allreduce_bound_refusal's reason, where it gives one.
void require_allreduce_bound(const Target& target, const TrainConfig& config, int world);

// A trainer for this rank: parameters from init_params(config.model, config.seed), data from `data`.
RankTrainer make_rank_trainer(const Target& target, const TrainConfig& config, Communicator& comm, const Dataset& data);

// Whether the target's trace digests only a prefix of each buffer (the mutant trace-digest-prefix):
// for TraceRecorder::set_digest_prefix.
bool trace_digest_prefix(const Target& target);

}  // namespace dpcheck
