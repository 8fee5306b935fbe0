// Checks for every CUDA, cuBLAS and NCCL call and every kernel launch: a failure throws dpcheck::Error
// naming the call, the library's own words for the code, and the place (src/error.hpp).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "src/error.hpp"

namespace dpcheck::cuda {

const char* cublas_status_text(cublasStatus_t s);

}  // namespace dpcheck::cuda

#define DPCHECK_CUDA_CHECK(call)                                                                                      \
  do {                                                                                                                \
    const cudaError_t dpcheck_err_ = (call);                                                                          \
    if (dpcheck_err_ != cudaSuccess)                                                                                  \
      ::dpcheck::throw_call_error(#call, static_cast<long>(dpcheck_err_), cudaGetErrorString(dpcheck_err_), __FILE__, \
                                  __LINE__);                                                                          \
  } while (0)

#define DPCHECK_CUBLAS_CHECK(call)                                                                       \
  do {                                                                                                   \
    const cublasStatus_t dpcheck_st_ = (call);                                                           \
    if (dpcheck_st_ != CUBLAS_STATUS_SUCCESS)                                                            \
      ::dpcheck::throw_call_error(#call, static_cast<long>(dpcheck_st_),                                 \
                                  ::dpcheck::cuda::cublas_status_text(dpcheck_st_), __FILE__, __LINE__); \
  } while (0)

// After every <<<...>>>: a bad configuration is only reported by the next runtime call otherwise.
#define DPCHECK_LAUNCH_CHECK() DPCHECK_CUDA_CHECK(cudaGetLastError())
