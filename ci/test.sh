#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test with ctest.
# JUnit results go to build/junit.xml.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
bash ci/build.sh "$@"
cd build
ctest --output-on-failure --parallel "$(nproc)" --output-junit junit.xml --timeout 600
