// GPU benchmarks: the CUDA trainer's step against PyTorch's on the same model in the same run, and the
// replica hash's read bandwidth against a device-to-device copy's. Used by `dpcheck bench step` and
// `dpcheck bench hash` (src/cli/cmd_bench.cpp) through the plugin; their tables are printed by
// src/cli/gpu_report.cpp.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "src/target/cuda_api.hpp"

namespace dpcheck::cuda {

std::vector<StepBenchRow> bench_step(const StepBenchOptions& options);

HashBenchRow bench_hash(std::size_t bytes, int repeats);

}  // namespace dpcheck::cuda
