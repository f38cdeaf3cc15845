#include "hectorgen/offload/extents.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace hectorgen::offload {

ExtentAllocator::ExtentAllocator(std::uint64_t capacity, std::uint64_t alignment)
    : capacity_(capacity), alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw std::invalid_argument("offload: extent alignment must be a power of two, got " + std::to_string(alignment));
  }
  capacity_ -= capacity_ % alignment_;
  if (capacity_ > 0) {
    free_.emplace(0, capacity_);
  }
}

std::uint64_t ExtentAllocator::rounded(std::uint64_t bytes) const {
  return std::max<std::uint64_t>(alignment_, (bytes + alignment_ - 1) / alignment_ * alignment_);
}

std::optional<std::uint64_t> ExtentAllocator::allocate(std::uint64_t bytes) {
  if (bytes > capacity_) {
    return std::nullopt;
  }
  const std::uint64_t size = rounded(bytes);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) {
      continue;
    }
    const std::uint64_t offset = it->first;
    const std::uint64_t rest = it->second - size;
    free_.erase(it);
    if (rest > 0) {
      free_.emplace(offset + size, rest);
    }
    allocated_.emplace(offset, size);
    used_ += size;
    peak_ = std::max(peak_, used_);
    return offset;
  }
  return std::nullopt;
}

void ExtentAllocator::free(std::uint64_t offset) {
  const auto block = allocated_.find(offset);
  if (block == allocated_.end()) {
    throw std::logic_error("offload: freeing extent " + std::to_string(offset) + ", which is not allocated");
  }
  std::uint64_t start = offset;
  std::uint64_t size = block->second;
  allocated_.erase(block);
  used_ -= size;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == start) {
      start = previous->first;
      size += previous->second;
      free_.erase(previous);
    }
  }
  free_.emplace(start, size);
}

std::uint64_t ExtentAllocator::largest_free() const {
  std::uint64_t largest = 0;
  for (const auto& [offset, size] : free_) {
    largest = std::max(largest, size);
  }
  return largest;
}

}  // namespace hectorgen::offload
