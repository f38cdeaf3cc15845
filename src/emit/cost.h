// The cost model of materialization: auto (docs/materialization.md). A generated auto module holds two programs,
// vanilla and compact, and picks one per graph when the graph is prepared. What it compares is, per phase,
//
//     seconds = launches * launch_us * 1e-6 + bytes / (bandwidth_gbs * 1e9)
//             + gather_rows * gather_row_ns * 1e-9 + search_rows * rounds(etypes) * search_round_ns * 1e-9
//
// with bytes a linear function of the graph's counts: so many bytes per node, per edge, per unique (source, edge
// type) pair, per edge type, per node type, and fixed; and gather_rows, likewise, the rows of the gather sums: the
// kernels that read through the pair and edge maps (a pair's edges, a node's pairs), one warp per row. Such a row
// waits on a chain of dependent loads (its CSR offsets, its entries' ids, their indices) before its first data and
// then reads only a few scattered rows (1.6 edges per pair on wikikg2), so its time is that latency over the warps
// the GPU keeps in flight, not its bytes: on wikikg2 (16M edges, 10M pairs) the compact program's gather sums over
// 10M pair rows made its training step 13% slower than vanilla's (RGAT and RGCN) while its bytes were 10-25% fewer.
// Where a gather sum's rows average fewer entries than its rows variant's threshold, the launcher runs that variant,
// a group of lanes a row and several rows a warp, whose rows wait together: such a row counts 1 / groups of a
// gather row (GroupedRows, decided per graph like the launcher).
// search_rows are the rows that find their edge type by a search of the per-type offsets (a pair's type in RGAT's
// compact traversals: warp_segment_of), the 32 lanes of the row's warp together: rounds(etypes) = ceil(log2(etypes)
// / 5) rounds of one load each, 2 for wikikg2's 535 relations (a binary search took 9 dependent loads). The coefficients come from the lowered kernels (what each
// kernel reads and writes per row of its domain), here, at generation time; the module evaluates them on the
// graph's counts at prepare time. launch_us, bandwidth_gbs and the per-relation compaction threshold theta come
// from templates/tuning/materialization.json, per GPU architecture: ESTIMATES until calibrated on the GPU.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/intra/intra.h"

namespace hectorgen::emit {

// What a byte count is per: the coefficient's index in Bytes.
enum class CostDomain { Fixed, Node, Edge, Pair, Etype, Ntype };
inline constexpr size_t kCostDomains = 6;
const char* to_string(CostDomain d);  // fixed, node, edge, pair, etype, ntype

// Bytes moved as coefficients of (1, nodes, edges, pairs, etypes, ntypes).
using Bytes = std::array<double, kCostDomains>;

// The rows of a gather sum that has a rows variant (intra::gather_sum_rows): where its rows average fewer than
// `below` entries, `groups` rows share a warp and their latencies overlap, so each counts 1 / groups of a gather row.
struct GroupedRows {
  CostDomain rows = CostDomain::Pair;     // what a row is: a pair (a pair's edges) or a node (a node's pairs)
  CostDomain entries = CostDomain::Edge;  // what its entries are
  int below = 0;
  int groups = 1;
  bool operator==(const GroupedRows&) const = default;
};

// The estimate of one phase (one op): kernel launches (ATen calls of a PyTorch fallback count as launches too)
// and bytes moved through global memory.
struct PhaseCost {
  std::string phase;
  int launches = 0;
  Bytes bytes{};
  Bytes gather_rows{};  // rows of gather sums, per domain (coefficients of the same counts as bytes)
  Bytes search_rows{};  // rows that search their edge type (rounds(etypes) rounds each), per domain
  // the rows of gather sums with a rows variant, one entry a kernel (not in gather_rows: what they cost depends on
  // the graph's entries per row)
  std::vector<GroupedRows> grouped_rows{};
};

// One kernel's launches and bytes: every tensor row it reads or writes, once per row of the domain it is read in
// (a gathered node row read per edge counts per edge); rows of weights and other per-type data count once (they
// stay in cache); graph index arrays 4 bytes per read; zero-initialised results one extra write; each row of a
// gather sum one gather row; each row that searches its edge type (a pair's) one search row.
PhaseCost kernel_cost(const intra::Program& p, const intra::Kernel& k);
// The sum over the phase's kernels, plus the zeroing of the tensors the op allocates zeroed.
PhaseCost phase_cost(const intra::Program& p);
// A backward's cost by the gradients it computes. The op runs a kernel, and fills a zeroed tensor, only when a
// result it feeds is asked for (emit_op's grad_mask; `fed[i]`: the results kernel i feeds, results_fed), so its
// cost on a call is the sum of the parts whose key shares a bit with the call's mask. Key: the results a part feeds,
// a bit mask over the op's `results` (all bits: what every gradient needs). The parts add up to phase_cost(p).
std::map<uint64_t, PhaseCost> cost_by_results(const intra::Program& p, const std::vector<std::string>& results,
                                              const std::vector<std::set<size_t>>& fed);

// A graph's counts, as the module reads them from the prepared Graph.
struct GraphCounts {
  double nodes = 0, edges = 0, pairs = 0, etypes = 1, ntypes = 1;
};

// One architecture's row of the tuning table.
struct Tuning {
  double launch_us = 0;      // seconds per kernel launch, in microseconds (launch and the gap between kernels)
  double bandwidth_gbs = 0;  // achieved global-memory bandwidth, GB/s
  double theta = 1;          // compact relation r iff unique pairs_r / edges_r <= theta
  double gather_row_ns = 0;   // nanoseconds per row of a gather sum beyond its bytes (PhaseCost::gather_rows)
  double search_round_ns = 0;  // nanoseconds per round of a search of a row's edge type (PhaseCost::search_rows)
};

// The tuning table: architecture ("sm_80", "sm_90", "default") -> row.
using TuningTable = std::map<std::string, Tuning>;
// Parses templates/tuning/materialization.json; throws std::runtime_error naming what is wrong.
TuningTable parse_tuning(const std::string& json_text);
// The embedded table (the generator's own copy of the file).
const TuningTable& tuning_table();

// A coefficient vector (bytes or gather rows) on the graph's counts.
double evaluate(const Bytes& coefficients, const GraphCounts& g);
// The count of one domain on the graph (fixed: 1).
double count(CostDomain d, const GraphCounts& g);
// The gather rows of the phase on the graph: gather_rows, plus each grouped kernel's rows, divided by its groups
// where the launcher runs its rows variant on this graph.
double phase_gather_rows(const PhaseCost& c, const GraphCounts& g);
// The rounds of a warp's search of `etypes` offsets: ceil(log2(etypes) / 5), 0 for one edge type.
double search_rounds(double etypes);
// The rounds of the phase's edge-type searches on the graph: search rows times search_rounds(etypes).
double phase_search_rounds(const PhaseCost& c, const GraphCounts& g);
double estimated_seconds(const PhaseCost& c, const GraphCounts& g, const Tuning& t);
// The sum over `phases` (inference: forward; training: forward_train and backward).
double estimated_seconds(const std::vector<PhaseCost>& phases, const GraphCounts& g, const Tuning& t);

}  // namespace hectorgen::emit
