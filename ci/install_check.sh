#!/usr/bin/env bash
# What a plugin's author does with an installed dpcheck: `cmake --install` the build into a fresh
# prefix, build examples/comm_ring and kernels_naive on their own against it (find_package(dpcheck), the target
# dpcheck::plugin_headers), and run the installed dpcheck's conform on the plugins built there. ctest
# runs it (Install.AnExampleBuildsAgainstTheInstalledPackage).
#   bash ci/install_check.sh BUILD-DIR SOURCE-DIR
set -euo pipefail
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
test -x "$work/prefix/bin/dpcheck"
test -f "$work/prefix/include/dpcheck/plugin.h"
for example in comm_ring kernels_naive; do
  cmake -S "$source/examples/$example" -B "$work/$example" -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/configure.log"
  cmake --build "$work/$example" > "$work/build.log"
done
# The header compiles as C++ too, warnings as errors.
printf '#include <dpcheck/plugin.h>\nint main() { return DPCHECK_PLUGIN_ABI == 3 && DPCHECK_BFLOAT16 == 3 && DPCHECK_FLOAT16 == 4 && DPCHECK_DTYPE_BIT(DPCHECK_FLOAT16) == 16u && DPCHECK_ABI1_OPS == 15u ? 0 : 1; }\n' > "$work/abi.cpp"
c++ -std=c++17 -Wall -Wextra -Wpedantic -Wshadow -Werror -I"$work/prefix/include" "$work/abi.cpp" -o "$work/abi"
"$work/abi"
"$work/prefix/bin/dpcheck" conform --comm "$work/comm_ring/libdpcheck_comm_ring.so" --world-size 3 --no-properties \
  --max-mib 1 --timeout 10
"$work/prefix/bin/dpcheck" conform --kernels "$work/kernels_naive/libdpcheck_kernels_naive.so" --no-properties
echo "install check: the examples built against the installed package and kept every promise"
