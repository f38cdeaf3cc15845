#!/usr/bin/env bash
# CTest entry (test "gpu_references_cpu"): the CPU-only tests of tests/gpu -- the generic PyTorch reference
# against the float64 interpreter (test_ir_torch.py), the GPU check's harness in its CPU dry mode
# (test_gpu_check_dry.py), the interpreter bridge, the graphs and the hand-written references. They need a Python
# ($HECTORGEN_TEST_PYTHON, else python3) with torch, pytest and PyYAML; without them the test is SKIPPED (exit 77).
#   tests/gpu/run_cpu_tests.sh HECTORGEN [pytest args...]
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HG="${1:?usage: run_cpu_tests.sh HECTORGEN [pytest args...]}"
shift
PY="${HECTORGEN_TEST_PYTHON:-python3}"
if ! "$PY" -c 'import torch, pytest, yaml' 2>/dev/null; then
  echo "gpu_references_cpu: SKIPPED: needs $PY with torch, pytest and PyYAML (pip install torch pytest pyyaml)"
  exit 77
fi
export HECTORGEN="$HG"
cd "$HERE"
exec "$PY" -m pytest -q -p no:cacheprovider -rsx test_ir_torch.py test_gpu_check_dry.py test_reference_bridge.py \
  test_graphs_compare.py test_reference_models.py "$@"
