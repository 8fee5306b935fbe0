// MemoryService: what dpcheck does with float buffers of one memory space without knowing what they
// hold: hash them, find the first element where two differ, copy them to and from the host. The
// replica check hashes and compares parameters and optimizer state through it, and the engines and
// optimizers copy their buffers through it, so a device's buffers stay on the device until the host
// needs a value. Implementations: the host's (src/io/memory_service.cpp: XXH3-64, a loop over the bits,
// memcpy) and the CUDA engine's (kernels/cuda_engine.*: the replica hash of kernels/hash.hpp, which is
// not XXH3, a first-difference kernel, and copies queued on the engine's stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "src/dtype.hpp"

namespace dpcheck {

class MemoryService {
 public:
  virtual ~MemoryService() = default;

  // Where the buffers this service takes live.
  virtual MemorySpace memory_space() const = 0;

  // The name of the function hash() computes, for messages that print a hash ("xxh3" on the host).
  // Hashes under different names are not comparable.
  virtual std::string_view hash_name() const = 0;

  // A 64-bit hash of n floats in memory_space(), chained from seed; equal bits give equal hashes.
  virtual std::uint64_t hash(const float* data, std::size_t n, std::uint64_t seed) const = 0;

  // The smallest i < n whose bits differ between a and b (both in memory_space()), or n if none.
  virtual std::size_t first_difference(const float* a, const float* b, std::size_t n) const = 0;

  // Copies n floats from memory_space() to the host, after the work already queued on it; returns when
  // the copy is done.
  virtual void copy_to_host(const float* src, float* dst, std::size_t n) const = 0;

  // Copies n floats from the host into memory_space(); returns when the copy is done, so that src may
  // go away.
  virtual void copy_from_host(const float* src, float* dst, std::size_t n) const = 0;
};

// The host's service: XXH3-64 (hash_host), a loop over the bits, memcpy. One for the process.
const MemoryService& host_memory();

// XXH3-64 of the bytes of n floats (host memory).
std::uint64_t hash_host(const float* data, std::size_t n, std::uint64_t seed);

}  // namespace dpcheck
