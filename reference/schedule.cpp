#include "reference/schedule.hpp"

#include <algorithm>

#include "src/error.hpp"

namespace dpcheck::reference {

std::vector<std::int64_t> StepExamples::global() const {
  std::vector<std::int64_t> all;
  for (const std::vector<std::int64_t>& r : ranks) all.insert(all.end(), r.begin(), r.end());
  return all;
}

std::int64_t StepExamples::largest_share() const {
  std::int64_t largest = 0;
  for (const std::vector<std::int64_t>& r : ranks) largest = std::max(largest, static_cast<std::int64_t>(r.size()));
  return largest;
}

StepExamples step_examples(const TrainConfig& config, const DistributedSampler& sampler, std::int64_t step) {
  const int world = sampler.config().world_size;
  DPCHECK_ASSERT(step >= 0 && world >= 1);
  const std::int64_t slice = (config.batch + world - 1) / world;
  std::int64_t largest_share = 0;
  for (int r = 0; r < world; ++r) largest_share = std::max(largest_share, sampler.share_size(r));
  StepExamples out;
  out.steps_per_epoch = std::max<std::int64_t>(1, (largest_share + slice - 1) / slice);
  out.epoch = step / out.steps_per_epoch;
  const std::int64_t first = (step % out.steps_per_epoch) * slice;
  for (int r = 0; r < world; ++r) {
    const std::vector<std::int64_t> share = sampler.indices(r, out.epoch);
    const auto n = static_cast<std::int64_t>(share.size());
    const std::int64_t begin = std::min(n, first), end = std::min(n, first + slice);
    out.ranks.emplace_back(share.begin() + begin, share.begin() + end);
  }
  return out;
}

}  // namespace dpcheck::reference
