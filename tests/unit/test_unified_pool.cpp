// The pooled host allocator of unified tensors (runtime/include/hectorgen/unified_pool.h), over a counting fake
// of cudaHostAlloc: few source calls, reuse, coalescing, alignment, limits, exhaustion and trimming.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "hectorgen/unified_pool.h"

namespace {

using hectorgen::unified::HostPool;
using hectorgen::unified::PinnedMemoryExhausted;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// A source of page-aligned chunks that counts its calls and can be told to fail past a budget.
struct FakeSource {
  struct Log {
    std::map<void*, std::size_t> live;
    std::size_t allocations = 0;
    std::size_t releases = 0;
    std::size_t budget = SIZE_MAX;  // total live bytes the "system" lets us pin
    std::size_t live_bytes = 0;
  };
  std::shared_ptr<Log> log = std::make_shared<Log>();

  std::string last_failure() const { return log->live_bytes > 0 ? "over budget" : ""; }

  void* allocate(std::size_t bytes) {
    if (log->live_bytes + bytes > log->budget) return nullptr;
    void* chunk = std::aligned_alloc(4096, bytes);
    if (chunk == nullptr) return nullptr;
    ++log->allocations;
    log->live[chunk] = bytes;
    log->live_bytes += bytes;
    return chunk;
  }
  void release(void* chunk, std::size_t bytes) {
    REQUIRE(log->live.count(chunk) == 1);
    REQUIRE(log->live[chunk] == bytes);
    log->live.erase(chunk);
    log->live_bytes -= bytes;
    ++log->releases;
    std::free(chunk);
  }
};

}  // namespace

TEST_CASE("unified pool: many blocks come from one chunk and are reused", "[unified_pool]") {
  FakeSource source;
  auto log = source.log;
  {
    HostPool<FakeSource> pool(source, 8 * kMiB, 2 * kMiB);
    std::vector<void*> blocks;
    for (int i = 0; i < 100; ++i) blocks.push_back(pool.allocate(1000 + i));
    CHECK(log->allocations == 1);
    CHECK(pool.stats().chunks == 1);
    for (void* b : blocks) CHECK(reinterpret_cast<std::uintptr_t>(b) % HostPool<FakeSource>::kAlignment == 0);
    // Blocks are disjoint and writable over their whole size.
    for (std::size_t i = 0; i < blocks.size(); ++i) std::memset(blocks[i], int(i), 1000 + i);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      CHECK(static_cast<unsigned char*>(blocks[i])[999 + i] == static_cast<unsigned char>(i));
    }
    for (void* b : blocks) pool.deallocate(b);
    CHECK(pool.stats().in_use_bytes == 0);
    // After coalescing, the whole chunk is one free block again.
    CHECK(pool.stats().largest_free_block == 8 * kMiB);
    void* again = pool.allocate(8 * kMiB);
    CHECK(log->allocations == 1);
    pool.deallocate(again);
  }
  CHECK(log->live.empty());  // the destructor gives every chunk back
}

TEST_CASE("unified pool: a large request gets its own chunk, rounded to the granularity", "[unified_pool]") {
  FakeSource source;
  auto log = source.log;
  HostPool<FakeSource> pool(source, 4 * kMiB, 2 * kMiB);
  void* small = pool.allocate(100);
  void* big = pool.allocate(9 * kMiB + 1);
  CHECK(log->allocations == 2);
  CHECK(log->live.at(big) == 10 * kMiB);
  CHECK(pool.block_size(big) == 9 * kMiB + HostPool<FakeSource>::kAlignment);
  pool.deallocate(big);
  // The freed large chunk serves the next large request without a new source call.
  void* big2 = pool.allocate(6 * kMiB);
  CHECK(log->allocations == 2);
  pool.deallocate(big2);
  pool.deallocate(small);
  CHECK(pool.trim() == 14 * kMiB);
  CHECK(log->live.empty());
  CHECK(pool.stats().reserved_bytes == 0);
}

TEST_CASE("unified pool: coalescing in any free order gives back the whole chunk", "[unified_pool]") {
  FakeSource source;
  auto log = source.log;
  HostPool<FakeSource> pool(source, 2 * kMiB, 2 * kMiB);
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::vector<void*> blocks;
    std::size_t used = 0;
    while (true) {
      const std::size_t size = 256 * (1 + rng() % 64);
      if (used + size > 2 * kMiB) break;
      blocks.push_back(pool.allocate(size));
      used += size;
    }
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (void* b : blocks) pool.deallocate(b);
    REQUIRE(pool.stats().largest_free_block == 2 * kMiB);
  }
  CHECK(log->allocations == 1);
}

TEST_CASE("unified pool: exhaustion is an error naming the sizes, after free chunks are released", "[unified_pool]") {
  FakeSource source;
  auto log = source.log;
  log->budget = 6 * kMiB;
  HostPool<FakeSource> pool(source, 4 * kMiB, 2 * kMiB);
  void* a = pool.allocate(3 * kMiB);
  // A second chunk of 4 MiB would pass the budget; the first chunk is in use, so nothing can be released.
  try {
    pool.allocate(3 * kMiB);
    FAIL("expected PinnedMemoryExhausted");
  } catch (const PinnedMemoryExhausted& error) {
    CHECK_THAT(error.what(), Catch::Contains("cannot get 4194304 bytes of pinned host memory") &&
                                 Catch::Contains("3145728 bytes") && Catch::Contains("in use; over budget)"));
  }
  pool.deallocate(a);
  // Now the unused chunk is released and a 5 MiB chunk (6 MiB rounded) fits the budget.
  void* b = pool.allocate(5 * kMiB);
  CHECK(log->releases == 1);
  CHECK(log->live.at(b) == 6 * kMiB);
  pool.deallocate(b);
}

TEST_CASE("unified pool: a limit refuses requests past it", "[unified_pool]") {
  FakeSource source;
  HostPool<FakeSource> pool(source, 2 * kMiB, 2 * kMiB);
  pool.set_limit(1 * kMiB);
  void* a = pool.allocate(kMiB / 2);
  CHECK_THROWS_AS(pool.allocate(kMiB / 2 + 1), PinnedMemoryExhausted);
  pool.deallocate(a);
  pool.set_limit(0);
  void* b = pool.allocate(kMiB + 1);
  pool.deallocate(b);
}

TEST_CASE("unified pool: foreign pointers are refused", "[unified_pool]") {
  FakeSource source;
  HostPool<FakeSource> pool(source, 2 * kMiB, 2 * kMiB);
  int local = 0;
  CHECK_THROWS_AS(pool.deallocate(&local), std::invalid_argument);
  void* a = pool.allocate(512);
  CHECK_THROWS_AS(pool.deallocate(static_cast<char*>(a) + 256), std::invalid_argument);
  pool.deallocate(a);
  CHECK_THROWS_AS(pool.deallocate(a), std::invalid_argument);  // double free
  pool.deallocate(nullptr);
  CHECK(pool.block_size(&local) == 0);
}
