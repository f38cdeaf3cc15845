#!/usr/bin/env bash
# GEMM-template microbenchmark, one command on a GPU machine (see docs/gemm_template.md):
#   bench/gemm/run.sh [--build-only] [gemm_bench arguments...]
# Checks the mma fragment offsets on the CPU, builds every source for sm_90a (run) and sm_80 (compile check)
# in parallel with -Werror, prints the registers/spills of each kernel and its tensor-core instruction counts,
# runs the checks and timings, and writes everything under $OUT (default bench/gemm/out): env.txt,
# fragment_check.log, build.log, kernels.txt (registers, spills, SASS instruction counts), bench.log,
# sanitizer.log, results.csv. The short table comes last on stdout.
# CuTe/CUTLASS headers: $CUTLASS_INCLUDE, else ./.cutlass/include at the repository root (the include/
# folder of the nvidia-cutlass wheel: cutlass_library/source/include).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${OUT:-$here/out}"
build="${BUILD_DIR:-$(mktemp -d /tmp/gemm_bench.XXXXXX)}"
mkdir -p "$out" "$build"

build_only=0
if [ "${1:-}" = "--build-only" ]; then
  build_only=1
  shift
fi

cutlass="${CUTLASS_INCLUDE:-$root/.cutlass/include}"
if [ ! -f "$cutlass/cute/tensor.hpp" ]; then
  echo "run.sh: no CuTe headers at $cutlass: set CUTLASS_INCLUDE or carry .cutlass (see docs/gemm_template.md)" >&2
  exit 1
fi
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
cuobjdump="$(command -v cuobjdump || echo "$(dirname "$nvcc")/cuobjdump")"

{
  date -u
  nvidia-smi 2>&1 || echo "(no nvidia-smi)"
  "$nvcc" --version
  echo "CUTLASS headers: $cutlass"
  grep -E "define CUTLASS_(MAJOR|MINOR|PATCH) " "$cutlass/cutlass/version.h"
} > "$out/env.txt" 2>&1

flags=(-std=c++17 -O3 -Werror all-warnings -Xcompiler -Wall,-Wextra -I "$root/runtime/include"
       -isystem "$cutlass" --expt-relaxed-constexpr -lineinfo -Xptxas -v)

compile() {  # translation unit, arch; the seconds it took go to $build/<unit>_<arch>.seconds
  local begin=$SECONDS status
  "$nvcc" "${flags[@]}" "-gencode=arch=compute_$2,code=sm_$2" -c "$here/$1.cu" -o "$build/$1_$2.o" \
    > "$out/build_$1_$2.log" 2>&1
  status=$?
  echo $((SECONDS - begin)) > "$build/$1_$2.seconds"
  return $status
}

# CPU first: the warp-level operand offsets against an emulation of ldmatrix/mma (no GPU needed).
cxx="${CXX:-$(command -v g++ || command -v c++)}"
if "$cxx" -std=c++17 -O1 -Wall -Wextra -Werror -I "$root/runtime/include" "$here/fragment_check.cpp" \
    -o "$build/fragment_check" \
    > "$out/fragment_check.log" 2>&1 && "$build/fragment_check" >> "$out/fragment_check.log" 2>&1; then
  echo "[check] fragment offsets: ok (CPU emulation of ldmatrix/mma; $out/fragment_check.log)"
else
  echo "[check] fragment offsets: FAILED"
  cat "$out/fragment_check.log"
fi

units="main cute_gemm_bf16 cute_gemm_fp16"
echo "[build] $units for sm_90a and sm_80, in parallel (logs: $out/build_*.log)"
start=$SECONDS
pids=()
names=()
for arch in 90a 80; do
  for tu in $units; do
    compile "$tu" "$arch" &
    pids+=($!)
    names+=("${tu}_$arch")
  done
done
failed=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "[build] ${names[$i]}: ok ($(cat "$build/${names[$i]}.seconds") s)"
  else
    echo "[build] ${names[$i]}: FAILED"
    failed=1
  fi
done
if [ "$failed" -ne 0 ]; then
  for log in "$out"/build_*.log; do
    echo "== $log"
    grep -E "error|warning" "$log" | grep -v "ptxas info" | head -20
  done
  exit 1
fi
"$nvcc" -gencode=arch=compute_90a,code=sm_90a "$build/main_90a.o" "$build/cute_gemm_bf16_90a.o" \
  "$build/cute_gemm_fp16_90a.o" -o "$build/gemm_bench" \
  || { echo "[build] link FAILED"; exit 1; }
echo "[build] done in $((SECONDS - start)) s"

# Resources per kernel (sm_90a) and the matrix instructions each one really uses: $out/kernels.txt.
{
  echo "== registers / shared memory / spills (sm_90a) =="
  for tu in $units; do
    grep -E "Compiling entry|Used|spill" "$out/build_${tu}_90a.log" | sed -E 's/ptxas info *: //' | paste - - - |
      sed -E "s/Compiling entry function '([^']*)' for 'sm_90a'/\1/"
  done
} > "$out/kernels.txt" 2>&1
"$cuobjdump" -sass "$build/gemm_bench" 2>&1 | awk '
  /Function :/ { if (name != "") printf "%s HMMA %d FFMA %d LDSM %d LDGSTS %d\n", name, h, f, l, g;
                 name = $3; h = f = l = g = 0 }
  /HMMA/ { h++ } /FFMA/ { f++ } /LDSM/ { l++ } /LDGSTS/ { g++ }
  END { if (name != "") printf "%s HMMA %d FFMA %d LDSM %d LDGSTS %d\n", name, h, f, l, g }' > "$build/sass.txt"
{
  echo
  echo "== SASS instruction counts: HMMA (tensor cores), FFMA, LDSM (ldmatrix), LDGSTS (cp.async) =="
  cat "$build/sass.txt"
} >> "$out/kernels.txt"
tc_pattern="^_ZN10gemm_bench(2tc(19segment_gemm|20wgrad_partial)|9cute_impl)"
echo "[sass] tensor-core kernels with HMMA in their SASS: $(grep -E "$tc_pattern" "$build/sass.txt" |
  grep -cE "HMMA [1-9]") of $(grep -cE "$tc_pattern" "$build/sass.txt")"
echo "[ptxas] kernels with a stack frame or spills: $(grep -cE " [1-9][0-9]* bytes (stack frame|spill)" \
  "$out/kernels.txt") (details: $out/kernels.txt)"
cat "$out"/build_*.log > "$build/build.log" && rm -f "$out"/build_*.log && mv "$build/build.log" "$out/build.log"

if [ "$build_only" -eq 1 ]; then
  echo "[build-only] binary at $build/gemm_bench"
  exit 0
fi

# One process per case, so that a kernel fault (a sticky CUDA error) costs only its case: that case is then
# rerun one implementation per process to isolate the culprit. Cases are cheapest first; past the budget
# (seconds since the start of this script, $BUDGET, default 200) the rest are skipped.
budget="${BUDGET:-200}"
bench="$build/gemm_bench"
csvs=()
: > "$out/bench.log"
run_one() {  # csv name, gemm_bench arguments...
  local name=$1
  shift
  "$bench" --csv "$build/$name.csv" "$@" 2>&1 | tee -a "$out/bench.log"
  local status=${PIPESTATUS[0]}
  if [ "$status" -le 1 ]; then csvs+=("$build/$name.csv"); fi
  return "$status"
}
for case_name in $("$bench" --list); do
  if [ "$SECONDS" -gt "$budget" ]; then
    echo "[run] $case_name: SKIPPED, over the ${budget} s budget" | tee -a "$out/bench.log"
    skipped="$build/skipped-$case_name.csv"
    printf '%s\n%s\n' "case,op,impl,dtype,ms,gflops,gbs,floor_ms,ratio_to_floor,rel_err,status,note,copy_gbs" \
      "$case_name,all,-,-,nan,nan,nan,nan,nan,nan,SKIP,over the run.sh budget,nan" > "$skipped"
    csvs+=("$skipped")
    continue
  fi
  echo "[run] $SECONDS s: $case_name" | tee -a "$out/bench.log"
  run_one "$case_name" --case "$case_name" "$@"
  if [ $? -ge 2 ]; then
    echo "[run] $case_name: CUDA error; rerunning it one implementation at a time" | tee -a "$out/bench.log"
    for impl in simt tc cute; do
      run_one "$case_name-$impl" --case "$case_name" --impls "$impl" "$@" ||
        echo "[run] $case_name --impls $impl: exit $?" | tee -a "$out/bench.log"
    done
  fi
done
if [ "${#csvs[@]}" -eq 0 ]; then
  echo "[run] no results"
  exit 2
fi
# compute-sanitizer, checks only, when time is left (started before $SANITIZER_START s, default 200):
#   memcheck over two small cases (tiny, tiny-128: 5K and 3K rows), every implementation, 60 s at most;
#   racecheck (shared-memory hazards of the cp.async rings) over tiny-128 and the tensor-core kernels in tf32 and
#   bf16 only (fp16 is the bf16 code with another mma): K = 128 is the case whose forward ring wraps (4 slabs,
#   3 stages; K = 64 has 2 slabs in 2 stages) and racecheck instruments every shared-memory access (45 s did not
#   cover tiny + tiny-128 with every implementation). It gets what is left of $TOTAL_BUDGET (default 235 s, the
#   whole script's 4-minute budget), at least 30 s.
sanitizer="$(command -v compute-sanitizer || echo "$(dirname "$nvcc")/compute-sanitizer")"
: > "$out/sanitizer.log"
for tool in memcheck racecheck; do
  if [ ! -x "$sanitizer" ] || [ "$SECONDS" -gt "${SANITIZER_START:-200}" ]; then
    echo "[sanitizer] $tool: not run (no compute-sanitizer, or past ${SANITIZER_START:-200} s)" | tee -a "$out/bench.log"
    continue
  fi
  if [ "$tool" = memcheck ]; then
    limit=60
    scope=(--case tiny --case tiny-128)
  else
    limit=$(( ${TOTAL_BUDGET:-235} - SECONDS ))
    [ "$limit" -lt 30 ] && limit=30
    scope=(--case tiny-128 --impls tc,cute --dtypes tf32,bf16)
  fi
  timeout "$limit" "$sanitizer" --tool "$tool" --error-exitcode 9 "$bench" "${scope[@]}" --check-only \
    > "$build/sanitizer_$tool.log" 2>&1
  status=$?
  cat "$build/sanitizer_$tool.log" >> "$out/sanitizer.log"
  summary="$(grep -E "(ERROR|RACECHECK) SUMMARY" "$build/sanitizer_$tool.log" | tail -1)"
  # result rows only ("... err 1.66e-03  FAIL ..."), not the table's header line that explains FAIL
  fails="$(grep -cE "err [^ ]+  FAIL" "$build/sanitizer_$tool.log")"
  rows="$(grep -cE "err [^ ]+  (ok|FAIL)" "$build/sanitizer_$tool.log")"
  echo "[sanitizer] $tool on ${scope[*]} (${limit} s at most): exit $status (124: timed out; 9: errors found);" \
    "${summary:-no summary}; $rows rows checked, $fails FAIL" | tee -a "$out/bench.log"
done

{
  head -n 1 "${csvs[0]}"
  for f in "${csvs[@]}"; do tail -n +2 "$f"; done
} > "$out/results.csv"
echo "[run] done in $SECONDS s; all rows: $out/results.csv"
"$bench" --table "$out/results.csv"
