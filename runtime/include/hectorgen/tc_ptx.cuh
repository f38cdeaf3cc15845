// Device building blocks of the tensor-core kernels (hectorgen/tc_gemm.cuh): storage-type conversions, the PTX
// wrappers (cp.async, ldmatrix, mma.sync m16n8k16 / m16n8k8) and small helpers. sm_80 and later; header-only CUDA.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace hectorgen::tc {

// ---- conversions -----------------------------------------------------------------------------------------

template <class T> __host__ __device__ inline float to_float(T v);
template <> __host__ __device__ inline float to_float<float>(float v) { return v; }
template <> __host__ __device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __host__ __device__ inline float to_float<__half>(__half v) { return __half2float(v); }

template <class T> __host__ __device__ inline T from_float(float v);
template <> __host__ __device__ inline float from_float<float>(float v) { return v; }
template <> __host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __host__ __device__ inline __half from_float<__half>(float v) { return __float2half(v); }

// ---- PTX wrappers (sm_80 and later) ------------------------------------------------------------------------

__device__ inline uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy that bypasses L1; copies zeros instead when !valid (src is not read then).
__device__ inline void cp_async_16(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// 16 bytes of a shared-memory tile of T from `src`, whose elements are S: a cp.async when S is T; else (T float, S
// a 16-bit type: a 16-bit model's fp32 gradients meeting its 16-bit weights or activations) the 4 elements are
// loaded through registers and widened, exactly, for tf32 MMAs. Zeros when !valid (src is not read then). The
// widened copy is a plain shared-memory store: the kernels write a stage only once every warp is done reading it
// (the __syncthreads that precedes each slab's loads), and read it after the next one, as for the cp.async ring.
template <class T, class S>
__device__ inline void copy_16(T* dst, const S* src, bool valid) {
  if constexpr (std::is_same_v<T, S>) {
    cp_async_16(dst, src, valid);
  } else {
    static_assert(std::is_same_v<T, float> && sizeof(S) == 2, "only 16-bit elements are widened, into fp32 tiles");
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (valid) {
      const uint2 raw = *reinterpret_cast<const uint2*>(src);
      const S* const e = reinterpret_cast<const S*>(&raw);
      v = make_float4(to_float(e[0]), to_float(e[1]), to_float(e[2]), to_float(e[3]));
    }
    *reinterpret_cast<float4*>(dst) = v;
  }
}
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices; lane i gives the address of row i % 8 of matrix i / 8; register j holds matrix j.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d += a * b for one 16x8 tile: m16n8k16 (16-bit operands) or m16n8k8 (tf32), fp32 accumulators.
template <class T>
__device__ inline void mma_16x8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ inline void mma_16x8<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ inline void mma_16x8<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ inline void mma_16x8<float>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// fp32 -> tf32 bits, rounded to nearest (the mma would otherwise truncate the low mantissa bits).
__device__ inline uint32_t to_tf32(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return r;
}

// v as a tf32 head (v rounded to tf32) and a tf32 tail (what the head leaves out, rounded to tf32): head + tail
// keeps 22 of v's 24 significand bits, so head_a * head_b + head_a * tail_b + tail_a * head_b is the product to
// about fp32's precision (the tail * tail term lies below it). The "3xTF32" of dtype fp32 (tc_gemm.cuh, Fp32Math).
__device__ inline void split_tf32(float v, uint32_t& head, uint32_t& tail) {
  head = to_tf32(v);
  tail = to_tf32(v - __uint_as_float(head));
}

// Two fp32 values as one 32-bit pair of T (for the 16-bit types) for staging stores.
template <class T> struct Pair;
template <> struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  __device__ static type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <> struct Pair<__half> {
  using type = __half2;
  __device__ static type make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <> struct Pair<float> {
  using type = float2;
  __device__ static type make(float a, float b) { return make_float2(a, b); }
};

// Adds a 16-byte vector of four floats to global memory (one vector atomic on sm_90, four scalars before).
__device__ inline void atomic_add_float4(float* dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(dst), v);
#else
  atomicAdd(dst + 0, v.x);
  atomicAdd(dst + 1, v.y);
  atomicAdd(dst + 2, v.z);
  atomicAdd(dst + 3, v.w);
#endif
}

// The last segment s with first[s] <= item (first is a prefix sum of length num_segments + 1).
__device__ inline int find_segment(const int32_t* __restrict__ first, int num_segments, int64_t item) {
  int lo = 0, hi = num_segments - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= item) lo = mid; else hi = mid - 1;
  }
  return lo;
}

}  // namespace hectorgen::tc
