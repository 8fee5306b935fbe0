#include "properties/scenario.hpp"

#include <ostream>
#include <sstream>

namespace dpcheck {

namespace {

std::string lr_string(double lr) {
  std::ostringstream os;
  os << lr;
  return os.str();
}

}  // namespace

std::string Scenario::describe() const {
  const TrainConfig& t = train;
  std::ostringstream os;
  os << "model " << dims_string(t.model.dims) << " " << activation_name(t.model.activation) << " "
     << loss_name(t.model.loss) << " | batch " << t.batch << " | world " << world_size << " "
     << split_name(t.split) << " " << policy_name(t.policy) << (t.shuffle ? " shuffled" : " in order") << " | "
     << optimizer_name(t.optimizer.kind) << " lr " << lr_string(t.optimizer.lr) << " | " << t.steps
     << (t.steps == 1 ? " step" : " steps") << ", accumulate " << t.accumulate << " | seed " << t.seed;
  return os.str();
}

std::string Scenario::train_flags() const {
  const TrainConfig& t = train;
  std::ostringstream os;
  os << "--model " << dims_string(t.model.dims) << " --activation " << activation_name(t.model.activation)
     << " --loss " << loss_name(t.model.loss) << " --batch " << t.batch << " --world-size " << world_size
     << " --split " << split_name(t.split) << " --policy " << policy_name(t.policy)
     << (t.shuffle ? "" : " --no-shuffle") << " --optimizer " << optimizer_name(t.optimizer.kind) << " --lr "
     << lr_string(t.optimizer.lr) << " --steps " << t.steps << " --accumulate " << t.accumulate << " --seed "
     << t.seed;
  return os.str();
}

void showValue(const Scenario& s, std::ostream& os) { os << s.describe(); }

rc::Gen<Scenario> gen_scenario(const ScenarioSpace& space) {
  return rc::gen::exec([space] {
    Scenario s;
    TrainConfig& t = s.train;
    const int layers = *rc::gen::inRange(1, space.max_layers + 1);
    t.model.dims.clear();
    for (int l = 0; l <= layers; ++l) t.model.dims.push_back(*rc::gen::inRange(1, space.max_width + 1));
    t.model.activation = *rc::gen::element(Activation::relu, Activation::tanh, Activation::identity);
    t.model.loss = *rc::gen::element(Loss::mse, Loss::cross_entropy);

    s.world_size = space.world_size > 0 ? space.world_size
                                        : *rc::gen::inRange(space.min_world_size, space.max_world_size + 1);
    const std::int64_t n = s.world_size;
    if (space.uneven_only) {
      t.policy = Policy::uneven;
      if (n > 1) {
        // B = q N + r with 0 < r < N, so shares differ in size.
        const std::int64_t q = *rc::gen::inRange<std::int64_t>(0, std::max<std::int64_t>(1, space.max_batch / n));
        const std::int64_t r = *rc::gen::inRange<std::int64_t>(1, n);
        t.batch = q * n + r;
      } else {
        t.batch = *rc::gen::inRange<std::int64_t>(1, space.max_batch + 1);
      }
    } else {
      t.policy = *rc::gen::element(Policy::uneven, Policy::pad, Policy::drop_last);
      // drop-last needs an example per rank.
      const std::int64_t least = t.policy == Policy::drop_last ? n : 1;
      t.batch = *rc::gen::inRange<std::int64_t>(least, std::max(least, space.max_batch) + 1);
    }
    t.split = *rc::gen::element(Split::strided, Split::contiguous);
    t.shuffle = *rc::gen::element(false, true);
    t.optimizer.kind = *rc::gen::element(OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::adam);
    t.optimizer.lr = *rc::gen::element(0.1, 0.01, 0.001);
    t.steps = *rc::gen::inRange(space.min_steps, std::max(space.min_steps, 4) + 1);
    t.accumulate = space.accumulate ? *rc::gen::inRange(2, 5) : 1;
    t.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
    return s;
  });
}

std::string SamplerScenario::describe() const {
  std::ostringstream os;
  os << "data " << sampler.dataset_size << " | world " << sampler.world_size << " " << split_name(sampler.split)
     << " " << policy_name(sampler.policy) << (sampler.shuffle ? " shuffled" : " in order") << " | seed "
     << sampler.seed << " | " << epochs << (epochs == 1 ? " epoch" : " epochs");
  return os.str();
}

void showValue(const SamplerScenario& s, std::ostream& os) { os << s.describe(); }

rc::Gen<SamplerScenario> gen_sampler_scenario(int fixed_world_size, int max_world_size) {
  return rc::gen::exec([fixed_world_size, max_world_size] {
    SamplerScenario s;
    s.sampler.dataset_size = *rc::gen::inRange<std::int64_t>(0, 1001);
    s.sampler.world_size = fixed_world_size > 0 ? fixed_world_size : *rc::gen::inRange(1, max_world_size + 1);
    s.sampler.split = *rc::gen::element(Split::strided, Split::contiguous);
    s.sampler.policy = *rc::gen::element(Policy::uneven, Policy::pad, Policy::drop_last);
    s.sampler.shuffle = *rc::gen::element(false, true);
    s.sampler.seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
    s.epochs = *rc::gen::inRange(1, 4);
    return s;
  });
}

}  // namespace dpcheck
