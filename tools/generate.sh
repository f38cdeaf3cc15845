#!/usr/bin/env bash
# The main job: set up, build hectorgen, generate code for a spec and compile the generated kernels.
#   tools/generate.sh [SPEC] [OUTDIR]        (default: specs/rgat.yaml out/<model>)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SPEC="${1:-$ROOT/specs/rgat.yaml}"
"$ROOT/tools/bootstrap.sh" "$ROOT/build"
MODEL="$(basename "${SPEC%.*}")"
OUT="${2:-$ROOT/out/$MODEL}"
"$ROOT/build/hectorgen" "$SPEC" -o "$OUT"
echo "generate: wrote $(find "$OUT" -type f | wc -l) file(s) to $OUT"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
shopt -s nullglob
cus=("$OUT"/*.cu)
if ((${#cus[@]})) && [[ -x "$NVCC" ]]; then
  for cu in "${cus[@]}"; do
    for arch in sm_80 sm_90; do
      "$NVCC" -std=c++17 -arch="$arch" -I"$ROOT/runtime/include" -c "$cu" -o "${cu%.cu}.$arch.o" -Xcompiler -Wall
      echo "generate: compiled $(basename "$cu") for $arch"
    done
  done
fi
