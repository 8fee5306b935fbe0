#include "kernels/gpu_comm.hpp"

#include <nccl.h>

#include <array>
#include <thread>
#include <vector>

#include "kernels/allreduce.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"
#include "src/error.hpp"
#include "src/local_comm.hpp"

#define DPCHECK_NCCL_CHECK(call)                                                                           \
  do {                                                                                                     \
    const ncclResult_t dpcheck_nr_ = (call);                                                               \
    if (dpcheck_nr_ != ncclSuccess)                                                                        \
      ::dpcheck::throw_call_error(#call, static_cast<long>(dpcheck_nr_), ncclGetErrorString(dpcheck_nr_),  \
                                  __FILE__, __LINE__);                                                     \
  } while (0)

namespace dpcheck::cuda {

namespace {

// Shared by both GPU backends: the host side, the stream, and the staging copies.
class DeviceCommunicator : public Communicator {
 public:
  explicit DeviceCommunicator(Communicator& host) : host_(host) { Communicator::set_timeout(host.timeout()); }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  MemorySpace memory_space() const override { return MemorySpace::device; }
  Communicator& host() override { return host_; }
  bool shares_address_space() const override { return host_.shares_address_space(); }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  void set_timeout(std::chrono::milliseconds t) override {
    Communicator::set_timeout(t);
    host_.set_timeout(t);
  }
  void to_host(const void* src, void* dst, std::size_t bytes) override {
    if (bytes == 0) return;
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    DPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void from_host(const void* src, void* dst, std::size_t bytes) override {
    if (bytes == 0) return;
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    DPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 protected:
  void sync() { DPCHECK_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  Communicator& host_;
  cudaStream_t stream_ = nullptr;
};

class CudaLocalCommunicator final : public DeviceCommunicator {
 public:
  using DeviceCommunicator::DeviceCommunicator;
  std::string_view backend() const override { return "cuda-local"; }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    // This replica's writes into buf must be done before any other replica reads it.
    sync();
    const std::vector<void*> bufs = exchange("allreduce", buf, nullptr, count, dtype, static_cast<int>(op));
    const std::size_t n = bufs.size(), r = static_cast<std::size_t>(rank());
    const std::size_t lo = count * r / n, hi = count * (r + 1) / n;
    reduce_rank_order(bufs.data(), static_cast<int>(n), lo, hi, dtype, op, stream_);
    sync();
    host_.barrier();  // every slice is reduced before anyone uses the result
  }

  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    sync();
    const std::vector<void*> bufs = exchange("broadcast", buf, nullptr, count, dtype, 1000 + root);
    if (rank() != root && count > 0)
      DPCHECK_CUDA_CHECK(cudaMemcpyAsync(buf, bufs[static_cast<std::size_t>(root)], count * dtype_size(dtype),
                                         cudaMemcpyDeviceToDevice, stream_));
    sync();
    host_.barrier();  // the root may not change its buffer before everyone copied it
  }

  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    sync();
    const std::vector<void*> sends = exchange("allgather", const_cast<void*>(send), recv, count, dtype, 2000);
    const std::size_t bytes = count * dtype_size(dtype);
    for (std::size_t r = 0; r < sends.size() && bytes > 0; ++r)
      DPCHECK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(recv) + r * bytes, sends[r], bytes,
                                         cudaMemcpyDeviceToDevice, stream_));
    sync();
    host_.barrier();
  }

  void barrier() override {
    sync();
    host_.barrier();
  }

 private:
  // Every rank's buffer pointer, after checking that all ranks called the same collective alike.
  std::vector<void*> exchange(const char* call, void* buf, void* /*recv*/, std::size_t count, DType dtype, int tag) {
    const std::array<std::uint64_t, 3> mine{reinterpret_cast<std::uint64_t>(buf), count,
                                            static_cast<std::uint64_t>(dtype) | static_cast<std::uint64_t>(tag) << 8};
    std::vector<std::uint64_t> all(3 * static_cast<std::size_t>(size()));
    host_.allgather(mine.data(), all.data(), 3, DType::u64);
    std::vector<void*> bufs;
    for (int r = 0; r < size(); ++r) {
      const auto k = 3 * static_cast<std::size_t>(r);
      if (all[k + 1] != count || all[k + 2] != mine[2])
        throw Error(std::string(call) + " on rank " + std::to_string(rank()) + ": rank " + std::to_string(r) +
                    " called a different collective or count (" + std::to_string(all[k + 1]) + " elements against " +
                    std::to_string(count) + ")");
      bufs.push_back(reinterpret_cast<void*>(all[k]));
    }
    return bufs;
  }
};

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u64: return ncclUint64;
    case DType::u8: return ncclUint8;
  }
  return ncclFloat32;
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

class NcclCommunicator final : public DeviceCommunicator {
 public:
  // Joins (or, with `owned` false, adopts) an NCCL communicator for this rank.
  NcclCommunicator(Communicator& host, int device, ncclComm_t adopt = nullptr)
      : DeviceCommunicator(host), device_(device), comm_(adopt) {
    DPCHECK_CUDA_CHECK(cudaSetDevice(device_));
    if (comm_) return;
    ncclUniqueId id{};
    if (host.rank() == 0) DPCHECK_NCCL_CHECK(ncclGetUniqueId(&id));
    host.broadcast(&id, sizeof id, DType::u8, 0);
    DPCHECK_NCCL_CHECK(ncclCommInitRank(&comm_, host.size(), id, host.rank()));
  }
  ~NcclCommunicator() override {
    if (comm_) {
      if (aborted_)
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
  }
  std::string_view backend() const override { return "nccl"; }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if (dtype == DType::u8) throw Error("allreduce does not support uint8");
    run("allreduce", [&] {
      DPCHECK_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), nccl_op(op), comm_, stream_));
    });
  }
  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    run("broadcast", [&] { DPCHECK_NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm_, stream_)); });
  }
  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    run("allgather", [&] { DPCHECK_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, stream_)); });
  }
  void barrier() override {
    sync();
    host_.barrier();
  }

 private:
  // Meets the peers on the host first (a missing one is named there), then waits for NCCL within the
  // timeout, watching for asynchronous errors; on expiry the communicator is aborted.
  template <class Enqueue>
  void run(const char* call, Enqueue&& enqueue) {
    if (aborted_) throw Error(std::string(call) + " on rank " + std::to_string(rank()) + ": the NCCL communicator was aborted");
    DPCHECK_CUDA_CHECK(cudaSetDevice(device_));
    host_.barrier();
    enqueue();
    const auto deadline = std::chrono::steady_clock::now() + timeout();
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) DPCHECK_CUDA_CHECK(q);
      ncclResult_t async = ncclSuccess;
      DPCHECK_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        aborted_ = true;
        throw Error(std::string(call) + " on rank " + std::to_string(rank()) + " failed in NCCL: " + ncclGetErrorString(async));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        aborted_ = true;
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw TimeoutError(std::string(call) + " timed out on rank " + std::to_string(rank()) + " after " +
                           std::to_string(timeout().count() / 1000.0) + " s inside NCCL");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  int device_;
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
  require_device();
  if (n > kMaxLocalReplicas) throw UsageError("cuda-local runs at most 64 replicas");
  run_local(n, [&](Communicator& host) {
    DPCHECK_CUDA_CHECK(cudaSetDevice(0));
    CudaLocalCommunicator comm(host);
    fn(comm);
  }, timeout);
}

void run_nccl_threads(int n, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  require_device();
  if (n > device_count())
    throw UsageError("nccl needs one GPU per rank: " + std::to_string(n) + " ranks, " + std::to_string(device_count()) +
                     " GPUs (use cuda-local for several replicas on one GPU)");
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n));
  std::vector<int> devices(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) devices[static_cast<std::size_t>(i)] = i;
  DPCHECK_NCCL_CHECK(ncclCommInitAll(comms.data(), n, devices.data()));
  run_local(n, [&](Communicator& host) {
    NcclCommunicator comm(host, host.rank(), comms[static_cast<std::size_t>(host.rank())]);
    fn(comm);
  }, timeout);
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, int device) {
  require_device();
  return std::make_unique<NcclCommunicator>(host, device);
}

}  // namespace dpcheck::cuda
