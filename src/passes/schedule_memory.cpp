// schedule-for-memory (see passes.h): a pass over the intra-operator IR, the last one of lowering. The host code
// allocates a temporary right before the first kernel that touches it and releases it after the last
// (emit/host.cpp, plan_memory), so the order of independent kernels decides how many temporaries are live at once.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "passes/passes.h"

namespace hectorgen::passes {

using namespace intra;

namespace {

// Rows of a tensor on a typical graph, relative to its nodes (typical_graph(1)). Per-type tensors do not count:
// moving kernels for them would churn the generated code for nothing.
int64_t typical_rows(inter::Per per) {
  const GraphCounts typical = typical_graph(1);
  switch (per) {
    case inter::Per::Node: return typical.nodes;
    case inter::Per::Edge: return typical.edges;
    case inter::Per::Pair: return typical.pairs;
    default: return 0;
  }
}

// Rows of a tensor on a graph of `c`.
int64_t rows(inter::Per per, const GraphCounts& c) {
  switch (per) {
    case inter::Per::Node: return c.nodes;
    case inter::Per::Edge: return c.edges;
    case inter::Per::Pair: return c.pairs;
    case inter::Per::Etype: return c.etypes;
    case inter::Per::Ntype: return c.ntypes;
    default: return 1;
  }
}

// The tensors the program holds for the whole op: what it reads from its caller and what it hands back (outputs and
// saved fields live from the start to the return).
bool held(const TensorInfo& t, const std::set<std::string>& returned) {
  return t.role == Role::Input || t.role == Role::Weight || returned.count(t.name) > 0;
}

struct Footprint {
  std::vector<std::set<std::string>> touched;  // per kernel: the temporaries it reads or writes
  std::map<std::string, int64_t> bytes;        // per temporary: its size (scheduling: elements per typical node)
};

// The tensors the order decides about: every one the program allocates itself and does not hand back, each of
// `size` bytes.
Footprint footprint(const Program& p, const std::function<int64_t(const TensorInfo&)>& size) {
  const std::set<std::string> returned = returned_tensors(p);
  Footprint f;
  for (const TensorInfo& t : p.tensors)
    if (!held(t, returned)) f.bytes[t.name] = size(t);
  for (const Kernel& k : p.kernels) {
    std::set<std::string> mine;
    for (const std::set<std::string>& names : {kernel_reads(k), kernel_writes(k)})
      for (const std::string& n : names)
        if (f.bytes.count(n)) mine.insert(n);
    f.touched.push_back(mine);
  }
  return f;
}

// The most memory the temporaries take at once when the kernels run in `order` (each live from the first kernel
// that touches it to the last).
int64_t peak(const Footprint& f, const std::vector<size_t>& order) {
  std::map<std::string, std::pair<size_t, size_t>> span;
  for (size_t at = 0; at < order.size(); ++at)
    for (const std::string& n : f.touched[order[at]]) {
      auto [it, fresh] = span.try_emplace(n, at, at);
      if (!fresh) it->second.second = at;
    }
  int64_t most = 0;
  for (size_t at = 0; at < order.size(); ++at) {
    int64_t live = 0;
    for (const auto& [n, s] : span)
      if (s.first <= at && at <= s.second) live += f.bytes.at(n);
    most = std::max(most, live);
  }
  return most;
}

}  // namespace

void schedule_for_memory(Program& p) {
  const size_t n = p.kernels.size();
  if (n < 3) return;
  // Kernel j must follow kernel i < j when one writes what the other reads or writes (in either direction, so
  // accumulations into one tensor keep their order and every result stays bit-identical).
  std::vector<std::set<size_t>> after(n);  // after[j]: the kernels j must follow
  std::vector<std::set<std::string>> reads(n), writes(n);
  for (size_t i = 0; i < n; ++i) {
    reads[i] = kernel_reads(p.kernels[i]);
    writes[i] = kernel_writes(p.kernels[i]);
  }
  auto meet = [](const std::set<std::string>& a, const std::set<std::string>& b) {
    return std::any_of(a.begin(), a.end(), [&](const std::string& x) { return b.count(x) > 0; });
  };
  for (size_t j = 0; j < n; ++j)
    for (size_t i = 0; i < j; ++i)
      if (meet(writes[i], reads[j]) || meet(writes[i], writes[j]) || meet(reads[i], writes[j])) after[j].insert(i);
  const Footprint f = footprint(p, [](const TensorInfo& t) { return typical_rows(t.per) * t.row_numel(); });
  // Greedy list scheduling: of the kernels whose predecessors have run, the one that grows the live temporaries
  // least (what it allocates minus what it is the last to touch); ties keep the lowering's order.
  std::vector<size_t> order;
  std::vector<bool> done(n, false);
  std::map<std::string, size_t> touches_left;
  for (size_t i = 0; i < n; ++i)
    for (const std::string& t : f.touched[i]) ++touches_left[t];
  std::set<std::string> live;
  while (order.size() < n) {
    size_t best = n;
    int64_t best_growth = 0;
    for (size_t k = 0; k < n; ++k) {
      if (done[k] || std::any_of(after[k].begin(), after[k].end(), [&](size_t i) { return !done[i]; })) continue;
      int64_t growth = 0;
      for (const std::string& t : f.touched[k]) {
        if (!live.count(t)) growth += f.bytes.at(t);
        if (touches_left.at(t) == 1) growth -= f.bytes.at(t);
      }
      if (best == n || growth < best_growth) {
        best = k;
        best_growth = growth;
      }
    }
    done[best] = true;
    order.push_back(best);
    for (const std::string& t : f.touched[best]) {
      live.insert(t);
      if (--touches_left.at(t) == 0) live.erase(t);
    }
  }
  std::vector<size_t> lowered(n);
  for (size_t i = 0; i < n; ++i) lowered[i] = i;
  if (peak(f, order) >= peak(f, lowered)) return;  // only a strictly smaller peak changes the order
  std::vector<Kernel> kernels;
  for (size_t i : order) kernels.push_back(p.kernels[i]);
  p.kernels = std::move(kernels);
}

GraphCounts typical_graph(int64_t nodes) { return {nodes, 8 * nodes, 4 * nodes, 1, 1}; }

int64_t tensor_bytes(const TensorInfo& t, const GraphCounts& counts) {
  return rows(t.per, counts) * t.row_numel() * intra::storage_bytes(t.storage);
}

int64_t peak_bytes(const Program& p, const GraphCounts& counts) {
  auto bytes = [&](const TensorInfo& t) { return tensor_bytes(t, counts); };
  const std::set<std::string> returned = returned_tensors(p);
  int64_t whole_op = 0;
  for (const TensorInfo& t : p.tensors)
    if (held(t, returned)) whole_op += bytes(t);
  std::vector<size_t> order(p.kernels.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  return whole_op + peak(footprint(p, bytes), order);
}

}  // namespace hectorgen::passes
