// bucketing_preserves_bits: a drawn scenario trained twice, with one all-reduce after the backward pass
// and with the gradient in buckets of a drawn size (src/train/bucketing.hpp), each started as the backward
// pass produces it: every step's reported loss, and the parameters, the optimizer state and the loss
// scaler's state after every step, must be the same bits. Each element is still reduced once, by the
// same backend in rank order, so nothing may change: a bucket that leaves an element out, or one taken
// before its last layer has written it, changes some bit of the step.
//
// Bucket sizes are drawn to split tensors (any size from one element), to end exactly at a tensor's
// start, and to hold the whole gradient in one bucket; scenarios draw micro-batches too, whose
// buckets start in the last one's backward pass only. Worlds have two ranks or more (unless a launcher
// fixed one), since on one rank an element left out of the average keeps its value anyway.
#include <algorithm>
#include <bit>
#include <mutex>

#include "properties/common.hpp"
#include "src/error.hpp"
#include "src/train/bucketing.hpp"
#include "src/train/replica_check.hpp"

namespace dpcheck {

std::string bucketing_unavailable(const Target& target) {
  if (target.world_size == 1)
    return "one rank: an element left out of the average, or reduced twice, keeps its value, so buckets can hide "
           "nothing there";
  if (target.backend->rank_order) return "";
  return "the " + target.backend->name +
         " backend does not promise to reduce an element in rank order wherever it falls in a call (a ring's "
         "chunks change the order), so buckets may change bits by design";
}

namespace {

// What one run leaves on rank 0 (every process, under a launcher): after each step, the parameters,
// the optimizer state and the scaler's state, and the step's loss.
struct RunRecord {
  std::vector<std::vector<float>> params, state, grads;  // grads: the reduced gradient the step took
  std::vector<LossScalerState> scaler;
  std::vector<double> losses;
  bool overlapped = false;
  // Rank 0's first step (on any rank) whose buckets did not all start during the backward pass although
  // they could, or whose replica check failed: -1 when none.
  std::int64_t not_overlapped = -1, out_of_sync = -1;
  std::string replicas;  // the failed replica check's report
};

RunRecord train_recorded(const Scenario& s, const Target& target, const Dataset& data, double bucket_mb) {
  TrainConfig c = s.train;
  c.bucket_mb = bucket_mb;
  RunRecord out;
  std::mutex mu;
  run_world(target, s.world_size, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    RunRecord mine;
    // Where the communicator takes calls from a communication thread and the engine's gradient lives
    // beside its buffers (a host gradient, copied at the hook; a GPU's, through its staging), the
    // buckets must overlap: judged from the target, not from the trainer's own word.
    mine.overlapped =
        bucket_mb > 0 && comm.callable_from_any_thread() && rt.engine->memory_space() == comm.memory_space();
    while (rt.trainer->next_step() < c.steps) {
      const StepResult r = rt.trainer->step();
      // Every bucket's lowest layer is done inside the last micro-batch's backward pass, so each must
      // have started there; a rank with nothing to train on has no pass to start them in.
      if (mine.overlapped && (!r.buckets_may_overlap || r.buckets_overlapped != r.buckets) &&
          !rt.trainer->local_indices(r.step).empty() && mine.not_overlapped < 0)
        mine.not_overlapped = r.step;
      if (!r.replicas.synchronized && mine.out_of_sync < 0) {
        mine.out_of_sync = r.step;
        mine.replicas = r.replicas.describe();
      }
      mine.losses.push_back(r.loss);
      mine.grads.emplace_back(rt.engine->param_count());
      rt.engine->store_grads(mine.grads.back());
      mine.params.emplace_back(rt.engine->param_count());
      rt.engine->store_params(mine.params.back());
      mine.state.emplace_back(rt.optimizer->state_size());
      rt.optimizer->store_state(mine.state.back());
      mine.scaler.push_back(rt.trainer->scaler().state());
    }
    if (!records(target, comm)) return;
    const std::lock_guard<std::mutex> lock(mu);
    out = std::move(mine);
  });
  return out;
}

// The first element at which a and b differ in their bits, or a.size() when none does.
std::size_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return i;
  return a.size();
}

}  // namespace

BucketingOutcome check_bucketing(const Scenario& s, const Target& target, std::size_t bucket_elements) {
  const TrainConfig& c = s.train;
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  const ParamLayout layout(c.model);
  // Exact: bucket_elements * 4 bytes / 2^20 is a multiple of a power of two.
  const double bucket_mb = static_cast<double>(bucket_elements) * sizeof(float) / (1024.0 * 1024.0);
  DPCHECK_ASSERT(dpcheck::bucket_elements(bucket_mb) == bucket_elements);

  BucketingOutcome o;
  const std::vector<GradientBucket> plan = plan_buckets(layout, bucket_elements);
  o.buckets = plan.size();
  for (const GradientBucket& b : plan) o.splits_tensor |= b.lo > 0 && layout.slice_at(b.lo).offset != b.lo;

  const RunRecord one = train_recorded(s, target, data, 0);
  const RunRecord bucketed = train_recorded(s, target, data, bucket_mb);
  o.overlapped = bucketed.overlapped;
  const std::string with = "with the gradient in " + std::to_string(plan.size()) + " bucket" +
                           (plan.size() == 1 ? "" : "s") + " of at most " + std::to_string(bucket_elements) +
                           (bucket_elements == 1 ? " element, " : " elements, ");
  const auto value_text = [](float got, float want) {
    return float_bits_text(got) + " where one all-reduce gives " + float_bits_text(want) + " (" +
           std::to_string(ulp_distance(got, want)) + " ulp apart)";
  };
  if (bucketed.out_of_sync >= 0) {
    o.passed = false;
    o.message =
        with + "step " + std::to_string(bucketed.out_of_sync) + " left the replicas out of sync: " + bucketed.replicas;
    return o;
  }
  for (std::size_t t = 0; t < one.params.size() && o.passed; ++t) {
    const std::string at = with + "after step " + std::to_string(t) + ", ";
    // The bucket that holds flat element i, the first clue to which bucket went wrong.
    const auto in_bucket = [&](std::size_t i) {
      for (std::size_t k = 0; k < plan.size(); ++k)
        if (plan[k].lo <= i && i < plan[k].hi)
          return "; it is element " + std::to_string(i - plan[k].lo) + " of bucket " + std::to_string(k) + " [" +
                 std::to_string(plan[k].lo) + ", " + std::to_string(plan[k].hi) + ")";
      return std::string();
    };
    if (std::size_t g = first_bit_difference(bucketed.grads[t], one.grads[t]); g < one.grads[t].size()) {
      o.message = at + "the all-reduced gradient at " + layout.describe_element(g) + " is " +
                  value_text(bucketed.grads[t][g], one.grads[t][g]) + in_bucket(g);
    } else if (std::size_t i = first_bit_difference(bucketed.params[t], one.params[t]); i < one.params[t].size()) {
      o.message = at + "parameter " + layout.describe_element(i) + " is " +
                  value_text(bucketed.params[t][i], one.params[t][i]) + in_bucket(i);
    } else if (std::size_t j = first_bit_difference(bucketed.state[t], one.state[t]); j < one.state[t].size()) {
      o.message = at + "the optimizer state at " + std::to_string(j) + " is " +
                  value_text(bucketed.state[t][j], one.state[t][j]);
    } else if (std::bit_cast<std::uint64_t>(bucketed.losses[t]) != std::bit_cast<std::uint64_t>(one.losses[t])) {
      o.message = at + "the step's reported loss is " + std::to_string(bucketed.losses[t]) + " instead of " +
                  std::to_string(one.losses[t]);
    } else if (bucketed.scaler[t] != one.scaler[t]) {
      o.message = at + "the loss scaler's state (scale, counter, skipped steps) differs from one all-reduce's";
    }
    o.passed = o.message.empty();
  }
  if (o.passed && bucketed.not_overlapped >= 0) {
    o.passed = false;
    o.message = with + "at step " + std::to_string(bucketed.not_overlapped) +
                " some bucket started only after the backward pass had returned, though the communicator can take it "
                "from another thread: the backward pass hid none of its all-reduce";
  }
  return o;
}

void bucketing_body(const Target& target, const CaseDraw& draw, CaseRecord& record) {
  ScenarioSpace space = space_for(target, draw);
  // Two to four ranks (with two, a bucket reduced twice averages x and x back to x exactly: three and
  // four show it).
  space.min_world_size = 2;
  space.max_world_size = 4;
  space.accumulate = *rc::gen::arbitrary<bool>();
  const Scenario s = *gen_scenario(space);
  record.size = size_of(s);
  const ParamLayout layout(s.train.model);
  const std::size_t total = layout.size();
  // Any size from one element (splitting tensors), one that ends the first bucket at a tensor's start,
  // or one bucket for the whole gradient.
  std::size_t cap = 1;
  switch (*rc::gen::inRange(0, 4)) {
    case 0: cap = *rc::gen::inRange<std::size_t>(1, total + 1); break;
    case 1: cap = *rc::gen::inRange<std::size_t>(1, std::min<std::size_t>(total, 64) + 1); break;
    case 2: {
      const auto k = *rc::gen::inRange<std::size_t>(1, layout.slices().size());
      cap = total - layout.slices()[k].offset;
      break;
    }
    default: cap = total + *rc::gen::inRange<std::size_t>(0, 3);
  }
  const BucketingOutcome o = check_bucketing(s, target, cap);
  RC_CLASSIFY(o.buckets == 1, "one bucket");
  RC_CLASSIFY(o.splits_tensor, "a bucket splits a tensor");
  RC_CLASSIFY(o.overlapped, "overlapped with the backward pass");
  RC_CLASSIFY(s.train.accumulate > 1, "micro-batches");
  if (!agree(target, o.passed))
    fail_case(o.message.empty() ? "another rank found the bucketed run's bits differ" : o.message);
}

}  // namespace dpcheck
