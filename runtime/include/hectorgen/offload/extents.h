// Sub-allocation of one contiguous byte range (a pinned host arena, an offload file): first fit over a free list
// sorted by offset, neighbours merged on free. Offsets and sizes are rounded up to the alignment, so every block
// can be the target of an O_DIRECT transfer. Not thread-safe (the owner locks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

namespace hectorgen::offload {

class ExtentAllocator {
 public:
  ExtentAllocator(std::uint64_t capacity, std::uint64_t alignment);

  // The offset of a free block of at least `bytes` (rounded up to the alignment), or nothing when no free block is
  // large enough. A request of 0 bytes takes one alignment unit, so that every block has a distinct offset.
  std::optional<std::uint64_t> allocate(std::uint64_t bytes);
  // Returns the block at `offset` (which allocate returned and was not freed since).
  void free(std::uint64_t offset);

  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t used() const { return used_; }
  std::uint64_t peak() const { return peak_; }
  std::uint64_t largest_free() const;
  std::size_t blocks() const { return allocated_.size(); }
  std::uint64_t rounded(std::uint64_t bytes) const;

 private:
  std::uint64_t capacity_;
  std::uint64_t alignment_;
  std::uint64_t used_ = 0;
  std::uint64_t peak_ = 0;
  std::map<std::uint64_t, std::uint64_t> free_;       // offset -> size, disjoint and never adjacent
  std::map<std::uint64_t, std::uint64_t> allocated_;  // offset -> size
};

}  // namespace hectorgen::offload
