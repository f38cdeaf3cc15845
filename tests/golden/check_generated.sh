#!/usr/bin/env bash
# Golden test of the generated code: regenerates generated/<model>/ for every bundled spec (twice, to
# check determinism) and fails on any difference from the committed files.
#   check_generated.sh HECTORGEN SOURCE_DIR           check
#   check_generated.sh HECTORGEN SOURCE_DIR --bless   rewrite generated/ (tools/update_goldens.sh does this)
set -euo pipefail
HECTORGEN="$1"
SRC="$2"
BLESS="${3:-}"
SPECS=(rgcn rgat hgt)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$SRC"  # banners name the spec by its path relative to the repository
status=0
for model in "${SPECS[@]}"; do
  "$HECTORGEN" "specs/$model.yaml" -o "$tmp/a/$model"
  "$HECTORGEN" "specs/$model.yaml" -o "$tmp/b/$model"
  if ! diff -r "$tmp/a/$model" "$tmp/b/$model" >/dev/null; then
    echo "FAIL: two runs on specs/$model.yaml produced different files" >&2
    status=1
  fi
  if [[ "$BLESS" == "--bless" ]]; then
    rm -rf "generated/$model"  # (an extension build folder inside it goes too)
    mkdir -p generated
    cp -r "$tmp/a/$model" "generated/$model"
    echo "blessed generated/$model"
  elif ! diff -ru -x __pycache__ -x build "generated/$model" "$tmp/a/$model"; then
    echo "FAIL: generated/$model differs from what hectorgen generates now; if intended, run tools/update_goldens.sh" >&2
    status=1
  else
    echo "ok: generated/$model ($(ls "generated/$model" | wc -l) files)"
  fi
done
exit $status
