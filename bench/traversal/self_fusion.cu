// Microbenchmark: RGCN's self GEMM fused into its node traversal (issue 8). The compact layer computes
//   h = feature . W0                                   (tensor-core GEMM, writes h)
//   h[n] += sum over n's in-edges i of in_norm[i] * lin[in_pair[i]]   (node traversal, reads h back)
// and the write and read-back of h (2 x N x 128 bytes in bf16) is what stands between am and 2x its HBM floor.
// Fused, each block computes its 64-row tile of feature . W0 on the tensor cores (tc::segment_gemm_tile, the tile
// left in shared memory in fp32) and its warps then walk the tile's nodes' in-edges starting from those rows:
// h is written once.
//
//   gemm + sum   the two kernels (the GEMM rounds h to bf16, the sum reads it back)
//   fused 64     one kernel, 64-row tiles (4 warps), the tile's 64 nodes summed by its 4 warps
//   fused 128    one kernel, 128-row tiles (8 warps)
//
// The node sum reads its edges' pairs and norms by CSR position (in_pair, in_norm), rows of 8 lanes, 4 rows a warp
// in step. Build and run: TRAVERSAL_BENCHES=self_fusion bench/traversal/run.sh.
#include <cmath>

#include "common.cuh"
#include "hectorgen/tc_gemm.cuh"

namespace tc = hectorgen::tc;
using bf16 = __nv_bfloat16;
using traversal::add_row;
using traversal::median_ms;
using traversal::upload;

struct Graph {
  int64_t N, E, P;
  const int *ptr, *in_pair;
  const float* in_norm;
  const bf16* lin;
};

// The edge loop of row n (8 lanes, this lane's 8 elements in acc), its 4 rows a warp in step; stores h[n].
__device__ inline void sum_edges(float (&acc)[8], int64_t n, bool live, int lane, const int* __restrict__ in_ptr,
                                 const int* __restrict__ in_pair, const float* __restrict__ in_norm,
                                 const bf16* __restrict__ lin, bf16* __restrict__ h) {
  const int begin = in_ptr[n], end = live ? in_ptr[n + 1] : begin;
  const int todo = __reduce_max_sync(0xffffffffu, end - begin);
  for (int done = 0; done < todo; done += 8) {
    const int i0 = begin + done;
    const int steps = min(todo - done, 8), count = max(min(end - i0, 8), 0);
    int p_lane = 0;
    float w_lane = 0.0f;
    if (lane < count) {
      p_lane = in_pair[i0 + lane];
      w_lane = in_norm[i0 + lane];
    }
    for (int j = 0; j < steps; ++j) {
      const int p = __shfl_sync(0xffffffffu, p_lane, j, 8);
      const float w = __shfl_sync(0xffffffffu, w_lane, j, 8);
      const uint4 word = reinterpret_cast<const uint4*>(lin + static_cast<int64_t>(p) * 64)[lane];
      if (j < count) add_row(acc, w, word);
    }
  }
  if (live) traversal::store_row(acc, h + n * 64, lane);
}

// The unfused node sum: starts from h[n] as the GEMM stored it.
__global__ void __launch_bounds__(256) node_sum(int64_t n_rows, const int* __restrict__ in_ptr,
                                                const int* __restrict__ in_pair, const float* __restrict__ in_norm,
                                                bf16* __restrict__ h, const bf16* __restrict__ lin) {
  traversal::for_each_row(n_rows, [&](int64_t n, bool live, int lane) {
    float acc[8];
    const uint4 self = reinterpret_cast<const uint4*>(h + n * 64)[lane];
    const bf16* s = reinterpret_cast<const bf16*>(&self);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = __bfloat162float(s[j]);
    sum_edges(acc, n, live, lane, in_ptr, in_pair, in_norm, lin, h);
  });
}

// Fused: the block's tile of feature . W0, then its nodes' edge sums.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    fused(const tc::SegmentGemmArgs<bf16, float> a, const int* __restrict__ in_ptr, const int* __restrict__ in_pair,
          const float* __restrict__ in_norm, bf16* __restrict__ h, const bf16* __restrict__ lin) {
  __shared__ tc::GemmSmem<Cfg> sm;
  tc::segment_gemm_tile<Cfg>(a, blockIdx.x, sm, tc::NoLoads{}, [&](const tc::GemmTile& tile) {
    const int lane = threadIdx.x & 7, group = (threadIdx.x & 31) >> 3, warp = threadIdx.x >> 5;
    constexpr int kWarps = Cfg::kThreads / 32;
    for (int r0 = warp * 4; r0 < tile.rows; r0 += kWarps * 4) {
      const bool live = r0 + group < tile.rows;
      const int r = live ? r0 + group : tile.rows - 1;
      float acc[8];
      const float4 c0 = *reinterpret_cast<const float4*>(&sm.stage(r, lane * 8));
      const float4 c1 = *reinterpret_cast<const float4*>(&sm.stage(r, lane * 8 + 4));
      acc[0] = c0.x, acc[1] = c0.y, acc[2] = c0.z, acc[3] = c0.w;
      acc[4] = c1.x, acc[5] = c1.y, acc[6] = c1.z, acc[7] = c1.w;
      sum_edges(acc, tile.row_begin + r, live, lane, in_ptr, in_pair, in_norm, lin, h);
    }
  });
}

// Fused, the tile's edges gathered under the GEMM: its nodes' in-edges are one CSR range (consecutive nodes); their
// pair rows are copied (cp.async) into shared memory kChunk edges at a time, the first chunk while the GEMM's
// first slabs load, and each node then sums its edges' rows from shared memory in CSR order, starting from its
// row of the tile.
template <class Cfg, int kChunk>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    fused_gather(const tc::SegmentGemmArgs<bf16, float> a, const int* __restrict__ in_ptr,
                 const int* __restrict__ in_pair, const float* __restrict__ in_norm, bf16* __restrict__ h,
                 const bf16* __restrict__ lin) {
  constexpr int kBM = Cfg::kBM, kThreads = Cfg::kThreads, kWarps = kThreads / 32, kPasses = kBM / (4 * kWarps);
  __shared__ tc::GemmSmem<Cfg> sm;
  __shared__ int ptr_s[kBM + 1];
  __shared__ float norm_s[kChunk];
  __shared__ alignas(16) bf16 rows_s[kChunk * 64];
  const int tid = threadIdx.x;
  int e_begin = 0, e_end = 0;
  auto fetch = [&](int first) {  // the rows and norms of edges first .. first + kChunk
    for (int i = tid; i < kChunk * 8; i += kThreads) {
      const int j = i >> 3, c = i & 7, e = first + j;
      const bool valid = e < e_end;
      const int p = valid ? in_pair[e] : 0;
      tc::cp_async_16(rows_s + j * 64 + c * 8, lin + static_cast<int64_t>(p) * 64 + c * 8, valid);
      if (c == 0) norm_s[j] = valid ? in_norm[e] : 0.0f;
    }
    tc::cp_async_commit();
  };
  auto issued = [&](const tc::GemmTile& t) {
    for (int r = tid; r <= t.rows; r += kThreads) ptr_s[r] = in_ptr[t.row_begin + r];
    __syncthreads();
    e_begin = ptr_s[0];
    e_end = ptr_s[t.rows];
    fetch(e_begin);
  };
  tc::segment_gemm_tile<Cfg>(a, blockIdx.x, sm, issued, [&](const tc::GemmTile& tile) {
    const int lane = tid & 7, group = (tid & 31) >> 3, warp = tid >> 5;
    float acc[kPasses][8];
#pragma unroll
    for (int q = 0; q < kPasses; ++q) {
      const int r = min(warp * 4 + group + q * 4 * kWarps, tile.rows - 1);
      const float4 c0 = *reinterpret_cast<const float4*>(&sm.stage(r, lane * 8));
      const float4 c1 = *reinterpret_cast<const float4*>(&sm.stage(r, lane * 8 + 4));
      acc[q][0] = c0.x, acc[q][1] = c0.y, acc[q][2] = c0.z, acc[q][3] = c0.w;
      acc[q][4] = c1.x, acc[q][5] = c1.y, acc[q][6] = c1.z, acc[q][7] = c1.w;
    }
    for (int first = e_begin;; first += kChunk) {
      if (first != e_begin) {
        __syncthreads();  // every node is done with the previous chunk
        fetch(first);
      }
      tc::cp_async_wait<0>();
      __syncthreads();
#pragma unroll
      for (int q = 0; q < kPasses; ++q) {
        const int r = warp * 4 + group + q * 4 * kWarps;
        if (r < tile.rows) {
          const int lo = max(ptr_s[r], first), hi = min(ptr_s[r + 1], first + kChunk);
          for (int e = lo; e < hi; ++e)
            add_row(acc[q], norm_s[e - first], reinterpret_cast<const uint4*>(rows_s + (e - first) * 64)[lane]);
        }
      }
      if (first + kChunk >= e_end) break;
    }
#pragma unroll
    for (int q = 0; q < kPasses; ++q) {
      const int r = warp * 4 + group + q * 4 * kWarps;
      if (r < tile.rows) traversal::store_row(acc[q], h + (tile.row_begin + r) * 64, lane);
    }
  });
}

using Fused64 = tc::SegmentGemm<bf16, 64, 64, 2, 3, tc::Epilogue::kStore, 9, float>;
using Fused64x6 = tc::SegmentGemm<bf16, 64, 64, 2, 3, tc::Epilogue::kStore, 6, float>;
using Fused128 = tc::SegmentGemm<bf16, 64, 64, 4, 3, tc::Epilogue::kStore, 4, float>;

// A copy of the self GEMM's bytes (read N rows of 128 bytes, write N): what the GEMM's traffic costs at best.
__global__ void __launch_bounds__(256) copy_rows(int64_t n16, const uint4* __restrict__ x, uint4* __restrict__ y) {
  for (int64_t i = blockIdx.x * int64_t{256} + threadIdx.x; i < n16; i += int64_t{gridDim.x} * 256) y[i] = x[i];
}

std::vector<float> download(const bf16* d, size_t n) {
  std::vector<bf16> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

int main() {
  printf("%-8s %-12s %9s %9s %12s\n", "graph", "kernel", "ms", "vs first", "max rel err");
  for (const traversal::Case& c : {traversal::kAm, traversal::kWikikg2}) {
    std::mt19937 rng(1);
    // degrees uniform in 0 .. 2 E / N: about E edges
    const std::vector<int> ptr = traversal::random_row_ptr(c.N, static_cast<int>(2 * c.E / c.N), rng);
    const int64_t E = ptr[c.N];
    std::vector<int> in_pair(E);
    std::vector<float> in_norm(E);
    for (int64_t i = 0; i < E; ++i) {
      in_pair[i] = static_cast<int>(rng() % c.P);
      in_norm[i] = 1.0f / static_cast<float>(1 + rng() % 4);
    }
    auto random_bf16 = [&](size_t n) {
      std::vector<bf16> v(n);
      for (auto& x : v) x = __float2bfloat16(static_cast<float>(static_cast<int>(rng() % 33) - 16) / 16.0f);
      return v;
    };
    const std::vector<bf16> lin_h = random_bf16(c.P * 64), x_h = random_bf16(c.N * 64), w_h = random_bf16(64 * 64);
    Graph g{c.N, E, c.P, upload(ptr), upload(in_pair), upload(in_norm), upload(lin_h)};
    const bf16* x = upload(x_h);
    const bf16* w0 = upload(w_h);
    bf16 *h = nullptr, *h_fused = nullptr;
    CHECK(cudaMalloc(&h, c.N * 64 * sizeof(bf16)));
    CHECK(cudaMalloc(&h_fused, c.N * 64 * sizeof(bf16)));
    int32_t *tile_ptr64 = nullptr, *tile_ptr128 = nullptr;
    CHECK(cudaMalloc(&tile_ptr64, 2 * sizeof(int32_t)));
    CHECK(cudaMalloc(&tile_ptr128, 2 * sizeof(int32_t)));
    CHECK(hectorgen::launch_segment_tile_ptr(nullptr, 1, c.N, 64, tile_ptr64, 0));
    CHECK(hectorgen::launch_segment_tile_ptr(nullptr, 1, c.N, 128, tile_ptr128, 0));

    tc::SegmentGemmArgs<bf16, bf16> gemm{x, w0, h, nullptr, nullptr, nullptr, nullptr, tile_ptr64, c.N, 1};
    int sms = 0, dev = 0, blocks = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, node_sum, 256, 0));
    const unsigned sum_grid = static_cast<unsigned>(std::min<int64_t>((c.N * 8 + 255) / 256, int64_t{blocks} * sms * 4));
    auto unfused = [&] {
      tc::launch_segment_gemm<bf16, 64, 64, tc::Epilogue::kStore>(gemm, 0);
      node_sum<<<sum_grid, 256>>>(c.N, g.ptr, g.in_pair, g.in_norm, h, g.lin);
    };
    const float t_gemm = median_ms([&] { tc::launch_segment_gemm<bf16, 64, 64, tc::Epilogue::kStore>(gemm, 0); });
    const float t_sum = median_ms([&] { node_sum<<<sum_grid, 256>>>(c.N, g.ptr, g.in_pair, g.in_norm, h, g.lin); });
    const float t_unfused = median_ms(unfused);
    const float t_copy = median_ms([&] {
      copy_rows<<<sms * 8, 256>>>(c.N * 8, reinterpret_cast<const uint4*>(x), reinterpret_cast<uint4*>(h));
    });
    // The self GEMM in other shapes: blocks an SM (the register cap) and tile rows.
    auto gemm_variant = [&](auto cfg, const int32_t* tile_ptr) {
      using Cfg = decltype(cfg);
      tc::SegmentGemmArgs<bf16, bf16> v = gemm;
      v.tile_ptr = tile_ptr;
      const unsigned grid = static_cast<unsigned>((c.N + Cfg::kBM - 1) / Cfg::kBM);
      return median_ms([&] { tc::segment_gemm_kernel<Cfg><<<grid, Cfg::kThreads>>>(v); });
    };
    const float t_g12 = gemm_variant(tc::SegmentGemm<bf16, 64, 64, 2, 3, tc::Epilogue::kStore, 12>{}, tile_ptr64);
    const float t_g16 = gemm_variant(tc::SegmentGemm<bf16, 64, 64, 2, 3, tc::Epilogue::kStore, 16>{}, tile_ptr64);
    const float t_g128 = gemm_variant(tc::SegmentGemm<bf16, 64, 64, 4, 3, tc::Epilogue::kStore, 4>{}, tile_ptr128);
    const float t_g128x6 = gemm_variant(tc::SegmentGemm<bf16, 64, 64, 4, 3, tc::Epilogue::kStore, 6>{}, tile_ptr128);
    const double gemm_gb = 2.0 * c.N * 128 / 1e9;
    printf("%-8s %-12s %9.3f %8.2f TB/s\n", c.name, "copy", t_copy, gemm_gb / t_copy);
    printf("%-8s %-12s %9.3f %8.2f TB/s\n", c.name, "gemm 64/9", t_gemm, gemm_gb / t_gemm);
    printf("%-8s %-12s %9.3f %8.2f TB/s\n", c.name, "gemm 64/12", t_g12, gemm_gb / t_g12);
    printf("%-8s %-12s %9.3f %8.2f TB/s\n", c.name, "gemm 64/16", t_g16, gemm_gb / t_g16);
    printf("%-8s %-12s %9.3f %8.2f TB/s\n", c.name, "gemm 128/4", t_g128, gemm_gb / t_g128);
    printf("%-8s %-12s %9.3f %8.2f TB/s\n", c.name, "gemm 128/6", t_g128x6, gemm_gb / t_g128x6);
    unfused();
    const std::vector<float> ref = download(h, c.N * 64);

    // One fused kernel's median time and its largest relative difference to the two kernels' output (poisoned
    // first: a row it does not store reads NaN, an infinite error).
    auto against_ref = [&](auto&& launch) {
      CHECK(cudaMemset(h_fused, 0xff, c.N * 64 * sizeof(bf16)));
      const float t = median_ms(launch);
      const std::vector<float> out = download(h_fused, c.N * 64);
      double worst = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        const double d = std::fabs(static_cast<double>(out[i]) - ref[i]) / (1.0 + std::fabs(ref[i]));
        worst = std::isnan(out[i]) ? INFINITY : std::max(worst, d);
      }
      return std::pair<float, double>{t, worst};
    };
    auto fused_run = [&](auto cfg, const int32_t* tile_ptr) {
      using Cfg = decltype(cfg);
      const tc::SegmentGemmArgs<bf16, float> a{x, w0, nullptr, nullptr, nullptr, nullptr, nullptr, tile_ptr, c.N, 1};
      const unsigned grid = static_cast<unsigned>((c.N + Cfg::kBM - 1) / Cfg::kBM);
      return against_ref([&] { fused<Cfg><<<grid, Cfg::kThreads>>>(a, g.ptr, g.in_pair, g.in_norm, h_fused, g.lin); });
    };
    auto gather_run = [&](auto cfg, auto chunk) {
      using Cfg = decltype(cfg);
      constexpr int kChunk = decltype(chunk)::value;
      const tc::SegmentGemmArgs<bf16, float> a{x, w0, nullptr, nullptr, nullptr, nullptr, nullptr, tile_ptr64, c.N, 1};
      const unsigned grid = static_cast<unsigned>((c.N + Cfg::kBM - 1) / Cfg::kBM);
      return against_ref(
          [&] { fused_gather<Cfg, kChunk><<<grid, Cfg::kThreads>>>(a, g.ptr, g.in_pair, g.in_norm, h_fused, g.lin); });
    };
    const auto [tg64, eg64] = gather_run(Fused64{}, std::integral_constant<int, 64>{});
    const auto [tg128, eg128] = gather_run(Fused64{}, std::integral_constant<int, 128>{});
    const auto [tg128b, eg128b] = gather_run(Fused64x6{}, std::integral_constant<int, 128>{});
    const auto [t64, e64] = fused_run(Fused64{}, tile_ptr64);
    const auto [t128, e128] = fused_run(Fused128{}, tile_ptr128);
    printf("%-8s %-12s %9.3f %9s %12s\n", c.name, "gemm", t_gemm, "", "");
    printf("%-8s %-12s %9.3f %9s %12s\n", c.name, "sum", t_sum, "", "");
    printf("%-8s %-12s %9.3f %8.2fx %12s\n", c.name, "gemm + sum", t_unfused, 1.0, "(reference)");
    printf("%-8s %-12s %9.3f %8.2fx %12.2e\n", c.name, "fused 64", t64, t_unfused / t64, e64);
    printf("%-8s %-12s %9.3f %8.2fx %12.2e\n", c.name, "fused 128", t128, t_unfused / t128, e128);
    printf("%-8s %-12s %9.3f %8.2fx %12.2e\n", c.name, "gather 64", tg64, t_unfused / tg64, eg64);
    printf("%-8s %-12s %9.3f %8.2fx %12.2e\n", c.name, "gather 128", tg128, t_unfused / tg128, eg128);
    printf("%-8s %-12s %9.3f %8.2fx %12.2e\n", c.name, "gather 128/6", tg128b, t_unfused / tg128b, eg128b);
    for (const void* p : {static_cast<const void*>(g.ptr), static_cast<const void*>(g.in_pair),
                          static_cast<const void*>(g.in_norm), static_cast<const void*>(g.lin),
                          static_cast<const void*>(x), static_cast<const void*>(w0), static_cast<const void*>(h),
                          static_cast<const void*>(h_fused), static_cast<const void*>(tile_ptr64),
                          static_cast<const void*>(tile_ptr128)})
      CHECK(cudaFree(const_cast<void*>(p)));
  }
  return 0;
}
