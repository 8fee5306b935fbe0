// The sampler's documented recipe, restated from its definition with none of the sampler's code
// (src/train/sampler.hpp, src/rng.hpp), so that a shuffle that is biased, off by one or keyed wrongly cannot
// agree with itself. A permutation stays disjoint and covering whatever it is, so the sampler's own
// property cannot see such a bug; a user who follows the recipe in another loader can, and so does
// shuffle_follows_recipe, which compares the two every epoch.
//
// The recipe (docs/architecture.md, "The shuffle"):
//   key(seed, epoch)   SplitMix64's finalizer of seed + 0x9E3779B97F4A7C15 * (epoch + 1)
//   bits(key, s, i)    Philox4x32-10 (Salmon et al., SC'11) of the 128-bit counter (i, s) -- words
//                      i mod 2^32, i / 2^32, s mod 2^32, s / 2^32 -- under the 64-bit key; the first two
//                      output words, the second one high
//   below(key, i, n)   a uniform integer in [0, n) by Lemire's multiply-and-reject: attempt a = 0, 1, ...
//                      takes r = bits(key, a * 2^32, i) and accepts the high half of r * n unless its
//                      low half is below 2^64 mod n
//   order              0 .. D-1, then for i = D-1 down to 1: swap positions i and below(key, i, i + 1)
//   pad / drop-last    the order repeated from its head until N divides its length / cut to a multiple of N
//   split              strided: rank r takes positions r, r + N, ...; contiguous: the r-th block of
//                      numpy.array_split (the first len mod N blocks one longer)
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "src/train/sampler.hpp"

namespace dpcheck::reference {

// Philox4x32-10 on counter words {c0, c1, c2, c3} and key words {k0, k1}.
std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> counter, std::array<std::uint32_t, 2> key);

std::uint64_t shuffle_key(std::uint64_t seed, std::int64_t epoch);
std::uint64_t shuffle_bits(std::uint64_t key, std::uint64_t stream, std::uint64_t index);
std::uint64_t shuffle_below(std::uint64_t key, std::uint64_t index, std::uint64_t n);

// The epoch's order of 0 .. dataset_size-1 (the identity without shuffling).
std::vector<std::int64_t> epoch_order(const SamplerConfig& config, std::int64_t epoch);
// Every rank's share of the epoch, built the plain way: the padded or cut list, then split.
std::vector<std::vector<std::int64_t>> epoch_shares(const SamplerConfig& config, std::int64_t epoch);

}  // namespace dpcheck::reference
