/* NCCL as a dpcheck communicator plugin (DPCHECK_CUDA: device buffers, the engine's stream): the
 * wrapper a backend team writes around its NCCL build to check it with `dpcheck conform --engine cuda`.
 *
 * init swaps rank 0's ncclUniqueId through the bootstrap and joins the communicator on the device the
 * engine's rank already runs on. NCCL wants one GPU per rank, so the world size is at most the number
 * of GPUs the ranks' engines use.
 *
 * A collective whose peer never arrives would spin on the GPU for ever. So each call waits for its own
 * work on the stream, polling for an asynchronous NCCL error, and after DPCHECK_PLUGIN_TIMEOUT_MS (set
 * by dpcheck: the run's --timeout) three quarters of it aborts the communicator and fails: an error,
 * not a hang. Waiting serialises the call with the engine's stream, which a checker can afford. */
#include <dpcheck/plugin.h>

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct nccl_plugin {
  const dpcheck_bootstrap_t* boot;
  ncclComm_t comm;
  int aborted;
  long timeout_ms;
  char error[512];
} nccl_plugin_t;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int nccl_failed(nccl_plugin_t* p, const char* call, ncclResult_t r) {
  snprintf(p->error, sizeof p->error, "%s: %s (%s)", call, ncclGetErrorString(r), ncclGetLastError(p->comm));
  return 1;
}

static int cuda_failed(nccl_plugin_t* p, const char* call, cudaError_t e) {
  snprintf(p->error, sizeof p->error, "%s: %s", call, cudaGetErrorString(e));
  return 1;
}

/* Waits for the call's work on `stream`; aborts the communicator when a peer has not come in time. */
static int wait_for(nccl_plugin_t* p, const char* call, ncclResult_t enqueued, cudaStream_t stream) {
  const double deadline = now_ms() + (double)p->timeout_ms * 0.75;
  if (enqueued != ncclSuccess) return nccl_failed(p, call, enqueued);
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return 0;
    if (q != cudaErrorNotReady) return cuda_failed(p, call, q);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(p->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) return nccl_failed(p, call, async);
    if (now_ms() > deadline) {
      ncclCommAbort(p->comm);
      p->aborted = 1;
      snprintf(p->error, sizeof p->error,
               "%s: not finished after %ld ms (a peer did not arrive?); the communicator was aborted", call,
               p->timeout_ms * 3 / 4);
      return 1;
    }
    struct timespec t = {0, 200000};
    nanosleep(&t, NULL);
  }
}

/* The 16-bit formats (plugin ABI 2) are NCCL's own; its ring rounds their sums to the format at every
   hop, which dpcheck's checks allow. */
static int to_nccl_type(dpcheck_dtype_t t, ncclDataType_t* out) {
  switch (t) {
    case DPCHECK_FLOAT32: *out = ncclFloat32; return 0;
    case DPCHECK_FLOAT64: *out = ncclFloat64; return 0;
    case DPCHECK_INT64: *out = ncclInt64; return 0;
    case DPCHECK_BFLOAT16: *out = ncclBfloat16; return 0;
    case DPCHECK_FLOAT16: *out = ncclFloat16; return 0;
  }
  return 1;
}

static int to_nccl_op(dpcheck_op_t op, ncclRedOp_t* out) {
  switch (op) {
    case DPCHECK_SUM: *out = ncclSum; return 0;
    case DPCHECK_AVG: *out = ncclAvg; return 0;
    case DPCHECK_MIN: *out = ncclMin; return 0;
    case DPCHECK_MAX: *out = ncclMax; return 0;
  }
  return 1;
}

static int p_init(const dpcheck_bootstrap_t* boot, void** out) {
  nccl_plugin_t* p = (nccl_plugin_t*)calloc(1, sizeof *p);
  ncclUniqueId id, *all;
  ncclResult_t r;
  const char* timeout = getenv("DPCHECK_PLUGIN_TIMEOUT_MS");
  if (!p) return 1;
  *out = p;
  p->boot = boot;
  p->timeout_ms = timeout ? atol(timeout) : 60000;
  if (p->timeout_ms <= 0) p->timeout_ms = 60000;
  memset(&id, 0, sizeof id);
  if (boot->rank == 0 && (r = ncclGetUniqueId(&id)) != ncclSuccess) return nccl_failed(p, "ncclGetUniqueId", r);
  all = (ncclUniqueId*)malloc(sizeof id * (size_t)boot->size);
  if (!all) return 1;
  if (boot->allgather(boot->ctx, &id, all, sizeof id) != 0) {
    free(all);
    snprintf(p->error, sizeof p->error, "the bootstrap could not swap the NCCL unique id");
    return 1;
  }
  id = all[0];
  free(all);
  /* The device is the one the engine's rank already uses (cudaSetDevice was called for this thread). */
  r = ncclCommInitRank(&p->comm, boot->size, id, boot->rank);
  if (r != ncclSuccess) return nccl_failed(p, "ncclCommInitRank", r);
  return 0;
}

static int p_allreduce(void* h, void* buf, size_t count, dpcheck_dtype_t t, dpcheck_op_t op, void* stream) {
  nccl_plugin_t* p = (nccl_plugin_t*)h;
  ncclDataType_t type;
  ncclRedOp_t nop;
  if (to_nccl_type(t, &type) || to_nccl_op(op, &nop)) {
    snprintf(p->error, sizeof p->error, "allreduce: unknown dtype %d or op %d", (int)t, (int)op);
    return 1;
  }
  return wait_for(p, "ncclAllReduce", ncclAllReduce(buf, buf, count, type, nop, p->comm, (cudaStream_t)stream),
                  (cudaStream_t)stream);
}

static int p_broadcast(void* h, void* buf, size_t count, dpcheck_dtype_t t, int root, void* stream) {
  nccl_plugin_t* p = (nccl_plugin_t*)h;
  ncclDataType_t type;
  if (to_nccl_type(t, &type)) {
    snprintf(p->error, sizeof p->error, "broadcast: unknown dtype %d", (int)t);
    return 1;
  }
  return wait_for(p, "ncclBroadcast", ncclBroadcast(buf, buf, count, type, root, p->comm, (cudaStream_t)stream),
                  (cudaStream_t)stream);
}

static int p_allgather(void* h, const void* send, void* recv, size_t count, dpcheck_dtype_t t, void* stream) {
  nccl_plugin_t* p = (nccl_plugin_t*)h;
  ncclDataType_t type;
  if (to_nccl_type(t, &type)) {
    snprintf(p->error, sizeof p->error, "allgather: unknown dtype %d", (int)t);
    return 1;
  }
  return wait_for(p, "ncclAllGather", ncclAllGather(send, recv, count, type, p->comm, (cudaStream_t)stream),
                  (cudaStream_t)stream);
}

static int p_barrier(void* h) {
  nccl_plugin_t* p = (nccl_plugin_t*)h;
  if (p->boot->barrier(p->boot->ctx) != 0) {
    snprintf(p->error, sizeof p->error, "barrier: the bootstrap failed");
    return 1;
  }
  return 0;
}

static const char* p_last_error(void* h) { return h ? ((nccl_plugin_t*)h)->error : "init failed"; }

static void p_finalize(void* h) {
  nccl_plugin_t* p = (nccl_plugin_t*)h;
  if (!p) return;
  if (p->comm && !p->aborted) ncclCommDestroy(p->comm);
  free(p);
}

/* NCCL reduces every dtype of the ABI, with every op (ncclAvg since NCCL 2.10). The version is the
   library's own, read when dpcheck first asks for the table. */
static dpcheck_comm_plugin_t nccl_plugin = {
    DPCHECK_PLUGIN_ABI,
    "nccl",
    DPCHECK_CUDA,
    p_init,
    p_allreduce,
    p_broadcast,
    p_allgather,
    p_barrier,
    p_last_error,
    p_finalize,
    NULL,
    DPCHECK_ABI1_DTYPES | DPCHECK_DTYPE_BIT(DPCHECK_BFLOAT16) | DPCHECK_DTYPE_BIT(DPCHECK_FLOAT16),
    DPCHECK_ABI1_OPS,
};

static char nccl_version[32];

const dpcheck_comm_plugin_t* dpcheck_comm_plugin(void) {
  int v = 0;
  if (!nccl_plugin.version && ncclGetVersion(&v) == ncclSuccess) {
    /* NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9 */
    snprintf(nccl_version, sizeof nccl_version, "NCCL %d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    nccl_plugin.version = nccl_version;
  }
  return &nccl_plugin;
}

/* The variables that choose NCCL's algorithm and protocol (include/dpcheck/plugin.h, "Environment"):
   a repro bundle records them, and a replay under other values is warned of, by name. */
const char* const* dpcheck_plugin_env(void) {
  static const char* const names[] = {"NCCL_ALGO", "NCCL_PROTO", NULL};
  return names;
}
