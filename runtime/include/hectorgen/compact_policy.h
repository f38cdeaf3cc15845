// Per-relation choice of compact materialization (hectorgen/graph.h, build_compact_mapping): which relations get
// one row per unique (node, relation) pair, and which keep one row per edge.
//
// Compaction pays where a relation repeats its (node, relation) pairs: data that depends only on the pair is then
// computed and stored once per pair instead of once per edge. A relation with few repeats (unique pairs / edges
// close to 1) gains nothing and pays for the extra indirection, so a policy may leave it uncompacted. An
// uncompacted relation still appears in the compact mapping, with one pair per edge, so kernels written for the
// compact layout run unchanged on any mix of compacted and uncompacted relations.
//
// Plain C++17 without CUDA headers (unit-tested on the host); the decision rule is also callable from device code.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define HECTORGEN_HOST_DEVICE __host__ __device__
#else
#define HECTORGEN_HOST_DEVICE
#endif

namespace hectorgen::runtime {

// Which relations build_compact_mapping compacts.
struct CompactPolicy {
  enum class Kind : uint8_t {
    kAll,        // every relation (the layout of runtime 1.2 and earlier)
    kThreshold,  // relation r iff it has no edges or unique_pairs_r / edges_r <= threshold (compacts_relation)
    kMask,       // relation r iff mask[r] != 0
  };
  Kind kind = Kind::kAll;
  double threshold = 0.0;         // kThreshold: >= 0 (a ratio is in (0, 1], so >= 1 compacts every relation)
  const uint8_t* mask = nullptr;  // kMask: device array [R]

  static CompactPolicy all() { return CompactPolicy{}; }
  static CompactPolicy ratio_at_most(double threshold) { return CompactPolicy{Kind::kThreshold, threshold, nullptr}; }
  static CompactPolicy relations(const uint8_t* device_mask) { return CompactPolicy{Kind::kMask, 0.0, device_mask}; }

  // A threshold that is a number >= 0 (not NaN), a mask that is given.
  bool valid() const {
    switch (kind) {
      case Kind::kAll: return true;
      case Kind::kThreshold: return !std::isnan(threshold) && threshold >= 0.0;
      case Kind::kMask: return mask != nullptr;
    }
    return false;
  }
};

// Optional per-relation outputs of build_compact_mapping: device arrays [R], each may be nullptr (not written).
struct CompactChoice {
  int32_t* unique_pairs = nullptr;  // unique (node, r) pairs of relation r: its pair rows if it is compacted
  uint8_t* compacted = nullptr;     // 1 where relation r was compacted, else 0 (one pair row per edge)
};

// The threshold rule: a relation with `edges` edges, `unique_pairs` of them with distinct nodes, is compacted iff it
// has no edges or unique_pairs / edges <= threshold, the ratio an IEEE double division (correctly rounded, the same
// on the host, on the device and in Python). threshold 0 compacts only relations without edges.
HECTORGEN_HOST_DEVICE inline bool compacts_relation(double threshold, int64_t unique_pairs, int64_t edges) {
  return edges == 0 || static_cast<double>(unique_pairs) / static_cast<double>(edges) <= threshold;
}

}  // namespace hectorgen::runtime
