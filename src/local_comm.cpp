// The "local" backend (src/local_comm.hpp): ranks are threads that meet in a LocalHub, a mutex and a
// condition variable guarding each rank's posted call. Every collective is two phases:
//
//   1. arrive  each rank posts its call (kind, count, dtype, op, root, buffers) and waits for all N;
//              the last to arrive checks that the calls agree and leaves a verdict for everyone.
//   2. depart  after working on its share of the buffers, each rank waits until all N have finished,
//              so that no rank returns (and lets its caller reuse a buffer) while a peer still reads
//              or writes it.
//
// All-reduce splits the buffer into N slices (on 64-byte boundaries); rank r reduces slice r for
// everyone, reading all N buffers once and writing the result into all N once. Each element is
// reduced in rank order, ((b0 + b1) + b2) + ..., whichever thread computes it, so every rank ends
// with bitwise identical values.
#include "src/local_comm.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "src/error.hpp"

namespace dpcheck {

namespace {

using Clock = std::chrono::steady_clock;

enum class CallKind : std::uint8_t { allreduce, broadcast, allgather, barrier };

std::string_view kind_name(CallKind k) {
  switch (k) {
    case CallKind::allreduce: return "allreduce";
    case CallKind::broadcast: return "broadcast";
    case CallKind::allgather: return "allgather";
    case CallKind::barrier: return "barrier";
  }
  return "?";
}

// What a rank asked for. Fields a collective does not use stay at their defaults, so that two
// allgathers never differ by an op they ignore.
struct CallDesc {
  CallKind kind = CallKind::barrier;
  std::size_t count = 0;
  DType dtype = DType::u8;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  bool operator==(const CallDesc&) const = default;
};

std::string describe(const CallDesc& d) {
  std::string s(kind_name(d.kind));
  if (d.kind == CallKind::barrier) return s + "()";
  s += "(count " + std::to_string(d.count) + ", " + std::string(dtype_name(d.dtype));
  if (d.kind == CallKind::allreduce) s += ", " + std::string(reduce_op_name(d.op));
  if (d.kind == CallKind::broadcast) s += ", root " + std::to_string(d.root);
  return s + ")";
}

struct Slot {
  CallDesc desc;
  void* buf = nullptr;         // allreduce, broadcast: the buffer; allgather: recv
  const void* send = nullptr;  // allgather only
};

// "rank 3" or "ranks 0, 2, 3".
std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

std::string seconds_text(std::chrono::milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  // Caps "practically forever" so that now + timeout cannot overflow the clock.
  constexpr auto cap = std::chrono::hours(24 * 365 * 100);
  return Clock::now() + (timeout > cap ? std::chrono::duration_cast<Clock::duration>(cap)
                                       : std::chrono::duration_cast<Clock::duration>(timeout));
}

// Thrown by a rank that gave up because another rank failed or timed out first. run_local uses the
// distinct types to rethrow the exception that started a failure rather than one of its echoes;
// callers see them as Error and TimeoutError.
class PeerFailedError : public Error {
 public:
  using Error::Error;
};
class PeerTimeoutError : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

// ---- the element-wise reduction -----------------------------------------------------------------

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

// Bytes of each rank's buffer reduced at a time: all N chunks and the accumulator stay in cache,
// so each result is written back into lines just read (no extra read for ownership) and every
// input byte crosses the memory bus once in and once out.
constexpr std::size_t chunk_bytes = 4096;

// len is a compile-time constant on the hot path (full chunks), which lets the compiler vectorise
// the loops without a run-time trip count; the same code with a run-time len handles the tail, and
// computes the same expression per element, so the two paths agree bit for bit.
template <class T, class Op> inline void reduce_chunk(void* const* bufs, int n, std::size_t base,
                                                      std::size_t len, T* acc, Op op, bool divide) {
  const T* __restrict first = static_cast<const T*>(bufs[0]) + base;
  for (std::size_t k = 0; k < len; ++k) acc[k] = first[k];
  for (int j = 1; j < n; ++j) {
    const T* __restrict in = static_cast<const T*>(bufs[j]) + base;
    for (std::size_t k = 0; k < len; ++k) acc[k] = op(acc[k], in[k]);
  }
  if (divide) {
    const T d = static_cast<T>(n);
    for (std::size_t k = 0; k < len; ++k) acc[k] = acc[k] / d;
  }
  for (int j = 0; j < n; ++j) {
    T* __restrict out = static_cast<T*>(bufs[j]) + base;
    for (std::size_t k = 0; k < len; ++k) out[k] = acc[k];
  }
}

template <class T, class Op>
void reduce_slice(void* const* bufs, int n, std::size_t lo, std::size_t hi, Op op, bool divide) {
  constexpr std::size_t chunk = chunk_bytes / sizeof(T);
  alignas(64) T acc[chunk];
  std::size_t base = lo;
  for (; base + chunk <= hi; base += chunk) reduce_chunk<T>(bufs, n, base, chunk, acc, op, divide);
  if (base < hi) reduce_chunk<T>(bufs, n, base, hi - base, acc, op, divide);
}

template <class T> void reduce_typed(void* const* bufs, int n, std::size_t lo, std::size_t hi, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return reduce_slice<T>(bufs, n, lo, hi, Sum<T>{}, false);
    case ReduceOp::avg:
      if constexpr (std::is_floating_point_v<T>) return reduce_slice<T>(bufs, n, lo, hi, Sum<T>{}, true);
      break;  // refused by check_calls before any rank gets here
    case ReduceOp::min: return reduce_slice<T>(bufs, n, lo, hi, Min<T>{}, false);
    case ReduceOp::max: return reduce_slice<T>(bufs, n, lo, hi, Max<T>{}, false);
  }
  DPCHECK_ASSERT(false);
}

void reduce(void* const* bufs, int n, std::size_t lo, std::size_t hi, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::f32: return reduce_typed<float>(bufs, n, lo, hi, op);
    case DType::f64: return reduce_typed<double>(bufs, n, lo, hi, op);
    case DType::i32: return reduce_typed<std::int32_t>(bufs, n, lo, hi, op);
    case DType::i64: return reduce_typed<std::int64_t>(bufs, n, lo, hi, op);
    case DType::u64: return reduce_typed<std::uint64_t>(bufs, n, lo, hi, op);
    case DType::u8: break;  // refused by check_calls
  }
  DPCHECK_ASSERT(false);
}

// Rank r's share [lo, hi) of count elements: N nearly equal runs of whole 64-byte blocks, so that
// two ranks never write the same cache line of an aligned buffer.
std::pair<std::size_t, std::size_t> slice_of(std::size_t count, std::size_t elem_bytes, int rank, int n) {
  const std::size_t per_block = std::max<std::size_t>(1, 64 / elem_bytes);
  const std::size_t blocks = (count + per_block - 1) / per_block;
  const auto r = static_cast<std::size_t>(rank), un = static_cast<std::size_t>(n);
  const std::size_t lo = std::min(count, blocks * r / un * per_block);
  const std::size_t hi = std::min(count, blocks * (r + 1) / un * per_block);
  return {lo, hi};
}

}  // namespace

// ---- the hub --------------------------------------------------------------------------------------

class LocalHub {
 public:
  explicit LocalHub(int size)
      : size_(size), seq_(static_cast<std::size_t>(size), 0), slots_(static_cast<std::size_t>(size)) {}

  int size() const { return size_; }

  // Phase 1: posts this rank's call and waits until every rank has posted one, then copies every
  // rank's slot into `all`. Throws if the calls disagree, the wait times out, or the world is broken.
  void arrive(int rank, const Slot& mine, std::chrono::milliseconds timeout, Clock::time_point deadline,
              std::vector<Slot>& all) {
    const std::string_view call = kind_name(mine.desc.kind);
    std::unique_lock lk(mu_);
    // A broken world takes no new arrivals: counting one could complete a phase that the ranks which
    // already gave up will never finish.
    if (broken_) throw_abandoned(call, rank);
    slots_[static_cast<std::size_t>(rank)] = mine;
    const std::uint64_t s = ++seq_[static_cast<std::size_t>(rank)];
    if (all_reached(s)) {
      verdict_seq_ = s;
      verdict_ = check_calls();
      cv_.notify_all();
    } else if (!cv_.wait_until(lk, deadline, [&] { return all_reached(s) || broken_; })) {
      const std::string msg = std::string(call) + " timed out on rank " + std::to_string(rank) + " after " +
                              seconds_text(timeout) + ": " + rank_list(ranks_below(s)) + " did not arrive";
      break_world(msg, true);
      throw TimeoutError(msg);
    }
    // Completion wins over a later break: peers may already be working on this rank's buffer.
    if (!all_reached(s)) throw_abandoned(call, rank);
    DPCHECK_ASSERT(verdict_seq_ == s);
    if (!verdict_.empty())
      throw Error(std::string(call) + " on rank " + std::to_string(rank) + ": " + verdict_);
    all = slots_;  // the caller sized `all`, so this copies without allocating
  }

  // Phase 2: waits until every rank has finished its share of the call.
  void depart(int rank, CallKind kind, std::chrono::milliseconds timeout, Clock::time_point deadline) {
    std::unique_lock lk(mu_);
    const std::uint64_t s = ++seq_[static_cast<std::size_t>(rank)];
    const auto done = [&] { return all_reached(s); };
    if (done()) {
      cv_.notify_all();
      return;
    }
    if (cv_.wait_until(lk, deadline, done)) return;
    const std::string msg = std::string(kind_name(kind)) + " timed out on rank " + std::to_string(rank) +
                            " after " + seconds_text(timeout) + ": " + rank_list(ranks_below(s)) +
                            " did not finish";
    break_world(msg, true);
    // The late ranks are inside plain copy loops over this rank's buffer, which end on their own;
    // returning before they do would let the caller free memory that is still being written.
    cv_.wait(lk, done);
    throw TimeoutError(msg);
  }

  void abort(int rank, const std::string& reason) {
    std::lock_guard lk(mu_);
    break_world("rank " + std::to_string(rank) + " failed: " + reason, false);
  }

 private:
  bool all_reached(std::uint64_t s) const {
    return std::all_of(seq_.begin(), seq_.end(), [s](std::uint64_t v) { return v >= s; });
  }

  std::vector<int> ranks_below(std::uint64_t s) const {
    std::vector<int> late;
    for (int r = 0; r < size_; ++r)
      if (seq_[static_cast<std::size_t>(r)] < s) late.push_back(r);
    return late;
  }

  // Called with the lock held. The first failure is the one every later error reports.
  void break_world(const std::string& reason, bool by_timeout) {
    if (broken_) return;
    broken_ = true;
    broken_by_timeout_ = by_timeout;
    reason_ = reason;
    cv_.notify_all();
  }

  [[noreturn]] void throw_abandoned(std::string_view call, int rank) const {
    const std::string msg = std::string(call) + " on rank " + std::to_string(rank) + " abandoned: " + reason_;
    if (broken_by_timeout_) throw PeerTimeoutError(msg);
    throw PeerFailedError(msg);
  }

  // Run by the last rank to arrive, on everyone's behalf; an empty result means the calls agree and
  // are supported. Every rank throws the same message, so all of them take the same branch.
  std::string check_calls() const {
    const CallDesc& d0 = slots_[0].desc;
    if (!std::all_of(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.desc == d0; })) {
      std::vector<CallDesc> kinds;
      std::vector<std::vector<int>> who;
      for (int r = 0; r < size_; ++r) {
        const CallDesc& d = slots_[static_cast<std::size_t>(r)].desc;
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
      if (d0.op == ReduceOp::avg && d0.dtype != DType::f32 && d0.dtype != DType::f64)
        return "avg is for float32 and float64, not " + std::string(dtype_name(d0.dtype));
    }
    if (d0.kind == CallKind::broadcast && (d0.root < 0 || d0.root >= size_))
      return "broadcast root " + std::to_string(d0.root) + " is not a rank of a world of size " +
             std::to_string(size_);
    if (d0.count > 0) {
      std::vector<int> null_ranks;
      for (int r = 0; r < size_; ++r) {
        const Slot& s = slots_[static_cast<std::size_t>(r)];
        if (d0.kind != CallKind::barrier && (s.buf == nullptr || (d0.kind == CallKind::allgather && !s.send)))
          null_ranks.push_back(r);
      }
      if (!null_ranks.empty()) return rank_list(null_ranks) + " passed a null buffer";
    }
    return {};
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const int size_;
  // The number of phases each rank has entered. Phases complete when every rank has reached the
  // same number, so there is no counter to reset between calls and no generation to race on.
  std::vector<std::uint64_t> seq_;
  std::vector<Slot> slots_;
  std::uint64_t verdict_seq_ = 0;
  std::string verdict_;
  bool broken_ = false;
  bool broken_by_timeout_ = false;
  std::string reason_;
};

// ---- the communicator -----------------------------------------------------------------------------

namespace {

class LocalComm final : public Communicator {
 public:
  // Sized once here: between arrive and depart nothing may throw (not even bad_alloc), or the peers
  // would wait in depart for a rank that never comes.
  LocalComm(std::shared_ptr<LocalHub> hub, int rank)
      : hub_(std::move(hub)),
        rank_(rank),
        peers_(static_cast<std::size_t>(hub_->size())),
        bufs_(static_cast<std::size_t>(hub_->size())) {}

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  std::string_view backend() const override { return "local"; }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    const auto deadline = deadline_after(timeout());
    hub_->arrive(rank_, Slot{CallDesc{CallKind::allreduce, count, dtype, op, 0}, buf, nullptr}, timeout(),
                 deadline, peers_);
    const auto [lo, hi] = slice_of(count, dtype_size(dtype), rank_, size());
    if (lo < hi) {
      for (std::size_t j = 0; j < peers_.size(); ++j) bufs_[j] = peers_[j].buf;
      reduce(bufs_.data(), size(), lo, hi, dtype, op);
    }
    hub_->depart(rank_, CallKind::allreduce, timeout(), deadline);
  }

  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    const auto deadline = deadline_after(timeout());
    hub_->arrive(rank_, Slot{CallDesc{CallKind::broadcast, count, dtype, ReduceOp::sum, root}, buf, nullptr},
                 timeout(), deadline, peers_);
    // Each rank copies its slice of root's buffer to everyone, so the copying is shared like the
    // reduction instead of falling on the receivers alone.
    const std::size_t esize = dtype_size(dtype);
    const auto [lo, hi] = slice_of(count, esize, rank_, size());
    if (lo < hi) {
      const auto* src = static_cast<const unsigned char*>(peers_[static_cast<std::size_t>(root)].buf);
      for (int j = 0; j < size(); ++j) {
        if (j == root) continue;
        std::memcpy(static_cast<unsigned char*>(peers_[static_cast<std::size_t>(j)].buf) + lo * esize,
                    src + lo * esize, (hi - lo) * esize);
      }
    }
    hub_->depart(rank_, CallKind::broadcast, timeout(), deadline);
  }

  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    const auto deadline = deadline_after(timeout());
    hub_->arrive(rank_, Slot{CallDesc{CallKind::allgather, count, dtype, ReduceOp::sum, 0}, recv, send},
                 timeout(), deadline, peers_);
    // Rank r writes its own block into everyone's recv: the work is balanced and each send buffer
    // is read by its owner's thread only.
    const std::size_t bytes = count * dtype_size(dtype);
    if (bytes > 0) {
      for (const Slot& peer : peers_) {
        auto* dst = static_cast<unsigned char*>(peer.buf) + static_cast<std::size_t>(rank_) * bytes;
        if (dst != send) std::memmove(dst, send, bytes);  // send may be this block of our own recv
      }
    }
    hub_->depart(rank_, CallKind::allgather, timeout(), deadline);
  }

  void barrier() override { hub_->arrive(rank_, Slot{}, timeout(), deadline_after(timeout()), peers_); }

 private:
  std::shared_ptr<LocalHub> hub_;
  int rank_;
  std::vector<Slot> peers_;  // every rank's posted call, refreshed by each arrive
  std::vector<void*> bufs_;
};

}  // namespace

// ---- the world and run_local ----------------------------------------------------------------------

LocalWorld::LocalWorld(int size, std::chrono::milliseconds timeout) {
  if (size < 1) throw Error("local world: size must be at least 1, not " + std::to_string(size));
  hub_ = std::make_shared<LocalHub>(size);
  comms_.reserve(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    comms_.push_back(std::make_unique<LocalComm>(hub_, r));
    comms_.back()->set_timeout(timeout);
  }
}

LocalWorld::~LocalWorld() = default;

int LocalWorld::size() const { return hub_->size(); }

Communicator& LocalWorld::comm(int rank) {
  if (rank < 0 || rank >= size())
    throw Error("local world: no rank " + std::to_string(rank) + " in a world of size " +
                std::to_string(size()));
  return *comms_[static_cast<std::size_t>(rank)];
}

void LocalWorld::abort(int rank, const std::string& reason) { hub_->abort(rank, reason); }

void run_local(int size, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  LocalWorld world(size, timeout);
  std::mutex mu;
  std::exception_ptr first;  // the first failure that was not an echo of another rank's
  std::exception_ptr first_echo;

  const auto fail = [&](int rank, std::exception_ptr e, const std::string& what, bool echo) {
    {
      std::lock_guard lk(mu);
      std::exception_ptr& slot = echo ? first_echo : first;
      if (!slot) slot = e;
    }
    world.abort(rank, what);
  };
  const auto body = [&](int rank) {
    try {
      fn(world.comm(rank));
    } catch (const PeerFailedError& e) {
      fail(rank, std::current_exception(), e.what(), true);
    } catch (const PeerTimeoutError& e) {
      fail(rank, std::current_exception(), e.what(), true);
    } catch (const std::exception& e) {
      fail(rank, std::current_exception(), e.what(), false);
    } catch (...) {
      fail(rank, std::current_exception(), "unknown exception", false);
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(size));
  try {
    for (int r = 0; r < size; ++r) threads.emplace_back(body, r);
  } catch (const std::exception& e) {
    world.abort(static_cast<int>(threads.size()), std::string("could not start its thread: ") + e.what());
    for (std::thread& t : threads) t.join();
    throw;
  }
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
  if (first_echo) std::rethrow_exception(first_echo);
}

}  // namespace dpcheck
