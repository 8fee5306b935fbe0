#include "kernels/cuda_memory.hpp"

#include "kernels/cuda_check.hpp"
#include "kernels/first_difference.hpp"

namespace dpcheck::cuda {

std::uint64_t CudaMemory::hash(const float* data, std::size_t n, std::uint64_t seed) const {
  if (!hasher_) hasher_ = std::make_unique<DeviceHasher>();
  return hasher_->hash(data, n * sizeof(float), seed, stream_);
}

std::size_t CudaMemory::first_difference(const float* a, const float* b, std::size_t n) const {
  return cuda::first_difference(a, b, n, stream_);
}

void CudaMemory::copy_to_host(const float* src, float* dst, std::size_t n) const {
  if (n == 0) return;
  DPCHECK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  DPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaMemory::copy_from_host(const float* src, float* dst, std::size_t n) const {
  if (n == 0) return;
  DPCHECK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
  // The host buffer may go away when the caller returns: the copy must be done first.
  DPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace dpcheck::cuda
