// Where each lane of a warp reads its mma operands in shared memory: the offsets (in elements, from the
// top-left of a 16 x 16 (16-bit) or 16 x 8 (tf32) operand tile) that tc_gemm.cuh passes to ldmatrix or loads
// directly. Plain functions, host and device, so that fragment_check.cpp can verify them on the CPU against
// an emulation of ldmatrix and mma as the PTX ISA defines them.
//
// Notation of the PTX ISA: g = lane / 4 (group), t = lane % 4 (thread in group).
#pragma once

#if defined(__CUDACC__)
#define FRAGMENTS_HD __host__ __device__
#else
#define FRAGMENTS_HD
#endif

namespace gemm_bench::fragments {

// ---- 16-bit types (m16n8k16) through ldmatrix.x4: the address lane supplies (row lane % 8 of matrix lane / 8).

// A, rows (m) along shared-memory rows, k contiguous: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15),
// (m 8-15, k 8-15) = a0a1, a2a3, a4a5, a6a7; ldmatrix without .trans.
FRAGMENTS_HD constexpr int a_rowmajor_ldsm(int lane, int stride) { return (lane % 16) * stride + (lane / 16) * 8; }

// A stored transposed (k along shared-memory rows, m contiguous), read with ldmatrix.trans: matrix j covers
// m (j % 2) * 8.., k (j / 2) * 8.. so the registers again come out as a0a1, a2a3, a4a5, a6a7.
FRAGMENTS_HD constexpr int a_colmajor_ldsm_trans(int lane, int stride) {
  return (lane % 8 + (lane / 16) * 8) * stride + ((lane / 8) % 2) * 8;
}

// B for two n8 tiles, k along shared-memory rows, n contiguous, read with ldmatrix.trans: matrices
// (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15) = b0b1 and b2b3 of the first n tile,
// then of the second.
FRAGMENTS_HD constexpr int b_ldsm_trans(int lane, int stride) { return (lane % 16) * stride + (lane / 16) * 8; }

// ---- tf32 (m16n8k8): one 32-bit element per register, loaded directly.

// A (m along rows, k contiguous): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4).
FRAGMENTS_HD constexpr int a_rowmajor_tf32(int lane, int stride, int reg) {
  return (lane / 4 + (reg % 2) * 8) * stride + lane % 4 + (reg / 2) * 4;
}
// A stored transposed (k along rows, m contiguous): the same (m, k) positions.
FRAGMENTS_HD constexpr int a_colmajor_tf32(int lane, int stride, int reg) {
  return (lane % 4 + (reg / 2) * 4) * stride + lane / 4 + (reg % 2) * 8;
}
// B (k along rows, n contiguous): b0 (k t, n g), b1 (k t + 4, n g).
FRAGMENTS_HD constexpr int b_tf32(int lane, int stride, int reg) { return (lane % 4 + reg * 4) * stride + lane / 4; }

// ---- accumulators (both shapes): c0 c1 at (g, 2t), (g, 2t + 1); c2 c3 at (g + 8, 2t), (g + 8, 2t + 1).
FRAGMENTS_HD constexpr int c_row(int lane, int reg) { return lane / 4 + (reg / 2) * 8; }
FRAGMENTS_HD constexpr int c_col(int lane, int reg) { return (lane % 4) * 2 + reg % 2; }

}  // namespace gemm_bench::fragments

#undef FRAGMENTS_HD
