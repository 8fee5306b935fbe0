#!/usr/bin/env bash
# dpcheck's main job on the CPU default: installs what is missing, builds, and runs `dpcheck verify`
# (every property, 100 cases each, CPU engine, local backend). Extra arguments go to verify.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh
exec build/dpcheck verify "$@"
