/* dpcheck's linear layer on a CBLAS library's sgemm, as a kernel plugin (include/dpcheck/plugin.h).
 * One source, built once per library: with KERNELS_BLAS_OPENBLAS against OpenBLAS (table name
 * "openblas"), with KERNELS_BLAS_BLIS against BLIS's CBLAS layer (table name "blis"). Every other
 * entry is NULL, so dpcheck's own kernels run for activations, losses and optimizer steps. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dpcheck/plugin.h>

#if defined(KERNELS_BLAS_OPENBLAS)
#include <cblas.h>
#define KERNELS_NAME "openblas"
#define LIBRARY_NAME "OpenBLAS"
typedef blasint blas_int;
#elif defined(KERNELS_BLAS_BLIS)
#include <blis.h> /* includes BLIS's cblas.h when BLIS was built with its CBLAS layer */
#if !defined(BLIS_ENABLE_CBLAS)
#error "this BLIS was built without its CBLAS layer (BLIS_ENABLE_CBLAS)"
#endif
#define KERNELS_NAME "blis"
#define LIBRARY_NAME "BLIS"
typedef f77_int blas_int;
#else
#error "define KERNELS_BLAS_OPENBLAS or KERNELS_BLAS_BLIS"
#endif

#define BLAS_INT_MAX (sizeof(blas_int) == 4 ? (int64_t)INT32_MAX : (int64_t)INT64_MAX)

typedef struct {
  double* sums; /* db's column sums, in double so that db is rounded once */
  int64_t sums_capacity;
  char error[256];
} blas_kernels;

/* Set once, by dpcheck_kernel_plugin(): the version shown in dpcheck's reports, and the reason init
   must fail (empty when it need not), which last_error returns for the handle init never made. */
static char library_version[256];
static char library_error[512];
static pthread_once_t library_once = PTHREAD_ONCE_INIT;
static dpcheck_kernel_plugin_t table;

/* The file of the loaded object that defines `function`, or NULL. */
static const char* object_of(void (*function)(void)) {
  void* address;
  Dl_info info;
  memcpy(&address, &function, sizeof address); /* ISO C has no function-to-object pointer cast */
  return dladdr(address, &info) && info.dli_fname ? info.dli_fname : NULL;
}

static void library_setup(void) {
  /* The plugin's cblas_sgemm binds to the first object in the process that defines it: a generic
     libblas or another BLAS loaded before this plugin would quietly run instead of the library named
     here. It must come from the object that also defines the library's own version function. */
#if defined(KERNELS_BLAS_OPENBLAS)
  void (*own)(void) = (void (*)(void))openblas_get_config;
  snprintf(library_version, sizeof library_version, "%s", openblas_get_config());
#else
  void (*own)(void) = (void (*)(void))bli_info_get_version_str;
  snprintf(library_version, sizeof library_version, "BLIS %s, %s kernels%s", bli_info_get_version_str(),
           bli_arch_string(bli_arch_query_id()),
           bli_info_get_enable_openmp()     ? ", OpenMP"
           : bli_info_get_enable_pthreads() ? ", pthreads"
                                            : "");
#endif
  const char* library = object_of(own);
  const char* sgemm = object_of((void (*)(void))cblas_sgemm);
  if (!library || !sgemm)
    snprintf(library_error, sizeof library_error, "cannot tell which object defines cblas_sgemm (dladdr failed)");
  else if (strcmp(library, sgemm) != 0)
    snprintf(library_error, sizeof library_error,
             "cblas_sgemm resolves to %s, not to %s (" LIBRARY_NAME
             "): another BLAS in the process "
             "defines it first",
             sgemm, library);
  table.version = library_version;
}

static int fail(blas_kernels* k, const char* message) {
  snprintf(k->error, sizeof k->error, "%s", message);
  return 1;
}

/* The sizes every call must have; 0 when they are usable, after writing the reason otherwise. */
static int check_sizes(blas_kernels* k, int64_t rows, int64_t in, int64_t out) {
  char message[160];
  if (rows < 0 || in < 1 || out < 1) {
    snprintf(message, sizeof message, "bad sizes rows=%lld in=%lld out=%lld (rows >= 0, in and out >= 1)",
             (long long)rows, (long long)in, (long long)out);
    return fail(k, message);
  }
  if (rows > BLAS_INT_MAX || in > BLAS_INT_MAX || out > BLAS_INT_MAX) {
    snprintf(message, sizeof message,
             "sizes rows=%lld in=%lld out=%lld exceed the %d-bit integers of " LIBRARY_NAME "'s CBLAS interface",
             (long long)rows, (long long)in, (long long)out, (int)(8 * sizeof(blas_int)));
    return fail(k, message);
  }
  return 0;
}

static int blas_init(void** kernels) {
  *kernels = NULL;
  if (library_error[0]) return 1;
  blas_kernels* k = calloc(1, sizeof *k);
  if (!k) {
    snprintf(library_error, sizeof library_error, "out of memory for the plugin's state");
    return 1;
  }
  *kernels = k;
  return 0;
}

static int blas_linear_forward(void* kernels, const float* x, const float* w, const float* b, float* y, int64_t rows,
                               int64_t in, int64_t out, void* stream) {
  blas_kernels* k = kernels;
  (void)stream;
  if (check_sizes(k, rows, in, out)) return 1;
  if (rows == 0) return 0;
  if (!x || !w || !b || !y) return fail(k, "linear_forward: a NULL buffer");
  /* y starts as the bias and sgemm adds x w^T to it (beta = 1), so the NaN dpcheck leaves in y is
     overwritten before the library reads y. */
  for (int64_t i = 0; i < rows; ++i) memcpy(y + i * out, b, (size_t)out * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blas_int)rows, (blas_int)out, (blas_int)in, 1.0f, x,
              (blas_int)in, w, (blas_int)in, 1.0f, y, (blas_int)out);
  return 0;
}

static int blas_linear_backward(void* kernels, const float* x, const float* w, const float* dy, float* dx, float* dw,
                                float* db, int64_t rows, int64_t in, int64_t out, int accumulate, void* stream) {
  blas_kernels* k = kernels;
  (void)stream;
  if (check_sizes(k, rows, in, out)) return 1;
  if (accumulate != 0 && accumulate != 1) return fail(k, "linear_backward: accumulate is neither 0 nor 1");
  if (!dw || !db || (rows > 0 && (!x || !dy || (dx && !w)))) return fail(k, "linear_backward: a NULL buffer");
  if (rows == 0) {
    /* An empty sum, done here rather than as a GEMM with k = 0 (which both libraries get right): x and
       dy may then be NULL, and db needs the case anyway. */
    if (!accumulate) {
      memset(dw, 0, (size_t)(out * in) * sizeof(float));
      memset(db, 0, (size_t)out * sizeof(float));
    }
    return 0;
  }
  if (out > k->sums_capacity) {
    double* sums = realloc(k->sums, (size_t)out * sizeof(double));
    if (!sums) return fail(k, "linear_backward: out of memory for db's column sums");
    k->sums = sums;
    k->sums_capacity = out;
  }

  /* dw (+)= dy^T x: dy is rows x out, read transposed. With beta = 0 the library must not read dw (the
     BLAS contract, and both libraries keep it): the NaN put there before the call must not leak. */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blas_int)out, (blas_int)in, (blas_int)rows, 1.0f, dy,
              (blas_int)out, x, (blas_int)in, accumulate ? 1.0f : 0.0f, dw, (blas_int)in);

  /* db is a reduction, not a GEMM: summed here row by row (in a fixed order, so run to run the same
     bits), in double, and added to the old db with one rounding. */
  double* sums = k->sums;
  for (int64_t j = 0; j < out; ++j) sums[j] = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = dy + i * out;
    for (int64_t j = 0; j < out; ++j) sums[j] += (double)row[j];
  }
  for (int64_t j = 0; j < out; ++j) db[j] = (float)(accumulate ? (double)db[j] + sums[j] : sums[j]);

  if (dx)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blas_int)rows, (blas_int)in, (blas_int)out, 1.0f, dy,
                (blas_int)out, w, (blas_int)in, 0.0f, dx, (blas_int)in);
  return 0;
}

static const char* blas_last_error(void* kernels) {
  const blas_kernels* k = kernels;
  return k ? k->error : library_error;
}

static void blas_finalize(void* kernels) {
  blas_kernels* k = kernels;
  if (!k) return;
  free(k->sums);
  free(k);
}

/* Not const: `version` is the library's own, read at run time. */
static dpcheck_kernel_plugin_t table = {
    DPCHECK_PLUGIN_ABI,
    KERNELS_NAME,
    DPCHECK_HOST,
    blas_init,
    blas_linear_forward,
    blas_linear_backward,
    NULL, /* activation_forward: the rest are element-wise or reductions with no GEMM in them */
    NULL, /* activation_backward */
    NULL, /* loss_forward_backward */
    NULL, /* sgd_step */
    NULL, /* momentum_step */
    NULL, /* adam_step */
    blas_last_error,
    blas_finalize,
    NULL, /* version: the library's, set by library_setup */
};

const dpcheck_kernel_plugin_t* dpcheck_kernel_plugin(void) {
  pthread_once(&library_once, library_setup);
  return &table;
}
