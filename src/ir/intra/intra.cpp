#include <fmt/format.h>

#include <set>

#include "ir/inter/printer.h"
#include "ir/inter/verifier.h"
#include "ir/intra/intra.h"

namespace hectorgen::intra {

const TensorInfo* Program::find(const std::string& name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

static const char* role_name(Role r) {
  switch (r) {
    case Role::Input: return "input";
    case Role::Weight: return "weight";
    case Role::Output: return "output";
    case Role::Field: return "field";
    case Role::Temp: return "temp";
  }
  return "?";
}

bool traversal_supports(const inter::ExprP& e) {
  using inter::ExprKind;
  if (e->kind == ExprKind::Call) {
    static const std::set<std::string> kSupported = {"exp", "sqrt", "tanh", "relu", "sigmoid", "leakyrelu",
                                                      "leakyrelu_grad", "dot", "sum", "reshape", "max", "max_grad"};
    if (!kSupported.count(e->name)) return false;
    if (e->name == "leakyrelu" || e->name == "leakyrelu_grad" || e->name == "reshape") return traversal_supports(e->args[0]);
  }
  for (const auto& a : e->args)
    if (!traversal_supports(a)) return false;
  return true;
}

std::string print_program(const Program& p) {
  std::string out = fmt::format("# hectorgen intra-operator IR\nmodel {}\n", p.model);
  std::string lay;
  for (const auto& l : p.layouts) lay += (lay.empty() ? "" : ", ") + l;
  out += fmt::format("layouts {}\n", lay);
  for (const TensorInfo& t : p.tensors)
    out += fmt::format("tensor {}: {} {}{}{}\n", t.name, role_name(t.role), inter::to_string(t.per), inter::shape_str(t.shape),
                       t.zero_init ? " zero_init" : "");
  for (const Kernel& k : p.kernels) {
    out += "\n";
    if (k.kind == Kernel::Kind::WeightGrad) {
      const WeightGradInstance& w = k.wgrad;
      auto gather = [](Gather g) { return g == Gather::None ? "row" : g == Gather::Src ? "src[row]" : "dst[row]"; };
      out += fmt::format("wgrad {}:  {}[{}] += sum over rows {}[{}]^T · {}[{}]{}\n", w.name, w.dw,
                         w.segments == Segments::None ? "-" : w.segments == Segments::Etype ? "etype" : "ntype", w.x, gather(w.x_gather),
                         w.dy, gather(w.dy_gather), w.row_scalar.empty() ? "" : fmt::format(" * {}[row]", w.row_scalar));
      out += fmt::format("    rows={} heads={} k={} n={} tile={} deterministic\n    from: {}\n", w.edge_rows ? "edges" : "nodes",
                         w.heads, w.k, w.n, w.tile, w.source);
      continue;
    }
    if (k.kind == Kernel::Kind::SegmentSum) {
      const SegmentSumInstance& ss = k.segsum;
      out += fmt::format("segsum {}:  {}[{}] += sum over rows {}[row]  numel={} deterministic\n    from: {}\n", ss.name, ss.dw,
                         ss.segments == Segments::None ? "-" : ss.segments == Segments::Etype ? "etype" : "ntype", ss.v, ss.numel, ss.source);
      continue;
    }
    if (k.kind == Kernel::Kind::Gemm) {
      const GemmInstance& g = k.gemm;
      const char* gather = g.gather == Gather::None ? "" : g.gather == Gather::Src ? "src" : "dst";
      const char* seg = g.segments == Segments::None ? "-" : g.segments == Segments::Etype ? "etype" : "ntype";
      std::string x = g.gather == Gather::None ? fmt::format("{}[row]", g.x) : fmt::format("{}[{}[row]]", g.x, gather);
      std::string y = g.scatter != Gather::None ? fmt::format("{}[{}[row]] +=", g.y, g.scatter == Gather::Src ? "src" : "dst")
                      : fmt::format("{}[row] {}=", g.y, g.accumulate ? "+" : "");
      out += fmt::format("gemm {}:  {} {} · {}[{}]{}{}\n", g.name, y, x, g.w, seg, g.transpose_w ? "^T" : "",
                         g.row_scalar.empty() ? "" : fmt::format(" * {}[row]", g.row_scalar));
      out += fmt::format("    rows={} heads={} k={} n={} tile={} coarsen={}{}{}\n", g.edge_rows ? "edges" : "nodes", g.heads,
                         g.k, g.n, g.tile, g.coarsen, g.scatter != Gather::None ? " store=atomic" : g.accumulate ? " store=add" : " store=plain",
                         g.launch_bounds ? fmt::format(" launch_bounds={}", *g.launch_bounds) : "");
      out += fmt::format("    from: {}\n", g.source);
    } else {
      const TraversalSource& t = k.trav;
      if (k.kind == Kernel::Kind::Torch)
        out += fmt::format("torch {}:  PyTorch calls over all {}s\n", t.name, inter::is_edge_loop(t.loop->loop) ? "edge" : "node");
      else
        out += fmt::format("traversal {}:  threads={} one warp per {}\n", t.name, t.threads,
                           inter::is_edge_loop(t.loop->loop) ? "edge" : "node");
      for (const auto& [local, tensor] : t.materialized) out += fmt::format("    local {} -> {}\n", local, tensor);
      for (const auto& [field, tensor] : t.field_tensor) out += fmt::format("    field {} -> {}\n", field, tensor);
      out += inter::print_stmt(t.loop, "    ");
    }
  }
  return out;
}

std::string verify_program(const Program& p) {
  std::set<std::string> names, kernels;
  for (const TensorInfo& t : p.tensors)
    if (!names.insert(t.name).second) return fmt::format("tensor '{}' is defined twice", t.name);
  for (const Kernel& k : p.kernels) {
    if (!kernels.insert(k.name()).second) return fmt::format("kernel '{}' is defined twice", k.name());
    if (k.kind != Kernel::Kind::Gemm) continue;
    const GemmInstance& g = k.gemm;
    for (const std::string& t : {g.x, g.w, g.y})
      if (!p.find(t)) return fmt::format("{}: unknown tensor '{}'", g.name, t);
    if (g.tile % g.coarsen) return fmt::format("{}: tile {} is not a multiple of coarsening {}", g.name, g.tile, g.coarsen);
    if (p.find(g.x)->row_numel() != g.heads * g.k)
      return fmt::format("{}: input rows of {} have {} elements, expected {} x {}", g.name, g.x, p.find(g.x)->row_numel(), g.heads, g.k);
    if (p.find(g.y)->row_numel() != g.heads * g.n)
      return fmt::format("{}: output rows of {} have {} elements, expected {} x {}", g.name, g.y, p.find(g.y)->row_numel(), g.heads, g.n);
  }
  return {};
}

}  // namespace hectorgen::intra
