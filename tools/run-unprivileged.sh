#!/usr/bin/env bash
# Runs a command as the unprivileged user `sandbox-ci` with a cgroup subtree delegated to it,
# the way systemd's Delegate=yes would: the user owns <hierarchy>/agent-sandbox-ci, the command
# itself lives in the leaf .../host (cgroup v2 forbids processes in inner cgroups and requires
# the mover to own the common ancestor), and runs go under .../runs.
#   tools/run-unprivileged.sh COMMAND [ARGS...]
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "run as root" >&2; exit 2; }
USER_NAME=sandbox-ci
id "$USER_NAME" >/dev/null 2>&1 || useradd --system --create-home --shell /usr/sbin/nologin "$USER_NAME"
uid=$(id -u "$USER_NAME"); gid=$(id -g "$USER_NAME")
CG=/sys/fs/cgroup
SUB=agent-sandbox-ci

delegate() {  # $1 = hierarchy dir
  local h=$1
  mkdir -p "$h/$SUB/host" "$h/$SUB/runs"
  chown -R "$uid:$gid" "$h/$SUB"
}
if [ -f "$CG/cgroup.controllers" ]; then
  # Pure cgroup v2: enable the controllers down to the delegated subtree.
  for c in memory pids cpu; do echo "+$c" > "$CG/cgroup.subtree_control" 2>/dev/null || true; done
  delegate "$CG"
  for c in memory pids cpu; do echo "+$c" > "$CG/$SUB/cgroup.subtree_control"; done
  echo $$ > "$CG/$SUB/host/cgroup.procs"
else
  # v1 / hybrid: one subtree per v1 hierarchy, plus the unified (v2) mount if present.
  for h in memory pids cpu cpuacct freezer; do
    [ -d "$CG/$h" ] && delegate "$CG/$h" && echo $$ > "$CG/$h/$SUB/host/cgroup.procs"
  done
  if [ -d "$CG/unified" ]; then
    delegate "$CG/unified"
    echo $$ > "$CG/unified/$SUB/host/cgroup.procs"
  fi
fi

export SANDBOX_CGROUP_PARENT="/$SUB/runs"
export SANDBOX_IMAGE_DIR=${SANDBOX_IMAGE_DIR:-/var/lib/agent-sandbox/images}
export HOME=$(getent passwd "$USER_NAME" | cut -d: -f6)
export XDG_RUNTIME_DIR= XDG_DATA_HOME=
exec setpriv --reuid="$uid" --regid="$gid" --init-groups --reset-env \
  env SANDBOX_CGROUP_PARENT="$SANDBOX_CGROUP_PARENT" SANDBOX_IMAGE_DIR="$SANDBOX_IMAGE_DIR" \
      SANDBOX_MUST_WORK="${SANDBOX_MUST_WORK:-}" CI="${CI:-}" HOME="$HOME" "$@"
