/* Naive kernels for every op of dpcheck's kernel plugin ABI (include/dpcheck/plugin.h): plain C99
 * loops on host memory, in a fixed order, so every result is deterministic. A starting point for a
 * plugin of one's own, and the plugin that `dpcheck conform --kernels` is shown to pass. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <dpcheck/plugin.h>

static int naive_linear_forward(void* kernels, const float* x, const float* w, const float* b, float* y, int64_t rows,
                                int64_t in, int64_t out, void* stream) {
  (void)kernels;
  (void)stream;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < out; ++j) {
      float sum = b[j];
      for (int64_t k = 0; k < in; ++k) sum += x[i * in + k] * w[j * in + k];
      y[i * out + j] = sum;
    }
  return 0;
}

static int naive_linear_backward(void* kernels, const float* x, const float* w, const float* dy, float* dx, float* dw,
                                 float* db, int64_t rows, int64_t in, int64_t out, int accumulate, void* stream) {
  (void)kernels;
  (void)stream;
  for (int64_t j = 0; j < out; ++j) {
    for (int64_t k = 0; k < in; ++k) {
      float sum = accumulate ? dw[j * in + k] : 0.0f;
      for (int64_t i = 0; i < rows; ++i) sum += dy[i * out + j] * x[i * in + k];
      dw[j * in + k] = sum;
    }
    float sum = accumulate ? db[j] : 0.0f;
    for (int64_t i = 0; i < rows; ++i) sum += dy[i * out + j];
    db[j] = sum;
  }
  if (dx)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = 0; k < in; ++k) {
        float sum = 0.0f;
        for (int64_t j = 0; j < out; ++j) sum += dy[i * out + j] * w[j * in + k];
        dx[i * in + k] = sum;
      }
  return 0;
}

static int naive_activation_forward(void* kernels, dpcheck_activation_t activation, const float* x, float* y, int64_t n,
                                    void* stream) {
  (void)kernels;
  (void)stream;
  for (int64_t i = 0; i < n; ++i) y[i] = activation == DPCHECK_RELU ? (x[i] > 0.0f ? x[i] : 0.0f) : tanhf(x[i]);
  return 0;
}

static int naive_activation_backward(void* kernels, dpcheck_activation_t activation, const float* x, const float* y,
                                     const float* dy, float* dx, int64_t n, void* stream) {
  (void)kernels;
  (void)stream;
  for (int64_t i = 0; i < n; ++i)
    dx[i] = activation == DPCHECK_RELU ? (x[i] > 0.0f ? dy[i] : 0.0f) : dy[i] * (1.0f - y[i] * y[i]);
  return 0;
}

static int naive_loss_forward_backward(void* kernels, dpcheck_loss_t loss, const float* out, const void* target,
                                       float* dout, double* loss_value, int64_t rows, int64_t cols, float scale,
                                       void* stream) {
  (void)kernels;
  (void)stream;
  double total = 0.0;
  if (loss == DPCHECK_MSE) {
    const float* y = (const float*)target;
    const float c = (float)(2.0 * scale / ((double)rows * (double)cols));
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float diff = out[i] - y[i];
      dout[i] = diff * c;
      total += (double)diff * (double)diff;
    }
    *loss_value = total / ((double)rows * (double)cols);
    return 0;
  }
  const int64_t* labels = (const int64_t*)target;
  const float c = (float)(scale / (double)rows);
  for (int64_t i = 0; i < rows; ++i) {
    const float* z = out + i * cols;
    float* d = dout + i * cols;
    float m = z[0];
    for (int64_t j = 1; j < cols; ++j) m = z[j] > m ? z[j] : m;
    float sum = 0.0f;
    for (int64_t j = 0; j < cols; ++j) {
      d[j] = expf(z[j] - m);
      sum += d[j];
    }
    for (int64_t j = 0; j < cols; ++j) d[j] = (d[j] / sum - (j == labels[i] ? 1.0f : 0.0f)) * c;
    total += log((double)sum) + (double)m - (double)z[labels[i]];
  }
  *loss_value = total / (double)rows;
  return 0;
}

static int naive_sgd_step(void* kernels, float* p, const float* g, int64_t n, double lr, void* stream) {
  (void)kernels;
  (void)stream;
  const float neg_lr = (float)-lr;
  for (int64_t i = 0; i < n; ++i) p[i] += neg_lr * g[i];
  return 0;
}

static int naive_momentum_step(void* kernels, float* p, const float* g, float* buf, int64_t n, double lr,
                               double momentum, int64_t step, void* stream) {
  (void)kernels;
  (void)stream;
  const float neg_lr = (float)-lr, mu = (float)momentum;
  for (int64_t i = 0; i < n; ++i) {
    buf[i] = step == 1 ? g[i] : mu * buf[i] + g[i];
    p[i] += neg_lr * buf[i];
  }
  return 0;
}

static int naive_adam_step(void* kernels, float* p, const float* g, float* m, float* v, int64_t n, double lr,
                           double beta1, double beta2, double eps, int64_t step, void* stream) {
  (void)kernels;
  (void)stream;
  const double bias_correction1 = 1.0 - pow(beta1, (double)step);
  const double bias_correction2 = 1.0 - pow(beta2, (double)step);
  const float step_size = (float)(lr / bias_correction1), bc2_sqrt = (float)sqrt(bias_correction2);
  const float w1 = (float)(1.0 - beta1), b2 = (float)beta2, w2 = (float)(1.0 - beta2), e = (float)eps;
  for (int64_t i = 0; i < n; ++i) {
    m[i] += w1 * (g[i] - m[i]);
    v[i] = b2 * v[i] + w2 * g[i] * g[i];
    p[i] -= step_size * (m[i] / (sqrtf(v[i]) / bc2_sqrt + e));
  }
  return 0;
}

static const char* naive_last_error(void* kernels) {
  (void)kernels;
  return "no error";
}

static const dpcheck_kernel_plugin_t naive = {
    DPCHECK_PLUGIN_ABI,
    "naive",
    DPCHECK_HOST,
    NULL, /* init: no state */
    naive_linear_forward,
    naive_linear_backward,
    naive_activation_forward,
    naive_activation_backward,
    naive_loss_forward_backward,
    naive_sgd_step,
    naive_momentum_step,
    naive_adam_step,
    naive_last_error,
    NULL,          /* finalize: nothing to release */
    "example 1.0", /* version (plugin ABI 3), shown in dpcheck's reports */
};

const dpcheck_kernel_plugin_t* dpcheck_kernel_plugin(void) { return &naive; }
