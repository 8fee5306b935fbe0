// The replica hash: the XXH64 parts of its host restatement (reference/hash.cpp) and of the kernel's
// arithmetic (kernels/hash_math.hpp), each checked against libxxhash's XXH64; the host restatement
// checked on the CPU for the properties the replica check relies on (deterministic, seed-sensitive,
// sensitive to every bit, the tail bytes and the length); and the kernel (kernels/hash.cu) checked on the
// GPU to give exactly the host's value, on sizes from empty to beyond four words a lane, with and without
// a partial last word. The kernel and its reference share no code: this test is where they meet.
#include <gtest/gtest.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <array>
#include <bit>
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

[[maybe_unused]] constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kLaneBytes = 16 * reference::replica_hash_lanes;  // one 16-byte word for every lane: 4 MiB

// ---- the XXH64 parts, against libxxhash ----------------------------------------------------------------

// One side's XXH64 primes, round and avalanche.
struct Xxh64Parts {
  const char* side;
  std::array<std::uint64_t, 5> prime;  // P1..P5
  std::uint64_t (*round)(std::uint64_t acc, std::uint64_t input);
  std::uint64_t (*avalanche)(std::uint64_t h);
};

const Xxh64Parts kReferenceParts{"reference",
                                 {reference::xxh64::prime_1, reference::xxh64::prime_2, reference::xxh64::prime_3,
                                  reference::xxh64::prime_4, reference::xxh64::prime_5},
                                 reference::xxh64::round,
                                 reference::xxh64::avalanche};
const Xxh64Parts kKernelParts{"kernel",
                              {hash::kPrime1, hash::kPrime2, hash::kPrime3, hash::kPrime4, hash::kPrime5},
                              hash::xxh_round,
                              hash::avalanche};

std::uint64_t little_endian(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int k = bytes - 1; k >= 0; --k) v = (v << 8) | p[k];
  return v;
}

// XXH64 as the xxHash specification gives it, from one side's parts: every prime, the round (with and
// without a zero accumulator) and the avalanche take part, so XXH64's value is reached only if all of
// them are XXH64's.
std::uint64_t xxh64_from(const Xxh64Parts& x, const unsigned char* p, std::size_t n, std::uint64_t seed) {
  const auto [p1, p2, p3, p4, p5] = x.prime;
  std::size_t i = 0;
  std::uint64_t h = seed + p5;
  if (n >= 32) {
    std::uint64_t v[4] = {seed + p1 + p2, seed + p2, seed, seed - p1};
    for (; i + 32 <= n; i += 32)
      for (int k = 0; k < 4; ++k) v[k] = x.round(v[k], little_endian(p + i + 8 * k, 8));
    h = std::rotl(v[0], 1) + std::rotl(v[1], 7) + std::rotl(v[2], 12) + std::rotl(v[3], 18);
    for (std::uint64_t lane : v) h = (h ^ x.round(0, lane)) * p1 + p4;
  }
  h += n;
  for (; i + 8 <= n; i += 8) h = std::rotl(h ^ x.round(0, little_endian(p + i, 8)), 27) * p1 + p4;
  if (i + 4 <= n) {
    h = std::rotl(h ^ little_endian(p + i, 4) * p1, 23) * p2 + p3;
    i += 4;
  }
  for (; i < n; ++i) h = std::rotl(h ^ p[i] * p5, 11) * p1;
  return x.avalanche(h);
}

TEST(ReplicaHashXxh64, BothSidesPrimesRoundAndAvalancheAreXxh64s) {
  // Lengths 0 to 100 reach every branch (stripes of 32, 8-byte words, a 4-byte word, single bytes).
  for (const Xxh64Parts& x : {kReferenceParts, kKernelParts}) {
    for (std::size_t n = 0; n <= 100; ++n) {
      const std::vector<unsigned char> a = random_bytes(n, 100 + n);
      for (std::uint64_t seed :
           {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{0x9E3779B97F4A7C15}, ~std::uint64_t{0}})
        ASSERT_EQ(xxh64_from(x, a.data(), n, seed), XXH64(a.data(), n, seed))
            << x.side << ": " << n << " bytes, seed " << seed;
    }
  }
}

// The comparison above can fail: a wrong prime, a wrong rotation in the round or a wrong constant in the
// avalanche each give another value than XXH64's.
TEST(ReplicaHashXxh64, TheAnchorSeesAWrongPart) {
  const std::vector<unsigned char> a = random_bytes(45, 9);  // a stripe, an 8-byte word, a 4-byte word, a byte
  const auto differs = [&](const Xxh64Parts& x) {
    return xxh64_from(x, a.data(), a.size(), 3) != XXH64(a.data(), a.size(), 3);
  };
  ASSERT_FALSE(differs(kReferenceParts));
  for (std::size_t k = 0; k < 5; ++k) {
    Xxh64Parts wrong = kReferenceParts;
    wrong.prime[k] ^= std::uint64_t{1} << 40;
    EXPECT_TRUE(differs(wrong)) << "P" << k + 1;
  }
  Xxh64Parts wrong_round = kReferenceParts;
  wrong_round.round = [](std::uint64_t acc, std::uint64_t input) {
    return std::rotl(acc + input * reference::xxh64::prime_2, 30) * reference::xxh64::prime_1;
  };
  EXPECT_TRUE(differs(wrong_round));
  Xxh64Parts wrong_avalanche = kReferenceParts;
  wrong_avalanche.avalanche = [](std::uint64_t h) {
    h = (h ^ (h >> 33)) * reference::xxh64::prime_2;
    h = (h ^ (h >> 29)) * reference::xxh64::prime_2;  // P3 in XXH64
    return h ^ (h >> 32);
  };
  EXPECT_TRUE(differs(wrong_avalanche));
}

// ---- the host restatement ----------------------------------------------------------------------------

// The kernel's fixed layout is the one the reference restates (a difference shows here without a GPU).
TEST(ReplicaHash, KernelLayoutIsTheReferences) {
  EXPECT_EQ(static_cast<std::uint64_t>(hash::kBlocks), reference::replica_hash_groups);
  EXPECT_EQ(static_cast<std::uint64_t>(hash::kThreads), reference::replica_hash_lanes_per_group);
}

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
  for (std::size_t byte : {std::size_t{0}, std::size_t{15}, std::size_t{16}, kLaneBytes - 1, kLaneBytes,
                           kLaneBytes + 17, n - 6, n - 5, n - 1}) {
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
  if (!host.empty()) DPCHECK_CUDA_CHECK(cudaMemcpyAsync(d.get(), host.data(), host.size(), cudaMemcpyHostToDevice, s));
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
const std::vector<std::size_t> kSizes{
    0, 1, 15, 16, 17, 4095, kMiB, kMiB + 13, kLaneBytes + 16 * 3 + 5, 4 * kLaneBytes + 16 * 100 + 9};

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
