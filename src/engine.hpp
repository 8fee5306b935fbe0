// The Engine: forward and backward of the MLP on one rank's examples, into a flat gradient buffer laid
// out like the parameters (src/model.hpp). Implementations: "cpu" (Eigen, float32, src/cpu_engine.cpp)
// and "cuda" (kernels/). Buffers live in memory_space(); the trainer moves only the gradient through
// the Communicator and the parameters through the Optimizer, so a device engine never copies to the
// host on the training path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "src/data.hpp"
#include "src/dtype.hpp"
#include "src/model.hpp"

namespace dpcheck {

class Engine {
 public:
  virtual ~Engine() = default;

  virtual std::string_view name() const = 0;
  virtual MemorySpace memory_space() const = 0;
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

  // A 64-bit hash of n floats in memory_space(), chained from seed; equal bits give equal hashes.
  virtual std::uint64_t hash(const float* data, std::size_t n, std::uint64_t seed) const = 0;

  // The smallest i < n whose bits differ between a and b (both in memory_space()), or n if none.
  virtual std::size_t first_difference(const float* a, const float* b, std::size_t n) const = 0;

  // Copies n floats from memory_space() to the host.
  virtual void copy_to_host(const float* src, float* dst, std::size_t n) const = 0;

  // The stream the engine's work is queued on (a cudaStream_t for GPU engines), so that communicators
  // and optimizers order their work after it; nullptr on the CPU.
  virtual void* stream() { return nullptr; }

  // Waits for queued device work; a no-op on the CPU.
  virtual void synchronize() {}
};

std::unique_ptr<Engine> make_cpu_engine(const ModelConfig& model);

// XXH3-64 of the bytes of n floats (host memory).
std::uint64_t hash_host(const float* data, std::size_t n, std::uint64_t seed);

}  // namespace dpcheck
