#!/usr/bin/env bash
# Compile check of the graph preprocessing runtime; needs no GPU. Runnable from any directory.
#   1. runtime/src/graph_preprocess.cu and unified.cu with nvcc for sm_80 and sm_90 (-c), every warning an error;
#   2. the tensor-core kernels hectorgen/tc_gemm.cuh, each kernel instantiated for each storage type, with nvcc for
#      sm_80 and sm_90a (-c), every warning an error;
#   3. the public headers hectorgen/compact_policy.h, graph.h, runtime_version.h, unified.h and unified_pool.h as plain
#      C++17 (no nvcc, no CUB);
#   4. when Python can import torch: the libtorch binding runtime/torch/*.cpp (syntax only).
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), CXX (default c++), PYTHON (python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
runtime="$root/runtime"

nvcc="${NVCC:-}"
if [[ -z "$nvcc" ]]; then
  if command -v nvcc >/dev/null 2>&1; then
    nvcc="$(command -v nvcc)"
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
    nvcc=/usr/local/cuda/bin/nvcc
  else
    echo "compile_check: nvcc not found (set NVCC)" >&2
    exit 1
  fi
fi
cuda_include="$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)/include"
cxx="${CXX:-c++}"
python="${PYTHON:-python3}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

for arch in 80 90; do
  "$nvcc" -std=c++17 -O2 -arch="sm_$arch" -I"$runtime/include" \
    -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror \
    -c "$runtime/src/graph_preprocess.cu" -o "$tmp/graph_preprocess_sm$arch.o"
  echo "compile_check: ok  graph_preprocess.cu for sm_$arch"
  "$nvcc" -std=c++17 -O2 -arch="sm_$arch" -I"$runtime/include" \
    -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror \
    -c "$runtime/src/unified.cu" -o "$tmp/unified_sm$arch.o"
  echo "compile_check: ok  unified.cu for sm_$arch"
done

# The tensor-core kernels of the header, for each storage type and every epilogue (what generated code instantiates).
cat >"$tmp/tc_gemm_check.cu" <<'EOF'
#include "hectorgen/simt_wgrad.cuh"
#include "hectorgen/tc_gemm.cuh"

namespace tc = hectorgen::tc;
namespace simt = hectorgen::simt;

template <class T>
void instantiate(cudaStream_t stream) {
  using Store = tc::ForwardConfig<T, 64, 64, tc::Epilogue::kStore>;
  using Atomic = tc::ForwardConfig<T, 128, 128, tc::Epilogue::kAtomic>;
  tc::launch_segment_gemm<T, 64, 64, tc::Epilogue::kStore>(tc::SegmentGemmArgs<T, typename Store::OutT>{}, stream);
  tc::launch_segment_gemm<T, 128, 128, tc::Epilogue::kAtomic>(tc::SegmentGemmArgs<T, typename Atomic::OutT>{},
                                                               stream);
  using Accumulate = tc::ForwardConfig<T, 32, 64, tc::Epilogue::kAccumulate>;
  tc::launch_segment_gemm<T, 32, 64, tc::Epilogue::kAccumulate>(
      tc::SegmentGemmArgs<T, typename Accumulate::OutT>{}, stream);
  (void)tc::launch_transpose_segments<T>(nullptr, nullptr, 1, 64, 32, stream);
  // a 16-bit GEMM storing or accumulating into an fp32 output
  tc::launch_segment_gemm<T, 64, 64, tc::Epilogue::kStore, float>(tc::SegmentGemmArgs<T, float>{}, stream);
  tc::launch_segment_gemm<T, 64, 64, tc::Epilogue::kAccumulate, float>(tc::SegmentGemmArgs<T, float>{}, stream);
  (void)hectorgen::launch_segment_tile_ptr(nullptr, 1, 0, tc::kForwardTileRows, nullptr, stream);
  tc::launch_csr_segment_sum<T, 64>(nullptr, nullptr, nullptr, 0, stream);
  tc::launch_wgrad<T, 64, 128>(tc::WgradArgs<T>{}, nullptr, 128, nullptr, false, stream);
  (void)tc::launch_wgrad_partials<T, 64, 64>(tc::WgradArgs<T>{}, nullptr, 128, nullptr, stream);
  (void)simt::launch_wgrad_partials<T, 64, 64, 1>(simt::WgradArgs<T>{}, nullptr, 128, nullptr, stream);
  (void)simt::launch_wgrad_partials<T, 16, 48, 4>(simt::WgradArgs<T>{}, nullptr, 128, nullptr, stream);
  (void)hectorgen::launch_reduce_partials<T>(nullptr, nullptr, nullptr, 1, 64 * 64, true, stream);
  (void)hectorgen::launch_segment_tile_ptr(nullptr, 1, 0, 64, nullptr, stream);
  (void)hectorgen::launch_segment_sum_partials<T>(nullptr, 64, nullptr, 0, 1, nullptr, 128, nullptr, stream);
}

// fp32 as 3xTF32: the operands split into tf32 heads and tails (every epilogue, the weight gradient).
void instantiate_split(cudaStream_t stream) {
  constexpr tc::Fp32Math kSplit = tc::Fp32Math::kSplitTf32;
  tc::launch_segment_gemm<float, 64, 64, tc::Epilogue::kStore, float, kSplit>(tc::SegmentGemmArgs<float, float>{}, stream);
  tc::launch_segment_gemm<float, 128, 128, tc::Epilogue::kAtomic, float, kSplit>(tc::SegmentGemmArgs<float, float>{},
                                                                                 stream);
  tc::launch_segment_gemm<float, 32, 64, tc::Epilogue::kAccumulate, float, kSplit>(tc::SegmentGemmArgs<float, float>{},
                                                                                   stream);
  tc::launch_wgrad<float, 64, 128, kSplit>(tc::WgradArgs<float>{}, nullptr, 128, nullptr, false, stream);
  (void)tc::launch_wgrad_partials<float, 64, 64, kSplit>(tc::WgradArgs<float>{}, nullptr, 128, nullptr, stream);
}

void instantiate_all(cudaStream_t stream) {
  instantiate_split(stream);
  instantiate<float>(stream);
  instantiate<__nv_bfloat16>(stream);
  instantiate<__half>(stream);
}
EOF
for arch in 80 90a; do
  "$nvcc" -std=c++17 -O2 "-gencode=arch=compute_$arch,code=sm_$arch" -I"$runtime/include" \
    -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror -c "$tmp/tc_gemm_check.cu" -o "$tmp/tc_gemm_sm$arch.o"
  echo "compile_check: ok  hectorgen/tc_gemm.cuh, simt_wgrad.cuh, segments.cuh for sm_$arch (fp32 3xTF32, tf32, bf16, fp16)"
done

printf '#include "hectorgen/%s"
' compact_policy.h graph.h runtime_version.h segments.h tc_fragments.h unified.h \
  unified_pool.h unified_gather.h \
  >"$tmp/header_check.cpp"
printf 'int main() { return 0; }
' >>"$tmp/header_check.cpp"
"$cxx" -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I"$runtime/include" -I"$cuda_include" "$tmp/header_check.cpp"
echo "compile_check: ok  hectorgen/compact_policy.h, graph.h, runtime_version.h, segments.h, tc_fragments.h, unified.h," \
  "unified_pool.h, unified_gather.h as plain C++17"

torch_query='from torch.utils.cpp_extension import include_paths; print(" ".join(include_paths()))'
if torch_includes="$("$python" -c "$torch_query" 2>/dev/null)"; then
  python_include="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  flags=(-std=c++20 -Wall -Wextra -Werror -fsyntax-only -DTORCH_EXTENSION_NAME=hectorgen_runtime_C
         -I"$runtime/include" -I"$runtime/torch/include" -isystem "$cuda_include" -isystem "$python_include")
  for dir in $torch_includes; do flags+=(-isystem "$dir"); done
  for source in "$runtime/torch/graph_preprocess_torch.cpp" "$runtime/torch/python_module.cpp" \
                "$runtime/torch/unified_torch.cpp" "$runtime/torch/unified_python.cpp"; do
    "$cxx" "${flags[@]}" "$source"
    echo "compile_check: ok  $(basename "$source") (libtorch binding)"
  done
else
  echo "compile_check: skip libtorch binding (torch not importable by $python)"
fi
