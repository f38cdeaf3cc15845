#!/usr/bin/env bash
# GPU check of the generated code, in one command on a CUDA machine (run from anywhere; works in the repo root):
#
#   tools/gpu_check.sh                 reports in $OUT (default: out/gpu_check)
#   tools/gpu_check.sh --bundle        (on the BUILD machine) copy build/hectorgen and the shared libraries of
#                                      its -dev dependencies into build/hg_bundle/, to carry to a GPU machine
#                                      that has no fmt/spdlog/yaml-cpp/CLI11 packages
#
# Steps (each logged; the whole run is kept under GPU_CHECK_BUDGET_S seconds, default 470):
#   1. hectorgen: $HECTORGEN, else build/hectorgen, else build/hg_bundle/hectorgen (first one that runs, with the
#      libraries of build/hg_bundle/lib on LD_LIBRARY_PATH if needed), else a fresh build into build-gpu/ (needs the -dev packages).
#      Without any: the bundled generated/ is tested and the CPU-reference rows FAIL.
#   2. regenerates rgcn, rgat, hgt (specs/) and rgat4 (tests/gpu/specs/rgat4.yaml) into $HG_GEN_DIR/generated/
#      (default /tmp/hg_gen; a mirror of the repo layout, so relative paths in the output match), and diffs
#      the bundled generated/<model> against them (gen.log).
#   2b. builds and installs the hectorgen runtime (runtime/, CMake) into $HG_GEN_DIR/runtime-prefix and exports
#      CMAKE_PREFIX_PATH and PYTHONPATH so that the extensions and the generated modules find it (gen.log).
#   3. builds the four extensions in parallel (CMake + Ninja; build.log).
#   4. tests/gpu/gpu_check.py: tiny graph vs the float64 CPU reference, medium graph vs the PyTorch reference,
#      NaN-poisoned re-runs, timing (gpu_check.md, gpu_check.json).
#   5. compute-sanitizer --tool memcheck on one forward per model on the tiny graph (sanitizer.log).
#   6. a short summary table (summary.txt). Everything printed is also in gpu_check.log.
# Exit status 0 iff every check passed and memcheck reported no error.
#
# Environment: OUT, MODELS (rgcn,rgat,rgat4,hgt), GRAPHS (tiny,medium), HG_GEN_DIR, HECTORGEN, SEED,
# GPU_CHECK_BUDGET_S, SKIP_SANITIZER=1, SANITIZER_FLAGS (extra compute-sanitizer options, e.g. "--report-api-errors no"
# if PyTorch itself trips API-error reports), HECTORGEN_CUDA_ARCH (default: this GPU's, e.g. 90).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

spec_of() {
  case "$1" in
    rgcn) echo specs/rgcn.yaml ;;
    rgat) echo specs/rgat.yaml ;;
    rgat4) echo tests/gpu/specs/rgat4.yaml ;;
    hgt) echo specs/hgt.yaml ;;
    rgat_concat) echo tests/gpu/specs/rgat_concat.yaml ;;
    rgcn_t32c4) echo tests/gpu/specs/rgcn_t32c4.yaml ;;
    hgt_c2) echo tests/gpu/specs/hgt_c2.yaml ;;
    *) return 1 ;;
  esac
}

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
  "$dst/hectorgen" --version
  echo "gpu_check: wrote $dst ($(du -sh "$dst" | cut -f1)): carry build/hg_bundle to the GPU machine"
  ls -l "$dst" "$dst/lib" "$dst/lib/std"
  exit 0
fi

OUT="${OUT:-$ROOT/out/gpu_check}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
GEN_ROOT="${HG_GEN_DIR:-/tmp/hg_gen}"
MODELS="${MODELS:-rgcn,rgat,rgat4,hgt,rgat_concat,rgcn_t32c4,hgt_c2}"
GRAPHS="${GRAPHS:-tiny,medium}"
BUDGET="${GPU_CHECK_BUDGET_S:-470}"
IFS=',' read -r -a MODEL_LIST <<< "$MODELS"

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

export PYTHONUNBUFFERED=1
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="$PATH:/usr/local/cuda/bin"
fi
log "repo $ROOT, OUT $OUT, scratch $GEN_ROOT, models $MODELS, graphs $GRAPHS, budget ${BUDGET}s"
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
    log "hectorgen: build failed (missing -dev packages? see gen.log). Testing the bundled generated/ WITHOUT the CPU reference"
  fi
fi

# ---- 2. generate into a mirror of the repo layout, diff against the bundled generated/ -----------------------
for link in specs tests runtime; do ln -sfn "$ROOT/$link" "$GEN_ROOT/$link"; done
GEN_DIR="$GEN_ROOT/generated"
mkdir -p "$GEN_DIR"
GEN_STATUS=()
for m in "${MODEL_LIST[@]}"; do
  spec="$(spec_of "$m")" || { log "unknown model $m"; exit 2; }
  if [[ -n "$HG" ]]; then
    echo "===== $m: hectorgen $spec -o generated/$m" >> "$GEN_LOG"
    if (cd "$GEN_ROOT" && "$HG" "$spec" -o "generated/$m") >> "$GEN_LOG" 2>&1; then
      n=$(find "$GEN_DIR/$m" -maxdepth 1 -type f | wc -l)
      if [[ -d "$ROOT/generated/$m" ]]; then
        if diff -r -x build -x '.*' "$ROOT/generated/$m" "$GEN_DIR/$m" > "$GEN_ROOT/diff_$m.txt" 2>&1; then
          st="same as generated/"
        elif diff -r -q -x build -x '.*' -I 'Generated by hectorgen' "$ROOT/generated/$m" "$GEN_DIR/$m" > /dev/null 2>&1; then
          st="banner lines differ from generated/"
        else
          st="DIFFERS from generated/ ($({ diff -r -q -x build -x '.*' "$ROOT/generated/$m" "$GEN_DIR/$m" || true; } | wc -l) file(s))"
        fi
        { echo "--- diff -r generated/$m <fresh> (first 200 lines):"; head -200 "$GEN_ROOT/diff_$m.txt"; } >> "$GEN_LOG"
      else
        st="not bundled in generated/"
      fi
      GEN_STATUS+=("$m: generated ($n files), $st")
    else
      GEN_STATUS+=("$m: GENERATION FAILED (gen.log)")
    fi
  else
    if [[ -d "$ROOT/generated/$m" ]]; then
      mkdir -p "$GEN_DIR/$m"
      (cd "$ROOT/generated/$m" && tar cf - --exclude=./build .) | (cd "$GEN_DIR/$m" && tar xf -)
      GEN_STATUS+=("$m: bundled generated/ copy (no hectorgen)")
    else
      GEN_STATUS+=("$m: MISSING (no hectorgen, not in generated/)")
    fi
  fi
done
for s in "${GEN_STATUS[@]}"; do log "generate: $s"; done

# ---- 2b. the hectorgen runtime, built and installed once into $GEN_ROOT/runtime-prefix ------------------------
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
if timeout -k 10 "$(cap 240 200)" bash -c '"${@:3}" && cmake --build "$1" && cmake --install "$1" --prefix "$2"' _ \
     "$GEN_ROOT/runtime-build" "$RT_PREFIX" cmake "${rt_args[@]}" >> "$GEN_LOG" 2>&1 &&
   [[ -f "$RT_PREFIX/python/hectorgen_runtime/__init__.py" ]]; then
  log "hectorgen runtime: $(PYTHONPATH="$RT_PREFIX/python" python3 -c 'import hectorgen_runtime as r; print(r.__version__, "with", r.load_extension().__file__)' 2>&1 | tail -1)"
else
  log "hectorgen runtime: build FAILED (gen.log); the extensions will not configure"
fi
export CMAKE_PREFIX_PATH="$RT_PREFIX${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export PYTHONPATH="$RT_PREFIX/python${PYTHONPATH:+:$PYTHONPATH}"

# ---- 3. build the extensions in parallel ---------------------------------------------------------------------
t=$(cap 330 140)
log "building extensions (timeout ${t}s; log: build.log)"
build_rc=0
timeout -k 10 "$t" python3 tests/gpu/gpu_check.py --build-only --generated "$GEN_DIR" --models "$MODELS" --out "$OUT" \
  --build-timeout "$((t - 5))" || build_rc=$?
log "extension builds: rc=$build_rc"

# ---- 4. the checks -------------------------------------------------------------------------------------------
t=$(cap 240 100)
log "gpu_check.py (timeout ${t}s)"
check_rc=0
timeout -k 10 "$t" python3 tests/gpu/gpu_check.py --hectorgen "${HG:-}" --generated "$GEN_DIR" --out "$OUT" \
  --models "$MODELS" --graphs "$GRAPHS" --no-build --child-timeout "$((t / 3 > 60 ? t / 3 : 60))" \
  ${SEED:+--seed "$SEED"} || check_rc=$?
log "gpu_check.py: rc=$check_rc"

# ---- 4b. training example: 2 generated layers + a linear head, loss must go down (train.log, train_loss.png)
TRAIN_LINE="training: skipped"
train_rc=0
if [[ "${SKIP_TRAIN:-0}" != 1 ]] && (($(left) > 120)); then
  : > "$OUT/train.log"
  for m in ${TRAIN_MODELS:-rgcn rgat hgt}; do
    timeout -k 5 "$(cap 60 4)" python3 tools/train_example.py --model "$m" --generated "$GEN_DIR" \
      --epochs "${TRAIN_EPOCHS:-60}" --out "$GEN_ROOT/train" >> "$OUT/train.log" 2>&1 || train_rc=1
  done
  python3 - "$GEN_ROOT/train" "$OUT/train_loss.png" <<'PY' || true
import json, sys, pathlib
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
runs = sorted(pathlib.Path(sys.argv[1]).glob("train_*.json"))
fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
for r in runs:
    d = json.loads(r.read_text())
    ax.plot(d["losses"], label=f'{d["model"]} (test acc {d["test_acc"]:.2f}, {d["median_step_ms"]:.1f} ms/step)')
ax.set_xlabel("epoch"); ax.set_ylabel("cross-entropy loss"); ax.legend(fontsize=7)
ax.set_title(f'2-layer classifiers on generated layers ({d["device"]})', fontsize=9)
fig.tight_layout(); fig.savefig(sys.argv[2])
PY
  TRAIN_LINE="training: $(grep -c ': PASS (loss' "$OUT/train.log" || true) model(s) PASS; $(grep -E '^[a-z0-9_]+: loss ' "$OUT/train.log" | tr '\n' ';')"
fi
log "$TRAIN_LINE"

# ---- 5. compute-sanitizer memcheck ---------------------------------------------------------------------------
SAN_LOG="$OUT/sanitizer.log"
SAN=""
for c in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/nvcc)")/compute-sanitizer"; do
  if command -v "$c" >/dev/null 2>&1; then SAN="$(command -v "$c")"; break; fi
done
san_rc=0
if [[ "${SKIP_SANITIZER:-0}" == 1 ]]; then
  SAN_LINE="sanitizer: SKIPPED (SKIP_SANITIZER=1)"
  echo "$SAN_LINE" > "$SAN_LOG"
elif [[ -z "$SAN" ]]; then
  SAN_LINE="sanitizer: FAIL (compute-sanitizer not found)"
  echo "$SAN_LINE" > "$SAN_LOG"
  san_rc=1
elif (($(left) < 45)); then
  SAN_LINE="sanitizer: FAIL (no time left in the ${BUDGET}s budget)"
  echo "$SAN_LINE" > "$SAN_LOG"
  san_rc=1
else
  t=$(cap 300 8)
  log "compute-sanitizer --tool memcheck (timeout ${t}s; log: sanitizer.log)"
  # shellcheck disable=SC2086  # SANITIZER_FLAGS: extra options, e.g. "--report-api-errors no"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$t" "$SAN" --tool memcheck --error-exitcode 1 ${SANITIZER_FLAGS:-} \
    python3 tests/gpu/gpu_check.py --sanitizer-run --generated "$GEN_DIR" --models "$MODELS" \
    > "$SAN_LOG" 2>&1 || san_rc=$?
  summary_line="$({ grep -E 'ERROR SUMMARY' "$SAN_LOG" || true; } | tail -1 | sed 's/^=* *//')"
  runs_line="$({ grep -E '^sanitizer-run: ' "$SAN_LOG" || true; } | tail -1)"
  n_mem="$(grep -c -E '^=+ +(Invalid|Uninitialized|Out-of-range|Misaligned|Address .* is out of bounds)' "$SAN_LOG" || true)"
  n_api="$(grep -c -E '^=+ +Program hit' "$SAN_LOG" || true)"
  summary_line="${summary_line:-no summary}, ${n_mem:-0} memory-access report(s), ${n_api:-0} CUDA API error report(s)"
  if ((san_rc == 0)); then
    SAN_LINE="sanitizer: memcheck PASS (${summary_line}; ${runs_line:-?})"
  elif ((san_rc == 124)); then
    SAN_LINE="sanitizer: memcheck FAIL (timed out after ${t}s; ${runs_line:-no run finished})"
  else
    SAN_LINE="sanitizer: memcheck FAIL (rc=$san_rc; ${summary_line}; ${runs_line:-?})"
  fi
fi
log "$SAN_LINE"
# racecheck on the same runs (shared-memory hazards in the GEMM/weight-gradient/segment-sum kernels)
if [[ -n "${SAN:-}" && -x "${SAN:-/nonexistent}" ]] && (($(left) > 60)); then
  t=$(cap 200 8)
  race_rc=0
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$t" "$SAN" --tool racecheck --error-exitcode 1 ${SANITIZER_FLAGS:-} \
    python3 tests/gpu/gpu_check.py --sanitizer-run --generated "$GEN_DIR" --models "$MODELS" \
    > "$GEN_ROOT/racecheck.log" 2>&1 || race_rc=$?
  race_summary="$({ grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$GEN_ROOT/racecheck.log" || true; } | tail -1 | sed 's/^=* *//')"
  { echo "===== racecheck"; cat "$GEN_ROOT/racecheck.log"; } >> "$SAN_LOG"
  if ((race_rc == 0)); then RACE_LINE="racecheck PASS (${race_summary:-no summary})"; else RACE_LINE="racecheck FAIL (rc=$race_rc; ${race_summary:-no summary})"; san_rc=1; fi
  SAN_LINE="$SAN_LINE; $RACE_LINE"
  log "$RACE_LINE"
fi

# ---- 6. summary ----------------------------------------------------------------------------------------------
python3 - "$OUT/gpu_check.json" "$OUT/summary.txt" "$SAN_LINE" "$build_rc" "$check_rc" "$TRAIN_LINE" "${GEN_STATUS[@]}" <<'PY' || true
import json, math, sys
path, out, san, build_rc, check_rc, train, *gen = sys.argv[1:]
lines = []
try:
    data = json.load(open(path))
except Exception as e:  # noqa: BLE001
    data = None
    lines.append(f"no results ({path}: {e}); gpu_check.py rc={check_rc}")
if data:
    agg = {}
    for r in data["rows"]:
        a = agg.setdefault((r["model"], r["graph"]), {"err": 0.0, "ok": True, "failed": []})
        e = float(r["err"])
        if r["check"].startswith(("forward", "functional", "poisoned")) or not r["ok"]:
            a["err"] = e if math.isnan(e) or e > a["err"] else a["err"]
        if not r["ok"]:
            a["ok"] = False
            a["failed"].append(r["check"])
    tim = {(t["model"], t["graph"]): t for t in data.get("timings", [])}
    rows = [("model", "graph", "max rel err", "result", "gen ms", "ref ms", "speedup", "failed checks")]
    for (m, g), a in agg.items():
        t = tim.get((m, g))
        rows.append((m, g, f"{a['err']:.3e}", "PASS" if a["ok"] else "FAIL",
                     f"{t['generated_ms']:.3f}" if t else "", f"{t['reference_fp32_ms']:.3f}" if t else "",
                     f"{t['speedup_vs_reference']:.2f}x" if t else "", ", ".join(a["failed"])))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    meta = data.get("meta", {})
    lines.append(f"device {meta.get('device')}, torch {meta.get('torch')}, seed {meta.get('seed')}")
lines.append(f"extension builds: {'OK' if build_rc == '0' else 'FAILED (build.log)'}")
lines += [f"generate: {s}" for s in gen]
lines.append(san)
lines.append(train)
text = "\n".join(lines)
open(out, "w").write(text + "\n")
print("\n===== summary =====\n" + text)
PY

{ echo "===== generation log"; cat "$GEN_LOG"; } >> "$OUT/gpu_check.log" 2>/dev/null || true
if ((check_rc == 0 && san_rc == 0 && build_rc == 0 && train_rc == 0)); then
  log "ALL PASS"
  exit 0
fi
log "FAILED (build rc=$build_rc, gpu_check rc=$check_rc, sanitizer rc=$san_rc, training rc=$train_rc)"
exit 1
