// Fixed-order reduction across replicas on one GPU, and the division that makes NCCL's sum an average
// (kernels/allreduce.hpp). Test: tests/cuda_local_comm_test.cpp, against the local backend's bits.
//
// bfloat16 and float16 are widened to float, reduced in float in rank order (divided there for avg) and
// rounded to the format once, as src/comm/collective.cpp does on the host: __float2bfloat16_rn and
// __float2half_rn round to nearest, ties to even, as src/low_precision.hpp does, so the bits agree
// (a NaN may come back with another payload).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/allreduce.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/launch.hpp"
#include "src/error.hpp"

namespace dpcheck::cuda {

namespace {

// Pointers travel in the kernel's parameters: no device array to copy for every call.
template <class T> struct Buffers { T* p[kMaxLocalReplicas]; };

template <class T> __device__ T apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::min: return b < a ? b : a;
    case ReduceOp::max: return b > a ? b : a;
    default:
      if constexpr (std::is_integral_v<T>) {
        // Integer sums wrap like the host backends' (src/comm/collective.cpp), without signed overflow.
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      } else {
        return a + b;
      }
  }
}

template <class T> __global__ void reduce_kernel(Buffers<T> bufs, int n, long long lo, long long hi, ReduceOp op) {
  for (long long i = lo + blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < hi;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    T acc = bufs.p[0][i];
    for (int r = 1; r < n; ++r) acc = apply(op, acc, bufs.p[r][i]);
    if (op == ReduceOp::avg) acc = acc / static_cast<T>(n);
    for (int r = 0; r < n; ++r) bufs.p[r][i] = acc;
  }
}

__device__ inline float widen(__nv_bfloat16 h) { return __bfloat162float(h); }
__device__ inline float widen(__half h) { return __half2float(h); }
template <class H> __device__ H narrow(float f);
template <> __device__ inline __nv_bfloat16 narrow<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }
template <> __device__ inline __half narrow<__half>(float f) { return __float2half_rn(f); }

template <class H> __global__ void reduce16_kernel(Buffers<H> bufs, int n, long long lo, long long hi, ReduceOp op) {
  for (long long i = lo + blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < hi;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float acc = widen(bufs.p[0][i]);
    for (int r = 1; r < n; ++r) acc = apply(op, acc, widen(bufs.p[r][i]));
    if (op == ReduceOp::avg) acc = acc / static_cast<float>(n);
    const H out = narrow<H>(acc);  // the one rounding
    for (int r = 0; r < n; ++r) bufs.p[r][i] = out;
  }
}

template <class T>
void launch(void* const* buffers, int n, std::size_t lo, std::size_t hi, ReduceOp op, cudaStream_t stream) {
  Buffers<T> b{};
  for (int r = 0; r < n; ++r) b.p[r] = static_cast<T*>(buffers[r]);
  const auto count = static_cast<long long>(hi - lo);
  reduce_kernel<T>
      <<<grid_for(count), kBlock, 0, stream>>>(b, n, static_cast<long long>(lo), static_cast<long long>(hi), op);
  DPCHECK_LAUNCH_CHECK();
}

template <class H>
void launch16(void* const* buffers, int n, std::size_t lo, std::size_t hi, ReduceOp op, cudaStream_t stream) {
  Buffers<H> b{};
  for (int r = 0; r < n; ++r) b.p[r] = static_cast<H*>(buffers[r]);
  const auto count = static_cast<long long>(hi - lo);
  reduce16_kernel<H>
      <<<grid_for(count), kBlock, 0, stream>>>(b, n, static_cast<long long>(lo), static_cast<long long>(hi), op);
  DPCHECK_LAUNCH_CHECK();
}

template <class H> __global__ void divide16_kernel(H* p, long long n, float d) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    p[i] = narrow<H>(widen(p[i]) / d);
}

template <class H> void launch_divide16(void* buf, std::size_t count, int n, cudaStream_t stream) {
  const auto c = static_cast<long long>(count);
  divide16_kernel<H><<<grid_for(c), kBlock, 0, stream>>>(static_cast<H*>(buf), c, static_cast<float>(n));
  DPCHECK_LAUNCH_CHECK();
}

template <class T> __global__ void divide_kernel(T* p, long long n, T d) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    p[i] = p[i] / d;
}

template <class T> void launch_divide(void* buf, std::size_t count, int n, cudaStream_t stream) {
  const auto c = static_cast<long long>(count);
  divide_kernel<T><<<grid_for(c), kBlock, 0, stream>>>(static_cast<T*>(buf), c, static_cast<T>(n));
  DPCHECK_LAUNCH_CHECK();
}

}  // namespace

void divide_elements(void* buf, std::size_t count, DType dtype, int n, cudaStream_t stream) {
  if (count == 0) return;
  switch (dtype) {
    case DType::f32: return launch_divide<float>(buf, count, n, stream);
    case DType::f64: return launch_divide<double>(buf, count, n, stream);
    case DType::bf16: return launch_divide16<__nv_bfloat16>(buf, count, n, stream);
    case DType::f16: return launch_divide16<__half>(buf, count, n, stream);
    case DType::i32:
    case DType::i64:
    case DType::u64:
    case DType::u8: break;
  }
  throw Error("avg is for the floating dtypes (float32, float64, bfloat16, float16), not " +
              std::string(dtype_name(dtype)));
}

void reduce_rank_order(void* const* buffers, int n, std::size_t lo, std::size_t hi, DType dtype, ReduceOp op,
                       cudaStream_t stream) {
  // Checked before the early return, so that a rank with an empty slice refuses what its peers refuse.
  if (n > kMaxLocalReplicas) throw Error("cuda-local supports at most 64 replicas");
  if (op == ReduceOp::avg && !is_floating(dtype))
    throw Error("avg is for the floating dtypes (float32, float64, bfloat16, float16), not " +
                std::string(dtype_name(dtype)));
  if (dtype == DType::u8) throw Error("allreduce does not support uint8");
  if (hi <= lo) return;
  switch (dtype) {
    case DType::f32: return launch<float>(buffers, n, lo, hi, op, stream);
    case DType::f64: return launch<double>(buffers, n, lo, hi, op, stream);
    case DType::i32: return launch<std::int32_t>(buffers, n, lo, hi, op, stream);
    case DType::i64: return launch<long long>(buffers, n, lo, hi, op, stream);
    case DType::u64: return launch<unsigned long long>(buffers, n, lo, hi, op, stream);
    case DType::bf16: return launch16<__nv_bfloat16>(buffers, n, lo, hi, op, stream);
    case DType::f16: return launch16<__half>(buffers, n, lo, hi, op, stream);
    case DType::u8: throw Error("allreduce does not support uint8");
  }
}

}  // namespace dpcheck::cuda
