// The replica hash of kernels/hash.cu restated on the host, as plain loops over the same lanes, blocks
// and trees, so that the GPU's result can be checked bit for bit (tests/hash_test.cpp, bench hash).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dpcheck::reference {

std::uint64_t replica_hash(const void* data, std::size_t bytes, std::uint64_t seed);

}  // namespace dpcheck::reference
