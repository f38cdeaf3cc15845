#!/usr/bin/env bash
# The warp-cooperative search of a row's relation (warp_segment_of, emitted into RGAT's compact pair traversals)
# against a plain scan, on the GPU: the helper is taken from what hectorgen generates for
# tests/gpu/specs/rgat_compact_reorder.yaml, compiled into a small kernel and run over random offset arrays (with
# empty segments, as relations without pairs give) of 1 to 3000 segments, every row of each, warps partly past the
# last row included. Prints the mismatches (0) and exits 1 on any.
#   tests/gpu/check_warp_segment_of.sh [HECTORGEN]   (default: build/hectorgen, else build/hg_bundle/hectorgen)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_check_lib.sh"
device_check_setup "${1:-}"
helper="$(generated_piece check_warp_segment_of tests/gpu/specs/rgat_compact_reorder.yaml '^__device__ __forceinline__ int warp_segment_of')"
cat > "$tmp/check.cu" <<CU
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>
$helper
// One warp per row, in a grid-stride loop over warps as the traversals run (every lane with the warp's row).
__global__ void search(const int32_t* ptr, int count, int64_t rows, int* found) {
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t stride = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = first; row < rows; row += stride) {
    const int s = warp_segment_of(ptr, count, row);
    if ((threadIdx.x & 31) == 0) found[row] = s;
  }
}
int main() {
  std::mt19937 rng(11);
  long long mismatches = 0, checked = 0;
  for (int count : {1, 2, 3, 4, 5, 31, 32, 33, 51, 100, 122, 474, 535, 1024, 1025, 3000}) {
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<int32_t> ptr{0};
      for (int s = 0; s < count; ++s) ptr.push_back(ptr.back() + (rng() % 3 == 0 ? 0 : static_cast<int32_t>(rng() % 40)));
      if (ptr.back() == 0) ptr.back() = 1;  // at least one row
      const int64_t rows = ptr.back();
      int32_t* d_ptr; int* d_found;
      cudaMalloc(&d_ptr, ptr.size() * sizeof(int32_t));
      cudaMalloc(&d_found, rows * sizeof(int));
      cudaMemcpy(d_ptr, ptr.data(), ptr.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
      search<<<7, 96>>>(d_ptr, count, rows, d_found);  // 3 warps a block: grid-stride, partial last passes
      std::vector<int> found(rows);
      cudaMemcpy(found.data(), d_found, rows * sizeof(int), cudaMemcpyDeviceToHost);
      if (cudaGetLastError() != cudaSuccess) { std::printf("CUDA error\\n"); return 1; }
      for (int64_t row = 0; row < rows; ++row) {
        int expected = 0;
        for (int s = 0; s < count; ++s) if (ptr[s] <= row) expected = s;
        ++checked;
        if (found[row] != expected && mismatches++ < 5)
          std::printf("count %d row %lld: found %d, expected %d\\n", count, (long long)row, found[row], expected);
      }
      cudaFree(d_ptr); cudaFree(d_found);
    }
  }
  std::printf("warp_segment_of: %lld rows checked, %lld mismatches\\n", checked, mismatches);
  return mismatches ? 1 : 0;
}
CU
build_and_run check_warp_segment_of
