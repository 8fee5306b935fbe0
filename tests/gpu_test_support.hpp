// What the GPU tests share: skipping, with the runtime's reason, where there is no device; moving
// vectors to and from device buffers; poisoning an output buffer so that an element a kernel leaves
// unwritten cannot pass; and a wrapper that runs code written for host buffers (the communicator
// conformance suite) against a device communicator. Include it only where DPCHECK_HAVE_CUDA is set.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cuda_check.hpp"
#include "kernels/device.hpp"
#include "src/comm.hpp"

// Skips the test, naming the runtime's reason, where no CUDA device can be used.
#define DPCHECK_REQUIRE_GPU()                                                       \
  do {                                                                              \
    std::string why_;                                                               \
    if (!cuda::device_available(&why_)) GTEST_SKIP() << "no CUDA device: " << why_; \
  } while (0)

namespace dpcheck {

// A device copy of `host` (at least one element, so that an empty input still has an address).
template <class T> cuda::DeviceBuffer<T> upload(const std::vector<T>& host, cudaStream_t s) {
  cuda::DeviceBuffer<T> d(std::max<std::size_t>(host.size(), 1));
  if (!host.empty())
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  DPCHECK_CUDA_CHECK(cudaStreamSynchronize(s));
  return d;
}

// The first n elements of d, after the work queued on s.
template <class T> std::vector<T> download(const cuda::DeviceBuffer<T>& d, std::size_t n, cudaStream_t s) {
  std::vector<T> host(n);
  if (n > 0) DPCHECK_CUDA_CHECK(cudaMemcpyAsync(host.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost, s));
  DPCHECK_CUDA_CHECK(cudaStreamSynchronize(s));
  return host;
}

// All bits set: a NaN in float32 and in float64, so an element the kernel does not write cannot pass.
template <class T> void poison(const cuda::DeviceBuffer<T>& d, std::size_t n, cudaStream_t s) {
  DPCHECK_CUDA_CHECK(cudaMemsetAsync(d.get(), 0xff, n * sizeof(T), s));
}

// Host buffers in, device buffers underneath: each call's host buffers are copied to fresh device
// buffers, the device communicator's collective runs on them, and the results are copied back, so that
// the suite (written for host buffers) runs against a device backend. Zero-element calls pass null
// device pointers, as the suite passes null host ones; an allgather whose send block lies inside its
// recv stays in place on the device too.
class Staged final : public Communicator {
 public:
  explicit Staged(Communicator& device) : dev_(device) {
    dev_.set_stream(stream_.get());
    Communicator::set_timeout(device.timeout());
  }
  using Communicator::allgather;  // the typed span forms, beside the overrides below
  using Communicator::allreduce;
  using Communicator::broadcast;
  int rank() const override { return dev_.rank(); }
  int size() const override { return dev_.size(); }
  std::string_view backend() const override { return dev_.backend(); }
  void set_timeout(std::chrono::milliseconds t) override {
    Communicator::set_timeout(t);
    dev_.set_timeout(t);
  }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    const std::size_t bytes = count * dtype_size(dtype);
    const cuda::DeviceBuffer<unsigned char> d(bytes);
    copy(d.get(), buf, bytes, cudaMemcpyHostToDevice);
    dev_.allreduce(device_ptr(d, buf), count, dtype, op);
    copy(buf, d.get(), bytes, cudaMemcpyDeviceToHost);
  }

  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    const std::size_t bytes = count * dtype_size(dtype);
    const cuda::DeviceBuffer<unsigned char> d(bytes);
    copy(d.get(), buf, bytes, cudaMemcpyHostToDevice);
    dev_.broadcast(device_ptr(d, buf), count, dtype, root);
    copy(buf, d.get(), bytes, cudaMemcpyDeviceToHost);
  }

  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    const std::size_t bytes = count * dtype_size(dtype), total = bytes * static_cast<std::size_t>(size());
    const cuda::DeviceBuffer<unsigned char> drecv(total);
    const auto s = reinterpret_cast<std::uintptr_t>(send), r = reinterpret_cast<std::uintptr_t>(recv);
    if (bytes > 0 && recv && s >= r && s < r + total) {  // in place: the send block is part of recv
      copy(drecv.get(), recv, total, cudaMemcpyHostToDevice);
      dev_.allgather(drecv.get() + (s - r), drecv.get(), count, dtype);
    } else {
      const cuda::DeviceBuffer<unsigned char> dsend(bytes);
      copy(dsend.get(), send, bytes, cudaMemcpyHostToDevice);
      dev_.allgather(send ? dsend.get() : nullptr, recv ? drecv.get() : nullptr, count, dtype);
    }
    copy(recv, drecv.get(), total, cudaMemcpyDeviceToHost);
  }

  void barrier() override { dev_.barrier(); }

 private:
  static void* device_ptr(const cuda::DeviceBuffer<unsigned char>& d, const void* host) {
    return host ? d.get() : nullptr;
  }
  void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0 || !dst || !src) return;
    DPCHECK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream_.get()));
    stream_.synchronize();
  }

  Communicator& dev_;
  cuda::Stream stream_;
};

}  // namespace dpcheck
