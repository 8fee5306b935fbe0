/* activation_backward for tanh from the input rather than the output: dy (1 - x^2) where the derivative
 * is 1 - tanh(x)^2. relu is the naive one. */
#include "broken.h"

static int tanh_from_x_backward(void* kernels, dpcheck_activation_t activation, const float* x, const float* y,
                                const float* dy, float* dx, int64_t n, void* stream) {
  if (activation != DPCHECK_TANH) return naive_activation_backward(kernels, activation, x, y, dy, dx, n, stream);
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (1.0f - x[i] * x[i]);
  return 0;
}

DPCHECK_BROKEN("tanh-backward-x", activation_backward, tanh_from_x_backward)
