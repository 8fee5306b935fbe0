// `dpcheck bench step --engine cpu`: the CPU engine's training step (forward, loss, backward, SGD) against
// bare GEMMs of exactly the step's shapes, timed in the same run on every GEMM code path this binary and
// CPU have (src/gemm/cpu_gemm.hpp) with one thread and with all of them. The step does those products and
// little else, so the best of the bare GEMMs is what it could reach: the table gives each one's GFLOP/s
// (2*m*n*k a product) and the step's ratio to the best. Medians over repeats, every buffer touched
// before anything is timed.
//
// Then PyTorch's step of the same model (ci/torch_baseline.py --device cpu, run by the Python given),
// on as many threads as dpcheck's step used: the bare GEMMs say what the step could reach, PyTorch what
// users would otherwise run. It runs after dpcheck's rows, as a child process, so that the two never
// share the cores; the row names the BLAS library and the threads PyTorch actually used, since a CPU
// ratio means little without them.
#pragma once

#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/gemm/cpu_gemm.hpp"
#include "src/train/model.hpp"

namespace dpcheck::bench {

// How to run the PyTorch baseline; `run` false leaves the result skipped with `skipped` as its reason.
struct TorchCpuOptions {
  bool run = false;
  std::string python = "python3";  // a name looked up on PATH, or a path
  std::string script;              // ci/torch_baseline.py, found by the caller
  std::string skipped;             // why it does not run, when !run
};

struct CpuStepConfig {
  ModelConfig model;
  int batch = 1024;
  double goal = 0;  // the step's ratio to the best GEMM that counts as met (>=), 0 for none
  int warmup = 1;
  int repeats = 7;
  TorchCpuOptions torch;
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

// PyTorch's step, as ci/torch_baseline.py reported it.
struct TorchCpuStep {
  enum class Status {
    ran,
    skipped,  // not asked for, or no Python, no torch or no script: a note, not a failure
    failed,   // torch was there and the script failed: a note too, with its last line
  };
  Status status = Status::skipped;
  std::string note;            // skipped or failed: why, on one line
  std::string python, script;  // as run
  double ms = 0;               // median
  double gflops = 0;
  double of_best = 0;
  int threads = 0;           // torch.get_num_threads() once the script had set it
  std::string version;       // torch.__version__
  std::string blas;          // a short name: "OpenBLAS", "MKL", ...
  std::string blas_version;  // where the library's file name gives it, else empty
  std::string blas_library;  // the file mapped into the process, else empty
  int blas_threads = 0;      // the BLAS's own thread pool where it can be asked (OpenBLAS), else 0
  std::string blas_core;     // the kernel OpenBLAS chose ("SkylakeX", "Prescott"), else empty
  // Not empty when the BLAS runs a kernel narrower than this CPU's vectors (OpenBLAS on a CPU model it
  // does not recognize): the ratio then measures that choice, and the note says how to change it.
  std::string blas_kernel_note;
};
const char* torch_status_name(TorchCpuStep::Status s);

// Runs ci/torch_baseline.py for one model on `threads` threads; never throws for what the child did.
TorchCpuStep torch_cpu_step(const TorchCpuOptions& options, const ModelConfig& model, int batch, int threads,
                            int warmup, int repeats);

struct CpuStepResult {
  CpuStepConfig config;
  double flops = 0;              // of the step's products
  std::string engine_path;       // cpu::describe_engine_path()
  std::vector<CpuStepRow> rows;  // the GEMM rows, then the step's
  bool same_bits = false;        // two steps from the same state end in the same parameters, bit for bit
  TorchCpuStep torch;
  const CpuStepRow& step() const { return rows.back(); }
  // dpcheck's step time over PyTorch's (below 1: dpcheck's is faster); 0 when PyTorch did not run.
  double step_over_torch() const {
    return torch.status == TorchCpuStep::Status::ran && torch.ms > 0 ? step().ms / torch.ms : 0;
  }
};

CpuStepResult bench_cpu_step(const CpuStepConfig& config);

void print_cpu_step_table(std::ostream& out, const std::vector<CpuStepResult>& results);
nlohmann::ordered_json cpu_step_json(const std::vector<CpuStepResult>& results);

}  // namespace dpcheck::bench
