#!/usr/bin/env bash
# Golden test of --print-ir-after=all: every phase (forward, forward_train, backward) after every pass, for RGAT,
# against tests/golden/print_ir_after/rgat.txt.
#   check_print_ir_after.sh HECTORGEN SOURCE_DIR           check
#   check_print_ir_after.sh HECTORGEN SOURCE_DIR --bless   rewrite the golden (tools/update_goldens.sh does this)
set -euo pipefail
HECTORGEN="$1" SRC="$2" BLESS="${3:-}"
cd "$SRC"
golden="tests/golden/print_ir_after/rgat.txt"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$HECTORGEN" specs/rgat.yaml --print-ir-after=all --verify-each -o "$tmp/out" >"$tmp/ir.txt"
if [[ "$BLESS" == "--bless" ]]; then
  mkdir -p "$(dirname "$golden")"
  cp "$tmp/ir.txt" "$golden"
  echo "blessed $golden"
elif ! diff -u "$golden" "$tmp/ir.txt"; then
  echo "FAIL: --print-ir-after=all differs from $golden; if intended, run tools/update_goldens.sh" >&2
  exit 1
else
  echo "ok: $golden ($(grep -c '^# ---- IR after' "$golden") pass x phase listings)"
fi
