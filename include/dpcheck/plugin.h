/* dpcheck's plugin ABI: how a user's communicator or kernels join dpcheck, as a shared object that
 * exports one function returning a table of entry points (in the manner of NCCL's net and tuner
 * plugins). C99 and C++; no dpcheck header, no C++ runtime needed.
 *
 *   dpcheck verify  --comm ./libmy_comm.so [--world-size N]     (or under mpirun -np N)
 *   dpcheck conform --comm ./libmy_comm.so                      does it keep the promises?
 *   dpcheck verify  --kernels ./libmy_kernels.so
 *   dpcheck conform --kernels ./libmy_kernels.so
 *
 * Versioning: `abi` is DPCHECK_PLUGIN_ABI of the header the plugin was built with. dpcheck refuses a
 * table whose abi it does not know and says both numbers, and loads every older one: it reads no field
 * that the table's abi does not have. A change raises DPCHECK_PLUGIN_ABI.
 *   1  the tables below up to `finalize`; dtypes float32, float64, int64; ops sum, avg, min, max.
 *   2  adds the 16-bit floating dtypes DPCHECK_BFLOAT16 and DPCHECK_FLOAT16. An abi-2 communicator
 *      takes every dtype and op there is in abi 2 (so a plugin built for float32 and recompiled against
 *      the abi-2 header was handed 16-bit buffers: abi 3 ends that).
 *   3  adds, after `finalize`, `version` and the capability masks `dtypes` and `ops`, and specifies
 *      finalize (below). Support is opt-in: a mask of 0 means the dtypes and ops of abi 1 (float32,
 *      float64, int64; sum, avg, min, max) and nothing newer, so a source written before a dtype or an
 *      op existed, recompiled against a newer header unchanged, is never handed it.
 *
 * Capabilities (abi 3): a communicator lists the dtypes its collectives take in `dtypes`
 * (DPCHECK_DTYPE_BIT(DPCHECK_FLOAT32) | ...) and the all-reduce ops it takes in `ops`
 * (DPCHECK_OP_BIT(DPCHECK_SUM) | ...). dpcheck never passes it anything else: `conform` reports the
 * other rows as "unsupported: the plugin says so" (neither a failure nor a pass), and `train` or
 * `verify` asked for a gradient all-reduce the plugin does not declare (`--allreduce-dtype bf16` on a
 * plugin without DPCHECK_BFLOAT16) refuse before they start, naming the plugin, the dtype and the
 * remedy (exit 2). dpcheck's gradient all-reduce is an avg: a plugin for training declares DPCHECK_AVG
 * at least with float32.
 *
 * Finalize (specified with abi 3, and kept for plugins of every abi): finalize is collective. Every
 * rank that returned from init is finalized once. When the run ends normally, dpcheck first waits for
 * every rank at a barrier of its own transport, so every rank's last call into the plugin has
 * returned before any rank's finalize starts; the bootstrap stays valid until every finalize has
 * returned, and finalize may call it (its barrier, say, when the ranks must close together). Before it
 * closes its connections, a plugin must complete what it started itself: sends that are still in
 * flight after a collective returned, and receives its peers may still be serving. After a failure (a
 * rank's error, a timeout) finalize runs without that barrier, the bootstrap's calls may fail, and a
 * peer may be gone: release the resources without waiting for anyone.
 *
 * Environment (optional, any abi): a plugin whose algorithm an environment variable chooses says
 * which variables do, by exporting beside its table
 *   const char* const* dpcheck_plugin_env(void);
 * which returns their names in a list ended by NULL (letters, digits and '_', not starting with a
 * digit; at most 64). dpcheck looks it up by name, so a plugin without it loads as before, and no table
 * of any abi changes. A repro bundle records each variable's value, or that it was unset; the bundle's
 * replay line sets them again, and `dpcheck replay` warns, naming the variable, when one differs. A
 * list dpcheck cannot read is refused when the plugin loads (exit 2). It is called after the table,
 * any number of times, from any thread.
 *
 * Errors: every entry point that returns int returns 0 on success; after a non-zero return, dpcheck
 * reports the plugin's name, the call, the rank and last_error()'s text, and ends the run.
 *
 * Threads: with ranks as threads of one process (--world-size N), each rank calls init once from its
 * own thread and then only uses its own handle from that thread; entry points run concurrently on
 * different handles. Under mpirun each process is one rank.
 *
 * Timeouts: dpcheck cannot interrupt a call. A call that has not returned within --timeout ends the
 * run (exit 3) with a message naming the plugin, the call and the rank. The bootstrap's own calls give
 * up (non-zero) after three quarters of it, and dpcheck sets DPCHECK_PLUGIN_TIMEOUT_MS in the
 * environment to the whole of it, so that a plugin with a transport of its own can give up in time too:
 * a peer that never arrives should become an error, not a hang.
 */
#ifndef DPCHECK_PLUGIN_H
#define DPCHECK_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* In C++ a function named as a struct tag hides the struct's constructor, which -Wshadow reports; the
   names are the ABI's, so the warning is silenced here for this header alone. */
#if defined(__cplusplus) && defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif

#define DPCHECK_PLUGIN_ABI 3

/* DPCHECK_BFLOAT16 (8 significant bits, float32's exponent range) and DPCHECK_FLOAT16 (IEEE binary16)
   buffers hold the formats' 16-bit patterns, a uint16_t per element; abi 2 and later. */
typedef enum {
  DPCHECK_FLOAT32 = 0,
  DPCHECK_FLOAT64 = 1,
  DPCHECK_INT64 = 2,
  DPCHECK_BFLOAT16 = 3,
  DPCHECK_FLOAT16 = 4
} dpcheck_dtype_t;
typedef enum { DPCHECK_SUM = 0, DPCHECK_AVG = 1, DPCHECK_MIN = 2, DPCHECK_MAX = 3 } dpcheck_op_t;
typedef enum { DPCHECK_HOST = 0, DPCHECK_CUDA = 1 } dpcheck_memory_t;

/* The capability masks of a communicator's table (abi 3): a bit per dtype, a bit per all-reduce op. */
#define DPCHECK_DTYPE_BIT(dtype) (1u << (unsigned)(dtype))
#define DPCHECK_OP_BIT(op) (1u << (unsigned)(op))
/* What a mask of 0 means: abi 1's dtypes and ops, never one added later. */
#define DPCHECK_ABI1_DTYPES \
  (DPCHECK_DTYPE_BIT(DPCHECK_FLOAT32) | DPCHECK_DTYPE_BIT(DPCHECK_FLOAT64) | DPCHECK_DTYPE_BIT(DPCHECK_INT64))
#define DPCHECK_ABI1_OPS                                                                     \
  (DPCHECK_OP_BIT(DPCHECK_SUM) | DPCHECK_OP_BIT(DPCHECK_AVG) | DPCHECK_OP_BIT(DPCHECK_MIN) | \
   DPCHECK_OP_BIT(DPCHECK_MAX))

/* ---- communicators ------------------------------------------------------------------------------ */

/* What dpcheck hands a communicator to set itself up: its rank, the world size, and a way to swap
   bytes with every other rank over dpcheck's own host transport (threads or MPI). */
typedef struct dpcheck_bootstrap {
  int rank, size;
  int same_process; /* 1 when the ranks are threads of one process, so pointers may be shared */
  void* ctx;
  /* recv receives size*bytes, rank r's block at r*bytes; 0 on success */
  int (*allgather)(void* ctx, const void* send, void* recv, size_t bytes);
  int (*barrier)(void* ctx);
} dpcheck_bootstrap_t;

/* The collectives work in place or into the caller's buffer, counts in elements, and must leave every
   rank with the same bits. DPCHECK_AVG is the sum divided by the world size. A 16-bit all-reduce may
   round to the format once, after summing in float32 (as dpcheck's own backends do), or at every hop
   (as NCCL's ring does): `conform` checks its sums on inputs that are exact either way, bit for bit,
   and its averages within rounding; min and max must return one of the inputs. For DPCHECK_CUDA plugins
   the buffers are device pointers and `stream` is the engine's cudaStream_t, on which the work must be
   ordered (after what is queued there already); for DPCHECK_HOST plugins `stream` is NULL. The
   bootstrap handed to init stays valid until every rank's finalize has returned. */
typedef struct dpcheck_comm_plugin {
  unsigned abi; /* DPCHECK_PLUGIN_ABI */
  const char* name;
  dpcheck_memory_t memory;
  int (*init)(const dpcheck_bootstrap_t* bootstrap, void** comm); /* 0 on success */
  int (*allreduce)(void* comm, void* buf, size_t count, dpcheck_dtype_t dtype, dpcheck_op_t op, void* stream);
  int (*broadcast)(void* comm, void* buf, size_t count, dpcheck_dtype_t dtype, int root, void* stream);
  /* recv receives size*count elements, rank r's block at r*count */
  int (*allgather)(void* comm, const void* send, void* recv, size_t count, dpcheck_dtype_t dtype, void* stream);
  int (*barrier)(void* comm);
  const char* (*last_error)(void* comm); /* the message for the last non-zero return */
  void (*finalize)(void* comm);          /* collective: see "Finalize" above */

  /* ---- abi 3 and later (a table of an earlier abi ends above; dpcheck does not read on) ---- */
  const char* version; /* the plugin's or its library's version, shown in every report; NULL: none */
  uint32_t dtypes;     /* DPCHECK_DTYPE_BIT()s its collectives take; 0: DPCHECK_ABI1_DTYPES */
  uint32_t ops;        /* DPCHECK_OP_BIT()s its all-reduce takes; 0: DPCHECK_ABI1_OPS */
} dpcheck_comm_plugin_t;

const dpcheck_comm_plugin_t* dpcheck_comm_plugin(void); /* the one exported symbol */

/* ---- kernels ------------------------------------------------------------------------------------ */

typedef enum { DPCHECK_RELU = 0, DPCHECK_TANH = 1 } dpcheck_activation_t;
typedef enum { DPCHECK_MSE = 0, DPCHECK_CROSS_ENTROPY = 1 } dpcheck_loss_t;

/* The engine's operations on row-major float32 buffers: host pointers for DPCHECK_HOST plugins, device
   pointers and the engine's cudaStream_t for DPCHECK_CUDA ones. Every entry but abi, name and memory
   may be NULL: dpcheck's own kernel runs instead. Shapes: x is rows x in, w is out x in, b and db have
   out elements, y and dy are rows x out. An output must be written whole: dpcheck fills outputs with
   NaN before each call in `conform`. */
typedef struct dpcheck_kernel_plugin {
  unsigned abi; /* DPCHECK_PLUGIN_ABI */
  const char* name;
  dpcheck_memory_t memory;
  /* Once per engine (one per rank); NULL: the handle passed to the other entries is NULL. */
  int (*init)(void** kernels);

  /* y = x w^T + b */
  int (*linear_forward)(void* kernels, const float* x, const float* w, const float* b, float* y, int64_t rows,
                        int64_t in, int64_t out, void* stream);
  /* dw (+)= dy^T x, db (+)= column sums of dy: added to what is there when accumulate is 1, written
     when it is 0; dx = dy w, unless dx is NULL (the first layer has no input gradient to pass on). */
  int (*linear_backward)(void* kernels, const float* x, const float* w, const float* dy, float* dx, float* dw,
                         float* db, int64_t rows, int64_t in, int64_t out, int accumulate, void* stream);
  /* y = f(x), element by element */
  int (*activation_forward)(void* kernels, dpcheck_activation_t activation, const float* x, float* y, int64_t n,
                            void* stream);
  /* dx = dy f'(x), where y = f(x) is passed too (tanh' = 1 - y^2; relu' = 1 where x > 0, else 0) */
  int (*activation_backward)(void* kernels, dpcheck_activation_t activation, const float* x, const float* y,
                             const float* dy, float* dx, int64_t n, void* stream);
  /* out is rows x cols. target: rows x cols float32 (mse) or rows int64 labels in [0, cols)
     (cross-entropy). *loss (a host pointer) receives the mean loss: over rows x cols for mse, over rows
     for cross-entropy (softmax then negative log-likelihood, as PyTorch's). dout = scale * d(mean
     loss)/d(out). */
  int (*loss_forward_backward)(void* kernels, dpcheck_loss_t loss, const float* out, const void* target, float* dout,
                               double* loss_value, int64_t rows, int64_t cols, float scale, void* stream);
  /* PyTorch's torch.optim formulas, without weight decay, dampening or Nesterov; step counts from 1.
     sgd:      p -= lr g
     momentum: buf = g on step 1, else momentum buf + g; p -= lr buf
     adam:     m = m + (1 - beta1)(g - m); v = beta2 v + (1 - beta2) g^2;
               p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps) */
  int (*sgd_step)(void* kernels, float* p, const float* g, int64_t n, double lr, void* stream);
  int (*momentum_step)(void* kernels, float* p, const float* g, float* buf, int64_t n, double lr, double momentum,
                       int64_t step, void* stream);
  int (*adam_step)(void* kernels, float* p, const float* g, float* m, float* v, int64_t n, double lr, double beta1,
                   double beta2, double eps, int64_t step, void* stream);

  const char* (*last_error)(void* kernels); /* the message for the last non-zero return */
  void (*finalize)(void* kernels);          /* NULL: nothing to release */

  /* ---- abi 3 and later (a table of an earlier abi ends above; dpcheck does not read on) ---- */
  const char* version; /* the plugin's or its library's version, shown in every report; NULL: none */
} dpcheck_kernel_plugin_t;

const dpcheck_kernel_plugin_t* dpcheck_kernel_plugin(void); /* the one exported symbol */

/* ---- the environment that chooses the algorithm (optional; see "Environment" above) ------------- */

/* e.g. { "MYCOMM_ALGORITHM", "MYCOMM_CHUNK_BYTES", NULL }; a plugin that exports nothing by this name
   is chosen by no variable. */
const char* const* dpcheck_plugin_env(void);

#if defined(__cplusplus) && defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* DPCHECK_PLUGIN_H */
