#!/usr/bin/env bash
# Builds the libFuzzer targets (the "fuzz" preset: clang, ASan and UBSan, in build-fuzz/) and runs each
# for SECONDS (default 60), as many at once as there are CPUs, over a copy of its seed corpus,
# tests/fuzz/corpus/<target>/, so that the inputs it finds never land in the committed corpus. A crash,
# a sanitizer report, a leak, a timeout or a broken invariant fails the run (exit status 1); the input
# that did it is kept in build-fuzz/fuzz-run/<target>/findings/ and libFuzzer's log beside it.
#   bash ci/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
[[ $seconds =~ ^[1-9][0-9]*$ ]] || { echo "usage: bash ci/fuzz.sh [SECONDS-PER-TARGET]" >&2; exit 2; }
targets=(npy manifest case_token model sizes trace)

bash ci/setup.sh
start=$SECONDS
cmake --preset fuzz
cmake --build --preset fuzz --parallel "$(nproc)" --target "${targets[@]/%/_fuzz}"
echo "ci/fuzz.sh: the build took $((SECONDS - start)) s"

run=build-fuzz/fuzz-run
rm -rf "$run"
# The npy and manifest targets write each input to a file (and read_npy's round trip fsyncs): on tmpfs
# that costs microseconds instead of milliseconds.
tmp_root=/dev/shm
[ -w "$tmp_root" ] || tmp_root=${TMPDIR:-/tmp}
scratch=$(mktemp -d "$tmp_root/dpcheck-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch
export UBSAN_OPTIONS=print_stacktrace=1
symbolizer=/usr/lib/llvm-14/bin/llvm-symbolizer
if [ -x "$symbolizer" ]; then export ASAN_SYMBOLIZER_PATH=$symbolizer; fi
# One target a CPU at a time: each is one process, so on two cores two run side by side in the time of one.
fuzz_one() {
  local t=$1 work=$run/$1
  mkdir -p "$work/corpus" "$work/findings"
  cp tests/fuzz/corpus/"$t"/* "$work/corpus/"
  # -timeout: one input taking over 10 s is a hang; -rss_limit_mb: a parser that allocates what an input
  # claims instead of what it holds fails here rather than on a user's machine.
  local status=0
  build-fuzz/tests/fuzz/"$t"_fuzz -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/findings/" "$work/corpus" > "$work/log" 2>&1 || status=$?
  echo "$status" > "$work/status"
}
jobs_max=$(nproc)
for t in "${targets[@]}"; do
  while (( $(jobs -rp | wc -l) >= jobs_max )); do wait -n || true; done
  fuzz_one "$t" &
done
wait
passed=0 failed=0
for t in "${targets[@]}"; do
  work=$run/$t
  if [ "$(cat "$work/status")" = 0 ]; then
    passed=$((passed + 1))
    verdict=pass
  else
    failed=$((failed + 1))
    verdict="FAIL: $(ls "$work/findings")"
    tail -n 60 "$work/log"
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
  echo "fuzz $t: ${runs:-?} inputs in ${seconds} s, corpus $(ls "$work/corpus" | wc -l) files: $verdict"
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
