#!/usr/bin/env bash
# Configures and builds tests/cmake_example (a project using hectorgen_generate()) in a fresh build directory,
# runs its program, then checks that the build is incremental: a second build does nothing, and touching the
# spec reruns hectorgen without recompiling anything (hectorgen rewrites only files whose content changed).
# The hectorgen runtime comes either in-tree (--runtime-source: the example add_subdirectory()s it) or installed
# (--install-runtime: runtime/ is built and installed into the same prefix as hectorgen, the core library only).
# With an installed runtime it then configures the generated extension project (<gen>/CMakeLists.txt) against it,
# when Python can import torch, and checks that without the runtime that configure fails with a clear message.
# Exit 77 (skipped) when no CUDA compiler is found. Registered as CTest tests by tests/CMakeLists.txt:
#   run_test.sh --cmake CMAKE --generator GEN [--make-program PROG] --source DIR --build DIR --spec SPEC
#               (--hectorgen EXE --module-path DIR --runtime-source RUNTIME_DIR
#                | --install-from HECTORGEN_BUILD_DIR --install-runtime RUNTIME_DIR)
# The CUDA compiler: $CUDACXX, else nvcc on PATH, else /usr/local/cuda/bin/nvcc; architectures: $CUDAARCHS,
# else 80 (one is enough here: tests/golden/compile_generated.sh and tests/runtime/compile_check.sh compile for
# sm_80 and sm_90). Python: $PYTHON, else python3.
set -euo pipefail

CMAKE=cmake GENERATOR="" MAKE_PROGRAM="" SRC="" B="" SPEC="" HECTORGEN="" MODULE_PATH="" INSTALL_FROM=""
RUNTIME_SOURCE="" INSTALL_RUNTIME=""
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
    --runtime-source) RUNTIME_SOURCE="$2" ;;
    --install-runtime) INSTALL_RUNTIME="$2" ;;
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

ARCHS="${CUDAARCHS:-80}"
common=(-DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCHS")
[[ -n "$GENERATOR" ]] && common+=(-G "$GENERATOR")
[[ -n "$MAKE_PROGRAM" ]] && common+=(-DCMAKE_MAKE_PROGRAM="$MAKE_PROGRAM")
args=(-S "$SRC" -B "$B/example" "${common[@]}" -DHECTORGEN_EXAMPLE_SPEC="$SPEC_COPY")
if [[ -n "$INSTALL_FROM" ]]; then
  [[ -n "$INSTALL_RUNTIME" ]] || fail "--install-from needs --install-runtime"
  step "installing $INSTALL_FROM into $B/prefix"
  "$CMAKE" --install "$INSTALL_FROM" --prefix "$B/prefix" >/dev/null
  step "configure without any hectorgen runtime: expect hectorgen_generate() to say what is missing"
  if "$CMAKE" -S "$SRC" -B "$B/example-no-runtime" "${common[@]}" -DHECTORGEN_EXAMPLE_SPEC="$SPEC_COPY" \
       -DCMAKE_PREFIX_PATH="$B/prefix" > "$B/example-no-runtime.log" 2>&1; then
    fail "hectorgen_generate() configured without any hectorgen runtime"
  fi
  grep -q "hectorgen_generate(rgcn_kernels): the hectorgen runtime [0-9]*\.[0-9]*" "$B/example-no-runtime.log" \
    || { cat "$B/example-no-runtime.log"; fail "hectorgen_generate() did not say that the runtime is missing"; }
  step "building the runtime $INSTALL_RUNTIME (core library) and installing it into $B/prefix"
  "$CMAKE" -S "$INSTALL_RUNTIME" -B "$B/runtime" "${common[@]}" -DHECTORGEN_RUNTIME_TORCH=OFF >/dev/null
  "$CMAKE" --build "$B/runtime" >/dev/null
  "$CMAKE" --install "$B/runtime" --prefix "$B/prefix" >/dev/null
  for f in include/hectorgen/graph.h include/hectorgen/runtime_version.h \
           lib/cmake/hectorgen_runtime/hectorgen_runtimeConfig.cmake; do
    [[ -f "$B/prefix/$f" ]] || fail "the runtime install lacks $f"
  done
  args+=(-DCMAKE_PREFIX_PATH="$B/prefix")
else
  [[ -n "$HECTORGEN" && -n "$MODULE_PATH" && -n "$RUNTIME_SOURCE" ]] \
    || fail "need --hectorgen, --module-path and --runtime-source, or --install-from and --install-runtime"
  args+=(-DCMAKE_MODULE_PATH="$MODULE_PATH" -DHECTORGEN_EXECUTABLE="$HECTORGEN"
         -DHECTORGEN_EXAMPLE_RUNTIME_SOURCE_DIR="$RUNTIME_SOURCE")
fi

step "configure (CUDA compiler $NVCC)"
"$CMAKE" "${args[@]}"
if [[ -n "$INSTALL_FROM" ]]; then
  grep -q "^hectorgen_DIR:PATH=$B/prefix/" "$B/example/CMakeCache.txt" \
    || fail "find_package(hectorgen) did not use the installed package in $B/prefix"
  grep -q "^hectorgen_runtime_DIR:PATH=$B/prefix/" "$B/example/CMakeCache.txt" \
    || fail "hectorgen_generate() did not use the runtime installed in $B/prefix"
else
  grep -q "^hectorgen_runtime_DIR:" "$B/example/CMakeCache.txt" \
    && fail "hectorgen_generate() searched for an installed runtime although the hectorgen::runtime target exists"
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
[[ "$out" == "ok (hectorgen runtime "* ]] || fail "rgcn_example printed '$out', expected 'ok (hectorgen runtime ...)'"

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

if [[ -n "$INSTALL_FROM" ]]; then
  # The generated extension project (the Python extension) against the installed runtime: configure only.
  PYTHON="${PYTHON:-python3}"
  step "generated extension project without the runtime: expect a clear configure error"
  if "$CMAKE" -S "$gen_dir" -B "$B/ext-no-runtime" "${common[@]}" > "$B/ext-no-runtime.log" 2>&1; then
    fail "the generated CMakeLists.txt configured without any hectorgen runtime"
  fi
  grep -q "rgcn needs the hectorgen runtime [0-9]*\.[0-9]* or a later" "$B/ext-no-runtime.log" \
    || { cat "$B/ext-no-runtime.log"; fail "the configure error does not say which hectorgen runtime is missing"; }
  if torch_prefix="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)"; then
    step "generated extension project against the installed runtime (configure only)"
    "$CMAKE" -S "$gen_dir" -B "$B/ext" "${common[@]}" -DCMAKE_PREFIX_PATH="$B/prefix;$torch_prefix" \
      -DPython3_EXECUTABLE="$(command -v "$PYTHON")" > "$B/ext.log" 2>&1 \
      || { tail -40 "$B/ext.log"; fail "the generated extension project did not configure"; }
    grep -q "^hectorgen_runtime_DIR:PATH=$B/prefix/" "$B/ext/CMakeCache.txt" \
      || fail "the generated extension project did not use the runtime installed in $B/prefix"
  else
    echo "note: $PYTHON cannot import torch: the generated extension project was not configured"
  fi
fi
echo "PASS: cmake_example"
