#!/usr/bin/env bash
# The compile_generated test: regenerates every bundled spec (specs/*.yaml, specs/*.json) and every test spec
# (tests/gpu/specs/, tests/specs/) with this build's hectorgen into a temporary directory and compiles all of it
# with compile_outputs.sh: nvcc for sm_80 and sm_90, the host code against torch's headers, py_compile.
#   compile_generated.sh HECTORGEN SOURCE_DIR
# A test spec the compiler does not support yet says so in a line "# known-unsupported: REASON"; it must then be
# rejected with exit 1 (a positioned diagnostic), and the test fails once it generates, so the line is removed.
set -euo pipefail
HECTORGEN="$1"
SRC="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$SRC"  # banners name the spec by its path relative to the repository, as in generated/
shopt -s nullglob
specs=(specs/*.yaml specs/*.json tests/gpu/specs/*.yaml tests/gpu/specs/*.json tests/specs/*.yaml tests/specs/*.json)
bundled=(specs/*.yaml specs/*.json)
if ((${#bundled[@]} < 4)); then
  echo "FAIL: expected the bundled specs (specs/*.yaml, specs/*.json) in $SRC, found ${#bundled[@]}"
  exit 1
fi
status=0
dirs=()
for spec in "${specs[@]}"; do
  out="$tmp/$spec"  # e.g. $tmp/specs/rgcn.json/
  if grep -q '^# known-unsupported:' "$spec"; then
    rc=0
    "$HECTORGEN" "$spec" -o "$out" 2> "$tmp/stderr" || rc=$?
    if ((rc == 1)) && grep -q ': error: ' "$tmp/stderr"; then
      echo "ok   $spec (known unsupported, rejected: $(grep -m1 ': error: ' "$tmp/stderr" | cut -c1-160))"
    else
      echo "FAIL $spec (marked known-unsupported, but hectorgen exited with $rc; remove the line if it now works)"
      cat "$tmp/stderr"
      status=1
    fi
    continue
  fi
  if "$HECTORGEN" "$spec" -o "$out"; then
    dirs+=("$out")
  else
    echo "FAIL $spec (hectorgen exited with $?)"
    status=1
  fi
done
# Storage types: 16-bit variants of specs (the spec's `dtype: fp32` replaced), written next to the originals in the
# temporary directory (banners name them <spec>.<dtype>.yaml). A few, to keep the test's time: RGAT in bf16 (edge
# softmax, weight gradients, segment sums), HGT in fp16 (per-node-type segments; fp32 gradients meeting fp16
# weights and activations: the widened tensor-core GEMMs and weight gradients), compact HGT in fp16 (the same over
# pairs), and the PyTorch fallbacks of rgat_concat_outer in bf16; and RGAT with reorder on (weight-weight products
# over the edge types) in tf32, bf16 and fp16. (All five of specs/ and tests/specs/{gcn_shared,simplehgn} in both
# types compile too.)
variants=0
for variant_of in specs/rgat.yaml:bf16 specs/hgt.yaml:fp16 tests/gpu/specs/hgt_compact.yaml:fp16 \
                  tests/specs/rgat_concat_outer.yaml:bf16 tests/specs/rgat_reorder.yaml:tf32 \
                  tests/specs/rgat_reorder.yaml:bf16 tests/specs/rgat_reorder.yaml:fp16; do
  spec="${variant_of%:*}"
  dtype="${variant_of#*:}"
  variant="${spec%.yaml}.$dtype.yaml"
  if ! grep -q '^  dtype: fp32$' "$spec"; then
    echo "FAIL $spec (no line '  dtype: fp32' to make its $dtype variant from)"
    status=1
    continue
  fi
  mkdir -p "$tmp/$(dirname "$variant")"
  sed 's/^  dtype: fp32$/  dtype: '"$dtype"'/' "$spec" > "$tmp/$variant"
  out="$tmp/$variant.out"
  if (cd "$tmp" && "$HECTORGEN" "$variant" -o "$out"); then
    dirs+=("$out")
    variants=$((variants + 1))
  else
    echo "FAIL $variant (hectorgen exited with $?)"
    status=1
  fi
done
echo "generated ${#dirs[@]} of ${#specs[@]} specs and $variants dtype variants"
cd "$tmp"  # the lines name the files as <spec>/<file>
"$SRC/tests/compile/compile_outputs.sh" "${dirs[@]#"$tmp/"}" || status=1
exit $status
