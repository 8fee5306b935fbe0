// DistributedSampler: which examples each rank trains on in an epoch. Every rank computes the same
// epoch order on its own (a shuffle keyed by seed and epoch, or the identity), then takes its share:
//
//   split   strided     rank r takes order[r], order[r+N], ...            (PyTorch's DistributedSampler)
//           contiguous  rank r takes the r-th of N consecutive blocks      (torch.chunk when N divides it)
//   policy  pad         repeat examples from the head of the order until N divides the total (PyTorch's
//                       default); the repeats are reported by padded()
//           drop-last   leave out the tail so that N divides the total; reported by dropped()
//           uneven      no padding and nothing dropped; shares differ in size by at most one
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

namespace dpcheck {

enum class Split { strided, contiguous };
enum class Policy { pad, drop_last, uneven };

std::string_view split_name(Split s);
std::string_view policy_name(Policy p);
Split parse_split(std::string_view name);    // throws UsageError naming the valid choices
Policy parse_policy(std::string_view name);  // "pad", "drop-last", "uneven"

struct SamplerConfig {
  std::int64_t dataset_size = 0;  // D >= 0
  int world_size = 1;             // N >= 1
  bool shuffle = true;
  std::uint64_t seed = 0;
  Split split = Split::strided;
  Policy policy = Policy::pad;
};

class DistributedSampler {
 public:
  explicit DistributedSampler(const SamplerConfig& config);  // throws UsageError on bad sizes
  virtual ~DistributedSampler() = default;

  const SamplerConfig& config() const { return config_; }

  // The order of all D examples in this epoch: a permutation keyed by (seed, epoch), or 0..D-1.
  std::vector<std::int64_t> epoch_order(std::int64_t epoch) const;

  // Rank r's share of the epoch, in the order the rank visits it.
  virtual std::vector<std::int64_t> indices(int rank, std::int64_t epoch) const;
  // Example k of rank r's share (indices(rank, epoch)[k]) without building the share: O(1) in order,
  // for data sets too large to list (2^31 examples and more); a shuffled epoch builds its order once.
  std::int64_t index(int rank, std::int64_t epoch, std::int64_t k) const;

  // Size of rank r's share (the same every epoch); its sum over ranks is total_size().
  std::int64_t share_size(int rank) const;
  std::int64_t total_size() const;  // D + padded() - dropped()
  std::int64_t padded() const;      // repeated examples added by the pad policy
  std::int64_t dropped() const;     // examples left out by the drop-last policy

 protected:
  // Rank r's share of an epoch order of length D: pads or drops it as the policy says, then splits.
  // Mutants that change the order reuse it.
  std::vector<std::int64_t> share_of(const std::vector<std::int64_t>& order, int rank) const;
  // Where example k of rank r's share sits in the padded-or-truncated list of the epoch (before it wraps
  // around D): the split's arithmetic, which every share and index() go through.
  virtual std::int64_t position(int rank, std::int64_t k) const;

 private:
  // The epoch order indices() last built, or nullptr: a simulated world (src/comm/simulated_comm.hpp) asks
  // for every rank's share of the same epoch in turn, which would otherwise build the order N times.
  // Copies share it (it depends on the config alone); a mutex, since ranks as threads may share a sampler.
  std::shared_ptr<const std::vector<std::int64_t>> cached_order(std::int64_t epoch) const;
  struct OrderCache {
    std::mutex mutex;
    std::int64_t epoch = -1;
    std::shared_ptr<const std::vector<std::int64_t>> order;
  };

  SamplerConfig config_;
  std::shared_ptr<OrderCache> cache_ = std::make_shared<OrderCache>();
};

}  // namespace dpcheck
