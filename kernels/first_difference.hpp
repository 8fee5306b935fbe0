// The first element whose bits differ between two device buffers, for locating a replica desync
// without copying whole replicas to the host. Reference: the host MemoryService's first_difference
// (src/cpu/cpu_engine.cpp), a plain loop over the bits; test: tests/first_difference_test.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace dpcheck::cuda {

// The smallest i < n with bits(a[i]) != bits(b[i]), or n when the buffers are identical. Deterministic:
// the minimum does not depend on which thread finds a difference first.
std::size_t first_difference(const float* a, const float* b, std::size_t n, cudaStream_t stream);

}  // namespace dpcheck::cuda
