// What the property files share (properties/common.hpp).
#include "properties/common.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <system_error>

#include "mutants/mutants.hpp"
#include "src/comm/local_comm.hpp"
#include "src/error.hpp"

namespace dpcheck {

std::vector<int> ranks_played(Communicator& comm) {
  if (!comm.simulated()) return {comm.rank()};
  std::vector<int> all(static_cast<std::size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) all[static_cast<std::size_t>(r)] = r;
  return all;
}

ScenarioSpace space_for(const Target& target, const CaseDraw& draw) {
  ScenarioSpace s;
  s.world_size = target.world_size;
  s.thresholds = [target](int world) { return comm_thresholds(target, world); };
  s.allreduce_dtype = target.allreduce_dtype;
  s.dims = draw.model_dims;
  if (draw.thorough) {
    s.max_world_size = 16;
    s.max_layers = 5;
    s.max_steps = 12;
  }
  if (target.precision == Precision::fp16) {
    s.loss_scaling.kind = LossScaling::dynamic;
    s.loss_scaling.growth_interval = 2;
  }
  return s;
}

CaseRecord::Size size_of(const Scenario& s) {
  return {s.train.data_size(), s.world_size, s.train.model.layers(),
          *std::max_element(s.train.model.dims.begin(), s.train.model.dims.end())};
}

int scale_one_in(const Target& target) {
  if (target.world_size > 0 || target.process_world) return 0;
  // The engine's own communicator, or its simulated ranks, which sum as it does.
  if (!simulated_backend(*target.engine) || !(target.backend->engine_default || target.backend->simulated)) return 0;
  const MutantInfo* m = find_mutant(target.mutant);
  return m && m->scale ? 2 : 16;
}

void add_scale_class(ScenarioSpace& space, const Target& target) {
  space.scale_one_in = scale_one_in(target);
  if (space.scale_one_in > 0) space.scale_worlds = scale_class_worlds();
}

Target target_for_case(const Target& target, bool simulated) {
  if (!simulated || target.backend->simulated) return target;
  Target t = target;
  t.backend = simulated_backend(*target.engine);
  if (!t.backend) throw Error("the " + std::string(target.engine->name) + " engine has no simulated ranks");
  return t;
}

void step_check_body(const Target& target, const CaseDraw& draw, CaseRecord& record,
                     StepOutcome (*check)(const Scenario& scenario, const Target& target), const char* elsewhere,
                     void (*classify)(const Scenario& scenario), bool scale) {
  ScenarioSpace space = space_for(target, draw);
  if (scale) add_scale_class(space, target);
  const Scenario s = *gen_scenario(space);
  record.size = size_of(s);
  const StepOutcome o = check(s, target_for_case(target, s.simulated));
  RC_CLASSIFY(s.simulated, "the scale class: " + std::to_string(s.world_size) + " simulated ranks");
  record.ratio = o.ratio;
  record.note = o.note;
  if (classify) classify(s);
  if (!agree(target, o.passed)) fail_case(o.message.empty() ? elsewhere : o.message);
}

std::filesystem::path make_scratch(const Target& target, const std::string& what, bool in_memory) {
  static std::atomic<unsigned> counter{0};
  std::int64_t id[2] = {static_cast<std::int64_t>(::getpid()), static_cast<std::int64_t>(counter++)};
  if (target.process_world) target.process_world->broadcast(id, 2, DType::i64, 0);
  // Durability is tested elsewhere (tests/writer_test.cpp); here memory-backed /dev/shm spares the
  // fsyncs of hundreds of checkpoints.
  std::error_code ec;
  const std::filesystem::path base =
      in_memory && std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
          ? std::filesystem::path("/dev/shm")
          : std::filesystem::temp_directory_path();
  const std::filesystem::path dir =
      base / ("dpcheck-" + what + "-" + std::to_string(id[0]) + "-" + std::to_string(id[1]));
  if (!target.process_world || target.process_world->rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  if (target.process_world) target.process_world->barrier();
  return dir;
}

void remove_scratch(const Target& target, const std::filesystem::path& dir) {
  if (target.process_world) target.process_world->barrier();
  if (!target.process_world || target.process_world->rank() == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

}  // namespace dpcheck
