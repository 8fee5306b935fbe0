#!/usr/bin/env bash
# dpcheck's C, C++ and CUDA sources follow its .clang-format (clang-format 14, Debian's clang-format
# package). Without --fix: prints each file that differs with clang-format's first complaints and exits 1;
# exits 0 when every file follows it. With --fix: rewrites the files in place. The files are those git
# tracks under SOURCE-DIR (a copy without git: every such file outside build*/), or the FILEs given.
# ctest runs it (Format.SourcesFollowClangFormat, and Format.AMisformattedFileFails on a planted file).
#   bash ci/format.sh [--fix] [SOURCE-DIR [FILE...]]
set -euo pipefail
fix=0
if [[ ${1:-} == --fix ]]; then fix=1; shift; fi
if [[ ${1:-} == -* ]]; then echo "usage: bash ci/format.sh [--fix] [SOURCE-DIR [FILE...]]" >&2; exit 2; fi
src=$(cd "${1:-$(dirname "$0")/..}" && pwd)
(($#)) && shift
style=$src/.clang-format
[ -f "$style" ] || { echo "ci/format.sh: no .clang-format in $src" >&2; exit 2; }
tool=
for t in clang-format-14 clang-format; do
  if command -v "$t" > /dev/null; then tool=$t; break; fi
done
[ -n "$tool" ] || { echo "ci/format.sh: no clang-format (apt-get install clang-format)" >&2; exit 77; }

files=("$@")
if ((${#files[@]} == 0)); then
  if git -C "$src" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    mapfile -t files < <(git -C "$src" ls-files -- '*.c' '*.h' '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.inc' |
                         sed "s|^|$src/|")
  else
    mapfile -t files < <(find "$src" -path "$src/build*" -prune -o -type f \( -name '*.c' -o -name '*.h' \
                           -o -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \) \
                           -print | sort)
  fi
fi
((${#files[@]})) || { echo "ci/format.sh: no source files under $src" >&2; exit 2; }

if ((fix)); then
  "$tool" --style="file:$style" -i "${files[@]}"
  echo "ci/format.sh: ${#files[@]} files formatted"
  exit 0
fi
# One clang-format for every file: a start per file took ten times as long.
if out=$("$tool" --style="file:$style" --dry-run --Werror "${files[@]}" 2>&1); then
  echo "ci/format.sh: all ${#files[@]} files follow .clang-format"
  exit 0
fi
head -n 30 <<< "$out"
mapfile -t differ < <(sed -n -E 's/^(.+):[0-9]+:[0-9]+: error: code should be clang-formatted.*$/\1/p' <<< "$out" | sort -u)
if ((${#differ[@]} == 0)); then
  echo "ci/format.sh: $tool failed" >&2
  exit 2
fi
printf '  %s\n' "${differ[@]}"
echo "ci/format.sh: ${#differ[@]} of ${#files[@]} files do not follow .clang-format; bash ci/format.sh --fix rewrites them"
exit 1
