// The zero-copy gather's address arithmetic (runtime/include/hectorgen/unified_gather.h), checked by emulating a lane
// group of the kernel on the host: every row width and table/output alignment copies exactly the row's bytes, loads
// only the 16-byte sectors overlapping the row (never outside its allocation's sectors), every load instruction stays
// inside whole aligned 128-byte lines, and every store is aligned to its width.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hectorgen/unified_gather.h"

namespace {

namespace gm = hectorgen::unified::gather_math;

struct Emulation {
  std::int64_t loads = 0;            // 16-byte sector loads
  std::int64_t load_instructions = 0;  // (step, unroll slot) pairs with at least one lane loading
  std::vector<std::string> problems;
};

// One row through the kernel's steps, lane by lane: the loads of a step by every lane, then its stores.
template <int kLanes, int kStore>
void emulate_row(const unsigned char* source, std::int64_t row_bytes, unsigned char* dst, Emulation& e) {
  const auto start = reinterpret_cast<std::uintptr_t>(source);
  const gm::RowSpan span = gm::row_span(start, row_bytes);
  const std::uintptr_t envelope_begin = start & ~std::uintptr_t{15};
  const std::uintptr_t envelope_end = (start + static_cast<std::uintptr_t>(row_bytes) + 15) & ~std::uintptr_t{15};
  for (std::int64_t base = 0; base < span.end; base += gm::step_bytes<kLanes>()) {
    unsigned char stage[kLanes * gm::kUnroll][16] = {};
    for (int u = 0; u < gm::kUnroll; ++u) {
      bool any = false;
      const std::uintptr_t window = span.line + static_cast<std::uintptr_t>(gm::sector<kLanes>(base, u, 0));
      for (int sub = 0; sub < kLanes; ++sub) {
        const std::int64_t at = gm::sector<kLanes>(base, u, sub);
        if (!gm::overlaps(at, span)) continue;
        const std::uintptr_t address = span.line + static_cast<std::uintptr_t>(at);
        if (address < envelope_begin || address + 16 > envelope_end) e.problems.push_back("load outside the row");
        if (window % 128 != 0 || address < window || address + 16 > window + kLanes * 16) {
          e.problems.push_back("a load instruction leaves its aligned lines");
        }
        std::memcpy(stage[u * kLanes + sub], reinterpret_cast<const void*>(address), 16);
        ++e.loads;
        any = true;
      }
      e.load_instructions += any;
    }
    if constexpr (kStore == 16) {
      for (int sub = 0; sub < kLanes; ++sub) {
        for (int u = 0; u < gm::kUnroll; ++u) {
          const std::int64_t at = gm::sector<kLanes>(base, u, sub);
          if (!gm::inside(at, span)) continue;
          unsigned char* target = dst + (at - span.head);
          if (reinterpret_cast<std::uintptr_t>(target) % 16 != 0) e.problems.push_back("misaligned 16-byte store");
          std::memcpy(target, stage[u * kLanes + sub], 16);
        }
      }
    } else {
      std::int64_t lo = 0, hi = 0;
      gm::step_range<kLanes>(base, span, lo, hi);
      const unsigned char* stage_bytes = &stage[0][0];
      for (int sub = 0; sub < kLanes; ++sub) {
        for (std::int64_t b = lo + std::int64_t{sub} * kStore; b < hi; b += std::int64_t{kLanes} * kStore) {
          unsigned char* target = dst + (b - span.head);
          if (reinterpret_cast<std::uintptr_t>(target) % kStore != 0 || (b - base) % kStore != 0) {
            e.problems.push_back("misaligned store");
          }
          if (b + kStore > base + gm::step_bytes<kLanes>()) e.problems.push_back("store reads past the stage");
          std::memcpy(target, stage_bytes + (b - base), kStore);
        }
      }
    }
  }
}

template <int kLanes>
void emulate_lanes(int store, const unsigned char* source, std::int64_t row_bytes, unsigned char* dst, Emulation& e) {
  switch (store) {
    case 16: emulate_row<kLanes, 16>(source, row_bytes, dst, e); break;
    case 8: emulate_row<kLanes, 8>(source, row_bytes, dst, e); break;
    case 4: emulate_row<kLanes, 4>(source, row_bytes, dst, e); break;
    case 2: emulate_row<kLanes, 2>(source, row_bytes, dst, e); break;
    default: emulate_row<kLanes, 1>(source, row_bytes, dst, e); break;
  }
}

// Gathers `rows` rows of a table at byte offset table_offset of an aligned buffer into an output at out_offset, the
// way launch_gather picks lanes and store width; returns the emulation's record. Checks the bytes.
Emulation gather(std::int64_t row_bytes, std::size_t table_offset, std::size_t out_offset, std::mt19937& rng) {
  constexpr std::int64_t kRows = 37;
  constexpr std::size_t kPad = 256;  // sectors of the first and last rows' lines lie in the padding
  const std::size_t table_bytes = static_cast<std::size_t>(kRows * row_bytes);
  std::vector<unsigned char> table_buffer(table_bytes + 2 * kPad + 256);
  auto* aligned = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(table_buffer.data()) + kPad +
                                                    255) & ~std::uintptr_t{255});
  unsigned char* table = aligned + table_offset;
  for (std::size_t i = 0; i < table_bytes; ++i) table[i] = static_cast<unsigned char>(rng());
  std::vector<unsigned char> out_buffer(table_bytes + 1024, 0xEE);
  auto* out = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(out_buffer.data()) + 256 + 255) &
                                               ~std::uintptr_t{255}) + out_offset;

  const int lanes = gm::lanes_per_row(row_bytes);
  const int store = gm::widest_store(reinterpret_cast<std::uintptr_t>(table), static_cast<std::uintptr_t>(row_bytes),
                                     reinterpret_cast<std::uintptr_t>(out));
  Emulation e;
  std::vector<std::int64_t> index(kRows);
  for (auto& r : index) r = static_cast<std::int64_t>(rng() % kRows);
  for (std::int64_t i = 0; i < kRows; ++i) {
    const unsigned char* source = table + index[i] * row_bytes;
    unsigned char* dst = out + i * row_bytes;
    switch (lanes) {
      case 8: emulate_lanes<8>(store, source, row_bytes, dst, e); break;
      case 16: emulate_lanes<16>(store, source, row_bytes, dst, e); break;
      default: emulate_lanes<32>(store, source, row_bytes, dst, e); break;
    }
  }
  for (std::int64_t i = 0; i < kRows; ++i) {
    if (std::memcmp(out + i * row_bytes, table + index[i] * row_bytes, static_cast<std::size_t>(row_bytes)) != 0) {
      e.problems.push_back("row " + std::to_string(i) + " differs");
    }
  }
  // Nothing written around the output.
  if (out[-1] != 0xEE || out[kRows * row_bytes] != 0xEE) e.problems.push_back("write outside the output");
  return e;
}

}  // namespace

TEST_CASE("unified gather: every width and alignment copies exactly the rows", "[unified_gather]") {
  std::mt19937 rng(11);
  for (std::int64_t row_bytes : {1, 2, 3, 4, 8, 12, 16, 100, 127, 128, 129, 130, 256, 260, 512, 1000, 1024, 2052,
                                 4096, 4100, 16384}) {
    for (std::size_t table_offset : {0, 1, 2, 4, 8, 16, 100, 128}) {
      for (std::size_t out_offset : {0, 4, 16}) {
        const Emulation e = gather(row_bytes, table_offset, out_offset, rng);
        INFO("row_bytes " << row_bytes << ", table offset " << table_offset << ", out offset " << out_offset);
        CHECK(e.problems.empty());
        if (!e.problems.empty()) FAIL_CHECK(e.problems.front());
      }
    }
  }
}

TEST_CASE("unified gather: store widths follow the alignment of table, rows and output", "[unified_gather]") {
  CHECK(gm::widest_store(0x1000, 2052, 0x2000) == 4);
  CHECK(gm::widest_store(0x1000, 4096, 0x2000) == 16);
  CHECK(gm::widest_store(0x1008, 4096, 0x2000) == 8);
  CHECK(gm::widest_store(0x1000, 4096, 0x2002) == 2);
  CHECK(gm::widest_store(0x1000, 3, 0x2000) == 1);
  CHECK(gm::lanes_per_row(128) == 8);
  CHECK(gm::lanes_per_row(200) == 16);
  CHECK(gm::lanes_per_row(2052) == 32);
}

TEST_CASE("unified gather: misaligned rows cost whole lines, not more", "[unified_gather]") {
  std::mt19937 rng(5);
  // A 2052-byte row spans 17 lines at most: with 32 lanes x 16 bytes per load instruction (4 lines), 5 instructions
  // and at most 17 * 8 sectors.
  const Emulation e = gather(2052, 4, 0, rng);
  REQUIRE(e.problems.empty());
  CHECK(e.load_instructions <= 37 * 5);
  CHECK(e.loads <= 37 * 17 * 8);
  // Aligned 128-byte rows: one instruction (8 lanes) and 8 sectors per row.
  const Emulation aligned = gather(128, 0, 0, rng);
  REQUIRE(aligned.problems.empty());
  CHECK(aligned.load_instructions == 37);
  CHECK(aligned.loads == 37 * 8);
}
