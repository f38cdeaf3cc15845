#!/usr/bin/env bash
# The gather sum that hectorgen emits (compact materialization's backward: a pair's gradient summed over its edges)
# against a plain loop, on the GPU: the kernel (and the vector-run helpers it calls) is taken from what hectorgen
# generates for tests/gpu/specs/rgcn_compact.yaml (rgcn_compact_bw_sum_d_lin_feature: x rows through dst, a scale per
# entry; fp32 rows of 64: 4 groups of 8 lanes, group g adding the row's entries g, g + 4, ...) and run over random
# CSRs with Pareto-skewed row lengths (empty rows, one row of 20000 entries, lengths around each multiple of 32). The
# result must be bit-identical to the loop that adds the same way: one warp a row, entry k of the row into partial
# sum k % 4 in order, the row's value (s0 + s1) + (s2 + s3), as the kernel's butterfly adds its groups. Both are
# timed (median of 20 CUDA-event timings). Prints the mismatches (0) and the times; exits 1 on any mismatch.
#   tests/gpu/check_gather_sum.sh [HECTORGEN]   (default: build/hectorgen, else build/hg_bundle/hectorgen)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_check_lib.sh"
device_check_setup "${1:-}"
spec=tests/gpu/specs/rgcn_compact.yaml
helpers="$(generated_piece check_gather_sum $spec '^template <int kRunBytes> struct RunWord;' '^__device__ __forceinline__ void store_run')"
kernel="$(generated_piece check_gather_sum $spec '^__global__ void __launch_bounds__\(256\) rgcn_compact_bw_sum_d_lin_feature\(')"
grep -q 'kRun = 8, kGroupLanes = 8,' <<<"$kernel" ||
  { echo "check_gather_sum: the kernel is not in 4 groups of 8 lanes, as the loop below adds" >&2; exit 1; }
cat > "$tmp/check.cu" <<CU
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>
$helpers
$kernel
// The loop, one warp a row, the row's entries one after the other, entry k into partial sum k % 4.
__global__ void reference(int64_t num_rows, const int32_t* csr_ptr, const int32_t* csr_col, const float* x, float* y,
                          const int32_t* dst, const float* scale) {
  const int lane = threadIdx.x & 31;
  const int64_t first_row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t row_stride = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = first_row; row < num_rows; row += row_stride) {
    float acc[2][4] = {};
    for (int64_t i = csr_ptr[row]; i < csr_ptr[row + 1]; ++i) {
      const int64_t from_row = csr_col[i];
      const int64_t x_row = dst[from_row];
      const float entry_scale = scale[from_row];
      const int64_t k = (i - csr_ptr[row]) % 4;
      for (int c = 0; c < 2; ++c) acc[c][k] += entry_scale * x[x_row * 64 + lane + 32 * c];
    }
    for (int c = 0; c < 2; ++c) y[row * 64 + lane + 32 * c] = (acc[c][0] + acc[c][1]) + (acc[c][2] + acc[c][3]);
  }
}
template <class F> float median_ms(F launch) {
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < 23; ++i) {
    cudaEventRecord(a); launch(); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    if (i >= 3) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
int main() {
  std::mt19937 rng(5);
  long long mismatches = 0, checked = 0;
  const int64_t nodes = 100000;
  for (int trial = 0; trial < 3; ++trial) {
    // Row lengths: Pareto (shape 1.5) around 9 entries, empty rows, 31..33 and 63..65, and one row of 20000.
    std::vector<int32_t> ptr{0};
    const int64_t rows = 70000;
    std::uniform_real_distribution<double> u(1e-9, 1.0);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t len = r == 777 ? 20000 : r % 97 == 0 ? 0 : r % 89 == 0 ? 31 + r % 3 : r % 83 == 0 ? 63 + r % 3
                  : static_cast<int64_t>(3.0 * std::pow(u(rng), -1.0 / 1.5)) % 3000;
      ptr.push_back(ptr.back() + static_cast<int32_t>(len));
    }
    const int64_t entries = ptr.back();
    std::vector<int32_t> col(entries), dst(entries);
    std::vector<float> scale(entries), x(nodes * 64);
    for (int64_t i = 0; i < entries; ++i) col[i] = static_cast<int32_t>(rng() % entries);
    for (auto& d : dst) d = static_cast<int32_t>(rng() % nodes);
    std::normal_distribution<float> n01;
    for (auto& s : scale) s = n01(rng);
    for (auto& v : x) v = n01(rng);
    int32_t *d_ptr, *d_col, *d_dst; float *d_scale, *d_x, *d_y, *d_ref;
    cudaMalloc(&d_ptr, ptr.size() * 4); cudaMalloc(&d_col, entries * 4); cudaMalloc(&d_dst, entries * 4);
    cudaMalloc(&d_scale, entries * 4); cudaMalloc(&d_x, x.size() * 4);
    cudaMalloc(&d_y, rows * 64 * 4); cudaMalloc(&d_ref, rows * 64 * 4);
    cudaMemcpy(d_ptr, ptr.data(), ptr.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_col, col.data(), entries * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_dst, dst.data(), entries * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_scale, scale.data(), entries * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(d_x, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    cudaMemset(d_y, 0xff, rows * 64 * 4);  // NaN: every row must be written
    const unsigned blocks = static_cast<unsigned>((rows + 7) / 8);
    const float t_new = median_ms([&] { rgcn_compact_bw_sum_d_lin_feature<<<blocks, 256>>>(rows, d_ptr, d_col, d_x, d_y, d_dst, d_scale); });
    const float t_ref = median_ms([&] { reference<<<blocks, 256>>>(rows, d_ptr, d_col, d_x, d_ref, d_dst, d_scale); });
    std::vector<float> y(rows * 64), ref(rows * 64);
    cudaMemcpy(y.data(), d_y, y.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(ref.data(), d_ref, ref.size() * 4, cudaMemcpyDeviceToHost);
    if (cudaGetLastError() != cudaSuccess) { std::printf("CUDA error\\n"); return 1; }
    for (size_t i = 0; i < y.size(); ++i) {
      ++checked;
      if (std::memcmp(&y[i], &ref[i], 4) != 0 && mismatches++ < 5)
        std::printf("row %lld col %lld: %.9g, the loop %.9g\\n", (long long)(i / 64), (long long)(i % 64), y[i], ref[i]);
    }
    std::printf("trial %d: %lld rows, %lld entries: generated %.3f ms, the loop %.3f ms (%.2fx)\\n", trial,
                (long long)rows, (long long)entries, t_new, t_ref, t_ref / t_new);
    cudaFree(d_ptr); cudaFree(d_col); cudaFree(d_dst); cudaFree(d_scale); cudaFree(d_x); cudaFree(d_y); cudaFree(d_ref);
  }
  std::printf("gather sum: %lld values checked, %lld not bit-identical to the loop\\n", checked, mismatches);
  return mismatches ? 1 : 0;
}
CU
build_and_run check_gather_sum
