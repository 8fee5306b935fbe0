// share_weights_match_global_batch: after the all-reduce's average every example of a step's global batch
// weighs 1/B. The trainer gives rank r's micro-batch j the scale n_j N / B (its share weight b_r N / B
// times the micro-batch's weight n_j / b_r, times the loss scale), rounded once to float32
// (Trainer::micro_batch_scale); a case holds every rank's every scale to the float32 nearest that
// rational, with b_r and B from the step's definition (reference/schedule.hpp, from the shares' sizes),
// and every rank's slot of its share (Trainer::slot) to that definition's.
//
// The gradient properties see a weight only through a gradient's bound, whose roundings grow with the
// share: at 2^24 examples a share's gamma reaches 1 and the bound says nothing. Weights go wrong exactly
// there -- a count held in float32 is exact up to 2^24 and rounds past it -- and so do slots computed in
// 32 bits past 2^31, so this property asks the trainer for its slots and scales alone, with no example
// evaluated: data sets of up to 3N examples, past 2^24, past 2^31, and shares past 2^31 (data sets of
// N times that: tokens, not samples), at 1 to 8 ranks and at the scale class's 63 to 4096, every policy
// and split, 1 to 4 micro-batches and loss scales of 1 to 2^24, at a drawn step of the epoch (its last
// slices are short).
#include <cmath>
#include <cstdio>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "properties/common.hpp"
#include "reference/schedule.hpp"
#include "src/comm/simulated_comm.hpp"
#include "src/train/data.hpp"

namespace dpcheck {

namespace {

struct WeightCase {
  int world = 1;
  std::int64_t dataset = 1, batch = 1, step = 0;
  Split split = Split::strided;
  Policy policy = Policy::uneven;
  int accumulate = 1;
  int loss_scale_exponent = 0;

  TrainConfig config() const {
    TrainConfig c;
    c.model.dims = {1, 1};
    c.batch = batch;
    c.dataset_size = dataset;
    c.accumulate = accumulate;
    c.shuffle = false;  // the shares' sizes are the same shuffled; a shuffle of 2^31 would list them all
    c.split = split;
    c.policy = policy;
    return c;
  }
  std::string describe() const {
    std::ostringstream os;
    os << "data " << dataset << " | batch " << batch << " | world " << world << " " << split_name(split) << " "
       << policy_name(policy) << " | step " << step << " | " << accumulate << " micro-batch"
       << (accumulate == 1 ? "" : "es") << " | loss scale 2^" << loss_scale_exponent;
    return os.str();
  }
};

void showValue(const WeightCase& c, std::ostream& os) { os << c.describe(); }

rc::Gen<WeightCase> gen_weight_case(int fixed_world) {
  return rc::gen::exec([fixed_world] {
    WeightCase c;
    const int small = *rc::gen::inRange(1, 9);
    const bool scale = *rc::gen::element(false, true);
    const std::vector<int>& worlds = scale_class_worlds();
    const int large = worlds[*index_below(worlds.size())];
    c.world = fixed_world > 0 ? fixed_world : scale ? large : small;
    c.split = *rc::gen::element(Split::strided, Split::contiguous);
    c.policy = *rc::gen::element(Policy::uneven, Policy::pad, Policy::drop_last);
    // Up to 3N examples; from 2^24 to 2^25, where float32 holds every other count; from 2^20 short of
    // 2^31 to 2^32, where it holds one in 128 to 256; shares from 2^20 short of 2^31 to 2^32.
    const int magnitude = *uniform(rc::gen::inRange(0, 4));
    const auto offset = *uniform(rc::gen::inRange<std::int64_t>(0, std::int64_t{1} << 30));
    const std::int64_t n = c.world;
    const std::int64_t least = c.policy == Policy::drop_last ? n : 1;  // drop-last: a share for every rank
    const std::int64_t across_2_31 = (std::int64_t{1} << 31) - (std::int64_t{1} << 20) + 2 * offset;
    c.dataset = magnitude == 0   ? least + offset % (3 * n)
                : magnitude == 1 ? (std::int64_t{1} << 24) + offset % (std::int64_t{1} << 24)
                : magnitude == 2 ? across_2_31
                                 : n * across_2_31 + offset % n;
    const bool whole = *rc::gen::element(true, false);
    const auto cut = *uniform(rc::gen::inRange<std::int64_t>(0, std::int64_t{1} << 40));
    c.batch = whole ? c.dataset : 1 + cut % c.dataset;
    const std::int64_t steps = c.config().steps_per_epoch(c.world);
    const int at = *uniform(rc::gen::inRange(0, 3));
    const auto pick = *uniform(rc::gen::inRange<std::int64_t>(0, std::int64_t{1} << 40));
    c.step = at == 0 ? 0 : at == 1 ? steps - 1 : pick % steps;
    c.accumulate = *uniform(rc::gen::inRange(1, 5));
    c.loss_scale_exponent = *uniform(rc::gen::inRange(0, 25));
    return c;
  });
}

// Whether `got` is `want` rounded once to float32. `want` is n N / B from one float64 division (within
// 2^-53 of the rational) and the trainer's float64 product within 2^-51 of it: where a float32 midpoint
// lies that close, either neighbour is the rational rounded once.
bool rounded_once(float got, double want) {
  const float nearest = static_cast<float>(want);
  if (got == nearest) return true;
  const double midpoint = (static_cast<double>(got) + static_cast<double>(nearest)) / 2;
  return std::nextafter(got, nearest) == nearest && std::abs(want - midpoint) <= 0x1p-50 * want;
}

}  // namespace

void share_weights_body(const Target& target, const CaseDraw& /*draw*/, CaseRecord& record) {
  const int fixed = fixed_world(target);
  const WeightCase c = *gen_weight_case(fixed);
  record.size = {c.dataset, c.world, 0, 0};
  RC_CLASSIFY(c.dataset > kCountableExamples, "a data set past 2^24 examples");
  RC_CLASSIFY(c.dataset / c.world >= (std::int64_t{1} << 31), "shares past 2^31 examples");
  RC_CLASSIFY(c.world > 8, "the scale class");

  // The trainer of rank 0 of a simulated world: its arithmetic is every rank's, and no example is read.
  const TrainConfig config = c.config();
  const SyntheticDataset data(config.data_size(), config.model, config.seed);
  SimulatedComm comm(c.world);
  const RankTrainer rt = make_rank_trainer(target_for_case(target, true), config, comm, data);
  const Trainer& trainer = *rt.trainer;

  const reference::StepSlots slots = reference::step_slots(config, *rt.sampler, c.step);
  for (int r = 0; r < c.world; ++r) {
    const Trainer::Slot s = trainer.slot(r, c.step);
    const auto at = static_cast<std::size_t>(r);
    if (s.epoch == slots.epoch && s.begin == slots.begin[at] && s.end == slots.end[at]) continue;
    fail_case("rank " + std::to_string(r) + " takes examples [" + std::to_string(s.begin) + ", " +
              std::to_string(s.end) + ") of its share of epoch " + std::to_string(s.epoch) + " at step " +
              std::to_string(c.step) + ", where slices of " + std::to_string(slots.slice) + " put it at [" +
              std::to_string(slots.begin[at]) + ", " + std::to_string(slots.end[at]) + ") of epoch " +
              std::to_string(slots.epoch) + " (its share holds " + std::to_string(rt.sampler->share_size(r)) + ")");
  }
  const std::int64_t global = slots.global();
  if (global == 0) fail_case("step " + std::to_string(c.step) + " has no examples on any rank");
  const float loss_scale = std::ldexp(1.0f, c.loss_scale_exponent);
  double worst = 0;  // the largest |got - want| in float32 spacings at want
  for (int r = 0; r < c.world; ++r) {
    const std::int64_t share = slots.end[static_cast<std::size_t>(r)] - slots.begin[static_cast<std::size_t>(r)];
    const std::vector<std::int64_t> micro = split_sizes(share, c.accumulate);
    for (std::size_t j = 0; j < micro.size(); ++j) {
      const std::int64_t n = micro[j];
      if (n == 0) continue;
      const float got = trainer.micro_batch_scale(n, share, share, global, loss_scale);
      const double want =
          static_cast<double>(n) * c.world / static_cast<double>(global) * static_cast<double>(loss_scale);
      const auto nearest = static_cast<float>(want);
      const double spacing = static_cast<double>(std::nextafter(nearest, INFINITY)) - static_cast<double>(nearest);
      const double off = std::abs(static_cast<double>(got) - want) / spacing;
      worst = std::max(worst, off);
      if (rounded_once(got, want)) continue;
      char buf[400];
      std::snprintf(buf, sizeof buf,
                    "rank %d scales micro-batch %zu (%lld of its %lld examples, of %lld in the global batch over %d "
                    "ranks) by %.9g: every example must weigh loss scale / B, so the scale is n N / B x 2^%d = "
                    "%.17g rounded once, %.9g (the scale is %.6f float32 spacings from it, the rounding %.6f)",
                    r, j, static_cast<long long>(n), static_cast<long long>(share), static_cast<long long>(global),
                    c.world, static_cast<double>(got), c.loss_scale_exponent, want, static_cast<double>(nearest), off,
                    std::abs(static_cast<double>(nearest) - want) / spacing);
      fail_case(buf);
    }
  }
  char note[160];
  std::snprintf(note, sizeof note, "every scale within %.3f float32 spacings of n N / B (%lld examples, %d ranks)",
                worst, static_cast<long long>(global), c.world);
  record.note = note;
}

}  // namespace dpcheck
