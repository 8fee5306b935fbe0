// First differing element (kernels/first_difference.hpp). Reference: the CPU engine's first_difference
// (src/cpu/cpu_engine.cpp); test: tests/first_difference_test.cpp.
#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"
#include "kernels/first_difference.hpp"
#include "kernels/launch.hpp"

namespace dpcheck::cuda {

namespace {

__global__ void first_difference_kernel(const unsigned* __restrict__ a, const unsigned* __restrict__ b, long long n,
                                        unsigned long long* first) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    if (static_cast<unsigned long long>(i) >= *first) return;  // a smaller index is already known
    if (a[i] != b[i]) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;
    }
  }
}

}  // namespace

std::size_t first_difference(const float* a, const float* b, std::size_t n, cudaStream_t stream) {
  if (n == 0) return 0;
  DeviceBuffer<unsigned long long> first(1);
  const unsigned long long none = n;
  DPCHECK_CUDA_CHECK(cudaMemcpyAsync(first.get(), &none, sizeof none, cudaMemcpyHostToDevice, stream));
  const auto count = static_cast<long long>(n);
  first_difference_kernel<<<grid_for(count), kBlock, 0, stream>>>(
      reinterpret_cast<const unsigned*>(a), reinterpret_cast<const unsigned*>(b), count, first.get());
  DPCHECK_LAUNCH_CHECK();
  unsigned long long found = n;
  DPCHECK_CUDA_CHECK(cudaMemcpyAsync(&found, first.get(), sizeof found, cudaMemcpyDeviceToHost, stream));
  DPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream));
  return static_cast<std::size_t>(found);
}

}  // namespace dpcheck::cuda
