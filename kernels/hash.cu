// The replica hash (kernels/hash.hpp). Reference: reference/hash.cpp; test: tests/hash_test.cpp.
//
// Pass 1: kHashBlocks x kHashThreads lanes; lane l absorbs the 16-byte words l, l + L, l + 2L, ... in
// order (coalesced 16-byte loads, four in flight per lane), then each block joins its lanes' values in a
// fixed binary tree. Pass 2: one block joins the blocks' values the same way, absorbs the bytes after
// the last whole word, and finishes with the length and XXH64's avalanche.
#include "kernels/cuda_check.hpp"
#include "kernels/hash.hpp"
#include "kernels/hash_math.hpp"

namespace dpcheck::cuda {

namespace {

using namespace dpcheck::hash;

__device__ void tree_join(std::uint64_t* values, int n) {
  for (int width = n / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width)
      values[threadIdx.x] = combine(values[threadIdx.x], values[threadIdx.x + width]);
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads) hash_lanes(const uint4* __restrict__ words, std::uint64_t nwords,
                                                       std::uint64_t seed, std::uint64_t* __restrict__ partial) {
  __shared__ std::uint64_t values[kThreads];
  const std::uint64_t lane = static_cast<std::uint64_t>(blockIdx.x) * kThreads + threadIdx.x;
  std::uint64_t acc = lane_start(seed, lane);
  std::uint64_t i = lane;
  // Four loads issued before their rounds, so that the memory system has work while the chain waits.
  for (; i + 3 * kLanes < nwords; i += 4 * kLanes) {
    const uint4 a = words[i], b = words[i + kLanes], c = words[i + 2 * kLanes], d = words[i + 3 * kLanes];
    acc = absorb(acc, a.x, a.y, a.z, a.w);
    acc = absorb(acc, b.x, b.y, b.z, b.w);
    acc = absorb(acc, c.x, c.y, c.z, c.w);
    acc = absorb(acc, d.x, d.y, d.z, d.w);
  }
  for (; i < nwords; i += kLanes) {
    const uint4 a = words[i];
    acc = absorb(acc, a.x, a.y, a.z, a.w);
  }
  values[threadIdx.x] = acc;
  __syncthreads();
  tree_join(values, kThreads);
  if (threadIdx.x == 0) partial[blockIdx.x] = values[0];
}

__global__ void __launch_bounds__(kBlocks)
    hash_blocks(const std::uint64_t* __restrict__ partial, const unsigned char* __restrict__ tail, int tail_bytes,
                std::uint64_t total_bytes, std::uint64_t* result) {
  __shared__ std::uint64_t values[kBlocks];
  values[threadIdx.x] = partial[threadIdx.x];
  __syncthreads();
  tree_join(values, kBlocks);
  if (threadIdx.x == 0) {
    std::uint64_t h = values[0];
    for (int k = 0; k < tail_bytes; ++k) h = xxh_round(h, tail[k]);
    *result = avalanche(h ^ total_bytes);
  }
}

}  // namespace

DeviceHasher::DeviceHasher() {
  DPCHECK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&partial_), kBlocks * sizeof(std::uint64_t)));
  DPCHECK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&result_), sizeof(std::uint64_t)));
  DPCHECK_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), sizeof(std::uint64_t)));
}

DeviceHasher::~DeviceHasher() {
  cudaFree(partial_);
  cudaFree(result_);
  cudaFreeHost(host_);
}

void DeviceHasher::enqueue(const void* data, std::size_t bytes, std::uint64_t seed, cudaStream_t stream) {
  // 16-byte loads need a 16-byte aligned start; cudaMalloc gives 256, and the engine's buffers start
  // there. A caller with another alignment is a bug in dpcheck.
  DPCHECK_ASSERT(reinterpret_cast<std::uintptr_t>(data) % 16 == 0 || bytes == 0);
  const std::uint64_t nwords = bytes / 16;
  hash_lanes<<<kBlocks, kThreads, 0, stream>>>(static_cast<const uint4*>(data), nwords, seed, partial_);
  DPCHECK_LAUNCH_CHECK();
  hash_blocks<<<1, kBlocks, 0, stream>>>(partial_, static_cast<const unsigned char*>(data) + nwords * 16,
                                         static_cast<int>(bytes % 16), bytes, result_);
  DPCHECK_LAUNCH_CHECK();
}

std::uint64_t DeviceHasher::hash(const void* data, std::size_t bytes, std::uint64_t seed, cudaStream_t stream) {
  enqueue(data, bytes, seed, stream);
  DPCHECK_CUDA_CHECK(cudaMemcpyAsync(host_, result_, sizeof(std::uint64_t), cudaMemcpyDeviceToHost, stream));
  DPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *host_;
}

}  // namespace dpcheck::cuda
