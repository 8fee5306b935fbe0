// Deterministic bias gradient (kernels/bias_grad.hpp), and the two broken variants the GPU mutants use.
// Reference: reference/activation.cpp; test: tests/bias_grad_test.cpp.
//
// Pass 1: a block owns 32 columns and one chunk of kBiasGradChunk rows. Its 32 x 8 threads each sum a
// fixed stripe of the chunk's rows (row = ty, ty + 8, ...) in row order; the 8 partial sums of a column
// are added in a fixed tree in shared memory. Pass 2 (more than one chunk): each column's chunk sums are
// added in chunk order. The order depends only on the shape, never on scheduling.
#include "kernels/bias_grad.hpp"
#include "kernels/cuda_check.hpp"

namespace dpcheck::cuda {

namespace {

constexpr int kCols = 32;
constexpr int kRowThreads = 8;

int chunks_of(int rows) { return rows <= kBiasGradChunk ? 1 : (rows + kBiasGradChunk - 1) / kBiasGradChunk; }

// Writes the column sums of rows [chunk * kBiasGradChunk, ...) to out[chunk * cols + col], or, with a
// single chunk, straight into gb (accumulating when asked).
__global__ void bias_grad_chunks(const float* __restrict__ delta, float* __restrict__ out, int rows, int cols,
                                 bool single, bool accumulate, int end) {
  __shared__ float part[kRowThreads][kCols];
  const int col = blockIdx.x * kCols + threadIdx.x;
  const int first = blockIdx.y * kBiasGradChunk;
  const int last = min(rows, first + kBiasGradChunk);
  float s = 0.0f;
  if (col < cols)
    for (int r = first + threadIdx.y; r < last; r += kRowThreads) s += delta[static_cast<long long>(r) * cols + col];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  for (int width = kRowThreads / 2; width > 0; width /= 2) {
    if (threadIdx.y < width) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + width][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y != 0 || col >= end) return;
  const float total = part[0][threadIdx.x];
  if (single) out[col] = accumulate ? out[col] + total : total;
  else out[static_cast<long long>(blockIdx.y) * cols + col] = total;
}

__global__ void bias_grad_join(const float* __restrict__ chunks, float* __restrict__ gb, int nchunks, int cols,
                               bool accumulate, int end) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= end) return;
  float s = chunks[col];
  for (int c = 1; c < nchunks; ++c) s += chunks[static_cast<long long>(c) * cols + col];
  gb[col] = accumulate ? gb[col] + s : s;
}

// Mutant: every element is added into gb with atomicAdd (after a zeroing kernel), so the order of the
// additions -- and the last bits -- follow the scheduler. One block of 32 columns per row (grid-striding
// past the grid's limit), so that even a few rows spread over many SMs and the order varies run to run.
__global__ void zero_kernel(float* gb, int cols) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col < cols) gb[col] = 0.0f;
}

__global__ void bias_grad_atomic(const float* __restrict__ delta, float* gb, int rows, int cols) {
  const int col = blockIdx.x * kCols + threadIdx.x;
  if (col >= cols) return;
  for (int row = blockIdx.y; row < rows; row += gridDim.y)
    atomicAdd(&gb[col], delta[static_cast<long long>(row) * cols + col]);
}

}  // namespace

std::size_t bias_grad_workspace(int rows, int cols) {
  const int chunks = chunks_of(rows);
  return chunks == 1 ? 0 : static_cast<std::size_t>(chunks) * static_cast<std::size_t>(cols);
}

void bias_grad(const float* delta, float* gb, int rows, int cols, bool accumulate, float* workspace,
               cudaStream_t stream, BiasGradKernel kernel) {
  if (cols == 0) return;
  const dim3 block(kCols, kRowThreads);
  const int col_blocks = (cols + kCols - 1) / kCols;
  if (kernel == BiasGradKernel::atomic) {
    if (!accumulate) {
      zero_kernel<<<(cols + 255) / 256, 256, 0, stream>>>(gb, cols);
      DPCHECK_LAUNCH_CHECK();
    }
    if (rows == 0) return;
    bias_grad_atomic<<<dim3(col_blocks, rows < 65535 ? rows : 65535), kCols, 0, stream>>>(delta, gb, rows, cols);
    DPCHECK_LAUNCH_CHECK();
    return;
  }
  // The skip-tail mutant's bug: the last tile stops one column short when the width is not a multiple of it.
  const int end = kernel == BiasGradKernel::skip_tail && cols % kCols != 0 ? cols - 1 : cols;
  const int chunks = chunks_of(rows);
  const bool single = chunks == 1;
  bias_grad_chunks<<<dim3(col_blocks, chunks), block, 0, stream>>>(delta, single ? gb : workspace, rows, cols, single,
                                                                   accumulate, end);
  DPCHECK_LAUNCH_CHECK();
  if (!single) {
    bias_grad_join<<<(cols + 255) / 256, 256, 0, stream>>>(workspace, gb, chunks, cols, accumulate, end);
    DPCHECK_LAUNCH_CHECK();
  }
}

}  // namespace dpcheck::cuda
