#!/usr/bin/env bash
# Installs every Debian package dpcheck needs to build, test and run. Idempotent: when everything is
# already installed it only checks, which takes a second.
set -euo pipefail

packages=(
  build-essential cmake ninja-build
  libeigen3-dev libgtest-dev librapidcheck-dev
  libopenmpi-dev openmpi-bin
  libmpich-dev mpich pkgconf  # dpcheck-mpich: the MPI backend built against MPICH too, for its rows in docs/libraries.md
  libcli11-dev nlohmann-json3-dev libxxhash-dev
  libtinyxml2-dev  # tests only: the HTML reports are parsed as XML
  libgloo-dev libopenblas-dev libblis-dev libdnnl-dev  # the adapters of real libraries (examples/)
  python3  # ci/validate-libraries.sh reads conform's JSON reports
  python3-torch python3-numpy pybind11-dev python3-dev  # dpcheck.torch (python/): PyTorch 1.13 with gloo, and its C++ core's binding
  clang libclang-rt-14-dev llvm-14  # the sanitize and fuzz presets: clang, the sanitizers' and libFuzzer's runtimes, llvm-symbolizer
  clang-format  # ci/format.sh: the sources follow .clang-format (a ctest test)
  lld  # the ci and sanitizer presets link with it: GNU ld took 2.5 times as long over the sanitizers' 150 MB programs, twice as long over the ci build's
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "ci/setup.sh: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "ci/setup.sh: all ${#packages[@]} packages present"
fi
