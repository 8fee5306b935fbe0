// GPU benchmarks (kernels/gpu_bench.hpp). Times are medians of CUDA-event timings after a warm-up; the
// PyTorch baseline (ci/torch_baseline.py) runs on the same GPU in the same invocation, so the ratio is
// measured, not quoted.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <sstream>

#include "kernels/cuda_check.hpp"
#include "kernels/cuda_engine.hpp"
#include "kernels/device.hpp"
#include "kernels/gpu_bench.hpp"
#include "kernels/hash.hpp"
#include "kernels/optimizer.hpp"
#include "src/error.hpp"
#include "src/io/process.hpp"
#include "src/train/data.hpp"

namespace dpcheck::cuda {

namespace {

class Events {
 public:
  Events() {
    DPCHECK_CUDA_CHECK(cudaEventCreate(&start_));
    DPCHECK_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~Events() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  template <class Work> double time_ms(cudaStream_t s, Work&& work) {
    DPCHECK_CUDA_CHECK(cudaEventRecord(start_, s));
    work();
    DPCHECK_CUDA_CHECK(cudaEventRecord(stop_, s));
    DPCHECK_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    DPCHECK_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

template <class Work> double median_ms(cudaStream_t s, int warmup, int repeats, Work&& work) {
  for (int i = 0; i < warmup; ++i) work();
  DPCHECK_CUDA_CHECK(cudaStreamSynchronize(s));
  Events ev;
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(ev.time_ms(s, work));
  return median(t);
}

// Runs the PyTorch baseline for one model; its last output line is one JSON object.
double torch_step_ms(const StepBenchOptions& o, const StepModel& m, std::string* note) {
  std::string dims;
  for (int d : m.dims) dims += (dims.empty() ? "" : ",") + std::to_string(d);
  ChildOptions child;
  child.argv = {o.python,    o.torch_script,           "--dims",   dims,
                "--batch",   std::to_string(m.batch),  "--warmup", std::to_string(o.warmup),
                "--repeats", std::to_string(o.repeats)};
  child.search_path = true;
  child.out = ChildOptions::Output::capture;
  child.err = ChildOptions::Output::to_stdout;
  ChildResult ran;
  try {
    ran = run_child(child);
  } catch (const ChildStartError& e) {
    *note = e.what();
    return -1;
  }
  const std::string& out = ran.out;
  const std::size_t brace = out.rfind('{');
  if (!ran.succeeded() || brace == std::string::npos) {
    *note = "PyTorch baseline failed: " + out.substr(out.size() > 300 ? out.size() - 300 : 0);
    return -1;
  }
  try {
    return nlohmann::json::parse(out.substr(brace)).at("median_ms").get<double>();
  } catch (const std::exception& e) {
    *note = std::string("unreadable PyTorch output: ") + e.what();
    return -1;
  }
}

__global__ void fill_kernel(std::uint32_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    p[i] = x;
  }
}

}  // namespace

std::vector<StepBenchRow> bench_step(const StepBenchOptions& o) {
  require_device();
  std::vector<StepBenchRow> rows;
  for (const StepModel& m : o.models) {
    StepBenchRow row;
    row.model = m;
    ModelConfig model{m.dims, Activation::relu, Loss::mse};
    model.validate();
    CudaEngine engine(model, EngineSpec{});
    const std::vector<float> initial = init_params(model, 1);
    engine.load_params(initial);
    const SyntheticDataset data(m.batch, model, 1);
    std::vector<std::int64_t> idx(static_cast<std::size_t>(m.batch));
    for (int i = 0; i < m.batch; ++i) idx[static_cast<std::size_t>(i)] = i;
    engine.upload(data.gather(idx));
    OptimizerConfig sgd;
    sgd.lr = 0.01;
    const auto stream = static_cast<cudaStream_t>(engine.stream());
    std::unique_ptr<Optimizer> opt = make_optimizer(sgd, engine.param_count(), stream);
    const auto step = [&] {
      engine.enqueue_forward_backward(1.0f, false);
      opt->step(engine.params(), engine.grads());
    };

    // The same step eagerly and as a graph, from the same parameters, must end in the same bits.
    step();
    engine.synchronize();
    std::vector<float> eager(engine.param_count()), graphed(engine.param_count());
    engine.store_params(eager);
    engine.load_params(initial);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    DPCHECK_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    step();
    DPCHECK_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    DPCHECK_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    DPCHECK_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    engine.synchronize();
    engine.store_params(graphed);
    row.same_bits = std::memcmp(eager.data(), graphed.data(), eager.size() * sizeof(float)) == 0;

    row.eager_ms = median_ms(stream, o.warmup, o.repeats, step);
    row.graph_ms = median_ms(stream, o.warmup, o.repeats, [&] { DPCHECK_CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    double macs = 0;
    for (std::size_t l = 0; l + 1 < m.dims.size(); ++l) macs += static_cast<double>(m.dims[l]) * m.dims[l + 1];
    // forward, weight gradients and input gradients (none for the first layer's input)
    const double flops = 2.0 * m.batch * (3 * macs - static_cast<double>(m.dims[0]) * m.dims[1]);
    row.tflops = flops / (row.graph_ms * 1e-3) / 1e12;
    if (o.torch) row.torch_ms = torch_step_ms(o, m, &row.torch_note);
    rows.push_back(row);
  }
  return rows;
}

HashBenchRow bench_hash(std::size_t bytes, int repeats) {
  require_device();
  HashBenchRow row;
  row.bytes = bytes;
  Stream stream;
  DeviceBuffer<std::uint32_t> src((bytes + 3) / 4), dst((bytes + 3) / 4);
  // Random-looking contents, never zeros: zeros can run faster than real data.
  fill_kernel<<<1024, 256, 0, stream.get()>>>(src.get(), src.size(), 12345u);
  DPCHECK_LAUNCH_CHECK();
  DeviceHasher hasher;
  row.hash_ms = median_ms(stream.get(), 3, repeats, [&] { hasher.enqueue(src.get(), bytes, 0, stream.get()); });
  row.copy_ms = median_ms(stream.get(), 3, repeats, [&] {
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream.get()));
  });
  row.hash_gbs = static_cast<double>(bytes) / (row.hash_ms * 1e-3) / 1e9;
  row.copy_gbs = 2.0 * static_cast<double>(bytes) / (row.copy_ms * 1e-3) / 1e9;
  return row;
}

}  // namespace dpcheck::cuda
