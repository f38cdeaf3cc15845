// The CPU reference: a float64 interpreter of the inter-operator IR over an in-memory heterogeneous
// graph. It is the oracle every generated kernel is checked against, so it is written for clarity:
// loops run in program order, one element at a time, exactly as the DSL reads.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/inter/ir.h"

namespace hectorgen::inter {

// Typed COO graph. Nodes share one index space; node n has type ntype[n].
struct HeteroGraph {
  int64_t num_nodes = 0;
  int num_ntypes = 1;
  int num_etypes = 1;
  std::vector<int> ntype;  // [num_nodes]
  std::vector<int64_t> src, dst;
  std::vector<int> etype;  // [num_edges]
  int64_t num_edges() const { return static_cast<int64_t>(src.size()); }
};

// A dense float64 tensor, row-major.
struct Tensor64 {
  std::vector<int64_t> shape;
  std::vector<double> data;
  int64_t numel() const;
  static Tensor64 zeros(std::vector<int64_t> shape);
};
using TensorMap = std::map<std::string, Tensor64>;

// The tensors a model needs, with their full shapes (leading dimension: nodes, edges or types).
// The number of unique (source node, edge type) pairs of the edges (the rows of a pair field).
int64_t num_src_etype_pairs(const HeteroGraph& g);
std::vector<int64_t> full_shape(const TensorDecl& t, const HeteroGraph& g);

// 1/c_{v,r}: for each edge, one over the number of edges with its destination and type.
Tensor64 inv_relation_in_degree(const HeteroGraph& g);

struct InterpretResult {
  bool ok = false;
  std::string error;   // set when !ok (bad graph or missing/ill-shaped tensor)
  TensorMap outputs;   // every declared output
  TensorMap fields;    // every node and edge field the program wrote
};

// Runs a verified, inlined module. `tensors` holds every input and weight by name; inputs declared
// `from_graph` are computed when absent.
InterpretResult interpret(const Module& m, const HeteroGraph& g, const TensorMap& tensors);

}  // namespace hectorgen::inter
