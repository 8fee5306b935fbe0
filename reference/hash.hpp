// The replica hash of kernels/hash.cu restated on the host, as plain loops, so that the GPU's result can
// be checked bit for bit (tests/hash_test.cpp). It is written from what the GPU hash computes, stated
// here, and shares no code or constant with the kernel: a wrong constant on either side shows as a
// disagreement rather than living on both.
//
// What it computes for `bytes` bytes and a seed:
//   - The bytes are read as 16-byte words; the bytes % 16 bytes after the last whole word are the tail.
//   - There are L = 1024 x 256 lanes. Lane l starts at seed + P5 + l * P1 and absorbs the words l, l + L,
//     l + 2L, ... in that order, each word as two little-endian 64-bit inputs, one XXH64 round each.
//   - Each group of 256 lanes (a GPU block), and then the 1024 groups' values, are joined by a binary
//     tree: while n values remain, value i (i < n/2) becomes join(value i, value i + n/2), where
//     join(a, b) = round(a ^ P4, b) * P1 + P4 (not commutative: the tree's order is part of the hash).
//   - Each tail byte, as a 64-bit input, goes through one round; the result is the XXH64 avalanche of
//     that value xor `bytes`.
// P1..P5, the round and the avalanche are XXH64's (Collet, xxHash specification); tests/hash_test.cpp
// checks them against libxxhash's XXH64. The lanes, the join and the tree are dpcheck's own.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dpcheck::reference {

std::uint64_t replica_hash(const void* data, std::size_t bytes, std::uint64_t seed);

// The fixed layout: the lane of every word depends on nothing else.
inline constexpr std::uint64_t replica_hash_groups = 1024;
inline constexpr std::uint64_t replica_hash_lanes_per_group = 256;
inline constexpr std::uint64_t replica_hash_lanes = replica_hash_groups * replica_hash_lanes_per_group;

// XXH64's primes and its two primitives, as the xxHash specification writes them.
namespace xxh64 {

inline constexpr std::uint64_t prime_1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t prime_2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t prime_3 = 0x165667B19E3779F9ull;
inline constexpr std::uint64_t prime_4 = 0x85EBCA77C2B2AE63ull;
inline constexpr std::uint64_t prime_5 = 0x27D4EB2F165667C5ull;

// acc + input * P2, rotated left by 31, times P1.
std::uint64_t round(std::uint64_t acc, std::uint64_t input);
// Shifts and multiplies that let every input bit reach every output bit.
std::uint64_t avalanche(std::uint64_t h);

}  // namespace xxh64

}  // namespace dpcheck::reference
