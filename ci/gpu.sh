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

# run NAME EXPECTED_STATUS COMMAND...: runs, logs to $out/NAME.log, records pass/fail and seconds.
run() {
  local name=$1 expect=$2
  shift 2
  local start=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local verdict=pass
  [ "$rc" -eq "$expect" ] || { verdict="FAIL (exit $rc, expected $expect)"; failed=1; }
  summary+=("$(printf '%-44s %-28s %5ds' "$name" "$verdict" $((SECONDS - start)))")
  echo "[$verdict] $name ($((SECONDS - start)) s)"
}

nvidia-smi -L > "$out/device.txt" 2>&1 || true
head -3 "$out/device.txt"

# 1. GPU test binaries (their CPU tests run too; GPU tests skip only where there is no device).
for t in linear activation loss bias_grad hash first_difference optimizer cuda_engine cuda_local_comm nccl_comm \
         gpu_properties; do
  [ -x "$bin/tests/${t}_test" ] || { summary+=("$(printf '%-44s %-28s' "test $t" 'MISSING')"); failed=1; continue; }
  run "test-$t" 0 "$bin/tests/${t}_test" --gtest_output=xml:"$out/junit-$t.xml"
done

# 2. The properties on the GPU target.
run verify-cuda-local 0 "$bin/dpcheck" verify --engine cuda --comm cuda-local --cases "$cases" \
  --report "$out/verify-cuda-local.json" --junit "$out/junit-verify-cuda-local.xml"
run verify-cuda-local-tf32 0 "$bin/dpcheck" verify --engine cuda --comm cuda-local --tf32 --cases "$cases" \
  --report "$out/verify-tf32.json"
run verify-nccl-1 0 "$bin/dpcheck" verify --engine cuda --comm nccl --world-size 1 --cases "$cases" \
  --report "$out/verify-nccl.json"

# 3. Mutants on the GPU target: each must be caught (exit 1) by the property aimed at it.
for m in bias-grad-skip-tail:gradient_average_matches_whole_batch bias-grad-atomic:checkpoint_resume_bitwise \
         allreduce-rank-order:replicas_bitwise_synchronized allreduce-sum-no-average:gradient_average_matches_whole_batch; do
  run "mutant-${m%%:*}" 1 "$bin/dpcheck" verify --engine cuda --comm cuda-local --mutant "${m%%:*}" \
    --property "${m#*:}" --cases "$cases"
done

# 4. compute-sanitizer over the kernel tests (few cases keep it quick: it slows kernels many times).
if command -v compute-sanitizer > /dev/null; then
  export RC_PARAMS="max_success=10"
  for tool in memcheck racecheck; do
    run "sanitizer-$tool" 0 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$bin/tests/bias_grad_test" --gtest_filter='*Gpu*'
    run "sanitizer-$tool-engine" 0 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$bin/tests/cuda_engine_test" --gtest_filter='*Gpu*'
  done
  unset RC_PARAMS
else
  summary+=("$(printf '%-44s %-28s' sanitizer 'skipped: no compute-sanitizer')")
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
