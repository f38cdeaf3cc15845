// CPU check of the warp-level operand layout of hectorgen/tc_gemm.cuh (runtime/include): emulates ldmatrix (.x4,
// with and without .trans) and mma.sync m16n8k16 / m16n8k8 exactly as the PTX ISA defines their per-lane fragments,
// drives them with the offsets of hectorgen/tc_fragments.h the way tc_gemm.cuh's warp_mma_step does (32 x 32 warp
// tile, two k steps), and compares the accumulators with a plain product. Integer-valued inputs make the comparison exact.
//   g++ -std=c++17 -O1 -I ../../runtime/include fragment_check.cpp -o fragment_check && ./fragment_check
#include <algorithm>
#include <array>
#include <cstdio>
#include <random>
#include <vector>

#include "hectorgen/tc_fragments.h"

namespace {

using hectorgen::tc::fragments::a_colmajor_ldsm_trans;
using hectorgen::tc::fragments::a_colmajor_tf32;
using hectorgen::tc::fragments::a_rowmajor_ldsm;
using hectorgen::tc::fragments::a_rowmajor_tf32;
using hectorgen::tc::fragments::b_ldsm_trans;
using hectorgen::tc::fragments::b_tf32;
using hectorgen::tc::fragments::c_col;
using hectorgen::tc::fragments::c_row;
using hectorgen::tc::fragments::RowCol;

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

// One warp's 32 x 32 tile over a k depth of 32 at origin (m0, n0) of a block tile, as warp_mma_step runs it:
//   a_transposed = false (forward): A[m][k] at al.offset(m, k); true (wgrad): at al.offset(k, m).
//   B[k][n] at bl.offset(k, n).
template <class ALayout, class BLayout>
int check(const char* name, bool tf32, bool a_transposed, ALayout al, BLayout bl, int m0, int n0, std::mt19937& rng) {
  g_stats = {};
  std::uniform_int_distribution<int> value(-4, 4);
  // 64 x 64 block tiles (the largest origin is 32, the warp tile 32 wide, k 32 deep)
  int a_size = 0, b_size = 0;
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 64; ++c) {
      a_size = std::max(a_size, al.offset(r, c) + 1);
      b_size = std::max(b_size, bl.offset(r, c) + 1);
    }
  }
  Smem a_smem(a_size), b_smem(b_size);
  for (float& v : a_smem) v = static_cast<float>(value(rng));
  for (float& v : b_smem) v = static_cast<float>(value(rng));
  auto A = [&](int m, int k) { return a_transposed ? a_smem[al.offset(k, m)] : a_smem[al.offset(m, k)]; };
  auto B = [&](int k, int n) { return b_smem[bl.offset(k, n)]; };
  // As the kernels address them: each lane's offset at the warp tile's origin (its first fragment position),
  // displaced by the fragment's, the k step's and the 16-row / 16-column tile's offsets (layout.displace).
  std::array<int, kLanes> a_lane{}, b_lane{};
  for (int l = 0; l < kLanes; ++l) {
    const RowCol pa = tf32 ? (a_transposed ? a_colmajor_tf32(l, 0) : a_rowmajor_tf32(l, 0))
                           : (a_transposed ? a_colmajor_ldsm_trans(l) : a_rowmajor_ldsm(l));
    a_lane[l] = a_transposed ? al.offset(pa.row, m0 + pa.col) : al.offset(m0 + pa.row, pa.col);
    const RowCol pb = tf32 ? b_tf32(l, 0) : b_ldsm_trans(l);
    b_lane[l] = bl.offset(pb.row, n0 + pb.col);
  }
  auto a_off = [&](int l, int dm, int dk) {
    return a_transposed ? al.displace(a_lane[l], dk, dm) : al.displace(a_lane[l], dm, dk);
  };

  Acc acc[2][4] = {};
  const int mma_k = tf32 ? 8 : 16;
  for (int kk = 0; kk < 32; kk += mma_k) {
    if (tf32) {
      std::array<std::array<float, 4>, kLanes> a[2];
      std::array<std::array<float, 2>, kLanes> b[4];
      for (int mt = 0; mt < 2; ++mt) {
        for (int r = 0; r < 4; ++r) {
          std::vector<int> bytes;
          for (int l = 0; l < kLanes; ++l) {
            const RowCol p = a_transposed ? a_colmajor_tf32(l, r) : a_rowmajor_tf32(l, r);
            const RowCol p0 = a_transposed ? a_colmajor_tf32(l, 0) : a_rowmajor_tf32(l, 0);
            const int dr = p.row - p0.row, dc = p.col - p0.col;
            const int offset = a_transposed ? al.displace(a_lane[l], kk + dr, mt * 16 + dc)
                                            : al.displace(a_lane[l], mt * 16 + dr, kk + dc);
            a[mt][l][r] = a_smem[offset];
            bytes.push_back(offset * 4);
          }
          count_phase(bytes, 4);
        }
      }
      for (int np = 0; np < 2; ++np) {
        for (int r = 0; r < 2; ++r) {
          for (int half = 0; half < 2; ++half) {
            std::vector<int> bytes;
            for (int l = 0; l < kLanes; ++l) {
              const int offset = bl.displace(b_lane[l], kk + 4 * r, np * 16 + 8 * half);
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
        std::array<int, kLanes> addr{};
        for (int l = 0; l < kLanes; ++l) {
          addr[l] = a_off(l, mt * 16, kk);
        }
        a[mt] = ldmatrix_x4(a_smem, addr, a_transposed);
      }
      for (int np = 0; np < 2; ++np) {
        std::array<int, kLanes> addr{};
        for (int l = 0; l < kLanes; ++l) {
          addr[l] = bl.displace(b_lane[l], kk, np * 16);
        }
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
          const int m = m0 + mt * 16 + c_row(l, r), n = n0 + nt * 8 + c_col(l, r);
          float want = 0;
          for (int k = 0; k < 32; ++k) want += A(m, k) * B(k, n);
          if (acc[mt][nt][l][r] != want) ++errors;
        }
      }
    }
  }
  errors += g_stats.misaligned;
  const bool conflict_free = g_stats.conflicted_phases == 0;
  std::printf("fragment_check %-5s %-28s warp (%2d, %2d): %s (%d wrong of 1024, %d misaligned ldmatrix rows; "
              "%d of %d shared-memory phases with a bank conflict)\n",
              tf32 ? "tf32" : "16bit", name, m0, n0, errors || !conflict_free ? "FAIL" : "ok",
              errors - g_stats.misaligned, g_stats.misaligned, g_stats.conflicted_phases, g_stats.phases);
  return errors + (conflict_free ? 0 : 1);
}

// A swizzled layout must be a bijection of the rows x kCols tile onto [0, rows * kCols) that keeps each 16-byte
// chunk contiguous and aligned (what the 16-byte cp.async copies and row reads need).
template <int kCols, int kElemBytes>
int check_swizzle(int rows) {
  using L = hectorgen::tc::fragments::Swizzled<kCols, kElemBytes>;
  std::vector<int> hits(rows * kCols, 0);
  int errors = 0;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < kCols; ++c) {
      const int o = L::offset(r, c);
      if (o < 0 || o >= rows * kCols) {
        ++errors;
        continue;
      }
      ++hits[o];
      if (c % L::kVec != 0 && o != L::offset(r, c - c % L::kVec) + c % L::kVec) ++errors;
      if (c % L::kVec == 0 && o * kElemBytes % 16 != 0) ++errors;
    }
  }
  for (int h : hits) errors += h != 1;
  std::printf("swizzle_check %3d x %2d of %d-byte elements: %s\n", rows, kCols, kElemBytes, errors ? "FAIL" : "ok");
  return errors;
}

// The epilogue's staging writes (Pair<OutT>: 4 or 8 bytes per lane at (g + 8 h, 2 t) of each 16 x 8 tile) into
// the swizzled [64][64] tile must be conflict-free too: phases of 128 bytes (32 lanes x 4 B, or 16 lanes x 8 B).
template <class L, int kElemBytes>
int check_staging(const char* name) {
  g_stats = {};
  int errors = 0;
  const int pair_bytes = 2 * kElemBytes, lanes_per_phase = 128 / pair_bytes;
  for (int wm = 0; wm < 2; ++wm) {
    for (int wn = 0; wn < 2; ++wn) {
      for (int mt = 0; mt < 2; ++mt) {
        for (int h = 0; h < 2; ++h) {
          for (int nt = 0; nt < 4; ++nt) {
            for (int first = 0; first < kLanes; first += lanes_per_phase) {
              std::vector<int> bytes;
              for (int l = first; l < first + lanes_per_phase; ++l) {
                const int y_lane = L::offset(wm * 32 + l / 4, wn * 32 + 2 * (l % 4));
                const int o = L::displace(y_lane, mt * 16 + 8 * h, nt * 8);
                const int r = wm * 32 + mt * 16 + l / 4 + 8 * h, c = wn * 32 + nt * 8 + 2 * (l % 4);
                if (o != L::offset(r, c)) ++errors;  // the displacement must reach the same element
                bytes.push_back(o * kElemBytes);
              }
              count_phase(bytes, pair_bytes);
            }
          }
        }
      }
    }
  }
  std::printf("staging_check %-14s %d-byte output: %s (%d wrong displacements; %d of %d phases with a bank conflict)\n",
              name, kElemBytes, errors || g_stats.conflicted_phases ? "FAIL" : "ok", errors, g_stats.conflicted_phases,
              g_stats.phases);
  return errors + g_stats.conflicted_phases;
}

}  // namespace

int main() {
  using hectorgen::tc::fragments::Padded;
  using hectorgen::tc::fragments::Swizzled;
  std::mt19937 rng(8);
  int errors = 0;
  for (int m0 = 0; m0 <= 32; m0 += 32) {
    for (int n0 = 0; n0 <= 32; n0 += 32) {
      // forward (tc_gemm.cuh SegmentGemm): X [64][32] and W [32][64], dense and swizzled
      errors += check("fwd X/W swizzled", false, false, Swizzled<32, 2>{}, Swizzled<64, 2>{}, m0, n0, rng);
      errors += check("fwd X/W padded 36/72", true, false, Padded<36>{}, Padded<72>{}, m0, n0, rng);
      // weight gradient: X and dY slabs [32][64 + 8], A transposed
      errors += check("wgrad padded 72", false, true, Padded<72>{}, Padded<72>{}, m0, n0, rng);
      errors += check("wgrad padded 72", true, true, Padded<72>{}, Padded<72>{}, m0, n0, rng);
    }
  }
  errors += check_swizzle<32, 2>(64);
  errors += check_swizzle<64, 2>(64);
  errors += check_swizzle<32, 4>(64);
  errors += check_swizzle<64, 4>(64);
  // the epilogue's staging tile: swizzled for the 16-bit types (bf16/fp16 store, fp32 scatter-add), padded for tf32
  errors += check_staging<Swizzled<64, 2>, 2>("swizzled");
  errors += check_staging<Swizzled<64, 4>, 4>("swizzled");
  errors += check_staging<Padded<72>, 4>("padded 72");
  return errors == 0 ? 0 : 1;
}
