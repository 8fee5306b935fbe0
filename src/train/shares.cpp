#include "src/train/shares.hpp"

#include <algorithm>
#include <map>

namespace dpcheck {

namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i)
    s += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return s;
}

std::string examples_text(const std::vector<ShareCount::Repeat>& repeats) {
  std::string s;
  for (std::size_t i = 0; i < repeats.size(); ++i)
    s += (i == 0 ? "" : ", ") + std::to_string(repeats[i].example) + " (" + ranks_text(repeats[i].ranks) + ")";
  return s;
}

std::string list_text(const std::vector<std::int64_t>& values) {
  std::string s;
  for (std::size_t i = 0; i < values.size(); ++i) s += (i == 0 ? "" : ", ") + std::to_string(values[i]);
  return s;
}

// Whether some share, less a padded tail, is out of ascending order.
bool looks_shuffled(const EpochShares& s) {
  const std::size_t n = s.sizes.size();
  const std::int64_t body = n == 0 ? 0 : s.dataset_size / static_cast<std::int64_t>(n);
  for (std::size_t r = 0; r < n; ++r)
    for (std::int64_t k = 1; k < std::min(s.sizes[r], body); ++k)
      if (s.at(r, k) < s.at(r, k - 1)) return true;
  return false;
}

bool same_order(const EpochShares& a, const EpochShares& b) {
  if (a.sizes.size() != b.sizes.size()) return false;
  for (std::size_t r = 0; r < a.sizes.size(); ++r) {
    if (a.sizes[r] != b.sizes[r]) return false;
    for (std::int64_t k = 0; k < a.sizes[r]; ++k)
      if (a.at(r, k) != b.at(r, k)) return false;
  }
  return true;
}

}  // namespace

ShareCount count_shares(const EpochShares& s) {
  ShareCount c;
  const std::int64_t d = s.dataset_size;
  const std::size_t n = s.sizes.size();
  std::vector<std::int64_t> count(static_cast<std::size_t>(std::max<std::int64_t>(d, 0)), 0);
  if (n > 0) {
    c.smallest = *std::min_element(s.sizes.begin(), s.sizes.end());
    c.widest = *std::max_element(s.sizes.begin(), s.sizes.end());
  }
  for (std::size_t r = 0; r < n; ++r)
    for (std::int64_t k = 0; k < s.sizes[r]; ++k) {
      const std::int64_t i = s.at(r, k);
      if (i < 0 || i >= d) {
        if (c.outside_rank < 0) {
          c.outside_rank = static_cast<int>(r);
          c.outside_example = i;
        }
        continue;
      }
      ++count[static_cast<std::size_t>(i)];
      ++c.total;
    }
  // The ranks behind the first few repeats: one more pass, over those examples alone.
  std::map<std::int64_t, std::size_t> named;
  for (std::int64_t i = 0; i < d; ++i) {
    const std::int64_t k = count[static_cast<std::size_t>(i)];
    if (k > 1) {
      c.repeats += k - 1;
      if (c.first_repeat < 0) c.first_repeat = i;
      if (c.repeated.size() < kNamedExamples) {
        named[i] = c.repeated.size();
        c.repeated.push_back({i, {}});
      }
    }
    if (k == 0) {
      ++c.missing;
      if (c.first_missing < 0) c.first_missing = i;
      if (c.missed.size() < kNamedExamples) c.missed.push_back(i);
    }
  }
  if (!named.empty())
    for (std::size_t r = 0; r < n; ++r)
      for (std::int64_t k = 0; k < s.sizes[r]; ++k)
        if (const auto it = named.find(s.at(r, k)); it != named.end())
          c.repeated[it->second].ranks.push_back(static_cast<int>(r));
  return c;
}

ShareVerdict judge_shares(std::int64_t epoch, const EpochShares& shares, const ShareRules& rules,
                          const EpochShares* previous) {
  ShareVerdict v;
  v.count = count_shares(shares);
  const ShareCount& c = v.count;
  const std::int64_t d = shares.dataset_size, n = static_cast<std::int64_t>(shares.sizes.size());
  const std::string at = "epoch " + std::to_string(epoch) + ": ";
  const auto fail = [&](const std::string& why) {
    if (v.passed) v.message = at + why;
    v.passed = false;
  };
  if (n == 0) {
    fail("no rank drew any example");
    return v;
  }
  const std::int64_t ceil_share = (d + n - 1) / n, floor_share = d / n;
  v.padded = c.repeats > 0 && c.missing == 0 && c.smallest == c.widest && c.widest == ceil_share &&
             c.repeats == n * ceil_share - d;
  v.dropped = c.missing > 0 && c.repeats == 0 && c.smallest == c.widest && c.widest == floor_share &&
              c.missing == d - n * floor_share;
  v.shuffled = rules.shuffled.value_or(looks_shuffled(shares));

  if (c.outside_rank >= 0)
    fail("rank " + std::to_string(c.outside_rank) + " draws example " + std::to_string(c.outside_example) +
         ", outside the data set's [0, " + std::to_string(d) + ")");
  if (c.repeats > 0 && !v.padded) {
    const bool everyone = c.missing == 0 && c.smallest == d && c.widest == d;
    fail(everyone
             ? "every rank draws all " + std::to_string(d) +
                   " examples: the shares are not split among the ranks (no DistributedSampler?)"
             : "example " + examples_text({c.repeated.front()}) + " is drawn more than once" +
                   (c.missing > 0 ? ", and example " + std::to_string(c.first_missing) + " by no rank" : "") + " (" +
                   std::to_string(c.repeats) + " repeated draws, " + std::to_string(c.missing) +
                   " examples in no share; repeated: " + examples_text(c.repeated) + "): the ranks' shares overlap");
  }
  if (c.missing > 0 && c.repeats == 0 && !v.dropped)
    fail(std::to_string(c.missing) + " examples are in no share (" + list_text(c.missed) +
         (c.missing > static_cast<std::int64_t>(c.missed.size()) ? ", ..." : "") +
         "): the shares do not cover the data");
  if (c.repeats == 0 && c.missing == 0 && c.widest - c.smallest > 1)
    fail("the shares hold from " + std::to_string(c.smallest) + " to " + std::to_string(c.widest) +
         " examples: they differ by more than one");
  if (v.passed && rules.strict && v.padded)
    fail("padding repeats " + std::to_string(c.repeats) + " example" + (c.repeats == 1 ? "" : "s") + " (" +
         examples_text(c.repeated) + ") so that the shares are equal, and strict shares were asked for");
  if (v.passed && rules.strict && v.dropped)
    fail(std::to_string(c.missing) + " examples (" + list_text(c.missed) +
         ") are dropped so that the shares are equal, and strict shares were asked for");
  if (previous != nullptr && v.shuffled && same_order(shares, *previous)) {
    v.repeats_previous_epoch = true;
    fail("every rank draws exactly the order it drew in epoch " + std::to_string(epoch - 1) +
         ", though the sampler shuffles: the shuffle does not change with the epoch (call the sampler's "
         "set_epoch(epoch) before each epoch)");
  }
  if (!v.passed) return v;

  std::string seen = std::to_string(n) + (n == 1 ? " rank draws " : " ranks draw ");
  seen += c.smallest == c.widest ? std::to_string(c.widest) + (n == 1 ? "" : " examples each")
                                 : std::to_string(c.smallest) + " to " + std::to_string(c.widest) + " examples";
  seen += " of " + std::to_string(d) + ", disjoint, covering the data";
  if (v.padded)
    seen += " apart from padding: " + std::to_string(c.repeats) + " example" + (c.repeats == 1 ? "" : "s") +
            " drawn twice so that the shares are equal (" + examples_text(c.repeated) + ")";
  if (v.dropped)
    seen += " apart from " + std::to_string(c.missing) + " dropped so that the shares are equal (" +
            list_text(c.missed) + ")";
  if (v.shuffled) seen += previous != nullptr ? "; shuffled, in a new order this epoch" : "; shuffled";
  v.message = at + seen;
  return v;
}

}  // namespace dpcheck
