// dpcheck train: data-parallel training with every check on every step. Prints the loss and the
// replica check per step; on the first desync, or the first loss that is not finite, says so and exits
// 1. Checkpoints and the log go through the RankZeroWriter (never a checkpoint of parameters that are
// not finite); --resume continues a run bit for bit.
#include <CLI/CLI.hpp>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <span>
#include <thread>

#include "divergence/divergence.hpp"
#include "divergence/trace.hpp"
#include "properties/mutants.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/commands.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/report/html.hpp"
#include "src/target.hpp"

namespace dpcheck::cli {

namespace {

struct TrainOptions {
  ModelOptions model;
  TrainConfig train;
  std::string optimizer = "sgd", split = "strided", policy = "pad", mutant, engine{default_engine()}, comm, kernels;
  std::string x, y, init, checkpoint_dir, resume, log, trace, report, html;
  bool quiet = false;
  LiveCheckOptions checks;
  std::string bundle_dir = ".";
  bool bundle_dir_given = false;
  bool no_bundle = false;
  int checkpoint_every = 0;
  int keep = 2;
  bool no_shuffle = false;
  bool tf32 = false;
  int world_size = 1;
  bool world_size_given = false;
  SeedOption seed;
  TimeoutOption timeout;
  PrecisionOption precision;
  LossScaleOptions loss_scale;
  AllreduceDtypeOption allreduce_dtype;
  // Fault injection for the dead-rank tests: "kill" (SIGKILL) or "stall" (stop answering) at a step.
  std::string fault;
  int fault_rank = 1;
  int fault_step = 0;
};

int run_train(TrainOptions& o) {
  TrainConfig& t = o.train;
  t.model = o.model.config();
  t.optimizer.kind = parse_optimizer(o.optimizer);
  t.split = parse_split(o.split);
  t.policy = parse_policy(o.policy);
  t.shuffle = !o.no_shuffle;
  t.seed = o.seed.value();
  t.optimizer.validate();
  if (o.x.empty() != o.y.empty()) throw UsageError("give both --x and --y, or neither");
  if (o.checkpoint_every < 0) throw UsageError("--checkpoint-every must be at least 0");
  if (o.checkpoint_every > 0 && o.checkpoint_dir.empty()) throw UsageError("--checkpoint-every needs --checkpoint-dir");
  if (o.keep < 1) throw UsageError("--keep must be at least 1");
  if (!o.init.empty() && !o.resume.empty())
    throw UsageError("--init and --resume both give the starting parameters (--resume those of its checkpoint): give one");
  if (!o.fault.empty() && o.fault != "kill" && o.fault != "stall")
    throw UsageError("--inject-fault takes kill or stall");
  if (o.checks.gradient_every < 0) throw UsageError("--check-gradient-every must be at least 0");

  Target target;
  target.engine = o.engine;
  target.comm = o.comm;
  target.mutant = o.mutant;
  target.tf32 = o.tf32;
  target.kernels = o.kernels;
  target.timeout = o.timeout.value();
  target.precision = o.precision.value();
  t.loss_scaling = o.loss_scale.config(target.precision);
  t.allreduce_dtype = o.allreduce_dtype.value();
  target.allreduce_dtype = t.allreduce_dtype;
  const int world = resolve_world(target, o.world_size, o.world_size_given);
  target.world_size = world;
  // Each rank loads its own plugin: one that fails on one rank stops every rank at once.
  agree_on_rank_inputs([&] { validate_target(target); });
  // Before any work: a bad output path costs a second, not a training run.
  check_on_writing_rank([&] {
    if (!o.log.empty()) check_output_path(o.log, "--log", OutputMode::append);
    if (!o.report.empty()) check_output_path(o.report, "--report");
    if (!o.html.empty()) check_output_path(o.html, "--html");
    if (!o.checkpoint_dir.empty()) check_output_dir(o.checkpoint_dir, "--checkpoint-dir");
    if (!o.trace.empty()) check_output_path(o.trace, "--trace");
    // The default (the current directory) is not held against a run that may never fail: a read-only one
    // costs only the bundle, said when a check fails.
    if (!o.no_bundle && o.bundle_dir_given) check_output_dir(o.bundle_dir, "--bundle-dir");
  });

  // Each rank reads its own data files: one missing or damaged on one rank stops every rank at once.
  std::unique_ptr<Dataset> data;
  agree_on_rank_inputs([&] {
    if (!o.x.empty()) data = std::make_unique<ArrayDataset>(ArrayDataset::load(o.x, o.y, t.model));
  });
  if (data) {
    if (t.dataset_size != 0 && t.dataset_size != data->size())
      throw UsageError("--dataset-size is " + std::to_string(t.dataset_size) + " but --x holds " +
                       std::to_string(data->size()) + " examples");
    t.dataset_size = data->size();
  }
  t.validate(world);
  check_accumulate(t.accumulate, t.batch, world);
  check_train_size(t, world, target, o.checks.gradient_every > 0);
  if (!data) data = std::make_unique<SyntheticDataset>(t.data_size(), t.model, t.seed);
  std::vector<float> params;
  std::optional<Checkpoint> resume;
  std::vector<std::string> skipped;
  agree_on_rank_inputs([&] {
    params = o.init.empty() ? init_params(t.model, t.seed) : load_params_dir(o.init, t.model);
    if (!o.resume.empty()) resume = load_checkpoint(o.resume, t.model, &skipped);
  });
  if (resume) {
    const std::string mismatch = t.resume_mismatch(resume->config, world);
    if (!mismatch.empty()) throw UsageError("cannot resume from " + o.resume + ": " + mismatch);
  }

  const bool printing = is_printing_rank();
  if (printing) {
    std::printf("dpcheck train: model %s (%s, %s), %d ranks, batch %lld of %lld examples, %s lr %g%s, %d steps, "
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
      std::printf("gradient all-reduced in buckets of at most %g MiB, each started as the backward pass produces it "
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

  // Every rank sees the same reports, losses and parameters, so every rank stops at the same place;
  // rank 0 says why.
  std::atomic<bool> passed{true};
  std::string failure;
  // A timeout among threads: 1 while rank 0 writes its bundle, 2 when done; one thread reports it.
  std::atomic<int> timeout_bundle{0};
  std::atomic<bool> timeout_reported{false};
  const ParamLayout layout(t.model);
  const nlohmann::json target_json = {{"engine", target.engine}, {"comm", target.comm}, {"kernels", target.kernels},
                                      {"mutant", target.mutant}, {"tf32", target.tf32},
                                      {"precision", precision_name(target.precision)}};
  const std::vector<std::string> state_names = make_cpu_optimizer(t.optimizer, 0)->state_names();
  // Rank 0's steps, for --report and --html; and the progress line on a terminal.
  nlohmann::json report_steps = nlohmann::json::array();
  Progress progress(printing && Progress::wanted(o.quiet));
  run_world(target, world, [&](Communicator& world_comm) {
    // With --trace, the trainer talks through the recorder's wrapper, which sees its data collectives.
    TraceRecorder recorder(t.model, state_names);
    recorder.set_digest_prefix(trace_digest_prefix(target));
    std::optional<TracingCommunicator> traced;
    Communicator& comm = o.trace.empty() ? world_comm : traced.emplace(world_comm, recorder);
    RankTrainer rt = make_rank_trainer(target, t, comm, *data);
    rt.engine->load_params(params);
    if (resume) rt.trainer->restore(*resume);
    const std::unique_ptr<RankZeroWriter> writer = make_writer(target, comm, o.checkpoint_dir, o.log, o.keep);
    std::unique_ptr<RankZeroWriter> trace_writer;
    if (!o.trace.empty()) {
      trace_writer = make_writer(target, comm, {}, o.trace);
      trace_writer->start_log_fresh();
      trace_writer->log(trace_header(t.to_json(world), target_json, world, t.model, state_names));
    }
    LiveChecks checks(target, o.checks);
    StepObservers observers;
    if (!o.trace.empty()) observers.add(&recorder);
    if (o.checks.finite || o.checks.gradient_every > 0) observers.add(&checks);
    if (!observers.empty()) rt.trainer->set_observer(&observers);
    const bool speaks = comm.rank() == 0;
    // Rank 0 keeps the state before each step, and the one the run began from, for the bundle that a
    // failing step leaves.
    const bool bundles = !o.no_bundle && speaks;
    Checkpoint before, start;
    if (bundles) start = rt.trainer->checkpoint();
    // Every rank calls it at the same step (collective: false when a peer may be gone, and then only
    // the rank that saw it): says why, and leaves the bundle.
    const auto fail = [&](const StepFailure& f, bool collective) {
      passed = false;
      if (speaks) failure = f.message;
      if (o.no_bundle || !speaks) {
        if (collective && !o.no_bundle) comm.host().barrier();  // rank 0 writes the bundle meanwhile
        return;
      }
      try {
        BundleManifest m;
        m.config = t;
        m.world_size = world;
        m.target = target;
        m.checks = o.checks;
        m.command_line = command_line();
        if (!o.x.empty()) {
          m.x = std::filesystem::absolute(o.x).string();
          m.y = std::filesystem::absolute(o.y).string();
          m.x_xxh3 = file_xxh3(o.x);
          m.y_xxh3 = file_xxh3(o.y);
        }
        m.version = DPCHECK_VERSION;
        m.failure = f;
        for (int r = 0; r < world; ++r) m.indices.push_back(rt.trainer->rank_indices(r, f.step));
        const std::filesystem::path path = fresh_bundle_path(o.bundle_dir, f.step);
        // Rank 0 alone, so that a bundle it cannot write (a full disk, a read-only directory) costs the
        // bundle and not a hang of the others in a collective.
        write_bundle(target, comm, path, m, before, start, o.trace, false);
        failure += "\nrepro bundle " + path.string() + "; replay it with: " + bundle_replay_command(target, path);
      } catch (const std::exception& e) {
        failure += std::string("\nno repro bundle: ") + e.what();
      }
      if (collective) comm.host().barrier();
    };
    while (rt.trainer->next_step() < t.steps) {
      if (!o.fault.empty() && comm.rank() == o.fault_rank && rt.trainer->next_step() == o.fault_step) {
        if (o.fault == "kill") ::raise(SIGKILL);
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // stops answering
      }
      if (bundles) rt.trainer->checkpoint_into(before);
      const std::int64_t step = rt.trainer->next_step();
      checks.clear();
      std::optional<StepFailure> failed;
      StepResult r;
      try {
        r = rt.trainer->step();
      } catch (const StepCheckFailed& e) {
        failed = e.failure;
      } catch (const TimeoutError& e) {
        // A peer that stopped answering: rank 0 leaves a bundle, then the run ends as a timeout does.
        if (writer) writer->flush();
        if (trace_writer) trace_writer->flush();
        StepFailure f;
        f.kind = "timeout";
        f.step = step;
        f.message = e.what();
        if (speaks) {
          timeout_bundle = 1;
          fail(f, false);
          timeout_bundle = 2;
          std::printf("%s\n", failure.substr(failure.find('\n') + 1).c_str());
          std::fflush(stdout);
        }
        if (target.process_world) throw;  // the launcher ends the other processes
        // Ranks as threads: the stuck one can neither be stopped nor joined, so the process ends here,
        // as the plugin watchdog ends it. Another rank gives rank 0 a moment to start its bundle (rank 0
        // may be the stuck one) and, once started, the time to finish it; one thread says why.
        if (!speaks) {
          const auto until = std::chrono::steady_clock::now() + std::min<std::chrono::milliseconds>(target.timeout, std::chrono::seconds(5));
          while (timeout_bundle == 0 && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          while (timeout_bundle == 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (!timeout_reported.exchange(true)) {
          print_error(e.what());
          std::_Exit(exit_runtime_error);
        }
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // the reporting thread ends the process
      }
      if (!o.trace.empty()) {
        nlohmann::json extra = {{"loss", failed ? nlohmann::json(nullptr) : nlohmann::json(r.loss)},
                                {"global_batch", rt.trainer->global_batch(step)}};
        if (!checks.last().empty()) extra["checks"] = checks.last();
        if (failed) extra["failure"] = failed->to_json();
        const nlohmann::json line = recorder.finish_step(comm.host(), step, std::move(extra));
        trace_writer->log(line);
      }
      if (failed) {
        if (speaks) {
          std::printf("%s\n", failed->message.c_str());
          std::fflush(stdout);
        }
        writer->log({{"step", step}, {"failure", failed->to_json()}});
        if (trace_writer) trace_writer->flush();
        fail(*failed, true);
        break;
      }
      if (speaks) {
        nlohmann::json row = {{"step", r.step},
                              {"loss", std::isfinite(r.loss) ? nlohmann::json(r.loss) : nlohmann::json(nullptr)},
                              {"skipped", r.skipped},
                              {"loss_scale", r.loss_scale},
                              {"replicas_identical", r.replicas.synchronized},
                              {"gradient_error_ratio", checks.last().contains("gradient_ratio")
                                                           ? checks.last()["gradient_ratio"]
                                                           : nlohmann::json(nullptr)}};
        report_steps.push_back(std::move(row));
        progress.done();
        std::printf("step %4lld  loss %-14s global batch %-6lld %s", static_cast<long long>(r.step),
                    float_text(r.loss).c_str(), static_cast<long long>(r.global_batch), r.replicas.describe().c_str());
        if (checks.last().contains("gradient_ratio"))
          std::printf("  gradient error ratio %.3g", checks.last()["gradient_ratio"].get<double>());
        if (t.loss_scaling.enabled())
          std::printf("  loss scale %s%s", float_text(r.loss_scale).c_str(), r.skipped ? " (step skipped: non-finite gradient)" : "");
        std::printf("\n");
        std::fflush(stdout);
        progress.update("train: step " + std::to_string(r.step + 1) + " of " + std::to_string(t.steps) + ", " +
                        std::to_string(static_cast<long long>(progress.seconds())) + " s");
      }
      nlohmann::json record = {{"step", r.step},
                               {"loss", r.loss},
                               {"global_batch", r.global_batch},
                               {"replicas_identical", r.replicas.synchronized},
                               {"hash", r.replicas.hashes.empty() ? 0 : r.replicas.hashes[0]}};
      if (checks.last().contains("gradient_ratio")) record["gradient_ratio"] = checks.last()["gradient_ratio"];
      if (t.loss_scaling.enabled()) {
        record["loss_scale"] = r.loss_scale;
        record["skipped"] = r.skipped;
      }
      if (t.bucket_mb > 0) {
        record["compute_ms"] = r.compute_seconds * 1e3;
        record["exposed_comm_ms"] = r.exposed_comm_seconds * 1e3;
        record["buckets"] = r.buckets;
        record["buckets_overlapped"] = r.buckets_overlapped;
      }
      writer->log(record);
      if (!r.replicas.synchronized) {
        if (trace_writer) trace_writer->flush();
        fail(replica_failure(r.replicas), true);
        break;
      }
      // The loss is all-reduced, so every rank holds the same one. A NaN or an infinity spreads to every
      // parameter, identically on every rank, where the replica check cannot see it -- unless the loss
      // scaler passed the step over, which leaves the parameters as they were.
      if (!std::isfinite(r.loss) && !r.skipped) {
        if (trace_writer) trace_writer->flush();
        fail(loss_failure(r.step, r.loss), true);
        break;
      }
      const std::int64_t done = rt.trainer->next_step();
      if (!o.checkpoint_dir.empty() && ((o.checkpoint_every > 0 && done % o.checkpoint_every == 0) || done == t.steps)) {
        const Checkpoint c = rt.trainer->checkpoint();
        if (has_non_finite(c.params) || has_non_finite(c.optimizer_state)) {
          fail(non_finite_state_failure(r.step, c.params, c.optimizer_state, layout, ""), true);
          if (speaks) failure += "\nstopped without writing the checkpoint of step " + std::to_string(done);
          break;
        }
        const std::filesystem::path saved = writer->save(c, t.model);
        if (speaks && !saved.empty()) std::printf("checkpoint %s\n", saved.string().c_str());
      } else if (done == t.steps) {
        std::vector<float> last(layout.size());
        rt.engine->store_params(last);
        if (has_non_finite(last)) fail(non_finite_state_failure(r.step, last, {}, layout, ""), true);
      }
    }
    writer->flush();
    if (trace_writer) trace_writer->flush();
  });
  progress.done();
  if (printing && (!o.report.empty() || !o.html.empty())) {
    const nlohmann::json report = {{"command", "train"},
                                   {"target", target_json},
                                   {"config", t.to_json(world)},
                                   {"passed", passed.load()},
                                   {"failure", passed ? nlohmann::json(nullptr) : nlohmann::json{{"message", failure}}},
                                   {"steps", report_steps}};
    if (!o.report.empty()) write_file_atomic(o.report, report.dump(2) + "\n");
    if (!o.html.empty()) write_file_atomic(o.html, html::train_page(report));
  }
  if (printing) std::printf("%s\n", passed ? "all steps passed the replica check" : ("FAILED: " + failure).c_str());
  return passed ? exit_ok : exit_check_failed;
}

}  // namespace

Runner add_train(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* sub = app.add_subcommand("train", "Data-parallel training with the replica check on every step");
  o->model.add_to(*sub);
  TrainConfig& t = o->train;
  sub->add_option("--batch", t.batch, "Global batch per step (default 32)");
  sub->add_option("--steps", t.steps, "Total optimizer steps, counting those before a --resume (default 1)");
  sub->add_option("--world-size", o->world_size, "Number of ranks (default 1; under a launcher, its processes)");
  sub->add_option("--optimizer", o->optimizer, "sgd (default), momentum or adam");
  sub->add_option("--lr", t.optimizer.lr, "Learning rate (default 0.01)");
  sub->add_option("--momentum", t.optimizer.momentum, "Momentum (default 0.9)");
  sub->add_option("--accumulate", t.accumulate, "Micro-batches per rank per step, at most a rank's share (default 1)");
  sub->add_flag("--linear-scaling", t.linear_scaling, "Multiply the learning rate by the world size");
  sub->add_option("--warmup-steps", t.warmup_steps,
                  "With --linear-scaling: raise the learning rate in equal steps from --lr to lr x N over the first K "
                  "steps (Goyal et al.'s gradual warm-up; default 0, none)");
  sub->add_option("--bucket-mb", t.bucket_mb,
                  "All-reduce the gradient in buckets of at most M MiB, in reverse layer order, each started as soon as the "
                  "backward pass has produced it, overlapped with the rest of it (default 0: one all-reduce)");
  sub->add_option("--dataset-size", t.dataset_size, "Examples in the data set (default: one batch)");
  sub->add_option("--split", o->split, "strided (default) or contiguous");
  sub->add_option("--policy", o->policy, "pad (default), drop-last or uneven");
  sub->add_flag("--no-shuffle", o->no_shuffle, "Visit examples in order instead of shuffling each epoch");
  o->seed.add_to(*sub, "Seed of the parameters, the synthetic data and the shuffle");
  sub->add_option("--x", o->x, "Inputs, .npy of shape (D, in)");
  sub->add_option("--y", o->y, "Targets, .npy: (D, out) floats for mse, (D,) int64 classes for cross-entropy");
  sub->add_option("--init", o->init, "Directory of initial parameter .npy files (not with --resume)");
  sub->add_option("--checkpoint-dir", o->checkpoint_dir, "Write checkpoints here (rank 0 only)");
  sub->add_option("--checkpoint-every", o->checkpoint_every, "Checkpoint every K steps (default: only at the end)");
  sub->add_option("--keep", o->keep, "Checkpoints to keep (default 2)");
  sub->add_option("--resume", o->resume, "Continue from the newest usable checkpoint in this directory");
  sub->add_option("--log", o->log, "Append one JSON line a step to this file (rank 0 only)");
  sub->add_option("--report", o->report,
                  "Write a JSON report of the run to this file: the target, the configuration, each step's loss, "
                  "replica check and live gradient check, the verdict (rank 0 only)");
  sub->add_option("--html", o->html,
                  "Write the report as one self-contained HTML page: the loss curve, the live gradient error ratio "
                  "per step and the replica check (rank 0 only)");
  sub->add_flag("--quiet", o->quiet, "No progress line on a terminal");
  sub->add_option("--trace", o->trace,
                  "Write a value-level trace here (rank 0): one JSON line a step with every rank's digests of its "
                  "examples, gradients, parameters, optimizer state and collectives (compare two with dpcheck diff)");
  sub->add_flag("--check-finite", o->checks.finite,
                "Every rank checks its loss and local gradient before the all-reduce; a NaN or infinity fails the "
                "run naming the step, rank and element");
  sub->add_option("--check-gradient-every", o->checks.gradient_every,
                  "Every K steps, hold the all-reduced gradient against the float64 reference of the whole batch "
                  "within the derived bound (0: never, the default)");
  sub->add_option("--bundle-dir", o->bundle_dir,
                  "Where a failing check leaves its repro bundle for dpcheck replay (default: the current directory)");
  sub->add_flag("--no-bundle", o->no_bundle, "Leave no repro bundle when a check fails");
  sub->add_option("--mutant", o->mutant, "Train with a deliberately broken part (see dpcheck verify --list-mutants)");
  sub->add_option("--engine", o->engine, engine_option_help());
  sub->add_option("--comm", o->comm, comm_option_help());
  sub->add_flag("--tf32", o->tf32, "cuda engine: TF32 matrix products");
  add_kernels_option(*sub, o->kernels);
  o->precision.add_to(*sub);
  o->loss_scale.add_to(*sub);
  o->allreduce_dtype.add_to(*sub);
  o->timeout.add_to(*sub);
  sub->add_option("--inject-fault", o->fault, "Testing: kill or stall --fault-rank at --fault-step")->group("");
  sub->add_option("--fault-rank", o->fault_rank, "")->group("");
  sub->add_option("--fault-step", o->fault_step, "")->group("");
  return [o, sub] {
    o->world_size_given = sub->count("--world-size") > 0;
    o->bundle_dir_given = sub->count("--bundle-dir") > 0;
    if (sub->count("--comm") == 0) o->comm = default_comm(o->engine);
    return run_train(*o);
  };
}

}  // namespace dpcheck::cli
