// The GPU's plumbing shared by the kernels, the CUDA engine and the GPU communicators: whether there is
// a device (and why not), owning wrappers for device memory, streams and cuBLAS handles.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>

#include "kernels/cuda_check.hpp"

namespace dpcheck::cuda {

// True when a CUDA device can be used; otherwise false with the runtime's reason in *why (on machines
// without a GPU: "CUDA driver version is insufficient for CUDA runtime version"). The count is read
// only when the call succeeds: on failure the runtime leaves it untouched.
bool device_available(std::string* why = nullptr);

// Throws UsageError("no CUDA device: <reason>") when there is none.
void require_device();

template <class T> class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    release();
    p_ = std::exchange(o.p_, nullptr);
    n_ = std::exchange(o.n_, 0);
    return *this;
  }

  // Grows to at least n elements (contents are not kept); never shrinks, so buffers reused for every
  // micro-batch are allocated once.
  void reserve(std::size_t n) {
    if (n > n_) resize(n);
  }
  void resize(std::size_t n) {
    release();
    if (n > 0) DPCHECK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    n_ = n;
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  void release() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

class Stream {
 public:
  Stream() { DPCHECK_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void synchronize() const { DPCHECK_CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

// One cuBLAS handle per stream, with a workspace of its own: cuBLAS promises the same bits on every run
// only then (several streams sharing a handle's workspace may pick different implementations).
class Blas {
 public:
  Blas(cudaStream_t stream, bool tf32);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
  DeviceBuffer<unsigned char> workspace_;
};

}  // namespace dpcheck::cuda
