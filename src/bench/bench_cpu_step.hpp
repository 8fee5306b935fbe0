// `dpcheck bench step --engine cpu`: the CPU engine's training step (forward, loss, backward, SGD) against
// bare GEMMs of exactly the step's shapes, timed in the same run on every GEMM code path this binary and
// CPU have (src/cpu/cpu_gemm.hpp) with one thread and with all of them. The step does those products and
// little else, so the best of the bare GEMMs is what it could reach: the table gives each one's GFLOP/s
// (2*m*n*k a product) and the step's ratio to the best. Medians over repeats, every buffer touched
// before anything is timed.
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/cpu/cpu_gemm.hpp"
#include "src/train/model.hpp"

namespace dpcheck::bench {

struct CpuStepConfig {
  ModelConfig model;
  int batch = 1024;
  double goal = 0;  // the step's ratio to the best GEMM that counts as met (>=), 0 for none
  int warmup = 1;
  int repeats = 7;
};

// The products of one step of `model` on `batch` examples, per layer: forward in * W^T, backward
// delta^T * in (the weight gradient) and, below the first layer, delta * W.
struct GemmShape {
  std::string what;  // "layers.0 forward", ...
  bool trans_a = false, trans_b = false;
  std::ptrdiff_t m = 0, n = 0, k = 0;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};
std::vector<GemmShape> step_gemms(const ModelConfig& model, int batch);

struct CpuStepRow {
  std::string what;  // "GEMMs" or "step"
  cpu::Isa isa = cpu::Isa::baseline;
  int threads = 1;
  double ms = 0;  // median
  double gflops = 0;
  double of_best = 0;  // GFLOP/s over the best GEMM row's
};

struct CpuStepResult {
  CpuStepConfig config;
  double flops = 0;           // of the step's products
  std::string engine_path;    // cpu::describe_engine_path()
  std::vector<CpuStepRow> rows;  // the GEMM rows, then the step's
  bool same_bits = false;     // two steps from the same state end in the same parameters, bit for bit
  const CpuStepRow& step() const { return rows.back(); }
};

CpuStepResult bench_cpu_step(const CpuStepConfig& config);

void print_cpu_step_table(std::ostream& out, const std::vector<CpuStepResult>& results);
nlohmann::ordered_json cpu_step_json(const std::vector<CpuStepResult>& results);

}  // namespace dpcheck::bench
