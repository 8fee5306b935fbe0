/* Communicator plugins that each break one promise, the way a backend's author might: built from this
 * file once per BREAK value (tests/plugins/comm/CMakeLists.txt), and `dpcheck conform` must fail each
 * with the right check and a minimal case (tests/conform_comm_test.cpp). BREAK 0 is the correct
 * plugin they are built from: every rank gathers every rank's buffer through the bootstrap and reduces
 * them in rank order, so every rank computes the same bits.
 *
 *   1 vector-tail     allreduce works in blocks of 4 elements; the remainder is left unreduced once
 *                     the buffer holds a block (the scalar path covers only buffers of under 4)
 *   2 narrow-float64  float64 sums are accumulated in float (a kernel written for float32 reused)
 *   3 int64-avg       avg divides floats by the world size but forgets int64
 *   4 block-order     allgather puts rank r's block at ((r + 1) mod N), an off-by-one in the ring index
 *   5 broadcast-root  broadcast always sends rank 0's buffer, whatever the root
 *   6 large-message   above 65536 elements a "pipelined" path reduces in slices of 65536 and skips
 *                     the last, partial slice
 *   7 own-order       each rank starts its sum at its own buffer: exact inputs agree, ranks don't
 *   8 run-to-run      the order alternates with a per-communicator call counter (same on every rank)
 *   9 hang            waits for its peers in a loop that ignores the bootstrap's failure
 *  12 power-of-two    written for worlds of 2^k ranks: the ranks past the largest power of two are left
 *                     out of the sum (right for N = 1, 2, 4, 8; wrong for 3, 5, ...)
 *  14 sequence-wrap   an 8-bit call counter picks a slot; when it wraps, call 257 finds the slot of
 *                     call 1 still marked done and returns without reducing
 *  15 half-as-bfloat16  float16 buffers are widened and narrowed as bfloat16 (a kernel written for
 *                     bfloat16 reused): the patterns survive a copy, but their sums are wrong
 *  18 float64-unwired  declares float64 (copied from a table that had it) but its all-reduce returns
 *                     an error for it, "not implemented": a row fails with the plugin's own error
 *  19 some-ranks-turn  on every other call each rank starts its sum at its own buffer (the "odd" half of
 *                     a double buffer, written for a copy saved): rank 0's bits never change, the
 *                     others' change from call to call, as some ranks' do in MPICH's recursive exchange
 *                     at k = 3. Ranks that see a new result and ranks that do not must still make the
 *                     same calls, or the check hangs where it should fail
 *
 * Built with ORDER_ENV, the correct plugin takes its order of summation from DPCHECK_TEST_COMM_ORDER,
 * which it lists through dpcheck_plugin_env (plugin.h, "Environment") as an adapter lists the variable
 * that chooses its algorithm: "own" starts each rank's sum at its own buffer (BREAK 7's order, whose
 * ranks disagree from N = 3 on), anything else, or unset, sums in rank order
 * (tests/backend_record_test.cpp: a bundle records it, and replay names a change).
 *
 * And one that is correct in another way than BREAK 0:
 *  13 avg-by-reciprocal  avg multiplies every input by a rounded 1/N before the sum, as NCCL's ncclAvg
 *                     does: within rounding of the mean, not the bits of sum / N
 *
 * And two that are correct but for how they end, for finalize's contract (include/dpcheck/plugin.h,
 * "Finalize"; tests/plugin_comm_test.cpp):
 *  16 closes-early    with the ranks as threads, the last rank reads every peer's "connection" 50 ms
 *                     after the others have returned from an all-reduce, and a rank's finalize closes
 *                     its connection at once: right only if no rank is finalized before every rank's
 *                     last call has returned
 *  17 finalize-barrier  finalize waits for the other ranks at the bootstrap's barrier, and aborts the
 *                     process if the bootstrap is no longer usable
 *
 * And two that fault rather than compute wrong, for the run's own ending (cli tests):
 *  10 crash           dereferences NULL in allreduce
 *  11 stall           rank 1 never returns from an allreduce of more than one element
 *
 * bfloat16 and float16 are summed in float and rounded to the format once, as dpcheck's own backends
 * do. The table declares (plugin ABI 3) every dtype and op, unless built with DECLARED_DTYPES or
 * DECLARED_OPS (masks), or with UNCHANGED_SOURCE (the table as a source written for ABI 2 has it, the
 * new fields left out, so 0: the ABI-1 dtypes and ops). Built with -DPLUGIN_ABI=1 or 2, the table
 * declares that ABI. Whatever it declares is all it takes: a collective of another dtype or op fails,
 * saying so, so that dpcheck passing one is seen.
 */
#include <dpcheck/plugin.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef BREAK
#define BREAK 0
#endif
#ifndef PLUGIN_ABI
#define PLUGIN_ABI DPCHECK_PLUGIN_ABI
#endif
#define ALL_DTYPES (DPCHECK_ABI1_DTYPES | DPCHECK_DTYPE_BIT(DPCHECK_BFLOAT16) | DPCHECK_DTYPE_BIT(DPCHECK_FLOAT16))
#ifndef DECLARED_DTYPES
#define DECLARED_DTYPES ALL_DTYPES
#endif
#ifndef DECLARED_OPS
#define DECLARED_OPS DPCHECK_ABI1_OPS
#endif
/* What the table's ABI and masks give it (plugin.h, "Capabilities"). */
#if PLUGIN_ABI == 1 || defined(UNCHANGED_SOURCE)
#define TAKES_DTYPES DPCHECK_ABI1_DTYPES
#define TAKES_OPS DPCHECK_ABI1_OPS
#elif PLUGIN_ABI == 2
#define TAKES_DTYPES ALL_DTYPES
#define TAKES_OPS DPCHECK_ABI1_OPS
#else
#define TAKES_DTYPES (DECLARED_DTYPES ? DECLARED_DTYPES : DPCHECK_ABI1_DTYPES)
#define TAKES_OPS (DECLARED_OPS ? DECLARED_OPS : DPCHECK_ABI1_OPS)
#endif

typedef struct comm {
  const dpcheck_bootstrap_t* boot;
  int rank, size;
  long calls;
  unsigned char sequence;
  char error[256];
} comm_t;

#if BREAK == 16
/* One "connection" per rank of a world of threads, open from init to finalize. */
static int connection_open[64];
#endif

static size_t dtype_bytes(dpcheck_dtype_t t) {
  return t == DPCHECK_FLOAT32 ? 4 : t == DPCHECK_BFLOAT16 || t == DPCHECK_FLOAT16 ? 2 : 8;
}

static int is_16bit(dpcheck_dtype_t t) { return t == DPCHECK_BFLOAT16 || t == DPCHECK_FLOAT16; }

/* The 16-bit formats (as examples/comm_ring/comm_ring.c): to float exactly, back rounded to nearest,
   ties to even. */
static float float_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t bits_of_float(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float widen(dpcheck_dtype_t t, uint16_t h) {
  uint32_t sign, e, m;
  if (t == DPCHECK_BFLOAT16 || BREAK == 15) return float_of_bits((uint32_t)h << 16);
  sign = (uint32_t)(h & 0x8000u) << 16;
  e = (h >> 10) & 0x1Fu;
  m = h & 0x3FFu;
  if (e == 0) return sign ? -((float)m * 0x1p-24f) : (float)m * 0x1p-24f;
  if (e == 31) return float_of_bits(sign | 0x7F800000u | (m << 13));
  return float_of_bits(sign | ((e + 112u) << 23) | (m << 13));
}

static uint16_t narrow(dpcheck_dtype_t t, float f) {
  const uint32_t x = bits_of_float(f), ax = x & 0x7FFFFFFFu;
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  if (t == DPCHECK_BFLOAT16 || BREAK == 15) {
    if (ax > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040u);
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
  }
  if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7C00u);
  if (ax < 0x38800000u) {
    const float scaled = float_of_bits(ax) * 0x1p24f;
    uint32_t m = (uint32_t)scaled;
    const float rest = scaled - (float)m;
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return (uint16_t)(sign | m);
  }
  return (uint16_t)(sign | ((ax - 0x38000000u + 0xFFFu + (((ax - 0x38000000u) >> 13) & 1u)) >> 13));
}

static int fail(comm_t* c, const char* what) {
  snprintf(c->error, sizeof c->error, "%s: the bootstrap failed on rank %d", what, c->rank);
  return 1;
}

/* Every rank's `bytes` at `send`, rank r's at all + r * bytes (caller frees). */
static int gather_all(comm_t* c, const void* send, size_t bytes, char** all) {
  *all = (char*)malloc(bytes * (size_t)c->size + 1);
  if (!*all) return fail(c, "allocation");
  if (c->boot->allgather(c->boot->ctx, send, *all, bytes) != 0) {
#if BREAK == 9
    for (;;) { /* "the peer is just slow": wait for it forever */
      struct timespec t = {0, 10000000};
      nanosleep(&t, NULL);
    }
#endif
    free(*all);
    *all = NULL;
    return fail(c, "allgather");
  }
  return 0;
}

static double get(const char* p, dpcheck_dtype_t t, size_t i) {
  if (t == DPCHECK_FLOAT32) return ((const float*)p)[i];
  if (is_16bit(t)) return widen(t, ((const uint16_t*)p)[i]);
  return ((const double*)p)[i];
}

/* One element of the reduction over the ranks' buffers, starting at rank `first`. */
static void reduce_element(comm_t* c, const char* all, size_t bytes, size_t i, void* out, dpcheck_dtype_t t,
                           dpcheck_op_t op, int first) {
  int k, ranks = c->size;
#if BREAK == 12
  while (ranks & (ranks - 1)) ranks &= ranks - 1; /* the largest power of two <= size */
#endif
  if (t == DPCHECK_INT64) {
    int64_t acc = ((const int64_t*)(all + (size_t)first * bytes))[i];
    for (k = 1; k < ranks; ++k) {
      const int64_t v = ((const int64_t*)(all + (size_t)((first + k) % c->size) * bytes))[i];
      acc = op == DPCHECK_MIN ? (v < acc ? v : acc) : op == DPCHECK_MAX ? (v > acc ? v : acc) : acc + v;
    }
#if BREAK != 3
    if (op == DPCHECK_AVG) acc /= c->size;
#endif
    ((int64_t*)out)[i] = acc;
  } else if (is_16bit(t)) {
    /* In float, rounded to the format once; min and max keep the winning input's bits. */
    const uint16_t* first_buf = (const uint16_t*)(all + (size_t)first * bytes);
    uint16_t best = first_buf[i];
    float acc = widen(t, best);
#if BREAK == 13
    if (op == DPCHECK_AVG) {
      const float inv = 1.0f / (float)c->size;
      acc = acc * inv;
      for (k = 1; k < c->size; ++k) acc += (float)get(all + (size_t)((first + k) % c->size) * bytes, t, i) * inv;
      ((uint16_t*)out)[i] = narrow(t, acc);
      return;
    }
#endif
    for (k = 1; k < ranks; ++k) {
      const uint16_t h = ((const uint16_t*)(all + (size_t)((first + k) % c->size) * bytes))[i];
      const float v = widen(t, h);
      if (op == DPCHECK_MIN || op == DPCHECK_MAX) {
        if (op == DPCHECK_MIN ? v < widen(t, best) : v > widen(t, best)) best = h;
      } else {
        acc += v;
      }
    }
    if (op == DPCHECK_AVG) acc /= (float)c->size;
    ((uint16_t*)out)[i] = op == DPCHECK_MIN || op == DPCHECK_MAX ? best : narrow(t, acc);
  } else if (t == DPCHECK_FLOAT32 || BREAK == 2) {
    float acc = (float)get(all + (size_t)first * bytes, t, i);
#if BREAK == 13
    if (op == DPCHECK_AVG) {
      const float inv = 1.0f / (float)c->size;
      acc = acc * inv;
      for (k = 1; k < c->size; ++k) acc += (float)get(all + (size_t)((first + k) % c->size) * bytes, t, i) * inv;
      if (t == DPCHECK_FLOAT32) ((float*)out)[i] = acc;
      else ((double*)out)[i] = acc;
      return;
    }
#endif
    for (k = 1; k < ranks; ++k) {
      const float v = (float)get(all + (size_t)((first + k) % c->size) * bytes, t, i);
      acc = op == DPCHECK_MIN ? (v < acc ? v : acc) : op == DPCHECK_MAX ? (v > acc ? v : acc) : acc + v;
    }
    if (op == DPCHECK_AVG) acc /= (float)c->size;
    if (t == DPCHECK_FLOAT32) ((float*)out)[i] = acc;
    else ((double*)out)[i] = acc;
  } else {
    double acc = get(all + (size_t)first * bytes, t, i);
#if BREAK == 13
    if (op == DPCHECK_AVG) {
      const double inv = 1.0 / (double)c->size;
      acc = acc * inv;
      for (k = 1; k < c->size; ++k) acc += get(all + (size_t)((first + k) % c->size) * bytes, t, i) * inv;
      ((double*)out)[i] = acc;
      return;
    }
#endif
    for (k = 1; k < ranks; ++k) {
      const double v = get(all + (size_t)((first + k) % c->size) * bytes, t, i);
      acc = op == DPCHECK_MIN ? (v < acc ? v : acc) : op == DPCHECK_MAX ? (v > acc ? v : acc) : acc + v;
    }
    if (op == DPCHECK_AVG) acc /= (double)c->size;
    ((double*)out)[i] = acc;
  }
}

static int c_init(const dpcheck_bootstrap_t* boot, void** out) {
  comm_t* c = (comm_t*)calloc(1, sizeof *c);
  if (!c) return 1;
  c->boot = boot;
  c->rank = boot->rank;
  c->size = boot->size;
#if BREAK == 16
  if (boot->same_process && c->size <= 64) __atomic_store_n(&connection_open[c->rank], 1, __ATOMIC_RELEASE);
#endif
  *out = c;
  return 0;
}

/* A dtype or op the table does not declare is never passed: if it were, the call fails saying so. */
static int newer_dtype(comm_t* c, const char* call, dpcheck_dtype_t t) {
  if (TAKES_DTYPES & DPCHECK_DTYPE_BIT(t)) return 0;
  snprintf(c->error, sizeof c->error, "%s: dtype %d is not among the dtypes this table (plugin ABI %d) declares", call,
           (int)t, PLUGIN_ABI);
  return 1;
}

static int undeclared_op(comm_t* c, dpcheck_op_t op) {
  if (TAKES_OPS & DPCHECK_OP_BIT(op)) return 0;
  snprintf(c->error, sizeof c->error, "allreduce: op %d is not among the ops this table declares", (int)op);
  return 1;
}

#if BREAK == 16
static int read_every_peer(comm_t* c) {
  int r;
  if (!c->boot->same_process || c->rank != c->size - 1 || c->size > 64) return 0;
  {
    struct timespec t = {0, 50000000};
    nanosleep(&t, NULL);
  }
  for (r = 0; r < c->size; ++r)
    if (r != c->rank && !__atomic_load_n(&connection_open[r], __ATOMIC_ACQUIRE)) {
      snprintf(c->error, sizeof c->error, "allreduce: connection closed by peer (rank %d) before its message was read",
               r);
      return 1;
    }
  return 0;
}
#endif

#ifdef ORDER_ENV
const char* const* dpcheck_plugin_env(void) {
  static const char* const names[] = {"DPCHECK_TEST_COMM_ORDER", NULL};
  return names;
}

static int own_order(void) {
  const char* order = getenv("DPCHECK_TEST_COMM_ORDER");
  return order && strcmp(order, "own") == 0;
}
#endif

static int c_allreduce(void* handle, void* buf, size_t count, dpcheck_dtype_t t, dpcheck_op_t op, void* stream) {
  comm_t* c = (comm_t*)handle;
  const size_t bytes = count * dtype_bytes(t);
  size_t i, end = count;
  int first = 0;
  char* all;
  (void)stream;
  if (newer_dtype(c, "allreduce", t) || undeclared_op(c, op)) return 1;
#if BREAK == 18
  if (t == DPCHECK_FLOAT64) {
    snprintf(c->error, sizeof c->error, "allreduce: float64 is not implemented");
    return 1;
  }
#endif
#if BREAK == 10
  if (count > 0) *(volatile int*)stream = 1;
#elif BREAK == 11
  if (count > 1 && c->rank == 1)
    for (;;) {
      struct timespec t = {0, 10000000};
      nanosleep(&t, NULL);
    }
#endif
#if BREAK == 14
  if (++c->sequence == 1 && c->calls > 0) { /* the counter wrapped: "already done" */
    ++c->calls;
    return 0;
  }
#endif
  if (gather_all(c, buf, bytes, &all)) return 1;
#if BREAK == 1
  if (count >= 4) end = count / 4 * 4;
#elif BREAK == 6
  if (count > 65536) end = count / 65536 * 65536;
#elif BREAK == 7
  first = c->rank;
#elif BREAK == 8
  first = (int)(c->calls % 2) * (c->size - 1);
#elif BREAK == 19
  if (c->calls % 2) first = c->rank;
#endif
#ifdef ORDER_ENV
  if (own_order()) first = c->rank;
#endif
  ++c->calls;
  for (i = 0; i < end; ++i) reduce_element(c, all, bytes, i, buf, t, op, first);
  free(all);
#if BREAK == 16
  if (count > 0) return read_every_peer(c);
#endif
  return 0;
}

static int c_broadcast(void* handle, void* buf, size_t count, dpcheck_dtype_t t, int root, void* stream) {
  comm_t* c = (comm_t*)handle;
  const size_t bytes = count * dtype_bytes(t);
  char* all;
  (void)stream;
  if (newer_dtype(c, "broadcast", t)) return 1;
#if BREAK == 5
  root = 0;
#endif
  if (gather_all(c, buf, bytes, &all)) return 1;
  memcpy(buf, all + (size_t)root * bytes, bytes);
  free(all);
  return 0;
}

static int c_allgather(void* handle, const void* send, void* recv, size_t count, dpcheck_dtype_t t, void* stream) {
  comm_t* c = (comm_t*)handle;
  const size_t bytes = count * dtype_bytes(t);
  char* all;
  int r;
  (void)stream;
  if (newer_dtype(c, "allgather", t)) return 1;
  if (gather_all(c, send, bytes, &all)) return 1;
  for (r = 0; r < c->size; ++r) {
    const int to = BREAK == 4 ? (r + 1) % c->size : r;
    memcpy((char*)recv + (size_t)to * bytes, all + (size_t)r * bytes, bytes);
  }
  free(all);
  return 0;
}

static int c_barrier(void* handle) {
  comm_t* c = (comm_t*)handle;
  return c->boot->barrier(c->boot->ctx) != 0 ? fail(c, "barrier") : 0;
}

static const char* c_last_error(void* handle) { return handle ? ((comm_t*)handle)->error : "init failed"; }
static void c_finalize(void* handle) {
  comm_t* c = (comm_t*)handle;
#if BREAK == 16
  if (c && c->boot->same_process && c->size <= 64) __atomic_store_n(&connection_open[c->rank], 0, __ATOMIC_RELEASE);
#elif BREAK == 17
  if (c && c->boot->barrier(c->boot->ctx) != 0) {
    fprintf(stderr, "finalize-barrier: the bootstrap's barrier failed inside finalize on rank %d\n", c->rank);
    abort();
  }
#endif
  free(c);
}

static const dpcheck_comm_plugin_t plugin = {
    PLUGIN_ABI,  "broken",        DPCHECK_HOST, c_init,       c_allreduce,
    c_broadcast, c_allgather,     c_barrier,    c_last_error, c_finalize,
#ifndef UNCHANGED_SOURCE
    "test 1",    DECLARED_DTYPES, DECLARED_OPS,
#endif
};

const dpcheck_comm_plugin_t* dpcheck_comm_plugin(void) { return &plugin; }
