#!/usr/bin/env bash
# What dpcheck says about real libraries (Gloo, Open MPI's and MPICH's own all-reduce, OpenBLAS, BLIS, oneDNN; NCCL
# where a GPU is): every library x algorithm x world size through `dpcheck conform`, written to
# docs/libraries.md. With --check, the CI subset (N = 2 and 3, small cases, and the --schedule rows),
# compared with the committed table: exit 1 when a verdict changed. Needs a build (bash ci/build.sh)
# with the adapters, which are built when ci/setup.sh has installed their libraries. Arguments: see
# --help.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 ci/validate_libraries.py "$@"
