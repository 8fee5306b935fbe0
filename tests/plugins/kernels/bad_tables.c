/* Plugins that cannot be loaded as kernels, one per -D: a table of an ABI dpcheck does not know, no
 * table, no name, device memory (for --engine cpu), a communicator (exported under the other name), and
 * one whose initializer crashes while dlopen loads it, before it has a table or a name. */
#include <signal.h>
#include <stddef.h>

#include <dpcheck/plugin.h>

#if defined(BAD_ABI) || defined(NO_NAME) || defined(DEVICE_MEMORY)
static const dpcheck_kernel_plugin_t table = {
#ifdef BAD_ABI
    99,           "from-the-future",
    DPCHECK_HOST,
#elif defined(NO_NAME)
    DPCHECK_PLUGIN_ABI, NULL, DPCHECK_HOST,
#else
    DPCHECK_PLUGIN_ABI, "device", DPCHECK_CUDA,
#endif
    NULL,         NULL,
    NULL,         NULL,
    NULL,         NULL,
    NULL,         NULL,
    NULL,         NULL,
    NULL};
const dpcheck_kernel_plugin_t* dpcheck_kernel_plugin(void) { return &table; }
#elif defined(NO_TABLE)
const dpcheck_kernel_plugin_t* dpcheck_kernel_plugin(void) { return NULL; }
#elif defined(COMM_ONLY)
const dpcheck_comm_plugin_t* dpcheck_comm_plugin(void) { return NULL; }
#elif defined(CRASH_ON_LOAD)
__attribute__((constructor)) static void crash_on_load(void) { raise(SIGSEGV); }
const dpcheck_kernel_plugin_t* dpcheck_kernel_plugin(void) { return NULL; }
#else
int dpcheck_unrelated(void);
int dpcheck_unrelated(void) { return 0; }
#endif
