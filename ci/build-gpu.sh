#!/usr/bin/env bash
# Builds what ci/gpu.sh runs and gathers it in gpu-bin/ (git-ignored): the dpcheck command, the audit
# library and every test binary, for CUDA architecture 90 (Hopper) unless DPCHECK_CUDA_ARCH says
# otherwise. Built without MPI, so that a GPU runner needs only the CUDA runtime, cuBLAS and NCCL;
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
find build-gpu/tests -maxdepth 1 -type f -perm -u+x -name '*_test' -exec cp {} gpu-bin/tests/ \;
# The plugin examples, for conform on the GPU (comm_nccl) and beside it on the host.
mkdir -p gpu-bin/examples
cp build-gpu/examples/comm_nccl/libdpcheck_comm_nccl.so build-gpu/examples/comm_ring/libdpcheck_comm_ring.so \
  build-gpu/examples/kernels_naive/libdpcheck_kernels_naive.so gpu-bin/examples/
strip --strip-unneeded gpu-bin/dpcheck gpu-bin/tests/* 2>/dev/null || true
echo "gpu-bin: $(du -sh gpu-bin | cut -f1) in $(find gpu-bin -type f | wc -l) files"
echo "libraries the GPU runner must provide (the plugin's; dpcheck itself loads it on first GPU use):"
ldd gpu-bin/libdpcheck_cuda.so | grep -E "cuda|cublas|nccl|not found" || true
