#!/usr/bin/env bash
# Builds and runs the traversal microbenchmarks on a CUDA machine: vector_gather.cu (lanes a row, scalar or vector
# loads), edge_chain.cu (the chain of dependent index loads per edge) and self_fusion.cu (RGCN's self GEMM fused
# into its node traversal); logs in $OUT if set.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/traversal.log"
for b in ${TRAVERSAL_BENCHES:-vector_gather edge_chain self_fusion}; do
  nvcc -O3 -std=c++17 -arch=sm_90 -I "$here/../../runtime/include" -o "/tmp/$b" "$here/$b.cu"
  "/tmp/$b" | tee -a "$out/traversal.log"
done
