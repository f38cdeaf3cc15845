// The cost model of materialization: auto (docs/materialization.md). A generated auto module holds two programs,
// vanilla and compact, and picks one per graph when the graph is prepared. What it compares is, per phase,
//
//     seconds = launches * launch_us * 1e-6 + bytes / (bandwidth_gbs * 1e9)
//
// with bytes a linear function of the graph's counts: so many bytes per node, per edge, per unique (source, edge
// type) pair, per edge type, per node type, and fixed. The coefficients come from the lowered kernels (what each
// kernel reads and writes per row of its domain), here, at generation time; the module evaluates them on the
// graph's counts at prepare time. launch_us, bandwidth_gbs and the per-relation compaction threshold theta come
// from templates/tuning/materialization.json, per GPU architecture: ESTIMATES until calibrated on the GPU.
#pragma once

#include <array>
#include <map>
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

// The estimate of one phase (one op): kernel launches (ATen calls of a PyTorch fallback count as launches too)
// and bytes moved through global memory.
struct PhaseCost {
  std::string phase;
  int launches = 0;
  Bytes bytes{};
};

// One kernel's launches and bytes: every tensor row it reads or writes, once per row of the domain it is read in
// (a gathered node row read per edge counts per edge); rows of weights and other per-type data count once (they
// stay in cache); graph index arrays 4 bytes per read; zero-initialised results one extra write.
PhaseCost kernel_cost(const intra::Program& p, const intra::Kernel& k);
// The sum over the phase's kernels, plus the zeroing of the tensors the op allocates zeroed.
PhaseCost phase_cost(const intra::Program& p);

// A graph's counts, as the module reads them from the prepared Graph.
struct GraphCounts {
  double nodes = 0, edges = 0, pairs = 0, etypes = 1, ntypes = 1;
};

// One architecture's row of the tuning table.
struct Tuning {
  double launch_us = 0;      // seconds per kernel launch, in microseconds (launch and the gap between kernels)
  double bandwidth_gbs = 0;  // achieved global-memory bandwidth, GB/s
  double theta = 1;          // compact relation r iff unique pairs_r / edges_r <= theta
};

// The tuning table: architecture ("sm_80", "sm_90", "default") -> row.
using TuningTable = std::map<std::string, Tuning>;
// Parses templates/tuning/materialization.json; throws std::runtime_error naming what is wrong.
TuningTable parse_tuning(const std::string& json_text);
// The embedded table (the generator's own copy of the file).
const TuningTable& tuning_table();

double estimated_seconds(const PhaseCost& c, const GraphCounts& g, const Tuning& t);
// The sum over `phases` (inference: forward; training: forward_train and backward).
double estimated_seconds(const std::vector<PhaseCost>& phases, const GraphCounts& g, const Tuning& t);

}  // namespace hectorgen::emit
