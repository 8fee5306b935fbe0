#!/usr/bin/env bash
# The dependency rule between dpcheck's folders, checked on every #include. The folders are layers, in
# the order of LAYERS below (lowest first): a file includes files of its own folder and of folders in
# lower layers, never of a higher layer or of another folder in its own. So no two folders include each
# other, directly or through others. Besides:
#   - nothing includes kernels/ (the core loads the CUDA plugin through its contract; tests pair a kernel
#     with its reference), and kernels/ includes nothing of reference/: a wrong constant must not live
#     on both sides of a check;
#   - no file in src/ includes a CUDA header: the core reaches the CUDA plugin through the contract it
#     owns (src/target/cuda_api.hpp);
#   - no two modules include each other, directly or through others, where a module is a header with
#     the source files of its stem (src/train/writer.hpp, src/train/writer.cpp).
# Prints each include that breaks the rule, each loop of folders (tsort names them) and each loop of
# modules, and exits 1; ctest runs it (Layers.IncludesRunOneWay, and Layers.AFolderLoopFails on a planted
# tree). The libraries follow the same order in CMake: each folder's library links those below it.
#   bash ci/layers.sh [SOURCE-DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

# Lowest first; folders on one line are one layer and include nothing of each other.
LAYERS=(
  "include"                             # plugin.h: the plugins' C ABI
  "src"                                 # error, dtypes, random numbers, the Communicator interface
  "src/io src/gemm src/plugin src/report"  # files and processes; the CPU's GEMM; a plugin's ABI; HTML
  "src/comm src/audit"                  # the communicators; the write audit
  "src/train"                           # model, data, sampler, optimizer, trainer, writer, engine interface
  "src/cpu"                             # the CPU engine
  "src/target"                          # the backend table, the Target, plugins as rows, mutant hooks
  "src/bench reference"                 # benchmarks; the float64 reference and its bounds
  "kernels mutants"                     # the CUDA engine; the planted bugs
  "verdict"                             # what the checks share: bounds, agreement, formulas
  "divergence"                          # traces, diff, bundles, replay, drift
  "conform"                             # a plugin's conformance checks
  "properties"                          # the promises as properties, and their runner
  "python"                              # a PyTorch job's checks and the Python module
  "src/cli"                             # the dpcheck command
)
mapfile -t sources < <(find src conform properties divergence python reference kernels include mutants verdict \
                         -type f \( -name '*.c' -o -name '*.cpp' -o -name '*.cu' -o -name '*.h' -o -name '*.hpp' \
                         -o -name '*.cuh' -o -name '*.inc' \) 2>/dev/null | sort)
# "FROM TO" for each include of a file of the project, by path.
includes=$(grep -HoE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' "${sources[@]}" |
           sed -E 's|^([^:]+):.*"([^"]+)"$|\1 \2|' | sort -u |
           while read -r from to; do [ -e "$to" ] && echo "$from $to"; done)

broken=0
# Each include's folders (a file's folder: the deepest folder of the layers that holds it, so that
# python/zoo/x.cpp is python's) judged against the order; awk prints "edge FROM-FOLDER TO-FOLDER" for
# each include between folders and a line for each break.
layer_list=$(for i in "${!LAYERS[@]}"; do for folder in ${LAYERS[$i]}; do echo "$folder $i"; done; done)
judged=$(awk -v layers="$layer_list" '
  BEGIN { n = split(layers, lines, "\n"); for (i = 1; i <= n; i++) { split(lines[i], w, " "); layer[w[1]] = w[2] } }
  function folder_of(path,   dir) {
    dir = path; sub(/\/[^\/]*$/, "", dir)
    while (!(dir in layer) && dir ~ /\//) sub(/\/[^\/]*$/, "", dir)
    return dir
  }
  NF == 2 {
    f = folder_of($1); t = folder_of($2)
    if (!(f in layer)) { if (!(f in told)) print "break " f ": a folder in no layer: add it to LAYERS in ci/layers.sh"; told[f] = 1; next }
    if (!(t in layer)) { if (!(t in told)) print "break " t ": a folder in no layer: add it to LAYERS in ci/layers.sh"; told[t] = 1; next }
    if (f == t) next
    print "edge " f " " t
    if (t == "kernels") print "break " $1 " includes " $2 "   <- nothing includes kernels/: the core loads it through its contract (src/target/cuda_api.hpp)"
    if (f == "kernels" && t == "reference") print "break " $1 " includes " $2 "   <- kernels/ and the oracle share no code"
    if (layer[t] + 0 > layer[f] + 0) print "break " $1 " includes " $2 "   <- " f " may not include " t ", a higher layer"
    else if (layer[t] == layer[f]) print "break " $1 " includes " $2 "   <- " f " and " t " are one layer and include nothing of each other"
  }' <<<"$includes")
if grep -q '^break ' <<<"$judged"; then
  sed -n 's/^break //p' <<<"$judged"
  broken=1
fi
folder_edges=$(sed -n 's/^edge //p' <<<"$judged" | sort -u)

# Loops of folders (each also breaks the order above; named here as loops).
if ! loops=$(tsort <<<"$folder_edges" 2>&1 >/dev/null); then
  echo "$loops" | sed -n 's|^tsort: \([^-].*\)$|folder loop through \1|p'
  broken=1
fi

# The core loads the CUDA plugin through the contract it owns: no CUDA header anywhere in src/.
cuda_headers=$([ -d src ] && grep -rHnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(cuda|cublas|nccl|curand|cub/|thrust/)' src || true)
if [ -n "$cuda_headers" ]; then
  echo "$cuda_headers" | sed 's|$|   <- the core includes no CUDA header|'
  broken=1
fi

# No include loop between modules: a loop means neither side can be understood, built or tested without
# the other. tsort names the modules of each loop.
module_edges=$(awk '{ sub(/\.[^.\/]*$/, "", $1); sub(/\.[^.\/]*$/, "", $2) } $1 != $2 { print $1, $2 }' <<<"$includes" | sort -u)
if ! loops=$(tsort <<<"$module_edges" 2>&1 >/dev/null); then
  echo "$loops" | sed -n 's|^tsort: \([^-].*\)$|include loop through \1|p'
  broken=1
fi

if ((broken)); then
  echo "ci/layers.sh: includes that run against the dependency rule (see the top of ci/layers.sh)"
  exit 1
fi
echo "ci/layers.sh: every include runs one way, through ${#LAYERS[@]} layers"
