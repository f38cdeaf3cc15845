#!/usr/bin/env bash
# Compiles everything hectorgen wrote into each output directory (no GPU needed):
#   tests/compile/compile_outputs.sh DIR...
# nvcc -c for sm_80 and sm_90 for every .cu, the host .cpp against torch's headers (syntax only),
# py_compile for every .py; every warning is an error. One line per file; exits 1 on any failure.
# Details, options and environment: compile_outputs.py next to this script.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/compile_outputs.py" "$@"
