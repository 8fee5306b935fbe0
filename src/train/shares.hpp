// What a sampler's shares of one epoch hold, counted example by example: which examples more than one
// rank draws (and which ranks), which no rank draws, and which lie outside the data set. The sampler
// property (properties/sampler_property.cpp) holds dpcheck's own sampler to these counts, and
// dpcheck.torch (python/) holds the indices a real job's ranks drew to them, through judge_shares.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dpcheck {

// Every rank's share of one epoch, in order: rank r's k-th example is flat[r * widest + k] for k below
// sizes[r] (what an all-gather of shares padded to the widest one gives).
struct EpochShares {
  std::int64_t dataset_size = 0;
  std::span<const std::int64_t> flat;
  std::size_t widest = 0;
  std::span<const std::int64_t> sizes;

  std::int64_t at(std::size_t rank, std::int64_t k) const { return flat[rank * widest + static_cast<std::size_t>(k)]; }
};

struct ShareCount {
  std::int64_t total = 0;    // examples drawn, over every share (repeats counted)
  std::int64_t repeats = 0;  // draws beyond the first of an example
  std::int64_t missing = 0;  // examples no share holds
  std::int64_t first_repeat = -1, first_missing = -1;
  std::int64_t smallest = 0, widest = 0;  // share sizes
  // The first example outside [0, dataset_size), and the rank that holds it; -1: none.
  int outside_rank = -1;
  std::int64_t outside_example = 0;
  // The first few examples drawn more than once, each with the ranks that draw it (a rank twice when it
  // draws it twice), and the first few examples drawn by none.
  struct Repeat {
    std::int64_t example = 0;
    std::vector<int> ranks;
  };
  std::vector<Repeat> repeated;
  std::vector<std::int64_t> missed;
};
inline constexpr std::size_t kNamedExamples = 8;  // how many repeats and misses a count names

ShareCount count_shares(const EpochShares& shares);

// How a real job's shares are judged.
struct ShareRules {
  // Padding (every share ceil(D/N), the repeats exactly the N ceil(D/N) - D the shares exceed the data
  // by, nothing missing: DistributedSampler without drop_last) and dropping (every share floor(D/N), at
  // most N - 1 examples in no share, nothing repeated: with drop_last) are reported, and fail only when
  // strict.
  bool strict = false;
  // Whether the sampler shuffles: an epoch whose every share repeats the previous epoch's order is then
  // a shuffle that ignores the epoch (set_epoch never called). Unknown: a share that is not ascending
  // (apart from a padded tail) counts as shuffled.
  std::optional<bool> shuffled;
};

struct ShareVerdict {
  bool passed = true;
  bool padded = false, dropped = false, shuffled = false;
  bool repeats_previous_epoch = false;
  ShareCount count;
  std::string message;  // why it failed; otherwise what was seen ("3 ranks draw 34 examples each ...")
};

// One epoch's shares; `previous`, when given, the same ranks' shares of the epoch before.
ShareVerdict judge_shares(std::int64_t epoch, const EpochShares& shares, const ShareRules& rules,
                          const EpochShares* previous = nullptr);

}  // namespace dpcheck
