#include "kernels/device.hpp"

#include "kernels/cublas_library.hpp"

namespace dpcheck::cuda {

const char* cublas_status_text(cublasStatus_t s) { return cublas().GetStatusString(s); }

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error
    return false;
  }
  if (count < 1) {
    if (why) *why = "the CUDA runtime reports no device";
    return false;
  }
  return true;
}

void require_device() {
  std::string why;
  if (!device_available(&why)) throw UsageError("no CUDA device: " + why);
}

Blas::Blas(cudaStream_t stream, bool tf32) {
  DPCHECK_CUBLAS_CHECK(cublas().Create(&h_));
  try {
    DPCHECK_CUBLAS_CHECK(cublas().SetStream(h_, stream));
    // Pedantic: plain FP32 arithmetic, no TF32 or reduced-precision reductions, unless asked.
    DPCHECK_CUBLAS_CHECK(cublas().SetMathMode(h_, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
    constexpr std::size_t kWorkspace = 32u << 20;  // cuBLAS's recommendation for Hopper
    workspace_.resize(kWorkspace);
    DPCHECK_CUBLAS_CHECK(cublas().SetWorkspace(h_, workspace_.get(), kWorkspace));
  } catch (...) {
    cublas().Destroy(h_);
    throw;
  }
}

Blas::~Blas() {
  if (h_) cublas().Destroy(h_);
}

}  // namespace dpcheck::cuda
