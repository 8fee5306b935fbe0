/* dpcheck's linear layer on oneDNN's matmul primitive (the C API of oneDNN 2.x, dnnl.h), as a kernel
 * plugin (include/dpcheck/plugin.h). Every other entry is NULL, so dpcheck's own kernels run for
 * activations, losses and optimizer steps.
 *
 * Each handle (one per rank) has its own CPU engine, stream and scratchpad, and a cache of matmul
 * primitives keyed by operation and shape: creating a primitive generates code and takes far longer
 * than running it at dpcheck's sizes. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dpcheck/plugin.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <oneapi/dnnl/dnnl_version.h>

#if DNNL_VERSION_MAJOR != 2
#error "this plugin uses oneDNN 2.x's C API (operation descriptors), which oneDNN 3.0 replaced"
#endif

/* The three matmuls of a linear layer, as C[m x n] (+)= A[m x k] B[k x n]. */
typedef enum {
  OP_FORWARD,     /* y  = x w^T + b:  m = rows, n = out, k = in */
  OP_WEIGHT_GRAD, /* dw = dy^T x:     m = out,  n = in,  k = rows (accumulating: dw += dy^T x) */
  OP_INPUT_GRAD   /* dx = dy w:       m = rows, n = in,  k = out */
} matmul_op;

typedef struct {
  matmul_op op;
  int accumulate;
  int64_t m, n, k;
  uint64_t last_used; /* for evicting the least recently used entry */
  dnnl_primitive_t primitive;
  /* Memory objects made once with the primitive's descriptors; each call points them at its buffers. */
  dnnl_memory_t src, weights, bias, dst, scratchpad;
  size_t scratchpad_bytes;
} cached_matmul;

/* Enough for a model's layers (up to four matmuls each: forward, dx, dw written and dw accumulated)
   without keeping code for every shape `dpcheck conform` draws. */
#define CACHE_CAPACITY 48

typedef struct {
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  cached_matmul cache[CACHE_CAPACITY];
  int cached;
  uint64_t clock;
  /* The handle's scratchpad, shared by its primitives (a handle runs one at a time): with the library's
     scratchpad, primitives running concurrently on several ranks' threads could share one. */
  void* scratchpad;
  size_t scratchpad_bytes;
  double* sums; /* db's column sums, in double so that db is rounded once */
  int64_t sums_capacity;
  char error[512];
} onednn_kernels;

static char library_version[160];
/* Why init failed, for the handle it never made. */
static char init_error[256];

static int fail(onednn_kernels* k, const char* message) {
  snprintf(k->error, sizeof k->error, "%s", message);
  return 1;
}

static int fail_status(onednn_kernels* k, const char* what, dnnl_status_t status) {
  snprintf(k->error, sizeof k->error, "%s: oneDNN says %s", what, dnnl_status2str(status));
  return 1;
}

static void release(cached_matmul* e) {
  if (e->primitive) dnnl_primitive_destroy(e->primitive);
  dnnl_memory_t* memories[] = {&e->src, &e->weights, &e->bias, &e->dst, &e->scratchpad};
  for (size_t i = 0; i < sizeof memories / sizeof memories[0]; ++i)
    if (*memories[i]) dnnl_memory_destroy(*memories[i]);
  memset(e, 0, sizeof *e);
}

/* A 2-D f32 memory descriptor over a row-major buffer, or its transpose when `transposed`: rows x cols
   of a buffer whose rows are `ld` floats apart, read as stored or with the strides swapped. */
static dnnl_status_t matrix_desc(dnnl_memory_desc_t* md, int64_t rows, int64_t cols, int64_t ld, int transposed) {
  const dnnl_dims_t dims = {rows, cols};
  dnnl_dims_t strides = {ld, 1};
  if (transposed) {
    strides[0] = 1;
    strides[1] = ld;
  }
  return dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_f32, strides);
}

#define TRY(call)                          \
  do {                                     \
    status = (call);                       \
    if (status != dnnl_success) goto done; \
  } while (0)

/* The primitive for (op, accumulate, m, n, k): found in the cache or created into a free (or the least
   recently used) slot. NULL after writing the error. */
static cached_matmul* matmul_for(onednn_kernels* k, matmul_op op, int accumulate, int64_t m, int64_t n, int64_t kk) {
  for (int i = 0; i < k->cached; ++i) {
    cached_matmul* e = &k->cache[i];
    if (e->op == op && e->accumulate == accumulate && e->m == m && e->n == n && e->k == kk) {
      e->last_used = ++k->clock;
      return e;
    }
  }
  /* A slot a failed creation left empty, else a new one, else the least recently used. */
  cached_matmul* e = NULL;
  for (int i = 0; i < k->cached && !e; ++i)
    if (!k->cache[i].primitive) e = &k->cache[i];
  if (!e && k->cached < CACHE_CAPACITY) e = &k->cache[k->cached++];
  if (!e) {
    e = &k->cache[0];
    for (int i = 1; i < CACHE_CAPACITY; ++i)
      if (k->cache[i].last_used < e->last_used) e = &k->cache[i];
  }
  release(e);

  dnnl_status_t status = dnnl_success;
  const char* step = "creating the matmul's attributes";
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t post_ops = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_memory_desc_t src_md, weights_md, bias_md, dst_md;
  const dnnl_memory_desc_t* scratchpad_md = NULL;

  TRY(dnnl_primitive_attr_create(&attr));
  /* Strict f32 whatever ONEDNN_DEFAULT_FPMATH_MODE says: no implicit bf16 or f16 down-conversion. */
  TRY(dnnl_primitive_attr_set_fpmath_mode(attr, dnnl_fpmath_mode_strict));
  TRY(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
  if (accumulate) {
    /* dst = 1 * dst + A B: the sum post-op reads dw, which holds the gradient to add to. */
    TRY(dnnl_post_ops_create(&post_ops));
    TRY(dnnl_post_ops_append_sum(post_ops, 1.0f));
    TRY(dnnl_primitive_attr_set_post_ops(attr, post_ops));
  }

  step = "describing the matrices";
  switch (op) {
    case OP_FORWARD: /* x [rows x in], w^T [in x out] (w is out x in), b [1 x out] */
      TRY(matrix_desc(&src_md, m, kk, kk, 0));
      TRY(matrix_desc(&weights_md, kk, n, kk, 1));
      TRY(matrix_desc(&bias_md, 1, n, n, 0));
      break;
    case OP_WEIGHT_GRAD: /* dy^T [out x rows] (dy is rows x out), x [rows x in] */
      TRY(matrix_desc(&src_md, m, kk, m, 1));
      TRY(matrix_desc(&weights_md, kk, n, n, 0));
      break;
    case OP_INPUT_GRAD: /* dy [rows x out], w [out x in] */
      TRY(matrix_desc(&src_md, m, kk, kk, 0));
      TRY(matrix_desc(&weights_md, kk, n, n, 0));
      break;
  }
  TRY(matrix_desc(&dst_md, m, n, n, 0));

  step = "creating the matmul primitive";
  dnnl_matmul_desc_t desc;
  TRY(dnnl_matmul_desc_init(&desc, &src_md, &weights_md, op == OP_FORWARD ? &bias_md : NULL, &dst_md));
  TRY(dnnl_primitive_desc_create(&pd, &desc, attr, k->engine, NULL));
  TRY(dnnl_primitive_create(&e->primitive, pd));
  scratchpad_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  e->scratchpad_bytes = scratchpad_md ? dnnl_memory_desc_get_size(scratchpad_md) : 0;

  step = "creating the matmul's memory objects";
  TRY(dnnl_memory_create(&e->src, &src_md, k->engine, DNNL_MEMORY_NONE));
  TRY(dnnl_memory_create(&e->weights, &weights_md, k->engine, DNNL_MEMORY_NONE));
  if (op == OP_FORWARD) TRY(dnnl_memory_create(&e->bias, &bias_md, k->engine, DNNL_MEMORY_NONE));
  TRY(dnnl_memory_create(&e->dst, &dst_md, k->engine, DNNL_MEMORY_NONE));
  if (e->scratchpad_bytes) TRY(dnnl_memory_create(&e->scratchpad, scratchpad_md, k->engine, DNNL_MEMORY_NONE));

  e->op = op;
  e->accumulate = accumulate;
  e->m = m;
  e->n = n;
  e->k = kk;
  e->last_used = ++k->clock;

done:
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (post_ops) dnnl_post_ops_destroy(post_ops);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (status == dnnl_success) return e;
  char what[256];
  snprintf(what, sizeof what, "%s (m=%lld n=%lld k=%lld)", step, (long long)m, (long long)n, (long long)kk);
  fail_status(k, what, status);
  release(e);
  return NULL;
}

/* Runs C[m x n] (+)= A B (+ bias) on the given buffers and waits for it. */
static int run_matmul(onednn_kernels* k, matmul_op op, int accumulate, int64_t m, int64_t n, int64_t kk, const float* a,
                      const float* b, const float* bias, float* c) {
  cached_matmul* e = matmul_for(k, op, accumulate, m, n, kk);
  if (!e) return 1;
  if (e->scratchpad_bytes > k->scratchpad_bytes) {
    /* Page-aligned: oneDNN lays its scratch buffers out at aligned offsets from the start. */
    void* p = NULL;
    if (posix_memalign(&p, 4096, e->scratchpad_bytes) != 0) {
      snprintf(k->error, sizeof k->error, "out of memory for a %zu-byte matmul scratchpad", e->scratchpad_bytes);
      return 1;
    }
    free(k->scratchpad);
    k->scratchpad = p;
    k->scratchpad_bytes = e->scratchpad_bytes;
  }
  dnnl_status_t status = dnnl_success;
  /* oneDNN's handles are not const; matmul only reads its sources. */
  TRY(dnnl_memory_set_data_handle(e->src, (void*)a));
  TRY(dnnl_memory_set_data_handle(e->weights, (void*)b));
  TRY(dnnl_memory_set_data_handle(e->dst, c));
  dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, e->src}, {DNNL_ARG_WEIGHTS, e->weights}, {DNNL_ARG_DST, e->dst}};
  int nargs = 3;
  if (e->bias) {
    TRY(dnnl_memory_set_data_handle(e->bias, (void*)bias));
    args[nargs].arg = DNNL_ARG_BIAS;
    args[nargs++].memory = e->bias;
  }
  if (e->scratchpad) {
    TRY(dnnl_memory_set_data_handle(e->scratchpad, k->scratchpad));
    args[nargs].arg = DNNL_ARG_SCRATCHPAD;
    args[nargs++].memory = e->scratchpad;
  }
  TRY(dnnl_primitive_execute(e->primitive, k->stream, nargs, args));
  TRY(dnnl_stream_wait(k->stream));
done:
  if (status == dnnl_success) return 0;
  char what[128];
  snprintf(what, sizeof what, "running the matmul (m=%lld n=%lld k=%lld)", (long long)m, (long long)n, (long long)kk);
  return fail_status(k, what, status);
}

static int check_sizes(onednn_kernels* k, int64_t rows, int64_t in, int64_t out) {
  if (rows < 0 || in < 1 || out < 1) {
    snprintf(k->error, sizeof k->error, "bad sizes rows=%lld in=%lld out=%lld (rows >= 0, in and out >= 1)",
             (long long)rows, (long long)in, (long long)out);
    return 1;
  }
  /* oneDNN takes 64-bit sizes, but 2.6's matmul truncates them to int in places: a size of 2^32
     crashes it (SIGFPE) while it creates the primitive, and 2^32 + 1 gets an implementation that would
     do one row. */
  if (rows > INT32_MAX || in > INT32_MAX || out > INT32_MAX) {
    snprintf(k->error, sizeof k->error, "sizes rows=%lld in=%lld out=%lld: each must be below 2^31 for oneDNN's matmul",
             (long long)rows, (long long)in, (long long)out);
    return 1;
  }
  return 0;
}

static int onednn_init(void** kernels) {
  *kernels = NULL;
  onednn_kernels* k = calloc(1, sizeof *k);
  if (!k) {
    snprintf(init_error, sizeof init_error, "out of memory for the plugin's state");
    return 1;
  }
  dnnl_status_t status = dnnl_engine_create(&k->engine, dnnl_cpu, 0);
  if (status == dnnl_success) status = dnnl_stream_create(&k->stream, k->engine, dnnl_stream_default_flags);
  if (status != dnnl_success) {
    snprintf(init_error, sizeof init_error, "creating oneDNN's CPU engine and stream: %s", dnnl_status2str(status));
    if (k->engine) dnnl_engine_destroy(k->engine);
    free(k);
    return 1;
  }
  *kernels = k;
  return 0;
}

static int onednn_linear_forward(void* kernels, const float* x, const float* w, const float* b, float* y, int64_t rows,
                                 int64_t in, int64_t out, void* stream) {
  onednn_kernels* k = kernels;
  (void)stream;
  if (check_sizes(k, rows, in, out)) return 1;
  if (rows == 0) return 0; /* y is empty */
  if (!x || !w || !b || !y) return fail(k, "linear_forward: a NULL buffer");
  return run_matmul(k, OP_FORWARD, 0, rows, out, in, x, w, b, y);
}

static int onednn_linear_backward(void* kernels, const float* x, const float* w, const float* dy, float* dx, float* dw,
                                  float* db, int64_t rows, int64_t in, int64_t out, int accumulate, void* stream) {
  onednn_kernels* k = kernels;
  (void)stream;
  if (check_sizes(k, rows, in, out)) return 1;
  if (accumulate != 0 && accumulate != 1) return fail(k, "linear_backward: accumulate is neither 0 nor 1");
  if (!dw || !db || (rows > 0 && (!x || !dy || (dx && !w)))) return fail(k, "linear_backward: a NULL buffer");
  if (rows == 0) {
    /* An empty sum (a matmul with k = 0 is not asked of oneDNN): zero, or nothing to add. */
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
  if (run_matmul(k, OP_WEIGHT_GRAD, accumulate, out, in, rows, dy, x, NULL, dw)) return 1;

  /* db is a reduction, not a matmul: summed here row by row (in a fixed order, so run to run the same
     bits), in double, and added to the old db with one rounding. */
  double* sums = k->sums;
  for (int64_t j = 0; j < out; ++j) sums[j] = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = dy + i * out;
    for (int64_t j = 0; j < out; ++j) sums[j] += (double)row[j];
  }
  for (int64_t j = 0; j < out; ++j) db[j] = (float)(accumulate ? (double)db[j] + sums[j] : sums[j]);

  if (dx && run_matmul(k, OP_INPUT_GRAD, 0, rows, in, out, dy, w, NULL, dx)) return 1;
  return 0;
}

static const char* onednn_last_error(void* kernels) {
  const onednn_kernels* k = kernels;
  return k ? k->error : init_error;
}

static void onednn_finalize(void* kernels) {
  onednn_kernels* k = kernels;
  if (!k) return;
  for (int i = 0; i < k->cached; ++i) release(&k->cache[i]);
  dnnl_stream_destroy(k->stream);
  dnnl_engine_destroy(k->engine);
  free(k->scratchpad);
  free(k->sums);
  free(k);
}

static dpcheck_kernel_plugin_t table = {
    DPCHECK_PLUGIN_ABI,
    "onednn",
    DPCHECK_HOST,
    onednn_init,
    onednn_linear_forward,
    onednn_linear_backward,
    NULL, /* activation_forward: the rest are element-wise or small reductions, not matmuls */
    NULL, /* activation_backward */
    NULL, /* loss_forward_backward */
    NULL, /* sgd_step */
    NULL, /* momentum_step */
    NULL, /* adam_step */
    onednn_last_error,
    onednn_finalize,
    NULL, /* version: the library's, set below */
};

const dpcheck_kernel_plugin_t* dpcheck_kernel_plugin(void) {
  /* dpcheck reads the table once, before any rank starts. */
  if (!table.version) {
    const dnnl_version_t* v = dnnl_version();
    const char* runtime = v->cpu_runtime == DNNL_RUNTIME_OMP   ? "OpenMP"
                          : v->cpu_runtime == DNNL_RUNTIME_TBB ? "TBB"
                          : v->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential"
                                                               : "threadpool";
    const char* isa = dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());
    if (strncmp(isa, "cpu_isa_", 8) == 0) isa += 8;
    snprintf(library_version, sizeof library_version, "oneDNN %d.%d.%d (%s threads, %s)", v->major, v->minor, v->patch,
             runtime, isa);
    table.version = library_version;
  }
  return &table;
}
