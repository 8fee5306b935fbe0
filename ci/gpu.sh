#!/usr/bin/env bash
# The GPU checks on the binaries ci/build-gpu.sh gathered in gpu-bin/, in one run that ends with a
# verdict: a preflight (nvidia-smi, and ldd of every binary the run loads), every GPU test binary, the
# properties on the GPU target through `dpcheck verify` (cuda-local, TF32, nccl with one rank, the NCCL
# plugin example through conform and verify, the mixed-precision rows), the GPU mutants (each must be
# caught), the benchmarks against PyTorch and the device-to-device copy, and last compute-sanitizer
# (memcheck on dpcheck's own kernels, racecheck on the bias-gradient and hash kernels). Builds nothing.
#
# Usage: bash ci/gpu.sh [--first-run | --full] [--steps GROUP[,GROUP...]]
#   --first-run  the default (DPCHECK_GPU_MODE=first): 10 cases a property and the first-run budgets of
#                the step table below, which add up to 8 minutes, for a runner that allows a command 10.
#   --full       DPCHECK_GPU_MODE=full: 100 cases a property, every test of the GPU property binary and
#                longer budgets, for a runner without that limit (set DPCHECK_GPU_DEADLINE=0), or one
#                group at a time with --steps.
#   --steps      (DPCHECK_GPU_STEPS) the groups to run, of tests, verify, precision, mutants, bench and
#                sanitizer (all by default); they run in that order, after the preflight, which always runs.
# Environment: OUT (default gpu-out/), DPCHECK_GPU_BIN (default gpu-bin/), DPCHECK_GPU_CASES (cases a
# property), DPCHECK_GPU_DEADLINE (seconds for the whole run, default 540, 0 for none: a step that would
# start later is not reached), DPCHECK_GPU_BUDGET_SCALE (percent applied to every step's budget, 100).
#
# Every step runs under `timeout -k 5 BUDGET`; one that runs out is recorded as "TIMEOUT (Ns)". Logs,
# JUnit XML and JSON reports go to a scratch directory; $OUT receives only summary.txt (the table, also
# printed last, by an EXIT trap, so that a killed run still shows every row it reached) and
# gpu-logs.tar.gz (everything else), both rewritten after every step. Exit status: 0 when every row
# passed (INCONCLUSIVE and "not built" rows do not fail), 1 otherwise, 2 for bad usage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

usage() { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; }

mode=${DPCHECK_GPU_MODE:-first}
groups=${DPCHECK_GPU_STEPS:-tests,verify,precision,mutants,bench,sanitizer}
while (($# > 0)); do
  case $1 in
    --first-run | --first) mode=first ;;
    --full) mode=full ;;
    --steps)
      (($# >= 2)) || { echo "ci/gpu.sh: --steps needs a list of groups" >&2; exit 2; }
      groups=$2
      shift
      ;;
    --steps=*) groups=${1#--steps=} ;;
    -h | --help) usage; exit 0 ;;
    *) echo "ci/gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $mode in
  first) cases=${DPCHECK_GPU_CASES:-10} ;;
  full) cases=${DPCHECK_GPU_CASES:-100} ;;
  *) echo "ci/gpu.sh: DPCHECK_GPU_MODE is first or full, not '$mode'" >&2; exit 2 ;;
esac
deadline=${DPCHECK_GPU_DEADLINE:-540}
scale=${DPCHECK_GPU_BUDGET_SCALE:-100}
for v in "cases=$cases" "deadline=$deadline" "scale=$scale"; do
  [[ ${v#*=} =~ ^[0-9]+$ ]] || { echo "ci/gpu.sh: $v is not a whole number of at least 0" >&2; exit 2; }
done
((cases >= 1 && scale >= 1)) || { echo "ci/gpu.sh: DPCHECK_GPU_CASES and DPCHECK_GPU_BUDGET_SCALE must be at least 1" >&2; exit 2; }
all_groups="tests verify precision mutants bench sanitizer"
for g in ${groups//,/ }; do
  [[ " $all_groups " == *" $g "* ]] || { echo "ci/gpu.sh: unknown group '$g' (groups: $all_groups)" >&2; exit 2; }
done
selected() { [[ ",$groups," == *",$1,"* ]]; }

# ---- the steps: every row of the table, in the order they run, with its timeout in seconds ----------
# The first run's budgets add up to 480 s, so that a whole first run (the runner starts in a minute or
# two and allows a command 10) ends with its table; the seconds each step took are in the table, to set
# these from. Each property case builds up to 8 CUDA engines with cuBLAS handles and the nccl rows start
# a communicator per world, so the verify, mutant and plugin rows grow with the cases.
step_table='
# group     row                            first   full
preflight   device                            10     10
preflight   ldd                               10     10
tests       test-linear                        8     60
tests       test-activation                    8     60
tests       test-loss                          8     60
tests       test-bias_grad                    12     60
tests       test-hash                         12     60
tests       test-first_difference              8     60
tests       test-optimizer                    10     60
tests       test-cuda_engine                  20    120
tests       test-cuda_local_comm              12     60
tests       test-nccl_comm                    12     60
tests       test-gpu_properties               25    480
tests       test-gpu_bucketing                12     60
tests       test-backends                      8     30
verify      verify-cuda-local                 30    300
verify      verify-cuda-local-tf32            18    300
verify      verify-nccl-1                     29    420
verify      conform-comm-nccl                 12     60
verify      verify-comm-nccl-plugin           18    420
precision   verify-bf16                       12    300
precision   verify-fp16                       12    300
mutants     mutant-bias-grad-skip-tail        12    120
mutants     mutant-bias-grad-atomic           12    120
mutants     mutant-allreduce-rank-order       12    120
mutants     mutant-allreduce-sum-no-average   12    120
bench       bench-hash                        12     30
bench       bench-step                        29     90
bench       bench-scaling                     12     90
sanitizer   memcheck-bias_grad                18     60
sanitizer   memcheck-cuda_engine              25    180
sanitizer   racecheck-bias_grad               15     60
sanitizer   racecheck-hash                    15     60
'
# The GPU mutants, each with the property that must catch it (exit 1).
mutants=(bias-grad-skip-tail:gradient_average_matches_whole_batch bias-grad-atomic:checkpoint_resume_bitwise
         allreduce-rank-order:replicas_bitwise_synchronized allreduce-sum-no-average:gradient_average_matches_whole_batch)
# The mixed-precision rows (run_precision_rows): verify on cuda-local at each of these precisions, as
# the rows verify-<precision> of the table. Add a precision here and a row there to run another.
precisions=(bf16 fp16)
# compute-sanitizer runs: row, tool, test binary, GoogleTest filter. Only dpcheck's own kernels are
# checked (--kernel-name kns=dpcheck: every kernel of ours sits in namespace dpcheck::cuda, so its name
# holds "dpcheck"; cuBLAS's SGEMM kernels run unchecked), and racecheck runs only where the kernels
# share memory among threads and no SGEMM runs: the bias gradient and the hash.
kernel_substring=dpcheck
sanitizer_runs=("memcheck-bias_grad memcheck bias_grad *Gpu*" "memcheck-cuda_engine memcheck cuda_engine *Gpu*"
                "racecheck-bias_grad racecheck bias_grad *Gpu*" "racecheck-hash racecheck hash *Gpu*")

declare -A budget=() group_of=() verdict=() secs=()
plan=() tests=()
budget_sum=0
while read -r g row first full; do
  [[ -z ${g:-} || $g == \#* ]] && continue
  group_of[$row]=$g
  [ "$g" = tests ] && tests+=("${row#test-}")
  [ "$g" = preflight ] || selected "$g" || continue
  if [ "$mode" = first ]; then b=$first; else b=$full; fi
  budget[$row]=$(((b * scale + 99) / 100))
  budget_sum=$((budget_sum + budget[$row]))
  plan+=("$row")
done <<< "$step_table"
for row in "${mutants[@]/#/mutant-}" "${precisions[@]/#/verify-}" "${sanitizer_runs[@]%% *}"; do
  row=${row%%:*}
  [ -n "${group_of[$row]:-}" ] || { echo "ci/gpu.sh: row $row has no line in the step table" >&2; exit 2; }
done

# ---- the mode's settings ----------------------------------------------------------------------------
# A first run asks the test binaries' RapidCheck properties for as many cases as verify's rows (unless
# RC_PARAMS says otherwise), and runs of the GPU property binary (every property at 50 cases in fp32
# and TF32, and every mutant) only the kill matrix of the GPU's own mutants: verify's rows cover the rest.
conform_cases=$((cases < 20 ? cases : 20))
rc_env=()
san_rc="max_success=10"
properties_filter=''
if [ "$mode" = first ]; then
  [ -n "${RC_PARAMS:-}" ] || rc_env=("RC_PARAMS=max_success=$cases")
  san_rc="max_success=5"
  properties_filter='Gpu/GpuKillMatrix.*/bias_grad_*'
fi

bin=${DPCHECK_GPU_BIN:-gpu-bin}
[ -d "$bin" ] && bin=$(cd "$bin" && pwd)
dpcheck=$bin/dpcheck
out=${OUT:-gpu-out}
mkdir -p "$out" || exit 2
scratch=$(mktemp -d "${TMPDIR:-/tmp}/dpcheck-gpu.XXXXXX") || exit 2
work=$scratch/gpu-logs
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_DEBUG=WARN
# The plugin beside the binaries, whatever path the build machine compiled in.
export DPCHECK_CUDA_PLUGIN="$bin/libdpcheck_cuda.so"

# Skip reasons that mean the GPU target could not be reached at all: on the runner these are failures,
# not skips (src/cuda_plugin.cpp and tests/gpu_test_support.hpp word them).
plugin_re='no CUDA device|cannot load the CUDA plugin|is a CUDA plugin from another dpcheck build|the CUDA plugin libdpcheck_cuda\.so is missing|this build has no CUDA engine'

current='' current_start=0 child='' signal='' stop_reason='' device_info='' n_fail=0
notes=()
rc=0 took=0 limit=0
note() { notes+=("$1"); }

# ---- the table ---------------------------------------------------------------------------------------
is_failure() {
  case $1 in
    pass* | INCONCLUSIVE* | "not built"*) return 1 ;;
    *) return 0 ;;
  esac
}

bench_section() {
  local log=$work/bench-$1.log
  [ -s "$log" ] || return 0
  echo "---- bench $1"
  # Everything but the two header lines: the rows, and the PyTorch baseline's note ("#   ...") when it failed.
  grep -v -E '^# (dpcheck bench |medians of )' "$log" | head -n 30
}

render_summary() {
  local row v failed_rows=() n_rows=0 line
  n_fail=0
  echo "==== dpcheck GPU checks: $mode run, $cases cases a property, groups $groups"
  [ -n "$device_info" ] && printf '%s\n' "$device_info"
  echo "step budgets ${budget_sum}s in all (deadline ${deadline}s); full logs, JUnit XML and JSON in gpu-logs.tar.gz"
  printf '%-32s %-72s %s\n' row verdict "s/limit"
  for row in "${plan[@]}"; do
    v=${verdict[$row]:-not reached}
    n_rows=$((n_rows + 1))
    if is_failure "$v"; then
      n_fail=$((n_fail + 1))
      failed_rows+=("$row")
    fi
    printf '%-32s %-72s %s\n' "$row" "$v" "${secs[$row]:--}/${budget[$row]}"
  done
  if ((${#notes[@]} > 0)) || [ -s "$work/skipped.txt" ] || [ -n "$stop_reason" ]; then
    echo "---- notes"
    [ -n "$stop_reason" ] && echo "stopped: $stop_reason"
    for line in "${notes[@]}"; do echo "$line"; done
    if [ -s "$work/skipped.txt" ]; then
      echo "skipped tests ($(wc -l < "$work/skipped.txt"), all in skipped.txt):"
      head -n 6 "$work/skipped.txt" | cut -c1-150 | sed 's/^/  /'
    fi
  fi
  bench_section hash
  bench_section step
  bench_section scaling
  if ((n_fail == 0)); then
    echo "==== verdict: pass ($n_rows rows)"
  else
    line=${failed_rows[*]:0:8}
    ((n_fail > 8)) && line+=" and $((n_fail - 8)) more"
    echo "==== verdict: FAIL ($n_fail of $n_rows rows: $line)"
  fi
}

write_summary() {
  render_summary > "$out/.summary.txt.part" && mv -f "$out/.summary.txt.part" "$out/summary.txt"
}

pack() {
  cp -f "$out/summary.txt" "$work/summary.txt" 2> /dev/null
  tar -czf "$out/.gpu-logs.tar.gz.part" -C "$scratch" gpu-logs 2> /dev/null
  mv -f "$out/.gpu-logs.tar.gz.part" "$out/gpu-logs.tar.gz"
}

# record ROW VERDICT [SECONDS]: one row of the table; the summary and the archive are rewritten at once,
# so that even a run killed without warning leaves both as of its last step.
record() {
  verdict[$1]=$2
  secs[$1]=${3:-0}
  echo "[$2] $1 (${secs[$1]} s)"
  write_summary
  pack
}

# shellcheck disable=SC2317 # finish and on_signal are called by the traps
# The EXIT trap: the step cut short (if any) is marked and its processes ended, the table is written,
# packed with the logs and printed, and the exit status says whether every row passed.
finish() {
  trap - EXIT
  trap '' TERM INT HUP
  if [ -n "$current" ]; then
    verdict[$current]="KILLED (${signal:-the run ended} after $((SECONDS - current_start))s)"
    secs[$current]=$((SECONDS - current_start))
    if [ -n "$child" ]; then
      kill -TERM "$child" 2> /dev/null
      for _ in 1 2 3 4 5 6; do
        kill -0 "$child" 2> /dev/null || break
        sleep 0.5
      done
      kill -KILL -- "-$child" 2> /dev/null
    fi
  fi
  write_summary
  pack
  echo
  cat "$out/summary.txt"
  rm -rf "$scratch"
  ((n_fail == 0)) && exit 0
  exit 1
}
# shellcheck disable=SC2317
on_signal() {
  signal=SIG$1
  exit 1
}
trap finish EXIT
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP

# stop_run REASON: ends the run here; the rows not run show as "not reached".
stop_run() {
  stop_reason=$1
  exit 1
}

# ---- running one step --------------------------------------------------------------------------------
# run_step ROW COMMAND...: COMMAND under `timeout -k 5 LIMIT` (the row's budget, or what the deadline
# leaves), in the background so that a signal reaches the trap at once, its output in $work/ROW.log.
# Sets rc, took (seconds) and limit.
run_step() {
  local row=$1
  shift
  limit=${budget[$row]}
  if ((deadline > 0)); then
    local left=$((deadline - SECONDS))
    ((left >= 5)) || stop_run "the ${deadline}s deadline came before $row"
    ((limit <= left)) || limit=$left
  fi
  current=$row
  current_start=$SECONDS
  verdict[$row]="not finished (running when the run ended)"
  write_summary
  timeout -k 5 "$limit" "$@" > "$work/$row.log" 2>&1 < /dev/null &
  child=$!
  wait "$child"
  rc=$?
  child='' current=''
  took=$((SECONDS - current_start))
}

# Whether the last step was ended by its timeout (124; 137 when it had to be killed; a 137 well before
# the limit is some other kill).
timed_out() { ((rc == 124 || (rc == 137 && took >= limit))); }

# The first line in LOG saying that the GPU target could not be reached, shortened.
plugin_trouble() { grep -o -m1 -E "($plugin_re).{0,60}" "$1" 2> /dev/null | head -n 1 | cut -c1-44; }

# verdict_of ROW EXPECTED_STATUS: the verdict on the step just run.
verdict_of() {
  local why
  if timed_out; then
    echo "TIMEOUT (${limit}s)"
  elif ((rc == $2)); then
    echo pass
  else
    why=$(plugin_trouble "$work/$1.log")
    echo "FAIL (exit $rc, expected $2${why:+: $why})"
  fi
}

need() {
  [ -e "$2" ] && return 0
  record "$1" "MISSING (${2#"$bin"/} in $bin)"
  return 1
}

# ---- what the logs say -------------------------------------------------------------------------------
# The reason line under each ": Skipped" of a GoogleTest log.
skip_reasons() { grep -A1 -E ': Skipped$' "$1" 2> /dev/null | grep -v -E ': Skipped$|^--$|^$'; }
# The names of the tests that failed.
failed_tests() { sed -n -E 's/^\[  FAILED  \] ([A-Za-z0-9_/]+\.[A-Za-z0-9_/.]+).*/\1/p' "$1" 2> /dev/null | sort -u; }

# Whether the bias-gradient test saw the atomic kernel's order vary: it prints, for each size, "atomic
# bias gradient RxC: K of 20 runs differ from the ordered kernel, D distinct results". A D above 1 is
# run-to-run nondeterminism, what checkpoint_resume_bitwise catches. 0: it varied; 1: it never did;
# 2: not measured (the test did not run, or printed nothing).
atomic_variation() {
  local lines
  lines=$(grep -E '^atomic bias gradient [0-9]+x[0-9]+: ' "$work/test-bias_grad.log" 2> /dev/null) || return 2
  awk 'match($0, /, [0-9]+ distinct results/) { if (substr($0, RSTART + 2, RLENGTH - 2) + 0 > 1) varied = 1 }
       END { exit varied ? 0 : 1 }' <<< "$lines"
}

# The verdict on bias-grad-atomic having survived: a miss only if its nondeterminism was seen here.
atomic_survived() {
  atomic_variation
  case $? in
    0) echo "FAIL (survived, though test-bias_grad saw the atomic order vary)" ;;
    1) echo "INCONCLUSIVE (atomic order did not vary)" ;;
    *) echo "INCONCLUSIVE (atomic order not measured: test-bias_grad did not run)" ;;
  esac
}

# ---- the preflight -----------------------------------------------------------------------------------
preflight_device() {
  if ! command -v nvidia-smi > /dev/null; then
    device_info="device: no nvidia-smi on PATH"
    record device "FAIL (no nvidia-smi on PATH)"
    return
  fi
  # shellcheck disable=SC2016 # expanded by that shell
  run_step device sh -c 'nvidia-smi -L; s=$?; echo "----"; nvidia-smi; exit $s'
  local gpus driver n
  gpus=$(sed '/^----$/q' "$work/device.log" | grep -E '^GPU [0-9]+:')
  driver=$(grep -m1 'Driver Version' "$work/device.log" | tr -s ' |' ' ' | sed 's/^ //; s/ $//')
  n=$(grep -c . <<< "$gpus")
  device_info="${gpus:-no GPU listed by nvidia-smi -L}"$'\n'"driver: ${driver:-no driver line from nvidia-smi}"
  printf '%s\n' "$device_info"
  if timed_out; then
    record device "TIMEOUT (${limit}s)" "$took"
  elif ((rc != 0)); then
    record device "FAIL (nvidia-smi exit $rc: $(grep -m1 . "$work/device.log" | cut -c1-50))" "$took"
  elif ((n == 0)); then
    record device "FAIL (nvidia-smi -L lists no GPU)" "$took"
  else
    record device "pass ($n GPU)" "$took"
  fi
}

# ldd of everything the run loads; a library "not found" stops the run here, since it would otherwise
# show as a skipped test or a plugin that does not load.
preflight_ldd() {
  if [ ! -d "$bin" ]; then
    record ldd "FAIL (no $bin: build it with ci/build-gpu.sh)"
    stop_run "no $bin"
  fi
  local files=("$dpcheck" "$bin/libdpcheck_cuda.so") present=() absent=() f t missing n
  for f in "$bin"/examples/*.so; do [ -e "$f" ] && files+=("$f"); done
  for t in "${tests[@]}"; do files+=("$bin/tests/${t}_test"); done
  for f in "${files[@]}"; do
    if [ -e "$f" ]; then present+=("$f"); else absent+=("${f#"$bin"/}"); fi
  done
  # shellcheck disable=SC2016 # expanded by that shell
  run_step ldd bash -c 'for f; do echo "== $f"; ldd "$f" 2>&1; done' ldd "${present[@]}"
  missing=$(awk -v bin="$bin/" '/^== / { f = substr($0, 4); if (index(f, bin) == 1) f = substr(f, length(bin) + 1) }
                               /not found/ { print f ": " $1 " not found" }' "$work/ldd.log")
  n=$(grep -c . <<< "$missing")
  ((${#absent[@]} == 0)) || note "absent from $bin: ${absent[*]}"
  if ((n > 0)); then
    note "ldd: $n libraries not found:"
    while read -r f; do note "  $f"; done < <(head -n 8 <<< "$missing")
    record ldd "FAIL ($(head -n 1 <<< "$missing")$( ((n > 1)) && echo ", $((n - 1)) more"))" "$took"
    stop_run "ldd found a library that is not found"
  elif timed_out; then
    record ldd "TIMEOUT (${limit}s)" "$took"
  elif ((${#absent[@]} > 0)); then
    record ldd "FAIL (absent: ${absent[*]})" "$took"
  else
    record ldd "pass (${#present[@]} files)" "$took"
  fi
}

# ---- the groups --------------------------------------------------------------------------------------
# One GPU test binary, JUnit XML out. A test skipped because the GPU target cannot be reached (no device,
# a CUDA plugin that does not load) fails here; other skips (a test for machines without a GPU, one that
# needs MPI, which these binaries are built without) are counted in the row and listed in skipped.txt.
run_test() {
  local t=$1 row=test-$1 exe=$bin/tests/$1_test filter=() reasons bad skipped failures n v line
  need "$row" "$exe" || return
  [ "$t" = gpu_properties ] && [ -n "$properties_filter" ] && filter=(--gtest_filter="$properties_filter")
  run_step "$row" env "${rc_env[@]}" "$exe" --gtest_output=xml:"$work/junit-$row.xml" "${filter[@]}"
  reasons=$(skip_reasons "$work/$row.log")
  [ -z "$reasons" ] || while read -r line; do echo "$t: $line"; done <<< "$reasons" >> "$work/skipped.txt"
  bad=$(grep -m1 -o -E "($plugin_re).{0,50}" <<< "$reasons")
  skipped=$(grep -c -E ': Skipped$' "$work/$row.log")
  failures=$(failed_tests "$work/$row.log")
  n=$(grep -c . <<< "$failures")
  if timed_out; then
    v="TIMEOUT (${limit}s)"
  elif [ -n "$bad" ]; then
    v="FAIL (skipped: ${bad:0:48})"
  elif ((rc != 0)); then
    v="FAIL (exit $rc${failures:+: $n failed, $(head -n 1 <<< "$failures" | cut -c1-40)})"
    # The kill matrix's atomic mutant surviving is the same question as its verify row's.
    if ((rc == 1)) && ((n > 0)) && ! grep -q -v '/bias_grad_atomic$' <<< "$failures" &&
      grep -q 'bias-grad-atomic survived' "$work/$row.log"; then
      v=$(atomic_survived)
    fi
  elif ((skipped > 0)); then
    v="pass ($skipped skipped)"
  else
    v=pass
  fi
  record "$row" "$v" "$took"
}

run_tests() {
  local t
  [ -z "$properties_filter" ] || note "test-gpu_properties: first run, only --gtest_filter=$properties_filter (verify's rows cover the rest)"
  for t in "${tests[@]}"; do run_test "$t"; done
  # What the bias-gradient test saw of the atomic kernel's order (the atomic mutant's rows read it).
  local lines
  lines=$(grep -E '^atomic bias gradient ' "$work/test-bias_grad.log" 2> /dev/null | head -n 4)
  [ -z "$lines" ] || while read -r t; do note "test-bias_grad: $t"; done <<< "$lines"
}

# run_command ROW EXPECTED_STATUS COMMAND...
run_command() {
  local row=$1 expect=$2
  shift 2
  run_step "$row" "$@"
  record "$row" "$(verdict_of "$row" "$expect")" "$took"
}

run_verify_rows() {
  local nccl=$bin/examples/libdpcheck_comm_nccl.so row
  for row in verify-cuda-local verify-cuda-local-tf32 verify-nccl-1 conform-comm-nccl verify-comm-nccl-plugin; do
    need "$row" "$dpcheck" || continue
    case $row in
      verify-cuda-local)
        run_command "$row" 0 "$dpcheck" verify --engine cuda --comm cuda-local --cases "$cases" \
          --report "$work/$row.json" --junit "$work/junit-$row.xml" ;;
      verify-cuda-local-tf32)
        run_command "$row" 0 "$dpcheck" verify --engine cuda --comm cuda-local --tf32 --cases "$cases" \
          --report "$work/$row.json" --junit "$work/junit-$row.xml" ;;
      verify-nccl-1)
        run_command "$row" 0 "$dpcheck" verify --engine cuda --comm nccl --world-size 1 --cases "$cases" \
          --report "$work/$row.json" --junit "$work/junit-$row.xml" ;;
      # The NCCL plugin example through conform and verify (one GPU: one rank; NCCL wants a GPU per rank).
      conform-comm-nccl)
        need "$row" "$nccl" || continue
        run_command "$row" 0 "$dpcheck" conform --engine cuda --comm "$nccl" --world-size 1 --cases "$conform_cases" \
          --report "$work/$row.json" --junit "$work/junit-$row.xml" ;;
      verify-comm-nccl-plugin)
        need "$row" "$nccl" || continue
        run_command "$row" 0 "$dpcheck" verify --engine cuda --comm "$nccl" --world-size 1 --cases "$cases" \
          --report "$work/$row.json" --junit "$work/junit-$row.xml" ;;
    esac
  done
}

# The mixed-precision rows: `verify --engine cuda --comm cuda-local --precision P` for each of
# precisions=(). A dpcheck whose verify does not take --precision yet, or takes it for another engine
# only, records "not built" (no failure).
run_precision_rows() {
  local p row help=
  [ -x "$dpcheck" ] && help=$(timeout -k 5 10 "$dpcheck" verify --help 2>&1)
  for p in "${precisions[@]}"; do
    row=verify-$p
    need "$row" "$dpcheck" || continue
    if ! grep -q -e '--precision' <<< "$help"; then
      record "$row" "not built (no --precision)"
      continue
    fi
    run_step "$row" "$dpcheck" verify --engine cuda --comm cuda-local --precision "$p" --cases "$cases" \
      --report "$work/$row.json" --junit "$work/junit-$row.xml"
    # A verify that takes --precision for the cpu engine only refuses the cuda engine, as a usage error
    # saying so: not built either.
    if ((rc == 2)) && grep -q 'not built' "$work/$row.log"; then
      record "$row" "not built (cuda engine: no --precision $p yet)" "$took"
    else
      record "$row" "$(verdict_of "$row" 0)" "$took"
    fi
  done
}

# Mutants on the GPU target: each must be caught (exit 1) by the property aimed at it. The atomic
# bias gradient's bug shows only when the scheduler changes the order of its additions; on an idle GPU
# it may not, and its surviving is then inconclusive, not a pass or a miss.
run_mutants() {
  local m name row v
  for m in "${mutants[@]}"; do
    name=${m%%:*}
    row=mutant-$name
    need "$row" "$dpcheck" || continue
    run_step "$row" "$dpcheck" verify --engine cuda --comm cuda-local --mutant "$name" --property "${m#*:}" \
      --cases "$cases" --report "$work/$row.json"
    v=$(verdict_of "$row" 1)
    [ "$name" = bias-grad-atomic ] && ((rc == 0)) && v=$(atomic_survived)
    record "$row" "$v" "$took"
  done
}

# Benchmarks: the step against PyTorch in the same run, the hash against the copy.
run_bench() {
  local row v
  need bench-hash "$dpcheck" && run_command bench-hash 0 "$dpcheck" bench hash --json "$work/bench-hash.json"
  row=bench-step
  need "$row" "$dpcheck" || return
  run_step "$row" "$dpcheck" bench step --engine cuda --json "$work/bench-step.json"
  v=$(verdict_of "$row" 0)
  [ "$v" = pass ] && grep -q -E '^#   ' "$work/$row.log" && v="pass (PyTorch baseline note below)"
  record "$row" "$v" "$took"
  # Compute against communication: replicas on the one GPU, N = 1..4, buckets overlapped or not.
  need bench-scaling "$dpcheck" && run_command bench-scaling 0 "$dpcheck" bench scaling --engine cuda \
    --comm cuda-local --world-size 4 --model 1024,4096,4096,1024 --batch 4096 --steps 3 --warmup 1 --bucket-mb 8 \
    --quiet --json "$work/bench-scaling.json" --html "$work/bench-scaling.html"
}

find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer)" /usr/local/cuda/bin/compute-sanitizer \
    /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
    /usr/local/cuda-*/compute-sanitizer/compute-sanitizer; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
  done
}

# compute-sanitizer, last (it slows kernels many times): few RapidCheck cases.
run_sanitizers() {
  local san s row tool test filter exe v only=() help errors why
  san=$(find_sanitizer)
  if [ -z "$san" ]; then
    for s in "${sanitizer_runs[@]}"; do record "${s%% *}" "FAIL (no compute-sanitizer found)"; done
    return
  fi
  help=$(timeout -k 5 10 "$san" --help 2>&1)
  # --kernel-name (called --kernel-regex before compute-sanitizer 2023.3) checks only the kernels whose
  # name matches; kns= matches a substring of it.
  if grep -q -e '--kernel-name' <<< "$help"; then
    only=(--kernel-name "kns=$kernel_substring")
  elif grep -q -e '--kernel-regex' <<< "$help"; then
    only=(--kernel-regex "kns=$kernel_substring")
  fi
  note "compute-sanitizer: $san ${only[*]:-(no kernel filter option: every kernel checked)}, RC_PARAMS=$san_rc"
  for s in "${sanitizer_runs[@]}"; do
    read -r row tool test filter <<< "$s"
    exe=$bin/tests/${test}_test
    need "$row" "$exe" || continue
    run_step "$row" env RC_PARAMS="$san_rc" "$san" --tool "$tool" --error-exitcode 9 "${only[@]}" \
      "$exe" --gtest_filter="$filter" --gtest_output=xml:"$work/junit-$row.xml"
    why=$(skip_reasons "$work/$row.log" | grep -m1 -o -E "($plugin_re).{0,50}")
    if timed_out; then
      v="TIMEOUT (${limit}s)"
    elif [ -n "$why" ]; then
      v="FAIL (skipped: ${why:0:48})"
    elif ((rc == 0)); then
      v=pass
    elif ((rc == 9)); then
      errors=$(grep -o -m1 -E 'ERROR SUMMARY: [0-9]+ error' "$work/$row.log" | grep -o -E '[0-9]+')
      v="FAIL (${errors:-some} $tool errors)"
    else
      v="FAIL (exit $rc)"
    fi
    record "$row" "$v" "$took"
  done
}

# ---- the run -----------------------------------------------------------------------------------------
echo "==== dpcheck GPU checks: $mode run, $cases cases a property, groups $groups; budgets ${budget_sum}s, deadline ${deadline}s"
preflight_device
preflight_ldd
selected tests && run_tests
selected verify && run_verify_rows
selected precision && run_precision_rows
selected mutants && run_mutants
selected bench && run_bench
selected sanitizer && run_sanitizers
exit 0
