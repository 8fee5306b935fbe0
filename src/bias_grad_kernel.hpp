// Which bias-gradient kernel the CUDA engine runs (kernels/bias_grad.hpp): its own, or a mutant's. Its own
// header, so that the kernel's file includes this and not the whole contract of src/target/cuda_api.hpp
// (nlohmann-json, the engine and communicator interfaces), which nvcc's front ends parsed for 10 of
// that file's 15 seconds.
#pragma once

namespace dpcheck::cuda {

enum class BiasGradKernel {
  ordered,    // the kernel dpcheck trains with
  atomic,     // mutant: every element added with atomicAdd, in whatever order the scheduler picks
  skip_tail,  // mutant: the tail tile's bound is off by one, so the last column is never written when
              // the width is not a multiple of the tile
};

}  // namespace dpcheck::cuda
