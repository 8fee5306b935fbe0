// Loss gradients (kernels/loss.hpp). Reference: reference/loss.cpp; test: tests/loss_test.cpp.
#include "kernels/cuda_check.hpp"
#include "kernels/launch.hpp"
#include "kernels/loss.hpp"

namespace dpcheck::cuda {

namespace {

__global__ void mse_delta_kernel(const float* __restrict__ z, const float* __restrict__ y, float* __restrict__ delta,
                                 long long n, float c) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    delta[i] = (z[i] - y[i]) * c;
}

// One warp a row: lanes take columns j = lane, lane + 32, ...; the row's float64 sum of squares is
// combined by a fixed shuffle tree, so it is the same on every run.
__global__ void mse_row_loss_kernel(const float* __restrict__ z, const float* __restrict__ y, double* row_loss,
                                    int rows, int cols) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  double s = 0.0;
  for (int j = lane; j < cols; j += 32) {
    const double e = static_cast<double>(z[static_cast<long long>(row) * cols + j]) -
                     static_cast<double>(y[static_cast<long long>(row) * cols + j]);
    s += e * e;
  }
  for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
  if (lane == 0) row_loss[row] = s;
}

// One thread a row: classes are few next to the batch, and a sequential loop keeps the CPU engine's
// order of operations (max, exps summed left to right, one division each).
__global__ void softmax_xent_kernel(const float* __restrict__ z, const std::int64_t* __restrict__ labels,
                                    float* __restrict__ delta, int rows, int cols, float c, double* row_loss) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const float* zr = z + static_cast<long long>(row) * cols;
  float* dr = delta + static_cast<long long>(row) * cols;
  float m = zr[0];
  for (int j = 1; j < cols; ++j) m = fmaxf(m, zr[j]);
  float s = 0.0f;
  double s64 = 0.0;
  for (int j = 0; j < cols; ++j) {
    const float e = expf(zr[j] - m);
    dr[j] = e;
    s += e;
    if (row_loss) s64 += exp(static_cast<double>(zr[j]) - m);
  }
  const long long label = labels[row];
  for (int j = 0; j < cols; ++j) dr[j] = (dr[j] / s - (j == label ? 1.0f : 0.0f)) * c;
  if (row_loss) row_loss[row] = log(s64) + m - static_cast<double>(zr[label]);
}

}  // namespace

void mse_delta(const float* z, const float* y, float* delta, int rows, int cols, float c, double* row_loss,
               cudaStream_t stream) {
  const long long n = static_cast<long long>(rows) * cols;
  if (n == 0) return;
  mse_delta_kernel<<<grid_for(n), kBlock, 0, stream>>>(z, y, delta, n, c);
  DPCHECK_LAUNCH_CHECK();
  if (row_loss) {
    constexpr int kRowsPerBlock = kBlock / 32;
    mse_row_loss_kernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kBlock, 0, stream>>>(z, y, row_loss, rows, cols);
    DPCHECK_LAUNCH_CHECK();
  }
}

void softmax_xent_delta(const float* z, const std::int64_t* labels, float* delta, int rows, int cols, float c,
                        double* row_loss, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  softmax_xent_kernel<<<(rows + kBlock - 1) / kBlock, kBlock, 0, stream>>>(z, labels, delta, rows, cols, c, row_loss);
  DPCHECK_LAUNCH_CHECK();
}

}  // namespace dpcheck::cuda
