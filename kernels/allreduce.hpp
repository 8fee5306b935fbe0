// The fixed-order reduction of the cuda-local communicator on the device: N replicas' buffers on one
// GPU, element i reduced as ((b0[i] + b1[i]) + b2[i]) + ..., the same order as the CPU backends (16-bit
// elements in float, rounded to their format once, as there).
// Reference: the local backend (src/comm/collective.hpp); test: tests/cuda_local_comm_test.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "src/comm.hpp"

namespace dpcheck::cuda {

inline constexpr int kMaxLocalReplicas = 64;

// Reduces elements [lo, hi) of the n buffers in rank order and writes the result into all n of them.
void reduce_rank_order(void* const* buffers, int n, std::size_t lo, std::size_t hi, DType dtype, ReduceOp op,
                       cudaStream_t stream);

// buf[i] = buf[i] / n for count float32, float64, bfloat16 or float16 elements: avg as the sum divided
// by n, for the nccl backend, whose own ncclAvg multiplies every input by 1/n before summing. A 16-bit
// element is divided in float and rounded back to its format.
void divide_elements(void* buf, std::size_t count, DType dtype, int n, cudaStream_t stream);

}  // namespace dpcheck::cuda
