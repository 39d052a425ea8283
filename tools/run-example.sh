#!/usr/bin/env bash
# The main job, end to end on a fresh Debian 12 machine (root): set-up, then the freight-quote
# walkthrough — a real Python snippet computes a quote in the process sandbox, and a second
# one that tries the network comes back `network_disabled`.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The walkthrough needs only the language images (the test suite's set-up builds the rest).
SANDBOX_IMAGES=${SANDBOX_IMAGES:-python3 node} "$ROOT/tools/setup.sh"
exec "$ROOT/build/${SANDBOX_PRESET:-dev}/bin/freight_quote" "$@"
