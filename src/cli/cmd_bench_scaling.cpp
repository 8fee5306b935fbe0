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
// starts per N (mpi, as `bench allreduce` does), or GPUs (nccl, cuda-local).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "src/bench/bench.hpp"
#include "src/bench/scaling.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/cmd_bench_scaling.hpp"
#include "src/cli/commands.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/error.hpp"
#include "src/io/files.hpp"
#include "src/io/process.hpp"
#include "src/report/html.hpp"
#include "src/target.hpp"

namespace dpcheck::cli {

namespace {

constexpr std::string_view kWorkerPrefix = "dpcheck-scaling-world: ";

struct ScalingArgs {
  ModelOptions model;
  std::int64_t batch = 256;
  int world_size = 4;
  int steps = 5;
  int warmup = 2;
  double bucket_mb = 1;
  std::string engine{default_engine()};
  std::string comm;
  std::string json;
  std::string html;
  bool quiet = false;
};

TrainConfig train_config(const ScalingArgs& a) {
  TrainConfig t;
  t.model = a.model.config();
  t.batch = a.batch;
  t.steps = 1 << 30;  // the trainer is stepped as often as the measurement needs
  t.optimizer.lr = 1e-3f;
  return t;
}

Target target_of(const ScalingArgs& a) {
  Target target;
  target.engine = a.engine;
  target.comm = a.comm.empty() ? default_comm(a.engine) : a.comm;
  return target;
}

// The all-reduce sweep: powers of four from 4 KiB below the gradient's size, and the gradient itself.
std::vector<std::size_t> sweep_elements(std::size_t gradient) {
  std::vector<std::size_t> sizes;
  for (std::size_t n = 1024; n < gradient; n *= 4) sizes.push_back(n);
  sizes.push_back(gradient);
  return sizes;
}

// One world's figures, measured by every rank together; rank 0's (every process's) result.
nlohmann::json measure_world(const ScalingArgs& a, const Target& target, Communicator& comm) {
  using clock = std::chrono::steady_clock;
  const TrainConfig t = train_config(a);
  Communicator& host = comm.host();
  const auto slowest = [&](double seconds) {
    host.allreduce(&seconds, 1, DType::f64, ReduceOp::max);
    return seconds;
  };
  const auto since = [](clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); };
  const SyntheticDataset data(t.batch, t.model, t.seed);
  const int n = comm.size();

  // Compute alone: this rank's share of the batch fetched, forward, backward and the optimizer.
  RankTrainer rt = make_rank_trainer(target, t, comm, data);
  std::vector<std::int64_t> share;
  {
    const std::vector<std::int64_t> sizes = split_sizes(t.batch, n);
    std::int64_t begin = 0;
    for (int r = 0; r < comm.rank(); ++r) begin += sizes[static_cast<std::size_t>(r)];
    for (std::int64_t i = 0; i < sizes[static_cast<std::size_t>(comm.rank())]; ++i) share.push_back(begin + i);
  }
  std::vector<double> compute;
  for (int i = 0; i < a.warmup + a.steps; ++i) {
    host.barrier();
    const auto t0 = clock::now();
    // The step's examples are fetched every step, as the trainer fetches them.
    const Batch batch = data.gather(share);
    rt.engine->forward_backward(batch, 1.0f / static_cast<float>(n), false);
    rt.optimizer->step(rt.engine->params(), rt.engine->grads());
    rt.engine->synchronize();
    const double s = slowest(since(t0));
    if (i >= a.warmup) compute.push_back(s);
  }

  // The all-reduce of each size of the sweep, in the gradient's own buffer.
  const std::size_t gradient = rt.engine->param_count();
  nlohmann::json sweep = nlohmann::json::array();
  if (n > 1) {
    for (std::size_t count : sweep_elements(gradient)) {
      for (int i = 0; i < 2; ++i) comm.allreduce(rt.engine->grads(), count, DType::f32, ReduceOp::avg);
      rt.engine->synchronize();
      host.barrier();
      auto t0 = clock::now();
      comm.allreduce(rt.engine->grads(), count, DType::f32, ReduceOp::avg);
      rt.engine->synchronize();
      // Enough calls for about 50 ms, the same number on every rank.
      const int iters = static_cast<int>(std::clamp(0.05 / std::max(slowest(since(t0)), 1e-7), 3.0, 200.0));
      host.barrier();
      t0 = clock::now();
      for (int i = 0; i < iters; ++i) comm.allreduce(rt.engine->grads(), count, DType::f32, ReduceOp::avg);
      rt.engine->synchronize();
      sweep.push_back({{"bytes", count * sizeof(float)}, {"seconds", slowest(since(t0)) / iters}});
    }
  }

  // The data-parallel step as train runs it, without buckets and with them.
  const auto steps = [&](double bucket_mb, double* exposed, std::size_t* overlapped, std::size_t* buckets) {
    TrainConfig tb = t;
    tb.bucket_mb = bucket_mb;
    RankTrainer trainer = make_rank_trainer(target, tb, comm, data);
    std::vector<double> times, exposures;
    for (int i = 0; i < a.warmup + a.steps; ++i) {
      host.barrier();
      const auto t0 = clock::now();
      const StepResult r = trainer.trainer->step();
      const double s = slowest(since(t0));
      // On the critical path: the slowest rank's compute, then what the all-reduce adds after it (a
      // rank that finished early waits for the others, which is not the all-reduce's cost).
      const double e = slowest(r.compute_seconds + r.exposed_comm_seconds) - slowest(r.compute_seconds);
      if (i < a.warmup) continue;
      times.push_back(s);
      exposures.push_back(e);
      *overlapped = r.buckets_overlapped;
      *buckets = r.buckets;
    }
    *exposed = bench::median(exposures);
    return bench::median(times);
  };
  double exposed = 0, exposed_bucketed = 0;
  std::size_t overlapped = 0, buckets = 0, unused = 0;
  const double step = steps(0, &exposed, &unused, &unused);
  const double step_bucketed = steps(a.bucket_mb, &exposed_bucketed, &overlapped, &buckets);
  return {{"ranks", n},
          {"compute_s", bench::median(compute)},
          {"step_s", step},
          {"step_bucketed_s", step_bucketed},
          {"exposed_s", n > 1 ? exposed : 0.0},
          {"exposed_bucketed_s", n > 1 ? exposed_bucketed : 0.0},
          {"buckets", buckets},
          {"buckets_overlapped", overlapped},
          {"allreduce", sweep}};
}

// A double as the digits that read back as the same double.
std::string exact_text(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}

std::vector<std::string> worker_args(const ScalingArgs& a) {
  return {"bench",    "scaling-worker", "--model",     a.model.dims,
          "--activation", a.model.activation, "--loss", a.model.loss,
          "--batch",  std::to_string(a.batch), "--steps", std::to_string(a.steps),
          "--warmup", std::to_string(a.warmup), "--bucket-mb", exact_text(a.bucket_mb),
          "--engine", a.engine, "--comm", target_of(a).comm};
}

void validate(const ScalingArgs& a, Communicator* worker_world = nullptr) {
  const bool worker = worker_world != nullptr;
  if (a.world_size < 1 || a.world_size > 64) throw UsageError("--world-size must be from 1 to 64");
  if (a.batch < a.world_size)
    throw UsageError("--batch " + std::to_string(a.batch) + " must hold at least one example for each of the " +
                     std::to_string(a.world_size) + " ranks of --world-size");
  if (a.steps < 1) throw UsageError("--steps must be at least 1");
  if (a.warmup < 0) throw UsageError("--warmup must be at least 0");
  if (!(a.bucket_mb > 0)) throw UsageError("--bucket-mb must be above 0: the buckets bench scaling compares against one all-reduce");
  bucket_elements(a.bucket_mb);
  Target target = target_of(a);
  target.process_world = worker_world;
  if (worker) target.world_size = worker_world->size();
  // A backend whose ranks are a launcher's processes is checked by the workers, under the mpirun that
  // bench scaling starts for each N.
  const Backend& row = backend_for(target.engine, target.comm);
  if (worker || !row.needs_launcher())
    validate_target(target);
  else if (!mpi_available())
    throw UsageError("--comm " + target.comm + ": this build has no MPI backend (configure with -DDPCHECK_MPI=ON)");
  const TrainConfig t = train_config(a);
  t.validate(a.world_size);
  if (!worker) check_train_size(t, a.world_size, target);
}

// c0 + c1/N by least squares over the measured compute, neither below zero; C(1)/N alone from one N.
std::pair<double, double> compute_fit(const std::vector<int>& ranks, const std::vector<double>& compute) {
  if (ranks.size() < 2) return {0.0, compute[0]};
  double n = 0, su = 0, suu = 0, sy = 0, suy = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const double u = 1.0 / ranks[i];
    n += 1;
    su += u;
    suu += u * u;
    sy += compute[i];
    suy += u * compute[i];
  }
  const double det = n * suu - su * su;
  double c1 = det > 0 ? (n * suy - su * sy) / det : compute[0];
  double c0 = (sy - c1 * su) / n;
  if (c1 < 0) {
    c1 = 0;
    c0 = sy / n;
  } else if (c0 < 0) {
    c0 = 0;
    c1 = suy / suu;
  }
  return {c0, c1};
}

double ms(double seconds) { return seconds * 1e3; }
std::string gbs_text(double bytes_per_second) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GB/s", bytes_per_second / 1e9);
  return text;
}
nlohmann::json ms_or_null(std::optional<double> seconds) {
  return seconds ? nlohmann::json(ms(*seconds)) : nlohmann::json(nullptr);
}

int run_scaling(const ScalingArgs& a) {
  validate(a);
  if (!a.json.empty()) check_output_path(a.json, "--json");
  if (!a.html.empty()) check_output_path(a.html, "--html");
  Target target = target_of(a);
  const Backend& row = backend_for(target.engine, target.comm);
  if (process_world() != nullptr)
    throw UsageError("bench scaling starts the ranks of each N itself; run it without a launcher");
  bench::MpiWorkerLaunch launch;
  if (row.needs_launcher()) {
    launch.mpirun = find_in_path("mpirun");
    if (launch.mpirun.empty()) throw UsageError("--comm " + target.comm + " runs under mpirun, which is not on PATH");
    launch.dpcheck = self_executable().string();
  }
  const TrainConfig t = train_config(a);
  const std::size_t gradient_elements = static_cast<std::size_t>(parameter_count(t.model.dims));
  const double gradient_bytes = static_cast<double>(gradient_elements) * sizeof(float);
  Progress progress(Progress::wanted(a.quiet));

  std::vector<nlohmann::json> worlds;
  for (int n = 1; n <= a.world_size; ++n) {
    progress.update("bench scaling: measuring N = " + std::to_string(n) + " of " + std::to_string(a.world_size) + ", " +
                    std::to_string(static_cast<long long>(progress.seconds())) + " s");
    if (row.needs_launcher()) {
      worlds.push_back(bench::run_mpi_worker(launch, n, worker_args(a), kWorkerPrefix));
      continue;
    }
    std::mutex mu;
    nlohmann::json figures;
    run_world(target, n, [&](Communicator& comm) {
      nlohmann::json mine = measure_world(a, target, comm);
      if (comm.rank() != 0) return;
      const std::lock_guard<std::mutex> lock(mu);
      figures = std::move(mine);
    });
    worlds.push_back(std::move(figures));
  }
  progress.done();

  // The fit over every N's sweep; the prediction from each N's compute and the fitted all-reduce.
  std::vector<scaling::AllreduceSample> samples;
  for (const nlohmann::json& w : worlds)
    for (const nlohmann::json& s : w.at("allreduce"))
      samples.push_back({w.at("ranks").get<int>(), s.at("bytes").get<double>(), s.at("seconds").get<double>()});
  std::optional<scaling::AlphaBetaFit> fit;
  if (samples.size() >= 2) fit = scaling::fit_alpha_beta(samples);
  std::vector<int> ranks;
  std::vector<double> compute, allreduce;
  for (const nlohmann::json& w : worlds) {
    ranks.push_back(w.at("ranks").get<int>());
    compute.push_back(w.at("compute_s").get<double>());
    allreduce.push_back(fit ? fit->model.seconds(ranks.back(), gradient_bytes) : 0);
  }
  const std::size_t cap = bucket_elements(a.bucket_mb);
  const std::vector<scaling::Prediction> predicted =
      scaling::predict(ranks, compute, allreduce, scaling::mlp_shape(t.model, cap), fit ? fit->model.alpha : 0);

  // Measured speed-ups against the one-rank step; the measured break-even from the exposed communication.
  const double one = worlds[0].at("step_s").get<double>();
  std::optional<int> measured_break_even;
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < worlds.size(); ++i) {
    const nlohmann::json& w = worlds[i];
    const scaling::Prediction& p = predicted[i];
    std::optional<double> measured_allreduce;
    for (const nlohmann::json& s : w.at("allreduce"))
      if (s.at("bytes").get<double>() == gradient_bytes) measured_allreduce = s.at("seconds").get<double>();
    const double step = w.at("step_s").get<double>(), bucketed = w.at("step_bucketed_s").get<double>();
    const double exposed = w.at("exposed_s").get<double>();
    if (!measured_break_even && p.ranks > 1 && exposed >= p.compute) measured_break_even = p.ranks;
    rows.push_back({{"ranks", p.ranks},
                    {"compute_ms", ms(p.compute)},
                    {"allreduce_ms", ms_or_null(measured_allreduce)},
                    {"allreduce_fit_ms", p.ranks > 1 && fit ? nlohmann::json(ms(p.allreduce)) : nlohmann::json(nullptr)},
                    {"predicted_ms", ms(p.step)},
                    {"predicted_overlap_ms", ms(p.step_overlap)},
                    {"measured_ms", ms(step)},
                    {"measured_bucketed_ms", ms(bucketed)},
                    {"speedup_predicted", p.speedup},
                    {"speedup_predicted_overlap", p.speedup_overlap},
                    {"speedup_measured", one / step},
                    {"speedup_measured_bucketed", one / bucketed},
                    {"model_error", step / p.step},
                    {"model_error_overlap", bucketed / p.step_overlap},
                    {"exposed_comm_ms", ms(exposed)},
                    {"exposed_comm_bucketed_ms", ms(w.at("exposed_bucketed_s").get<double>())},
                    {"buckets", w.at("buckets")},
                    {"buckets_overlapped", w.at("buckets_overlapped")}});
  }
  // Beyond the sweep the model goes on with the fitted all-reduce and C(N) = c0 + c1/N fitted to the
  // measured compute (c0: what does not shrink with N, the optimizer's update of every parameter).
  std::optional<int> predicted_break_even = scaling::break_even(predicted);
  if (!predicted_break_even && fit) {
    const auto [c0, c1] = compute_fit(ranks, compute);
    for (int n = a.world_size + 1; n <= 1 << 16 && !predicted_break_even; ++n)
      if (fit->model.seconds(n, gradient_bytes) >= c0 + c1 / n) predicted_break_even = n;
  }
  const auto or_null = [](std::optional<int> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json report = {
      {"command", "bench scaling"},
      {"model", dims_string(t.model.dims)},
      {"batch", t.batch},
      {"engine", target.engine},
      {"comm", target.comm},
      {"gradient_bytes", static_cast<std::int64_t>(gradient_bytes)},
      {"bucket_mb", a.bucket_mb},
      {"fit", fit ? nlohmann::json{{"alpha_us", fit->model.alpha * 1e6},
                                   {"beta_gbs", fit->model.beta / 1e9},
                                   {"rms_relative_error", fit->rms_relative_error},
                                   {"samples", fit->samples}}
                  : nlohmann::json(nullptr)},
      {"rows", rows},
      {"break_even", {{"predicted", or_null(predicted_break_even)}, {"measured", or_null(measured_break_even)}}}};

  std::printf("dpcheck bench scaling: model %s, batch %lld, engine %s, comm %s; gradient %.2f MB; buckets of %g MiB\n",
              dims_string(t.model.dims).c_str(), static_cast<long long>(t.batch), target.engine.c_str(),
              target.comm.c_str(), gradient_bytes / 1e6, a.bucket_mb);
  if (fit)
    std::printf("all-reduce, ring alpha-beta fit over %zu timings (N = 2..%d): alpha %.1f us, beta %s, "
                "rms relative error %.0f%%\n",
                fit->samples, a.world_size, fit->model.alpha * 1e6,
                fit->model.beta > 0 ? gbs_text(fit->model.beta).c_str() : "unbounded (latency alone fits best)",
                fit->rms_relative_error * 100);
  std::printf("times in ms per step; error = measured / predicted; exposed = communication the step did not hide\n");
  std::printf("%4s %9s %9s %9s | %9s %9s %6s %7s %7s | %9s %9s %6s %7s %7s | %8s %8s\n", "N", "compute", "allred",
              "fit", "predict", "measured", "error", "S pred", "S meas", "overlap", "bucketed", "error", "S pred",
              "S meas", "exposed", "exp.bkt");
  for (const nlohmann::json& r : rows) {
    const auto num = [&](const char* k) { return r.at(k).is_null() ? std::nan("") : r.at(k).get<double>(); };
    std::printf("%4d %9.2f %9.2f %9.2f | %9.2f %9.2f %6.2f %7.2f %7.2f | %9.2f %9.2f %6.2f %7.2f %7.2f | %8.2f %8.2f\n",
                r.at("ranks").get<int>(), num("compute_ms"), num("allreduce_ms"), num("allreduce_fit_ms"),
                num("predicted_ms"), num("measured_ms"), num("model_error"), num("speedup_predicted"),
                num("speedup_measured"), num("predicted_overlap_ms"), num("measured_bucketed_ms"),
                num("model_error_overlap"), num("speedup_predicted_overlap"), num("speedup_measured_bucketed"),
                num("exposed_comm_ms"), num("exposed_comm_bucketed_ms"));
  }
  const auto n_text = [](std::optional<int> v) { return v ? "N = " + std::to_string(*v) : std::string("not reached"); };
  std::printf("break-even (exposed all-reduce >= compute): predicted %s%s, measured %s\n",
              n_text(predicted_break_even).c_str(),
              predicted_break_even && *predicted_break_even > a.world_size ? " (beyond the sweep: c0 + c1/N and the fit)" : "",
              measured_break_even ? n_text(measured_break_even).c_str() : ("not reached by N = " + std::to_string(a.world_size)).c_str());
  if (!a.json.empty()) write_file_atomic(a.json, report.dump(2) + "\n");
  if (!a.html.empty()) write_file_atomic(a.html, html::scaling_page(report));
  return exit_ok;
}

int run_scaling_worker(const ScalingArgs& a) {
  Communicator* world = process_world();
  if (world == nullptr) throw UsageError("bench scaling-worker runs under mpirun, as `dpcheck bench scaling` starts it");
  ScalingArgs w = a;
  w.world_size = world->size();
  validate(w, world);
  Target target = target_of(w);
  target.process_world = world;
  target.world_size = world->size();
  const nlohmann::json figures = measure_world(w, target, *world);
  if (world->rank() == 0) std::cout << kWorkerPrefix << figures.dump() << std::endl;
  return exit_ok;
}

void add_common(CLI::App& sub, ScalingArgs& a) {
  a.model.dims = "512,1024,1024,512";
  a.model.add_to(sub, false);
  sub.add_option("--batch", a.batch, "Global batch per step")->capture_default_str();
  sub.add_option("--steps", a.steps, "Timed steps of each measurement; the median is reported")->capture_default_str();
  sub.add_option("--warmup", a.warmup, "Untimed steps first")->capture_default_str();
  sub.add_option("--bucket-mb", a.bucket_mb, "Bucket size of the overlapped rows, MiB")->capture_default_str();
  sub.add_option("--engine", a.engine, engine_option_help());
  sub.add_option("--comm", a.comm, comm_option_help());
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
