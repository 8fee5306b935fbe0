// The Engine: forward and backward of the MLP on one rank's examples, into a flat gradient buffer laid
// out like the parameters (src/train/model.hpp). Implementations: "cpu" (Eigen, float32, src/cpu/cpu_engine.cpp)
// and "cuda" (kernels/). Buffers live in memory_space(), whose hashes, comparisons and copies are the
// engine's MemoryService (src/io/memory_service.hpp); the trainer moves only the gradient through the
// Communicator and the parameters through the Optimizer, so a device engine never copies to the host
// on the training path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "src/dtype.hpp"
#include "src/engine_spec.hpp"
#include "src/io/memory_service.hpp"
#include "src/low_precision.hpp"
#include "src/train/data.hpp"
#include "src/train/model.hpp"

namespace dpcheck {

class Kernels;  // src/plugin/kernel_plugin.hpp

// A device engine's part in a bucketed all-reduce that overlaps its backward pass (src/train/bucketing.hpp).
// On a GPU the layer-ready hook fires when a layer's kernels are queued, not when they have run, so a
// bucket cannot be copied then: its copy and its all-reduce go to a stream of their own, ordered after
// the backward pass's kernels by an event, and the host thread that reduces it only queues and waits.
// Element i of the gradient sits at element i of buffer(). Not thread-safe beyond what each call says.
class BucketStaging {
 public:
  virtual ~BucketStaging() = default;
  // The stream the buckets' copies and all-reduces are queued on; the communicator takes it for the
  // step's buckets, and the engine's stream back at the end (a cudaStream_t for GPU engines).
  virtual void* comm_stream() = 0;
  virtual void* engine_stream() = 0;
  virtual float* buffer() = 0;
  // On the rank's thread, from the layer-ready hook: bucket k's gradient is final once the work queued
  // on the engine's stream so far has run.
  virtual void mark(std::size_t k) = 0;
  // On the communication thread: queues on comm_stream(), after mark k, the copy of grads[lo, hi) into
  // the buffer's [lo, hi).
  virtual void stage(std::size_t k, const float* grads, std::size_t lo, std::size_t hi) = 0;
  // On the rank's thread, once every bucket's all-reduce has returned: queues on the engine's stream,
  // after everything on comm_stream(), the copy of the buffer's [lo, hi) back into grads[lo, hi).
  virtual void unstage(float* grads, std::size_t lo, std::size_t hi) = 0;
};

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

  // What a bucketed all-reduce of `buckets` buckets needs to overlap this engine's backward pass where
  // the hook fires before the gradient is written (a GPU's queued kernels); nullptr where the gradient
  // is final when the hook fires (the CPU), so the reducer copies it there and then.
  virtual std::unique_ptr<BucketStaging> make_bucket_staging(std::size_t /*buckets*/) { return nullptr; }

 protected:
  void layer_ready(int layer) {
    if (layer_ready_) layer_ready_(layer);
  }

 private:
  std::function<void(int layer)> layer_ready_;
};

// With `kernels`, the ops its plugin provides run in place of the engine's own (--kernels); with a low
// precision, the plugin's linear ops receive inputs already rounded to it. Of the spec it reads the
// precision and the mutant bf16-accumulate (accumulate_in_low_precision):
//
// --precision: each matrix product's inputs are rounded to this format (round to nearest even) and the
// products accumulate in float32, as autocast with cuBLAS's GemmEx and CUBLAS_COMPUTE_32F does.
// Products of two bf16 or two fp16 numbers are exact in float32, so rounding the inputs and multiplying
// in float32 gives the bits of a low-precision product accumulated in float32. The bias gradients, the
// activations, the loss and everything after the gradient stay float32. The mutant also rounds every
// partial sum to the low format.
std::unique_ptr<Engine> make_cpu_engine(const ModelConfig& model, std::shared_ptr<const Kernels> kernels = nullptr,
                                        const EngineSpec& spec = {});

}  // namespace dpcheck
