#!/usr/bin/env bash
# Installs clients/python offline into a fresh venv under the build tree and runs its pytest
# suite against a real `sandboxctl serve`.
#
#   run_python_client_tests.sh SANDBOXCTL VENV_DIR
#
# Exit 77 (skipped) when a prerequisite is missing (Debian's python3-venv, python3-pip,
# python3-setuptools, python3-wheel, python3-pytest: tools/setup.sh installs them) — unless
# CI=true or SANDBOX_MUST_WORK=1, where a missing prerequisite fails.
set -euo pipefail

sandboxctl=$1
venv=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
python=/usr/bin/python3

skip() {
  echo "run_python_client_tests: $*" >&2
  if [ "${CI:-}" = true ] || [ "${SANDBOX_MUST_WORK:-}" = 1 ]; then exit 1; fi
  exit 77
}

[ -x "$python" ] || skip "no $python"
for module in venv ensurepip setuptools wheel pytest; do
  "$python" -c "import $module" 2>/dev/null || skip "python module '$module' is missing"
done
[ "$(id -u)" = 0 ] || [ -n "${SANDBOX_CGROUP_PARENT:-}" ] ||
  skip "needs root or a delegated cgroup (SANDBOX_CGROUP_PARENT) to run sandboxes"

# Offline: the system's setuptools and wheel build the package (no build isolation, no
# index); the venv sees Debian's pytest through --system-site-packages.
# From a copy: setuptools writes its egg-info beside the sources, and a test never writes
# into the source tree.
rm -rf "$venv" "$venv.src"
cp -r "$root/clients/python" "$venv.src"
rm -rf "$venv.src"/src/*.egg-info "$venv.src/build"
"$python" -m venv --system-site-packages "$venv"
PIP_CONFIG_FILE=/dev/null "$venv/bin/pip" install --quiet --no-index --no-build-isolation \
  --disable-pip-version-check "$venv.src"

# Run from outside the source tree, so the installed package is what gets imported.
cd "$venv"
SANDBOXCTL=$sandboxctl exec "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  "$root/clients/python/tests"
