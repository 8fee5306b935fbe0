#!/usr/bin/env bash
# The test command, and what CI runs: installs what is missing, builds (the ci preset, CUDA where nvcc
# is found) and runs its tests with ctest (JUnit results in build/junit.xml); then the subset of the
# table of real libraries (ci/validate-libraries.sh --check), which fails when a library's verdict changes
# from docs/libraries.md; then every CPU test under AddressSanitizer and UndefinedBehaviorSanitizer and
# the thread-backend and trainer tests under ThreadSanitizer (ci/sanitize.sh), and each parser's fuzz
# target for 15 s over its seed corpus (ci/fuzz.sh). The unit-test programs that the ASan stage runs
# whole are built and run there only. Extra arguments go to the main build's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
bash ci/setup.sh
echo "ci/test.sh: set-up took $((SECONDS - start)) s"
step=$SECONDS
# The unit-test programs that the ASan stage builds and runs whole (tests/CMakeLists.txt,
# DPCHECK_SANITIZED_ONLY) are built and run there alone: each test program is built once.
bash ci/build.sh -DDPCHECK_UNIT_TESTS_SANITIZED_ONLY=ON "$@"
echo "ci/test.sh: the main build took $((SECONDS - step)) s"
step=$SECONDS
# The "ci" test preset: output on failure, JUnit XML in build/junit.xml, 600 s a test at most. Twice as
# many tests as CPUs: a test waits on its processes, pipes and fsyncs about as long as it computes, and
# with one a CPU the CPUs were busy 60% of the time (the ASan stage does the same).
bash ci/ctest-costs.sh seed build ci
ctest --preset ci --parallel "$((2 * $(nproc)))"
echo "ci/test.sh: the main tests took $((SECONDS - step)) s"
echo "ci/test.sh: main build and tests took $((SECONDS - start)) s"
start=$SECONDS
bash ci/validate-libraries.sh --check
echo "ci/test.sh: the real libraries' subset took $((SECONDS - start)) s"
bash ci/sanitize.sh asan tsan
start=$SECONDS
bash ci/fuzz.sh 15
echo "ci/test.sh: fuzzing took $((SECONDS - start)) s"
