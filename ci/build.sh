#!/usr/bin/env bash
# Configures and builds dpcheck in build/ (Release with debug info, warnings as errors).
# Extra arguments go to CMake's configure step, e.g. -DDPCHECK_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
[ -f build/CMakeCache.txt ] && generator=()  # keep whatever generator the build folder already uses
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDPCHECK_WERROR=ON "$@"
cmake --build build --parallel "$(nproc)"
