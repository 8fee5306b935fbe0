// The mutants that break which examples a rank trains on and how its gradient is weighed: the sampler,
// and the trainer's slots, batches and weights (its hooks, src/train/trainer.hpp), each with its row.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "mutants/mutants.hpp"
#include "src/rng.hpp"

namespace dpcheck {

namespace {

template <class S> std::unique_ptr<DistributedSampler> sampler_of(const SamplerConfig& config) {
  return std::make_unique<S>(config);
}

// The split's arithmetic in 32 bits (unsigned, so that it wraps rather than overflows, then read back
// as an int): every position past 2^31 - 1 turns negative.
class Index32Sampler final : public DistributedSampler {
 public:
  using DistributedSampler::DistributedSampler;

 protected:
  std::int64_t position(int rank, std::int64_t k) const override {
    const auto n = static_cast<std::uint32_t>(config().world_size), r = static_cast<std::uint32_t>(rank);
    const auto i = static_cast<std::uint32_t>(k), total = static_cast<std::uint32_t>(total_size());
    const std::uint32_t p = config().split == Split::strided ? r + i * n : r * (total / n) + std::min(r, total % n) + i;
    return static_cast<std::int32_t>(p);
  }
};

class RankSeedSampler final : public DistributedSampler {
 public:
  using DistributedSampler::DistributedSampler;
  std::vector<std::int64_t> indices(int rank, std::int64_t epoch) const override {
    SamplerConfig own = config();
    own.seed += static_cast<std::uint64_t>(rank);
    return share_of(DistributedSampler(own).epoch_order(epoch), rank);
  }
};

class OffByOneSampler final : public DistributedSampler {
 public:
  using DistributedSampler::DistributedSampler;
  std::vector<std::int64_t> indices(int rank, std::int64_t epoch) const override {
    const std::vector<std::int64_t> order = epoch_order(epoch);
    std::vector<std::int64_t> mine = share_of(order, rank);
    if (rank == 0 || mine.empty()) return mine;
    const std::vector<std::int64_t> previous = share_of(order, rank - 1);
    if (previous.empty()) return mine;
    mine.pop_back();
    mine.insert(mine.begin(), previous.back());
    return mine;
  }
};

// The shuffle as a contributor might rewrite it: Sattolo's partner in [0, i), or the bits modulo i + 1.
enum class ShuffleSlip { sattolo, modulo };
template <ShuffleSlip slip> class SlippedShuffleSampler final : public DistributedSampler {
 public:
  using DistributedSampler::DistributedSampler;
  std::vector<std::int64_t> indices(int rank, std::int64_t epoch) const override {
    std::vector<std::int64_t> order(static_cast<std::size_t>(config().dataset_size));
    std::iota(order.begin(), order.end(), std::int64_t{0});
    if (config().shuffle) {
      const std::uint64_t key = mix_key(config().seed, static_cast<std::uint64_t>(epoch));
      for (std::size_t i = order.size() > 0 ? order.size() - 1 : 0; i >= 1; --i) {
        const std::uint64_t j =
            slip == ShuffleSlip::sattolo ? random_below(key, 0, i, i) : random_u64(key, 0, i) % (i + 1);
        std::swap(order[i], order[static_cast<std::size_t>(j)]);
      }
    }
    return share_of(order, rank);
  }
};

// A step's slot of a share in 32 bits, wrapping as two's complement does (without the undefined
// behaviour of an overflowing int).
StepSlot slot_32bit(const Trainer& t, int rank, std::int64_t step, StepSlot) {
  const auto i32 = [](std::int64_t v) { return static_cast<std::int32_t>(static_cast<std::uint32_t>(v)); };
  const std::int32_t share = i32(t.sampler().share_size(rank));
  const std::int32_t slice = i32((t.config().batch + t.world_size() - 1) / t.world_size());
  const std::int32_t begin = std::min(share, i32(std::int64_t{i32(step % t.steps_per_epoch())} * slice));
  return {
      .epoch = step / t.steps_per_epoch(), .begin = begin, .end = std::min(share, i32(std::int64_t{begin} + slice))};
}

// Steps per epoch rounded down: a short last step is never taken.
StepSlot short_last_step_dropped(const Trainer& t, int rank, std::int64_t step, StepSlot) {
  const std::int64_t slice = (t.config().batch + t.world_size() - 1) / t.world_size();
  std::int64_t largest = 0;
  for (int r = 0; r < t.world_size(); ++r) largest = std::max(largest, t.sampler().share_size(r));
  const std::int64_t steps = std::max<std::int64_t>(1, largest / slice);
  const std::int64_t share = t.sampler().share_size(rank);
  const std::int64_t begin = std::min(share, (step % steps) * slice);
  return {.epoch = step / steps, .begin = begin, .end = std::min(share, begin + slice)};
}

double loss_mean_of_rank_means(Trainer& t, double local_loss_sum, std::int64_t local_examples, std::int64_t) {
  double mean = local_examples > 0 ? local_loss_sum / static_cast<double>(local_examples) : 0.0;
  t.comm().host().allreduce(&mean, 1, DType::f64, ReduceOp::avg);
  return mean;
}

}  // namespace

std::span<const MutantInfo> data_mutants() {
  static const MutantInfo rows[] = {
      {.name = "sampler-rank-seed",
       .caught_by = "sampler_shards_disjoint",
       .bug = "each rank shuffles with seed + rank instead of the shared seed",
       .parts = {.sampler = sampler_of<RankSeedSampler>}},
      {.name = "sampler-off-by-one",
       .caught_by = "sampler_shards_disjoint",
       .bug = "each rank after the first starts its share one example early, repeating its neighbour's last example "
              "and leaving out its own last",
       .parts = {.sampler = sampler_of<OffByOneSampler>}},
      {.name = "sampler-index-32bit",
       .caught_by = "sampler_shards_disjoint",
       .bug = "the sampler computes a share's positions in 32-bit integers, as code written for data sets that fit an "
              "int does: past 2^31 examples a position wraps negative",
       .scale = true,
       .parts = {.sampler = sampler_of<Index32Sampler>}},
      {.name = "shuffle-sattolo",
       .caught_by = "shuffle_follows_recipe",
       .bug = "the shuffle draws each swap partner from [0, i) instead of [0, i] (Sattolo's algorithm): every order is "
              "one "
              "cycle, no example ever keeps its place, and the shares are still disjoint and covering",
       .parts = {.sampler = sampler_of<SlippedShuffleSampler<ShuffleSlip::sattolo>>}},
      {.name = "shuffle-modulo",
       .caught_by = "shuffle_follows_recipe",
       .bug = "the shuffle reduces 64 random bits modulo i + 1 instead of the recipe's multiply-and-reject: a valid, "
              "nearly unbiased permutation, but not the one another loader following the recipe draws",
       .parts = {.sampler = sampler_of<SlippedShuffleSampler<ShuffleSlip::modulo>>}},
      {.name = "sampler-epoch-frozen",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug =
           "the trainer never advances the sampler's epoch: every epoch visits the examples in the first epoch's order",
       .parts = {.trainer = {.slot =
                                 [](const Trainer&, int, std::int64_t, StepSlot s) {
                                   s.epoch = 0;
                                   return s;
                                 }}}},
      {.name = "short-last-step-dropped",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug = "an epoch has floor(share / slice) steps, so a short last step is never taken and its examples never "
              "trained",
       .parts = {.trainer = {.slot = short_last_step_dropped}}},
      {.name = "trainer-slot-32bit",
       .caught_by = "share_weights_match_global_batch",
       .bug = "the trainer computes a step's slot of a share in 32-bit integers: past 2^31 examples a share (a data "
              "set of "
              "tokens over few ranks) wraps negative, and the rank trains on the wrong examples or none",
       .scale = true,
       .parts = {.trainer = {.slot = slot_32bit}}},
      {.name = "drop-one-sample",
       .caught_by = "gradient_average_matches_whole_batch",
       .bug = "the last rank leaves the last example of its share out of the forward pass",
       .parts = {.trainer = {.local_batch =
                                 [](const Trainer& t, std::int64_t, Batch b) {
                                   return t.rank() == t.world_size() - 1 && b.size > 0 ? b.slice(0, b.size - 1) : b;
                                 }}}},
      {.name = "mean-of-means",
       .caught_by = "uneven_shares_match_whole_batch",
       .bug = "every rank's mean gradient gets the same weight, however many examples its share holds",
       .parts = {.trainer = {.share_weight = [](std::int64_t share, std::int64_t,
                                                int) { return share > 0 ? 1.0 : 0.0; }}}},
      {.name = "share-weight-float32",
       .caught_by = "share_weights_match_global_batch",
       .bug =
           "the share weight b_r N / B is computed from counts held in float32, as a global batch counted in a float "
           "tensor is: exact up to 2^24 examples, past that B and b_r N round before the division",
       .scale = true,
       .parts = {.trainer = {.share_weight =
                                 [](std::int64_t share, std::int64_t global, int world) {
                                   return static_cast<double>(static_cast<float>(share * world)) /
                                          static_cast<double>(static_cast<float>(global));
                                 }}}},
      {.name = "accumulate-sum-of-means",
       .caught_by = "accumulation_matches_whole_batch",
       .bug = "gradient accumulation adds the micro-batches' mean gradients without dividing by their number",
       .parts = {.trainer = {.micro_batch_weight = [](std::int64_t micro,
                                                      std::int64_t) { return micro > 0 ? 1.0 : 0.0; }}}},
      {.name = "loss-mean-of-rank-means",
       .caught_by = "reported_loss_is_global_mean",
       .bug = "the reported loss averages the ranks' mean losses, whatever their shares' sizes",
       .parts = {.trainer = {.global_mean_loss = loss_mean_of_rank_means}}},
  };
  return rows;
}

}  // namespace dpcheck
