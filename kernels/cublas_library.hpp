// cuBLAS, opened on first use. Linked, it ran its static initializers as every process that carries
// the CUDA engine started, GPU or not: 0.45 s of CPU each on the 2-core CI machine, most of it in page
// faults over cuBLASLt's tables, where a CPU-only test process takes 0.01 s. The engine calls cuBLAS
// through this table instead, filled the first time cublas() is called (a Blas handle is made), so a
// process that makes none never loads the library.
//
// Each entry has the type of the function that <cublas_v2.h> declares, so a call through the table is
// checked against the header as a direct call would be. The library is opened from the directory of the
// CUDA runtime this process loaded (the toolkit keeps both there, and so they come from one toolkit),
// else wherever the dynamic loader finds it (LD_LIBRARY_PATH, the caller's run path, ld.so.conf).
#pragma once

#include <cublas_v2.h>

namespace dpcheck::cuda {

struct CublasLibrary {
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasDestroy_v2) Destroy;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasSetMathMode) SetMathMode;
  decltype(&cublasSetWorkspace_v2) SetWorkspace;
  decltype(&cublasSgemm_v2) Sgemm;
  // The library's cublasGemmEx, with a cublasComputeType_t (the header overloads the name in C++ with
  // an inline wrapper that takes the older cudaDataType).
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                           const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                           cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasGetStatusString) GetStatusString;
};

// The table, opening the library on the first call (thread-safe). Throws dpcheck::Error naming the
// library's file and the loader's reason when it cannot be opened or lacks one of the functions.
const CublasLibrary& cublas();

// The library's file name: libcublas.so.<the major version of the cuBLAS headers compiled against>.
const char* cublas_soname();

}  // namespace dpcheck::cuda
