#!/usr/bin/env bash
# ctest starts the tests it has timings for longest first (Testing/Temporary/CTestCostData.txt in the build
# directory), and a fresh clone has none: it would start them in the order they are declared, and a
# long test declared late (BadInput.EveryRowEndsWithOneLineAndTouchesNothing under ASan, 80 s) would run
# alone at the end while the CPUs idle. So each CI stage seeds a fresh build with the timings kept in
# tests/costs/<preset>.txt: those of its tests that took 1 s or more in a run of that stage. A test not in
# the file counts as quick; a timing that has gone stale only changes the order. ctest keeps its own
# timings once it has run (seed leaves them alone).
#   bash ci/ctest-costs.sh seed BUILD-DIR PRESET   before ctest: copy tests/costs/PRESET.txt in, if none is there
#   bash ci/ctest-costs.sh save BUILD-DIR PRESET   after a run of the stage: write tests/costs/PRESET.txt anew
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: bash ci/ctest-costs.sh seed|save BUILD-DIR PRESET" >&2; exit 2; }
(($# == 3)) || usage
action=$1 data=$2/Testing/Temporary/CTestCostData.txt kept=tests/costs/$3.txt
[[ $3 =~ ^[a-z0-9-]+$ ]] || { echo "ci/ctest-costs.sh: $3: not a preset name" >&2; exit 2; }
case $action in
  seed)
    [ -e "$data" ] && exit 0
    [ -e "$kept" ] || { echo "ci/ctest-costs.sh: no $kept: the tests start in the order they are declared"; exit 0; }
    mkdir -p "$(dirname "$data")"
    cp "$kept" "$data"
    echo "ci/ctest-costs.sh: $(($(wc -l < "$kept") - 1)) test timings from $kept: the longest start first"
    ;;
  save)
    [ -e "$data" ] || { echo "ci/ctest-costs.sh: no $data: run the stage's tests first" >&2; exit 2; }
    # "name runs seconds" lines, then "---" and the names of the tests that failed, which are left out.
    { awk '$1 == "---" { exit } NF == 3 && $3 >= 1 { printf "%s 1 %.1f\n", $1, $3 }' "$data" | sort -k3,3 -g -r
      echo "---"; } > "$kept"
    echo "ci/ctest-costs.sh: $kept: $(($(wc -l < "$kept") - 1)) tests of 1 s or more"
    ;;
  *) usage ;;
esac
