#!/usr/bin/env bash
# What a one-shot `sandboxctl run` of print(1) costs as a user or a shell-driven agent calls
# it, at the process level, with more levels enabled in --config beside it — against a bare
# `python3 -I -S -c 'print(1)'` measured in the same run, rounds interleaved. Prints p50 and
# p95 (ms) per configuration and each p50's ratio to bare's; no pass/fail (docs/performance.md,
# "The CLI's cold path").
#
#   tools/bench-cli.sh [RUNS]        # as root, after tools/setup.sh; RUNS per case (default 20)
#   SANDBOXCTL=/path/to/sandboxctl tools/bench-cli.sh   # another build of it
#
# Cases: bare; process only; container and gvisor enabled; microvm enabled (the levels a
# process-level run does not need: `sandboxctl run` self-tests only the levels its run can
# use). A case whose level is not available here still runs: the run needs only the process
# level. The untimed first round records each level's self-test pass; the timed rounds reuse
# it, as every invocation after the first on a host does (docs/operations.md, "Start-up
# self-test"). Then, when built, `sandbox_bench_cold` gives the library's own cold run (a
# `runtime::run` call to result in a live process, its p50 over RUNS runs, measured right
# after) and each case's ratio to it (issue 18's aim: at most 1.5x).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/build/${SANDBOX_PRESET:-dev}"
RUNS=${1:-20}
CTL="${SANDBOXCTL:-$BUILD/bin/sandboxctl}"  # SANDBOXCTL=...: another build's, to compare
[ -x "$CTL" ] || { echo "tools/bench-cli.sh: $CTL missing: run tools/setup.sh first" >&2; exit 2; }
case "$RUNS" in '' | *[!0-9]*) echo "tools/bench-cli.sh: RUNS must be a number" >&2; exit 2 ;; esac

WORK=$(mktemp -d /tmp/sandbox-bench-cli-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo 'print(1)' >"$WORK/one.py"
echo '{"v": 1}' >"$WORK/process.json"
echo '{"v": 1, "backends": {"container": {"runtime": "crun"}, "gvisor": {"runtime": "runsc"}}}' >"$WORK/oci.json"
echo '{"v": 1, "backends": {"microvm": {}}}' >"$WORK/microvm.json"

cases=(bare process oci microvm)
run_case() {
  case "$1" in
    bare) /usr/bin/python3 -I -S -c 'print(1)' ;;
    *) "$CTL" run --state-dir "$WORK/state" --blob-dir "$WORK/blobs" --config "$WORK/$1.json" \
      "$WORK/one.py" ;;
  esac
}
# One untimed run of each first (page cache, image unpacking), and a check that it works.
for c in "${cases[@]}"; do
  out=$(run_case "$c" 2>&1) || { echo "tools/bench-cli.sh: case $c failed: $out" >&2; exit 1; }
done
for ((i = 0; i < RUNS; i++)); do
  for c in "${cases[@]}"; do
    t0=$(date +%s%N)
    run_case "$c" >/dev/null 2>&1
    t1=$(date +%s%N)
    echo $(((t1 - t0) / 1000)) >>"$WORK/$c.us"
  done
done
pct() { sort -n "$1" | awk -v p="$2" '{v[NR] = $1} END {i = int((NR - 1) * p + 0.5) + 1; printf "%.1f", v[i] / 1000}'; }
bare=$(pct "$WORK/bare.us" 0.5)
printf '%-36s %9s %9s %9s\n' "sandboxctl run of print(1), $RUNS runs" "p50 ms" "p95 ms" "vs bare"
for c in "${cases[@]}"; do
  p50=$(pct "$WORK/$c.us" 0.5)
  p95=$(pct "$WORK/$c.us" 0.95)
  case "$c" in
    bare) label="bare python3 -I -S" ;;
    process) label="process level only" ;;
    oci) label="container + gvisor enabled" ;;
    microvm) label="microvm enabled" ;;
  esac
  printf '%-36s %9s %9s %8.2fx\n' "$label" "$p50" "$p95" "$(awk -v a="$p50" -v b="$bare" 'BEGIN {print a / b}')"
done
# The library's own cold run, from its benchmark (not interleaved: a process of its own).
COLD="$BUILD/bin/sandbox_bench_cold"
if [ -x "$COLD" ] && lib=$("$COLD" "$RUNS" 2>/dev/null | awk '/^sandboxed: total, call to result/ {print $(NF-1)}') &&
  [ -n "$lib" ]; then
  printf '%-36s %9s\n' "library's own cold run (sandbox_bench_cold)" "$lib"
  for c in process oci microvm; do
    p50=$(pct "$WORK/$c.us" 0.5)
    printf "  %-34s %8.2fx the library's cold run\n" "$c" "$(awk -v a="$p50" -v b="$lib" 'BEGIN {print a / b}')"
  done
fi
