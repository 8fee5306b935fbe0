/* The broken kernel plugins of the conform tests: each is the naive kernels
 * (examples/kernels_naive/kernels_naive.c) with one entry replaced by a kernel that breaks one promise
 * the way a real backend does. DPCHECK_BROKEN(NAME, ENTRY, FUNCTION) exports that table. */
#ifndef DPCHECK_TESTS_BROKEN_H
#define DPCHECK_TESTS_BROKEN_H

#include <dpcheck/plugin.h>

/* The naive plugin's export, renamed so that the broken table is the one dpcheck finds. */
#define dpcheck_kernel_plugin naive_kernel_plugin
#include "kernels_naive.c"
#undef dpcheck_kernel_plugin

#define DPCHECK_BROKEN(NAME, ENTRY, FUNCTION)                  \
  const dpcheck_kernel_plugin_t* dpcheck_kernel_plugin(void) { \
    static dpcheck_kernel_plugin_t table;                      \
    table = *naive_kernel_plugin();                            \
    table.name = NAME;                                         \
    table.ENTRY = FUNCTION;                                    \
    return &table;                                             \
  }

#endif
