#include "reference/hash.hpp"

#include <cstring>
#include <vector>

#include "kernels/hash_math.hpp"

namespace dpcheck::reference {

namespace {

// Joins n values (a power of two) as the kernels' shared-memory tree does: at each level, value i and
// value i + width become value i.
std::uint64_t tree(std::vector<std::uint64_t> v) {
  for (std::size_t width = v.size() / 2; width > 0; width /= 2)
    for (std::size_t i = 0; i < width; ++i) v[i] = hash::combine(v[i], v[i + width]);
  return v[0];
}

}  // namespace

std::uint64_t replica_hash(const void* data, std::size_t bytes, std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::uint64_t nwords = bytes / 16;
  std::vector<std::uint64_t> lanes(hash::kLanes);
  for (std::uint64_t lane = 0; lane < hash::kLanes; ++lane) {
    std::uint64_t acc = hash::lane_start(seed, lane);
    for (std::uint64_t i = lane; i < nwords; i += hash::kLanes) {
      std::uint32_t w[4];
      std::memcpy(w, p + i * 16, 16);
      acc = hash::absorb(acc, w[0], w[1], w[2], w[3]);
    }
    lanes[lane] = acc;
  }
  std::vector<std::uint64_t> blocks(hash::kBlocks);
  for (int b = 0; b < hash::kBlocks; ++b)
    blocks[static_cast<std::size_t>(b)] =
        tree(std::vector<std::uint64_t>(lanes.begin() + static_cast<std::ptrdiff_t>(b) * hash::kThreads,
                                        lanes.begin() + static_cast<std::ptrdiff_t>(b + 1) * hash::kThreads));
  std::uint64_t h = tree(blocks);
  for (std::size_t k = nwords * 16; k < bytes; ++k) h = hash::xxh_round(h, p[k]);
  return hash::avalanche(h ^ bytes);
}

}  // namespace dpcheck::reference
