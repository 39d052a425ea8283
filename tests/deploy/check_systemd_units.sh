#!/usr/bin/env bash
# `systemd-analyze verify` on deploy/systemd/ (offline: it needs no running systemd), with
# ExecStart= pointed at the built sandboxctl (verify refuses a command that does not exist).
# Fails on any complaint about our units, warnings (an unknown key, a bad value) included.
#   check_systemd_units.sh <sandboxctl> <source dir>
# Exit 77 (skipped) without systemd-analyze, unless CI=true or SANDBOX_MUST_WORK=1.
set -euo pipefail
SANDBOXCTL=$1
SRC=$2
if ! command -v systemd-analyze >/dev/null; then
  echo "check_systemd_units: systemd-analyze is not installed (tools/setup.sh installs systemd)"
  if [ "${CI:-}" = true ] || [ "${SANDBOX_MUST_WORK:-}" = 1 ]; then exit 1; fi
  exit 77
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
sed "s|/usr/local/bin/sandboxctl|$SANDBOXCTL|" "$SRC/deploy/systemd/agent-sandbox.service" \
  >"$TMP/agent-sandbox.service"
cp "$SRC/deploy/systemd/agent-sandbox.socket" "$TMP/"
grep -q "^ExecStart=$SANDBOXCTL serve " "$TMP/agent-sandbox.service" ||
  { echo "check_systemd_units: ExecStart= does not start with /usr/local/bin/sandboxctl serve"; exit 1; }
rc=0
out=$(cd "$TMP" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify \
  ./agent-sandbox.socket ./agent-sandbox.service 2>&1) || rc=$?
mine=$(printf '%s\n' "$out" | grep -F agent-sandbox || true)
printf '%s\n' "$out"
if [ "$rc" != 0 ] || [ -n "$mine" ]; then
  echo "check_systemd_units: systemd-analyze verify failed (status $rc)"
  exit 1
fi
echo "check_systemd_units: both units verify"
