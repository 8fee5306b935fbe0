#!/bin/bash
# A battery of hostile values for every option of dpcheck's newer features (mixed precision, buckets,
# plugins, conform, drift, diff, replay, bench): each value on each option, alone, against the contract
# for bad input -- exit 0..3 and never a signal or a hang, at most one line "dpcheck: error: ..." on exit
# 2 or 3, and nothing left behind in the scratch directory. Values that a run accepted (exit 0 or 1) are
# listed for a person to judge: "0" is a fine --bucket-mb, "nan" is not.
#
#   tests/battery/bad_input_battery.sh BUILD_DIR [FILTER]
# BUILD_DIR holds dpcheck and the test plugins (build/); FILTER, a regular expression, picks the options
# (default: all). Exit status 1 when any run broke the contract.
set -u
build=$(realpath "${1:?usage: bad_input_battery.sh BUILD_DIR [FILTER]}")
filter=${2:-.}
bin=$build/dpcheck
ring=$(ls "$build"/examples/*/libdpcheck_comm_ring.so "$build"/libdpcheck_comm_ring.so 2>/dev/null | head -n 1)
naive=$(ls "$build"/examples/*/libdpcheck_kernels_naive.so "$build"/libdpcheck_kernels_naive.so 2>/dev/null | head -n 1)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkfifo "$scratch/fifo"
mkdir "$scratch/dir"
long=$(printf 'x%.0s' $(seq 5000))

"$bin" train --model 4,1 --steps 2 --checkpoint-every 1 --keep 5 --checkpoint-dir "$scratch/ckpt" --trace "$scratch/t.jsonl" >/dev/null 2>&1 ||
  { echo "cannot make the fixtures"; exit 2; }

values=('' ' ' 'nan' 'inf' '-inf' '-1' '0' '1e308' '9223372036854775808' '18446744073709551616' '0x10' '010' '1.5' 'abc'
        $'a\nb' "$long" '/dev/zero' "$scratch/fifo" "$scratch/dir" '4,,1' '8,8@8:nan')

# option  command line it is added to ({v} is the value)
cases=(
  "--precision|verify --cases 1 --property sampler_shards_disjoint --precision {v}"
  "--allreduce-dtype|verify --cases 1 --property sampler_shards_disjoint --allreduce-dtype {v}"
  "--loss-scale|train --model 4,1 --steps 1 --loss-scale {v}"
  "--loss-scale-init|train --model 4,1 --steps 1 --loss-scale dynamic --loss-scale-init {v}"
  "--loss-scale-interval|train --model 4,1 --steps 1 --loss-scale dynamic --loss-scale-interval {v}"
  "--bucket-mb|train --model 4,1 --steps 1 --world-size 2 --bucket-mb {v}"
  "--warmup-steps|train --model 4,1 --steps 1 --linear-scaling --warmup-steps {v}"
  "--momentum|train --model 4,1 --steps 1 --optimizer momentum --momentum {v}"
  "verify --world-size --thorough|verify --thorough --cases 1 --property sampler_shards_disjoint --world-size {v}"
  "train --comm|train --model 4,1 --steps 1 --comm {v}"
  "train --kernels|train --model 4,1 --steps 1 --kernels {v}"
  "grad --precision|grad --model 4,1 --batch 4 --precision {v}"
  "conform --world-size|conform --comm $ring --check 'allreduce float32 sum' --case count=3 --world-size {v}"
  "conform --case|conform --comm $ring --check 'allreduce float32 sum' --case {v}"
  "conform --check|conform --comm $ring --no-properties --max-mib 0 --check {v}"
  "conform --max-size|conform --kernels $naive --check linear_forward --max-size {v}"
  "conform --max-mib|conform --comm $ring --check 'allreduce float32 sum' --max-mib {v}"
  "conform --kernels|conform --kernels {v}"
  "drift --from|drift $scratch/ckpt $scratch/ckpt --from {v}"
  "drift --trace-a|drift $scratch/ckpt $scratch/ckpt --trace-a {v}"
  "drift a|drift {v} $scratch/ckpt"
  "diff A|diff {v} $scratch/t.jsonl"
  "diff --ulp|diff $scratch/ckpt/step-00000001 $scratch/ckpt/step-00000002 --ulp {v}"
  "diff --rtol|diff $scratch/ckpt/step-00000001 $scratch/ckpt/step-00000002 --rtol {v}"
  "diff --json|diff $scratch/t.jsonl $scratch/t.jsonl --json {v}"
  "replay --step|replay $scratch/ckpt --step {v}"
  "replay --world-size|replay $scratch/ckpt --step 1 --world-size {v}"
  "replay --mutant|replay $scratch/ckpt --step 1 --mutant {v}"
  "bench step --models|bench step --engine cpu --repeats 1 --warmup 0 --models {v}"
  "bench allreduce --sizes|bench allreduce --backends local --ranks 2 --iters 1 --warmup 0 --sizes {v}"
  "bench allreduce --ranks|bench allreduce --backends local --sizes 4K --iters 1 --warmup 0 --ranks {v}"
  "bench scaling --bucket-mb|bench scaling --model 4,1 --batch 4 --world-size 1 --steps 1 --warmup 0 --bucket-mb {v}"
  "bench hash --bytes|bench hash --repeats 1 --bytes {v}"
)

runs=0 broken=0 accepted=0
report=$scratch/report
for c in "${cases[@]}"; do
  name=${c%%|*}
  template=${c#*|}
  [[ $name =~ $filter ]] || continue
  for v in "${values[@]}"; do
    before=$(cd "$scratch" && find . | sort)
    # The value goes through an array, whole, whatever it holds.
    eval "args=(${template//\{v\}/__VALUE__})"
    for i in "${!args[@]}"; do [[ ${args[$i]} == __VALUE__ ]] && args[$i]=$v; done
    out=$(cd "$scratch" && timeout 60 "$bin" "${args[@]}" 2>&1 >/dev/null)
    rc=$?
    runs=$((runs + 1))
    shown=$(printf '%q' "$v")
    [[ ${#shown} -gt 40 ]] && shown="${shown:0:37}..."
    lines=$(printf '%s' "$out" | grep -c '' || true)
    after=$(cd "$scratch" && find . | sort)
    why=""
    if [[ $rc -ge 124 ]]; then why="signal or timeout (status $rc)"
    elif [[ $rc -ge 2 && $lines -ne 1 ]]; then why="$lines lines on standard error"
    elif [[ $rc -ge 2 && $out != "dpcheck: error: "* ]]; then why="no 'dpcheck: error:' line"
    elif [[ $rc -ge 2 && $before != "$after" ]]; then why="left files behind after refusing"
    fi
    if [[ -n $why ]]; then
      broken=$((broken + 1))
      printf 'BROKEN   %-28s %-40s %s: %s\n' "$name" "$shown" "$why" "$(printf '%s' "$out" | head -c 300 | tr '\n' '|')"
    elif [[ $rc -le 1 ]]; then
      accepted=$((accepted + 1))
      printf 'accepted %-28s %-40s exit %d\n' "$name" "$shown" "$rc" >>"$report"
    fi
    # What a run wrote on purpose (a --json that was accepted) goes, so that the next run starts clean.
    (cd "$scratch" && comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after") | xargs -r rm -rf)
  done
done
[[ -f $report ]] && cat "$report"
echo "battery: $runs runs, $broken broke the contract, $accepted accepted (listed above for review)"
[[ $broken -eq 0 ]]
