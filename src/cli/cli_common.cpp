#include "src/cli/cli_common.hpp"

#include "src/cli/commands.hpp"
#include "src/comm.hpp"
#include "src/target/backends.hpp"

#include <sys/ioctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/io/npy.hpp"

namespace dpcheck::cli {

nlohmann::json plugins_json(const Target& target) {
  nlohmann::json out = nlohmann::json::array();
  for (const PluginIdentity& p : target_plugins(target)) out.push_back(p.to_json());
  return out;
}

std::string plugins_text(const Target& target) {
  std::string out;
  for (const PluginIdentity& p : target_plugins(target)) out += "; " + p.text();
  return out;
}

std::string plugins_junit(const Target& target) {
  const std::vector<PluginIdentity> plugins = target_plugins(target);
  if (plugins.empty()) return "";
  std::string out = "  <properties>\n";
  for (const PluginIdentity& p : plugins) {
    const std::string key = p.option == "--comm" ? "comm_plugin" : "kernel_plugin";
    out += "    <property name=\"" + key + "\" value=\"" + xml_escape(p.name) + "\"/>\n";
    out += "    <property name=\"" + key + "_version\" value=\"" + xml_escape(p.version) + "\"/>\n";
    out += "    <property name=\"" + key + "_abi\" value=\"" + std::to_string(p.abi) + "\"/>\n";
    out += "    <property name=\"" + key + "_path\" value=\"" + xml_escape(p.path) + "\"/>\n";
    if (!p.capabilities.empty())
      out += "    <property name=\"" + key + "_capabilities\" value=\"" + xml_escape(p.capabilities) + "\"/>\n";
  }
  return out + "  </properties>\n";
}

void ModelOptions::add_to(CLI::App& sub, bool required) {
  CLI::Option* m = sub.add_option("--model", dims, "Layer widths, input first, e.g. 784,256,10");
  if (required) m->required();
  sub.add_option("--activation", activation, "relu (default), tanh or identity");
  sub.add_option("--loss", loss, "mse (default) or cross-entropy");
}

ModelConfig ModelOptions::config() const {
  ModelConfig c;
  c.dims = parse_dims(dims, "--model");
  c.activation = parse_activation(activation);
  c.loss = parse_loss(loss);
  return c;
}

std::vector<float> load_params_dir(const std::string& dir, const ModelConfig& model) {
  if (!std::filesystem::is_directory(dir)) throw UsageError(dir + ": not a directory of .npy parameter files");
  const ParamLayout layout(model);
  // A file the model has no parameter for is a sign of another model (or a checkpoint, whose optimizer
  // state --resume reads): loading the rest would silently train something else.
  std::set<std::string> expected;
  for (const Slice& s : layout.slices()) expected.insert(s.name + ".npy");
  std::vector<std::string> extra;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (!expected.contains(e.path().filename().string())) extra.push_back(e.path().filename().string());
  if (!extra.empty()) {
    std::sort(extra.begin(), extra.end());
    std::string names;
    for (std::size_t i = 0; i < extra.size() && i < 5; ++i) names += (i ? ", " : "") + extra[i];
    if (extra.size() > 5) names += " and " + std::to_string(extra.size() - 5) + " more";
    throw UsageError("--init " + dir + " holds files that are not parameters of model " + dims_string(model.dims) +
                     ": " + names +
                     (std::filesystem::exists(std::filesystem::path(dir) / "manifest.json")
                          ? " (a checkpoint continues with --resume)"
                          : ""));
  }
  std::vector<float> params(layout.size());
  for (const Slice& s : layout.slices()) {
    const std::filesystem::path file = std::filesystem::path(dir) / (s.name + ".npy");
    const NpyArray a = read_npy_expect(file, s.shape);
    if (a.dtype == DType::i64) throw UsageError(file.string() + ": parameters must be float32 or float64");
    const std::vector<float> v = a.as_finite_float32(file);
    std::copy(v.begin(), v.end(), params.begin() + static_cast<std::ptrdiff_t>(s.offset));
  }
  return params;
}

int resolve_world(Target& target, int requested, bool given) {
  const Backend& backend = target.backend();
  if (Communicator* world = world_of_processes(backend, process_world())) {
    if (given && requested != world->size())
      throw UsageError("--world-size " + std::to_string(requested) + " disagrees with the launcher's " +
                       std::to_string(world->size()) + " processes");
    target.process_world = world;
    return world->size();
  }
  return requested;
}

void print_error(std::string_view message) {
  constexpr std::string_view prefix = "dpcheck: error: ";
  while (!message.empty() && message.back() == '\n') message.remove_suffix(1);
  if (message.starts_with(prefix)) message.remove_prefix(prefix.size());
  std::string line = std::string(prefix) + escape_control(message) + '\n';
  std::fflush(stdout);
  std::cout.flush();
  try {
    write_all(STDERR_FILENO, line.data(), line.size(), "standard error");
  } catch (const Error&) {
    // Nowhere left to say it.
  }
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\n': out += "&#10;"; break;
      default: out += c;
    }
  }
  return out;
}

Progress::Progress(bool enabled) : enabled_(enabled), start_(std::chrono::steady_clock::now()), last_(start_) {}

Progress::~Progress() { done(); }

bool Progress::wanted(bool quiet) { return !quiet && ::isatty(STDERR_FILENO) == 1; }

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(const std::string& line) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (shown_ && now - last_ < std::chrono::milliseconds(50)) return;
  last_ = now;
  shown_ = true;
  // A line longer than the terminal would wrap, and "\r" would return to its last row only.
  winsize ws{};
  const std::size_t width =
      ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? static_cast<std::size_t>(ws.ws_col) - 1 : 119;
  std::string text = "\r" + line.substr(0, std::min(line.size(), width)) + "\033[K";
  std::fflush(stdout);
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

void Progress::done() {
  if (!enabled_ || !shown_) return;
  shown_ = false;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
}

// ---- checks every option gets -------------------------------------------------------------------

namespace {

bool is_blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

// How the option is named in a message: "--seed", or "argument A" for a positional one.
std::string option_label(const CLI::Option& opt) {
  const std::string name = opt.get_name();
  return name.starts_with("-") ? name : "argument " + name;
}

// A whole number as CLI11 would store it in an integer option, held to decimal and to the range of
// int64 (uint64 without a sign): anything else is refused rather than read as hex, octal or a clamped value.
void check_integer_text(const std::string& label, const std::string& text, bool is_unsigned) {
  const std::string_view digits = std::string_view(text).substr(!is_unsigned && text.starts_with('-') ? 1 : 0);
  const bool decimal = !digits.empty() &&
                       std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                       (digits.size() == 1 || digits[0] != '0');
  bool fits = false;
  if (decimal) {
    if (is_unsigned) {
      std::uint64_t v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      fits = ec == std::errc() && end == text.data() + text.size();
    } else {
      std::int64_t v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      fits = ec == std::errc() && end == text.data() + text.size();
    }
  }
  if (!fits)
    throw UsageError(label + " '" + text + "': give a whole number in decimal, from " +
                     (is_unsigned ? std::string("0") : std::to_string(std::numeric_limits<std::int64_t>::min())) +
                     " to " +
                     (is_unsigned ? std::to_string(std::numeric_limits<std::uint64_t>::max())
                                  : std::to_string(std::numeric_limits<std::int64_t>::max())));
}

bool is_output_option(const std::string& name) {
  static const std::set<std::string> outputs{"--report", "--junit", "--json", "--html", "--log", "--trace"};
  return outputs.contains(name);
}

// An output path as the file it will replace, for comparing two outputs that may not exist yet.
std::filesystem::path output_identity(const std::string& path) {
  try {
    return std::filesystem::absolute(resolve_links(path)).lexically_normal();
  } catch (const std::exception&) {
    return std::filesystem::absolute(path).lexically_normal();  // a loop: check_output_path names it
  }
}

void check_options_of(const CLI::App& sub) {
  std::vector<std::pair<std::string, std::string>> inputs, outputs;  // (label, path)
  for (const CLI::Option* opt : sub.get_options()) {
    if (opt->count() == 0 || opt->get_type_size_max() == 0) continue;  // absent, or a flag
    const std::string label = option_label(*opt);
    const std::string type = opt->get_type_name();
    // audit's COMMAND is the audited program's own argument list, where '' may mean something.
    if (type == "ARGS") continue;
    for (const std::string& value : opt->results()) {
      if (is_blank(value))
        throw UsageError(label + " is empty: give a value, or leave the option out" +
                         (opt->get_name().starts_with("-") ? " for its default" : ""));
      if (type == "INT" || type == "UINT") check_integer_text(label, value, type == "UINT");
      (is_output_option(opt->get_name()) ? outputs : inputs).emplace_back(label, value);
    }
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    for (const auto& [in_label, in_path] : inputs)
      check_not_an_input(outputs[i].second, outputs[i].first, in_path, in_label);
    for (std::size_t j = 0; j < i; ++j)
      if (output_identity(outputs[i].second) == output_identity(outputs[j].second))
        throw UsageError(outputs[j].first + " and " + outputs[i].first + " name the same file, " + outputs[i].second +
                         ": give each its own");
  }
  for (const CLI::App* inner : sub.get_subcommands()) check_options_of(*inner);
}

}  // namespace

void check_parsed_options(const CLI::App& app) { check_options_of(app); }

// ---- timeouts and seeds -------------------------------------------------------------------------

std::chrono::milliseconds parse_timeout(double seconds, std::string_view option) {
  if (!(seconds >= 0.001 && seconds <= max_timeout_s))
    throw UsageError(std::string(option) + " " + float_text(seconds) +
                     ": give the seconds a collective may wait, from 0.001 to " + float_text(max_timeout_s) +
                     " (a day)");
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000)));
}

void TimeoutOption::add_to(CLI::App& sub) {
  sub.add_option("--timeout", seconds,
                 "Seconds a collective may wait for a peer (default 60, at most " + float_text(max_timeout_s) + ")");
}

void PrecisionOption::add_to(CLI::App& sub) {
  sub.add_option(
      "--precision", name,
      "fp32 (default), bf16 or fp16: autocast's mixed precision on the cpu engine. Each matrix product's "
      "inputs are rounded to the format (nearest even) and accumulate in float32; activations, losses, "
      "master weights and optimizer state stay float32; the float64 reference rounds as the model does, and the "
      "bound carries each rounded activation or delta exactly, or its whole width where a rounding boundary lies "
      "within its error");
}

void AllreduceDtypeOption::add_to(CLI::App& sub) {
  sub.add_option("--allreduce-dtype", name,
                 "fp32 (default) or bf16: the gradient all-reduce in bfloat16, half the traffic (each rank's "
                 "gradient rounded to bf16; the bound adds N + 1 roundings of 2^-8 on the all-reduced path)");
}

void LossScaleOptions::add_to(CLI::App& sub) {
  sub.add_option(
      "--loss-scale", kind,
      "none or dynamic (PyTorch GradScaler's semantics: the backward pass runs at a power-of-two scale, "
      "a step whose gradient is non-finite on any rank is skipped on every rank and the scale halves, and "
      "it doubles after --loss-scale-interval good steps). Default: dynamic with --precision fp16, else none");
  sub.add_option("--loss-scale-init", init, "The scaler's first scale, a power of two (default 65536)");
  sub.add_option("--loss-scale-interval", interval, "Good steps before the scale doubles (default 2000)");
}

LossScalerConfig LossScaleOptions::config(Precision precision) const {
  LossScalerConfig c;
  c.kind = kind.empty() ? (precision == Precision::fp16 ? LossScaling::dynamic : LossScaling::none)
                        : parse_loss_scaling(kind);
  c.init_scale = init;
  c.growth_interval = interval;
  if (!c.enabled() && (init != 65536 || interval != 2000))
    throw UsageError("--loss-scale-init and --loss-scale-interval are for --loss-scale dynamic");
  c.validate();
  return c;
}

void add_kernels_option(CLI::App& sub, std::string& path) {
  sub.add_option("--kernels", path,
                 "A kernel plugin (a shared object exporting dpcheck_kernel_plugin, include/dpcheck/plugin.h): "
                 "the ops it provides replace the engine's and optimizer's own (a host plugin with --engine cpu, a "
                 "device one with --engine cuda)");
}

void TargetOptions::add_to(CLI::App& sub, unsigned fields) {
  sub_ = &sub;
  namespace f = target_option;
  if (fields & f::engine) sub.add_option("--engine", engine, engine_option_help());
  if (fields & f::comm) sub.add_option("--comm", comm, comm_option_help());
  if (fields & f::kernels) add_kernels_option(sub, kernels);
  if (fields & f::mutant)
    sub.add_option("--mutant", mutant, "Run with a deliberately broken part (see dpcheck verify --list-mutants)");
  if (fields & f::world_size)
    sub.add_option("--world-size", world_size,
                   "Number of ranks (default " + std::to_string(world_size) + "; under a launcher, its processes)");
  if (fields & f::tf32) sub.add_flag("--tf32", tf32, "cuda engine: TF32 matrix products (the bound uses u = 2^-11)");
  if (fields & f::precision) precision.add_to(sub);
  if (fields & f::allreduce_dtype) allreduce_dtype.add_to(sub);
  if (fields & f::timeout) timeout.add_to(sub);
}

void TargetOptions::reword(const std::string& option, const std::string& help) {
  sub_->get_option(option)->description(help);
}

bool TargetOptions::given(const std::string& option) const {
  return sub_ != nullptr && sub_->get_option_no_throw(option) != nullptr && sub_->count(option) > 0;
}

Target TargetOptions::target() const {
  // --world-size is checked here alone, for every command that takes it.
  if (given("--world-size") && world_size < 1) throw UsageError("--world-size must be at least 1");
  Target t;
  t.engine = engine;
  t.comm = given("--comm") ? comm : default_comm(engine);
  t.kernels = kernels;
  t.mutant = mutant;
  t.world_size = world_size;
  t.tf32 = tf32;
  t.precision = precision.value();
  t.allreduce_dtype = allreduce_dtype.value();
  t.timeout = timeout.value();
  return t;
}

Target TargetOptions::resolved() const {
  Target t = target();
  t.world_size = resolve_world(t, world_size, given("--world-size"));
  return t;
}

std::string TargetOptions::flags(const Target& t) {
  std::string out;
  if (t.engine != default_engine()) out += " --engine " + t.engine;
  if (t.comm != default_comm(t.engine)) out += " --comm " + shell_word(t.comm);
  if (!t.kernels.empty()) out += " --kernels " + shell_word(t.kernels);
  if (!t.mutant.empty()) out += " --mutant " + t.mutant;
  if (t.tf32) out += " --tf32";
  if (t.precision != Precision::fp32) out += " --precision " + std::string(precision_name(t.precision));
  return out;
}

std::uint64_t parse_seed(std::string_view text, std::string_view option) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const bool digits =
      !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || ec != std::errc() || end != text.data() + text.size())
    throw UsageError(std::string(option) + " '" + std::string(text) + "': give a whole number from 0 to " +
                     std::to_string(std::numeric_limits<std::uint64_t>::max()));
  return v;
}

void SeedOption::add_to(CLI::App& sub, const std::string& description) {
  sub.add_option("--seed", text_, description + " (default " + std::to_string(default_) + ")")->type_name("UINT64");
}

void check_accumulate(int accumulate, std::int64_t batch, int world_size) {
  if (accumulate < 1) throw UsageError("--accumulate must be at least 1");
  if (batch < 1 || world_size < 1) return;  // refused elsewhere, with their own names
  const std::int64_t slice = (batch + world_size - 1) / world_size;
  if (accumulate > slice)
    throw UsageError("--accumulate " + std::to_string(accumulate) + " is more than a rank's share of a step (" +
                     std::to_string(slice) + " examples: batch " + std::to_string(batch) + " over " +
                     std::to_string(world_size) + (world_size == 1 ? " rank" : " ranks") + "); give at most " +
                     std::to_string(slice));
}

// ---- what a run needs, against what this machine has ---------------------------------------------

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// The first number in a file such as /proc/sys/kernel/threads-max or a cgroup's memory.max; nullopt
// when it cannot be read or says "max".
std::optional<double> number_in(const char* path) {
  std::ifstream in(path);
  double v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

// The value of a "Key:   123 kB" line of /proc/meminfo, in bytes.
std::optional<double> meminfo(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    double kb = 0;
    if (fields >> kb) return kb * 1024;
  }
  return std::nullopt;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / kGiB);
  return buf;
}

}  // namespace

MachineLimits machine_limits() {
  MachineLimits m;
  const auto lower = [](double& best, std::string& source, std::optional<double> v, const char* what) {
    if (v && *v >= 0 && (best <= 0 || *v < best)) {
      best = *v;
      source = what;
    }
  };
  if (const auto avail = meminfo("MemAvailable"))
    lower(m.memory_bytes, m.memory_source, avail, "MemAvailable in /proc/meminfo");
  else
    lower(m.memory_bytes, m.memory_source,
          static_cast<double>(::sysconf(_SC_AVPHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGESIZE)),
          "available pages (sysconf)");
  // A container's cgroup (v2, then v1) may allow less than the machine has free.
  for (const auto& [limit, usage] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const auto l = number_in(limit);
    if (l && *l < 1e18)
      lower(m.memory_bytes, m.memory_source, *l - number_in(usage).value_or(0), "the cgroup's memory limit");
  }
  for (const auto& [resource, name] : {std::pair{RLIMIT_AS, "ulimit -v"}, std::pair{RLIMIT_DATA, "ulimit -d"}}) {
    struct rlimit r {};
    if (::getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
      lower(m.memory_bytes, m.memory_source, static_cast<double>(r.rlim_cur), name);
  }

  double threads = 0;
  lower(threads, m.threads_source, number_in("/proc/sys/kernel/threads-max"), "/proc/sys/kernel/threads-max");
  lower(threads, m.threads_source, number_in("/sys/fs/cgroup/pids.max"), "the cgroup's pids.max");
  lower(threads, m.threads_source, number_in("/sys/fs/cgroup/pids/pids.max"), "the cgroup's pids.max");
  struct rlimit r {};
  if (::getrlimit(RLIMIT_NPROC, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    lower(threads, m.threads_source, static_cast<double>(r.rlim_cur), "ulimit -u");
  m.threads = threads > 0 ? static_cast<std::int64_t>(threads) : std::numeric_limits<std::int64_t>::max();
  return m;
}

std::string ratio_text(double ratio, const char* infinite) {
  if (!std::isfinite(ratio)) return infinite;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", ratio);
  return buf;
}

std::string counted(long long n, const char* noun) { return std::to_string(n) + " " + noun + (n == 1 ? "" : "s"); }

void check_train_size(const TrainConfig& t, int world, const Target& target, bool reference) {
  RunSize needs;
  needs.model = t.model;
  needs.batch = t.batch;
  needs.dataset = t.data_size();
  needs.world_size = world;
  needs.ranks_are_threads = target.process_world == nullptr && !target.backend().simulated;
  needs.replicas_on_host = target.engine_row().memory == MemorySpace::host;
  needs.optimizer_blocks = t.optimizer.kind == OptimizerKind::adam       ? 2
                           : t.optimizer.kind == OptimizerKind::momentum ? 1
                                                                         : 0;
  needs.reference = reference;
  check_run_size(needs);
}

void check_run_size(const RunSize& run, const MachineLimits& machine) {
  const double n = run.world_size;
  const std::string world_text = "--world-size " + std::to_string(run.world_size);
  // A few threads beside the ranks: the main thread, the launcher's, the timeout watchers.
  if (run.ranks_are_threads && run.world_size > 1 && static_cast<double>(machine.threads) < n + 8)
    throw UsageError(world_text +
                     " is too big for this machine: its ranks run as threads of one process, and this "
                     "process may start at most " +
                     std::to_string(machine.threads) + " threads (" + machine.threads_source + ")");

  // Bytes, in double so that no product overflows. Each factor is an upper estimate measured on the cpu
  // engine (resident memory of train and grad against model, batch and world size), with room to spare.
  const double p = static_cast<double>(parameter_count(run.model.dims));
  double widths = 0;
  for (int d : run.model.dims) widths += d;
  const double in_out = run.model.dims.size() < 2 ? 0.0 : run.model.in_dim() + run.model.out_dim();
  const double replicas = run.ranks_are_threads ? n : 1;
  const double batch = static_cast<double>(run.batch);
  const double rank_batch = run.ranks_are_threads ? batch : std::ceil(batch / n);
  const double dataset = static_cast<double>(run.dataset > 0 ? run.dataset : run.batch);

  // Parameters, gradients, the loaded copy and optimizer state, each also copied for a checkpoint.
  double model_bytes = 4 * p * (run.replicas_on_host ? replicas * (5 + 3.0 * run.optimizer_blocks) : 0) + 4 * p;
  // Activations, pre-activations and deltas of every layer, and the gathered inputs and targets.
  double batch_bytes = rank_batch * (12 * widths + 8 * in_out);
  // Each rank's order of the data set and its share of it, every epoch.
  const double dataset_bytes = replicas * 16 * dataset;
  // A thread's stack and bookkeeping, and every rank's view of every other's call.
  double world_bytes = run.ranks_are_threads ? n * 65536 + n * n * 48 : n * 48;
  if (run.reference) {
    model_bytes += 64 * p + 4 * p * n;  // float64 gradient, magnitudes and bounds; every share's gradient
    batch_bytes += batch * (48 * widths + 4 * in_out);
    if (run.json) model_bytes += 40 * p * (n + 5);
  }
  const double total = model_bytes + batch_bytes + dataset_bytes + world_bytes;
  const double largest = std::max({model_bytes, batch_bytes, dataset_bytes, world_bytes});
  std::string culprit;
  if (largest == model_bytes)
    culprit = "--model " + dims_string(run.model.dims) + " (" + std::to_string(static_cast<std::int64_t>(p)) +
              " parameters" + (replicas > 1 ? ", " + std::to_string(run.world_size) + " replicas" : std::string()) +
              ")";
  else if (largest == batch_bytes) culprit = "--batch " + std::to_string(run.batch);
  else if (largest == dataset_bytes) culprit = "--dataset-size " + std::to_string(static_cast<std::int64_t>(dataset));
  else culprit = world_text;
  require_memory(total, culprit,
                 "model " + gib(model_bytes) + ", batch " + gib(batch_bytes) + ", data set order " +
                     gib(dataset_bytes) + ", ranks " + gib(world_bytes),
                 machine);
}

void require_memory(double bytes, const std::string& input, const std::string& parts, const MachineLimits& machine) {
  // The estimates are generous; the margin is for what else runs on the machine meanwhile.
  if (bytes <= 0.9 * machine.memory_bytes) return;
  throw UsageError(input + " is too big for this machine: the run needs about " + gib(bytes) + " of memory" +
                   (parts.empty() ? "" : " (" + parts + ")") + " and " + gib(machine.memory_bytes) + " is available (" +
                   machine.memory_source + ")");
}

// ---- agreement across the processes of a launcher -----------------------------------------------

namespace {

// Rank 0's text on every rank: its length, then its bytes.
std::string broadcast_text(Communicator& world, std::string text) {
  std::uint64_t size = text.size();
  world.broadcast(&size, 1, DType::u64, 0);
  text.resize(size);
  if (size > 0) world.broadcast(text.data(), size, DType::u8, 0);
  return text;
}

bool is_option_name(const std::string& token) {
  return token.size() > 1 && token[0] == '-' && !(token[1] >= '0' && token[1] <= '9') && token[1] != '.';
}

// "--batch=30" as "--batch", "30", so that the two spellings of one value compare equal.
std::vector<std::string> normalized(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    const std::size_t eq = a.find('=');
    if (a.starts_with("--") && eq != std::string::npos) {
      out.push_back(a.substr(0, eq));
      out.push_back(a.substr(eq + 1));
    } else {
      out.push_back(a);
    }
  }
  return out;
}

// The option whose value token i is ("--batch" for the 30 of "--batch 30"), or "" when token i is an
// option itself or a positional argument.
std::string owner_of(const std::vector<std::string>& args, std::size_t i) {
  if (i == 0 || i >= args.size() || is_option_name(args[i]) || !is_option_name(args[i - 1])) return {};
  return args[i - 1];
}

std::string describe_difference(const std::vector<std::vector<std::string>>& all) {
  const std::vector<std::string> zero = normalized(all[0]);
  for (std::size_t r = 1; r < all.size(); ++r) {
    const std::vector<std::string> other = normalized(all[r]);
    if (other == zero) continue;
    std::size_t i = 0;
    while (i < zero.size() && i < other.size() && zero[i] == other[i]) ++i;
    const std::string rank = " on rank " + std::to_string(r);
    const std::string option = owner_of(zero, i);
    if (!option.empty() && option == owner_of(other, i))
      return option + " is " + zero[i] + " on rank 0 and " + other[i] + rank;
    const auto at = [](const std::vector<std::string>& a, std::size_t k) {
      return k < a.size() ? a[k] : std::string("nothing");
    };
    return "argument " + std::to_string(i + 1) + " is " + at(zero, i) + " on rank 0 and " + at(other, i) + rank;
  }
  return {};
}

}  // namespace

void check_on_writing_rank(const std::function<void()>& check) {
  Communicator* world = process_world();
  if (world == nullptr || world->size() == 1) return check();
  std::string why;
  if (world->rank() == 0) {
    try {
      check();
    } catch (const UsageError& e) {
      why = e.what();
      if (why.empty()) why = "bad output path";
    }
  }
  why = broadcast_text(*world, why);
  if (!why.empty()) throw UsageError(why);
}

void agree_on_rank_inputs(const std::function<void()>& local) {
  Communicator* world = process_world();
  if (world == nullptr || world->size() == 1) return local();
  std::string why;
  try {
    local();
  } catch (const UsageError& e) {
    why = e.what();
    if (why.empty()) why = "bad input";
  }
  // Every rank's reason ("" for none), padded to the longest for the all-gather.
  const std::vector<std::uint64_t> sizes = world->allgather_value<std::uint64_t>(why.size());
  const std::uint64_t size = *std::max_element(sizes.begin(), sizes.end());
  if (size == 0) return;
  why.resize(size);
  std::string all(size * static_cast<std::size_t>(world->size()), '\0');
  world->allgather(why.data(), all.data(), size, DType::u8);
  std::vector<std::string> reasons;
  for (std::size_t r = 0; r < sizes.size(); ++r) reasons.emplace_back(all.data() + r * size, sizes[r]);
  throw UsageError(describe_rank_reasons(reasons));
}

std::string describe_rank_reasons(const std::vector<std::string>& reasons) {
  if (reasons.empty()) return {};
  const bool same = std::all_of(reasons.begin(), reasons.end(), [&](const std::string& w) { return w == reasons[0]; });
  if (same) return reasons[0];
  std::size_t first = 0;
  while (reasons[first].empty()) ++first;
  int failing = 0;
  for (const std::string& w : reasons) failing += w.empty() ? 0 : 1;
  return "rank " + std::to_string(first) + ": " + reasons[first] +
         (failing > 1 ? " (and " + std::to_string(failing - 1) + " other ranks failed too)" : "");
}

void require_same_command_line(Communicator& world, const std::vector<std::string>& args) {
  if (world.size() == 1) return;
  std::string joined;
  for (const std::string& a : args) joined += a + '\0';
  // Equal counts for the all-gather: every rank's bytes padded to the longest.
  const std::vector<std::uint64_t> sizes = world.allgather_value<std::uint64_t>(joined.size());
  const std::uint64_t size = *std::max_element(sizes.begin(), sizes.end());
  joined.resize(size);
  std::string all(size * static_cast<std::size_t>(world.size()), '\0');
  if (size > 0) world.allgather(joined.data(), all.data(), size, DType::u8);
  std::vector<std::vector<std::string>> per_rank(static_cast<std::size_t>(world.size()));
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    std::string_view rest(all.data() + r * size, sizes[r]);
    while (!rest.empty()) {
      const std::size_t end = rest.find('\0');
      per_rank[r].emplace_back(rest.substr(0, end));
      rest.remove_prefix(std::min(end + 1, rest.size()));
    }
  }
  const std::string difference = describe_difference(per_rank);
  if (!difference.empty()) throw UsageError("ranks disagree on the command line: " + difference);
}

}  // namespace dpcheck::cli

namespace dpcheck::cli {

namespace {
Communicator* g_process_world = nullptr;
std::vector<std::string>& g_command_line() {
  static std::vector<std::string> words{"dpcheck"};
  return words;
}
}  // namespace

const std::vector<std::string>& command_line() { return g_command_line(); }
void set_command_line(std::vector<std::string> words) { g_command_line() = std::move(words); }

Communicator* process_world() { return g_process_world; }
void set_process_world(Communicator* world) { g_process_world = world; }
bool is_printing_rank() { return !g_process_world || g_process_world->rank() == 0; }

}  // namespace dpcheck::cli
