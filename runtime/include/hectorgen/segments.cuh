// Per-call bookkeeping of the grouped kernels (the host-side sizes are in hectorgen/segments.h) (hectorgen/tc_gemm.cuh, hectorgen/simt_wgrad.cuh), computed on the
// GPU in the caller's stream: no host synchronisation, so a generated layer can be captured in a CUDA graph.
//   segment_tile_ptr: numbers the row tiles (or weight-gradient chunks) of type-sorted segments consecutively;
//   segment_sum_partials: per-chunk column sums of a per-row tensor (the split-K first half of a segment sum);
//   reduce_partials:  the second kernel of weight gradients and segment sums, adding per-chunk partials in chunk
//                     order.
// Header-only CUDA, installed with the runtime.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
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

// partial[c][j] = sum over the rows r of chunk c of v[r][j], for the chunks numbered by chunk_ptr (chunk_rows rows
// each, segments as in segment_tile_ptr_kernel). blockIdx.x: the chunk, blockIdx.y: slices of 32 columns. Each
// warp adds every kWarps-th row of the chunk (a coalesced row slice per load), then the warps' sums are added in
// warp order: a fixed order, so two runs give bit-identical sums.
template <class T, int kThreads = 256>
__global__ void __launch_bounds__(kThreads)
    segment_sum_partials_kernel(const T* __restrict__ v, int64_t numel, const int32_t* __restrict__ seg_ptr,
                                int64_t num_rows, int num_segments, const int32_t* __restrict__ chunk_ptr,
                                int chunk_rows, float* __restrict__ partial) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float sums[kWarps][32];
  const int64_t chunk = blockIdx.x;
  if (chunk >= chunk_ptr[num_segments]) return;  // the grid over-approximates the chunk count
  const int type = tc::find_segment(chunk_ptr, num_segments, chunk);
  const int64_t seg_begin = seg_ptr ? seg_ptr[type] : 0, seg_end = seg_ptr ? seg_ptr[type + 1] : num_rows;
  const int64_t row_begin = seg_begin + (chunk - chunk_ptr[type]) * chunk_rows;
  const int64_t row_end = min(row_begin + chunk_rows, seg_end);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Column slices past grid y's limit are taken in turns by the blocks of y.
  for (int64_t col = static_cast<int64_t>(blockIdx.y) * 32 + lane; col - lane < numel;
       col += static_cast<int64_t>(gridDim.y) * 32) {
    float acc = 0.f;
    if (col < numel) {
      for (int64_t r = row_begin + warp; r < row_end; r += kWarps) acc += tc::to_float(v[r * numel + col]);
    }
    sums[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && col < numel) {
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += sums[w][lane];
      partial[chunk * numel + col] = total;
    }
    __syncthreads();  // sums is rewritten by the next slice
  }
}

template <class T>
cudaError_t launch_segment_sum_partials(const T* v, int64_t numel, const int32_t* seg_ptr, int64_t num_rows,
                                        int num_segments, const int32_t* chunk_ptr, int chunk_rows, float* partial,
                                        cudaStream_t stream) {
  if (num_rows <= 0 || numel <= 0) return cudaSuccess;  // chunk_ptr is all zeros: the reduction writes zeros
  const dim3 grid(static_cast<unsigned>(wgrad_max_chunks(num_rows, num_segments, chunk_rows)),
                  static_cast<unsigned>(std::min<int64_t>((numel + 31) / 32, 65535)));
  segment_sum_partials_kernel<T><<<grid, 256, 0, stream>>>(v, numel, seg_ptr, num_rows, num_segments, chunk_ptr,
                                                           chunk_rows, partial);
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
