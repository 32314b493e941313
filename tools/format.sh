#!/usr/bin/env bash
# The C++ sources in the style of .clang-format (Debian's clang-format 14,
# which tools/setup.sh installs; another version may format differently).
#
#   tools/format.sh           # formats every tracked .h/.cc in place
#   tools/format.sh --check   # lists the files that differ; exit 1 if any
set -euo pipefail
cd "$(dirname "$0")/.."
format=$(command -v clang-format-14 || command -v clang-format)
mapfile -t files < <(git ls-files '*.h' '*.cc')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    "$format" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if [ "${#bad[@]}" -gt 0 ]; then
    printf 'format.sh: not in .clang-format style (tools/format.sh fixes them):\n' >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} files in .clang-format style"
else
  "$format" -i "${files[@]}"
fi
