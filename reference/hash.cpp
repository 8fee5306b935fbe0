// The replica hash, restated from its description in reference/hash.hpp: one loop per lane, then the
// trees, then the tail and the finish, in the order the description gives them.
#include "reference/hash.hpp"

#include <bit>
#include <vector>

namespace dpcheck::reference {

namespace xxh64 {

std::uint64_t round(std::uint64_t acc, std::uint64_t input) {
  acc += input * prime_2;
  acc = std::rotl(acc, 31);
  return acc * prime_1;
}

std::uint64_t avalanche(std::uint64_t h) {
  h ^= h >> 33;
  h *= prime_2;
  h ^= h >> 29;
  h *= prime_3;
  h ^= h >> 32;
  return h;
}

}  // namespace xxh64

namespace {

// Eight bytes as a little-endian number, whatever the host's byte order.
std::uint64_t little_endian_64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int k = 7; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

std::uint64_t join(std::uint64_t left, std::uint64_t right) {
  return xxh64::round(left ^ xxh64::prime_4, right) * xxh64::prime_1 + xxh64::prime_4;
}

// Joins the n values v[first], ..., v[first + n - 1] (n a power of two): value i and value i + n/2 become
// value i, until one is left.
std::uint64_t tree(std::vector<std::uint64_t>& v, std::size_t first, std::size_t n) {
  for (std::size_t half = n / 2; half > 0; half /= 2)
    for (std::size_t i = 0; i < half; ++i) v[first + i] = join(v[first + i], v[first + i + half]);
  return v[first];
}

}  // namespace

std::uint64_t replica_hash(const void* data, std::size_t bytes, std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  const std::uint64_t words = bytes / 16;

  std::vector<std::uint64_t> lane(replica_hash_lanes);
  for (std::uint64_t l = 0; l < replica_hash_lanes; ++l) {
    std::uint64_t acc = seed + xxh64::prime_5 + l * xxh64::prime_1;
    for (std::uint64_t w = l; w < words; w += replica_hash_lanes) {
      acc = xxh64::round(acc, little_endian_64(p + 16 * w));
      acc = xxh64::round(acc, little_endian_64(p + 16 * w + 8));
    }
    lane[l] = acc;
  }

  std::vector<std::uint64_t> group(replica_hash_groups);
  for (std::uint64_t g = 0; g < replica_hash_groups; ++g)
    group[g] = tree(lane, g * replica_hash_lanes_per_group, replica_hash_lanes_per_group);
  std::uint64_t h = tree(group, 0, replica_hash_groups);

  for (std::size_t k = 16 * words; k < bytes; ++k) h = xxh64::round(h, p[k]);
  return xxh64::avalanche(h ^ bytes);
}

}  // namespace dpcheck::reference
