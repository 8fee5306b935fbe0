// The CPU engine's matrix products (src/cpu/cpu_engine.cpp) and the code paths they run on. Eigen's GEMM is
// compiled once per instruction set (src/gemm/cpu_gemm_baseline.cpp, cpu_gemm_avx2.cpp, cpu_gemm_avx512.cpp,
// each including src/gemm/cpu_gemm_kernel.inc under its own flags and its own name for Eigen's namespace, so
// that the three sets of Eigen's inline templates never meet under one name at link time), and the path
// is picked at run time from what the CPU has: a binary built for any x86-64 uses AVX2 or AVX-512 where
// they are and runs where they are not. A product on several threads is cut into blocks of rows (or of
// columns) of the result, one a thread, each an independent single-threaded GEMM: no thread waits on
// another inside a product, which matters on a machine whose cores other work shares.
//
// A product's bits depend on the path (the vector width and FMA change the roundings) and on the thread
// count (which decides the blocks), never on the run: the same path and thread count give the same
// bits every time, which checkpoint-resume and replay rely on. DPCHECK_CPU_ISA and DPCHECK_CPU_THREADS
// pin both, so that the same binary gives the same bits on another machine that has the path. Every order of summation
// stays within the engine's derived error bound (reference/bound.hpp), FMA included.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dpcheck::cpu {

enum class Isa { baseline, avx2, avx512 };

std::string_view isa_name(Isa isa);  // "baseline", "avx2", "avx512"
// What a path needs of the CPU, in words, for messages: "AVX2 and FMA", ...
std::string_view isa_flags(Isa isa);

// The paths this binary was built with and this CPU can run, baseline first.
std::vector<Isa> available_isas();

// The path the engine takes: DPCHECK_CPU_ISA when set (Error when it names no path or one this binary
// or CPU lacks), else the widest available one.
Isa engine_isa();

// The threads this process may run on (its CPU affinity), at least 1.
int cores();

// The threads the engine's products use on the calling thread: 1 where this rank shares the machine
// with other ranks (ranks as threads of one process, see share_machine_on_this_thread; or one of
// several processes an MPI launcher started on this node); otherwise DPCHECK_CPU_THREADS when set (Error
// when it is not a whole number from 1 to 1024), else cores().
int engine_threads();

// Marks the calling thread as one of several ranks on this machine: its products run on one thread.
// run_local (src/comm/local_comm.hpp) calls it on each rank's thread of a world of two or more.
void share_machine_on_this_thread();

// c = (accumulate ? c : 0) + op(a) * op(b), float32, every matrix dense and row-major: c is m x n, a is
// m x k (k x m when trans_a), b is k x n (n x k when trans_b). `threads` (1 or more) is the most blocks
// the product is cut into; a product too small to gain from threads stays whole. One multi-threaded
// product runs at a time in a process (they share one set of workers); single-threaded ones run freely.
void gemm(Isa isa, int threads, bool trans_a, bool trans_b, std::ptrdiff_t m, std::ptrdiff_t n, std::ptrdiff_t k,
          const float* a, const float* b, float* c, bool accumulate);

// What the engine's path is, for reports: "avx512, 2 threads (DPCHECK_CPU_ISA unset, DPCHECK_CPU_THREADS unset)".
std::string describe_engine_path();

}  // namespace dpcheck::cpu
