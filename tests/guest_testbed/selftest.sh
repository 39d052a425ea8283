#!/usr/bin/env bash
# Self-test of the pure cgroup v2 test bed (tools/run-in-cgroup2-guest.sh), run by CTest:
#   1. bad input is refused before anything is built, naming the variable or path;
#   2. the probe (testbed_probe.cpp) finds every promise kept inside the guest (cgroup2 only
#      with memory, pids, cpu; root; CI=true SANDBOX_MUST_WORK=1; read-only root; no status
#      port in /dev), prints a forged "TESTBED-EXIT 0" and exits 7: the bed must exit 7; and
#      as TESTBED_AS=user: not root, in the delegated leaf, managing only its own subtree;
#   3. a command that never ends is stopped by the guest's watchdog a quarter before
#      TESTBED_TIMEOUT, its processes listed on the console: exit 125, no QEMU left.
# Exit 77 (skipped) without root, QEMU or the guest kernel — unless CI=true or
# SANDBOX_MUST_WORK=1, where that is a failure.
#
#   selftest.sh <build dir> <path of run-in-cgroup2-guest.sh>
set -uo pipefail
BUILD=$1
BED=$2
KERNEL=${SANDBOX_KERNEL_DIR:-/var/lib/agent-sandbox/microvm/kernel}/current
PROBE=$BUILD/tests/guest_testbed/testbed_probe
STEP=
LOG=
# On a failure the failing step's whole output, then the reason, last: a passing step prints
# one line, so CTest's output (which CI cuts in the middle) keeps the failure whole.
fail() {
  if [ -n "$LOG" ] && [ -s "$LOG" ]; then
    echo "selftest: --- output of step '$STEP' ---" >&2
    cat "$LOG" >&2
  fi
  echo "selftest: FAILED${STEP:+ (step '$STEP')}: $*" >&2
  exit 1
}
skip() {
  if [ "${CI:-}" = true ] || [ "${SANDBOX_MUST_WORK:-}" = 1 ]; then
    fail "cannot run ($*) and CI=true / SANDBOX_MUST_WORK=1"
  fi
  echo "selftest: skipped: $*" >&2
  exit 77
}
[ "$(id -u)" = 0 ] || skip "not root"
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not installed"
[ -f "$KERNEL/vmlinuz" ] || skip "no guest kernel at $KERNEL (tools/fetch-guest-kernel.sh)"
[ -x "$PROBE" ] || fail "$PROBE is not built"
# One vCPU (the bed's default is two): nothing here needs more, and CTest then runs another
# test beside it (PROCESSORS 1) instead of holding both slots for a minute, half of it the
# hang case's wait for the watchdog.
export TESTBED_CPUS=${TESTBED_CPUS:-1}
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

# 1. Bad input: exit 125 with the field named, nothing booted.
STEP="bad input"
expect_refusal() {  # expect_refusal WHAT_THE_MESSAGE_NAMES ENV... -- ARGS...
  local names=$1
  shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$BED" "$@" >"$LOG" 2>&1
  local rc=$?
  [ $rc = 125 ] || fail "expected exit 125 for bad '$names', got $rc"
  grep -q -- "$names" "$LOG" || fail "the refusal does not name '$names'"
  grep -q "booting" "$LOG" && fail "booted despite bad '$names'"
  return 0
}
expect_refusal TESTBED_MEM_MIB TESTBED_MEM_MIB=lots -- "$BUILD"
expect_refusal TESTBED_TIMEOUT TESTBED_TIMEOUT=-5 -- "$BUILD"
expect_refusal TESTBED_CPUS TESTBED_CPUS=2x -- "$BUILD"
expect_refusal TESTBED_AS TESTBED_AS=admin -- "$BUILD"
expect_refusal TESTBED_ACCEL TESTBED_ACCEL=xen TESTBED_PROGRAM="$PROBE" -- "$BUILD" 0
expect_refusal /nonexistent-build-dir X=1 -- /nonexistent-build-dir
expect_refusal "TESTBED_PROGRAM" TESTBED_PROGRAM=relative/prog -- "$BUILD"
expect_refusal "no guest kernel" SANDBOX_KERNEL_DIR=/nonexistent TESTBED_PROGRAM="$PROBE" -- "$BUILD" 0
echo "selftest: bad input refused, each naming its field" >&2

# 2. The probe: every promise held, its own status comes back, the forged line is ignored.
STEP="the probe, as root"
TESTBED_PROGRAM=$PROBE "$BED" "$BUILD" 7 >"$LOG" 2>&1
rc=$?
grep -q "^TESTBED-EXIT 0" "$LOG" || fail "the probe's forged status line is not in the output"
grep -q "all promises hold" "$LOG" || fail "the probe did not report its promises held"
[ $rc = 7 ] || fail "expected the probe's exit status 7, got $rc"
echo "selftest: the probe's status 7 came back; its forged 'TESTBED-EXIT 0' did not count" >&2

# 2b. The same as the unprivileged user (TESTBED_AS=user): in its delegated leaf, not root.
STEP="the probe, as the user"
TESTBED_AS=user TESTBED_PROGRAM=$PROBE "$BED" "$BUILD" 5 user >"$LOG" 2>&1
rc=$?
[ $rc = 5 ] || fail "expected the probe's exit status 5 as the user, got $rc"
echo "selftest: as the user, in a delegated subtree: every promise held" >&2

# 3. A command that never ends: stopped by the guest's watchdog, the guest gone.
STEP="a hung command"
TESTBED_PROGRAM=$PROBE TESTBED_TIMEOUT=40 "$BED" "$BUILD" hang >"$LOG" 2>&1
rc=$?
[ $rc = 125 ] || fail "expected exit 125 for a guest past its deadline, got $rc"
grep -q "ran past the watchdog's 30 s" "$LOG" || fail "the watchdog's message is missing"
grep -q "^testbed: pid [0-9]* (testbed_probe) .*testbed_probe hang" "$LOG" ||
  fail "the watchdog did not list the hung command"
grep -q "^testbed: --- watchdog: end ---" "$LOG" || fail "the watchdog's dump did not end"
if pgrep -f "$BUILD/guest-testbed/run-" >/dev/null; then fail "a QEMU of the bed outlived it"; fi
echo "selftest: a hung command is listed and stopped by the watchdog (exit 125), nothing left running" >&2
echo "selftest: passed" >&2
