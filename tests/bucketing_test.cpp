// Tests for src/bucketing: the bucket plan (covering the gradient once, from its end, each bucket ready
// with its lowest layer), --bucket-mb's sizes, the reducer against one all-reduce (bitwise, threaded
// and not, float32 and bf16), an error on the communication thread reaching the rank's thread, and the
// trainer starting buckets during the backward pass and giving one all-reduce's bits.
#include "src/bucketing.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "src/comm/local_comm.hpp"
#include "src/engine.hpp"
#include "src/error.hpp"
#include "src/optimizer.hpp"
#include "src/trainer.hpp"

namespace dpcheck {
namespace {

ModelConfig model_of(std::vector<int> dims) {
  ModelConfig m;
  m.dims = std::move(dims);
  return m;
}

TEST(PlanBuckets, CoversTheGradientOnceFromItsEnd) {
  const ParamLayout layout(model_of({3, 5, 4, 2}));  // 15 + 5, 20 + 4, 8 + 2: 54 elements
  ASSERT_EQ(layout.size(), 54u);
  for (std::size_t cap : {1, 2, 7, 10, 25, 53, 54, 55, 1000}) {
    const std::vector<GradientBucket> plan = plan_buckets(layout, cap);
    std::size_t hi = layout.size();
    for (const GradientBucket& b : plan) {
      EXPECT_EQ(b.hi, hi) << "cap " << cap;
      EXPECT_LT(b.lo, b.hi);
      EXPECT_LE(b.hi - b.lo, cap);
      EXPECT_EQ(b.ready_layer, layer_of(layout, b.lo));
      hi = b.lo;
    }
    EXPECT_EQ(hi, 0u) << "cap " << cap;
    EXPECT_EQ(plan.size(), (layout.size() + cap - 1) / cap);
  }
  // Ten elements from the end: the last layer's weight and bias exactly, ready with layer 2.
  const std::vector<GradientBucket> plan = plan_buckets(layout, 10);
  EXPECT_EQ(plan[0].lo, 44u);
  EXPECT_EQ(plan[0].ready_layer, 2);
  // [34, 44) holds layer 1's last weights and its bias: ready with layer 1.
  EXPECT_EQ(plan[1].ready_layer, 1);
  EXPECT_EQ(plan.back().ready_layer, 0);
}

TEST(PlanBuckets, LayerOfEveryElement) {
  const ParamLayout layout(model_of({3, 5, 2}));
  for (std::size_t i = 0; i < layout.size(); ++i) EXPECT_EQ(layer_of(layout, i), i < 20 ? 0 : 1) << i;
}

TEST(BucketElements, MiBOfFloat32) {
  EXPECT_EQ(bucket_elements(1), 262144u);
  EXPECT_EQ(bucket_elements(25), 25u * 262144u);
  EXPECT_EQ(bucket_elements(4.0 / (1 << 20)), 1u);
  EXPECT_EQ(bucket_elements(1e-9), 1u);  // at least one element
  EXPECT_THROW(bucket_elements(-1), UsageError);
  EXPECT_THROW(bucket_elements(std::nan("")), UsageError);
  EXPECT_THROW(bucket_elements(1e300), UsageError);
}

// Each rank's gradient: values that differ between ranks in their last bits.
std::vector<float> rank_gradient(int rank, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.1f * static_cast<float>(i % 13) + 1e-3f * static_cast<float>(rank + 1) / 3.0f;
  return g;
}

TEST(BucketReducer, GivesTheBitsOfOneAllReduce) {
  const ParamLayout layout(model_of({6, 9, 4}));
  const std::size_t n = layout.size();
  for (const DType dtype : {DType::f32, DType::bf16})
    for (const bool threaded : {false, true})
      for (std::size_t cap : {1, 5, 13, 1000}) {
        std::vector<std::vector<float>> one(3), bucketed(3);
        run_local(3, [&](Communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          std::vector<float> g = rank_gradient(comm.rank(), n);
          if (dtype == DType::f32) {
            comm.allreduce(g.data(), n, DType::f32, ReduceOp::avg);
          } else {
            std::vector<std::uint16_t> low(n);
            for (std::size_t i = 0; i < n; ++i) low[i] = float_to_bf16_bits(g[i]);
            comm.allreduce(low.data(), n, DType::bf16, ReduceOp::avg);
            for (std::size_t i = 0; i < n; ++i) g[i] = bf16_bits_to_float(low[i]);
          }
          one[r] = g;
          std::vector<float> h = rank_gradient(comm.rank(), n);
          BucketReducer reducer(comm, plan_buckets(layout, cap), dtype, threaded);
          for (int step = 0; step < 2; ++step) {  // a second step reuses the buffers
            h = rank_gradient(comm.rank(), n);
            reducer.begin(h.data());
            if (!reducer.buckets().empty()) reducer.launch(0);
            reducer.finish();
          }
          bucketed[r] = h;
        });
        for (std::size_t r = 0; r < 3; ++r)
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(std::bit_cast<std::uint32_t>(bucketed[r][i]), std::bit_cast<std::uint32_t>(one[r][i]))
                << "rank " << r << " element " << i << " cap " << cap << (threaded ? " threaded" : "");
      }
}

TEST(BucketReducer, LaunchesInOrderOnly) {
  const ParamLayout layout(model_of({2, 2}));
  run_local(1, [&](Communicator& comm) {
    BucketReducer reducer(comm, plan_buckets(layout, 2), DType::f32, false);
    std::vector<float> g(layout.size());
    reducer.begin(g.data());
    EXPECT_THROW(reducer.launch(1), Error);
  });
}

// A communicator whose third data call fails, as a dead peer makes one fail.
class FailingThird final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if (++calls_ == 3) throw Error("the peer is gone");
    inner_.allreduce(buf, count, dtype, op);
  }

 private:
  int calls_ = 0;
};

TEST(BucketReducer, AnErrorOnTheCommunicationThreadReachesTheRank) {
  const ParamLayout layout(model_of({4, 4}));
  run_local(1, [&](Communicator& comm) {
    FailingThird failing(comm);
    BucketReducer reducer(failing, plan_buckets(layout, 4), DType::f32, true);
    std::vector<float> g(layout.size(), 1.0f);
    reducer.begin(g.data());
    try {
      reducer.finish();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the peer is gone"), std::string::npos);
    }
    // The step ended with its error; the next begins cleanly.
    reducer.begin(g.data());
    reducer.finish();
    // A step left before finish() (an exception in the backward pass) leaves no step to follow it.
    reducer.begin(g.data());
    reducer.launch(0);
    EXPECT_THROW(reducer.begin(g.data()), Error);
  });
}

// Two trainings of the same configuration, with and without buckets: every step's parameters the
// same bits, and with buckets on a multi-layer model some of them started during the backward pass.
TEST(BucketedTrainer, OneAllReducesBitsAndStartsDuringTheBackwardPass) {
  TrainConfig c;
  c.model = model_of({8, 32, 32, 32, 4});
  c.model.activation = Activation::tanh;
  c.batch = 24;
  c.steps = 3;
  c.seed = 5;
  c.optimizer.kind = OptimizerKind::adam;
  for (const int accumulate : {1, 3}) {
    c.accumulate = accumulate;
    std::vector<std::vector<float>> params[2];
    std::size_t overlapped = 0, buckets = 0;
    std::mutex mu;
    for (const double mb : {0.0, 300 * 4.0 / (1 << 20)}) {  // 300 elements a bucket: splits every weight
      TrainConfig cb = c;
      cb.bucket_mb = mb;
      run_local(3, [&](Communicator& comm) {
        const SyntheticDataset data(cb.data_size(), cb.model, cb.seed);
        const DistributedSampler sampler(cb.sampler(comm.size()));
        auto engine = make_cpu_engine(cb.model);
        engine->load_params(init_params(cb.model, cb.seed));
        auto optimizer = make_cpu_optimizer(cb.optimizer_for(comm.size()), engine->param_count());
        Trainer trainer(cb, comm, *engine, *optimizer, sampler, data);
        std::vector<std::vector<float>> mine;
        for (int s = 0; s < cb.steps; ++s) {
          const StepResult r = trainer.step();
          EXPECT_TRUE(r.replicas.synchronized);
          mine.emplace_back(engine->param_count());
          engine->store_params(mine.back());
          if (comm.rank() == 0 && mb > 0) {
            const std::lock_guard<std::mutex> lock(mu);
            overlapped += r.buckets_overlapped;
            buckets += r.buckets;
          }
        }
        if (comm.rank() == 0) params[mb > 0 ? 1 : 0] = std::move(mine);
      });
    }
    ASSERT_EQ(params[0].size(), params[1].size());
    for (std::size_t s = 0; s < params[0].size(); ++s)
      for (std::size_t i = 0; i < params[0][s].size(); ++i)
        ASSERT_EQ(std::bit_cast<std::uint32_t>(params[1][s][i]), std::bit_cast<std::uint32_t>(params[0][s][i]))
            << "step " << s << " element " << i << " accumulate " << accumulate;
    // 8*32+32 + 2*(32*32+32) + 32*4+4 = 2532 elements: 9 buckets a step, every one started by the
    // engine's hook before the backward pass returned.
    EXPECT_EQ(buckets, 9u * 3u);
    EXPECT_EQ(overlapped, 9u * 3u);
  }
}

TEST(BucketedTrainer, RefusesABadSize) {
  TrainConfig c;
  c.model = model_of({2, 2});
  c.bucket_mb = -1;
  EXPECT_THROW(c.validate(1), UsageError);
}

}  // namespace
}  // namespace dpcheck
