// What a target asks of an engine (src/target/backends.hpp's rows build engines and optimizers from it): the
// products' format, the kernels, the collectives' timeout, and the two broken parts that mutants of an
// engine swap in. A mutant's engine hook edits it (src/target/mutant_hooks.hpp); the row reads what its engine has.
#pragma once

#include <chrono>
#include <string>

#include "src/bias_grad_kernel.hpp"
#include "src/comm.hpp"
#include "src/low_precision.hpp"

namespace dpcheck {

struct EngineSpec {
  Precision precision = Precision::fp32;  // --precision: the matrix products' input format
  bool tf32 = false;                      // --tf32: TF32 tensor cores (an engine whose row has tf32)
  std::string kernels = {};               // --kernels: a kernel plugin's path; empty: the engine's own
  std::chrono::milliseconds timeout = Communicator::default_timeout;  // what a plugin's call may take
  bool accumulate_in_low_precision = false;  // the mutant bf16-accumulate (a host engine's products)
  cuda::BiasGradKernel bias_grad = cuda::BiasGradKernel::ordered;  // the GPU mutants' bias-gradient kernel
};

}  // namespace dpcheck
