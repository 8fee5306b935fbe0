#!/usr/bin/env bash
# Builds what ci/gpu.sh runs and gathers it in gpu-bin/ (git-ignored): the dpcheck command, the audit
# library, the CUDA plugin, the example plugins and the test binaries of ci/gpu.sh's "tests" rows (a
# runner takes at most 64 MiB of them; every test binary would be about 100), for CUDA architecture 90
# (Hopper) unless DPCHECK_CUDA_ARCH says otherwise. Built without MPI, so that a GPU runner needs only the CUDA runtime, cuBLAS and NCCL;
# GoogleTest and RapidCheck are linked statically and xxHash is header-only.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
arch=${DPCHECK_CUDA_ARCH:-90}
# The "gpu" preset (CMakePresets.json): build-gpu/, Release, CUDA on, MPI off, warnings as errors.
cmake --preset gpu -DCMAKE_CUDA_ARCHITECTURES="$arch"
cmake --build --preset gpu --parallel "$(nproc)"

rm -rf gpu-bin
mkdir -p gpu-bin/tests
cp build-gpu/dpcheck build-gpu/libdpcheck_audit.so build-gpu/libdpcheck_cuda.so gpu-bin/
# The rows "tests test-NAME ..." of ci/gpu.sh's step table name the binaries it runs: NAME_test.
tests=$(awk '/^step_table=/ { on = 1; next } on && /^'"'"'/ { on = 0 } on && $1 == "tests" { sub(/^test-/, "", $2); print $2 }' ci/gpu.sh)
[ -n "$tests" ] || { echo "ci/build-gpu.sh: no tests rows in ci/gpu.sh's step table" >&2; exit 1; }
for t in $tests; do cp "build-gpu/tests/${t}_test" gpu-bin/tests/; done
# The plugin examples, for conform on the GPU (comm_nccl) and beside it on the host.
mkdir -p gpu-bin/examples
cp build-gpu/examples/comm_nccl/libdpcheck_comm_nccl.so build-gpu/examples/comm_ring/libdpcheck_comm_ring.so \
  build-gpu/examples/kernels_naive/libdpcheck_kernels_naive.so gpu-bin/examples/
strip --strip-unneeded gpu-bin/dpcheck gpu-bin/tests/* 2>/dev/null || true
echo "gpu-bin: $(du -sh gpu-bin | cut -f1) in $(find gpu-bin -type f | wc -l) files"
mib=$(du -sm gpu-bin | cut -f1)
((mib <= 64)) || { echo "ci/build-gpu.sh: gpu-bin/ is ${mib} MiB, more than the 64 MiB a GPU runner takes" >&2; exit 1; }
echo "libraries the GPU runner must provide (the plugin's; dpcheck itself loads it on first GPU use):"
ldd gpu-bin/libdpcheck_cuda.so | grep -E "cuda|nccl|not found" || true
echo "and cuBLAS, which the plugin opens on first use beside the CUDA runtime (kernels/cublas_library.hpp)"
