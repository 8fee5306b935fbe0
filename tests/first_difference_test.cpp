// The first element whose bits differ between two buffers, as the replica check uses it to locate a
// desync: the CPU engine's loop (src/cpu/cpu_engine.cpp), which is the reference, and the kernel
// (kernels/first_difference.cu) on the GPU. Bits, not values: +0 and -0 differ, a NaN equals itself
// only bit for bit, and identical buffers give n.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "src/rng.hpp"
#include "src/train/engine.hpp"

#if DPCHECK_HAVE_CUDA
#include "kernels/device.hpp"
#include "kernels/first_difference.hpp"
#include "tests/gpu_test_support.hpp"
#endif

namespace dpcheck {
namespace {

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  const std::uint64_t key = mix_key(seed, 0xf1d);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = random_symmetric(key, 0, i);
  return v;
}

// The planted-difference cases every implementation must get right, as (n, positions changed).
struct Plant {
  std::size_t n;
  std::vector<std::size_t> at;
};

std::vector<Plant> plants() {
  std::vector<Plant> p{{1, {0}},
                       {1, {}},
                       {3, {2}},
                       {3, {0, 2}},
                       {17, {16}},
                       {17, {5, 16}},
                       {1000, {0, 999}},
                       {1000, {999}},
                       {4099, {4098}},
                       {4099, {}},
                       {(1u << 20) + 3, {(1u << 20) + 2}},
                       {(1u << 20) + 3, {0}},
                       {(1u << 20) + 3, {777777, 900000}}};
  // Random positions, one to three of them.
  const std::uint64_t key = mix_key(9, 0x91a);
  for (std::uint64_t k = 0; k < 20; ++k) {
    const std::size_t n = 1 + random_below(key, 0, k, 300000);
    Plant q{n, {}};
    for (std::uint64_t j = 0; j <= k % 3; ++j) q.at.push_back(random_below(key, 1 + j, k, n));
    p.push_back(q);
  }
  return p;
}

std::size_t expected(const Plant& p) { return p.at.empty() ? p.n : *std::min_element(p.at.begin(), p.at.end()); }

// b = a with each planted element changed in its lowest mantissa bit: the smallest change there is.
std::vector<float> planted(const std::vector<float>& a, const Plant& p) {
  std::vector<float> b = a;
  for (std::size_t i : p.at) b[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(b[i]) ^ 1u);
  return b;
}

// ---- the CPU engine's loop: the reference ---------------------------------------------------------

TEST(FirstDifference, CpuEngineFindsTheSmallestPlantedIndex) {
  const auto engine = make_cpu_engine(ModelConfig{{2, 1}, Activation::identity, Loss::mse});
  for (const Plant& p : plants()) {
    const std::vector<float> a = random_floats(p.n, p.n), b = planted(a, p);
    EXPECT_EQ(engine->memory().first_difference(a.data(), b.data(), p.n), expected(p)) << p.n;
    EXPECT_EQ(engine->memory().first_difference(b.data(), a.data(), p.n), expected(p)) << p.n;  // symmetric
  }
  EXPECT_EQ(engine->memory().first_difference(nullptr, nullptr, 0), 0u);
}

TEST(FirstDifference, CpuEngineComparesBitsNotValues) {
  const auto engine = make_cpu_engine(ModelConfig{{2, 1}, Activation::identity, Loss::mse});
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float other_nan = std::bit_cast<float>(std::bit_cast<std::uint32_t>(nan) | 1u);
  const std::vector<float> a{1.0f, 0.0f, nan, 2.0f}, b{1.0f, -0.0f, nan, 2.0f}, c{1.0f, 0.0f, other_nan, 2.0f};
  EXPECT_EQ(engine->memory().first_difference(a.data(), b.data(), 4), 1u);  // +0 == -0 as values, not as bits
  EXPECT_EQ(engine->memory().first_difference(a.data(), a.data(), 4), 4u);  // NaN equals itself bit for bit
  EXPECT_EQ(engine->memory().first_difference(a.data(), c.data(), 4), 2u);  // another NaN payload differs
}

#if DPCHECK_HAVE_CUDA

// ---- the kernel on the GPU ------------------------------------------------------------------------

TEST(FirstDifferenceGpu, FindsTheSmallestPlantedIndex) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  for (const Plant& p : plants()) {
    const std::vector<float> a = random_floats(p.n, p.n), b = planted(a, p);
    const auto da = upload(a, s), db = upload(b, s);
    EXPECT_EQ(cuda::first_difference(da.get(), db.get(), p.n, s), expected(p)) << p.n;
    EXPECT_EQ(cuda::first_difference(db.get(), da.get(), p.n, s), expected(p)) << p.n;
    // A prefix that stops before the first difference is identical.
    const std::size_t first = expected(p);
    EXPECT_EQ(cuda::first_difference(da.get(), db.get(), first, s), first) << p.n;
  }
  EXPECT_EQ(cuda::first_difference(nullptr, nullptr, 0, s), 0u);
}

// Many differences everywhere: the minimum must not depend on which thread finds one first.
TEST(FirstDifferenceGpu, SmallestIndexAmongManyDifferences) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  const std::size_t n = (1u << 22) + 5;
  const std::vector<float> a = random_floats(n, 3);
  for (std::size_t first : {std::size_t{0}, std::size_t{1}, std::size_t{255}, std::size_t{256}, n / 2, n - 1}) {
    const auto flip_sign = [](float v) { return std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) ^ 0x80000000u); };
    std::vector<float> b = a;
    for (std::size_t i = first; i < n; i += 97) b[i] = flip_sign(a[i]);
    b[n - 1] = flip_sign(a[n - 1]);
    const auto da = upload(a, s), db = upload(b, s);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(cuda::first_difference(da.get(), db.get(), n, s), first);
  }
}

TEST(FirstDifferenceGpu, ComparesBitsNotValues) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float other_nan = std::bit_cast<float>(std::bit_cast<std::uint32_t>(nan) | 1u);
  const auto a = upload<float>({1.0f, 0.0f, nan, 2.0f}, s), b = upload<float>({1.0f, -0.0f, nan, 2.0f}, s);
  const auto c = upload<float>({1.0f, 0.0f, other_nan, 2.0f}, s);
  EXPECT_EQ(cuda::first_difference(a.get(), b.get(), 4, s), 1u);
  EXPECT_EQ(cuda::first_difference(a.get(), a.get(), 4, s), 4u);
  EXPECT_EQ(cuda::first_difference(a.get(), c.get(), 4, s), 2u);
}

#endif  // DPCHECK_HAVE_CUDA

}  // namespace
}  // namespace dpcheck
