#!/usr/bin/env bash
# The CPU engine's per-instruction-set GEMM files (src/gemm/cpu_gemm_kernel.inc) must share no inline or
# template function with the rest of the binary: the linker keeps one copy of each such function, and
# if it kept the AVX-512 file's copy of one the baseline path calls, a CPU without AVX-512 would stop on
# an illegal instruction. Each file renames Eigen's namespace for that; this lists the weak symbols the
# files define outside their own names (std's, dpcheck's) and exits 1 if there are any. ctest runs it
# on the optimized builds (CpuGemm.IsaFilesShareNoInlineFunctions); a debug build also emits std's small
# inline functions out of line, and is not a binary to hand to another machine.
#   bash ci/gemm_symbols.sh LIBDPCHECK_CORE.a
set -euo pipefail
lib=$1
# nm -A: "archive:member:address type name"; V, W (and lower case) are weak.
shared=$(nm -A -C --defined-only "$lib" | grep -E ':cpu_gemm_(avx2|avx512)\.cpp\.o:' |
         grep -E ' [VvWwu] ' | grep -v -E 'EigenIsa(Avx2|Avx512)|DW\.ref\.__gxx_personality_v0' || true)
members=$(ar t "$lib" | grep -c -E '^cpu_gemm_(avx2|avx512)\.cpp\.o$' || true)
if [[ $members -eq 0 ]]; then
  echo "no AVX2 or AVX-512 GEMM file in $lib (not an x86-64 build?)"
  exit 0
fi
if [[ -n $shared ]]; then
  echo "weak symbols the AVX2/AVX-512 GEMM files share with the rest of the binary:"
  echo "$shared"
  exit 1
fi
echo "ok: the $members AVX2/AVX-512 GEMM files define weak symbols under their own names only"
