// `dpcheck bench step --engine cpu` (src/bench/bench_cpu_step.hpp): the bare GEMM rows, the step's row, the
// table and its JSON form.
#include "src/bench/bench_cpu_step.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <ostream>

#include "src/backends.hpp"
#include "src/bench/bench.hpp"
#include "src/engine.hpp"
#include "src/train/data.hpp"
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

}  // namespace

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
                  std::vector<float>(static_cast<std::size_t>(s.k * s.n)), std::vector<float>(static_cast<std::size_t>(s.m * s.n))};
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

  double best = 0;
  for (const CpuStepRow& r : result.rows)
    if (r.what == "GEMMs") best = std::max(best, r.gflops);
  for (CpuStepRow& r : result.rows) r.of_best = best > 0 ? r.gflops / best : 0;
  return result;
}

void print_cpu_step_table(std::ostream& out, const std::vector<CpuStepResult>& results) {
  char line[256];
  for (const CpuStepResult& r : results) {
    const CpuStepConfig& c = r.config;
    out << "# dpcheck bench step --engine " << engine_for_memory(MemorySpace::host).name << ": model " << dims_string(c.model.dims) << " (" << activation_name(c.model.activation)
        << ", " << loss_name(c.model.loss) << "), batch " << c.batch << "\n";
    std::snprintf(line, sizeof line, "# %.2f GFLOP a step (2*m*n*k over its %zu products); median of %d after %d untimed\n",
                  r.flops / 1e9, step_gemms(c.model, c.batch).size(), c.repeats, c.warmup);
    out << line;
    out << "# the engine's path: " << r.engine_path << "\n";
    std::snprintf(line, sizeof line, "%-28s %-9s %7s %11s %9s %8s\n", "what", "path", "threads", "ms", "GFLOP/s", "of best");
    out << line;
    for (const CpuStepRow& row : r.rows) {
      const std::string what =
          row.what == "step" ? "step (fwd, loss, bwd, SGD)" : "bare GEMMs of the step";
      std::snprintf(line, sizeof line, "%-28s %-9s %7d %11.3f %9.1f %8.2f\n", what.c_str(),
                    std::string(cpu::isa_name(row.isa)).c_str(), row.threads, row.ms, row.gflops, row.of_best);
      out << line;
    }
    std::snprintf(line, sizeof line, "step / best GEMM: %.2f", r.step().of_best);
    out << line;
    if (c.goal > 0) out << (r.step().of_best >= c.goal ? " (goal >= " : " (goal missed: >= ") << c.goal << ")";
    out << "; the same bits from the same state: " << (r.same_bits ? "yes" : "NO") << "\n";
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
    out.push_back({{"model", dims_string(r.config.model.dims)},
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
                   {"same_bits", r.same_bits}});
  }
  return out;
}

}  // namespace dpcheck::bench
