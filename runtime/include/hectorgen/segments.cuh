// Per-call bookkeeping of the grouped kernels (the host-side sizes are in hectorgen/segments.h) (hectorgen/tc_gemm.cuh, hectorgen/simt_wgrad.cuh), computed on the
// GPU in the caller's stream: no host synchronisation, so a generated layer can be captured in a CUDA graph.
//   segment_tile_ptr: numbers the row tiles (or weight-gradient chunks) of type-sorted segments consecutively;
//   reduce_partials:  the weight gradient's second kernel, summing per-chunk partials in chunk order.
// Header-only CUDA, installed with the runtime.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "hectorgen/segments.h"
#include "hectorgen/tc_ptx.cuh"  // to_float, from_float

namespace hectorgen {

// tile_ptr[s] = sum over t < s of ceil(rows of segment t / tile_rows), for s = 0..num_segments. Segment t holds
// rows seg_ptr[t]..seg_ptr[t+1]; a null seg_ptr means one segment of num_rows rows. One block scans the
// segments in slices of its width (a few hundred segments at most in practice: one slice).
template <int kThreads = 256>
__global__ void __launch_bounds__(kThreads)
    segment_tile_ptr_kernel(const int32_t* __restrict__ seg_ptr, int num_segments, int64_t num_rows, int tile_rows,
                            int32_t* __restrict__ tile_ptr) {
  constexpr int kWarps = kThreads / 32;
  __shared__ int32_t warp_sums[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int32_t carry = 0;
  if (threadIdx.x == 0) tile_ptr[0] = 0;
  for (int base = 0; base < num_segments; base += kThreads) {
    const int s = base + static_cast<int>(threadIdx.x);
    int32_t tiles = 0;
    if (s < num_segments) {
      const int64_t rows = seg_ptr ? seg_ptr[s + 1] - seg_ptr[s] : num_rows;
      tiles = static_cast<int32_t>((rows + tile_rows - 1) / tile_rows);
    }
    // Inclusive scan: within the warp, then over the warp totals.
    int32_t sum = tiles;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int32_t v = __shfl_up_sync(0xffffffffu, sum, d);
      if (lane >= d) sum += v;
    }
    if (lane == 31) warp_sums[warp] = sum;
    __syncthreads();
    int32_t before = carry;
    for (int w = 0; w < warp; ++w) before += warp_sums[w];
    if (s < num_segments) tile_ptr[s + 1] = before + sum;
    for (int w = 0; w < kWarps; ++w) carry += warp_sums[w];
    __syncthreads();  // warp_sums is rewritten by the next slice
  }
}

inline cudaError_t launch_segment_tile_ptr(const int32_t* seg_ptr, int num_segments, int64_t num_rows,
                                           int tile_rows, int32_t* tile_ptr, cudaStream_t stream) {
  if (num_segments < 1 || tile_rows < 1) return cudaErrorInvalidValue;
  segment_tile_ptr_kernel<><<<1, 256, 0, stream>>>(seg_ptr, num_segments, num_rows, tile_rows, tile_ptr);
  return cudaGetLastError();
}

// dw[t] (+)= sum of partial[c] for c in chunk_ptr[t]..chunk_ptr[t+1], in that order (deterministic), for
// segments of `elems` fp32 values each (heads x k x n); OutT is dW's storage type (the sum stays fp32).
template <class OutT>
__global__ void __launch_bounds__(256)
    reduce_partials_kernel(const float* __restrict__ partial, const int32_t* __restrict__ chunk_ptr,
                           OutT* __restrict__ dw, int num_segments, int64_t elems, bool accumulate) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_segments * elems) return;
  const int64_t type = i / elems, e = i % elems;
  float sum = 0.f;
  for (int c = chunk_ptr[type]; c < chunk_ptr[type + 1]; ++c) sum += partial[static_cast<int64_t>(c) * elems + e];
  dw[i] = tc::from_float<OutT>(accumulate ? sum + tc::to_float(dw[i]) : sum);
}

template <class OutT>
cudaError_t launch_reduce_partials(const float* partial, const int32_t* chunk_ptr, OutT* dw, int num_segments,
                                   int64_t elems, bool accumulate, cudaStream_t stream) {
  const int64_t threads = num_segments * elems;
  if (threads == 0) return cudaSuccess;
  reduce_partials_kernel<OutT><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
      partial, chunk_ptr, dw, num_segments, elems, accumulate);
  return cudaGetLastError();
}

}  // namespace hectorgen
