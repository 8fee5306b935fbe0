// Launch shapes shared by the elementwise kernels: grid-stride loops over a fixed block size, with the
// grid capped so that a large tensor is covered by a few waves instead of millions of blocks.
#pragma once

namespace dpcheck::cuda {

inline constexpr int kBlock = 256;

inline int grid_for(long long n) {
  const long long blocks = (n + kBlock - 1) / kBlock;
  constexpr long long kMaxBlocks = 132 * 16;  // 16 resident blocks on each of an H200's 132 SMs
  return static_cast<int>(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

}  // namespace dpcheck::cuda
