// dpcheck train: data-parallel training with every check on every step. Prints the loss and the
// replica check per step; on the first desync, or the first loss that is not finite, says so and exits
// 1. Checkpoints and the log go through the RankZeroWriter (never a checkpoint of parameters that are
// not finite); --resume continues a run bit for bit.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>

#include "divergence/divergence.hpp"
#include "divergence/run_checks.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/report/html.hpp"
#include "src/target/target.hpp"
#include "src/train/training_run.hpp"

namespace dpcheck::cli {

namespace {

struct TrainOptions {
  ModelOptions model;
  TrainConfig train;
  std::string optimizer = "sgd", split = "strided", policy = "pad";
  std::string init, resume, report, html;
  bool quiet = false;
  bool bundle_dir_given = false;
  bool no_bundle = false;
  bool no_shuffle = false;
  SeedOption seed;
  TargetOptions target;
  LossScaleOptions loss_scale;
  TrainingRunOptions run;         // --checkpoint-dir, --checkpoint-every, --keep, --log, faults
  TrainingCheckOptions checking;  // --trace, the live checks, --bundle-dir, --x, --y
};

// The configuration from the options, each checked (UsageError naming the option).
void configure(TrainOptions& o) {
  TrainConfig& t = o.train;
  const TrainingRunOptions& run = o.run;
  const TrainingCheckOptions& checking = o.checking;
  t.model = o.model.config();
  t.optimizer.kind = parse_optimizer(o.optimizer);
  t.split = parse_split(o.split);
  t.policy = parse_policy(o.policy);
  t.shuffle = !o.no_shuffle;
  t.seed = o.seed.value();
  t.optimizer.validate();
  if (checking.x.empty() != checking.y.empty()) throw UsageError("give both --x and --y, or neither");
  if (run.checkpoint_every < 0) throw UsageError("--checkpoint-every must be at least 0");
  if (run.checkpoint_every > 0 && run.checkpoint_dir.empty())
    throw UsageError("--checkpoint-every needs --checkpoint-dir");
  if (run.keep < 1) throw UsageError("--keep must be at least 1");
  if (!o.init.empty() && !o.resume.empty())
    throw UsageError(
        "--init and --resume both give the starting parameters (--resume those of its checkpoint): give one");
  if (!run.fault.empty() && run.fault != "kill" && run.fault != "stall")
    throw UsageError("--inject-fault takes kill or stall");
  if (checking.live.gradient_every < 0) throw UsageError("--check-gradient-every must be at least 0");
  t.allreduce_dtype = o.target.allreduce_dtype.value();
  t.loss_scaling = o.loss_scale.config(o.target.precision.value());
}

// Before any work: a bad output path costs a second, not a training run.
void check_outputs(const TrainOptions& o) {
  const TrainingRunOptions& run = o.run;
  check_on_writing_rank([&] {
    if (!run.log.empty()) check_output_path(run.log, "--log", OutputMode::append);
    if (!o.report.empty()) check_output_path(o.report, "--report");
    if (!o.html.empty()) check_output_path(o.html, "--html");
    if (!run.checkpoint_dir.empty()) check_output_dir(run.checkpoint_dir, "--checkpoint-dir");
    if (!o.checking.trace.empty()) check_output_path(o.checking.trace, "--trace");
    // The default (the current directory) is not held against a run that may never fail: a read-only one
    // costs only the bundle, said when a check fails.
    if (!o.no_bundle && o.bundle_dir_given) check_output_dir(o.checking.bundle_dir, "--bundle-dir");
  });
}

// Each rank reads its own data files: one missing or damaged on one rank stops every rank at once.
std::unique_ptr<Dataset> load_data(TrainOptions& o, int world, const Target& target) {
  TrainConfig& t = o.train;
  std::unique_ptr<Dataset> data;
  agree_on_rank_inputs([&] {
    if (!o.checking.x.empty())
      data = std::make_unique<ArrayDataset>(ArrayDataset::load(o.checking.x, o.checking.y, t.model));
  });
  if (data) {
    if (t.dataset_size != 0 && t.dataset_size != data->size())
      throw UsageError("--dataset-size is " + std::to_string(t.dataset_size) + " but --x holds " +
                       std::to_string(data->size()) + " examples");
    t.dataset_size = data->size();
  }
  t.validate(world);
  require_allreduce_bound(target, t, world);
  check_accumulate(t.accumulate, t.batch, world);
  check_train_size(t, world, target, o.checking.live.gradient_every > 0);
  if (!data) data = std::make_unique<SyntheticDataset>(t.data_size(), t.model, t.seed);
  return data;
}

void print_header(const TrainOptions& o, const Target& target, const std::vector<std::string>& skipped,
                  const std::optional<Checkpoint>& resume) {
  const TrainConfig& t = o.train;
  const int world = target.world_size;
  std::printf(
      "dpcheck train: model %s (%s, %s), %d ranks, batch %lld of %lld examples, %s lr %g%s, %d steps, "
      "accumulate %d, %s %s%s, %s\n",
      dims_string(t.model.dims).c_str(), std::string(activation_name(t.model.activation)).c_str(),
      std::string(loss_name(t.model.loss)).c_str(), world, static_cast<long long>(t.batch),
      static_cast<long long>(t.data_size()), o.optimizer.c_str(), t.optimizer_for(world).lr,
      t.linear_scaling ? " (linear scaling)" : "", t.steps, t.accumulate, o.split.c_str(), o.policy.c_str(),
      t.shuffle ? ", shuffled" : "", (target.describe() + plugins_text(target)).c_str());
  if (t.warmup_steps > 0)
    std::printf("warm-up: the learning rate rises from %g to %g over %lld steps\n", t.optimizer.lr,
                t.optimizer_for(world).lr, static_cast<long long>(t.warmup_steps));
  if (t.allreduce_dtype != DType::f32) std::printf("gradient all-reduce in bf16\n");
  if (t.bucket_mb > 0)
    std::printf(
        "gradient all-reduced in buckets of at most %g MiB, each started as the backward pass produces it "
        "(with a communicator callable from another thread, and no live check or trace; else after "
        "the pass)\n",
        t.bucket_mb);
  if (t.loss_scaling.enabled())
    std::printf("dynamic loss scaling from %g, doubled after %lld good steps, halved on a non-finite gradient\n",
                t.loss_scaling.init_scale, static_cast<long long>(t.loss_scaling.growth_interval));
  for (const std::string& s : skipped) std::printf("skipped checkpoint %s\n", s.c_str());
  if (resume) std::printf("resuming from %s at step %lld\n", o.resume.c_str(), static_cast<long long>(resume->step));
  std::fflush(stdout);
}

// Rank 0's lines: a step's loss and replica check, and a progress line on a terminal.
class PrintingListener final : public TrainingRunListener {
 public:
  PrintingListener(const TrainConfig& t, bool progress) : t_(t), progress_(progress) {}

  void step_done(const StepResult& r, const nlohmann::json& checks) override {
    progress_.done();
    std::printf("step %4lld  loss %-14s global batch %-6lld %s", static_cast<long long>(r.step),
                float_text(r.loss).c_str(), static_cast<long long>(r.global_batch), r.replicas.describe().c_str());
    if (checks.contains("gradient_ratio"))
      std::printf("  gradient error ratio %.3g", checks["gradient_ratio"].get<double>());
    if (t_.loss_scaling.enabled())
      std::printf("  loss scale %s%s", float_text(r.loss_scale).c_str(),
                  r.skipped ? " (step skipped: non-finite gradient)" : "");
    std::printf("\n");
    std::fflush(stdout);
    progress_.update("train: step " + std::to_string(r.step + 1) + " of " + std::to_string(t_.steps) + ", " +
                     std::to_string(static_cast<long long>(progress_.seconds())) + " s");
  }
  void line(const std::string& text) override {
    progress_.done();
    std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  }
  [[noreturn]] void end_process(const std::string& message) override {
    progress_.done();
    print_error(message);
    std::_Exit(exit_runtime_error);
  }
  void done() { progress_.done(); }

 private:
  const TrainConfig& t_;
  Progress progress_;
};

void write_reports(const TrainOptions& o, const Target& target, const TrainingOutcome& out) {
  const nlohmann::json report = {
      {"command", "train"},
      {"target", target_to_json(target)},
      {"config", o.train.to_json(target.world_size)},
      {"passed", out.passed},
      {"failure", out.passed ? nlohmann::json(nullptr) : nlohmann::json{{"message", out.failure}}},
      {"steps", out.steps}};
  if (!o.report.empty()) write_file_atomic(o.report, report.dump(2) + "\n");
  if (!o.html.empty()) write_file_atomic(o.html, html::train_page(report));
}

// Every rank of the target's world trains (src/train/training_run.hpp) with dpcheck's checks
// (divergence/run_checks.hpp), its trainer talking through the checks' communicator.
TrainingOutcome train_world(const TrainOptions& o, const Target& target, const Dataset& data,
                            const std::vector<float>& params, const std::optional<Checkpoint>& resume,
                            TrainingRunListener& listener) {
  TrainingShared shared;
  run_world(target, target.world_size, [&](Communicator& world_comm) {
    TrainingChecks checks(target, o.train, target.world_size, o.checking, world_comm);
    const RankTrainer rt = make_rank_trainer(target, o.train, checks.comm(), data);
    const std::unique_ptr<RankZeroWriter> writer =
        make_writer(target, checks.comm(), o.run.checkpoint_dir, o.run.log, o.run.keep);
    const RankRunParts parts{.comm = checks.comm(),
                             .trainer = *rt.trainer,
                             .engine = *rt.engine,
                             .writer = *writer,
                             .ranks_are_processes = target.process_world != nullptr,
                             .timeout = target.timeout};
    run_rank(o.train, o.run, parts, checks, listener, shared, params, resume);
  });
  return shared.outcome();
}

int run_train(TrainOptions& o) {
  configure(o);
  Target target = o.target.resolved();
  target.allreduce_dtype = o.train.allreduce_dtype;
  // Each rank loads its own plugin: one that fails on one rank stops every rank at once.
  agree_on_rank_inputs([&] { validate_target(target); });
  check_outputs(o);
  const std::unique_ptr<Dataset> data = load_data(o, target.world_size, target);
  std::vector<float> params;
  std::optional<Checkpoint> resume;
  std::vector<std::string> skipped;
  agree_on_rank_inputs([&] {
    params = o.init.empty() ? init_params(o.train.model, o.train.seed) : load_params_dir(o.init, o.train.model);
    if (!o.resume.empty()) resume = load_checkpoint(o.resume, o.train.model, &skipped);
  });
  if (resume) {
    const std::string mismatch = o.train.resume_mismatch(resume->config, target.world_size);
    if (!mismatch.empty()) throw UsageError("cannot resume from " + o.resume + ": " + mismatch);
  }
  const bool printing = is_printing_rank();
  if (printing) print_header(o, target, skipped, resume);
  o.checking.bundle = !o.no_bundle;
  o.checking.command_line = command_line();
  PrintingListener listener(o.train, printing && Progress::wanted(o.quiet));
  const TrainingOutcome out = train_world(o, target, *data, params, resume, listener);
  listener.done();
  if (printing && (!o.report.empty() || !o.html.empty())) write_reports(o, target, out);
  const char* passed = target.backend->simulated ? "all steps ran (simulated ranks share one replica: no replica check)"
                                                 : "all steps passed the replica check";
  if (printing) std::printf("%s\n", out.passed ? passed : ("FAILED: " + out.failure).c_str());
  return out.passed ? exit_ok : exit_check_failed;
}

}  // namespace

Runner add_train(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* sub = app.add_subcommand("train", "Data-parallel training with the replica check on every step");
  o->model.add_to(*sub);
  TrainConfig& t = o->train;
  sub->add_option("--batch", t.batch, "Global batch per step (default 32)");
  sub->add_option("--steps", t.steps, "Total optimizer steps, counting those before a --resume (default 1)");
  sub->add_option("--optimizer", o->optimizer, "sgd (default), momentum or adam");
  sub->add_option("--lr", t.optimizer.lr, "Learning rate (default 0.01)");
  sub->add_option("--momentum", t.optimizer.momentum, "Momentum (default 0.9)");
  sub->add_option("--accumulate", t.accumulate, "Micro-batches per rank per step, at most a rank's share (default 1)");
  sub->add_flag("--linear-scaling", t.linear_scaling, "Multiply the learning rate by the world size");
  sub->add_option("--warmup-steps", t.warmup_steps,
                  "With --linear-scaling: raise the learning rate in equal steps from --lr to lr x N over the first K "
                  "steps (Goyal et al.'s gradual warm-up; default 0, none)");
  sub->add_option(
      "--bucket-mb", t.bucket_mb,
      "All-reduce the gradient in buckets of at most M MiB, in reverse layer order, each started as soon as the "
      "backward pass has produced it, overlapped with the rest of it (default 0: one all-reduce)");
  sub->add_option("--dataset-size", t.dataset_size, "Examples in the data set (default: one batch)");
  sub->add_option("--split", o->split, "strided (default) or contiguous");
  sub->add_option("--policy", o->policy, "pad (default), drop-last or uneven");
  sub->add_flag("--no-shuffle", o->no_shuffle, "Visit examples in order instead of shuffling each epoch");
  o->seed.add_to(*sub, "Seed of the parameters, the synthetic data and the shuffle");
  sub->add_option("--x", o->checking.x, "Inputs, .npy of shape (D, in)");
  sub->add_option("--y", o->checking.y, "Targets, .npy: (D, out) floats for mse, (D,) int64 classes for cross-entropy");
  sub->add_option("--init", o->init, "Directory of initial parameter .npy files (not with --resume)");
  sub->add_option("--checkpoint-dir", o->run.checkpoint_dir, "Write checkpoints here (rank 0 only)");
  sub->add_option("--checkpoint-every", o->run.checkpoint_every, "Checkpoint every K steps (default: only at the end)");
  sub->add_option("--keep", o->run.keep, "Checkpoints to keep (default 2)");
  sub->add_option("--resume", o->resume, "Continue from the newest usable checkpoint in this directory");
  sub->add_option("--log", o->run.log, "Append one JSON line a step to this file (rank 0 only)");
  sub->add_option("--report", o->report,
                  "Write a JSON report of the run to this file: the target, the configuration, each step's loss, "
                  "replica check and live gradient check, the verdict (rank 0 only)");
  sub->add_option("--html", o->html,
                  "Write the report as one self-contained HTML page: the loss curve, the live gradient error ratio "
                  "per step and the replica check (rank 0 only)");
  sub->add_flag("--quiet", o->quiet, "No progress line on a terminal");
  sub->add_option("--trace", o->checking.trace,
                  "Write a value-level trace here (rank 0): one JSON line a step with every rank's digests of its "
                  "examples, gradients, parameters, optimizer state and collectives (compare two with dpcheck diff)");
  sub->add_flag("--check-finite", o->checking.live.finite,
                "Every rank checks its loss and local gradient before the all-reduce; a NaN or infinity fails the "
                "run naming the step, rank and element");
  sub->add_option("--check-gradient-every", o->checking.live.gradient_every,
                  "Every K steps, hold the all-reduced gradient against the float64 reference of the whole batch "
                  "within the derived bound (0: never, the default)");
  sub->add_option("--bundle-dir", o->checking.bundle_dir,
                  "Where a failing check leaves its repro bundle for dpcheck replay (default: the current directory)");
  sub->add_flag("--no-bundle", o->no_bundle, "Leave no repro bundle when a check fails");
  o->target.add_to(*sub, target_option::training);
  o->target.reword("--mutant", "Train with a deliberately broken part (see dpcheck verify --list-mutants)");
  o->loss_scale.add_to(*sub);
  sub->add_option("--inject-fault", o->run.fault, "Testing: kill or stall --fault-rank at --fault-step")->group("");
  sub->add_option("--fault-rank", o->run.fault_rank, "")->group("");
  sub->add_option("--fault-step", o->run.fault_step, "")->group("");
  return [o, sub] {
    o->bundle_dir_given = sub->count("--bundle-dir") > 0;
    return run_train(*o);
  };
}

}  // namespace dpcheck::cli
