// (a) The current SIMT templates, transcribed from templates/cuda/gemm.cu.in and wgrad.cu.in as the generator
// renders them for RGCN (generated/rgcn/rgcn_kernels.cu: rgcn_fwt_gemm_h_edges, rgcn_fw_gemm_h_2,
// rgcn_bw_wgrad_d_W): 16x16 fp32 tiles, 256 threads, coarsening 1, one head. Only the optional lists are
// runtime pointers here (the generator fixes them per instance); the arithmetic and the schedule are the
// template's.
#pragma once

#include <algorithm>

#include "common.cuh"

namespace gemm_bench::simt {

constexpr int kTile = 16;
constexpr int kThreads = 256;

template <int K, int N, Epilogue kEpi>
__global__ void __launch_bounds__(kThreads) segment_gemm(const float* __restrict__ x, const float* __restrict__ w,
                                                         float* __restrict__ y, const int32_t* __restrict__ src,
                                                         const int32_t* __restrict__ dst,
                                                         const float* __restrict__ row_scalar,
                                                         const int32_t* __restrict__ seg_ptr,
                                                         const int32_t* __restrict__ tile_ptr, int num_segments) {
  constexpr int kCoarsen = 1;
  constexpr int kRowGroups = kTile / kCoarsen;
  constexpr int64_t kK = K, kN = N, kHeads = 1;
  __shared__ float xs[kTile][kTile + 1];
  __shared__ float ws[kTile][kTile + 1];
  // Row tiles of all etype segments are numbered consecutively: find this block's segment.
  const int tile = blockIdx.x;
  if (tile >= tile_ptr[num_segments]) return;  // the grid over-approximates the tile count
  int type = 0;
  for (int lo = 0, hi = num_segments - 1; lo < hi;) {  // the last segment whose first tile <= tile
    const int mid = (lo + hi + 1) / 2;
    if (tile_ptr[mid] <= tile) lo = mid; else hi = mid - 1;
    type = lo;
  }
  const int64_t row_begin = seg_ptr[type] + static_cast<int64_t>(tile - tile_ptr[type]) * kTile;
  const int64_t row_end = row_begin + kTile < seg_ptr[type + 1] ? row_begin + kTile : seg_ptr[type + 1];
  const int head = blockIdx.z;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const float* w_slice = w + static_cast<int64_t>(type) * (kK * kN);
  float acc[kCoarsen] = {};
  for (int64_t k0 = 0; k0 < kK; k0 += kTile) {
    for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
      const int r = i / kTile, c = i % kTile;
      const int64_t row = row_begin + r, k = k0 + c;
      xs[r][c] = (row < row_end && k < kK)
                     ? x[(src ? static_cast<int64_t>(src[row]) : row) * (kHeads * kK) + head * kK + k]
                     : 0.f;
      const int64_t wk = k0 + r, wn = col0 + c;
      ws[r][c] = (wk < kK && wn < kN) ? w_slice[wk * kN + wn] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTile; ++kk) {
      const float wv = ws[kk][tx];
#pragma unroll
      for (int c = 0; c < kCoarsen; ++c) acc[c] += xs[ty + c * kRowGroups][kk] * wv;
    }
    __syncthreads();
  }
#pragma unroll
  for (int c = 0; c < kCoarsen; ++c) {
    const int64_t row = row_begin + ty + c * kRowGroups, col = col0 + tx;
    if (row < row_end && col < kN) {
      const float v = row_scalar ? acc[c] * row_scalar[row] : acc[c];
      const int64_t y_row = dst ? static_cast<int64_t>(dst[row]) : row;
      if constexpr (kEpi == Epilogue::kAtomic) {
        atomicAdd(&y[y_row * (kHeads * kN) + head * kN + col], v);
      } else {
        y[y_row * (kHeads * kN) + head * kN + col] = v;
      }
    }
  }
}

template <int K, int N, Epilogue kEpi>
void launch_segment_gemm(const SegmentGemmArgs<float, float>& a, cudaStream_t stream) {
  if (a.num_rows == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((a.num_rows + kTile - 1) / kTile + a.num_segments,
                                                          a.num_rows)),
                  N / kTile, 1);
  segment_gemm<K, N, kEpi><<<grid, kThreads, 0, stream>>>(a.x, a.w, a.y, a.gather, a.scatter, a.scale, a.seg_ptr,
                                                          a.tile_ptr, a.num_segments);
}

// One block per (dW tile, head, segment) walks the segment's rows in order: deterministic, no atomics.
template <int K, int N>
__global__ void __launch_bounds__(kThreads) wgrad(const float* __restrict__ x, const float* __restrict__ dy,
                                                  float* __restrict__ dw, const int32_t* __restrict__ src,
                                                  const int32_t* __restrict__ dst,
                                                  const float* __restrict__ row_scalar,
                                                  const int32_t* __restrict__ seg_ptr, int num_segments) {
  constexpr int kCoarsen = 1;
  constexpr int kRowGroups = kTile / kCoarsen;
  constexpr int64_t kK = K, kN = N, kHeads = 1;
  constexpr int64_t kKTiles = K / kTile, kNTiles = N / kTile;
  __shared__ float xs[kTile][kTile + 1];  // [row][k]
  __shared__ float ds[kTile][kTile + 1];  // [row][n]
  const int64_t k0 = blockIdx.x % kKTiles * kTile, n0 = blockIdx.x / kKTiles % kNTiles * kTile;
  const int head = static_cast<int>(blockIdx.x / (kKTiles * kNTiles));
  const int tk = threadIdx.x / kTile, tn = threadIdx.x % kTile;
  for (int64_t type = blockIdx.y; type < num_segments; type += gridDim.y) {
    const int64_t row_begin = seg_ptr[type], row_end = seg_ptr[type + 1];
    float acc[kCoarsen] = {};
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kTile) {
      for (int i = threadIdx.x; i < kTile * kTile; i += blockDim.x) {
        const int r = i / kTile, c = i % kTile;
        const int64_t row = r0 + r;
        const bool in_range = row < row_end;
        const int64_t x_row = in_range && src ? static_cast<int64_t>(src[row]) : row;
        const int64_t dy_row = in_range && dst ? static_cast<int64_t>(dst[row]) : row;
        const float s = in_range && row_scalar ? row_scalar[row] : 1.f;
        xs[r][c] = in_range && k0 + c < kK ? x[x_row * (kHeads * kK) + head * kK + k0 + c] : 0.f;
        ds[r][c] = in_range && n0 + c < kN ? dy[dy_row * (kHeads * kN) + head * kN + n0 + c] * s : 0.f;
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kTile; ++r) {
        const float d = ds[r][tn];
#pragma unroll
        for (int c = 0; c < kCoarsen; ++c) acc[c] += xs[r][tk + c * kRowGroups] * d;
      }
      __syncthreads();
    }
#pragma unroll
    for (int c = 0; c < kCoarsen; ++c) {
      const int64_t k = k0 + tk + c * kRowGroups, n = n0 + tn;
      if (k < kK && n < kN) dw[(type * kHeads + head) * kK * kN + k * kN + n] += acc[c];
    }
  }
}

// The template accumulates (+=): the caller zeroes dW first, as the generated backward does.
template <int K, int N>
void launch_wgrad(const WgradArgs<float>& a, cudaStream_t stream) {
  const dim3 grid((K / kTile) * (N / kTile), static_cast<unsigned>(std::min(a.num_segments, 65535)), 1);
  wgrad<K, N><<<grid, kThreads, 0, stream>>>(a.x, a.dy, a.dw, a.gather, a.scatter, a.scale, a.seg_ptr,
                                             a.num_segments);
}

}  // namespace gemm_bench::simt
