// Weight gradients on CUDA cores, for fp32 models and for the instances the tensor-core kernel does not take
// (several heads, k or n not a multiple of 64): the same fixed split-K schedule as tc::launch_wgrad. n = 1 (a
// vector per relation) is a scaled row sum (wgrad_rowsum_partial_kernel) rather than a padded 64 x 64 tile.
//   dW[t][h] (+)= sum over the rows r of segment t of X[G(r)][h]^T (dY[S(r)][h] * scale[r])
// Each block computes one 64 x 64 tile of dW[t][h] over one chunk of chunk_rows rows of segment t (chunk_ptr
// numbers the chunks of every segment: hectorgen::launch_segment_tile_ptr with tile_rows = chunk_rows) and stores
// it to partial[chunk][h]; hectorgen::launch_reduce_partials then adds the chunks of each segment in order. The
// partition depends only on the row count, so two runs give bit-identical gradients. Header-only CUDA.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "hectorgen/segments.cuh"
#include "hectorgen/tc_ptx.cuh"  // to_float

namespace hectorgen::simt {

// x: [rows of X][heads][k], dy: [rows of dY][heads][n], any storage types (converted to fp32 when loaded).
template <class T, class TD = T>
struct WgradArgs {
  const T* x;
  const TD* dy;
  const int32_t* gather;   // X row of each row, or null (the row itself)
  const int32_t* scatter;  // dY row of each row, or null
  const float* scale;      // one scalar per row, or null
  const int32_t* seg_ptr;  // [num_segments + 1], or null: one segment of num_rows rows
  int64_t num_rows;
  int num_segments;
};

constexpr int kWgradTile = 64;     // dW tile: 64 (k) x 64 (n)
constexpr int kWgradSlab = 32;     // rows per shared-memory slab (the reduction dimension)
constexpr int kWgradThreads = 256;  // 16 x 16 threads, each 4 (k) x 4 (n) outputs

// Blocks per chunk: dW tiles x heads. wgrad_chunk_rows(num_rows, this) gives the chunk size.
template <int K, int N, int kHeads>
constexpr int wgrad_blocks_per_chunk() {
  return ((K + kWgradTile - 1) / kWgradTile) * ((N + kWgradTile - 1) / kWgradTile) * kHeads;
}

template <class T, class TD, int K, int N, int kHeads>
__global__ void __launch_bounds__(kWgradThreads)
    wgrad_partial_kernel(const WgradArgs<T, TD> a, const int32_t* __restrict__ chunk_ptr, int chunk_rows,
                         float* __restrict__ partial) {
  constexpr int kKTiles = (K + kWgradTile - 1) / kWgradTile, kNTiles = (N + kWgradTile - 1) / kWgradTile;
  constexpr int kBlocksPerChunk = kKTiles * kNTiles * kHeads;
  // +4: the 4-wide row reads of a warp start in different banks.
  __shared__ alignas(16) float xs[kWgradSlab][kWgradTile + 4];
  __shared__ alignas(16) float ds[kWgradSlab][kWgradTile + 4];

  const int64_t chunk = blockIdx.x / kBlocksPerChunk;
  const int within = static_cast<int>(blockIdx.x % kBlocksPerChunk);
  const int k0 = within % kKTiles * kWgradTile, n0 = within / kKTiles % kNTiles * kWgradTile;
  const int head = within / (kKTiles * kNTiles);
  if (chunk >= chunk_ptr[a.num_segments]) return;  // the grid over-approximates the chunk count
  const RowRange rows = chunk_row_range(chunk_ptr, a.seg_ptr, a.num_segments, a.num_rows, chunk_rows, chunk);
  const int64_t row_begin = rows.begin, row_end = rows.end;

  const int tid = threadIdx.x;
  const int tk = tid / 16 * 4, tn = tid % 16 * 4;  // this thread's outputs: k0 + tk + 0..3, n0 + tn + 0..3
  // Loads: each thread copies 4 consecutive columns of 8 slab rows of both X and dY (a warp: 2 rows, coalesced).
  const int lc = tid % 16 * 4, lr = tid / 16;
  float acc[4][4] = {};
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kWgradSlab) {
#pragma unroll
    for (int p = 0; p < kWgradSlab / 16; ++p) {
      const int r = lr + 16 * p;
      const int64_t row = r0 + r;
      const bool valid = row < row_end;
      const int64_t x_row = !valid ? 0 : a.gather ? static_cast<int64_t>(a.gather[row]) : row;
      const int64_t d_row = !valid ? 0 : a.scatter ? static_cast<int64_t>(a.scatter[row]) : row;
      const float s = valid && a.scale ? a.scale[row] : 1.f;
      const T* xp = a.x + (x_row * kHeads + head) * K;
      const TD* dp = a.dy + (d_row * kHeads + head) * N;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int k = k0 + lc + j, n = n0 + lc + j;
        xs[r][lc + j] = valid && k < K ? tc::to_float(xp[k]) : 0.f;
        ds[r][lc + j] = valid && n < N ? tc::to_float(dp[n]) * s : 0.f;
      }
    }
    __syncthreads();
#pragma unroll 8
    for (int r = 0; r < kWgradSlab; ++r) {
      const float4 xv = *reinterpret_cast<const float4*>(&xs[r][tk]);
      const float4 dv = *reinterpret_cast<const float4*>(&ds[r][tn]);
      const float xk[4] = {xv.x, xv.y, xv.z, xv.w}, dn[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += xk[i] * dn[j];
      }
    }
    __syncthreads();
  }
  float* const out = partial + (chunk * kHeads + head) * static_cast<int64_t>(K) * N;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int k = k0 + tk + i;
    if (k >= K) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + tn + j;
      if (n < N) out[static_cast<int64_t>(k) * N + n] = acc[i][j];
    }
  }
}

// n = 1 (a weight vector per relation, e.g. the weight-weight product of linear operator reordering): dW[t][h] is a
// scaled sum of X rows, a memory-bound reduction, so no 64 x 64 tile of which 63 columns would be padding. Same
// chunks and partial layout as wgrad_partial_kernel (blocks per chunk: k tiles x heads). A tile row (kCols
// columns of one head) is read by kGroupLanes lanes in runs of kRun columns, one load each (kRun =
// run_length<T>(K): 16 bytes for row lengths that allow it; a bf16 row of 64: 8 lanes, fp32: 16), so a warp
// reads kGroups = 32 / kGroupLanes rows at a time. Warp w takes the rows of the chunk 32 at a time (rows
// r0..r0 + 31, r0 = row_begin + 32 * (w + kWarps * i)): lane j fetches row r0 + j's X row and scaled dY value
// (coalesced index loads), and group g of the warp loads row r0 + s * kGroups + g at step s, kInFlight steps'
// loads in flight before they are added in step order. Then the groups' sums: within the warp a butterfly (fixed
// shuffles), over the warps in warp order; a fixed order, so two runs give bit-identical sums.
template <class T, class TD, int K, int kHeads>
__global__ void __launch_bounds__(kWgradThreads)
    wgrad_rowsum_partial_kernel(const WgradArgs<T, TD> a, const int32_t* __restrict__ chunk_ptr, int chunk_rows,
                                float* __restrict__ partial) {
  constexpr int kKTiles = (K + kWgradTile - 1) / kWgradTile;
  constexpr int kBlocksPerChunk = kKTiles * kHeads;
  constexpr int kWarps = kWgradThreads / 32, kRun = run_length<T>(K);
  using R = Run<T, kRun>;
  constexpr int kCols = K < kWgradTile ? K : kWgradTile;  // a tile's columns; kRun divides them (and k0)
  constexpr int kRuns = kCols / kRun;
  // Lanes a row: kRuns rounded up to a power of two (a divisor of 32), at most 32.
  constexpr int kGroupLanes = kRuns > 16 ? 32 : kRuns > 8 ? 16 : kRuns > 4 ? 8 : kRuns > 2 ? 4 : kRuns;
  constexpr int kLaneRuns = (kRuns + kGroupLanes - 1) / kGroupLanes;  // runs a lane: 2 for 1-element runs of 64
  constexpr int kGroups = 32 / kGroupLanes, kSteps = 32 / kGroups, kInFlight = kSteps < 8 ? kSteps : 8;
  __shared__ float sums[kWarps][kWgradTile];

  const int64_t chunk = blockIdx.x / kBlocksPerChunk;
  const int within = static_cast<int>(blockIdx.x % kBlocksPerChunk);
  const int k0 = within % kKTiles * kWgradTile, head = within / kKTiles;
  if (chunk >= chunk_ptr[a.num_segments]) return;  // the grid over-approximates the chunk count
  const RowRange rows = chunk_row_range(chunk_ptr, a.seg_ptr, a.num_segments, a.num_rows, chunk_rows, chunk);
  const int64_t row_begin = rows.begin, row_end = rows.end;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group = lane / kGroupLanes, group_lane = lane % kGroupLanes;

  float acc[kLaneRuns][kRun] = {};
  for (int64_t r0 = row_begin + 32 * warp; r0 < row_end; r0 += 32 * kWarps) {
    const int64_t row = r0 + lane;
    const bool valid = row < row_end;
    const int64_t lane_x_row = !valid ? 0 : a.gather ? static_cast<int64_t>(a.gather[row]) : row;
    const int64_t d_row = !valid ? 0 : a.scatter ? static_cast<int64_t>(a.scatter[row]) : row;
    const float lane_d = valid ? tc::to_float(a.dy[d_row * kHeads + head]) * (a.scale ? a.scale[row] : 1.f) : 0.f;
#pragma unroll
    for (int s0 = 0; s0 < kSteps; s0 += kInFlight) {
      typename R::Word x[kInFlight][kLaneRuns];
      float d[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int j = (s0 + u) * kGroups + group;  // the row of the 32 that this group loads
        const int64_t x_row = __shfl_sync(0xffffffffu, lane_x_row, j);
        d[u] = __shfl_sync(0xffffffffu, lane_d, j);
        const T* xp = a.x + (x_row * kHeads + head) * K + k0;
#pragma unroll
        for (int q = 0; q < kLaneRuns; ++q) {
          const int c = (group_lane + kGroupLanes * q) * kRun;  // the run's columns: k0 + c .. k0 + c + kRun - 1
          x[u][q] = r0 + j < row_end && c < kCols && k0 + c < K ? R::load(xp + c) : typename R::Word{};
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
#pragma unroll
        for (int q = 0; q < kLaneRuns; ++q) {
#pragma unroll
          for (int i = 0; i < kRun; ++i) acc[q][i] += R::at(x[u][q], i) * d[u];
        }
      }
    }
  }
#pragma unroll
  for (int offset = kGroupLanes; offset < 32; offset *= 2) {
#pragma unroll
    for (int q = 0; q < kLaneRuns; ++q) {
#pragma unroll
      for (int i = 0; i < kRun; ++i) acc[q][i] += __shfl_xor_sync(0xffffffffu, acc[q][i], offset);
    }
  }
  if (group == 0) {
#pragma unroll
    for (int q = 0; q < kLaneRuns; ++q) {
      const int c = (group_lane + kGroupLanes * q) * kRun;
      if (c < kCols) {
#pragma unroll
        for (int i = 0; i < kRun; ++i) sums[warp][c + i] = acc[q][i];
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kCols && k0 + static_cast<int>(threadIdx.x) < K) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += sums[w][threadIdx.x];
    partial[(chunk * kHeads + head) * static_cast<int64_t>(K) + k0 + threadIdx.x] = total;
  }
}

// First half of the weight gradient: partial[chunk][h] for every chunk (chunk_ptr from launch_segment_tile_ptr
// with chunk_rows = wgrad_chunk_rows(num_rows, wgrad_blocks_per_chunk<K, N, kHeads>())). partial holds
// wgrad_max_chunks(num_rows, num_segments, chunk_rows) x kHeads x K x N floats.
template <class T, int K, int N, int kHeads, class TD>
cudaError_t launch_wgrad_partials(const WgradArgs<T, TD>& a, const int32_t* chunk_ptr, int chunk_rows, float* partial,
                                  cudaStream_t stream) {
  if (a.num_rows <= 0) return cudaSuccess;  // chunk_ptr is all zeros: the reduction writes zeros
  const int64_t blocks = wgrad_max_chunks(a.num_rows, a.num_segments, chunk_rows) *
                         wgrad_blocks_per_chunk<K, N, kHeads>();
  if (blocks > kMaxGridX) return cudaErrorInvalidConfiguration;  // never a truncated grid
  if constexpr (N == 1)
    wgrad_rowsum_partial_kernel<T, TD, K, kHeads>
        <<<static_cast<unsigned>(blocks), kWgradThreads, 0, stream>>>(a, chunk_ptr, chunk_rows, partial);
  else
    wgrad_partial_kernel<T, TD, K, N, kHeads>
        <<<static_cast<unsigned>(blocks), kWgradThreads, 0, stream>>>(a, chunk_ptr, chunk_rows, partial);
  return cudaGetLastError();
}

}  // namespace hectorgen::simt
