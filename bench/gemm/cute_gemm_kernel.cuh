// (c) Forward segment GEMM on CuTe, the kernel template; cute_gemm_bf16.cu and cute_gemm_fp16.cu instantiate it
// (two translation units: CuTe compiles slowly, and the two build in parallel). The design: the same schedule as tc_gemm.cuh (64 x 64 block tiles of type-sorted rows,
// k slabs of 32, a 3-stage cp.async ring, shared-memory staged 16-byte stores), with CuTe doing the parts a
// library does well: the tiled MMA (2 x 2 warps of SM80 m16n8k16 atoms), the swizzled shared-memory layouts
// and the ldmatrix partitioning. The gathered cp.async copies address shared memory through CuTe's layouts.
#pragma once

#include <cute/tensor.hpp>

#include "cute_gemm.h"

#include <algorithm>

namespace gemm_bench::cute_impl {
namespace detail {

using namespace cute;

template <class T> struct Types;
template <> struct Types<__nv_bfloat16> {
  using Elem = cute::bfloat16_t;
  using Mma = SM80_16x8x16_F32BF16BF16F32_TN;
};
template <> struct Types<__half> {
  using Elem = cute::half_t;
  using Mma = SM80_16x8x16_F32F16F16F32_TN;
};

constexpr int kBM = kTileRows, kBN = 64, kBK = 32, kStages = 3, kThreads = 128;
constexpr int kYStride = kBN + 8;  // epilogue staging rows, padded

template <class T>
struct Config {
  using Elem = typename Types<T>::Elem;
  // 2 x 2 warps; the 32 x 32 x 16 permutation gives each warp 16 columns a step, so B loads as ldmatrix x4.
  using TiledMma = decltype(make_tiled_mma(typename Types<T>::Mma{}, Layout<Shape<_2, _2, _1>>{},
                                           Tile<_32, _32, _16>{}));
  // X tile (rows x k, k contiguous, 64-byte rows) and W tile (n x k, n contiguous), both swizzled.
  using LayoutA = decltype(tile_to_shape(composition(Swizzle<2, 3, 3>{}, Layout<Shape<_8, _32>, Stride<_32, _1>>{}),
                                         Shape<Int<kBM>, Int<kBK>, Int<kStages>>{}));
  using LayoutB = decltype(tile_to_shape(composition(Swizzle<3, 3, 3>{}, Layout<Shape<_64, _8>, Stride<_1, _64>>{}),
                                         Shape<Int<kBN>, Int<kBK>, Int<kStages>>{}));
  using CopyA = Copy_Atom<SM75_U32x4_LDSM_N, Elem>;  // ldmatrix
  using CopyB = Copy_Atom<SM75_U16x8_LDSM_T, Elem>;  // ldmatrix.trans
  static constexpr int kLoadBytes = static_cast<int>((cosize(LayoutA{}) + cosize(LayoutB{})) * sizeof(Elem));
};

template <class T, int K, int N, Epilogue kEpi>
__global__ void __launch_bounds__(kThreads) segment_gemm_kernel(const SegmentGemmArgs<T, OutT<T, kEpi>> a) {
  using Cfg = Config<T>;
  using Elem = typename Cfg::Elem;
  using Out = OutT<T, kEpi>;
  constexpr int kVec = 8;  // 16-byte copies of 16-bit elements
  constexpr int kNTiles = N / kBN, kKSlabs = K / kBK;
  static_assert(K % kBK == 0 && N % kBN == 0, "K must be a multiple of 32 and N of 64");
  constexpr int kStoreBytes = kBM * kYStride * static_cast<int>(sizeof(Out));
  __shared__ alignas(128) unsigned char smem[std::max(Cfg::kLoadBytes, kStoreBytes)];
  __shared__ float row_scale[kBM];

  Elem* const a_base = reinterpret_cast<Elem*>(smem);
  Tensor sA = make_tensor(make_smem_ptr(a_base), typename Cfg::LayoutA{});  // (BM, BK, stage)
  Tensor sB = make_tensor(make_smem_ptr(a_base + cosize(typename Cfg::LayoutA{})), typename Cfg::LayoutB{});

  const int64_t tile = blockIdx.x / kNTiles;
  const int n0 = static_cast<int>(blockIdx.x % kNTiles) * kBN;
  if (tile >= a.tile_ptr[a.num_segments]) return;
  const int type = find_segment(a.tile_ptr, a.num_segments, tile);
  const int64_t row_begin = a.seg_ptr[type] + (tile - a.tile_ptr[type]) * kBM;
  const int rows = static_cast<int>(min(static_cast<int64_t>(kBM), a.seg_ptr[type + 1] - row_begin));
  const int tid = threadIdx.x;

  // gmem -> smem: X rows through the gather list (fixed over the slabs), W rows of this type's n tile.
  constexpr int kXChunks = kBK / kVec, kXRowsPerPass = kThreads / kXChunks, kXPasses = kBM / kXRowsPerPass;
  constexpr int kWChunks = kBN / kVec, kWRowsPerPass = kThreads / kWChunks, kWPasses = kBK / kWRowsPerPass;
  const int xc = tid % kXChunks, xr = tid / kXChunks, wc = tid % kWChunks, wr = tid / kWChunks;
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
  const T* const w_src = a.w + static_cast<int64_t>(type) * K * N + static_cast<int64_t>(wr) * N + n0 + wc * kVec;
  auto load_slab = [&](int slab, int stage) {
#pragma unroll
    for (int i = 0; i < kXPasses; ++i) {
      cp_async_16(&sA(xr + i * kXRowsPerPass, xc * kVec, stage), x_src[i] + slab * kBK, x_valid[i]);
    }
#pragma unroll
    for (int i = 0; i < kWPasses; ++i) {
      cp_async_16(&sB(wc * kVec, wr + i * kWRowsPerPass, stage),
                  w_src + static_cast<int64_t>(slab * kBK + i * kWRowsPerPass) * N, true);
    }
  };

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_slice(tid);
  Tensor tCrA = thr_mma.partition_fragment_A(sA(_, _, 0));  // (MMA, MMA_M, MMA_K)
  Tensor tCrB = thr_mma.partition_fragment_B(sB(_, _, 0));  // (MMA, MMA_N, MMA_K)
  Tensor acc = partition_fragment_C(mma, Shape<Int<kBM>, Int<kBN>>{});
  clear(acc);
  auto s2r_a = make_tiled_copy_A(typename Cfg::CopyA{}, mma);
  auto s2r_thr_a = s2r_a.get_slice(tid);
  Tensor tXsA = s2r_thr_a.partition_S(sA);  // (CPY, CPY_M, CPY_K, stage)
  Tensor tXrA = s2r_thr_a.retile_D(tCrA);
  auto s2r_b = make_tiled_copy_B(typename Cfg::CopyB{}, mma);
  auto s2r_thr_b = s2r_b.get_slice(tid);
  Tensor tXsB = s2r_thr_b.partition_S(sB);
  Tensor tXrB = s2r_thr_b.retile_D(tCrB);

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kKSlabs) load_slab(s, s);
    cp_async_commit();
  }
  for (int slab = 0; slab < kKSlabs; ++slab) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = slab + kStages - 1;
    if (next < kKSlabs) load_slab(next, next % kStages);
    cp_async_commit();
    const int stage = slab % kStages;
#pragma unroll
    for (int kb = 0; kb < size<2>(tCrA); ++kb) {
      copy(s2r_a, tXsA(_, _, kb, stage), tXrA(_, _, kb));
      copy(s2r_b, tXsB(_, _, kb, stage), tXrB(_, _, kb));
      gemm(mma, tCrA(_, _, kb), tCrB(_, _, kb), acc);
    }
  }
  cp_async_wait<0>();
  if (tid < kBM) row_scale[tid] = a.scale && tid < rows ? a.scale[row_begin + tid] : 1.f;
  __syncthreads();

  // Epilogue: the accumulator's (row, column) coordinates come from an identity tensor partitioned like it.
  Out* const ys = reinterpret_cast<Out*>(smem);
  Tensor tCcC = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBM>, Int<kBN>>{}));
#pragma unroll
  for (int i = 0; i < size(acc); ++i) {
    const int r = get<0>(tCcC(i)), c = get<1>(tCcC(i));
    ys[r * kYStride + c] = from_float<Out>(acc(i) * row_scale[r]);
  }
  __syncthreads();
  constexpr int kYVec = 16 / sizeof(Out), kYChunks = kBN / kYVec;
  for (int i = tid; i < rows * kYChunks; i += kThreads) {
    const int r = i / kYChunks, c = i % kYChunks * kYVec;
    const int64_t row = row_begin + r;
    const int64_t y_row = a.scatter ? static_cast<int64_t>(a.scatter[row]) : row;
    Out* const dst = a.y + y_row * N + n0 + c;
    const uint4 v = *reinterpret_cast<const uint4*>(ys + r * kYStride + c);
    if constexpr (kEpi == Epilogue::kAtomic) {
      atomic_add_float4(reinterpret_cast<float*>(dst), *reinterpret_cast<const float4*>(&v));
    } else {
      *reinterpret_cast<uint4*>(dst) = v;
    }
  }
}

}  // namespace detail

template <class T, int K, int N, Epilogue kEpi>
void launch_segment_gemm(const SegmentGemmArgs<T, OutT<T, kEpi>>& a, cudaStream_t stream) {
  if (a.num_rows == 0) return;
  const int64_t tiles = (a.num_rows + detail::kBM - 1) / detail::kBM + a.num_segments;  // upper bound, no host sync
  detail::segment_gemm_kernel<T, K, N, kEpi>
      <<<static_cast<unsigned>(tiles * (N / detail::kBN)), detail::kThreads, 0, stream>>>(a);
}

}  // namespace gemm_bench::cute_impl

// The instances main.cu calls, for one element type.
#define GEMM_BENCH_CUTE_INSTANTIATE(T, D)                                                                     \
  template void gemm_bench::cute_impl::launch_segment_gemm<T, D, D, gemm_bench::Epilogue::kStore>(             \
      const gemm_bench::SegmentGemmArgs<T, T>&, cudaStream_t);                                               \
  template void gemm_bench::cute_impl::launch_segment_gemm<T, D, D, gemm_bench::Epilogue::kAtomic>(            \
      const gemm_bench::SegmentGemmArgs<T, float>&, cudaStream_t);
