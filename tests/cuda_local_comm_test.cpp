// The "cuda-local" communicator (kernels/gpu_comm.cpp: N replicas on one GPU, reduced in rank order by
// kernels/allreduce.cu). The backend-independent checks are the conformance suite
// (tests/comm_conformance.hpp), run here for N = 1..8 through a staging wrapper that moves each call's
// host buffers to device buffers and back; this file adds that cuda-local gives exactly the local
// backend's bits, and what it refuses.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/device.hpp"
#include "kernels/gpu_comm.hpp"
#include "src/comm/local_comm.hpp"
#include "src/error.hpp"
#include "tests/comm_conformance.hpp"
#include "tests/gpu_test_support.hpp"

namespace dpcheck {
namespace {

using namespace std::chrono_literals;

// ---- the conformance suite ----------------------------------------------------------------------------

constexpr int kMaxRanks = 8;

class Conformance : public testing::TestWithParam<conformance::ConformanceCheck> {};

TEST_P(Conformance, OnWorldSizes1To8) {
  DPCHECK_REQUIRE_GPU();
  for (int n = 1; n <= kMaxRanks; ++n)
    cuda::run_cuda_local(
        n,
        [&](Communicator& c) {
          Staged staged(c);
          GetParam().run(staged);
        },
        30s);
}

INSTANTIATE_TEST_SUITE_P(CudaLocalCommGpu, Conformance, testing::ValuesIn(conformance::conformance_checks()),
                         conformance::check_name);

// ---- beyond the suite -------------------------------------------------------------------------------

TEST(CudaLocalCommGpu, ReportsItselfAsADeviceBackendSharingOneAddressSpace) {
  DPCHECK_REQUIRE_GPU();
  cuda::run_cuda_local(
      3,
      [](Communicator& c) {
        EXPECT_EQ(c.backend(), "cuda-local");
        EXPECT_EQ(c.memory_space(), MemorySpace::device);
        EXPECT_EQ(c.size(), 3);
        EXPECT_NE(&c.host(), &c);
        EXPECT_EQ(c.host().memory_space(), MemorySpace::host);
        EXPECT_EQ(c.host().rank(), c.rank());
        EXPECT_TRUE(c.shares_address_space());
      },
      30s);
}

// The same inputs through cuda-local and through the local backend give the same bits, on every rank,
// for every world size and every floating dtype: a model trained on either agrees with the other to the
// last bit.
TEST(CudaLocalCommGpu, FloatSumsAndAveragesHaveTheLocalBackendsBits) {
  DPCHECK_REQUIRE_GPU();
  constexpr std::size_t len = 100'003;
  for (int n = 1; n <= kMaxRanks; ++n) {
    for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      const auto run = [&](bool gpu, auto zero) {
        using T = decltype(zero);
        std::vector<std::vector<T>> out(static_cast<std::size_t>(n));
        std::mutex mu;
        const auto body = [&](Communicator& c) {
          std::vector<T> buf = conformance::awkward_values<T>(c.rank(), len);
          c.allreduce(std::span<T>(buf), op);
          const std::lock_guard<std::mutex> lock(mu);
          out[static_cast<std::size_t>(c.rank())] = std::move(buf);
        };
        if (gpu)
          cuda::run_cuda_local(
              n,
              [&](Communicator& c) {
                Staged staged(c);
                body(staged);
              },
              30s);
        else run_local(n, body, 30s);
        return out;
      };
      const auto check = [&](auto zero, const char* type) {
        using T = decltype(zero);
        const auto local = run(false, zero), gpu = run(true, zero);
        for (int r = 0; r < n; ++r)
          EXPECT_EQ(std::memcmp(gpu[static_cast<std::size_t>(r)].data(), local[0].data(), len * sizeof(T)), 0)
              << "N=" << n << " rank " << r << " " << type << " " << reduce_op_name(op);
      };
      check(0.0f, "float32");
      check(0.0, "float64");
      check(Bf16{}, "bfloat16");  // widened, summed in float in rank order, rounded once: on both sides
      check(Fp16{}, "float16");
    }
  }
}

// A collective whose buffers are null on some rank is refused on every rank, before any replica reads
// through the null pointer.
TEST(CudaLocalCommGpu, NullDeviceBufferIsRefusedOnEveryRank) {
  DPCHECK_REQUIRE_GPU();
  cuda::run_cuda_local(
      3,
      [](Communicator& c) {
        cuda::DeviceBuffer<float> buf(4);
        try {
          c.allreduce(c.rank() == 1 ? nullptr : buf.get(), 4, DType::f32, ReduceOp::sum);
          ADD_FAILURE() << "rank " << c.rank() << ": no error";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("rank 1 passed a null buffer"), std::string::npos) << e.what();
        }
        c.barrier();
      },
      30s);
}

// A collective waits for the work already queued on the replica's stream before any peer reads its
// buffer: here each replica's input arrives by a copy queued behind a 20 ms host callback, and the call
// comes at once, without a synchronization of its own. Were the communicator to skip its leading
// synchronization, the peers would sum the NaN poison instead.
TEST(CudaLocalCommGpu, ACollectiveWaitsForWorkQueuedBeforeIt) {
  DPCHECK_REQUIRE_GPU();
  constexpr std::size_t kCount = 1 << 16;
  cuda::run_cuda_local(
      4,
      [&](Communicator& c) {
        const cuda::Stream stream;
        c.set_stream(stream.get());
        cuda::DeviceBuffer<float> buf(kCount);
        float* input = nullptr;  // pinned, so that the copy really waits in the stream
        ASSERT_EQ(cudaMallocHost(&input, kCount * sizeof(float)), cudaSuccess);
        for (std::size_t i = 0; i < kCount; ++i) input[i] = static_cast<float>(c.rank() + 1);
        ASSERT_EQ(cudaMemset(buf.get(), 0xff, kCount * sizeof(float)), cudaSuccess);  // NaN everywhere
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto nap = [](void*) { std::this_thread::sleep_for(20ms); };
        ASSERT_EQ(cudaLaunchHostFunc(stream.get(), nap, nullptr), cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(buf.get(), input, kCount * sizeof(float), cudaMemcpyHostToDevice, stream.get()),
                  cudaSuccess);
        c.allreduce(buf.get(), kCount, DType::f32, ReduceOp::sum);
        std::vector<float> out(kCount);
        c.to_host(buf.get(), out.data(), kCount * sizeof(float));
        std::size_t wrong = 0;
        for (float x : out) wrong += x != 10.0f;  // 1 + 2 + 3 + 4
        EXPECT_EQ(wrong, 0u) << "rank " << c.rank();
        cudaFreeHost(input);
      },
      30s);
}

// Work queued on the legacy default stream is not ordered with the engine's: a device collective on a
// replica without a stream is refused on every replica, the ones with a stream included.
TEST(CudaLocalCommGpu, ACollectiveWithoutAStreamIsRefusedOnEveryRank) {
  DPCHECK_REQUIRE_GPU();
  cuda::run_cuda_local(
      3,
      [](Communicator& c) {
        const cuda::Stream stream;
        if (c.rank() != 1) c.set_stream(stream.get());
        cuda::DeviceBuffer<float> buf(4);
        try {
          c.allreduce(buf.get(), 4, DType::f32, ReduceOp::sum);
          ADD_FAILURE() << "rank " << c.rank() << ": no error";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("set_stream() was never called on rank(s) 1"), std::string::npos)
              << e.what();
        }
      },
      30s);
}

TEST(CudaLocalComm, WorldSizeOutsideOneTo64IsAUsageError) {
  // Whether or not there is a device: the size is wrong either way.
  for (int n : {0, -1, 65, 1000}) {
    try {
      cuda::run_cuda_local(
          n, [](Communicator&) {}, 1s);
      ADD_FAILURE() << n << " replicas accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("1 to 64 replicas"), std::string::npos) << e.what();
    }
  }
}

TEST(CudaLocalComm, WithoutADeviceIsAUsageErrorWithTheRuntimesReason) {
  std::string why;
  if (cuda::device_available(&why)) GTEST_SKIP() << "a CUDA device is present";
  try {
    cuda::run_cuda_local(
        2, [](Communicator&) {}, 1s);
    FAIL() << "ran without a device";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device: " + why), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dpcheck
