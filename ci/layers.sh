#!/usr/bin/env bash
# The dependency rule between dpcheck's folders, checked on every #include:
#   src/cli -> {conform, properties, divergence, python} -> {reference, core};  kernels -> core
# where the core is src/ without src/cli/. So: the core includes nothing from src/cli/, conform/,
# properties/, divergence/, reference/ or kernels/; reference/ (the oracle) nothing from kernels/ or
# above it; kernels/ nothing from reference/, the checks or src/cli/; the checks (conform/, properties/
# and divergence/, one layer in three folders) nothing from kernels/ or src/cli/; src/cli/ nothing from
# kernels/ (it reaches the CUDA plugin through the core's contract, src/cuda_api.hpp); and no file in
# src/ includes a CUDA header; and no two modules include each other, directly or through others. Prints
# each include that breaks the rule (each module of a loop) and exits 1; ctest runs it
# (Layers.IncludesRunOneWay). The libraries follow the same rule in CMake (dpcheck_kernels links the
# core only).
#   bash ci/layers.sh [SOURCE-DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

broken=0
# check FOLDER[:!NESTED] FORBIDDEN-PREFIX... : the sources under FOLDER (less those under NESTED, when
# given) must include nothing under the forbidden prefixes.
check() {
  local folder=${1%%:!*} nested=
  [[ $1 == *':!'* ]] && nested=${1#*:!}
  local -a files
  mapfile -t files < <(find "$folder" -type f \( -name '*.c' -o -name '*.cpp' -o -name '*.cu' -o -name '*.h' \
                         -o -name '*.hpp' -o -name '*.cuh' \) | { if [ -n "$nested" ]; then grep -v "^$nested"; else cat; fi; } | sort)
  shift
  local prefix hits
  for prefix in "$@"; do
    ((${#files[@]})) || continue
    hits=$(grep -Hn "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"$prefix" "${files[@]}" || true)
    if [ -n "$hits" ]; then
      echo "$hits" | sed "s|\$|   <- may not include $prefix|"
      broken=1
    fi
  done
}

checks=(conform/ properties/ divergence/ python/)
check 'src/:!src/cli/' src/cli/ "${checks[@]}" reference/ kernels/
check 'reference/' kernels/ "${checks[@]}" src/cli/
check 'kernels/' reference/ "${checks[@]}" src/cli/
for folder in "${checks[@]}"; do check "$folder" kernels/ src/cli/; done
check 'src/cli/' kernels/
# The core loads the CUDA plugin through the contract it owns: no CUDA header anywhere in src/.
cuda_headers=$(grep -rHnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(cuda|cublas|nccl|curand|cub/|thrust/)' src || true)
if [ -n "$cuda_headers" ]; then
  echo "$cuda_headers" | sed 's|$|   <- the core includes no CUDA header|'
  broken=1
fi

# No include loop between modules, where a module is a header with the source files of the same stem
# (src/train/writer.hpp, src/train/writer.cpp): a loop means neither side can be understood, built or tested without
# the other. tsort names the modules of each loop.
mapfile -t sources < <(find src conform properties divergence python reference kernels include -type f \( -name '*.c' -o -name '*.cpp' -o -name '*.cu' \
                         -o -name '*.h' -o -name '*.hpp' -o -name '*.cuh' -o -name '*.inc' \) | sort)
edges=$(grep -HoE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' "${sources[@]}" |
        sed -E 's|^([^:]+):.*"([^"]+)"$|\1 \2|' |
        while read -r from to; do [ -e "$to" ] && echo "${from%.*} ${to%.*}"; done | awk '$1 != $2' | sort -u)
if ! loops=$(tsort <<<"$edges" 2>&1 >/dev/null); then
  echo "$loops" | sed -n 's|^tsort: \([^-].*\)$|include loop through \1|p'
  broken=1
fi

if ((broken)); then
  echo "ci/layers.sh: includes that run against the dependency rule (see the top of ci/layers.sh)"
  exit 1
fi
echo "ci/layers.sh: every include runs one way"
