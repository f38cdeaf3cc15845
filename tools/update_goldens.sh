#!/usr/bin/env bash
# Re-blesses the golden files after an intended change, in one command:
#   1. tests/diagnostics/fail_*.stderr: the exact stderr of hectorgen on each fail_*.yaml / fail_*.json
#      (checked by tests/diagnostics/run.cmake, ctest test `diagnostics`);
#   2. generated/<model>/: the generated code of the bundled specs (checked by the ctest test
#      `golden_generated`, tests/golden/check_generated.sh);
#   3. tests/golden/print_ir_after/rgat.txt: --print-ir-after=all on specs/rgat.yaml (ctest test `print_ir_after`).
# Review the resulting diff (git diff) before committing.
#
#   tools/update_goldens.sh [--diagnostics-only] [HECTORGEN]      (default HECTORGEN: build/hectorgen)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

DIAGNOSTICS_ONLY=0
HECTORGEN=""
for arg in "$@"; do
  case "$arg" in
    --diagnostics-only) DIAGNOSTICS_ONLY=1 ;;
    -h|--help) sed -n '2,9p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) HECTORGEN="$arg" ;;
  esac
done
HECTORGEN="${HECTORGEN:-$ROOT/build/hectorgen}"
HECTORGEN="$(cd "$(dirname "$HECTORGEN")" && pwd)/$(basename "$HECTORGEN")"
if [[ ! -x "$HECTORGEN" ]]; then
  echo "update_goldens: no hectorgen at $HECTORGEN (build first: cmake --build build)" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# ---- 1. diagnostics goldens: tests/diagnostics/fail_*.stderr ----------------------------------------
# Run from inside tests/diagnostics so the paths in the messages are just the file names.
cd "$ROOT/tests/diagnostics"
shopt -s nullglob
status=0
count=0
for spec in fail_*.yaml fail_*.json; do
  name="${spec%.*}"
  rc=0
  "$HECTORGEN" "$spec" -o "$tmp/out-$name" 2>"$name.stderr" >/dev/null || rc=$?
  count=$((count + 1))
  if [[ $rc -ne 1 ]]; then
    echo "update_goldens: WARNING: $spec exited with $rc, expected 1 (a user error); $name.stderr written anyway" >&2
    status=1
  fi
done
# .stderr files whose spec is gone
for golden in fail_*.stderr; do
  name="${golden%.stderr}"
  if [[ ! -e "$name.yaml" && ! -e "$name.json" ]]; then
    rm -f "$golden"
    echo "update_goldens: removed $golden (no $name.yaml / $name.json)"
  fi
done
echo "update_goldens: wrote $count tests/diagnostics/*.stderr"
cd "$ROOT"

# ==== 2. generated-code goldens: generated/<model>/ ===================================================
# (Section for the generated code. tests/golden/check_generated.sh --bless regenerates generated/<model>/
# for every bundled spec; extend here if more generated goldens appear.)
if [[ $DIAGNOSTICS_ONLY -eq 0 ]]; then
  if [[ -f "$ROOT/tests/golden/check_generated.sh" ]]; then
    bash "$ROOT/tests/golden/check_generated.sh" "$HECTORGEN" "$ROOT" --bless || status=1
  else
    echo "update_goldens: no tests/golden/check_generated.sh; generated code not re-blessed" >&2
  fi
  bash "$ROOT/tests/golden/check_print_ir_after.sh" "$HECTORGEN" "$ROOT" --bless || status=1
fi
# ==== end of the generated-code section ===============================================================

exit $status
