#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test with ctest.
# JUnit results go to build/junit.xml.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh "$@"
# The "ci" test preset: output on failure, JUnit XML in build/junit.xml, 600 s a test at most.
ctest --preset ci --parallel "$(nproc)"
