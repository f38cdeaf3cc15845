# What the device-code checks share (check_warp_segment_of.sh, check_gather_sum.sh); sourced, not run:
#   device_check_setup [HECTORGEN]   ROOT, HG (the given hectorgen, else build/hectorgen, else
#                                    build/hg_bundle/hectorgen: the first that runs), NVCC, and tmp (removed at exit)
#   generated_piece CHECK SPEC START [END]  the lines of the kernels hectorgen generates for SPEC from the first one
#                                    matching the awk regex START to the next "}" at column 0 (after the first line
#                                    matching END, when given); exits 1 (naming CHECK) if none
#   build_and_run CHECK              compiles $tmp/check.cu for this GPU (else sm_90) and runs it;
#                                    CHECK_COMPILE_ONLY=1 stops after compiling (a machine without a GPU)
device_check_setup() {
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  HG="${1:-}"
  local c
  for c in "$HG" "$ROOT/build/hectorgen" "$ROOT/build/hg_bundle/hectorgen"; do
    if [[ -n "$c" && -x "$c" ]] && "$c" --version >/dev/null 2>&1; then HG="$c"; break; fi
  done
  NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
}

generated_piece() {
  local check="$1" spec="$2" start="$3" end="${4:-$3}" piece
  "$HG" "$ROOT/$spec" -o "$tmp/gen" >/dev/null
  # (the regexes through the environment: awk -v would take their backslashes as string escapes)
  piece="$(START="$start" END="$end" awk '!on && $0 ~ ENVIRON["START"] { on = 1 } on { print }
    on && $0 ~ ENVIRON["END"] { last = 1 } last && /^}/ { exit }' "$tmp"/gen/*_kernels.cu)"
  [[ -n "$piece" ]] || { echo "$check: nothing matching /$start/ in the kernels generated for $spec" >&2; exit 1; }
  printf '%s\n' "$piece"
}

build_and_run() {
  "$NVCC" -std=c++17 -O2 -arch=native -o "$tmp/check" "$tmp/check.cu" 2>/dev/null ||
    "$NVCC" -std=c++17 -O2 -arch=sm_90 -o "$tmp/check" "$tmp/check.cu"
  if [[ "${CHECK_COMPILE_ONLY:-0}" == 1 ]]; then echo "$1: compiled"; return 0; fi
  "$tmp/check"
}
