// Tests for src/train/replica_check: identical replicas pass with equal hashes; a single flipped bit in a
// parameter, a perturbed optimizer state element, or a differing step count is found and located
// (tensor, index, every rank's value and bits, the minority, the ULP distance) on every rank; and
// ulp_distance on the cases where the float bit patterns are not simply ordered.
#include "src/train/replica_check.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "src/comm/local_comm.hpp"
#include "src/train/model.hpp"

namespace dpcheck {
namespace {

ModelConfig model_3_4_2() {
  ModelConfig m;
  m.dims = {3, 4, 2};
  return m;
}

OptimizerConfig optimizer_of(OptimizerKind kind) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = 0.1f;
  return c;
}

std::string hex(float f) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", std::bit_cast<std::uint32_t>(f));
  return buf;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Every rank builds a CPU engine with the same parameters and a fresh optimizer, lets `prepare`
// change its own replica, and runs the check; the reports come back in rank order.
std::vector<ReplicaReport> check_world(int world, OptimizerKind kind,
                                       const std::function<void(int, Engine&, Optimizer&)>& prepare) {
  std::vector<ReplicaReport> reports(static_cast<std::size_t>(world));
  run_local(world, [&](Communicator& comm) {
    const ModelConfig m = model_3_4_2();
    const auto engine = make_cpu_engine(m);
    engine->load_params(init_params(m, 3));
    const auto optimizer = make_cpu_optimizer(optimizer_of(kind), engine->param_count());
    prepare(comm.rank(), *engine, *optimizer);
    reports[static_cast<std::size_t>(comm.rank())] = check_replicas(comm, *engine, *optimizer, 4);
  });
  return reports;
}

// The same deterministic gradient on every rank, then one optimizer step.
void step_with_fixed_gradient(Engine& engine, Optimizer& optimizer) {
  float* g = engine.grads();
  for (std::size_t i = 0; i < engine.param_count(); ++i) g[i] = 0.25f - 0.0625f * static_cast<float>(i % 9);
  optimizer.step(engine.params(), engine.grads());
}

void flip_last_bit(float& f) { f = std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) ^ 1u); }

// ---- identical replicas ---------------------------------------------------------------------------

TEST(ReplicaCheck, IdenticalReplicasAreSynchronizedWithEqualHashes) {
  for (OptimizerKind kind : {OptimizerKind::sgd, OptimizerKind::momentum, OptimizerKind::adam}) {
    SCOPED_TRACE(std::string(optimizer_name(kind)));
    const auto reports = check_world(3, kind, [](int, Engine& e, Optimizer& o) { step_with_fixed_gradient(e, o); });
    for (const ReplicaReport& r : reports) {
      EXPECT_TRUE(r.synchronized);
      EXPECT_EQ(r.step, 4);
      ASSERT_EQ(r.hashes.size(), 3u);
      EXPECT_EQ(r.hashes[1], r.hashes[0]);
      EXPECT_EQ(r.hashes[2], r.hashes[0]);
      EXPECT_EQ(r.hashes, reports[0].hashes);
      EXPECT_EQ(r.optimizer_steps, (std::vector<std::int64_t>{1, 1, 1}));
      EXPECT_TRUE(r.minority.empty());
      EXPECT_TRUE(contains(r.describe(), "identical")) << r.describe();
      EXPECT_TRUE(contains(r.describe(), "3 ranks")) << r.describe();
      EXPECT_EQ(r.hash_name, host_memory().hash_name());
      EXPECT_TRUE(contains(r.describe(), "xxh3 ")) << r.describe();
    }
  }
}

TEST(ReplicaCheck, DescriptionNamesTheHashTheEngineComputed) {
  // A device engine's hash is not XXH3, and the line must not say it is.
  ReplicaReport r;
  r.hashes = {0xabcu, 0xabcu};
  r.hash_name = "gpu-replica-hash";
  EXPECT_EQ(r.describe(), "replicas identical (2 ranks, gpu-replica-hash 0000000000000abc)");
}

TEST(ReplicaCheck, HashCoversParametersStateAndStepCount) {
  // Three single-rank checks of different replicas give three different hashes: the check cannot
  // pass on a hash that ignores part of the replica.
  const auto fresh = check_world(1, OptimizerKind::momentum, [](int, Engine&, Optimizer&) {});
  const auto stepped =
      check_world(1, OptimizerKind::momentum, [](int, Engine& e, Optimizer& o) { step_with_fixed_gradient(e, o); });
  const auto state_only = check_world(1, OptimizerKind::momentum, [](int, Engine& e, Optimizer& o) {
    step_with_fixed_gradient(e, o);
    o.state()[0] += 1.0f;
  });
  const auto steps_only = check_world(1, OptimizerKind::sgd, [](int, Engine& e, Optimizer& o) {
    std::vector<float> zero(e.param_count(), 0.0f);
    o.step(e.params(), zero.data());  // p + (-lr) * 0 == p: only the step count changes
  });
  const auto sgd_fresh = check_world(1, OptimizerKind::sgd, [](int, Engine&, Optimizer&) {});
  EXPECT_NE(fresh[0].hashes[0], stepped[0].hashes[0]);
  EXPECT_NE(stepped[0].hashes[0], state_only[0].hashes[0]);
  EXPECT_NE(steps_only[0].hashes[0], sgd_fresh[0].hashes[0]);
}

// ---- a flipped bit in the parameters --------------------------------------------------------------

TEST(ReplicaCheck, FlippedParameterBitIsLocatedOnEveryRank) {
  // Flat element 5 of the 3-4-2 model is layers.0.weight[1, 2] (row 1 of 4, column 2 of 3).
  float original = 0, flipped = 0;
  const auto reports = check_world(3, OptimizerKind::sgd, [&](int rank, Engine& e, Optimizer&) {
    if (rank != 2) return;
    original = e.params()[5];
    flip_last_bit(e.params()[5]);
    flipped = e.params()[5];
  });
  ASSERT_NE(original, flipped);
  for (std::size_t r = 0; r < reports.size(); ++r) {
    SCOPED_TRACE("report on rank " + std::to_string(r));
    const ReplicaReport& rep = reports[r];
    EXPECT_FALSE(rep.synchronized);
    EXPECT_EQ(rep.hashes[0], rep.hashes[1]);
    EXPECT_NE(rep.hashes[2], rep.hashes[0]);
    EXPECT_EQ(rep.buffer, "parameters");
    EXPECT_EQ(rep.element, "layers.0.weight[1, 2]");
    EXPECT_EQ(rep.flat_index, 5u);
    ASSERT_EQ(rep.values.size(), 3u);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(rep.values[0]), std::bit_cast<std::uint32_t>(original));
    EXPECT_EQ(std::bit_cast<std::uint32_t>(rep.values[1]), std::bit_cast<std::uint32_t>(original));
    EXPECT_EQ(std::bit_cast<std::uint32_t>(rep.values[2]), std::bit_cast<std::uint32_t>(flipped));
    EXPECT_EQ(rep.minority, std::vector<int>{2});
    EXPECT_EQ(rep.max_ulp, 1u);
    const std::string text = rep.describe();
    EXPECT_TRUE(contains(text, "layers.0.weight[1, 2]")) << text;
    EXPECT_TRUE(contains(text, hex(original))) << text;
    EXPECT_TRUE(contains(text, hex(flipped))) << text;
    EXPECT_TRUE(contains(text, "rank 2")) << text;
    EXPECT_TRUE(contains(text, "minority")) << text;
    EXPECT_TRUE(contains(text, "1 ulp")) << text;
    EXPECT_FALSE(contains(text, "identical")) << text;
  }
}

TEST(ReplicaCheck, FirstDifferenceIsReportedWhenSeveralElementsDiffer) {
  // Rank 0 in the minority this time, with differences in a bias and a later weight: the first flat
  // index wins, and the distance is measured from the majority value.
  const auto reports = check_world(3, OptimizerKind::sgd, [](int rank, Engine& e, Optimizer&) {
    if (rank != 0) return;
    e.params()[20] = std::nextafter(std::nextafter(std::nextafter(e.params()[20], 10.0f), 10.0f), 10.0f);
    e.params()[13] = std::nextafter(std::nextafter(e.params()[13], -10.0f), -10.0f);
  });
  for (const ReplicaReport& rep : reports) {
    EXPECT_FALSE(rep.synchronized);
    EXPECT_EQ(rep.element, "layers.0.bias[1]");
    EXPECT_EQ(rep.flat_index, 13u);
    EXPECT_EQ(rep.minority, std::vector<int>{0});
    EXPECT_EQ(rep.max_ulp, 2u);
  }
}

TEST(ReplicaCheck, TwoRankTieTakesTheLowestRanksValueAsTheMajority) {
  const auto reports = check_world(2, OptimizerKind::sgd, [](int rank, Engine& e, Optimizer&) {
    if (rank == 1) e.params()[25] = -e.params()[25];
  });
  for (const ReplicaReport& rep : reports) {
    EXPECT_EQ(rep.element, "layers.1.bias[1]");
    EXPECT_EQ(rep.minority, std::vector<int>{1});
    EXPECT_EQ(rep.max_ulp, ulp_distance(rep.values[0], rep.values[1]));
    EXPECT_GT(rep.max_ulp, 1000000u);
  }
}

// ---- optimizer state and step counts --------------------------------------------------------------

TEST(ReplicaCheck, DifferenceInMomentumBufferNamesTheStateBlock) {
  const std::size_t n = ParamLayout(model_3_4_2()).size();  // 26
  const auto reports = check_world(3, OptimizerKind::momentum, [](int rank, Engine& e, Optimizer& o) {
    step_with_fixed_gradient(e, o);
    if (rank == 1) flip_last_bit(o.state()[17]);
  });
  for (const ReplicaReport& rep : reports) {
    EXPECT_FALSE(rep.synchronized);
    EXPECT_EQ(rep.buffer, "optimizer state momentum_buffer");
    EXPECT_EQ(rep.element, "layers.1.weight[0, 1]");  // element 17 of the parameter layout
    EXPECT_EQ(rep.flat_index, n + 17);
    EXPECT_EQ(rep.minority, std::vector<int>{1});
    EXPECT_EQ(rep.max_ulp, 1u);
    EXPECT_TRUE(contains(rep.describe(), "optimizer state momentum_buffer")) << rep.describe();
  }
}

TEST(ReplicaCheck, DifferenceInAdamSecondMomentNamesExpAvgSq) {
  const std::size_t n = ParamLayout(model_3_4_2()).size();
  const auto reports = check_world(3, OptimizerKind::adam, [n](int rank, Engine& e, Optimizer& o) {
    step_with_fixed_gradient(e, o);
    if (rank == 0) o.state()[n + 3] *= 2.0f;  // exp_avg_sq block, element 3
  });
  for (const ReplicaReport& rep : reports) {
    EXPECT_EQ(rep.buffer, "optimizer state exp_avg_sq");
    EXPECT_EQ(rep.element, "layers.0.weight[1, 0]");
    EXPECT_EQ(rep.flat_index, 2 * n + 3);
    EXPECT_EQ(rep.minority, std::vector<int>{0});
  }
}

TEST(ReplicaCheck, DifferentStepCountsAloneAreNotSynchronized) {
  // SGD with a zero gradient leaves the parameters as they were; only rank 1's step count moves.
  const auto reports = check_world(3, OptimizerKind::sgd, [](int rank, Engine& e, Optimizer& o) {
    if (rank != 1) return;
    std::vector<float> zero(e.param_count(), 0.0f);
    o.step(e.params(), zero.data());
  });
  for (const ReplicaReport& rep : reports) {
    EXPECT_FALSE(rep.synchronized);
    EXPECT_EQ(rep.optimizer_steps, (std::vector<std::int64_t>{0, 1, 0}));
    EXPECT_EQ(rep.buffer, "optimizer step count");
    EXPECT_TRUE(contains(rep.describe(), "rank 1=1")) << rep.describe();
  }
}

// ---- ulp_distance ---------------------------------------------------------------------------------

TEST(UlpDistance, AdjacentSignedZeroAndSubnormalCases) {
  EXPECT_EQ(ulp_distance(1.0f, std::nextafter(1.0f, 2.0f)), 1u);
  EXPECT_EQ(ulp_distance(1.0f, std::nextafter(1.0f, 0.0f)), 1u);
  EXPECT_EQ(ulp_distance(1.0f, 1.0f), 0u);
  EXPECT_EQ(ulp_distance(+0.0f, -0.0f), 0u);
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(ulp_distance(-tiny, tiny), 2u);
  EXPECT_EQ(ulp_distance(0.0f, tiny), 1u);
  EXPECT_EQ(ulp_distance(-0.0f, tiny), 1u);
  EXPECT_EQ(ulp_distance(std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()), 1u);
  EXPECT_EQ(ulp_distance(2.0f, 4.0f), std::uint64_t{1} << 23);  // one binade: 2^23 floats
}

TEST(UlpDistance, OppositeSignsAreFarApartAndSymmetric) {
  // Between -1 and 1 lie the positive and the negative floats below 1 in magnitude, each counted
  // by 1.0f's bit pattern (0x3f800000).
  const std::uint64_t d = ulp_distance(-1.0f, 1.0f);
  EXPECT_EQ(d, 2u * 0x3f800000u);
  EXPECT_EQ(ulp_distance(1.0f, -1.0f), d);
  EXPECT_EQ(ulp_distance(-3.5f, 0.25f), ulp_distance(0.25f, -3.5f));
  EXPECT_EQ(ulp_distance(-3.5f, 0.25f), ulp_distance(-3.5f, 0.0f) + ulp_distance(0.0f, 0.25f));
}

// The double version, to its ends: the largest distance (2^64 - 2, from -max to +max) must not wrap.
TEST(UlpDistance, DoublesAcrossTheWholeRange) {
  EXPECT_EQ(ulp_distance(1.0, std::nextafter(1.0, 2.0)), 1u);
  EXPECT_EQ(ulp_distance(+0.0, -0.0), 0u);
  const double tiny = std::numeric_limits<double>::denorm_min(), max = std::numeric_limits<double>::max();
  EXPECT_EQ(ulp_distance(-tiny, tiny), 2u);
  EXPECT_EQ(ulp_distance(2.0, 4.0), std::uint64_t{1} << 52);
  EXPECT_EQ(ulp_distance(max, std::numeric_limits<double>::infinity()), 1u);
  EXPECT_EQ(ulp_distance(-max, max), 2 * (std::bit_cast<std::uint64_t>(max)));
  EXPECT_EQ(ulp_distance(max, -max), ulp_distance(-max, max));
  EXPECT_EQ(ulp_distance(-3.5, 0.25), ulp_distance(-3.5, 0.0) + ulp_distance(0.0, 0.25));
  // A float and its double agree on the ulp count only within float's own spacing: 1 float ulp at 1 is
  // 2^29 double ulps.
  EXPECT_EQ(ulp_distance(1.0, static_cast<double>(std::nextafter(1.0f, 2.0f))), std::uint64_t{1} << 29);
}

}  // namespace
}  // namespace dpcheck
