#include "kernels/gpu_comm.hpp"

#include <nccl.h>

#include <array>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "kernels/allreduce.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"
#include "src/builtin_names.hpp"
#include "src/comm/collective.hpp"
#include "src/comm/local_comm.hpp"
#include "src/error.hpp"

#define DPCHECK_NCCL_CHECK(call)                                                                                    \
  do {                                                                                                              \
    const ncclResult_t dpcheck_nr_ = (call);                                                                        \
    if (dpcheck_nr_ != ncclSuccess)                                                                                 \
      ::dpcheck::throw_call_error(#call, static_cast<long>(dpcheck_nr_), ncclGetErrorString(dpcheck_nr_), __FILE__, \
                                  __LINE__);                                                                        \
  } while (0)

namespace dpcheck::cuda {

namespace {

// Shared by both GPU backends: the host side, the stream, the staging copies, and the agreement every
// collective starts with.
class DeviceCommunicator : public Communicator {
 public:
  DeviceCommunicator(Communicator& host, int device) : host_(host), device_(device) {
    Communicator::set_timeout(host.timeout());
  }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  MemorySpace memory_space() const override { return MemorySpace::device; }
  Communicator& host() override { return host_; }
  bool shares_address_space() const override { return host_.shares_address_space(); }
  // A bucketed all-reduce's communication thread (src/train/bucketing.hpp) may make the calls, one at a time:
  // the host side must allow it, and each call selects its device itself (select_device).
  bool callable_from_any_thread() const override { return host_.callable_from_any_thread(); }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  void set_timeout(std::chrono::milliseconds t) override {
    Communicator::set_timeout(t);
    host_.set_timeout(t);
  }
  void to_host(const void* src, void* dst, std::size_t bytes) override {
    if (bytes == 0) return;
    select_device();
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    DPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void from_host(const void* src, void* dst, std::size_t bytes) override {
    if (bytes == 0) return;
    select_device();
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    DPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 protected:
  struct Peer {
    void* buf = nullptr;         // allreduce, broadcast: the buffer; allgather: recv
    const void* send = nullptr;  // allgather only
  };

  // The device is selected first in every call: it may come from a thread that has not selected it.
  void select_device() { DPCHECK_CUDA_CHECK(cudaSetDevice(device_)); }
  void sync() {
    select_device();
    DPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Every rank's call and buffers, gathered on the host and judged on every rank by the host backends'
  // own rules (src/comm/collective.hpp): calls that disagree (count, dtype, op, root, kind) or that no
  // backend supports (uint8 sums, avg of integers, a root outside the world, a null buffer) throw on
  // every rank, with the same words as the local and mpi backends, before any rank reads a peer's
  // buffer or enters NCCL. The gather is also the rendezvous that a missing rank times out in.
  std::vector<Peer> agree(const CallDesc& desc, void* buf, const void* send) {
    constexpr std::size_t kWords = 5;
    const std::array<std::uint64_t, kWords> mine{
        static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(buf)),
        static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(send)), desc.count,
        static_cast<std::uint64_t>(desc.kind) | static_cast<std::uint64_t>(desc.dtype) << 8 |
            static_cast<std::uint64_t>(desc.op) << 16 | static_cast<std::uint64_t>(stream_ ? 0 : 1) << 24,
        static_cast<std::uint64_t>(static_cast<std::int64_t>(desc.root))};
    const auto n = static_cast<std::size_t>(size());
    std::vector<std::uint64_t> all(kWords * n);
    host_.allgather(mine.data(), all.data(), kWords, DType::u64);
    std::vector<CallDesc> descs(n);
    std::vector<std::uint8_t> null_buffer(n);
    std::vector<Peer> peers(n);
    std::string without_stream;
    for (std::size_t r = 0; r < n; ++r) {
      const std::uint64_t* w = all.data() + kWords * r;
      CallDesc& d = descs[r];
      d.kind = static_cast<CallKind>(w[3] & 0xff);
      d.dtype = static_cast<DType>((w[3] >> 8) & 0xff);
      d.op = static_cast<ReduceOp>((w[3] >> 16) & 0xff);
      d.count = static_cast<std::size_t>(w[2]);
      d.root = static_cast<int>(static_cast<std::int64_t>(w[4]));
      peers[r].buf = reinterpret_cast<void*>(static_cast<std::uintptr_t>(w[0]));
      peers[r].send = reinterpret_cast<const void*>(static_cast<std::uintptr_t>(w[1]));
      const bool some_null = !peers[r].buf || (d.kind == CallKind::allgather && !peers[r].send);
      null_buffer[r] = passes_null_buffer(d, some_null) ? 1 : 0;
      if ((w[3] >> 24) & 1) without_stream += (without_stream.empty() ? "" : ", ") + std::to_string(r);
    }
    const std::string verdict = check_calls(descs, null_buffer);
    if (!verdict.empty()) throw Error(call_on_rank(desc.kind, rank()) + ": " + verdict);
    // Without the engine's stream the work would go to the legacy default stream, which is not ordered
    // with the engine's non-blocking one: a peer could read a half-written buffer. Judged on every rank.
    if (!without_stream.empty() && desc.count > 0)
      throw Error(call_on_rank(desc.kind, rank()) + ": set_stream() was never called on rank(s) " + without_stream);
    return peers;
  }

  Communicator& host_;
  int device_;
  cudaStream_t stream_ = nullptr;
};

class CudaLocalCommunicator final : public DeviceCommunicator {
 public:
  using DeviceCommunicator::DeviceCommunicator;
  std::string_view backend() const override { return builtin::cuda_local; }

  // Every collective: this replica's stream is synchronized first (its writes into the buffers are done
  // before any other replica reads them), and ends, after its own stream is synchronized again, with a
  // vote of every replica that is also a barrier (finish(): no replica uses, or changes, a buffer that
  // a peer still reads or writes).
  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    sync();
    const std::vector<Peer> peers = agree(CallDesc{CallKind::allreduce, count, dtype, op, 0}, buf, nullptr);
    finish(CallKind::allreduce, [&] {
      const std::size_t n = peers.size(), r = static_cast<std::size_t>(rank());
      const std::size_t lo = count * r / n, hi = count * (r + 1) / n;
      std::vector<void*> bufs(n);
      for (std::size_t k = 0; k < n; ++k) bufs[k] = peers[k].buf;
      reduce_rank_order(bufs.data(), static_cast<int>(n), lo, hi, dtype, op, stream_);
    });
  }

  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    sync();
    const std::vector<Peer> peers =
        agree(CallDesc{CallKind::broadcast, count, dtype, ReduceOp::sum, root}, buf, nullptr);
    finish(CallKind::broadcast, [&] {
      if (rank() != root && count > 0)
        DPCHECK_CUDA_CHECK(cudaMemcpyAsync(buf, peers[static_cast<std::size_t>(root)].buf, count * dtype_size(dtype),
                                           cudaMemcpyDeviceToDevice, stream_));
    });
  }

  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    sync();
    const std::vector<Peer> peers = agree(CallDesc{CallKind::allgather, count, dtype, ReduceOp::sum, 0}, recv, send);
    finish(CallKind::allgather, [&] {
      const std::size_t bytes = count * dtype_size(dtype);
      for (std::size_t r = 0; r < peers.size() && bytes > 0; ++r) {
        char* dst = static_cast<char*>(recv) + r * bytes;
        // In place, this rank's send is already its own block: a copy onto itself would overlap.
        if (dst != peers[r].send)
          DPCHECK_CUDA_CHECK(cudaMemcpyAsync(dst, peers[r].send, bytes, cudaMemcpyDeviceToDevice, stream_));
      }
    });
  }

  void barrier() override {
    sync();
    agree(CallDesc{}, nullptr, nullptr);
  }

 private:
  // The part of a collective after the agreement, then this replica's stream, then a vote of every
  // replica on whether its part succeeded (which is also the closing barrier): if any failed, every
  // replica throws, since its buffer may hold a slice that was never reduced. The failing replica still
  // waits for its stream and takes part in the vote before its error leaves: its caller may free the
  // buffers, and the peers' kernels may still be using them.
  template <class Body> void finish(CallKind kind, Body&& body) {
    std::exception_ptr error;
    try {
      body();
      sync();
    } catch (...) {
      error = std::current_exception();
      cudaStreamSynchronize(stream_);
    }
    bool all_ok = false;
    try {
      all_ok = host_.all(!error);
    } catch (...) {
      if (!error) throw;  // the error already on its way says more than a peer that is also gone
    }
    if (error) std::rethrow_exception(error);
    if (!all_ok) throw Error(call_on_rank(kind, rank()) + ": another replica failed in its part of the call");
  }
};

// bfloat16 and float16 sums: NCCL rounds to the format at every hop of its ring, not once at the end
// as the host backends and cuda-local do (src/comm.hpp).
ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u64: return ncclUint64;
    case DType::u8: return ncclUint8;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  throw Error("nccl: no NCCL type for dtype " + std::to_string(static_cast<int>(t)));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

// Whether an NCCL call was accepted: a nonblocking communicator answers ncclInProgress while it works.
void check_enqueued(ncclResult_t r, const char* call, const char* file, int line) {
  if (r != ncclSuccess && r != ncclInProgress)
    throw_call_error(call, static_cast<long>(r), ncclGetErrorString(r), file, line);
}
#define DPCHECK_NCCL_ENQUEUE(call) check_enqueued((call), #call, __FILE__, __LINE__)

class NcclCommunicator final : public DeviceCommunicator {
 public:
  // Joins the NCCL communicator that `id` names as rank host.rank() of host.size(), on GPU `device`.
  // The communicator is nonblocking, so that a peer that never joins, or never makes a call, ends in a
  // timeout instead of a hang.
  NcclCommunicator(Communicator& host, int device, const ncclUniqueId& id) : DeviceCommunicator(host, device) {
    DPCHECK_CUDA_CHECK(cudaSetDevice(device_));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    try {
      DPCHECK_NCCL_ENQUEUE(ncclCommInitRankConfig(&comm_, host.size(), id, host.rank(), &config));
      wait_ready("NCCL communicator set-up", deadline_after(timeout()));
    } catch (...) {
      abort_now();  // the destructor does not run for a constructor that throws
      throw;
    }
  }
  ~NcclCommunicator() override {
    if (!comm_) return;  // never joined, or aborted
    cudaSetDevice(device_);
    // Finalized first, within the timeout (a dead peer would keep it from ever becoming quiescent), then
    // destroyed; aborted if it does not get there.
    const ncclResult_t finalize = ncclCommFinalize(comm_);
    ncclResult_t state = finalize == ncclSuccess || finalize == ncclInProgress ? ncclInProgress : finalize;
    const auto deadline = deadline_after(timeout());
    while (state == ncclInProgress && std::chrono::steady_clock::now() <= deadline) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) break;
      if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (state == ncclSuccess) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
  }
  std::string_view backend() const override { return builtin::nccl; }
  // Each rank's buffers live on its own GPU: even as threads of one process, no rank may read another's
  // without peer access, so checks gather copies instead.
  bool shares_address_space() const override { return false; }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    run(CallDesc{CallKind::allreduce, count, dtype, op, 0}, buf, nullptr, [&](auto deadline) {
      // avg is the sum divided by size() (src/comm.hpp). NCCL's own ncclAvg multiplies every input by
      // 1/size() before summing, which rounds differently whenever size() is not a power of two.
      DPCHECK_NCCL_ENQUEUE(ncclAllReduce(buf, buf, count, nccl_type(dtype), op == ReduceOp::avg ? ncclSum : nccl_op(op),
                                         comm_, stream_));
      if (op == ReduceOp::avg) {
        // The division must be queued after the sum, which a nonblocking communicator may not have queued yet.
        wait_ready("allreduce", deadline);
        divide_elements(buf, count, dtype, size(), stream_);
      }
    });
  }
  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    run(CallDesc{CallKind::broadcast, count, dtype, ReduceOp::sum, root}, buf, nullptr,
        [&](auto) { DPCHECK_NCCL_ENQUEUE(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, stream_)); });
  }
  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    run(CallDesc{CallKind::allgather, count, dtype, ReduceOp::sum, 0}, recv, send,
        [&](auto) { DPCHECK_NCCL_ENQUEUE(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_)); });
  }
  void barrier() override {
    sync();
    agree(CallDesc{}, nullptr, nullptr);
  }

 private:
  // Waits until NCCL has finished what it was doing on the host (a nonblocking communicator's set-up, or
  // the queueing of a call it answered with ncclInProgress), watching for asynchronous errors; on an
  // error or at `deadline` the communicator is aborted and the error names `what` and this rank.
  void wait_ready(const std::string& what, std::chrono::steady_clock::time_point deadline) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      DPCHECK_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress)
        fail(what + " on rank " + std::to_string(rank()) + " failed in NCCL: " + ncclGetErrorString(state));
      if (std::chrono::steady_clock::now() > deadline) time_out(what);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  [[noreturn]] void fail(const std::string& message) {
    abort_now();
    throw Error(message);
  }
  [[noreturn]] void time_out(const std::string& what) {
    abort_now();
    throw TimeoutError(what + " timed out on rank " + std::to_string(rank()) + " after " +
                       std::to_string(timeout().count() / 1000.0) + " s inside NCCL");
  }
  void abort_now() {  // idempotent
    aborted_ = true;
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Meets the peers on the host first, agreeing on the call (a missing rank is named there, a mismatch
  // throws on every rank instead of hanging inside NCCL), then waits for NCCL within the timeout,
  // watching for asynchronous errors; on expiry the communicator is aborted. Nothing is enqueued for
  // zero elements, whose buffers may be null.
  template <class Enqueue> void run(const CallDesc& desc, void* buf, const void* send, Enqueue&& enqueue) {
    const std::string call(kind_name(desc.kind));
    if (aborted_) throw Error(call + " on rank " + std::to_string(rank()) + ": the NCCL communicator was aborted");
    DPCHECK_CUDA_CHECK(cudaSetDevice(device_));
    agree(desc, buf, send);
    if (desc.count == 0) return;
    const auto deadline = deadline_after(timeout());
    try {
      enqueue(deadline);
    } catch (...) {
      abort_now();  // peers that queued their part learn of it at their deadline, not never
      throw;
    }
    // Until NCCL has queued the call, the stream can look idle.
    wait_ready(call, deadline);
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) DPCHECK_CUDA_CHECK(q);
      ncclResult_t async = ncclSuccess;
      DPCHECK_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress)
        fail(call + " on rank " + std::to_string(rank()) + " failed in NCCL: " + ncclGetErrorString(async));
      if (std::chrono::steady_clock::now() > deadline) time_out(call);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
};

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void run_cuda_local(int n, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  // A size outside 1..64 is wrong with or without a GPU: say so before asking for one.
  if (n < 1 || n > kMaxLocalReplicas)
    throw UsageError("cuda-local runs 1 to " + std::to_string(kMaxLocalReplicas) + " replicas, not " +
                     std::to_string(n));
  require_device();
  run_local(
      n,
      [&](Communicator& host) {
        DPCHECK_CUDA_CHECK(cudaSetDevice(0));
        CudaLocalCommunicator comm(host, 0);
        fn(comm);
      },
      timeout);
}

void run_nccl_threads(int n, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  require_device();
  if (n < 1) throw UsageError("nccl runs at least 1 rank, not " + std::to_string(n));
  if (n > device_count())
    throw UsageError("nccl needs one GPU per rank: " + std::to_string(n) + " ranks, " + std::to_string(device_count()) +
                     " GPUs (use cuda-local for several replicas on one GPU)");
  // What ncclCommInitAll does (one ncclUniqueId, then every rank joins), with each rank joining from
  // its own thread and nonblocking, so that set-up and every call end within the timeout.
  ncclUniqueId id{};
  DPCHECK_NCCL_CHECK(ncclGetUniqueId(&id));
  run_local(
      n,
      [&](Communicator& host) {
        NcclCommunicator comm(host, host.rank(), id);
        fn(comm);
      },
      timeout);
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, int device) {
  require_device();
  DPCHECK_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId id{};
  if (host.rank() == 0) DPCHECK_NCCL_CHECK(ncclGetUniqueId(&id));
  host.broadcast(&id, sizeof id, DType::u8, 0);
  return std::make_unique<NcclCommunicator>(host, device, id);
}

}  // namespace dpcheck::cuda
