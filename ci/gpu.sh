#!/usr/bin/env bash
# The GPU checks on the binaries ci/build-gpu.sh gathered in gpu-bin/, in one run that ends with a
# verdict. The rows that can find a bug run first and the benchmarks last, so that a run cut short by
# the deadline loses the measurements, not the checks: a preflight (nvidia-smi, which also counts the
# GPUs, and ldd of every binary the run loads); the properties on the GPU target through `dpcheck
# verify` (cuda-local, TF32, nccl and the NCCL plugin example through conform and verify, one rank per
# GPU present, and the mixed-precision rows); the GPU mutants (each must be caught); every GPU test
# binary; compute-sanitizer (memcheck on dpcheck's own kernels, racecheck on the bias-gradient and hash
# kernels); and last the benchmarks against PyTorch and the device-to-device copy. Builds nothing.
#
# Usage: bash ci/gpu.sh [--first-run | --full] [--steps GROUP[,GROUP...]]
#   --first-run  the default (DPCHECK_GPU_MODE=first): 10 cases a property and budgets set from each
#                row's measured CPU time (the step table below), for a runner that allows a command 10
#                minutes; the sum of the budgets is printed first.
#   --full       DPCHECK_GPU_MODE=full: 100 cases a property, every test of the GPU property binary and
#                longer budgets, for a runner without that limit (set DPCHECK_GPU_DEADLINE=0), or one
#                group at a time with --steps.
#   --steps      (DPCHECK_GPU_STEPS) the groups to run, of verify, precision, mutants, tests, sanitizer
#                and bench (all by default); they run in that order, after the preflight, which always runs.
# Environment: OUT (default gpu-out/), DPCHECK_GPU_BIN (default gpu-bin/), DPCHECK_GPU_CASES (cases a
# property), DPCHECK_GPU_DEADLINE (seconds for the whole run, default 540, 0 for none: a step that would
# start later is not reached), DPCHECK_GPU_BUDGET_SCALE (percent applied to every step's budget, 100).
#
# Every step runs under `timeout -k 5 BUDGET`; one that runs out is recorded as "TIMEOUT (Ns)". A row
# reads its command's report (JUnit XML, or GoogleTest's counts), so that a skipped property or test is
# counted as SKIP, never as a pass: "pass 12, SKIP 2 (why)". A tool the runner lacks (compute-sanitizer,
# nvidia-smi) makes its rows "unavailable", not failures. A mutant row reads "caught" when its property
# fails; if the shrinking after that failure outlives the budget, the row still reads "caught".
# Logs, JUnit XML and JSON reports go to a scratch directory; $OUT receives only summary.txt (the
# table, also printed last, by an EXIT trap, so that a killed run still shows every row it reached) and
# gpu-logs.tar.gz (everything else), both rewritten after every step. Exit status: 0 when no row failed
# (SKIP, unavailable, INCONCLUSIVE and "not built" rows do not fail), 1 otherwise, 2 for bad usage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

usage() { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; }

mode=${DPCHECK_GPU_MODE:-first}
groups=${DPCHECK_GPU_STEPS:-verify,precision,mutants,tests,sanitizer,bench}
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
# A GPU runner ends a command after 10 minutes; the deadline leaves a minute of that for the script's
# own start, the EXIT trap and the archive.
command_limit=600
deadline=${DPCHECK_GPU_DEADLINE:-540}
scale=${DPCHECK_GPU_BUDGET_SCALE:-100}
for v in "cases=$cases" "deadline=$deadline" "scale=$scale"; do
  [[ ${v#*=} =~ ^[0-9]+$ ]] || { echo "ci/gpu.sh: $v is not a whole number of at least 0" >&2; exit 2; }
done
((cases >= 1 && scale >= 1)) || { echo "ci/gpu.sh: DPCHECK_GPU_CASES and DPCHECK_GPU_BUDGET_SCALE must be at least 1" >&2; exit 2; }
all_groups="verify precision mutants tests sanitizer bench"
for g in ${groups//,/ }; do
  [[ " $all_groups " == *" $g "* ]] || { echo "ci/gpu.sh: unknown group '$g' (groups: $all_groups)" >&2; exit 2; }
done
selected() { [[ ",$groups," == *",$1,"* ]]; }

# ---- the steps: every row of the table, in the order they run, with its budget ------------------------
# A first run's budget of a row is   max(floor, start-up + factor x cpu)   seconds. cpu is the measured
# time of the row's equivalent on the CPU target, on a development machine (2 cores, shared with other
# builds; RelWithDebInfo; the largest of 3 runs): the same dpcheck command with --engine cpu and --comm
# local, or the host plugin example comm_ring in the nccl plugin's place, with the same cases and seed
# (so the same scenarios), less only_rank0_writes, which the GPU build (no MPI) skips; a GPU mutant's
# by a CPU mutant that breaks the same property the same way (bias-grad-skip-tail by
# allreduce-sum-no-average, bias-grad-atomic by allreduce-arrival-order, nondeterministic too, or the
# property passing, whichever is longer), caught, shrunk and run once as the row runs it; a test
# binary's by its tests that need no GPU (test-gpu_properties': its two kill-matrix tests' equivalent,
# 50 cases, reruns and replay). A "case" row's cpu is for 10 cases and grows with DPCHECK_GPU_CASES.
# floor is the least a row gets for GPU work that has no CPU equivalent (a test binary's GPU tests, a
# sanitizer, a benchmark: their cpu is "-" and the floor is the budget).
#
# The factor, and why: a GPU row does the same host work as the CPU one (the scenarios, the float64
# reference and its bound, the comparisons) and swaps the CPU engine's steps for the CUDA engine's. At
# the properties' sizes (layers up to 64 wide, a replica's batch up to 512) a CPU step takes 0.001 to
# 0.76 ms here (bench step --engine cpu: 8,8@8; 32,32,32@64; 64,64,64,64@512), while a GPU step is
# launch-bound at about 1.2 ms (measured on the GPU runner: PyTorch's 784-256-10@256 and
# 512-512-512-10@1024 steps), and a case builds up to 8 CUDA engines with a cuBLAS handle each. A case
# takes 6 ms here on average (verify-cuda-local: 0.62 s for 110 cases) and is put at 20 to 60 ms there,
# 3 to 10 times as long: the factor is the top of that. The start-up is a fresh process's on a bare
# runner (the CUDA plugin, the primary context, cuBLAS's first handle, the lazy loading of the first
# kernels, or NCCL's first communicator): about 3 s, doubled.
budget_factor=10
startup_s=6
#
# The full column is a --full run's budget (100 cases, every GPU property test), not measured: for a
# runner without the 10-minute limit; a "case" row gets at least its first-run budget scaled to the
# cases. DPCHECK_GPU_BUDGET_SCALE scales every budget.
step_table='
# group     row                             per   cpu_s  floor   full
preflight   device                          run       -     10     10
preflight   ldd                             run       -     10     10
verify      verify-cuda-local               case   0.62     10    300
verify      verify-cuda-local-tf32          case   0.62     10    300
verify      verify-nccl                     case   0.32     10    420
verify      conform-comm-nccl               run    4.10     10     90
verify      verify-comm-nccl-plugin         case   0.26     10    420
precision   verify-bf16                     case   0.93     10    300
precision   verify-fp16                     case   1.31     10    300
mutants     mutant-bias-grad-skip-tail      case   0.09     12    120
mutants     mutant-allreduce-sum-no-average case   0.09     12    120
mutants     mutant-allreduce-rank-order     case   0.26     12    120
mutants     bias-grad-atomic-variation      run       -     12     30
mutants     mutant-bias-grad-atomic         case   0.75     12    120
tests       test-cublas_library             run    0.45      8     30
tests       test-linear                     run    0.07      8     60
tests       test-activation                 run    0.07      8     60
tests       test-loss                       run    0.07      8     60
tests       test-bias_grad                  run    0.08     12     60
tests       test-hash                       run    0.62     12     60
tests       test-first_difference           run    0.18      8     60
tests       test-optimizer                  run    0.21     10     60
tests       test-cuda_engine                run    0.07     20    120
tests       test-cuda_local_comm            run    0.07     12     60
tests       test-nccl_comm                  run    0.07     12     60
tests       test-gpu_properties             run    0.35     25    480
tests       test-gpu_bucketing              run    0.07     12     60
tests       test-backends                   run    0.12      8     30
sanitizer   memcheck-bias_grad              run       -     18     60
sanitizer   memcheck-cuda_engine            run       -     25    180
sanitizer   racecheck-bias_grad             run       -     15     60
sanitizer   racecheck-hash                  run       -     15     60
bench       bench-hash                      run       -     12     30
bench       bench-step                      run       -     29     90
bench       bench-scaling                   run       -     12     90
'
# The GPU mutants, each with the property that must catch it (exit 1).
# The deterministic ones first; bias-grad-atomic last, after the row that measures its order.
mutants=(bias-grad-skip-tail:gradient_average_matches_whole_batch
         allreduce-sum-no-average:gradient_average_matches_whole_batch
         allreduce-rank-order:replicas_bitwise_synchronized bias-grad-atomic:checkpoint_resume_bitwise)
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
# The CPU times were measured at 10 cases a property; a "case" row's grows with the cases.
measured_cases=10
while read -r g row per cpu floor full; do
  [[ -z ${g:-} || $g == \#* ]] && continue
  group_of[$row]=$g
  [ "$g" = tests ] && tests+=("${row#test-}")
  [ "$g" = preflight ] || selected "$g" || continue
  b=$(awk -v cpu="$cpu" -v floor="$floor" -v f="$budget_factor" -v s="$startup_s" -v per="$per" \
        -v cases="$cases" -v measured="$measured_cases" \
        'BEGIN { b = floor
                 if (cpu != "-") { t = s + f * cpu * (per == "case" ? cases / measured : 1)
                                   t = (t == int(t)) ? t : int(t) + 1; if (t > b) b = t }
                 print b }')
  [ "$mode" = full ] && ((full > b)) && b=$full
  budget[$row]=$(((b * scale + 99) / 100))
  budget_sum=$((budget_sum + budget[$row]))
  plan+=("$row")
done <<< "$step_table"
for row in "${mutants[@]/#/mutant-}" "${precisions[@]/#/verify-}" "${sanitizer_runs[@]%% *}" bias-grad-atomic-variation; do
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
# not skips (src/target/cuda_plugin.cpp and tests/gpu_test_support.hpp word them).
plugin_re='no CUDA device|cannot load the CUDA plugin|is a CUDA plugin from another dpcheck build|the CUDA plugin libdpcheck_cuda\.so is missing|this build has no CUDA engine'

current='' current_start=0 child='' signal='' stop_reason='' device_info='' n_fail=0
# GPUs that nvidia-smi lists: every nccl row runs one rank per GPU (NCCL refuses two ranks on one GPU).
ngpu=1 ngpu_from="assumed: no nvidia-smi"
notes=()
rc=0 took=0 limit=0
note() { notes+=("$1"); }

# ---- the table ---------------------------------------------------------------------------------------
is_failure() {
  case $1 in
    pass* | caught* | SKIP* | unavailable* | INCONCLUSIVE* | "not built"*) return 1 ;;
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
  local row v failed_rows=() n_rows=0 line n_skip=0 n_unavailable=0 n_inconclusive=0 others=()
  n_fail=0
  echo "==== dpcheck GPU checks: $mode run, $cases cases a property, groups $groups"
  [ -n "$device_info" ] && printf '%s\n' "$device_info"
  echo "step budgets ${budget_sum}s in all (factor ${budget_factor} x CPU time + ${startup_s}s start-up, or a floor)," \
    "deadline ${deadline}s of the ${command_limit}s a command may run"
  echo "full logs, JUnit XML and JSON in gpu-logs.tar.gz"
  printf '%-32s %-72s %s\n' row verdict "s/limit"
  for row in "${plan[@]}"; do
    v=${verdict[$row]:-not reached}
    n_rows=$((n_rows + 1))
    if is_failure "$v"; then
      n_fail=$((n_fail + 1))
      failed_rows+=("$row")
    fi
    case $v in
      SKIP* | *", SKIP "*) n_skip=$((n_skip + 1)) ;;
      unavailable*) n_unavailable=$((n_unavailable + 1)) ;;
      INCONCLUSIVE*) n_inconclusive=$((n_inconclusive + 1)) ;;
    esac
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
  ((n_skip > 0)) && others+=("$n_skip with skips")
  ((n_unavailable > 0)) && others+=("$n_unavailable unavailable")
  ((n_inconclusive > 0)) && others+=("$n_inconclusive inconclusive")
  line=$(IFS=,; echo "${others[*]}")
  if ((n_fail == 0)); then
    echo "==== verdict: pass ($n_rows rows${line:+; ${line//,/, }})"
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

# verdict_of ROW EXPECTED_STATUS: the verdict on the step just run, from its exit status alone (the
# benchmarks).
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

# ---- what the logs and reports say -------------------------------------------------------------------
# The reason line under each ": Skipped" of a GoogleTest log.
skip_reasons() { grep -A1 -E ': Skipped$' "$1" 2> /dev/null | grep -v -E ': Skipped$|^--$|^$'; }
# The names of the tests that failed.
failed_tests() { sed -n -E 's/^\[  FAILED  \] ([A-Za-z0-9_/]+\.[A-Za-z0-9_/.]+).*/\1/p' "$1" 2> /dev/null | sort -u; }
# "PASSED SKIPPED": the counts in GoogleTest's closing lines.
gtest_counts() {
  local p k
  p=$(sed -n -E 's/^\[  PASSED  \] ([0-9]+) tests?\..*/\1/p' "$1" 2> /dev/null | tail -n 1)
  k=$(sed -n -E 's/^\[  SKIPPED \] ([0-9]+) tests?, listed below:.*/\1/p' "$1" 2> /dev/null | tail -n 1)
  echo "${p:-0} ${k:-0}"
}

# junit_counts FILE: of a JUnit report of dpcheck verify or conform (one element a line), "TESTS FAILED
# SKIPPED" on the first line, the first skip's message on the second, the failed tests' names on the
# third.
junit_counts() {
  awk '/<testcase / { n++; name = $0; sub(/.* name="/, "", name); sub(/".*/, "", name) }
       /<failure / { f++; failed = failed (failed == "" ? "" : "; ") name }
       /<skipped / { k++; if (why == "") { why = $0; sub(/.*<skipped message="/, "", why); sub(/"\/>.*/, "", why) } }
       END { printf "%d %d %d\n%s\n%s\n", n, f, k, why, failed }' "$1" 2> /dev/null |
    sed -e 's/&#10;/ /g; s/&quot;/"/g; s/&lt;/</g; s/&gt;/>/g; s/&amp;/\&/g'
}

# counted PASSED SKIPPED WHY: "pass P", "pass P, SKIP K (why)", or "SKIP K (why)" when nothing passed.
counted() {
  local skip="SKIP $2${3:+ (${3:0:44})}"
  if (($2 == 0)); then
    echo "pass $1"
  elif (($1 == 0)); then
    echo "$skip"
  else
    echo "pass $1, $skip"
  fi
}

# report_verdict ROW: the verdict on a verify or conform row, from its exit status and its JUnit report,
# so that a property skipped (unavailable on this target) is counted as SKIP, not as a pass.
report_verdict() {
  local row=$1 junit=$work/junit-$1.xml n f k why failed trouble
  if timed_out; then
    echo "TIMEOUT (${limit}s)"
    return
  fi
  trouble=$(plugin_trouble "$work/$row.log")
  if [ ! -s "$junit" ]; then
    echo "FAIL (exit $rc, no report${trouble:+: $trouble})"
    return
  fi
  { read -r n f k; IFS= read -r why; IFS= read -r failed; } < <(junit_counts "$junit")
  if grep -q -E "$plugin_re" <<< "$why"; then
    echo "FAIL (skipped: ${why:0:48})"
  elif ((rc == 0 && f == 0)); then
    counted $((n - f - k)) "$k" "$why"
  elif ((rc == 1 && f > 0)); then
    echo "FAIL ($f of $n: ${failed:0:40}$( ((k > 0)) && echo ", SKIP $k"))"
  else
    echo "FAIL (exit $rc${trouble:+: $trouble})"
  fi
}

# Whether the atomic bias gradient's order was seen to vary at the sizes checkpoint_resume_bitwise
# draws: tests/bias_grad_test.cpp measures it at a spread of those sizes and prints "atomic bias
# gradient at the property's sizes (...): varied from run to run at V of N sizes (...)". A V above 0 is
# run-to-run nondeterminism where the property looks, what it catches. 0: it varied; 1: it never did;
# 2: not measured (the row bias-grad-atomic-variation did not run, nor test-bias_grad).
variation_line() {
  grep -h -m1 -E "^atomic bias gradient at the property's sizes" "$work/bias-grad-atomic-variation.log" \
    "$work/test-bias_grad.log" 2> /dev/null | head -n 1
}
atomic_variation() {
  local line varied
  line=$(variation_line)
  varied=$(sed -n -E 's/.*varied from run to run at ([0-9]+) of [0-9]+ sizes.*/\1/p' <<< "$line")
  [ -n "$varied" ] || return 2
  ((varied > 0)) && return 0
  return 1
}

# The verdict on bias-grad-atomic having survived: a miss only if its nondeterminism was seen here.
atomic_survived() {
  local at
  at=$(sed -n -E 's/.*at ([0-9]+ of [0-9]+) sizes.*/\1/p' <<< "$(variation_line)")
  atomic_variation
  case $? in
    0) echo "FAIL (survived, though its order varied at $at of the property's sizes)" ;;
    1) echo "INCONCLUSIVE (atomic order never varied at the property's sizes)" ;;
    *) echo "INCONCLUSIVE (atomic order not measured at the property's sizes)" ;;
  esac
}

# ---- the preflight -----------------------------------------------------------------------------------
# nvidia-smi's list of GPUs and driver line; the count sets the nccl rows' world size. Without
# nvidia-smi the row is "unavailable" and one GPU is assumed (what a runner is lent).
preflight_device() {
  if ! command -v nvidia-smi > /dev/null; then
    device_info="device: no nvidia-smi on PATH; the nccl rows run 1 rank"
    record device "unavailable (no nvidia-smi on PATH: 1 GPU assumed)"
    return
  fi
  # shellcheck disable=SC2016 # expanded by that shell
  run_step device sh -c 'nvidia-smi -L; s=$?; echo "----"; nvidia-smi; exit $s'
  local gpus driver n
  gpus=$(sed '/^----$/q' "$work/device.log" | grep -E '^GPU [0-9]+:')
  driver=$(grep -m1 'Driver Version' "$work/device.log" | tr -s ' |' ' ' | sed 's/^ //; s/ $//')
  n=$(grep -c . <<< "$gpus")
  ((n > 0)) && ngpu=$n ngpu_from="the GPUs nvidia-smi -L lists"
  device_info="${gpus:-no GPU listed by nvidia-smi -L}"$'\n'"driver: ${driver:-no driver line from nvidia-smi}"
  device_info+=$'\n'"nccl rows: $ngpu rank$( ((ngpu > 1)) && echo s), one a GPU"
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
  local t=$1 row=${2:-test-$1} exe=$bin/tests/$1_test filter=() reasons bad failures n v line p k
  need "$row" "$exe" || return
  if [ -n "${3:-}" ]; then
    filter=(--gtest_filter="$3")
  elif [ "$t" = gpu_properties ] && [ -n "$properties_filter" ]; then
    filter=(--gtest_filter="$properties_filter")
  fi
  run_step "$row" env "${rc_env[@]}" "$exe" --gtest_output=xml:"$work/junit-$row.xml" "${filter[@]}"
  reasons=$(skip_reasons "$work/$row.log")
  [ -z "$reasons" ] || while read -r line; do echo "$row: $line"; done <<< "$reasons" >> "$work/skipped.txt"
  bad=$(grep -m1 -o -E "($plugin_re).{0,50}" <<< "$reasons")
  failures=$(failed_tests "$work/$row.log")
  n=$(grep -c . <<< "$failures")
  read -r p k < <(gtest_counts "$work/$row.log")
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
  else
    v=$(counted "$p" "$k" "$(head -n 1 <<< "$reasons")")
    # The measurement the atomic mutant's row is judged by.
    [ "$row" = bias-grad-atomic-variation ] && line=$(variation_line) && [ -n "$line" ] &&
      v+=" (varied at $(sed -n -E 's/.*at ([0-9]+ of [0-9]+) sizes.*/\1/p' <<< "$line") sizes)"
  fi
  record "$row" "$v" "$took"
}

run_tests() {
  local t line
  [ -z "$properties_filter" ] || note "test-gpu_properties: first run, only --gtest_filter=$properties_filter (verify's rows cover the rest)"
  for t in "${tests[@]}"; do run_test "$t"; done
  line=$(grep -m1 -E "^atomic bias gradient at the property's sizes" "$work/test-bias_grad.log" 2> /dev/null)
  [ -z "$line" ] || note "test-bias_grad: $line"
}

# run_command ROW EXPECTED_STATUS COMMAND...
run_command() {
  local row=$1 expect=$2
  shift 2
  run_step "$row" "$@"
  record "$row" "$(verdict_of "$row" "$expect")" "$took"
}

# run_verify ROW COMMAND...: a verify or conform row, judged from its JUnit report.
run_verify() {
  local row=$1
  shift
  run_step "$row" "$@" --report "$work/$row.json" --junit "$work/junit-$row.xml"
  record "$row" "$(report_verdict "$row")" "$took"
}

# The properties on the GPU target. The nccl rows (built in, and the plugin example through conform and
# verify) run one rank per GPU present: NCCL refuses two ranks on one GPU, and without --world-size
# verify would draw 1 to 8.
run_verify_rows() {
  local nccl=$bin/examples/libdpcheck_comm_nccl.so row
  note "nccl rows: --world-size $ngpu ($ngpu_from)"
  for row in verify-cuda-local verify-cuda-local-tf32 verify-nccl conform-comm-nccl verify-comm-nccl-plugin; do
    need "$row" "$dpcheck" || continue
    case $row in
      verify-cuda-local)
        run_verify "$row" "$dpcheck" verify --engine cuda --comm cuda-local --cases "$cases" ;;
      verify-cuda-local-tf32)
        run_verify "$row" "$dpcheck" verify --engine cuda --comm cuda-local --tf32 --cases "$cases" ;;
      verify-nccl)
        run_verify "$row" "$dpcheck" verify --engine cuda --comm nccl --world-size "$ngpu" --cases "$cases" ;;
      conform-comm-nccl)
        need "$row" "$nccl" || continue
        run_verify "$row" "$dpcheck" conform --engine cuda --comm "$nccl" --world-size "$ngpu" --cases "$conform_cases" ;;
      verify-comm-nccl-plugin)
        need "$row" "$nccl" || continue
        run_verify "$row" "$dpcheck" verify --engine cuda --comm "$nccl" --world-size "$ngpu" --cases "$cases" ;;
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
      record "$row" "$(report_verdict "$row")" "$took"
    fi
  done
}

# mutant_verdict ROW MUTANT: caught (exit 1, the property failed), or, cut by the budget, caught if the
# progress line had reached the shrinking (which starts only from a failure); surviving is a failure.
mutant_verdict() {
  local row=$1 name=$2 n f k why failed passed shrunk trouble
  if timed_out; then
    if grep -a -q -E 'shrinking \([0-9]+\)' "$work/$row.log"; then
      echo "caught (shrinking cut short by the ${limit}s budget)"
    else
      echo "TIMEOUT (${limit}s)"
    fi
    return
  fi
  trouble=$(plugin_trouble "$work/$row.log")
  n=0 f=0 k=0 why=''
  [ -s "$work/junit-$row.xml" ] &&
    { read -r n f k; IFS= read -r why; IFS= read -r failed; } < <(junit_counts "$work/junit-$row.xml")
  passed=$(sed -n -E 's/.*<property name="cases" value="([0-9]+)".*/\1/p' "$work/junit-$row.xml" 2> /dev/null | head -n 1)
  shrunk=$(grep -a -o -m1 -E 'shrunk [0-9]+ times' "$work/$row.log")
  if grep -q -E "$plugin_re" <<< "$why"; then
    echo "FAIL (skipped: ${why:0:48})"
  elif ((k > 0)); then
    echo "SKIP (${why:0:60})"
  elif ((rc == 1 && f > 0)); then
    echo "caught (at case $((${passed:-0} + 1)) of $cases${shrunk:+, $shrunk})"
  elif ((rc == 0)) && [ "$name" = bias-grad-atomic ]; then
    atomic_survived
  elif ((rc == 0)); then
    echo "FAIL (survived $cases cases)"
  else
    echo "FAIL (exit $rc, expected 1${trouble:+: $trouble})"
  fi
}

# Mutants on the GPU target: each must be caught (exit 1) by the property aimed at it. A row stops being
# about the budget once the mutant is caught: it runs a failing case once (--reruns 1: the verdict needs
# the catch, not how often it fails), and under a terminal (script, where the runner has it) so that the
# progress line shows the shrinking that only a failure starts. The atomic bias gradient's bug shows
# only when the scheduler changes the order of its additions; on an idle GPU it may not, so the row
# before it measures that order at the property's sizes, and its surviving is a miss only if it varied.
run_mutants() {
  local m name row cmd
  for m in "${mutants[@]}"; do
    name=${m%%:*}
    row=mutant-$name
    [ "$name" = bias-grad-atomic ] &&
      run_test bias_grad bias-grad-atomic-variation 'BiasGradGpu.AtomicMutantOrderFollowsTheSchedulerAtThePropertysSizes'
    need "$row" "$dpcheck" || continue
    cmd=("$dpcheck" verify --engine cuda --comm cuda-local --mutant "$name" --property "${m#*:}" --cases "$cases"
         --reruns 1 --report "$work/$row.json" --junit "$work/junit-$row.xml")
    if command -v script > /dev/null; then
      run_step "$row" env SHELL="$BASH" script -q -e -f -c "$(printf '%q ' "${cmd[@]}")" /dev/null
    else
      run_step "$row" "${cmd[@]}"
    fi
    record "$row" "$(mutant_verdict "$row" "$name")" "$took"
  done
  command -v script > /dev/null || note "mutants: no script(1) here, so no progress line: a row cut while shrinking reads TIMEOUT"
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

# compute-sanitizer (it slows kernels many times): few RapidCheck cases. A runner without it (it is not
# part of every CUDA installation) makes these rows "unavailable", not failures.
run_sanitizers() {
  local san s row tool test filter exe v only=() help errors why p k
  san=$(find_sanitizer)
  if [ -z "$san" ]; then
    for s in "${sanitizer_runs[@]}"; do record "${s%% *}" "unavailable (no compute-sanitizer on this runner)"; done
    note "compute-sanitizer: not on PATH nor under /usr/local/cuda*: its ${#sanitizer_runs[@]} rows are unavailable"
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
      read -r p k < <(gtest_counts "$work/$row.log")
      v=$(counted "$p" "$k" "$(skip_reasons "$work/$row.log" | head -n 1)")
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
echo "==== dpcheck GPU checks: $mode run, $cases cases a property, groups $groups"
echo "budgets: ${budget_sum}s in all (factor ${budget_factor} x CPU time + ${startup_s}s start-up a row, or the row's floor); deadline ${deadline}s; a GPU runner allows a command ${command_limit}s"
if ((deadline > 0 && budget_sum > deadline)); then
  note "the budgets (${budget_sum}s) add up to more than the deadline (${deadline}s): rows that run long leave the last unreached"
fi
preflight_device
preflight_ldd
selected verify && run_verify_rows
selected precision && run_precision_rows
selected mutants && run_mutants
selected tests && run_tests
selected sanitizer && run_sanitizers
selected bench && run_bench
exit 0
