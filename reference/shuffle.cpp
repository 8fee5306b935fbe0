#include "reference/shuffle.hpp"

#include <utility>

#include "src/error.hpp"

namespace dpcheck::reference {

namespace {

constexpr std::uint32_t kMultiplier[2] = {0xD2511F53u, 0xCD9E8D57u};  // Salmon et al.'s M0, M1
constexpr std::uint32_t kWeyl[2] = {0x9E3779B9u, 0xBB67AE85u};        // the key's bumps per round

std::uint32_t low(std::uint64_t v) { return static_cast<std::uint32_t>(v & 0xFFFFFFFFu); }
std::uint32_t high(std::uint64_t v) { return static_cast<std::uint32_t>(v >> 32); }

}  // namespace

std::array<std::uint32_t, 4> philox4x32_10(std::array<std::uint32_t, 4> x, std::array<std::uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    // One round: two 32x32 -> 64-bit products, their halves crossed with the other words and the key.
    const std::uint64_t a = std::uint64_t{kMultiplier[0]} * x[0];
    const std::uint64_t b = std::uint64_t{kMultiplier[1]} * x[2];
    x = {high(b) ^ x[1] ^ k[0], low(b), high(a) ^ x[3] ^ k[1], low(a)};
    k = {k[0] + kWeyl[0], k[1] + kWeyl[1]};
  }
  return x;
}

std::uint64_t shuffle_key(std::uint64_t seed, std::int64_t epoch) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<std::uint64_t>(epoch) + 1);
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t shuffle_bits(std::uint64_t key, std::uint64_t stream, std::uint64_t index) {
  const std::array<std::uint32_t, 4> out =
      philox4x32_10({low(index), high(index), low(stream), high(stream)}, {low(key), high(key)});
  return (std::uint64_t{out[1]} << 32) | out[0];
}

std::uint64_t shuffle_below(std::uint64_t key, std::uint64_t index, std::uint64_t n) {
  DPCHECK_ASSERT(n > 0);
  __extension__ typedef unsigned __int128 wide;
  const std::uint64_t reject_below = static_cast<std::uint64_t>((wide{1} << 64) % n);
  for (std::uint64_t attempt = 0;; ++attempt) {
    const wide m = wide{shuffle_bits(key, attempt << 32, index)} * n;
    if (static_cast<std::uint64_t>(m) >= reject_below) return static_cast<std::uint64_t>(m >> 64);
  }
}

std::vector<std::int64_t> epoch_order(const SamplerConfig& config, std::int64_t epoch) {
  std::vector<std::int64_t> order;
  for (std::int64_t i = 0; i < config.dataset_size; ++i) order.push_back(i);
  if (!config.shuffle) return order;
  const std::uint64_t key = shuffle_key(config.seed, epoch);
  for (std::int64_t i = config.dataset_size - 1; i >= 1; --i) {
    const auto j =
        static_cast<std::int64_t>(shuffle_below(key, static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i) + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

std::vector<std::vector<std::int64_t>> epoch_shares(const SamplerConfig& config, std::int64_t epoch) {
  const std::vector<std::int64_t> order = epoch_order(config, epoch);
  const std::size_t n = static_cast<std::size_t>(config.world_size);
  std::vector<std::int64_t> list = order;
  if (config.policy == Policy::pad && !order.empty())
    for (std::size_t next = 0; list.size() % n != 0; next = (next + 1) % order.size()) list.push_back(order[next]);
  if (config.policy == Policy::drop_last) list.resize(list.size() - list.size() % n);
  std::vector<std::vector<std::int64_t>> shares(n);
  if (config.split == Split::strided) {
    for (std::size_t p = 0; p < list.size(); ++p) shares[p % n].push_back(list[p]);
    return shares;
  }
  std::size_t p = 0;
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t k = 0; k < list.size() / n + (r < list.size() % n ? 1 : 0); ++k) shares[r].push_back(list[p++]);
  return shares;
}

}  // namespace dpcheck::reference
