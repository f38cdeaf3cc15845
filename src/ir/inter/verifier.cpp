#include "ir/inter/verifier.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>
#include <tuple>

#include "ir/inter/constant.h"
#include "ir/inter/names.h"
#include "ir/inter/ops.h"
#include "ir/inter/printer.h"
#include "ir/inter/typing.h"

namespace hectorgen::inter {

namespace {

struct Loop {
  std::string var;
  LoopKind kind;
  bool edge() const { return is_edge_loop(kind); }
  bool pair() const { return kind == LoopKind::SrcPairs; }
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

std::string print_short(const ExprP& e) { return print_expr(e); }
std::string print_short(const Expr& e) { return print_expr(std::make_shared<Expr>(e)); }

class Verifier {
 public:
  Verifier(const Module& m, Diagnostics& d) : m_(m), d_(d) {
    out_.decl = m.decl;
    ctx_ = TypeContext::of(out_);
  }

  std::optional<Module> run() {
    int before = d_.error_count();
    for (const StmtP& s : m_.body)
      if (StmtP t = stmt(s)) out_.body.push_back(t);
    if (d_.error_count() != before) return std::nullopt;  // later checks would only echo earlier errors
    for (const TensorDecl& o : m_.decl.outputs) {
      if (o.per != Per::Node && o.per != Per::Edge) {
        if (!weight_grads_written_.count(o.name))
          d_.warning(o.loc, "unwritten-output", fmt::format("weight gradient '{}' is never accumulated (it stays zero)", o.name));
        continue;
      }
      auto& fields = o.per == Per::Edge ? out_.edge_fields : out_.node_fields;
      auto it = fields.find(o.name);
      if (it == fields.end())
        d_.error(o.loc, "unwritten-output",
                 fmt::format("output '{}' is never written; assign {}[\"{}\"] in the program", o.name,
                             o.per == Per::Edge ? "e" : "n", o.name));
      else if (it->second.shape != o.shape)
        d_.error(o.loc, "output-mismatch", fmt::format("output '{}' is declared with shape {}, but the program computes shape {}",
                                                       o.name, shape_str(o.shape), shape_str(it->second.shape)));
    }
    if (d_.error_count() != before) return std::nullopt;  // unused/unwritten follow from earlier errors
    for (const TensorDecl& w : m_.decl.weights)
      if (!used_.count(w.name)) d_.warning(w.loc, "unused", fmt::format("weight '{}' is never used", w.name));
    for (const TensorDecl& i : m_.decl.inputs)
      if (!used_.count(i.name)) d_.warning(i.loc, "unused", fmt::format("input '{}' is never used", i.name));
    // A typed module's field tables must be what inference computes.
    if (!m_.node_fields.empty() || !m_.edge_fields.empty() || !m_.pair_fields.empty()) {
      auto same = [](const FieldTable& a, const FieldTable& b) {
        if (a.size() != b.size()) return false;
        for (const auto& [k, v] : a) {
          auto it = b.find(k);
          if (it == b.end() || it->second.shape != v.shape || it->second.on_edges != v.on_edges || it->second.dtype != v.dtype)
            return false;
        }
        return true;
      };
      if (!same(m_.node_fields, out_.node_fields) || !same(m_.edge_fields, out_.edge_fields) ||
          !same(m_.pair_fields, out_.pair_fields))
        d_.error(m_.decl.loc, "internal", "the module's field tables differ from what type inference computes");
    }
    if (d_.error_count() != before) return std::nullopt;
    return std::move(out_);
  }

 private:
  // ---- typed nodes ------------------------------------------------------------------------------------
  // `e` with typed children and type `t`: `e` itself when it has them already. A node that carries a
  // different type is a pass's bug (verify() after a pass).
  ExprP make(const ExprP& e, std::vector<ExprP> args, Type t, Op fn) {
    if (e->type.typed() && (e->type != t || e->fn != fn))
      d_.error(e->loc, "internal",
               fmt::format("'{}' carries type {}, but type inference gives {}", print_short(e), e->type.str(), t.str()));
    if (args == e->args && e->type == t && e->fn == fn) return e;
    auto c = std::make_shared<Expr>(*e);
    c->args = std::move(args);
    c->type = std::move(t);
    c->fn = fn;
    return c;
  }
  ExprP make(const ExprP& e, Type t) { return make(e, e->args, std::move(t), e->fn); }

  StmtP typed_assign(const StmtP& s, ExprP target, ExprP value) {
    if (target == s->target && value == s->value) return s;
    return Stmt::assign(std::move(target), s->op, std::move(value), s->loc);
  }

  // ---- statements -----------------------------------------------------------------------------
  StmtP stmt(const StmtP& s) {
    switch (s->kind) {
      case StmtKind::For: return for_stmt(s);
      case StmtKind::Assign: return assign(s);
      case StmtKind::Call: {
        const std::string& f = s->value->name;
        if (s->value->fn != Op::None)
          d_.error(s->loc, "unused-value", fmt::format("the result of '{}' is not used", f));
        else
          d_.error(s->value->loc, "unknown-function", fmt::format("unknown function '{}'", f));
        return nullptr;
      }
    }
    return nullptr;
  }

  StmtP for_stmt(const StmtP& sp) {
    const Stmt& s = *sp;
    bool graph_loop = is_graph_loop(s.loop);
    if (name_taken(s.var)) {
      d_.error(s.loc, "duplicate-name", fmt::format("loop variable '{}' hides another name", s.var));
      return nullptr;
    }
    if (graph_loop) {
      if (s.parent != "g") {
        d_.error(s.loc, "bad-iterator", fmt::format("'{}' is not the graph; graph loops iterate g.{}()", s.parent, to_string(s.loop)));
        return nullptr;
      }
      if (!loops_.empty()) {
        d_.error(s.loc, "nested-graph-loop",
                 fmt::format("a loop over g.{}() cannot be nested in another loop; iterate n.incoming_edges() "
                             "or n.outgoing_edges() instead",
                             to_string(s.loop)));
        return nullptr;
      }
    } else {
      const Loop* parent = find_loop(s.parent);
      if (!parent || parent->edge() || parent->pair()) {
        d_.error(s.loc, "bad-iterator",
                 fmt::format("'{}.{}()' needs '{}' to be the variable of an enclosing node loop", s.parent,
                             to_string(s.loop), s.parent));
        return nullptr;
      }
      if (loops_.size() != 1) {
        d_.error(s.loc, "nested-graph-loop", "edge loops can be nested one level deep in a node loop only");
        return nullptr;
      }
    }
    if (!check_name(s.var, s.loc, "loop variable")) return nullptr;
    loops_.push_back({s.var, s.loop});
    scopes_.emplace_back();
    aggregating_.emplace_back();
    std::vector<StmtP> body;
    for (const StmtP& b : s.body)
      if (StmtP t = stmt(b)) body.push_back(t);
    aggregating_.pop_back();
    scopes_.pop_back();
    loops_.pop_back();
    if (body == s.body) return sp;
    return Stmt::for_loop(s.var, s.loop, s.parent, std::move(body), s.loc);
  }

  StmtP assign(const StmtP& sp) {
    const Stmt& s = *sp;
    if (loops_.empty()) {
      d_.error(s.loc, "outside-loop", "statements must be inside a loop over the graph's nodes or edges");
      return nullptr;
    }
    ExprP value = tensor(s.value, "the assigned value");
    const Expr& t = *s.target;
    if (value && is_weight_grad_target(t)) return assign_weight_grad(sp, value);
    if (!value) {
      // Remember the failed definition so its uses do not report again.
      if (t.kind == ExprKind::Name) poisoned_.insert(t.name);
      if (t.kind == ExprKind::Index && t.args[1]->kind == ExprKind::String) poisoned_.insert("\"" + t.args[1]->name);
      return nullptr;
    }
    if (t.kind == ExprKind::Name) return assign_local(sp, value);
    if (t.kind == ExprKind::Attr) {
      d_.error(t.loc, "read-only", fmt::format("'{}' is read-only; produced data are written as x[\"name\"]", print_short(t)));
      return nullptr;
    }
    // t is Index(base, "field")
    ExprP base = eval(t.args[0]);
    if (!base) return nullptr;
    if (t.args[1]->kind != ExprKind::String) {
      d_.error(t.args[1]->loc, "bad-field", "field names must be string literals such as e[\"att\"]");
      return nullptr;
    }
    const std::string& field = t.args[1]->name;
    if (!check_name(field, t.args[1]->loc, "field name")) {
      poisoned_.insert("\"" + field);
      return nullptr;
    }
    if (base->type.kind == ValueKind::Edge) return assign_edge_field(sp, base, value);
    if (base->type.kind == ValueKind::Node) return assign_node_field(sp, base, value);
    if (base->type.kind == ValueKind::Pair) return assign_pair_field(sp, base, value);
    d_.error(t.loc, "bad-assign-target", "only locals, e[\"field\"] and n[\"field\"] can be assigned");
    return nullptr;
  }

  // Outputs declared per etype / ntype / none are weight gradients: only `d_W[sel] += v` writes them.
  bool is_weight_grad_target(const Expr& t) const {
    if (t.kind == ExprKind::Name) return weight_grad_output(m_.decl, t.name) != nullptr;
    return t.kind == ExprKind::Index && t.args[0]->kind == ExprKind::Name && weight_grad_output(m_.decl, t.args[0]->name);
  }

  StmtP assign_weight_grad(const StmtP& sp, const ExprP& value) {
    const Stmt& s = *sp;
    const Expr& t = *s.target;
    const std::string& name = t.kind == ExprKind::Name ? t.name : t.args[0]->name;
    const TensorDecl* o = weight_grad_output(m_.decl, name);
    if (s.op != AssignOp::Add) {
      d_.error(s.loc, "needs-aggregation", fmt::format("weight gradient '{}' can only be accumulated with '+='", name));
      return nullptr;
    }
    if ((t.kind == ExprKind::Name) != (o->per == Per::None)) {
      d_.error(t.loc, "weight-indexing", fmt::format("weight gradient '{}' is per {}", name, to_string(o->per)));
      return nullptr;
    }
    // The gradient tensor as a reference: a weight-like target accumulated per type.
    Type grad = weight_ref(*o);
    std::vector<ExprP> args;
    if (t.kind == ExprKind::Index) {
      ExprP idx = eval(t.args[1]);
      if (!idx) return nullptr;
      if (idx->type.kind != ValueKind::TypeIndex || idx->type.etype != (o->per == Per::Etype)) {
        d_.error(t.args[1]->loc, "weight-indexing", fmt::format("weight gradient '{}' is per {}; index it with {}", name,
                                                                to_string(o->per), o->per == Per::Etype ? "e.etype" : "n.ntype"));
        return nullptr;
      }
      args = {make(t.args[0], grad), idx};
    }
    Type v = value_type(value->type);
    if (v.shape != o->shape) {
      d_.error(s.loc, "shape-mismatch", fmt::format("weight gradient '{}' has shape {}, but a value of shape {} is accumulated",
                                                    name, shape_str(o->shape), shape_str(v.shape)));
      return nullptr;
    }
    weight_grads_written_.insert(name);
    // The stored type from the typed target (a user's `acc[e.etype] += v` arrives untyped).
    auto target0 = std::make_shared<Expr>(t);
    if (t.kind == ExprKind::Index) target0->args = args;
    Type stored = stored_type(*target0, s.op, value->type, ctx_);
    ExprP target = t.kind == ExprKind::Name ? make(s.target, stored) : make(s.target, args, stored, s.target->fn);
    return typed_assign(sp, target, value);
  }

  StmtP assign_local(const StmtP& sp, const ExprP& value) {
    const Stmt& s = *sp;
    const Expr& t = *s.target;
    Type* existing = find_local(t.name);
    Type v = value_type(value->type);
    if (s.op == AssignOp::Set) {
      if (!existing && name_taken(t.name)) {
        d_.error(t.loc, "duplicate-name", fmt::format("'{}' is already a {}; choose another local name", t.name, kind_of(t.name)));
        return nullptr;
      }
      if (!existing && !check_name(t.name, t.loc, "local")) {
        poisoned_.insert(t.name);
        return nullptr;
      }
      if (v.domain == Domain::Edge && !current_loop().edge() && !current_loop().pair()) {
        edge_in_node_loop(s.value->loc);
        return nullptr;
      }
      Type stored = stored_type(t, s.op, value->type, ctx_);
      scopes_.back()[t.name] = stored;
      return typed_assign(sp, make(s.target, stored), value);
    }
    if (!existing) {
      d_.error(t.loc, "undefined-name", fmt::format("'{}' is updated before it is assigned", t.name));
      return nullptr;
    }
    auto merged = broadcast(existing->shape, v.shape);
    if (!merged) {
      d_.error(s.loc, "shape-mismatch", fmt::format("shapes {} and {} do not broadcast (one must be a prefix of the other)",
                                                    shape_str(existing->shape), shape_str(v.shape)));
      return nullptr;
    }
    if (*merged != existing->shape) {
      d_.error(s.loc, "shape-mismatch", fmt::format("updating '{}' of shape {} with a value of shape {}", t.name,
                                                    shape_str(existing->shape), shape_str(v.shape)));
      return nullptr;
    }
    Type stored = stored_type(t, s.op, value->type, ctx_, existing);
    *existing = stored;
    return typed_assign(sp, make(s.target, stored), value);
  }

  StmtP assign_edge_field(const StmtP& sp, const ExprP& base, const ExprP& value) {
    const Stmt& s = *sp;
    const std::string& field = s.target->args[1]->name;
    const std::string& var = s.target->args[0]->name;  // an edge reference is an edge loop's variable
    if (current_loop().var != var) {
      d_.error(s.target->loc, "bad-assign-target", fmt::format("edge fields are written through the innermost loop variable, not '{}'", var));
      return nullptr;
    }
    if (const TensorDecl* o = m_.decl.find_output(field); o && o->per != Per::Edge) {
      d_.error(s.target->loc, "output-mismatch", fmt::format("output '{}' is declared per {}, but written per edge", field, to_string(o->per)));
      return nullptr;
    }
    if (const char* other = other_field_kind(field, Home::Edge)) {
      d_.error(s.target->loc, "duplicate-name", fmt::format("'{}' is already a {} field", field, other));
      return nullptr;
    }
    return write_field(sp, base, Home::Edge, value);
  }

  // p["x"] in a pair loop (one write per pair), or e.pair["x"] aggregated from the pair's edges.
  StmtP assign_pair_field(const StmtP& sp, const ExprP& base, const ExprP& value) {
    const Stmt& s = *sp;
    const std::string& field = s.target->args[1]->name;
    if (m_.decl.find_output(field)) {
      d_.error(s.target->loc, "output-mismatch",
               fmt::format("output '{}' is declared per {}, but written per (source, edge type) pair", field,
                           to_string(m_.decl.find_output(field)->per)));
      return nullptr;
    }
    if (const char* other = other_field_kind(field, Home::Pair)) {
      d_.error(s.target->loc, "duplicate-name", fmt::format("'{}' is already a {} field", field, other));
      return nullptr;
    }
    if (base->type.role == NodeRole::Loop) {
      if (current_loop().var != s.target->args[0]->name) {
        d_.error(s.target->loc, "bad-assign-target", "pair fields are written through the innermost loop variable");
        return nullptr;
      }
    } else {
      // The edges of a pair all write its row: only an aggregation is well defined.
      bool aggregation = s.op == AssignOp::Add || s.op == AssignOp::Sub || is_max_aggregation(s);
      if (!aggregation) {
        d_.error(s.loc, "needs-aggregation",
                 fmt::format("pair field '{}' is written once per edge here; aggregate with '+=' (or '-=')", field));
        return nullptr;
      }
      aggregating_.back().insert(field);
    }
    return write_field(sp, base, Home::Pair, value);
  }

  StmtP assign_node_field(const StmtP& sp, const ExprP& base, const ExprP& value) {
    const Stmt& s = *sp;
    const std::string& field = s.target->args[1]->name;
    if (const TensorDecl* o = m_.decl.find_output(field); o && o->per != Per::Node) {
      d_.error(s.target->loc, "output-mismatch", fmt::format("output '{}' is declared per {}, but written per node", field, to_string(o->per)));
      return nullptr;
    }
    if (const char* other = other_field_kind(field, Home::Node)) {
      d_.error(s.target->loc, "duplicate-name", fmt::format("'{}' is already an {} field", field, other));
      return nullptr;
    }
    bool through_edge = base->type.role != NodeRole::Loop;
    bool in_edge_loop = current_loop().edge() || current_loop().pair();
    bool aggregation = s.op == AssignOp::Add || s.op == AssignOp::Sub || is_max_aggregation(s);
    if (through_edge || in_edge_loop) {
      // Many edges write to the same node: only an aggregation is well defined.
      if (!aggregation) {
        d_.error(s.loc, "needs-aggregation",
                 fmt::format("node field '{}' is written once per edge here; aggregate with '+=' (or '-=')", field));
        return nullptr;
      }
      aggregating_.back().insert(field);
    } else if (value_type(value->type).domain == Domain::Edge) {
      edge_in_node_loop(s.value->loc);
      return nullptr;
    }
    return write_field(sp, base, Home::Node, value);
  }

  enum class Home { Node, Edge, Pair };
  FieldTable& table(Home h) { return h == Home::Edge ? out_.edge_fields : h == Home::Pair ? out_.pair_fields : out_.node_fields; }
  // The kind of another table that has a field `name` ("node", "edge", "pair"), or null.
  const char* other_field_kind(const std::string& name, Home home) {
    for (auto [h, what] : {std::pair{Home::Node, "node"}, std::pair{Home::Edge, "edge"}, std::pair{Home::Pair, "pair"}})
      if (h != home && table(h).count(name)) return what;
    return nullptr;
  }

  StmtP write_field(const StmtP& sp, const ExprP& base, Home home, const ExprP& value) {
    const Stmt& s = *sp;
    const std::string& name = s.target->args[1]->name;
    const bool on_edges = home == Home::Edge;
    FieldTable& fields = table(home);
    bool fresh = !fields.count(name);
    if (fresh && (s.op == AssignOp::Mul || s.op == AssignOp::Div)) {
      d_.error(s.target->loc, "undefined-field", fmt::format("field '{}' is updated before it is assigned", name));
      return nullptr;
    }
    // `+=` into a new field starts from zero.
    Type v = value_type(value->type);
    bool accumulates = s.op != AssignOp::Set || is_max_aggregation(s);
    bool may_grow = is_max_aggregation(s) || !read_.count(name);
    std::vector<int64_t> before = fresh ? std::vector<int64_t>{} : fields.at(name).shape;
    if (!record_field_write(fields, name, on_edges, accumulates, may_grow, v.shape)) {
      d_.error(s.loc, "shape-mismatch", fmt::format("field '{}' has shape {}, but a value of shape {} is {}", name, shape_str(before),
                                                    shape_str(v.shape), s.op == AssignOp::Set ? "assigned" : "accumulated"));
      return nullptr;
    }
    const std::vector<int64_t>& shape = fields.at(name).shape;
    if (const TensorDecl* o = m_.decl.find_output(name); o && !is_prefix(shape, o->shape)) {
      d_.error(s.loc, "output-mismatch", fmt::format("output '{}' is declared with shape {}, but is written with shape {}",
                                                     name, shape_str(o->shape), shape_str(shape)));
      return nullptr;
    }
    ExprP key = make(s.target->args[1], Type::of_kind(ValueKind::String));
    auto target0 = std::make_shared<Expr>(*s.target);
    target0->args = {base, key};
    Type stored = stored_type(*target0, s.op, value->type, ctx_);
    return typed_assign(sp, make(s.target, {base, key}, stored, s.target->fn), value);
  }

  // Names become identifiers in the generated code.
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
  // The typed node of `e`, which must denote a tensor value (or a weight slice used as one).
  ExprP tensor(const ExprP& e, std::string_view what) {
    ExprP n = eval(e);
    if (!n || !as_tensor(n, what)) return nullptr;
    return n;
  }

  bool as_tensor(const ExprP& n, std::string_view what) {
    const Type& t = n->type;
    if (t.kind == ValueKind::Tensor) return true;
    if (t.kind == ValueKind::Weight) return check_selected(n);
    std::string got = t.kind == ValueKind::Edge ? "an edge" : t.kind == ValueKind::Node ? "a node"
                      : t.kind == ValueKind::Pair ? "a (source, edge type) pair"
                      : t.kind == ValueKind::Graph ? "the graph" : t.kind == ValueKind::TypeIndex ? "a type index"
                      : "a string";
    d_.error(n->loc, "type-mismatch", fmt::format("{} must be a tensor value, but '{}' is {}", what, print_short(n), got));
    return false;
  }

  bool check_selected(const ExprP& n) {
    const Type& w = n->type;
    if (w.selected || w.per == Per::None) return true;
    d_.error(n->loc, "weight-indexing",
             fmt::format("weight '{}' is per {}; select a slice with {}[{}]", w.weight, to_string(w.per), w.weight,
                         w.per == Per::Etype ? "e.etype" : "n.ntype"));
    return false;
  }

  ExprP eval(const ExprP& e) {
    switch (e->kind) {
      case ExprKind::Number: return make(e, Type::constant(e->number));
      case ExprKind::String: return make(e, Type::of_kind(ValueKind::String));
      case ExprKind::Name: return name(e);
      case ExprKind::Attr: return attr(e);
      case ExprKind::Index: return index(e);
      case ExprKind::Call: return call(e);
      case ExprKind::Neg: {
        ExprP x = tensor(e->args[0], "the operand of '-'");
        if (!x) return nullptr;
        return op_node(e, {x}, Op::Neg);
      }
      case ExprKind::Binary: return binary(e);
    }
    return nullptr;
  }

  // The node of operator `op` over typed arguments (the table's type rule; errors reported).
  ExprP op_node(const ExprP& e, std::vector<ExprP> args, Op op) {
    TypeResult r = type_op(op, args, e->loc);
    if (auto* err = std::get_if<TypeError>(&r)) {
      d_.error(err->loc, err->kind, err->message);
      return nullptr;
    }
    return make(e, std::move(args), std::get<Type>(std::move(r)), op);
  }

  ExprP name(const ExprP& e) {
    const std::string& n = e->name;
    if (Type* t = find_local(n)) return make(e, *t);
    if (poisoned_.count(n)) return nullptr;
    if (const Loop* l = find_loop(n)) return make(e, Type::loop_var(l->kind));
    if (n == "g") return make(e, Type::of_kind(ValueKind::Graph));
    if (const HyperParam* h = m_.decl.find_hyper(n)) return make(e, Type::constant(h->value));
    if (weight_grad_output(m_.decl, n)) {
      d_.error(e->loc, "read-only", fmt::format("weight gradient '{}' can only be accumulated, not read", n));
      return nullptr;
    }
    if (m_.decl.find_weight(n)) {
      used_.insert(n);
      return make(e, weight_ref(*m_.decl.find_weight(n)));
    }
    if (const TensorDecl* in = m_.decl.find_input(n)) {
      d_.error(e->loc, "undefined-name", fmt::format("input '{}' is per {}; read it as {}.{}", n, to_string(in->per),
                                                     in->per == Per::Edge ? "e" : "n", n));
      return nullptr;
    }
    d_.error(e->loc, "undefined-name", fmt::format("undefined name '{}'{}", n, suggest(n, visible_names())));
    return nullptr;
  }

  ExprP attr(const ExprP& e) {
    ExprP base = eval(e->args[0]);
    if (!base) return nullptr;
    if (base->type.kind != ValueKind::Edge && base->type.kind != ValueKind::Node && base->type.kind != ValueKind::Pair) {
      d_.error(e->loc, "unknown-attribute", fmt::format("'{}' has no attribute '{}'", print_short(e->args[0]), e->name));
      return nullptr;
    }
    TypeResult r = type_attr(base->type, e->name, e->loc, ctx_);
    if (auto* err = std::get_if<TypeError>(&r)) {
      d_.error(err->loc, err->kind, err->message);
      return nullptr;
    }
    if (m_.decl.find_input(e->name) && std::get<Type>(r).kind == ValueKind::Tensor) used_.insert(e->name);
    return make(e, {base}, std::get<Type>(std::move(r)), e->fn);
  }

  ExprP index(const ExprP& e) {
    ExprP base = eval(e->args[0]);
    if (!base) return nullptr;
    const Type& bt = base->type;
    if (bt.kind == ValueKind::Weight) {
      if (bt.selected) {
        d_.error(e->loc, "weight-indexing", fmt::format("weight '{}' is indexed twice", bt.weight));
        return nullptr;
      }
      if (bt.per == Per::None) {
        d_.error(e->loc, "weight-indexing", fmt::format("weight '{}' is shared (per: none) and takes no index", bt.weight));
        return nullptr;
      }
      ExprP idx = eval(e->args[1]);
      if (!idx) return nullptr;
      bool want_etype = bt.per == Per::Etype;
      if (idx->type.kind != ValueKind::TypeIndex || idx->type.etype != want_etype) {
        d_.error(e->args[1]->loc, "weight-indexing",
                 fmt::format("weight '{}' is per {}; index it with {}", bt.weight, to_string(bt.per),
                             want_etype ? "an edge type such as e.etype" : "a node type such as n.ntype or e.src.ntype"));
        return nullptr;
      }
      return typed_index(e, base, idx);
    }
    if (bt.kind == ValueKind::Edge || bt.kind == ValueKind::Node || bt.kind == ValueKind::Pair) {
      Home home = bt.kind == ValueKind::Edge ? Home::Edge : bt.kind == ValueKind::Pair ? Home::Pair : Home::Node;
      const ExprP& key = e->args[1];
      if (key->kind != ExprKind::String) {
        d_.error(key->loc, "bad-field", "field names must be string literals such as e[\"att\"]");
        return nullptr;
      }
      auto& fields = table(home);
      auto it = fields.find(key->name);
      if (it == fields.end() && poisoned_.count("\"" + key->name)) return nullptr;
      if (it == fields.end()) {
        static const char* const kWhat[] = {"node", "edge", "pair"};
        if (const char* other = other_field_kind(key->name, home))
          d_.error(key->loc, "undefined-field", fmt::format("'{}' is a{} {} field, not a{} {} field", key->name,
                                                            *other == 'e' ? "n" : "", other,
                                                            home == Home::Edge ? "n" : "", kWhat[static_cast<int>(home)]));
        else
          d_.error(key->loc, "undefined-field", fmt::format("field '{}' is read before it is written{}", key->name,
                                                            suggest(key->name, field_names(fields))));
        return nullptr;
      }
      if (home != Home::Edge) {
        for (const auto& agg : aggregating_)
          if (agg.count(key->name)) {
            d_.error(key->loc, "read-while-aggregating",
                     fmt::format("{} field '{}' is read in the loop that aggregates into it; its value would "
                                 "depend on the edge order",
                                 home == Home::Pair ? "pair" : "node", key->name));
            return nullptr;
          }
      }
      read_.insert(key->name);
      return typed_index(e, base, make(key, Type::of_kind(ValueKind::String)));
    }
    d_.error(e->loc, "bad-index", fmt::format("'{}' cannot be indexed; use reshape() to change shapes", print_short(e->args[0])));
    return nullptr;
  }

  ExprP typed_index(const ExprP& e, const ExprP& base, const ExprP& idx) {
    TypeResult r = type_index(base->type, *idx, e->loc, ctx_);
    if (auto* err = std::get_if<TypeError>(&r)) {
      d_.error(err->loc, err->kind, err->message);
      return nullptr;
    }
    return make(e, {base, idx}, std::get<Type>(std::move(r)), e->fn);
  }

  ExprP binary(const ExprP& e) {
    ExprP l = eval(e->args[0]);
    if (!l) return nullptr;
    ExprP r = eval(e->args[1]);
    if (!r) return nullptr;
    if (e->op == BinOp::Mul) {
      if (resolve_mul(l->type, r->type) == Op::Linear) {
        if (!as_tensor(l, "the input of a linear transform") || !check_selected(r)) return nullptr;
        return op_node(e, {l, r}, Op::Linear);
      }
      if (l->type.kind == ValueKind::Weight && l->type.shape.size() >= 2) {
        d_.error(e->loc, "operand-order", fmt::format("write the input first: x * {} (row vector times matrix)", l->type.weight));
        return nullptr;
      }
    }
    if (!as_tensor(l, fmt::format("the left operand of '{}'", to_string(e->op)))) return nullptr;
    if (!as_tensor(r, fmt::format("the right operand of '{}'", to_string(e->op)))) return nullptr;
    return op_node(e, {l, r}, binary_op(e->op));
  }

  ExprP call(const ExprP& e) {
    const std::string& f = e->name;
    if (e->fn == Op::None) {
      bool user = std::any_of(m_.functions.begin(), m_.functions.end(), [&](const FuncDef& d) { return d.name == f; });
      if (user)
        d_.error(e->loc, "unknown-function", fmt::format("function '{}' has no value; call it as a statement", f));
      else
        d_.error(e->loc, "unknown-function", fmt::format("unknown function '{}'{}", f, suggest(f, call_op_names())));
      return nullptr;
    }
    const OpInfo& op = op_info(e->fn);
    size_t lo = op.min_args(), hi = op.max_args();
    if (e->args.size() < lo || e->args.size() > hi) {
      std::string want = lo == hi ? std::to_string(lo) : hi == SIZE_MAX ? fmt::format("at least {}", lo) : fmt::format("{} or {}", lo, hi);
      d_.error(e->loc, "wrong-arguments",
               fmt::format("'{}' takes {} argument{}, got {}", f, want, lo == 1 && hi == 1 ? "" : "s", e->args.size()));
      return nullptr;
    }
    std::vector<ExprP> args;
    for (size_t i = 0; i < e->args.size(); ++i) {
      const ExprP& a = e->args[i];
      const Param& p = op.param(i);
      ExprP typed;
      switch (p.kind) {
        case ParamKind::Tensor: typed = tensor(a, fmt::format("{} of '{}'", p.role, f)); break;
        case ParamKind::Weight:
          typed = eval(a);
          if (!typed) return nullptr;
          if (typed->type.kind != ValueKind::Weight) {
            d_.error(a->loc, "type-mismatch", fmt::format("{} of '{}' must be a weight", p.role, f));
            return nullptr;
          }
          if (!check_selected(typed)) return nullptr;
          break;
        case ParamKind::Constant: {
          Diagnostics scratch;
          if (!eval_constant(a, m_.decl, scratch)) {
            d_.error(a->loc, p.error_kind, p.error);
            return nullptr;
          }
          typed = eval(a);  // numbers, hyper-parameters and arithmetic of those: typed as constants
          break;
        }
      }
      if (!typed) return nullptr;
      args.push_back(typed);
    }
    return op_node(e, std::move(args), e->fn);
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
  static std::vector<std::string> field_names(const FieldTable& f) {
    std::vector<std::string> v;
    for (const auto& [k, _] : f) v.push_back(k);
    return v;
  }

  const Module& m_;
  Diagnostics& d_;
  Module out_;
  TypeContext ctx_;
  std::vector<Loop> loops_;
  std::vector<std::map<std::string, Type>> scopes_;
  std::vector<std::set<std::string>> aggregating_;  // per loop: node fields scattered into
  std::set<std::string> used_;
  std::set<std::string> read_;
  std::set<std::string> poisoned_;  // locals (name) and fields ("\"name") whose definition failed
  std::set<std::string> weight_grads_written_;
};

}  // namespace

std::optional<Module> typecheck(const Module& m, Diagnostics& diags) { return Verifier(m, diags).run(); }

bool verify(const Module& m, Diagnostics& diags) {
  Diagnostics scratch;
  bool ok = Verifier(m, scratch).run().has_value();
  for (const Diagnostic& d : scratch.all())
    if (d.severity == Severity::Error) diags.error(d.loc, d.kind, d.message);
  return ok;
}

}  // namespace hectorgen::inter
