#!/usr/bin/env bash
# The benchmark suite (docs/performance.md): set-up, then every section of sandbox_bench.
# Not part of the test suite. Arguments go to sandbox_bench: --runs N, --section NAME.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/tools/setup.sh"
exec "$ROOT/build/${SANDBOX_PRESET:-dev}/bin/sandbox_bench" "$@"
