#!/usr/bin/env bash
# The GPU check's device-code checks (check_warp_segment_of.sh, check_gather_sum.sh: pieces of generated kernels
# with their helpers, compiled beside a reference loop) compile on a machine without a GPU, so a change of the
# generated code they take pieces of fails here, in CI, not first on the GPU machine. Exits 77 (skipped) without
# nvcc.
#   tests/gpu/compile_device_checks.sh HECTORGEN
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || { echo "no nvcc: skipped"; exit 77; }
for check in check_warp_segment_of check_gather_sum; do
  CHECK_COMPILE_ONLY=1 bash "$here/$check.sh" "$1"
done
