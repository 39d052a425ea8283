#!/usr/bin/env bash
# Fails when a C++ file of the tree is not formatted as .clang-format says (Debian 12's
# clang-format 14). CI runs it before the tests (tools/run-tests.sh); to fix a tree:
#   tools/check-format.sh --fix
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
if ! command -v clang-format >/dev/null 2>&1; then
  echo "tools/check-format.sh: clang-format not found (Debian: apt-get install clang-format)" >&2
  exit 2
fi
# Every tracked C/C++ source, and new ones git does not ignore.
mapfile -d '' files < <(git ls-files -z --cached --others --exclude-standard \
  '*.cpp' '*.hpp' '*.c' '*.h')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/check-format.$$; then
  # One line per file: its name and how many places differ.
  grep -oE '^[^ :]+:[0-9]+:[0-9]+: (error|warning)' /tmp/check-format.$$ | cut -d: -f1 |
    sort | uniq -c | awk '{print "  " $2 " (" $1 " places)"}' >&2
  rm -f /tmp/check-format.$$
  echo "tools/check-format.sh: the files above are not clang-formatted; run tools/check-format.sh --fix" >&2
  exit 1
fi
rm -f /tmp/check-format.$$
echo "==> formatting: ${#files[@]} files as .clang-format says" >&2
