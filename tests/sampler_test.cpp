// DistributedSampler against PyTorch's DistributedSampler: the worked examples by hand, a direct
// transcription of PyTorch's list arithmetic (pad with `indices += ...`, slice `[r::N]`) as the
// reference over a grid of sizes, and the shuffle's determinism. The randomized property over the
// sampler lives with the other properties; these are the fixed cases it is measured against.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "src/error.hpp"
#include "src/rng.hpp"
#include "src/train/sampler.hpp"

namespace dpcheck {
namespace {

using Indices = std::vector<std::int64_t>;

constexpr Split kSplits[] = {Split::strided, Split::contiguous};
constexpr Policy kPolicies[] = {Policy::pad, Policy::drop_last, Policy::uneven};

SamplerConfig config_of(std::int64_t d, int n, Split split, Policy policy, bool shuffle = false,
                        std::uint64_t seed = 0) {
  SamplerConfig c;
  c.dataset_size = d;
  c.world_size = n;
  c.shuffle = shuffle;
  c.seed = seed;
  c.split = split;
  c.policy = policy;
  return c;
}

std::vector<Indices> all_shares(const DistributedSampler& s, std::int64_t epoch) {
  std::vector<Indices> shares;
  for (int r = 0; r < s.config().world_size; ++r) shares.push_back(s.indices(r, epoch));
  return shares;
}

std::string describe(const SamplerConfig& c) {
  return "D=" + std::to_string(c.dataset_size) + " N=" + std::to_string(c.world_size) + " " +
         std::string(split_name(c.split)) + " " + std::string(policy_name(c.policy)) +
         (c.shuffle ? " shuffle" : " in-order");
}

// PyTorch's DistributedSampler.__iter__ written out list by list, plus numpy.array_split for the
// uneven contiguous case; deliberately naive so that it can be checked by eye.
Indices reference_share(Indices list, int n, Split split, Policy policy, int rank) {
  const auto d = static_cast<std::int64_t>(list.size());
  std::int64_t total = d;
  if (policy == Policy::pad) {
    const std::int64_t num_samples = (d + n - 1) / n;
    total = num_samples * n;
    const std::int64_t padding = total - d;
    if (padding > 0 && d > 0) {
      Indices repeated;
      const std::int64_t copies = (padding + d - 1) / d;  // indices * ceil(padding / len)
      for (std::int64_t c = 0; c < copies; ++c) {
        repeated.insert(repeated.end(), list.begin(), list.end());
      }
      list.insert(list.end(), repeated.begin(), repeated.begin() + padding);
    }
  } else if (policy == Policy::drop_last) {
    total = (d / n) * n;
    list.resize(static_cast<std::size_t>(total));
  }
  Indices share;
  if (split == Split::strided) {
    for (std::int64_t p = rank; p < total; p += n) {
      share.push_back(list[static_cast<std::size_t>(p)]);
    }
    return share;
  }
  // numpy.array_split: div_points = cumsum([0] + extras * [q + 1] + (N - extras) * [q]).
  const std::int64_t q = total / n, extras = total % n;
  std::vector<std::int64_t> div_points{0};
  for (int r = 0; r < n; ++r) div_points.push_back(div_points.back() + q + (r < extras ? 1 : 0));
  return Indices(list.begin() + div_points[static_cast<std::size_t>(rank)],
                 list.begin() + div_points[static_cast<std::size_t>(rank) + 1]);
}

// ---- names --------------------------------------------------------------------------------------

TEST(SamplerNames, RoundTrip) {
  for (Split s : kSplits) EXPECT_EQ(parse_split(split_name(s)), s);
  for (Policy p : kPolicies) EXPECT_EQ(parse_policy(policy_name(p)), p);
  EXPECT_EQ(split_name(Split::strided), "strided");
  EXPECT_EQ(split_name(Split::contiguous), "contiguous");
  EXPECT_EQ(policy_name(Policy::pad), "pad");
  EXPECT_EQ(policy_name(Policy::drop_last), "drop-last");
  EXPECT_EQ(policy_name(Policy::uneven), "uneven");
}

TEST(SamplerNames, UnknownNamesListTheChoices) {
  try {
    parse_split("interleaved");
    FAIL() << "parse_split accepted an unknown name";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("interleaved"), std::string::npos) << what;
    EXPECT_NE(what.find("strided"), std::string::npos) << what;
    EXPECT_NE(what.find("contiguous"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  try {
    parse_policy("drop_last");  // the enum's spelling, not the command's
    FAIL() << "parse_policy accepted an unknown name";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("drop_last"), std::string::npos) << what;
    for (const char* choice : {"pad", "drop-last", "uneven"}) {
      EXPECT_NE(what.find(choice), std::string::npos) << what;
    }
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  EXPECT_THROW(parse_split(""), UsageError);
  EXPECT_THROW(parse_policy("Pad"), UsageError);
}

// ---- validation ---------------------------------------------------------------------------------

TEST(SamplerConfigCheck, RejectsBadSizes) {
  EXPECT_THROW(DistributedSampler(config_of(10, 0, Split::strided, Policy::pad)), UsageError);
  EXPECT_THROW(DistributedSampler(config_of(10, -2, Split::strided, Policy::pad)), UsageError);
  EXPECT_THROW(DistributedSampler(config_of(-1, 4, Split::strided, Policy::pad)), UsageError);
  // Rounding up to a multiple of N would overflow; drop-last and uneven never round up.
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  EXPECT_THROW(DistributedSampler(config_of(kMax, 3, Split::strided, Policy::pad)), UsageError);
  EXPECT_NO_THROW(DistributedSampler(config_of(kMax, 3, Split::strided, Policy::drop_last)));
  EXPECT_NO_THROW(DistributedSampler(config_of(kMax, 1, Split::strided, Policy::pad)));
  EXPECT_NO_THROW(DistributedSampler(config_of(0, 1, Split::strided, Policy::pad)));
}

TEST(SamplerConfigCheck, RejectsRankOutOfRange) {
  const DistributedSampler s(config_of(10, 4, Split::strided, Policy::pad));
  for (int rank : {-1, 4, 100}) {
    EXPECT_THROW(s.indices(rank, 0), UsageError) << rank;
    EXPECT_THROW(s.share_size(rank), UsageError) << rank;
  }
  try {
    s.indices(4, 0);
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 4"), std::string::npos) << e.what();
  }
}

// ---- PyTorch's examples, worked by hand (shuffle=False) -----------------------------------------

TEST(SamplerPytorchExamples, StridedPad_D10_N4) {
  const DistributedSampler s(config_of(10, 4, Split::strided, Policy::pad));
  EXPECT_EQ(all_shares(s, 0), (std::vector<Indices>{{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}}));
  EXPECT_EQ(s.padded(), 2);
  EXPECT_EQ(s.dropped(), 0);
  EXPECT_EQ(s.total_size(), 12);
}

TEST(SamplerPytorchExamples, StridedDropLast_D10_N4) {
  const DistributedSampler s(config_of(10, 4, Split::strided, Policy::drop_last));
  EXPECT_EQ(all_shares(s, 0), (std::vector<Indices>{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(s.padded(), 0);
  EXPECT_EQ(s.dropped(), 2);
  EXPECT_EQ(s.total_size(), 8);
}

TEST(SamplerPytorchExamples, StridedUneven_D10_N4) {
  const DistributedSampler s(config_of(10, 4, Split::strided, Policy::uneven));
  EXPECT_EQ(all_shares(s, 0), (std::vector<Indices>{{0, 4, 8}, {1, 5, 9}, {2, 6}, {3, 7}}));
  EXPECT_EQ(s.padded(), 0);
  EXPECT_EQ(s.dropped(), 0);
  EXPECT_EQ(s.total_size(), 10);
}

TEST(SamplerPytorchExamples, ContiguousPad_D10_N4) {
  const DistributedSampler s(config_of(10, 4, Split::contiguous, Policy::pad));
  EXPECT_EQ(all_shares(s, 0), (std::vector<Indices>{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 0, 1}}));
}

TEST(SamplerPytorchExamples, ContiguousDropLast_D10_N4) {
  const DistributedSampler s(config_of(10, 4, Split::contiguous, Policy::drop_last));
  EXPECT_EQ(all_shares(s, 0), (std::vector<Indices>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
}

TEST(SamplerPytorchExamples, ContiguousUnevenIsArraySplit_D10_N4) {
  // numpy.array_split(range(10), 4) -> [0 1 2] [3 4 5] [6 7] [8 9]
  const DistributedSampler s(config_of(10, 4, Split::contiguous, Policy::uneven));
  EXPECT_EQ(all_shares(s, 0), (std::vector<Indices>{{0, 1, 2}, {3, 4, 5}, {6, 7}, {8, 9}}));
}

TEST(SamplerPytorchExamples, PadWithFewerExamplesThanRanks) {
  for (Split split : kSplits) {
    SCOPED_TRACE(std::string(split_name(split)));
    const DistributedSampler one(config_of(1, 4, split, Policy::pad));
    EXPECT_EQ(all_shares(one, 0), (std::vector<Indices>{{0}, {0}, {0}, {0}}));
    EXPECT_EQ(one.padded(), 3);
    // The padding (5) exceeds D (2), so PyTorch repeats the whole list: [0 1] + [0 1 0 1 0].
    const DistributedSampler two(config_of(2, 7, split, Policy::pad));
    EXPECT_EQ(all_shares(two, 0), (std::vector<Indices>{{0}, {1}, {0}, {1}, {0}, {1}, {0}}));
    EXPECT_EQ(two.padded(), 5);
  }
}

TEST(SamplerPytorchExamples, FewerExamplesThanRanksWithoutPadding) {
  for (Split split : kSplits) {
    SCOPED_TRACE(std::string(split_name(split)));
    const DistributedSampler drop(config_of(3, 4, split, Policy::drop_last));
    EXPECT_EQ(all_shares(drop, 0), (std::vector<Indices>(4)));
    EXPECT_EQ(drop.dropped(), 3);
    EXPECT_EQ(drop.total_size(), 0);
    const DistributedSampler uneven(config_of(3, 4, split, Policy::uneven));
    EXPECT_EQ(all_shares(uneven, 0), (std::vector<Indices>{{0}, {1}, {2}, {}}));
  }
}

TEST(SamplerPytorchExamples, EmptyDataSetGivesEmptyShares) {
  for (Split split : kSplits) {
    for (Policy policy : kPolicies) {
      for (bool shuffle : {false, true}) {
        const SamplerConfig c = config_of(0, 3, split, policy, shuffle, 7);
        SCOPED_TRACE(describe(c));
        const DistributedSampler s(c);
        EXPECT_TRUE(s.epoch_order(0).empty());
        EXPECT_EQ(all_shares(s, 0), (std::vector<Indices>(3)));
        EXPECT_EQ(s.total_size(), 0);
        EXPECT_EQ(s.padded(), 0);  // nothing to repeat
        EXPECT_EQ(s.dropped(), 0);
        for (int r = 0; r < 3; ++r) EXPECT_EQ(s.share_size(r), 0);
      }
    }
  }
}

TEST(SamplerPytorchExamples, OneRankTakesTheWholeOrder) {
  for (Split split : kSplits) {
    for (Policy policy : kPolicies) {
      const SamplerConfig c = config_of(13, 1, split, policy, true, 3);
      SCOPED_TRACE(describe(c));
      const DistributedSampler s(c);
      EXPECT_EQ(s.indices(0, 5), s.epoch_order(5));
      EXPECT_EQ(s.padded(), 0);
      EXPECT_EQ(s.dropped(), 0);
    }
  }
}

TEST(SamplerUneven, SharesDifferByAtMostOne) {
  for (Split split : kSplits) {
    for (std::int64_t d = 0; d <= 40; ++d) {
      for (int n = 1; n <= 9; ++n) {
        const SamplerConfig c = config_of(d, n, split, Policy::uneven);
        const DistributedSampler s(c);
        std::int64_t smallest = d, largest = 0;
        for (int r = 0; r < n; ++r) {
          smallest = std::min(smallest, s.share_size(r));
          largest = std::max(largest, s.share_size(r));
          // The larger shares go to the first D mod N ranks, in both splits.
          EXPECT_EQ(s.share_size(r), d / n + (r < d % n ? 1 : 0)) << describe(c) << " rank " << r;
        }
        EXPECT_LE(largest - smallest, 1) << describe(c);
      }
    }
  }
}

// ---- shuffle ------------------------------------------------------------------------------------

bool is_permutation_of_range(const Indices& order, std::int64_t d) {
  Indices sorted = order;
  std::sort(sorted.begin(), sorted.end());
  Indices range(static_cast<std::size_t>(d));
  std::iota(range.begin(), range.end(), 0);
  return sorted == range;
}

TEST(SamplerShuffle, IsAPermutation) {
  for (std::int64_t d : {1, 2, 3, 10, 97, 1000}) {
    const DistributedSampler s(config_of(d, 4, Split::strided, Policy::pad, true, 42));
    for (std::int64_t epoch : {0, 1, 2, 1000}) {
      EXPECT_TRUE(is_permutation_of_range(s.epoch_order(epoch), d)) << "D=" << d << " epoch " << epoch;
    }
  }
}

TEST(SamplerShuffle, WithoutShuffleTheOrderIsTheIdentity) {
  const DistributedSampler s(config_of(25, 4, Split::strided, Policy::pad, false, 42));
  Indices identity(25);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(s.epoch_order(0), identity);
  EXPECT_EQ(s.epoch_order(9), identity);
}

TEST(SamplerShuffle, ShufflesAtAll) {
  // A shuffle that returned the identity would pass every permutation check above.
  const DistributedSampler s(config_of(50, 4, Split::strided, Policy::pad, true, 0));
  Indices identity(50);
  std::iota(identity.begin(), identity.end(), 0);
  for (std::int64_t epoch = 0; epoch < 5; ++epoch) EXPECT_NE(s.epoch_order(epoch), identity);
}

TEST(SamplerShuffle, EpochsGiveDifferentOrders) {
  const DistributedSampler s(config_of(50, 4, Split::strided, Policy::pad, true, 1));
  std::set<Indices> seen;
  for (std::int64_t epoch = 0; epoch < 20; ++epoch) seen.insert(s.epoch_order(epoch));
  EXPECT_EQ(seen.size(), 20u);
}

TEST(SamplerShuffle, SameSeedAndEpochGiveTheSameOrder) {
  // Each rank builds its own sampler; nothing but (seed, epoch) may decide the order.
  const SamplerConfig c = config_of(200, 8, Split::strided, Policy::pad, true, 12345);
  const DistributedSampler a(c);
  const DistributedSampler b(c);
  for (std::int64_t epoch : {0, 3, 77}) {
    EXPECT_EQ(a.epoch_order(epoch), b.epoch_order(epoch));
    EXPECT_EQ(a.epoch_order(epoch), a.epoch_order(epoch));
    for (int r = 0; r < 8; ++r) EXPECT_EQ(a.indices(r, epoch), b.indices(r, epoch));
  }
}

TEST(SamplerShuffle, SeedsGiveDifferentOrders) {
  const DistributedSampler a(config_of(50, 4, Split::strided, Policy::pad, true, 1));
  const DistributedSampler b(config_of(50, 4, Split::strided, Policy::pad, true, 2));
  for (std::int64_t epoch = 0; epoch < 5; ++epoch) {
    EXPECT_NE(a.epoch_order(epoch), b.epoch_order(epoch));
  }
}

TEST(SamplerShuffle, FollowsTheFisherYatesRecipe) {
  // The recipe is part of the interface: a GPU data loader or a Python harness that runs the same
  // Fisher-Yates over the same Philox draws must visit the examples in the same order.
  const std::uint64_t seed = 0xC0FFEE;
  const std::int64_t d = 64;
  const DistributedSampler s(config_of(d, 3, Split::strided, Policy::pad, true, seed));
  for (std::int64_t epoch : {0, 1, 5}) {
    Indices order(static_cast<std::size_t>(d));
    std::iota(order.begin(), order.end(), 0);
    const std::uint64_t key = mix_key(seed, static_cast<std::uint64_t>(epoch));
    for (std::uint64_t i = static_cast<std::uint64_t>(d) - 1; i >= 1; --i) {
      std::swap(order[i], order[random_below(key, 0, i, i + 1)]);
    }
    EXPECT_EQ(s.epoch_order(epoch), order) << "epoch " << epoch;
  }
}

TEST(SamplerShuffle, SharesAreCutFromTheEpochOrder) {
  for (Split split : kSplits) {
    for (Policy policy : kPolicies) {
      const SamplerConfig c = config_of(23, 5, split, policy, true, 9);
      SCOPED_TRACE(describe(c));
      const DistributedSampler s(c);
      for (std::int64_t epoch : {0, 4}) {
        const Indices order = s.epoch_order(epoch);
        for (int r = 0; r < 5; ++r) {
          EXPECT_EQ(s.indices(r, epoch), reference_share(order, 5, split, policy, r)) << "rank " << r;
        }
      }
    }
  }
}

// A sampler that visits the examples backwards: share_of must cut the order it is handed, which is
// what lets a mutant change the order and keep the policy.
class ReversedSampler : public DistributedSampler {
 public:
  using DistributedSampler::DistributedSampler;
  std::vector<std::int64_t> indices(int rank, std::int64_t epoch) const override {
    Indices order = epoch_order(epoch);
    std::reverse(order.begin(), order.end());
    return share_of(order, rank);
  }
};

TEST(SamplerShareOf, CutsTheOrderItIsGiven) {
  const ReversedSampler s(config_of(10, 4, Split::strided, Policy::pad));
  EXPECT_EQ(all_shares(s, 0), (std::vector<Indices>{{9, 5, 1}, {8, 4, 0}, {7, 3, 9}, {6, 2, 8}}));
}

// ---- every size, split, policy ------------------------------------------------------------------

// Counts how often each example appears across all ranks' shares and checks it against the policy:
// uneven covers every example once, drop-last leaves out exactly the tail of the order, and pad
// adds exactly padded() repeats taken from the head of the order.
void check_coverage(const DistributedSampler& s, const std::vector<Indices>& shares, const Indices& order) {
  const SamplerConfig& c = s.config();
  const std::int64_t d = c.dataset_size;
  std::vector<std::int64_t> count(static_cast<std::size_t>(d), 0);
  for (const Indices& share : shares) {
    for (std::int64_t i : share) {
      ASSERT_TRUE(i >= 0 && i < d) << "index " << i << " out of the data set";
      ++count[static_cast<std::size_t>(i)];
    }
  }
  const std::int64_t total = s.total_size();
  for (std::int64_t pos = 0; pos < d; ++pos) {
    const std::int64_t example = order[static_cast<std::size_t>(pos)];
    // Position pos of the order is repeated once for each padded position p in [D, total) with
    // p mod D == pos; positions at or past total were dropped.
    std::int64_t expected = pos < total ? 1 : 0;
    if (c.policy == Policy::pad) {
      for (std::int64_t p = d; p < total; ++p) expected += (p % d == pos) ? 1 : 0;
    }
    EXPECT_EQ(count[static_cast<std::size_t>(example)], expected) << "example " << example << " at position " << pos;
  }
  const std::int64_t seen = std::count_if(count.begin(), count.end(), [](std::int64_t k) { return k > 0; });
  EXPECT_EQ(seen, d - s.dropped());
  const std::int64_t repeats = std::accumulate(count.begin(), count.end(), std::int64_t{0}) - seen;
  EXPECT_EQ(repeats, s.padded());
}

TEST(SamplerGrid, SizesCoverageAndPytorchAgreement) {
  int cases = 0;
  for (std::int64_t d = 0; d <= 40; ++d) {
    for (int n = 1; n <= 9; ++n) {
      for (Split split : kSplits) {
        for (Policy policy : kPolicies) {
          for (bool shuffle : {false, true}) {
            const SamplerConfig c = config_of(d, n, split, policy, shuffle, 2024);
            SCOPED_TRACE(describe(c));
            const DistributedSampler s(c);
            ++cases;

            EXPECT_EQ(s.total_size(), d + s.padded() - s.dropped());
            EXPECT_GE(s.padded(), 0);
            EXPECT_GE(s.dropped(), 0);
            EXPECT_LE(s.padded(), policy == Policy::pad ? n - 1 : 0);
            EXPECT_LE(s.dropped(), policy == Policy::drop_last ? n - 1 : 0);
            if (policy != Policy::uneven) {
              EXPECT_EQ(s.total_size() % n, 0);
            }

            std::int64_t sum = 0;
            for (int r = 0; r < n; ++r) sum += s.share_size(r);
            EXPECT_EQ(sum, s.total_size());

            for (std::int64_t epoch : {0, 1}) {
              const Indices order = s.epoch_order(epoch);
              const std::vector<Indices> shares = all_shares(s, epoch);
              for (int r = 0; r < n; ++r) {
                EXPECT_EQ(static_cast<std::int64_t>(shares[static_cast<std::size_t>(r)].size()), s.share_size(r))
                    << "rank " << r << " epoch " << epoch;
                if (policy != Policy::uneven) {
                  EXPECT_EQ(s.share_size(r), s.total_size() / n);
                }
                EXPECT_EQ(shares[static_cast<std::size_t>(r)], reference_share(order, n, split, policy, r))
                    << "rank " << r << " epoch " << epoch;
              }
              check_coverage(s, shares, order);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 41 * 9 * 2 * 3 * 2);
}

TEST(SamplerGrid, SharesOfDifferentRanksAreDisjointWithoutPadding) {
  for (Split split : kSplits) {
    for (Policy policy : {Policy::drop_last, Policy::uneven}) {
      const SamplerConfig c = config_of(103, 7, split, policy, true, 5);
      SCOPED_TRACE(describe(c));
      const DistributedSampler s(c);
      const std::vector<Indices> shares = all_shares(s, 3);
      for (std::size_t a = 0; a < shares.size(); ++a) {
        const std::set<std::int64_t> mine(shares[a].begin(), shares[a].end());
        EXPECT_EQ(mine.size(), shares[a].size()) << "rank " << a << " repeats an example";
        for (std::size_t b = a + 1; b < shares.size(); ++b) {
          for (std::int64_t i : shares[b]) {
            EXPECT_EQ(mine.count(i), 0u) << "ranks " << a << " and " << b;
          }
        }
      }
    }
  }
}

TEST(SamplerGrid, SizesOfAHugeDataSetNeedNoOrder) {
  // share_size and total_size are arithmetic: they must not build an order of D elements.
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const DistributedSampler drop(config_of(kMax, 3, Split::strided, Policy::drop_last));
  EXPECT_EQ(drop.share_size(2), kMax / 3);
  EXPECT_EQ(drop.dropped(), kMax % 3);
  const DistributedSampler uneven(config_of(kMax, 8, Split::contiguous, Policy::uneven));
  EXPECT_EQ(uneven.total_size(), kMax);
  EXPECT_EQ(uneven.share_size(0) - uneven.share_size(7), 1);
  // 2^63 - 15 pads by 7 to 2^63 - 8, the largest multiple of 8 that fits; one more overflows.
  const DistributedSampler pad(config_of(kMax - 14, 8, Split::strided, Policy::pad));
  EXPECT_EQ(pad.padded(), 7);
  EXPECT_EQ(pad.total_size(), kMax - 7);
  EXPECT_EQ(pad.share_size(7), kMax / 8);
  EXPECT_THROW(DistributedSampler(config_of(kMax - 6, 8, Split::strided, Policy::pad)), UsageError);
  // 2^63 - 1 is a multiple of 7, so it needs no padding at all.
  const DistributedSampler exact(config_of(kMax, 7, Split::contiguous, Policy::pad));
  EXPECT_EQ(exact.padded(), 0);
  EXPECT_EQ(exact.share_size(6), kMax / 7);
}

// index(rank, epoch, k) is indices(rank, epoch)[k], asked for alone: over a grid of sizes, both splits,
// every policy, in order and shuffled; a place outside the share is refused.
TEST(SamplerIndex, IsTheShareAskedPlaceByPlace) {
  for (const std::int64_t d : {0, 1, 5, 10, 17})
    for (const int n : {1, 3, 4, 7})
      for (const Split split : kSplits)
        for (const Policy policy : kPolicies)
          for (const bool shuffle : {false, true}) {
            const DistributedSampler s(config_of(d, n, split, policy, shuffle, 9));
            for (std::int64_t epoch = 0; epoch < 2; ++epoch)
              for (int r = 0; r < n; ++r) {
                const Indices share = s.indices(r, epoch);
                for (std::size_t k = 0; k < share.size(); ++k)
                  ASSERT_EQ(s.index(r, epoch, static_cast<std::int64_t>(k)), share[k])
                      << "D=" << d << " N=" << n << " rank " << r << " place " << k;
                EXPECT_THROW((void)s.index(r, epoch, static_cast<std::int64_t>(share.size())), UsageError);
                EXPECT_THROW((void)s.index(r, epoch, -1), UsageError);
              }
          }
}

// Past 2^31 examples, in order: a place is arithmetic, with no list of D examples built, and lands where
// 64-bit arithmetic puts it (the last rank's last example beyond 2^31).
TEST(SamplerIndex, PastTwoToTheThirtyOneNeedsNoList) {
  const std::int64_t d = (std::int64_t{1} << 32) + 5;
  const int n = 4096;
  const DistributedSampler strided(config_of(d, n, Split::strided, Policy::pad));
  const std::int64_t last = strided.share_size(n - 1) - 1;
  EXPECT_EQ(strided.index(n - 1, 0, last), (n - 1 + last * n) % d);
  EXPECT_GT(strided.index(n - 1, 0, last - 1), std::int64_t{1} << 31);
  const DistributedSampler contiguous(config_of(d, n, Split::contiguous, Policy::uneven));
  EXPECT_EQ(contiguous.index(n - 1, 0, contiguous.share_size(n - 1) - 1), d - 1);
  EXPECT_EQ(contiguous.index(1, 0, 0), contiguous.share_size(0));
}

}  // namespace
}  // namespace dpcheck
