#include "src/io/hash.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace dpcheck {

std::uint64_t hash_bytes(const void* data, std::size_t size, std::uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

}  // namespace dpcheck
