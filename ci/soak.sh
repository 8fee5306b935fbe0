#!/usr/bin/env bash
# A long run of every property to look for false alarms: `dpcheck verify` with CASES cases per property
# (default 20000; only_rank0_writes runs a tenth, each case a pair of mpirun jobs) under SEED, writing
# the JSON report to soak-SEED.json and printing each property's verdict, largest error ratio and closest
# call. Not part of CI (it takes hours on two cores); run it after changing the bound or a property.
#   bash ci/soak.sh [CASES] [SEED] [extra verify arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-20000}
seed=${2:-1}
shift $(( $# > 2 ? 2 : $# ))
[[ $cases =~ ^[1-9][0-9]*$ && $seed =~ ^[0-9]+$ ]] || { echo "usage: bash ci/soak.sh [CASES] [SEED] [verify arguments...]" >&2; exit 2; }
bash ci/setup.sh
bash ci/build.sh
report=soak-$seed.json
status=0
build/dpcheck verify --cases "$cases" --seed "$seed" --report "$report" "$@" || status=$?
echo "soak: report in $report, exit status $status"
exit "$status"
