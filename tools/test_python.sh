#!/usr/bin/env bash
# Gives the Python tests (CTest label python: the generated modules' host side, the runtime's PyTorch reference,
# the offload cache, the benchmark's CPU dry run, DDP on gloo) a Python that imports torch, and points CTest at it.
# Without torch they skip (exit 77), and a CI run would then pass without running them.
#
#     tools/test_python.sh BUILD_DIR
#
# First match wins: $HECTORGEN_TEST_PYTHON; this machine's python3 when it imports torch, numpy, pytest and yaml;
# the virtual environment BUILD_DIR/test-python (made once, over this python3's packages, with the pinned torch of
# tools/torch_headers.py, numpy, pytest and PyYAML from PyPI: about 4.6 GB with torch's CUDA libraries, which the
# CPU tests load but do not use). HECTORGEN_SKIP_TORCH_TESTS=1 keeps the Python tests skipped. A failed install is
# a warning (the tests skip as they would without it), except under CI (CI=true), where it fails the run.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${1:?usage: tools/test_python.sh BUILD_DIR}"
say() { echo "test_python: $*"; }

has_torch() { "$1" -c 'import torch, numpy, pytest, yaml' > /dev/null 2>&1; }
# Points CTest's Python tests at $1 (python3 when they are to skip).
use_python() { cmake -S "$ROOT" -B "$BUILD" -DHECTORGEN_TEST_PYTHON="$1" > /dev/null; }

# What the Python tests cannot have: an error under CI (CI=true), where they would pass by skipping; else a warning.
missing() {
  if [[ "${CI:-}" == true ]]; then say "ERROR: $*"; exit 1; fi
  say "WARNING: $*; the Python tests that need it skip"
  use_python "$(command -v python3)"
  exit 0
}

python="${HECTORGEN_TEST_PYTHON:-}"
if [[ "${HECTORGEN_SKIP_TORCH_TESTS:-0}" == 1 ]]; then
  say "HECTORGEN_SKIP_TORCH_TESTS=1: the Python tests that need torch skip"
  use_python "$(command -v python3)"
  exit 0
elif [[ -n "$python" ]]; then
  say "HECTORGEN_TEST_PYTHON=$python"
elif has_torch python3; then
  python="$(command -v python3)"
else
  venv="$(cd "$BUILD" && pwd)/test-python"
  torch_version="$(python3 -c "import sys; sys.path.insert(0, '$ROOT/tools'); import torch_headers; print(torch_headers.TORCH_VERSION)")"
  if ! has_torch "$venv/bin/python3"; then
    say "no torch in python3: installing torch==$torch_version, numpy, pytest and PyYAML into $venv (once; a few minutes)"
    python3 -m venv --system-site-packages "$venv" &&
      "$venv/bin/python3" -m pip install --disable-pip-version-check -q "torch==$torch_version" numpy pytest pyyaml ||
      missing "could not install torch==$torch_version, numpy, pytest and PyYAML into $venv"
  fi
  python="$venv/bin/python3"
fi
has_torch "$python" || missing "$python does not import torch, numpy, pytest and yaml"
say "Python tests run with $python (torch $("$python" -c 'import torch; print(torch.__version__)'))"
use_python "$python"
