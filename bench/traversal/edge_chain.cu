// Microbenchmark: the chain of dependent loads in RGCN's compact node traversal (h[n] += norm[e] * lin[pair[e]] over
// n's incoming edges, bf16 rows of 64, 8 lanes a row, 4 rows a warp in step, 8 edges a block fetched by their lanes:
// the kernel hectorgen emits since session 15), and what shortening it would buy. Edges are numbered in relation order
// (the benchmark's graphs), so in CSR order their ids are a random permutation and each edge's norm[e] and pair[e]
// is a random 4-byte read (a 32-byte sector each).
//
//   emitted      lane l of a row fetches in_eid[i + l] and pair[e]; each step shuffles them out, then loads norm[e]
//                and the row, then adds: one edge's loads after the previous edge's sum
//   +norm        lane l fetches norm[e] too (one level shorter per step)
//   +loads first the block's up-to-8 row loads issued before any sum (unrolled, predicated)
//   +csr pair    the pair index stored in CSR order (in_pair[i] = pair[in_eid[i]], built once per graph): a
//                coalesced read instead of a random one, in parallel with in_eid
//   +csr norm    norm in CSR order too (no random 4-byte read left)
//
// Build and run: bench/traversal/run.sh (nvcc -O3 -arch=sm_90).
#include "common.cuh"

using traversal::add_row;

enum Mode { kEmitted, kNormByLane, kLoadsFirst, kCsrPair, kCsrNorm };
constexpr const char* kNames[] = {"emitted", "+norm", "+loads first", "+csr pair", "+csr norm"};

template <Mode M>
__global__ void __launch_bounds__(256) chain(int64_t n_rows, const int* __restrict__ in_ptr, const int* __restrict__ in_eid,
                                             const int* __restrict__ pair, const int* __restrict__ in_pair,
                                             const float* __restrict__ norm, const float* __restrict__ in_norm,
                                             __nv_bfloat16* __restrict__ h, const __nv_bfloat16* __restrict__ lin) {
  traversal::for_each_row(n_rows, [&](int64_t n, bool live, int lane) {
    float acc[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = 0.0f;
    add_row(acc, 1.0f, reinterpret_cast<const uint4*>(h + n * 64)[lane]);
    const int begin = in_ptr[n], end = live ? in_ptr[n + 1] : begin;
    const int todo = __reduce_max_sync(0xffffffffu, end - begin);
    for (int done = 0; done < todo; done += 8) {
      const int i0 = begin + done;
      const int steps = min(todo - done, 8), count = max(min(end - i0, 8), 0);
      int p_lane = 0;
      float w_lane = 0.0f;
      int e_lane = 0;
      if (lane < count) {
        if (M >= kCsrPair) p_lane = in_pair[i0 + lane];
        if (M == kCsrNorm) w_lane = in_norm[i0 + lane];
        else {
          e_lane = in_eid[i0 + lane];
          if (M < kCsrPair) p_lane = pair[e_lane];
          if (M >= kNormByLane) w_lane = norm[e_lane];
        }
      }
      if (M <= kNormByLane) {
        for (int j = 0; j < steps; ++j) {
          const int p = __shfl_sync(0xffffffffu, p_lane, j, 8);
          float w;
          if (M == kEmitted) w = norm[__shfl_sync(0xffffffffu, e_lane, j, 8)];
          else w = __shfl_sync(0xffffffffu, w_lane, j, 8);
          const uint4 word = reinterpret_cast<const uint4*>(lin + static_cast<int64_t>(p) * 64)[lane];
          if (j < count) add_row(acc, w, word);
        }
      } else {
        int p[8];
        float w[8];
        uint4 word[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          p[j] = __shfl_sync(0xffffffffu, p_lane, j, 8);
          w[j] = __shfl_sync(0xffffffffu, w_lane, j, 8);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (j < steps) word[j] = reinterpret_cast<const uint4*>(lin + static_cast<int64_t>(p[j]) * 64)[lane];
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (j < count) add_row(acc, w[j], word[j]);
      }
    }
    if (live) traversal::store_row(acc, h + n * 64, lane);
  });
}

struct Graph {
  int64_t N, E, P;
  int *ptr, *eid, *pair, *in_pair;
  float *norm, *in_norm;
};

template <Mode M>
float run(const Graph& g, __nv_bfloat16* h, const __nv_bfloat16* lin, float* check) {
  int blocks = 0, dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, chain<M>, 256, 0));
  const int64_t grid = std::min<int64_t>((g.N * 8 + 255) / 256, static_cast<int64_t>(blocks) * sms * 4);
  const float ms = traversal::median_ms(
      [&] { chain<M><<<grid, 256>>>(g.N, g.ptr, g.eid, g.pair, g.in_pair, g.norm, g.in_norm, h, lin); },
      [&] { CHECK(cudaMemset(h, 0, g.N * 64 * sizeof(__nv_bfloat16))); }, 35, 5);
  // Every mode must compute the same sums: compare a checksum of the output.
  std::vector<__nv_bfloat16> out(g.N * 64);
  CHECK(cudaMemcpy(out.data(), h, out.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
  double s = 0;
  for (size_t i = 0; i < out.size(); i += 7) s += __bfloat162float(out[i]);
  *check = static_cast<float>(s);
  return ms;
}

int main(int argc, char** argv) {
  printf("%-8s %-13s %9s %9s %11s\n", "graph", "kernel", "ms", "vs first", "checksum");
  for (const traversal::Case& c : {traversal::kAm, traversal::kWikikg2}) {
    std::mt19937 rng(1);
    // degrees uniform in 0 .. 2 E / N: about E edges
    const std::vector<int> ptr = traversal::random_row_ptr(c.N, static_cast<int>(2 * c.E / c.N), rng);
    const int64_t E = ptr[c.N];
    std::vector<int> eid(E), pr(E), in_pair(E);
    std::vector<float> nm(E), in_norm(E);
    for (int64_t i = 0; i < E; ++i) {
      eid[i] = static_cast<int>(i);
      pr[i] = static_cast<int>(rng() % c.P);
      nm[i] = 1.0f / static_cast<float>(1 + rng() % 4);
    }
    std::shuffle(eid.begin(), eid.end(), rng);
    for (int64_t i = 0; i < E; ++i) {
      in_pair[i] = pr[eid[i]];
      in_norm[i] = nm[eid[i]];
    }
    using traversal::upload;
    const Graph g{c.N, E, c.P, upload(ptr), upload(eid), upload(pr), upload(in_pair), upload(nm), upload(in_norm)};
    std::vector<__nv_bfloat16> lin_h(c.P * 64);
    for (auto& x : lin_h) x = __float2bfloat16(static_cast<float>(rng() % 17) / 16.0f);
    __nv_bfloat16* h = nullptr;
    CHECK(cudaMalloc(&h, c.N * 64 * sizeof(__nv_bfloat16)));
    __nv_bfloat16* lin = upload(lin_h);
    float ms[5], sum[5];
    ms[0] = run<kEmitted>(g, h, lin, &sum[0]);
    ms[1] = run<kNormByLane>(g, h, lin, &sum[1]);
    ms[2] = run<kLoadsFirst>(g, h, lin, &sum[2]);
    ms[3] = run<kCsrPair>(g, h, lin, &sum[3]);
    ms[4] = run<kCsrNorm>(g, h, lin, &sum[4]);
    for (int m = 0; m < 5; ++m)
      printf("%-8s %-13s %9.3f %8.2fx %11.1f%s\n", c.name, kNames[m], ms[m], ms[0] / ms[m], sum[m],
             sum[m] == sum[0] ? "" : "  CHECKSUM DIFFERS");
    CHECK(cudaFree(h));
    CHECK(cudaFree(lin));
    for (void* p : {static_cast<void*>(g.ptr), static_cast<void*>(g.eid), static_cast<void*>(g.pair),
                    static_cast<void*>(g.in_pair), static_cast<void*>(g.norm), static_cast<void*>(g.in_norm)})
      CHECK(cudaFree(p));
  }
  return 0;
}
