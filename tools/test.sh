#!/usr/bin/env bash
# Runs the whole test suite (set-up and build included): unit, round-trip, diagnostics, robustness,
# golden, compile and Python tests through CTest. GPU checks are separate: tools/gpu_check.sh.
# The compile tests (ctest -L compile) compile everything generated for the bundled and test specs and for a
# sample of the fuzzer's accepted mutants: nvcc (sm_80, sm_90), the host code against torch's headers, Python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trap 'echo "test.sh: set-up, build and tests took ${SECONDS} s"' EXIT
"$ROOT/tools/bootstrap.sh" "$ROOT/build"
"$ROOT/tools/test_python.sh" "$ROOT/build"   # a Python with torch for the Python tests (CTest label python)
cd "$ROOT/build"
ctest --output-on-failure -j"$(nproc)"
