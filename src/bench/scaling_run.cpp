// `dpcheck bench scaling` as a run (src/bench/scaling_run.hpp): the measurement of each world, the report
// made of them and its table.
#include "src/bench/scaling_run.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <optional>
#include <ostream>
#include <utility>

#include "src/bench/bench.hpp"
#include "src/bench/scaling.hpp"
#include "src/error.hpp"
#include "src/io/process.hpp"
#include "src/train/bucketing.hpp"
#include "src/train/data.hpp"

namespace dpcheck::scaling {

namespace {

using WallClock = std::chrono::steady_clock;

double seconds_after(WallClock::time_point t0) { return std::chrono::duration<double>(WallClock::now() - t0).count(); }

// The slowest rank's seconds, on every rank.
double slowest_rank(Communicator& host, double seconds) {
  host.allreduce(&seconds, 1, DType::f64, ReduceOp::max);
  return seconds;
}

// The all-reduce sweep: powers of four from 4 KiB below the gradient's size, and the gradient itself.
std::vector<std::size_t> sweep_elements(std::size_t gradient) {
  std::vector<std::size_t> sizes;
  for (std::size_t n = 1024; n < gradient; n *= 4) sizes.push_back(n);
  sizes.push_back(gradient);
  return sizes;
}

// This rank's share of the batch: the indices split_sizes gives it.
std::vector<std::int64_t> batch_share(std::int64_t batch, const Communicator& comm) {
  const std::vector<std::int64_t> sizes = split_sizes(batch, comm.size());
  std::int64_t begin = 0;
  for (int r = 0; r < comm.rank(); ++r) begin += sizes[static_cast<std::size_t>(r)];
  std::vector<std::int64_t> share;
  for (std::int64_t i = 0; i < sizes[static_cast<std::size_t>(comm.rank())]; ++i) share.push_back(begin + i);
  return share;
}

// Compute alone: this rank's share of the batch fetched, forward, backward and the optimizer; the
// slowest rank's seconds of each timed step.
std::vector<double> measure_compute(const Setup& s, Communicator& comm, RankTrainer& rt, const Dataset& data) {
  const std::vector<std::int64_t> share = batch_share(s.train.batch, comm);
  const int n = comm.size();
  std::vector<double> compute;
  for (int i = 0; i < s.warmup + s.steps; ++i) {
    comm.host().barrier();
    const auto t0 = WallClock::now();
    // The step's examples are fetched every step, as the trainer fetches them.
    const Batch batch = data.gather(share);
    rt.engine->forward_backward(batch, 1.0f / static_cast<float>(n), false);
    rt.optimizer->step(rt.engine->params(), rt.engine->grads());
    rt.engine->synchronize();
    const double t = slowest_rank(comm.host(), seconds_after(t0));
    if (i >= s.warmup) compute.push_back(t);
  }
  return compute;
}

// The all-reduce of each size of the sweep, in the gradient's own buffer: [{bytes, seconds}].
nlohmann::json measure_sweep(Communicator& comm, RankTrainer& rt) {
  Communicator& host = comm.host();
  nlohmann::json sweep = nlohmann::json::array();
  for (std::size_t count : sweep_elements(rt.engine->param_count())) {
    for (int i = 0; i < 2; ++i) comm.allreduce(rt.engine->grads(), count, DType::f32, ReduceOp::avg);
    rt.engine->synchronize();
    host.barrier();
    auto t0 = WallClock::now();
    comm.allreduce(rt.engine->grads(), count, DType::f32, ReduceOp::avg);
    rt.engine->synchronize();
    // Enough calls for about 50 ms, the same number on every rank.
    const int iters =
        static_cast<int>(std::clamp(0.05 / std::max(slowest_rank(host, seconds_after(t0)), 1e-7), 3.0, 200.0));
    host.barrier();
    t0 = WallClock::now();
    for (int i = 0; i < iters; ++i) comm.allreduce(rt.engine->grads(), count, DType::f32, ReduceOp::avg);
    rt.engine->synchronize();
    sweep.push_back({{"bytes", count * sizeof(float)}, {"seconds", slowest_rank(host, seconds_after(t0)) / iters}});
  }
  return sweep;
}

// The data-parallel step as train runs it, with buckets of bucket_mb (0: one all-reduce after the
// backward pass): the median step, the median exposed communication, and the buckets of the last step.
struct StepFigures {
  double step = 0;
  double exposed = 0;
  std::size_t buckets = 0;
  std::size_t overlapped = 0;
};

StepFigures measure_steps(const Setup& s, double bucket_mb, Communicator& comm, const Dataset& data) {
  Communicator& host = comm.host();
  TrainConfig tb = s.train;
  tb.bucket_mb = bucket_mb;
  RankTrainer trainer = make_rank_trainer(s.target, tb, comm, data);
  std::vector<double> times, exposures;
  StepFigures f;
  for (int i = 0; i < s.warmup + s.steps; ++i) {
    host.barrier();
    const auto t0 = WallClock::now();
    const StepResult r = trainer.trainer->step();
    const double t = slowest_rank(host, seconds_after(t0));
    // On the critical path: the slowest rank's compute, then what the all-reduce adds after it (a
    // rank that finished early waits for the others, which is not the all-reduce's cost).
    const double e =
        slowest_rank(host, r.compute_seconds + r.exposed_comm_seconds) - slowest_rank(host, r.compute_seconds);
    if (i < s.warmup) continue;
    times.push_back(t);
    exposures.push_back(e);
    f.overlapped = r.buckets_overlapped;
    f.buckets = r.buckets;
  }
  f.exposed = bench::median(exposures);
  f.step = bench::median(times);
  return f;
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

double to_ms(double seconds) { return seconds * 1e3; }

// How far the report extrapolates the model: the scale class's largest world.
constexpr int kExtrapolateTo = 4096;

nlohmann::json ms_or_null(std::optional<double> seconds) {
  return seconds ? nlohmann::json(to_ms(*seconds)) : nlohmann::json(nullptr);
}

nlohmann::json int_or_null(std::optional<int> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

// The fit over every N's sweep; nullopt with fewer than two timings.
std::optional<AlphaBetaFit> fit_sweeps(const std::vector<nlohmann::json>& worlds) {
  std::vector<AllreduceSample> samples;
  for (const nlohmann::json& w : worlds)
    for (const nlohmann::json& s : w.at("allreduce"))
      samples.push_back({w.at("ranks").get<int>(), s.at("bytes").get<double>(), s.at("seconds").get<double>()});
  if (samples.size() < 2) return std::nullopt;
  return fit_alpha_beta(samples);
}

// The report's row of one N: the prediction against the world's figures, the speed-ups against the
// one-rank step `one`.
nlohmann::json report_row(const nlohmann::json& w, const Prediction& p, bool fitted, double gradient_bytes,
                          double one) {
  std::optional<double> measured_allreduce;
  for (const nlohmann::json& s : w.at("allreduce"))
    if (s.at("bytes").get<double>() == gradient_bytes) measured_allreduce = s.at("seconds").get<double>();
  const double step = w.at("step_s").get<double>(), bucketed = w.at("step_bucketed_s").get<double>();
  return {{"ranks", p.ranks},
          {"compute_ms", to_ms(p.compute)},
          {"allreduce_ms", ms_or_null(measured_allreduce)},
          {"allreduce_fit_ms", p.ranks > 1 && fitted ? nlohmann::json(to_ms(p.allreduce)) : nlohmann::json(nullptr)},
          {"predicted_ms", to_ms(p.step)},
          {"predicted_overlap_ms", to_ms(p.step_overlap)},
          {"measured_ms", to_ms(step)},
          {"measured_bucketed_ms", to_ms(bucketed)},
          {"speedup_predicted", p.speedup},
          {"speedup_predicted_overlap", p.speedup_overlap},
          {"speedup_measured", one / step},
          {"speedup_measured_bucketed", one / bucketed},
          {"model_error", step / p.step},
          {"model_error_overlap", bucketed / p.step_overlap},
          {"exposed_comm_ms", to_ms(w.at("exposed_s").get<double>())},
          {"exposed_comm_bucketed_ms", to_ms(w.at("exposed_bucketed_s").get<double>())},
          {"buckets", w.at("buckets")},
          {"buckets_overlapped", w.at("buckets_overlapped")}};
}

// printf into a string, for the report's fixed-width lines.
std::string formatted(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string formatted(const char* format, ...) {
  char line[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  return line;
}

}  // namespace

TrainConfig train_config(const ModelConfig& model, std::int64_t batch) {
  TrainConfig t;
  t.model = model;
  t.batch = batch;
  t.steps = 1 << 30;  // the trainer is stepped as often as the measurement needs
  t.optimizer.lr = 1e-3f;
  return t;
}

nlohmann::json measure_world(const Setup& s, Communicator& comm) {
  const SyntheticDataset data(s.train.batch, s.train.model, s.train.seed);
  const int n = comm.size();
  RankTrainer rt = make_rank_trainer(s.target, s.train, comm, data);
  const std::vector<double> compute = measure_compute(s, comm, rt, data);
  const nlohmann::json sweep = n > 1 ? measure_sweep(comm, rt) : nlohmann::json::array();
  const StepFigures one = measure_steps(s, 0, comm, data);
  const StepFigures bucketed = measure_steps(s, s.bucket_mb, comm, data);
  return {{"ranks", n},
          {"compute_s", bench::median(compute)},
          {"step_s", one.step},
          {"step_bucketed_s", bucketed.step},
          {"exposed_s", n > 1 ? one.exposed : 0.0},
          {"exposed_bucketed_s", n > 1 ? bucketed.exposed : 0.0},
          {"buckets", bucketed.buckets},
          {"buckets_overlapped", bucketed.overlapped},
          {"allreduce", sweep}};
}

std::vector<nlohmann::json> measure_worlds(const Setup& s, int world_size, const std::vector<std::string>& worker_args,
                                           const std::function<void(int n)>& on_world) {
  const Backend& row = *s.target.backend;
  bench::MpiWorkerLaunch launch;
  if (row.needs_launcher()) {
    launch.mpirun = find_in_path("mpirun");
    if (launch.mpirun.empty()) throw UsageError("--comm " + row.name + " runs under mpirun, which is not on PATH");
    launch.dpcheck = self_executable().string();
  }
  std::vector<nlohmann::json> worlds;
  for (int n = 1; n <= world_size; ++n) {
    on_world(n);
    if (row.needs_launcher()) {
      worlds.push_back(bench::run_mpi_worker(launch, n, worker_args, worker_world_prefix));
      continue;
    }
    std::mutex mu;
    nlohmann::json figures;
    run_world(s.target, n, [&](Communicator& comm) {
      nlohmann::json mine = measure_world(s, comm);
      if (comm.rank() != 0) return;
      const std::lock_guard<std::mutex> lock(mu);
      figures = std::move(mine);
    });
    worlds.push_back(std::move(figures));
  }
  return worlds;
}

nlohmann::json make_report(const Setup& s, const std::vector<nlohmann::json>& worlds) {
  const TrainConfig& t = s.train;
  const double gradient_bytes = static_cast<double>(parameter_count(t.model.dims)) * sizeof(float);
  // The prediction from each N's compute and the fitted all-reduce.
  const std::optional<AlphaBetaFit> fit = fit_sweeps(worlds);
  std::vector<int> ranks;
  std::vector<double> compute, allreduce;
  for (const nlohmann::json& w : worlds) {
    ranks.push_back(w.at("ranks").get<int>());
    compute.push_back(w.at("compute_s").get<double>());
    allreduce.push_back(fit ? fit->model.seconds(ranks.back(), gradient_bytes) : 0);
  }
  const std::vector<Prediction> predicted =
      predict(ranks, compute, allreduce, mlp_shape(t.model, bucket_elements(s.bucket_mb)), fit ? fit->model.alpha : 0);

  // Measured speed-ups against the one-rank step; the measured break-even from the exposed communication.
  const double one = worlds[0].at("step_s").get<double>();
  std::optional<int> measured_break_even;
  nlohmann::json rows = nlohmann::json::array();
  for (std::size_t i = 0; i < worlds.size(); ++i) {
    const Prediction& p = predicted[i];
    if (!measured_break_even && p.ranks > 1 && worlds[i].at("exposed_s").get<double>() >= p.compute)
      measured_break_even = p.ranks;
    rows.push_back(report_row(worlds[i], p, fit.has_value(), gradient_bytes, one));
  }
  // Beyond the sweep the model goes on with the fitted all-reduce and C(N) = c0 + c1/N fitted to the
  // measured compute (c0: what does not shrink with N, the optimizer's update of every parameter), for
  // the ring and for the double binary tree, up to N = kExtrapolateTo.
  std::optional<int> predicted_break_even = break_even(predicted), tree_break_even;
  nlohmann::json extrapolated = nlohmann::json::array();
  if (fit) {
    const auto [c0, c1] = compute_fit(ranks, compute);
    const auto compute_at = [c0 = c0, c1 = c1](int n) { return c0 + c1 / n; };
    for (int n = 2; n <= 1 << 16 && !(predicted_break_even && tree_break_even); ++n) {
      if (!predicted_break_even && n > ranks.back() && fit->model.seconds(n, gradient_bytes) >= compute_at(n))
        predicted_break_even = n;
      if (!tree_break_even && fit->model.tree_seconds(n, gradient_bytes) >= compute_at(n)) tree_break_even = n;
    }
    for (int n = 16; n <= kExtrapolateTo; n *= 2) {
      if (n <= ranks.back()) continue;
      const double ring = fit->model.seconds(n, gradient_bytes), tree = fit->model.tree_seconds(n, gradient_bytes);
      extrapolated.push_back({{"ranks", n},
                              {"compute_ms", to_ms(compute_at(n))},
                              {"ring_ms", to_ms(ring)},
                              {"tree_ms", to_ms(tree)},
                              {"speedup_ring", one / (compute_at(n) + ring)},
                              {"speedup_tree", one / (compute_at(n) + tree)}});
    }
  }
  return {{"command", "bench scaling"},
          {"model", dims_string(t.model.dims)},
          {"batch", t.batch},
          {"engine", s.target.engine->name},
          {"comm", s.target.backend->name},
          {"gradient_bytes", static_cast<std::int64_t>(gradient_bytes)},
          {"bucket_mb", s.bucket_mb},
          {"fit", fit ? nlohmann::json{{"alpha_us", fit->model.alpha * 1e6},
                                       {"beta_gbs", fit->model.beta / 1e9},
                                       {"rms_relative_error", fit->rms_relative_error},
                                       {"samples", fit->samples}}
                      : nlohmann::json(nullptr)},
          {"rows", rows},
          {"extrapolated", extrapolated},
          {"break_even",
           {{"predicted", int_or_null(predicted_break_even)},
            {"predicted_tree", int_or_null(tree_break_even)},
            {"measured", int_or_null(measured_break_even)}}}};
}

void print_report(std::ostream& out, const nlohmann::json& report) {
  const nlohmann::json& rows = report.at("rows");
  const int world_size = rows.back().at("ranks").get<int>();
  out << formatted(
      "dpcheck bench scaling: model %s, batch %lld, engine %s, comm %s; gradient %.2f MB; buckets of %g MiB\n",
      report.at("model").get<std::string>().c_str(), static_cast<long long>(report.at("batch").get<std::int64_t>()),
      report.at("engine").get<std::string>().c_str(), report.at("comm").get<std::string>().c_str(),
      report.at("gradient_bytes").get<double>() / 1e6, report.at("bucket_mb").get<double>());
  if (const nlohmann::json& fit = report.at("fit"); !fit.is_null()) {
    const double beta_gbs = fit.at("beta_gbs").get<double>();
    out << formatted(
        "all-reduce, ring alpha-beta fit over %zu timings (N = 2..%d): alpha %.1f us, beta %s, "
        "rms relative error %.0f%%\n",
        fit.at("samples").get<std::size_t>(), world_size, fit.at("alpha_us").get<double>(),
        beta_gbs > 0 ? formatted("%.2f GB/s", beta_gbs).c_str() : "unbounded (latency alone fits best)",
        fit.at("rms_relative_error").get<double>() * 100);
  }
  out << "times in ms per step; error = measured / predicted; exposed = communication the step did not hide\n";
  out << formatted("%4s %9s %9s %9s | %9s %9s %6s %7s %7s | %9s %9s %6s %7s %7s | %8s %8s\n", "N", "compute", "allred",
                   "fit", "predict", "measured", "error", "S pred", "S meas", "overlap", "bucketed", "error", "S pred",
                   "S meas", "exposed", "exp.bkt");
  for (const nlohmann::json& r : rows) {
    const auto num = [&](const char* k) { return r.at(k).is_null() ? std::nan("") : r.at(k).get<double>(); };
    out << formatted(
        "%4d %9.2f %9.2f %9.2f | %9.2f %9.2f %6.2f %7.2f %7.2f | %9.2f %9.2f %6.2f %7.2f %7.2f | %8.2f %8.2f\n",
        r.at("ranks").get<int>(), num("compute_ms"), num("allreduce_ms"), num("allreduce_fit_ms"), num("predicted_ms"),
        num("measured_ms"), num("model_error"), num("speedup_predicted"), num("speedup_measured"),
        num("predicted_overlap_ms"), num("measured_bucketed_ms"), num("model_error_overlap"),
        num("speedup_predicted_overlap"), num("speedup_measured_bucketed"), num("exposed_comm_ms"),
        num("exposed_comm_bucketed_ms"));
  }
  const nlohmann::json& predicted = report.at("break_even").at("predicted");
  const nlohmann::json& measured = report.at("break_even").at("measured");
  const auto n_text = [](const nlohmann::json& v) {
    return v.is_null() ? std::string("not reached") : "N = " + std::to_string(v.get<int>());
  };
  if (const nlohmann::json ext = report.value("extrapolated", nlohmann::json::array()); !ext.empty()) {
    out << "beyond the sweep, predicted: compute c0 + c1/N fitted to the measured; all-reduce from the fit, as a ring "
           "(latency 2(N - 1) alpha) and as a double binary tree (2 log2 N alpha)\n";
    out << formatted("%6s %9s %9s %9s %8s %8s\n", "N", "compute", "ring", "tree", "S ring", "S tree");
    for (const nlohmann::json& r : ext)
      out << formatted("%6d %9.3f %9.3f %9.3f %8.2f %8.2f\n", r.at("ranks").get<int>(),
                       r.at("compute_ms").get<double>(), r.at("ring_ms").get<double>(), r.at("tree_ms").get<double>(),
                       r.at("speedup_ring").get<double>(), r.at("speedup_tree").get<double>());
  }
  out << "break-even (exposed all-reduce >= compute): predicted " << n_text(predicted)
      << (!predicted.is_null() && predicted.get<int>() > world_size ? " (beyond the sweep: c0 + c1/N and the fit)" : "")
      << (report.at("break_even").contains("predicted_tree")
              ? ", as a tree " + n_text(report.at("break_even").at("predicted_tree"))
              : std::string())
      << ", measured " << (measured.is_null() ? "not reached by N = " + std::to_string(world_size) : n_text(measured))
      << "\n";
}

}  // namespace dpcheck::scaling
