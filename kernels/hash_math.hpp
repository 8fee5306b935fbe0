// The arithmetic of the replica hash on the GPU (kernels/hash.cu): XXH64's round and avalanche (Collet,
// xxHash specification), combined over a fixed assignment of 16-byte words to lanes and a fixed tree over
// lanes, so that the result depends only on the bytes, never on scheduling. The reference
// (reference/hash.cpp) restates it on its own; tests/hash_test.cpp checks these XXH64 parts against
// libxxhash on the host, and the kernel against the reference on the GPU.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DPCHECK_HASH_HD __host__ __device__ __forceinline__
#else
#define DPCHECK_HASH_HD inline
#endif

namespace dpcheck::hash {

inline constexpr std::uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t kPrime3 = 0x165667B19E3779F9ull;
inline constexpr std::uint64_t kPrime4 = 0x85EBCA77C2B2AE63ull;
inline constexpr std::uint64_t kPrime5 = 0x27D4EB2F165667C5ull;

inline constexpr int kBlocks = 1024;  // fixed: the lane of every word depends on nothing else
inline constexpr int kThreads = 256;
inline constexpr std::uint64_t kLanes = static_cast<std::uint64_t>(kBlocks) * kThreads;

DPCHECK_HASH_HD std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

DPCHECK_HASH_HD std::uint64_t xxh_round(std::uint64_t acc, std::uint64_t input) {
  acc += input * kPrime2;
  acc = rotl(acc, 31);
  return acc * kPrime1;
}

DPCHECK_HASH_HD std::uint64_t lane_start(std::uint64_t seed, std::uint64_t lane) {
  return seed + kPrime5 + lane * kPrime1;
}

// One 16-byte word, as four 32-bit halves x, y, z, w (little-endian: two 64-bit inputs).
DPCHECK_HASH_HD std::uint64_t absorb(std::uint64_t acc, std::uint32_t x, std::uint32_t y, std::uint32_t z,
                                     std::uint32_t w) {
  acc = xxh_round(acc, (static_cast<std::uint64_t>(y) << 32) | x);
  return xxh_round(acc, (static_cast<std::uint64_t>(w) << 32) | z);
}

// Joins two subtrees, left before right: not commutative, so the tree's order is part of the hash.
DPCHECK_HASH_HD std::uint64_t combine(std::uint64_t left, std::uint64_t right) {
  return xxh_round(left ^ kPrime4, right) * kPrime1 + kPrime4;
}

DPCHECK_HASH_HD std::uint64_t avalanche(std::uint64_t h) {
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

}  // namespace dpcheck::hash
