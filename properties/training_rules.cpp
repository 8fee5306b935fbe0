// The trainer's stateful rules against references written without its code (reference/shuffle.hpp,
// reference/training_rules.hpp). Every other property compares dpcheck with itself -- rank with rank,
// a straight run with a resumed one -- so a wrong rule that every rank shares passes all of them:
//
//   loss_scaler_follows_gradscaler  drawn overflow patterns (a NaN planted in one rank's gradient at
//                                   drawn steps), growth intervals, factors, first scales near both
//                                   ends of the range and a resume at any step: after every step the
//                                   skip decision, the scale's bits, the count of good steps, the
//                                   skipped steps and the optimizer's step count are GradScaler's, and
//                                   a skipped step leaves parameters and optimizer state as they were
//   lr_schedule_follows_goyal       drawn warm-ups and linear scaling: every step's learning rate is
//                                   Goyal et al.'s, and an SGD step moves the parameters by it
//   shuffle_follows_recipe          every rank's share of drawn epochs, seeds of 64 bits and epochs far
//                                   from 0: the documented recipe's, element for element
#include <algorithm>
#include <bit>
#include <cmath>
#include <mutex>
#include <sstream>
#include <utility>

#include "mutants/mutants.hpp"
#include "properties/common.hpp"
#include "reference/shuffle.hpp"
#include "reference/training_rules.hpp"
#include "src/train/replica_check.hpp"

namespace dpcheck {

namespace {

// The rules do not depend on the model's size: small models keep a case to milliseconds.
ScenarioSpace small_space(const Target& target, const CaseDraw& draw, int min_steps, int max_steps) {
  ScenarioSpace space = space_for(target, draw);
  space.thresholds = nullptr;
  space.max_layers = 2;
  space.max_width = 8;
  space.max_batch = 24;
  space.min_steps = min_steps;
  space.max_steps = max_steps;
  return space;
}

std::string number(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  return os.str();
}

// Plants a NaN in one rank's local gradient at the drawn steps, as an overflowing example would leave
// it: the all-reduced gradient is then non-finite on every rank, and every rank must skip the step.
class PlantNaN final : public StepObserver {
 public:
  PlantNaN(const std::vector<bool>& steps, int rank, std::size_t element)
      : steps_(steps), rank_(rank), element_(element) {}
  void local_gradient(Trainer& t, std::int64_t step, double, std::int64_t) override {
    if (t.rank() != rank_ || step >= static_cast<std::int64_t>(steps_.size()) ||
        !steps_[static_cast<std::size_t>(step)])
      return;
    Engine& e = t.engine();
    Fault f;
    f.kind = FaultKind::nan;
    f.element = element_ % e.param_count();
    inject_fault(e.memory(), e.grads(), e.param_count(), f);
  }

 private:
  const std::vector<bool>& steps_;
  int rank_;
  std::size_t element_;
};

constexpr int kMaxScalerSteps = 10;

// One drawn case of the scaler property, printed whole when it fails.
struct ScalerCase {
  Scenario s;
  std::vector<bool> planted;  // the steps whose gradient gets a NaN
  int plant_rank = 0;
  std::size_t element = 0;
  int resume_at = 0;  // 0: straight through
};

void showValue(const ScalerCase& k, std::ostream& os) {
  os << k.s.describe() << " | NaN planted on rank " << k.plant_rank << " at steps {";
  const char* sep = "";
  for (int i = 0; i < k.s.train.steps; ++i)
    if (k.planted[static_cast<std::size_t>(i)]) os << std::exchange(sep, ", ") << i;
  os << "}";
  if (k.resume_at > 0) os << " | resumed at step " << k.resume_at;
}

rc::Gen<ScalerCase> gen_scaler_case(const Target& target, const CaseDraw& draw) {
  // By value: RapidCheck runs the generator again to print a counterexample, after the case's target
  // (a per-case copy when formats are drawn) is gone.
  return rc::gen::exec([target, draw] {
    ScenarioSpace space = small_space(target, draw, 3, kMaxScalerSteps);
    space.loss_scaling.kind = LossScaling::dynamic;
    ScalerCase k;
    k.s = *gen_scenario(space);
    LossScalerConfig& ls = k.s.train.loss_scaling;
    ls.growth_interval = *uniform(rc::gen::inRange<std::int64_t>(1, 5));
    // GradScaler's first scale, one near each end of dpcheck's range (so that the clamps are reached),
    // and the identity.
    ls.init_scale = *rc::gen::element(65536.0, 0x1p62, 0x1p-23, 1.0);
    ls.growth_factor = *rc::gen::element(2.0, 4.0);
    ls.backoff_factor = *rc::gen::element(0.5, 0.25);
    k.planted.resize(kMaxScalerSteps);
    for (std::size_t i = 0; i < k.planted.size(); ++i) k.planted[i] = *uniform(rc::gen::inRange(0, 3)) == 2;
    k.plant_rank = *uniform(rc::gen::inRange(0, k.s.world_size));
    k.element = *uniform(rc::gen::inRange<std::size_t>(0, 1u << 20));
    k.resume_at = *uniform(rc::gen::inRange(0, k.s.train.steps));
    return k;
  });
}

}  // namespace

void loss_scaler_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  const ScalerCase k = *gen_scaler_case(target, draw);
  const Scenario& s = k.s;
  const LossScalerConfig& ls = s.train.loss_scaling;
  const std::vector<bool>& planted = k.planted;
  const int plant_rank = k.plant_rank;
  const std::size_t element = k.element;
  const int resume_at = k.resume_at;
  record.size = size_of(s);
  const TrainConfig& c = s.train;
  int planted_steps = 0;
  for (int i = 0; i < c.steps; ++i) planted_steps += planted[static_cast<std::size_t>(i)] ? 1 : 0;
  RC_CLASSIFY(planted_steps > 0 && planted_steps < c.steps, "both overflowing and good steps");
  RC_CLASSIFY(resume_at > 0, "resumed from a checkpoint");

  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  const std::filesystem::path dir = make_scratch(target, "scaler");
  std::string failure;
  std::mutex mu;
  try {
    run_world(target, s.world_size, [&](Communicator& comm) {
      PlantNaN plant(planted, plant_rank, element);
      auto rt = std::make_unique<RankTrainer>(make_rank_trainer(target, c, comm, data));
      rt->trainer->set_observer(&plant);
      reference::GradScalerModel ref;
      ref.scale = static_cast<float>(ls.init_scale);
      ref.growth_factor = static_cast<float>(ls.growth_factor);
      ref.backoff_factor = static_cast<float>(ls.backoff_factor);
      ref.growth_interval = ls.growth_interval;
      const std::size_t n = rt->engine->param_count();
      std::vector<float> before(n), after(n), state_before, state_after;
      std::string mine;
      // Every rank runs every step whatever it finds, so that no rank leaves the others waiting in a
      // collective; the first finding is the rank's verdict.
      for (int step = 0; step < c.steps; ++step) {
        if (resume_at > 0 && step == resume_at) {
          make_writer(target, comm, dir, {})->save(rt->trainer->checkpoint(), c.model);
          rt = std::make_unique<RankTrainer>(make_rank_trainer(target, c, comm, data));
          rt->trainer->restore(load_checkpoint(dir, c.model));
          rt->trainer->set_observer(&plant);
        }
        rt->engine->store_params(before);
        state_before.resize(rt->optimizer->state_size());
        rt->optimizer->store_state(state_before);
        const StepResult r = rt->trainer->step();
        const bool nan_planted = planted[static_cast<std::size_t>(step)];
        std::ostringstream at;
        at << "rank " << comm.rank() << ", step " << step << (nan_planted ? " (a NaN planted on rank " : "")
           << (nan_planted ? std::to_string(plant_rank) + ")" : "") << ", growth interval " << ls.growth_interval
           << (resume_at > 0 ? ", resumed at step " + std::to_string(resume_at) : "") << ": ";
        // A planted NaN must be skipped. Only float32 products are sure not to overflow by themselves; in
        // fp16 a step may also overflow at a large scale, and the rule is then judged on what happened.
        std::string why;
        if (nan_planted && !r.skipped)
          why = at.str() + "the step was taken although its all-reduced gradient held a NaN";
        if (!nan_planted && r.skipped && target.precision == Precision::fp32)
          why = at.str() + "the step was skipped although no gradient held an infinity or a NaN";
        ref.after_step(r.skipped);
        const LossScalerState& got = rt->trainer->scaler().state();
        rt->engine->store_params(after);
        state_after.resize(rt->optimizer->state_size());
        rt->optimizer->store_state(state_after);
        if (!why.empty()) {
        } else if (std::bit_cast<std::uint32_t>(got.scale) != std::bit_cast<std::uint32_t>(ref.scale))
          why = at.str() + "the scale is " + float_bits_text(got.scale) + ", GradScaler's rule gives " +
                float_bits_text(ref.scale);
        else if (r.loss_scale != ref.scale)
          why = at.str() + "the step reports the scale " + float_bits_text(r.loss_scale) + ", the scaler holds " +
                float_bits_text(ref.scale);
        else if (got.growth_tracker != ref.good_steps)
          why = at.str() + "the scaler counts " + std::to_string(got.growth_tracker) +
                " good steps since the scale last changed, GradScaler's rule " + std::to_string(ref.good_steps);
        else if (got.skipped != ref.skipped)
          why = at.str() + "the scaler counts " + std::to_string(got.skipped) + " skipped steps, not " +
                std::to_string(ref.skipped);
        else if (rt->optimizer->steps() != ref.optimizer_steps)
          why = at.str() + "the optimizer counts " + std::to_string(rt->optimizer->steps()) + " steps, but " +
                std::to_string(ref.optimizer_steps) + " were taken";
        else if (r.skipped && (!std::equal(before.begin(), before.end(), after.begin(), [](float a, float b) {
                   return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
                 }) || state_before != state_after))
          why = at.str() + "a skipped step changed the parameters or the optimizer state";
        if (mine.empty()) mine = why;
      }
      const std::lock_guard<std::mutex> lock(mu);
      if (failure.empty()) failure = mine;
    });
  } catch (...) {
    remove_scratch(target, dir);
    throw;
  }
  remove_scratch(target, dir);
  if (!agree(target, failure.empty()))
    fail_case(failure.empty() ? "another rank's scaler broke GradScaler's rule" : failure);
}

void lr_schedule_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  const Scenario s = *rc::gen::exec([target, draw] {  // by value, as gen_scaler_case
    Scenario d = *gen_scenario(small_space(target, draw, 2, 8));
    d.train.linear_scaling = *rc::gen::element(true, false);
    const std::int64_t warmup = *uniform(rc::gen::inRange<std::int64_t>(0, 7));
    d.train.warmup_steps = d.train.linear_scaling ? warmup : 0;  // a warm-up ramps towards the linearly scaled rate
    return d;
  });
  const TrainConfig& c = s.train;
  record.size = size_of(s);
  RC_CLASSIFY(c.warmup_steps > 0 && c.warmup_steps < c.steps, "the warm-up ends within the run");
  RC_CLASSIFY(c.linear_scaling && c.warmup_steps == 0, "linear scaling without a warm-up");

  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  std::string failure;
  std::mutex mu;
  run_world(target, s.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    const std::size_t n = rt.engine->param_count();
    std::vector<float> before(n), after(n), grads(n);
    std::string mine;
    for (int step = 0; step < c.steps; ++step) {  // every step on every rank: none left waiting
      rt.engine->store_params(before);
      const StepResult r = rt.trainer->step();
      const double want = reference::goyal_lr(c.optimizer.lr, c.linear_scaling, c.warmup_steps, step, comm.size());
      const double got = rt.optimizer->config().lr;
      const std::string at = "rank " + std::to_string(comm.rank()) + ", step " + std::to_string(step) + " of a " +
                             (c.warmup_steps > 0 ? std::to_string(c.warmup_steps) + "-step warm-up" : "run") +
                             (c.linear_scaling ? " with linear scaling" : "") + " on " + std::to_string(comm.size()) +
                             " ranks: ";
      // Two formulas of the same rate round differently in float64: a few ulps apart at most.
      if (!mine.empty()) continue;
      if (!(std::abs(got - want) <= 8 * 0x1p-53 * std::abs(want))) {
        mine = at + "the learning rate is " + number(got) + ", Goyal et al.'s rule gives " + number(want);
        continue;
      }
      if (c.optimizer.kind != OptimizerKind::sgd || r.skipped) continue;
      // And the step used it: SGD moves every parameter by lr x gradient, within float32 rounding.
      rt.engine->store_params(after);
      rt.engine->store_grads(grads);
      for (std::size_t i = 0; i < n; ++i) {
        const double expected = static_cast<double>(before[i]) - want * static_cast<double>(grads[i]);
        const double tolerance =
            0x1p-22 * (std::abs(static_cast<double>(before[i])) + std::abs(want * grads[i])) + 0x1p-140;
        if (std::abs(static_cast<double>(after[i]) - expected) > tolerance) {
          mine = at + "SGD moved parameter " + ParamLayout(c.model).describe_element(i) + " from " +
                 float_bits_text(before[i]) + " to " + float_bits_text(after[i]) + ", a rate of " + number(want) +
                 " gives " + number(expected);
          break;
        }
      }
    }
    const std::lock_guard<std::mutex> lock(mu);
    if (failure.empty()) failure = mine;
  });
  if (!agree(target, failure.empty()))
    fail_case(failure.empty() ? "another rank's learning rate broke the rule" : failure);
}

namespace {

struct ShuffleCase {
  SamplerScenario s;
  std::int64_t far_epoch = 0;
};

void showValue(const ShuffleCase& k, std::ostream& os) { os << k.s.describe() << ", and epoch " << k.far_epoch; }

}  // namespace

void shuffle_body(const Target& target, const CaseDraw& /*draw*/, CaseRecord& record) {
  const int world = fixed_world(target);
  const ShuffleCase k = *rc::gen::exec([world] {
    ShuffleCase c;
    c.s = *gen_sampler_scenario(world);
    // The whole seed, and one epoch far from the first: a recipe followed only for small seeds and
    // epochs (a key cut to 32 bits) is not the recipe.
    c.s.sampler.seed = *uniform(rc::gen::arbitrary<std::uint64_t>());
    c.far_epoch = *uniform(rc::gen::inRange<std::int64_t>(0, std::int64_t{1} << 40));
    return c;
  });
  const SamplerScenario& s = k.s;
  const std::int64_t far_epoch = k.far_epoch;
  record.size = {s.sampler.dataset_size, s.sampler.world_size, 0, 0};
  RC_CLASSIFY(s.sampler.shuffle, "shuffled");
  std::string failure;
  std::mutex mu;
  run_world(target, s.sampler.world_size, [&](Communicator& comm) {
    const std::unique_ptr<DistributedSampler> sampler = make_sampler(target, s.sampler);
    std::vector<std::int64_t> epochs;
    for (int e = 0; e < s.epochs; ++e) epochs.push_back(e);
    epochs.push_back(far_epoch);
    std::string mine;
    for (const std::int64_t epoch : epochs) {
      const std::vector<std::vector<std::int64_t>> recipe = reference::epoch_shares(s.sampler, epoch);
      for (const int rank : ranks_played(comm)) {
        const std::vector<std::int64_t> got = sampler->indices(rank, epoch);
        const std::vector<std::int64_t>& want = recipe[static_cast<std::size_t>(rank)];
        const auto diff = std::mismatch(got.begin(), got.end(), want.begin(), want.end());
        if (diff.first == got.end() && diff.second == want.end()) continue;
        const auto pos = std::to_string(diff.first - got.begin());
        mine = "epoch " + std::to_string(epoch) + ", rank " + std::to_string(rank) + ": ";
        if (diff.first == got.end() || diff.second == want.end())
          mine += "the share holds " + std::to_string(got.size()) + " examples, the recipe's " +
                  std::to_string(want.size());
        else
          mine += "position " + pos + " of the share holds example " + std::to_string(*diff.first) +
                  ", the recipe gives " + std::to_string(*diff.second);
        break;
      }
      if (!mine.empty()) break;
    }
    const std::lock_guard<std::mutex> lock(mu);
    if (failure.empty()) failure = mine;
  });
  if (!agree(target, failure.empty()))
    fail_case(failure.empty() ? "another rank's share is not the recipe's" : failure);
}

}  // namespace dpcheck
