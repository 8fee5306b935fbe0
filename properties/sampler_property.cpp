// sampler_shards_disjoint: in every epoch the shares are disjoint apart from the padding the sampler
// reports, cover the data apart from at most N-1 examples it reports dropped, are sized as the policy
// says, and every rank agrees on the totals. Each rank computes its own share; the others learn it
// only through the communicator.
#include <algorithm>
#include <mutex>

#include "properties/common.hpp"

namespace dpcheck {

void sampler_body(const Target& target, CaseRecord& record) {
  const SamplerScenario s = *gen_sampler_scenario(target.process_world ? target.process_world->size() : target.world_size);
  record.size = {s.sampler.dataset_size, s.sampler.world_size, 0, 0};
  const SamplerOutcome o = check_sampler(s, target);
  RC_CLASSIFY(s.sampler.dataset_size < s.sampler.world_size, "fewer examples than ranks");
  if (!agree(target, o.passed)) fail_case(o.message.empty() ? "another rank found the shares wrong" : o.message);
}

SamplerOutcome check_sampler(const SamplerScenario& s, const Target& target) {
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
          std::copy(shares[r].begin(), shares[r].end(), all.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(widest)));
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
      std::vector<std::int64_t> count(static_cast<std::size_t>(d), 0);
      std::int64_t total = 0;
      for (std::size_t r = 0; r < n; ++r) {
        if (sizes[r] != sampler->share_size(static_cast<int>(r)))
          fail(at + "rank " + std::to_string(r) + " holds " + std::to_string(sizes[r]) + " examples but share_size says " +
               std::to_string(sampler->share_size(static_cast<int>(r))));
        for (std::int64_t k = 0; k < sizes[r]; ++k) {
          const std::int64_t i = all[r * static_cast<std::size_t>(widest) + static_cast<std::size_t>(k)];
          if (i < 0 || i >= d) {
            fail(at + "rank " + std::to_string(r) + " holds example " + std::to_string(i) + ", outside [0, " +
                 std::to_string(d) + ")");
            continue;
          }
          ++count[static_cast<std::size_t>(i)];
          ++total;
        }
      }
      const std::int64_t lo = *std::min_element(sizes.begin(), sizes.end());
      std::int64_t repeats = 0, missing = 0, first_repeat = -1, first_missing = -1;
      for (std::int64_t i = 0; i < d; ++i) {
        const std::int64_t k = count[static_cast<std::size_t>(i)];
        if (k > 1) { repeats += k - 1; if (first_repeat < 0) first_repeat = i; }
        if (k == 0) { ++missing; if (first_missing < 0) first_missing = i; }
      }
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
          if (lo != widest || widest != d / nn) fail(at + "drop-last shares should all hold floor(D/N) = " + std::to_string(d / nn));
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
