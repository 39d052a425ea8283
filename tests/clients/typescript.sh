#!/usr/bin/env bash
# The TypeScript client's tests (clients/typescript, `node --test`) against a real daemon:
# builds the package (npm run build, tsc) when dist/ is older than its sources, then runs
# every test/*.test.mjs with SANDBOXCTL set. Exits 77 (skipped) when a prerequisite is
# missing — node older than 18, the package's node_modules (tools/setup.sh runs `npm ci`),
# or a host where sandboxctl cannot run python3 — unless CI=true or SANDBOX_MUST_WORK=1,
# where that fails (nothing skips in CI).
#
#   tests/clients/typescript.sh /path/to/sandboxctl
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PKG="$ROOT/clients/typescript"
SANDBOXCTL=${1:?usage: typescript.sh SANDBOXCTL}

skip() {
  echo "clients: typescript package: $*" >&2
  if [ "${CI:-}" = true ] || [ "${SANDBOX_MUST_WORK:-}" = 1 ]; then
    echo "CI=true / SANDBOX_MUST_WORK=1: failing instead of skipping" >&2
    exit 1
  fi
  exit 77
}

command -v node >/dev/null 2>&1 || skip "node not found (Debian 12: apt-get install nodejs)"
major=$(node -p 'process.versions.node.split(".")[0]')
[ "$major" -ge 18 ] || skip "node $(node --version) is older than 18"
[ -x "$PKG/node_modules/.bin/tsc" ] ||
  skip "$PKG/node_modules is absent (tools/setup.sh runs npm ci there)"

# The checks the service tests make (tests/cli/cli_harness.cpp, backend_unavailable_reason),
# with the same image dir and cgroup parent the daemon will get.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
flags=(--state-dir "$scratch/state" --blob-dir "$scratch/blobs")
[ -z "${SANDBOX_IMAGE_DIR:-}" ] || flags+=(--image-dir "$SANDBOX_IMAGE_DIR")
[ -z "${SANDBOX_CGROUP_PARENT:-}" ] || flags+=(--cgroup-parent "$SANDBOX_CGROUP_PARENT")
"$SANDBOXCTL" doctor "${flags[@]}" >"$scratch/doctor" 2>&1 ||
  skip "no backend registers (sandboxctl doctor): $(cat "$scratch/doctor")"
"$SANDBOXCTL" image current python3 "${flags[@]}" >/dev/null 2>"$scratch/image" ||
  skip "the python3 image is not installed: $(cat "$scratch/image")"

cd "$PKG"
if [ ! -e dist/index.js ] || [ -n "$(find src tsconfig.json package.json -newer dist/index.js)" ]; then
  npm run --silent build
fi
export SANDBOXCTL
exec node --test test/*.test.mjs
