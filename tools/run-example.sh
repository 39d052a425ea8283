#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine (root): set-up of only what the
# walkthrough needs (tools/setup.sh --example: the build's packages, the library and the
# example, the python3 image), then the freight-quote walkthrough — a real Python snippet
# computes a quote in the sandbox, and a second one that tries the network comes back
# `network_disabled`. Arguments go to the example (`--isolation container` and so on; the
# set-up then also installs that level's runtime).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
level=process
prev=""
for arg in "$@"; do
  case "$arg" in
    --isolation=*) level=${arg#--isolation=} ;;
    *) [ "$prev" = --isolation ] && level=$arg ;;
  esac
  prev=$arg
done
case "$level" in
  process|container|gvisor|microvm) ;;
  *) level=process ;;  # the example itself says what is wrong with the flag
esac
"$ROOT/tools/setup.sh" --example "$level"
exec "$ROOT/build/${SANDBOX_PRESET:-dev}/bin/freight_quote" "$@"
