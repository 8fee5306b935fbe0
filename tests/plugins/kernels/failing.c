/* linear_forward that fails, as a backend does when it runs out of something: a non-zero return and a
 * message from last_error, which dpcheck must report with the plugin's name, the call and the rank. */
#include "broken.h"

static int failing_linear_forward(void* kernels, const float* x, const float* w, const float* b, float* y, int64_t rows,
                                  int64_t in, int64_t out, void* stream) {
  (void)kernels, (void)x, (void)w, (void)b, (void)y, (void)rows, (void)in, (void)out, (void)stream;
  return 7;
}

static const char* failing_last_error(void* kernels) {
  (void)kernels;
  return "no workspace left for a 4x4 tile";
}

const dpcheck_kernel_plugin_t* dpcheck_kernel_plugin(void) {
  static dpcheck_kernel_plugin_t table;
  table = *naive_kernel_plugin();
  table.name = "failing";
  table.linear_forward = failing_linear_forward;
  table.last_error = failing_last_error;
  return &table;
}
