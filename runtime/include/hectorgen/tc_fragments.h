// Where each lane of a warp reads its mma operands in shared memory: the offsets (in elements, from the
// top-left of a 16 x 16 (16-bit) or 16 x 8 (tf32) operand tile) that hectorgen/tc_gemm.cuh passes to ldmatrix or
// loads directly. Plain functions, host and device, so that bench/gemm/fragment_check.cpp can verify them on the CPU
// against an emulation of ldmatrix and mma as the PTX ISA defines them.
//
// Notation of the PTX ISA: g = lane / 4 (group), t = lane % 4 (thread in group).
#pragma once

#if defined(__CUDACC__)
#define HECTORGEN_TC_HD __host__ __device__
#else
#define HECTORGEN_TC_HD
#endif

namespace hectorgen::tc::fragments {

// Every function returns the (row, col) of shared memory that a lane addresses, relative to the top-left
// of the operand tile; a layout (below) turns it into an element offset, so the same fragments serve the
// padded tiles of the weight gradient and the XOR-swizzled tiles of the forward.
struct RowCol {
  int row, col;
};

// ---- 16-bit types (m16n8k16) through ldmatrix.x4: the address lane supplies (row lane % 8 of matrix lane / 8).

// A, rows (m) along shared-memory rows, k contiguous: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15),
// (m 8-15, k 8-15) = a0a1, a2a3, a4a5, a6a7; ldmatrix without .trans.
HECTORGEN_TC_HD constexpr RowCol a_rowmajor_ldsm(int lane) { return {lane % 16, (lane / 16) * 8}; }

// A stored transposed (k along shared-memory rows, m contiguous), read with ldmatrix.trans: matrix j covers
// m (j % 2) * 8.., k (j / 2) * 8.. so the registers again come out as a0a1, a2a3, a4a5, a6a7. (row = k, col = m)
HECTORGEN_TC_HD constexpr RowCol a_colmajor_ldsm_trans(int lane) {
  return {lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8};
}

// B for two n8 tiles, k along shared-memory rows, n contiguous, read with ldmatrix.trans: matrices
// (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15) = b0b1 and b2b3 of the first n tile,
// then of the second. (row = k, col = n)
HECTORGEN_TC_HD constexpr RowCol b_ldsm_trans(int lane) { return {lane % 16, (lane / 16) * 8}; }

// ---- tf32 (m16n8k8): one 32-bit element per register, loaded directly.

// A (m along rows, k contiguous): a0 (g, t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4).
HECTORGEN_TC_HD constexpr RowCol a_rowmajor_tf32(int lane, int reg) {
  return {lane / 4 + (reg % 2) * 8, lane % 4 + (reg / 2) * 4};
}
// A stored transposed (k along rows, m contiguous): the same (m, k) positions. (row = k, col = m)
HECTORGEN_TC_HD constexpr RowCol a_colmajor_tf32(int lane, int reg) {
  return {lane % 4 + (reg / 2) * 4, lane / 4 + (reg % 2) * 8};
}
// B (k along rows, n contiguous): b0 (k t, n g), b1 (k t + 4, n g). (row = k, col = n)
HECTORGEN_TC_HD constexpr RowCol b_tf32(int lane, int reg) { return {lane % 4 + reg * 4, lane / 4}; }

// ---- accumulators (both shapes): c0 c1 at (g, 2t), (g, 2t + 1); c2 c3 at (g + 8, 2t), (g + 8, 2t + 1).
HECTORGEN_TC_HD constexpr int c_row(int lane, int reg) { return lane / 4 + (reg / 2) * 8; }
HECTORGEN_TC_HD constexpr int c_col(int lane, int reg) { return (lane % 4) * 2 + reg % 2; }

// ---- shared-memory layouts: (row, col) -> element offset.

// Rows padded to kStride elements (the weight gradient's tiles: 64 + 8; the tf32 forward's: 32 + 4 and 64 + 8).
// A displacement is an add, which the compiler folds into the load's immediate offset: the tf32 fragments are
// 16 scalar loads a k step, and as XORs (Swizzled::displace) each of them would hold an address register.
template <int kStride>
struct Padded {
  HECTORGEN_TC_HD static constexpr int offset(int row, int col) { return row * kStride + col; }
  // offset(row + dr, col + dc) from o = offset(row, col)
  HECTORGEN_TC_HD static constexpr int displace(int o, int dr, int dc) { return o + dr * kStride + dc; }
};

// Dense rows of kCols elements of kElemBytes, the 16-byte chunks XOR-permuted (CuTe's Swizzle<B, 3, 3> in
// chunk units): chunk index l = row * chunks + col / vec becomes l ^ ((l >> 3) & mask), mask = min(chunks, 8) - 1.
// Within each 128-byte line of 8 chunks the chunk order is permuted by the line's index, so 8 rows of one
// 16-byte column (an ldmatrix phase) or the 4 x 8 words of a tf32 fragment land in 8 different bank quads,
// without the padding bytes; 16-byte copies stay 16-byte aligned and contiguous within a chunk.
template <int kCols, int kElemBytes>
struct Swizzled {
  static constexpr int kVec = 16 / kElemBytes, kChunks = kCols / kVec, kMask = (kChunks < 8 ? kChunks : 8) - 1;
  static_assert(kCols % kVec == 0 && kChunks >= 4 && (kChunks & (kChunks - 1)) == 0,
                "rows of 4, 8, 16... 16-byte chunks");
  HECTORGEN_TC_HD static constexpr int offset(int row, int col) {
    const int l = row * kChunks + col / kVec;
    return (l ^ ((l >> 3) & kMask)) * kVec + col % kVec;
  }
  // offset(row + dr, col + dc) from o = offset(row, col) as one XOR with a constant, valid when dc is a whole
  // number of chunks and the chunk indices of (row, col) and (dr, dc) share no set bit (then the swizzle of their
  // sum is the XOR of their swizzles). The kernels compute each lane's offset once and displace it by the
  // compile-time fragment, k-step and n-tile offsets; bench/gemm/fragment_check.cpp runs exactly these
  // displacements.
  HECTORGEN_TC_HD static constexpr int displace(int o, int dr, int dc) { return o ^ offset(dr, dc); }
};

}  // namespace hectorgen::tc::fragments

#undef HECTORGEN_TC_HD
