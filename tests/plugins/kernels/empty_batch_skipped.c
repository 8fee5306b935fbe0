/* linear_backward that returns at once on an empty batch (rows = 0), as if there were nothing to do: when
 * accumulate is 0, dw and db must still be written (as zeros), and they are left as they were. Every batch
 * with a row is right. */
#include "broken.h"

static int empty_batch_skipped_linear_backward(void* kernels, const float* x, const float* w, const float* dy,
                                               float* dx, float* dw, float* db, int64_t rows, int64_t in, int64_t out,
                                               int accumulate, void* stream) {
  if (rows == 0) return 0;
  return naive_linear_backward(kernels, x, w, dy, dx, dw, db, rows, in, out, accumulate, stream);
}

DPCHECK_BROKEN("empty-batch-skipped", linear_backward, empty_batch_skipped_linear_backward)
