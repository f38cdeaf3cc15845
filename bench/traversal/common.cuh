// What the traversal microbenchmarks share (bench/traversal/*.cu): error checks, the graphs they walk, uploads and
// the timing loop.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

namespace traversal {

// The graphs' sizes: am 1.9M nodes, 5.7M edges, 1.9M (source, relation) pairs; wikikg2 2.5M, 16.1M, 10.1M.
struct Case {
  const char* name;
  int64_t N, E, P;
};
constexpr Case kAm{"am", 1885136, 5668682, 1900000};
constexpr Case kWikikg2{"wikikg2", 2500604, 16109182, 10100000};

// CSR row offsets of n rows whose in-degrees are uniform in 0 .. max_degree (from rng: the same graph every run).
inline std::vector<int> random_row_ptr(int64_t n, int max_degree, std::mt19937& rng) {
  std::vector<int> ptr(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) ptr[i + 1] = ptr[i] + static_cast<int>(rng() % (max_degree + 1));
  return ptr;
}

// acc[j] += w * the j-th of the 8 bf16 values in word (one lane's 16 bytes of a row).
__device__ inline void add_row(float (&acc)[8], float w, uint4 word) {
  const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&word);
#pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] += w * __bfloat162float(e[j]);
}

// The lane's 8 sums rounded to bf16 into its 16 bytes of a row of 64 (row: the row's first element).
__device__ inline void store_row(const float (&acc)[8], __nv_bfloat16* row, int lane) {
  uint4 out;
  __nv_bfloat16* o = reinterpret_cast<__nv_bfloat16*>(&out);
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = __float2bfloat16(acc[j]);
  reinterpret_cast<uint4*>(row)[lane] = out;
}

// Rows of 64 bf16 values, 8 lanes a row and 4 rows a warp in step, grid-stride: row(n, live, lane) for each of this
// thread's rows. Past the last row a group repeats it with live false, so that the warp's 4 rows stay in step
// (shuffles and warp reductions need all 32 lanes).
template <class F>
__device__ inline void for_each_row(int64_t n_rows, F&& row) {
  const int lane = threadIdx.x & 7, group = (threadIdx.x & 31) >> 3;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 3;
  const int64_t stride = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 3;
  for (int64_t warp_row = first - group; warp_row < n_rows; warp_row += stride) {
    const bool live = warp_row + group < n_rows;
    row(live ? warp_row + group : n_rows - 1, live, lane);
  }
}

// A device copy of v (freed by the caller with cudaFree).
template <class V>
typename V::value_type* upload(const V& v) {
  typename V::value_type* d = nullptr;
  CHECK(cudaMalloc(&d, v.size() * sizeof(v[0])));
  CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice));
  return d;
}

// The median CUDA-event time (ms) of `iters` calls of launch() after `warmup` untimed ones; before(), if given,
// runs ahead of each call outside the timed interval (e.g. resetting an output).
template <class F, class B>
float median_ms(F&& launch, B&& before, int iters = 40, int warmup = 5) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int it = 0; it < warmup + iters; ++it) {
    before();
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (it >= warmup) ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <class F>
float median_ms(F&& launch) {
  return median_ms(launch, [] {});
}

}  // namespace traversal
