#!/usr/bin/env bash
# The benchmark in one command on a CUDA machine (run from anywhere; bench/README.md):
#
#   bench/run.sh [--part K/N] [--datasets aifb,am] [--models rgcn,rgat,hgt] [--variants fp32,tf32,bf16,fp16]
#                [--baselines hand_fp32,hand_bf16,pyg_RGCNConv,...] [--modes infer,train] [--seed S] [--skew A]
#                [--case-budget SECONDS] ...        (every option of bench/bench.py; --plan N lists the parts)
#
# 1. hectorgen: $HECTORGEN, build/hectorgen or build/hg_bundle/hectorgen (tools/gpu_check.sh --bundle; carried),
#    the first that runs; without one only the committed generated/ (the fp32 variant) is benchmarked.
# 2. the hectorgen runtime, built and installed once into $HG_BENCH_DIR/runtime-prefix (default build/bench/,
#    which git ignores, so a warm machine keeps it between calls; rebuilt when runtime/ changes).
# 3. bench.py --prepare: generates each selected model x variant into $HG_BENCH_DIR/gen and builds the
#    extensions in parallel (incremental: an unchanged module is not rebuilt).
# 4. bench.py: the cases of this part, one progress line each; JSON lines in $OUT/results-KofN.jsonl, everything
#    printed in $OUT/bench.log; the short table last. No case starts after BENCH_LIMIT_S (default 540) seconds
#    of the whole command, so a part fits a 10-minute call; skipped cases say so.
# Then, on any machine: python3 bench/report.py results-*.jsonl  ->  bench/results.md and bench/*.png
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/out/bench}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="${HG_BENCH_DIR:-$ROOT/build/bench}"
mkdir -p "$WORK/bin"
LIMIT="${BENCH_LIMIT_S:-540}"
export HG_BENCH_CACHE="${HG_BENCH_CACHE:-$WORK/cache}"
export PYTHONUNBUFFERED=1
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="$PATH:/usr/local/cuda/bin"; fi

exec > >(tee -a "$OUT/bench.log") 2>&1
TEE_PID=$!
# shellcheck disable=SC2317  # invoked by the EXIT trap: let tee finish writing bench.log before the call returns
finish() {
  local rc=$?
  exec 1>&- 2>&-
  wait "$TEE_PID" 2>/dev/null || true
  exit "$rc"
}
trap finish EXIT
log() { echo "[run.sh $(printf '%3d' "$SECONDS")s] $*"; }
left() { echo $((LIMIT - SECONDS)); }

for a in "$@"; do
  if [[ "$a" == --plan* || "$a" == -h || "$a" == --help ]]; then exec python3 bench/bench.py "$@"; fi
done
log "repo $ROOT, OUT $OUT, work $WORK, args: $*"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'; } | sed 's/^/  /'

# ---- 1. hectorgen ---------------------------------------------------------------------------------------------
# shellcheck source=bench/find_hectorgen.sh
source "$ROOT/bench/find_hectorgen.sh"

# ---- 2. the hectorgen runtime ----------------------------------------------------------------------------------
# shellcheck source=bench/build_runtime.sh
source "$ROOT/bench/build_runtime.sh"
export PYTHONPATH="$RT/python${PYTHONPATH:+:$PYTHONPATH}"

# ---- 3. generate and build the variants -------------------------------------------------------------------------
log "generating and building the variants (log: $OUT/bench.log)"
timeout -k 10 "$(( $(left) - 150 > 60 ? $(left) - 150 : 60 ))" \
  python3 bench/bench.py --prepare "$@" --gen-dir "$WORK/gen" --hectorgen "$HG" ||
  log "prepare: some variants failed (their cells say why)"
cp "$WORK/gen/prepare.json" "$OUT/prepare.json" 2>/dev/null || true

# ---- 4. the cases -------------------------------------------------------------------------------------------------
BUDGET=$(( $(left) - 25 ))
log "benchmark: cases may start during the next ${BUDGET}s"
rc=0
timeout -k 10 "$(( $(left) > 10 ? $(left) : 10 ))" \
  python3 bench/bench.py "$@" --gen-dir "$WORK/gen" --out "$OUT" --budget-s "$BUDGET" || rc=$?
log "done (rc=$rc) in ${SECONDS}s; results in $OUT"
exit "$rc"
