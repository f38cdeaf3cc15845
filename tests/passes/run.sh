#!/usr/bin/env bash
# Pass tests: each tests/passes/*.ir is printed inter IR (the input of one pass) with, in comments,
#   # RUN-PASS: <pass> [<phase>]     the pass to run (hectorgen --run-pass=<pass> --phase=<phase>)
#   # CHECK: ...                      FileCheck directives on its output (CHECK-NEXT, CHECK-NOT, ...)
# The pass runs with --verify-each; its output must match the file's CHECK lines.
#   run.sh HECTORGEN FILECHECK DIR
set -uo pipefail
HECTORGEN="$1" FILECHECK="$2" DIR="$3"
if [[ -z "$FILECHECK" || ! -x "$FILECHECK" ]]; then
  echo "pass tests: FileCheck not found (Debian: llvm-<N>-tools; tools/bootstrap.sh installs it)" >&2
  exit 1
fi
failed=0 count=0
for f in "$DIR"/*.ir; do
  read -r pass phase < <(sed -n 's/^# RUN-PASS: *//p' "$f" | head -1)
  if [[ -z "${pass:-}" ]]; then echo "FAIL $f: no '# RUN-PASS:' line"; failed=1; continue; fi
  count=$((count + 1))
  if ! out=$("$HECTORGEN" --verify-each --run-pass="$pass" --phase="${phase:-forward}" "$f" 2>&1); then
    echo "FAIL $f: hectorgen --run-pass=$pass exited non-zero:"; echo "$out"; failed=1; continue
  fi
  if ! printf '%s\n' "$out" | "$FILECHECK" --dump-input=fail "$f"; then
    echo "FAIL $f (--run-pass=$pass)"; failed=1; continue
  fi
  echo "ok   $(basename "$f") ($pass)"
done
((count > 0)) || { echo "pass tests: no tests in $DIR"; exit 1; }
exit $failed
