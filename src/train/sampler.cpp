// DistributedSampler: the epoch order and each rank's share of it (sampler.hpp lists the policies).
// A share is computed position by position from the order, never by building the padded list, so a
// rank's cost is its share plus the order, and share_size() needs no order at all.
#include "src/train/sampler.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "src/choice.hpp"
#include "src/error.hpp"
#include "src/rng.hpp"

namespace dpcheck {

std::string_view split_name(Split s) {
  switch (s) {
    case Split::strided: return "strided";
    case Split::contiguous: return "contiguous";
  }
  return "?";
}

std::string_view policy_name(Policy p) {
  switch (p) {
    case Policy::pad: return "pad";
    case Policy::drop_last: return "drop-last";
    case Policy::uneven: return "uneven";
  }
  return "?";
}

Split parse_split(std::string_view name) {
  return parse_choice(name, {Split::strided, Split::contiguous}, split_name, "split");
}

Policy parse_policy(std::string_view name) {
  return parse_choice(name, {Policy::pad, Policy::drop_last, Policy::uneven}, policy_name, "sampler policy");
}

DistributedSampler::DistributedSampler(const SamplerConfig& config) : config_(config) {
  if (config_.world_size < 1) {
    throw UsageError("sampler: world_size must be at least 1, got " + std::to_string(config_.world_size));
  }
  if (config_.dataset_size < 0) {
    throw UsageError("sampler: dataset_size must not be negative, got " + std::to_string(config_.dataset_size));
  }
  // Padding rounds D up to a multiple of N, which must still fit in an int64.
  const std::int64_t d = config_.dataset_size, n = config_.world_size;
  if (config_.policy == Policy::pad && d / n + (d % n != 0 ? 1 : 0) > std::numeric_limits<std::int64_t>::max() / n) {
    throw UsageError("sampler: dataset_size " + std::to_string(config_.dataset_size) +
                     " is too large to pad to a multiple of world_size " + std::to_string(config_.world_size));
  }
}

std::vector<std::int64_t> DistributedSampler::epoch_order(std::int64_t epoch) const {
  const std::int64_t d = config_.dataset_size;
  std::vector<std::int64_t> order(static_cast<std::size_t>(d));
  for (std::int64_t i = 0; i < d; ++i) order[static_cast<std::size_t>(i)] = i;
  if (!config_.shuffle) return order;
  // Each draw is a pure function of (seed, epoch, position), so every rank (and any other
  // implementation of the same recipe) arrives at the same permutation without communicating.
  const std::uint64_t key = mix_key(config_.seed, static_cast<std::uint64_t>(epoch));
  for (std::int64_t i = d - 1; i >= 1; --i) {
    const auto u = static_cast<std::uint64_t>(i);
    const auto j = static_cast<std::size_t>(random_below(key, /*stream=*/0, /*index=*/u, u + 1));
    std::swap(order[static_cast<std::size_t>(i)], order[j]);
  }
  return order;
}

namespace {

// A rank outside [0, N) is rejected as a UsageError rather than an internal Error: ranks reach the
// sampler from the command line and from launcher environments as well as from a Communicator.
void check_rank(int rank, int world_size) {
  if (rank < 0 || rank >= world_size) {
    throw UsageError("sampler: rank " + std::to_string(rank) + " is out of range for world_size " +
                     std::to_string(world_size));
  }
}

// p mod D, for D > 0. A position outside [0, total) (a broken split's) stays out of [0, D) when it is
// negative, so a check sees it instead of a wrapped example.
std::int64_t wrapped(std::int64_t p, std::int64_t d) { return p < 0 ? p : p % d; }

}  // namespace

std::int64_t DistributedSampler::total_size() const {
  const std::int64_t d = config_.dataset_size;
  const std::int64_t n = config_.world_size;
  switch (config_.policy) {
    case Policy::pad: return (d / n + (d % n != 0 ? 1 : 0)) * n;
    case Policy::drop_last: return (d / n) * n;
    case Policy::uneven: return d;
  }
  return d;
}

std::int64_t DistributedSampler::padded() const {
  return std::max<std::int64_t>(total_size() - config_.dataset_size, 0);
}

std::int64_t DistributedSampler::dropped() const {
  return std::max<std::int64_t>(config_.dataset_size - total_size(), 0);
}

std::int64_t DistributedSampler::share_size(int rank) const {
  check_rank(rank, config_.world_size);
  const std::int64_t total = total_size();
  const std::int64_t n = config_.world_size;
  // Pad and drop-last make the total a multiple of N; uneven gives the first (total mod N) ranks
  // one more: the count of both the strided slice order[r::N] and numpy.array_split's block.
  return total / n + (rank < total % n ? 1 : 0);
}

std::int64_t DistributedSampler::position(int rank, std::int64_t k) const {
  const std::int64_t n = config_.world_size;
  if (config_.split == Split::strided) return rank + k * n;
  const std::int64_t total = total_size();
  return rank * (total / n) + std::min<std::int64_t>(rank, total % n) + k;
}

std::vector<std::int64_t> DistributedSampler::share_of(const std::vector<std::int64_t>& order, int rank) const {
  check_rank(rank, config_.world_size);
  DPCHECK_ASSERT(static_cast<std::int64_t>(order.size()) == config_.dataset_size);
  const std::int64_t d = config_.dataset_size;
  const std::int64_t size = share_size(rank);
  // Position p of the padded-or-truncated list is order[p mod D]: drop-last and uneven never reach
  // past D, and pad wraps around to the head as often as needed (PyTorch repeats the whole list
  // when the padding exceeds D).
  std::vector<std::int64_t> share;
  share.reserve(static_cast<std::size_t>(size));
  for (std::int64_t k = 0; k < size; ++k) {
    const std::int64_t p = wrapped(position(rank, k), d);
    share.push_back(p < 0 ? p : order[static_cast<std::size_t>(p)]);
  }
  return share;
}

std::int64_t DistributedSampler::index(int rank, std::int64_t epoch, std::int64_t k) const {
  check_rank(rank, config_.world_size);
  if (k < 0 || k >= share_size(rank))
    throw UsageError("sampler: rank " + std::to_string(rank) + " holds " + std::to_string(share_size(rank)) +
                     " examples, not an example " + std::to_string(k));
  const std::int64_t p = wrapped(position(rank, k), config_.dataset_size);
  if (!config_.shuffle || p < 0) return p;
  return (*cached_order(epoch))[static_cast<std::size_t>(p)];
}

std::shared_ptr<const std::vector<std::int64_t>> DistributedSampler::cached_order(std::int64_t epoch) const {
  const std::lock_guard<std::mutex> lock(cache_->mutex);
  if (!cache_->order || cache_->epoch != epoch) {
    cache_->order = std::make_shared<const std::vector<std::int64_t>>(epoch_order(epoch));
    cache_->epoch = epoch;
  }
  return cache_->order;
}

std::vector<std::int64_t> DistributedSampler::indices(int rank, std::int64_t epoch) const {
  check_rank(rank, config_.world_size);
  if (config_.shuffle) return share_of(*cached_order(epoch), rank);
  // In order: the identity needs no list of D examples.
  const std::int64_t size = share_size(rank);
  std::vector<std::int64_t> share;
  share.reserve(static_cast<std::size_t>(size));
  for (std::int64_t k = 0; k < size; ++k) share.push_back(wrapped(position(rank, k), config_.dataset_size));
  return share;
}

}  // namespace dpcheck
