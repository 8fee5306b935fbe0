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

#include "divergence/divergence.hpp"
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
  std::string engine, comm, kernels, mutant, x, y;
  bool tf32 = false;
  PrecisionOption precision;
  int world_size = 0;
  LiveCheckOptions checks;
  TimeoutOption timeout;
  CLI::App* sub = nullptr;
  bool given(const char* option) const { return sub->count(option) > 0; }
};

int run_replay(ReplayOptions& o) {
  ReplayInput in;
  Target target, recorded_target;
  std::optional<StepFailure> recorded;
  std::optional<Checkpoint> start;
  std::string data_x, data_y;
  bool is_bundle = false, retargeted = false;
  int world = 1;
  std::unique_ptr<Dataset> data;
  // Under a launcher every rank reads the bundle, its data and its plugin for itself: one that cannot
  // stops every rank at once, and rank 0 says which and why.
  agree_on_rank_inputs([&] {
    std::error_code ec;
    if (!fs::is_directory(o.path, ec)) throw UsageError(o.path + " is not a directory (a repro bundle or a checkpoint directory)");
    is_bundle = fs::exists(fs::path(o.path) / "indices.json", ec) || fs::exists(fs::path(o.path) / "checkpoint", ec);

    if (is_bundle) {
      if (o.given("--step")) throw UsageError("--step is for a checkpoint directory; a bundle replays its failing step");
      if (o.given("--world-size")) throw UsageError("--world-size is for a checkpoint directory; a bundle replays on its own world size");
      Bundle b = read_bundle(o.path);
      if (!b.before_unreadable.empty() && is_printing_rank())
        std::printf("the state before the step is not one to start from (%s): replaying from the run's start, step %lld\n",
                    b.before_unreadable.c_str(), static_cast<long long>(b.start.step));
      in.config = b.manifest.config;
      in.world_size = b.manifest.world_size;
      in.checks = b.manifest.checks;
      in.before = std::move(b.before);
      start = std::move(b.start);
      in.step = b.manifest.failure.step;
      in.indices = b.manifest.indices;
      target = b.manifest.target;
      recorded = b.manifest.failure;
      data_x = b.manifest.x;
      data_y = b.manifest.y;
      if (!data_x.empty() && !o.given("--x")) {
        // The data the run read must still be the same bytes, or the replay proves nothing.
        for (const auto& [file, hash] : {std::pair{data_x, b.manifest.x_xxh3}, std::pair{data_y, b.manifest.y_xxh3}}) {
          if (!fs::is_regular_file(file, ec))
            throw UsageError("the bundle's data file " + file + " is gone (give --x and --y)");
          if (file_xxh3(file) != hash) throw UsageError("the bundle's data file " + file + " has changed since the run");
        }
      }
    } else {
      if (!o.given("--step")) throw UsageError(o.path + " is not a repro bundle; to replay a checkpoint directory, give --step");
      if (o.step < 0) throw UsageError("--step must be at least 0");
      // The newest checkpoint at or before the step; the manifests say the model.
      const fs::path dir(o.path);
      const CheckpointRun run = read_checkpoint_run(dir);
      in.config = run.config;
      in.world_size = run.world_size;
      if (!run.steps.empty() && o.step > run.steps.back())
        throw UsageError("--step " + std::to_string(o.step) + " is beyond " + o.path + "'s newest checkpoint (step " +
                         std::to_string(run.steps.back()) + "): the run never reached it");
      in.before = load_checkpoint(dir, in.config.model, nullptr, o.step);
      in.step = o.step;
      in.checks.finite = true;
      in.checks.gradient_every = 1;
      target.engine = default_engine();
      target.comm = default_comm(target.engine);
    }
    // The command line re-targets: another engine (and its communicator), communicator, kernels, mutant.
    recorded_target = target;
    if (o.given("--engine")) {
      target.engine = o.engine;
      if (!o.given("--comm")) target.comm = default_comm(o.engine);
      if (!o.given("--tf32")) target.tf32 = false;
      if (!o.given("--kernels")) target.kernels.clear();
    }
    if (o.given("--comm")) target.comm = o.comm;
    if (o.given("--kernels")) target.kernels = o.kernels;
    if (o.given("--mutant")) target.mutant = o.mutant == "none" ? "" : o.mutant;
    if (o.given("--tf32")) target.tf32 = o.tf32;
    if (o.given("--precision")) target.precision = o.precision.value();
    if (o.given("--timeout")) target.timeout = o.timeout.value();
    if (o.given("--check-finite")) in.checks.finite = true;
    if (o.given("--check-gradient-every")) {
      if (o.checks.gradient_every < 0) throw UsageError("--check-gradient-every must be at least 0");
      in.checks.gradient_every = o.checks.gradient_every > 0 ? 1 : 0;  // one step: checked or not
    }
    if (o.given("--x") != o.given("--y")) throw UsageError("give both --x and --y, or neither");
    if (o.given("--x")) data_x = o.x, data_y = o.y;
    if (!is_bundle && o.given("--world-size")) in.world_size = o.world_size;
    world = resolve_world(target, in.world_size, true);
    target.world_size = world;
    validate_target(target);
    retargeted = target.engine != recorded_target.engine || target.comm != recorded_target.comm ||
                 target.kernels != recorded_target.kernels || target.mutant != recorded_target.mutant ||
                 target.tf32 != recorded_target.tf32 || target.precision != recorded_target.precision;

    if (!data_x.empty()) {
      data = std::make_unique<ArrayDataset>(ArrayDataset::load(data_x, data_y, in.config.model));
      if (data->size() != in.config.data_size())
        throw UsageError(data_x + " holds " + std::to_string(data->size()) + " examples; the run had " +
                         std::to_string(in.config.data_size()));
    } else {
      data = std::make_unique<SyntheticDataset>(in.config.data_size(), in.config.model, in.config.seed);
    }
    in.data = data.get();
    check_train_size(in.config, world, target, true);
  });

  const bool printing = is_printing_rank();
  if (printing) {
    std::printf("dpcheck replay: %s, step %lld on %d ranks, %s%s\n", o.path.c_str(), static_cast<long long>(in.step), world,
                target.describe().c_str(), retargeted ? " (re-targeted)" : "");
    // A checkpoint does not say where its data came from: say what this replay trains on.
    if (!is_bundle && data_x.empty())
      std::printf("data: synthetic, seed %llu (give --x and --y if the run trained on files)\n",
                  static_cast<unsigned long long>(in.config.seed));
    if (recorded) std::printf("recorded failure: %s at %s\n", recorded->kind.c_str(), recorded->where().c_str());
    std::fflush(stdout);
  }
  ReplayResult r = replay_step(target, in);
  // The step alone may pass where the run failed: a bug that depends on what ran before the step (a
  // communicator's call count, a counter that wraps) needs the run from its start.
  bool from_start = false;
  if (recorded && !retargeted && replay_verdict(*recorded, r.failure, target.mutant) == ReplayVerdict::not_reproduced && start &&
      start->step < in.before.step) {
    ReplayInput whole = in;
    whole.before = *start;
    ReplayResult again = replay_step(target, whole);
    if (replay_verdict(*recorded, again.failure, target.mutant) != ReplayVerdict::not_reproduced) {
      r = std::move(again);
      from_start = true;
    }
  }
  if (!printing) return r.failure ? exit_check_failed : exit_ok;

  if (r.failure) std::printf("replay: %s\n", r.failure->message.c_str());
  else std::printf("replay: the step passes every check on this target (loss %s)\n", float_text(r.loss).c_str());
  std::printf("\n%-16s %5s  %-12s %s\n", "phase", "rank", "error ratio", "worst element");
  for (const PhaseRatio& p : r.phases)
    std::printf("%-16s %5d  %-12s %s\n", p.phase.c_str(), p.rank, ratio_text(p.ratio, "differs").c_str(), p.element.c_str());
  std::printf("\n%s\n", r.first_out_of_bound.empty() ? "every phase stays within the bound of the float64 reference"
                                                      : ("first phase out of the bound: " + r.first_out_of_bound).c_str());
  if (recorded) {
    if (!retargeted) {
      if (from_start)
        std::printf("the step alone passes from the bundle's checkpoint; from the start of the run (step %lld) it fails "
                    "again: the failure depends on state from before the step (a communicator's or kernel's own)\n",
                    static_cast<long long>(start->step));
      const ReplayVerdict verdict = replay_verdict(*recorded, r.failure, target.mutant);
      if (verdict == ReplayVerdict::bit_for_bit)
        std::printf("reproduced bit for bit: the same verdict at the same place (%s at %s)\n", recorded->kind.c_str(),
                    recorded->where().c_str());
      else if (verdict == ReplayVerdict::same_place)
        std::printf("reproduced at the same place (%s at %s), with other values\n", recorded->kind.c_str(),
                    recorded->where().c_str());
      else
        std::printf("NOT reproduced: the recorded failure was %s at %s\n", recorded->kind.c_str(), recorded->where().c_str());
    } else {
      std::printf("%s\n", r.failure ? "the replay target fails too" : "the replay target passes: the failure belongs to the recorded target");
    }
  }
  return r.failure ? exit_check_failed : exit_ok;
}

}  // namespace

Runner add_replay(CLI::App& app) {
  auto o = std::make_shared<ReplayOptions>();
  CLI::App* sub = app.add_subcommand(
      "replay", "Run a failing training step again from its repro bundle (or a checkpoint and --step) and attribute it");
  o->sub = sub;
  sub->add_option("bundle", o->path, "A repro bundle left by train, or a --checkpoint-dir directory (then give --step)")
      ->required();
  sub->add_option("--step", o->step, "With a checkpoint directory: the step to replay (from the newest checkpoint at or before it)");
  sub->add_option("--world-size", o->world_size, "With a checkpoint directory: ranks (default: the run's)");
  sub->add_option("--engine", o->engine, "Replay on this engine instead of the recorded one (and its default communicator)");
  sub->add_option("--comm", o->comm, "Replay over this communicator instead of the recorded one");
  add_kernels_option(*sub, o->kernels);
  sub->add_option("--mutant", o->mutant, "Replay with this mutant (none: without the recorded one)");
  sub->add_flag("--tf32", o->tf32, "cuda engine: TF32 matrix products");
  o->precision.add_to(*sub);
  sub->add_option("--x", o->x, "Inputs .npy, when the run's data file has moved");
  sub->add_option("--y", o->y, "Targets .npy, with --x");
  sub->add_flag("--check-finite", o->checks.finite, "Also check the loss and local gradients for NaN and infinity");
  sub->add_option("--check-gradient-every", o->checks.gradient_every,
                  "Hold the all-reduced gradient against the float64 reference (any K > 0 checks the replayed step)");
  o->timeout.add_to(*sub);
  return [o] { return run_replay(*o); };
}

}  // namespace dpcheck::cli
