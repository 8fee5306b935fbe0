#!/usr/bin/env bash
# The sanitizer stages of CI, run by ci/test.sh after the main build and its tests:
#   asan  AddressSanitizer and UndefinedBehaviorSanitizer over every CPU test: the "sanitize" presets
#         (build-sanitize/, GCC, MPI on; leak detection off, since Open MPI leaks at exit). Its programs
#         are linked -no-pie: the sanitizers' descriptors of every global and every check made a
#         position-independent dpcheck carry 69 MB of relocations, which took half of the 0.7 s that each
#         of the stage's thousand or so program starts cost; and with lld (both stages), which links
#         them in 2.2 s where GNU ld took 5.6.
#   tsan  ThreadSanitizer over the tests that run ranks as threads: the "tsan" presets (build-tsan/,
#         GCC, no MPI); only those test executables are built.
# Each stage configures, builds and runs ctest through its presets and prints its time.
#   bash ci/sanitize.sh [asan] [tsan]     (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
stages=("$@")
((${#stages[@]})) || stages=(asan tsan)
bash ci/setup.sh

for stage in "${stages[@]}"; do
  start=$SECONDS
  case $stage in
    asan)
      cmake --preset sanitize
      cmake --build --preset sanitize --parallel "$(nproc)"
      ctest --preset sanitize --parallel "$((2 * $(nproc)))"
      ;;
    tsan)
      # The executables behind the tsan test preset's filter (CMakePresets.json).
      cmake --preset tsan
      cmake --build --preset tsan --parallel "$(nproc)" --target local_comm_test trainer_test \
        bucketing_test replica_check_test properties_test writer_test
      ctest --preset tsan --parallel "$(nproc)"
      ;;
    *)
      echo "usage: bash ci/sanitize.sh [asan] [tsan]" >&2
      exit 2
      ;;
  esac
  echo "ci/sanitize.sh: $stage took $((SECONDS - start)) s"
done
