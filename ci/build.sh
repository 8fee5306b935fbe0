#!/usr/bin/env bash
# Configures and builds dpcheck in build/ (Release with debug info, warnings as errors).
# Extra arguments go to CMake's configure step, e.g. -DDPCHECK_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
# The "ci" preset (CMakePresets.json): Ninja, build/, RelWithDebInfo, warnings as errors; every test
# program, unless the arguments say otherwise (ci/test.sh leaves the unit tests to its ASan stage).
cmake --preset ci -DDPCHECK_UNIT_TESTS_SANITIZED_ONLY=OFF "$@"
cmake --build --preset ci --parallel "$(nproc)"
