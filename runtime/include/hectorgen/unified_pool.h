// A pool of host memory carved out of a few large chunks: the allocator behind unified tensors
// (hectorgen/unified.h), separated from CUDA so that its logic is testable on any machine.
//
// Pinned, GPU-mapped host memory is expensive to get: every cudaHostAlloc is a system call that pins and maps
// pages (milliseconds for large sizes) and synchronises the device. The pool asks its `Source` for chunks of at
// least `chunk_bytes` (a larger request gets a chunk of its own, rounded up to `chunk_granularity`) and
// sub-allocates them; a freed block returns to its chunk, coalesced with free neighbours, and is reused by later
// requests. Chunks go back to the source only in trim() (all free chunks) or, when the source fails, before the
// pool retries once.
//
// Source is a type with
//   void* allocate(std::size_t bytes)           nullptr when it cannot (never throws)
//   void release(void* chunk, std::size_t bytes)
//   std::string last_failure() const            why the last allocate failed, for the error message ("" if unknown)
// Blocks are aligned to kAlignment bytes (two 128-byte cache lines, which GPU reads over PCIe are made of) when
// the source's chunks are (page-aligned chunks are). Thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

namespace hectorgen::unified {

// The pool cannot serve a request: the source refused a new chunk even after the free chunks were released, or the
// request would pass the pool's limit (set_limit). The message says which, with the sizes.
class PinnedMemoryExhausted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct PoolStats {
  std::size_t reserved_bytes = 0;  // held in chunks (from the source)
  std::size_t in_use_bytes = 0;    // handed out in blocks (rounded up to kAlignment)
  std::size_t chunks = 0;
  std::size_t source_allocations = 0;  // chunks asked of the source over the pool's lifetime
  std::size_t source_releases = 0;
  std::size_t largest_free_block = 0;
};

template <class Source>
class HostPool {
 public:
  static constexpr std::size_t kAlignment = 256;

  explicit HostPool(Source source, std::size_t chunk_bytes = std::size_t{256} << 20,
                    std::size_t chunk_granularity = std::size_t{2} << 20)
      : source_(std::move(source)), chunk_bytes_(round_up(chunk_bytes, chunk_granularity)),
        granularity_(chunk_granularity) {}

  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // Releases every chunk, including those with blocks still in use (the owner of the pool outlives its blocks).
  ~HostPool() {
    for (auto& [base, chunk] : chunks_) source_.release(base, chunk.bytes);
  }

  // A block of at least `bytes` bytes (bytes == 0 gives a block of kAlignment bytes, so every block is distinct).
  // Throws PinnedMemoryExhausted.
  void* allocate(std::size_t bytes) {
    const std::size_t size = round_up(std::max<std::size_t>(bytes, 1), kAlignment);
    std::lock_guard<std::mutex> lock(mutex_);
    if (limit_ && in_use_ + size > limit_) {
      throw PinnedMemoryExhausted("unified memory pool: a request of " + std::to_string(bytes) + " bytes would pass "
                                  "the pool's limit of " + std::to_string(limit_) + " bytes (" +
                                  std::to_string(in_use_) + " in use)");
    }
    if (void* block = take_free(size)) return block;
    const std::size_t chunk_size = size > chunk_bytes_ ? round_up(size, granularity_) : chunk_bytes_;
    char* base = static_cast<char*>(source_.allocate(chunk_size));
    if (base == nullptr) {
      release_free_chunks();  // give back what is unused, then try once more
      base = static_cast<char*>(source_.allocate(chunk_size));
    }
    if (base == nullptr) {
      const std::string why = source_.last_failure();
      throw PinnedMemoryExhausted("unified memory pool: cannot get " + std::to_string(chunk_size) +
                                  " bytes of pinned host memory for a request of " + std::to_string(bytes) +
                                  " bytes (the pool holds " + std::to_string(reserved_) + " bytes, " +
                                  std::to_string(in_use_) + " in use" + (why.empty() ? "" : "; " + why) +
                                  "); free unified tensors, or lower the memory locked by other processes");
    }
    ++source_allocations_;
    reserved_ += chunk_size;
    Chunk& chunk = chunks_[base];
    chunk.bytes = chunk_size;
    chunk.free_blocks[base] = chunk_size;
    free_by_size_.emplace(chunk_size, base);
    return take_free(size);
  }

  // Returns a block from allocate() to its chunk. nullptr is ignored; anything else not from allocate() throws
  // std::invalid_argument.
  void deallocate(void* pointer) {
    if (pointer == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto used = used_.find(static_cast<char*>(pointer));
    if (used == used_.end()) throw std::invalid_argument("unified memory pool: pointer not allocated by this pool");
    char* block = used->first;
    std::size_t size = used->second;
    used_.erase(used);
    in_use_ -= size;
    Chunk& chunk = chunk_of(block)->second;
    // Coalesce with the free neighbours inside the chunk.
    auto next = chunk.free_blocks.lower_bound(block);
    if (next != chunk.free_blocks.end() && block + size == next->first) {
      erase_by_size(next->first, next->second);
      size += next->second;
      next = chunk.free_blocks.erase(next);
    }
    if (next != chunk.free_blocks.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second == block) {
        erase_by_size(previous->first, previous->second);
        block = previous->first;
        size += previous->second;
        chunk.free_blocks.erase(previous);
      }
    }
    chunk.free_blocks[block] = size;
    free_by_size_.emplace(size, block);
  }

  // The size of the block that `pointer` (from allocate) starts, or 0 when it starts none.
  std::size_t block_size(const void* pointer) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto used = used_.find(static_cast<char*>(const_cast<void*>(pointer)));
    return used == used_.end() ? 0 : used->second;
  }

  // Gives every chunk without a block in use back to the source; returns the bytes released.
  std::size_t trim() {
    std::lock_guard<std::mutex> lock(mutex_);
    return release_free_chunks();
  }

  // At most `bytes` in use at once (0: no limit); requests that would pass it throw PinnedMemoryExhausted.
  void set_limit(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = bytes;
  }

  PoolStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    PoolStats s;
    s.reserved_bytes = reserved_;
    s.in_use_bytes = in_use_;
    s.chunks = chunks_.size();
    s.source_allocations = source_allocations_;
    s.source_releases = source_releases_;
    s.largest_free_block = free_by_size_.empty() ? 0 : std::prev(free_by_size_.end())->first;
    return s;
  }

  Source& source() { return source_; }

 private:
  struct Chunk {
    std::size_t bytes = 0;
    std::map<char*, std::size_t> free_blocks;  // start -> size, ordered by address for coalescing
  };

  static std::size_t round_up(std::size_t value, std::size_t multiple) {
    return (value + multiple - 1) / multiple * multiple;
  }

  typename std::map<char*, Chunk>::iterator chunk_of(char* pointer) {
    auto it = chunks_.upper_bound(pointer);
    return std::prev(it);  // the caller guarantees that pointer lies in a chunk
  }

  void erase_by_size(char* block, std::size_t size) {
    auto [first, last] = free_by_size_.equal_range(size);
    for (auto it = first; it != last; ++it) {
      if (it->second == block) {
        free_by_size_.erase(it);
        return;
      }
    }
  }

  // Best fit: the smallest free block that holds `size`; the rest stays free. nullptr when none does.
  void* take_free(std::size_t size) {
    auto fit = free_by_size_.lower_bound(size);
    if (fit == free_by_size_.end()) return nullptr;
    const auto [free_size, block] = *fit;
    free_by_size_.erase(fit);
    Chunk& chunk = chunk_of(block)->second;
    chunk.free_blocks.erase(block);
    if (free_size > size) {
      chunk.free_blocks[block + size] = free_size - size;
      free_by_size_.emplace(free_size - size, block + size);
    }
    used_[block] = size;
    in_use_ += size;
    return block;
  }

  std::size_t release_free_chunks() {
    std::size_t released = 0;
    for (auto it = chunks_.begin(); it != chunks_.end();) {
      Chunk& chunk = it->second;
      const bool unused = chunk.free_blocks.size() == 1 && chunk.free_blocks.begin()->first == it->first &&
                          chunk.free_blocks.begin()->second == chunk.bytes;
      if (!unused) {
        ++it;
        continue;
      }
      erase_by_size(it->first, chunk.bytes);
      source_.release(it->first, chunk.bytes);
      ++source_releases_;
      reserved_ -= chunk.bytes;
      released += chunk.bytes;
      it = chunks_.erase(it);
    }
    return released;
  }

  Source source_;
  const std::size_t chunk_bytes_;
  const std::size_t granularity_;
  mutable std::mutex mutex_;
  std::map<char*, Chunk> chunks_;                      // base -> chunk
  std::multimap<std::size_t, char*> free_by_size_;     // every free block of every chunk, by size
  std::map<char*, std::size_t> used_;                  // block -> size
  std::size_t reserved_ = 0;
  std::size_t in_use_ = 0;
  std::size_t limit_ = 0;
  std::size_t source_allocations_ = 0;
  std::size_t source_releases_ = 0;
};

}  // namespace hectorgen::unified
