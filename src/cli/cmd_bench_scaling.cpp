// `dpcheck bench scaling`: whether adding ranks pays, for one model, batch, engine and communicator.
// For each N = 1..--world-size it measures, on N ranks together:
//   - the compute of a step on a share of B/N examples (forward, backward, optimizer; the slowest rank),
//   - the all-reduce (avg) of a sweep of sizes up to the gradient's, which fits the ring's alpha-beta
//     model over every N (src/bench/scaling.hpp),
//   - the data-parallel step as `train` runs it, with one all-reduce after the backward pass and with
//     the gradient in buckets overlapped with it (--bucket-mb), and the communication each leaves
//     exposed;
// then predicts the step with and without overlap from the compute and the fitted all-reduce, and
// prints predicted against measured, the model's error (measured / predicted), the speed-ups and the
// break-even N. The ranks are threads here (local), or one process each under an mpirun this command
// starts per N (mpi, as `bench allreduce` does), or GPUs (nccl, cuda-local). The measurement, the
// report and its table are src/bench/scaling_run.hpp's; this file reads the options and prints.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/bench/scaling_run.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/cmd_bench_scaling.hpp"
#include "src/cli/commands.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/report/html.hpp"
#include "src/target/target.hpp"
#include "src/train/bucketing.hpp"

namespace dpcheck::cli {

namespace {

struct ScalingArgs {
  ModelOptions model;
  std::int64_t batch = 256;
  int world_size = 4;
  int steps = 5;
  int warmup = 2;
  double bucket_mb = 1;
  TargetOptions target;  // --engine and --comm
  std::string json;
  std::string html;
  bool quiet = false;
};

Target target_of(const ScalingArgs& a) {
  Target target = a.target.target();
  target.world_size = 0;  // each N of the sweep gives its own
  return target;
}

// What the options ask bench scaling to measure; in a worker, on the launcher's world.
scaling::Setup setup_of(const ScalingArgs& a, Communicator* worker_world = nullptr) {
  scaling::Setup s;
  s.target = target_of(a);
  s.target.process_world = worker_world;
  if (worker_world) s.target.world_size = worker_world->size();
  s.train = scaling::train_config(a.model.config(), a.batch);
  s.steps = a.steps;
  s.warmup = a.warmup;
  s.bucket_mb = a.bucket_mb;
  return s;
}

// A double as the digits that read back as the same double.
std::string exact_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

std::vector<std::string> worker_args(const ScalingArgs& a) {
  return {"bench",        "scaling-worker",         "--model",     a.model.dims,
          "--activation", a.model.activation,       "--loss",      a.model.loss,
          "--batch",      std::to_string(a.batch),  "--steps",     std::to_string(a.steps),
          "--warmup",     std::to_string(a.warmup), "--bucket-mb", exact_text(a.bucket_mb),
          "--engine",     a.target.engine,          "--comm",      target_of(a).backend->name};
}

void validate(const ScalingArgs& a, Communicator* worker_world = nullptr) {
  const bool worker = worker_world != nullptr;
  if (a.world_size < 1 || a.world_size > 64) throw UsageError("--world-size must be from 1 to 64");
  if (a.batch < a.world_size)
    throw UsageError("--batch " + std::to_string(a.batch) + " must hold at least one example for each of the " +
                     std::to_string(a.world_size) + " ranks of --world-size");
  if (a.steps < 1) throw UsageError("--steps must be at least 1");
  if (a.warmup < 0) throw UsageError("--warmup must be at least 0");
  if (!(a.bucket_mb > 0))
    throw UsageError("--bucket-mb must be above 0: the buckets bench scaling compares against one all-reduce");
  bucket_elements(a.bucket_mb);
  Target target = target_of(a);
  target.process_world = worker_world;
  if (worker) target.world_size = worker_world->size();
  // A backend whose ranks are a launcher's processes is checked by the workers, under the mpirun that
  // bench scaling starts for each N.
  const Backend& row = *target.backend;
  if (worker || !row.needs_launcher()) validate_target(target);
  else if (!mpi_available())
    throw UsageError("--comm " + row.name + ": this build has no MPI backend (configure with -DDPCHECK_MPI=ON)");
  const TrainConfig t = scaling::train_config(a.model.config(), a.batch);
  t.validate(a.world_size);
  if (!worker) check_train_size(t, a.world_size, target);
}

int run_scaling(const ScalingArgs& a) {
  validate(a);
  if (!a.json.empty()) check_output_path(a.json, "--json");
  if (!a.html.empty()) check_output_path(a.html, "--html");
  if (process_world() != nullptr)
    throw UsageError("bench scaling starts the ranks of each N itself; run it without a launcher");
  const scaling::Setup setup = setup_of(a);
  Progress progress(Progress::wanted(a.quiet));
  const std::vector<nlohmann::json> worlds = scaling::measure_worlds(setup, a.world_size, worker_args(a), [&](int n) {
    progress.update("bench scaling: measuring N = " + std::to_string(n) + " of " + std::to_string(a.world_size) + ", " +
                    std::to_string(static_cast<long long>(progress.seconds())) + " s");
  });
  progress.done();
  const nlohmann::json report = scaling::make_report(setup, worlds);
  scaling::print_report(std::cout, report);
  if (!a.json.empty()) write_file_atomic(a.json, report.dump(2) + "\n");
  if (!a.html.empty()) write_file_atomic(a.html, html::scaling_page(report));
  return exit_ok;
}

int run_scaling_worker(const ScalingArgs& a) {
  Communicator* world = process_world();
  if (world == nullptr)
    throw UsageError("bench scaling-worker runs under mpirun, as `dpcheck bench scaling` starts it");
  ScalingArgs w = a;
  w.world_size = world->size();
  validate(w, world);
  const nlohmann::json figures = scaling::measure_world(setup_of(w, world), *world);
  if (world->rank() == 0) std::cout << scaling::worker_world_prefix << figures.dump() << std::endl;
  return exit_ok;
}

void add_common(CLI::App& sub, ScalingArgs& a) {
  a.model.dims = "512,1024,1024,512";
  a.model.add_to(sub, false);
  sub.add_option("--batch", a.batch, "Global batch per step")->capture_default_str();
  sub.add_option("--steps", a.steps, "Timed steps of each measurement; the median is reported")->capture_default_str();
  sub.add_option("--warmup", a.warmup, "Untimed steps first")->capture_default_str();
  sub.add_option("--bucket-mb", a.bucket_mb, "Bucket size of the overlapped rows, MiB")->capture_default_str();
  a.target.add_to(sub, target_option::engine | target_option::comm);
}

}  // namespace

BenchCommand add_bench_scaling(CLI::App& bench) {
  auto a = std::make_shared<ScalingArgs>();
  CLI::App* sub = bench.add_subcommand(
      "scaling",
      "Compute against communication for N = 1..--world-size: the step predicted from the compute and a fitted "
      "ring all-reduce, against the step measured, with and without buckets overlapped with the backward pass");
  add_common(*sub, *a);
  sub->add_option("--world-size", a->world_size, "The largest N (ranks as threads, or processes under mpirun)")
      ->capture_default_str();
  sub->add_option("--json", a->json, "Also write the report as JSON to this file");
  sub->add_option("--html", a->html,
                  "Also write the report as one self-contained HTML page: speed-up against N, measured and predicted, "
                  "the break-even marked");
  sub->add_flag("--quiet", a->quiet, "No progress line on a terminal");

  auto w = std::make_shared<ScalingArgs>();
  CLI::App* worker = bench.add_subcommand("scaling-worker", "One world of bench scaling's rows under mpirun");
  worker->group("");
  add_common(*worker, *w);

  BenchCommand c;
  c.names = {"scaling"};
  c.run = [sub, a, worker, w]() -> std::optional<int> {
    if (sub->parsed()) return run_scaling(*a);
    if (worker->parsed()) return run_scaling_worker(*w);
    return std::nullopt;
  };
  return c;
}

}  // namespace dpcheck::cli
