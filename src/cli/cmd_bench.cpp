// `dpcheck bench`: collective benchmarks in the style of nccl-tests (src/bench/bench.hpp), one subcommand per
// collective. Each run measures its memcpy baseline first and prints one table; a wrong element in any
// row makes the exit status 1.
//
// `bench allreduce` puts the backends of the backend table that it runs in one table (by default local,
// threads of this process; mpi, dpcheck's mpi Communicator; and MPI_Allreduce, Open MPI's own, the
// baseline), with communicator plugins beside them. The process backends need one process per rank, so
// for each N it starts `mpirun -np N <this binary> bench allreduce-worker ...` (a hidden subcommand),
// whose rank 0 prints its rows as one JSON line (src/bench/allreduce_run.hpp runs it all).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "divergence/trace.hpp"
#include "src/bench/allreduce_run.hpp"
#include "src/bench/bench.hpp"
#include "src/bench/bench_cpu_step.hpp"
#include "src/choice.hpp"
#include "src/cli/cli_common.hpp"
#include "src/cli/cmd_bench_scaling.hpp"
#include "src/cli/commands.hpp"
#include "src/cli/gpu_report.hpp"
#include "src/comm/mpi_comm.hpp"
#include "src/error.hpp"
#include "src/gemm/cpu_gemm.hpp"
#include "src/io/files.hpp"
#include "src/io/process.hpp"
#include "src/plugin/plugin_loader.hpp"
#include "src/report/html.hpp"
#include "src/target/backends.hpp"
#include "src/target/cuda_plugin.hpp"
#include "src/target/plugin_comm.hpp"
#include "src/target/target.hpp"
#include "src/train/model.hpp"

namespace dpcheck::cli {

namespace {

struct AllreduceArgs {
  std::vector<std::string> plugins;  // --comm: communicator plugins, rows with the ranks as threads
  std::string sizes = "4K,1M,64M";
  std::string ranks = "2,4";
  std::string backends;  // empty: every available one
  int iters = 0;
  int warmup = 3;
  std::string json;
  std::string html;  // --html: the same as one self-contained page (src/report/html.hpp)
};

struct WorkerArgs {
  std::string backends;
  std::string sizes;
  int iters = 0;
  int warmup = 3;
};

// A communicator plugin's rows (--comm): its ranks as threads of this process, beside the table's.
bench::BenchBackend plugin_backend(const std::string& path) {
  if (!looks_like_plugin_path(path))
    throw UsageError("--comm " + path + ": give a communicator plugin's path (the built-in backends go in --backends)");
  // Loads and checks it: a host-memory plugin.
  const Backend& row = backend_for(std::string(engine_for_memory(MemorySpace::host).name), path);
  return bench::thread_backend(row, load_comm_plugin(path).name);
}

// --backends, or none when it was not given.
std::vector<const Backend*> backend_rows(const std::string& list) {
  return list.empty() ? std::vector<const Backend*>{} : parse_allreduce_backends(list);
}

int run_allreduce(const AllreduceArgs& args) {
  bench::AllreduceConfig cfg;
  cfg.sizes = bench::parse_sizes(args.sizes);
  cfg.ranks = bench::parse_ranks(args.ranks);
  if (args.iters < 0) throw UsageError("--iters must not be negative, got " + std::to_string(args.iters));
  if (args.warmup < 0) throw UsageError("--warmup must not be negative, got " + std::to_string(args.warmup));
  cfg.iters = args.iters;
  cfg.warmup = args.warmup;
  std::vector<bench::BenchBackend> plugins;
  for (const std::string& path : args.plugins) plugins.push_back(plugin_backend(path));
  const bench::AllreducePlan plan = bench::plan_allreduce(backend_rows(args.backends), std::move(plugins));

  // Checked before the run, so that a bad path fails in a second rather than after the benchmark.
  if (!args.json.empty()) check_output_path(args.json, "--json");
  if (!args.html.empty()) check_output_path(args.html, "--html");
  // Every rank holds a buffer of the largest size and the communicator a scratch copy or two, whether
  // the ranks are threads here or processes on this machine.
  const std::size_t largest = *std::max_element(cfg.sizes.begin(), cfg.sizes.end());
  const int most_ranks = *std::max_element(cfg.ranks.begin(), cfg.ranks.end());
  require_memory(3.0 * static_cast<double>(largest) * most_ranks, "--sizes " + args.sizes + " (" +
                                                                      std::to_string(largest) + " bytes on each of " +
                                                                      std::to_string(most_ranks) + " ranks)");

  const bench::AllreduceResult r = bench::run_allreduce(plan, cfg);
  bench::print_allreduce_table(std::cout, r.baseline, r.rows, plan.notes);
  const nlohmann::ordered_json json = bench::allreduce_json(r.baseline, r.rows, plan.notes);
  if (!args.json.empty()) write_file_atomic(args.json, json.dump(2) + "\n");
  if (!args.html.empty()) write_file_atomic(args.html, html::bench_page(json, "bench allreduce"));
  for (const bench::AllreduceRow& row : r.rows)
    if (row.wrong > 0) return exit_check_failed;
  return exit_ok;
}

// One rank of the process backends' rows, under the mpirun that run_allreduce started.
int run_allreduce_worker(const WorkerArgs& args) {
  Communicator* world = process_world();
  if (world == nullptr)
    throw UsageError("bench allreduce-worker runs under mpirun, as `dpcheck bench allreduce` starts it");
  bench::AllreduceConfig cfg;
  cfg.sizes = bench::parse_sizes(args.sizes);
  cfg.ranks = {world->size()};
  cfg.iters = args.iters;
  cfg.warmup = args.warmup;
  const std::vector<bench::AllreduceRow> rows =
      bench::allreduce_worker_rows(parse_allreduce_backends(args.backends), cfg, *world);
  if (world->rank() == 0)
    std::cout << bench::worker_rows_prefix << bench::allreduce_json(bench::MemcpyBaseline{}, rows).dump() << std::endl;
  return exit_ok;
}

struct StepArgs {
  TargetOptions target;  // --engine; empty: the device engine where a GPU is, else the host one
  std::string models;    // empty: the engine's default
  int warmup = 0;        // 0 and 0: the engine's defaults
  int repeats = 0;
  std::string python = "python3";
  std::string torch_script;  // empty: kTorchScript, found by find_torch_script
  bool no_torch = false;
  std::string json;
  std::string html;  // --html: the same as one self-contained page (src/report/html.hpp)
};

// bench step's models when --models is not given: the GPU engine's, the host engine's.
constexpr std::string_view kGpuStepModels = "1024,4096,4096,1024@8192:0.95;784,256,10@256:0.1";
constexpr std::string_view kCpuStepModels = "1024,2048,2048,1024@1024:0.7";
// The PyTorch baseline of both engines, relative to the repository's root.
constexpr std::string_view kTorchScript = "ci/torch_baseline.py";

struct TraceArgs {
  ModelOptions model;
  std::int64_t batch = 64;
  TargetOptions target;  // --engine and --world-size
  int steps = 40;
  int warmup = 5;
  std::string json;
  std::string html;  // --html: the same as one self-contained page (src/report/html.hpp)
};

struct HashArgs {
  std::string bytes = "4G";
  int repeats = 20;
  std::string json;
  std::string html;  // --html: the same as one self-contained page (src/report/html.hpp)
};

// "1024,4096,1024@8192:0.95;784,256,10@256" -> models with batch and goal.
std::vector<cuda::StepModel> parse_models(const std::string& text) {
  std::vector<cuda::StepModel> models;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ';');) {
    const std::size_t at = item.find('@');
    if (at == std::string::npos) throw UsageError("bad --models item '" + item + "': expected DIMS@BATCH[:GOAL]");
    cuda::StepModel m;
    m.dims = parse_dims(item.substr(0, at));
    const std::string rest = item.substr(at + 1);
    const std::size_t colon = rest.find(':');
    // Every field whole: "8:0.5x" or "8:0.5:9" is refused, not read as its start.
    const std::string batch = rest.substr(0, colon);
    const auto batch_end = std::from_chars(batch.data(), batch.data() + batch.size(), m.batch);
    if (batch.empty() || batch_end.ec != std::errc() || batch_end.ptr != batch.data() + batch.size() || m.batch < 1)
      throw UsageError("bad --models item '" + item + "': expected DIMS@BATCH[:GOAL] with a positive whole batch");
    if (colon != std::string::npos) {
      const std::string goal = rest.substr(colon + 1);
      const auto goal_end = std::from_chars(goal.data(), goal.data() + goal.size(), m.goal);
      // The goal is a ratio to the best GEMM's time: a finite number from 0 (none) up; nan, inf and
      // negative numbers would make every verdict the same.
      if (goal.empty() || goal_end.ec != std::errc() || goal_end.ptr != goal.data() + goal.size() ||
          !std::isfinite(m.goal) || m.goal < 0 || m.goal > 1000)
        throw UsageError("bad --models item '" + item + "': GOAL '" + goal +
                         "' must be a finite ratio from 0 to 1000 (the step's speed against the best GEMM's)");
    }
    models.push_back(m);
  }
  if (models.empty()) throw UsageError("--models is empty");
  return models;
}

// The PyTorch baseline script. --torch-script is taken as given (relative to the working directory) and
// must be a file. Without it, ci/torch_baseline.py is looked for in the working directory (the
// repository's root, where the docs run dpcheck from), then in the directories above this binary (a
// build directory inside the repository, build/dpcheck), so that a test or a user in another directory
// still finds it. "" when there is none, with `why` saying where it looked.
std::string find_torch_script(const std::string& given, std::string* why) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!given.empty()) {
    if (!fs::is_regular_file(given, ec))
      throw UsageError("--torch-script " + given + ": " +
                       (fs::exists(given, ec) ? "not a regular file" : "no such file") + " (or --no-torch)");
    return given;
  }
  if (fs::is_regular_file(std::string(kTorchScript), ec)) return std::string(kTorchScript);
  const fs::path self = self_executable(ec);
  if (!ec)
    for (fs::path dir = self.parent_path(); !dir.empty(); dir = dir.parent_path()) {
      const fs::path candidate = dir / kTorchScript;
      if (fs::is_regular_file(candidate, ec)) return candidate.string();
      if (dir == dir.root_path()) break;
    }
  *why = std::string(kTorchScript) + " is neither in the working directory nor in a directory above " +
         (self.empty() ? std::string("this binary") : self.string()) + "; --torch-script names it";
  return "";
}

// The CPU engine's step against bare GEMMs of its shapes (src/bench/bench_cpu_step.hpp), then PyTorch's;
// GOAL is the step's ratio to the best GEMM that counts as met.
// `note`, when not empty, is printed once every input has been checked (a refusal is one line).
int run_cpu_step(const StepArgs& a, bool warmup_given, bool repeats_given, const std::string& note) {
  std::vector<bench::CpuStepConfig> configs;
  const std::vector<cuda::StepModel> models = parse_models(a.models.empty() ? std::string(kCpuStepModels) : a.models);
  if (!a.json.empty()) check_output_path(a.json, "--json");
  if (!a.html.empty()) check_output_path(a.html, "--html");
  bench::TorchCpuOptions torch;
  torch.python = a.python;
  if (a.no_torch) {
    torch.skipped = "PyTorch baseline skipped (--no-torch)";
  } else {
    std::string why;
    torch.script = find_torch_script(a.torch_script, &why);
    torch.run = !torch.script.empty();
    if (!torch.run) torch.skipped = "PyTorch baseline skipped: " + why;
  }
  for (const cuda::StepModel& m : models) {
    bench::CpuStepConfig c;
    c.model = ModelConfig{m.dims, Activation::relu, Loss::mse};
    c.model.validate();
    c.batch = m.batch;
    // The engine's activations and deltas, the parameters and gradient, and every product's operands.
    const ModelConfig& mc = c.model;
    double widths = 0, gemm = 0;
    for (int w : mc.dims) widths += w;
    for (const bench::GemmShape& g : bench::step_gemms(mc, c.batch))
      gemm += static_cast<double>(g.m * g.k + g.k * g.n + g.m * g.n);
    require_memory(4.0 * (5.0 * widths * c.batch + 4.0 * static_cast<double>(ParamLayout(mc).size()) + gemm),
                   "--models " + dims_string(mc.dims) + "@" + std::to_string(c.batch));
    c.goal = m.goal;
    if (warmup_given) c.warmup = a.warmup;
    if (repeats_given) c.repeats = a.repeats;
    c.torch = torch;
    configs.push_back(c);
  }
  cpu::engine_isa();  // DPCHECK_CPU_ISA and DPCHECK_CPU_THREADS, before anything runs
  cpu::engine_threads();
  if (!note.empty()) std::cout << note << "\n";
  std::vector<bench::CpuStepResult> results;
  for (bench::CpuStepConfig& c : configs) {
    // No Python or no torch for one model is none for the next: say it once more without retrying.
    if (!results.empty() && results.back().torch.status == bench::TorchCpuStep::Status::skipped) {
      c.torch.run = false;
      c.torch.skipped = results.back().torch.note;
    }
    results.push_back(bench::bench_cpu_step(c));
  }
  bench::print_cpu_step_table(std::cout, results);
  if (!a.json.empty()) write_file_atomic(a.json, bench::cpu_step_json(results).dump(2) + "\n");
  if (!a.html.empty())
    write_file_atomic(
        a.html, html::bench_page(bench::cpu_step_json(results),
                                 "bench step --engine " + std::string(engine_for_memory(MemorySpace::host).name)));
  // Only the bits decide: a ratio on a shared machine is a figure to read, not a check.
  bool ok = true;
  for (const bench::CpuStepResult& r : results) ok &= r.same_bits;
  return ok ? exit_ok : exit_check_failed;
}

int run_step(const StepArgs& a, bool warmup_given, bool repeats_given) {
  if ((repeats_given && a.repeats < 1) || (warmup_given && a.warmup < 0))
    throw UsageError("--repeats must be at least 1 and --warmup at least 0");
  // Without --engine: the GPU's engine where a device answers, else the host's, saying why.
  const std::string host(engine_for_memory(MemorySpace::host).name), gpu(engine_for_memory(MemorySpace::device).name);
  std::string engine = a.target.engine;
  std::string note;
  if (engine.empty()) {
    std::string why;
    const cuda::Plugin* p = cuda_plugin(&why);
    engine = p != nullptr && p->device_available(&why) ? gpu : host;
    if (engine == host)
      note = "# no GPU for the " + gpu + " benchmark (" + why + "): the " + host + " one; --engine " + gpu + " or " +
             host + " to choose";
  }
  const EngineRow* row = nullptr;
  try {
    row = &find_engine(engine);
  } catch (const UsageError& e) {
    throw UsageError("--engine: " + std::string(e.what()));
  }
  if (row->memory == MemorySpace::host) return run_cpu_step(a, warmup_given, repeats_given, note);
  cuda::StepBenchOptions o;
  o.models = parse_models(a.models.empty() ? std::string(kGpuStepModels) : a.models);
  o.warmup = warmup_given ? a.warmup : 10;
  o.repeats = repeats_given ? a.repeats : 50;
  o.python = a.python;
  o.torch = !a.no_torch;
  if (o.torch) {
    // Not found: the plain name, so that the table's note says what Python could not open.
    std::string why;
    o.torch_script = find_torch_script(a.torch_script, &why);
    if (o.torch_script.empty()) o.torch_script = std::string(kTorchScript);
  }
  if (!a.json.empty()) check_output_path(a.json, "--json");
  if (!a.html.empty()) check_output_path(a.html, "--html");
  const std::vector<cuda::StepBenchRow> rows = require_cuda().bench_step(o);
  cuda::print_step_table(std::cout, rows);
  if (!a.json.empty()) write_file_atomic(a.json, cuda::step_json(rows).dump(2) + "\n");
  if (!a.html.empty()) write_file_atomic(a.html, html::bench_page(cuda::step_json(rows), "bench step"));
  bool ok = true;
  for (const cuda::StepBenchRow& r : rows) ok &= r.same_bits;
  return ok ? exit_ok : exit_check_failed;
}

int run_hash(const HashArgs& a) {
  if (a.repeats < 1) throw UsageError("--repeats must be at least 1");
  const std::size_t bytes = bench::parse_size(a.bytes);
  if (!a.json.empty()) check_output_path(a.json, "--json");
  if (!a.html.empty()) check_output_path(a.html, "--html");
  const cuda::HashBenchRow row = require_cuda().bench_hash(bytes, a.repeats);
  cuda::print_hash_table(std::cout, row);
  if (!a.json.empty()) write_file_atomic(a.json, cuda::hash_json(row).dump(2) + "\n");
  if (!a.html.empty()) write_file_atomic(a.html, html::bench_page(cuda::hash_json(row), "bench hash"));
  // Only timings: the hash's agreement with its reference is tests/hash_test.cpp's to check.
  return exit_ok;
}

// What train --trace costs: two trainers of the same run side by side, one plain and one with the
// recorder on (its communicator wrapper, its digests, the gather to rank 0 and the line written to a
// file), their steps interleaved so that both see the same machine; the medians of the step times.
int run_trace_bench(TraceArgs& a) {
  if (a.steps < 1 || a.warmup < 0) throw UsageError("--steps must be at least 1 and --warmup at least 0");
  TrainConfig t;
  t.model = a.model.config();
  t.batch = a.batch;
  t.steps = a.warmup + a.steps;
  const Target target = a.target.target();
  const int world = target.world_size;
  validate_target(target);
  t.validate(world);
  check_train_size(t, world, target);
  if (!a.json.empty()) check_output_path(a.json, "--json");
  if (!a.html.empty()) check_output_path(a.html, "--html");
  const SyntheticDataset data(t.data_size(), t.model, t.seed);
  const std::vector<std::string> state_names = make_cpu_optimizer(t.optimizer, 0)->state_names();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dpcheck-bench-trace-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<double> plain, traced;
  std::size_t line_bytes = 0;
  using clock = std::chrono::steady_clock;
  run_world(target, world, [&](Communicator& comm) {
    RankTrainer base = make_rank_trainer(target, t, comm, data);
    TraceRecorder recorder(t.model, state_names);
    TracingCommunicator tracing(comm, recorder);
    RankTrainer rec = make_rank_trainer(target, t, tracing, data);
    rec.trainer->set_observer(&recorder);
    const std::unique_ptr<RankZeroWriter> writer = make_writer(target, comm, {}, dir / "trace.jsonl");
    for (int s = 0; s < t.steps; ++s) {
      const auto t0 = clock::now();
      base.trainer->step();
      const auto t1 = clock::now();
      const StepResult r = rec.trainer->step();
      const nlohmann::json line = recorder.finish_step(comm.host(), r.step, {{"loss", r.loss}});
      writer->log(line);
      const auto t2 = clock::now();
      if (comm.rank() != 0 || s < a.warmup) continue;
      plain.push_back(std::chrono::duration<double>(t1 - t0).count());
      traced.push_back(std::chrono::duration<double>(t2 - t1).count());
      line_bytes = line.dump().size() + 1;
    }
  });
  std::filesystem::remove_all(dir);
  const double p = bench::median(plain), q = bench::median(traced);
  const double overhead = q / p - 1;
  std::printf("dpcheck bench trace: model %s, batch %lld, %d ranks, engine %s; median of %d steps after %d untimed\n",
              dims_string(t.model.dims).c_str(), static_cast<long long>(t.batch), world,
              std::string(target.engine->name).c_str(), a.steps, a.warmup);
  std::printf("%-22s %12s\n", "", "ms a step");
  std::printf("%-22s %12.3f\n", "step", p * 1e3);
  std::printf("%-22s %12.3f\n", "step with --trace", q * 1e3);
  std::printf("trace cost: %.2f%% of the step (goal under 5%%), %zu bytes a line\n", overhead * 100, line_bytes);
  const nlohmann::json figures{{"model", dims_string(t.model.dims)},
                               {"batch", t.batch},
                               {"world_size", world},
                               {"engine", target.engine->name},
                               {"step_s", p},
                               {"traced_step_s", q},
                               {"overhead", overhead},
                               {"line_bytes", line_bytes}};
  if (!a.json.empty()) write_file_atomic(a.json, figures.dump(2) + "\n");
  if (!a.html.empty()) write_file_atomic(a.html, html::bench_page(figures, "bench trace"));
  return exit_ok;
}

// `bench allreduce`, and the hidden `bench allreduce-worker` that it starts under mpirun.
BenchCommand add_bench_allreduce(CLI::App& bench) {
  CLI::App* allreduce =
      bench.add_subcommand("allreduce",
                           "In-place float32 sum all-reduce per world size and message size, with a 0-ULP check of "
                           "every element (#wrong) and a memcpy baseline measured in the same run");
  auto args = std::make_shared<AllreduceArgs>();
  allreduce->add_option("--sizes", args->sizes, "Message sizes in bytes, comma-separated; K, M and G are binary")
      ->capture_default_str();
  allreduce->add_option("--ranks", args->ranks, "World sizes, comma-separated")->capture_default_str();
  allreduce->add_option("--iters", args->iters, "Timed calls per row (default: enough for about 0.25 s a row)");
  allreduce->add_option("--warmup", args->warmup, "Untimed calls before timing each row")->capture_default_str();
  allreduce->add_option("--json", args->json, "Also write the table as JSON to this file");
  allreduce->add_option("--html", args->html, "Also write the table as one self-contained HTML page to this file");
  // The backends are rows of the backend table (src/target/backends.hpp), described as its Backend::bench says.
  std::vector<std::string> described;
  for (const Backend* row : allreduce_backends())
    described.push_back(allreduce_name(*row) + " (" + allreduce_help(*row) + ")");
  allreduce->add_option("--backends", args->backends,
                        "Backends, comma-separated, from " + and_list(described) + "; default: every one available");

  allreduce->add_option("--comm", args->plugins,
                        "A communicator plugin (a path to its shared object) whose rows join the table, its ranks as "
                        "threads (repeatable)");

  // Started by `bench allreduce` under mpirun; not for users, so hidden from --help.
  CLI::App* worker =
      bench.add_subcommand("allreduce-worker", "One rank of the " + and_list(allreduce_process_names()) + " rows");
  worker->group("");
  auto wargs = std::make_shared<WorkerArgs>();
  worker->add_option("--backends", wargs->backends)->required();
  worker->add_option("--sizes", wargs->sizes)->required();
  worker->add_option("--iters", wargs->iters);
  worker->add_option("--warmup", wargs->warmup);
  allreduce->allow_extras(false);

  BenchCommand c;
  c.names = {"allreduce"};
  c.run = [allreduce, args, worker, wargs]() -> std::optional<int> {
    if (allreduce->parsed()) return run_allreduce(*args);
    if (worker->parsed()) return run_allreduce_worker(*wargs);
    return std::nullopt;
  };
  return c;
}

BenchCommand add_bench_step(CLI::App& bench) {
  // The engines the step runs on, by where their buffers live: the GPU's against PyTorch, the host's
  // against bare GEMMs and PyTorch.
  const std::string host(engine_for_memory(MemorySpace::host).name), gpu(engine_for_memory(MemorySpace::device).name);
  CLI::App* step = bench.add_subcommand(
      "step",
      "The trainer's step (forward, MSE, backward, SGD): the CUDA engine's against PyTorch's on the same GPU, or "
      "the CPU engine's against bare GEMMs of the step's shapes on each code path and PyTorch's on as many "
      "threads, in the same run");
  auto sargs = std::make_shared<StepArgs>();
  sargs->target.engine.clear();
  sargs->target.add_to(*step, target_option::engine);
  sargs->target.reword("--engine", gpu + " (against PyTorch) or " + host +
                                       " (against bare GEMMs and PyTorch); default: " + gpu + " where a GPU is, else " +
                                       host);
  step->add_option("--models", sargs->models,
                   "Models as DIMS@BATCH[:GOAL], ';'-separated; GOAL is the step time over PyTorch's (" + gpu +
                       ", default " + std::string(kGpuStepModels) + ") or the step's GFLOP/s over the best GEMM's (" +
                       host + ", default " + std::string(kCpuStepModels) + ")");
  CLI::Option* step_warmup = step->add_option(
      "--warmup", sargs->warmup, "Untimed steps (and GEMM rounds) first; default 10 (" + gpu + "), 1 (" + host + ")");
  CLI::Option* step_repeats = step->add_option(
      "--repeats", sargs->repeats,
      "Timed steps (and GEMM rounds); the median is reported; default 50 (" + gpu + "), 7 (" + host + ")");
  step->add_option("--python", sargs->python, "Python with PyTorch for the baseline (both engines)")
      ->capture_default_str();
  step->add_option("--torch-script", sargs->torch_script,
                   "The PyTorch baseline script; default: " + std::string(kTorchScript) +
                       " in the working directory, else in a directory above this binary");
  step->add_flag("--no-torch", sargs->no_torch, "Skip the PyTorch baseline");
  step->add_option("--json", sargs->json, "Also write the table as JSON to this file");
  step->add_option("--html", sargs->html, "Also write the table as one self-contained HTML page to this file");

  BenchCommand c;
  c.names = {"step"};
  c.run = [step, sargs, step_warmup, step_repeats]() -> std::optional<int> {
    if (!step->parsed()) return std::nullopt;
    return run_step(*sargs, step_warmup->count() > 0, step_repeats->count() > 0);
  };
  return c;
}

BenchCommand add_bench_hash(CLI::App& bench) {
  CLI::App* hash = bench.add_subcommand("hash", "The replica hash's read bandwidth against a device-to-device copy's");
  auto hargs = std::make_shared<HashArgs>();
  hash->add_option("--bytes", hargs->bytes, "Buffer size; K, M and G are binary")->capture_default_str();
  hash->add_option("--repeats", hargs->repeats, "Timed runs; the median is reported")->capture_default_str();
  hash->add_option("--json", hargs->json, "Also write the table as JSON to this file");
  hash->add_option("--html", hargs->html, "Also write the table as one self-contained HTML page to this file");

  BenchCommand c;
  c.names = {"hash"};
  c.run = [hash, hargs]() -> std::optional<int> {
    if (!hash->parsed()) return std::nullopt;
    return run_hash(*hargs);
  };
  return c;
}

BenchCommand add_bench_trace(CLI::App& bench) {
  CLI::App* trace = bench.add_subcommand(
      "trace",
      "What train --trace costs, as a fraction of the step: the same run with and without it, steps interleaved");
  auto targs = std::make_shared<TraceArgs>();
  targs->model.dims = "784,256,10";
  targs->model.loss = "cross-entropy";
  targs->model.add_to(*trace, false);
  trace->add_option("--batch", targs->batch, "Global batch")->capture_default_str();
  trace->add_option("--steps", targs->steps, "Timed steps of each; the median is reported")->capture_default_str();
  trace->add_option("--warmup", targs->warmup, "Untimed steps first")->capture_default_str();
  targs->target.add_to(*trace, target_option::engine | target_option::world_size);
  targs->target.reword("--world-size", "Ranks, as threads (default 1)");
  trace->add_option("--json", targs->json, "Also write the figures as JSON to this file");
  trace->add_option("--html", targs->html, "Also write the figures as one self-contained HTML page to this file");

  BenchCommand c;
  c.names = {"trace"};
  c.run = [trace, targs]() -> std::optional<int> {
    if (!trace->parsed()) return std::nullopt;
    return run_trace_bench(*targs);
  };
  return c;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  CLI::App* bench =
      app.add_subcommand("bench", "Benchmark the collectives in the style of nccl-tests: one table a run");
  // Registered in the order --help lists them; the list of benchmarks names them in this one.
  const BenchCommand allreduce = add_bench_allreduce(*bench);
  const BenchCommand step = add_bench_step(*bench);
  const BenchCommand hash = add_bench_hash(*bench);
  const BenchCommand trace = add_bench_trace(*bench);
  const BenchCommand scaling = add_bench_scaling(*bench);
  const BenchCommand rounding = add_bench_rounding(*bench);
  const std::vector<BenchCommand> commands{allreduce, scaling, step, hash, trace, rounding};

  // A name that is not a benchmark is kept aside and reported as a usage error below, with the list
  // of benchmarks, instead of a generic parse error.
  bench->allow_extras();

  return [bench, commands]() -> int {
    for (const BenchCommand& c : commands)
      if (const std::optional<int> status = c.run()) return *status;
    const std::vector<std::string> extra = bench->remaining();
    if (!extra.empty()) {
      std::vector<std::string> names;
      for (const BenchCommand& c : commands) names.insert(names.end(), c.names.begin(), c.names.end());
      throw UsageError("bench: unknown benchmark '" + extra.front() + "' (available: " + joined_list(names, ", ") +
                       ")");
    }
    std::cerr << bench->help();
    return exit_usage;
  };
}

}  // namespace dpcheck::cli
