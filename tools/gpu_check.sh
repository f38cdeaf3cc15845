#!/usr/bin/env bash
# GPU check of the generated code for ANY spec, in one command on a CUDA machine (run from anywhere):
#
#   tools/gpu_check.sh [SPEC|MODEL ...]   every bundled and test spec by default (specs/, tests/gpu/specs/,
#                                         tests/specs/); reports in $OUT (default: out/gpu_check)
#   tools/gpu_check.sh --shard K/N [SPEC|MODEL ...]   the K-th of N interleaved parts of those specs (all by
#                                         default; GPU_CHECK_SHARD=K/N): the whole default list no longer fits
#                                         one 10-minute call, --shard 1/3 .. 3/3 does in three
#   tools/gpu_check.sh --dtypes tf32,bf16,fp16 [SPEC|MODEL ...]
#                                      the dtype run (below); fp32 alone (the default) is the run described here
#   tools/gpu_check.sh --bundle        (on the BUILD machine) copy build/hectorgen and the shared libraries of
#                                      its -dev dependencies into build/hg_bundle/, to carry to a GPU machine
#                                      that has no fmt/spdlog/yaml-cpp/CLI11 packages
#   DEVICE=cpu tools/gpu_check.sh      a dry run without a GPU (stand-in modules computed by the PyTorch model;
#                                      no build, no sanitizer): exercises the whole harness
#
# Steps (each logged; the whole run is kept under GPU_CHECK_BUDGET_S seconds, default 470, raised to what a cold
# machine's builds need beside the later steps when it is smaller):
#   1. hectorgen: $HECTORGEN, else build/hectorgen, else build/hg_bundle/hectorgen (first one that runs, with the
#      libraries of build/hg_bundle/lib on LD_LIBRARY_PATH if needed), else a fresh build into build-gpu/ (needs
#      the -dev packages). Without any: the bundled generated/ is tested and the interpreter rows FAIL.
#   1b. builds and installs the hectorgen runtime (runtime/, CMake) into $HG_GEN_DIR/runtime-prefix and exports
#      CMAKE_PREFIX_PATH and PYTHONPATH so that the extensions and the generated modules find it (gen.log).
#   2. gpu_check.py --prepare: generates every spec into $HG_GEN_DIR/generated/<model> (default /tmp/hg_gen; a
#      mirror of the repo layout, so relative paths in the output match), notes "no backward pass" warnings
#      (those specs are checked forward-only) and failures, diffs bundled models against generated/, then builds
#      the extensions in parallel (build.log).
#   3. gpu_check.py: per spec (one child process each), tiny graph vs the float64 interpreter (forward and the
#      gradients of autodiff's backward) and the generic PyTorch model (tests/gpu/ir_torch.py), medium graph vs
#      the PyTorch model in float64 on the GPU; fresh random inputs every run, NaN-poisoned re-runs of forward
#      and backward, bit-identical weight gradients, timings (gpu_check.md, gpu_check.json).
#   4. compute-sanitizer memcheck and racecheck (in parallel, each over two shards of the specs) on one
#      forward + backward per spec on the tiny graph (sanitizer.log).
#   4b. tools/ddp_train.py --check for rgat and hgt (DDP_MODELS): 2 processes on this one GPU over gloo with CUDA
#      tensors, weights vs one process, bit-identical rerun, ranks agree (ddp.log, ddp.jsonl; docs/distributed.md);
#      then the runtime under DDP (DDP_RUNTIME_MODEL, default hgt, khop mode): activations offloaded by the tensor
#      cache to per-rank files, features gathered from per-rank unified tensors, the same bits as without them.
#   4c. tests/gpu/check_warp_segment_of.sh: the warp's search of a pair's relation that hectorgen emits (RGAT's
#      compact pair traversals), against a scan over random offsets with empty segments; tests/gpu/check_gather_sum.sh:
#      a gather sum of the compact backward against a loop adding in the same order, bit for bit.
#   4d. the runtime's GPU tests with pytest (tests/runtime/test_preprocess.py, test_unified_gpu.py, test_offload_gpu.py:
#      preprocessing on the GPU bit for bit against the reference, unified tensors, the tensor cache; runtime_tests.log)
#      in the time the checks leave (RUNTIME_TESTS="test_preprocess ..." names them and reserves 60 s for them).
#   5. tools/train_example.py if time is left (train.log, train_loss.png).
#   6. the short per-spec table, printed last (summary.txt). Everything printed is also in gpu_check.log.
# Exit status 0 iff every spec PASSes: all checks, with gradients (a forward-only spec is not a pass), and
# memcheck and racecheck clean. The layers of rgcn, rgat and hgt (--capture MODELS, or CAPTURE: others, all, none)
# are also run under torch.cuda.set_sync_debug_mode("error") (no host synchronisation) and captured in CUDA graphs:
# the forward and a training step, replayed on new values and compared with an eager run.
#
# The dtype run, --dtypes LIST (or DTYPES=LIST; fp32, tf32, bf16, fp16 or all): every selected spec (default
# specs/rgcn, rgat, hgt, tests/specs/gcn_shared, simplehgn) is generated once per dtype, as module <model>_<dtype>
# from the spec with options.dtype replaced (gen_check.log), all built in parallel; then, per module (4 child
# processes at a time, CHECK_JOBS), on the tiny and mini graphs (GRAPHS), inputs, weights and output gradients
# drawn in float64 and rounded to the storage dtype, poisoned memory: forward, forward_train and backward vs the
# float64 interpreter on the same rounded values, at the dtype's tolerance (fp32 1e-5, tf32 2e-3, bf16/fp16 2e-2
# relative: tests/gpu/dtypes.py), bit-identical weight gradients, no host sync and CUDA graphs as above; then
# memcheck and racecheck as in 4, on the dtype's values. No training example; budget 550 s (< 10 minutes with the
# builds). The table printed last has one line per spec, dtype and phase (max rel err, tolerance, PASS/FAIL; the
# sanitizers' lines last). A module generated without dtype support (no DTYPE constant) is one FAIL line of its
# variant. A spec whose own options.dtype is not fp32 is checked by a dtype run only (the plain run refuses it).
#
# Environment: OUT, SPECS (comma list of specs or model names; MODELS is an alias), GRAPHS (tiny,medium), DTYPES,
# CAPTURE, CHECK_JOBS,
# HG_GEN_DIR, HECTORGEN, SEED, GPU_CHECK_BUDGET_S, DEVICE (cuda|cpu), SKIP_SANITIZER=1, SANITIZER_FLAGS (extra
# compute-sanitizer options, e.g. "--report-api-errors no" if PyTorch itself trips API-error reports),
# SKIP_TRAIN=1, TRAIN_MODELS (rgcn rgat hgt; none: no training example), SKIP_DDP=1, DDP_MODELS (rgat hgt),
# SKIP_RUNTIME_TESTS=1, RUNTIME_TESTS (test files of tests/runtime without .py),
# DDP_RUNTIME_MODEL (hgt), DDP_STEPS (4), HECTORGEN_CUDA_ARCH (default: this GPU's, e.g. 90).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# ---- --bundle: run on the build machine ---------------------------------------------------------------------
if [[ "${1:-}" == "--bundle" ]]; then
  src="${2:-$ROOT/build/hectorgen}"
  dst="$ROOT/build/hg_bundle"
  [[ -x "$src" ]] || { echo "gpu_check: $src missing: build it first (tools/bootstrap.sh)" >&2; exit 1; }
  rm -rf "$dst"
  mkdir -p "$dst/lib/std"
  cp "$src" "$dst/hectorgen"
  strip "$dst/hectorgen" 2>/dev/null || true
  # Every resolved dependency except glibc's own libraries; libstdc++/libgcc_s go to lib/std, used only if the
  # GPU machine's own are too old.
  while read -r name path; do
    case "$name" in
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | ld-linux* | linux-vdso*) ;;
      libstdc++.so* | libgcc_s.so*) cp -L "$path" "$dst/lib/std/$name" ;;
      *) cp -L "$path" "$dst/lib/$name" ;;
    esac
  done < <(ldd "$src" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
  # The commit the binary was built from (the GPU machine's copy of the repository may not know it).
  { git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo "?"; } >"$dst/COMMIT"
  git -C "$ROOT" diff --quiet HEAD -- src templates 2>/dev/null || sed -i 's/$/-dirty/' "$dst/COMMIT"
  "$dst/hectorgen" --version
  echo "gpu_check: wrote $dst ($(du -sh "$dst" | cut -f1)): carry build/hg_bundle to the GPU machine"
  ls -l "$dst" "$dst/lib" "$dst/lib/std"
  exit 0
fi

DTYPES="${DTYPES:-}"
CAPTURE="${CAPTURE:-rgcn,rgat,hgt}"
POS=()
while (($#)); do
  case "$1" in
    --dtypes) DTYPES="${2:?--dtypes needs a list, e.g. tf32,bf16,fp16}"; shift 2 ;;
    --dtypes=*) DTYPES="${1#--dtypes=}"; shift ;;
    --capture) CAPTURE="${2:?--capture needs a list of models, all or none}"; shift 2 ;;
    --capture=*) CAPTURE="${1#--capture=}"; shift ;;
    --shard) GPU_CHECK_SHARD="${2:?--shard needs K/N, e.g. 1/3}"; shift 2 ;;
    --shard=*) GPU_CHECK_SHARD="${1#--shard=}"; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) POS+=("$1"); shift ;;
  esac
done
DTYPE_RUN=0
case "${DTYPES// /}" in "" | fp32) DTYPES="" ;; *) DTYPE_RUN=1 ;; esac
if ((DTYPE_RUN)); then  # the list is checked before anything is built
  python3 -c 'import sys; sys.path.insert(0, "tests/gpu"); import dtypes; dtypes.parse_dtypes(sys.argv[1])' "$DTYPES" ||
    { echo "gpu_check: bad --dtypes $DTYPES" >&2; exit 2; }
fi

OUT="${OUT:-$ROOT/out/gpu_check}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
GEN_ROOT="${HG_GEN_DIR:-/tmp/hg_gen}"
GEN_DIR="$GEN_ROOT/generated"
SPECS="${SPECS:-${MODELS:-}}"
SPEC_ARGS=()
if ((${#POS[@]})); then SPEC_ARGS=("${POS[@]}"); elif [[ -n "$SPECS" ]]; then IFS=',' read -r -a SPEC_ARGS <<< "$SPECS"; fi
if [[ -n "${GPU_CHECK_SHARD:-}" ]]; then  # the K-th of N interleaved parts of those specs (all by default)
  SHARD_LIST="$(cd "$ROOT" && python3 - "$GPU_CHECK_SHARD" "${SPEC_ARGS[@]}" <<'PY'
import sys
sys.path.insert(0, "tests/gpu")
from gpu_check import discover
try:
    k, n = (int(x) for x in sys.argv[1].split("/"))
    assert 1 <= k <= n
except (ValueError, AssertionError):
    sys.exit(f"gpu_check: --shard {sys.argv[1]}: expected K/N with 1 <= K <= N")
for v in discover(sys.argv[2:])[0][k - 1::n]:
    print(v.spec)
PY
)" || exit 2
  mapfile -t SPEC_ARGS <<< "$SHARD_LIST"
  [[ -n "${SPEC_ARGS[0]:-}" ]] || { echo "gpu_check: shard $GPU_CHECK_SHARD holds no spec" >&2; exit 2; }
fi
if ((DTYPE_RUN)); then
  GRAPHS="${GRAPHS:-tiny,mini}"
  BUDGET="${GPU_CHECK_BUDGET_S:-550}"
  DTYPE_ARGS=(--dtypes "$DTYPES")
else
  GRAPHS="${GRAPHS:-tiny,medium}"
  BUDGET="${GPU_CHECK_BUDGET_S:-470}"
  DTYPE_ARGS=()
fi
DEVICE="${DEVICE:-cuda}"
CHECK="tests/gpu/gpu_check.py"

exec > >(tee -a "$OUT/gpu_check.log") 2>&1
TEE_PID=$!
# shellcheck disable=SC2317  # invoked by the EXIT trap
finish() {
  local rc=$?
  exec 1>&- 2>&-
  wait "$TEE_PID" 2>/dev/null || true
  exit "$rc"
}
trap finish EXIT

left() { echo $((BUDGET - SECONDS)); }
cap() { # cap WANT RESERVE: min(WANT, time left - RESERVE), at least 1
  local l=$(($(left) - $2))
  ((l < $1)) || l=$1
  ((l > 0)) || l=1
  echo "$l"
}
log() { echo "[gpu_check $(printf '%3d' "$SECONDS")s] $*"; }
# Seconds the steps after the checks need (sanitizers, DDP, device helpers), and after the builds (those and the
# checks, ~15 s a spec): what each earlier step leaves untouched. Skipped steps reserve nothing, so that a small
# budget (GPU_CHECK_BUDGET_S) with few specs and SKIP_SANITIZER=1 SKIP_DDP=1 still builds on a cold machine; every
# spec with every step reserves what it always did (75 s after the checks, 230 after the builds).
RESERVE_AFTER_CHECKS=10
if [[ "${SKIP_SANITIZER:-0}" != 1 && "$DEVICE" != cpu ]]; then
  RESERVE_AFTER_CHECKS=$((RESERVE_AFTER_CHECKS + 45))
fi
if ((!DTYPE_RUN)) && [[ "${SKIP_DDP:-0}" != 1 ]]; then RESERVE_AFTER_CHECKS=$((RESERVE_AFTER_CHECKS + 20)); fi
# The runtime's tests take what the checks leave, unless asked for by name (RUNTIME_TESTS): then they reserve 60 s.
if ((!DTYPE_RUN)) && [[ -n "${RUNTIME_TESTS:-}" && "${SKIP_RUNTIME_TESTS:-0}" != 1 && "$DEVICE" != cpu ]]; then
  RESERVE_AFTER_CHECKS=$((RESERVE_AFTER_CHECKS + 60))
fi
CHECKS_S=$((15 * (${#SPEC_ARGS[@]} > 0 ? ${#SPEC_ARGS[@]} : 30)))
((CHECKS_S >= 30)) || CHECKS_S=30
((CHECKS_S <= 155)) || CHECKS_S=155
RESERVE_AFTER_BUILDS=$((RESERVE_AFTER_CHECKS + CHECKS_S))
# A build step given less than this warns: a cold machine builds the runtime in ~40 s and 2-12 extensions in 60-150 s.
MIN_BUILD_S=60
warn_short() { # warn_short STEP SECONDS
  (($2 >= MIN_BUILD_S)) || log "WARNING: only $2 s left for $1 in the ${BUDGET}s budget (a cold machine needs more: raise GPU_CHECK_BUDGET_S)"
}
# A budget that cannot give both builds (runtime, extensions) MIN_BUILD_S beside the reservations fails for sure on a
# cold machine (a 230 s budget for six specs left the runtime build 10 s): it is raised to what the steps need; a
# warm machine still finishes early, and the caller's own time limit stays the hard one.
NEEDED_S=$((RESERVE_AFTER_BUILDS + 2 * MIN_BUILD_S + 20))
if ((BUDGET < NEEDED_S)); then
  log "budget ${BUDGET}s raised to ${NEEDED_S}s: the builds need ${MIN_BUILD_S}s each on a cold machine beside the ${RESERVE_AFTER_BUILDS}s the checks and later steps reserve"
  BUDGET=$NEEDED_S
fi

export PYTHONUNBUFFERED=1
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="$PATH:/usr/local/cuda/bin"
fi
log "repo $ROOT, OUT $OUT, scratch $GEN_ROOT, specs ${SPEC_ARGS[*]:-all}, graphs $GRAPHS, device $DEVICE, budget ${BUDGET}s${DTYPES:+, dtypes $DTYPES}, capture $CAPTURE"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: n/a"
  nvcc --version 2>/dev/null | tail -1 || echo "nvcc: n/a"
  python3 -c 'import torch,sys;print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  cmake --version | head -1; echo "ninja $(ninja --version 2>/dev/null || echo n/a)"; } | sed 's/^/  /'

# ---- 1. hectorgen -------------------------------------------------------------------------------------------
mkdir -p "$GEN_ROOT/bin"
GEN_LOG="$GEN_ROOT/gen.log"   # appended to gpu_check.log at the end ($OUT brings back at most 8 files)
: > "$GEN_LOG"
HGW="$GEN_ROOT/bin/hectorgen"   # wrapper: the binary with its library path
make_wrapper() {
  {
    echo '#!/bin/sh'
    [[ -n "$2" ]] && echo "LD_LIBRARY_PATH=\"$2\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\"; export LD_LIBRARY_PATH"
    echo "exec \"$1\" \"\$@\""
  } > "$HGW"
  chmod +x "$HGW"
}
try_hectorgen() { # try_hectorgen BIN [LIBPATH...]: the first library path it runs with wins
  local bin="$1" libs
  shift
  [[ -x "$bin" ]] || return 1
  for libs in "$@"; do
    make_wrapper "$bin" "$libs"
    if "$HGW" --version >> "$GEN_LOG" 2>&1; then
      log "hectorgen: $bin${libs:+ (LD_LIBRARY_PATH=$libs)}: $("$HGW" --version), $(date -r "$bin" '+%F %T' 2>/dev/null || true), sha256 $(sha256sum "$bin" | cut -c1-12)"
      return 0
    fi
  done
  return 1
}
HG=""
B="$ROOT/build/hg_bundle"
if [[ -n "${HECTORGEN:-}" ]] && try_hectorgen "$HECTORGEN" ""; then
  HG="$HGW"
elif try_hectorgen "$ROOT/build/hectorgen" "" "$B/lib" "$B/lib:$B/lib/std"; then
  HG="$HGW"
elif try_hectorgen "$B/hectorgen" "" "$B/lib" "$B/lib:$B/lib/std"; then
  HG="$HGW"
else
  log "hectorgen: no prebuilt binary runs here; building it into build-gpu/ (log: gen.log)"
  # shellcheck disable=SC2016  # $1 expands in the inner shell
  if timeout -k 10 "$(cap 240 300)" bash -c 'cmake -S "$1" -B "$1/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DHECTORGEN_BUILD_TESTS=OFF && cmake --build "$1/build-gpu" --target hectorgen' _ "$ROOT" >> "$GEN_LOG" 2>&1 &&
      try_hectorgen "$ROOT/build-gpu/hectorgen" ""; then
    HG="$HGW"
  else
    log "hectorgen: build failed (missing -dev packages? see gen.log). Testing the bundled generated/ WITHOUT the interpreter"
  fi
fi

# ---- 1b. the hectorgen runtime, built and installed once into $GEN_ROOT/runtime-prefix ------------------------
# The generated extensions find it through CMAKE_PREFIX_PATH (find_package(hectorgen_runtime)), the generated modules
# import its Python package (with the compiled _C) through PYTHONPATH; both are exported to every later step.
RT_PREFIX="$GEN_ROOT/runtime-prefix"
RT_ARCH="${HECTORGEN_CUDA_ARCH:-}"
if [[ -z "$RT_ARCH" ]]; then  # this GPU's, like the extensions (gpu_check.py default_cuda_arch)
  RT_ARCH="$(python3 -c 'import torch; m, n = torch.cuda.get_device_capability(0); print(f"{m}{n}")' 2>/dev/null ||
             echo "80;90")"
fi
log "hectorgen runtime: build for sm_$RT_ARCH and install into $RT_PREFIX (log: gen.log)"
echo "===== hectorgen runtime (runtime/ -> $RT_PREFIX)" >> "$GEN_LOG"
rt_args=(-S "$ROOT/runtime" -B "$GEN_ROOT/runtime-build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$RT_ARCH"
         -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
         -DPython3_EXECUTABLE="$(command -v python3)" -DHECTORGEN_RUNTIME_PYTHON_INSTALL_DIR=python)
command -v ninja >/dev/null && rt_args+=(-G Ninja)
# shellcheck disable=SC2016  # $1, $2 expand in the inner shell
t=$(cap 240 $((RESERVE_AFTER_BUILDS + MIN_BUILD_S)))
warn_short "the runtime build" "$t"
if timeout -k 10 "$t" bash -c '"${@:3}" && cmake --build "$1" && cmake --install "$1" --prefix "$2"' _ \
     "$GEN_ROOT/runtime-build" "$RT_PREFIX" cmake "${rt_args[@]}" >> "$GEN_LOG" 2>&1 &&
   [[ -f "$RT_PREFIX/python/hectorgen_runtime/__init__.py" ]]; then
  log "hectorgen runtime: $(PYTHONPATH="$RT_PREFIX/python" python3 -c 'import hectorgen_runtime as r; print(r.__version__, "with", r.load_extension().__file__)' 2>&1 | tail -1)"
else
  log "hectorgen runtime: build FAILED (gen.log); the extensions will not configure"
fi
export CMAKE_PREFIX_PATH="$RT_PREFIX${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PYTHONPATH="$RT_PREFIX/python${PYTHONPATH:+:$PYTHONPATH}"

# ---- 2. generate every spec, build the extensions in parallel -------------------------------------------------
if ((DTYPE_RUN)); then t=$(cap 300 150); else t=$(cap 240 "$RESERVE_AFTER_BUILDS"); fi
warn_short "generating and building the extensions" "$t"
log "generating and building (timeout ${t}s; logs: gen.log, build.log)"
prep_rc=0
timeout -k 10 "$t" python3 "$CHECK" --prepare "${SPEC_ARGS[@]}" "${DTYPE_ARGS[@]}" --hectorgen "${HG:-}" \
  --generated "$GEN_DIR" --out "$OUT" --device "$DEVICE" --build-timeout "$((t > 20 ? t - 10 : t))" || prep_rc=$?
log "generation and extension builds: rc=$prep_rc"

# ---- 3. the checks -------------------------------------------------------------------------------------------
NSPECS=$(python3 - "$GEN_ROOT" "$DTYPES" "${SPEC_ARGS[@]}" <<'PY' 2>/dev/null || echo 12
import sys
sys.path.insert(0, "tests/gpu")
from gpu_check import parse_dtypes, selected_variants
gen_root, dtypes, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
print(len(selected_variants(specs, parse_dtypes(dtypes) if dtypes else None, gen_root)[0]))
PY
)
if ((DTYPE_RUN)); then
  JOBS="${CHECK_JOBS:-4}"
  t=$(cap 400 "$RESERVE_AFTER_CHECKS")
  child=$((t * 2 * JOBS / (NSPECS > 0 ? NSPECS : 1)))
else
  JOBS="${CHECK_JOBS:-1}"
  t=$(cap 210 "$RESERVE_AFTER_CHECKS")
  child=$((t * 3 / (NSPECS > 0 ? NSPECS : 1)))
fi
((child >= 45)) || child=45
((DTYPE_RUN == 0 || child <= t / 2)) || child=$((t / 2))  # a hung module leaves time for the others
log "checks of $NSPECS module(s), $JOBS at a time (timeout ${t}s, ${child}s per module)"
check_rc=0
timeout -k 10 "$t" python3 "$CHECK" "${SPEC_ARGS[@]}" "${DTYPE_ARGS[@]}" --hectorgen "${HG:-}" --generated "$GEN_DIR" \
  --out "$OUT" --device "$DEVICE" --graphs "$GRAPHS" --no-build --child-timeout "$child" --check-jobs "$JOBS" \
  --capture "$CAPTURE" ${SEED:+--seed "$SEED"} || check_rc=$?
log "gpu_check.py: rc=$check_rc"

# ---- 4. compute-sanitizer memcheck and racecheck --------------------------------------------------------------
SAN_LOG="$OUT/sanitizer.log"
SAN=""
for c in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/nvcc)")/compute-sanitizer"; do
  if command -v "$c" >/dev/null 2>&1; then SAN="$(command -v "$c")"; break; fi
done
SUMMARY_ARGS=()
if [[ "${SKIP_SANITIZER:-0}" == 1 || "$DEVICE" == cpu ]]; then
  SAN_LINE="sanitizer: SKIPPED (${DEVICE/cuda/SKIP_SANITIZER=1})"
  echo "$SAN_LINE" > "$SAN_LOG"
elif [[ -z "$SAN" ]]; then
  SAN_LINE="sanitizer: FAIL (compute-sanitizer not found)"
  echo "$SAN_LINE" > "$SAN_LOG"
  SUMMARY_ARGS=(--memcheck-log "$GEN_ROOT/memcheck.log" --racecheck-log "$GEN_ROOT/racecheck.log")
  rm -f "$GEN_ROOT"/memcheck*.log "$GEN_ROOT"/racecheck*.log
elif (($(left) < 45)); then
  SAN_LINE="sanitizer: FAIL (no time left in the ${BUDGET}s budget)"
  echo "$SAN_LINE" > "$SAN_LOG"
  SUMMARY_ARGS=(--memcheck-log "$GEN_ROOT/memcheck.log" --racecheck-log "$GEN_ROOT/racecheck.log")
  rm -f "$GEN_ROOT"/memcheck*.log "$GEN_ROOT"/racecheck*.log
else
  t=$(cap 170 40)
  # Two shards per tool, four processes at once: the sanitizers are CPU-bound, the GPU mostly idle.
  # The specs (a dtype run: the specs its variants are made from; the sanitizer run makes the same variants)
  mapfile -t ALL_SPECS < <(python3 - "$GEN_ROOT" "$DTYPES" "${SPEC_ARGS[@]}" <<'PY'
import sys
sys.path.insert(0, "tests/gpu")
from gpu_check import parse_dtypes, selected_variants
gen_root, dtypes, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
variants = selected_variants(specs, parse_dtypes(dtypes) if dtypes else None, gen_root)[0]
for spec in dict.fromkeys(v.source or v.spec for v in variants):
    print(spec)
PY
)
  half=$(((${#ALL_SPECS[@]} + 1) / 2))
  SHARD0=("${ALL_SPECS[@]:0:$half}")
  SHARD1=("${ALL_SPECS[@]:$half}")
  log "compute-sanitizer memcheck + racecheck, ${#ALL_SPECS[@]} spec(s) in 2 shards each (timeout ${t}s; log: sanitizer.log)"
  pids=()
  san_names=()
  for tool in memcheck racecheck; do
    for shard in 0 1; do
      if ((shard == 0)); then specs=("${SHARD0[@]}"); else specs=("${SHARD1[@]}"); fi
      ((${#specs[@]})) || continue
      # shellcheck disable=SC2086  # SANITIZER_FLAGS: extra options
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$t" "$SAN" --tool "$tool" --error-exitcode 1 ${SANITIZER_FLAGS:-} \
        python3 "$CHECK" --sanitizer-run "${specs[@]}" "${DTYPE_ARGS[@]}" --generated "$GEN_DIR" ${SEED:+--seed "$SEED"} \
        > "$GEN_ROOT/$tool.$shard.log" 2>&1 &
      pids+=($!)
      san_names+=("$tool.$shard")
    done
  done
  # A process that fails is named with its exit status; one the time budget cut off (timeout: 124, or 137 after
  # the kill) says so and how many of its specs it had checked, so that a cut is not read as a finding.
  san_fail=0
  san_notes=()
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" && continue
    san_rc=$?
    san_fail=$((san_fail + 1))
    log_i="$GEN_ROOT/${san_names[$i]}.log"
    done_specs=$(grep -c '^sanitizer-run END' "$log_i" 2>/dev/null || true)
    if ((san_rc == 124 || san_rc == 137)); then
      san_notes+=("${san_names[$i]} cut off by the ${t}s budget after ${done_specs:-0} spec(s)")
    else
      san_notes+=("${san_names[$i]} exited $san_rc")
    fi
  done
  : > "$SAN_LOG"
  for tool in memcheck racecheck; do
    cat "$GEN_ROOT/$tool".*.log > "$GEN_ROOT/$tool.log" 2>/dev/null || true
    { echo "===== $tool"; cat "$GEN_ROOT/$tool.log"; } >> "$SAN_LOG"
  done
  SUMMARY_ARGS=(--memcheck-log "$GEN_ROOT/memcheck.log" --racecheck-log "$GEN_ROOT/racecheck.log")
  SAN_LINE="sanitizer: $((${#pids[@]} - san_fail))/${#pids[@]} sanitizer processes exited 0"
  ((${#san_notes[@]})) && SAN_LINE+=" ($(printf '%s; ' "${san_notes[@]}" | sed 's/; $//'))"
fi
log "$SAN_LINE"

# ---- 4b. data-parallel training: 2 processes on this one GPU over gloo, CUDA tensors ------------------------------
# tools/ddp_train.py --check per model: the 2-process weights after DDP_STEPS steps equal one process's over the same
# global batches, a rerun is bit-identical, both ranks agree, every parameter gets a gradient (docs/distributed.md).
# Its output goes to gpu_check.log (and $GEN_ROOT/ddp.log, ddp.jsonl: $OUT brings back at most 8 files).
DDP_LINE="ddp: skipped"
ddp_rc=0
if [[ "${SKIP_DDP:-0}" != 1 ]] && ((!DTYPE_RUN)); then
  DDP_LOG="$GEN_ROOT/ddp.log"
  : > "$DDP_LOG"
  rm -f "$GEN_ROOT/ddp.jsonl"
  ddp_pass=() ddp_fail=()
  for run in ${DDP_MODELS:-rgat hgt} "${DDP_RUNTIME_MODEL:-hgt}+runtime"; do
    m="${run%+runtime}"
    if [[ "$DEVICE" != cpu && ! -f "$GEN_DIR/$m/$m.py" ]]; then log "ddp: $m is not among the checked specs: skipped"; continue; fi
    if (($(left) < 25)); then ddp_fail+=("$run(no time left)"); ddp_rc=1; continue; fi
    ddp_args=(--model "$m" --check --steps "${DDP_STEPS:-4}" --out "$GEN_ROOT/ddp.jsonl")
    if [[ "$DEVICE" == cpu ]]; then  # the plain-PyTorch stand-in layers on a smaller graph
      ddp_args+=(--device cpu --graph mini --batch 64)
    else
      ddp_args+=(--backend gloo --generated "$GEN_DIR" --graph small --batch 512)
    fi
    if [[ "$run" == *+runtime ]]; then  # the tensor cache (CPU tensor mode on the CPU) and, on a GPU, unified features
      # (the test graphs' tensors are small: everything from 16 KiB on is offloaded)
      ddp_args+=(--offload file --offload-dir "$GEN_ROOT/offload" --offload-min-kib 16 --mode khop)
      [[ "$DEVICE" != cpu ]] && ddp_args+=(--features unified)
    fi
    log "ddp: $run, 2 processes (log: gpu_check.log, $DDP_LOG)"
    rc=0
    timeout -k 5 "$(cap 45 15)" python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
      tools/ddp_train.py "${ddp_args[@]}" 2>&1 | tee -a "$DDP_LOG" |
      { grep -E '^\[ddp_train|Error|error:' || true; } | sed 's/^/  /' || rc=$?
    if ((rc == 0)); then ddp_pass+=("$run"); else ddp_fail+=("$run(rc $rc)"); ddp_rc=1; fi
  done
  DDP_LINE="ddp (2 processes on one ${DEVICE/cuda/GPU}, gloo): ${ddp_pass[*]:+PASS ${ddp_pass[*]}}${ddp_fail[*]:+${ddp_pass[*]:+; }FAIL ${ddp_fail[*]}}; $(grep -oE '(PASS|FAIL): DDP check .*' "$DDP_LOG" | sed -E 's/^(PASS|FAIL): DDP check ([a-z0-9_]+) \([^)]*\): vs 1 process/\2:/' | tr '\n' ';')"
fi
log "$DDP_LINE"

# ---- 4c. device helpers: the warp's search of a pair's relation against a scan (tests/gpu/check_warp_segment_of.sh)
#      and the gather sum against a loop adding in its order (tests/gpu/check_gather_sum.sh)
HELPER_LINE="device helpers: skipped"
helper_rc=0
if [[ "$DEVICE" != cpu && -n "$HG" ]] && ((!DTYPE_RUN)) && (($(left) > 40)); then
  out="$(timeout -k 5 "$(cap 60 30)" bash "$ROOT/tests/gpu/check_warp_segment_of.sh" "$HG" 2>&1)" || helper_rc=1
  echo "$out" | tail -5 | sed 's/^/  /'
  HELPER_LINE="device helpers: $( ((helper_rc == 0)) && echo PASS || echo FAIL) ($(echo "$out" | tail -1)"
  out="$(timeout -k 5 "$(cap 60 30)" bash "$ROOT/tests/gpu/check_gather_sum.sh" "$HG" 2>&1)" || helper_rc=1
  echo "$out" | tail -5 | sed 's/^/  /'
  HELPER_LINE+="; $(echo "$out" | tail -1))"
  ((helper_rc == 0)) || HELPER_LINE="${HELPER_LINE/device helpers: PASS/device helpers: FAIL}"
fi
log "$HELPER_LINE"

# ---- 4d. the runtime's own GPU tests (pytest, the installed runtime with its compiled _C): graph preprocessing on
#      the GPU against the reference, bit for bit, every layout (test_preprocess), unified tensors (test_unified_gpu),
#      the tensor cache's GPU paths (test_offload_gpu); RUNTIME_TESTS names others, SKIP_RUNTIME_TESTS=1 skips them
RUNTIME_LINE="runtime tests: skipped"
runtime_rc=0
if [[ "${SKIP_RUNTIME_TESTS:-0}" != 1 && "$DEVICE" != cpu ]] && ((!DTYPE_RUN)) && (($(left) > 60)); then
  if ! python3 -c 'import pytest' 2>/dev/null; then
    RUNTIME_LINE="runtime tests: skipped (no pytest)"
  else
    rt_files=()
    for t in ${RUNTIME_TESTS:-test_preprocess test_unified_gpu test_offload_gpu}; do rt_files+=("tests/runtime/$t.py"); done
    out="$(HECTORGEN_RUNTIME_PYTHON="$RT_PREFIX/python" timeout -k 5 "$(cap 150 30)" \
      python3 -m pytest -q -p no:cacheprovider "${rt_files[@]}" 2>&1)" || runtime_rc=1
    echo "$out" > "$OUT/runtime_tests.log"
    echo "$out" | grep -E 'passed|failed|error' | tail -3 | sed 's/^/  /'
    RUNTIME_LINE="runtime tests: $( ((runtime_rc == 0)) && echo PASS || echo FAIL) ($(echo "$out" | grep -E 'passed|failed|error' | tail -1); ${RUNTIME_TESTS:-test_preprocess test_unified_gpu test_offload_gpu}; runtime_tests.log)"
  fi
fi
log "$RUNTIME_LINE"

# ---- 5. training example: 2 generated layers + a linear head, loss must go down (train.log, train_loss.png) ---
TRAIN_LINE="training: skipped"
train_rc=0
if [[ "${SKIP_TRAIN:-0}" != 1 && "$DEVICE" != cpu ]] && ((!DTYPE_RUN)) && (($(left) > 80)); then
  : > "$OUT/train.log"
  for m in ${TRAIN_MODELS:-rgcn rgat hgt}; do
    [[ "$m" == none ]] && continue
    # As for DDP: a model whose spec was not among the checked ones has no generated module to train.
    if [[ ! -f "$GEN_DIR/$m/$m.py" ]]; then echo "$m: not among the checked specs: skipped" >> "$OUT/train.log"; continue; fi
    (($(left) > 25)) || break
    timeout -k 5 "$(cap 40 20)" python3 tools/train_example.py --model "$m" --generated "$GEN_DIR" \
      --epochs "${TRAIN_EPOCHS:-60}" --out "$GEN_ROOT/train" >> "$OUT/train.log" 2>&1 || train_rc=1
  done
  python3 - "$GEN_ROOT/train" "$OUT/train_loss.png" <<'PY' || true
import json, sys, pathlib
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
runs = sorted(pathlib.Path(sys.argv[1]).glob("train_*.json"))
if not runs:
    sys.exit(0)
fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
for r in runs:
    d = json.loads(r.read_text())
    ax.plot(d["losses"], label=f'{d["model"]} (test acc {d["test_acc"]:.2f}, {d["median_step_ms"]:.1f} ms/step)')
ax.set_xlabel("epoch"); ax.set_ylabel("cross-entropy loss"); ax.legend(fontsize=7)
ax.set_title(f'2-layer classifiers on generated layers ({d["device"]})', fontsize=9)
fig.tight_layout(); fig.savefig(sys.argv[2])
PY
  TRAIN_LINE="training: $(grep -c ': PASS (loss' "$OUT/train.log" || true) model(s) PASS; $(grep -E '^[a-z0-9_]+: loss ' "$OUT/train.log" | tr '\n' ';')"
  untrained=$(grep -E '^[a-z0-9_]+: not among the checked specs' "$OUT/train.log" | cut -d: -f1 | tr '\n' ' ' || true)
  [[ -n "$untrained" ]] && TRAIN_LINE+=" not checked, so not trained: ${untrained% }"
fi
log "$TRAIN_LINE"

# ---- 6. the short table, printed last --------------------------------------------------------------------------
{ echo "===== generation log"; cat "$GEN_LOG"; } >> "$OUT/gpu_check.log.gen" 2>/dev/null || true
VERDICT="generation+builds rc=$prep_rc, checks rc=$check_rc, $SAN_LINE, training rc=$train_rc, ddp rc=$ddp_rc, helpers rc=$helper_rc, runtime tests rc=$runtime_rc; logs in $OUT; ${SECONDS}s"
sum_rc=0
python3 "$CHECK" --summary --out "$OUT" "${SUMMARY_ARGS[@]}" --extra "$TRAIN_LINE" --extra "$DDP_LINE" --extra "$HELPER_LINE" \
  --extra "$RUNTIME_LINE" --extra "$VERDICT" ||
  sum_rc=$?
# The generation log goes to the end of gpu_check.log, after the table (the table stays the last thing printed).
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null || true
cat "$OUT/gpu_check.log.gen" >> "$OUT/gpu_check.log" 2>/dev/null && rm -f "$OUT/gpu_check.log.gen"
trap - EXIT
if ((sum_rc == 0 && prep_rc == 0 && check_rc == 0 && train_rc == 0 && ddp_rc == 0 && helper_rc == 0 && runtime_rc == 0)); then
  exit 0
fi
exit 1
