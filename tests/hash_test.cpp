// The replica hash: its host restatement (reference/hash.cpp) checked on the CPU for the properties the
// replica check relies on (deterministic, seed-sensitive, sensitive to every bit, the tail bytes and the
// length), and the kernel (kernels/hash.cu) checked on the GPU to give exactly the host's value, on sizes
// from empty to beyond four words a lane, with and without a partial last word.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "kernels/hash_math.hpp"
#include "reference/hash.hpp"
#include "src/error.hpp"
#include "src/rng.hpp"

#if DPCHECK_HAVE_CUDA
#include "kernels/device.hpp"
#include "kernels/hash.hpp"
#include "tests/gpu_test_support.hpp"
#endif

namespace dpcheck {
namespace {

std::vector<unsigned char> random_bytes(std::size_t n, std::uint64_t seed) {
  const std::uint64_t key = mix_key(seed, 0x4a54);
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(random_u64(key, 0, i / 8) >> (8 * (i % 8)));
  return v;
}

std::uint64_t host_hash(const std::vector<unsigned char>& v, std::uint64_t seed) {
  return reference::replica_hash(v.data(), v.size(), seed);
}

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kLaneBytes = 16 * hash::kLanes;  // one 16-byte word for every lane: 4 MiB

// ---- the host restatement ----------------------------------------------------------------------------

TEST(ReplicaHash, DeterministicAndAFunctionOfTheBytesOnly) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{4096}}) {
    const std::vector<unsigned char> a = random_bytes(n, 1);
    const std::vector<unsigned char> b = a;  // another address, the same bytes
    EXPECT_EQ(host_hash(a, 7), host_hash(a, 7)) << n;
    EXPECT_EQ(host_hash(a, 7), host_hash(b, 7)) << n;
  }
  EXPECT_EQ(reference::replica_hash(nullptr, 0, 3), reference::replica_hash(nullptr, 0, 3));
}

TEST(ReplicaHash, SeedSensitive) {
  for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{64}}) {
    const std::vector<unsigned char> a = random_bytes(n, 2);
    std::set<std::uint64_t> seen;
    for (std::uint64_t seed = 0; seed < 16; ++seed) seen.insert(host_hash(a, seed));
    seen.insert(host_hash(a, ~std::uint64_t{0}));
    EXPECT_EQ(seen.size(), 17u) << n;
  }
}

TEST(ReplicaHash, EverySingleBitFlipChangesIt) {
  // 40 bytes: two whole words and a tail of 8; every one of the 320 flips gives its own hash.
  std::vector<unsigned char> a = random_bytes(40, 3);
  const std::uint64_t base = host_hash(a, 11);
  std::set<std::uint64_t> seen{base};
  for (std::size_t bit = 0; bit < 8 * a.size(); ++bit) {
    a[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    seen.insert(host_hash(a, 11));
    a[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
  }
  EXPECT_EQ(seen.size(), 1 + 8 * a.size());
  EXPECT_EQ(host_hash(a, 11), base);
}

TEST(ReplicaHash, FlipsInLargeBuffersChangeIt) {
  // Past one word a lane, lanes absorb a second word: flips there, at the first and last whole word and
  // in the tail must all show.
  const std::size_t n = kLaneBytes + 16 * 3 + 5;
  std::vector<unsigned char> a = random_bytes(n, 4);
  const std::uint64_t base = host_hash(a, 0);
  for (std::size_t byte : {std::size_t{0}, std::size_t{15}, std::size_t{16}, kLaneBytes - 1, kLaneBytes, kLaneBytes + 17,
                           n - 6, n - 5, n - 1}) {
    a[byte] ^= 0x80;
    EXPECT_NE(host_hash(a, 0), base) << "byte " << byte;
    a[byte] ^= 0x80;
  }
}

TEST(ReplicaHash, TailBytesAndLengthMatter) {
  for (std::size_t whole : {std::size_t{0}, std::size_t{1}, std::size_t{255}}) {
    for (std::size_t tail = 1; tail < 16; ++tail) {
      std::vector<unsigned char> a = random_bytes(16 * whole + tail, 5);
      const std::uint64_t base = host_hash(a, 1);
      a.back() ^= 1;
      EXPECT_NE(host_hash(a, 1), base) << whole << " words + " << tail;
      a.back() ^= 1;
      // One more zero byte, or one fewer: another length, another hash.
      std::vector<unsigned char> longer = a;
      longer.push_back(0);
      EXPECT_NE(host_hash(longer, 1), base) << whole << " words + " << tail;
      std::vector<unsigned char> shorter(a.begin(), a.end() - 1);
      EXPECT_NE(host_hash(shorter, 1), base) << whole << " words + " << tail;
    }
  }
  // All-zero buffers of different lengths differ too (the length goes into the finish).
  EXPECT_NE(host_hash(std::vector<unsigned char>(15), 0), host_hash(std::vector<unsigned char>(16), 0));
  EXPECT_NE(host_hash(std::vector<unsigned char>(16), 0), host_hash(std::vector<unsigned char>(32), 0));
  EXPECT_NE(host_hash(std::vector<unsigned char>(0), 0), host_hash(std::vector<unsigned char>(1), 0));
}

#if DPCHECK_HAVE_CUDA

// ---- the kernel on the GPU ----------------------------------------------------------------------------

// Exactly the input's size, unlike upload() (tests/gpu_test_support.hpp), which gives an empty input one
// element: here an empty input stays unallocated (a null pointer), as the hasher must accept.
cuda::DeviceBuffer<unsigned char> upload_exact(const std::vector<unsigned char>& host, cudaStream_t s) {
  cuda::DeviceBuffer<unsigned char> d(host.size());
  if (!host.empty())
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(d.get(), host.data(), host.size(), cudaMemcpyHostToDevice, s));
  DPCHECK_CUDA_CHECK(cudaStreamSynchronize(s));
  return d;
}

void set_byte(const cuda::DeviceBuffer<unsigned char>& d, std::size_t at, const unsigned char& value, cudaStream_t s) {
  DPCHECK_CUDA_CHECK(cudaMemcpyAsync(d.get() + at, &value, 1, cudaMemcpyHostToDevice, s));
  DPCHECK_CUDA_CHECK(cudaStreamSynchronize(s));
}

// Empty, shorter than a word, a word, a word and a byte, a page less one, 1 MiB, 1 MiB with a ragged
// tail, two words for some lanes, and more than four words a lane (the kernel's four-loads loop, then
// its remainder).
const std::vector<std::size_t> kSizes{0,   1,   15, 16, 17, 4095, kMiB, kMiB + 13, kLaneBytes + 16 * 3 + 5,
                                      4 * kLaneBytes + 16 * 100 + 9};

TEST(HashGpu, EqualsTheHostRestatementOnEverySize) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  cuda::DeviceHasher hasher;
  for (std::size_t n : kSizes) {
    const std::vector<unsigned char> a = random_bytes(n, 6 + n);
    const auto d = upload_exact(a, stream.get());
    for (std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{12345}}) {
      const std::uint64_t gpu = hasher.hash(d.get(), n, seed, stream.get());
      EXPECT_EQ(gpu, host_hash(a, seed)) << n << " bytes, seed " << seed;
      EXPECT_EQ(hasher.hash(d.get(), n, seed, stream.get()), gpu) << n << " bytes: not the same twice";
    }
  }
}

TEST(HashGpu, AnySingleFlippedBitChangesIt) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  cuda::DeviceHasher hasher;
  const cudaStream_t s = stream.get();
  for (std::size_t n : {std::size_t{17}, kMiB + 13, 4 * kLaneBytes + 16 * 100 + 9}) {
    std::vector<unsigned char> a = random_bytes(n, 7);
    const auto d = upload_exact(a, s);
    const std::uint64_t base = hasher.hash(d.get(), n, 3, s);
    std::vector<std::size_t> bits{0, 7, 8 * 15 + 7, 8 * 16, 8 * n - 1, 8 * (n - n % 16) - 1};
    const std::uint64_t key = mix_key(n, 0xf11b);
    for (std::uint64_t k = 0; k < 24; ++k) bits.push_back(random_below(key, 0, k, 8 * n));
    std::set<std::uint64_t> seen{base};
    for (std::size_t bit : bits) {
      const std::size_t at = bit / 8;
      const auto flipped = static_cast<unsigned char>(a[at] ^ (1u << (bit % 8)));
      set_byte(d, at, flipped, s);
      const std::uint64_t h = hasher.hash(d.get(), n, 3, s);
      EXPECT_NE(h, base) << n << " bytes, bit " << bit;
      if (n <= kMiB + 13) {  // the host restatement agrees on the flipped buffer too
        a[at] = flipped;
        EXPECT_EQ(h, host_hash(a, 3)) << n << " bytes, bit " << bit;
        a[at] = static_cast<unsigned char>(flipped ^ (1u << (bit % 8)));
      }
      seen.insert(h);
      set_byte(d, at, a[at], s);
    }
    EXPECT_EQ(hasher.hash(d.get(), n, 3, s), base) << n << " bytes: restored";
    // Each distinct bit gave its own hash (repeats among the random bits aside).
    const std::set<std::size_t> distinct_bits(bits.begin(), bits.end());
    EXPECT_EQ(seen.size(), 1 + distinct_bits.size()) << n;
  }
}

// 16-byte loads need a 16-byte aligned start; a buffer that is not is a bug in the caller, reported
// rather than read wrongly.
TEST(HashGpu, MisalignedStartIsRefused) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  cuda::DeviceHasher hasher;
  const auto d = upload_exact(random_bytes(64, 8), stream.get());
  EXPECT_THROW(hasher.hash(d.get() + 4, 32, 0, stream.get()), Error);
  EXPECT_NO_THROW(hasher.hash(d.get() + 16, 33, 0, stream.get()));
  EXPECT_NO_THROW(hasher.hash(d.get() + 4, 0, 0, stream.get()));
}

#endif  // DPCHECK_HAVE_CUDA

}  // namespace
}  // namespace dpcheck
