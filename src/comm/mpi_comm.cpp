// The "mpi" backend (src/comm/mpi_comm.hpp): one process per rank. Every collective is built from
// non-blocking point-to-point messages (MPI_Isend / MPI_Irecv) on a private duplicate of
// MPI_COMM_WORLD, polled against the call's deadline, in up to three rounds:
//
//   0. describe  every rank sends every other rank a small description of its call (kind, count,
//                dtype, op, root) and receives theirs. All ranks then judge the same N descriptions,
//                so a mismatch throws the same Error on every rank, and a rank that never makes the
//                call is the one whose description does not arrive. This round alone is the barrier.
//   1. scatter   (allreduce) rank r receives slice r of the buffer from every rank and reduces it in
//                rank order, ((b0 + b1) + b2) + ..., element by element, with the local backend's
//                kernel (src/comm/collective.hpp), so the two give the same bits for the same inputs.
//   2. gather    rank r sends its reduced slice to every rank (allreduce); root sends its buffer
//                (broadcast); every rank sends its block to every rank (allgather).
//
// A small call (up to inline_limit bytes) sends its data with its description and ends after round 0,
// since on a machine with more ranks than cores every round costs a trip through the scheduler.
// A message's tag holds the call's sequence number and its round, so it can only match the call and
#include "src/comm/mpi_comm.hpp"
#include "src/builtin_names.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "src/comm/collective.hpp"
#include "src/comm/mpi_world.hpp"
#include "src/error.hpp"

namespace dpcheck {

namespace {

using Clock = std::chrono::steady_clock;

// A description on the wire: fixed size and layout, the same binary on every rank. seq guards the
// tag scheme: a description from another call would be a bug in this file. payload is the number of
// data bytes that follow it in the same message (small calls only).
struct WireDesc {
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  std::int64_t root = 0;
  std::uint64_t payload = 0;
  std::uint8_t kind = 0, dtype = 0, op = 0, null_buffer = 0;
  std::uint8_t unused[4] = {};
};
static_assert(sizeof(WireDesc) == 40 && std::is_trivially_copyable_v<WireDesc>);

// A round-0 message: the description in the first header_bytes (so that the data after it stays
// 64-byte aligned), then up to inline_limit bytes of data.
constexpr std::size_t header_bytes = 64;
static_assert(sizeof(WireDesc) <= header_bytes);

// Calls whose data is this small travel with their descriptions, so they take one round instead of
// three: every rank sends its whole buffer to every rank (allreduce, allgather) or root sends its
// buffer (broadcast), and each rank finishes the call locally. An allreduce then reduces all N
// buffers on every rank, still in rank order, so the bits do not change; the total bounds that
// duplicated work and the messages' size as N grows.
constexpr std::size_t inline_limit = 32 << 10;
constexpr std::size_t inline_total = 96 << 10;

// A call that every rank refuses with the same message (mismatch, unsupported reduction): the ranks
// are still in step afterwards, so the communicator stays usable.
class RefusedCall : public Error {
 public:
  using Error::Error;
};

// ---- polling ------------------------------------------------------------------------------------------

// How a waiting rank spends its time while nothing completes. Ranks may outnumber cores (mpirun
// --oversubscribe on a 2-core machine), and a waiter that spins keeps the rank it waits for off the
// CPU; but a rank that is off the CPU progresses no transfer either: Open MPI moves data only inside
// MPI calls, and the receiver itself copies a large message (single-copy from the sender's memory).
// So: spin for a while (long enough for a message in flight to land; with 20 us instead of 200, 1 MiB
// at N = 4 on 2 cores took 3-4 ms instead of about 1), then yield the CPU between tests while a
// transfer of this size could still be running, and only then back off into sleeps, so that ranks
// waiting for a dead or stuck peer leave the CPUs to others.
constexpr auto spin_for = std::chrono::microseconds(200);
constexpr auto yield_base = std::chrono::milliseconds(5);
constexpr double yield_bytes_per_second = 0.5e9;  // a pessimistic transfer rate on a busy machine
constexpr auto first_sleep = std::chrono::microseconds(50);
constexpr auto max_sleep = std::chrono::milliseconds(2);

// The outstanding requests of one round, with whom each is for and in which direction.
struct Round {
  std::vector<MPI_Request> reqs;
  std::vector<int> peer;
  std::vector<std::uint8_t> is_send;
  std::vector<int> indices;  // MPI_Testsome's output
  std::size_t bytes = 0;

  void clear() {
    reqs.clear();
    peer.clear();
    is_send.clear();
    bytes = 0;
  }
};

// MPI counts are ints; larger messages go as several, in order (MPI does not overtake messages
// between the same pair with the same tag).
constexpr std::size_t max_message_bytes = std::size_t{1} << 30;

// ---- the communicator -------------------------------------------------------------------------------

class MpiComm final : public Communicator {
 public:
  // Takes ownership of comm (a duplicate made for this communicator).
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {
    DPCHECK_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    DPCHECK_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DPCHECK_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    void* attr = nullptr;
    int found = 0;
    DPCHECK_MPI_CHECK(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &attr, &found));
    // The standard promises tags up to at least 32767; Open MPI allows 2^31 - 1.
    const std::int64_t tag_ub = found ? *static_cast<int*>(attr) : 32767;
    tag_cycle_ = static_cast<std::uint64_t>((tag_ub + 1) / rounds_per_call);
    const auto n = static_cast<std::size_t>(size_);
    outbox_.resize(header_bytes + inline_limit);
    inbox_.resize((n - 1) * (header_bytes + inline_limit));
    descs_.resize(n);
    null_buffer_.resize(n);
    wires_.resize(n);
    inputs_.resize(n);
  }

  ~MpiComm() override {
    if (!broken_.empty()) {
      // A peer that was late rather than dead may still match a message of the call that timed out
      // and read this communicator's outbox, or finish a receive into its inbox or staging: those
      // buffers outlive the communicator, deliberately leaked, so that such a late copy touches
      // memory that is still mapped.
      new std::vector<unsigned char>(std::move(outbox_));
      new std::vector<unsigned char>(std::move(inbox_));
      new std::vector<unsigned char>(std::move(staging_));
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);  // local in Open MPI: pending messages do not block it
  }

  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool callable_from_any_thread() const override { return mpi_calls_from_any_thread(); }
  std::string_view backend() const override { return builtin::mpi; }
  // Small calls travel inline with their description; larger ones are sliced like the local backend's.
  std::vector<std::size_t> algorithm_thresholds(DType dtype) const override {
    const std::size_t esize = dtype_size(dtype);
    std::size_t inline_bytes = inline_limit;
    if (size_ > 1) inline_bytes = std::min(inline_bytes, inline_total / static_cast<std::size_t>(size_ - 1));
    std::vector<std::size_t> t = host_reduction_thresholds(size_, dtype);
    t.push_back(inline_bytes / esize);
    return t;
  }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    const std::size_t esize = dtype_size(dtype), bytes = count * esize;
    const bool small = fits_inline(bytes);
    run(CallDesc{CallKind::allreduce, count, dtype, op, 0}, buf == nullptr, buf, small ? bytes : 0, [&] {
      auto* data = static_cast<unsigned char*>(buf);
      if (small) {
        if (count == 0) return;
        for (int j = 0; j < size_; ++j)
          inputs_[static_cast<std::size_t>(j)] = j == rank_ ? static_cast<const void*>(data) : payload_of(j);
        void* const out = data;
        reduce_in_rank_order(inputs_.data(), size_, &out, 1, 0, count, dtype, op);
        return;
      }
      const auto [lo, hi] = slice_of(count, esize, rank_, size_);
      const std::size_t mine = (hi - lo) * esize;
      if (staging_.size() < mine * static_cast<std::size_t>(size_ - 1)) {
        staging_ = std::vector<unsigned char>();  // release before allocating the larger one
        staging_.resize(mine * static_cast<std::size_t>(size_ - 1));
      }

      // Round 1: slice p of this rank's buffer to rank p; slice r from every rank into staging.
      round_.clear();
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        const auto [plo, phi] = slice_of(count, esize, p, size_);
        post_recv(staging_.data() + peer_index(p) * mine, mine, p, 1);
        post_send(data + plo * esize, (phi - plo) * esize, p, 1);
      }
      wait(round_);

      if (mine > 0) {
        for (int j = 0; j < size_; ++j)
          inputs_[static_cast<std::size_t>(j)] =
              j == rank_ ? static_cast<const void*>(data + lo * esize) : staging_.data() + peer_index(j) * mine;
        // The inputs are slices, so the range is [0, hi - lo); out is this rank's own input slice.
        void* const out = data + lo * esize;
        reduce_in_rank_order(inputs_.data(), size_, &out, 1, 0, hi - lo, dtype, op);
      }

      // Round 2: the reduced slice r to every rank; everyone's reduced slice into place.
      round_.clear();
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        const auto [plo, phi] = slice_of(count, esize, p, size_);
        post_recv(data + plo * esize, (phi - plo) * esize, p, 2);
        post_send(data + lo * esize, mine, p, 2);
      }
      wait(round_);
    });
  }

  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    const std::size_t bytes = count * dtype_size(dtype);
    const bool small = fits_inline(bytes);
    run(CallDesc{CallKind::broadcast, count, dtype, ReduceOp::sum, root}, buf == nullptr, buf,
        small && rank_ == root ? bytes : 0, [&] {
          if (small) {
            if (rank_ != root && bytes > 0) std::memcpy(buf, payload_of(root), bytes);
            return;
          }
          round_.clear();
          if (rank_ == root) {
            for (int p = 0; p < size_; ++p)
              if (p != root) post_send(buf, bytes, p, 2);
          } else {
            post_recv(buf, bytes, root, 2);
          }
          wait(round_);
        });
  }

  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    const std::size_t bytes = count * dtype_size(dtype);
    const bool small = fits_inline(bytes);
    run(CallDesc{CallKind::allgather, count, dtype, ReduceOp::sum, 0}, send == nullptr || recv == nullptr, send,
        small ? bytes : 0, [&] {
          if (bytes == 0) return;
          auto* out = static_cast<unsigned char*>(recv);
          unsigned char* own = out + static_cast<std::size_t>(rank_) * bytes;
          if (own != send) std::memmove(own, send, bytes);  // send may be this very block
          if (small) {
            for (int p = 0; p < size_; ++p)
              if (p != rank_) std::memcpy(out + static_cast<std::size_t>(p) * bytes, payload_of(p), bytes);
            return;
          }
          round_.clear();
          for (int p = 0; p < size_; ++p) {
            if (p == rank_) continue;
            post_recv(out + static_cast<std::size_t>(p) * bytes, bytes, p, 2);
            post_send(own, bytes, p, 2);
          }
          wait(round_);
        });
  }

  void barrier() override {
    run(CallDesc{}, false, nullptr, 0, [] {});
  }

 private:
  static constexpr int rounds_per_call = 4;  // describe, scatter, gather, one spare

  bool fits_inline(std::size_t bytes) const {
    return bytes <= inline_limit && bytes * static_cast<std::size_t>(size_ - 1) <= inline_total;
  }

  // One collective: refuses at once on a broken communicator, exchanges the descriptions (with
  // payload_bytes of data from payload, for a small call), then runs body. Anything but a refusal
  // leaves the ranks out of step, so the communicator is broken after it.
  template <class Body>
  void run(const CallDesc& desc, bool null_buffer, const void* payload, std::size_t payload_bytes, Body&& body) {
    call_ = desc.kind;
    if (!broken_.empty()) {
      const std::string msg = call_on_rank(call_, rank_) + " abandoned: " + broken_;
      if (broken_by_timeout_) throw TimeoutError(msg);
      throw Error(msg);
    }
    ++seq_;
    deadline_ = deadline_after(timeout());
    try {
      describe_round(desc, null_buffer, payload, payload_bytes);
      body();
    } catch (const RefusedCall&) {
      throw;
    } catch (const TimeoutError&) {
      throw;  // broken_ already says why
    } catch (const std::exception& e) {
      broken_ = std::string(kind_name(call_)) + " failed on rank " + std::to_string(rank_) + ": " + e.what();
      throw;
    }
  }

  int tag(int round) const {
    return static_cast<int>((seq_ % tag_cycle_) * rounds_per_call + static_cast<std::uint64_t>(round));
  }

  // Where peer p's data sits in staging_ and inbox_, which have no block for this rank.
  std::size_t peer_index(int peer) const { return static_cast<std::size_t>(peer < rank_ ? peer : peer - 1); }
  unsigned char* inbox_of(int peer) { return inbox_.data() + peer_index(peer) * (header_bytes + inline_limit); }
  const unsigned char* payload_of(int peer) { return inbox_of(peer) + header_bytes; }

  void post(bool send, const void* data, std::size_t bytes, int peer, int round) {
    auto* p = static_cast<unsigned char*>(const_cast<void*>(data));  // MPI_Isend reads only
    for (std::size_t off = 0; off < bytes; off += max_message_bytes) {
      const int n = static_cast<int>(std::min(max_message_bytes, bytes - off));
      MPI_Request req = MPI_REQUEST_NULL;
      if (send) DPCHECK_MPI_CHECK(MPI_Isend(p + off, n, MPI_BYTE, peer, tag(round), comm_, &req));
      else DPCHECK_MPI_CHECK(MPI_Irecv(p + off, n, MPI_BYTE, peer, tag(round), comm_, &req));
      round_.reqs.push_back(req);
      round_.peer.push_back(peer);
      round_.is_send.push_back(send ? 1 : 0);
    }
    round_.bytes += bytes;
  }
  void post_send(const void* data, std::size_t bytes, int peer, int round) { post(true, data, bytes, peer, round); }
  void post_recv(void* data, std::size_t bytes, int peer, int round) { post(false, data, bytes, peer, round); }

  // Round 0: every rank's description (and a small call's data) to every rank; then the same verdict
  // everywhere. A receive always has room for the largest message any rank sends in this round, so a
  // mismatched call never truncates one.
  void describe_round(const CallDesc& desc, bool null_buffer, const void* payload, std::size_t payload_bytes) {
    WireDesc mine;
    mine.seq = seq_;
    mine.count = desc.count;
    mine.root = desc.root;
    mine.payload = payload_bytes;
    mine.kind = static_cast<std::uint8_t>(desc.kind);
    mine.dtype = static_cast<std::uint8_t>(desc.dtype);
    mine.op = static_cast<std::uint8_t>(desc.op);
    mine.null_buffer = passes_null_buffer(desc, null_buffer) ? 1 : 0;
    if (mine.null_buffer) mine.payload = payload_bytes = 0;
    std::memcpy(outbox_.data(), &mine, sizeof mine);
    if (payload_bytes > 0) std::memcpy(outbox_.data() + header_bytes, payload, payload_bytes);

    round_.clear();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      post_recv(inbox_of(p), header_bytes + inline_limit, p, 0);
      post_send(outbox_.data(), header_bytes + payload_bytes, p, 0);
    }
    wait(round_);

    for (int p = 0; p < size_; ++p) {
      WireDesc& w = wires_[static_cast<std::size_t>(p)];
      if (p == rank_) w = mine;
      else std::memcpy(&w, inbox_of(p), sizeof w);
      if (w.seq != seq_)
        throw Error(call_on_rank(call_, rank_) + ": rank " + std::to_string(p) + " sent the description of call " +
                    std::to_string(w.seq) + " during call " + std::to_string(seq_));
      descs_[static_cast<std::size_t>(p)] =
          CallDesc{static_cast<CallKind>(w.kind), static_cast<std::size_t>(w.count), static_cast<DType>(w.dtype),
                   static_cast<ReduceOp>(w.op), static_cast<int>(w.root)};
      null_buffer_[static_cast<std::size_t>(p)] = w.null_buffer;
    }
    // Every rank judges the same N descriptions, so all of them throw the same message or none does.
    const std::string verdict = check_calls(descs_, null_buffer_);
    if (!verdict.empty()) throw RefusedCall(call_on_rank(call_, rank_) + ": " + verdict);
    // Equal descriptions make equal decisions about sending data inline; check it all the same, since
    // a wrong guess here would read stale bytes.
    const std::size_t bytes = desc.count * dtype_size(desc.dtype);
    const std::size_t inline_bytes = fits_inline(bytes) ? bytes : 0;
    for (int p = 0; p < size_; ++p) {
      const std::size_t want = desc.kind == CallKind::broadcast && p != desc.root ? 0 : inline_bytes;
      DPCHECK_ASSERT(wires_[static_cast<std::size_t>(p)].payload == want);
    }
  }

  // Polls the round until every request completes; at the deadline, breaks the communicator and
  // throws a TimeoutError naming the ranks whose messages did not arrive (or that did not take ours).
  void wait(Round& round) {
    if (poll(round)) return;
    std::vector<int> silent, deaf;
    for (std::size_t i = 0; i < round.reqs.size(); ++i) {
      if (round.reqs[i] == MPI_REQUEST_NULL) continue;
      std::vector<int>& list = round.is_send[i] ? deaf : silent;
      if (std::find(list.begin(), list.end(), round.peer[i]) == list.end()) list.push_back(round.peer[i]);
    }
    std::sort(silent.begin(), silent.end());
    std::sort(deaf.begin(), deaf.end());
    std::erase_if(deaf, [&](int p) { return std::find(silent.begin(), silent.end(), p) != silent.end(); });
    std::string why;
    if (!silent.empty()) why = "no message from " + rank_list(silent);
    if (!deaf.empty()) why += (why.empty() ? "" : "; ") + rank_list(deaf) + " did not receive";
    broken_ = timed_out_on_rank(call_, rank_, timeout()) + ": " + why;
    broken_by_timeout_ = true;
    release(round);
    throw TimeoutError(broken_);
  }

  bool poll(Round& round) {
    const int n = static_cast<int>(round.reqs.size());
    round.indices.resize(round.reqs.size());
    const auto yield_for = yield_base + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                            static_cast<double>(round.bytes) / yield_bytes_per_second));
    auto last = Clock::now();
    auto nap = std::chrono::duration_cast<Clock::duration>(first_sleep);
    for (;;) {
      int done = 0;
      DPCHECK_MPI_CHECK(MPI_Testsome(n, round.reqs.data(), &done, round.indices.data(), MPI_STATUSES_IGNORE));
      if (done == MPI_UNDEFINED) return true;  // no active request left
      const auto now = Clock::now();
      if (done > 0) {
        last = now;
        nap = std::chrono::duration_cast<Clock::duration>(first_sleep);
        continue;
      }
      if (now >= deadline_) return false;
      const auto idle = now - last;
      if (idle < spin_for) continue;
      if (idle < yield_for) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(std::min(nap, deadline_ - now));
      nap = std::min(nap * 2, std::chrono::duration_cast<Clock::duration>(max_sleep));
    }
  }

  // After a timeout: receives that have not matched are cancelled, so that no late message lands in a
  // buffer the caller has taken back; what still cannot complete is let go (MPI_Request_free), so that
  // MPI_Finalize does not wait for it. Errors are ignored: this runs on the way to a TimeoutError.
  static void release(Round& round) {
    for (std::size_t i = 0; i < round.reqs.size(); ++i)
      if (round.reqs[i] != MPI_REQUEST_NULL && !round.is_send[i]) MPI_Cancel(&round.reqs[i]);
    const auto give_up = Clock::now() + std::chrono::milliseconds(100);
    for (;;) {
      int done = 0;
      if (MPI_Testsome(static_cast<int>(round.reqs.size()), round.reqs.data(), &done, round.indices.data(),
                       MPI_STATUSES_IGNORE) != MPI_SUCCESS ||
          done == MPI_UNDEFINED || Clock::now() >= give_up)
        break;
      if (done == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (MPI_Request& r : round.reqs)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 0;
  std::uint64_t tag_cycle_ = 1;
  std::uint64_t seq_ = 0;  // calls made so far, the same on every rank while in step
  CallKind call_ = CallKind::barrier;
  Clock::time_point deadline_;
  Round round_;
  std::vector<unsigned char> outbox_;  // this rank's round-0 message
  std::vector<unsigned char> inbox_;   // every other rank's round-0 message
  std::vector<WireDesc> wires_;        // every rank's description, as received
  std::vector<CallDesc> descs_;
  std::vector<std::uint8_t> null_buffer_;
  std::vector<const void*> inputs_;
  std::vector<unsigned char> staging_;  // round 1's slices from the other ranks; kept between calls
  std::string broken_;                  // why this communicator can no longer be used
  bool broken_by_timeout_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  return make_on_world_duplicate<MpiComm>("make_mpi_communicator");
}

}  // namespace dpcheck
