// The device's MemoryService (src/io/memory_service.hpp), which the CUDA engine and the CUDA optimizer use.
// A header of its own, so that the optimizer's kernels (kernels/optimizer.cu) are not compiled with the
// engine's headers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "kernels/hash.hpp"
#include "src/io/memory_service.hpp"

namespace dpcheck::cuda {

// The device's MemoryService on one stream: the replica hash (kernels/hash.hpp), the first-difference
// kernel, and copies queued after the stream's work. Not thread-safe: one per stream's owner.
class CudaMemory final : public MemoryService {
 public:
  explicit CudaMemory(cudaStream_t stream) : stream_(stream) {}

  MemorySpace memory_space() const override { return MemorySpace::device; }
  // kernels/hash.cu's own function (restated on the host by reference/hash.cpp), not XXH3: its hashes
  // cannot be compared with the host's.
  std::string_view hash_name() const override { return "gpu-replica-hash"; }
  std::uint64_t hash(const float* data, std::size_t n, std::uint64_t seed) const override;
  std::size_t first_difference(const float* a, const float* b, std::size_t n) const override;
  void copy_to_host(const float* src, float* dst, std::size_t n) const override;
  void copy_from_host(const float* src, float* dst, std::size_t n) const override;

 private:
  cudaStream_t stream_;
  // Made at the first hash: an optimizer copies its state through this service but never hashes.
  mutable std::unique_ptr<DeviceHasher> hasher_;
};

}  // namespace dpcheck::cuda
