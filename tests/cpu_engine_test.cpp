// The CPU engine (src/cpu_engine.cpp) against the float64 reference with the derived bound, on random
// shapes including 1-wide layers and odd sizes, with the gradient buffer poisoned before each run so an
// element the engine forgets to write cannot pass; and the host's MemoryService in the same file: XXH3-64
// by its published values, first_difference and the copies on bits rather than values.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "properties/scenario.hpp"
#include "reference/bound.hpp"
#include "src/engine.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

void poison(Engine& e) {
  std::fill_n(e.grads(), e.param_count(), std::numeric_limits<float>::quiet_NaN());
}

RC_GTEST_PROP(CpuEngine, GradientWithinDerivedBoundOfFloat64Reference, ()) {
  const auto [s, m, b, params] = draw_batch();
  auto engine = make_cpu_engine(m);
  engine->load_params(params);
  poison(*engine);
  const double loss = engine->forward_backward(b, 1.0f, false);
  std::vector<float> g(engine->param_count());
  engine->store_grads(g);
  const auto bound = reference::gradient_bound(m, params, b);
  const auto cmp = reference::compare(g, bound, reference::whole_batch_roundings(b.size));
  RC_LOG() << "error ratio " << cmp.max_ratio << " at " << ParamLayout(m).describe_element(cmp.worst) << "\n";
  RC_ASSERT(cmp.passed());
  // The loss is reported in double from float32 outputs: close to the reference's, not bitwise.
  RC_ASSERT(std::abs(loss - bound.reference.loss) <= 1e-4 * (1 + std::abs(bound.reference.loss)));
}

TEST(CpuEngine, ScaleByPowerOfTwoIsExact) {
  ModelConfig m{{7, 5, 3}, Activation::tanh, Loss::cross_entropy};
  auto e = make_cpu_engine(m);
  e->load_params(init_params(m, 2));
  const Batch b = first_examples(m, 13, 2);
  std::vector<float> g1(e->param_count()), g4(e->param_count());
  e->forward_backward(b, 1.0f, false);
  e->store_grads(g1);
  e->forward_backward(b, 4.0f, false);
  e->store_grads(g4);
  for (std::size_t i = 0; i < g1.size(); ++i) EXPECT_EQ(g4[i], 4.0f * g1[i]) << i;
}

TEST(CpuEngine, AccumulateAddsToTheBuffer) {
  ModelConfig m{{3, 4, 2}, Activation::relu, Loss::mse};
  auto e = make_cpu_engine(m);
  e->load_params(init_params(m, 4));
  const Batch b = first_examples(m, 10, 4);
  const Batch first = b.slice(0, 6), second = b.slice(6, 10);
  std::vector<float> ga(e->param_count()), gb(e->param_count()), gsum(e->param_count());
  e->forward_backward(first, 1.0f, false);
  e->store_grads(ga);
  e->forward_backward(second, 1.0f, false);
  e->store_grads(gb);
  e->forward_backward(first, 1.0f, false);
  e->forward_backward(second, 1.0f, true);
  e->store_grads(gsum);
  double moved = 0;
  for (std::size_t i = 0; i < ga.size(); ++i) {
    const double want = static_cast<double>(ga[i]) + static_cast<double>(gb[i]);
    // The engine adds inside its GEMM, so the sum may round differently from ga + gb: a few ulps.
    EXPECT_NEAR(gsum[i], want, 4 * 0x1p-24 * (std::abs(ga[i]) + std::abs(gb[i])) + 1e-30) << i;
    moved += std::abs(gb[i]);
  }
  EXPECT_GT(moved, 0.0);
}

TEST(CpuEngine, EmptyBatchZeroesTheGradient) {
  ModelConfig m{{3, 2}, Activation::identity, Loss::mse};
  auto e = make_cpu_engine(m);
  poison(*e);
  Batch empty;
  empty.in_dim = 3;
  empty.out_dim = 2;
  EXPECT_EQ(e->forward_backward(empty, 1.0f, false), 0.0);
  for (std::size_t i = 0; i < e->param_count(); ++i) EXPECT_EQ(e->grads()[i], 0.0f);
}

TEST(CpuEngine, HashSeesEveryBit) {
  std::vector<float> a(1000, 0.5f), b = a;
  EXPECT_EQ(hash_host(a.data(), a.size(), 7), hash_host(b.data(), b.size(), 7));
  EXPECT_NE(hash_host(a.data(), a.size(), 7), hash_host(a.data(), a.size(), 8));
  for (std::size_t i : {std::size_t{0}, std::size_t{500}, std::size_t{999}}) {
    b = a;
    b[i] = std::nextafter(b[i], 1.0f);
    EXPECT_NE(hash_host(a.data(), a.size(), 7), hash_host(b.data(), b.size(), 7)) << i;
  }
  b = a;
  b[3] = -0.0f;
  a[3] = 0.0f;
  EXPECT_NE(hash_host(a.data(), a.size(), 7), hash_host(b.data(), b.size(), 7));  // bits, not values
}

// ---- the host's MemoryService ------------------------------------------------------------------------

TEST(HostMemory, IsTheCpuEnginesAndHashesWithXxh3) {
  const MemoryService& memory = host_memory();
  EXPECT_EQ(memory.memory_space(), MemorySpace::host);
  EXPECT_EQ(memory.hash_name(), "xxh3");
  const auto e = make_cpu_engine(ModelConfig{{3, 4, 2}, Activation::relu, Loss::mse});
  EXPECT_EQ(&e->memory(), &memory);
  EXPECT_EQ(e->memory_space(), MemorySpace::host);
  // XXH3-64's published hash of no bytes with seed 0, and libxxhash's XXH3_64bits_withSeed of the
  // little-endian bytes of {1, -0, 2.5} with seed 7: the name printed is the function computed.
  const std::vector<float> three{1.0f, -0.0f, 2.5f};
  EXPECT_EQ(memory.hash(three.data(), 0, 0), 0x2d06800538d394c2ull);
  EXPECT_EQ(memory.hash(three.data(), three.size(), 7), 0x637f0cb39ddb2217ull);
  EXPECT_EQ(memory.hash(three.data(), three.size(), 7), hash_host(three.data(), three.size(), 7));
}

TEST(HostMemory, FirstDifferenceComparesBitsAndFindsTheFirst) {
  const MemoryService& memory = host_memory();
  const std::vector<float> a{0.0f, 1.0f, std::bit_cast<float>(0x7fc00001u), 3.0f, 4.0f};
  const std::size_t n = a.size();
  std::vector<float> b = a;
  EXPECT_EQ(memory.first_difference(a.data(), b.data(), n), n);
  EXPECT_EQ(memory.first_difference(a.data(), b.data(), 0), 0u);
  b[0] = -0.0f;  // equal values, different bits
  EXPECT_EQ(memory.first_difference(a.data(), b.data(), n), 0u);
  b = a;
  b[2] = std::bit_cast<float>(0x7fc00002u);  // another NaN payload
  b[4] = 5.0f;                                // a later difference does not hide it
  EXPECT_EQ(memory.first_difference(a.data(), b.data(), n), 2u);
  EXPECT_EQ(memory.first_difference(b.data(), a.data(), n), 2u);
  EXPECT_EQ(memory.first_difference(a.data(), b.data(), 2), 2u);  // only the first two compared
}

TEST(HostMemory, CopiesKeepEveryBit) {
  const MemoryService& memory = host_memory();
  const std::vector<float> in{-0.0f, std::numeric_limits<float>::denorm_min(), std::bit_cast<float>(0xffc01234u), 7.5f};
  std::vector<float> mid(in.size(), 1.0f), out(in.size(), 1.0f);
  memory.copy_from_host(in.data(), mid.data(), in.size());
  memory.copy_to_host(mid.data(), out.data(), in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(mid[i]), std::bit_cast<std::uint32_t>(in[i])) << i;
    EXPECT_EQ(std::bit_cast<std::uint32_t>(out[i]), std::bit_cast<std::uint32_t>(in[i])) << i;
  }
  std::vector<float> untouched(in.size(), 1.0f);
  memory.copy_to_host(in.data(), untouched.data(), 0);  // n = 0 copies nothing
  memory.copy_from_host(in.data(), untouched.data(), 0);
  EXPECT_EQ(untouched, std::vector<float>(in.size(), 1.0f));
}

}  // namespace
}  // namespace dpcheck
