// The cost model of materialization: auto (cost.h, docs/materialization.md).
#include "emit/cost.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

#include "emit/templates.h"
#include "ir/intra/launch.h"
#include "ir/intra/traversal.h"

namespace hectorgen::emit {

using inter::Per;
using intra::Program;

const char* to_string(CostDomain d) {
  switch (d) {
    case CostDomain::Fixed: return "fixed";
    case CostDomain::Node: return "node";
    case CostDomain::Edge: return "edge";
    case CostDomain::Pair: return "pair";
    case CostDomain::Etype: return "etype";
    case CostDomain::Ntype: return "ntype";
  }
  return "";
}

namespace {

constexpr double kIndexBytes = 4;  // int32 graph arrays

CostDomain domain_of(intra::Rows r) {
  switch (r) {
    case intra::Rows::Nodes: return CostDomain::Node;
    case intra::Rows::Edges: return CostDomain::Edge;
    case intra::Rows::Etypes: return CostDomain::Etype;
    case intra::Rows::Pairs: return CostDomain::Pair;
  }
  return CostDomain::Fixed;
}

CostDomain domain_of(Per per) {
  switch (per) {
    case Per::Node: return CostDomain::Node;
    case Per::Edge: return CostDomain::Edge;
    case Per::Pair: return CostDomain::Pair;
    case Per::Etype: return CostDomain::Etype;
    case Per::Ntype: return CostDomain::Ntype;
    case Per::None: return CostDomain::Fixed;
  }
  return CostDomain::Fixed;
}

CostDomain domain_of(inter::LoopKind k) {
  switch (k) {
    case inter::LoopKind::Edges:
    case inter::LoopKind::IncomingEdges:
    case inter::LoopKind::OutgoingEdges: return CostDomain::Edge;
    case inter::LoopKind::DstNodes:
    case inter::LoopKind::SrcNodes: return CostDomain::Node;
    case inter::LoopKind::SrcPairs: return CostDomain::Pair;
  }
  return CostDomain::Fixed;
}

// Accumulates one kernel's bytes.
class Counter {
 public:
  explicit Counter(const Program& p) : p_(p) {}

  void index(CostDomain d, double reads = 1) { bytes_[static_cast<size_t>(d)] += reads * kIndexBytes; }
  // A row of a gather sum, once per element of `d`: its latency beyond the bytes (PhaseCost::gather_rows).
  void gather_row(CostDomain d) { gather_rows_[static_cast<size_t>(d)] += 1; }
  // A search of a row's relation, once per element of `d` (PhaseCost::search_rows), of `rounds` rounds of the
  // warp's search each (PhaseCost::search_rows).
  void search_row(CostDomain d, double rounds = 1) { search_rows_[static_cast<size_t>(d)] += rounds; }
  void scalars(CostDomain d, const std::string& tensor) { row(d, tensor); }
  // A row of `tensor` read or written once per element of `d`; rows of per-type data (weights, per-relation
  // vectors) and tensors without rows count once per kernel, whatever reads them: they stay in cache.
  void row(CostDomain d, const std::string& tensor, double times = 1) {
    const intra::TensorInfo* t = p_.find(tensor);
    if (!t) return;  // not a tensor of the program (nothing to count)
    const double row_bytes = static_cast<double>(t->row_numel()) * intra::storage_bytes(t->storage);
    if (t->per == Per::Node || t->per == Per::Edge || t->per == Per::Pair) {
      bytes_[static_cast<size_t>(d)] += times * row_bytes;
    } else if (cached_.insert(tensor).second) {
      bytes_[static_cast<size_t>(domain_of(t->per))] += row_bytes;
    }
  }
  // The whole tensor, once (a weight, or a result written in full).
  void whole(const std::string& tensor, double times = 1) {
    const intra::TensorInfo* t = p_.find(tensor);
    if (!t) return;
    bytes_[static_cast<size_t>(domain_of(t->per))] +=
        times * static_cast<double>(t->row_numel()) * intra::storage_bytes(t->storage);
  }
  const Bytes& bytes() const { return bytes_; }
  const Bytes& gather_rows() const { return gather_rows_; }
  const Bytes& search_rows() const { return search_rows_; }

 private:
  const Program& p_;
  Bytes bytes_{};
  Bytes gather_rows_{};
  Bytes search_rows_{};
  std::set<std::string> cached_;
};

// A thread that searches alone (one thread per row) runs a binary search of log2(etypes) dependent loads, between 2
// (4 relations) and 5 times the rounds of a warp's search: counted as 4 rounds' worth.
constexpr double kThreadSearchRounds = 4;

void traversal_body(const std::vector<intra::Instr>& body, CostDomain d, Counter& c, bool per_thread) {
  for (const intra::Instr& in : body) {
    if (auto* def = std::get_if<intra::Def>(&in.v)) {
      if (auto* load = std::get_if<intra::Load>(&def->source)) c.row(d, load->tensor);
    } else if (auto* st = std::get_if<intra::Store>(&in.v)) {
      c.row(d, st->tensor, st->atomic ? 2 : 1);  // an atomic add reads the row too
    } else if (auto* index = std::get_if<intra::IndexDef>(&in.v)) {
      c.index(d);
      if (index->array == intra::GraphArray::PairEtype)  // a search of pair_etype_ptr
        c.search_row(d, per_thread ? kThreadSearchRounds : 1);
    } else if (auto* loop = std::get_if<intra::EdgeLoop>(&in.v)) {
      c.index(d, 2);  // the row node's CSR offsets
      c.index(CostDomain::Edge);  // the edge id at each position
      traversal_body(loop->body, CostDomain::Edge, c, per_thread);
    }
  }
}

}  // namespace

PhaseCost kernel_cost(const Program& p, const intra::Kernel& k) {
  Counter c(p);
  int launches = 1;
  std::vector<GroupedRows> grouped;
  if (auto* g = std::get_if<intra::GemmInstance>(&k)) {
    const CostDomain d = domain_of(g->rows);
    c.row(d, g->x);
    if (g->gather != intra::Gather::None) c.index(d);
    c.whole(g->w);
    const bool reads_y = g->accumulate || g->scatter != intra::Gather::None;
    c.row(d, g->y, reads_y ? 2 : 1);
    if (g->scatter != intra::Gather::None) c.index(d);
    if (!g->row_scalar.empty()) c.scalars(d, g->row_scalar);
  } else if (auto* w = std::get_if<intra::WeightGradInstance>(&k)) {
    const CostDomain d = domain_of(w->rows);
    c.row(d, w->x);
    if (w->x_gather != intra::Gather::None) c.index(d);
    c.row(d, w->dy);
    if (w->dy_gather != intra::Gather::None) c.index(d);
    if (!w->row_scalar.empty()) c.scalars(d, w->row_scalar);
    c.whole(w->dw, w->accumulate ? 3 : 2);  // the partials' write and read, the result (read too when +=)
    launches = 2;                           // partial sums, then their ordered reduction
  } else if (auto* s = std::get_if<intra::SegmentSumInstance>(&k)) {
    c.row(domain_of(s->rows), s->v);
    c.whole(s->dw, 2);
  } else if (auto* gs = std::get_if<intra::GatherSumInstance>(&k)) {
    const bool pair_edges = gs->csr == intra::GatherCsr::PairEdges;
    const CostDomain rows = pair_edges ? CostDomain::Pair : CostDomain::Node;
    const CostDomain entries = pair_edges ? CostDomain::Edge : CostDomain::Pair;
    c.index(rows, 2);
    c.row(rows, gs->y, gs->accumulate ? 2 : 1);
    if (const intra::GatherSumRows variant = intra::gather_sum_rows(*gs); variant.below > 0)
      grouped.push_back(GroupedRows{rows, entries, variant.below, variant.row_groups});
    else
      c.gather_row(rows);
    c.index(entries);
    c.row(entries, gs->x);
    if (gs->x_gather != intra::Gather::None) c.index(entries);
    if (!gs->scale.empty()) c.scalars(entries, gs->scale);
  } else if (auto* t = std::get_if<intra::TraversalInstance>(&k)) {
    traversal_body(t->body, domain_of(t->rows), c, intra::one_thread_per_row(*t));
  } else if (auto* torch = std::get_if<intra::TorchInstance>(&k)) {
    // ATen calls: each materialised operand read in full, the result written, a few launches (index_select,
    // the operation, index_add_).
    std::set<std::string> read;
    for (const auto& [_, tensor] : torch->materialized) read.insert(tensor);
    for (const auto& [_, tensor] : torch->field_tensor) read.insert(tensor);
    for (const std::string& tensor : read) c.whole(tensor, 2);  // gathered into a temporary, then read
    c.whole(torch->target, 2);
    launches = 2 + static_cast<int>(read.size());
  }
  return PhaseCost{intra::kernel_name(k), launches, c.bytes(), c.gather_rows(), c.search_rows(), std::move(grouped)};
}

namespace {

void add(PhaseCost& to, const PhaseCost& c) {
  to.launches += c.launches;
  for (size_t i = 0; i < kCostDomains; ++i) {
    to.bytes[i] += c.bytes[i];
    to.gather_rows[i] += c.gather_rows[i];
    to.search_rows[i] += c.search_rows[i];
  }
  to.grouped_rows.insert(to.grouped_rows.end(), c.grouped_rows.begin(), c.grouped_rows.end());
}

// The fill of a tensor the op allocates zeroed: one launch, one write.
PhaseCost fill_cost(const intra::TensorInfo& t) {
  PhaseCost c{"", 1, {}};
  c.bytes[static_cast<size_t>(domain_of(t.per))] = static_cast<double>(t.row_numel()) * intra::storage_bytes(t.storage);
  return c;
}

}  // namespace

PhaseCost phase_cost(const Program& p) {
  PhaseCost out{p.phase, 0, {}};
  for (const intra::Kernel& k : p.kernels) add(out, kernel_cost(p, k));
  for (const intra::TensorInfo& t : p.tensors)
    if (t.zero_init) add(out, fill_cost(t));
  return out;
}

std::map<uint64_t, PhaseCost> cost_by_results(const Program& p, const std::vector<std::string>& results,
                                              const std::vector<std::set<size_t>>& fed) {
  if (results.size() > 63) throw std::logic_error("cost: more than 63 results in one op");
  if (fed.size() != p.kernels.size()) throw std::logic_error("cost: one set of fed results per kernel expected");
  const uint64_t all = (uint64_t{1} << results.size()) - 1;
  std::map<uint64_t, PhaseCost> parts;
  // Key 0: a kernel that feeds no result, which the op never runs.
  auto part = [&](uint64_t mask) -> PhaseCost& { return parts.try_emplace(mask, PhaseCost{p.phase, 0, {}}).first->second; };
  // As emit_op: a tensor is filled when a result that it is, or that a kernel touching it feeds, is asked for.
  std::map<std::string, uint64_t> tensor_mask;
  for (size_t r = 0; r < results.size(); ++r) tensor_mask[results[r]] |= uint64_t{1} << r;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    uint64_t mask = 0;
    for (size_t r : fed[i]) mask |= uint64_t{1} << r;
    add(part(mask), kernel_cost(p, p.kernels[i]));
    for (const std::string& n : intra::kernel_reads(p.kernels[i])) tensor_mask[n] |= mask;
    for (const std::string& n : intra::kernel_writes(p.kernels[i])) tensor_mask[n] |= mask;
  }
  for (const intra::TensorInfo& t : p.tensors)
    if (t.zero_init) {
      auto it = tensor_mask.find(t.name);
      add(part(it == tensor_mask.end() ? all : it->second), fill_cost(t));
    }
  return parts;
}

TuningTable parse_tuning(const std::string& json_text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(fmt::format("tuning table: not JSON: {}", e.what()));
  }
  if (!j.is_object() || !j.contains("architectures") || !j["architectures"].is_object())
    throw std::runtime_error("tuning table: expected an object with an 'architectures' object");
  TuningTable out;
  for (const auto& [arch, row] : j["architectures"].items()) {
    auto number = [&](const char* key, double lo, double hi) {
      if (!row.is_object() || !row.contains(key) || !row[key].is_number())
        throw std::runtime_error(fmt::format("tuning table: architecture '{}' needs a number '{}'", arch, key));
      double v = row[key].get<double>();
      if (!(v >= lo && v <= hi))
        throw std::runtime_error(fmt::format("tuning table: '{}' of '{}' must be in [{}, {}], got {}", key, arch, lo, hi, v));
      return v;
    };
    // A key the model does not know is an error, not ignored: a misspelt (or renamed: search_step_ns, before
    // 2026-11-28) latency term would otherwise cost nothing.
    if (row.is_object())
      for (const auto& [key, value] : row.items())
        if (key != "launch_us" && key != "bandwidth_gbs" && key != "theta" && key != "gather_row_ns" && key != "search_round_ns")
          throw std::runtime_error(fmt::format("tuning table: architecture '{}' has an unknown key '{}' (known: launch_us, "
                                               "bandwidth_gbs, theta, gather_row_ns, search_round_ns)", arch, key));
    // gather_row_ns and search_round_ns are optional (0: the model before they existed, bytes and launches only).
    auto optional = [&](const char* key) { return row.is_object() && row.contains(key) ? number(key, 0, 1e6) : 0.0; };
    out[arch] = Tuning{number("launch_us", 0, 1e6), number("bandwidth_gbs", 1e-3, 1e6), number("theta", 0, 1),
                       optional("gather_row_ns"), optional("search_round_ns")};
  }
  if (!out.count("default")) throw std::runtime_error("tuning table: the 'default' architecture is missing");
  return out;
}

const TuningTable& tuning_table() {
  static const TuningTable table = [] {
    const auto& all = embedded_templates();
    auto it = all.find("tuning/materialization.json");
    if (it == all.end()) throw std::logic_error("cost: no embedded tuning/materialization.json");
    return parse_tuning(it->second);
  }();
  return table;
}

double evaluate(const Bytes& b, const GraphCounts& g) {
  return b[0] + b[1] * g.nodes + b[2] * g.edges + b[3] * g.pairs + b[4] * g.etypes + b[5] * g.ntypes;
}

double count(CostDomain d, const GraphCounts& g) {
  Bytes unit{};
  unit[static_cast<size_t>(d)] = 1;
  return evaluate(unit, g);
}

double phase_gather_rows(const PhaseCost& c, const GraphCounts& g) {
  double rows = evaluate(c.gather_rows, g);
  for (const GroupedRows& k : c.grouped_rows) {
    const double n = count(k.rows, g);
    rows += count(k.entries, g) < k.below * n ? n / k.groups : n;  // as the launcher decides (emit_gathersum)
  }
  return rows;
}

double search_rounds(double etypes) { return etypes > 1 ? std::ceil(std::log2(etypes) / 5 - 1e-9) : 0; }

double phase_search_rounds(const PhaseCost& c, const GraphCounts& g) {
  return evaluate(c.search_rows, g) * search_rounds(g.etypes);
}

double estimated_seconds(const PhaseCost& c, const GraphCounts& g, const Tuning& t) {
  return c.launches * t.launch_us * 1e-6 + evaluate(c.bytes, g) / (t.bandwidth_gbs * 1e9) +
         phase_gather_rows(c, g) * t.gather_row_ns * 1e-9 + phase_search_rounds(c, g) * t.search_round_ns * 1e-9;
}

double estimated_seconds(const std::vector<PhaseCost>& phases, const GraphCounts& g, const Tuning& t) {
  double s = 0;
  for (const PhaseCost& c : phases) s += estimated_seconds(c, g, t);
  return s;
}

}  // namespace hectorgen::emit
