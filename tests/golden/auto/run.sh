#!/usr/bin/env bash
# FileCheck tests of what a materialization: auto spec generates: each <spec>/<file>.check here holds FileCheck
# directives for the file <file> that `hectorgen tests/specs/<spec>.yaml` (or tests/gpu/specs/) writes. The parts
# that make the module auto are checked; everything else is covered by the golden files of the fixed choices.
#   run.sh HECTORGEN FILECHECK SOURCE_DIR
set -uo pipefail
HECTORGEN="$1" FILECHECK="$2" SRC="$3"
if [[ -z "$FILECHECK" || ! -x "$FILECHECK" ]]; then
  echo "auto module checks: FileCheck not found (Debian: llvm-<N>-tools; tools/bootstrap.sh installs it)" >&2
  exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$SRC" || exit 1
failed=0 count=0
for dir in tests/golden/auto/*/; do
  model="$(basename "$dir")"
  spec="tests/specs/$model.yaml"
  [[ -f "$spec" ]] || spec="tests/gpu/specs/$model.yaml"
  if ! "$HECTORGEN" "$spec" -o "$tmp/$model" 2> "$tmp/$model.stderr"; then
    echo "FAIL $spec: hectorgen exited non-zero:"; cat "$tmp/$model.stderr"; failed=1; continue
  fi
  for check in "$dir"*.check; do
    file="$(basename "$check" .check)"
    count=$((count + 1))
    if ! "$FILECHECK" --dump-input=fail "$check" < "$tmp/$model/$file"; then
      echo "FAIL $model/$file"; failed=1; continue
    fi
    echo "ok   $model/$file"
  done
done
((count > 0)) || { echo "auto module checks: no checks found"; exit 1; }
exit $failed
