// The "local" backend (src/comm/local_comm.hpp): ranks are threads that meet in a LocalHub, a mutex and a
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
// reduced in rank order, ((b0 + b1) + b2) + ..., whichever thread computes it (the kernel both host
// backends share, src/comm/collective.hpp), so every rank ends with bitwise identical values.
#include "src/comm/local_comm.hpp"
#include "src/builtin_names.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/collective.hpp"
#include "src/error.hpp"
#include "src/gemm/cpu_gemm.hpp"

namespace dpcheck {

namespace {

using Clock = std::chrono::steady_clock;

// A rank's buffers for the call it posted.
struct Slot {
  void* buf = nullptr;         // allreduce, broadcast: the buffer; allgather: recv
  const void* send = nullptr;  // allgather only
};

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

}  // namespace

// ---- the hub --------------------------------------------------------------------------------------

class LocalHub {
 public:
  explicit LocalHub(int size)
      : size_(size),
        seq_(static_cast<std::size_t>(size), 0),
        descs_(static_cast<std::size_t>(size)),
        null_buffer_(static_cast<std::size_t>(size), 0),
        slots_(static_cast<std::size_t>(size)) {}

  int size() const { return size_; }

  // Phase 1: posts this rank's call and waits until every rank has posted one, then copies every
  // rank's slot into `all`. Throws if the calls disagree, the wait times out, or the world is broken.
  void arrive(int rank, const CallDesc& desc, const Slot& mine, std::chrono::milliseconds timeout,
              Clock::time_point deadline, std::vector<Slot>& all) {
    std::unique_lock lk(mu_);
    // A broken world takes no new arrivals: counting one could complete a phase that the ranks which
    // already gave up will never finish.
    if (broken_) throw_abandoned(desc.kind, rank);
    const auto r = static_cast<std::size_t>(rank);
    descs_[r] = desc;
    null_buffer_[r] = passes_null_buffer(desc, !mine.buf || (desc.kind == CallKind::allgather && !mine.send)) ? 1 : 0;
    slots_[r] = mine;
    const std::uint64_t s = ++seq_[r];
    if (all_reached(s)) {
      verdict_seq_ = s;
      verdict_ = check_calls(descs_, null_buffer_);
      const bool agreed = verdict_.empty();
      if (agreed) all = slots_;
      // Woken after the lock is released, the waiters do not wake only to block on it at once: on N
      // threads over two cores, a 64-byte all-reduce took 0.66 of its time at N = 4, 0.60 at N = 8.
      lk.unlock();
      cv_.notify_all();
      // The verdict stays as it is until this rank arrives at its next call, which the next one needs.
      if (!agreed) throw Error(call_on_rank(desc.kind, rank) + ": " + verdict_);
      return;
    } else if (!cv_.wait_until(lk, deadline, [&] { return all_reached(s) || broken_; })) {
      const std::string msg =
          timed_out_on_rank(desc.kind, rank, timeout) + ": " + rank_list(ranks_below(s)) + " did not arrive";
      break_world(msg, true);
      throw TimeoutError(msg);
    }
    // Completion wins over a later break: peers may already be working on this rank's buffer.
    if (!all_reached(s)) throw_abandoned(desc.kind, rank);
    DPCHECK_ASSERT(verdict_seq_ == s);
    if (!verdict_.empty()) throw Error(call_on_rank(desc.kind, rank) + ": " + verdict_);
    all = slots_;  // the caller sized `all`, so this copies without allocating
  }

  // Phase 2: waits until every rank has finished its share of the call.
  void depart(int rank, CallKind kind, std::chrono::milliseconds timeout, Clock::time_point deadline) {
    std::unique_lock lk(mu_);
    const std::uint64_t s = ++seq_[static_cast<std::size_t>(rank)];
    const auto done = [&] { return all_reached(s); };
    if (done()) {
      lk.unlock();
      cv_.notify_all();
      return;
    }
    if (cv_.wait_until(lk, deadline, done)) return;
    const std::string msg =
        timed_out_on_rank(kind, rank, timeout) + ": " + rank_list(ranks_below(s)) + " did not finish";
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

  [[noreturn]] void throw_abandoned(CallKind kind, int rank) const {
    const std::string msg = call_on_rank(kind, rank) + " abandoned: " + reason_;
    if (broken_by_timeout_) throw PeerTimeoutError(msg);
    throw PeerFailedError(msg);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const int size_;
  // The number of phases each rank has entered. Phases complete when every rank has reached the
  // same number, so there is no counter to reset between calls and no generation to race on.
  std::vector<std::uint64_t> seq_;
  // Every rank's posted call, judged by the last to arrive (check_calls) on everyone's behalf.
  std::vector<CallDesc> descs_;
  std::vector<std::uint8_t> null_buffer_;
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
  std::string_view backend() const override { return builtin::local; }
  bool shares_address_space() const override { return true; }
  // A rank's calls are told apart by its rank, not by the thread that makes them.
  bool callable_from_any_thread() const override { return true; }
  std::vector<std::size_t> algorithm_thresholds(DType dtype) const override {
    return host_reduction_thresholds(size(), dtype);
  }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    const auto deadline = deadline_after(timeout());
    hub_->arrive(rank_, CallDesc{CallKind::allreduce, count, dtype, op, 0}, Slot{buf, nullptr}, timeout(), deadline,
                 peers_);
    const auto [lo, hi] = slice_of(count, dtype_size(dtype), rank_, size());
    if (lo < hi) {
      for (std::size_t j = 0; j < peers_.size(); ++j) bufs_[j] = peers_[j].buf;
      // Every rank's slice [lo, hi) into every rank's buffer, in place.
      reduce_in_rank_order(bufs_.data(), size(), bufs_.data(), size(), lo, hi, dtype, op);
    }
    hub_->depart(rank_, CallKind::allreduce, timeout(), deadline);
  }

  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    const auto deadline = deadline_after(timeout());
    hub_->arrive(rank_, CallDesc{CallKind::broadcast, count, dtype, ReduceOp::sum, root}, Slot{buf, nullptr}, timeout(),
                 deadline, peers_);
    // Each rank copies its slice of root's buffer to everyone, so the copying is shared like the
    // reduction instead of falling on the receivers alone.
    const std::size_t esize = dtype_size(dtype);
    const auto [lo, hi] = slice_of(count, esize, rank_, size());
    if (lo < hi) {
      const auto* src = static_cast<const unsigned char*>(peers_[static_cast<std::size_t>(root)].buf);
      for (int j = 0; j < size(); ++j) {
        if (j == root) continue;
        std::memcpy(static_cast<unsigned char*>(peers_[static_cast<std::size_t>(j)].buf) + lo * esize, src + lo * esize,
                    (hi - lo) * esize);
      }
    }
    hub_->depart(rank_, CallKind::broadcast, timeout(), deadline);
  }

  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    const auto deadline = deadline_after(timeout());
    hub_->arrive(rank_, CallDesc{CallKind::allgather, count, dtype, ReduceOp::sum, 0}, Slot{recv, send}, timeout(),
                 deadline, peers_);
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

  void barrier() override { hub_->arrive(rank_, CallDesc{}, Slot{}, timeout(), deadline_after(timeout()), peers_); }

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
    throw Error("local world: no rank " + std::to_string(rank) + " in a world of size " + std::to_string(size()));
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
    // Ranks that share the machine keep to a thread each in the CPU engine's products.
    if (size > 1) cpu::share_machine_on_this_thread();
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
