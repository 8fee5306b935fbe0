// The GPU communicators. Buffers are device pointers; work is queued on the stream set_stream() names
// (the engine's), and host() is a host communicator over the same ranks for control messages.
//
//   cuda-local  N replicas on one GPU, one host thread each (the local backend underneath for the
//               host's part), reduced in the fixed rank order by kernels/allreduce.cu, so every replica
//               gets identical bits. This is how multi-replica GPU properties run on a one-GPU machine.
//   nccl        one process per GPU, the ncclUniqueId broadcast over the host communicator (MPI), or
//               one process driving several GPUs (ranks as threads joining one ncclUniqueId, as
//               ncclCommInitAll does, but each nonblocking so that set-up has a timeout). NCCL refuses
//               two ranks on one GPU, so on a one-GPU machine it runs with one rank.
//
// Every collective first meets its peers on the host communicator, whose timeout names a dead or stuck
// rank; an NCCL call that does not complete within the timeout is aborted (ncclCommAbort).
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "src/comm.hpp"

namespace dpcheck::cuda {

// Runs fn on n threads, each with a cuda-local communicator (device 0).
void run_cuda_local(int n, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout);

// Runs fn on n threads, each driving GPU `rank` through an NCCL communicator (one ncclUniqueId).
void run_nccl_threads(int n, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout);

// An NCCL communicator for this process (one rank of `host`), on the GPU `device`.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, int device);

// The number of CUDA devices (0 without a usable one).
int device_count();

}  // namespace dpcheck::cuda
