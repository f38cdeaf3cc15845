#include "ir/inter/verifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <cctype>
#include <set>
#include <tuple>
#include <variant>

#include "dsl/parser.h"
#include "ir/inter/names.h"

namespace hectorgen::inter {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string Type::str() const {
  const char* d = "const";
  switch (domain) {
    case Domain::Const: d = "const"; break;
    case Domain::Weight: d = "weight"; break;
    case Domain::Node: d = "node"; break;
    case Domain::Edge: d = is_src_etype() && dep_src ? "src_etype" : "edge"; break;
  }
  return d + shape_str(shape);
}

namespace {

// ---- what an expression denotes ---------------------------------------------------------------
struct GraphRef {};
struct EdgeRef { std::string var; };
enum class NodeRole { Loop, Src, Dst };
struct NodeRef { NodeRole role; std::string var; };  // var: the loop variable it comes from
struct TypeIdx { bool etype; Type dep; };              // e.etype / n.ntype; dep carries the dependency
struct WeightRef { const TensorDecl* decl; bool selected; Type dep; };
struct StrLit { std::string value; };
using Val = std::variant<GraphRef, EdgeRef, NodeRef, TypeIdx, WeightRef, StrLit, Type>;

struct Loop {
  std::string var;
  LoopKind kind;
  bool edge() const { return is_edge_loop(kind); }
};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest candidate within a small edit distance, as "; did you mean 'x'?". Ties go to the candidate
// that differs from `name` only in case, then to the one sharing the longer prefix, then to the one of the
// closer length, then to the first in `candidates` (callers list the innermost scopes first).
std::string suggest(const std::string& name, const std::vector<std::string>& candidates) {
  auto lower = [](std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  const std::string lname = lower(name);
  const size_t limit = std::max<size_t>(1, name.size() / 3) + 1;
  using Rank = std::tuple<size_t, bool, size_t, size_t, size_t>;
  std::optional<Rank> best;
  std::string best_name;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string& c = candidates[i];
    size_t d = edit_distance(name, c);
    if (c == name || d >= limit) continue;
    size_t prefix = 0;
    while (prefix < c.size() && prefix < name.size() && c[prefix] == name[prefix]) ++prefix;
    size_t len_diff = c.size() > name.size() ? c.size() - name.size() : name.size() - c.size();
    Rank r{d, lower(c) != lname, name.size() - prefix, len_diff, i};
    if (!best || r < *best) {
      best = r;
      best_name = c;
    }
  }
  return best ? fmt::format("; did you mean '{}'?", best_name) : "";
}

Type of(Domain d) {
  Type t;
  t.domain = d;
  return t;
}

Type join(const Type& a, const Type& b) {
  Type t;
  t.domain = std::max(a.domain, b.domain);
  t.dep_src = a.dep_src || b.dep_src;
  t.dep_dst = a.dep_dst || b.dep_dst;
  t.dep_etype = a.dep_etype || b.dep_etype;
  t.dep_edge = a.dep_edge || b.dep_edge;
  return t;
}

bool is_prefix(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

class Verifier {
 public:
  Verifier(const Module& m, Diagnostics& d, Analysis& a) : m_(m), d_(d), a_(a) {}

  bool run() {
    int before = d_.error_count();
    for (const StmtP& s : m_.body) stmt(*s);
    if (d_.error_count() != before) return false;  // later checks would only echo earlier errors
    for (const TensorDecl& o : m_.decl.outputs) {
      if (o.per != Per::Node && o.per != Per::Edge) {
        if (!weight_grads_written_.count(o.name))
          d_.warning(o.loc, "unwritten-output", fmt::format("weight gradient '{}' is never accumulated (it stays zero)", o.name));
        continue;
      }
      auto& fields = o.per == Per::Edge ? a_.edge_fields : a_.node_fields;
      auto it = fields.find(o.name);
      if (it == fields.end())
        d_.error(o.loc, "unwritten-output",
                 fmt::format("output '{}' is never written; assign {}[\"{}\"] in the program", o.name,
                             o.per == Per::Edge ? "e" : "n", o.name));
      else if (it->second.shape != o.shape)
        d_.error(o.loc, "output-mismatch", fmt::format("output '{}' is declared with shape {}, but the program computes shape {}",
                                                       o.name, shape_str(o.shape), shape_str(it->second.shape)));
    }
    if (d_.error_count() != before) return false;  // unused/unwritten follow from earlier errors
    for (const TensorDecl& w : m_.decl.weights)
      if (!used_.count(w.name)) d_.warning(w.loc, "unused", fmt::format("weight '{}' is never used", w.name));
    for (const TensorDecl& i : m_.decl.inputs)
      if (!used_.count(i.name)) d_.warning(i.loc, "unused", fmt::format("input '{}' is never used", i.name));
    return d_.error_count() == before;
  }

 private:
  // ---- statements -----------------------------------------------------------------------------
  void stmt(const Stmt& s) {
    switch (s.kind) {
      case StmtKind::For: return for_stmt(s);
      case StmtKind::Assign: return assign(s);
      case StmtKind::Call: {
        const std::string& f = s.value->name;
        if (is_builtin(f))
          d_.error(s.loc, "unused-value", fmt::format("the result of '{}' is not used", f));
        else
          d_.error(s.value->loc, "unknown-function", fmt::format("unknown function '{}'", f));
        return;
      }
    }
  }

  void for_stmt(const Stmt& s) {
    bool graph_loop = s.loop == LoopKind::Edges || s.loop == LoopKind::DstNodes || s.loop == LoopKind::SrcNodes;
    if (name_taken(s.var)) {
      d_.error(s.loc, "duplicate-name", fmt::format("loop variable '{}' hides another name", s.var));
      return;
    }
    if (graph_loop) {
      if (s.parent != "g") {
        d_.error(s.loc, "bad-iterator", fmt::format("'{}' is not the graph; graph loops iterate g.{}()", s.parent, to_string(s.loop)));
        return;
      }
      if (!loops_.empty()) {
        d_.error(s.loc, "nested-graph-loop",
                 fmt::format("a loop over g.{}() cannot be nested in another loop; iterate n.incoming_edges() "
                             "or n.outgoing_edges() instead",
                             to_string(s.loop)));
        return;
      }
    } else {
      const Loop* parent = find_loop(s.parent);
      if (!parent || parent->edge()) {
        d_.error(s.loc, "bad-iterator",
                 fmt::format("'{}.{}()' needs '{}' to be the variable of an enclosing node loop", s.parent,
                             to_string(s.loop), s.parent));
        return;
      }
      if (loops_.size() != 1) {
        d_.error(s.loc, "nested-graph-loop", "edge loops can be nested one level deep in a node loop only");
        return;
      }
    }
    if (!check_name(s.var, s.loc, "loop variable")) return;
    loops_.push_back({s.var, s.loop});
    scopes_.emplace_back();
    aggregating_.emplace_back();
    for (const StmtP& b : s.body) stmt(*b);
    aggregating_.pop_back();
    scopes_.pop_back();
    loops_.pop_back();
  }

  void assign(const Stmt& s) {
    if (loops_.empty()) {
      d_.error(s.loc, "outside-loop", "statements must be inside a loop over the graph's nodes or edges");
      return;
    }
    std::optional<Type> value = tensor(s.value, "the assigned value");
    const Expr& t = *s.target;
    if (value && is_weight_grad_target(t)) return assign_weight_grad(s, t, *value);
    if (!value) {
      // Remember the failed definition so its uses do not report again.
      if (t.kind == ExprKind::Name) poisoned_.insert(t.name);
      if (t.kind == ExprKind::Index && t.args[1]->kind == ExprKind::String) poisoned_.insert("\"" + t.args[1]->name);
      return;
    }
    if (t.kind == ExprKind::Name) return assign_local(s, t, *value);
    if (t.kind == ExprKind::Attr) {
      d_.error(t.loc, "read-only", fmt::format("'{}' is read-only; produced data are written as x[\"name\"]", print_target(t)));
      return;
    }
    // t is Index(base, "field")
    std::optional<Val> base = eval(t.args[0]);
    if (!base) return;
    if (t.args[1]->kind != ExprKind::String) {
      d_.error(t.args[1]->loc, "bad-field", "field names must be string literals such as e[\"att\"]");
      return;
    }
    const std::string& field = t.args[1]->name;
    if (!check_name(field, t.args[1]->loc, "field name")) {
      poisoned_.insert("\"" + field);
      return;
    }
    if (auto* e = std::get_if<EdgeRef>(&*base)) return assign_edge_field(s, field, *e, *value);
    if (auto* n = std::get_if<NodeRef>(&*base)) return assign_node_field(s, field, *n, *value);
    d_.error(t.loc, "bad-assign-target", "only locals, e[\"field\"] and n[\"field\"] can be assigned");
  }

  // Outputs declared per etype / ntype / none are weight gradients: only `d_W[sel] += v` writes them.
  const TensorDecl* weight_grad_output(const std::string& n) const {
    const TensorDecl* o = m_.decl.find_output(n);
    return o && o->per != Per::Node && o->per != Per::Edge ? o : nullptr;
  }
  bool is_weight_grad_target(const Expr& t) const {
    if (t.kind == ExprKind::Name) return weight_grad_output(t.name) != nullptr;
    return t.kind == ExprKind::Index && t.args[0]->kind == ExprKind::Name && weight_grad_output(t.args[0]->name);
  }

  void assign_weight_grad(const Stmt& s, const Expr& t, const Type& value) {
    const std::string& name = t.kind == ExprKind::Name ? t.name : t.args[0]->name;
    const TensorDecl* o = weight_grad_output(name);
    if (s.op != AssignOp::Add) {
      d_.error(s.loc, "needs-aggregation", fmt::format("weight gradient '{}' can only be accumulated with '+='", name));
      return;
    }
    if ((t.kind == ExprKind::Name) != (o->per == Per::None)) {
      d_.error(t.loc, "weight-indexing", fmt::format("weight gradient '{}' is per {}", name, to_string(o->per)));
      return;
    }
    if (t.kind == ExprKind::Index) {
      std::optional<Val> idx = eval(t.args[1]);
      if (!idx) return;
      auto* ti = std::get_if<TypeIdx>(&*idx);
      if (!ti || ti->etype != (o->per == Per::Etype)) {
        d_.error(t.args[1]->loc, "weight-indexing", fmt::format("weight gradient '{}' is per {}; index it with {}", name,
                                                                to_string(o->per), o->per == Per::Etype ? "e.etype" : "n.ntype"));
        return;
      }
    }
    if (value.shape != o->shape) {
      d_.error(s.loc, "shape-mismatch", fmt::format("weight gradient '{}' has shape {}, but a value of shape {} is accumulated",
                                                    name, shape_str(o->shape), shape_str(value.shape)));
      return;
    }
    weight_grads_written_.insert(name);
    a_.assigned[&s] = value;
  }

  void assign_local(const Stmt& s, const Expr& t, Type value) {
    Type* existing = find_local(t.name);
    if (s.op == AssignOp::Set) {
      if (!existing && name_taken(t.name)) {
        d_.error(t.loc, "duplicate-name", fmt::format("'{}' is already a {}; choose another local name", t.name, kind_of(t.name)));
        return;
      }
      if (!existing && !check_name(t.name, t.loc, "local")) {
        poisoned_.insert(t.name);
        return;
      }
      if (value.domain == Domain::Edge && !current_loop().edge()) return edge_in_node_loop(s.value->loc);
      scopes_.back()[t.name] = value;
      a_.assigned[&s] = value;
      return;
    }
    if (!existing) {
      d_.error(t.loc, "undefined-name", fmt::format("'{}' is updated before it is assigned", t.name));
      return;
    }
    Type merged = join(*existing, value);
    if (!combine_shapes(existing->shape, value.shape, merged.shape, s.loc) ) return;
    if (merged.shape != existing->shape) {
      d_.error(s.loc, "shape-mismatch", fmt::format("updating '{}' of shape {} with a value of shape {}", t.name, shape_str(existing->shape), shape_str(value.shape)));
      return;
    }
    *existing = merged;
    a_.assigned[&s] = merged;
  }

  void assign_edge_field(const Stmt& s, const std::string& field, const EdgeRef& e, Type value) {
    if (current_loop().var != e.var) {
      d_.error(s.target->loc, "bad-assign-target", fmt::format("edge fields are written through the innermost loop variable, not '{}'", e.var));
      return;
    }
    if (const TensorDecl* o = m_.decl.find_output(field); o && o->per != Per::Edge) {
      d_.error(s.target->loc, "output-mismatch", fmt::format("output '{}' is declared per {}, but written per edge", field, to_string(o->per)));
      return;
    }
    if (a_.node_fields.count(field)) {
      d_.error(s.target->loc, "duplicate-name", fmt::format("'{}' is already a node field", field));
      return;
    }
    write_field(s, a_.edge_fields, field, true, value);
  }

  void assign_node_field(const Stmt& s, const std::string& field, const NodeRef& n, Type value) {
    if (const TensorDecl* o = m_.decl.find_output(field); o && o->per != Per::Node) {
      d_.error(s.target->loc, "output-mismatch", fmt::format("output '{}' is declared per {}, but written per node", field, to_string(o->per)));
      return;
    }
    if (a_.edge_fields.count(field)) {
      d_.error(s.target->loc, "duplicate-name", fmt::format("'{}' is already an edge field", field));
      return;
    }
    bool through_edge = n.role != NodeRole::Loop;
    bool in_edge_loop = current_loop().edge();
    bool aggregation = s.op == AssignOp::Add || s.op == AssignOp::Sub || is_max_aggregation(s);
    if (through_edge || in_edge_loop) {
      // Many edges write to the same node: only an aggregation is well defined.
      if (!aggregation) {
        d_.error(s.loc, "needs-aggregation",
                 fmt::format("node field '{}' is written once per edge here; aggregate with '+=' (or '-=')", field));
        return;
      }
      aggregating_.back().insert(field);
    } else if (value.domain == Domain::Edge) {
      return edge_in_node_loop(s.value->loc);
    }
    Type stored = value;
    stored.domain = Domain::Node;
    stored.dep_src = stored.dep_dst = stored.dep_etype = stored.dep_edge = false;
    write_field(s, a_.node_fields, field, false, stored);
  }

  void write_field(const Stmt& s, std::map<std::string, FieldInfo>& fields, const std::string& name, bool on_edges, Type value) {
    auto it = fields.find(name);
    bool fresh = it == fields.end();
    if (fresh) {
      if (s.op == AssignOp::Mul || s.op == AssignOp::Div) {
        d_.error(s.target->loc, "undefined-field", fmt::format("field '{}' is updated before it is assigned", name));
        return;
      }
      // `+=` into a new field starts from zero.
      it = fields.emplace(name, FieldInfo{on_edges, value.shape}).first;
    } else {
      std::vector<int64_t>& shape = it->second.shape;
      if (value.shape != shape) {
        // A field first set from a scalar (e.g. n["s"] = 0.0) takes the shape of what is accumulated into it.
        bool accumulates = s.op != AssignOp::Set || is_max_aggregation(s);
        bool grow = is_prefix(shape, value.shape) && accumulates && (is_max_aggregation(s) || !read_.count(name));
        bool bcast = is_prefix(value.shape, shape) && accumulates;
        if (grow) shape = value.shape;
        else if (!bcast) {
          d_.error(s.loc, "shape-mismatch", fmt::format("field '{}' has shape {}, but a value of shape {} is {}", name,
                                                        shape_str(shape), shape_str(value.shape),
                                                        s.op == AssignOp::Set ? "assigned" : "accumulated"));
          return;
        }
      }
    }
    if (const TensorDecl* o = m_.decl.find_output(name); o && !is_prefix(it->second.shape, o->shape)) {
      d_.error(s.loc, "output-mismatch", fmt::format("output '{}' is declared with shape {}, but is written with shape {}",
                                                     name, shape_str(o->shape), shape_str(it->second.shape)));
      return;
    }
    Type stored = value;
    stored.shape = it->second.shape;
    a_.assigned[&s] = stored;
  }

  // Names become identifiers in the generated code (the emitters mangle keywords); '__x' is reserved. Names
  // with the sigil only come from the compiler (the lexer rejects them in user text).
  bool check_name(const std::string& n, SourceLoc loc, const char* what) {
    std::string why = bad_name_reason(n);
    const char* kind = "bad-name";
    if (why.empty() && !is_derived_name(n)) {
      why = reserved_name_reason(n);
      if (why.empty() && std::string_view(what) != "loop variable") why = attribute_name_reason(n);
      kind = "reserved-name";
    }
    if (!why.empty()) d_.error(loc, kind, fmt::format("{} '{}' {}", what, n, why));
    return why.empty();
  }

  void edge_in_node_loop(SourceLoc loc) {
    d_.error(loc, "edge-in-node-loop",
             "an edge value is used in a node loop without aggregation; accumulate it with '+=' inside "
             "'for e in n.incoming_edges()'");
  }

  // ---- expressions ----------------------------------------------------------------------------
  std::optional<Type> tensor(const ExprP& e, std::string_view what) {
    std::optional<Val> v = eval(e);
    if (!v) return std::nullopt;
    return as_tensor(*v, e, what);
  }

  std::optional<Type> as_tensor(const Val& v, const ExprP& e, std::string_view what) {
    if (auto* t = std::get_if<Type>(&v)) return *t;
    if (auto* w = std::get_if<WeightRef>(&v)) {
      if (!check_selected(*w, e)) return std::nullopt;
      Type t = w->dep;
      if (t.domain < Domain::Weight) t.domain = Domain::Weight;
      t.shape = w->decl->shape;
      return t;
    }
    std::string got = std::holds_alternative<EdgeRef>(v) ? "an edge" : std::holds_alternative<NodeRef>(v) ? "a node"
                      : std::holds_alternative<GraphRef>(v) ? "the graph" : std::holds_alternative<TypeIdx>(v) ? "a type index"
                      : "a string";
    d_.error(e->loc, "type-mismatch", fmt::format("{} must be a tensor value, but '{}' is {}", what, print_expr_short(e), got));
    return std::nullopt;
  }

  bool check_selected(const WeightRef& w, const ExprP& e) {
    if (w.selected || w.decl->per == Per::None) return true;
    d_.error(e->loc, "weight-indexing",
             fmt::format("weight '{}' is per {}; select a slice with {}[{}]", w.decl->name, to_string(w.decl->per),
                         w.decl->name, w.decl->per == Per::Etype ? "e.etype" : "n.ntype"));
    return false;
  }

  std::optional<Val> eval(const ExprP& e) {
    switch (e->kind) {
      case ExprKind::Number: return Val{Type{}};
      case ExprKind::String: return Val{StrLit{e->name}};
      case ExprKind::Name: return name(e);
      case ExprKind::Attr: return attr(e);
      case ExprKind::Index: return index(e);
      case ExprKind::Call: return call(e);
      case ExprKind::Neg: {
        auto t = tensor(e->args[0], "the operand of '-'");
        if (!t) return std::nullopt;
        return Val{*t};
      }
      case ExprKind::Binary: return binary(e);
    }
    return std::nullopt;
  }

  std::optional<Val> name(const ExprP& e) {
    const std::string& n = e->name;
    if (Type* t = find_local(n)) return Val{*t};
    if (poisoned_.count(n)) return std::nullopt;
    if (const Loop* l = find_loop(n)) {
      if (l->edge()) return Val{EdgeRef{n}};
      return Val{NodeRef{NodeRole::Loop, n}};
    }
    if (n == "g") return Val{GraphRef{}};
    if (m_.decl.find_hyper(n)) return Val{Type{}};
    if (weight_grad_output(n)) {
      d_.error(e->loc, "read-only", fmt::format("weight gradient '{}' can only be accumulated, not read", n));
      return std::nullopt;
    }
    if (const TensorDecl* w = m_.decl.find_weight(n)) {
      used_.insert(n);
      return Val{WeightRef{w, false, of(Domain::Weight)}};
    }
    if (const TensorDecl* in = m_.decl.find_input(n)) {
      d_.error(e->loc, "undefined-name", fmt::format("input '{}' is per {}; read it as {}.{}", n, to_string(in->per),
                                                     in->per == Per::Edge ? "e" : "n", n));
      return std::nullopt;
    }
    d_.error(e->loc, "undefined-name", fmt::format("undefined name '{}'{}", n, suggest(n, visible_names())));
    return std::nullopt;
  }

  // The type a node's data has where it is read: per node in a node loop, gathered per edge in an edge loop.
  Type node_data(const NodeRef& n) const {
    if (n.role == NodeRole::Loop && !current_loop().edge()) return of(Domain::Node);
    if (n.role == NodeRole::Loop) return of(Domain::Node);  // the outer node, constant across its edges
    Type t = of(Domain::Edge);
    // In `for n ...: for e in n.incoming_edges()`, e.dst is n itself.
    const Loop* el = find_loop(n.var);
    bool is_outer = el && ((el->kind == LoopKind::IncomingEdges && n.role == NodeRole::Dst) ||
                           (el->kind == LoopKind::OutgoingEdges && n.role == NodeRole::Src));
    if (is_outer) return of(Domain::Node);
    (n.role == NodeRole::Src ? t.dep_src : t.dep_dst) = true;
    return t;
  }

  std::optional<Val> attr(const ExprP& e) {
    std::optional<Val> base = eval(e->args[0]);
    if (!base) return std::nullopt;
    const std::string& a = e->name;
    if (auto* er = std::get_if<EdgeRef>(&*base)) {
      if (a == "src") return Val{NodeRef{NodeRole::Src, er->var}};
      if (a == "dst") return Val{NodeRef{NodeRole::Dst, er->var}};
      if (a == "etype") {
        Type dep = of(Domain::Edge);
        dep.dep_etype = true;
        return Val{TypeIdx{true, dep}};
      }
      if (const TensorDecl* in = m_.decl.find_input(a); in && in->per == Per::Edge) {
        used_.insert(a);
        Type t{Domain::Edge, in->shape};
        t.dep_edge = true;
        return Val{t};
      }
      d_.error(e->loc, "unknown-attribute", fmt::format("an edge has no attribute '{}' (edges have src, dst, etype{})", a, edge_inputs()));
      return std::nullopt;
    }
    if (auto* nr = std::get_if<NodeRef>(&*base)) {
      if (a == "ntype") return Val{TypeIdx{false, node_data(*nr)}};
      if (const TensorDecl* in = m_.decl.find_input(a); in && in->per == Per::Node) {
        used_.insert(a);
        Type t = node_data(*nr);
        t.shape = in->shape;
        return Val{t};
      }
      d_.error(e->loc, "unknown-attribute", fmt::format("a node has no attribute '{}' (nodes have ntype{})", a, node_inputs()));
      return std::nullopt;
    }
    d_.error(e->loc, "unknown-attribute", fmt::format("'{}' has no attribute '{}'", print_expr_short(e->args[0]), a));
    return std::nullopt;
  }

  std::optional<Val> index(const ExprP& e) {
    std::optional<Val> base = eval(e->args[0]);
    if (!base) return std::nullopt;
    if (auto* w = std::get_if<WeightRef>(&*base)) {
      if (w->selected) {
        d_.error(e->loc, "weight-indexing", fmt::format("weight '{}' is indexed twice", w->decl->name));
        return std::nullopt;
      }
      if (w->decl->per == Per::None) {
        d_.error(e->loc, "weight-indexing", fmt::format("weight '{}' is shared (per: none) and takes no index", w->decl->name));
        return std::nullopt;
      }
      std::optional<Val> idx = eval(e->args[1]);
      if (!idx) return std::nullopt;
      auto* ti = std::get_if<TypeIdx>(&*idx);
      bool want_etype = w->decl->per == Per::Etype;
      if (!ti || ti->etype != want_etype) {
        d_.error(e->args[1]->loc, "weight-indexing",
                 fmt::format("weight '{}' is per {}; index it with {}", w->decl->name, to_string(w->decl->per),
                             want_etype ? "an edge type such as e.etype" : "a node type such as n.ntype or e.src.ntype"));
        return std::nullopt;
      }
      Type dep = ti->dep;
      return Val{WeightRef{w->decl, true, dep}};
    }
    if (std::holds_alternative<EdgeRef>(*base) || std::holds_alternative<NodeRef>(*base)) {
      bool is_edge = std::holds_alternative<EdgeRef>(*base);
      const ExprP& key = e->args[1];
      if (key->kind != ExprKind::String) {
        d_.error(key->loc, "bad-field", "field names must be string literals such as e[\"att\"]");
        return std::nullopt;
      }
      auto& fields = is_edge ? a_.edge_fields : a_.node_fields;
      auto it = fields.find(key->name);
      if (it == fields.end() && poisoned_.count("\"" + key->name)) return std::nullopt;
      if (it == fields.end()) {
        auto& other = is_edge ? a_.node_fields : a_.edge_fields;
        if (other.count(key->name))
          d_.error(key->loc, "undefined-field", fmt::format("'{}' is a{} field, not a{} field", key->name,
                                                            is_edge ? " node" : "n edge", is_edge ? "n edge" : " node"));
        else
          d_.error(key->loc, "undefined-field", fmt::format("field '{}' is read before it is written{}", key->name,
                                                            suggest(key->name, field_names(fields))));
        return std::nullopt;
      }
      if (!is_edge) {
        for (const auto& agg : aggregating_)
          if (agg.count(key->name)) {
            d_.error(key->loc, "read-while-aggregating",
                     fmt::format("node field '{}' is read in the loop that aggregates into it; its value would "
                                 "depend on the edge order",
                                 key->name));
            return std::nullopt;
          }
      }
      read_.insert(key->name);
      Type t;
      if (is_edge) {
        t = of(Domain::Edge);
        t.dep_edge = true;
      } else {
        t = node_data(std::get<NodeRef>(*base));
      }
      t.shape = it->second.shape;
      return Val{t};
    }
    d_.error(e->loc, "bad-index", fmt::format("'{}' cannot be indexed; use reshape() to change shapes", print_expr_short(e->args[0])));
    return std::nullopt;
  }

  bool combine_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b, std::vector<int64_t>& out, SourceLoc loc) {
    if (is_prefix(a, b)) { out = b; return true; }
    if (is_prefix(b, a)) { out = a; return true; }
    d_.error(loc, "shape-mismatch", fmt::format("shapes {} and {} do not broadcast (one must be a prefix of the other)", shape_str(a), shape_str(b)));
    return false;
  }

  // x [.., K] * W [K, N] -> [.., N]; x [H, K] * W [H, K, N] -> [H, N]
  std::optional<Type> linear(const Type& x, const WeightRef& w, const ExprP& at, const ExprP& wexpr) {
    if (!check_selected(w, wexpr)) return std::nullopt;
    const auto& ws = w.decl->shape;
    Type t = join(x, w.dep);
    if (t.domain < Domain::Node && x.domain < Domain::Node) {
      d_.error(at->loc, "type-mismatch", "a linear transform needs node or edge data as its input");
      return std::nullopt;
    }
    if (ws.size() == 2 && !x.shape.empty() && x.shape.back() == ws[0]) {
      t.shape = x.shape;
      t.shape.back() = ws[1];
      return t;
    }
    if (ws.size() == 3 && x.shape.size() == 2 && x.shape[0] == ws[0] && x.shape[1] == ws[1]) {
      t.shape = {ws[0], ws[2]};
      return t;
    }
    d_.error(at->loc, "shape-mismatch",
             fmt::format("cannot multiply a value of shape {} by weight '{}' of shape {} (expected [.., K] x [K, N] or "
                         "[H, K] x [H, K, N])",
                         shape_str(x.shape), w.decl->name, shape_str(ws)));
    return std::nullopt;
  }

  std::optional<Val> binary(const ExprP& e) {
    std::optional<Val> l = eval(e->args[0]);
    if (!l) return std::nullopt;
    std::optional<Val> r = eval(e->args[1]);
    if (!r) return std::nullopt;
    if (e->op == BinOp::Mul) {
      auto* lw = std::get_if<WeightRef>(&*l);
      auto* rw = std::get_if<WeightRef>(&*r);
      if (rw && rw->decl->shape.size() >= 2) {
        auto x = as_tensor(*l, e->args[0], "the input of a linear transform");
        if (!x) return std::nullopt;
        auto t = linear(*x, *rw, e, e->args[1]);
        if (!t) return std::nullopt;
        return Val{*t};
      }
      if (lw && lw->decl->shape.size() >= 2) {
        d_.error(e->loc, "operand-order", fmt::format("write the input first: x * {} (row vector times matrix)", lw->decl->name));
        return std::nullopt;
      }
    }
    auto a = as_tensor(*l, e->args[0], fmt::format("the left operand of '{}'", to_string(e->op)));
    if (!a) return std::nullopt;
    auto b = as_tensor(*r, e->args[1], fmt::format("the right operand of '{}'", to_string(e->op)));
    if (!b) return std::nullopt;
    Type t = join(*a, *b);
    if (!combine_shapes(a->shape, b->shape, t.shape, e->loc)) return std::nullopt;
    return Val{t};
  }

  static bool is_builtin(const std::string& f) { return builtin_functions().count(f) > 0; }

  bool arity(const ExprP& e, size_t lo, size_t hi) {
    if (e->args.size() >= lo && e->args.size() <= hi) return true;
    std::string want = lo == hi ? std::to_string(lo) : hi == SIZE_MAX ? fmt::format("at least {}", lo) : fmt::format("{} or {}", lo, hi);
    d_.error(e->loc, "wrong-arguments", fmt::format("'{}' takes {} argument{}, got {}", e->name, want, lo == 1 && hi == 1 ? "" : "s", e->args.size()));
    return false;
  }

  std::optional<Val> call(const ExprP& e) {
    const std::string& f = e->name;
    if (!is_builtin(f)) {
      bool user = std::any_of(m_.functions.begin(), m_.functions.end(), [&](const FuncDef& d) { return d.name == f; });
      if (user)
        d_.error(e->loc, "unknown-function", fmt::format("function '{}' has no value; call it as a statement", f));
      else
        d_.error(e->loc, "unknown-function",
                 fmt::format("unknown function '{}'{}", f,
                             suggest(f, std::vector<std::string>(builtin_functions().begin(), builtin_functions().end()))));
      return std::nullopt;
    }
    if (f == "max" || f == "max_grad") {
      if (!arity(e, 2, 2)) return std::nullopt;
      auto a = tensor(e->args[0], fmt::format("the first argument of '{}'", f));
      if (!a) return std::nullopt;
      auto b = tensor(e->args[1], fmt::format("the second argument of '{}'", f));
      if (!b) return std::nullopt;
      Type t = join(*a, *b);
      if (!combine_shapes(a->shape, b->shape, t.shape, e->loc)) return std::nullopt;
      return Val{t};
    }
    if (f == "exp" || f == "relu" || f == "tanh" || f == "sigmoid" || f == "sqrt") {
      if (!arity(e, 1, 1)) return std::nullopt;
      auto t = tensor(e->args[0], fmt::format("the argument of '{}'", f));
      if (!t) return std::nullopt;
      return Val{*t};
    }
    if (f == "sum") {
      if (!arity(e, 1, 1)) return std::nullopt;
      auto t = tensor(e->args[0], "the argument of 'sum'");
      if (!t) return std::nullopt;
      if (t->shape.empty()) {
        d_.error(e->loc, "shape-mismatch", "'sum' reduces the last axis; got a scalar");
        return std::nullopt;
      }
      t->shape.pop_back();
      return Val{*t};
    }
    if (f == "linear_t") {
      if (!arity(e, 2, 2)) return std::nullopt;
      auto y = tensor(e->args[0], "the input of 'linear_t'");
      if (!y) return std::nullopt;
      std::optional<Val> w = eval(e->args[1]);
      if (!w) return std::nullopt;
      auto* wr = std::get_if<WeightRef>(&*w);
      if (!wr || !check_selected(*wr, e->args[1])) {
        if (!wr) d_.error(e->args[1]->loc, "type-mismatch", "the second argument of 'linear_t' must be a weight");
        return std::nullopt;
      }
      const auto& ws = wr->decl->shape;
      Type t = join(*y, wr->dep);
      if (ws.size() == 2 && !y->shape.empty() && y->shape.back() == ws[1]) {
        t.shape = y->shape;
        t.shape.back() = ws[0];
        return Val{t};
      }
      if (ws.size() == 3 && y->shape.size() == 2 && y->shape[0] == ws[0] && y->shape[1] == ws[2]) {
        t.shape = {ws[0], ws[1]};
        return Val{t};
      }
      d_.error(e->loc, "shape-mismatch", fmt::format("cannot multiply a value of shape {} by the transpose of '{}' of shape {}",
                                                     shape_str(y->shape), wr->decl->name, shape_str(ws)));
      return std::nullopt;
    }
    if (f == "leakyrelu" || f == "leakyrelu_grad") {
      if (!arity(e, 1, 2)) return std::nullopt;
      auto t = tensor(e->args[0], fmt::format("the argument of '{}'", f));
      if (!t) return std::nullopt;
      if (e->args.size() == 2) {
        Diagnostics scratch;
        if (!dsl::eval_constant(e->args[1], m_.decl, scratch)) {
          d_.error(e->args[1]->loc, "not-constant", "the slope of 'leakyrelu' must be a constant (a number or a hyper-parameter)");
          return std::nullopt;
        }
      }
      return Val{*t};
    }
    if (f == "linear") {
      if (!arity(e, 2, 2)) return std::nullopt;
      auto x = tensor(e->args[0], "the input of 'linear'");
      if (!x) return std::nullopt;
      std::optional<Val> w = eval(e->args[1]);
      if (!w) return std::nullopt;
      auto* wr = std::get_if<WeightRef>(&*w);
      if (!wr) {
        d_.error(e->args[1]->loc, "type-mismatch", "the second argument of 'linear' must be a weight");
        return std::nullopt;
      }
      auto t = linear(*x, *wr, e, e->args[1]);
      if (!t) return std::nullopt;
      return Val{*t};
    }
    if (f == "dot" || f == "outer") {
      if (!arity(e, 2, 2)) return std::nullopt;
      auto a = tensor(e->args[0], fmt::format("the first argument of '{}'", f));
      if (!a) return std::nullopt;
      auto b = tensor(e->args[1], fmt::format("the second argument of '{}'", f));
      if (!b) return std::nullopt;
      Type t = join(*a, *b);
      if (a->shape.empty() || b->shape.empty()) {
        d_.error(e->loc, "shape-mismatch", fmt::format("'{}' needs vectors, got shapes {} and {}", f, shape_str(a->shape), shape_str(b->shape)));
        return std::nullopt;
      }
      if (f == "dot") {
        if (a->shape != b->shape) {
          d_.error(e->loc, "shape-mismatch", fmt::format("'dot' needs equal shapes, got {} and {}", shape_str(a->shape), shape_str(b->shape)));
          return std::nullopt;
        }
        t.shape.assign(a->shape.begin(), a->shape.end() - 1);
      } else {
        if (a->shape.size() != b->shape.size() || !std::equal(a->shape.begin(), a->shape.end() - 1, b->shape.begin())) {
          d_.error(e->loc, "shape-mismatch", fmt::format("'outer' needs equal leading dimensions, got {} and {}", shape_str(a->shape), shape_str(b->shape)));
          return std::nullopt;
        }
        t.shape = a->shape;
        t.shape.push_back(b->shape.back());
      }
      return Val{t};
    }
    if (f == "concat") {
      if (!arity(e, 2, SIZE_MAX)) return std::nullopt;
      std::optional<Type> acc;
      for (const ExprP& arg : e->args) {
        auto t = tensor(arg, "an argument of 'concat'");
        if (!t) return std::nullopt;
        if (t->shape.empty()) {
          d_.error(arg->loc, "shape-mismatch", "'concat' joins vectors along their last dimension; got a scalar");
          return std::nullopt;
        }
        if (!acc) { acc = t; continue; }
        if (acc->shape.size() != t->shape.size() || !std::equal(acc->shape.begin(), acc->shape.end() - 1, t->shape.begin())) {
          d_.error(arg->loc, "shape-mismatch", fmt::format("'concat' needs equal leading dimensions, got {} and {}", shape_str(acc->shape), shape_str(t->shape)));
          return std::nullopt;
        }
        Type j = join(*acc, *t);
        j.shape = acc->shape;
        j.shape.back() += t->shape.back();
        acc = j;
      }
      return Val{*acc};
    }
    // reshape(x, d0, d1, ...)
    if (!arity(e, 2, SIZE_MAX)) return std::nullopt;
    auto x = tensor(e->args[0], "the input of 'reshape'");
    if (!x) return std::nullopt;
    Type t = *x;
    t.shape.clear();
    int64_t n = 1, m = 1;
    for (int64_t d : x->shape) n *= d;
    for (size_t i = 1; i < e->args.size(); ++i) {
      Diagnostics scratch;
      auto v = dsl::eval_constant(e->args[i], m_.decl, scratch);
      if (!v || *v < 1 || static_cast<double>(static_cast<int64_t>(*v)) != *v) {
        d_.error(e->args[i]->loc, "bad-shape", "reshape dimensions must be positive integer constants");
        return std::nullopt;
      }
      t.shape.push_back(static_cast<int64_t>(*v));
      m *= t.shape.back();
    }
    if (n != m) {
      d_.error(e->loc, "shape-mismatch", fmt::format("cannot reshape {} ({} elements) to {} ({} elements)", shape_str(x->shape), n, shape_str(t.shape), m));
      return std::nullopt;
    }
    return Val{t};
  }

  // ---- scopes ---------------------------------------------------------------------------------
  const Loop& current_loop() const { return loops_.back(); }
  const Loop* find_loop(const std::string& n) const {
    for (const Loop& l : loops_)
      if (l.var == n) return &l;
    return nullptr;
  }
  Type* find_local(const std::string& n) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(n);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }
  bool name_taken(const std::string& n) { return !kind_of(n).empty(); }
  std::string kind_of(const std::string& n) {
    if (find_loop(n)) return "loop variable";
    if (find_local(n)) return "local";
    if (n == "g") return "graph";
    if (m_.decl.find_hyper(n)) return "hyper-parameter";
    if (m_.decl.find_weight(n)) return "weight";
    if (m_.decl.find_input(n)) return "input";
    return "";
  }
  // Innermost first: the order in which suggest() breaks ties.
  std::vector<std::string> visible_names() {
    std::vector<std::string> v;
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s)
      for (const auto& [k, _] : *s) v.push_back(k);
    for (auto l = loops_.rbegin(); l != loops_.rend(); ++l) v.push_back(l->var);
    for (const auto& w : m_.decl.weights) v.push_back(w.name);
    for (const auto& h : m_.decl.hyper) v.push_back(h.name);
    v.push_back("g");
    return v;
  }
  static std::vector<std::string> field_names(const std::map<std::string, FieldInfo>& f) {
    std::vector<std::string> v;
    for (const auto& [k, _] : f) v.push_back(k);
    return v;
  }
  std::string edge_inputs() const {
    std::string s;
    for (const auto& i : m_.decl.inputs)
      if (i.per == Per::Edge) s += ", " + i.name;
    return s;
  }
  std::string node_inputs() const {
    std::string s;
    for (const auto& i : m_.decl.inputs)
      if (i.per == Per::Node) s += ", " + i.name;
    return s;
  }
  static std::string print_expr_short(const ExprP& e);
  static std::string print_target(const Expr& e);

  const Module& m_;
  Diagnostics& d_;
  Analysis& a_;
  std::vector<Loop> loops_;
  std::vector<std::map<std::string, Type>> scopes_;
  std::vector<std::set<std::string>> aggregating_;  // per loop: node fields scattered into
  std::set<std::string> used_;
  std::set<std::string> read_;
  std::set<std::string> poisoned_;
  std::set<std::string> weight_grads_written_;  // locals (name) and fields ("\"name") whose definition failed
};

}  // namespace
}  // namespace hectorgen::inter

#include "ir/inter/printer.h"

namespace hectorgen::inter {
namespace {
std::string Verifier::print_expr_short(const ExprP& e) { return print_expr(e); }
std::string Verifier::print_target(const Expr& e) { return print_expr(std::make_shared<Expr>(e)); }
}  // namespace

bool verify(const Module& m, Diagnostics& diags, Analysis* analysis) {
  Analysis local;
  Analysis& a = analysis ? *analysis : local;
  a = Analysis{};
  return Verifier(m, diags, a).run();
}

}  // namespace hectorgen::inter
