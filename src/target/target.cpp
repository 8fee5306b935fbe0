#include "src/target/target.hpp"

#include "src/comm/mpi_comm.hpp"
#include "src/comm/simulated_comm.hpp"
#include "src/error.hpp"
#include "src/plugin/kernel_plugin.hpp"
#include "src/plugin/plugin_loader.hpp"
#include "src/target/cuda_plugin.hpp"
#include "src/target/mutant_hooks.hpp"
#include "src/target/plugin_comm.hpp"

#include <vector>

#include <nlohmann/json.hpp>

namespace dpcheck {

std::string Target::describe(const std::vector<Precision>& drawn_precisions,
                             const std::vector<DType>& drawn_allreduce_dtypes) const {
  std::string format = tf32                           ? " (tf32)"
                       : precision != Precision::fp32 ? " (" + std::string(precision_name(precision)) + ")"
                                                      : "";
  std::string drawn;
  for (const Precision p : drawn_precisions) drawn += (drawn.empty() ? "" : ", ") + std::string(precision_name(p));
  if (!drawn.empty()) format = " (" + drawn + " drawn per case)";
  std::string allreduce;
  for (const DType d : drawn_allreduce_dtypes)
    allreduce += (allreduce.empty() ? ", all-reduce in " : " or ") + std::string(allreduce_dtype_name(d));
  if (!allreduce.empty()) allreduce += " drawn per case";
  return "engine " + std::string(engine->name) + format + ", comm " + backend->name + allreduce +
         (kernels.empty() ? "" : ", kernels " + kernels) + ", mutant " + (mutant.empty() ? "none" : mutant);
}

std::string PluginIdentity::text() const {
  return "plugin '" + name + "'" + (version.empty() ? std::string() : " " + version) + ", ABI " + std::to_string(abi) +
         " (" + path + ")";
}

nlohmann::json PluginIdentity::to_json() const {
  nlohmann::json j{{"option", option},
                   {"path", path},
                   {"name", name},
                   {"version", version.empty() ? nlohmann::json(nullptr) : nlohmann::json(version)},
                   {"abi", abi}};
  if (option == "--comm") {
    j["dtypes"] = dtypes;
    j["ops"] = ops;
  }
  return j;
}

std::vector<PluginIdentity> target_plugins(const Target& target) {
  std::vector<PluginIdentity> out;
  if (looks_like_plugin_path(target.backend->name)) {
    const dpcheck_comm_plugin_t& t = load_comm_plugin(target.backend->name);
    PluginIdentity p{"--comm", target.backend->name,        t.name, t.abi >= 3 && t.version ? t.version : "",
                     t.abi,    comm_plugin_capabilities(t), {},     {}};
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
    out.push_back(
        {"--kernels", target.kernels, std::string(k.name()), std::string(k.version()), k.table().abi, "", {}, {}});
  }
  return out;
}

TargetRecord target_record(const Target& target) {
  return {.engine = std::string(target.engine->name),
          .comm = target.backend->name,
          .kernels = target.kernels,
          .mutant = target.mutant,
          .tf32 = target.tf32,
          .precision = target.precision,
          .timeout = target.timeout};
}

Target resolve_target(const TargetRecord& record) {
  Target t;
  t.engine = &find_engine(record.engine);
  t.backend = record.comm.empty() ? &default_backend(*t.engine) : &backend_for(record.engine, record.comm);
  return with_recorded_fields(t, record);
}

Target with_recorded_fields(Target target, const TargetRecord& record) {
  target.kernels = record.kernels;
  target.mutant = record.mutant;
  target.tf32 = record.tf32;
  target.precision = record.precision;
  target.timeout = record.timeout;
  return target;
}

std::string shell_word(const std::string& text) {
  if (!text.empty() &&
      text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=:,+@") ==
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
  const std::string& path = target.backend->name;
  if (!looks_like_plugin_path(path)) return "";
  const dpcheck_comm_plugin_t& plugin = load_comm_plugin(path);
  if (comm_plugin_supports(plugin, target.allreduce_dtype, ReduceOp::avg)) return "";
  return comm_plugin_lacks(plugin, path, target.allreduce_dtype, ReduceOp::avg);
}

namespace {

// The parts that the target's mutant breaks, or nullptr without one.
const MutantParts* broken_parts(const Target& target) {
  return target.mutant.empty() ? nullptr : &mutant_table().parts(target.mutant);
}

bool formats_drawable(const Target& target) {
  return target.engine->draws_formats && !target.tf32 &&
         (target.mutant.empty() || mutant_table().require(target.mutant).precision.empty());
}

}  // namespace

bool precision_drawable(const Target& target) { return formats_drawable(target) && target.kernels.empty(); }

bool allreduce_dtype_drawable(const Target& target) {
  if (!formats_drawable(target)) return false;
  Target bf16 = target;
  bf16.allreduce_dtype = DType::bf16;
  if (!gradient_allreduce_unsupported(bf16).empty()) return false;
  // A fixed world past the bf16 bound's reach (the drawn ones stop at 16, the scale class is the host
  // backends'): the cases draw float32 alone.
  return allreduce_bound_refusal(target, DType::bf16, fixed_world(target)).empty();
}

void validate_target(const Target& target, GradientAllreduce gradient) {
  const EngineRow& engine = *target.engine;
  require_same_engine(engine, *target.backend);
  (void)world_of_processes(*target.backend, target.process_world);
  if (target.tf32 && !engine.tf32)
    throw UsageError("--tf32 is for " + engines_with(&EngineRow::tf32) + "'s matrix products");
  if (target.tf32 && target.precision != Precision::fp32)
    throw UsageError("--tf32 and --precision " + std::string(precision_name(target.precision)) +
                     " both set the matrix products' input format: choose one");
  if (target.allreduce_dtype != DType::f32 && !engine.bf16_allreduce)
    throw UsageError("--allreduce-dtype bf16 runs on " + engines_with(&EngineRow::bf16_allreduce) + "; the " +
                     std::string(engine.name) + " engine's bf16 gradient all-reduce is not built yet");
  if (target.precision != Precision::fp32 && !engine.low_precision)
    throw UsageError("--precision " + std::string(precision_name(target.precision)) + " runs on " +
                     engines_with(&EngineRow::low_precision));
  if (target.precision != Precision::fp32 && !engine.low_precision_with_kernels && !target.kernels.empty())
    throw UsageError("--precision " + std::string(precision_name(target.precision)) + " and --kernels on the " +
                     std::string(engine.name) + " engine do not go together yet");
  if (!target.mutant.empty()) {
    const MutantTraits m = mutant_table().require(target.mutant);
    if (!m.engine.empty() && m.engine != engine.name)
      throw UsageError("mutant " + target.mutant + " breaks the " + std::string(m.engine) + " engine: add --engine " +
                       std::string(m.engine));
    if (!m.precision.empty() && m.precision != precision_name(target.precision))
      throw UsageError("mutant " + target.mutant + " breaks the " + std::string(m.precision) +
                       " path: add --precision " + std::string(m.precision));
  }
  if (target.world_size < 0) throw UsageError("world size must be at least 1");
  if (target.backend->simulated && target.world_size > SimulatedComm::max_world)
    throw UsageError("--world-size " + std::to_string(target.world_size) + ": a simulated world has at most " +
                     std::to_string(SimulatedComm::max_world) + " ranks (2^20)");
  if (engine.require) engine.require();
  if (!target.kernels.empty()) require_kernels_for_engine(load_kernel_plugin(target.kernels), engine);
  if (gradient == GradientAllreduce::required)
    if (const std::string why = gradient_allreduce_unsupported(target); !why.empty()) throw UsageError(why);
}

std::vector<std::size_t> comm_thresholds(const Target& target, int world_size) {
  const Backend& backend = *target.backend;
  return backend.thresholds ? backend.thresholds(world_size, target.process_world) : std::vector<std::size_t>{};
}

std::string launch_prefix(const Target& target) {
  return target.process_world ? target.backend->launch_prefix(target.process_world->size()) : std::string();
}

void run_world(const Target& target, int world_size, const std::function<void(Communicator&)>& fn) {
  const auto with_mutant = [&](Communicator& comm) {
    const MutantParts* broken = broken_parts(target);
    std::unique_ptr<Communicator> wrapped = broken && broken->communicator ? broken->communicator(comm) : nullptr;
    Communicator& inner = wrapped ? *wrapped : comm;
    std::unique_ptr<Communicator> faulty;
    if (target.fault && target.fault->phase == FaultPhase::all_reduce)
      faulty = fault_communicator(inner, *target.fault);
    fn(faulty ? *faulty : inner);
  };
  const Backend& backend = *target.backend;
  if (Communicator* world = world_of_processes(backend, target.process_world)) {
    if (world->size() != world_size)
      throw Error("a scenario asked for " + std::to_string(world_size) + " ranks but the launcher started " +
                  std::to_string(world->size()));
    world->set_timeout(target.timeout);
    return backend.run_processes(*world, with_mutant);
  }
  backend.run_threads(world_size, with_mutant, target.timeout);
}

namespace {

// What the target asks of its engine; the engine mutants' broken parts set here.
EngineSpec engine_spec(const Target& target) {
  EngineSpec spec;
  spec.precision = target.precision;
  spec.tf32 = target.tf32;
  spec.kernels = target.kernels;
  spec.timeout = target.timeout;
  if (const MutantParts* broken = broken_parts(target); broken && broken->engine_spec) broken->engine_spec(spec);
  return spec;
}

}  // namespace

std::unique_ptr<Engine> make_engine(const Target& target, const ModelConfig& model, int rank) {
  return target.engine->make_engine(model, engine_spec(target), rank);
}

std::unique_ptr<Optimizer> make_optimizer(const Target& target, const OptimizerConfig& config, std::size_t size,
                                          int rank, int world_size, void* stream) {
  const EngineRow& engine = *target.engine;
  const MutantParts* broken = broken_parts(target);
  OptimizerConfig c = config;
  if (broken && broken->optimizer_config) broken->optimizer_config(c, rank, world_size);
  std::unique_ptr<Optimizer> optimizer = engine.make_optimizer(c, size, stream, engine_spec(target), rank);
  // The optimizer mutants break a host engine's formula (the cuda engine's optimizer is kernels/optimizer.cu).
  if (broken && broken->optimizer && engine.memory == MemorySpace::host) return broken->optimizer(std::move(optimizer));
  return optimizer;
}

std::unique_ptr<DistributedSampler> make_sampler(const Target& target, const SamplerConfig& config) {
  if (const MutantParts* broken = broken_parts(target); broken && broken->sampler) return broken->sampler(config);
  return std::make_unique<DistributedSampler>(config);
}

std::unique_ptr<RankZeroWriter> make_writer(const Target& target, Communicator& comm,
                                            const std::filesystem::path& checkpoint_dir,
                                            const std::filesystem::path& log_path, int keep) {
  if (const MutantParts* broken = broken_parts(target); broken && broken->writer)
    return broken->writer(comm, checkpoint_dir, log_path, keep);
  return std::make_unique<RankZeroWriter>(comm, checkpoint_dir, log_path, keep);
}

// A bf16 all-reduce whose backend reduces in no known schedule may round each of its N - 1 additions
// and its average: N + 1 roundings of 2^-8, which past 64 ranks would leave the bound above a quarter
// of every gradient, checking nothing. A backend that adds in float32 in rank order and rounds once
// (dpcheck's own host backends) keeps the bound small at any N (reference/allreduce_schedule.hpp).
std::string allreduce_bound_refusal(const Target& target, DType dtype, int world) {
  if (dtype != DType::bf16 || world <= 64) return "";
  if (target.backend->rank_order) return "";
  return "--allreduce-dtype bf16 on " + std::to_string(world) + " ranks of --comm " + target.backend->name +
         ", which names no reduction schedule: its N + 1 roundings of 2^-8 would leave the bound above a quarter "
         "of every gradient; at most 64 ranks (dpcheck's own host backends round once, at any N)";
}

void require_allreduce_bound(const Target& target, const TrainConfig& config, int world) {
  if (std::string why = allreduce_bound_refusal(target, config.allreduce_dtype, world); !why.empty())
    throw UsageError(why);
}

RankTrainer make_rank_trainer(const Target& target, const TrainConfig& config, Communicator& comm,
                              const Dataset& data) {
  RankTrainer r;
  const int world = comm.size();
  config.validate(world);
  require_allreduce_bound(target, config, world);
  r.engine = make_engine(target, config.model, comm.rank());
  r.engine->load_params(init_params(config.model, config.seed));
  comm.set_stream(r.engine->stream());
  r.optimizer = make_optimizer(target, config.optimizer_for(world), r.engine->param_count(), comm.rank(), world,
                               r.engine->stream());
  r.sampler = make_sampler(target, config.sampler(world));
  // A planted fault's hooks take the place of the mutant's (an all-reduce fault has none: it wraps the
  // communicator).
  TrainerHooks hooks;
  if (target.fault && target.fault->phase != FaultPhase::all_reduce) hooks = fault_hooks(*target.fault);
  else if (const MutantParts* broken = broken_parts(target)) hooks = broken->trainer;
  r.trainer = std::make_unique<Trainer>(config, comm, *r.engine, *r.optimizer, *r.sampler, data, std::move(hooks));
  return r;
}

bool trace_digest_prefix(const Target& target) {
  const MutantParts* broken = broken_parts(target);
  return broken && broken->trace_digest_prefix;
}

nlohmann::json target_to_json(const TargetRecord& target) {
  return {{"engine", target.engine}, {"comm", target.comm}, {"kernels", target.kernels},
          {"mutant", target.mutant}, {"tf32", target.tf32}, {"precision", precision_name(target.precision)}};
}

TargetRecord target_from_json(const nlohmann::json& j, const std::string& where) {
  const auto get = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) throw UsageError("\"" + where + key + "\" is missing");
    return j.at(key);
  };
  const auto text = [&](const char* key) {
    const nlohmann::json& v = get(key);
    if (!v.is_string()) throw UsageError("\"" + where + key + "\" is " + v.dump() + ", not a string");
    return v.get<std::string>();
  };
  TargetRecord t;
  t.engine = text("engine");
  t.comm = text("comm");
  t.kernels = text("kernels");
  t.mutant = text("mutant");
  const nlohmann::json& tf32 = get("tf32");
  if (!tf32.is_boolean()) throw UsageError("\"" + where + "tf32\" is " + tf32.dump() + ", not true or false");
  t.tf32 = tf32.get<bool>();
  if (j.contains("precision")) {
    try {
      t.precision = parse_precision(text("precision"));
    } catch (const UsageError& e) {
      throw UsageError("\"" + where + "precision\": " + e.what());
    }
  }
  return t;
}

}  // namespace dpcheck
