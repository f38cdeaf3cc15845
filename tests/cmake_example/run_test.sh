#!/usr/bin/env bash
# Configures and builds tests/cmake_example (a project using hectorgen_generate()) in a fresh build directory,
# runs its program, then checks that the build is incremental: a second build does nothing, and touching the
# spec reruns hectorgen without recompiling anything (hectorgen rewrites only files whose content changed).
# Exit 77 (skipped) when no CUDA compiler is found. Registered as CTest tests by tests/CMakeLists.txt:
#   run_test.sh --cmake CMAKE --generator GEN [--make-program PROG] --source DIR --build DIR --spec SPEC
#               (--hectorgen EXE --module-path DIR | --install-from HECTORGEN_BUILD_DIR)
# The CUDA compiler: $CUDACXX, else nvcc on PATH, else /usr/local/cuda/bin/nvcc; architectures: $CUDAARCHS,
# else 80;90.
set -euo pipefail

CMAKE=cmake GENERATOR="" MAKE_PROGRAM="" SRC="" B="" SPEC="" HECTORGEN="" MODULE_PATH="" INSTALL_FROM=""
while (($#)); do
  case "$1" in
    --cmake) CMAKE="$2" ;;
    --generator) GENERATOR="$2" ;;
    --make-program) MAKE_PROGRAM="$2" ;;
    --source) SRC="$2" ;;
    --build) B="$2" ;;
    --spec) SPEC="$2" ;;
    --hectorgen) HECTORGEN="$2" ;;
    --module-path) MODULE_PATH="$2" ;;
    --install-from) INSTALL_FROM="$2" ;;
    *) echo "run_test.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
[[ -n "$SRC" && -n "$B" && -n "$SPEC" ]] || { echo "run_test.sh: --source, --build and --spec are required" >&2; exit 2; }

NVCC="${CUDACXX:-}"
[[ -z "$NVCC" ]] && NVCC="$(command -v nvcc || true)"
[[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]] && NVCC=/usr/local/cuda/bin/nvcc
if [[ -z "$NVCC" || ! -x "$NVCC" ]]; then
  echo "SKIP: no CUDA compiler (set CUDACXX or put nvcc on PATH)"
  exit 77
fi

step() { echo "== cmake_example: $*"; }
fail() { echo "FAIL: cmake_example: $*" >&2; exit 1; }

rm -rf "$B"
mkdir -p "$B/spec"
# Build from a copy of the spec so the test can touch it without disturbing the source tree.
cp "$SPEC" "$B/spec/"
SPEC_COPY="$B/spec/$(basename "$SPEC")"

args=(-S "$SRC" -B "$B/example" -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="${CUDAARCHS:-80;90}"
      -DHECTORGEN_EXAMPLE_SPEC="$SPEC_COPY")
[[ -n "$GENERATOR" ]] && args+=(-G "$GENERATOR")
[[ -n "$MAKE_PROGRAM" ]] && args+=(-DCMAKE_MAKE_PROGRAM="$MAKE_PROGRAM")
if [[ -n "$INSTALL_FROM" ]]; then
  step "installing $INSTALL_FROM into $B/prefix"
  "$CMAKE" --install "$INSTALL_FROM" --prefix "$B/prefix" >/dev/null
  args+=(-DCMAKE_PREFIX_PATH="$B/prefix")
else
  [[ -n "$HECTORGEN" && -n "$MODULE_PATH" ]] || fail "need --hectorgen and --module-path, or --install-from"
  args+=(-DCMAKE_MODULE_PATH="$MODULE_PATH" -DHECTORGEN_EXECUTABLE="$HECTORGEN")
fi

step "configure (CUDA compiler $NVCC)"
"$CMAKE" "${args[@]}"
if [[ -n "$INSTALL_FROM" ]]; then
  grep -q "^hectorgen_DIR:PATH=$B/prefix/" "$B/example/CMakeCache.txt" \
    || fail "find_package(hectorgen) did not use the installed package in $B/prefix"
fi

step "build"
if ! "$CMAKE" --build "$B/example"; then
  if [[ -z "$(find "$B/example" -name rgcn_kernels.cu -not -path '*/CMakeFiles/*')" ]]; then
    echo "note: hectorgen wrote no rgcn_kernels.cu: does this hectorgen generate code yet?" >&2
  fi
  fail "build failed"
fi

exe="$(find "$B/example" -name rgcn_example -type f -perm -u+x | head -1)"
[[ -n "$exe" ]] || fail "no rgcn_example built"
step "run $exe"
out="$("$exe")"
[[ "$out" == "ok" ]] || fail "rgcn_example printed '$out', expected 'ok'"

gen_dir="$(dirname "$(find "$B/example" -name rgcn_kernels.cu -not -path '*/CMakeFiles/*' | head -1)")"
stamp="$(find "$B/example" -name 'rgcn_kernels.hectorgen-stamp' | head -1)"
[[ -f "$stamp" ]] || fail "no stamp file"
# Files that must not change when nothing (or nothing but the spec's timestamp) changed.
products() {
  find "$gen_dir" -type f
  find "$B/example" \( -name '*.o' -o -name '*.a' -o -name rgcn_example \) -type f
}
newer_than() { products | while read -r f; do [[ "$f" -nt "$1" ]] && echo "$f"; done; true; }

# Timestamps can be coarse (a jiffy or a second): sleep so that "newer" is unambiguous.
sleep 1; touch "$B/marker1"; sleep 1
step "second build: expect no work"
"$CMAKE" --build "$B/example"
changed="$(newer_than "$B/marker1")"
[[ -z "$changed" ]] || fail "second build rewrote: $changed"
[[ "$stamp" -nt "$B/marker1" ]] && fail "second build reran hectorgen"

touch "$SPEC_COPY"
step "touched the spec: expect hectorgen to run and nothing to recompile"
"$CMAKE" --build "$B/example"
[[ "$stamp" -nt "$B/marker1" ]] || fail "touching the spec did not rerun hectorgen"
changed="$(newer_than "$B/marker1")"
[[ -z "$changed" ]] || fail "regenerating identical outputs rewrote or rebuilt: $changed"
echo "PASS: cmake_example"
