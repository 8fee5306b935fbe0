/* A ring all-reduce as a dpcheck communicator plugin: the template a backend's author starts from.
 *
 * All-reduce is a reduce-scatter then an all-gather around the ring of ranks: the buffer is cut into
 * `size` chunks; in each of size-1 steps every rank passes one chunk to its right neighbour, which
 * adds it to its own; after them rank r holds the whole sum of chunk r+1, and size-1 more steps pass
 * the finished chunks around. Long buffers go through in slices of at most SLICE_BYTES, so that the
 * scratch memory stays small.
 *
 * The one transport here is pass_left_to_right(): with the ranks as threads of one process it copies
 * straight from the left neighbour's buffer (the buffers' addresses swapped through the bootstrap);
 * with the ranks as processes it swaps the chunks themselves through the bootstrap's allgather. A real
 * backend replaces that function with its own transport (sockets, RDMA, shared memory) and keeps the
 * rest.
 *
 * Every rank ends with the same bits: each chunk is summed once, in one order, by the ranks around the
 * ring, and the finished chunk is copied, not recomputed.
 *
 * bfloat16 and float16 (declared in the table's dtypes) travel as their 16-bit patterns; each hop widens both operands
 * to float, adds them there and rounds the sum back to the format (to nearest, ties to even), as
 * NCCL's ring does. */
#include <dpcheck/plugin.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLICE_BYTES ((size_t)1 << 20)

typedef struct ring {
  const dpcheck_bootstrap_t* boot;
  int rank, size;
  char* scratch; /* the chunk received from the left neighbour, or (processes) every rank's */
  size_t scratch_bytes;
  char error[256];
} ring_t;

static int fail(ring_t* r, const char* what, int step) {
  snprintf(r->error, sizeof r->error, "%s failed at step %d on rank %d (the bootstrap gave up: a peer did not arrive)",
           what, step, r->rank);
  return 1;
}

static int reserve(ring_t* r, size_t bytes) {
  if (bytes <= r->scratch_bytes) return 0;
  char* grown = (char*)realloc(r->scratch, bytes);
  if (!grown) {
    snprintf(r->error, sizeof r->error, "out of memory for %zu bytes of scratch", bytes);
    return 1;
  }
  r->scratch = grown;
  r->scratch_bytes = bytes;
  return 0;
}

/* Every rank passes `send_bytes` from `send` to its right neighbour and receives its left neighbour's
   `recv_bytes` into `recv` (at most `max_bytes` on any rank). */
static int pass_left_to_right(ring_t* r, const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                              size_t max_bytes, int step) {
  const int left = (r->rank + r->size - 1) % r->size;
  if (r->boot->same_process) {
    const void** where = (const void**)malloc(sizeof(void*) * (size_t)r->size);
    if (!where) return fail(r, "allocation", step);
    if (r->boot->allgather(r->boot->ctx, &send, where, sizeof(void*)) != 0) {
      free(where);
      return fail(r, "address swap", step);
    }
    if (recv_bytes) memcpy(recv, where[left], recv_bytes);
    free(where);
    /* The left neighbour may not change what it sent until it has been read. */
    return r->boot->barrier(r->boot->ctx) != 0 ? fail(r, "barrier", step) : 0;
  }
  char* all = (char*)malloc(max_bytes * (size_t)r->size + 1);
  char* mine = (char*)malloc(max_bytes + 1);
  if (!all || !mine) {
    free(all);
    free(mine);
    return fail(r, "allocation", step);
  }
  if (send_bytes) memcpy(mine, send, send_bytes);
  const int rc = r->boot->allgather(r->boot->ctx, mine, all, max_bytes);
  if (rc == 0 && recv_bytes) memcpy(recv, all + (size_t)left * max_bytes, recv_bytes);
  free(all);
  free(mine);
  return rc != 0 ? fail(r, "chunk swap", step) : 0;
}

static size_t dtype_bytes(dpcheck_dtype_t t) {
  switch (t) {
    case DPCHECK_FLOAT32: return 4;
    case DPCHECK_BFLOAT16:
    case DPCHECK_FLOAT16: return 2;
    case DPCHECK_FLOAT64:
    case DPCHECK_INT64: break;
  }
  return 8;
}

/* ---- the 16-bit formats: to float exactly, back rounded to nearest, ties to even ---------------- */

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

static float bf16_to_float(uint16_t h) { return float_of_bits((uint32_t)h << 16); }

static uint16_t float_to_bf16(float f) {
  const uint32_t x = bits_of_float(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x0040u); /* a NaN stays a quiet NaN */
  /* Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even; a carry steps the exponent. */
  return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

static float fp16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
    const float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
  }
  if (e == 31) return float_of_bits(sign | 0x7F800000u | (m << 13)); /* infinity or NaN */
  return float_of_bits(sign | ((e + 112u) << 23) | (m << 13));
}

static uint16_t float_to_fp16(float f) {
  const uint32_t x = bits_of_float(f), ax = x & 0x7FFFFFFFu;
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  if (ax > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu)); /* NaN */
  if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7C00u);                        /* 65536 and up: infinity */
  if (ax < 0x38800000u) { /* below 2^-14: a multiple of 2^-24, rounded to an integer, ties to even */
    const float scaled = float_of_bits(ax) * 0x1p24f;
    uint32_t m = (uint32_t)scaled;
    const float rest = scaled - (float)m;
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return (uint16_t)(sign | m);
  }
  {
    const uint32_t r = ax - 0x38000000u; /* rebias the exponent; a carry past 65504 gives infinity */
    return (uint16_t)(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
}

static float widen(dpcheck_dtype_t t, uint16_t h) {
  return t == DPCHECK_BFLOAT16 ? bf16_to_float(h) : fp16_to_float(h);
}
static uint16_t narrow(dpcheck_dtype_t t, float f) {
  return t == DPCHECK_BFLOAT16 ? float_to_bf16(f) : float_to_fp16(f);
}

/* acc[i] = acc[i] (op) in[i] */
static void combine(void* acc, const void* in, size_t n, dpcheck_dtype_t t, dpcheck_op_t op) {
  size_t i;
  if (t == DPCHECK_BFLOAT16 || t == DPCHECK_FLOAT16) {
    uint16_t* a = (uint16_t*)acc;
    const uint16_t* b = (const uint16_t*)in;
    for (i = 0; i < n; ++i) {
      const float x = widen(t, a[i]), y = widen(t, b[i]);
      if (op == DPCHECK_MIN) a[i] = y < x ? b[i] : a[i]; /* one of the inputs, bit for bit */
      else if (op == DPCHECK_MAX) a[i] = y > x ? b[i] : a[i];
      else a[i] = narrow(t, x + y);
    }
    return;
  }
#define COMBINE(T)                                                  \
  {                                                                 \
    T* a = (T*)acc;                                                 \
    const T* b = (const T*)in;                                      \
    for (i = 0; i < n; ++i) {                                       \
      if (op == DPCHECK_MIN) a[i] = b[i] < a[i] ? b[i] : a[i];      \
      else if (op == DPCHECK_MAX) a[i] = b[i] > a[i] ? b[i] : a[i]; \
      else a[i] = a[i] + b[i];                                      \
    }                                                               \
  }
  if (t == DPCHECK_FLOAT32) COMBINE(float)
  else if (t == DPCHECK_FLOAT64) COMBINE(double)
  else COMBINE(int64_t)
#undef COMBINE
}

static void divide(void* buf, size_t n, dpcheck_dtype_t t, int size) {
  size_t i;
  if (t == DPCHECK_BFLOAT16 || t == DPCHECK_FLOAT16)
    for (i = 0; i < n; ++i) ((uint16_t*)buf)[i] = narrow(t, widen(t, ((uint16_t*)buf)[i]) / (float)size);
  else if (t == DPCHECK_FLOAT32)
    for (i = 0; i < n; ++i) ((float*)buf)[i] /= (float)size;
  else if (t == DPCHECK_FLOAT64)
    for (i = 0; i < n; ++i) ((double*)buf)[i] /= (double)size;
  else
    for (i = 0; i < n; ++i) ((int64_t*)buf)[i] /= size;
}

/* Chunk c of n elements cut into `parts`: its first element and its length. */
static size_t chunk_begin(size_t n, int parts, int c) {
  return n / (size_t)parts * (size_t)c + ((size_t)c < n % (size_t)parts ? (size_t)c : n % (size_t)parts);
}
static size_t chunk_len(size_t n, int parts, int c) { return chunk_begin(n, parts, c + 1) - chunk_begin(n, parts, c); }

static int ring_init(const dpcheck_bootstrap_t* boot, void** comm) {
  ring_t* r = (ring_t*)calloc(1, sizeof *r);
  if (!r) return 1;
  r->boot = boot;
  r->rank = boot->rank;
  r->size = boot->size;
  *comm = r;
  return 0;
}

static int ring_allreduce(void* comm, void* buf, size_t count, dpcheck_dtype_t dtype, dpcheck_op_t op, void* stream) {
  ring_t* r = (ring_t*)comm;
  const size_t es = dtype_bytes(dtype);
  const int n = r->size;
  const size_t slice = SLICE_BYTES / es * (size_t)n;
  size_t done;
  (void)stream;
  if (reserve(r, (slice / (size_t)n + 1) * es)) return 1;
  for (done = 0; done < count; done += slice) {
    char* base = (char*)buf + done * es;
    const size_t len = count - done < slice ? count - done : slice;
    const size_t max_chunk = chunk_len(len, n, 0) * es;
    int s;
    for (s = 0; s < n - 1; ++s) { /* reduce-scatter */
      const int send_c = (r->rank - s + n) % n, recv_c = (r->rank - 1 - s + 2 * n) % n;
      if (pass_left_to_right(r, base + chunk_begin(len, n, send_c) * es, chunk_len(len, n, send_c) * es, r->scratch,
                             chunk_len(len, n, recv_c) * es, max_chunk, s))
        return 1;
      combine(base + chunk_begin(len, n, recv_c) * es, r->scratch, chunk_len(len, n, recv_c), dtype, op);
    }
    if (op == DPCHECK_AVG) {
      const int mine = (r->rank + 1) % n;
      divide(base + chunk_begin(len, n, mine) * es, chunk_len(len, n, mine), dtype, n);
    }
    for (s = 0; s < n - 1; ++s) { /* all-gather */
      const int send_c = (r->rank + 1 - s + n) % n, recv_c = (r->rank - s + n) % n;
      if (pass_left_to_right(r, base + chunk_begin(len, n, send_c) * es, chunk_len(len, n, send_c) * es, r->scratch,
                             chunk_len(len, n, recv_c) * es, max_chunk, n - 1 + s))
        return 1;
      memcpy(base + chunk_begin(len, n, recv_c) * es, r->scratch, chunk_len(len, n, recv_c) * es);
    }
  }
  return 0;
}

static int ring_broadcast(void* comm, void* buf, size_t count, dpcheck_dtype_t dtype, int root, void* stream) {
  ring_t* r = (ring_t*)comm;
  const size_t bytes = count * dtype_bytes(dtype);
  size_t done;
  (void)stream;
  if (root < 0 || root >= r->size) {
    snprintf(r->error, sizeof r->error, "broadcast root %d is not a rank of a world of %d", root, r->size);
    return 1;
  }
  /* Around the ring from the root, a slice at a time: rank root+k receives in step k-1. */
  for (done = 0; done < bytes; done += SLICE_BYTES) {
    const size_t len = bytes - done < SLICE_BYTES ? bytes - done : SLICE_BYTES;
    int s;
    if (reserve(r, len)) return 1;
    for (s = 0; s < r->size - 1; ++s) {
      if (pass_left_to_right(r, (char*)buf + done, len, r->scratch, len, len, s)) return 1;
      if (r->rank == (root + s + 1) % r->size) memcpy((char*)buf + done, r->scratch, len);
    }
  }
  return 0;
}

static int ring_allgather(void* comm, const void* send, void* recv, size_t count, dpcheck_dtype_t dtype, void* stream) {
  ring_t* r = (ring_t*)comm;
  const size_t bytes = count * dtype_bytes(dtype);
  int s;
  (void)stream;
  /* Block r goes to its place, then each block travels the ring. */
  memmove((char*)recv + (size_t)r->rank * bytes, send, bytes);
  if (reserve(r, bytes + 1)) return 1;
  for (s = 0; s < r->size - 1; ++s) {
    const int send_b = (r->rank - s + r->size) % r->size, recv_b = (r->rank - 1 - s + 2 * r->size) % r->size;
    if (pass_left_to_right(r, (char*)recv + (size_t)send_b * bytes, bytes, r->scratch, bytes, bytes, s)) return 1;
    memcpy((char*)recv + (size_t)recv_b * bytes, r->scratch, bytes);
  }
  return 0;
}

static int ring_barrier(void* comm) {
  ring_t* r = (ring_t*)comm;
  return r->boot->barrier(r->boot->ctx) != 0 ? fail(r, "barrier", 0) : 0;
}

static const char* ring_last_error(void* comm) { return comm ? ((ring_t*)comm)->error : "init failed"; }

/* dpcheck calls finalize on every rank once every rank has returned from its last collective
   (plugin.h, "Finalize"), and this transport keeps nothing in flight: there is nothing to wait for. */
static void ring_finalize(void* comm) {
  ring_t* r = (ring_t*)comm;
  if (!r) return;
  free(r->scratch);
  free(r);
}

/* Plugin ABI 3 asks a plugin to say what it takes: every dtype of the ABI, every op. A plugin that
   leaves the masks 0 is handed float32, float64 and int64 only. */
static const dpcheck_comm_plugin_t ring_plugin = {
    DPCHECK_PLUGIN_ABI, "ring",
    DPCHECK_HOST,       ring_init,
    ring_allreduce,     ring_broadcast,
    ring_allgather,     ring_barrier,
    ring_last_error,    ring_finalize,
    "example 1.0",      DPCHECK_ABI1_DTYPES | DPCHECK_DTYPE_BIT(DPCHECK_BFLOAT16) | DPCHECK_DTYPE_BIT(DPCHECK_FLOAT16),
    DPCHECK_ABI1_OPS,
};

const dpcheck_comm_plugin_t* dpcheck_comm_plugin(void) { return &ring_plugin; }
