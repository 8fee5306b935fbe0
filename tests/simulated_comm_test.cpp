// Simulated ranks (src/comm/simulated_comm.hpp): one replica playing every rank in turn must give the
// local backend's bits -- each collective, and whole training runs -- while holding one call's partial
// result rather than N buffers.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "src/comm/local_comm.hpp"
#include "src/comm/simulated_comm.hpp"
#include "src/error.hpp"
#include "src/low_precision.hpp"
#include "src/target/target.hpp"
#include "src/train/data.hpp"

namespace dpcheck {
namespace {

// Every rank's buffer of `count` elements of dtype, as bytes: floats of mixed signs and magnitudes (so
// that the order of the additions shows in the bits), 16-bit patterns of such floats, or integers.
std::vector<std::vector<std::byte>> draw_buffers(int n, std::size_t count, DType dtype, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-12, 12);
  std::vector<std::vector<std::byte>> out(static_cast<std::size_t>(n),
                                          std::vector<std::byte>(count * dtype_size(dtype)));
  for (auto& buf : out)
    for (std::size_t i = 0; i < count; ++i) {
      const double v = std::ldexp(mantissa(rng), exponent(rng));
      switch (dtype) {
        case DType::f32: {
          const auto f = static_cast<float>(v);
          std::memcpy(&buf[i * 4], &f, 4);
          break;
        }
        case DType::f64: std::memcpy(&buf[i * 8], &v, 8); break;
        case DType::bf16: {
          const std::uint16_t h = float_to_bf16_bits(static_cast<float>(v));
          std::memcpy(&buf[i * 2], &h, 2);
          break;
        }
        case DType::f16: {
          const std::uint16_t h = float_to_fp16_bits(static_cast<float>(v / 4096));
          std::memcpy(&buf[i * 2], &h, 2);
          break;
        }
        case DType::i64: {
          const auto k = static_cast<std::int64_t>(rng()) >> 3;
          std::memcpy(&buf[i * 8], &k, 8);
          break;
        }
        default: ADD_FAILURE() << "no draw for this dtype";
      }
    }
  return out;
}

TEST(SimulatedComm, EveryAllreduceHasTheLocalBackendsBits) {
  struct Kind {
    DType dtype;
    ReduceOp op;
  };
  const Kind kinds[] = {{DType::f32, ReduceOp::sum},  {DType::f32, ReduceOp::avg},  {DType::f32, ReduceOp::min},
                        {DType::f32, ReduceOp::max},  {DType::f64, ReduceOp::sum},  {DType::f64, ReduceOp::avg},
                        {DType::bf16, ReduceOp::sum}, {DType::bf16, ReduceOp::avg}, {DType::f16, ReduceOp::avg},
                        {DType::f16, ReduceOp::max},  {DType::i64, ReduceOp::sum},  {DType::i64, ReduceOp::max}};
  for (const int n : {1, 2, 3, 5, 8})
    for (const Kind& k : kinds)
      for (const std::size_t count : {std::size_t{1}, std::size_t{7}, std::size_t{3000}}) {
        const std::vector<std::vector<std::byte>> inputs = draw_buffers(n, count, k.dtype, 1000u * n + count);
        std::vector<std::vector<std::byte>> local = inputs;
        run_local(n, [&](Communicator& comm) {
          comm.allreduce(local[static_cast<std::size_t>(comm.rank())].data(), count, k.dtype, k.op);
        });
        SimulatedComm sim(n);
        std::vector<std::byte> last;
        for (int r = 0; r < n; ++r) {
          sim.play(r);
          last = inputs[static_cast<std::size_t>(r)];
          sim.allreduce(last.data(), count, k.dtype, k.op);
          // An earlier rank keeps its own buffer: its pass goes on with what it had.
          if (r < n - 1) {
            EXPECT_EQ(last, inputs[static_cast<std::size_t>(r)]);
          }
        }
        sim.replicate();
        EXPECT_EQ(last, local[0]) << "N " << n << ", " << dtype_name(k.dtype) << " " << reduce_op_name(k.op)
                                  << ", count " << count;
      }
}

TEST(SimulatedComm, AfterThePassesTheReplicaStandsForEveryRank) {
  SimulatedComm sim(5);
  // A sum of five copies, added in rank order as five ranks would: 0.1f * 5 is not 0.1f + ... + 0.1f.
  std::vector<float> v{0.1f, 3.0f, -2.5f};
  const std::vector<float> copy = v;
  sim.allreduce(std::span<float>(v), ReduceOp::sum);
  for (std::size_t i = 0; i < v.size(); ++i) {
    float want = copy[i];
    for (int r = 1; r < 5; ++r) want = want + copy[i];
    EXPECT_EQ(std::bit_cast<std::uint32_t>(v[i]), std::bit_cast<std::uint32_t>(want)) << i;
  }
  std::int64_t verdict = 1;
  sim.allreduce(&verdict, 1, DType::i64, ReduceOp::min);
  EXPECT_EQ(verdict, 1);
  EXPECT_EQ(sim.allgather_value<std::int64_t>(42), std::vector<std::int64_t>(5, 42));
  EXPECT_EQ(sim.rank(), 0);
  EXPECT_EQ(sim.size(), 5);
}

TEST(SimulatedComm, RanksThatDisagreeOnTheirCallsAreNamed) {
  SimulatedComm sim(3);
  std::vector<float> a(4, 1.0f), b(5, 1.0f);
  sim.play(0);
  sim.allreduce(std::span<float>(a), ReduceOp::sum);
  sim.play(1);
  try {
    sim.allreduce(std::span<float>(b), ReduceOp::sum);
    ADD_FAILURE() << "a call of another count was taken";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1"), std::string::npos) << what;
    EXPECT_NE(what.find("count 4"), std::string::npos) << what;
  }
  // Rank 2 may not be played before rank 1 has made rank 0's calls, nor out of order.
  EXPECT_THROW(sim.play(2), Error);
  SimulatedComm again(3);
  again.play(0);
  EXPECT_THROW(again.play(2), Error);
  EXPECT_THROW(SimulatedComm(0), UsageError);
  EXPECT_THROW(SimulatedComm(SimulatedComm::max_world + 1), UsageError);
}

// Every rank's parameters after each step, for `config` trained on `world` ranks of backend `comm`.
std::vector<std::vector<float>> train_params(const std::string& comm, const TrainConfig& config, int world) {
  Target target;
  target.backend = find_backend(comm);
  const SyntheticDataset data(config.data_size(), config.model, config.seed);
  std::vector<std::vector<float>> out;
  run_world(target, world, [&](Communicator& c) {
    RankTrainer rt = make_rank_trainer(target, config, c, data);
    std::vector<std::vector<float>> mine;
    for (int s = 0; s < config.steps; ++s) {
      rt.trainer->step();
      std::vector<float> p(rt.engine->param_count());
      rt.engine->store_params(p);
      mine.push_back(std::move(p));
    }
    if (c.rank() == 0) out = std::move(mine);
  });
  return out;
}

TEST(SimulatedComm, TrainingOnSimulatedRanksGivesTheLocalBackendsBits) {
  struct Case {
    int world;
    std::int64_t batch, dataset;
    int accumulate;
    Policy policy;
    OptimizerKind optimizer;
    DType allreduce;
    double bucket_mb;
  };
  const Case cases[] = {{3, 10, 23, 1, Policy::uneven, OptimizerKind::adam, DType::f32, 0},
                        {8, 24, 0, 2, Policy::pad, OptimizerKind::momentum, DType::f32, 0},
                        {5, 7, 19, 1, Policy::drop_last, OptimizerKind::sgd, DType::bf16, 0},
                        {4, 16, 40, 3, Policy::uneven, OptimizerKind::adam, DType::f32, 0.0001}};
  for (const Case& k : cases) {
    TrainConfig c;
    c.model = ModelConfig{{5, 9, 3}, Activation::tanh, Loss::mse};
    c.batch = k.batch;
    c.dataset_size = k.dataset;
    c.steps = 5;
    c.accumulate = k.accumulate;
    c.policy = k.policy;
    c.optimizer.kind = k.optimizer;
    c.optimizer.lr = 0.05;
    c.allreduce_dtype = k.allreduce;
    c.bucket_mb = k.bucket_mb;
    c.seed = 11;
    const std::vector<std::vector<float>> local = train_params("local", c, k.world);
    const std::vector<std::vector<float>> simulated = train_params("simulated", c, k.world);
    ASSERT_EQ(local.size(), simulated.size());
    // Not vacuous: one rank more changes the bits, and training moves the parameters.
    const std::vector<std::vector<float>> other = train_params("local", c, k.world + 1);
    EXPECT_NE(other.back(), simulated.back()) << "world " << k.world;
    EXPECT_NE(simulated.front(), simulated.back()) << "world " << k.world;
    for (std::size_t s = 0; s < local.size(); ++s)
      EXPECT_EQ(0, std::memcmp(local[s].data(), simulated[s].data(), local[s].size() * sizeof(float)))
          << "world " << k.world << ", step " << s;
  }
}

TEST(SimulatedComm, AWorldOf4096RanksHoldsOneCallsPartialResult) {
  TrainConfig c;
  c.model = ModelConfig{{8, 16, 4}, Activation::relu, Loss::mse};
  c.batch = 4096;
  c.steps = 2;
  c.optimizer.kind = OptimizerKind::adam;
  c.optimizer.lr = 0.01;
  Target target;
  target.backend = find_backend("simulated");
  const SyntheticDataset data(c.data_size(), c.model, c.seed);
  std::size_t most = 0;
  std::int64_t global = 0;
  run_world(target, 4096, [&](Communicator& comm) {
    ASSERT_NE(comm.simulated(), nullptr);
    RankTrainer rt = make_rank_trainer(target, c, comm, data);
    for (int s = 0; s < c.steps; ++s) {
      const StepResult r = rt.trainer->step();
      global = r.global_batch;
      EXPECT_TRUE(r.replicas.synchronized);
      EXPECT_TRUE(std::isfinite(r.loss));
    }
    // The gradient's partial sum, and a few scalars: not 4096 gradients.
    most = comm.simulated()->peak_partial_bytes();
  });
  EXPECT_EQ(global, 4096);
  EXPECT_LE(most, 4 * ParamLayout(c.model).size() + 4096);
}

}  // namespace
}  // namespace dpcheck
