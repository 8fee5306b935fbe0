// The tables and JSON of the GPU benchmarks (kernels/gpu_bench.cu, run through the CUDA plugin).
#pragma once

#include <iosfwd>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/target/cuda_api.hpp"

namespace dpcheck::cuda {

void print_step_table(std::ostream& out, const std::vector<StepBenchRow>& rows);
void print_hash_table(std::ostream& out, const HashBenchRow& row);
nlohmann::json step_json(const std::vector<StepBenchRow>& rows);
nlohmann::json hash_json(const HashBenchRow& row);

}  // namespace dpcheck::cuda
