#!/usr/bin/env bash
# Data-parallel scaling in one command on a machine with several GPUs (run from anywhere; docs/distributed.md):
#
#   bench/ddp_run.sh [options of bench/ddp_scaling.py --run]   e.g. --gpus 1,2,4 --graphs mag,wikikg2 --models rgat
#                                                                    --shards stride,cost --sync-debug-run
#   bench/ddp_run.sh --prepare [--models M]      steps 1-3 only (a warm machine keeps them for the next call)
#   bench/ddp_run.sh --checks-only [--models M]  steps 1-4 only: the NCCL checks, no scaling runs
#
# 1. hectorgen: $HECTORGEN, build/hectorgen or build/hg_bundle/hectorgen (the first that runs); without one the
#    committed generated/ is used.
# 2. the hectorgen runtime, built and installed once into $HG_BENCH_DIR/runtime-prefix (default build/bench/, shared
#    with bench/run.sh and rebuilt when runtime/ changes).
# 3. bench.py --prepare: the fp32 modules of the selected models generated into $HG_BENCH_DIR/gen and built.
# 4. a 2-process NCCL --check of the first model on the 'small' graph in khop mode with cost shards and the subgraphs
#    prefetched on a side stream (weights vs 1 process, bit-identical rerun).
# 5. bench/ddp_scaling.py --run: torchrun on 1, 2, 4 GPUs (those present) per graph; JSON lines in
#    $OUT/ddp_scaling.jsonl, the check in $OUT/ddp_check.jsonl, everything printed in $OUT/ddp.log; the table last.
# The whole command stays under DDP_LIMIT_S (default 470) seconds, so it fits one 8-minute call. NVLink multicast stays
# off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1; /work/.library/device/KINDS.md).
# Then, on any machine: python3 bench/ddp_scaling.py --report ddp_scaling.jsonl  ->  bench/ddp_scaling.{md,png}
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/out/ddp}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="${HG_BENCH_DIR:-$ROOT/build/bench}"
mkdir -p "$WORK/bin"
LIMIT="${DDP_LIMIT_S:-470}"
export HG_BENCH_CACHE="${HG_BENCH_CACHE:-$WORK/cache}"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then export PATH="$PATH:/usr/local/cuda/bin"; fi

exec > >(tee -a "$OUT/ddp.log") 2>&1
TEE_PID=$!
# shellcheck disable=SC2317  # invoked by the EXIT trap: let tee finish writing ddp.log before the call returns
finish() {
  local rc=$?
  exec 1>&- 2>&-
  wait "$TEE_PID" 2>/dev/null || true
  exit "$rc"
}
trap finish EXIT
log() { echo "[ddp_run.sh $(printf '%3d' "$SECONDS")s] $*"; }
left() { echo $((LIMIT - SECONDS)); }

MODELS=rgat
PREPARE_ONLY=0
CHECKS_ONLY=0
ARGS=()
prev=""
for x in "$@"; do
  [[ "$prev" == --models ]] && MODELS="$x"
  case "$x" in
    --prepare) PREPARE_ONLY=1 ;;
    --checks-only) CHECKS_ONLY=1 ;;
    *) ARGS+=("$x") ;;
  esac
  prev="$x"
done
set -- "${ARGS[@]}"
log "repo $ROOT, OUT $OUT, work $WORK, models $MODELS, args: $*"
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>&1 || true
  nvidia-smi topo -m 2>/dev/null | head -12 || true
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
              ".".join(map(str, torch.cuda.nccl.version())), "GPUs", torch.cuda.device_count())'; } | sed 's/^/  /'

# ---- 1. hectorgen -----------------------------------------------------------------------------------------------
# shellcheck source=bench/find_hectorgen.sh
source "$ROOT/bench/find_hectorgen.sh"

# ---- 2. the hectorgen runtime (bench/build_runtime.sh: one build serves both scripts) ----------------------------
# shellcheck source=bench/build_runtime.sh
source "$ROOT/bench/build_runtime.sh"
export PYTHONPATH="$RT/python${PYTHONPATH:+:$PYTHONPATH}"

# ---- 3. generate and build the modules ----------------------------------------------------------------------------
log "generating and building $MODELS (fp32)"
timeout -k 10 "$(( $(left) - 200 > 60 ? $(left) - 200 : 60 ))" \
  python3 bench/bench.py --prepare --models "$MODELS" --variants fp32 --gen-dir "$WORK/gen" --hectorgen "$HG" ||
  log "prepare: FAILED (the runs below will say why)"

if ((PREPARE_ONLY)); then log "--prepare: done in ${SECONDS}s"; exit 0; fi

# ---- 4. the checks over NCCL: 2 GPUs, all GPUs, the runtime under DDP ---------------------------------------------
NGPU="$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)"
check_rc=0
if ((NGPU >= 2)); then
  rm -f "$OUT/ddp_check.jsonl"
  # Every GPU count present (2, then all of them), then the runtime under DDP: activations offloaded by the tensor
  # cache to per-rank files, features gathered from a per-rank unified tensor (docs/distributed.md).
  runs=("2")
  ((NGPU > 2)) && runs+=("$NGPU")
  runs+=("2 runtime")
  for run in "${runs[@]}"; do
    read -r n extra <<< "$run"
    args=(--model "${MODELS%%,*}" --check --graph small --mode khop --shard cost --steps 6 --batch 512 --backend nccl
          --generated "$WORK/gen" --out "$OUT/ddp_check.jsonl")
    what="khop mode (subgraphs prefetched), cost shards"
    if [[ -n "$extra" ]]; then
      # The 'small' graph's activations are a few hundred KiB: offload everything above 16 KiB, or nothing moves.
      args+=(--offload file --offload-min-kib 16 --features unified)
      what+=", activations offloaded to per-rank files, features in per-rank unified tensors"
    fi
    log "check: ${MODELS%%,*}, $n processes on $n GPUs over NCCL, $what"
    timeout -k 5 90 python3 -m torch.distributed.run --standalone --nproc_per_node="$n" tools/ddp_train.py \
      "${args[@]}" || check_rc=$?
  done
else
  log "check: SKIPPED ($NGPU GPU(s): NCCL needs one GPU per process)"
fi

if ((CHECKS_ONLY)); then log "--checks-only: done in ${SECONDS}s (check rc=$check_rc)"; exit "$((check_rc != 0))"; fi

# ---- 5. the scaling runs ------------------------------------------------------------------------------------------
BUDGET=$(( $(left) - 20 ))
log "scaling: runs may start during the next ${BUDGET}s"
rc=0
timeout -k 10 "$(( $(left) > 10 ? $(left) : 10 ))" python3 bench/ddp_scaling.py --run "$@" --generated "$WORK/gen" \
  --out "$OUT/ddp_scaling.jsonl" --budget-s "$BUDGET" || rc=$?
[[ -s "$OUT/ddp_scaling.jsonl" ]] &&
  python3 bench/ddp_scaling.py --report "$OUT/ddp_scaling.jsonl" --md "$OUT/ddp_scaling.md" --png "$OUT/ddp_scaling.png"
log "done: check rc=$check_rc, scaling rc=$rc, in ${SECONDS}s; results in $OUT"
((check_rc == 0 && rc == 0))
