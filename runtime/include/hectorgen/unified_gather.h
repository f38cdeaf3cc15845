// The address arithmetic of the zero-copy gather kernel (runtime/src/unified.cu), shared with a host emulation
// that checks it on any machine (tests/unit/test_unified_pool.cpp). Plain C++17, also compiled by nvcc.
//
// A group of kLanes lanes copies one row of row_bytes bytes that starts at byte address `start` of the table. The
// row's bytes are [head, end) relative to `line`, the 128-byte line holding its first byte. The group walks steps of
// kStep = kLanes * 16 * kUnroll bytes from `line`; in a step, lane `sub` loads, for u in [0, kUnroll), the 16-byte
// sector at offset base + (u * kLanes + sub) * 16 when that sector overlaps the row: every load instruction of the
// group (one u) covers whole aligned lines (kLanes * 16 is 128, 256 or 512), which is what PCIe requests are made of.
// Then either
//   direct (store width 16): the lane stores its sectors inside [head, end) to dst + (offset - head), or
//   staged (narrower): the group's sectors go to shared memory (sector j of the step at byte 16 j), and lane `sub`
//     copies the row bytes of the step, [lo, hi), in words of kStore bytes (b = lo + sub * kStore, step
//     kLanes * kStore) from stage + (b - base) to dst + (b - head).
// kStore must divide the table's address, row_bytes and the output's address, so that every row starts aligned to it
// in both (widest_store); then head, lo and hi are multiples of kStore.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HG_UNIFIED_HD __host__ __device__ __forceinline__
#else
#define HG_UNIFIED_HD inline
#endif

namespace hectorgen::unified::gather_math {

constexpr int kUnroll = 4;  // 16-byte loads in flight per lane before the first store

struct RowSpan {
  std::uintptr_t line;  // the 128-byte aligned address of the row's first line
  std::int64_t head;    // the row's first byte, from `line` (0..127)
  std::int64_t end;     // one past its last byte, from `line`
};

HG_UNIFIED_HD RowSpan row_span(std::uintptr_t start, std::int64_t row_bytes) {
  const std::uintptr_t line = start & ~std::uintptr_t{127};
  const auto head = static_cast<std::int64_t>(start - line);
  return {line, head, head + row_bytes};
}

template <int kLanes>
HG_UNIFIED_HD constexpr std::int64_t step_bytes() {
  return std::int64_t{kLanes} * 16 * kUnroll;
}

// The offset (from `line`) of the sector that lane `sub` loads for unroll slot u in the step at `base`.
template <int kLanes>
HG_UNIFIED_HD std::int64_t sector(std::int64_t base, int u, int sub) {
  return base + (std::int64_t{u} * kLanes + sub) * 16;
}

// Whether the sector at `at` holds bytes of the row (it is loaded).
HG_UNIFIED_HD bool overlaps(std::int64_t at, const RowSpan& row) { return at + 16 > row.head && at < row.end; }

// Whether the whole sector at `at` is row bytes (direct stores; with store width 16 an overlapping sector is).
HG_UNIFIED_HD bool inside(std::int64_t at, const RowSpan& row) { return at >= row.head && at < row.end; }

// The row bytes of the step at `base`, [lo, hi) from `line` (empty when lo >= hi).
template <int kLanes>
HG_UNIFIED_HD void step_range(std::int64_t base, const RowSpan& row, std::int64_t& lo, std::int64_t& hi) {
  lo = base > row.head ? base : row.head;
  hi = base + step_bytes<kLanes>() < row.end ? base + step_bytes<kLanes>() : row.end;
}

// The widest store (16, 8, 4, 2 or 1 bytes) that the table address, the row width and the output address are all
// aligned to.
HG_UNIFIED_HD int widest_store(std::uintptr_t table, std::uintptr_t row_bytes, std::uintptr_t out) {
  const std::uintptr_t bits = table | row_bytes | out;
  int width = 16;
  while (width > 1 && (bits & static_cast<std::uintptr_t>(width - 1)) != 0) width /= 2;
  return width;
}

// Lanes that share a row: enough 16-byte sectors per load instruction for the row, at most a warp.
HG_UNIFIED_HD int lanes_per_row(std::int64_t row_bytes) { return row_bytes <= 128 ? 8 : row_bytes <= 256 ? 16 : 32; }

}  // namespace hectorgen::unified::gather_math
