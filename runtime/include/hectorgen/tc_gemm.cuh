// Tensor-core kernels of hectorgen's GEMM and weight-gradient instances (mma.sync, sm_80 and later; header-only,
// installed with the runtime and included by generated *_kernels.cu):
//   segment_gemm:    Y[S[row]] = scale[row] * X[G[row]] * W[type(row)] over type-sorted rows;
//   csr_segment_sum: the second half of the deterministic scatter-add (rows stored destination-sorted, then
//                    summed per destination in a fixed order);
//   wgrad:           dW[t] = sum over segment t of X[G[row]]^T (dY[S[row]] * scale[row]), split-K over fixed row
//                    chunks, fp32 partials reduced in chunk order by a second kernel (deterministic).
//
// Both GEMMs use 32x32 warp tiles of m16n8k16 (bf16/fp16) or m16n8k8 (tf32; fp32 as three tf32 MMAs of split
// operands, Fp32Math) MMAs, 16-byte cp.async loads with the gather/scatter lists applied per row, and a
// kStages-deep cp.async ring over the reduction dimension.
// The forward's shared-memory tiles are dense and XOR-swizzled (fragments::Swizzled), the weight gradient's rows
// are padded by 16 bytes (fragments::Padded): either way ldmatrix and the tf32 fragment loads are conflict-free.
// Design and H100 measurements: docs/gemm_template.md; microbenchmark and CPU fragment check: bench/gemm/.
#pragma once

#include <algorithm>
#include <type_traits>

#include "hectorgen/segments.cuh"
#include "hectorgen/tc_fragments.h"
#include "hectorgen/tc_ptx.cuh"

namespace hectorgen::tc {

// How the GEMM's rows are stored: Y[S[row]] = scale[row] * X[G[row]] * W[T(row)].
//   kStore:      overwrite the output row (S absent: the row itself; S present: it must be injective).
//   kAtomic:     add into an fp32 output (S present, several rows may share a destination).
//   kAccumulate: add into the output row, read-add-store without atomics (the output rows must be distinct:
//                S absent or injective); the sum is taken in fp32 and rounded once to the output's type.
enum class Epilogue { kStore, kAtomic, kAccumulate };

// One segment GEMM over type-sorted rows. Rows seg_ptr[t]..seg_ptr[t+1] use weight t. Optional lists may be
// null. x: [x_rows][k], w: [num_segments][k][n], y: [y_rows][n]; every row index is int32 (like the runtime).
// WT, the weights' element type, is T's but for a widened GEMM: fp32 X (T float, tf32 MMAs) and a 16-bit model's
// weights, widened as they are loaded (copy_16).
template <class T, class OutT, class WT = T>
struct SegmentGemmArgs {
  const T* x;
  const WT* w;
  OutT* y;
  const int32_t* gather;   // G: the X row of each row, or null
  const int32_t* scatter;  // S: the Y row of each row, or null
  const float* scale;      // one scalar per row, or null
  const int32_t* seg_ptr;  // [num_segments + 1], or null: one segment of num_rows rows
  const int32_t* tile_ptr; // [num_segments + 1] prefix sum of ceil(rows / tile rows) for the kernel's tile, or
                           // null with seg_ptr null: one segment, tile t its rows t * tile rows onwards
  int64_t num_rows;
  int num_segments;
};

// Weight gradient dW[t] (=, or += when accumulate) sum over the rows of segment t of X[G[row]]^T (dY[S[row]] *
// scale[row]). x: [..][k], dy: [..][n], dw: [num_segments][k][n] in fp32 (the gradient accumulator).
// XT and DyT are one type, or one of them fp32 and the other a 16-bit type (a 16-bit model's fp32 gradient and
// 16-bit activation): then the kernel's tiles are fp32, the 16-bit operand widened as it is loaded, tf32 MMAs.
template <class XT, class DyT = XT>
struct WgradArgs {
  const XT* x;
  const DyT* dy;
  float* dw;
  const int32_t* gather;   // X rows, or null
  const int32_t* scatter;  // dY rows, or null
  const float* scale;
  const int32_t* seg_ptr;  // [num_segments + 1], or null: one segment of num_rows rows
  int64_t num_rows;
  int num_segments;
};

// Reduction depth of one mma: k16 for the 16-bit types, k8 for tf32 (stored as float).
template <class T> constexpr int kMmaK = 16;
template <> constexpr int kMmaK<float> = 8;

// How fp32 operands (T = float) enter the MMAs: rounded once to tf32 (the model's dtype tf32: 10 significand bits a
// product), or split into a tf32 head and tail (tc_ptx.cuh split_tf32) and multiplied as tail * head + head * tail
// + head * head (dtype fp32, "3xTF32": three MMAs a tile step for products about as exact as fp32's, the sums in
// fp32 as always). The 16-bit types ignore it.
enum class Fp32Math { kTf32, kSplitTf32 };

// ---- warp-level fragment loads (positions in tc_fragments.h, checked on the CPU by bench/gemm/fragment_check)
// Each lane computes the offset of its first fragment position inside the warp's tile once (a_lane_offset,
// b_lane_offset, through the layout, fragments::Padded or fragments::Swizzled); every other position is that
// offset displaced by a compile-time (rows, cols) (layout.displace: an add, or for the swizzle one XOR).

// The lane's first position of each operand (register 0 of the fragment, or the ldmatrix row address).
template <class T, bool kATransposed>
__device__ inline fragments::RowCol a_lane_position(int lane) {
  if constexpr (std::is_same_v<T, float>) {
    return kATransposed ? fragments::a_colmajor_tf32(lane, 0) : fragments::a_rowmajor_tf32(lane, 0);
  } else {
    return kATransposed ? fragments::a_colmajor_ldsm_trans(lane) : fragments::a_rowmajor_ldsm(lane);
  }
}
template <class T>
__device__ inline fragments::RowCol b_lane_position(int lane) {
  if constexpr (std::is_same_v<T, float>) return fragments::b_tf32(lane, 0);
  else return fragments::b_ldsm_trans(lane);
}

// The fp32 values of operand A's tf32 fragment (a 16 x 8 tile at (dm, dk), as load_a), not yet converted.
template <bool kATransposed, class Layout>
__device__ inline void load_a_fp32(float (&a)[4], const float* base, Layout l, int lane_offset, int dm, int dk) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    // register r sits (m, k) = ((r % 2) * 8, (r / 2) * 4) from register 0 (fragments::a_*_tf32)
    const int m = dm + (r % 2) * 8, k = dk + (r / 2) * 4;
    a[r] = base[kATransposed ? l.displace(lane_offset, k, m) : l.displace(lane_offset, m, k)];
  }
}

// Operand A of a 16 x kMmaK tile at (dm, dk) from the lane's origin; kATransposed: stored with k along
// shared-memory rows, m contiguous (the weight gradient's X^T), else m along rows, k contiguous.
template <class T, bool kATransposed, class Layout>
__device__ inline void load_a(uint32_t (&a)[4], const T* base, Layout l, int lane_offset, int dm, int dk) {
  if constexpr (std::is_same_v<T, float>) {
    float v[4];
    load_a_fp32<kATransposed>(v, base, l, lane_offset, dm, dk);
#pragma unroll
    for (int r = 0; r < 4; ++r) a[r] = to_tf32(v[r]);
  } else if constexpr (kATransposed) {
    ldmatrix_x4_trans(a, base + l.displace(lane_offset, dk, dm));
  } else {
    ldmatrix_x4(a, base + l.displace(lane_offset, dm, dk));
  }
}

// The fp32 values of operand B's two tf32 fragments (as load_b_pair), not yet converted.
template <class Layout>
__device__ inline void load_b_pair_fp32(float (&b0)[2], float (&b1)[2], const float* base, Layout l, int lane_offset,
                                        int dk, int dn) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {  // b0 (k t, n g), b1 (k t + 4, n g); the second n tile 8 columns on
    b0[r] = base[l.displace(lane_offset, dk + 4 * r, dn)];
    b1[r] = base[l.displace(lane_offset, dk + 4 * r, dn + 8)];
  }
}

// Operand B of two kMmaK x 8 tiles (n 0-7 and 8-15) at (dk, dn) from the lane's origin, k along rows.
template <class T, class Layout>
__device__ inline void load_b_pair(uint32_t (&b0)[2], uint32_t (&b1)[2], const T* base, Layout l, int lane_offset,
                                   int dk, int dn) {
  if constexpr (std::is_same_v<T, float>) {
    float v0[2], v1[2];
    load_b_pair_fp32(v0, v1, base, l, lane_offset, dk, dn);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      b0[r] = to_tf32(v0[r]);
      b1[r] = to_tf32(v1[r]);
    }
  } else {
    uint32_t r[4];
    ldmatrix_x4_trans(r, base + l.displace(lane_offset, dk, dn));
    b0[0] = r[0];
    b0[1] = r[1];
    b1[0] = r[2];
    b1[1] = r[3];
  }
}

// acc[mt][nt] += A(32 x kMmaK) * B(kMmaK x 32) with fp32 operands split into tf32 heads and tails (Fp32Math::
// kSplitTf32), 3 MMAs a tile (the small products first). B's fragments stay fp32 and are split where used (for each
// 16-row half of A again: a few ALU operations, where keeping both halves split would spill at the register cap).
template <bool kATransposed, class ALayout, class BLayout>
__device__ inline void warp_mma_step_split(float (&acc)[2][4][4], const float* a_base, ALayout al, int a_lane,
                                           const float* b_base, BLayout bl, int b_lane, int k0) {
  float b[4][2];
#pragma unroll
  for (int np = 0; np < 2; ++np) load_b_pair_fp32(b[2 * np], b[2 * np + 1], b_base, bl, b_lane, k0, np * 16);
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    float v[4];
    uint32_t a_head[4], a_tail[4];
    load_a_fp32<kATransposed>(v, a_base, al, a_lane, mt * 16, k0);
#pragma unroll
    for (int r = 0; r < 4; ++r) split_tf32(v[r], a_head[r], a_tail[r]);
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      uint32_t b_head[2], b_tail[2];
      split_tf32(b[nt][0], b_head[0], b_tail[0]);
      split_tf32(b[nt][1], b_head[1], b_tail[1]);
      mma_16x8<float>(acc[mt][nt], a_tail, b_head);
      mma_16x8<float>(acc[mt][nt], a_head, b_tail);
      mma_16x8<float>(acc[mt][nt], a_head, b_head);
    }
  }
}

// acc[mt][nt] += A(32 x kMmaK) * B(kMmaK x 32) for one warp at k step k0: 2 x 4 mma tiles. a_lane/b_lane: the
// lane's offsets at the warp tile's origin (for k0 = 0).
template <class T, bool kATransposed, Fp32Math kMath = Fp32Math::kTf32, class ALayout, class BLayout>
__device__ inline void warp_mma_step(float (&acc)[2][4][4], const T* a_base, ALayout al, int a_lane, const T* b_base,
                                     BLayout bl, int b_lane, int k0) {
  if constexpr (std::is_same_v<T, float> && kMath == Fp32Math::kSplitTf32) {
    warp_mma_step_split<kATransposed>(acc, a_base, al, a_lane, b_base, bl, b_lane, k0);
  } else {
    uint32_t a[2][4], b[4][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) load_a<T, kATransposed>(a[mt], a_base, al, a_lane, mt * 16, k0);
#pragma unroll
    for (int np = 0; np < 2; ++np) load_b_pair(b[2 * np], b[2 * np + 1], b_base, bl, b_lane, k0, np * 16);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) mma_16x8<T>(acc[mt][nt], a[mt], b[nt]);
    }
  }
}

// ---- forward: segment GEMM ----------------------------------------------------------------------------------

// Block tile kBM x 64 (kWarpsM x 2 warps of 32 x 32), k slabs of 32. Row tiles never straddle segments:
// tile_ptr numbers the kBM-row tiles of every segment; the n tiles of one row tile are adjacent block indices
// so the gathered X rows are re-read from L2.
//
// Occupancy is what the forward's speed is made of (it is memory-bound by ~8x on tensor cores, and each block
// has all of its loads in flight at once): shared memory holds dense XOR-swizzled tiles (no padding), the ring
// is no deeper than the k loop (K = 64: 2 slabs, 2 stages), the row scalars are read once into shared memory,
// and kMinBlocks caps the registers so that many blocks share an SM (16-bit, K = 64: 16.6 KB and <= 56
// registers, 9 blocks an SM, as many as the CuTe version, where the padded 3-stage version had 29 KB, 68
// registers and 7).
// The output's element type unless given: fp32 for kAtomic, else the storage type T. A 16-bit GEMM may also store
// or accumulate into an fp32 output (a tensor that atomics add into later).
template <class T, Epilogue kEpi>
using DefaultOutT = std::conditional_t<kEpi == Epilogue::kAtomic, float, T>;

template <class ElemT, int kDimK, int kDimN, int kWarpsRows, int kNumStages, Epilogue kEpilogue, int kMinBlocksPerSm,
          class OutElemT = DefaultOutT<ElemT, kEpilogue>, Fp32Math kFp32Math = Fp32Math::kTf32, class WElemT = ElemT>
struct SegmentGemm {
  using T = ElemT;
  using OutT = OutElemT;
  using WT = WElemT;  // the weights' element type: T, or 16-bit under fp32 X (widened as loaded)
  static constexpr Fp32Math kMath = kFp32Math;
  static_assert(std::is_same_v<WT, T> || (std::is_same_v<T, float> && sizeof(WT) == 2 && kMath == Fp32Math::kTf32),
                "only a tf32 GEMM of fp32 X widens 16-bit weights");
  static_assert(std::is_same_v<OutT, T> || std::is_same_v<OutT, float> || std::is_same_v<OutT, WT>,
                "the output is stored as T, fp32 or the weights' 16-bit type");
  static_assert(kEpilogue != Epilogue::kAtomic || std::is_same_v<OutT, float>, "atomics add into fp32");
  // The epilogue's staging type: the output's, except for kAccumulate, which adds the fp32 tile to the output.
  using StageT = std::conditional_t<kEpilogue == Epilogue::kAccumulate, float, OutT>;
  static constexpr int K = kDimK, N = kDimN, kWarpsM = kWarpsRows, kMinBlocks = kMinBlocksPerSm;
  static constexpr Epilogue kEpi = kEpilogue;
  static constexpr int kWarpsN = 2;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kBM = 32 * kWarpsM, kBN = 32 * kWarpsN, kBK = 32;
  static constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte copy
  static constexpr int kNTiles = N / kBN;
  static constexpr int kKSlabs = K / kBK;
  static constexpr int kStages = kNumStages < kKSlabs ? kNumStages : kKSlabs < 2 ? 2 : kKSlabs;
  // 16-bit: dense swizzled tiles; tf32: padded rows (see fragments::Padded; its occupancy is the same either
  // way, 6 blocks an SM by its 33-37 KB of shared memory).
  static constexpr bool kSwizzle = sizeof(T) == 2;
  using XLayout = std::conditional_t<kSwizzle, fragments::Swizzled<kBK, sizeof(T)>, fragments::Padded<kBK + 4>>;
  using WLayout = std::conditional_t<kSwizzle, fragments::Swizzled<kBN, sizeof(T)>, fragments::Padded<kBN + 8>>;
  // The epilogue's staging tile [kBM][kBN] of StageT, laid out like the loads.
  using YLayout = std::conditional_t<kSwizzle, fragments::Swizzled<kBN, sizeof(StageT)>, fragments::Padded<kBN + 8>>;
  static constexpr int kXStage = kBM * (kSwizzle ? kBK : kBK + 4), kWStage = kBK * (kSwizzle ? kBN : kBN + 8);
  static constexpr int kLoadBytes = kStages * (kXStage + kWStage) * static_cast<int>(sizeof(T));
  static constexpr int kStoreBytes = kBM * (kSwizzle ? kBN : kBN + 8) * static_cast<int>(sizeof(StageT));
  static constexpr int kSmemBytes = kLoadBytes > kStoreBytes ? kLoadBytes : kStoreBytes;
  static_assert(K % kBK == 0 && N % kBN == 0, "K must be a multiple of 32 and N of 64");
  static_assert(kStages >= 2, "at least double buffering");
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory");
};

// The block of segment_gemm that a tile of kBM rows x kBN output columns is: rows row_begin .. row_begin + rows
// (rows 0 when the block has none: the grid over-approximates the tile count), columns n0 .. n0 + kBN.
struct GemmTile {
  int64_t row_begin;
  int rows;
  int n0;
};

// The shared memory of one segment_gemm block: the cp.async ring of X and W slabs, reused as the staging tile.
template <class Cfg>
struct GemmSmem {
  alignas(128) unsigned char bytes[Cfg::kSmemBytes];
  float row_scale[Cfg::kBM];
  // The staged tile [kBM x kBN] of StageT (laid out by YLayout: stage(r, c) is row r's element c).
  __device__ typename Cfg::StageT& stage(int r, int c) {
    return reinterpret_cast<typename Cfg::StageT*>(bytes)[Cfg::YLayout::offset(r, c)];
  }
};

// Computes block `block`'s tile, scales its rows, stages it in shared memory (GemmSmem::stage) and hands it to
// `staged(tile)`, which every thread of the block runs: segment_gemm_kernel stores the tile; a fused kernel may
// consume it instead. `issued(tile)` runs once the first slabs' copies are in flight (a fused kernel starts its own
// loads there, under the GEMM's; cp.async groups it commits are waited for with the GEMM's). A block without rows
// (the grid over-approximates the tile count) runs neither. Every thread of the block calls it.
struct NoLoads {
  __device__ void operator()(const GemmTile&) const {}
};
template <class Cfg, class Issued, class Staged>
__device__ inline void segment_gemm_tile(const SegmentGemmArgs<typename Cfg::T, typename Cfg::OutT, typename Cfg::WT>& a,
                                         int64_t block,
                                         GemmSmem<Cfg>& sm, Issued&& issued, Staged&& staged) {
  using T = typename Cfg::T;
  using StageT = typename Cfg::StageT;
  using XL = typename Cfg::XLayout;
  using WL = typename Cfg::WLayout;
  using YL = typename Cfg::YLayout;
  constexpr int K = Cfg::K, N = Cfg::N, kStages = Cfg::kStages;
  constexpr int kThreads = Cfg::kThreads, kBM = Cfg::kBM, kBN = Cfg::kBN, kBK = Cfg::kBK, kVec = Cfg::kVec;
  T* const xs = reinterpret_cast<T*>(sm.bytes);  // [kStages][kBM x kBK swizzled]
  T* const ws = xs + kStages * Cfg::kXStage;     // [kStages][kBK x kBN swizzled]
  float* const row_scale = sm.row_scale;

  const int64_t tile = block / Cfg::kNTiles;
  const int n0 = static_cast<int>(block % Cfg::kNTiles) * kBN;
  // The tile's segment and its first tile (one segment, numbered from 0, without tile offsets); the grid may
  // over-approximate the tile count.
  int type = 0;
  int64_t first_tile = 0;
  if (a.tile_ptr) {
    if (tile >= a.tile_ptr[a.num_segments]) return;
    type = find_segment(a.tile_ptr, a.num_segments, tile);
    first_tile = a.tile_ptr[type];
  } else if (tile * kBM >= a.num_rows) {
    return;
  }
  const int64_t seg_begin = a.seg_ptr ? a.seg_ptr[type] : 0, seg_end = a.seg_ptr ? a.seg_ptr[type + 1] : a.num_rows;
  const int64_t row_begin = seg_begin + (tile - first_tile) * kBM;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kBM), seg_end - row_begin));
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / Cfg::kWarpsN, wn = warp % Cfg::kWarpsN;

  // Each thread copies one 16-byte column of X for kXPasses rows: the gathered row addresses stay fixed
  // over the k slabs, so the gather list is read once.
  constexpr int kXChunks = kBK / kVec, kXRowsPerPass = kThreads / kXChunks, kXPasses = kBM / kXRowsPerPass;
  static_assert(kBM % kXRowsPerPass == 0);
  const int xc = tid % kXChunks, xr = tid / kXChunks;
  const T* x_src[kXPasses];
  bool x_valid[kXPasses];
#pragma unroll
  for (int i = 0; i < kXPasses; ++i) {
    const int r = xr + i * kXRowsPerPass;
    x_valid[i] = r < rows;
    const int64_t row = row_begin + r;
    const int64_t x_row = !x_valid[i] ? 0 : a.gather ? static_cast<int64_t>(a.gather[row]) : row;
    x_src[i] = a.x + x_row * K + xc * kVec;
  }
  constexpr int kWChunks = kBN / kVec, kWRowsPerPass = kThreads / kWChunks, kWPasses = kBK / kWRowsPerPass;
  static_assert(kWRowsPerPass >= 1 && kBK % kWRowsPerPass == 0);
  const int wc = tid % kWChunks, wr = tid / kWChunks;
  const typename Cfg::WT* const w_src =
      a.w + static_cast<int64_t>(type) * K * N + static_cast<int64_t>(wr) * N + n0 + wc * kVec;

  auto load_slab = [&](int slab, int stage) {
    T* const xs_s = xs + stage * Cfg::kXStage;
    T* const ws_s = ws + stage * Cfg::kWStage;
#pragma unroll
    for (int i = 0; i < kXPasses; ++i) {
      cp_async_16(xs_s + XL::offset(xr + i * kXRowsPerPass, xc * kVec), x_src[i] + slab * kBK, x_valid[i]);
    }
#pragma unroll
    for (int i = 0; i < kWPasses; ++i) {
      copy_16(ws_s + WL::offset(wr + i * kWRowsPerPass, wc * kVec),
              w_src + static_cast<int64_t>(slab * kBK + i * kWRowsPerPass) * N, true);
    }
  };

  const fragments::RowCol pa = a_lane_position<T, false>(lane), pb = b_lane_position<T>(lane);
  const int a_lane = XL::offset(wm * 32 + pa.row, pa.col), b_lane = WL::offset(pb.row, wn * 32 + pb.col);
  float acc[2][4][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < Cfg::kKSlabs) load_slab(s, s);
    cp_async_commit();
  }
  issued(GemmTile{row_begin, rows, n0});
  for (int slab = 0; slab < Cfg::kKSlabs; ++slab) {
    cp_async_wait<kStages - 2>();  // slab's copies have landed (for this thread) ...
    __syncthreads();               // ... for every thread, and slab - 1's stage is free again
    const int next = slab + kStages - 1;
    if (next < Cfg::kKSlabs) load_slab(next, next % kStages);
    cp_async_commit();
    const T* const xs_s = xs + (slab % kStages) * Cfg::kXStage;
    const T* const ws_s = ws + (slab % kStages) * Cfg::kWStage;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += kMmaK<T>) {
      warp_mma_step<T, false, Cfg::kMath>(acc, xs_s, XL{}, a_lane, ws_s, WL{}, b_lane, kk);
    }
  }
  cp_async_wait<0>();
  for (int r = tid; r < kBM; r += kThreads) row_scale[r] = a.scale && r < rows ? a.scale[row_begin + r] : 1.f;
  __syncthreads();

  // Scale, convert and stage the tile in shared memory (swizzled like the loads: the fragment writes and the
  // 16-byte row reads are both conflict-free).
  StageT* const ys = reinterpret_cast<StageT*>(sm.bytes);  // [kBM x kBN swizzled]
  const int g = lane / 4, t = lane % 4;
  const int y_lane = YL::offset(wm * 32 + g, wn * 32 + 2 * t);  // c0 c1 of the first 16 x 8 tile
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float s = row_scale[wm * 32 + mt * 16 + g + 8 * h];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        *reinterpret_cast<typename Pair<StageT>::type*>(ys + YL::displace(y_lane, mt * 16 + 8 * h, nt * 8)) =
            Pair<StageT>::make(acc[mt][nt][2 * h] * s, acc[mt][nt][2 * h + 1] * s);
      }
    }
  }
  __syncthreads();
  staged(GemmTile{row_begin, rows, n0});
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    segment_gemm_kernel(const SegmentGemmArgs<typename Cfg::T, typename Cfg::OutT, typename Cfg::WT> a) {
  using OutT = typename Cfg::OutT;
  using StageT = typename Cfg::StageT;
  using YL = typename Cfg::YLayout;
  constexpr int N = Cfg::N, kThreads = Cfg::kThreads, kBN = Cfg::kBN;
  __shared__ GemmSmem<Cfg> sm;
  segment_gemm_tile<Cfg>(a, blockIdx.x, sm, NoLoads{}, [&](const GemmTile& tile) {
    // The staged tile's 16-byte row chunks: row stores (or vector atomics, or read-add-stores of the output's
    // elements).
    const StageT* const ys = reinterpret_cast<const StageT*>(sm.bytes);
    constexpr int kYVec = 16 / sizeof(StageT), kYChunks = kBN / kYVec;
    for (int i = threadIdx.x; i < tile.rows * kYChunks; i += kThreads) {
      const int r = i / kYChunks, c = i % kYChunks * kYVec;
      const int64_t row = tile.row_begin + r;
      const int64_t y_row = a.scatter ? static_cast<int64_t>(a.scatter[row]) : row;
      OutT* const dst = a.y + y_row * N + tile.n0 + c;
      const uint4 v = *reinterpret_cast<const uint4*>(ys + YL::offset(r, c));
      if constexpr (Cfg::kEpi == Epilogue::kAtomic) {
        atomic_add_float4(reinterpret_cast<float*>(dst), *reinterpret_cast<const float4*>(&v));
      } else if constexpr (Cfg::kEpi == Epilogue::kAccumulate) {
        // kYVec (4) fp32 sums: 16 bytes of an fp32 output, 8 of a 16-bit one.
        using Raw = std::conditional_t<sizeof(OutT) == 4, uint4, uint2>;
        Raw raw = *reinterpret_cast<const Raw*>(dst);
        OutT* const out = reinterpret_cast<OutT*>(&raw);
        const float* const add = reinterpret_cast<const float*>(&v);
#pragma unroll
        for (int j = 0; j < kYVec; ++j) out[j] = from_float<OutT>(to_float(out[j]) + add[j]);
        *reinterpret_cast<Raw*>(dst) = raw;
      } else {
        *reinterpret_cast<uint4*>(dst) = v;
      }
    }
  });
}

// The benchmarked configuration: 64-row tiles (2 x 2 warps), up to 3 stages for 16-bit types, 2 for tf32, and
// the register cap of kForwardMinBlocks blocks an SM (tf32: 6, its 37 KB of shared memory allow no more). The
// tile_ptr passed in must be built for kForwardTileRows rows per tile (or be null, for one segment without seg_ptr).
constexpr int kForwardWarpsM = 2;
constexpr int kForwardTileRows = 32 * kForwardWarpsM;
template <class T> constexpr int kForwardMinBlocks = 9;
template <> constexpr int kForwardMinBlocks<float> = 6;
// fp32's split operands need more registers than 6 blocks an SM leave (80: 40 bytes of spills; 107 uncapped);
// 5 leave 96 (24 bytes of spills on sm_90, none on sm_80): more warps to hide the loads than 4 would keep.
constexpr int kSplitForwardMinBlocks = 5;
template <class T, int K, int N, Epilogue kEpi, class OutT = DefaultOutT<T, kEpi>, Fp32Math kMath = Fp32Math::kTf32,
          class WT = T>
using ForwardConfig =
    SegmentGemm<T, K, N, kForwardWarpsM, sizeof(T) == 4 ? 2 : 3, kEpi,
                kMath == Fp32Math::kSplitTf32 ? kSplitForwardMinBlocks : kForwardMinBlocks<T>, OutT, kMath, WT>;

// WT is deduced from the arguments (SegmentGemmArgs' third type): T unless the GEMM widens 16-bit weights.
template <class T, int K, int N, Epilogue kEpi, class OutT = DefaultOutT<T, kEpi>, Fp32Math kMath = Fp32Math::kTf32,
          class WT = T>
void launch_segment_gemm(const SegmentGemmArgs<T, typename ForwardConfig<T, K, N, kEpi, OutT, kMath, WT>::OutT, WT>& a,
                         cudaStream_t stream) {
  using Cfg = ForwardConfig<T, K, N, kEpi, OutT, kMath, WT>;
  if (a.num_rows == 0) return;
  // an upper bound without tile offsets to read back (no host sync); exact for one segment without them
  const int64_t tiles = a.tile_ptr ? max_segment_tiles(a.num_rows, a.num_segments, Cfg::kBM)
                                   : (a.num_rows + Cfg::kBM - 1) / Cfg::kBM;
  segment_gemm_kernel<Cfg><<<static_cast<unsigned>(tiles * Cfg::kNTiles), Cfg::kThreads, 0, stream>>>(a);
}

// ---- transposed weights -------------------------------------------------------------------------------------
//
// wt[s] = w[s]^T for each of num_segments matrices: w [num_segments][rows][cols] -> wt [num_segments][cols][rows].
// The input gradients of the backward (Y = X W^T, W stored [n][k] per segment) transpose their weights with it
// per call into a workspace: wt is [k][n], the B operand of launch_segment_gemm<T, k, n>, which then runs
// unchanged. 32 x 32 tiles through shared memory (one padding column: conflict-free), coalesced reads and
// writes; 256 threads (32 x 8) a tile, one block per tile and segment.
template <class T>
__global__ void __launch_bounds__(256)
    transpose_segments_kernel(const T* __restrict__ w, T* __restrict__ wt, int num_segments, int rows, int cols) {
  __shared__ T tile[32][33];
  const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
  for (int64_t seg = blockIdx.z; seg < num_segments; seg += gridDim.z) {  // grid z is capped at 65535
    const T* const in = w + seg * rows * cols;
    T* const out = wt + seg * rows * cols;
    for (int i = threadIdx.y; i < 32; i += 8) {
      const int r = r0 + i, c = c0 + static_cast<int>(threadIdx.x);
      if (r < rows && c < cols) tile[i][threadIdx.x] = in[static_cast<int64_t>(r) * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
      const int c = c0 + i, r = r0 + static_cast<int>(threadIdx.x);
      if (r < rows && c < cols) out[static_cast<int64_t>(c) * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();  // the tile is rewritten for the next segment
  }
}

template <class T>
cudaError_t launch_transpose_segments(const T* w, T* wt, int num_segments, int rows, int cols, cudaStream_t stream) {
  if (num_segments < 1 || rows < 1 || cols < 1) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((cols + 31) / 32), static_cast<unsigned>((rows + 31) / 32),
                  static_cast<unsigned>(std::min(num_segments, 65535)));
  transpose_segments_kernel<T><<<grid, dim3(32, 8), 0, stream>>>(w, wt, num_segments, rows, cols);
  return cudaGetLastError();
}

// ---- deterministic scatter-add: destination-sorted segment sum ----------------------------------------------
//
// Y[v] = sum over the edges e with dst[e] = v of scale[e] * X[src[e]] * W[etype[e]], in a fixed order, without
// atomics (issue 8, item 4). Edges are sorted by relation, so one destination's edges span several segments
// (and blocks): a fixed-order sum needs its terms materialised. Two launches:
//   1. the segment GEMM with the store epilogue and the scatter list dst_pos: the row of edge e lands at
//      E[dst_pos[e]], its position in the destination-sorted order (stable: ties in edge order). E holds the
//      per-edge rows in the storage type T, so they are written and read once each (2 * M * N * sizeof(T) bytes
//      more than the fused atomic version, which instead pays a 4-byte read-modify-write per element in L2).
//   2. csr_segment_sum: Y[v] = sum of E[dst_ptr[v] .. dst_ptr[v + 1]) in row order, fp32 accumulation, each
//      thread one 16-byte column of one destination. E is read as a stream, Y written once (no zeroing).
// Both are deterministic: every value is computed by one thread in an order fixed by the graph alone, so two
// runs are bit-identical. dst_pos and dst_ptr come from the graph's preprocessing (a stable counting sort by
// destination), like tile_ptr.
template <class T, int N>
__global__ void __launch_bounds__(256)
    csr_segment_sum_kernel(const T* __restrict__ e, const int32_t* __restrict__ dst_ptr, float* __restrict__ y,
                           int64_t num_nodes) {
  constexpr int kVec = 16 / sizeof(T), kChunks = N / kVec;
  static_assert(N % kVec == 0);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_nodes * kChunks) return;
  const int64_t v = i / kChunks;
  const int c = static_cast<int>(i % kChunks) * kVec;
  const int64_t begin = dst_ptr[v], end = dst_ptr[v + 1];
  float acc[kVec] = {};
  auto add = [&](const uint4& raw) {
    const T* const p = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[k] += to_float(p[k]);
  };
  int64_t j = begin;
  // four rows in flight at a time, added in row order (streaming loads: E is read once)
  for (; j + 4 <= end; j += 4) {
    uint4 raw[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) raw[q] = __ldcs(reinterpret_cast<const uint4*>(e + (j + q) * N + c));
#pragma unroll
    for (int q = 0; q < 4; ++q) add(raw[q]);
  }
  for (; j < end; ++j) add(__ldcs(reinterpret_cast<const uint4*>(e + j * N + c)));
  float4* const dst = reinterpret_cast<float4*>(y + v * N + c);
#pragma unroll
  for (int k = 0; k < kVec; k += 4) dst[k / 4] = make_float4(acc[k], acc[k + 1], acc[k + 2], acc[k + 3]);
}

template <class T, int N>
void launch_csr_segment_sum(const T* e, const int32_t* dst_ptr, float* y, int64_t num_nodes, cudaStream_t stream) {
  const int64_t threads = num_nodes * (N / (16 / static_cast<int>(sizeof(T))));
  if (threads == 0) return;
  csr_segment_sum_kernel<T, N><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(e, dst_ptr, y,
                                                                                                 num_nodes);
}

// ---- weight gradient: split-K over fixed row chunks -------------------------------------------------------

// Each block computes one 64 x 64 tile of dW[type] over one chunk of chunk_rows rows of the segment (chunk_ptr
// numbers the chunks of every segment, like tile_ptr) and writes it to partial[chunk]. 2 x 2 warps; the rows
// are the reduction dimension, in slabs of 32. T is the tiles' (and MMAs') type: WgradMathT of the operands.
template <class XT, class DyT>
using WgradMathT = std::conditional_t<std::is_same_v<XT, DyT>, XT, float>;

template <class T, int K, int N, int kStages>
struct Wgrad {
  static constexpr int kThreads = 128;
  static constexpr int kBM = 64, kBN = 64, kBR = 32;
  static constexpr int kVec = 16 / sizeof(T);
  static constexpr int kStride = 64 + 8;  // X slab [kBR][k], dY slab [kBR][n]
  static constexpr int kStage = kBR * kStride;
  static constexpr int kKTiles = K / kBM, kNTiles = N / kBN;
  static_assert(K % kBM == 0 && N % kBN == 0, "K and N must be multiples of 64");
  static_assert(2 * kStages * kStage * sizeof(T) <= 48 * 1024, "static shared memory");
};

template <class Cfg, class XT, class DyT, int K, int N, int kStages, Fp32Math kMath = Fp32Math::kTf32>
__global__ void __launch_bounds__(Cfg::kThreads)
    wgrad_partial_kernel(const WgradArgs<XT, DyT> a, const int32_t* __restrict__ chunk_ptr, int chunk_rows,
                         float* __restrict__ partial) {
  using T = WgradMathT<XT, DyT>;
  static_assert(std::is_same_v<XT, DyT> || kMath == Fp32Math::kTf32, "widened operands multiply in tf32");
  constexpr int kThreads = Cfg::kThreads, kBR = Cfg::kBR, kVec = Cfg::kVec, kStride = Cfg::kStride;
  __shared__ alignas(16) T xs[kStages][kBR][kStride];
  __shared__ alignas(16) T ds[kStages][kBR][kStride];

  constexpr int kTiles = Cfg::kKTiles * Cfg::kNTiles;
  const int64_t chunk = blockIdx.x / kTiles;
  const int k0 = static_cast<int>(blockIdx.x % kTiles % Cfg::kKTiles) * Cfg::kBM;
  const int n0 = static_cast<int>(blockIdx.x % kTiles / Cfg::kKTiles) * Cfg::kBN;
  if (chunk >= chunk_ptr[a.num_segments]) return;  // the grid over-approximates the chunk count
  const RowRange rows = chunk_row_range(chunk_ptr, a.seg_ptr, a.num_segments, a.num_rows, chunk_rows, chunk);
  const int64_t row_begin = rows.begin, row_end = rows.end;
  const int num_slabs = static_cast<int>((row_end - row_begin + kBR - 1) / kBR);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / 2, wn = warp % 2;

  constexpr int kChunks = 64 / kVec, kRowsPerPass = kThreads / kChunks, kPasses = kBR / kRowsPerPass;
  static_assert(kBR % kRowsPerPass == 0);
  const int cc = tid % kChunks, cr = tid / kChunks;

  auto load_slab = [&](int slab, int stage) {
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = cr + i * kRowsPerPass;
      const int64_t row = row_begin + static_cast<int64_t>(slab) * kBR + r;
      const bool valid = row < row_end;
      const int64_t x_row = !valid ? 0 : a.gather ? static_cast<int64_t>(a.gather[row]) : row;
      const int64_t d_row = !valid ? 0 : a.scatter ? static_cast<int64_t>(a.scatter[row]) : row;
      copy_16(&xs[stage][r][cc * kVec], a.x + x_row * K + k0 + cc * kVec, valid);
      copy_16(&ds[stage][r][cc * kVec], a.dy + d_row * N + n0 + cc * kVec, valid);
    }
  };
  // The per-row scalar multiplies dY in shared memory, each thread on the vectors it copied itself.
  auto scale_slab = [&](int slab, int stage) {
    if (!a.scale) return;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
      const int r = cr + i * kRowsPerPass;
      const int64_t row = row_begin + static_cast<int64_t>(slab) * kBR + r;
      if (row >= row_end) continue;
      const float s = a.scale[row];
      T* const p = &ds[stage][r][cc * kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) p[j] = from_float<T>(to_float(p[j]) * s);
    }
  };

  using Layout = fragments::Padded<kStride>;
  constexpr Layout layout{};
  const fragments::RowCol pa = a_lane_position<T, true>(lane), pb = b_lane_position<T>(lane);
  const int a_lane = layout.offset(pa.row, wm * 32 + pa.col), b_lane = layout.offset(pb.row, wn * 32 + pb.col);
  float acc[2][4][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_slabs) load_slab(s, s);
    cp_async_commit();
  }
  for (int slab = 0; slab < num_slabs; ++slab) {
    cp_async_wait<kStages - 2>();
    scale_slab(slab, slab % kStages);
    __syncthreads();
    const int next = slab + kStages - 1;
    if (next < num_slabs) load_slab(next, next % kStages);
    cp_async_commit();
    const int stage = slab % kStages;
#pragma unroll
    for (int kk = 0; kk < kBR; kk += kMmaK<T>) {
      warp_mma_step<T, true, kMath>(acc, &xs[stage][0][0], layout, a_lane, &ds[stage][0][0], layout, b_lane, kk);
    }
  }
  cp_async_wait<0>();

  float* const out = partial + chunk * K * N;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int k = k0 + wm * 32 + mt * 16 + g + 8 * h;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int n = n0 + wn * 32 + nt * 8 + 2 * t;
        *reinterpret_cast<float2*>(out + static_cast<int64_t>(k) * N + n) =
            make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
    }
  }
}

// dW[t] (+)= sum of partial[c] for c in chunk_ptr[t]..chunk_ptr[t+1], in that order; 4 elements a thread.
template <int K, int N>
__global__ void __launch_bounds__(256)
    wgrad_reduce_kernel(const float* __restrict__ partial, const int32_t* __restrict__ chunk_ptr,
                        float* __restrict__ dw, int num_segments, bool accumulate) {
  constexpr int64_t kQuads = K * N / 4;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= num_segments * kQuads) return;
  const int type = static_cast<int>(i / kQuads);
  const int64_t e = i % kQuads * 4;
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int c = chunk_ptr[type]; c < chunk_ptr[type + 1]; ++c) {
    const float4 p = *reinterpret_cast<const float4*>(partial + static_cast<int64_t>(c) * K * N + e);
    sum.x += p.x;
    sum.y += p.y;
    sum.z += p.z;
    sum.w += p.w;
  }
  float4* const dst = reinterpret_cast<float4*>(dw + type * K * N + e);
  if (accumulate) {
    const float4 old = *dst;
    sum.x += old.x;
    sum.y += old.y;
    sum.z += old.z;
    sum.w += old.w;
  }
  *dst = sum;
}

// The fixed partition and the chunk count's bound are hectorgen/segments.cuh's (shared with the SIMT kernel).
using hectorgen::wgrad_chunk_rows;
using hectorgen::wgrad_max_chunks;

// First half of the weight gradient: partial[chunk] for every chunk (chunk_ptr from launch_segment_tile_ptr with
// chunk_rows = wgrad_chunk_rows(num_rows, K / 64 * N / 64)); a.dw is not touched. hectorgen::launch_reduce_partials
// (or the K x N specialised wgrad_reduce_kernel of launch_wgrad) adds the chunks of each segment in order.
// DyT is deduced from the arguments: XT's, or (with one of them fp32) the other operand's type.
template <class XT, int K, int N, Fp32Math kMath = Fp32Math::kTf32, class DyT = XT>
cudaError_t launch_wgrad_partials(const WgradArgs<XT, DyT>& a, const int32_t* chunk_ptr, int chunk_rows, float* partial,
                                  cudaStream_t stream) {
  using T = WgradMathT<XT, DyT>;
  constexpr int kStages = sizeof(T) == 4 ? 2 : 3;
  using Cfg = Wgrad<T, K, N, kStages>;
  if (a.num_rows <= 0) return cudaSuccess;
  const int64_t blocks = wgrad_max_chunks(a.num_rows, a.num_segments, chunk_rows) * Cfg::kKTiles * Cfg::kNTiles;
  if (blocks > kMaxGridX) return cudaErrorInvalidConfiguration;  // never a truncated grid
  wgrad_partial_kernel<Cfg, XT, DyT, K, N, kStages, kMath>
      <<<static_cast<unsigned>(blocks), Cfg::kThreads, 0, stream>>>(a, chunk_ptr, chunk_rows, partial);
  return cudaGetLastError();
}

template <class XT, int K, int N, Fp32Math kMath = Fp32Math::kTf32, class DyT = XT>
void launch_wgrad(const WgradArgs<XT, DyT>& a, const int32_t* chunk_ptr, int chunk_rows, float* partial, bool accumulate,
                  cudaStream_t stream) {
  launch_wgrad_partials<XT, K, N, kMath>(a, chunk_ptr, chunk_rows, partial, stream);
  const int64_t threads = static_cast<int64_t>(a.num_segments) * K * N / 4;
  wgrad_reduce_kernel<K, N>
      <<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(partial, chunk_ptr, a.dw, a.num_segments,
                                                                         accumulate);
}

}  // namespace hectorgen::tc
