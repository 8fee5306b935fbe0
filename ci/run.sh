#!/usr/bin/env bash
# dpcheck's main job on the CPU default: installs what is missing, builds what verify runs -- dpcheck and
# the write-audit library it preloads, and the CUDA plugin only where a GPU is present -- and runs
# `dpcheck verify` (every property, 100 cases each, CPU engine, local backend). Extra arguments go to
# verify. ci/test.sh builds everything else.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash ci/setup.sh
cmake --preset ci >/dev/null
targets=(dpcheck dpcheck_audit)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU' &&
   cmake --build --preset ci --target help | grep -q '^dpcheck_cuda:'; then
  targets+=(dpcheck_cuda)
fi
cmake --build --preset ci --parallel "$(nproc)" --target "${targets[@]}"
echo "ci/run.sh: set-up and build took $((SECONDS - start)) s" >&2
exec build/dpcheck verify "$@"
