/* Plugins that dpcheck must refuse to load (exit 2, one line naming the file): built once per BAD value.
 *   1 wrong-abi     a table from a future dpcheck (abi 99)
 *   2 null-entry    no allreduce
 *   3 null-table    the function returns NULL
 *   4 unknown-dtype   its dtypes mask holds a bit that is no dtype of the ABI
 *   5 unknown-op      its ops mask holds a bit that is no op of the ABI
 *   6 bad-env         its dpcheck_plugin_env lists something that is not a variable's name
 */
#include <dpcheck/plugin.h>
#include <stddef.h>

static int ok_init(const dpcheck_bootstrap_t* b, void** c) {
  (void)b;
  *c = NULL;
  return 0;
}
#if BAD != 2
static int ok_allreduce(void* c, void* b, size_t n, dpcheck_dtype_t t, dpcheck_op_t o, void* s) {
  (void)c;
  (void)b;
  (void)n;
  (void)t;
  (void)o;
  (void)s;
  return 0;
}
#endif
static int ok_broadcast(void* c, void* b, size_t n, dpcheck_dtype_t t, int r, void* s) {
  (void)c;
  (void)b;
  (void)n;
  (void)t;
  (void)r;
  (void)s;
  return 0;
}
static int ok_allgather(void* c, const void* a, void* b, size_t n, dpcheck_dtype_t t, void* s) {
  (void)c;
  (void)a;
  (void)b;
  (void)n;
  (void)t;
  (void)s;
  return 0;
}
static int ok_barrier(void* c) {
  (void)c;
  return 0;
}
static const char* ok_error(void* c) {
  (void)c;
  return "";
}
static void ok_finalize(void* c) { (void)c; }

static const dpcheck_comm_plugin_t plugin = {
#if BAD == 1
    99,
#else
    DPCHECK_PLUGIN_ABI,
#endif
    "bad",
    DPCHECK_HOST,
    ok_init,
#if BAD == 2
    NULL,
#else
    ok_allreduce,
#endif
    ok_broadcast,
    ok_allgather,
    ok_barrier,
    ok_error,
    ok_finalize,
    NULL,
#if BAD == 4
    DPCHECK_DTYPE_BIT(DPCHECK_FLOAT32) | (1u << 9),
    0,
#elif BAD == 5
    0,
    DPCHECK_OP_BIT(DPCHECK_SUM) | (1u << 7),
#else
    0,
    0,
#endif
};

#if BAD == 6
const char* const* dpcheck_plugin_env(void) {
  static const char* const names[] = {"BAD_ENV_ALGORITHM", "BAD_ENV_CHUNK=4096", NULL};
  return names;
}
#endif

const dpcheck_comm_plugin_t* dpcheck_comm_plugin(void) {
  /* BAD 3: a table exists but the function does not hand it out. */
  return BAD == 3 ? NULL : &plugin;
}
