// hoist-node-transforms: a linear transform inside an edge loop whose input depends on one endpoint of the
// edge only (the source or the destination node) and whose weight is shared or selected by that node's type
// gives the same row for every edge of the node. It is computed once per node instead, in a node loop
// before the loop that uses it, and the edge loop reads the node field through the endpoint (see passes.h):
//
//   for e in g.edges():                              for n in g.src_nodes():
//       e.dst["h"] += e.norm * (e.src.feature * W)       n["feature_W"] = n.feature * W
//                                               ==>  for e in g.edges():
//                                                        e.dst["h"] += e.norm * e.src["feature_W"]
//
// An N-row GEMM then replaces an E-row one. The pass runs before autodiff, so the training forward and the
// backward inherit it: the gradient flows through the node field (a node-centric sum of the edges'
// contributions) into N-row input- and weight-gradient GEMMs.
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

// Every name a module uses (declarations, hyper-parameters, fields, locals, loop variables), so new fields and
// loop variables collide with none.
void collect_names(const ExprP& e, std::set<std::string>& out) {
  if (e->kind == ExprKind::Name || e->kind == ExprKind::String || e->kind == ExprKind::Attr) out.insert(e->name);
  for (const ExprP& a : e->args) collect_names(a, out);
}
void collect_names(const std::vector<StmtP>& body, std::set<std::string>& out) {
  for (const StmtP& s : body) {
    if (s->kind == StmtKind::For) {
      out.insert(s->var);
      collect_names(s->body, out);
    }
    if (s->target) collect_names(s->target, out);
    if (s->value) collect_names(s->value, out);
  }
}

enum class End { Src, Dst };

class Hoister {
 public:
  explicit Hoister(const Module& m) : m_(m) {
    for (const HyperParam& h : m.decl.hyper) names_.insert(h.name);
    for (const auto* list : {&m.decl.inputs, &m.decl.weights, &m.decl.outputs})
      for (const TensorDecl& t : *list) names_.insert(t.name);
    for (const auto& [n, f] : m.node_fields) names_.insert(n);
    for (const auto& [n, f] : m.edge_fields) names_.insert(n);
    collect_names(m.body, names_);
    names_.insert(m.decl.name);
  }

  // The module with the transforms hoisted, untyped where it changed; `changed` says whether anything did.
  Module run(bool& changed) {
    Module out = m_;
    out.body.clear();
    for (const StmtP& top : m_.body) {
      if (top->kind != StmtKind::For) {
        out.body.push_back(top);
        continue;
      }
      hoisted_.clear();
      written_.clear();
      written_fields(top->body, written_);
      StmtP rewritten = loop(top, {});
      for (End end : {End::Src, End::Dst}) {
        std::vector<StmtP> defs;
        for (const Hoisted& h : hoisted_)
          if (h.end == end) defs.push_back(h.def);
        if (defs.empty()) continue;
        std::string var = free_loop_var(m_, "n");
        for (StmtP& d : defs) d = bind_placeholder(d, "$node", var);
        out.body.push_back(Stmt::for_loop(var, end == End::Src ? LoopKind::SrcNodes : LoopKind::DstNodes, "g", defs, top->loc));
      }
      changed = changed || !hoisted_.empty();
      out.body.push_back(rewritten);
    }
    return out;
  }

 private:
  // The loop nest being rewritten: the enclosing node loop's variable (if any) and the edge loop's.
  struct Scope {
    std::string node_var;  // the loop node of an enclosing node loop
    std::string edge_var;  // the edge loop's variable, when inside one
    LoopKind edge_loop = LoopKind::Edges;
  };

  struct Hoisted {
    End end;
    std::string key;    // the transform, printed with the node as `$node`
    std::string field;  // the node field that holds it
    StmtP def;          // `$node["field"] = x * W`, untyped, the node variable still to be bound
  };

  StmtP loop(const StmtP& L, Scope scope) {
    if (is_edge_loop(L->loop)) {
      scope.edge_var = L->var;
      scope.edge_loop = L->loop;
    } else {
      scope.node_var = L->var;
    }
    std::vector<StmtP> body;
    bool changed = false;
    for (const StmtP& s : L->body) {
      StmtP r = s;
      if (s->kind == StmtKind::For) {
        r = loop(s, scope);
      } else if (s->kind == StmtKind::Assign && !scope.edge_var.empty()) {
        ExprP value = rewrite(s->value, scope);
        if (value != s->value) r = Stmt::assign(untyped_copy(s->target), s->op, value, s->loc);
      }
      changed = changed || r != s;
      body.push_back(r);
    }
    if (!changed) return L;
    return Stmt::for_loop(L->var, L->loop, L->parent, body, L->loc);
  }

  // `e` with every hoistable linear transform replaced by a read of its node field (the same node when
  // nothing is hoisted; else an untyped copy).
  ExprP rewrite(const ExprP& e, const Scope& scope) {
    if (e->kind == ExprKind::Binary || e->kind == ExprKind::Call || e->kind == ExprKind::Neg) {
      if (e->fn == Op::Linear)
        if (ExprP r = hoist(e, scope)) return r;
    }
    std::vector<ExprP> args;
    bool changed = false;
    for (const ExprP& a : e->args) {
      args.push_back(rewrite(a, scope));
      changed = changed || args.back() != a;
    }
    if (!changed) return e;
    auto c = std::make_shared<Expr>(*e);
    c->type = Type{};
    for (size_t i = 0; i < args.size(); ++i)
      c->args[i] = args[i] == e->args[i] ? untyped_copy(args[i]) : args[i];
    return c;
  }

  // The endpoint a node reference denotes in this scope: e.src / e.dst of the edge variable, or the enclosing
  // node loop's node (the destination of its incoming edges, the source of its outgoing ones).
  std::optional<End> endpoint(const ExprP& base, const Scope& scope) const {
    if (base->kind == ExprKind::Attr && (base->name == "src" || base->name == "dst") &&
        base->args[0]->kind == ExprKind::Name && base->args[0]->name == scope.edge_var)
      return base->name == "src" ? End::Src : End::Dst;
    if (base->kind == ExprKind::Name && !scope.node_var.empty() && base->name == scope.node_var &&
        scope.edge_loop != LoopKind::Edges)
      return scope.edge_loop == LoopKind::IncomingEdges ? End::Dst : End::Src;
    return std::nullopt;
  }

  // True when `x` reads nothing but one endpoint's inputs and fields (fields the loop nest does not write),
  // constants, hyper-parameters and shared weights; sets `end` to that endpoint and `name` to what to call it.
  bool node_only(const ExprP& x, const Scope& scope, std::optional<End>& end, std::string& name) const {
    auto same = [&](End e) {
      if (end && *end != e) return false;
      end = e;
      return true;
    };
    switch (x->kind) {
      case ExprKind::Number: return true;
      case ExprKind::String: return false;
      case ExprKind::Name: {
        if (x->type.value) return true;  // a hyper-parameter
        const TensorDecl* w = m_.decl.find_weight(x->name);
        return w && w->per == Per::None;
      }
      case ExprKind::Attr: {  // an input read through the endpoint
        const TensorDecl* in = m_.decl.find_input(x->name);
        std::optional<End> e = endpoint(x->args[0], scope);
        if (!in || in->per != Per::Node || !e || !same(*e)) return false;
        if (name.empty()) name = x->name;
        return true;
      }
      case ExprKind::Index: {
        if (!is_field(x)) return false;  // weight slices: selected by the edge's type or another node's
        std::optional<End> e = endpoint(x->args[0], scope);
        if (!e || !same(*e) || written_.count(x->args[1]->name)) return false;
        if (name.empty()) name = x->args[1]->name;
        return true;
      }
      case ExprKind::Neg:
      case ExprKind::Binary:
      case ExprKind::Call:
        if (x->fn == Op::Linear || x->fn == Op::LinearT) return false;  // one transform at a time (inner first)
        for (const ExprP& a : x->args)
          if (!node_only(a, scope, end, name)) return false;
        return true;
    }
    return false;
  }

  // The weight of a hoistable transform: shared, or selected by the endpoint's node type. Sets its name.
  bool node_weight(const ExprP& w, const Scope& scope, End end, std::string& name) const {
    if (w->kind == ExprKind::Name) {
      const TensorDecl* d = m_.decl.find_weight(w->name);
      name = w->name;
      return d && d->per == Per::None;
    }
    if (w->kind != ExprKind::Index || w->args[0]->kind != ExprKind::Name) return false;
    const TensorDecl* d = m_.decl.find_weight(w->args[0]->name);
    const ExprP& sel = w->args[1];
    name = w->args[0]->name;
    if (!d || d->per != Per::Ntype || sel->kind != ExprKind::Attr || sel->name != "ntype") return false;
    std::optional<End> e = endpoint(sel->args[0], scope);
    return e && *e == end;
  }

  ExprP hoist(const ExprP& lin, const Scope& scope) {
    const ExprP& x = lin->args[0];
    const ExprP& w = lin->args[1];
    std::optional<End> end;
    std::string x_name, w_name;
    if (!node_only(x, scope, end, x_name) || !end || !node_weight(w, scope, *end, w_name)) return nullptr;
    // The transform with the endpoint as a placeholder node `$node` (bound to the node loop's variable later).
    auto to_node = [&](const ExprP& e) -> ExprP {
      if (e->kind == ExprKind::Attr || e->kind == ExprKind::Name)
        if (endpoint(e, scope)) return Expr::name_ref("$node", e->loc);
      return nullptr;
    };
    ExprP node_lin = untyped_copy(lin, to_node);
    std::string key = fmt::format("{}:{}", *end == End::Src ? "src" : "dst", print_expr(node_lin));
    const Hoisted* h = nullptr;
    for (const Hoisted& o : hoisted_)
      if (o.key == key) h = &o;
    if (!h) {
      std::string field = fresh(derived_name(x_name, w_name));  // feature$W: no user name has the sigil
      ExprP target = Expr::index(Expr::name_ref("$node", lin->loc), Expr::string_lit(field, lin->loc), lin->loc);
      hoisted_.push_back({*end, key, field, Stmt::assign(target, AssignOp::Set, node_lin, lin->loc)});
      h = &hoisted_.back();
    }
    // The edge loop reads the field through the endpoint, as the transform's input did.
    ExprP base = *end == End::Src ? Expr::attr(Expr::name_ref(scope.edge_var, lin->loc), "src", lin->loc)
                                  : Expr::attr(Expr::name_ref(scope.edge_var, lin->loc), "dst", lin->loc);
    return Expr::index(base, Expr::string_lit(h->field, lin->loc), lin->loc);
  }

  // A name no declaration, field, local or loop variable of the module uses yet.
  std::string fresh(const std::string& base) {
    std::string n = fresh_name(base, [&](const std::string& x) { return names_.count(x) > 0; });
    names_.insert(n);
    return n;
  }

  const Module& m_;
  std::set<std::string> names_;
  std::set<std::string> written_;  // fields the current top-level loop nest writes
  std::vector<Hoisted> hoisted_;   // of the current top-level loop nest
};

}  // namespace

Module hoist_node_transforms(const Module& m) {
  bool changed = false;
  Module out = Hoister(m).run(changed);
  if (!changed) return m;
  // The rewritten statements are untyped copies: type inference types them (and rebuilds the field tables).
  return retype(std::move(out), "hoist-node-transforms");
}

}  // namespace hectorgen::passes
