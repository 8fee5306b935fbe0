#!/usr/bin/env bash
# Configures and builds dpcheck in build/ (Release with debug info, warnings as errors).
# Extra arguments go to CMake's configure step, e.g. -DDPCHECK_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
# The "ci" preset (CMakePresets.json): Ninja, build/, RelWithDebInfo, warnings as errors.
cmake --preset ci "$@"
cmake --build --preset ci --parallel "$(nproc)"
