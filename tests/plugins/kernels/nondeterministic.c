/* linear_forward whose summation order alternates from call to call (a counter standing in for a split
 * that depends on which thread or stream arrives first): every result is within rounding, but two runs
 * on the same inputs differ in their last bits. */
#include "broken.h"

static int calls;

static int nondeterministic_linear_forward(void* kernels, const float* x, const float* w, const float* b, float* y,
                                           int64_t rows, int64_t in, int64_t out, void* stream) {
  (void)kernels;
  (void)stream;
  const int reverse = calls++ % 2;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < out; ++j) {
      float sum = 0.0f;
      for (int64_t t = 0; t < in; ++t) {
        const int64_t k = reverse ? in - 1 - t : t;
        sum += x[i * in + k] * w[j * in + k];
      }
      y[i * out + j] = sum + b[j];
    }
  return 0;
}

DPCHECK_BROKEN("nondeterministic", linear_forward, nondeterministic_linear_forward)
