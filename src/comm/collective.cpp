// What the host communicators share (src/comm/collective.hpp): call descriptions and their verdict, error
// texts, the split of an all-reduce among ranks, and the rank-order reduction kernel.
#include "src/comm/collective.hpp"

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "src/error.hpp"
#include "src/low_precision.hpp"

namespace dpcheck {

std::string_view kind_name(CallKind k) {
  switch (k) {
    case CallKind::allreduce: return "allreduce";
    case CallKind::broadcast: return "broadcast";
    case CallKind::allgather: return "allgather";
    case CallKind::barrier: return "barrier";
  }
  return "?";
}

std::string describe(const CallDesc& d) {
  std::string s(kind_name(d.kind));
  if (d.kind == CallKind::barrier) return s + "()";
  s += "(count " + std::to_string(d.count) + ", " + std::string(dtype_name(d.dtype));
  if (d.kind == CallKind::allreduce) s += ", " + std::string(reduce_op_name(d.op));
  if (d.kind == CallKind::broadcast) s += ", root " + std::to_string(d.root);
  return s + ")";
}

bool passes_null_buffer(const CallDesc& d, bool some_null) {
  return some_null && d.count > 0 && d.kind != CallKind::barrier;
}

std::string check_calls(std::span<const CallDesc> descs, std::span<const std::uint8_t> null_buffer) {
  const int size = static_cast<int>(descs.size());
  const CallDesc& d0 = descs[0];
  if (!std::all_of(descs.begin(), descs.end(), [&](const CallDesc& d) { return d == d0; })) {
    std::vector<CallDesc> kinds;
    std::vector<std::vector<int>> who;
    for (int r = 0; r < size; ++r) {
      const CallDesc& d = descs[static_cast<std::size_t>(r)];
      const auto it = std::find(kinds.begin(), kinds.end(), d);
      if (it == kinds.end()) {
        kinds.push_back(d);
        who.push_back({r});
      } else {
        who[static_cast<std::size_t>(it - kinds.begin())].push_back(r);
      }
    }
    std::string msg = "ranks called different collectives:";
    for (std::size_t i = 0; i < kinds.size(); ++i)
      msg += std::string(i == 0 ? " " : "; ") + rank_list(who[i]) + " called " + describe(kinds[i]);
    return msg;
  }
  if (d0.kind == CallKind::allreduce) {
    if (d0.dtype == DType::u8) return "allreduce does not support uint8";
    if (d0.op == ReduceOp::avg && !is_floating(d0.dtype))
      return "avg is for the floating dtypes (float32, float64, bfloat16, float16), not " +
             std::string(dtype_name(d0.dtype));
  }
  if (d0.kind == CallKind::broadcast && (d0.root < 0 || d0.root >= size))
    return "broadcast root " + std::to_string(d0.root) + " is not a rank of a world of size " + std::to_string(size);
  std::vector<int> null_ranks;
  for (int r = 0; r < size; ++r)
    if (null_buffer[static_cast<std::size_t>(r)]) null_ranks.push_back(r);
  if (!null_ranks.empty()) return rank_list(null_ranks) + " passed a null buffer";
  return {};
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

std::string call_on_rank(CallKind k, int rank) {
  return std::string(kind_name(k)) + " on rank " + std::to_string(rank);
}

std::string timed_out_on_rank(CallKind k, int rank, std::chrono::milliseconds timeout) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.2f s", static_cast<double>(timeout.count()) / 1000.0);
  return std::string(kind_name(k)) + " timed out on rank " + std::to_string(rank) + " after " + seconds;
}

std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  constexpr auto cap = std::chrono::hours(24 * 365 * 100);
  return Clock::now() + (timeout > cap ? std::chrono::duration_cast<Clock::duration>(cap)
                                       : std::chrono::duration_cast<Clock::duration>(timeout));
}

std::pair<std::size_t, std::size_t> slice_of(std::size_t count, std::size_t elem_bytes, int rank, int n) {
  const std::size_t per_block = std::max<std::size_t>(1, 64 / elem_bytes);
  const std::size_t blocks = (count + per_block - 1) / per_block;
  const auto r = static_cast<std::size_t>(rank), un = static_cast<std::size_t>(n);
  const std::size_t lo = std::min(count, blocks * r / un * per_block);
  const std::size_t hi = std::min(count, blocks * (r + 1) / un * per_block);
  return {lo, hi};
}

// ---- the rank-order reduction ---------------------------------------------------------------------

namespace {

template <class T> struct Sum {
  T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      // Wraps like the hardware instead of being undefined for signed overflow.
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
template <class T> struct Min {
  T operator()(T a, T b) const { return b < a ? b : a; }
};
template <class T> struct Max {
  T operator()(T a, T b) const { return a < b ? b : a; }
};

// Elements of each input reduced at a time: all N input chunks and the accumulator stay in cache, so
// an output that is also an input is written back into lines just read (no extra read for ownership)
// and every byte crosses the memory bus once in and once out.
constexpr std::size_t chunk_bytes = 4096;

// len is a compile-time constant on the hot path (full chunks), which lets the compiler vectorise the
// loops without a run-time trip count; the same code with a run-time len handles the tail, and
// computes the same expression per element, so the two paths agree bit for bit.
template <class T, class Op> inline void reduce_chunk(const void* const* in, int n, void* const* out, int m,
                                                      std::size_t base, std::size_t len, T* acc, Op op, bool divide) {
  {
    const T* __restrict first = static_cast<const T*>(in[0]) + base;
    for (std::size_t k = 0; k < len; ++k) acc[k] = first[k];
  }
  for (int j = 1; j < n; ++j) {
    const T* __restrict b = static_cast<const T*>(in[j]) + base;
    for (std::size_t k = 0; k < len; ++k) acc[k] = op(acc[k], b[k]);
  }
  if (divide) {
    const T d = static_cast<T>(n);
    for (std::size_t k = 0; k < len; ++k) acc[k] = acc[k] / d;
  }
  // Outputs may be inputs, so they are written only after every input's chunk has been read.
  for (int j = 0; j < m; ++j) {
    T* __restrict o = static_cast<T*>(out[j]) + base;
    for (std::size_t k = 0; k < len; ++k) o[k] = acc[k];
  }
}

template <class T, class Op> void reduce_range(const void* const* in, int n, void* const* out, int m, std::size_t lo,
                                               std::size_t hi, Op op, bool divide) {
  constexpr std::size_t chunk = chunk_bytes / sizeof(T);
  alignas(64) T acc[chunk];
  std::size_t base = lo;
  for (; base + chunk <= hi; base += chunk) reduce_chunk<T>(in, n, out, m, base, chunk, acc, op, divide);
  if (base < hi) reduce_chunk<T>(in, n, out, m, base, hi - base, acc, op, divide);
}

template <class T>
void reduce_typed(const void* const* in, int n, void* const* out, int m, std::size_t lo, std::size_t hi, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return reduce_range<T>(in, n, out, m, lo, hi, Sum<T>{}, false);
    case ReduceOp::avg:
      if constexpr (std::is_floating_point_v<T>) return reduce_range<T>(in, n, out, m, lo, hi, Sum<T>{}, true);
      break;  // refused by check_calls before any rank gets here
    case ReduceOp::min: return reduce_range<T>(in, n, out, m, lo, hi, Min<T>{}, false);
    case ReduceOp::max: return reduce_range<T>(in, n, out, m, lo, hi, Max<T>{}, false);
  }
  DPCHECK_ASSERT(false);
}

// ---- bfloat16 and float16: in float32, rounded once --------------------------------------------------

// The 16-bit formats as the reduction sees them: a pattern to float32 (exact) and back (rounded to
// nearest, ties to even; src/low_precision.hpp).
struct Bf16Format {
  static float widen(std::uint16_t h) { return bf16_bits_to_float(h); }
  static std::uint16_t narrow(float f) { return float_to_bf16_bits(f); }
};
struct Fp16Format {
  static float widen(std::uint16_t h) { return fp16_bits_to_float(h); }
  static std::uint16_t narrow(float f) { return float_to_fp16_bits(f); }
};

// As reduce_chunk, with the accumulator in float32: every input element is widened, combined in rank
// order in float32 (divided by n there for avg), and the result rounded to the format once, when it
// is written out. The chunk is as many 16-bit elements as chunk_bytes holds, so that
// host_reduction_thresholds says where the work changes shape for these dtypes too.
template <class Format, class Op> inline void reduce_chunk_16(const void* const* in, int n, void* const* out, int m,
                                                              std::size_t base, std::size_t len, float* acc, Op op,
                                                              bool divide) {
  {
    const std::uint16_t* __restrict first = static_cast<const std::uint16_t*>(in[0]) + base;
    for (std::size_t k = 0; k < len; ++k) acc[k] = Format::widen(first[k]);
  }
  for (int j = 1; j < n; ++j) {
    const std::uint16_t* __restrict b = static_cast<const std::uint16_t*>(in[j]) + base;
    for (std::size_t k = 0; k < len; ++k) acc[k] = op(acc[k], Format::widen(b[k]));
  }
  if (divide) {
    const auto d = static_cast<float>(n);
    for (std::size_t k = 0; k < len; ++k) acc[k] = acc[k] / d;
  }
  // Outputs may be inputs: narrowed once into the first output, then copied, after every input's
  // chunk has been read.
  std::uint16_t* __restrict o0 = static_cast<std::uint16_t*>(out[0]) + base;
  for (std::size_t k = 0; k < len; ++k) o0[k] = Format::narrow(acc[k]);
  for (int j = 1; j < m; ++j) {
    std::uint16_t* __restrict o = static_cast<std::uint16_t*>(out[j]) + base;
    for (std::size_t k = 0; k < len; ++k) o[k] = o0[k];
  }
}

template <class Format, class Op> void reduce_range_16(const void* const* in, int n, void* const* out, int m,
                                                       std::size_t lo, std::size_t hi, Op op, bool divide) {
  constexpr std::size_t chunk = chunk_bytes / sizeof(std::uint16_t);
  alignas(64) float acc[chunk];
  std::size_t base = lo;
  for (; base + chunk <= hi; base += chunk) reduce_chunk_16<Format>(in, n, out, m, base, chunk, acc, op, divide);
  if (base < hi) reduce_chunk_16<Format>(in, n, out, m, base, hi - base, acc, op, divide);
}

template <class Format>
void reduce_16(const void* const* in, int n, void* const* out, int m, std::size_t lo, std::size_t hi, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return reduce_range_16<Format>(in, n, out, m, lo, hi, Sum<float>{}, false);
    case ReduceOp::avg: return reduce_range_16<Format>(in, n, out, m, lo, hi, Sum<float>{}, true);
    case ReduceOp::min: return reduce_range_16<Format>(in, n, out, m, lo, hi, Min<float>{}, false);
    case ReduceOp::max: return reduce_range_16<Format>(in, n, out, m, lo, hi, Max<float>{}, false);
  }
  DPCHECK_ASSERT(false);
}

}  // namespace

std::vector<std::size_t> host_reduction_thresholds(int n, DType dtype) {
  const std::size_t esize = dtype_size(dtype), un = static_cast<std::size_t>(n);
  return {un * std::max<std::size_t>(1, 64 / esize), un * (chunk_bytes / esize)};
}

void reduce_in_rank_order(const void* const* in, int n, void* const* out, int m, std::size_t lo, std::size_t hi,
                          DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::f32: return reduce_typed<float>(in, n, out, m, lo, hi, op);
    case DType::f64: return reduce_typed<double>(in, n, out, m, lo, hi, op);
    case DType::i32: return reduce_typed<std::int32_t>(in, n, out, m, lo, hi, op);
    case DType::i64: return reduce_typed<std::int64_t>(in, n, out, m, lo, hi, op);
    case DType::u64: return reduce_typed<std::uint64_t>(in, n, out, m, lo, hi, op);
    case DType::bf16: return reduce_16<Bf16Format>(in, n, out, m, lo, hi, op);
    case DType::f16: return reduce_16<Fp16Format>(in, n, out, m, lo, hi, op);
    case DType::u8: break;  // refused by check_calls
  }
  DPCHECK_ASSERT(false);
}

}  // namespace dpcheck
