#include "src/cli/cli_common.hpp"

#include "src/cli/commands.hpp"
#include "src/comm.hpp"
#include "src/target/backends.hpp"

#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
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
  const Backend& backend = *target.backend;
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
  Target t = resolve_target({.engine = engine,
                             .comm = given("--comm") ? comm : "",
                             .kernels = kernels,
                             .mutant = mutant,
                             .tf32 = tf32,
                             .precision = precision.value(),
                             .timeout = timeout.value()});
  t.world_size = world_size;
  t.allreduce_dtype = allreduce_dtype.value();
  return t;
}

Target TargetOptions::resolved() const {
  Target t = target();
  t.world_size = resolve_world(t, world_size, given("--world-size"));
  return t;
}

std::string TargetOptions::flags(const Target& t) {
  std::string out;
  if (t.engine != &default_engine_row()) out += " --engine " + std::string(t.engine->name);
  if (!t.backend->engine_default) out += " --comm " + shell_word(t.backend->name);
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

}  // namespace dpcheck::cli
