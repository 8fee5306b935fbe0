// Loading the CUDA plugin (src/target/cuda_api.hpp) on first use: $DPCHECK_CUDA_PLUGIN, else libdpcheck_cuda.so
// beside the running executable, else the one this build made.
#pragma once

#include <string>

#include "src/target/cuda_api.hpp"

namespace dpcheck {

// The plugin, or nullptr with the reason in *why (not built, not found, its CUDA libraries missing).
const cuda::Plugin* cuda_plugin(std::string* why = nullptr);

// The plugin with a usable GPU, or UsageError: "no CUDA device: <the runtime's reason>", or why the
// plugin could not be loaded.
const cuda::Plugin& require_cuda();

}  // namespace dpcheck
