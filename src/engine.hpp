// The Engine: forward and backward of the MLP on one rank's examples, into a flat gradient buffer laid
// out like the parameters (src/model.hpp). Implementations: "cpu" (Eigen, float32, src/cpu_engine.cpp)
// and "cuda" (kernels/). Buffers live in memory_space(), whose hashes, comparisons and copies are the
// engine's MemoryService (src/memory_service.hpp); the trainer moves only the gradient through the
// Communicator and the parameters through the Optimizer, so a device engine never copies to the host
// on the training path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "src/data.hpp"
#include "src/dtype.hpp"
#include "src/low_precision.hpp"
#include "src/memory_service.hpp"
#include "src/model.hpp"

namespace dpcheck {

class Kernels;  // src/plugin/kernel_plugin.hpp

class Engine {
 public:
  virtual ~Engine() = default;

  virtual std::string_view name() const = 0;

  // Hashes, comparisons and copies of buffers in the engine's memory space: the parameters, the
  // gradient, and an optimizer's state that lives beside them.
  virtual const MemoryService& memory() const = 0;
  MemorySpace memory_space() const { return memory().memory_space(); }

  virtual const ModelConfig& model() const = 0;
  virtual std::size_t param_count() const = 0;

  virtual float* params() = 0;  // memory_space()
  virtual float* grads() = 0;   // memory_space()

  virtual void load_params(std::span<const float> host) = 0;
  virtual void store_params(std::span<float> host) const = 0;
  virtual void store_grads(std::span<float> host) const = 0;

  // grads = (accumulate ? grads : 0) + scale * d(mean loss over batch)/d(params); returns the mean loss
  // (computed in double from the float32 outputs). An empty batch contributes nothing.
  virtual double forward_backward(const Batch& batch, float scale, bool accumulate) = 0;
  virtual void zero_grads() = 0;

  // The stream the engine's work is queued on (a cudaStream_t for GPU engines), so that communicators
  // and optimizers order their work after it; nullptr on the CPU.
  virtual void* stream() { return nullptr; }

  // Waits for queued device work; a no-op on the CPU.
  virtual void synchronize() {}

  // Called by forward_backward as soon as layer l's weight and bias gradients are final for the call
  // (layers in reverse order, the last first), so that a bucketed all-reduce can take them while the
  // backward pass goes on (train --bucket-mb). An engine that never calls it stays correct: the trainer
  // takes whatever is left when forward_backward returns. Empty: no hook.
  void set_layer_ready_hook(std::function<void(int layer)> hook) { layer_ready_ = std::move(hook); }

 protected:
  void layer_ready(int layer) {
    if (layer_ready_) layer_ready_(layer);
  }

 private:
  std::function<void(int layer)> layer_ready_;
};

struct CpuEngineOptions {
  // --precision: each matrix product's inputs are rounded to this format (round to nearest even) and
  // the products accumulate in float32, as autocast with cuBLAS's GemmEx and CUBLAS_COMPUTE_32F does.
  // Products of two bf16 or two fp16 numbers are exact in float32, so rounding the inputs and
  // multiplying in float32 gives the bits of a low-precision product accumulated in float32. The
  // bias gradients, the activations, the loss and everything after the gradient stay float32.
  Precision precision = Precision::fp32;
  // The mutant bf16-accumulate: the products also round every partial sum to the low format.
  bool accumulate_in_low_precision = false;
};

// With `kernels`, the ops its plugin provides run in place of the engine's own (--kernels); with a low
// precision, the plugin's linear ops receive inputs already rounded to it.
std::unique_ptr<Engine> make_cpu_engine(const ModelConfig& model, std::shared_ptr<const Kernels> kernels = nullptr,
                                        const CpuEngineOptions& options = {});

}  // namespace dpcheck
