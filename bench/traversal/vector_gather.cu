// Microbenchmark: the RGCN compact node traversal of am (out[n] = out[n] + sum over n's incoming edges of
// norm[e] * lin[pair[e]], rows of 64 values) with G lanes per row, each lane's slots either interleaved (element
// lane + G j, one scalar load per slot: hectorgen's traversal layout up to session 14) or blocked (elements
// lane S .. lane S + S - 1, one vector load per lane). Graph: am's sizes, uniform random pairs, degrees 0..6.
// Build and run: bench/traversal/run.sh (nvcc -O3 -arch=sm_90).
#include "common.cuh"

__device__ inline float to_f(float x) { return x; }
__device__ inline float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ inline T from_f(float x);
template <> __device__ inline float from_f<float>(float x) { return x; }
template <> __device__ inline __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// S consecutive elements at p (aligned to S * sizeof(T)) as floats, in as few loads as 16-byte vectors allow.
template <class T, int S>
__device__ inline void load_block(const T* p, float (&v)[S]) {
  constexpr int kBytes = S * sizeof(T);
  if constexpr (kBytes % 16 == 0) {
    #pragma unroll
    for (int c = 0; c < kBytes / 16; ++c) {
      uint4 r = reinterpret_cast<const uint4*>(p)[c];
      const T* e = reinterpret_cast<const T*>(&r);
      #pragma unroll
      for (int i = 0; i < 16 / (int)sizeof(T); ++i) v[c * 16 / sizeof(T) + i] = to_f(e[i]);
    }
  } else if constexpr (kBytes == 8) {
    uint2 r = *reinterpret_cast<const uint2*>(p);
    const T* e = reinterpret_cast<const T*>(&r);
    #pragma unroll
    for (int i = 0; i < S; ++i) v[i] = to_f(e[i]);
  } else if constexpr (kBytes == 4) {
    uint32_t r = *reinterpret_cast<const uint32_t*>(p);
    const T* e = reinterpret_cast<const T*>(&r);
    #pragma unroll
    for (int i = 0; i < S; ++i) v[i] = to_f(e[i]);
  } else {
    #pragma unroll
    for (int i = 0; i < S; ++i) v[i] = to_f(p[i]);
  }
}

template <class T, int G, bool kBlocked>
__global__ void __launch_bounds__(256) gather(int64_t n_rows, const int* in_ptr, const int* in_eid, const int* pair,
                                              const float* norm, T* out, const T* lin) {
  constexpr int D = 64, S = D / G;
  const int lane = threadIdx.x % G;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x / G;
  for (int64_t n = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / G; n < n_rows; n += stride) {
    float acc[S];
    if (kBlocked) load_block<T, S>(out + n * D + lane * S, acc);
    else for (int j = 0; j < S; ++j) acc[j] = to_f(out[n * D + lane + G * j]);
    for (int i = in_ptr[n]; i < in_ptr[n + 1]; ++i) {
      const int e = in_eid[i];
      const int p = pair[e];
      const float w = norm[e];
      float v[S];
      if (kBlocked) load_block<T, S>(lin + (int64_t)p * D + lane * S, v);
      else {
        #pragma unroll
        for (int j = 0; j < S; ++j) v[j] = to_f(lin[(int64_t)p * D + lane + G * j]);
      }
      #pragma unroll
      for (int j = 0; j < S; ++j) acc[j] += w * v[j];
    }
    #pragma unroll
    for (int j = 0; j < S; ++j) out[n * D + (kBlocked ? lane * S + j : lane + G * j)] = from_f<T>(acc[j]);
  }
}

template <class T, int G, bool B>
float run(const char* name, int64_t N, int64_t E, int64_t P, const int* ip, const int* ie, const int* pr, const float* nm, T* out, const T* lin) {
  int blocks = 0, dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, gather<T, G, B>, 256, 0));
  const int64_t grid = std::min<int64_t>((N * G + 255) / 256, (int64_t)blocks * sms * 4);
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a)); CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int it = 0; it < 30; ++it) {
    CHECK(cudaEventRecord(a));
    gather<T, G, B><<<grid, 256>>>(N, ip, ie, pr, nm, out, lin);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t; CHECK(cudaEventElapsedTime(&t, a, b));
    if (it >= 5) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const float med = ms[ms.size() / 2];
  const double bytes = (double)E * (64 * sizeof(T) + 12) + (double)N * (2 * 64 * sizeof(T) + 4);
  printf("%-6s G=%2d %-11s %8.3f ms  %7.0f GB/s (unique bytes)\n", name, G, B ? "blocked" : "interleaved", med, bytes / med / 1e6);
  return med;
}

template <class T>
void all(const char* name, int64_t N, int64_t E, int64_t P, const int* ip, const int* ie, const int* pr, const float* nm) {
  T *out, *lin;
  CHECK(cudaMalloc(&out, N * 64 * sizeof(T)));
  CHECK(cudaMalloc(&lin, P * 64 * sizeof(T)));
  CHECK(cudaMemset(out, 0, N * 64 * sizeof(T)));
  CHECK(cudaMemset(lin, 0, P * 64 * sizeof(T)));
  run<T, 32, false>(name, N, E, P, ip, ie, pr, nm, out, lin);
  run<T, 32, true>(name, N, E, P, ip, ie, pr, nm, out, lin);
  run<T, 16, false>(name, N, E, P, ip, ie, pr, nm, out, lin);
  run<T, 16, true>(name, N, E, P, ip, ie, pr, nm, out, lin);
  run<T, 8, false>(name, N, E, P, ip, ie, pr, nm, out, lin);
  run<T, 8, true>(name, N, E, P, ip, ie, pr, nm, out, lin);
  run<T, 4, true>(name, N, E, P, ip, ie, pr, nm, out, lin);
  CHECK(cudaFree(out)); CHECK(cudaFree(lin));
}

int main() {
  const int64_t N = traversal::kAm.N, P = traversal::kAm.P;
  std::mt19937 rng(1);
  const std::vector<int> ptr = traversal::random_row_ptr(N, 6, rng);
  const int64_t E = ptr[N];
  std::vector<int> eid(E), pr(E);
  std::vector<float> nm(E, 0.5f);
  for (int64_t i = 0; i < E; ++i) { eid[i] = (int)i; pr[i] = (int)(rng() % P); }
  std::shuffle(eid.begin(), eid.end(), rng);
  int *ip, *ie, *pp; float* nmd;
  CHECK(cudaMalloc(&ip, (N + 1) * 4)); CHECK(cudaMalloc(&ie, E * 4)); CHECK(cudaMalloc(&pp, E * 4)); CHECK(cudaMalloc(&nmd, E * 4));
  CHECK(cudaMemcpy(ip, ptr.data(), (N + 1) * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(ie, eid.data(), E * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(pp, pr.data(), E * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(nmd, nm.data(), E * 4, cudaMemcpyHostToDevice));
  printf("N=%lld E=%lld pairs=%lld\n", (long long)N, (long long)E, (long long)P);
  all<__nv_bfloat16>("bf16", N, E, P, ip, ie, pp, nmd);
  all<float>("fp32", N, E, P, ip, ie, pp, nmd);
  return 0;
}
