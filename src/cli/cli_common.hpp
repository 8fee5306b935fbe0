// Options shared by the dpcheck subcommands, and their conversion to dpcheck's types. Every value is
// checked here, before any work starts, so bad input ends with one line and exit status 2: output
// paths (src/io/files.hpp), timeouts, seeds, and whether a run fits in this machine's memory and threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "src/target/target.hpp"
#include "src/train/data.hpp"
#include "src/train/model.hpp"
#include "src/train/replica_check.hpp"  // float_text
#include "src/train/sampler.hpp"

#include <nlohmann/json_fwd.hpp>

namespace CLI {
class App;
}

namespace dpcheck::cli {

// The target's plugins for a JSON report: [{"option": "--comm", "path", "name", "version" (null when
// none), "abi", "dtypes", "ops"}, ...] (a kernel plugin's without dtypes and ops); [] when it runs none.
nlohmann::json plugins_json(const Target& target);
// The same as text for a report's header: "" or "; plugin 'gloo ring' Gloo 0.5.0, ABI 3 (./libgloo.so)".
std::string plugins_text(const Target& target);
// The same for a JUnit testsuite: <properties> with a property per plugin ("" when it runs none).
std::string plugins_junit(const Target& target);

struct ModelOptions {
  std::string dims;
  std::string activation = "relu";
  std::string loss = "mse";

  void add_to(CLI::App& sub, bool required = true);
  ModelConfig config() const;  // UsageError on bad values
};

// Loads parameters from a directory of <name>.npy files (layers.0.weight.npy, ...), each with the
// shape of its slice and finite values; UsageError naming the file on any mismatch, and naming the
// files that are not parameters of this model.
std::vector<float> load_params_dir(const std::string& dir, const ModelConfig& model);

// Fills target.process_world from --engine, --comm and the launcher, through the backend's row
// (src/target/backends.hpp): UsageError for unknown names or a pair that does not go together; a backend whose
// ranks may be a launcher's processes (mpi, nccl) takes this process's MPI world when a launcher started
// it (UsageError when --world-size disagrees with it), one that needs a launcher is refused without
// one, and one whose ranks are threads is refused under a launcher of several processes (every process
// would run a whole world of its own). Returns the world size to use.
int resolve_world(Target& target, int requested_world_size, bool world_size_given);

// An error ratio in three digits, or `infinite` for an infinite one (a NaN met, bits that differ).
std::string ratio_text(double ratio, const char* infinite);

// "1 rank", "3 ranks": a count with its noun, plural past one.
std::string counted(long long n, const char* noun);

// The checks every option of every subcommand gets, after parsing and before the command runs, so
// that no command can forget one: an empty value ('') is refused (it would otherwise stand for the
// default, or for no file at all); a whole number is decimal and within its type (CLI11 reads "0x10"
// as hex and "010" as octal, and saturates 2^63 to 2^63 - 1); an output file (--report, --junit,
// --json, --html, --log, --trace) is neither the same file as an input, nor the same as another
// output. UsageError naming the option.
void check_parsed_options(const CLI::App& app);

// Writes "dpcheck: error: <message>" and a newline to standard error (after flushing standard output)
// in one write(2), with control characters escaped so that the message stays one line, so that the lines of several
// ranks sharing a terminal never interleave mid-line.
void print_error(std::string_view message);

// Text for an XML attribute or element (JUnit reports): & < > " and newlines escaped.
std::string xml_escape(const std::string& s);

// A progress line on standard error for a person at a terminal: each update() rewrites the one line
// ("\r", the text, then clear to the end of the line), done() clears it. A command clears it with
// done() before it prints a line of its own, and a later update() starts it again. Disabled, every
// call does nothing, so a command constructs one whatever the output is:
//   Progress progress(Progress::wanted(o.quiet) && is_printing_rank());
//   progress.update("  train: step 12 of 100, 3.4 s");
//   ...
//   progress.done();
// update() writes at most every 50 ms (a case or a step can take microseconds) and cuts the text to
// the terminal's width, so that "\r" always returns to its start.
class Progress {
 public:
  explicit Progress(bool enabled);
  ~Progress();  // done()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Whether a progress line is wanted: not --quiet, and standard error is a terminal.
  static bool wanted(bool quiet);

  bool enabled() const { return enabled_; }
  void update(const std::string& line);
  void done();
  // Seconds since construction, for the line's elapsed time.
  double seconds() const;

 private:
  bool enabled_;
  bool shown_ = false;
  std::chrono::steady_clock::time_point start_, last_;
};

// ---- timeouts and seeds -------------------------------------------------------------------------

// The longest --timeout accepted: a day. Longer is no timeout at all, which a stuck rank turns into a hang.
inline constexpr double max_timeout_s = 86400;

// Seconds as given on the command line to a collective timeout: UsageError naming `option` unless
// finite, at least a millisecond and at most max_timeout_s (inf, nan and 1e300 would break every
// collective's deadline arithmetic).
std::chrono::milliseconds parse_timeout(double seconds, std::string_view option = "--timeout");

// --timeout SECONDS, with its help text: add_to at registration, value() when the command runs.
struct TimeoutOption {
  double seconds = 60;
  void add_to(CLI::App& sub);
  std::chrono::milliseconds value() const { return parse_timeout(seconds); }
};

// --precision fp32|bf16|fp16 (verify, train, grad): the format the matrix products' inputs are rounded to.
struct PrecisionOption {
  std::string name = "fp32";
  void add_to(CLI::App& sub);
  Precision value() const { return parse_precision(name); }
};

// --allreduce-dtype fp32|bf16 (verify, train, grad): the gradient all-reduce's dtype.
struct AllreduceDtypeOption {
  std::string name = "fp32";
  void add_to(CLI::App& sub);
  DType value() const { return parse_allreduce_dtype(name); }
};

// --loss-scale none|dynamic, --loss-scale-init S, --loss-scale-interval N (train, grad): the loss
// scaler (src/train/loss_scaler.hpp); by default dynamic with fp16, none otherwise.
struct LossScaleOptions {
  std::string kind;  // empty: the precision's default
  double init = 65536;
  std::int64_t interval = 2000;
  void add_to(CLI::App& sub);
  LossScalerConfig config(Precision precision) const;  // UsageError on bad values
};

// --kernels PATH (verify, train, grad): a kernel plugin (include/dpcheck/plugin.h) whose ops replace the
// engine's own; validate_target loads and checks it.
void add_kernels_option(CLI::App& sub, std::string& path);

// ---- the target ------------------------------------------------------------------------------------

// The options that say what a command runs against, each registered here alone with its help text:
// --engine, --comm, --kernels, --mutant, --world-size, --tf32, --precision, --allreduce-dtype and
// --timeout. A command registers those it takes, may reword one's help for its own sense, and builds
// its Target from them once the command line is parsed:
//   TargetOptions target;
//   target.add_to(*sub, target_option::training);
//   target.reword("--world-size", "Fix the number of ranks (default: each case draws 1-8)");
//   ...
//   Target t = target.resolved();  // the engine's communicator unless --comm; the world resolved
namespace target_option {
enum : unsigned {
  engine = 1u << 0,
  comm = 1u << 1,
  kernels = 1u << 2,
  mutant = 1u << 3,
  world_size = 1u << 4,
  tf32 = 1u << 5,
  precision = 1u << 6,
  allreduce_dtype = 1u << 7,
  timeout = 1u << 8,
  // What a training run takes (train, verify, grad).
  training = (1u << 9) - 1,
};
}  // namespace target_option

class TargetOptions {
 public:
  // The world size when --world-size is not given (0: verify's cases draw it).
  explicit TargetOptions(int default_world_size = 1) : world_size(default_world_size) {}

  void add_to(CLI::App& sub, unsigned fields);
  // Replaces a registered option's help text.
  void reword(const std::string& option, const std::string& help);
  // Whether the option was on the command line (after parsing).
  bool given(const std::string& option) const;

  // The Target the options give, its rows found (resolve_target): the engine's default communicator
  // unless --comm was given, and the --world-size asked for (unresolved). UsageError on an unknown
  // --engine or --comm, or a bad --precision, --allreduce-dtype or --timeout.
  Target target() const;
  // target() with its world resolved against the launcher (resolve_world) and recorded in world_size.
  Target resolved() const;

  // The options that give `target` again, each one not at its default, with a space in front of each:
  // " --engine cuda --comm nccl --mutant ring-skip-chunk --tf32 --precision bf16" (for a replay line).
  static std::string flags(const Target& target);

  std::string engine{default_engine()};
  std::string comm;  // empty: the engine's default
  std::string kernels;
  std::string mutant;
  int world_size;
  bool tf32 = false;
  PrecisionOption precision;
  AllreduceDtypeOption allreduce_dtype;
  TimeoutOption timeout;

 private:
  CLI::App* sub_ = nullptr;
};

// A whole number from 0 to 2^64 - 1 in decimal; UsageError naming `option` otherwise (no sign, no wrap
// of -1 to 2^64 - 1, no saturation of larger numbers).
std::uint64_t parse_seed(std::string_view text, std::string_view option = "--seed");

// --seed N: add_to at registration (the help text gets the default), value() when the command runs.
class SeedOption {
 public:
  explicit SeedOption(std::uint64_t default_seed = 0) : default_(default_seed) {}
  void add_to(CLI::App& sub, const std::string& description);
  std::uint64_t value() const { return text_.empty() ? default_ : parse_seed(text_); }

 private:
  std::string text_;
  std::uint64_t default_;
};

// --accumulate K splits each rank's slice of a step (ceil(batch / world_size) examples) into K
// micro-batches; more than the slice would leave micro-batches empty and compute what fewer give.
// UsageError naming the slice.
void check_accumulate(int accumulate, std::int64_t batch, int world_size);

// ---- what a run needs, against what this machine has ---------------------------------------------

struct MachineLimits {
  double memory_bytes = 0;    // MemAvailable, or less under a cgroup limit or ulimit -v / -d
  std::string memory_source;  // where memory_bytes came from, for the message
  std::int64_t threads = 0;   // threads this process may start
  std::string threads_source;
};
MachineLimits machine_limits();

struct RunSize {
  ModelConfig model;         // may be left empty where the command draws small models itself (verify)
  std::int64_t batch = 1;    // examples in one step's global batch
  std::int64_t dataset = 0;  // examples the sampler orders every epoch (0: batch)
  int world_size = 1;
  bool ranks_are_threads = true;  // every rank in this process (local, cuda-local, nccl without launcher)
  bool replicas_on_host = true;   // the cpu engine; the GPU engines keep their replicas on the device
  int optimizer_blocks = 0;       // optimizer state per parameter: 0 sgd, 1 momentum, 2 adam
  bool reference = false;         // grad: the float64 reference and bound, and every share's gradient
  bool json = false;              // grad --json: all of those again as text
};

// check_run_size for a training run of `config` on `world` ranks of `target` (train, replay, drift,
// bench trace), with `reference` when the float64 reference runs beside it (live checks, replay).
void check_train_size(const TrainConfig& config, int world, const Target& target, bool reference = false);

// Estimates the run's memory (parameters, gradients, optimizer state and checkpoint copies per replica,
// activations for the batch, the sampler's order, the ranks themselves) and threads, and throws
// UsageError naming the input whose part is largest -- --model, --batch, --dataset-size or
// --world-size -- when the run would not fit, before anything is allocated.
void check_run_size(const RunSize& run, const MachineLimits& machine = machine_limits());

// UsageError "<input> is too big for this machine: the run needs about X GiB of memory (<parts>) and Y GiB
// is available" when `bytes` would not fit; `input` names the option and its value ("--sizes 100G").
void require_memory(double bytes, const std::string& input, const std::string& parts = {},
                    const MachineLimits& machine = machine_limits());

// ---- agreement across the processes of a launcher -----------------------------------------------

// Runs `check` on the rank that writes (rank 0 of the launcher's world, or this process alone) and makes
// every rank throw the UsageError it raised, so that all ranks stop together and only rank 0 touches
// the file system (check_output_path creates a trial file). For output paths:
//   check_on_writing_rank([&] { check_output_path(o.report, "--report"); });
void check_on_writing_rank(const std::function<void()>& check);

// Runs `local` on every rank of a launcher's world -- what each rank reads for itself: its data files,
// its plugin, its checkpoint -- and then has every rank throw UsageError when any rank's `local` raised
// one, with that rank's reason, so that rank 0 says at once which rank could not read what: a rank that
// stopped alone would leave the others waiting out the timeout in their next collective, and blame a
// missing message. "rank 2: x.npy: no such file" when ranks differ; the reason alone when every rank
// gave the same one. Every rank must call it at the same point. Without a launcher: `local()`.
void agree_on_rank_inputs(const std::function<void()>& local);

// Each rank's reason ("" for a rank that had none) as one line: the reason alone when every rank gave the
// same one, else the first rank's, named, with how many others failed too.
std::string describe_rank_reasons(const std::vector<std::string>& reasons);

// All-gathers every rank's command line (the arguments after the program name) and throws UsageError
// on every rank when any differs from rank 0's, naming the option and the ranks:
// "ranks disagree on the command line: --batch is 30 on rank 0 and 32 on rank 2".
void require_same_command_line(Communicator& world, const std::vector<std::string>& args);

}  // namespace dpcheck::cli
