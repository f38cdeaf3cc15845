#!/usr/bin/env bash
# Builds and runs the vector-gather microbenchmark (vector_gather.cu) on a CUDA machine; log in $OUT if set.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp}"
nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/vector_gather "$here/vector_gather.cu"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/vector_gather.log"
/tmp/vector_gather | tee -a "$out/vector_gather.log"
