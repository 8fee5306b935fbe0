// Bias + activation forward and the activation's backward (kernels/activation.hpp).
// Reference: reference/activation.cpp; test: tests/activation_test.cpp.
#include "kernels/activation.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/launch.hpp"

namespace dpcheck::cuda {

namespace {

__global__ void bias_activation_kernel(float* __restrict__ z, float* __restrict__ a, const float* __restrict__ bias,
                                       long long n, int cols, int act) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const float v = z[i] + bias[i % cols];
    z[i] = v;
    if (a) {
      // Same operations as the CPU engine: relu by comparison, tanh by tanhf (at most 2 ulp, which the
      // bound's tanh_error covers).
      a[i] = act == 0 ? (v > 0.0f ? v : 0.0f) : act == 1 ? tanhf(v) : v;
    }
  }
}

__global__ void activation_backward_kernel(const float* __restrict__ h, const float* __restrict__ z,
                                           const float* __restrict__ a, float* __restrict__ delta, long long n,
                                           int act) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    if (act == 0) delta[i] = z[i] > 0.0f ? h[i] : 0.0f;
    else if (act == 1)
      delta[i] = h[i] * (1.0f - a[i] * a[i]);  // a fused multiply-add only rounds less than the bound counts
    else delta[i] = h[i];
  }
}

int code(Activation act) { return act == Activation::relu ? 0 : act == Activation::tanh ? 1 : 2; }

}  // namespace

void bias_activation_forward(float* z, float* a, const float* bias, int rows, int cols, Activation act,
                             cudaStream_t stream) {
  const long long n = static_cast<long long>(rows) * cols;
  if (n == 0) return;
  bias_activation_kernel<<<grid_for(n), kBlock, 0, stream>>>(z, a, bias, n, cols, code(act));
  DPCHECK_LAUNCH_CHECK();
}

void activation_backward(const float* h, const float* z, const float* a, float* delta, int rows, int cols,
                         Activation act, cudaStream_t stream) {
  const long long n = static_cast<long long>(rows) * cols;
  if (n == 0) return;
  activation_backward_kernel<<<grid_for(n), kBlock, 0, stream>>>(h, z, a, delta, n, code(act));
  DPCHECK_LAUNCH_CHECK();
}

}  // namespace dpcheck::cuda
