#!/usr/bin/env bash
# The RGCN half of item 5 in one command on a CUDA machine (run from anywhere; bench/unified/README.md):
#
#   bench/unified/rgcn_e2e.sh [--quick] [every option of rgcn_e2e.py]
#
# 1. hectorgen: $HECTORGEN, build/hectorgen or build/hg_bundle/hectorgen (bench/find_hectorgen.sh).
# 2. the hectorgen runtime, built and installed once into $HG_BENCH_DIR/runtime-prefix (default build/bench/;
#    bench/build_runtime.sh, shared with bench/run.sh), first on PYTHONPATH and CMAKE_PREFIX_PATH.
# 3. rgcn_e2e.py: generates the two layers into $HG_BENCH_DIR/rgcn_e2e and builds them (not again when unchanged),
#    then the epochs; results (rgcn_e2e.json, rgcn_e2e.log) in $OUT, else bench/unified/results.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
WORK="${HG_BENCH_DIR:-$ROOT/build/bench}"
mkdir -p "$WORK"
LIMIT="${BENCH_LIMIT_S:-540}"
export PYTHONUNBUFFERED=1
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="$PATH:/usr/local/cuda/bin"; fi
log() { echo "[rgcn_e2e.sh $(printf '%3d' "$SECONDS")s] $*"; }
left() { echo $((LIMIT - SECONDS)); }

# shellcheck source=bench/find_hectorgen.sh
source "$ROOT/bench/find_hectorgen.sh"
if [[ -z "$HG" ]]; then
  log "no hectorgen runs here: build it (build/hectorgen), carry build/hg_bundle or set HECTORGEN"
  exit 1
fi
# shellcheck source=bench/build_runtime.sh
source "$ROOT/bench/build_runtime.sh"
export PYTHONPATH="$RT/python${PYTHONPATH:+:$PYTHONPATH}"
exec python3 bench/unified/rgcn_e2e.py --hectorgen "$HG" --work "$WORK/rgcn_e2e" "$@"
