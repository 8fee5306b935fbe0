// The host's MemoryService (src/io/memory_service.hpp): its own file, not the CPU engine's, since the
// optimizers, the replica check and the checkpoint format copy and hash host buffers through it without
// needing an engine (and the parsers' fuzz targets link these without the engine's GEMM).
#include "src/io/memory_service.hpp"

#include <algorithm>
#include <cstring>

#include "src/io/hash.hpp"

namespace dpcheck {
namespace {

class HostMemory final : public MemoryService {
 public:
  MemorySpace memory_space() const override { return MemorySpace::host; }
  std::string_view hash_name() const override { return "xxh3"; }

  std::uint64_t hash(const float* data, std::size_t n, std::uint64_t seed) const override {
    return hash_host(data, n, seed);
  }

  // Bits, not values: -0 differs from +0, and a NaN from the same NaN with another payload.
  std::size_t first_difference(const float* a, const float* b, std::size_t n) const override {
    for (std::size_t i = 0; i < n; ++i)
      if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
    return n;
  }

  void copy_to_host(const float* src, float* dst, std::size_t n) const override { std::copy_n(src, n, dst); }
  void copy_from_host(const float* src, float* dst, std::size_t n) const override { std::copy_n(src, n, dst); }
};

}  // namespace

const MemoryService& host_memory() {
  static const HostMemory memory;
  return memory;
}

std::uint64_t hash_host(const float* data, std::size_t n, std::uint64_t seed) {
  return hash_bytes(data, n * sizeof(float), seed);
}

}  // namespace dpcheck
