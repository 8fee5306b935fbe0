// The bias gradient's column sums (kernels/bias_grad.cu) against the float64 reference
// (reference/activation.cpp: column_sums), its fixed order (the same bits on every run), and its two
// mutants: skip_tail, which must leave the last column unwritten when the width is not a multiple of the
// tile, and atomic, whose sums are right but whose order follows the scheduler. How often the atomic
// order varies is measured at the sizes checkpoint_resume_bitwise draws (the property aimed at it), so
// that ci/gpu.sh can tell that mutant surviving on a GPU where it could not show from a missed catch.
//
// The bound: a column sum of n rows, added in any order (one chunk's stripes, their tree, the chunks'
// sums), rounds at most n - 1 times on any term's path: |err| <= gamma_{n-1} * sum |delta| (Higham 4.2),
// u = 2^-24; accumulating into the old gradient adds one term: gamma_n * (sum |delta| + |old|). Used
// as gamma_n and gamma_{n+1}.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "kernels/bias_grad.hpp"
#include "kernels/device.hpp"
#include "properties/scenario.hpp"
#include "reference/activation.hpp"
#include "reference/bound.hpp"
#include "reference/linear.hpp"
#include "src/rng.hpp"
#include "tests/gpu_test_support.hpp"
#include "tests/test_support.hpp"

namespace dpcheck {
namespace {

using reference::Matrix;
using reference::RowVector;
constexpr double u32 = 0x1p-24;

// Values in [-1, 1) times 2^e, e in [-spread, spread]: with a wide spread the order of the additions
// shows in the last bits.
std::vector<float> random_floats(std::size_t n, std::uint64_t seed, std::uint64_t stream, int spread = 4) {
  const std::uint64_t key = mix_key(seed, 0xb1a5);
  std::vector<float> v(n);
  const auto width = static_cast<std::uint64_t>(2 * spread + 1);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = std::ldexp(random_symmetric(key, stream, i),
                      static_cast<int>(random_u64(key, stream + 1000, i) % width) - spread);
  return v;
}

// Row counts below, at and above one chunk (kBiasGradChunk = 512 rows), so that both the one-pass and
// the two-pass (chunks, then their sums in chunk order) paths run, with ragged last chunks.
rc::Gen<int> gen_rows() {
  return rc::gen::oneOf(rc::gen::element(0, 1, 3, 8, 9, 17, 511, 512, 513, 1024, 1500, 8192),
                        rc::gen::inRange(1, 2000));
}
rc::Gen<int> gen_cols() {
  return rc::gen::oneOf(rc::gen::element(1, 3, 17, 31, 32, 33, 64, 127, 129), rc::gen::inRange(1, 300));
}

// ---- host side ------------------------------------------------------------------------------------------

TEST(BiasGrad, WorkspaceIsOneRowOfSumsPerChunkBeyondTheFirst) {
  static_assert(cuda::kBiasGradChunk == 512);
  EXPECT_EQ(cuda::bias_grad_workspace(0, 5), 0u);
  EXPECT_EQ(cuda::bias_grad_workspace(1, 5), 0u);
  EXPECT_EQ(cuda::bias_grad_workspace(512, 5), 0u);
  EXPECT_EQ(cuda::bias_grad_workspace(513, 5), 10u);
  EXPECT_EQ(cuda::bias_grad_workspace(1500, 7), 21u);
  EXPECT_EQ(cuda::bias_grad_workspace(8192, 33), 16u * 33u);
}

TEST(BiasGrad, ReferenceColumnSumsAreTheLoops) {
  const int rows = 13, cols = 5;
  const std::vector<float> d = random_floats(rows * cols, 1, 1);
  const Matrix<double> D = reference::to_matrix(d, rows, cols);
  const RowVector<double> sums = reference::column_sums(D), mags = reference::column_magnitudes(D);
  for (int j = 0; j < cols; ++j) {
    double s = 0, m = 0;
    for (int k = 0; k < rows; ++k) {
      s += d[static_cast<std::size_t>(k * cols + j)];
      m += std::abs(d[static_cast<std::size_t>(k * cols + j)]);
    }
    EXPECT_NEAR(sums(j), s, 1e-14 * m) << j;
    EXPECT_NEAR(mags(j), m, 1e-14 * m) << j;
  }
}

// ---- on the GPU -------------------------------------------------------------------------------------------

// One run of the kernel on delta (rows x cols): gb starts as `old` when accumulating, else poisoned
// (all bits set, a NaN) so that an unwritten column cannot pass.
std::vector<float> run_kernel(const cuda::DeviceBuffer<float>& delta, int rows, int cols, bool accumulate,
                              const std::vector<float>& old, cuda::BiasGradKernel kernel, cudaStream_t s) {
  const auto c = static_cast<std::size_t>(cols);
  const auto gb = upload(old, s);
  if (!accumulate) DPCHECK_CUDA_CHECK(cudaMemsetAsync(gb.get(), 0xff, c * sizeof(float), s));
  cuda::DeviceBuffer<float> workspace(std::max<std::size_t>(cuda::bias_grad_workspace(rows, cols), 1));
  DPCHECK_CUDA_CHECK(cudaMemsetAsync(workspace.get(), 0xff, workspace.size() * sizeof(float), s));
  cuda::bias_grad(delta.get(), gb.get(), rows, cols, accumulate, workspace.get(), s, kernel);
  return download(gb, c, s);
}

struct Expected {
  RowVector<double> value, bound;
};
Expected expected(const std::vector<float>& d, int rows, int cols, bool accumulate, const std::vector<float>& old) {
  const Matrix<double> D = reference::to_matrix(d, rows, cols);
  Expected e{reference::column_sums(D), reference::gamma(rows, u32) * reference::column_magnitudes(D)};
  if (accumulate) {
    const RowVector<double> o = reference::to_matrix(old, 1, cols).row(0);
    e.value += o;
    e.bound = reference::gamma(rows + 1, u32) * (reference::column_magnitudes(D) + o.cwiseAbs());
  }
  return e;
}

// Error / bound of column j; infinite for a NaN or an error where the bound is 0.
double ratio(float got, const Expected& e, int j) { return error_ratio(got, e.value(j), e.bound(j)); }

TEST(BiasGradGpu, OrderedSumsWithinDerivedBoundOfFloat64Reference) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  rc::detail::checkGTest([&] {
    const int rows = *gen_rows(), cols = *gen_cols();
    const bool accumulate = *rc::gen::arbitrary<bool>();
    const auto seed = *rc::gen::arbitrary<std::uint32_t>();
    const std::vector<float> d =
        random_floats(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols), seed, 1);
    const std::vector<float> old = random_floats(static_cast<std::size_t>(cols), seed, 2);
    const auto dd = upload(d, s);
    const std::vector<float> gb = run_kernel(dd, rows, cols, accumulate, old, cuda::BiasGradKernel::ordered, s);
    const Expected e = expected(d, rows, cols, accumulate, old);
    double worst = 0;
    int at = 0;
    for (int j = 0; j < cols; ++j)
      if (const double q = ratio(gb[static_cast<std::size_t>(j)], e, j); q > worst || j == 0) {
        worst = q;
        at = j;
      }
    RC_CLASSIFY(rows > cuda::kBiasGradChunk, "two passes (more than one chunk of rows)");
    RC_LOG() << rows << "x" << cols << (accumulate ? " accumulate" : "") << ": error ratio " << worst << " at column "
             << at << "\n";
    RC_ASSERT(worst <= 1.0);
  });
}

TEST(BiasGradGpu, OrderedGivesTheSameBitsOnEveryRun) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  for (const auto& [rows, cols] : {std::pair{8192, 33}, std::pair{1500, 17}, std::pair{513, 300}, std::pair{100, 5}}) {
    // Twenty binades each way: any change of order changes the last bits somewhere.
    const std::vector<float> d = random_floats(static_cast<std::size_t>(rows * cols), 3, 1, 20);
    const auto dd = upload(d, s);
    const std::vector<float> none(static_cast<std::size_t>(cols));
    const std::vector<float> first = run_kernel(dd, rows, cols, false, none, cuda::BiasGradKernel::ordered, s);
    for (int k = 0; k < 5; ++k) {
      const std::vector<float> again = run_kernel(dd, rows, cols, false, none, cuda::BiasGradKernel::ordered, s);
      EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0) << rows << "x" << cols;
    }
  }
}

// The skip-tail mutant never writes the last column when the width is not a multiple of the 32-wide
// tile (the poison stays), writes every other column correctly, and is the ordered kernel otherwise.
TEST(BiasGradGpu, SkipTailMutantLeavesTheLastColumnUnwritten) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  for (int rows : {3, 512, 513, 1500})
    for (int cols : {1, 3, 17, 32, 33, 64, 127}) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
      const std::vector<float> d = random_floats(static_cast<std::size_t>(rows * cols), 4, 1);
      const auto dd = upload(d, s);
      const std::vector<float> none(static_cast<std::size_t>(cols));
      const std::vector<float> got = run_kernel(dd, rows, cols, false, none, cuda::BiasGradKernel::skip_tail, s);
      const std::vector<float> ordered = run_kernel(dd, rows, cols, false, none, cuda::BiasGradKernel::ordered, s);
      const Expected e = expected(d, rows, cols, false, none);
      for (int j = 0; j + 1 < cols; ++j)
        EXPECT_LE(ratio(got[static_cast<std::size_t>(j)], e, j), 1.0) << "column " << j;
      if (cols % 32 != 0) {
        EXPECT_TRUE(std::isnan(got.back())) << "the last column was written: " << got.back();
      } else {
        EXPECT_EQ(std::memcmp(got.data(), ordered.data(), got.size() * sizeof(float)), 0);
      }
    }
}

// The atomic mutant's sums are right (each is some order of the same additions), and every column is
// written: that much is certain, and checked up to sizes beyond one chunk of rows.
TEST(BiasGradGpu, AtomicMutantIsWithinTheBound) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  for (const auto& [rows, cols] : {std::pair{8192, 33}, std::pair{1500, 17}, std::pair{3, 5}, std::pair{0, 7}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    const std::vector<float> d = random_floats(static_cast<std::size_t>(rows * cols), 5, 1, 20);
    const auto dd = upload(d, s);
    const std::vector<float> old = random_floats(static_cast<std::size_t>(cols), 5, 2);
    for (const bool accumulate : {false, true}) {
      const Expected e = expected(d, rows, cols, accumulate, old);
      const std::vector<float> got = run_kernel(dd, rows, cols, accumulate, old, cuda::BiasGradKernel::atomic, s);
      for (int j = 0; j < cols; ++j) EXPECT_LE(ratio(got[static_cast<std::size_t>(j)], e, j), 1.0) << "column " << j;
    }
  }
}

// Whether its order, and so its bits, differ from the ordered kernel's or from one run to the next
// depends on the scheduler: counted and reported, not asserted, at the sizes the property aimed at this
// mutant (checkpoint_resume_bitwise) hands the kernel. There a replica's delta has as many rows as its
// share of the batch (0 to the scenario's largest batch; cuda-local has no algorithm threshold to widen
// a layer) and as many columns as a layer is wide (1 to the scenario's widest). A variation seen only at
// larger sizes (thousands of rows, which the property never draws) says nothing about its catch.
TEST(BiasGradGpu, AtomicMutantOrderFollowsTheSchedulerAtThePropertysSizes) {
  DPCHECK_REQUIRE_GPU();
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  const ScenarioSpace space;
  const int max_rows = static_cast<int>(space.max_batch), max_cols = space.max_width;
  const auto up_to = [](std::vector<int> v, int most) {
    std::erase_if(v, [most](int n) { return n > most; });
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  };
  const std::vector<int> row_sizes = up_to({0, 1, 2, 7, 33, 100, max_rows / 2, max_rows}, max_rows);
  const std::vector<int> col_sizes = up_to({1, 5, 17, 33, max_cols}, max_cols);
  constexpr int kRuns = 20;
  int sizes = 0, varied = 0;
  std::size_t most = 0;
  std::string most_at;
  for (const int rows : row_sizes)
    for (const int cols : col_sizes) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
      const std::vector<float> d = random_floats(static_cast<std::size_t>(rows * cols), 5, 1, 20);
      const auto dd = upload(d, s);
      const std::vector<float> none(static_cast<std::size_t>(cols));
      const std::vector<float> ordered = run_kernel(dd, rows, cols, false, none, cuda::BiasGradKernel::ordered, s);
      int differ_from_ordered = 0;
      std::set<std::vector<std::uint32_t>> distinct;
      for (int k = 0; k < kRuns; ++k) {
        const std::vector<float> got = run_kernel(dd, rows, cols, false, none, cuda::BiasGradKernel::atomic, s);
        differ_from_ordered += std::memcmp(got.data(), ordered.data(), got.size() * sizeof(float)) != 0 ? 1 : 0;
        std::vector<std::uint32_t> bits(got.size());
        std::memcpy(bits.data(), got.data(), got.size() * sizeof(float));
        distinct.insert(bits);
      }
      std::printf("atomic bias gradient %dx%d: %d of %d runs differ from the ordered kernel, %zu distinct results\n",
                  rows, cols, differ_from_ordered, kRuns, distinct.size());
      ++sizes;
      varied += distinct.size() > 1 ? 1 : 0;
      if (distinct.size() > most) {
        most = distinct.size();
        most_at = std::to_string(rows) + "x" + std::to_string(cols);
      }
      // One row, or none, leaves nothing to reorder: the mutant must then agree with the ordered kernel.
      if (rows <= 1) {
        EXPECT_EQ(differ_from_ordered, 0);
        EXPECT_EQ(distinct.size(), 1u);
      }
    }
  // The line ci/gpu.sh reads (atomic_variation): the mutant's surviving is a miss only where this is above 0.
  std::printf(
      "atomic bias gradient at the property's sizes (rows 0-%d, columns 1-%d): varied from run to run at %d "
      "of %d sizes (most: %zu distinct results of %d runs, at %s)\n",
      max_rows, max_cols, varied, sizes, most, kRuns, most_at.c_str());
  RecordProperty("atomic_sizes_varied", std::to_string(varied) + "/" + std::to_string(sizes));
}

}  // namespace
}  // namespace dpcheck
