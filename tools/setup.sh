#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine, as root: installs the build and test
# dependencies, builds agent-sandbox (preset "dev"), and builds the runtime images (python3,
# node, tools, chromium, mcp, python3-data, python3-test; below) into the image store when
# they are missing. Safe to run again at any time.
#
#   tools/setup.sh                      # everything (what tools/run-tests.sh needs)
#   tools/setup.sh --example [LEVEL]    # only what the freight walkthrough needs at LEVEL
#                                       # (process, container, gvisor or microvm; default
#                                       # process): tools/run-example.sh
#   SANDBOX_SKIP_IMAGES=1 tools/setup.sh   # packages and build only
set -euo pipefail

# The scope: "all", or "example" with the walkthrough's isolation level.
SCOPE=all
LEVEL=process
case "${1:-}" in
  "") ;;
  --example)
    SCOPE=example
    LEVEL=${2:-process}
    case "$LEVEL" in
      process|container|gvisor|microvm) ;;
      *) echo "tools/setup.sh: --example: unknown isolation level '$LEVEL' (process, container, gvisor or microvm)" >&2; exit 2 ;;
    esac
    ;;
  *) echo "usage: tools/setup.sh [--example [process|container|gvisor|microvm]]" >&2; exit 2 ;;
esac

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PRESET=${SANDBOX_PRESET:-dev}
BUILD="$ROOT/build/$PRESET"
IMAGE_DIR=${SANDBOX_IMAGE_DIR:-/var/lib/agent-sandbox/images}

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "tools/setup.sh: run as root (it installs packages and builds images with debootstrap)" >&2
  exit 2
fi

# 1. Packages (Debian 12). Only what is missing is installed. crun, runc and runsc are the OCI
#    runtimes of the container and gvisor levels (their backends are tested in CI); python3
#    and openssl make the egress tests' loopback origins and their certificate on the host;
#    gdb gives the conformance hang watchdog its backtraces; qemu-system-x86 and erofs-utils
#    are the microvm level's VMM and its read-only image disks; lz4 unpacks the guest kernel
#    for a direct boot (tools/extract-vmlinux.py); cpio packs the initramfs of
#    the pure cgroup v2 test bed (tools/run-in-cgroup2-guest.sh); clang-format checks the
#    tree's formatting before the tests (tools/check-format.sh); python3-venv, -pip,
#    -setuptools, -wheel and -pytest install clients/python offline into a venv and run its
#    tests (tests/clients/run_python_client_tests.sh); python3-yaml parses the Kubernetes
#    manifests and systemd brings systemd-analyze, which verifies the unit files offline
#    (tests/deploy/: a fresh Debian 12 container has neither).
#    The walkthrough (--example) needs only the build's packages, debootstrap, and its level's
#    runtime (crun, runsc, or QEMU with erofs-utils and lz4); everything else is the tests'.
BUILD_PACKAGES=(
  g++ cmake make pkg-config git ca-certificates tar gzip xz-utils
  libboost1.81-dev libboost-program-options1.81-dev libfmt-dev nlohmann-json3-dev
  libseccomp-dev libssl-dev catch2 libbenchmark-dev
  debootstrap util-linux iproute2 procps
)
TEST_PACKAGES=(
  bubblewrap
  crun runc runsc
  python3 openssl gdb
  qemu-system-x86 erofs-utils lz4
  cpio
  clang-format
  python3-venv python3-pip python3-setuptools python3-wheel python3-pytest
  python3-yaml systemd
)
if [ "$SCOPE" = all ]; then
  PACKAGES=("${BUILD_PACKAGES[@]}" "${TEST_PACKAGES[@]}")
else
  PACKAGES=("${BUILD_PACKAGES[@]}")
  case "$LEVEL" in
    container) PACKAGES+=(crun runc) ;;
    gvisor) PACKAGES+=(runsc) ;;
    microvm) PACKAGES+=(qemu-system-x86 erofs-utils lz4) ;;
  esac
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm (the MCP image's packages, the TypeScript client's npm ci; Debian's npm brings Debian's
# nodejs, 18): Debian's, unless the host has one already (a nodejs from elsewhere bundles its
# own, and Debian's npm would conflict with it).
[ "$SCOPE" = example ] || command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# `npm ci` in DIR from the registry, exactly as its package-lock.json pins, install scripts
# off; skipped when node_modules was installed from this very lock file (a stamp holds the
# lock's hash).
npm_ci_pinned() {
  local dir=$1 lock
  lock=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  [ "$(cat "$dir/node_modules/.setup-lock-sha256" 2>/dev/null)" = "$lock" ] && return 0
  log "npm ci in ${dir#"$ROOT"/}"
  (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$lock" >"$dir/node_modules/.setup-lock-sha256"
}
# The TypeScript client's dev dependencies (typescript, @types/node) for its test
# (tests/clients/typescript.sh).
[ "$SCOPE" = example ] || npm_ci_pinned "$ROOT/clients/typescript"

# The microvm level's guest kernel (Debian's cloud kernel, unpacked, not installed).
if [ "$SCOPE" = all ] || [ "$LEVEL" = microvm ]; then
  "$ROOT/tools/fetch-guest-kernel.sh"
fi

# 2. Build, with the images (3.) made alongside: the image builder first
#    (bin/sandbox-image-build: `sandboxctl image build` alone, which needs only the image
#    store's part of the library, about a third of it), then the rest of the tree while
#    debootstrap and dpkg (one process at a time, so one core) run in the background. Their
#    output goes to $BUILD/setup-images.log, shown when one fails.
log "building ($PRESET)"
cmake --preset "$PRESET" -S "$ROOT" >/dev/null
cmake --build --preset "$PRESET" --target sandbox-image-build
BUILDER="$BUILD/bin/sandbox-image-build"

# 3. Runtime images, built from Debian packages with debootstrap when absent (about a minute
#    each on a first run, several for chromium and python3-data). SANDBOX_IMAGES picks which
#    (default: all):
#    - python3, node: the language runtimes;
#    - tools: the registered tools the tests use (docs/operations.md, "Registered tools"): a
#      Markdown renderer (cmark) and a regex engine (pcre2grep);
#    - chromium: Debian's Chromium (and python3 to drive it) for the headless-browser
#      example, examples/browser_screenshot;
#    - python3-data: the data-analysis runtime — Debian's python3 with numpy, pandas,
#      matplotlib and scipy (a host defines the runtime in its configuration's `runtimes`
#      section: README, "Data analysis");
#    - python3-test: Debian's python3 plus libpython3.11-testsuite (CPython's own regression
#      tests), for the compatibility test that runs them inside the sandbox and outside on
#      the same image (tests/integration/process/cpython_compat_test.cpp);
#    - mcp: Debian's node plus the reference "everything" stdio MCP server from npm (pinned;
#      its dependencies accept the image's node 18), installed by the host's npm with scripts
#      disabled, for the session tests (tests/integration/process/session_test.cpp).
if [ "$SCOPE" = example ]; then
  DEFAULT_IMAGES="python3"
else
  DEFAULT_IMAGES="python3 node tools chromium mcp python3-data python3-test"
fi
build_images() {
  for runtime in ${SANDBOX_IMAGES:-$DEFAULT_IMAGES}; do
    if "$BUILDER" --current "$runtime" --image-dir "$IMAGE_DIR" >/dev/null 2>&1; then
      log "image $runtime: present"
    else
      log "image $runtime: building with debootstrap"
      packages=()
      case "$runtime" in
        python3|node) ;;
        tools) packages=(--package cmark --package pcre2-utils) ;;
        chromium) packages=(--package chromium --package fonts-dejavu-core --package python3) ;;
        mcp) packages=(--package nodejs --npm @modelcontextprotocol/server-everything@2025.9.25) ;;
        python3-data) packages=(--package python3 --package python3-numpy --package python3-pandas
          --package python3-matplotlib --package python3-scipy) ;;
        python3-test) packages=(--package python3 --package libpython3.11-testsuite) ;;
        *) echo "tools/setup.sh: unknown image $runtime in SANDBOX_IMAGES" >&2; return 2 ;;
      esac
      "$BUILDER" "$runtime" "${packages[@]}" --image-dir "$IMAGE_DIR"
      log "image $runtime: built"
    fi
  done
}
images_pid=""
images_log="$BUILD/setup-images.log"
if [ "${SANDBOX_SKIP_IMAGES:-0}" != 1 ]; then
  build_images >"$images_log" 2>&1 &
  images_pid=$!
  # Stop the image builds if the build below fails (set -e leaves through here).
  trap '[ -z "$images_pid" ] || kill "$images_pid" 2>/dev/null || true' EXIT
fi
if [ "$SCOPE" = example ]; then
  cmake --build --preset "$PRESET" --target freight_quote
else
  cmake --build --preset "$PRESET"
fi
if [ -n "$images_pid" ]; then
  log "waiting for the images (log: $images_log)"
  # On a terminal, each image's steps as they happen (quiet otherwise).
  if [ -t 2 ]; then
    tail -n +1 -f --pid="$images_pid" "$images_log" 2>/dev/null |
      grep -a --line-buffered -e '==> image' -e 'info: image build' >&2 || true
  fi
  if ! wait "$images_pid"; then
    images_pid=""
    tail -n 60 "$images_log" >&2
    echo "tools/setup.sh: building the runtime images failed (whole log: $images_log)" >&2
    exit 1
  fi
  images_pid=""
  [ -t 2 ] || grep -a '==> image' "$images_log" >&2 || true
fi
# 4. The official MCP TypeScript SDK client for the `sandboxctl mcp` test (tests/mcp).
[ "$SCOPE" = example ] || npm_ci_pinned "$ROOT/tests/mcp"
log "set-up done"
