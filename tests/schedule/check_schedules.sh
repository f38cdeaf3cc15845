#!/usr/bin/env bash
# Every accepted schedule yields launchable kernels on sm_80 and sm_90; everything else is a positioned error.
#
#   check_schedules.sh HECTORGEN SOURCE_DIR [JOBS]
#
# 1. Generates the bundled models over the grid of GEMM tile x coarsening x __launch_bounds__ x traversal
#    threads (every value of each at least once, the largest ones included; every kernel kind: GEMM, weight
#    gradient (the runtime's split-K, whatever the schedule), segment sum, traversal; one and several heads) and models with large shapes (rows of 2^24
#    elements through GEMMs, a 2^24-deep GEMM reduction, 10^5 heads, the widest traversal row), and checks
#    that hectorgen accepts each without a word.
# 2. Checks that schedules that cannot launch are rejected (exit 1, a [bad-schedule] error with a position).
# 3. Compiles every kernels file with nvcc for sm_80 and sm_90, warnings as errors: ptxas rejects blocks over
#    1024 threads and __launch_bounds__ it cannot meet. The widest traversal row (16384 elements) is generated
#    only: nvcc takes minutes on it.
# Exits 77 (skipped) after steps 1 and 2 when nvcc is missing. KEEP_WORK=1 keeps (and names) the work folder.
set -euo pipefail
HECTORGEN="$1"
SRC="$2"
JOBS="${3:-2}"
work="$(mktemp -d)"
[[ -n "${KEEP_WORK:-}" ]] && echo "work: $work" || trap 'rm -rf "$work"' EXIT
status=0
fail() { echo "FAIL: $*" >&2; status=1; }

# variant NAME BASE HEADS GEMM THREADS: specs/BASE.yaml renamed NAME with `heads: HEADS` (if it has heads) and
# `schedule: {gemm: {GEMM}, traversal: {threads: THREADS}}` in place of its own schedule.
variant() {
  local name=$1 base=$2 heads=$3 gemm=$4 threads=$5
  sed -e '/^  schedule:/,/^program:/{/^program:/!d}' -e "s/^model: .*/model: $name/" -e "s/^  heads: .*/  heads: $heads/" \
      -e "s/^  dtype: fp32\$/  dtype: fp32\n  schedule:\n    gemm: {$gemm}\n    traversal: {threads: $threads}/" \
      "$SRC/specs/$base.yaml" >"$work/$name.yaml"
  grep -q "gemm: {$gemm}" "$work/$name.yaml" || fail "$name: could not set the schedule of specs/$base.yaml"
}

#        name        base  heads  gemm                                   traversal threads
variant  t8c1_lb32   rgat  1      "tile: 8, coarsen: 1, launch_bounds: 32"  32
variant  t8c2        hgt   2      "tile: 8, coarsen: 2"                     64
variant  t8c4_lb32   rgcn  1      "tile: 8, coarsen: 4, launch_bounds: 32"  1024
variant  t16c1_lb8   rgat  4      "tile: 16, coarsen: 1, launch_bounds: 8"  128
variant  t16c2       hgt   1      "tile: 16, coarsen: 2"                    256
variant  t16c4_lb32  rgcn  1      "tile: 16, coarsen: 4, launch_bounds: 32" 512
variant  t32c1_lb2   rgat  2      "tile: 32, coarsen: 1, launch_bounds: 2"  1024
variant  t32c2_lb4   hgt   4      "tile: 32, coarsen: 2, launch_bounds: 4"  96
variant  t32c4       rgcn  1      "tile: 32, coarsen: 4"                    768
variant  t64c4_lb2   rgat  1      "tile: 64, coarsen: 4, launch_bounds: 2"  1024
variant  t64c4_lb1   hgt   2      "tile: 64, coarsen: 4, launch_bounds: 1"  32

# Large shapes. GEMM rows of 2^24 elements: 2^20 column tiles, folded over grid y and z; the backward reduces
# over 2^24 (d_feature) and has 2^20 dW tiles.
cat >"$work/wide_rows.yaml" <<'SPEC'
model: wide_rows
hyper: {in_dim: 16, out_dim: 16777216}
inputs:
  feature: {per: node, shape: [in_dim]}
weights:
  W0: {per: none, shape: [in_dim, out_dim]}
outputs:
  h: {per: node, shape: [out_dim]}
program: |
  for n in g.dst_nodes():
      n["h"] = n.feature * W0
SPEC
# A 2^24-deep reduction per output element, per node type; the backward's d_feature rows are 2^24 wide.
cat >"$work/deep_rows.yaml" <<'SPEC'
model: deep_rows
hyper: {in_dim: 16777216, out_dim: 16}
inputs:
  feature: {per: node, shape: [in_dim]}
weights:
  W: {per: ntype, shape: [in_dim, out_dim]}
outputs:
  h: {per: node, shape: [out_dim]}
program: |
  for n in g.dst_nodes():
      n["h"] = n.feature * W[n.ntype]
SPEC
# 10^5 heads (grid z would be 10^5): folded over grid y and z.
cat >"$work/many_heads.yaml" <<'SPEC'
model: many_heads
hyper: {heads: 100000, in_dim: 4, out_dim: 4}
inputs:
  feature: {per: node, shape: [heads, in_dim]}
weights:
  W: {per: ntype, shape: [heads, in_dim, out_dim]}
outputs:
  h: {per: node, shape: [heads, out_dim]}
program: |
  for n in g.dst_nodes():
      n["h"] = n.feature * W[n.ntype]
SPEC
# The widest row a traversal takes (limits::kTraversalRowElements), generated only.
sed -e 's/^model: .*/model: widest_traversal/' -e 's/^  out_dim: .*/  out_dim: 16384/' "$SRC/specs/rgat.yaml" \
  >"$work/widest_traversal.yaml"

# ---- 1. generation: exit 0, nothing on stderr -------------------------------------------------------------
compile=()
for spec in "$work"/*.yaml; do
  name="$(basename "$spec" .yaml)"
  if ! "$HECTORGEN" "$spec" -o "$work/out/$name" 2>"$work/$name.err"; then
    fail "$name: hectorgen failed"; cat "$work/$name.err" >&2; continue
  fi
  [[ -s "$work/$name.err" ]] && { fail "$name: hectorgen printed"; cat "$work/$name.err" >&2; }
  [[ "$name" == widest_traversal ]] || compile+=("$work/out/$name/${name}_kernels.cu")
done
echo "generated: $(ls "$work/out" | wc -l) specs"

# ---- 2. schedules that cannot launch: exit 1 with a positioned [bad-schedule] error -------------------------
reject() {
  local gemm=$1 threads=$2
  sed -e '/^  schedule:/,/^program:/{/^program:/!d}' \
      -e "s/^  dtype: fp32\$/  dtype: fp32\n  schedule:\n    gemm: {$gemm}\n    traversal: {threads: $threads}/" \
      "$SRC/specs/rgat.yaml" >"$work/reject.yaml"
  local rc=0
  "$HECTORGEN" "$work/reject.yaml" -o "$work/reject" 2>"$work/reject.err" || rc=$?
  if [[ $rc -ne 1 ]] || ! grep -Eq '^.*reject\.yaml:[0-9]+:[0-9]+: error: .*\[bad-schedule\]$' "$work/reject.err"; then
    fail "schedule {$gemm} threads $threads: expected exit 1 and a positioned [bad-schedule] error, got exit $rc:"
    cat "$work/reject.err" >&2
  fi
}
reject "tile: 64, coarsen: 1" 256
reject "tile: 64, coarsen: 2" 256
reject "tile: 128, coarsen: 4" 256
reject "tile: 12" 256
reject "tile: 16, coarsen: 8" 256
reject "tile: 32, coarsen: 1, launch_bounds: 3" 256
reject "tile: 16, coarsen: 1, launch_bounds: 9" 256
reject "tile: 8, coarsen: 4, launch_bounds: 33" 256
reject "tile: 16, coarsen: 1, launch_bounds: 0" 256
reject "tile: 16" 1056
reject "tile: 16" 48
reject "tile: 16" 0
echo "rejected: 12 schedules"

# ---- 3. nvcc for sm_80 and sm_90, warnings as errors ----------------------------------------------------------
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
if [[ ! -x "$NVCC" ]]; then
  echo "nvcc not found: compile step skipped"
  [[ $status -eq 0 ]] && exit 77
  exit $status
fi
# The runtime's kernels the generated launchers call (weight gradients: hectorgen/simt_wgrad.cuh, tc_gemm.cuh).
RUNTIME_INCLUDE="$(cd "$SRC/runtime/include" && pwd)"
export RUNTIME_INCLUDE
compile_one() {  # compile_one NVCC FILE.cu ARCH
  if "$1" -std=c++17 -arch="$3" -c "$2" -o "${2%.cu}.$3.o" -I"$RUNTIME_INCLUDE" -Werror all-warnings -Xcompiler -Wall,-Wextra \
       >"${2%.cu}.$3.log" 2>&1; then
    echo "ok: $(basename "$2") for $3"
  else
    echo "FAIL: $(basename "$2") for $3" >&2; cat "${2%.cu}.$3.log" >&2; return 1
  fi
}
export -f compile_one
for cu in "${compile[@]}"; do for arch in sm_80 sm_90; do printf '%s\0%s\0%s\0' "$NVCC" "$cu" "$arch"; done; done |
  xargs -0 -n 3 -P "$JOBS" bash -c 'compile_one "$@"' _ || status=1
exit $status
