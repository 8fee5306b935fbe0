// The CUDA plugin's entry: the table of functions dpcheck calls through (src/target/cuda_api.hpp).
#include "kernels/cuda_engine.hpp"
#include "kernels/device.hpp"
#include "kernels/gpu_bench.hpp"
#include "kernels/gpu_comm.hpp"
#include "kernels/optimizer.hpp"
#include "src/target/cuda_api.hpp"

namespace dpcheck::cuda {

namespace {

bool available(std::string* why) { return device_available(why); }

void* alloc(std::size_t bytes) {
  void* p = nullptr;
  return cudaMalloc(&p, bytes == 0 ? 1 : bytes) == cudaSuccess ? p : nullptr;
}

void release(void* p) { cudaFree(p); }

std::unique_ptr<Optimizer> optimizer(const OptimizerConfig& config, std::size_t size, void* stream,
                                     std::shared_ptr<const Kernels> kernels) {
  return make_optimizer(config, size, static_cast<cudaStream_t>(stream), std::move(kernels));
}

}  // namespace

}  // namespace dpcheck::cuda

extern "C" __attribute__((visibility("default"))) const dpcheck::cuda::Plugin* dpcheck_cuda_plugin() {
  using namespace dpcheck::cuda;
  static const Plugin plugin{kPluginAbi, sizeof(Plugin), available,        device_count,           make_engine,
                             optimizer,  run_cuda_local, run_nccl_threads, make_nccl_communicator, bench_step,
                             bench_hash, alloc,          release};
  return &plugin;
}
