#include "properties/target.hpp"

#include "properties/mutants.hpp"
#include "src/error.hpp"
#include "src/local_comm.hpp"

namespace dpcheck {

std::string Target::describe() const {
  return "engine " + engine + ", comm " + comm + ", mutant " + (mutant.empty() ? "none" : mutant);
}

void validate_target(const Target& target) {
  if (target.engine != "cpu")
    throw UsageError("unknown engine '" + target.engine + "' (this build has: cpu)");
  if (target.comm != "local" && !(target.comm == "mpi" && target.process_world))
    throw UsageError("unknown communicator '" + target.comm + "' (this build has: local)");
  require_known_mutant(target.mutant);
  if (target.world_size < 0) throw UsageError("world size must be at least 1");
}

void run_world(const Target& target, int world_size, const std::function<void(Communicator&)>& fn) {
  const auto with_mutant = [&](Communicator& comm) {
    std::unique_ptr<Communicator> wrapped = mutant_communicator(target.mutant, comm);
    fn(wrapped ? *wrapped : comm);
  };
  if (target.process_world) {
    if (target.process_world->size() != world_size)
      throw Error("a scenario asked for " + std::to_string(world_size) + " ranks but the launcher started " +
                  std::to_string(target.process_world->size()));
    target.process_world->set_timeout(target.timeout);
    with_mutant(*target.process_world);
    return;
  }
  run_local(world_size, with_mutant, target.timeout);
}

std::unique_ptr<Engine> make_engine(const Target& target, const ModelConfig& model) {
  if (target.engine == "cpu") return make_cpu_engine(model);
  throw UsageError("unknown engine '" + target.engine + "'");
}

std::unique_ptr<Optimizer> make_optimizer(const Target& target, const OptimizerConfig& config, std::size_t size,
                                          int rank, int world_size) {
  const OptimizerConfig c = mutant_optimizer_config(target.mutant, config, rank, world_size);
  if (target.engine == "cpu") return make_cpu_optimizer(c, size);
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
  r.engine = make_engine(target, config.model);
  r.engine->load_params(init_params(config.model, config.seed));
  r.optimizer = make_optimizer(target, config.optimizer_for(world), r.engine->param_count(), comm.rank(), world);
  r.sampler = make_sampler(target, config.sampler(world));
  r.trainer = mutant_trainer(target.mutant, config, comm, *r.engine, *r.optimizer, *r.sampler, data);
  if (!r.trainer) r.trainer = std::make_unique<Trainer>(config, comm, *r.engine, *r.optimizer, *r.sampler, data);
  return r;
}

}  // namespace dpcheck
