// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11): the value at a counter is a pure
// function of (key, counter), so every rank and the GPU compute the same examples and permutations
// without communicating or carrying generator state.
#pragma once

#include <array>
#include <cstdint>

#if defined(__CUDACC__)
#define DPCHECK_HD __host__ __device__
#else
#define DPCHECK_HD
#endif

namespace dpcheck {

struct PhiloxBlock {
  std::uint32_t v[4];
};

DPCHECK_HD inline PhiloxBlock philox4x32(std::uint64_t counter_hi, std::uint64_t counter_lo, std::uint64_t key) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  std::uint32_t c0 = static_cast<std::uint32_t>(counter_lo);
  std::uint32_t c1 = static_cast<std::uint32_t>(counter_lo >> 32);
  std::uint32_t c2 = static_cast<std::uint32_t>(counter_hi);
  std::uint32_t c3 = static_cast<std::uint32_t>(counter_hi >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(key);
  std::uint32_t k1 = static_cast<std::uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(m0) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(m1) * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += w0;
    k1 += w1;
  }
  return {{c0, c1, c2, c3}};
}

// 64 random bits at (stream, index) under key.
DPCHECK_HD inline std::uint64_t random_u64(std::uint64_t key, std::uint64_t stream, std::uint64_t index) {
  const PhiloxBlock b = philox4x32(stream, index, key);
  return (static_cast<std::uint64_t>(b.v[1]) << 32) | b.v[0];
}

// Uniform in [-1, 1), a multiple of 2^-23 (exact in float32).
DPCHECK_HD inline float random_symmetric(std::uint64_t key, std::uint64_t stream, std::uint64_t index) {
  const std::uint32_t bits = static_cast<std::uint32_t>(random_u64(key, stream, index) >> 40);  // 24 bits
  return static_cast<float>(static_cast<std::int32_t>(bits) - (1 << 23)) * (1.0f / (1 << 23));
}

// Uniform in [0, 1), a multiple of 2^-53.
DPCHECK_HD inline double random_unit(std::uint64_t key, std::uint64_t stream, std::uint64_t index) {
  return static_cast<double>(random_u64(key, stream, index) >> 11) * 0x1.0p-53;
}

// Mixes two 64-bit values into a key (SplitMix64's finalizer), e.g. (seed, epoch).
DPCHECK_HD inline std::uint64_t mix_key(std::uint64_t a, std::uint64_t b) {
  std::uint64_t z = a + 0x9E3779B97F4A7C15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform integer in [0, n) for n > 0, without modulo bias (Lemire's multiply-and-reject): attempt a
// draws at the same index from stream + a * 2^32, until one is accepted. The sampler's shuffle is
// documented in these terms (docs/architecture.md, "The shuffle"), so that other loaders can follow it.
inline std::uint64_t random_below(std::uint64_t key, std::uint64_t stream, std::uint64_t index, std::uint64_t n) {
  const std::uint64_t threshold = (0 - n) % n;
  for (std::uint64_t attempt = 0;; ++attempt) {
    const std::uint64_t r = random_u64(key, stream + (attempt << 32), index);
    __extension__ typedef unsigned __int128 u128;  // the 64x64->128 multiply Lemire's method needs
    const u128 m = static_cast<u128>(r) * n;
    if (static_cast<std::uint64_t>(m) >= threshold) return static_cast<std::uint64_t>(m >> 64);
  }
}

}  // namespace dpcheck
