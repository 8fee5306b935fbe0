// dpcheck replay: one training step again, from a repro bundle that a failing `train` left (or from a
// checkpoint of `--checkpoint-dir` and a step), with the same checks. On the bundle's own target it says
// whether the step fails the same way, bit for bit; on another (--engine cpu --comm local) it measures
// each phase of the step on each rank against the float64 reference and names the first phase that
// leaves the bound. Exit status: 0 when the step passes every check on the replay target, 1 when a
// check fails there.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "divergence/backend_record.hpp"
#include "divergence/divergence.hpp"
#include "python/torch_record.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"
#include "src/train/writer.hpp"

namespace dpcheck::cli {

namespace {

namespace fs = std::filesystem;

struct ReplayOptions {
  std::string path;
  std::int64_t step = -1;
  std::string x, y;
  TargetOptions target{0};
  LiveCheckOptions checks;
  CLI::App* sub = nullptr;
  bool given(const char* option) const { return sub->count(option) > 0; }
};

// What a replay runs: the step and its state, the target, and what the run recorded.
struct ReplaySetup {
  ReplayInput in;
  Target target;
  TargetRecord recorded_target;  // the bundle's, by name (the default target for a checkpoint directory)
  std::optional<StepFailure> recorded;
  std::optional<Checkpoint> start;
  std::string data_x, data_y;
  bool is_bundle = false, retargeted = false;
  int world = 1;
  std::unique_ptr<Dataset> data;
  // The backend the bundle recorded (none in an older bundle), and how the one replayed differs from it.
  std::optional<BackendRecord> recorded_backend;
  std::vector<std::string> backend_warnings;
  bool backend_unrecorded = false;  // an older bundle, on a plugin or MPI backend: nothing to compare
};

void read_bundle_input(const ReplayOptions& o, ReplaySetup& s) {
  std::error_code ec;
  if (o.given("--step")) throw UsageError("--step is for a checkpoint directory; a bundle replays its failing step");
  if (o.given("--world-size"))
    throw UsageError("--world-size is for a checkpoint directory; a bundle replays on its own world size");
  Bundle b = read_bundle(o.path);
  if (!b.before_unreadable.empty() && is_printing_rank())
    std::printf("the state before the step is not one to start from (%s): replaying from the run's start, step %lld\n",
                b.before_unreadable.c_str(), static_cast<long long>(b.start.step));
  s.in.config = b.manifest.config;
  s.in.world_size = b.manifest.world_size;
  s.in.checks = b.manifest.checks;
  s.in.before = std::move(b.before);
  s.start = std::move(b.start);
  s.in.step = b.manifest.failure.step;
  s.in.indices = b.manifest.indices;
  s.recorded_target = b.manifest.target;
  s.recorded = b.manifest.failure;
  s.recorded_backend = b.manifest.backend;
  s.data_x = b.manifest.x;
  s.data_y = b.manifest.y;
  if (!s.data_x.empty() && !o.given("--x")) {
    // The data the run read must still be the same bytes, or the replay proves nothing.
    for (const auto& [file, hash] : {std::pair{s.data_x, b.manifest.x_xxh3}, std::pair{s.data_y, b.manifest.y_xxh3}}) {
      if (!fs::is_regular_file(file, ec))
        throw UsageError("the bundle's data file " + file + " is gone (give --x and --y)");
      if (file_xxh3(file) != hash) throw UsageError("the bundle's data file " + file + " has changed since the run");
    }
  }
}

void read_checkpoint_input(const ReplayOptions& o, ReplaySetup& s) {
  if (!o.given("--step"))
    throw UsageError(o.path + " is not a repro bundle; to replay a checkpoint directory, give --step");
  if (o.step < 0) throw UsageError("--step must be at least 0");
  // The newest checkpoint at or before the step; the manifests say the model.
  const fs::path dir(o.path);
  const CheckpointRun run = read_checkpoint_run(dir);
  s.in.config = run.config;
  s.in.world_size = run.world_size;
  if (!run.steps.empty() && o.step > run.steps.back())
    throw UsageError("--step " + std::to_string(o.step) + " is beyond " + o.path + "'s newest checkpoint (step " +
                     std::to_string(run.steps.back()) + "): the run never reached it");
  s.in.before = load_checkpoint(dir, s.in.config.model, nullptr, o.step);
  s.in.step = o.step;
  s.in.checks.finite = true;
  s.in.checks.gradient_every = 1;
  s.recorded_target = target_record(Target{});
}

// The command line re-targets: another engine (and its communicator), communicator, kernels, mutant.
void retarget(const ReplayOptions& o, ReplaySetup& s) {
  TargetRecord want = s.recorded_target;
  const TargetOptions& to = o.target;
  if (to.given("--engine")) {
    want.engine = to.engine;
    if (!to.given("--comm")) want.comm.clear();  // the engine's default
    if (!to.given("--tf32")) want.tf32 = false;
    if (!to.given("--kernels")) want.kernels.clear();
  }
  if (to.given("--comm")) want.comm = to.comm;
  if (to.given("--kernels")) want.kernels = to.kernels;
  if (to.given("--mutant")) want.mutant = to.mutant == "none" ? "" : to.mutant;
  if (to.given("--tf32")) want.tf32 = to.tf32;
  if (to.given("--precision")) want.precision = to.precision.value();
  if (to.given("--timeout")) want.timeout = to.timeout.value();
  s.target = resolve_target(want);
  if (o.given("--check-finite")) s.in.checks.finite = true;
  if (o.given("--check-gradient-every")) {
    if (o.checks.gradient_every < 0) throw UsageError("--check-gradient-every must be at least 0");
    s.in.checks.gradient_every = o.checks.gradient_every > 0 ? 1 : 0;  // one step: checked or not
  }
  if (o.given("--x") != o.given("--y")) throw UsageError("give both --x and --y, or neither");
  if (o.given("--x")) s.data_x = o.x, s.data_y = o.y;
  if (!s.is_bundle && o.given("--world-size")) s.in.world_size = o.target.world_size;
  s.world = resolve_world(s.target, s.in.world_size, true);
  s.target.world_size = s.world;
  validate_target(s.target);
  TargetRecord now = target_record(s.target);
  now.timeout = s.recorded_target.timeout;  // a longer wait runs the same step
  s.retargeted = now != s.recorded_target;
}

// The backend about to run against the one the bundle recorded. Replay sets nothing itself: a variable
// that chose the run's algorithm and differs now is said, with the line that replays as the run did.
void compare_backend(ReplaySetup& s) {
  if (!s.is_bundle) return;
  const BackendRecord now = record_backend(s.target);
  if (s.recorded_backend) s.backend_warnings = backend_differences(*s.recorded_backend, now);
  else s.backend_unrecorded = !now.plugins.empty() || !now.env_prefixes.empty();
}

void print_backend_warnings(const ReplayOptions& o, const ReplaySetup& s) {
  if (s.backend_unrecorded)
    std::printf(
        "note: the bundle records no backend (an older dpcheck wrote it): its plugins and environment are not "
        "compared\n");
  for (const std::string& w : s.backend_warnings) std::printf("warning: %s\n", w.c_str());
  if (!s.backend_warnings.empty() && !recorded_env_prefix(*s.recorded_backend).empty()) {
    // The launcher of the recorded communicator (this replay's, where that one no longer loads here).
    Target recorded = s.target;
    try {
      recorded = resolve_target(s.recorded_target);
    } catch (const UsageError&) {
    }
    recorded.process_world = s.target.process_world;  // the launcher in front, as this replay was started
    std::printf("to replay with the bundle's environment: %s\n",
                bundle_replay_command(recorded, o.path, &*s.recorded_backend).c_str());
  }
}

void load_replay_data(ReplaySetup& s) {
  if (!s.data_x.empty()) {
    s.data = std::make_unique<ArrayDataset>(ArrayDataset::load(s.data_x, s.data_y, s.in.config.model));
    if (s.data->size() != s.in.config.data_size())
      throw UsageError(s.data_x + " holds " + std::to_string(s.data->size()) + " examples; the run had " +
                       std::to_string(s.in.config.data_size()));
  } else {
    s.data = std::make_unique<SyntheticDataset>(s.in.config.data_size(), s.in.config.model, s.in.config.seed);
  }
  s.in.data = s.data.get();
  check_train_size(s.in.config, s.world, s.target, true);
}

// The replay's verdict on the failure the run recorded.
void print_verdict(const ReplaySetup& s, const ReplayResult& r, bool from_start) {
  if (s.retargeted) {
    std::printf("%s\n", r.failure ? "the replay target fails too"
                                  : "the replay target passes: the failure belongs to the recorded target");
    return;
  }
  const StepFailure& recorded = *s.recorded;
  if (from_start)
    std::printf(
        "the step alone passes from the bundle's checkpoint; from the start of the run (step %lld) it fails "
        "again: the failure depends on state from before the step (a communicator's or kernel's own)\n",
        static_cast<long long>(s.start->step));
  const ReplayVerdict verdict = replay_verdict(recorded, r.failure, s.target.mutant);
  if (verdict == ReplayVerdict::bit_for_bit)
    std::printf("reproduced bit for bit: the same verdict at the same place (%s at %s)\n", recorded.kind.c_str(),
                recorded.where().c_str());
  else if (verdict == ReplayVerdict::same_place)
    std::printf("reproduced at the same place (%s at %s), with other values\n", recorded.kind.c_str(),
                recorded.where().c_str());
  else
    std::printf("NOT reproduced: the recorded failure was %s at %s\n", recorded.kind.c_str(), recorded.where().c_str());
  if (verdict != ReplayVerdict::bit_for_bit && !s.backend_warnings.empty())
    std::printf(
        "the backend is not the one the bundle ran on (the warnings above): the replay may have run another "
        "algorithm\n");
}

void print_replay(const ReplaySetup& s, const ReplayResult& r, bool from_start) {
  if (r.failure) std::printf("replay: %s\n", r.failure->message.c_str());
  else std::printf("replay: the step passes every check on this target (loss %s)\n", float_text(r.loss).c_str());
  std::printf("\n%-16s %5s  %-12s %s\n", "phase", "rank", "error ratio", "worst element");
  for (const PhaseRatio& p : r.phases)
    std::printf("%-16s %5d  %-12s %s\n", p.phase.c_str(), p.rank, ratio_text(p.ratio, "differs").c_str(),
                p.element.c_str());
  std::printf("\n%s\n", r.first_out_of_bound.empty()
                            ? "every phase stays within the bound of the float64 reference"
                            : ("first phase out of the bound: " + r.first_out_of_bound).c_str());
  if (s.recorded) print_verdict(s, r, from_start);
}

// ---- a step of a real PyTorch job (a dpcheck.torch bundle or record) ------------------------------------

// The recorded step as dpcheck's own trainer takes it: the global batch as the data set, one step an
// epoch, no shuffle, from the recorded parameters and optimizer state.
ReplayInput trainer_input(const torchjob::Record& rec, const torchjob::RecordedStep& st, const Dataset& data) {
  const torchjob::RecordHeader& h = rec.header;
  ReplayInput in;
  TrainConfig& c = in.config;
  c.model = h.model;
  c.batch = data.size();
  c.dataset_size = data.size();
  c.steps = static_cast<int>(st.step + 1);
  c.optimizer = *h.optimizer;
  c.optimizer.lr = st.lr;
  c.shuffle = false;
  in.world_size = h.world_size;
  in.checks.finite = true;
  in.checks.gradient_every = 1;
  in.step = st.step;
  in.data = &data;
  Checkpoint& b = in.before;
  b.step = st.step;
  b.epoch = st.step;
  b.params = st.params;
  b.optimizer_state = st.state;
  b.optimizer_steps = st.optimizer_steps;
  b.state_names = h.optimizer->kind == OptimizerKind::adam       ? std::vector<std::string>{"exp_avg", "exp_avg_sq"}
                  : h.optimizer->kind == OptimizerKind::momentum ? std::vector<std::string>{"momentum_buffer"}
                                                                 : std::vector<std::string>{};
  b.config = c.to_json(in.world_size);
  return in;
}

int replay_torch(ReplayOptions& o) {
  for (const char* option : {"--x", "--y", "--world-size", "--mutant", "--kernels", "--precision", "--tf32"})
    if (o.given(option))
      throw UsageError(std::string(option) + " does not apply to " + o.path +
                       ", a record of a PyTorch job: its step is judged as "
                       "recorded, and run again on dpcheck's trainer with the recorded data and world size");
  if (process_world())
    throw UsageError("replay of a PyTorch job's step runs its ranks as threads: start it without a launcher");
  const torchjob::Record rec = torchjob::read_record(o.path);
  const torchjob::RecordHeader& h = rec.header;
  std::int64_t step = 0;
  if (h.failure) {
    if (o.given("--step") && o.step != (*h.failure)["step"].get<std::int64_t>())
      throw UsageError("--step: " + o.path + " is a bundle of step " + (*h.failure)["step"].dump() + " alone");
    step = (*h.failure)["step"].get<std::int64_t>();
  } else {
    if (!o.given("--step")) throw UsageError(o.path + " is a record of every step: give --step");
    if (o.step < 0) throw UsageError("--step must be at least 0");
    step = o.step;
  }
  const torchjob::RecordedStep st = torchjob::read_recorded_step(rec, step);
  // dpcheck's trainer on the same step, on the options' target (by default the cpu engine).
  TargetRecord want;
  if (o.target.given("--engine")) want.engine = o.target.engine;
  if (o.target.given("--comm")) want.comm = o.target.comm;
  if (o.target.given("--timeout")) want.timeout = o.target.timeout.value();
  Target t = resolve_target(want);
  t.world_size = h.world_size;
  validate_target(t);

  std::printf("dpcheck replay: %s, step %lld of a PyTorch job (torch %s, %s, %s, %s)\n", o.path.c_str(),
              static_cast<long long>(step), h.torch_version.c_str(), h.backend.c_str(),
              counted(h.world_size, "rank").c_str(), h.optimizer_name.c_str());
  std::int64_t examples = 0;
  for (const torchjob::GradientPart& p : st.parts) examples += p.batch.size;
  std::printf("model %s, %s, %s; global batch of %s in %s\n", dims_string(h.model.dims).c_str(),
              std::string(activation_name(h.model.activation)).c_str(), std::string(loss_name(h.model.loss)).c_str(),
              counted(examples, "example").c_str(), counted(static_cast<long long>(st.parts.size()), "part").c_str());
  if (!st.failure_kind.empty()) {
    std::printf("the job's %s check failed at this step: %s\n", st.failure_kind.c_str(), st.failure_line().c_str());
    const std::size_t rest = st.failure_message.find('\n');
    if (rest != std::string::npos) std::printf("%s\n", st.failure_message.substr(rest + 1).c_str());
  }

  const torchjob::StepJudgement j = torchjob::judge_recorded_step(rec, st);
  std::printf("\nthe recorded step, against the float64 reference from its own parameters:\n");
  std::printf("%-12s %-12s %s\n", "phase", "error ratio", "worst element");
  for (const torchjob::RecordedPhase& p : j.phases)
    std::printf("%-12s %-12s %s\n", p.phase.c_str(), p.judged ? ratio_text(p.ratio, "inf").c_str() : "-",
                p.judged ? p.element.c_str() : p.message.c_str());
  for (const torchjob::RecordedPhase& p : j.phases)
    // Each phase out of the bound in words, unless the job's own report above already said it.
    if (p.judged && !(p.ratio <= 1.0) && h.torch_names(st.failure_message).find(p.message) == std::string::npos)
      std::printf("%s: %s\n", p.phase.c_str(), p.message.c_str());
  std::printf("%s\n", j.first_out_of_bound.empty() ? "every phase judged stays within the bound"
                                                   : ("first phase out of the bound: " + j.first_out_of_bound).c_str());

  std::optional<ReplayResult> mine;
  if (!h.optimizer) {
    std::printf("\ndpcheck's trainer: not run (the optimizer is %s)\n", h.optimizer_not_judged.c_str());
  } else {
    const ArrayDataset data(concat(std::vector<Batch>([&] {
      std::vector<Batch> b;
      for (const torchjob::GradientPart& p : st.parts) b.push_back(p.batch);
      return b;
    }())));
    const ReplayInput in = trainer_input(rec, st, data);
    check_train_size(in.config, h.world_size, t, true);
    std::printf("\ndpcheck's trainer on the same parameters, optimizer state and batch (%s, %s):\n",
                t.describe().c_str(), counted(h.world_size, "rank").c_str());
    std::fflush(stdout);
    mine = replay_step(t, in);
    std::printf("%-16s %5s  %-12s %s\n", "phase", "rank", "error ratio", "worst element");
    for (const PhaseRatio& p : mine->phases)
      std::printf("%-16s %5d  %-12s %s\n", p.phase.c_str(), p.rank, ratio_text(p.ratio, "differs").c_str(),
                  h.torch_names(p.element).c_str());
    std::printf("%s\n", mine->failure ? ("dpcheck's trainer fails: " + h.torch_names(mine->failure->message)).c_str()
                                      : "dpcheck's trainer passes every check on this step");
  }
  const bool recorded_fails = !j.first_out_of_bound.empty();
  const bool mine_fails = mine && mine->failure;
  std::printf("\n");
  if (recorded_fails && mine && !mine_fails)
    std::printf(
        "the recorded step leaves the bound where dpcheck's trainer, from the same parameters, state and examples, "
        "does not: the failure is the job's (its loss, its all-reduce or its optimizer), not the model's or the "
        "data's\n");
  else if (recorded_fails) std::printf("the recorded step leaves the bound (%s)\n", j.first_out_of_bound.c_str());
  else if (!st.failure_kind.empty())
    std::printf(
        "the recorded step on rank 0 stays within the bound: the job's %s check failed on what the ranks did "
        "differently, which rank 0's record cannot show; the job's report above located it\n",
        st.failure_kind.c_str());
  else std::printf("the recorded step stays within the bound of the float64 reference\n");
  return recorded_fails || mine_fails || !st.failure_kind.empty() ? exit_check_failed : exit_ok;
}

int run_replay(ReplayOptions& o) {
  if (torchjob::is_record(o.path)) return replay_torch(o);
  ReplaySetup s;
  // Under a launcher every rank reads the bundle, its data and its plugin for itself: one that cannot
  // stops every rank at once, and rank 0 says which and why.
  agree_on_rank_inputs([&] {
    std::error_code ec;
    if (!fs::is_directory(o.path, ec))
      throw UsageError(o.path + " is not a directory (a repro bundle or a checkpoint directory)");
    s.is_bundle = fs::exists(fs::path(o.path) / "indices.json", ec) || fs::exists(fs::path(o.path) / "checkpoint", ec);
    if (s.is_bundle) read_bundle_input(o, s);
    else read_checkpoint_input(o, s);
    retarget(o, s);
    compare_backend(s);
    load_replay_data(s);
  });

  const bool printing = is_printing_rank();
  if (printing) {
    std::printf("dpcheck replay: %s, step %lld on %d ranks, %s%s\n", o.path.c_str(), static_cast<long long>(s.in.step),
                s.world, s.target.describe().c_str(), s.retargeted ? " (re-targeted)" : "");
    print_backend_warnings(o, s);
    // A checkpoint does not say where its data came from: say what this replay trains on.
    if (!s.is_bundle && s.data_x.empty())
      std::printf("data: synthetic, seed %llu (give --x and --y if the run trained on files)\n",
                  static_cast<unsigned long long>(s.in.config.seed));
    if (s.recorded) std::printf("recorded failure: %s at %s\n", s.recorded->kind.c_str(), s.recorded->where().c_str());
    std::fflush(stdout);
  }
  ReplayResult r = replay_step(s.target, s.in);
  // The step alone may pass where the run failed: a bug that depends on what ran before the step (a
  // communicator's call count, a counter that wraps) needs the run from its start.
  bool from_start = false;
  if (s.recorded && !s.retargeted && s.start && s.start->step < s.in.before.step &&
      replay_verdict(*s.recorded, r.failure, s.target.mutant) == ReplayVerdict::not_reproduced) {
    ReplayInput whole = s.in;
    whole.before = *s.start;
    ReplayResult again = replay_step(s.target, whole);
    if (replay_verdict(*s.recorded, again.failure, s.target.mutant) != ReplayVerdict::not_reproduced) {
      r = std::move(again);
      from_start = true;
    }
  }
  if (printing) print_replay(s, r, from_start);
  return r.failure ? exit_check_failed : exit_ok;
}

}  // namespace

Runner add_replay(CLI::App& app) {
  auto o = std::make_shared<ReplayOptions>();
  CLI::App* sub = app.add_subcommand(
      "replay",
      "Run a failing training step again from its repro bundle (or a checkpoint and --step) and attribute it");
  o->sub = sub;
  sub->add_option("bundle", o->path,
                  "A repro bundle left by train or by dpcheck.torch (Monitor(bundle_dir=DIR)), or a --checkpoint-dir "
                  "directory or a record of a PyTorch job (Monitor(record=DIR)); for these two give --step")
      ->required();
  sub->add_option("--step", o->step,
                  "With a checkpoint directory: the step to replay (from the newest checkpoint at or before it)");
  namespace f = target_option;
  o->target.add_to(*sub,
                   f::world_size | f::engine | f::comm | f::kernels | f::mutant | f::tf32 | f::precision | f::timeout);
  o->target.reword("--world-size", "With a checkpoint directory: ranks (default: the run's)");
  o->target.reword("--engine", "Replay on this engine instead of the recorded one (and its default communicator)");
  o->target.reword("--comm", "Replay over this communicator instead of the recorded one");
  o->target.reword("--mutant", "Replay with this mutant (none: without the recorded one)");
  sub->add_option("--x", o->x, "Inputs .npy, when the run's data file has moved");
  sub->add_option("--y", o->y, "Targets .npy, with --x");
  sub->add_flag("--check-finite", o->checks.finite, "Also check the loss and local gradients for NaN and infinity");
  sub->add_option("--check-gradient-every", o->checks.gradient_every,
                  "Hold the all-reduced gradient against the float64 reference (any K > 0 checks the replayed step)");
  return [o] { return run_replay(*o); };
}

}  // namespace dpcheck::cli
