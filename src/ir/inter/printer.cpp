#include "ir/inter/printer.h"

#include <fmt/format.h>

namespace hectorgen::inter {

namespace {

int precedence(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Binary: return e.op == BinOp::Add || e.op == BinOp::Sub ? 1 : 2;
    case ExprKind::Neg: return 3;
    case ExprKind::Number: return e.number < 0 ? 3 : 4;
    default: return 4;
  }
}

std::string number(double v, bool is_integer) {
  if (is_integer) return fmt::format("{}", static_cast<long long>(v));
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEni") == std::string::npos) s += ".0";
  return s;
}

void print(const ExprP& e, std::string& out) {
  auto child = [&](const ExprP& c, bool parens) {
    if (parens) out += '(';
    print(c, out);
    if (parens) out += ')';
  };
  switch (e->kind) {
    case ExprKind::Number: out += number(e->number, e->is_integer); break;
    case ExprKind::String: out += '"' + e->name + '"'; break;
    case ExprKind::Name: out += e->name; break;
    case ExprKind::Attr:
      child(e->args[0], precedence(*e->args[0]) < 4);
      out += '.' + e->name;
      break;
    case ExprKind::Index:
      child(e->args[0], precedence(*e->args[0]) < 4);
      out += '[';
      print(e->args[1], out);
      out += ']';
      break;
    case ExprKind::Call:
      out += e->name + '(';
      for (size_t i = 0; i < e->args.size(); ++i) {
        if (i) out += ", ";
        print(e->args[i], out);
      }
      out += ')';
      break;
    case ExprKind::Binary: {
      int p = precedence(*e);
      child(e->args[0], precedence(*e->args[0]) < p);
      out += fmt::format(" {} ", to_string(e->op));
      child(e->args[1], precedence(*e->args[1]) <= p);
      break;
    }
    case ExprKind::Neg:
      out += '-';
      child(e->args[0], precedence(*e->args[0]) < 3);
      break;
  }
}

void print_block(const std::vector<StmtP>& body, int depth, const Annotator& annotate, std::string& out) {
  std::string indent(static_cast<size_t>(depth) * 4, ' ');
  for (const StmtP& s : body) {
    out += indent;
    switch (s->kind) {
      case StmtKind::For:
        out += fmt::format("for {} in {}.{}():", s->var, s->parent, to_string(s->loop));
        break;
      case StmtKind::Assign:
        out += fmt::format("{} {} {}", print_expr(s->target), to_string(s->op), print_expr(s->value));
        break;
      case StmtKind::Call: out += print_expr(s->value); break;
    }
    if (annotate) {
      std::string note = annotate(*s);
      if (!note.empty()) out += "  # " + note;
    }
    out += '\n';
    if (s->kind == StmtKind::For) print_block(s->body, depth + 1, annotate, out);
  }
}

std::string shape_text(const TensorDecl& t) {
  std::string s;
  for (size_t i = 0; i < t.shape_exprs.size(); ++i) s += (i ? ", " : "") + print_expr(t.shape_exprs[i]);
  return s;
}

}  // namespace

std::string print_expr(const ExprP& e) {
  std::string out;
  print(e, out);
  return out;
}

std::string print_stmt(const StmtP& s, const std::string& prefix) {
  std::string body;
  print_block({s}, 0, nullptr, body);
  std::string out;
  size_t start = 0;
  while (start < body.size()) {
    size_t end = body.find('\n', start);
    out += prefix + body.substr(start, end - start) + "\n";
    start = end + 1;
  }
  return out;
}

std::string print_module(const Module& m, const Annotator& annotate) {
  const ModelDecl& d = m.decl;
  std::string out = fmt::format("# hectorgen inter-operator IR\nmodel {}\n", d.name);
  for (const HyperParam& h : d.hyper) out += fmt::format("hyper {} = {}\n", h.name, print_expr(h.expr));
  auto tensors = [&](const char* kw, const std::vector<TensorDecl>& list, bool weights) {
    for (const TensorDecl& t : list) {
      out += fmt::format("{} {}: {}[{}]", kw, t.name, to_string(t.per), shape_text(t));
      if (!t.from_graph.empty()) out += fmt::format(" from_graph=\"{}\"", t.from_graph);
      if (!t.requires_grad && std::string_view(kw) != "output") out += " requires_grad=0";
      if (t.unified) out += " placement=\"unified\"";
      if (t.indexed_rows) out += " rows=\"indexed\"";
      if (weights) out += fmt::format(" init=\"{}\"", t.init.empty() ? "glorot" : t.init);
      out += '\n';
    }
  };
  tensors("input", d.inputs, false);
  tensors("weight", d.weights, true);
  tensors("output", d.outputs, false);
  const Options& o = d.options;
  out += fmt::format("option materialization = \"{}\"\n", to_string(o.materialization));
  if (o.compact_relations) out += fmt::format("option compact_relations = {}\n", *o.compact_relations);
  out += fmt::format("option reorder = \"{}\"\n", to_string(o.reorder));
  // Printed when not auto: the default leaves the text of the programs it does not change as it was.
  if (o.recompute != Recompute::Auto) out += fmt::format("option recompute = \"{}\"\n", to_string(o.recompute));
  out += fmt::format("option dtype = \"{}\"\n", to_string(o.dtype));
  out += fmt::format("option gemm_tile = {}\n", o.schedule.gemm_tile);
  out += fmt::format("option gemm_coarsen = {}\n", o.schedule.gemm_coarsen);
  out += fmt::format("option traversal_threads = {}\n", o.schedule.traversal_threads);
  if (o.schedule.traversal_edge_batch != 1)
    out += fmt::format("option traversal_edge_batch = {}\n", o.schedule.traversal_edge_batch);
  if (o.schedule.traversal_row_lanes != 0)
    out += fmt::format("option traversal_row_lanes = {}\n", o.schedule.traversal_row_lanes);
  if (o.schedule.traversal_vector != 0) out += fmt::format("option traversal_vector = {}\n", o.schedule.traversal_vector);
  if (o.schedule.traversal_position_indices != 1)
    out += fmt::format("option traversal_position_indices = {}\n", o.schedule.traversal_position_indices);
  if (o.schedule.gather_sum_row_lanes != 0)
    out += fmt::format("option gather_sum_row_lanes = {}\n", o.schedule.gather_sum_row_lanes);
  if (o.schedule.gather_sum_group_rows_below != -1)
    out += fmt::format("option gather_sum_group_rows_below = {}\n", o.schedule.gather_sum_group_rows_below);
  if (o.schedule.launch_bounds) out += fmt::format("option launch_bounds = {}\n", *o.schedule.launch_bounds);
  out += "program:\n";
  for (const FuncDef& f : m.functions) {
    std::string params;
    for (size_t i = 0; i < f.params.size(); ++i) params += (i ? ", " : "") + f.params[i];
    out += fmt::format("def {}({}):\n", f.name, params);
    print_block(f.body, 1, annotate, out);
    out += '\n';
  }
  print_block(m.body, 0, annotate, out);
  return out;
}

}  // namespace hectorgen::inter
