// train --bucket-mb on the GPU: the cuda engine with cuda-local replicas, each bucket's copy and
// all-reduce queued on a stream of its own after an event the backward pass records as it queues the
// bucket's last layer (kernels/cuda_engine.cpp, src/train/bucketing.hpp). Every bucket must start during the
// backward pass, and every step's parameters must be the bits of one all-reduce, for bucket sizes that
// split tensors, end at one, or hold the whole gradient, with and without micro-batches.
//
// Through the CUDA plugin, as `dpcheck train --engine cuda` runs; without the plugin or a device every
// test skips with the reason.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "src/error.hpp"
#include "src/target/target.hpp"
#include "src/train/data.hpp"
#include "src/train/loss_scaler.hpp"
#include "src/train/trainer.hpp"
#include "tests/target_support.hpp"

namespace dpcheck {
namespace {

Target cuda_local(int world) {
  Target t = resolve_target({.engine = "cuda", .comm = "cuda-local"});
  t.world_size = world;
  return t;
}

struct TrainingRun {
  std::vector<std::vector<float>> params;  // rank 0's, after every step
  std::size_t buckets = 0, overlapped = 0;
  bool may_overlap = true, synchronized = true;
};

TrainingRun train(const TrainConfig& c, int world) {
  const Target target = cuda_local(world);
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  TrainingRun out;
  std::mutex mu;
  run_world(target, world, [&](Communicator& comm) {
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    TrainingRun mine;
    for (int s = 0; s < c.steps; ++s) {
      const StepResult r = rt.trainer->step();
      mine.buckets += r.buckets;
      mine.overlapped += r.buckets_overlapped;
      mine.may_overlap &= c.bucket_mb == 0 || r.buckets_may_overlap;
      mine.synchronized &= r.replicas.synchronized;
      mine.params.emplace_back(rt.engine->param_count());
      rt.engine->store_params(mine.params.back());
    }
    if (comm.rank() != 0) return;
    const std::lock_guard<std::mutex> lock(mu);
    out = std::move(mine);
  });
  return out;
}

TEST(GpuBucketing, OverlappedBucketsGiveTheBitsOfOneAllReduce) {
  const std::string why = target_unavailable(cuda_local(3));
  if (!why.empty()) GTEST_SKIP() << why;
  // Wide enough that a layer's kernels run for a while after they are queued: a bucket's copy that did
  // not wait for its event would read a gradient the kernels had not yet written.
  TrainConfig c;
  c.model.dims = {256, 1024, 1024, 1024, 64};
  c.model.activation = Activation::tanh;
  c.batch = 384;
  c.steps = 3;
  c.seed = 11;
  c.optimizer.kind = OptimizerKind::adam;
  // 256*1024+1024 + 2*(1024*1024+1024) + 1024*64+64 = 2427968 elements: buckets that split the widest
  // weights, one that holds a layer and more, and one for the whole gradient.
  struct Variant {
    int accumulate;
    bool loss_scaling;
  };
  for (const Variant v : {Variant{1, false}, Variant{3, false}, Variant{1, true}}) {
    c.accumulate = v.accumulate;
    c.loss_scaling.kind = v.loss_scaling ? LossScaling::dynamic : LossScaling::none;
    c.bucket_mb = 0;
    const TrainingRun one = train(c, 3);
    ASSERT_TRUE(one.synchronized);
    for (const std::size_t elements : {std::size_t{100'000}, std::size_t{1'100'000}, std::size_t{2'427'968}}) {
      TrainConfig cb = c;
      cb.bucket_mb = static_cast<double>(elements) * sizeof(float) / (1024.0 * 1024.0);
      const TrainingRun bucketed = train(cb, 3);
      const std::string what = std::to_string(elements) + "-element buckets, accumulate " +
                               std::to_string(v.accumulate) + (v.loss_scaling ? ", loss scaling" : "");
      EXPECT_TRUE(bucketed.synchronized) << what;
      EXPECT_TRUE(bucketed.may_overlap) << what << ": no communication thread on the GPU";
      EXPECT_GT(bucketed.buckets, 0u) << what;
      EXPECT_EQ(bucketed.overlapped, bucketed.buckets) << what << ": buckets started after the backward pass";
      ASSERT_EQ(bucketed.params.size(), one.params.size());
      for (std::size_t s = 0; s < one.params.size(); ++s)
        for (std::size_t i = 0; i < one.params[s].size(); ++i)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(bucketed.params[s][i]), std::bit_cast<std::uint32_t>(one.params[s][i]))
              << what << ": step " << s << " element " << i;
    }
  }
}

}  // namespace
}  // namespace dpcheck
