#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine (root): set-up, then every test — unit,
# fuzz corpus, consumer (find_package, FetchContent), and the process backend's integration
# tests and the conformance suite's core tier as root *and* as an unprivileged user with a
# delegated cgroup subtree (the heavy tier and the full soak are separate: docs/security.md).
# With CI=true a sandbox test that cannot run fails instead of skipping.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PRESET=${SANDBOX_PRESET:-dev}
BUILD="$ROOT/build/$PRESET"
# Each stage's header says when it starts (seconds since this script started), so a log,
# CI's included, shows where the time went.
stage() { echo "==> $* (at ${SECONDS} s)" >&2; }
"$ROOT/tools/setup.sh"
# Formatting first: a tree that is not clang-formatted fails at once (STYLE.md, "Tooling").
"$ROOT/tools/check-format.sh"

export SANDBOX_MUST_WORK=1
# Two whole-library builds that need no quiet machine run in the background, under SCHED_IDLE
# (they get only the cycles the stages below leave idle: a TCG guest with one vCPU leaves a
# core idle for minutes): the ThreadSanitizer stage's tests, and the test "consumer:
# FetchContent" itself (its command, from ctest), whose first run builds the library from
# source. The consumer tests then run after the conformance suite, incremental (seconds).
# A failure here fails the run (its log is shown then). Its exit status goes to BG_STATUS
# (the stage that needs the builds runs in a subshell, which cannot `wait` for them).
BG_LOG="$BUILD/background-builds.log"
BG_STATUS="$BUILD/background-builds.status"
rm -f "$BG_STATUS"
export ROOT PRESET BG_STATUS
setsid chrt --idle 0 bash -c '
  trap "echo \$? >\"\$BG_STATUS\"" EXIT
  set -euo pipefail
  echo "==> ThreadSanitizer build (preset tsan, target sandbox_tsan_tests)"
  cmake --preset tsan -S "$ROOT" >/dev/null
  cmake --build --preset tsan --target sandbox_tsan_tests
  echo "==> consumer: FetchContent, ahead of its ctest run"
  ctest --preset "$PRESET" -R "^consumer: FetchContent\$" --show-only=json-v1 |
    /usr/bin/python3 -c "import json, subprocess, sys
t = json.load(sys.stdin)[\"tests\"][0]
cwd = next((p[\"value\"] for p in t[\"properties\"] if p[\"name\"] == \"WORKING_DIRECTORY\"), None)
sys.exit(subprocess.call(t[\"command\"], cwd=cwd))"
' >"$BG_LOG" 2>&1 &
bg_pid=$!
UNPRIV_TMP=""
cleanup() {
  [ -z "$bg_pid" ] || kill -- -"$bg_pid" 2>/dev/null || true
  [ -z "$UNPRIV_TMP" ] || rm -rf "$UNPRIV_TMP"
}
trap cleanup EXIT

# Two tests at a time: the microvm tests (one emulated vCPU each, minutes) in a lane of their
# own beside the rest (tests/CMakeLists.txt, "Two at a time"). CTest's own timings from an
# earlier run reorder them; a fresh build goes by each test's COST.
JOBS=$(nproc)
[ "$JOBS" -le 2 ] || JOBS=2
stage "ctest (as root)"
ctest --preset "$PRESET" --output-on-failure --parallel "$JOBS" -LE 'conformance|consumer'
# The process backend's integration tests once more, in a QEMU microvm guest whose only
# cgroup hierarchy is cgroup2 (this host is v1-hybrid; production hosts are pure v2), as root
# with CI=true: the library's v2 cgroup path runs on every submission (docs/operations.md,
# "Pure cgroup v2 test bed"). ≈1.5 min each under TCG. Left out: the crun and runsc cases (the
# container and gvisor levels are not in the guest), the stream-control cases (their scripted
# sandbox-init is the host's python3, not in the guest) and four cases whose programs cannot
# meet their own deadlines on TCG's emulated CPU (the two Node runs: start-up within 2 s;
# 2,000 forks within 8 s; a socket race that needs 50 rounds within 2 s), and the MCP session
# case ([mcp]: a Node server's handshake, about 25 s of emulation per pass, where nothing
# depends on the cgroup version that the other session cases do not cover); they run on this
# host above. So do the data runtime and the CPython comparison ([data], [cpython]: their
# images are not on the bed's disk, and CPython's tests would take an hour under TCG).
# Then the same as an unprivileged user owning a delegated subtree (systemd's Delegate=yes on
# v2: its processes in a leaf), as tools/run-unprivileged.sh does below on this host. Cases
# tagged [pure_v2] (the daemon socket-activated in a delegated cgroup) run only here: this
# host's passes leave them out.
# Each case's time is printed as it ends (--durations), so a hang names the case after the
# last one listed; the bed's watchdog then lists every process and kernel stack in the guest
# before it fails. A failed bed is run once more (as the conformance suite below): one rare
# hang (seen once in CI, not reproduced) cannot hide the other results, and its diagnostics
# stay in the log.
GUEST_TESTS='~[container] ~[gvisor] ~[stream] ~[node] ~[mcp] ~[data] ~[cpython] ~"lifetime: thousands of orphans*" ~"network: a lingering socket*"'
for as in root user; do
  for try in 1 2; do
    stage "process backend's integration tests in a pure cgroup v2 guest (QEMU, TCG), as $as (try $try)"
    if TESTBED_AS=$as TESTBED_REQUIRE_CGROUP_PARENT=1 "$ROOT/tools/run-in-cgroup2-guest.sh" \
      "$BUILD" --use-colour no --durations yes "$GUEST_TESTS"; then
      break
    fi
    [ "$try" = 1 ] || exit 1
  done
done
# The process level creates sandbox-init in the run's cgroup2 directory
# (clone3 CLONE_INTO_CGROUP) instead of moving it there: on pure v2 that is its only cgroup
# set-up, proved here from the child's own /proc/self/cgroup (the unit test program, as root;
# about 20 s with the boot).
stage "clone3(CLONE_INTO_CGROUP) in the pure cgroup v2 guest"
TESTBED_AS=root TESTBED_PROGRAM="$BUILD/tests/sandbox_unit_tests" "$ROOT/tools/run-in-cgroup2-guest.sh" \
  "$BUILD" --use-colour no "real cgroup: a process spawned into the cgroup2 directory starts there"
# The conformance suite's core tier per level, with the rest of the run beside it. A case
# still running after 300 s makes the suite print the host's process tree and every thread's
# stack and fail (its hang watchdog); such a level is run once more, so one rare hang (under
# investigation: seen once in CI, never reproduced) cannot hide every other result, while its
# diagnostics stay in the log. Two lanes, as in the root stage, each about one core's work:
# lane [vm] runs the microvm tier (one emulated core, 600 to 930 s) and its pre-started pool
# kinds (about 130 s), then the container's pre-started pool profile (its whole tier, about
# 80 s) and the interpreter-cells entry; lane [host], one after another, the process,
# container and gvisor tiers and gvisor's pre-started kinds (about 220 + 280 + 220 + 25 s),
# the consumer tests, the ThreadSanitizer cases and the unprivileged stage. (Run E of
# 2026-12-05, with the gvisor entries in lane [vm]: that lane took 1394 s, lane [host] about
# 950 s; moved, each lane is about 1150 s.)
# The suites count only their own runs' cgroups and processes, so two tiers may run at once.
# Each lane's lines carry its tag; the run fails if either lane fails.
UNPRIV_TMP=$(mktemp -d /tmp/sandbox-unpriv-XXXXXX)
chmod 0777 "$UNPRIV_TMP"
prefix() { sed -u "s/^/[$1] /"; }
stage "conformance: the microvm and gvisor tiers in lane [vm]; the rest in lane [host]"
(
  set -o pipefail
  (
    set -e
    ctest --preset "$PRESET" --output-on-failure -L conformance -R microvm --repeat until-pass:2
    ctest --preset "$PRESET" --output-on-failure -L conformance -R 'cells|container, pre-started' \
      --repeat until-pass:2
  ) 2>&1 | prefix vm
) &
vm_lane=$!
(
  set -o pipefail
  (
    set -e
    ctest --preset "$PRESET" --output-on-failure -L conformance \
      -E 'microvm|cells|container, pre-started' --repeat until-pass:2

    stage "waiting for the background builds (log: $BG_LOG)"
    while [ ! -s "$BG_STATUS" ] && kill -0 "$bg_pid" 2>/dev/null; do sleep 2; done
    if [ "$(cat "$BG_STATUS" 2>/dev/null)" != 0 ]; then
      tail -n 80 "$BG_LOG"
      echo "tools/run-tests.sh: a background build failed (whole log: $BG_LOG)"
      exit 1
    fi
    stage "consumer tests (find_package; FetchContent, built above)"
    ctest --preset "$PRESET" --output-on-failure -L consumer

    stage "scheduler and runtime under ThreadSanitizer (preset tsan)"
    # (sandbox_tsan_tests: the unit test files with cases of these tags; tests/CMakeLists.txt;
    # built in the background above)
    TSAN_OPTIONS="halt_on_error=1 die_after_fork=0" \
      "$ROOT/build/tsan/tests/sandbox_tsan_tests" "[scheduler],[runtime],[fake],[gc]"

    stage "integration tests as an unprivileged user"
    # (The CPython comparison, [cpython], ran as root above: its outside run is a chroot.
    # [pure_v2] needs a pure cgroup v2 host: the guest passes above ran it as root and user.)
    "$ROOT/tools/run-unprivileged.sh" "$BUILD/tests/sandbox_process_tests" "~[cpython] ~[pure_v2]"
    "$ROOT/tools/run-unprivileged.sh" "$BUILD/tests/sandbox_conformance" "[core]"
    "$ROOT/tools/run-unprivileged.sh" "$BUILD/tests/cli/sandbox_cli_tests" --needs-backend "[backend]"
    "$ROOT/tools/run-unprivileged.sh" "$BUILD/tests/service/sandbox_service_tests"
    # sandboxctl mcp with the SDK client (its approval case, which needs the container level,
    # ran as root above).
    "$ROOT/tools/run-unprivileged.sh" node "$ROOT/tests/mcp/mcp.test.mjs" "$BUILD/bin/sandboxctl"
    "$ROOT/tools/run-unprivileged.sh" "$BUILD/bin/freight_quote" --blob-dir "$UNPRIV_TMP/blobs" \
      --state-dir "$UNPRIV_TMP/state"
  ) 2>&1 | prefix host
) &
host_lane=$!
vm_rc=0 host_rc=0
wait "$host_lane" || host_rc=$?
wait "$vm_lane" || vm_rc=$?
# (bg_pid stays set: when lane [host] failed before the background builds ended, the exit
# trap stops them; a group that already ended is not there to kill.)
if [ "$host_rc" != 0 ] || [ "$vm_rc" != 0 ]; then
  echo "tools/run-tests.sh: failed: lane [host] status $host_rc, lane [vm] status $vm_rc" >&2
  exit 1
fi
stage "all tests passed"
