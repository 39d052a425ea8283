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
"$ROOT/tools/setup.sh"

export SANDBOX_MUST_WORK=1
echo "==> ctest (as root)" >&2
ctest --preset "$PRESET" --output-on-failure -LE conformance
# The process backend's integration tests once more, in a QEMU microvm guest whose only
# cgroup hierarchy is cgroup2 (this host is v1-hybrid; production hosts are pure v2), as root
# with CI=true: the library's v2 cgroup path runs on every submission (docs/operations.md,
# "Pure cgroup v2 test bed"). ≈1.5 min each under TCG. Left out: the crun and runsc cases (the
# container and gvisor levels are not in the guest), the stream-control cases (their scripted
# sandbox-init is the host's python3, not in the guest) and four cases whose programs cannot
# meet their own deadlines on TCG's emulated CPU (the two Node runs: start-up within 2 s;
# 2,000 forks within 8 s; a socket race that needs 50 rounds within 2 s); they run on this
# host above.
# Then the same as an unprivileged user owning a delegated subtree (systemd's Delegate=yes on
# v2: its processes in a leaf), as tools/run-unprivileged.sh does below on this host.
GUEST_TESTS='~[container] ~[gvisor] ~[stream] ~[node] ~"lifetime: thousands of orphans*" ~"network: a lingering socket*"'
for as in root user; do
  echo "==> process backend's integration tests in a pure cgroup v2 guest (QEMU, TCG), as $as" >&2
  TESTBED_AS=$as TESTBED_REQUIRE_CGROUP_PARENT=1 "$ROOT/tools/run-in-cgroup2-guest.sh" "$BUILD" \
    --use-colour no "$GUEST_TESTS"
done
# The conformance suite's core tier, per level. A case still running after 300 s makes the
# suite print the host's process tree and every thread's stack and fail (its hang watchdog);
# such a level is run once more, so one rare hang (under investigation: seen once in CI,
# never reproduced) cannot hide every other result, while its diagnostics stay in the log.
ctest --preset "$PRESET" --output-on-failure -L conformance --repeat until-pass:2

echo "==> scheduler and runtime under ThreadSanitizer (preset tsan)" >&2
cmake --preset tsan -S "$ROOT" >/dev/null
cmake --build --preset tsan --target sandbox_unit_tests
TSAN_OPTIONS="halt_on_error=1 die_after_fork=0" \
  "$ROOT/build/tsan/tests/sandbox_unit_tests" "[scheduler],[runtime],[fake],[gc]"

echo "==> integration tests as an unprivileged user" >&2
UNPRIV_TMP=$(mktemp -d /tmp/sandbox-unpriv-XXXXXX)
chmod 0777 "$UNPRIV_TMP"
trap 'rm -rf "$UNPRIV_TMP"' EXIT
"$ROOT/tools/run-unprivileged.sh" "$BUILD/tests/sandbox_process_tests"
"$ROOT/tools/run-unprivileged.sh" "$BUILD/tests/sandbox_conformance" "[core]"
"$ROOT/tools/run-unprivileged.sh" "$BUILD/tests/cli/sandbox_cli_tests" --needs-backend "[backend]"
"$ROOT/tools/run-unprivileged.sh" "$BUILD/tests/service/sandbox_service_tests"
"$ROOT/tools/run-unprivileged.sh" "$BUILD/bin/freight_quote" --blob-dir "$UNPRIV_TMP/blobs" \
  --state-dir "$UNPRIV_TMP/state"
echo "==> all tests passed" >&2
