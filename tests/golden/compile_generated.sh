#!/usr/bin/env bash
# Compiles every committed generated kernels file with nvcc for sm_80 and sm_90 (compile only: no GPU
# needed). Exits 77 (skipped) when nvcc is missing.
set -euo pipefail
SRC="$1"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[[ -x "$NVCC" ]] || { echo "nvcc not found: skipped"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for cu in "$SRC"/generated/*/*_kernels.cu; do
  for arch in sm_80 sm_90; do
    "$NVCC" -std=c++17 -arch="$arch" -c "$cu" -o "$tmp/$(basename "$cu" .cu).$arch.o" \
      -Werror all-warnings -Xcompiler -Wall,-Wextra
    echo "ok: $(basename "$cu") for $arch"
  done
done
