#include "properties/target.hpp"

#include "properties/mutants.hpp"
#include "src/error.hpp"
#include "src/comm/plugin_comm.hpp"
#include "src/cuda_plugin.hpp"
#include "src/plugin/plugin_loader.hpp"
#include "src/plugin/kernel_plugin.hpp"

#include <vector>

namespace dpcheck {

std::string Target::describe() const {
  std::string format = tf32 ? " (tf32)" : precision != Precision::fp32 ? " (" + std::string(precision_name(precision)) + ")" : "";
  std::string drawn;
  for (const Precision p : drawn_precisions) drawn += (drawn.empty() ? "" : ", ") + std::string(precision_name(p));
  if (!drawn.empty()) format = " (" + drawn + " drawn per case)";
  std::string allreduce;
  for (const DType d : drawn_allreduce_dtypes)
    allreduce += (allreduce.empty() ? ", all-reduce in " : " or ") + std::string(allreduce_dtype_name(d));
  if (!allreduce.empty()) allreduce += " drawn per case";
  return "engine " + engine + format + ", comm " + comm + allreduce + (kernels.empty() ? "" : ", kernels " + kernels) +
         ", mutant " + (mutant.empty() ? "none" : mutant);
}

std::string PluginIdentity::text() const {
  return "plugin '" + name + "'" + (version.empty() ? std::string() : " " + version) + ", ABI " + std::to_string(abi) +
         " (" + path + ")";
}

std::vector<PluginIdentity> target_plugins(const Target& target) {
  std::vector<PluginIdentity> out;
  if (looks_like_plugin_path(target.comm)) {
    const dpcheck_comm_plugin_t& t = load_comm_plugin(target.comm);
    PluginIdentity p{"--comm", target.comm, t.name, t.abi >= 3 && t.version ? t.version : "", t.abi,
                     comm_plugin_capabilities(t), {}, {}};
    for (DType d : {DType::f32, DType::f64, DType::i64, DType::bf16, DType::f16})
      if (comm_plugin_has_dtype(t, d)) p.dtypes.emplace_back(dtype_name(d));
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max})
      if (comm_plugin_supports(t, DType::f32, op) || comm_plugin_supports(t, DType::f64, op) ||
          comm_plugin_supports(t, DType::i64, op))
        p.ops.emplace_back(reduce_op_name(op));
    out.push_back(std::move(p));
  }
  if (!target.kernels.empty()) {
    const KernelPlugin& k = load_kernel_plugin(target.kernels);
    out.push_back({"--kernels", target.kernels, std::string(k.name()), std::string(k.version()), k.table().abi, "", {}, {}});
  }
  return out;
}

namespace {

// The target's row; UsageError when its names are unknown or do not go together.
const Backend& backend_of(const Target& target) { return backend_for(target.engine, target.comm); }

}  // namespace

std::string shell_word(const std::string& text) {
  if (!text.empty() && text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@") ==
                           std::string::npos)
    return text;
  return shell_quoted(text);
}

std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string gradient_allreduce_unsupported(const Target& target) {
  if (!looks_like_plugin_path(target.comm)) return "";
  const dpcheck_comm_plugin_t& plugin = load_comm_plugin(target.comm);
  if (comm_plugin_supports(plugin, target.allreduce_dtype, ReduceOp::avg)) return "";
  return comm_plugin_lacks(plugin, target.comm, target.allreduce_dtype, ReduceOp::avg);
}

namespace {

bool formats_drawable(const Target& target) {
  const MutantInfo* m = target.mutant.empty() ? nullptr : find_mutant(target.mutant);
  return target.engine == "cpu" && !target.tf32 && !(m && !m->precision.empty());
}

}  // namespace

bool precision_drawable(const Target& target) { return formats_drawable(target) && target.kernels.empty(); }

bool allreduce_dtype_drawable(const Target& target) {
  if (!formats_drawable(target)) return false;
  Target bf16 = target;
  bf16.allreduce_dtype = DType::bf16;
  return gradient_allreduce_unsupported(bf16).empty();
}

void validate_target(const Target& target, GradientAllreduce gradient) {
  const Backend& backend = backend_of(target);
  (void)world_of_processes(backend, target.process_world);
  if (target.tf32 && target.engine != "cuda") throw UsageError("--tf32 is for the cuda engine's matrix products");
  if (target.tf32 && target.precision != Precision::fp32)
    throw UsageError("--tf32 and --precision " + std::string(precision_name(target.precision)) +
                     " both set the matrix products' input format: choose one");
  if (target.allreduce_dtype != DType::f32 && target.engine != "cpu")
    throw UsageError("--allreduce-dtype bf16 runs on the cpu engine; the " + target.engine +
                     " engine's bf16 gradient all-reduce is not built yet");
  if (target.precision != Precision::fp32 && target.engine != "cpu" && target.engine != "cuda")
    throw UsageError("--precision " + std::string(precision_name(target.precision)) + " runs on the cpu and cuda engines");
  if (target.precision != Precision::fp32 && target.engine == "cuda" && !target.kernels.empty())
    throw UsageError("--precision " + std::string(precision_name(target.precision)) +
                     " and --kernels on the cuda engine do not go together yet");
  require_known_mutant(target.mutant);
  if (const MutantInfo* m = find_mutant(target.mutant); m && !m->engine.empty() && m->engine != target.engine)
    throw UsageError("mutant " + target.mutant + " breaks the " + std::string(m->engine) + " engine: add --engine " +
                     std::string(m->engine));
  if (const MutantInfo* m = find_mutant(target.mutant);
      m && !m->precision.empty() && m->precision != precision_name(target.precision))
    throw UsageError("mutant " + target.mutant + " breaks the " + std::string(m->precision) + " path: add --precision " +
                     std::string(m->precision));
  if (target.world_size < 0) throw UsageError("world size must be at least 1");
  if (const EngineRow& engine = find_engine(target.engine); engine.require) engine.require();
  if (!target.kernels.empty()) require_kernels_for_engine(load_kernel_plugin(target.kernels), target.engine);
  if (gradient == GradientAllreduce::required)
    if (const std::string why = gradient_allreduce_unsupported(target); !why.empty()) throw UsageError(why);
}

std::vector<std::size_t> comm_thresholds(const Target& target, int world_size) {
  const Backend& backend = backend_of(target);
  return backend.thresholds ? backend.thresholds(world_size, target.process_world) : std::vector<std::size_t>{};
}

std::string launch_prefix(const Target& target) {
  return target.process_world ? backend_of(target).launch_prefix(target.process_world->size()) : std::string();
}

std::string replay_command(const Target& target, const std::string& token) {
  const Backend& backend = backend_of(target);
  std::string cmd = launch_prefix(target) + "dpcheck verify";
  if (target.engine != default_engine()) cmd += " --engine " + target.engine;
  if (!backend.engine_default) cmd += " --comm " + shell_word(target.comm);
  if (target.tf32) cmd += " --tf32";
  // A format the run fixed is named even at its default, where verify would otherwise draw it per case.
  if (target.precision != Precision::fp32 || (target.drawn_precisions.empty() && precision_drawable(target)))
    cmd += " --precision " + std::string(precision_name(target.precision));
  if (target.allreduce_dtype != DType::f32 || (target.drawn_allreduce_dtypes.empty() && allreduce_dtype_drawable(target)))
    cmd += " --allreduce-dtype " + std::string(allreduce_dtype_name(target.allreduce_dtype));
  if (!target.kernels.empty()) cmd += " --kernels " + shell_word(target.kernels);
  if (!target.mutant.empty()) cmd += " --mutant " + target.mutant;
  // A process backend's world is the launcher's; a thread backend's is a flag (or drawn per case, and
  // then recorded in the token).
  if (target.world_size > 0 && !target.process_world) cmd += " --world-size " + std::to_string(target.world_size);
  if (target.thorough) cmd += " --thorough";  // the token replays a case of the wider space
  return cmd + " --reproduce " + shell_quoted(token);
}

reference::BoundOptions bound_options(const Target& target) {
  reference::BoundOptions o;
  o.uncertain_kinks = target.mutant != "bound-without-kink-term";
  if (target.mutant == "bound-three-times-loose") o.looseness = 3;
  if (target.tf32) {
    o.unit_roundoff = 0x1p-11;  // TF32 keeps 10 explicit mantissa bits
    o.product_input_roundings = 4;
  }
  o.input_format = target.precision;
  // Tensor cores may accumulate with truncation rather than rounding to nearest (Fasi, Higham, Mikaitis
  // and Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ Comput. Sci. 7, 2021), which doubles
  // float32's unit roundoff in the accumulation: the bound allows it on the cuda engine's products.
  if (target.precision != Precision::fp32 && target.engine == "cuda") o.unit_roundoff = 0x1p-23;
  o.allreduce_format = target.allreduce_dtype == DType::bf16 ? Precision::bf16 : Precision::fp32;
  return o;
}

reference::BoundOptions sharded_bound_options(reference::BoundOptions options, int world_size) {
  if (options.input_format != Precision::fp32) options.delta_scale *= world_size;
  if (options.allreduce_format != Precision::fp32)
    options.allreduce_roundings =
        (world_size + 1) * static_cast<std::int64_t>(precision_unit_roundoff(options.allreduce_format) / options.unit_roundoff);
  return options;
}

reference::BoundOptions bound_options(const Target& target, const TrainConfig& config) {
  reference::BoundOptions o = bound_options(target);
  o.allreduce_format = config.allreduce_dtype == DType::bf16 ? Precision::bf16 : Precision::fp32;
  return o;
}

reference::GradientBound sharded_gradient_bound(const reference::GradientBound& whole, const ModelConfig& model,
                                                std::span<const float> params, const Batch& batch, int world_size) {
  const reference::BoundOptions options = sharded_bound_options(whole.options, world_size);
  if (options.delta_scale != whole.options.delta_scale) return reference::gradient_bound(model, params, batch, options);
  reference::GradientBound out = whole;
  out.options.allreduce_roundings = options.allreduce_roundings;
  return out;
}

void run_world(const Target& target, int world_size, const std::function<void(Communicator&)>& fn) {
  const auto with_mutant = [&](Communicator& comm) {
    std::unique_ptr<Communicator> wrapped = mutant_communicator(target.mutant, comm);
    Communicator& inner = wrapped ? *wrapped : comm;
    std::unique_ptr<Communicator> faulty;
    if (target.fault && target.fault->phase == FaultPhase::all_reduce) faulty = fault_communicator(inner, *target.fault);
    fn(faulty ? *faulty : inner);
  };
  const Backend& backend = backend_of(target);
  if (Communicator* world = world_of_processes(backend, target.process_world)) {
    if (world->size() != world_size)
      throw Error("a scenario asked for " + std::to_string(world_size) + " ranks but the launcher started " +
                  std::to_string(world->size()));
    world->set_timeout(target.timeout);
    return backend.run_processes(*world, with_mutant);
  }
  backend.run_threads(world_size, with_mutant, target.timeout);
}

std::unique_ptr<Engine> make_engine(const Target& target, const ModelConfig& model, int rank) {
  if (target.engine == "cpu") {
    CpuEngineOptions options;
    options.precision = target.precision;
    options.accumulate_in_low_precision = target.mutant == "bf16-accumulate";
    return make_cpu_engine(model, make_kernels(target.kernels, rank, target.timeout), options);
  }
  if (!target.kernels.empty()) require_kernels_for_engine(load_kernel_plugin(target.kernels), target.engine);
  if (target.engine == "cuda") {
    cuda::EngineOptions options;
    options.tf32 = target.tf32;
    options.precision = target.precision;
    // The GPU mutants swap in a broken bias-gradient kernel (kernels/bias_grad.cu).
    if (target.mutant == "bias-grad-atomic") options.bias_grad = cuda::BiasGradKernel::atomic;
    if (target.mutant == "bias-grad-skip-tail") options.bias_grad = cuda::BiasGradKernel::skip_tail;
    options.kernels = make_kernels(target.kernels, rank, target.timeout);
    return require_cuda().make_engine(model, options);
  }
  throw UsageError("unknown engine '" + target.engine + "'");
}

std::unique_ptr<Optimizer> make_optimizer(const Target& target, const OptimizerConfig& config, std::size_t size,
                                          int rank, int world_size, void* stream) {
  const OptimizerConfig c = mutant_optimizer_config(target.mutant, config, rank, world_size);
  if (target.engine == "cpu")
    return mutant_optimizer(target.mutant, make_cpu_optimizer(c, size, make_kernels(target.kernels, rank, target.timeout)));
  if (target.engine == "cuda")
    return require_cuda().make_optimizer(c, size, stream, make_kernels(target.kernels, rank, target.timeout));
  throw UsageError("unknown engine '" + target.engine + "'");
}

std::unique_ptr<DistributedSampler> make_sampler(const Target& target, const SamplerConfig& config) {
  if (auto m = mutant_sampler(target.mutant, config)) return m;
  return std::make_unique<DistributedSampler>(config);
}

std::unique_ptr<RankZeroWriter> make_writer(const Target& target, Communicator& comm,
                                            const std::filesystem::path& checkpoint_dir,
                                            const std::filesystem::path& log_path, int keep) {
  if (auto m = mutant_writer(target.mutant, comm, checkpoint_dir, log_path, keep)) return m;
  return std::make_unique<RankZeroWriter>(comm, checkpoint_dir, log_path, keep);
}

RankTrainer make_rank_trainer(const Target& target, const TrainConfig& config, Communicator& comm,
                              const Dataset& data) {
  RankTrainer r;
  const int world = comm.size();
  config.validate(world);
  r.engine = make_engine(target, config.model, comm.rank());
  r.engine->load_params(init_params(config.model, config.seed));
  comm.set_stream(r.engine->stream());
  r.optimizer = make_optimizer(target, config.optimizer_for(world), r.engine->param_count(), comm.rank(), world,
                               r.engine->stream());
  r.sampler = make_sampler(target, config.sampler(world));
  if (target.fault && target.fault->phase != FaultPhase::all_reduce)
    r.trainer = fault_trainer(*target.fault, config, comm, *r.engine, *r.optimizer, *r.sampler, data);
  else
    r.trainer = mutant_trainer(target.mutant, config, comm, *r.engine, *r.optimizer, *r.sampler, data);
  if (!r.trainer) r.trainer = std::make_unique<Trainer>(config, comm, *r.engine, *r.optimizer, *r.sampler, data);
  return r;
}

}  // namespace dpcheck
