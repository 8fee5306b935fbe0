// Which GEMM code path and how many threads the CPU engine's products take (src/gemm/cpu_gemm.hpp), and the
// dispatch to the per-instruction-set files (src/gemm/cpu_gemm_kernel.hpp).
#include "src/gemm/cpu_gemm.hpp"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "src/error.hpp"
#include "src/gemm/cpu_gemm_kernel.hpp"

namespace dpcheck::cpu {

namespace {

thread_local bool shares_machine = false;

using Kernel = void (*)(const kernel::GemmCall&);

// Threads that run the blocks of a product beside the caller, which runs block 0. They live as long as
// the process, so that the memory Eigen's GEMM allocates on each of them is reused rather than fresh
// (slow to touch on these machines). One product at a time; the workers wait on a condition variable,
// not spinning, so that they cost nothing between products. Never destroyed: a rank thread may still be
// in a product while the process exits, and the workers die with the process.
class Workers {
 public:
  void run(int parts, const std::function<void(int)>& part) {
    std::lock_guard one_at_a_time(run_mu_);
    {
      std::unique_lock lk(mu_);
      while (static_cast<int>(threads_.size()) < parts - 1) {
        const int index = static_cast<int>(threads_.size()) + 1;
        threads_.emplace_back([this, index] { work(index); });
      }
      job_ = &part;
      parts_ = parts;
      pending_ = parts - 1;
      error_ = nullptr;
      ++generation_;
    }
    start_.notify_all();
    std::exception_ptr mine;
    try {
      part(0);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock lk(mu_);
    done_.wait(lk, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work(int index) {
    std::uint64_t seen = 0;
    std::unique_lock lk(mu_);
    for (;;) {
      start_.wait(lk, [&] { return generation_ != seen; });
      seen = generation_;
      if (index >= parts_) continue;
      const std::function<void(int)>* job = job_;
      lk.unlock();
      std::exception_ptr failed;
      try {
        (*job)(index);
      } catch (...) {
        failed = std::current_exception();
      }
      lk.lock();
      if (failed && !error_) error_ = failed;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  int parts_ = 0, pending_ = 0;
  std::uint64_t generation_ = 0;
  std::exception_ptr error_;
};

Workers& workers() {
  static Workers* const w = new Workers;
  return *w;
}

Kernel kernel_of(Isa isa) {
  switch (isa) {
    case Isa::baseline: return kernel::gemm_baseline;
#ifdef DPCHECK_GEMM_AVX2
    case Isa::avx2: return kernel::gemm_avx2;
#endif
#ifdef DPCHECK_GEMM_AVX512
    case Isa::avx512: return kernel::gemm_avx512;
#endif
    default: break;
  }
  throw Error("the " + std::string(isa_name(isa)) + " GEMM path is not in this binary");
}

bool cpu_has(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  switch (isa) {
    case Isa::baseline: return true;
    // libgcc's checks include the operating system's support for the wider registers (XCR0).
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma");
  }
  return false;
#else
  return isa == Isa::baseline;
#endif
}

bool built_with(Isa isa) {
  switch (isa) {
    case Isa::baseline: return true;
#ifdef DPCHECK_GEMM_AVX2
    case Isa::avx2: return true;
#endif
#ifdef DPCHECK_GEMM_AVX512
    case Isa::avx512: return true;
#endif
    default: return false;
  }
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

Isa isa_from_env() {
  const char* v = env("DPCHECK_CPU_ISA");
  const std::string_view text = v ? v : "";
  for (Isa isa : {Isa::baseline, Isa::avx2, Isa::avx512}) {
    if (text != isa_name(isa)) continue;
    if (!built_with(isa))
      throw Error("DPCHECK_CPU_ISA=" + std::string(text) + ": this binary has no " + std::string(text) +
                  " path (built for a target without it)");
    if (!cpu_has(isa))
      throw Error("DPCHECK_CPU_ISA=" + std::string(text) + ": this CPU lacks " + std::string(isa_flags(isa)));
    return isa;
  }
  throw Error("DPCHECK_CPU_ISA='" + std::string(text) + "': choose baseline, avx2 or avx512");
}

int threads_from_env() {
  const char* v = env("DPCHECK_CPU_THREADS");
  if (v == nullptr) return 0;
  const std::string_view text = v;
  int n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc{} || end != text.data() + text.size() || n < 1 || n > 1024)
    throw Error("DPCHECK_CPU_THREADS='" + std::string(text) + "': give a whole number from 1 to 1024");
  return n;
}

// The ranks an MPI launcher started on this node (or in all, where it does not say), 1 without one.
int launcher_ranks_here() {
  for (const char* name :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = env(name)) return std::max(1, std::atoi(v));
  return 1;
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::baseline: return "baseline";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

std::string_view isa_flags(Isa isa) {
  switch (isa) {
    case Isa::baseline: return "the target's baseline";
    case Isa::avx2: return "AVX2 and FMA";
    case Isa::avx512: return "AVX-512 F, VL, DQ and BW, and FMA";
  }
  return "?";
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::baseline, Isa::avx2, Isa::avx512})
    if (built_with(isa) && cpu_has(isa)) out.push_back(isa);
  return out;
}

Isa engine_isa() {
  if (env("DPCHECK_CPU_ISA")) return isa_from_env();
  return available_isas().back();
}

int cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

int engine_threads() {
  const int pinned = threads_from_env();  // checked even where it cannot apply
  if (shares_machine || launcher_ranks_here() > 1) return 1;
  return pinned > 0 ? pinned : cores();
}

void share_machine_on_this_thread() { shares_machine = true; }

void gemm(Isa isa, int threads, bool trans_a, bool trans_b, std::ptrdiff_t m, std::ptrdiff_t n, std::ptrdiff_t k,
          const float* a, const float* b, float* c, bool accumulate) {
  DPCHECK_ASSERT(m >= 0 && n >= 0 && k >= 0 && threads >= 1);
  const kernel::GemmCall whole{trans_a, trans_b, accumulate, m, n, k, a, trans_a ? m : k, b, trans_b ? k : n, c, n};
  const Kernel run = kernel_of(isa);
  // The blocks follow from the shape and the thread count alone, so the bits do too. Each block is
  // a multiple of 16 rows (or columns), whole vector registers on every path.
  const double work = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const bool by_rows = m >= n;
  const std::ptrdiff_t len = by_rows ? m : n;
  const std::ptrdiff_t most = std::min<std::ptrdiff_t>({threads, len / 32, static_cast<std::ptrdiff_t>(work / 4e6)});
  if (most <= 1) return run(whole);
  const std::ptrdiff_t block = ((len + most - 1) / most + 15) / 16 * 16;
  const int parts = static_cast<int>((len + block - 1) / block);
  workers().run(parts, [&](int part) {
    const std::ptrdiff_t begin = part * block, size = std::min(block, len - begin);
    kernel::GemmCall call = whole;
    if (by_rows) {
      call.m = size;
      call.c += begin * whole.ldc;
      call.a += trans_a ? begin : begin * whole.lda;
    } else {
      call.n = size;
      call.c += begin;
      call.b += trans_b ? begin * whole.ldb : begin;
    }
    run(call);
  });
}

std::string describe_engine_path() {
  const auto shown = [](const char* name) {
    return std::string(name) + (env(name) ? std::string("=") + env(name) : " unset");
  };
  const int t = engine_threads();
  return std::string(isa_name(engine_isa())) + ", " + std::to_string(t) + (t == 1 ? " thread" : " threads") + " (" +
         shown("DPCHECK_CPU_ISA") + ", " + shown("DPCHECK_CPU_THREADS") + ")";
}

}  // namespace dpcheck::cpu
