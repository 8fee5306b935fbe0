// The backends dpcheck runs on, as one table: a row per communicator backend (local, mpi, cuda-local,
// nccl) and a row per engine (cpu, cuda). Everything that depends on which backend was asked for reads
// it from here: validation of --engine and --comm, the default communicator of an engine, whether the
// ranks are threads of this process or the processes of a launcher, how a world is run, the
// communicator's algorithm thresholds, the launcher prefix of a replay line, and the help texts of
// --engine and --comm. In the manner of nccl-tests' one struct per collective: the harness is written
// once, and a backend is one more row (register_backend), which is how a user's plugin joins.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/comm.hpp"
#include "src/dtype.hpp"
#include "src/engine_spec.hpp"
#include "src/plugin/kernel_plugin.hpp"
#include "src/train/engine.hpp"
#include "src/train/optimizer.hpp"

namespace dpcheck {

// What a rank runs, given its communicator.
using RankFunction = std::function<void(Communicator&)>;

// ---- engines --------------------------------------------------------------------------------------

struct EngineRow {
  std::string_view name;  // --engine
  MemorySpace memory;     // where its parameters, gradients and replicas live
  std::string_view help;  // a few words for --help
  // Throws UsageError naming why this machine cannot run the engine (no GPU, no plugin); null when it
  // always can.
  void (*require)();
  // What the engine can do, which validation and verify's drawing read instead of its name.
  bool tf32 = false;                        // --tf32: TF32 tensor cores for the matrix products
  bool low_precision = false;               // --precision bf16 and fp16
  bool low_precision_with_kernels = false;  // the same with --kernels
  bool bf16_allreduce = false;              // --allreduce-dtype bf16: the gradient all-reduced in bfloat16
  // verify draws the precision and the all-reduce's dtype per case where no option fixes them.
  bool draws_formats = false;
  // Its low-precision products may accumulate with truncation rather than rounding to nearest (tensor
  // cores), which the bound allows for.
  bool products_may_truncate = false;
  // Its engine, and an optimizer whose work goes on that engine's stream (nullptr on a host engine); for
  // `rank` (-1: none, in messages), with the spec's kernels on a handle of their own.
  std::unique_ptr<Engine> (*make_engine)(const ModelConfig& model, const EngineSpec& spec, int rank) = nullptr;
  std::unique_ptr<Optimizer> (*make_optimizer)(const OptimizerConfig& config, std::size_t size, void* stream,
                                               const EngineSpec& spec, int rank) = nullptr;
};

// The engines, the default first.
std::span<const EngineRow> engines();
std::string_view default_engine();
const EngineRow& default_engine_row();
// UsageError "unknown engine 'x' (choose cpu or cuda)".
const EngineRow& find_engine(std::string_view name);
// The first engine whose buffers live in `memory` (a plugin of host or device memory joins it).
const EngineRow& engine_for_memory(MemorySpace memory);
// "the cpu and cuda engines": the engines whose row has `has` set, for messages.
std::string engines_with(bool EngineRow::*has);
// UsageError when a kernel plugin's memory is not the engine's (a host plugin on the cuda engine, or a
// device plugin on an engine without device memory), naming the engine to run it with.
void require_kernels_for_engine(const KernelPlugin& plugin, const EngineRow& engine);

// ---- communicator backends ------------------------------------------------------------------------

enum class MpiUse { none, transport, collectives };

// The run functions are std::function rather than bare pointers so that a row added at run time can
// carry what it needs (a plugin's handle and its table of entry points).
struct Backend {
  std::string name;                        // --comm, and Communicator::backend() of its communicators
  std::string engine;                      // the engine whose buffers it carries
  bool engine_default = false;             // the engine's communicator when --comm is not given
  MemorySpace memory = MemorySpace::host;  // where the buffers it reduces live: its engine's
  std::string help;                        // one line for --help: how its ranks run
  // Whether each element's reduction depends on the inputs alone, summed in rank order, and not on the
  // element's place in the call (as a ring's chunks make it): then all-reducing the gradient in
  // buckets changes no bit (src/train/bucketing.hpp). Such a backend sums 16-bit floats in float32 and
  // rounds once (src/comm/collective.hpp), the rank-order schedule whose depth the gradient bound takes
  // (reference/allreduce_schedule.hpp); a backend that rounds at every addition is not rank_order.
  bool rank_order = false;
  // Simulated ranks (src/comm/simulated_comm.hpp): one thread plays each rank in turn on one replica,
  // so a world costs one replica's memory at any size. What needs real ranks (replica synchronisation,
  // the write audit, per-rank traces) cannot be checked on it.
  bool simulated = false;
  // What it takes from the MPI library: nothing, its transport (dpcheck's collectives over it), or its
  // own collectives, whose algorithm Open MPI's MCA parameters may force. Reports name the library.
  MpiUse mpi = MpiUse::none;
  // Whether `dpcheck bench allreduce` puts it in its table (src/bench/allreduce_run.hpp), the name of
  // its rows there and what the command's --help says of it (the backend's own name and help when
  // empty), and other names the command's --backends takes for it (any name is taken in either case).
  struct BenchAllreduce {
    bool runs = false;
    std::string name;
    std::string help;
    std::vector<std::string> aliases;
  };
  BenchAllreduce bench;

  // Ranks as threads of this process: runs fn on n threads, each with its rank's communicator of a world
  // of n, joins them, and rethrows the exception that ended the world. Empty when the ranks can only be
  // processes.
  std::function<void(int n, const RankFunction& fn, std::chrono::milliseconds timeout)> run_threads;
  // Ranks as a launcher's processes: runs fn on this process's rank alone, with the backend's
  // communicator over `world`, the launcher's world (timeout already set). Empty when the backend never
  // runs under a launcher.
  std::function<void(Communicator& world, const RankFunction& fn)> run_processes;
  // The command, before the number of processes, that starts the ranks of run_processes: a replay line
  // begins with it.
  std::string launcher;
  // The element counts (float32) at which the communicator changes algorithm in a world of n ranks
  // (Communicator::algorithm_thresholds), `world` being the launcher's world or nullptr. Empty when the
  // backend has one path, or does not say.
  std::function<std::vector<std::size_t>(int n, Communicator* world)> thresholds;

  bool ranks_as_threads() const { return static_cast<bool>(run_threads); }
  // nccl does both: threads without a launcher, one process per GPU under one.
  bool may_run_under_launcher() const { return static_cast<bool>(run_processes); }
  bool needs_launcher() const { return !run_threads; }
  // "mpirun -np 4 " for a backend that runs under a launcher, "" for one that never does.
  std::string launch_prefix(int processes) const;
};

// The rows, built-in ones first (local, mpi, cuda-local, nccl), then those registered, in that order.
const std::deque<Backend>& backends();

// The row named `name`, or nullptr. A name that no row has goes to the finders (add_backend_finder):
// a path to a shared object (holding a '/' or ending in ".so") is a communicator plugin
// (include/dpcheck/plugin.h), loaded and registered as a row on first use (src/target/plugin_comm.cpp),
// UsageError if it cannot be.
const Backend* find_backend(std::string_view name);

// Where rows come from besides the table: a finder takes a --comm value that names no row and returns
// the row it has registered for it (register_backend), or nullptr when the value is not of its kind.
// The plugin layer adds its finder at start-up, so that the table never calls back into it.
using BackendFinder = const Backend* (*)(std::string_view name);
void add_backend_finder(BackendFinder finder);
// The row named `name` among those already in the table, or nullptr; loads nothing.
const Backend* find_registered_backend(std::string_view name);

// The row of --comm `comm` for --engine `engine`. UsageError for an unknown engine, an unknown
// communicator, or one that carries another engine's buffers ("engine cpu runs with --comm local or
// mpi, not 'nccl' (nccl is for --engine cuda)").
const Backend& backend_for(std::string_view engine, std::string_view comm);
// The same refusal for two rows: UsageError when `b` carries another engine's buffers than `e`'s.
void require_same_engine(const EngineRow& e, const Backend& b);

// The engine's communicator when --comm is not given ("local" for cpu, "cuda-local" for cuda): every
// engine has one among the built-in rows (Error otherwise), and a registered row cannot take its place.
const Backend& default_backend(const EngineRow& engine);
// The engine's first communicator whose ranks may be a launcher's processes ("mpi" for cpu, "nccl"
// for cuda); nullptr when it has none.
const Backend* process_backend(const EngineRow& engine);
// The engine's simulated communicator (Backend::simulated: "simulated" for cpu); nullptr when it has none.
const Backend* simulated_backend(const EngineRow& engine);

// How backend b's ranks run in this process: the launcher's world (launcher_world, nullptr when no
// launcher started this process) when they are its processes, nullptr when they are threads here.
// UsageError when b needs a launcher and none started this process, or when a launcher started several
// processes and b runs its ranks as threads (every process would run a whole world of its own).
Communicator* world_of_processes(const Backend& b, Communicator* launcher_world);

// Appends a row: how a plugin's communicator joins, with its validation, dispatch, help and replay
// lines. UsageError when the name is taken, the engine unknown, it has no way to run (neither
// run_threads nor run_processes), or it runs under a launcher without naming one. Not thread-safe:
// rows are registered at start-up, before any run; earlier rows stay where they are.
const Backend& register_backend(Backend row);

// The help texts of --engine and --comm, listing every row.
std::string engine_option_help();
std::string comm_option_help();

// bench allreduce's view of the table (src/bench/allreduce_run.hpp runs it).
// The table's rows that bench allreduce runs (Backend::bench.runs), in table order.
std::vector<const Backend*> allreduce_backends();
// The name of a row's rows in bench allreduce's table: Backend::bench.name, else the row's name.
std::string allreduce_name(const Backend& row);
// What bench allreduce's --help says of a row: Backend::bench.help, else the row's help.
std::string allreduce_help(const Backend& row);
// The names (allreduce_name) of the rows of allreduce_backends whose ranks are processes under mpirun.
std::vector<std::string> allreduce_process_names();

// --backends "local,mpi,MPI_Allreduce": rows of allreduce_backends, in table order, without repeats.
// An item names a row by its name, its rows' name or one of its aliases (Backend::bench), in either
// case. UsageError naming an unknown item and the choices.
std::vector<const Backend*> parse_allreduce_backends(std::string_view list);

}  // namespace dpcheck
