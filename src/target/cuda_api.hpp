// What the rest of dpcheck sees of the CUDA code: plain types and one table of functions. The CUDA code
// is built as a plugin (libdpcheck_cuda.so) that dpcheck loads only when a GPU target is asked for, so
// the command starts in milliseconds on CPU work and runs on machines without CUDA libraries at all
// (loading cudart, cuBLAS and NCCL at start-up costs about 0.4 s). This header includes no CUDA header.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/bias_grad_kernel.hpp"
#include "src/comm.hpp"
#include "src/engine_spec.hpp"
#include "src/plugin/kernel_plugin.hpp"
#include "src/train/engine.hpp"
#include "src/train/optimizer.hpp"

namespace dpcheck::cuda {

struct StepModel {
  std::vector<int> dims;
  int batch = 0;
  double goal = 0;  // the step time over PyTorch's that counts as met (<=), 0 for none
};

struct StepBenchOptions {
  std::vector<StepModel> models;
  int warmup = 10;
  int repeats = 50;
  std::string python = "python3";
  std::string torch_script = "ci/torch_baseline.py";  // relative to the working directory
  bool torch = true;
};

struct StepBenchRow {
  StepModel model;
  double eager_ms = 0;   // median, kernels launched one by one
  double graph_ms = 0;   // median, the step replayed as one CUDA graph
  double torch_ms = -1;  // PyTorch's median, -1 when unavailable
  std::string torch_note;
  double tflops = 0;       // of the graph step
  bool same_bits = false;  // a graph step and an eager step from the same state end in the same bits
  double ratio() const { return torch_ms > 0 ? graph_ms / torch_ms : -1; }
};

struct HashBenchRow {
  std::size_t bytes = 0;
  double hash_ms = 0, hash_gbs = 0;  // bytes read / time
  double copy_ms = 0, copy_gbs = 0;  // (bytes read + written) / time
  double ratio() const { return copy_gbs > 0 ? hash_gbs / copy_gbs : 0; }
};

using RankFunction = std::function<void(Communicator&)>;

// The plugin's table. `abi` and `size` guard against a plugin from another build.
struct Plugin {
  int abi = 0;
  std::size_t size = 0;
  bool (*device_available)(std::string* why);
  int (*device_count)();
  // An engine whose memory() is the device's MemoryService on the engine's stream, whose hash is the
  // GPU's own replica hash, not the host's XXH3.
  // Reads the spec's tf32, precision and bias_grad (the mutants swap in a broken kernel); `kernels`: a
  // device kernel plugin's ops, which replace the engine's own where it provides them (nullptr: none).
  std::unique_ptr<Engine> (*make_engine)(const ModelConfig& model, const EngineSpec& spec,
                                         std::shared_ptr<const Kernels> kernels);
  // An optimizer whose state lives on the device, its work queued on `stream` (the engine's).
  // A device kernel plugin's optimizer steps replace the optimizer's own where it provides them.
  std::unique_ptr<Optimizer> (*make_optimizer)(const OptimizerConfig& config, std::size_t size, void* stream,
                                               std::shared_ptr<const Kernels> kernels);
  void (*run_cuda_local)(int n, const RankFunction& fn, std::chrono::milliseconds timeout);
  void (*run_nccl_threads)(int n, const RankFunction& fn, std::chrono::milliseconds timeout);
  std::unique_ptr<Communicator> (*make_nccl_communicator)(Communicator& host, int device);
  std::vector<StepBenchRow> (*bench_step)(const StepBenchOptions& options);
  HashBenchRow (*bench_hash)(std::size_t bytes, int repeats);
  // Device memory on the calling thread's device (cudaMalloc, cudaFree), for checks that stage their
  // own buffers there (conform with a device-memory communicator plugin). nullptr: out of memory.
  void* (*device_alloc)(std::size_t bytes);
  void (*device_free)(void* pointer);
};

// 3: the bench's hash row lost its reference check (kernels never call the reference), and the
// Engine's hashes, comparisons and copies moved to its MemoryService (src/io/memory_service.hpp), which
// changed the Engine's virtual functions. Raised with every change to the types above.
// 4: device_alloc and device_free, for conform's buffers. 5: a device kernel plugin in EngineOptions
// and make_optimizer. 6: DType's bf16 and f16, which the plugin's communicators must reduce (an older
// plugin would take them for another type). 8: Engine::make_bucket_staging, a new virtual function
// (src/train/engine.hpp), which an older plugin's engines lack: the trainer would call past their tables.
// 9: make_engine takes the EngineSpec itself (src/engine_spec.hpp) and the kernels, in place of EngineOptions.
inline constexpr int kPluginAbi = 9;

}  // namespace dpcheck::cuda

// The plugin's one exported symbol.
extern "C" const dpcheck::cuda::Plugin* dpcheck_cuda_plugin();
