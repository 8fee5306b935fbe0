// `dpcheck bench step --engine cpu` (src/bench/bench_cpu_step.hpp): the bare GEMM rows, the step's row,
// PyTorch's row, the table and its JSON form.
#include "src/bench/bench_cpu_step.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <ostream>

#include "src/bench/bench.hpp"
#include "src/error.hpp"
#include "src/io/process.hpp"
#include "src/target/backends.hpp"
#include "src/train/data.hpp"
#include "src/train/engine.hpp"
#include "src/train/optimizer.hpp"

namespace dpcheck::bench {

namespace {

using Clock = std::chrono::steady_clock;

// The median seconds of `repeats` calls of fn after `warmup` untimed ones.
double time_median(int warmup, int repeats, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    fn();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return bench::median(times);
}

// A product's operands and result, filled (so touched) before anything is timed.
struct GemmBuffers {
  GemmShape shape;
  std::vector<float> a, b, c;
};

void fill(std::vector<float>& v, std::uint32_t seed) {
  std::uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) * 0x1p-23f - 1.0f;  // [-1, 1)
  }
}

// The last line of `text` that holds more than blanks, its control characters escaped, cut to `most`
// characters: the reason a child gives, kept to one line of the table.
std::string last_line(const std::string& text, std::size_t most = 200) {
  std::size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const std::size_t newline = text.rfind('\n', end);
  const std::size_t start = newline == std::string::npos ? 0 : newline + 1;
  std::string line = text.substr(start, end + 1 - start);
  if (line.size() > most) line = line.substr(0, most) + "...";
  return escape_control(line);
}

// ci/torch_baseline.py's status when torch cannot be imported.
constexpr int kExitNoTorch = 3;

// OpenBLAS's x86-64 kernels that use AVX-512, and those that use AVX2 at least (its names, lower case).
bool openblas_core_has(cpu::Isa isa, std::string core) {
  for (char& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const std::vector<std::string> avx512{"skylakex", "cooperlake", "sapphirerapids"};
  std::vector<std::string> avx2{"haswell", "zen", "excavator"};
  avx2.insert(avx2.end(), avx512.begin(), avx512.end());
  const std::vector<std::string>& cores = isa == cpu::Isa::avx512 ? avx512 : avx2;
  return std::find(cores.begin(), cores.end(), core) != cores.end();
}

// The note for an OpenBLAS kernel narrower than the widest vectors this CPU has, else "".
std::string blas_kernel_note(const TorchCpuStep& t) {
  if (t.blas != "OpenBLAS" || t.blas_core.empty()) return "";
  const std::vector<cpu::Isa> isas = cpu::available_isas();
  struct Fit {
    cpu::Isa isa;
    const char* name;
    const char* core;
  };
  for (const Fit& f : {Fit{cpu::Isa::avx512, "AVX-512", "SkylakeX"}, Fit{cpu::Isa::avx2, "AVX2", "Haswell"}})
    if (std::find(isas.begin(), isas.end(), f.isa) != isas.end()) {
      if (openblas_core_has(f.isa, t.blas_core)) return "";
      return "OpenBLAS runs its " + t.blas_core + " kernel on this " + f.name +
             " CPU (it did not recognize the model), so PyTorch's products run below the CPU's speed; "
             "OPENBLAS_CORETYPE=" +
             f.core + " in the environment picks the fitting kernel";
    }
  return "";
}

}  // namespace

const char* torch_status_name(TorchCpuStep::Status s) {
  switch (s) {
    case TorchCpuStep::Status::ran: return "ran";
    case TorchCpuStep::Status::skipped: return "skipped";
    case TorchCpuStep::Status::failed: return "failed";
  }
  return "?";
}

TorchCpuStep torch_cpu_step(const TorchCpuOptions& options, const ModelConfig& model, int batch, int threads,
                            int warmup, int repeats) {
  TorchCpuStep t;
  if (!options.run) {
    t.note = options.skipped;
    return t;
  }
  t.python = options.python;
  t.script = options.script;
  ChildOptions child;
  child.argv = {options.python, options.script,          "--device", "cpu",
                "--dims",       dims_string(model.dims), "--batch",  std::to_string(batch),
                "--threads",    std::to_string(threads), "--warmup", std::to_string(warmup),
                "--repeats",    std::to_string(repeats)};
  child.search_path = true;
  child.input = ChildOptions::Input::null;
  child.out = ChildOptions::Output::capture;
  child.err = ChildOptions::Output::capture;
  ChildResult ran;
  try {
    ran = run_child(child);
  } catch (const ChildStartError& e) {
    t.note = std::string("PyTorch baseline skipped: ") + e.what() + " (--python names the interpreter)";
    return t;
  }
  if (ran.signal == 0 && ran.exit_code == kExitNoTorch) {
    t.note = "PyTorch baseline skipped: " + last_line(ran.err) + " (--python names another interpreter)";
    return t;
  }
  const std::string line = last_line(ran.out, std::string::npos);
  if (!ran.succeeded() || line.empty() || line.front() != '{') {
    const std::string why = last_line(ran.err.empty() ? ran.out : ran.err);
    t.status = TorchCpuStep::Status::failed;
    t.note = "PyTorch baseline failed: " + options.python + " " + options.script + " " + ran.status_text() +
             (why.empty() ? "" : ": " + why);
    return t;
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(line);
    t.ms = j.at("median_ms").get<double>();
    t.threads = j.at("threads").get<int>();
    t.version = j.at("torch").get<std::string>();
    t.blas = j.at("blas").get<std::string>();
    const auto text = [&](const char* key) {
      return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
    };
    t.blas_version = text("blas_version");
    t.blas_library = text("blas_library");
    if (j.contains("blas_threads") && j["blas_threads"].is_number_integer())
      t.blas_threads = j["blas_threads"].get<int>();
    t.blas_core = text("blas_core");
    if (!(t.ms > 0)) throw Error("median_ms is not above 0");
  } catch (const std::exception& e) {
    t = TorchCpuStep{};
    t.python = options.python;
    t.script = options.script;
    t.status = TorchCpuStep::Status::failed;
    t.note = "PyTorch baseline failed: unreadable output from " + options.script + ": " + last_line(e.what());
    return t;
  }
  t.status = TorchCpuStep::Status::ran;
  t.blas_kernel_note = blas_kernel_note(t);
  return t;
}

std::vector<GemmShape> step_gemms(const ModelConfig& model, int batch) {
  std::vector<GemmShape> out;
  const std::ptrdiff_t n = batch;
  for (int l = 0; l < model.layers(); ++l) {
    const std::ptrdiff_t in = model.dims[static_cast<std::size_t>(l)], o = model.dims[static_cast<std::size_t>(l) + 1];
    const std::string name = "layers." + std::to_string(l);
    out.push_back({name + " forward in*W^T", false, true, n, o, in});
    out.push_back({name + " weight grad d^T*in", true, false, o, in, n});
    if (l > 0) out.push_back({name + " input grad d*W", false, false, n, in, o});
  }
  return out;
}

CpuStepResult bench_cpu_step(const CpuStepConfig& config) {
  CpuStepResult result;
  result.config = config;
  result.engine_path = cpu::describe_engine_path();
  const std::vector<GemmShape> shapes = step_gemms(config.model, config.batch);
  for (const GemmShape& s : shapes) result.flops += s.flops();

  std::vector<GemmBuffers> buffers;
  std::uint32_t seed = 1;
  for (const GemmShape& s : shapes) {
    GemmBuffers g{s, std::vector<float>(static_cast<std::size_t>(s.m * s.k)),
                  std::vector<float>(static_cast<std::size_t>(s.k * s.n)),
                  std::vector<float>(static_cast<std::size_t>(s.m * s.n))};
    fill(g.a, seed++);
    fill(g.b, seed++);
    fill(g.c, seed++);
    buffers.push_back(std::move(g));
  }
  std::vector<int> thread_counts{1};
  if (cpu::cores() > 1) thread_counts.push_back(cpu::cores());
  for (cpu::Isa isa : cpu::available_isas())
    for (int threads : thread_counts) {
      const double t = time_median(config.warmup, config.repeats, [&] {
        for (GemmBuffers& g : buffers)
          cpu::gemm(isa, threads, g.shape.trans_a, g.shape.trans_b, g.shape.m, g.shape.n, g.shape.k, g.a.data(),
                    g.b.data(), g.c.data(), false);
      });
      result.rows.push_back({"GEMMs", isa, threads, t * 1e3, result.flops / t / 1e9, 0});
    }
  buffers.clear();

  // The step as the trainer runs it on one rank: the engine's forward, loss and backward, then SGD.
  const ModelConfig& m = config.model;
  const SyntheticDataset data(config.batch, m, 7);
  std::vector<std::int64_t> indices(static_cast<std::size_t>(config.batch));
  std::iota(indices.begin(), indices.end(), std::int64_t{0});
  const Batch batch = data.gather(indices);
  const std::vector<float> init = init_params(m, 7);
  const std::unique_ptr<Engine> engine = make_cpu_engine(m);
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::sgd;
  sgd.lr = 1e-4;
  engine->load_params(init);
  std::unique_ptr<Optimizer> optimizer = make_cpu_optimizer(sgd, engine->param_count());
  const auto step = [&] {
    engine->forward_backward(batch, 1.0f, false);
    optimizer->step(engine->params(), engine->grads());
  };
  const double t = time_median(config.warmup, config.repeats, step);
  result.rows.push_back({"step", cpu::engine_isa(), cpu::engine_threads(), t * 1e3, result.flops / t / 1e9, 0});

  // Two steps from the same state, on fresh optimizers: the same bits, or replay could not work.
  std::vector<std::vector<float>> after(2, std::vector<float>(engine->param_count()));
  for (std::vector<float>& p : after) {
    engine->load_params(init);
    optimizer = make_cpu_optimizer(sgd, engine->param_count());
    step();
    engine->store_params(p);
  }
  result.same_bits = std::memcmp(after[0].data(), after[1].data(), after[0].size() * sizeof(float)) == 0;

  // PyTorch last, once every buffer of dpcheck's is gone, on the threads dpcheck's step used.
  result.torch = torch_cpu_step(config.torch, m, config.batch, result.step().threads, config.warmup, config.repeats);
  if (result.torch.status == TorchCpuStep::Status::ran)
    result.torch.gflops = result.flops / (result.torch.ms * 1e-3) / 1e9;

  double best = 0;
  for (const CpuStepRow& r : result.rows)
    if (r.what == "GEMMs") best = std::max(best, r.gflops);
  for (CpuStepRow& r : result.rows) r.of_best = best > 0 ? r.gflops / best : 0;
  result.torch.of_best = best > 0 ? result.torch.gflops / best : 0;
  return result;
}

namespace {

// "OpenBLAS 0.3.21 (kernel SkylakeX, its own pool: 2 threads)", as much as the baseline could tell.
std::string blas_text(const TorchCpuStep& t) {
  std::string text = t.blas;
  if (!t.blas_version.empty()) text += " " + t.blas_version;
  std::string more;
  if (!t.blas_core.empty()) more = "kernel " + t.blas_core;
  if (t.blas_threads > 0)
    more += (more.empty() ? "" : ", ") + ("its own pool: " + std::to_string(t.blas_threads) + " threads");
  if (!more.empty()) text += " (" + more + ")";
  return text;
}

}  // namespace

void print_cpu_step_table(std::ostream& out, const std::vector<CpuStepResult>& results) {
  char line[512];
  for (const CpuStepResult& r : results) {
    const CpuStepConfig& c = r.config;
    out << "# dpcheck bench step --engine " << engine_for_memory(MemorySpace::host).name << ": model "
        << dims_string(c.model.dims) << " (" << activation_name(c.model.activation) << ", " << loss_name(c.model.loss)
        << "), batch " << c.batch << "\n";
    std::snprintf(line, sizeof line,
                  "# %.2f GFLOP a step (2*m*n*k over its %zu products); median of %d after %d untimed\n", r.flops / 1e9,
                  step_gemms(c.model, c.batch).size(), c.repeats, c.warmup);
    out << line;
    out << "# the engine's path: " << r.engine_path << "\n";
    const TorchCpuStep& t = r.torch;
    const bool torch_ran = t.status == TorchCpuStep::Status::ran;
    if (torch_ran)
      out << "# PyTorch " << t.version << " (" << t.script << " --device cpu): " << t.threads
          << " threads (torch.get_num_threads()), BLAS " << blas_text(t) << "\n";
    if (torch_ran && !t.blas_kernel_note.empty()) out << "# " << t.blas_kernel_note << "\n";
    if (!torch_ran) out << "# " << t.note << "\n";
    std::snprintf(line, sizeof line, "%-28s %-9s %7s %11s %9s %8s\n", "what", "path", "threads", "ms", "GFLOP/s",
                  "of best");
    out << line;
    for (const CpuStepRow& row : r.rows) {
      const std::string what = row.what == "step" ? "step (fwd, loss, bwd, SGD)" : "bare GEMMs of the step";
      std::snprintf(line, sizeof line, "%-28s %-9s %7d %11.3f %9.1f %8.2f\n", what.c_str(),
                    std::string(cpu::isa_name(row.isa)).c_str(), row.threads, row.ms, row.gflops, row.of_best);
      out << line;
    }
    if (torch_ran) {
      // The path column holds PyTorch's BLAS: its products are where its time goes.
      std::snprintf(line, sizeof line, "%-28s %-9s %7d %11.3f %9.1f %8.2f\n",
                    ("PyTorch " + t.version + " step").c_str(), t.blas.c_str(), t.threads, t.ms, t.gflops, t.of_best);
      out << line;
    }
    std::snprintf(line, sizeof line, "step / best GEMM: %.2f", r.step().of_best);
    out << line;
    if (c.goal > 0) out << (r.step().of_best >= c.goal ? " (goal >= " : " (goal missed: >= ") << c.goal << ")";
    out << "; the same bits from the same state: " << (r.same_bits ? "yes" : "NO") << "\n";
    if (torch_ran) {
      std::snprintf(line, sizeof line, "step / PyTorch's step, in time: %.2f (below 1: dpcheck's is faster), ",
                    r.step_over_torch());
      out << line;
      // torch.set_num_threads can be refused (an OpenMP runtime fixed earlier): say so rather than compare
      // unlike with unlike silently.
      if (t.threads == r.step().threads) out << "both on " << t.threads << " threads";
      else out << "dpcheck on " << r.step().threads << " threads, PyTorch on " << t.threads << " (NOT the same)";
      out << "; PyTorch's products on " << t.blas << (t.blas_version.empty() ? "" : " " + t.blas_version)
          << (t.blas_core.empty() ? "" : " " + t.blas_core)
          << (t.blas_kernel_note.empty() ? "" : ", a kernel below this CPU's (see above)") << "\n";
    }
  }
}

nlohmann::ordered_json cpu_step_json(const std::vector<CpuStepResult>& results) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const CpuStepResult& r : results) {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const CpuStepRow& row : r.rows)
      rows.push_back({{"what", row.what},
                      {"path", cpu::isa_name(row.isa)},
                      {"threads", row.threads},
                      {"ms", row.ms},
                      {"gflops", row.gflops},
                      {"of_best", row.of_best}});
    const TorchCpuStep& t = r.torch;
    const bool torch_ran = t.status == TorchCpuStep::Status::ran;
    if (torch_ran)
      rows.push_back({{"what", "torch"},
                      {"path", t.blas},
                      {"threads", t.threads},
                      {"ms", t.ms},
                      {"gflops", t.gflops},
                      {"of_best", t.of_best}});
    nlohmann::ordered_json torch{
        {"status", torch_status_name(t.status)}, {"note", t.note}, {"python", t.python}, {"script", t.script}};
    if (torch_ran) {
      torch["version"] = t.version;
      torch["threads"] = t.threads;
      torch["blas"] = t.blas;
      torch["blas_version"] = t.blas_version;
      torch["blas_library"] = t.blas_library;
      torch["blas_threads"] = t.blas_threads > 0 ? nlohmann::ordered_json(t.blas_threads) : nlohmann::ordered_json();
      torch["blas_core"] = t.blas_core;
      torch["blas_kernel_note"] = t.blas_kernel_note;
      torch["ms"] = t.ms;
      torch["gflops"] = t.gflops;
    }
    out.push_back(
        {{"model", dims_string(r.config.model.dims)},
         {"activation", activation_name(r.config.model.activation)},
         {"loss", loss_name(r.config.model.loss)},
         {"batch", r.config.batch},
         {"warmup", r.config.warmup},
         {"repeats", r.config.repeats},
         {"gflop", r.flops / 1e9},
         {"engine_path", r.engine_path},
         {"rows", rows},
         {"step_over_best_gemm", r.step().of_best},
         {"goal", r.config.goal},
         {"same_bits", r.same_bits},
         {"torch", torch},
         // dpcheck's step time over PyTorch's; null when PyTorch did not run
         {"step_over_torch", torch_ran ? nlohmann::ordered_json(r.step_over_torch()) : nlohmann::ordered_json()}});
  }
  return out;
}

}  // namespace dpcheck::bench
