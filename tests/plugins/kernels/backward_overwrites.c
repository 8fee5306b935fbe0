/* linear_backward that ignores `accumulate`: it always writes dw and db, so micro-batches replace each
 * other's gradient instead of adding to it. */
#include "broken.h"

static int overwriting_linear_backward(void* kernels, const float* x, const float* w, const float* dy, float* dx,
                                       float* dw, float* db, int64_t rows, int64_t in, int64_t out, int accumulate,
                                       void* stream) {
  (void)accumulate;
  return naive_linear_backward(kernels, x, w, dy, dx, dw, db, rows, in, out, 0, stream);
}

DPCHECK_BROKEN("backward-overwrites", linear_backward, overwriting_linear_backward)
