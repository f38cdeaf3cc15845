// CPU check of the warp-level operand layout of tc_gemm.cuh: emulates ldmatrix (.x4, with and without .trans)
// and mma.sync m16n8k16 / m16n8k8 exactly as the PTX ISA defines their per-lane fragments, drives them with the
// offsets of fragments.h the way tc_gemm.cuh's warp_mma_step does (32 x 32 warp tile, two k steps), and
// compares the accumulators with a plain product. Integer-valued inputs make the comparison exact.
//   g++ -std=c++17 -O1 fragment_check.cpp -o fragment_check && ./fragment_check
#include <array>
#include <cstdio>
#include <random>
#include <vector>

#include "fragments.h"

namespace {

using gemm_bench::fragments::a_colmajor_ldsm_trans;
using gemm_bench::fragments::a_colmajor_tf32;
using gemm_bench::fragments::a_rowmajor_ldsm;
using gemm_bench::fragments::a_rowmajor_tf32;
using gemm_bench::fragments::b_ldsm_trans;
using gemm_bench::fragments::b_tf32;
using gemm_bench::fragments::c_col;
using gemm_bench::fragments::c_row;

constexpr int kLanes = 32;
struct Pair {  // one 32-bit register holding two 16-bit elements: lo at the lower address
  float lo = 0, hi = 0;
};
using Smem = std::vector<float>;

// Shared-memory accounting of the emulated loads: ldmatrix row addresses must be 16-byte aligned (else the
// instruction faults); a bank conflict is a phase whose accesses share a bank at different addresses
// (ldmatrix: each 8x8 matrix is one phase of 8 16-byte rows; tf32: one phase of 32 4-byte words).
struct SmemStats {
  int misaligned = 0, conflicted_phases = 0, phases = 0;
};
SmemStats g_stats;

void count_phase(const std::vector<int>& byte_addresses, int access_bytes) {
  ++g_stats.phases;
  for (size_t i = 0; i < byte_addresses.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const int bank_i = byte_addresses[i] / 4 % 32, bank_j = byte_addresses[j] / 4 % 32;
      const bool same_word_group = byte_addresses[i] / access_bytes == byte_addresses[j] / access_bytes;
      // accesses of access_bytes cover access_bytes / 4 consecutive banks
      const int span = access_bytes / 4;
      const bool overlap = (bank_i - bank_j + 32) % 32 < span || (bank_j - bank_i + 32) % 32 < span;
      if (overlap && !same_word_group) {
        ++g_stats.conflicted_phases;
        return;
      }
    }
  }
}

// ldmatrix.x4: lane 8j + r gives the address of row r of matrix j; register j of lane l receives row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j (.trans: the transposed matrix).
std::array<std::array<Pair, 4>, kLanes> ldmatrix_x4(const Smem& smem, const std::array<int, kLanes>& addr,
                                                    bool trans) {
  std::array<std::array<Pair, 4>, kLanes> out{};
  for (int j = 0; j < 4; ++j) {
    std::vector<int> bytes;
    for (int r = 0; r < 8; ++r) {
      bytes.push_back(addr[8 * j + r] * 2);  // 16-bit elements
      if (addr[8 * j + r] * 2 % 16 != 0) ++g_stats.misaligned;
    }
    count_phase(bytes, 16);
  }
  for (int l = 0; l < kLanes; ++l) {
    for (int j = 0; j < 4; ++j) {
      if (!trans) {
        const int row = addr[8 * j + l / 4];
        out[l][j] = {smem[row + 2 * (l % 4)], smem[row + 2 * (l % 4) + 1]};
      } else {
        out[l][j] = {smem[addr[8 * j + 2 * (l % 4)] + l / 4], smem[addr[8 * j + 2 * (l % 4) + 1] + l / 4]};
      }
    }
  }
  return out;
}

using Acc = std::array<std::array<float, 4>, kLanes>;

// mma.sync.m16n8k16.row.col: A 16x16, B 16x8, per-lane fragments as in the PTX ISA.
void mma_16816(Acc& d, const std::array<std::array<Pair, 4>, kLanes>& a, const std::array<std::array<Pair, 2>, kLanes>& b) {
  float A[16][16] = {}, B[16][8] = {};
  for (int l = 0; l < kLanes; ++l) {
    const int g = l / 4, t = l % 4;
    const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
    for (int r = 0; r < 4; ++r) {
      A[rows[r]][cols[r]] = a[l][r].lo;
      A[rows[r]][cols[r] + 1] = a[l][r].hi;
    }
    for (int r = 0; r < 2; ++r) {
      B[2 * t + 8 * r][g] = b[l][r].lo;
      B[2 * t + 8 * r + 1][g] = b[l][r].hi;
    }
  }
  for (int l = 0; l < kLanes; ++l) {
    for (int r = 0; r < 4; ++r) {
      float sum = 0;
      for (int k = 0; k < 16; ++k) sum += A[c_row(l, r)][k] * B[k][c_col(l, r)];
      d[l][r] += sum;
    }
  }
}

// mma.sync.m16n8k8.row.col.tf32: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); b0 (t, g), b1 (t + 4, g).
void mma_1688(Acc& d, const std::array<std::array<float, 4>, kLanes>& a, const std::array<std::array<float, 2>, kLanes>& b) {
  float A[16][8] = {}, B[8][8] = {};
  for (int l = 0; l < kLanes; ++l) {
    const int g = l / 4, t = l % 4;
    A[g][t] = a[l][0];
    A[g + 8][t] = a[l][1];
    A[g][t + 4] = a[l][2];
    A[g + 8][t + 4] = a[l][3];
    B[t][g] = b[l][0];
    B[t + 4][g] = b[l][1];
  }
  for (int l = 0; l < kLanes; ++l) {
    for (int r = 0; r < 4; ++r) {
      float sum = 0;
      for (int k = 0; k < 8; ++k) sum += A[c_row(l, r)][k] * B[k][c_col(l, r)];
      d[l][r] += sum;
    }
  }
}

// One warp's 32 x 32 tile over a k depth of 32, as warp_mma_step runs it in the kernels:
//   a_transposed = false (forward): A[m][k] = a_smem[m * a_stride + k]; the caller's tile is a_smem + kk.
//   a_transposed = true  (wgrad):   A[m][k] = a_smem[k * a_stride + m]; the caller's tile is a_smem + kk * stride.
//   B[k][n] = b_smem[k * b_stride + n]; the caller's tile is b_smem + kk * b_stride.
int check(bool tf32, bool a_transposed, int a_stride, int b_stride, std::mt19937& rng) {
  g_stats = {};
  std::uniform_int_distribution<int> value(-4, 4);
  Smem a_smem(32 * a_stride), b_smem(32 * b_stride);
  for (float& v : a_smem) v = static_cast<float>(value(rng));
  for (float& v : b_smem) v = static_cast<float>(value(rng));
  auto A = [&](int m, int k) { return a_transposed ? a_smem[k * a_stride + m] : a_smem[m * a_stride + k]; };
  auto B = [&](int k, int n) { return b_smem[k * b_stride + n]; };

  Acc acc[2][4] = {};
  const int mma_k = tf32 ? 8 : 16;
  for (int kk = 0; kk < 32; kk += mma_k) {
    const int a_tile = a_transposed ? kk * a_stride : kk;
    const int b_tile = kk * b_stride;
    if (tf32) {
      std::array<std::array<float, 4>, kLanes> a[2];
      std::array<std::array<float, 2>, kLanes> b[4];
      for (int mt = 0; mt < 2; ++mt) {
        const int tile = a_tile + (a_transposed ? mt * 16 : mt * 16 * a_stride);
        for (int r = 0; r < 4; ++r) {
          std::vector<int> bytes;
          for (int l = 0; l < kLanes; ++l) {
            const int offset = tile + (a_transposed ? a_colmajor_tf32(l, a_stride, r) : a_rowmajor_tf32(l, a_stride, r));
            a[mt][l][r] = a_smem[offset];
            bytes.push_back(offset * 4);
          }
          count_phase(bytes, 4);
        }
      }
      for (int np = 0; np < 2; ++np) {
        const int tile = b_tile + np * 16;
        for (int r = 0; r < 2; ++r) {
          for (int half = 0; half < 2; ++half) {
            std::vector<int> bytes;
            for (int l = 0; l < kLanes; ++l) {
              const int offset = tile + b_tf32(l, b_stride, r) + 8 * half;
              b[2 * np + half][l][r] = b_smem[offset];
              bytes.push_back(offset * 4);
            }
            count_phase(bytes, 4);
          }
        }
      }
      for (int mt = 0; mt < 2; ++mt) {
        for (int nt = 0; nt < 4; ++nt) mma_1688(acc[mt][nt], a[mt], b[nt]);
      }
    } else {
      std::array<std::array<Pair, 4>, kLanes> a[2];
      std::array<std::array<Pair, 2>, kLanes> b[4];
      for (int mt = 0; mt < 2; ++mt) {
        const int tile = a_tile + (a_transposed ? mt * 16 : mt * 16 * a_stride);
        std::array<int, kLanes> addr{};
        for (int l = 0; l < kLanes; ++l) {
          addr[l] = tile + (a_transposed ? a_colmajor_ldsm_trans(l, a_stride) : a_rowmajor_ldsm(l, a_stride));
        }
        a[mt] = ldmatrix_x4(a_smem, addr, a_transposed);
      }
      for (int np = 0; np < 2; ++np) {
        std::array<int, kLanes> addr{};
        for (int l = 0; l < kLanes; ++l) addr[l] = b_tile + np * 16 + b_ldsm_trans(l, b_stride);
        const auto r = ldmatrix_x4(b_smem, addr, true);
        for (int l = 0; l < kLanes; ++l) {
          b[2 * np][l] = {r[l][0], r[l][1]};
          b[2 * np + 1][l] = {r[l][2], r[l][3]};
        }
      }
      for (int mt = 0; mt < 2; ++mt) {
        for (int nt = 0; nt < 4; ++nt) mma_16816(acc[mt][nt], a[mt], b[nt]);
      }
    }
  }

  int errors = 0;
  for (int mt = 0; mt < 2; ++mt) {
    for (int nt = 0; nt < 4; ++nt) {
      for (int l = 0; l < kLanes; ++l) {
        for (int r = 0; r < 4; ++r) {
          const int m = mt * 16 + c_row(l, r), n = nt * 8 + c_col(l, r);
          float want = 0;
          for (int k = 0; k < 32; ++k) want += A(m, k) * B(k, n);
          if (acc[mt][nt][l][r] != want) ++errors;
        }
      }
    }
  }
  errors += g_stats.misaligned;
  std::printf("fragment_check %-5s A %-10s a_stride %2d b_stride %2d: %s (%d wrong of 1024, %d misaligned "
              "ldmatrix rows; %d of %d shared-memory phases with a bank conflict)\n",
              tf32 ? "tf32" : "16bit", a_transposed ? "transposed" : "row-major", a_stride, b_stride,
              errors ? "FAIL" : "ok", errors - g_stats.misaligned, g_stats.misaligned, g_stats.conflicted_phases,
              g_stats.phases);
  return errors;
}

}  // namespace

int main() {
  std::mt19937 rng(8);
  int errors = 0;
  // the strides of tc_gemm.cuh: forward X 32 + 8 (16-bit) or 32 + 4 (tf32), W 64 + 8; wgrad 64 + 8 for both
  errors += check(false, false, 40, 72, rng);
  errors += check(false, true, 72, 72, rng);
  errors += check(true, false, 36, 72, rng);
  errors += check(true, true, 72, 72, rng);
  return errors == 0 ? 0 : 1;
}
