/* adam_step whose bias corrections use the step count after an extra increment (step + 1), as a kernel
 * that counts from 1 and is handed a count that already does. */
#include "broken.h"

static int off_by_one_adam_step(void* kernels, float* p, const float* g, float* m, float* v, int64_t n, double lr,
                                double beta1, double beta2, double eps, int64_t step, void* stream) {
  return naive_adam_step(kernels, p, g, m, v, n, lr, beta1, beta2, eps, step + 1, stream);
}

DPCHECK_BROKEN("adam-off-by-one", adam_step, off_by_one_adam_step)
