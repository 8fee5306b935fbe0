/* linear_forward in tiles of 4 output columns; the tail tile (out not a multiple of 4) is computed by a
 * separate loop that forgets the bias. Full tiles are right, so sizes that are multiples of 4 pass. */
#include "broken.h"

static int tail_tile_linear_forward(void* kernels, const float* x, const float* w, const float* b, float* y,
                                    int64_t rows, int64_t in, int64_t out, void* stream) {
  (void)kernels;
  (void)stream;
  const int64_t full = out / 4 * 4;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j0 = 0; j0 < full; j0 += 4)
      for (int64_t j = j0; j < j0 + 4; ++j) {
        float sum = b[j];
        for (int64_t k = 0; k < in; ++k) sum += x[i * in + k] * w[j * in + k];
        y[i * out + j] = sum;
      }
    for (int64_t j = full; j < out; ++j) {
      float sum = 0.0f;
      for (int64_t k = 0; k < in; ++k) sum += x[i * in + k] * w[j * in + k];
      y[i * out + j] = sum;
    }
  }
  return 0;
}

DPCHECK_BROKEN("tail-tile", linear_forward, tail_tile_linear_forward)
