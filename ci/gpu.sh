#!/usr/bin/env bash
# The GPU checks, on binaries already built by ci/build-gpu.sh (gpu-bin/): every GPU test binary (JUnit
# XML out), the properties on the GPU target through `dpcheck verify`, the GPU mutants (each must be
# caught), compute-sanitizer memcheck and racecheck over the kernel tests, and the benchmarks against
# PyTorch and the device-to-device copy. Full logs go to $OUT (default gpu-out/); a short table is
# printed last. Builds nothing. Exit status 1 if any check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${DPCHECK_GPU_BIN:-gpu-bin}
out=${OUT:-gpu-out}
cases=${DPCHECK_GPU_CASES:-100}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# The plugin beside the binaries, whatever path the build machine compiled in.
export DPCHECK_CUDA_PLUGIN="$(cd "$bin" && pwd)/libdpcheck_cuda.so"
summary=()
failed=0

# record NAME VERDICT START: one line of the summary table; any verdict but "pass..." fails the run.
record() {
  [[ $2 == pass* ]] || failed=1
  summary+=("$(printf '%-44s %-36s %5ds' "$1" "$2" $((SECONDS - $3)))")
  echo "[$2] $1 ($((SECONDS - $3)) s)"
}

# run NAME EXPECTED_STATUS COMMAND...: runs, logs to $out/NAME.log, records pass/fail and seconds.
run() {
  local name=$1 expect=$2
  shift 2
  local start=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  if [ "$rc" -eq "$expect" ]; then record "$name" pass "$start"; else record "$name" "FAIL (exit $rc, expected $expect)" "$start"; fi
}

# run_test NAME: one GPU test binary, JUnit XML out. Here a test that skips for want of a device is a
# failure (the runner has one); other skips (a test for machines without a GPU, one that needs MPI,
# which these binaries are built without) are counted in the verdict and listed in $out/skipped.txt.
run_test() {
  local name=$1 start=$SECONDS
  local xml="$out/junit-$name.xml" log="$out/test-$name.log"
  "$bin/tests/${name}_test" --gtest_output=xml:"$xml" > "$log" 2>&1
  local rc=$?
  local skipped
  skipped=$(grep -c '<skipped' "$xml" 2> /dev/null) || skipped=0
  grep -A1 -E ': Skipped$' "$log" | grep -v -E ': Skipped$|^--$' | sed "s/^/$name: /" >> "$out/skipped.txt"
  if [ "$rc" -ne 0 ]; then
    record "test-$name" "FAIL (exit $rc)" "$start"
  elif grep -q 'no CUDA device' "$log"; then
    record "test-$name" "FAIL (skipped: no CUDA device)" "$start"
  elif [ "$skipped" -gt 0 ]; then
    record "test-$name" "pass ($skipped skipped)" "$start"
  else
    record "test-$name" pass "$start"
  fi
}

{ nvidia-smi -L 2> /dev/null || echo "no nvidia-smi"; } > "$out/device.txt"
rm -f "$out/skipped.txt"
head -3 "$out/device.txt"

# 1. GPU test binaries (their CPU tests run too; GPU tests skip only where there is no device).
for t in linear activation loss bias_grad hash first_difference optimizer cuda_engine cuda_local_comm nccl_comm \
         gpu_properties backends; do
  [ -x "$bin/tests/${t}_test" ] || { record "test-$t" MISSING $SECONDS; continue; }
  run_test "$t"
done

# 2. The properties on the GPU target.
run verify-cuda-local 0 "$bin/dpcheck" verify --engine cuda --comm cuda-local --cases "$cases" \
  --report "$out/verify-cuda-local.json" --junit "$out/junit-verify-cuda-local.xml"
run verify-cuda-local-tf32 0 "$bin/dpcheck" verify --engine cuda --comm cuda-local --tf32 --cases "$cases" \
  --report "$out/verify-tf32.json"
run verify-nccl-1 0 "$bin/dpcheck" verify --engine cuda --comm nccl --world-size 1 --cases "$cases" \
  --report "$out/verify-nccl.json"

# The NCCL plugin example through conform and verify (one GPU: one rank; NCCL wants a GPU per rank).
run conform-comm-nccl 0 "$bin/dpcheck" conform --engine cuda --comm "$bin/examples/libdpcheck_comm_nccl.so" \
  --world-size 1 --cases 20 --report "$out/conform-nccl.json" --junit "$out/junit-conform-nccl.xml"
run verify-comm-nccl-plugin 0 "$bin/dpcheck" verify --engine cuda --comm "$bin/examples/libdpcheck_comm_nccl.so" \
  --world-size 1 --cases "$cases"

# 3. Mutants on the GPU target: each must be caught (exit 1) by the property aimed at it.
for m in bias-grad-skip-tail:gradient_average_matches_whole_batch bias-grad-atomic:checkpoint_resume_bitwise \
         allreduce-rank-order:replicas_bitwise_synchronized allreduce-sum-no-average:gradient_average_matches_whole_batch; do
  run "mutant-${m%%:*}" 1 "$bin/dpcheck" verify --engine cuda --comm cuda-local --mutant "${m%%:*}" \
    --property "${m#*:}" --cases "$cases"
done

# 4. compute-sanitizer over the kernel tests (few cases keep it quick: it slows kernels many times).
# The toolkit does not always put it on PATH.
sanitizer=$(command -v compute-sanitizer || true)
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -n "$sanitizer" ] || { [ -x "$c" ] && sanitizer=$c; }
done
if [ -n "$sanitizer" ]; then
  export RC_PARAMS="max_success=10"
  for tool in memcheck racecheck; do
    run "sanitizer-$tool" 0 "$sanitizer" --tool "$tool" --error-exitcode 9 \
      "$bin/tests/bias_grad_test" --gtest_filter='*Gpu*'
    run "sanitizer-$tool-engine" 0 "$sanitizer" --tool "$tool" --error-exitcode 9 \
      "$bin/tests/cuda_engine_test" --gtest_filter='*Gpu*'
  done
  unset RC_PARAMS
else
  record sanitizer "FAIL (no compute-sanitizer found)" $SECONDS
fi

# 5. Benchmarks: the step against PyTorch in the same run, the hash against the copy.
run bench-hash 0 "$bin/dpcheck" bench hash --json "$out/bench-hash.json"
run bench-step 0 "$bin/dpcheck" bench step --json "$out/bench-step.json"

echo
echo "==== dpcheck GPU checks ($(head -1 "$out/device.txt"))"
printf '%s\n' "${summary[@]}"
echo "---- bench hash"; grep -v '^#' "$out/bench-hash.log" || true
echo "---- bench step"; grep -v '^# ' "$out/bench-step.log" || true
exit $failed
