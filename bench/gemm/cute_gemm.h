// (c) The forward segment GEMM built on CuTe (cute/ headers of CUTLASS, header-only): CuTe's MMA atoms, tiled
// MMA partitioning, ldmatrix copy atoms and swizzled shared-memory layouts; the gathered global->shared copies
// stay hand-written cp.async (CuTe has no gather iterator for SM80 copies). Compiled in its own translation
// units (cute_gemm_bf16.cu, cute_gemm_fp16.cu over cute_gemm_kernel.cuh) so that the CuTe headers
// never reach the other kernels.
#pragma once

#include <type_traits>

#include "common.cuh"

namespace gemm_bench::cute_impl {

constexpr int kTileRows = 64;  // rows per tile: tile_ptr must be built for it

template <class T, Epilogue kEpi>
using OutT = std::conditional_t<kEpi == Epilogue::kAtomic, float, T>;

// Defined for T in {__nv_bfloat16, __half}, K = N in {64, 128}, both epilogues.
template <class T, int K, int N, Epilogue kEpi>
void launch_segment_gemm(const SegmentGemmArgs<T, OutT<T, kEpi>>& a, cudaStream_t stream);

}  // namespace gemm_bench::cute_impl
