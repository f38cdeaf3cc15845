// The per-relation compaction policy of the runtime (runtime/include/hectorgen/compact_policy.h): the threshold rule
// that build_compact_mapping evaluates on the device and hectorgen_runtime's reference evaluates in Python, and which
// policies build_compact_mapping accepts.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "hectorgen/compact_policy.h"

using hectorgen::runtime::CompactPolicy;
using hectorgen::runtime::compacts_relation;

TEST_CASE("a relation is compacted iff unique pairs / edges <= threshold", "[runtime][compact_policy]") {
  CHECK(compacts_relation(0.5, 1, 2));      // the ratio equal to the threshold
  CHECK(compacts_relation(0.5, 2, 5));
  CHECK_FALSE(compacts_relation(0.5, 3, 5));
  CHECK(compacts_relation(0.8, 4, 5));      // 4.0 / 5.0 and the literal 0.8 are the same double
  CHECK_FALSE(compacts_relation(std::nextafter(0.8, 0.0), 4, 5));
  CHECK_FALSE(compacts_relation(0.3, 1, 3));  // 1/3 rounds above 0.3
  CHECK(compacts_relation(1.0 / 3.0, 1, 3));  // the same division on both sides
}

TEST_CASE("threshold edge cases: no edges, 0, 1 and above, large counts", "[runtime][compact_policy]") {
  // A relation without edges counts as compacted whatever the threshold (it has no rows either way).
  CHECK(compacts_relation(0.0, 0, 0));
  CHECK(compacts_relation(0.25, 0, 0));
  // Threshold 0 compacts no relation with edges; every such relation has at least one pair.
  CHECK_FALSE(compacts_relation(0.0, 1, 1));
  CHECK_FALSE(compacts_relation(0.0, 1, 1000000));
  // Ratios are at most 1: threshold 1 (or more, or infinity) compacts everything, including all-unique relations.
  CHECK(compacts_relation(1.0, 7, 7));
  CHECK(compacts_relation(2.0, 7, 7));
  CHECK(compacts_relation(std::numeric_limits<double>::infinity(), 7, 7));
  // int32-sized counts are exact doubles: a ratio just below 1 stays below it.
  const int64_t edges = std::numeric_limits<int32_t>::max() - 1;
  CHECK(compacts_relation(1.0, edges - 1, edges));
  CHECK_FALSE(compacts_relation(1.0 - 1e-9, edges - 1, edges));  // the ratio is 1 - 4.7e-10
}

TEST_CASE("which policies build_compact_mapping accepts", "[runtime][compact_policy]") {
  CHECK(CompactPolicy::all().valid());
  CHECK(CompactPolicy::all().kind == CompactPolicy::Kind::kAll);
  CHECK(CompactPolicy{}.kind == CompactPolicy::Kind::kAll);  // the default is the layout of runtime 1.2
  CHECK(CompactPolicy::ratio_at_most(0.0).valid());
  CHECK(CompactPolicy::ratio_at_most(0.35).threshold == 0.35);
  CHECK(CompactPolicy::ratio_at_most(std::numeric_limits<double>::infinity()).valid());
  CHECK_FALSE(CompactPolicy::ratio_at_most(-0.1).valid());
  CHECK_FALSE(CompactPolicy::ratio_at_most(std::nan("")).valid());
  const uint8_t mask[3] = {1, 0, 1};
  CHECK(CompactPolicy::relations(mask).valid());
  CHECK(CompactPolicy::relations(mask).mask == mask);
  CHECK_FALSE(CompactPolicy::relations(nullptr).valid());
}
