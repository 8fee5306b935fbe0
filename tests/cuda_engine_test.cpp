// The "cuda" engine (kernels/cuda_engine.cpp) against the float64 reference with the derived bound
// (reference/bound.hpp), as tests/cpu_engine_test.cpp checks the CPU engine: random scenarios with
// 1-wide layers and odd sizes, the gradient buffer poisoned (NaN) before each run, pedantic float32 with
// u = 2^-24 and TF32 with u = 2^-11; then what the trainer and the replica check rely on: a power-of-two
// scale is exact, accumulation adds, an empty batch zeroes, repeated runs give the same bits; and its
// MemoryService: the hash sees every bit and is not the host's, buffers round-trip bit for bit both
// ways, and first_difference locates a planted change.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda_engine.hpp"
#include "kernels/device.hpp"
#include "properties/scenario.hpp"
#include "reference/bound.hpp"
#include "reference/hash.hpp"
#include "src/error.hpp"
#include "tests/gpu_test_support.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

// All bits set in every gradient element (a NaN), on the engine's stream, so that an element the
// engine does not write cannot pass.
void poison(Engine& e) {
  DPCHECK_CUDA_CHECK(
      cudaMemsetAsync(e.grads(), 0xff, e.param_count() * sizeof(float), static_cast<cudaStream_t>(e.stream())));
  e.synchronize();
}

std::vector<float> grads_of(const Engine& e) {
  std::vector<float> g(e.param_count());
  e.store_grads(g);
  return g;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- without a device -------------------------------------------------------------------------------

TEST(CudaEngine, WithoutADeviceMakingOneIsAUsageErrorWithTheRuntimesReason) {
  std::string why;
  if (cuda::device_available(&why)) GTEST_SKIP() << "a CUDA device is present";
  const ModelConfig m{{3, 2}, Activation::relu, Loss::mse};
  try {
    cuda::make_engine(m, EngineSpec{});
    FAIL() << "made an engine without a device";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device: " + why), std::string::npos) << e.what();
  }
}

// ---- against the float64 reference ------------------------------------------------------------------

// RapidCheck's GoogleTest glue (rc::detail::checkGTest) with at most `cases` cases, since GPU time is
// scarce (and ci/gpu.sh runs these under compute-sanitizer too). RC_PARAMS still sets the seed, can ask
// for fewer cases, and replays a failure with its reproduce=.
template <class Testable> void check_cases(int cases, Testable&& testable) {
  const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
  rc::detail::TestMetadata metadata;
  metadata.id = std::string(t->test_suite_name()) + "/" + t->name();
  metadata.description = t->name();
  rc::detail::TestParams params = rc::detail::configuration().testParams;
  params.maxSuccess = std::min(params.maxSuccess, cases);
  const rc::detail::TestResult result = rc::detail::checkTestable(std::forward<Testable>(testable), metadata, params);
  std::ostringstream message;
  rc::detail::printResultMessage(result, message);
  if (!result.template is<rc::detail::SuccessResult>()) FAIL() << message.str();
  std::cout << message.str() << std::endl;
}

void check_gradient(const EngineSpec& options, std::int64_t max_batch, int cases) {
  reference::BoundOptions bound_options;
  if (options.tf32) {  // as bound_options() in verdict/bounds.cpp gives for a TF32 target
    bound_options.unit_roundoff = 0x1p-11;
    bound_options.product_input_roundings = 4;
  }
  double worst = 0;
  check_cases(cases, [&] {
    const auto [s, m, b, params] = draw_batch(max_batch);
    const auto engine = cuda::make_engine(m, options);
    engine->load_params(params);
    poison(*engine);
    const double loss = engine->forward_backward(b, 1.0f, false);
    const std::vector<float> g = grads_of(*engine);
    const auto bound = reference::gradient_bound(m, params, b, bound_options);
    const auto cmp = reference::compare(g, bound, reference::whole_batch_roundings(b.size, bound_options));
    RC_CLASSIFY(b.size > cuda::kBiasGradChunk, "two-pass bias gradient");
    RC_CLASSIFY(bound.uncertain_units > 0, "a ReLU within rounding of its kink");
    RC_LOG() << s.describe() << ": error ratio " << cmp.max_ratio << " at "
             << ParamLayout(m).describe_element(cmp.worst) << " (got " << cmp.worst_value << ", reference "
             << cmp.worst_reference << ", bound " << cmp.worst_bound << ")\n";
    RC_ASSERT(cmp.passed());
    // The loss is reported in double from float32 outputs: close to the reference's, not bitwise (with
    // TF32 the outputs carry 2^-11-sized errors, so only its finiteness is asked for).
    RC_ASSERT(std::isfinite(loss));
    if (!options.tf32) RC_ASSERT(std::abs(loss - bound.reference.loss) <= 1e-4 * (1 + std::abs(bound.reference.loss)));
    worst = std::max(worst, cmp.max_ratio);
  });
  testing::Test::RecordProperty("max_error_ratio", std::to_string(worst));
}

TEST(CudaEngineGpu, GradientWithinDerivedBoundOfFloat64Reference) {
  DPCHECK_REQUIRE_GPU();
  check_gradient(EngineSpec{}, 512, 60);
}

// Batches past one chunk of the bias gradient (512 rows), where its second pass runs.
TEST(CudaEngineGpu, LargeBatchGradientWithinDerivedBound) {
  DPCHECK_REQUIRE_GPU();
  check_gradient(EngineSpec{}, 3000, 20);
}

TEST(CudaEngineGpu, Tf32GradientWithinTheTf32Bound) {
  DPCHECK_REQUIRE_GPU();
  EngineSpec options;
  options.tf32 = true;
  check_gradient(options, 512, 40);
}

// ---- what the trainer relies on ---------------------------------------------------------------------

TEST(CudaEngineGpu, ScaleByPowerOfTwoIsExact) {
  DPCHECK_REQUIRE_GPU();
  for (const Loss loss : {Loss::cross_entropy, Loss::mse}) {
    const ModelConfig m{{7, 5, 3}, Activation::tanh, loss};
    const auto e = cuda::make_engine(m, {});
    e->load_params(init_params(m, 2));
    const Batch b = first_examples(m, 13, 2);
    e->forward_backward(b, 1.0f, false);
    const std::vector<float> g1 = grads_of(*e);
    e->forward_backward(b, 4.0f, false);
    const std::vector<float> g4 = grads_of(*e);
    for (std::size_t i = 0; i < g1.size(); ++i) EXPECT_EQ(g4[i], 4.0f * g1[i]) << i;
  }
}

// Accumulating a second batch adds its gradient: the sum is within the two halves' derived bounds (one
// more rounding each, for the addition) of the sum of their references, and is not the second half's
// gradient alone.
TEST(CudaEngineGpu, AccumulateAddsToTheBuffer) {
  DPCHECK_REQUIRE_GPU();
  const ModelConfig m{{3, 4, 2}, Activation::relu, Loss::mse};
  const std::vector<float> params = init_params(m, 4);
  const auto e = cuda::make_engine(m, {});
  e->load_params(params);
  const Batch b = first_examples(m, 10, 4);
  const Batch first = b.slice(0, 6), second = b.slice(6, 10);
  poison(*e);
  e->forward_backward(first, 1.0f, false);
  e->forward_backward(second, 1.0f, true);
  const std::vector<float> sum = grads_of(*e);
  const auto ba = reference::gradient_bound(m, params, first), bb = reference::gradient_bound(m, params, second);
  const std::int64_t ma = reference::whole_batch_roundings(6) + 1, mb = reference::whole_batch_roundings(4) + 1;
  for (std::size_t i = 0; i < sum.size(); ++i) {
    const double want = ba.reference.grad[i] + bb.reference.grad[i];
    EXPECT_LE(std::abs(sum[i] - want), ba.bound(i, ma) + bb.bound(i, mb)) << ParamLayout(m).describe_element(i);
  }
  EXPECT_FALSE(reference::compare(sum, bb, mb).passed()) << "the second batch overwrote the first";
}

TEST(CudaEngineGpu, EmptyBatchZeroesTheGradientOrLeavesTheSum) {
  DPCHECK_REQUIRE_GPU();
  const ModelConfig m{{3, 2}, Activation::identity, Loss::mse};
  const auto e = cuda::make_engine(m, {});
  e->load_params(init_params(m, 1));
  Batch empty;
  empty.in_dim = 3;
  empty.out_dim = 2;
  poison(*e);
  EXPECT_EQ(e->forward_backward(empty, 1.0f, false), 0.0);
  for (float v : grads_of(*e)) EXPECT_EQ(v, 0.0f);
  // Accumulating nothing leaves what is there.
  e->forward_backward(first_examples(m, 5, 1), 1.0f, false);
  const std::vector<float> before = grads_of(*e);
  e->forward_backward(empty, 1.0f, true);
  EXPECT_TRUE(same_bits(before, grads_of(*e)));
}

// The same batch gives the same bits, run after run and engine after engine (each with its own stream
// and cuBLAS handle): replicas agree because of it.
TEST(CudaEngineGpu, SameBitsWhenRepeated) {
  DPCHECK_REQUIRE_GPU();
  for (const ModelConfig& m : {ModelConfig{{33, 65, 17}, Activation::relu, Loss::cross_entropy},
                               ModelConfig{{5, 129, 3}, Activation::tanh, Loss::mse}}) {
    const std::vector<float> params = init_params(m, 8);
    const Batch b = first_examples(m, 1500, 8);
    const auto e1 = cuda::make_engine(m, {}), e2 = cuda::make_engine(m, {});
    e1->load_params(params);
    e2->load_params(params);
    const double l1 = e1->forward_backward(b, 1.0f, false);
    const std::vector<float> g1 = grads_of(*e1);
    EXPECT_EQ(e1->forward_backward(b, 1.0f, false), l1);
    EXPECT_TRUE(same_bits(g1, grads_of(*e1)));
    EXPECT_EQ(e2->forward_backward(b, 1.0f, false), l1);
    EXPECT_TRUE(same_bits(g1, grads_of(*e2)));
  }
}

// ---- what the replica check relies on -------------------------------------------------------------

TEST(CudaEngineGpu, HashIsTheReplicaHashOfTheBytesAndSeesEveryBit) {
  DPCHECK_REQUIRE_GPU();
  const ModelConfig m{{17, 33, 5}, Activation::relu, Loss::mse};
  std::vector<float> params = init_params(m, 3);
  const auto a = cuda::make_engine(m, {}), b = cuda::make_engine(m, {});
  a->load_params(params);
  b->load_params(params);
  const std::size_t n = a->param_count();
  const std::uint64_t h = a->memory().hash(a->params(), n, 7);
  EXPECT_EQ(h, b->memory().hash(b->params(), n, 7));
  EXPECT_EQ(h, reference::replica_hash(params.data(), n * sizeof(float), 7));
  EXPECT_NE(h, a->memory().hash(a->params(), n, 8));
  EXPECT_NE(h, a->memory().hash(a->params(), n - 1, 7));
  for (std::size_t i : {std::size_t{0}, n / 2, n - 1}) {
    std::vector<float> changed = params;
    changed[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(changed[i]) ^ 1u);
    b->load_params(changed);
    EXPECT_NE(h, b->memory().hash(b->params(), n, 7)) << i;
  }
  std::vector<float> zeros(n, 0.0f), negative_zeros(n, 0.0f);
  negative_zeros[5] = -0.0f;
  a->load_params(zeros);
  b->load_params(negative_zeros);
  EXPECT_NE(a->memory().hash(a->params(), n, 7), b->memory().hash(b->params(), n, 7));  // bits, not values
}

TEST(CudaEngineGpu, ParametersAndGradientsRoundTripBitForBit) {
  DPCHECK_REQUIRE_GPU();
  const ModelConfig m{{9, 31, 4}, Activation::tanh, Loss::cross_entropy};
  std::vector<float> params = init_params(m, 6);
  params[3] = -0.0f;
  params[4] = std::numeric_limits<float>::denorm_min();
  params[5] = std::numeric_limits<float>::quiet_NaN();
  const auto e = cuda::make_engine(m, {});
  e->load_params(params);
  std::vector<float> back(e->param_count());
  e->store_params(back);
  EXPECT_TRUE(same_bits(params, back));
  std::vector<float> one(1);
  e->memory().copy_to_host(e->params() + 4, one.data(), 1);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(one[0]), std::bit_cast<std::uint32_t>(params[4]));
  // Gradients come back as the engine holds them: the same through store_grads and copy_to_host.
  params[5] = 0.5f;
  e->load_params(params);
  e->forward_backward(first_examples(m, 21, 6), 1.0f, false);
  const std::vector<float> g = grads_of(*e);
  std::vector<float> copy(g.size());
  e->memory().copy_to_host(e->grads(), copy.data(), copy.size());
  EXPECT_TRUE(same_bits(g, copy));
}

TEST(CudaEngineGpu, MemoryServiceIsTheDevicesAndNamesItsOwnHash) {
  DPCHECK_REQUIRE_GPU();
  const ModelConfig m{{5, 7, 3}, Activation::relu, Loss::mse};
  const std::vector<float> params = init_params(m, 4);
  const auto e = cuda::make_engine(m, {});
  e->load_params(params);
  const MemoryService& memory = e->memory();
  EXPECT_EQ(memory.memory_space(), MemorySpace::device);
  EXPECT_EQ(e->memory_space(), MemorySpace::device);
  // A message that prints a GPU hash must not call it XXH3: the two differ on the same bits.
  EXPECT_NE(memory.hash_name(), host_memory().hash_name());
  const std::size_t n = e->param_count();
  EXPECT_NE(memory.hash(e->params(), n, 7), host_memory().hash(params.data(), n, 7));
  // copy_from_host then copy_to_host gives back the same bits, -0, subnormals and NaN payloads included.
  std::vector<float> in(n);
  for (std::size_t i = 0; i < n; ++i) in[i] = std::bit_cast<float>(static_cast<std::uint32_t>(0x9e3779b9u * (i + 1)));
  in[0] = -0.0f;
  in[1] = std::numeric_limits<float>::denorm_min();
  in[2] = std::bit_cast<float>(0x7fc00123u);
  memory.copy_from_host(in.data(), e->grads(), n);
  std::vector<float> out(n, 1.0f);
  memory.copy_to_host(e->grads(), out.data(), n);
  EXPECT_TRUE(same_bits(in, out));
  memory.copy_from_host(nullptr, e->grads(), 0);  // an empty copy leaves the buffer as it was
  EXPECT_TRUE(same_bits(in, grads_of(*e)));
}

TEST(CudaEngineGpu, FirstDifferenceLocatesAPlantedChange) {
  DPCHECK_REQUIRE_GPU();
  const ModelConfig m{{64, 128, 10}, Activation::relu, Loss::cross_entropy};
  const std::vector<float> params = init_params(m, 9);
  const auto a = cuda::make_engine(m, {}), b = cuda::make_engine(m, {});
  a->load_params(params);
  b->load_params(params);
  const std::size_t n = a->param_count();
  EXPECT_EQ(a->memory().first_difference(a->params(), b->params(), n), n);
  for (std::size_t i : {std::size_t{0}, std::size_t{1000}, n - 1}) {
    std::vector<float> changed = params;
    changed[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(changed[i]) ^ 0x80000000u);
    // A later difference does not hide it.
    if (i != n - 1) changed[n - 1] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(changed[n - 1]) ^ 1u);
    b->load_params(changed);
    EXPECT_EQ(a->memory().first_difference(a->params(), b->params(), n), i);
    EXPECT_EQ(b->memory().first_difference(b->params(), a->params(), n), i);
  }
}

}  // namespace
}  // namespace dpcheck
