/* momentum_step with dampening equal to the momentum (buf = momentum buf + (1 - momentum) g, an
 * exponential average), which torch.optim.SGD does only when asked: from the first step on, the update
 * is (1 - momentum) times too small. */
#include "broken.h"

static int dampened_momentum_step(void* kernels, float* p, const float* g, float* buf, int64_t n, double lr,
                                  double momentum, int64_t step, void* stream) {
  (void)kernels;
  (void)stream;
  const float neg_lr = (float)-lr, mu = (float)momentum, damp = (float)(1.0 - momentum);
  for (int64_t i = 0; i < n; ++i) {
    buf[i] = step == 1 ? damp * g[i] : mu * buf[i] + damp * g[i];
    p[i] += neg_lr * buf[i];
  }
  return 0;
}

DPCHECK_BROKEN("momentum-dampening", momentum_step, dampened_momentum_step)
