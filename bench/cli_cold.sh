#!/usr/bin/env bash
# What a one-shot `sandboxctl run` of print(1) costs as a user or a shell-driven agent calls
# it, at the process level, with more levels enabled in --config beside it, against two
# baselines measured in the same run, rounds interleaved (each round in a rotated order):
#   - bare `/usr/bin/python3 -I -S -c 'print(1)'`;
#   - the library's own cold run: `runtime::run` of print(1) in a live process, call to
#     result (`sandbox_bench_cold --serve`, asked for one run per round).
# Prints the median and p95 (ms) per case and each median's ratio to both baselines; no
# pass/fail (docs/performance.md, "The CLI's cold path"; issue 18's aim: at most 1.5x the
# library's cold run with container and gvisor enabled, and no VM boot for a process-level
# run with microvm enabled).
#
#   bench/cli_cold.sh [RUNS]        # as root, after tools/setup.sh; RUNS per case (default 20)
#   SANDBOXCTL=/path/to/sandboxctl bench/cli_cold.sh   # another build of it
#
# Cases: process only; container and gvisor enabled; microvm enabled (levels a process-level
# run does not need: `sandboxctl run` self-tests only the levels its run can use). A case
# whose level is not available here still runs: the run needs only the process level. The
# untimed first round records the process level's self-test pass in a fresh state directory;
# the timed rounds reuse it, as every invocation after the first on a host does
# (docs/operations.md, "Start-up self-test"). After the rounds, one more invocation of each
# case with --verbose shows which levels it started and whether it self-tested.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD="$ROOT/build/${SANDBOX_PRESET:-dev}"
RUNS=${1:-20}
CTL="${SANDBOXCTL:-$BUILD/bin/sandboxctl}"
COLD="$BUILD/bin/sandbox_bench_cold"
me=bench/cli_cold.sh
for b in "$CTL" "$COLD"; do
  [ -x "$b" ] || { echo "$me: $b missing: run tools/setup.sh (or build it) first" >&2; exit 2; }
done
case "$RUNS" in '' | *[!0-9]* | 0) echo "$me: RUNS must be a positive number" >&2; exit 2 ;; esac
[ -n "${EPOCHREALTIME:-}" ] || { echo "$me: needs bash 5 (EPOCHREALTIME)" >&2; exit 2; }

WORK=$(mktemp -d /tmp/sandbox-bench-cli-XXXXXX)
LIB_PID=
cleanup() {
  [ -z "$LIB_PID" ] || kill "$LIB_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
echo 'print(1)' >"$WORK/one.py"
echo '{"v": 1}' >"$WORK/process.json"
echo '{"v": 1, "backends": {"container": {"runtime": "crun"}, "gvisor": {"runtime": "runsc"}}}' >"$WORK/oci.json"
echo '{"v": 1, "backends": {"microvm": {}}}' >"$WORK/microvm.json"

cases=(bare lib process oci microvm)
declare -A label=([bare]="bare python3 -I -S -c 'print(1)'" [lib]="library's cold run (runtime::run)"
  [process]="sandboxctl run, process level only" [oci]="  ... container + gvisor enabled"
  [microvm]="  ... microvm enabled")
ctl() {
  "$CTL" run --state-dir "$WORK/state" --blob-dir "$WORK/blobs" --config "$WORK/$1.json" "${@:2}" \
    "$WORK/one.py"
}

# The library's own cold run, in a process of its own that runs one per line we send.
coproc LIB { exec "$COLD" --serve 2>"$WORK/lib.err"; }
lib_in=${LIB[1]} lib_out=${LIB[0]}
read -r ready <&"$lib_out" || ready=
[ "$ready" = ready ] || { echo "$me: sandbox_bench_cold: $(cat "$WORK/lib.err")" >&2; exit 1; }

# One untimed round first (page cache; records the self-test pass), and a check it works.
for c in process oci microvm; do
  out=$(ctl "$c" 2>"$WORK/err") && [ "$out" = 1 ] ||
    { echo "$me: case $c failed: $out $(cat "$WORK/err")" >&2; exit 1; }
done
n=${#cases[@]}
for ((i = 0; i < RUNS; i++)); do
  for ((k = 0; k < n; k++)); do
    c=${cases[$(((i + k) % n))]}  # rotated: no case always follows the same one
    case "$c" in
      lib)
        echo >&"$lib_in"
        read -r ms <&"$lib_out"
        case "$ms" in error*) echo "$me: the library's run failed: $ms" >&2; exit 1 ;; esac
        echo "$ms" >>"$WORK/$c.ms"
        continue
        ;;
    esac
    t0=$EPOCHREALTIME
    if [ "$c" = bare ]; then
      /usr/bin/python3 -I -S -c 'print(1)' >/dev/null
    else
      ctl "$c" >/dev/null 2>&1
    fi
    t1=$EPOCHREALTIME
    awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f\n", (b - a) * 1000}' >>"$WORK/$c.ms"
  done
done
exec {lib_in}>&-
wait "$LIB_PID" 2>/dev/null || true
LIB_PID=

# Median (mean of the middle two for an even count) and p95 (nearest rank).
stat_of() {
  sort -n "$1" | awk '{v[NR] = $1} END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    r = int(NR * 0.95 + 0.999999); if (r < 1) r = 1
    printf "%.1f %.1f\n", m, v[r] }'
}
read -r bare_m _ < <(stat_of "$WORK/bare.ms")
read -r lib_m _ < <(stat_of "$WORK/lib.ms")
echo "$RUNS rounds, interleaved; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-40s %8s %8s %8s %8s\n' "print(1)" "median" "p95 ms" "vs bare" "vs lib"
for c in "${cases[@]}"; do
  read -r m p < <(stat_of "$WORK/$c.ms")
  printf '%-40s %8s %8s %7.2fx %7.2fx\n' "${label[$c]}" "$m" "$p" \
    "$(awk -v a="$m" -v b="$bare_m" 'BEGIN {print a / b}')" \
    "$(awk -v a="$m" -v b="$lib_m" 'BEGIN {print a / b}')"
done
# What each case started: its self-test lines and the levels it made (host log, --verbose).
for c in process oci microvm; do
  started=$(ctl "$c" --verbose 2>&1 >/dev/null | grep -E 'self-test|backend (ready|not registered)' |
    sed -e 's/^agent-sandbox: [a-z]*: //' -e 's/ (.*//' | paste -sd ';' -) || true
  printf '%-10s %s\n' "$c:" "${started:-nothing logged}"
done
