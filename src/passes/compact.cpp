// compact-materialization (thesis: "Compact Tensor Materialization and Data Layout"): an edge value that
// depends only on the edge's source node and its type is the same for every edge of a (source, edge type)
// pair. It is computed once per unique pair instead, in a pair loop before the loop nest that uses it, and
// the edges read it through their pair (see passes.h):
//
//   for e in g.edges():                                 for p in g.src_etype_pairs():
//       hs = e.src.feature * W[e.etype]                     p["hs"] = p.src.feature * W[p.etype]
//       e["msg"] = hs                                       p["msg"] = p["hs"]
//       e["att"] = dot(hs, w_s[e.etype]) + ...   ==>        p["dot$hs"] = dot(p["hs"], w_s[p.etype])
//                                                       for e in g.edges():
//                                                           e["att"] = e.pair["dot$hs"] + ...
//
// What moves: locals and edge fields set once from such a value (an edge field only when it is set once in the
// whole program and is not an output; its reads everywhere then go through the pair), and, inside the values
// that stay per edge, the largest such subexpressions that do work (a linear transform or a dot). A GEMM over
// the U unique pairs then replaces one over the E edges, and E-row temporaries become U-row ones. The pass runs
// before autodiff: the backward inherits it (the edges' gradients are summed per pair, then U-row input- and
// weight-gradient GEMMs).
#include <fmt/format.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "ir/inter/names.h"
#include "ir/inter/ops.h"
#include "ir/inter/printer.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace hectorgen::passes {

using namespace inter;

namespace {

// Per field: how many statements write it, and whether one of them is not a plain set.
struct Writes {
  int count = 0;
  bool only_sets = true;
};
void count_field_writes(const std::vector<StmtP>& body, std::map<std::string, Writes>& out) {
  for (const StmtP& s : body) {
    if (s->kind == StmtKind::For) {
      count_field_writes(s->body, out);
    } else if (s->kind == StmtKind::Assign && is_field(s->target)) {
      Writes& w = out[s->target->args[1]->name];
      ++w.count;
      w.only_sets = w.only_sets && s->op == AssignOp::Set;
    }
  }
}
// How many statements of a loop body assign each local.
void count_local_writes(const std::vector<StmtP>& body, std::map<std::string, int>& out) {
  for (const StmtP& s : body) {
    if (s->kind == StmtKind::For) count_local_writes(s->body, out);
    else if (s->kind == StmtKind::Assign && s->target->kind == ExprKind::Name) ++out[s->target->name];
  }
}

// True when `e` does work worth storing per pair: a linear transform or a dot product.
bool does_work(const ExprP& e) {
  if ((e->kind == ExprKind::Call || e->kind == ExprKind::Binary) &&
      (e->fn == Op::Linear || e->fn == Op::LinearT || e->fn == Op::Dot))
    return true;
  for (const ExprP& a : e->args)
    if (does_work(a)) return true;
  return false;
}

class Compactor {
 public:
  explicit Compactor(const Module& m) : m_(m) {
    for (const HyperParam& h : m.decl.hyper) names_.insert(h.name);
    for (const auto* list : {&m.decl.inputs, &m.decl.weights, &m.decl.outputs})
      for (const TensorDecl& t : *list) names_.insert(t.name);
    for (const auto* table : {&m.node_fields, &m.edge_fields, &m.pair_fields})
      for (const auto& [n, f] : *table) names_.insert(n);
    names_.insert(m.decl.name);
    count_field_writes(m.body, field_writes_);
  }

  Module run(bool& changed) {
    Module out = m_;
    out.body.clear();
    for (const StmtP& top : m_.body) {
      if (top->kind != StmtKind::For) {
        out.body.push_back(top);
        continue;
      }
      defs_.clear();
      keys_.clear();
      written_.clear();
      written_fields(top->body, written_);
      StmtP rewritten = loop(top);
      if (!defs_.empty()) {
        std::string var = free_loop_var(m_, "p");
        for (StmtP& d : defs_) d = bind_placeholder(d, "$pair", var);
        out.body.push_back(Stmt::for_loop(var, LoopKind::SrcPairs, "g", defs_, top->loc));
        changed = true;
      }
      out.body.push_back(rewritten);
    }
    if (!moved_fields_.empty()) {
      // Reads of a moved edge field anywhere in the program go through the edge's pair.
      for (StmtP& s : out.body) s = reroute(s);
    }
    return out;
  }

 private:
  // Loop state of the edge loop being rewritten.
  struct Scope {
    std::string edge_var;  // empty outside edge loops
    std::map<std::string, int> local_writes;
    std::map<std::string, std::string> moved_locals;  // local -> pair field
    std::map<std::string, ExprP> inline_locals;       // cheap movable locals -> their value ($pair form)
  };

  StmtP loop(const StmtP& L) {
    if (!is_edge_loop(L->loop)) {
      std::vector<StmtP> body;
      bool changed = false;
      for (const StmtP& s : L->body) {
        StmtP r = s->kind == StmtKind::For ? loop(s) : s;
        changed = changed || r != s;
        body.push_back(r);
      }
      return changed ? Stmt::for_loop(L->var, L->loop, L->parent, body, L->loc) : L;
    }
    // In a node's outgoing edges, e.src is the loop node itself: its values are per node, nothing to compact.
    if (L->loop == LoopKind::OutgoingEdges) return L;
    Scope scope;
    scope.edge_var = L->var;
    count_local_writes(L->body, scope.local_writes);
    std::vector<StmtP> body;
    bool changed = false;
    for (const StmtP& s : L->body) {
      StmtP r = s->kind == StmtKind::Assign ? assign(s, scope) : s;
      changed = changed || r != s;
      if (r) body.push_back(r);
    }
    if (!changed) return L;
    return Stmt::for_loop(L->var, L->loop, L->parent, body, L->loc);
  }

  // The statement, rewritten; null when it moved to the pair loop.
  StmtP assign(const StmtP& s, Scope& scope) {
    const Expr& t = *s->target;
    bool movable_value = s->op == AssignOp::Set && movable(s->value, scope);
    bool pair_value = movable_value && per_pair(s->value, scope);
    if (t.kind == ExprKind::Name && !weight_grad_output(m_.decl, t.name) && scope.local_writes[t.name] == 1 && movable_value) {
      if (pair_value && does_work(s->value)) {
        std::string f = define(t.name, s->value, scope, s->loc);
        scope.moved_locals[t.name] = f;
        return nullptr;
      }
      scope.inline_locals[t.name] = to_pair(s->value, scope);
    }
    if (is_field(s->target) && s->target->args[0]->kind == ExprKind::Name && s->target->args[0]->name == scope.edge_var &&
        pair_value) {
      const std::string& f = t.args[1]->name;
      const Writes& w = field_writes_.at(f);
      if (w.count == 1 && w.only_sets && !m_.decl.find_output(f)) {
        defs_.push_back(Stmt::assign(pair_field(f, s->loc), AssignOp::Set, to_pair(s->value, scope), s->loc));
        moved_fields_.insert(f);
        return nullptr;
      }
    }
    ExprP value = to_edge(s->value, scope);
    ExprP target = to_edge_target(s->target, scope);
    if (value == s->value && target == s->target) return s;
    // The target is typed as what it stored: untyped, typecheck types it as what it stores now.
    return Stmt::assign(untyped_copy(target), s->op, untyped_copy(value), s->loc);
  }

  // A new pair field holding `value` (printed form as the key: a subexpression met twice is stored once).
  std::string define(const std::string& base, const ExprP& value, Scope& scope, SourceLoc loc) {
    ExprP v = to_pair(value, scope);
    std::string key = print_expr(v);
    if (auto it = keys_.find(key); it != keys_.end()) return it->second;
    std::string f = fresh(base);
    defs_.push_back(Stmt::assign(pair_field(f, loc), AssignOp::Set, v, loc));
    keys_[key] = f;
    return f;
  }

  // ---- what may move --------------------------------------------------------------------------------
  // The edge variable's source node: e.src (in a node's incoming edges too; not in its outgoing edges, where
  // the loop skips compaction).
  bool is_src(const ExprP& e, const Scope& scope) const {
    return e->kind == ExprKind::Attr && e->name == "src" && e->args[0]->kind == ExprKind::Name &&
           e->args[0]->name == scope.edge_var;
  }
  bool is_etype(const ExprP& e, const Scope& scope) const {
    return e->kind == ExprKind::Attr && e->name == "etype" && e->args[0]->kind == ExprKind::Name &&
           e->args[0]->name == scope.edge_var;
  }
  bool is_edge_pair(const ExprP& e, const Scope& scope) const {
    return e->kind == ExprKind::Attr && e->name == "pair" && e->args[0]->kind == ExprKind::Name &&
           e->args[0]->name == scope.edge_var;
  }

  // True when `x` reads only the edge's source (its inputs, node fields this loop nest does not write), its
  // type (weight slices), its pair, shared weights, constants, and locals that moved or can be inlined.
  bool movable(const ExprP& x, const Scope& scope) const {
    switch (x->kind) {
      case ExprKind::Number: return true;
      case ExprKind::String: return false;
      case ExprKind::Name: {
        if (x->type.value) return true;  // a hyper-parameter
        if (scope.moved_locals.count(x->name) || scope.inline_locals.count(x->name)) return true;
        if (scope.local_writes.count(x->name)) return false;
        const TensorDecl* w = m_.decl.find_weight(x->name);
        return w && w->per == Per::None;
      }
      case ExprKind::Attr: {
        const TensorDecl* in = m_.decl.find_input(x->name);
        return in && in->per == Per::Node && is_src(x->args[0], scope);
      }
      case ExprKind::Index: {
        const ExprP& base = x->args[0];
        if (is_field(x)) {
          const std::string& f = x->args[1]->name;
          if (is_src(base, scope)) return !written_.count(f);
          if (is_edge_pair(base, scope)) return !written_.count(f);
          if (base->kind == ExprKind::Name && base->name == scope.edge_var) return moved_fields_.count(f) > 0;
          return false;
        }
        // A weight slice: selected by the edge's type or its source's node type.
        const ExprP& sel = x->args[1];
        if (is_etype(sel, scope)) return true;
        return sel->kind == ExprKind::Attr && sel->name == "ntype" && is_src(sel->args[0], scope);
      }
      case ExprKind::Neg:
      case ExprKind::Binary:
      case ExprKind::Call:
        for (const ExprP& a : x->args)
          if (!movable(a, scope)) return false;
        return true;
    }
    return false;
  }

  // True when a movable tensor value varies with the edge type and the source: a pair holds it. (Values of the
  // source alone are node values, of the type alone relation values: other passes place those.)
  bool per_pair(const ExprP& x, const Scope& scope) const {
    bool src = false, etype = false;
    std::function<void(const ExprP&)> walk = [&](const ExprP& e) {
      if (is_src(e, scope)) src = true;
      if (is_etype(e, scope)) etype = true;
      if (is_edge_pair(e, scope)) src = etype = true;
      if (e->kind == ExprKind::Name && scope.moved_locals.count(e->name)) src = etype = true;
      if (e->kind == ExprKind::Name && scope.inline_locals.count(e->name)) {
        if (is_pair_expr(scope.inline_locals.at(e->name), true)) src = true;
        if (is_pair_expr(scope.inline_locals.at(e->name), false)) etype = true;
      }
      if (is_field(e) && e->args[0]->kind == ExprKind::Name && e->args[0]->name == scope.edge_var) src = etype = true;
      for (const ExprP& a : e->args) walk(a);
    };
    walk(x);
    return src && etype && value_type(x->type).kind == ValueKind::Tensor;
  }
  // Whether a $pair-form expression reads the pair's source (src) or its type (!src).
  static bool is_pair_expr(const ExprP& e, bool src) {
    if (e->kind == ExprKind::Attr && e->args[0]->kind == ExprKind::Name && e->args[0]->name == "$pair" &&
        e->name == (src ? "src" : "etype"))
      return true;
    if (is_field(e) && e->args[0]->kind == ExprKind::Name && e->args[0]->name == "$pair") return true;
    for (const ExprP& a : e->args)
      if (is_pair_expr(a, src)) return true;
    return false;
  }

  // ---- rewriting ----------------------------------------------------------------------------------
  // A movable value as the pair loop computes it: e.src -> $pair.src, e.etype -> $pair.etype, moved locals and
  // fields -> $pair["f"], inlinable locals -> their value.
  ExprP to_pair(const ExprP& x, const Scope& scope) const {
    return untyped_copy(x, [&](const ExprP& e) -> ExprP {
      ExprP pair = Expr::name_ref("$pair", e->loc);
      if (is_src(e, scope)) return Expr::attr(pair, "src", e->loc);
      if (is_etype(e, scope)) return Expr::attr(pair, "etype", e->loc);
      if (is_edge_pair(e, scope)) return pair;
      if (e->kind == ExprKind::Name) {
        if (auto it = scope.moved_locals.find(e->name); it != scope.moved_locals.end()) return pair_field(it->second, e->loc);
        if (auto it = scope.inline_locals.find(e->name); it != scope.inline_locals.end()) return untyped_copy(it->second);
      }
      if (is_field(e) && e->args[0]->kind == ExprKind::Name && e->args[0]->name == scope.edge_var)
        return pair_field(e->args[1]->name, e->loc);  // a moved edge field
      return nullptr;
    });
  }

  static ExprP pair_field(const std::string& f, SourceLoc loc) {
    return Expr::index(Expr::name_ref("$pair", loc), Expr::string_lit(f, loc), loc);
  }
  ExprP edge_pair_field(const std::string& edge_var, const std::string& f, SourceLoc loc) const {
    return Expr::index(Expr::attr(Expr::name_ref(edge_var, loc), "pair", loc), Expr::string_lit(f, loc), loc);
  }

  // A value that stays per edge: moved locals read through the pair, and its largest movable subexpressions
  // that do work stored per pair. The same node when nothing changes.
  ExprP to_edge(const ExprP& x, Scope& scope) {
    if (x->kind == ExprKind::Name) {
      if (auto it = scope.moved_locals.find(x->name); it != scope.moved_locals.end())
        return edge_pair_field(scope.edge_var, it->second, x->loc);
      return x;
    }
    if ((x->kind == ExprKind::Call || x->kind == ExprKind::Binary || x->kind == ExprKind::Neg) && does_work(x) &&
        movable(x, scope) && per_pair(x, scope))
      return edge_pair_field(scope.edge_var, define(subexpression_name(x), x, scope, x->loc), x->loc);
    if (is_field(x) && x->args[0]->kind == ExprKind::Name && x->args[0]->name == scope.edge_var &&
        moved_fields_.count(x->args[1]->name))
      return edge_pair_field(scope.edge_var, x->args[1]->name, x->loc);
    std::vector<ExprP> args;
    bool changed = false;
    for (const ExprP& a : x->args) {
      args.push_back(to_edge(a, scope));
      changed = changed || args.back() != a;
    }
    if (!changed) return x;
    auto c = std::make_shared<Expr>(*x);
    c->type = Type{};
    for (size_t i = 0; i < args.size(); ++i) c->args[i] = args[i] == x->args[i] ? untyped_copy(args[i]) : args[i];
    return c;
  }
  ExprP to_edge_target(const ExprP& t, Scope& scope) {
    if (t->kind != ExprKind::Index) return t;
    ExprP index = to_edge(t->args[1], scope);
    if (index == t->args[1]) return t;
    return Expr::index(untyped_copy(t->args[0]), index, t->loc);
  }

  // The name of a stored subexpression: after the first local, field or input it reads (dot$hs, k$W_att).
  std::string subexpression_name(const ExprP& x) const {
    std::string first;
    std::function<void(const ExprP&)> walk = [&](const ExprP& e) {
      if (!first.empty()) return;
      if (is_field(e)) first = e->args[1]->name;
      else if (e->kind == ExprKind::Attr && m_.decl.find_input(e->name)) first = e->name;
      else if (e->kind == ExprKind::Name && !e->type.value && !m_.decl.find_weight(e->name)) first = e->name;
      for (const ExprP& a : e->args) walk(a);
    };
    walk(x);
    std::string op = x->fn == Op::Dot ? "dot" : x->fn == Op::Linear ? "lin" : "pair";
    return derived_name(op, first.empty() ? "v" : first);
  }

  // Reads of moved edge fields, X["f"] with X an edge, become X.pair["f"].
  StmtP reroute(const StmtP& s) {
    if (s->kind == StmtKind::For) {
      std::vector<StmtP> body;
      bool changed = false;
      for (const StmtP& b : s->body) {
        body.push_back(reroute(b));
        changed = changed || body.back() != b;
      }
      return changed ? Stmt::for_loop(s->var, s->loop, s->parent, body, s->loc) : s;
    }
    if (s->kind != StmtKind::Assign) return s;
    bool changed = false;
    std::function<ExprP(const ExprP&)> fix = [&](const ExprP& e) -> ExprP {
      if (is_field(e) && moved_fields_.count(e->args[1]->name) && e->args[0]->type.kind == ValueKind::Edge) {
        changed = true;
        return Expr::index(Expr::attr(untyped_copy(e->args[0]), "pair", e->loc), Expr::string_lit(e->args[1]->name, e->loc),
                           e->loc);
      }
      return nullptr;
    };
    ExprP value = untyped_copy(s->value, fix);
    ExprP target = s->target->kind == ExprKind::Index
                       ? Expr::index(untyped_copy(s->target->args[0], fix), untyped_copy(s->target->args[1], fix), s->target->loc)
                       : untyped_copy(s->target, fix);
    if (!changed) return s;
    return Stmt::assign(target, s->op, value, s->loc);
  }

  std::string fresh(const std::string& base) {
    std::string n = fresh_name(base, [&](const std::string& x) { return names_.count(x) > 0; });
    names_.insert(n);
    return n;
  }

  const Module& m_;
  std::set<std::string> names_;  // declarations, hyper-parameters and fields: what a new pair field must not be named
  std::map<std::string, Writes> field_writes_;
  std::set<std::string> moved_fields_;  // edge fields that became pair fields
  // Of the current top-level loop nest:
  std::set<std::string> written_;
  std::vector<StmtP> defs_;                   // the pair loop's statements, `$pair` still to be bound
  std::map<std::string, std::string> keys_;   // printed value -> pair field
};

}  // namespace

Module compact_materialization(const Module& m, Materialization mode) {
  if (mode == Materialization::Vanilla) return m;
  bool changed = false;
  Module out = Compactor(m).run(changed);
  if (!changed) return m;
  return retype(std::move(out), "compact-materialization");
}

}  // namespace hectorgen::passes
