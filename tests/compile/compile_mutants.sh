#!/usr/bin/env bash
# The robustness_compile test: compiles, with compile_outputs.sh, what hectorgen generated for the sample of
# accepted mutants that the fuzzer (tests/unit/test_robustness.cpp, ctest robustness_fuzz) wrote into
# SAMPLE_DIR as <seed>-<index>-<spec>/{<spec>, mutation.txt, out/}. A mutant whose output does not compile is a
# failure that names it; its spec is saved as robustness-failures/<seed>-<index>-<spec> with a line in
# robustness-failures/failures.txt (in the working directory, as the fuzzer saves its own failures).
#   compile_mutants.sh SAMPLE_DIR
set -euo pipefail
SAMPLE="$(cd "$1" && pwd)"
COMPILE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/compile_outputs.sh"
FAILURES="$PWD/robustness-failures"
shopt -s nullglob
cases=()
for d in "$SAMPLE"/*/; do
  d="${d%/}"
  [[ -f "$d/mutation.txt" && -d "$d/out" ]] && cases+=("$(basename "$d")")
done
if ((${#cases[@]} == 0)); then
  echo "FAIL: no accepted mutants in $SAMPLE (the robustness_fuzz test writes them when HECTORGEN_FUZZ_COMPILE_DIR is set)"
  exit 1
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
(cd "$SAMPLE" && "$COMPILE" "${cases[@]/%//out}") | tee "$log" || status=1
for c in "${cases[@]}"; do
  failed="$(grep "^FAIL $c/" "$log" | sed -e "s|^FAIL $c/out/||" -e 's| ([0-9.]* s)$||' | paste -sd';' -)" || true
  [[ -n "$failed" ]] || continue
  status=1
  description="$(head -n1 "$SAMPLE/$c/mutation.txt"): accepted, but its output does not compile: $failed"
  echo "FAIL mutant $description (input saved as robustness-failures/$c)"
  mkdir -p "$FAILURES"
  spec="$(find "$SAMPLE/$c" -maxdepth 1 -type f ! -name mutation.txt | head -n1)"
  cp "$spec" "$FAILURES/$c"
  echo "$description (input saved as robustness-failures/$c)" >>"$FAILURES/failures.txt"
done
exit $status
