// Verifier and type inference of the inter-operator IR.
//
// Every value gets a *domain* and a *shape*:
//   const      numbers and hyper-parameters, broadcast anywhere
//   weight     a weight (slice), e.g. W[e.etype] or W0
//   node       one value per node
//   edge       one value per edge
//   src_etype  an edge value that depends only on the source node and the edge type: one value per unique
//              (source, edge type) pair suffices (what compact materialization exploits)
// The verifier rejects undefined names, unknown functions, shape mismatches, wrong weight indexing, edge
// values used in node loops without aggregation, fields read before they are written, and writes to
// outputs whose shape differs from the declaration.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "diag/diagnostics.h"
#include "ir/inter/ir.h"

namespace hectorgen::inter {

enum class Domain { Const, Weight, Node, Edge };

struct Type {
  Domain domain = Domain::Const;
  std::vector<int64_t> shape;
  // For edge values: what they depend on (decides the src_etype domain).
  bool dep_src = false, dep_dst = false, dep_etype = false, dep_edge = false;

  bool is_src_etype() const { return domain == Domain::Edge && !dep_dst && !dep_edge; }
  std::string str() const;  // "edge[1, 64]", "src_etype[64]", "node[]" ...
};

std::string shape_str(const std::vector<int64_t>& shape);

struct FieldInfo {
  bool on_edges = false;
  std::vector<int64_t> shape;
};

struct Analysis {
  std::map<const Stmt*, Type> assigned;  // the type stored by each assignment
  std::map<std::string, FieldInfo> node_fields, edge_fields;
};

// Verifies a module whose functions have been inlined. Returns true if it is well-formed.
bool verify(const Module& m, Diagnostics& diags, Analysis* analysis = nullptr);

}  // namespace hectorgen::inter
