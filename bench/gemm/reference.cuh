// Random inputs and float64 references, all on the device (the largest case has 21M rows): simple kernels, no
// libraries. The references read the same stored (rounded) inputs as the kernel under test, so the error
// measures the kernel's arithmetic, not the input rounding.
#pragma once

#include "common.cuh"

namespace gemm_bench::ref {

// Counter-based random numbers: the same (seed, i) always gives the same value, whatever the launch shape.
__host__ __device__ inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__host__ __device__ inline float uniform(uint64_t seed, uint64_t i, float lo, float hi) {
  const float u = static_cast<float>(mix(seed * 0x100000001B3ull + i) >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

template <class T>
__global__ void fill_uniform(T* out, int64_t count, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_float<T>(uniform(seed, i, lo, hi));
  }
}

__global__ void fill_index(int32_t* out, int64_t count, uint64_t seed, int32_t bound) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int32_t>(mix(seed * 0x100000001B3ull + i) % static_cast<uint64_t>(bound));
  }
}

// The quiet NaN bit pattern in every element (bytes 0xFF: a NaN in fp32, bf16 and fp16 alike).
template <class T>
void poison(T* p, int64_t count, cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(p, 0xFF, count * sizeof(T), stream));
}

__global__ void row_types(const int32_t* __restrict__ seg_ptr, int num_segments, int32_t* __restrict__ type,
                          int64_t num_rows) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < num_rows;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    type[i] = find_segment(seg_ptr, num_segments, i);
  }
}

// Sums of squares: sums[0] += (out - ref)^2, sums[1] += ref^2, sums[2] += number of non-finite outputs.
__device__ inline void add_error(double* sums, double d2, double r2, double bad) {
  for (int off = 16; off > 0; off /= 2) {
    d2 += __shfl_down_sync(0xffffffffu, d2, off);
    r2 += __shfl_down_sync(0xffffffffu, r2, off);
    bad += __shfl_down_sync(0xffffffffu, bad, off);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&sums[0], d2);
    atomicAdd(&sums[1], r2);
    atomicAdd(&sums[2], bad);
  }
}

__device__ inline void accumulate_error(double out, double ref, double& d2, double& r2, double& bad) {
  if (!isfinite(out)) {
    bad += 1.0;
  } else {
    d2 += (out - ref) * (out - ref);
  }
  r2 += ref * ref;
}

// Direct store: out[row][n] against scale[row] * sum_k x[G[row]][k] * w[type][k][n], computed here.
template <class T, class OutT>
__global__ void __launch_bounds__(256)
    check_direct(const T* __restrict__ x, const T* __restrict__ w, const OutT* __restrict__ out,
                 const int32_t* __restrict__ gather, const float* __restrict__ scale,
                 const int32_t* __restrict__ type, int64_t num_rows, int k_dim, int n_dim, double* sums) {
  double d2 = 0, r2 = 0, bad = 0;
  const int64_t total = num_rows * n_dim;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // every thread makes the same number of trips so the warp shuffles stay converged
  const int64_t trips = (total + stride - 1) / stride;
  for (int64_t trip = 0; trip < trips; ++trip) {
    const int64_t i = trip * stride + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i >= total) continue;
    const int64_t row = i / n_dim;
    const int n = static_cast<int>(i % n_dim);
    const int64_t x_row = gather ? gather[row] : row;
    const T* xr = x + x_row * k_dim;
    const T* wc = w + static_cast<int64_t>(type[row]) * k_dim * n_dim + n;
    double acc = 0;
    for (int k = 0; k < k_dim; ++k) acc += static_cast<double>(to_float(xr[k])) * to_float(wc[k * n_dim]);
    if (scale) acc *= scale[row];
    accumulate_error(to_float(out[i]), acc, d2, r2, bad);
  }
  add_error(sums, d2, r2, bad);
}

// Scatter-add reference: ref[S[row]][n] += scale[row] * (x[G[row]] * w[type])[n] in float64.
template <class T>
__global__ void __launch_bounds__(256)
    reference_scatter(const T* __restrict__ x, const T* __restrict__ w, double* __restrict__ ref,
                      const int32_t* __restrict__ gather, const int32_t* __restrict__ scatter,
                      const float* __restrict__ scale, const int32_t* __restrict__ type, int64_t num_rows,
                      int k_dim, int n_dim) {
  const int64_t total = num_rows * n_dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / n_dim;
    const int n = static_cast<int>(i % n_dim);
    const int64_t x_row = gather ? gather[row] : row;
    const T* xr = x + x_row * k_dim;
    const T* wc = w + static_cast<int64_t>(type[row]) * k_dim * n_dim + n;
    double acc = 0;
    for (int k = 0; k < k_dim; ++k) acc += static_cast<double>(to_float(xr[k])) * to_float(wc[k * n_dim]);
    if (scale) acc *= scale[row];
    atomicAdd(&ref[(scatter ? scatter[row] : row) * n_dim + n], acc);
  }
}

// Weight-gradient reference: ref[t][k][n] += sum over the rows of segment t of x[G]_k * dy[S]_n * scale, in
// float64. One block per chunk of ref_chunk_rows rows (chunk_ptr numbers them); 8 rows at a time in shared
// memory; each thread owns k_dim * n_dim / 256 outputs (at most kMaxPerThread).
template <class T>
__global__ void __launch_bounds__(256)
    reference_wgrad(const T* __restrict__ x, const T* __restrict__ dy, double* __restrict__ ref,
                    const int32_t* __restrict__ gather, const int32_t* __restrict__ scatter,
                    const float* __restrict__ scale, const int32_t* __restrict__ seg_ptr,
                    const int32_t* __restrict__ chunk_ptr, int chunk_rows, int num_segments, int k_dim, int n_dim) {
  constexpr int kRows = 8, kMaxDim = 128, kMaxPerThread = kMaxDim * kMaxDim / 256;
  __shared__ double xs[kRows][kMaxDim];
  __shared__ double ds[kRows][kMaxDim];
  const int chunk = blockIdx.x;
  if (chunk >= chunk_ptr[num_segments]) return;
  const int type = find_segment(chunk_ptr, num_segments, chunk);
  const int64_t begin = seg_ptr[type] + static_cast<int64_t>(chunk - chunk_ptr[type]) * chunk_rows;
  const int64_t end = min(begin + chunk_rows, static_cast<int64_t>(seg_ptr[type + 1]));
  const int outputs = k_dim * n_dim, per_thread = outputs / 256;
  double acc[kMaxPerThread] = {};
  for (int64_t r0 = begin; r0 < end; r0 += kRows) {
    for (int i = threadIdx.x; i < kRows * kMaxDim; i += blockDim.x) {
      const int r = i / kMaxDim, c = i % kMaxDim;
      const int64_t row = r0 + r;
      const bool valid = row < end;
      xs[r][c] = valid && c < k_dim ? to_float(x[(gather ? gather[row] : row) * k_dim + c]) : 0.0;
      ds[r][c] = valid && c < n_dim
                     ? static_cast<double>(to_float(dy[(scatter ? scatter[row] : row) * n_dim + c])) *
                           (scale ? scale[row] : 1.f)
                     : 0.0;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kMaxPerThread; ++j) {
      if (j >= per_thread) break;
      const int e = threadIdx.x + j * 256, k = e / n_dim, n = e % n_dim;
      for (int r = 0; r < kRows; ++r) acc[j] += xs[r][k] * ds[r][n];
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kMaxPerThread; ++j) {
    if (j >= per_thread) break;
    atomicAdd(&ref[static_cast<int64_t>(type) * outputs + threadIdx.x + j * 256], acc[j]);
  }
}

template <class OutT>
__global__ void __launch_bounds__(256)
    compare(const OutT* __restrict__ out, const double* __restrict__ ref, int64_t count, double* sums) {
  double d2 = 0, r2 = 0, bad = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t trips = (count + stride - 1) / stride;
  for (int64_t trip = 0; trip < trips; ++trip) {
    const int64_t i = trip * stride + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < count) accumulate_error(to_float(out[i]), ref[i], d2, r2, bad);
  }
  add_error(sums, d2, r2, bad);
}

}  // namespace gemm_bench::ref
