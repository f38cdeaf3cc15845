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
#include <type_traits>

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

// The rows of chunk `chunk` of a split-K partition (chunk_ptr numbers the chunks of chunk_rows rows of each segment,
// from segment_tile_ptr_kernel with tile_rows = chunk_rows; segments as there): [begin, end) within its segment.
struct RowRange {
  int64_t begin, end;
};
__device__ inline RowRange chunk_row_range(const int32_t* __restrict__ chunk_ptr, const int32_t* __restrict__ seg_ptr,
                                           int num_segments, int64_t num_rows, int chunk_rows, int64_t chunk) {
  const int type = tc::find_segment(chunk_ptr, num_segments, chunk);
  const int64_t seg_begin = seg_ptr ? seg_ptr[type] : 0, seg_end = seg_ptr ? seg_ptr[type + 1] : num_rows;
  const int64_t begin = seg_begin + (chunk - chunk_ptr[type]) * chunk_rows;
  return {begin, min(begin + chunk_rows, seg_end)};
}

inline cudaError_t launch_segment_tile_ptr(const int32_t* seg_ptr, int num_segments, int64_t num_rows,
                                           int tile_rows, int32_t* tile_ptr, cudaStream_t stream) {
  if (num_segments < 1 || tile_rows < 1) return cudaErrorInvalidValue;
  segment_tile_ptr_kernel<><<<1, 256, 0, stream>>>(seg_ptr, num_segments, num_rows, tile_rows, tile_ptr);
  return cudaGetLastError();
}

// A run of kRun consecutive elements of a row moved as one load of kRun * sizeof(T) bytes (2, 4, 8 or 16:
// uint16_t, uint32_t, uint2 or uint4) and kept raw until it is added, so that several runs' loads are in flight
// before the first is used. The address is a multiple of the run's size: the row length is a multiple of kRun
// and the tensor starts 16-byte aligned (the host code checks).
template <class T, int kRun>
struct Run {
  static constexpr int kBytes = kRun * static_cast<int>(sizeof(T));
  static_assert(kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16, "a run is one load of at most 16 bytes");
  using Word = std::conditional_t<
      kBytes == 16, uint4, std::conditional_t<kBytes == 8, uint2, std::conditional_t<kBytes == 4, uint32_t, uint16_t>>>;
  __device__ static Word load(const T* p) { return *reinterpret_cast<const Word*>(p); }
  __device__ static float at(const Word& w, int i) { return tc::to_float(reinterpret_cast<const T*>(&w)[i]); }
};

// The longest run of T (at most 16 bytes, a power of two) that divides `numel`: a row of numel elements then
// starts at a multiple of the run's size, and no run crosses the end of a row.
template <class T>
__host__ __device__ constexpr int run_length(int64_t numel) {
  int run = 16 / static_cast<int>(sizeof(T));
  while (numel % run != 0) run /= 2;
  return run;
}

// Sum over the groups of each column of a block's slots: on entry (after a barrier) sums[g * width + c] holds
// group g's value of column c, for g < groups (width * groups <= the block's threads); on return sums[c] holds
// the column's sum. A halving tree of a fixed shape (of n values, value g < n - h adds value g + h, h = ceil(n/2);
// then n = h), so the additions depend on the sizes alone: bit-identical sums. Called by every thread of the block.
__device__ inline void sum_groups(float* sums, int width, int groups) {
  const int t = threadIdx.x, g = t / width;
  for (int n = groups; n > 1;) {
    const int h = (n + 1) / 2;
    if (g < n - h) sums[t] += sums[t + h * width];  // reads groups h..n-1, writes groups 0..n-h-1 <= h-1
    n = h;
    __syncthreads();
  }
}

// partial[c][j] = sum over the rows r of chunk c of v[r][j], for the chunks numbered by chunk_ptr (chunk_rows rows
// each, segments as in segment_tile_ptr_kernel). The sums depend only on the sizes (the order of the additions
// below is fixed), so two runs give bit-identical sums. Two kernels, by the row length:
//
// numel < 32: blockIdx.x is the chunk. The block's first groups * numel threads (groups = kThreads / numel) read
// `groups` rows at a time, one element a thread: thread t always adds column t % numel, of rows row_begin +
// t / numel + k * groups, so each step's reads are one contiguous run of the chunk and kUnroll steps' loads are
// in flight before they are added in row order. sum_groups then adds the groups' sums of each column.
template <class T, int kThreads = 256>
__global__ void __launch_bounds__(kThreads)
    segment_sum_partials_narrow_kernel(const T* __restrict__ v, int numel, const int32_t* __restrict__ seg_ptr,
                                       int64_t num_rows, int num_segments, const int32_t* __restrict__ chunk_ptr,
                                       int chunk_rows, float* __restrict__ partial) {
  constexpr int kUnroll = 8;
  __shared__ float sums[kThreads];
  const int64_t chunk = blockIdx.x;
  if (chunk >= chunk_ptr[num_segments]) return;  // the grid over-approximates the chunk count
  const RowRange rows = chunk_row_range(chunk_ptr, seg_ptr, num_segments, num_rows, chunk_rows, chunk);
  const int64_t row_begin = rows.begin, row_end = rows.end;
  const int t = threadIdx.x, groups = kThreads / numel;
  // Elements of the chunk, from its first: thread t takes t, t + step, ... (step: a multiple of numel).
  const T* const first = v + row_begin * numel;
  const int64_t count = (row_end - row_begin) * numel, step = static_cast<int64_t>(groups) * numel;
  float acc = 0.f;
  if (t < groups * numel) {
    for (int64_t i0 = t; i0 < count; i0 += kUnroll * step) {
      float x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + u * step;
        x[u] = i < count ? tc::to_float(first[i]) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) acc += x[u];
    }
  }
  sums[t] = acc;
  __syncthreads();
  sum_groups(sums, numel, groups);
  if (t < numel) partial[chunk * numel + t] = sums[t];
}

// numel >= 32: blockIdx.x is the chunk, blockIdx.y a slice of 32 columns (slices past grid y's limit are taken
// in turns by the blocks of y). A slice row is read by 32 / kRun lanes, kRun consecutive columns a lane in one
// load (kRun = run_length<T>(numel): 16 bytes for row lengths that allow it), so a warp reads kRun rows at a
// time and the block kGroups = kWarps * kRun; thread group g adds rows row_begin + g + k * kGroups, kUnroll of
// them in flight before they are added in row order. Then the groups' sums: within the warp a butterfly (fixed
// shuffles), over the warps in warp order.
template <class T, int kRun, int kThreads = 256>
__global__ void __launch_bounds__(kThreads)
    segment_sum_partials_kernel(const T* __restrict__ v, int64_t numel, const int32_t* __restrict__ seg_ptr,
                                int64_t num_rows, int num_segments, const int32_t* __restrict__ chunk_ptr,
                                int chunk_rows, float* __restrict__ partial) {
  using R = Run<T, kRun>;
  constexpr int kWarps = kThreads / 32, kGroupLanes = 32 / kRun, kGroups = kThreads / kGroupLanes;
  constexpr int kUnroll = R::kBytes >= 16 ? 4 : 8;  // 64 bytes or more in flight a thread
  __shared__ float sums[kWarps][32];
  const int64_t chunk = blockIdx.x;
  if (chunk >= chunk_ptr[num_segments]) return;  // the grid over-approximates the chunk count
  const RowRange rows = chunk_row_range(chunk_ptr, seg_ptr, num_segments, num_rows, chunk_rows, chunk);
  const int64_t row_begin = rows.begin, row_end = rows.end;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group = threadIdx.x / kGroupLanes, group_lane = lane % kGroupLanes;
  for (int64_t slice = blockIdx.y; slice * 32 < numel; slice += gridDim.y) {
    const int64_t col = slice * 32 + group_lane * kRun;  // this lane's run: columns col..col + kRun - 1
    float acc[kRun] = {};
    if (col < numel) {  // a run is all in the row or all past its end (kRun divides numel)
      for (int64_t r0 = row_begin + group; r0 < row_end; r0 += kUnroll * kGroups) {
        typename R::Word w[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t r = r0 + u * kGroups;
          w[u] = r < row_end ? R::load(v + r * numel + col) : typename R::Word{};
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
          for (int i = 0; i < kRun; ++i) acc[i] += R::at(w[u], i);
        }
      }
    }
#pragma unroll
    for (int offset = kGroupLanes; offset < 32; offset *= 2) {
#pragma unroll
      for (int i = 0; i < kRun; ++i) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], offset);
    }
    if (lane < kGroupLanes) {
#pragma unroll
      for (int i = 0; i < kRun; ++i) sums[warp][group_lane * kRun + i] = acc[i];
    }
    __syncthreads();
    if (warp == 0 && slice * 32 + lane < numel) {
      float total = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += sums[w][lane];
      partial[chunk * numel + slice * 32 + lane] = total;
    }
    __syncthreads();  // sums is rewritten by the next slice
  }
}

// The wide kernel with the longest run that divides numel.
template <class T, int kRun = 16 / static_cast<int>(sizeof(T))>
void launch_segment_sum_runs(dim3 grid, const T* v, int64_t numel, const int32_t* seg_ptr, int64_t num_rows,
                             int num_segments, const int32_t* chunk_ptr, int chunk_rows, float* partial,
                             cudaStream_t stream) {
  if constexpr (kRun > 1) {
    if (run_length<T>(numel) < kRun)
      return launch_segment_sum_runs<T, kRun / 2>(grid, v, numel, seg_ptr, num_rows, num_segments, chunk_ptr,
                                                  chunk_rows, partial, stream);
  }
  segment_sum_partials_kernel<T, kRun><<<grid, 256, 0, stream>>>(v, numel, seg_ptr, num_rows, num_segments,
                                                                 chunk_ptr, chunk_rows, partial);
}

template <class T>
cudaError_t launch_segment_sum_partials(const T* v, int64_t numel, const int32_t* seg_ptr, int64_t num_rows,
                                        int num_segments, const int32_t* chunk_ptr, int chunk_rows, float* partial,
                                        cudaStream_t stream) {
  if (num_rows <= 0 || numel <= 0) return cudaSuccess;  // chunk_ptr is all zeros: the reduction writes zeros
  const dim3 grid(static_cast<unsigned>(wgrad_max_chunks(num_rows, num_segments, chunk_rows)),
                  static_cast<unsigned>(std::min<int64_t>((numel + 31) / 32, 65535)));
  if (numel < 32)
    segment_sum_partials_narrow_kernel<T><<<grid, 256, 0, stream>>>(v, static_cast<int>(numel), seg_ptr, num_rows,
                                                                    num_segments, chunk_ptr, chunk_rows, partial);
  else
    launch_segment_sum_runs<T>(grid, v, numel, seg_ptr, num_rows, num_segments, chunk_ptr, chunk_rows, partial,
                               stream);
  return cudaGetLastError();
}

// dw[t] (+)= sum of partial[c] for c in chunk_ptr[t]..chunk_ptr[t+1], for segments of `elems` fp32 values each
// (heads x k x n); OutT is dW's storage type (the sum stays fp32). A block takes a slice of `width` consecutive
// elements of one segment (blocks past grid x's limit in turns); its threads split into groups = kThreads / width
// groups of width threads, group g adding the chunks g, g + groups, ... of the segment in order (kUnroll loads in
// flight; a group reads a contiguous slice of each chunk, and for width = elems the block reads contiguously),
// then sum_groups adds the groups' sums. The order depends only on the sizes: bit-identical sums.
template <class OutT, int kThreads = 256>
__global__ void __launch_bounds__(kThreads)
    reduce_partials_kernel(const float* __restrict__ partial, const int32_t* __restrict__ chunk_ptr,
                           OutT* __restrict__ dw, int num_segments, int64_t elems, int width, bool accumulate) {
  constexpr int kUnroll = 8;
  __shared__ float sums[kThreads];
  const int t = threadIdx.x, groups = kThreads / width, group = t / width;
  const int64_t slices = (elems + width - 1) / width;
  // Each thread rewrites only its own slot of sums before the next barrier (sum_groups ends with one).
  for (int64_t b = blockIdx.x; b < num_segments * slices; b += gridDim.x) {
    const int64_t type = b / slices, e = b % slices * width + t % width;
    const int64_t c_end = chunk_ptr[type + 1];
    float acc = 0.f;
    if (group < groups && e < elems) {
      for (int64_t c0 = chunk_ptr[type] + group; c0 < c_end; c0 += kUnroll * groups) {
        float x[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = c0 + u * groups;
          x[u] = c < c_end ? partial[c * elems + e] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) acc += x[u];
      }
    }
    sums[t] = acc;
    __syncthreads();
    sum_groups(sums, width, groups);
    if (t < width && e < elems) {
      const int64_t i = type * elems + e;
      dw[i] = tc::from_float<OutT>(accumulate ? sums[t] + tc::to_float(dw[i]) : sums[t]);
    }
  }
}

template <class OutT>
cudaError_t launch_reduce_partials(const float* partial, const int32_t* chunk_ptr, OutT* dw, int num_segments,
                                   int64_t elems, bool accumulate, cudaStream_t stream) {
  if (num_segments <= 0 || elems <= 0) return cudaSuccess;
  // Slices of 32 elements (a 128-byte row of a chunk's partial per warp), all of a segment's when fewer; halved,
  // down to 8 (a 32-byte sector), while fewer than kMinBlocks blocks would leave SMs idle (few segments of a few
  // dozen elements: more threads per element instead). A function of the sizes alone, like the order it sets.
  constexpr int64_t kMinBlocks = 512;
  int width = elems < 32 ? static_cast<int>(elems) : 32;
  while (width > 8 && elems >= 32 && num_segments * ((elems + width - 1) / width) < kMinBlocks) width /= 2;
  const int64_t blocks = num_segments * ((elems + width - 1) / width);
  reduce_partials_kernel<OutT><<<static_cast<unsigned>(std::min(blocks, kMaxGridX)), 256, 0, stream>>>(
      partial, chunk_ptr, dw, num_segments, elems, width, accumulate);
  return cudaGetLastError();
}

}  // namespace hectorgen
