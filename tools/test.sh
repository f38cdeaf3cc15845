#!/usr/bin/env bash
# Runs the whole test suite (set-up and build included): unit, round-trip, diagnostics, robustness,
# golden and compile tests through CTest. GPU checks are separate: tools/gpu_check.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/tools/bootstrap.sh" "$ROOT/build"
cd "$ROOT/build"
ctest --output-on-failure -j"$(nproc)"
