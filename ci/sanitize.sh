#!/usr/bin/env bash
# The sanitizer stages of CI, run by ci/test.sh after the main build and its tests:
#   asan  AddressSanitizer and UndefinedBehaviorSanitizer over every CPU test: the "sanitize" presets
#         (build-sanitize/, clang, MPI on; leak detection off, since Open MPI leaks at exit). clang builds
#         this stage because it compiles the test programs in about half GCC's time (167 CPU-seconds
#         against 311, the whole build 492 against 687, on the 2-core machine); the sanitizers' shared
#         runtime (-shared-libsan, one for the programs and the write audit's preloaded library) is found
#         through an rpath that CMakeLists.txt adds. UBSan runs without its null, alignment and
#         pointer-overflow checks, as when GCC built the stage: there those three (a static record per
#         memory access, registered by ASan as a global with redzones) made dpcheck's data 77 MB (4 MB
#         without them), 0.2 s of CPU at each of the stage's thousands of program starts (0.08 s
#         without). A null dereference still stops under ASan (SEGV, with its stack); alignment and
#         pointer overflow stay checked by the fuzz stage, whose UBSan keeps them, on every parser of
#         bytes. Its programs are linked -no-pie (the sanitizers' descriptors made a position-independent
#         dpcheck carry 69 MB of relocations) and with lld (both stages), which links them in 2.2 s where
#         GNU ld took 5.6. RapidCheck's properties run 25 cases each under both sanitizers (RC_PARAMS in
#         the test presets), where the main stage runs 100.
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
      echo "ci/sanitize.sh: asan's build took $((SECONDS - start)) s"
      bash ci/ctest-costs.sh seed build-sanitize sanitize
      ctest --preset sanitize --parallel "$((2 * $(nproc)))"
      ;;
    tsan)
      # The executables behind the tsan test preset's filter (CMakePresets.json).
      cmake --preset tsan
      cmake --build --preset tsan --parallel "$(nproc)" --target local_comm_test trainer_test \
        bucketing_test replica_check_test properties_test writer_test
      echo "ci/sanitize.sh: tsan's build took $((SECONDS - start)) s"
      bash ci/ctest-costs.sh seed build-tsan tsan
      ctest --preset tsan --parallel "$(nproc)"
      ;;
    *)
      echo "usage: bash ci/sanitize.sh [asan] [tsan]" >&2
      exit 2
      ;;
  esac
  echo "ci/sanitize.sh: $stage took $((SECONDS - start)) s"
done
