/* linear_forward with a blocked path for long rows: past 512 inputs a row of x no longer stays in cache
 * beside the rows of w it meets, so the sum runs over panels of 64 inputs, each added to every output of
 * the row before the next panel is read. The panel count is in / 64, rounded down instead of up: when in
 * is not a multiple of 64 the last, partial panel is never added. Every shape up to 512 inputs takes the
 * plain path and is right, so only drawn sizes past 512 show it. */
#include "broken.h"

enum { PANEL = 64, BLOCKED_FROM = 512 };

static int large_k_drop_linear_forward(void* kernels, const float* x, const float* w, const float* b, float* y,
                                       int64_t rows, int64_t in, int64_t out, void* stream) {
  if (in <= BLOCKED_FROM) return naive_linear_forward(kernels, x, w, b, y, rows, in, out, stream);
  const int64_t panels = in / PANEL;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < out; ++j) y[i * out + j] = b[j];
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t k0 = p * PANEL, k1 = k0 + PANEL < in ? k0 + PANEL : in;
      for (int64_t j = 0; j < out; ++j) {
        float sum = y[i * out + j];
        for (int64_t k = k0; k < k1; ++k) sum += x[i * in + k] * w[j * in + k];
        y[i * out + j] = sum;
      }
    }
  }
  return 0;
}

DPCHECK_BROKEN("large-k-drop", linear_forward, large_k_drop_linear_forward)
