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

std::int64_t StepSlots::global() const {
  std::int64_t total = 0;
  for (std::size_t r = 0; r < begin.size(); ++r) total += end[r] - begin[r];
  return total;
}

StepSlots step_slots(const TrainConfig& config, const DistributedSampler& sampler, std::int64_t step) {
  const int world = sampler.config().world_size;
  DPCHECK_ASSERT(step >= 0 && world >= 1);
  const std::int64_t slice = (config.batch + world - 1) / world;
  std::int64_t largest_share = 0;
  for (int r = 0; r < world; ++r) largest_share = std::max(largest_share, sampler.share_size(r));
  StepSlots out;
  out.steps_per_epoch = std::max<std::int64_t>(1, (largest_share + slice - 1) / slice);
  out.epoch = step / out.steps_per_epoch;
  out.slice = slice;
  out.first = (step % out.steps_per_epoch) * slice;
  for (int r = 0; r < world; ++r) {
    const std::int64_t n = sampler.share_size(r);
    out.begin.push_back(std::min(n, out.first));
    out.end.push_back(std::min(n, out.first + slice));
  }
  return out;
}

StepExamples step_examples(const TrainConfig& config, const DistributedSampler& sampler, std::int64_t step) {
  const StepSlots slots = step_slots(config, sampler, step);
  StepExamples out;
  out.epoch = slots.epoch;
  out.steps_per_epoch = slots.steps_per_epoch;
  for (std::size_t r = 0; r < slots.begin.size(); ++r) {
    // Cut from the share the sampler lists (a broken sampler's may be of another size than it reports).
    const std::vector<std::int64_t> share = sampler.indices(static_cast<int>(r), out.epoch);
    const auto n = static_cast<std::int64_t>(share.size());
    const std::int64_t begin = std::min(n, slots.first), end = std::min(n, slots.first + slots.slice);
    out.ranks.emplace_back(share.begin() + begin, share.begin() + end);
  }
  return out;
}

}  // namespace dpcheck::reference
