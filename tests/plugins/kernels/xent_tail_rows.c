/* Cross-entropy over rows in blocks of 4, whose tail block (rows not a multiple of 4) leaves out the
 * one-hot term: softmax alone, as if every label were missing. mse is the naive one. */
#include "broken.h"

static int tail_rows_loss(void* kernels, dpcheck_loss_t loss, const float* out, const void* target, float* dout,
                          double* loss_value, int64_t rows, int64_t cols, float scale, void* stream) {
  const int rc = naive_loss_forward_backward(kernels, loss, out, target, dout, loss_value, rows, cols, scale, stream);
  if (rc != 0 || loss != DPCHECK_CROSS_ENTROPY) return rc;
  const int64_t* labels = (const int64_t*)target;
  const float c = (float)(scale / (double)rows);
  for (int64_t i = rows / 4 * 4; i < rows; ++i) dout[i * cols + labels[i]] += c;
  return 0;
}

DPCHECK_BROKEN("xent-tail-rows", loss_forward_backward, tail_rows_loss)
