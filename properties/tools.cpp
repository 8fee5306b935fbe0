// The divergence tools held to a property: two runs identical but for one planted difference, at a
// drawn phase (the examples, the local gradient, the all-reduce's output, the parameters after the
// update, the optimizer state), step, rank and element -- often the last element of a tensor or of the
// index list, where a digest that covers a prefix stops looking. Each case checks that
//
//   - `dpcheck diff` of the two traces names that step, phase, rank and tensor (or index list) as the
//     first difference, and the .npy diff of the planted buffer names that element and no other;
//   - a repro bundle of a NaN planted in a local gradient replays as "reproduced" when the replay
//     plants the same fault, and not when it plants it in another rank or element, or plants a bug of
//     another kind at the same place;
//   - `dpcheck drift` of two correct runs on different world sizes calls their difference rounding,
//     and with a bug planted in either run names that run, step, rank and element;
//   - a correct run in the case's formats (drawn where verify draws them: bf16 or fp16 products, a bf16
//     all-reduce, fp16's dynamic loss scaler) passes train's live checks, the gradient held to its
//     sharded bound at every step, and a bundle of it reads back whole (target and configuration) and
//     replays on what it read, as `dpcheck replay` does;
//   - in one case of scale_one_in (the scale class's share), a NaN planted in one rank's local gradient
//     on 63 to 4096 simulated ranks is found by the live finite check on that rank.
//
// diff runs in float32, where a flipped low bit stays where it was planted; drift runs in the case's
// formats, where a bug-sized change outlives every rounding and the runs' rounding is the format's. The tools' own
// mutants (trace-digest-prefix, replay-same-place-ignores-element, drift-judges-update-only,
// bundle-precision-not-read-back, live-gradient-whole-batch-bound, live-finite-simulated-rank0) are
// caught here.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <mutex>
#include <ostream>
#include <sstream>

#include "divergence/diff.hpp"
#include "divergence/divergence.hpp"
#include "divergence/trace.hpp"
#include "mutants/mutants.hpp"
#include "properties/common.hpp"
#include "reference/schedule.hpp"
#include "src/io/npy.hpp"
#include "src/train/writer.hpp"

namespace dpcheck {

namespace {

namespace fs = std::filesystem;

// How the replay's fault differs from the recorded one.
enum class ReplayChange { none, rank, element, kind };
constexpr const char* kChangeNames[] = {"the same fault", "another rank", "another element", "another kind"};

struct ToolsCase {
  Scenario s;
  Fault plant;     // the traces' one difference
  Fault recorded;  // a NaN in a local gradient, which --check-finite fails on: the bundle's failure
  ReplayChange change = ReplayChange::none;
  Fault replayed;      // what the replay plants
  int world_b = 1;     // drift's second run: another world size, so that the two differ by rounding
  int drift_bug = -1;  // the run (0, 1) with a bug planted in its local gradient, or -1
  Fault bug;
  // In one case of scale_one_in: a scenario of the scale class, on simulated ranks, with a NaN planted in
  // one rank's local gradient, which train's live finite check must find on that rank.
  bool simulated = false;
  Scenario sim;
  Fault sim_nan;
};

void showValue(const ToolsCase& k, std::ostream& os) {
  os << k.s.describe() << "\n  planted: " << k.plant.describe() << "\n  bundle: " << k.recorded.describe()
     << ", replayed with " << kChangeNames[static_cast<int>(k.change)] << ": " << k.replayed.describe()
     << "\n  drift: runs on " << k.s.world_size << " and " << k.world_b << " ranks, "
     << (k.drift_bug < 0 ? std::string("no bug")
                         : "run " + std::string(k.drift_bug == 0 ? "A" : "B") + " with " + k.bug.describe());
  if (k.simulated) os << "\n  simulated: " << k.sim.describe() << ", " << k.sim_nan.describe();
}

// An element of a buffer of n elements: anywhere, the last of a drawn tensor, or the very last.
rc::Gen<std::size_t> gen_element(const ParamLayout& layout, std::size_t n) {
  const std::size_t blocks = n / layout.size();
  return rc::gen::exec([layout, n, blocks] {
    switch (*uniform(rc::gen::inRange(0, 3))) {
      case 0: return *uniform(rc::gen::inRange<std::size_t>(0, n));
      case 1: {
        const Slice& t = layout.slices()[*uniform(rc::gen::inRange<std::size_t>(0, layout.slices().size()))];
        const std::size_t block = *uniform(rc::gen::inRange<std::size_t>(0, blocks));
        return block * layout.size() + t.offset + t.size() - 1;
      }
      default: return n - 1;
    }
  });
}

rc::Gen<ToolsCase> gen_tools_case(const Target& target, const CaseDraw& draw) {
  ScenarioSpace space = space_for(target, draw);
  space.thresholds = nullptr;
  space.max_world_size = 4;
  space.max_layers = 2;
  space.max_width = 8;
  space.max_batch = 24;
  space.max_steps = 3;
  ScenarioSpace sim_space = space_for(target, draw);
  sim_space.thresholds = nullptr;
  sim_space.scale_worlds = scale_class_worlds();
  sim_space.scale_one_in = 1;
  sim_space.loss_scaling = LossScalerConfig{};
  sim_space.allreduce_dtype = DType::f32;
  const int one_in = scale_one_in(target);
  return rc::gen::exec([space, sim_space, one_in] {
    ToolsCase k;
    k.s = *gen_scenario(space);
    const TrainConfig& c = k.s.train;
    const ParamLayout layout(c.model);
    const std::size_t n = layout.size();
    const std::size_t state_blocks = make_cpu_optimizer(c.optimizer, 0)->state_names().size();
    const int world = k.s.world_size;

    Fault& p = k.plant;
    p.phase = static_cast<FaultPhase>(*uniform(rc::gen::inRange(0, 5)));
    if (p.phase == FaultPhase::optimizer_state && state_blocks == 0) p.phase = FaultPhase::update;
    if (p.phase == FaultPhase::data && c.data_size() < 2) p.phase = FaultPhase::local_gradient;  // no other example
    p.step = *uniform(rc::gen::inRange<std::int64_t>(0, c.steps));
    // A data fault goes where the step has examples.
    std::vector<int> ranks;
    const reference::StepExamples ex = reference::step_examples(c, DistributedSampler(c.sampler(world)), p.step);
    for (int r = 0; r < world; ++r)
      if (p.phase != FaultPhase::data || !ex.ranks[static_cast<std::size_t>(r)].empty()) ranks.push_back(r);
    if (ranks.empty()) p.phase = FaultPhase::local_gradient, ranks = {0};
    p.rank = ranks[*uniform(rc::gen::inRange<std::size_t>(0, ranks.size()))];
    if (p.phase == FaultPhase::data) {
      const std::size_t examples = ex.ranks[static_cast<std::size_t>(p.rank)].size();
      p.element = *rc::gen::weightedOneOf<std::size_t>(
          {{1, uniform(rc::gen::inRange<std::size_t>(0, examples))}, {1, rc::gen::just(examples - 1)}});
    } else {
      p.element = *gen_element(layout, p.phase == FaultPhase::optimizer_state ? state_blocks * n : n);
    }
    p.kind = FaultKind::flip_low_bit;

    Fault& f = k.recorded;
    f.phase = FaultPhase::local_gradient;
    f.kind = FaultKind::nan;
    f.step = p.step;
    f.rank = *uniform(rc::gen::inRange(0, world));
    f.element = *gen_element(layout, n);
    k.change = static_cast<ReplayChange>(*uniform(rc::gen::inRange(0, 4)));
    if (k.change == ReplayChange::rank && world == 1) k.change = ReplayChange::element;
    if (k.change == ReplayChange::element && n == 1) k.change = ReplayChange::kind;
    k.replayed = f;
    switch (k.change) {
      case ReplayChange::none: break;
      case ReplayChange::rank: k.replayed.rank = (f.rank + *uniform(rc::gen::inRange(1, world))) % world; break;
      case ReplayChange::element: {
        // Within the same tensor where it has another element: the same tensor's name, another index.
        const Slice& t = layout.slice_at(f.element);
        const std::size_t other =
            t.size() > 1
                ? t.offset + (f.element - t.offset + *uniform(rc::gen::inRange<std::size_t>(1, t.size()))) % t.size()
                : (f.element + 1) % n;
        k.replayed.element = other;
        break;
      }
      case ReplayChange::kind: k.replayed.kind = FaultKind::bug; break;
    }

    // Drift: the second run on another world size, when the target draws them.
    k.world_b = space.world_size > 0 ? world : (world % 4) + 1;
    try {
      c.validate(k.world_b);
    } catch (const UsageError&) {
      k.world_b = world;
    }
    k.drift_bug = *uniform(rc::gen::inRange(-1, 2));
    k.bug.phase = FaultPhase::local_gradient;
    k.bug.kind = FaultKind::bug;
    k.bug.step = f.step;
    k.bug.rank = std::min(f.rank, (k.drift_bug == 1 ? k.world_b : world) - 1);
    k.bug.element = f.element;

    k.simulated = one_in > 0 && *uniform(rc::gen::inRange(0, one_in)) == 0;
    if (k.simulated) {
      k.sim = *gen_scenario(sim_space);
      k.sim_nan.phase = FaultPhase::local_gradient;
      k.sim_nan.kind = FaultKind::nan;
      k.sim_nan.step = *uniform(rc::gen::inRange<std::int64_t>(0, k.sim.train.steps));
      k.sim_nan.rank = *uniform(rc::gen::inRange(0, k.sim.world_size));
      const ParamLayout sim_layout(k.sim.train.model);
      k.sim_nan.element = *gen_element(sim_layout, sim_layout.size());
    }
    return k;
  });
}

// Captures one rank's planted buffer at one step: the buffer the fault went into, as it is after it.
class PlantedBuffer final : public StepObserver {
 public:
  explicit PlantedBuffer(const Fault& plant) : plant_(plant) {}
  void local_gradient(Trainer& t, std::int64_t step, double, std::int64_t) override {
    if (here(t, step, FaultPhase::local_gradient)) grab_grads(t);
  }
  void reduced_gradient(Trainer& t, std::int64_t step) override {
    if (here(t, step, FaultPhase::all_reduce)) grab_grads(t);
  }
  void updated(Trainer& t, std::int64_t step) override {
    if (here(t, step, FaultPhase::update)) {
      values.resize(t.engine().param_count());
      t.engine().store_params(values);
    }
    if (here(t, step, FaultPhase::optimizer_state)) {
      values.resize(t.optimizer().state_size());
      t.optimizer().store_state(values);
    }
  }
  std::vector<float> values;

 private:
  bool here(const Trainer& t, std::int64_t step, FaultPhase phase) const {
    return t.rank() == plant_.rank && step == plant_.step && phase == plant_.phase;
  }
  void grab_grads(Trainer& t) {
    values.resize(t.engine().param_count());
    t.engine().store_grads(values);
  }
  Fault plant_;
};

// Trains the scenario with the recorder on, and the fault when given; writes the trace to `file`
// (rank 0), and returns the planted buffer of the plant's rank and step.
std::vector<float> traced_run(const Target& target, const Scenario& s, const Fault& plant, bool planted,
                              const fs::path& file) {
  Target t = target;
  if (planted) t.fault = plant;
  const SyntheticDataset data(s.train.data_size(), s.train.model, s.train.seed);
  const std::vector<std::string> state_names = make_cpu_optimizer(s.train.optimizer, 0)->state_names();
  std::vector<std::string> lines;
  std::vector<float> buffer;
  std::mutex mu;
  run_world(t, s.world_size, [&](Communicator& world_comm) {
    TraceRecorder recorder(s.train.model, state_names);
    recorder.set_digest_prefix(trace_digest_prefix(t));
    PlantedBuffer grab(plant);
    StepObservers chain;
    chain.add(&recorder);
    chain.add(&grab);
    // The recorder sees what the trainer sends and receives: the fault's result included.
    TracingCommunicator comm(world_comm, recorder);
    RankTrainer rt = make_rank_trainer(t, s.train, comm, data);
    rt.trainer->set_observer(&chain);
    std::vector<std::string> mine;
    while (rt.trainer->next_step() < s.train.steps) {
      const StepResult r = rt.trainer->step();
      const nlohmann::json line = recorder.finish_step(comm.host(), r.step, {{"loss", r.loss}});
      if (comm.rank() == 0) mine.push_back(line.dump());
    }
    const std::lock_guard<std::mutex> lock(mu);
    if (comm.rank() == 0) lines = std::move(mine);
    if (!grab.values.empty()) buffer = std::move(grab.values);
  });
  if (target.process_world && target.process_world->rank() != 0) return buffer;
  std::ofstream out(file);
  out << trace_header(s.train.to_json(s.world_size), {{"engine", t.engine->name}}, s.world_size, s.train.model,
                      state_names)
             .dump()
      << "\n";
  for (const std::string& l : lines) out << l << "\n";
  if (!out.flush()) throw Error("cannot write " + file.string());
  return buffer;
}

// The buffer as a directory of .npy tensors, one per slice (per state block and slice).
void write_buffer(const fs::path& dir, const ParamLayout& layout, const std::vector<float>& values) {
  fs::create_directories(dir);
  for (std::size_t b = 0; b * layout.size() < values.size(); ++b)
    for (const Slice& t : layout.slices())
      write_npy(dir / ("b" + std::to_string(b) + "." + t.name + ".npy"), t.shape,
                std::span<const float>(values.data() + b * layout.size() + t.offset, t.size()));
}

// What the trace diff must name first, or "" when it does.
std::string check_trace_diff(const ToolsCase& k, const TraceDiff& d, const std::vector<std::string>& state_names) {
  const Fault& p = k.plant;
  const ParamLayout layout(k.s.train.model);
  const std::size_t n = layout.size();
  std::string item;
  TracePhase phase = TracePhase::data;
  switch (p.phase) {
    case FaultPhase::data: item = "indices"; break;
    case FaultPhase::local_gradient:
      phase = TracePhase::local_gradient;
      item = "local_grad " + layout.slice_at(std::min(p.element, n - 1)).name;
      break;
    case FaultPhase::all_reduce: phase = TracePhase::all_reduce; break;  // the call's output: checked below
    case FaultPhase::update:
      phase = TracePhase::optimizer;
      item = "params " + layout.slice_at(std::min(p.element, n - 1)).name;
      break;
    case FaultPhase::optimizer_state: {
      phase = TracePhase::optimizer;
      const std::size_t e = std::min(p.element, state_names.size() * n - 1);
      item = "state " + state_names[e / n] + " " + layout.slice_at(e % n).name;
      break;
    }
  }
  std::ostringstream want;
  want << "step " << p.step << ", " << phase_name(phase) << ", rank " << p.rank << ", "
       << (p.phase == FaultPhase::all_reduce ? "collective seq " + std::to_string(p.step) + " allreduce ... out"
                                             : item);
  const TraceMismatch* m = d.first();
  if (!m) return "dpcheck diff finds the traces identical; the planted difference is at " + want.str();
  const bool right =
      m->step == p.step && m->phase == phase && m->rank == p.rank &&
      (p.phase == FaultPhase::all_reduce
           ? m->item.starts_with("collective seq " + std::to_string(p.step) + " allreduce") && m->item.ends_with(" out")
           : m->item == item);
  if (right) return "";
  return "dpcheck diff names " + m->where() + " as the first difference; the planted difference is at " + want.str();
}

// The .npy diff of the planted buffer must name exactly the planted element.
std::string check_npy_diff(const ToolsCase& k, const std::vector<TensorDiff>& diffs, std::size_t size) {
  const ParamLayout layout(k.s.train.model);
  const std::size_t e = std::min(k.plant.element, size - 1);
  const Slice& t = layout.slice_at(e % layout.size());
  const std::string name = "b" + std::to_string(e / layout.size()) + "." + t.name;
  const std::string index = index_text(t.shape, e % layout.size() - t.offset);
  std::string found;
  for (const TensorDiff& d : diffs)
    if (!d.passed)
      found +=
          (found.empty() ? "" : ", ") + d.name + d.first_index + " (" + std::to_string(d.differing) + " differing)";
  if (found == name + index + " (1 differing)") return "";
  return "dpcheck diff of the planted buffer finds " + (found.empty() ? std::string("no difference") : found) +
         "; the planted element is " + name + index;
}

// Trains with the live checks, and the fault when given: the failure, and the bundle it leaves in
// `bundle` (none when empty).
std::optional<StepFailure> failing_run(const Target& target, const TrainConfig& c, int world,
                                       const std::optional<Fault>& fault, const LiveCheckOptions& checks,
                                       const fs::path& bundle) {
  Target t = target;
  t.fault = fault;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  std::optional<StepFailure> failure;
  std::mutex mu;
  run_world(t, world, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(t, c, comm, data);
    LiveChecks live(t, checks);
    rt.trainer->set_observer(&live);
    const Checkpoint start = rt.trainer->checkpoint();
    Checkpoint before;
    while (rt.trainer->next_step() < c.steps) {
      rt.trainer->checkpoint_into(before);
      try {
        rt.trainer->step();
      } catch (const StepCheckFailed& e) {
        if (comm.rank() == 0 && !bundle.empty()) {
          BundleManifest m;
          m.config = c;
          m.world_size = world;
          m.target = target_record(target);
          m.checks = checks;
          m.version = DPCHECK_VERSION;
          m.failure = e.failure;
          for (int r = 0; r < world; ++r) m.indices.push_back(rt.trainer->rank_indices(r, e.failure.step));
          write_bundle(t, comm, bundle, m, before, start, {}, false);
        }
        if (records(t, comm)) {
          const std::lock_guard<std::mutex> lock(mu);
          failure = e.failure;
        }
        break;
      }
    }
  });
  return failure;
}

// Trains with every step checkpointed into `dir` (rank 0 writes).
void checkpointed_run(const Target& target, const TrainConfig& c, int world, const std::optional<Fault>& fault,
                      const fs::path& dir) {
  Target t = target;
  t.fault = fault;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  run_world(t, world, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(t, c, comm, data);
    const std::unique_ptr<RankZeroWriter> writer = make_writer(t, comm, dir, {}, c.steps + 1);
    writer->save(rt.trainer->checkpoint(), c.model);
    while (rt.trainer->next_step() < c.steps) {
      rt.trainer->step();
      writer->save(rt.trainer->checkpoint(), c.model);
    }
  });
}

// "bf16 products, all-reduce in bf16, a dynamic loss scaler"
std::string formats_text(const Target& t, const TrainConfig& c) {
  return std::string(precision_name(t.precision)) + " products, all-reduce in " +
         std::string(allreduce_dtype_name(c.allreduce_dtype)) +
         (c.loss_scaling.kind == LossScaling::none ? "" : ", a dynamic loss scaler");
}

// Where `read` (a bundle's target and configuration, read back) differs from what was recorded: the
// first JSON field that differs, or "".
std::string read_back_difference(const Target& recorded, const TrainConfig& config, int world, const Bundle& read) {
  const nlohmann::json want = {{"target", target_to_json(recorded)}, {"config", config.to_json(world)}};
  const nlohmann::json got = {{"target", target_to_json(read.manifest.target)},
                              {"config", read.manifest.config.to_json(read.manifest.world_size)}};
  for (const char* part : {"target", "config"})
    for (const auto& [key, value] : want[part].items())
      if (!got[part].contains(key) || got[part][key] != value)
        return std::string(part) + "." + key + " is recorded as " + value.dump() + " and read back as " +
               (got[part].contains(key) ? got[part][key].dump() : std::string("nothing"));
  return "";
}

}  // namespace

void tools_body(const Target& given, const CaseDraw& draw, CaseRecord& record) {
  // The case's formats (drawn per case where verify draws them): the live checks of a correct run, and
  // the bundle, run in them (a dynamic loss scaler with fp16 products, as space_for gives).
  const ToolsCase k = *gen_tools_case(given, draw);
  // diff in float32 with no scaler, which keeps the planted bits where they were planted.
  Target target = given;
  target.precision = Precision::fp32;
  target.allreduce_dtype = DType::f32;
  Scenario exact = k.s;
  exact.train.loss_scaling = LossScalerConfig{};
  exact.train.allreduce_dtype = DType::f32;
  const Scenario& s = exact;
  record.size = size_of(s);
  const bool scaled = k.s.train.loss_scaling.kind != LossScaling::none;
  RC_CLASSIFY(given.precision != Precision::fp32 || k.s.train.allreduce_dtype != DType::f32, "16-bit formats");
  RC_CLASSIFY(k.plant.phase == FaultPhase::data, "planted in the examples");
  RC_CLASSIFY(k.plant.phase == FaultPhase::optimizer_state, "planted in the optimizer state");
  RC_CLASSIFY(k.change == ReplayChange::none, "replayed with the recorded fault");
  RC_CLASSIFY(k.drift_bug >= 0, "a bug for drift");
  RC_CLASSIFY(k.world_b != s.world_size, "drift across two world sizes");

  const fs::path dir = make_scratch(target, "tools");
  std::string failure;
  const bool here = !target.process_world || target.process_world->rank() == 0;
  try {
    // 0. The live checks on a correct run in the case's formats: --check-finite and the gradient held to
    // the sharded bound at every step (a bf16 all-reduce's roundings and the scaler's scale in it) pass.
    {
      LiveCheckOptions checks;
      checks.finite = true;
      checks.gradient_every = 1;
      const std::optional<StepFailure> f = failing_run(given, k.s.train, k.s.world_size, std::nullopt, checks, {});
      if (here && f)
        failure = "train --check-finite --check-gradient-every 1 fails a correct run with " +
                  formats_text(given, k.s.train) + ": " + f->kind + " at " + f->where() + ": " + f->message;
    }
    // 0b. On simulated ranks, where each rank's pass is played in turn on one replica: a NaN in one
    // rank's local gradient is found by train's live finite check, on that rank.
    if (k.simulated && failure.empty()) {
      LiveCheckOptions checks;
      checks.finite = true;
      const std::optional<StepFailure> f =
          failing_run(target_for_case(target, true), k.sim.train, k.sim.world_size, k.sim_nan, checks, {});
      const std::string element = ParamLayout(k.sim.train.model).describe_element(k.sim_nan.element);
      if (!f || f->kind != "non-finite" || f->step != k.sim_nan.step || f->rank != k.sim_nan.rank ||
          f->element != element)
        failure = "train --check-finite on " + std::to_string(k.sim.world_size) + " simulated ranks " +
                  (f ? "reports " + f->kind + " at " + f->where() : std::string("passes")) +
                  "; the planted NaN is at step " + std::to_string(k.sim_nan.step) + ", rank " +
                  std::to_string(k.sim_nan.rank) + ", " + element;
    }
    const std::vector<std::string> state_names = make_cpu_optimizer(s.train.optimizer, 0)->state_names();
    // 1. diff: the traces, and the planted buffer element by element.
    const std::vector<float> a = traced_run(target, s, k.plant, false, dir / "a.jsonl");
    const std::vector<float> b = traced_run(target, s, k.plant, true, dir / "b.jsonl");
    if (here && failure.empty())
      failure = check_trace_diff(k, diff_traces(dir / "a.jsonl", dir / "b.jsonl"), state_names);
    if (failure.empty() && k.plant.phase != FaultPhase::data && !a.empty()) {
      const ParamLayout layout(s.train.model);
      write_buffer(dir / ("a." + std::to_string(k.plant.rank)), layout, a);
      write_buffer(dir / ("b." + std::to_string(k.plant.rank)), layout, b);
      failure = check_npy_diff(k,
                               diff_tensor_dirs(dir / ("a." + std::to_string(k.plant.rank)),
                                                dir / ("b." + std::to_string(k.plant.rank)), Tolerance{}),
                               a.size());
    }

    // 2. replay: a bundle of the recorded fault, replayed with the same fault or one changed. In the
    // case's formats, but for a loss scaler's (which skips the step of a NaN gradient instead of failing
    // it): float32 there. The bundle's target and configuration must read back whole, and the replay runs
    // on what it read, as `dpcheck replay` does.
    if (agree(target, failure.empty())) {
      LiveCheckOptions checks;
      checks.finite = true;
      checks.gradient_every = 1;
      const Target& bundled = scaled ? target : given;
      const TrainConfig& bundled_config = scaled ? s.train : k.s.train;
      const std::optional<StepFailure> f =
          failing_run(bundled, bundled_config, s.world_size, k.recorded, checks, dir / "bundle");
      const ParamLayout layout(s.train.model);
      const std::string place = "non-finite at step " + std::to_string(k.recorded.step) + ", rank " +
                                std::to_string(k.recorded.rank) + ", " + layout.describe_element(k.recorded.element);
      if (here && (!f || f->kind != "non-finite" || f->step != k.recorded.step || f->rank != k.recorded.rank ||
                   f->element != layout.describe_element(k.recorded.element)))
        failure = "train --check-finite " + (f ? "reports " + f->kind + " at " + f->where() : std::string("passes")) +
                  "; the planted NaN is " + place;
      if (agree(target, failure.empty())) {
        const Bundle bundle = read_bundle(dir / "bundle");
        if (const std::string d = read_back_difference(bundled, bundled_config, s.world_size, bundle);
            here && !d.empty())
          failure = "a bundle of " + formats_text(bundled, bundled_config) + " does not read back whole: " + d;
        // The engine and communicator as read back are the bundled ones' rows (read_back_difference
        // compared their names); the rest as read.
        Target t = with_recorded_fields(bundled, bundle.manifest.target);
        t.fault = k.replayed;
        ReplayInput in;
        in.config = bundle.manifest.config;
        in.world_size = bundle.manifest.world_size;
        in.checks = bundle.manifest.checks;
        in.before = bundle.before;
        in.step = bundle.manifest.failure.step;
        const SyntheticDataset data(in.config.data_size(), in.config.model, in.config.seed);
        in.data = &data;
        in.indices = bundle.manifest.indices;
        const ReplayResult r = replay_step(t, in);
        const ReplayVerdict v = replay_verdict(bundle.manifest.failure, r.failure, t.mutant);
        const bool want = k.change == ReplayChange::none;
        if (here && failure.empty() && (v != ReplayVerdict::not_reproduced) != want)
          failure = "replay of a bundle of " + place + " with " + kChangeNames[static_cast<int>(k.change)] + " (" +
                    k.replayed.describe() + ", which fails " +
                    (r.failure ? r.failure->kind + " at " + r.failure->where() : std::string("no check")) + ") says " +
                    (v == ReplayVerdict::not_reproduced ? "NOT reproduced" : "reproduced");
      }
    }

    // 3. drift: rounding between world sizes, and a planted bug named where it is, in the case's formats.
    if (agree(target, failure.empty())) {
      const TrainConfig& drifted = k.s.train;
      checkpointed_run(given, drifted, s.world_size, k.drift_bug == 0 ? std::optional<Fault>(k.bug) : std::nullopt,
                       dir / "drift-a");
      checkpointed_run(given, drifted, k.world_b, k.drift_bug == 1 ? std::optional<Fault>(k.bug) : std::nullopt,
                       dir / "drift-b");
      const CheckpointRun runs[2] = {read_checkpoint_run(dir / "drift-a"), read_checkpoint_run(dir / "drift-b")};
      Target targets[2] = {given, given};
      if (k.drift_bug >= 0) targets[k.drift_bug].fault = k.bug;
      const SyntheticDataset data(s.train.data_size(), s.train.model, s.train.seed);
      const Dataset* const both[2] = {&data, &data};
      const DriftReport d = rounding_or_bug(targets, runs, both);
      // A loss scaler that skipped the step the bug went into (a gradient overflowed at the scale) may
      // leave no mark of it: the step changed nothing, and a rank's local gradient that is not finite
      // is the scaler's to handle, not held to the bound. There rounding is a right verdict too; a bug,
      // where drift names one, must still be the planted one.
      bool bug_skipped = false;
      if (k.drift_bug >= 0 && drifted.loss_scaling.kind != LossScaling::none) {
        const fs::path run = dir / (k.drift_bug == 0 ? "drift-a" : "drift-b");
        const std::optional<Checkpoint> at = read_checkpoint(run / checkpoint_name(k.bug.step), s.train.model),
                                        next = read_checkpoint(run / checkpoint_name(k.bug.step + 1), s.train.model);
        bug_skipped = at && next && at->optimizer_steps == next->optimizer_steps;
      }
      RC_CLASSIFY(bug_skipped, "a drift bug in a step the loss scaler passed over");
      const ParamLayout layout(s.train.model);
      const std::string where =
          "local gradient on rank " + std::to_string(k.bug.rank) + " at " + layout.describe_element(k.bug.element);
      const std::string said = d.bug_run < 0 ? "rounding"
                                             : "a bug in run " + std::string(d.bug_run == 0 ? "A" : "B") + " at step " +
                                                   std::to_string(d.bug_step) + ", " + d.bug_where;
      const bool right =
          d.unreproduced_run < 0 &&
          (k.drift_bug < 0 ? d.bug_run < 0
                           : (bug_skipped && d.bug_run < 0) ||
                                 (d.bug_run == k.drift_bug && d.bug_step == k.bug.step && d.bug_where == where));
      if (!right && (!target.process_world || target.process_world->rank() == 0))
        failure =
            d.unreproduced_run >= 0
                ? "dpcheck drift cannot replay step " + std::to_string(d.unreproduced_step) + " of run " +
                      (d.unreproduced_run == 0 ? "A" : "B") + " to its recorded bits"
                : "dpcheck drift calls the runs' difference " + said + "; " +
                      (k.drift_bug < 0 ? std::string("both are correct")
                                       : "the planted bug is in run " + std::string(k.drift_bug == 0 ? "A" : "B") +
                                             " at step " + std::to_string(k.bug.step) + ", " + where);
    }
  } catch (...) {
    remove_scratch(target, dir);
    throw;
  }
  remove_scratch(target, dir);
  if (!agree(target, failure.empty())) fail_case(failure.empty() ? "another rank's tool check failed" : failure);
}

}  // namespace dpcheck
