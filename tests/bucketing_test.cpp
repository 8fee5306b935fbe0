// Tests for src/train/bucketing: the bucket plan (covering the gradient once, from its end, each bucket ready
// with its lowest layer), --bucket-mb's sizes, the reducer against one all-reduce (bitwise, threaded
// and not, float32 and bf16), an error on the communication thread reaching the rank's thread, the
// trainer starting buckets during the backward pass and giving one all-reduce's bits, and the staged
// path a GPU engine takes (marks, copies on the communication thread, its own stream), on the host.
#include "src/train/bucketing.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "src/comm/local_comm.hpp"
#include "src/error.hpp"
#include "src/train/engine.hpp"
#include "src/train/optimizer.hpp"
#include "src/train/trainer.hpp"

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
  for (std::size_t i = 0; i < n; ++i)
    g[i] = 0.1f * static_cast<float>(i % 13) + 1e-3f * static_cast<float>(rank + 1) / 3.0f;
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

// The staged path (a GPU's, src/train/engine.hpp) on the host: a staging whose streams are two tags, which
// checks that every bucket is marked before it is staged, staged on the communication thread before its
// all-reduce, with the communicator on the staging's stream for the step's buckets and back on the
// engine's afterwards, and unstaged once per bucket after all of them.
class RecordingStaging final : public BucketStaging {
 public:
  RecordingStaging(std::size_t elements, std::size_t buckets) : buffer_(elements), marked_(buckets) {}
  void* comm_stream() override { return &comm_tag; }
  void* engine_stream() override { return &engine_tag; }
  float* buffer() override { return buffer_.data(); }
  void mark(std::size_t k) override {
    const std::lock_guard<std::mutex> lock(mu_);
    marked_.at(k) = true;
  }
  void stage(std::size_t k, const float* grads, std::size_t lo, std::size_t hi) override {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      if (!marked_.at(k)) ADD_FAILURE() << "bucket " << k << " staged before it was marked";
      ++staged;
    }
    std::copy(grads + lo, grads + hi, buffer_.begin() + static_cast<std::ptrdiff_t>(lo));
  }
  void unstage(float* grads, std::size_t lo, std::size_t hi) override {
    std::copy(buffer_.begin() + static_cast<std::ptrdiff_t>(lo), buffer_.begin() + static_cast<std::ptrdiff_t>(hi),
              grads + lo);
    ++unstaged;
    const std::lock_guard<std::mutex> lock(mu_);
    std::fill(marked_.begin(), marked_.end(), false);  // the next step marks again
  }

  static inline int comm_tag = 0, engine_tag = 0;
  std::size_t staged = 0, unstaged = 0;

 private:
  std::mutex mu_;
  std::vector<float> buffer_;
  std::vector<bool> marked_;
};

// The cpu engine, with a staging of the kind above.
class StagingEngine final : public Engine {
 public:
  explicit StagingEngine(const ModelConfig& model) : inner_(make_cpu_engine(model)) {
    inner_->set_layer_ready_hook([this](int l) { layer_ready(l); });
  }
  std::string_view name() const override { return "staging"; }
  const MemoryService& memory() const override { return inner_->memory(); }
  const ModelConfig& model() const override { return inner_->model(); }
  std::size_t param_count() const override { return inner_->param_count(); }
  float* params() override { return inner_->params(); }
  float* grads() override { return inner_->grads(); }
  void load_params(std::span<const float> host) override { inner_->load_params(host); }
  void store_params(std::span<float> host) const override { inner_->store_params(host); }
  void store_grads(std::span<float> host) const override { inner_->store_grads(host); }
  double forward_backward(const Batch& batch, float scale, bool accumulate) override {
    return inner_->forward_backward(batch, scale, accumulate);
  }
  void zero_grads() override { inner_->zero_grads(); }
  std::unique_ptr<BucketStaging> make_bucket_staging(std::size_t buckets) override {
    auto s = std::make_unique<RecordingStaging>(param_count(), buckets);
    staging = s.get();
    return s;
  }
  RecordingStaging* staging = nullptr;

 private:
  std::unique_ptr<Engine> inner_;
};

// Which stream the communicator was told to use, and whether every data call came while it was the
// staging's.
class StreamRecorder final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void set_stream(void* stream) override { stream_ = stream; }
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if (stream_ != &RecordingStaging::comm_tag) off_stream = true;
    inner_.allreduce(buf, count, dtype, op);
  }
  void* stream() const { return stream_; }
  bool off_stream = false;

 private:
  void* stream_ = &RecordingStaging::engine_tag;
};

TEST(BucketedTrainer, StagedBucketsGiveTheSameBitsOnTheirOwnStream) {
  TrainConfig c;
  c.model = model_of({8, 32, 32, 4});
  c.batch = 12;
  c.steps = 3;
  c.seed = 9;
  std::vector<float> params[2];
  for (const double mb : {0.0, 200 * 4.0 / (1 << 20)}) {
    TrainConfig cb = c;
    cb.bucket_mb = mb;
    run_local(2, [&](Communicator& comm) {
      StreamRecorder recorder(comm);
      const SyntheticDataset data(cb.data_size(), cb.model, cb.seed);
      const DistributedSampler sampler(cb.sampler(comm.size()));
      StagingEngine engine(cb.model);
      engine.load_params(init_params(cb.model, cb.seed));
      auto optimizer = make_cpu_optimizer(cb.optimizer_for(comm.size()), engine.param_count());
      Trainer trainer(cb, mb > 0 ? static_cast<Communicator&>(recorder) : comm, engine, *optimizer, sampler, data);
      for (int s = 0; s < cb.steps; ++s) {
        const StepResult r = trainer.step();
        EXPECT_TRUE(r.replicas.synchronized);
        if (mb == 0) continue;
        EXPECT_TRUE(r.buckets_may_overlap);
        EXPECT_EQ(r.buckets_overlapped, r.buckets);
        EXPECT_EQ(recorder.stream(), &RecordingStaging::engine_tag) << "step " << s;
      }
      if (mb > 0) {
        ASSERT_NE(engine.staging, nullptr);
        // 8*32+32 + 32*32+32 + 32*4+4 = 1476 elements: 8 buckets a step.
        EXPECT_EQ(engine.staging->staged, 8u * 3u);
        EXPECT_EQ(engine.staging->unstaged, 8u * 3u);
        EXPECT_FALSE(recorder.off_stream) << "a bucket was all-reduced on the engine's stream";
      }
      if (comm.rank() == 0) {
        params[mb > 0 ? 1 : 0].resize(engine.param_count());
        engine.store_params(params[mb > 0 ? 1 : 0]);
      }
    });
  }
  ASSERT_EQ(params[0].size(), params[1].size());
  for (std::size_t i = 0; i < params[0].size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(params[1][i]), std::bit_cast<std::uint32_t>(params[0][i]))
        << "element " << i;
}

TEST(BucketedTrainer, RefusesABadSize) {
  TrainConfig c;
  c.model = model_of({2, 2});
  c.bucket_mb = -1;
  EXPECT_THROW(c.validate(1), UsageError);
}

}  // namespace
}  // namespace dpcheck
