// sampler_shards_disjoint: in every epoch the shares are disjoint apart from the padding the sampler
// reports, cover the data apart from at most N-1 examples it reports dropped, are sized as the policy
// says, and every rank agrees on the totals. Each rank computes its own share; the others learn it
// only through the communicator.
#include <algorithm>
#include <mutex>

#include "properties/common.hpp"
#include "src/train/shares.hpp"

namespace dpcheck {

void sampler_body(const Target& target, const CaseDraw& /*draw*/, CaseRecord& record) {
  const SamplerScenario s = *gen_sampler_scenario(fixed_world(target), 64, scale_one_in(target));
  record.size = {s.sampler.dataset_size, s.sampler.world_size, 0, 0};
  const SamplerOutcome o = check_sampler(s, target_for_case(target, s.simulated));
  RC_CLASSIFY(s.sampler.dataset_size < s.sampler.world_size, "fewer examples than ranks");
  RC_CLASSIFY(s.simulated, "the scale class: simulated ranks");
  RC_CLASSIFY(s.sampler.dataset_size > kCountableExamples, "a data set past 2^24 examples, asked place by place");
  if (!agree(target, o.passed)) fail_case(o.message.empty() ? "another rank found the shares wrong" : o.message);
}

namespace {

// A data set too large to count example by example (2^31 examples would take 16 GiB of counts, and no
// shuffle is drawn for one): every rank's first two, middle and last two examples are asked for one by
// one (DistributedSampler::index) and held to where the split puts them, from the shares' sizes alone.
// Strided, example k of rank r is r + kN; contiguous, a share starts where the shares before it end;
// both mod D, as padding wraps. With sizes as the policy says, adding up to total_size(), those places
// are disjoint and cover the data (less what drop-last reports): a position computed in too few bits,
// or any other slip of the split's arithmetic, lands elsewhere.
SamplerOutcome check_sampler_by_place(const SamplerScenario& s, const Target& target) {
  const SamplerConfig& c = s.sampler;
  const std::unique_ptr<DistributedSampler> sampler = make_sampler(target, c);
  const std::int64_t d = c.dataset_size, n = c.world_size;
  SamplerOutcome o;
  const auto fail = [&](const std::string& why) {
    if (o.passed) o.message = why;
    o.passed = false;
  };
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(n));
  std::int64_t total = 0;
  for (int r = 0; r < n; ++r) total += sizes[static_cast<std::size_t>(r)] = sampler->share_size(r);
  const std::int64_t lo = *std::min_element(sizes.begin(), sizes.end());
  const std::int64_t hi = *std::max_element(sizes.begin(), sizes.end());
  if (total != sampler->total_size())
    fail("the shares hold " + std::to_string(total) + " examples, total_size says " +
         std::to_string(sampler->total_size()));
  switch (c.policy) {
    case Policy::pad:
      if (lo != hi || hi != (d + n - 1) / n)
        fail("pad shares should all hold ceil(D/N) = " + std::to_string((d + n - 1) / n));
      if (sampler->padded() != total - d)
        fail("the shares repeat " + std::to_string(total - d) + " examples but the sampler reports " +
             std::to_string(sampler->padded()) + " padded");
      break;
    case Policy::drop_last:
      if (lo != hi || hi != d / n) fail("drop-last shares should all hold floor(D/N) = " + std::to_string(d / n));
      if (sampler->dropped() != d - total || d - total > n - 1)
        fail(std::to_string(d - total) + " examples are in no share but the sampler reports " +
             std::to_string(sampler->dropped()) + " dropped, at most N-1 allowed");
      break;
    case Policy::uneven:
      if (hi - lo > 1) fail("uneven shares differ by " + std::to_string(hi - lo) + " examples");
      if (total != d) fail("uneven shares hold " + std::to_string(total) + " of " + std::to_string(d) + " examples");
      break;
  }
  for (int epoch = 0; epoch < s.epochs && o.passed; ++epoch) {
    std::int64_t start = 0;  // where rank r's block begins, contiguous
    for (int r = 0; r < n && o.passed; ++r) {
      const std::int64_t size = sizes[static_cast<std::size_t>(r)];
      for (const std::int64_t k : {std::int64_t{0}, std::int64_t{1}, size / 2, size - 2, size - 1}) {
        if (k < 0 || k >= size) continue;
        const std::int64_t want = (c.split == Split::strided ? r + k * n : start + k) % d;
        const std::int64_t got = sampler->index(r, epoch, k);
        if (got == want) continue;
        fail("epoch " + std::to_string(epoch) + ": rank " + std::to_string(r) + "'s example " + std::to_string(k) +
             " is " + std::to_string(got) + ", where the " + std::string(split_name(c.split)) + " split of " +
             std::to_string(d) + " examples puts example " + std::to_string(want));
        break;
      }
      start += size;
    }
  }
  return o;
}

}  // namespace

SamplerOutcome check_sampler(const SamplerScenario& s, const Target& target) {
  if (s.sampler.dataset_size > kCountableExamples) return check_sampler_by_place(s, target);
  const SamplerConfig& c = s.sampler;
  const auto n = static_cast<std::size_t>(c.world_size);
  const std::int64_t d = c.dataset_size;
  SamplerOutcome o;
  std::mutex mu;
  const auto fail = [&](const std::string& why) {
    const std::lock_guard<std::mutex> lock(mu);
    if (o.passed) o.message = why;
    o.passed = false;
  };
  run_world(target, c.world_size, [&](Communicator& comm) {
    const std::unique_ptr<DistributedSampler> sampler = make_sampler(target, c);
    Communicator& host = comm.host();
    for (int epoch = 0; epoch < s.epochs; ++epoch) {
      const std::string at = "epoch " + std::to_string(epoch) + ": ";
      std::vector<std::int64_t> sizes, all, views;
      std::int64_t widest = 0;
      // Every rank's idea of the sizes and totals must agree.
      const std::int64_t view = sampler->total_size() * 1'000'003 + sampler->padded() * 1009 + sampler->dropped();
      if (comm.simulated()) {
        // Simulated ranks: one replica plays them all, so it computes every rank's share itself.
        std::vector<std::vector<std::int64_t>> shares(n);
        for (std::size_t r = 0; r < n; ++r) {
          shares[r] = sampler->indices(static_cast<int>(r), epoch);
          sizes.push_back(static_cast<std::int64_t>(shares[r].size()));
          widest = std::max(widest, sizes.back());
        }
        all.assign(static_cast<std::size_t>(widest) * n, -1);
        for (std::size_t r = 0; r < n; ++r)
          std::copy(shares[r].begin(), shares[r].end(),
                    all.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(widest)));
        views.push_back(view);
      } else {
        // Each rank computes its own share; the others learn it only through the communicator.
        const std::vector<std::int64_t> mine = sampler->indices(comm.rank(), epoch);
        sizes = host.allgather_value<std::int64_t>(static_cast<std::int64_t>(mine.size()));
        widest = *std::max_element(sizes.begin(), sizes.end());
        std::vector<std::int64_t> padded_mine(mine);
        padded_mine.resize(static_cast<std::size_t>(widest), -1);
        all.resize(static_cast<std::size_t>(widest) * n);
        host.allgather(padded_mine.data(), all.data(), static_cast<std::size_t>(widest), DType::i64);
        views = host.allgather_value<std::int64_t>(view);
      }
      if (!records(target, comm)) continue;

      if (std::any_of(views.begin(), views.end(), [&](std::int64_t v) { return v != views[0]; }))
        fail(at + "ranks disagree on the total, padding or dropped counts");
      for (std::size_t r = 0; r < n; ++r)
        if (sizes[r] != sampler->share_size(static_cast<int>(r)))
          fail(at + "rank " + std::to_string(r) + " holds " + std::to_string(sizes[r]) +
               " examples but share_size says " + std::to_string(sampler->share_size(static_cast<int>(r))));
      // The counts dpcheck.torch holds a real job's shares to (src/train/shares.hpp).
      const ShareCount counted = count_shares({d, all, static_cast<std::size_t>(widest), sizes});
      if (counted.outside_rank >= 0)
        fail(at + "rank " + std::to_string(counted.outside_rank) + " holds example " +
             std::to_string(counted.outside_example) + ", outside [0, " + std::to_string(d) + ")");
      const std::int64_t total = counted.total, lo = counted.smallest, repeats = counted.repeats,
                         missing = counted.missing, first_repeat = counted.first_repeat,
                         first_missing = counted.first_missing;
      const auto nn = static_cast<std::int64_t>(n);
      switch (c.policy) {
        case Policy::pad:
          if (d > 0 && (lo != widest || widest != (d + nn - 1) / nn))
            fail(at + "pad shares should all hold ceil(D/N) = " + std::to_string((d + nn - 1) / nn) + " examples");
          if (missing > 0) fail(at + "example " + std::to_string(first_missing) + " is in no share");
          if (repeats != sampler->padded())
            fail(at + std::to_string(repeats) + " examples are repeated (first: " + std::to_string(first_repeat) +
                 ") but the sampler reports " + std::to_string(sampler->padded()) + " padded");
          break;
        case Policy::drop_last:
          if (lo != widest || widest != d / nn)
            fail(at + "drop-last shares should all hold floor(D/N) = " + std::to_string(d / nn));
          if (repeats > 0) fail(at + "example " + std::to_string(first_repeat) + " is in more than one share");
          if (missing != sampler->dropped() || missing > nn - 1)
            fail(at + std::to_string(missing) + " examples are in no share (first: " + std::to_string(first_missing) +
                 ") but the sampler reports " + std::to_string(sampler->dropped()) + " dropped, at most N-1 allowed");
          break;
        case Policy::uneven:
          if (widest - lo > 1) fail(at + "uneven shares differ by " + std::to_string(widest - lo) + " examples");
          if (repeats > 0) fail(at + "example " + std::to_string(first_repeat) + " is in more than one share");
          if (missing > 0) fail(at + "example " + std::to_string(first_missing) + " is in no share");
          break;
      }
      if (total != sampler->total_size())
        fail(at + "the shares hold " + std::to_string(total) + " examples, total_size says " +
             std::to_string(sampler->total_size()));
    }
  });
  return o;
}

}  // namespace dpcheck
