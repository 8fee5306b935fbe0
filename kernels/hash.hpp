// The replica hash on the GPU: 64 bits over the bytes of a device buffer, reading it once at memory
// bandwidth. Equal bits give equal hashes; the replica check compares them across ranks. Reference:
// reference/hash.cpp (the same function on the host); test: tests/hash_test.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dpcheck::cuda {

class DeviceHasher {
 public:
  DeviceHasher();
  ~DeviceHasher();
  DeviceHasher(const DeviceHasher&) = delete;
  DeviceHasher& operator=(const DeviceHasher&) = delete;

  // Enqueues the hash of `bytes` bytes at `data` on `stream` into the device word `result()`.
  void enqueue(const void* data, std::size_t bytes, std::uint64_t seed, cudaStream_t stream);
  std::uint64_t* result() const { return result_; }
  // enqueue, then copy the result to the host (synchronizes the stream).
  std::uint64_t hash(const void* data, std::size_t bytes, std::uint64_t seed, cudaStream_t stream);

 private:
  std::uint64_t* partial_ = nullptr;  // one per block
  std::uint64_t* result_ = nullptr;
  std::uint64_t* host_ = nullptr;  // pinned
};

}  // namespace dpcheck::cuda
