// Loop canonicalisation and fusion on the inter-operator IR (thesis: "graph-semantic-aware loop
// transformation"). Rules, applied until nothing changes:
//   1. adjacent edge loops fuse when the second reads no node data the first scatters into;
//   2. an edge loop without GEMM work (a linear transform, its transpose, a weight-gradient outer product:
//      lowering runs those as GEMM-template instances over the edges, not inside a node's edge loop) that
//      sits next to a node loop is rewritten with the graph rule
//      `for e in g.edges()`  ==  `for n in g.dst_nodes(): for e in n.incoming_edges()`, and
//   3. adjacent node loops fuse when neither reads, through another node, a node field the other writes,
//      nor reads an edge field the other writes over a different edge set;
//   4. adjacent inner edge loops of one node loop fuse when the second does not read a node field the
//      first aggregates (it would see a partial sum), and GEMM work of the second (a linear transform or a
//      weight-gradient outer product) neither reads nor writes what the first touches: lowering cannot
//      flush a stage in the middle of an inner edge loop, so such a fused loop would not lower (the
//      dependency the user split the loops for).
#include <fmt/format.h>

#include <functional>
#include <set>

#include "ir/inter/mutator.h"
#include "ir/inter/ops.h"
#include "passes/passes.h"

namespace hectorgen::passes {

using namespace inter;

namespace {

bool is_graph_node_loop(const Stmt& s) {
  return s.kind == StmtKind::For && (s.loop == LoopKind::DstNodes || s.loop == LoopKind::SrcNodes);
}
bool is_graph_edge_loop(const Stmt& s) { return s.kind == StmtKind::For && s.loop == LoopKind::Edges; }

// Renames a loop variable (the loops' types stay what they are).
class Renamer : public Mutator {
 public:
  Renamer(TypeContext ctx, std::string from, std::string to) : Mutator(ctx), from_(std::move(from)), to_(std::move(to)) {}

 protected:
  ExprP visit_name(const ExprP& e) override {
    if (e->name != from_) return Mutator::visit_name(e);
    return Mutator::visit_name(typed::name(to_, e->type, e->loc));
  }
  StmtP visit_for(const StmtP& s) override {
    if (s->var != from_ && s->parent != from_) return Mutator::visit_for(s);
    return Mutator::visit_for(Stmt::for_loop(s->var == from_ ? to_ : s->var, s->loop, s->parent == from_ ? to_ : s->parent,
                                             s->body, s->loc));
  }

 private:
  std::string from_, to_;
};

StmtP rename_stmt(const StmtP& s, const std::string& from, const std::string& to, const Module& m) {
  return Renamer(TypeContext::of(m), from, to).mutate(s);
}

// What a top-level loop reads and writes, split by how it reaches the data.
struct Access {
  std::set<std::string> node_writes_own, node_writes_other;  // loop node's fields / other nodes' (scatter)
  bool other_writes_only_via_dst = true;  // every scatter goes to e.dst (the node of its incoming loop)
  std::set<std::string> node_reads_own, node_reads_other;
  std::set<std::string> edge_writes, edge_reads;
  std::set<LoopKind> edge_sets;  // how the edges are reached: Edges, IncomingEdges, OutgoingEdges
  bool has_gemm = false;  // a linear transform, its transpose or a weight-gradient outer product
  std::set<std::string> locals;
  // Statements with GEMM work (linear, linear_t, outer): the fields and locals they read and write.
  std::set<std::string> gemm_reads, gemm_writes;
};

bool has_gemm_work(const Expr& e) {
  if ((e.kind == ExprKind::Call || e.kind == ExprKind::Binary) &&
      (e.fn == Op::Linear || e.fn == Op::LinearT || e.fn == Op::Outer))
    return true;
  for (const ExprP& x : e.args)
    if (has_gemm_work(*x)) return true;
  return false;
}

// The field names and local names an expression reads.
void names_read(const Expr& e, std::set<std::string>& out) {
  if (e.kind == ExprKind::Index && e.args[1]->kind == ExprKind::String) {
    out.insert(e.args[1]->name);
    return;
  }
  if (e.kind == ExprKind::Name) out.insert(e.name);
  for (const ExprP& x : e.args) names_read(*x, out);
}

class Analyzer {
 public:

  Access run(const Stmt& loop) {
    Access a;
    loop_ = &loop;
    node_var_ = is_graph_node_loop(loop) ? loop.var : "";
    if (is_graph_edge_loop(loop)) a.edge_sets.insert(LoopKind::Edges);
    walk(loop.body, a, nullptr);
    return a;
  }

 private:
  void walk(const std::vector<StmtP>& body, Access& a, const Stmt* inner) {
    for (const StmtP& s : body) {
      if (s->kind == StmtKind::For) {
        a.edge_sets.insert(s->loop);
        walk(s->body, a, s.get());
        continue;
      }
      if (s->kind != StmtKind::Assign) continue;
      expr(s->value, a, inner);
      const Expr& t = *s->target;
      if (has_gemm_work(*s->value)) {
        names_read(*s->value, a.gemm_reads);
        if (s->op != AssignOp::Set) names_read(t, a.gemm_reads);
        a.gemm_writes.insert(t.kind == ExprKind::Index && t.args[1]->kind == ExprKind::String ? t.args[1]->name : t.name);
      }
      if (t.kind == ExprKind::Name) {
        a.locals.insert(t.name);
        continue;
      }
      if (t.kind == ExprKind::Index && t.args[1]->kind == ExprKind::String) {
        const std::string& f = t.args[1]->name;
        switch (classify(t.args[0], inner)) {
          case Ref::Edge: a.edge_writes.insert(f); break;
          case Ref::OwnNode: a.node_writes_own.insert(f); break;
          case Ref::OtherNode:
            a.node_writes_other.insert(f);
            if (!(t.args[0]->kind == ExprKind::Attr && t.args[0]->name == "dst")) a.other_writes_only_via_dst = false;
            break;
        }
        if (s->op != AssignOp::Set) expr(s->target, a, inner);
      }
    }
  }

  enum class Ref { Edge, OwnNode, OtherNode };

  Ref classify(const ExprP& base, const Stmt* inner) const {
    if (base->kind == ExprKind::Name) return base->name == node_var_ ? Ref::OwnNode : node_var_.empty() || inner ? (is_edge(base->name, inner) ? Ref::Edge : Ref::OwnNode) : Ref::OwnNode;
    // e.src / e.dst
    if (inner && ((inner->loop == LoopKind::IncomingEdges && base->name == "dst") ||
                  (inner->loop == LoopKind::OutgoingEdges && base->name == "src")))
      return Ref::OwnNode;
    return Ref::OtherNode;
  }
  bool is_edge(const std::string& var, const Stmt* inner) const {
    return (inner && inner->var == var) || (is_graph_edge_loop(*loop_) && loop_->var == var);
  }

  void expr(const ExprP& e, Access& a, const Stmt* inner) {
    if (e->kind == ExprKind::Index && e->args[1]->kind == ExprKind::String) {
      const std::string& f = e->args[1]->name;
      switch (classify(e->args[0], inner)) {
        case Ref::Edge: a.edge_reads.insert(f); break;
        case Ref::OwnNode: a.node_reads_own.insert(f); break;
        case Ref::OtherNode: a.node_reads_other.insert(f); break;
      }
      return;
    }
    if ((e->kind == ExprKind::Call || e->kind == ExprKind::Binary) &&
        (e->fn == Op::Linear || e->fn == Op::LinearT || e->fn == Op::Outer))
      a.has_gemm = true;
    for (const ExprP& x : e->args) expr(x, a, inner);
  }

  const Stmt* loop_ = nullptr;
  std::string node_var_;
};

bool intersects(const std::set<std::string>& a, const std::set<std::string>& b) {
  for (const auto& x : a)
    if (b.count(x)) return true;
  return false;
}

std::set<std::string> unite(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::set<std::string> r = a;
  r.insert(b.begin(), b.end());
  return r;
}

// Can loops A then B (same kind) run as one loop, element by element?
bool can_fuse(const Access& a, const Access& b) {
  std::set<std::string> a_node_writes = unite(a.node_writes_own, a.node_writes_other);
  std::set<std::string> b_node_writes = unite(b.node_writes_own, b.node_writes_other);
  // Reading another node's field that the other loop writes (it may not be written yet, or already be
  // overwritten); scatters (writes to other nodes) conflict with every read of that field.
  if (intersects(b.node_reads_other, a_node_writes) || intersects(a.node_reads_other, b_node_writes)) return false;
  if (intersects(unite(b.node_reads_own, b_node_writes), a.node_writes_other)) return false;
  if (intersects(unite(a.node_reads_own, a_node_writes), b.node_writes_other)) return false;
  // Edge data is shared safely only when both loops reach the edges the same way.
  if (a.edge_sets != b.edge_sets && !a.edge_sets.empty() && !b.edge_sets.empty() &&
      (intersects(b.edge_reads, a.edge_writes) || intersects(a.edge_reads, b.edge_writes) ||
       intersects(a.edge_writes, b.edge_writes)))
    return false;
  // Locals live per loop; fusing must not merge two different locals of one name.
  if (intersects(a.locals, b.locals)) return false;
  return true;
}

StmtP fuse(const StmtP& a, const StmtP& b, const Module& m) {
  std::vector<StmtP> body = a->body;
  StmtP rb = b->var == a->var ? b : rename_stmt(b, b->var, a->var, m);
  body.insert(body.end(), rb->body.begin(), rb->body.end());
  return Stmt::for_loop(a->var, a->loop, a->parent, body, a->loc);
}

// for e in g.edges(): B   ->   for n in g.dst_nodes(): for e in n.incoming_edges(): B
// B's types follow: e.dst is now the loop node (per node, no longer gathered per edge).
StmtP to_node_form(const StmtP& edge_loop, const std::string& node_var, const Module& m) {
  StmtP inner = Stmt::for_loop(edge_loop->var, LoopKind::IncomingEdges, node_var, edge_loop->body, edge_loop->loc);
  StmtP loop = Stmt::for_loop(node_var, LoopKind::DstNodes, "g", {inner}, edge_loop->loc);
  return Mutator(TypeContext::of(m)).mutate(loop);
}

// Fuses adjacent inner loops of a node loop where rule 4 allows.
StmtP fuse_inner(const StmtP& node_loop, const Module& m) {
  std::vector<StmtP> body;
  Analyzer an;
  for (const StmtP& s : node_loop->body) {
    if (!body.empty() && s->kind == StmtKind::For && body.back()->kind == StmtKind::For && s->loop == body.back()->loop) {
      // Wrap each inner loop in a node loop to reuse the access analysis.
      Access a = an.run(*Stmt::for_loop(node_loop->var, node_loop->loop, "g", {body.back()}));
      Access b = an.run(*Stmt::for_loop(node_loop->var, node_loop->loop, "g", {s}));
      bool reads_partial = intersects(unite(b.node_reads_own, b.node_reads_other), unite(a.node_writes_own, a.node_writes_other));
      bool writes_read = intersects(unite(b.node_writes_own, b.node_writes_other), unite(a.node_reads_own, a.node_reads_other));
      // GEMM work of the second loop depending on the first (or overwriting what it reads) would have to
      // wait for the first loop's values in the middle of the fused loop.
      std::set<std::string> a_touches = unite(unite(unite(a.node_writes_own, a.node_writes_other), a.edge_writes), a.locals);
      std::set<std::string> a_reads = unite(unite(a.node_reads_own, a.node_reads_other), a.edge_reads);
      bool gemm_depends = intersects(b.gemm_reads, a_touches) || intersects(b.gemm_writes, unite(a_touches, a_reads));
      if (!reads_partial && !writes_read && !gemm_depends && !intersects(a.locals, b.locals)) {
        body.back() = fuse(body.back(), s, m);
        continue;
      }
    }
    body.push_back(s);
  }
  return Stmt::for_loop(node_loop->var, node_loop->loop, node_loop->parent, body, node_loop->loc);
}

}  // namespace

Module fuse_loops(const Module& m) {
  std::vector<StmtP> loops = m.body;
  Analyzer an;
  bool changed = true;
  while (changed) {
    changed = false;
    for (size_t i = 0; i + 1 < loops.size() && !changed; ++i) {
      const StmtP& a = loops[i];
      const StmtP& b = loops[i + 1];
      Access aa = an.run(*a), ba = an.run(*b);
      bool both_edges = is_graph_edge_loop(*a) && is_graph_edge_loop(*b);
      bool both_nodes = is_graph_node_loop(*a) && is_graph_node_loop(*b);
      if ((both_edges || both_nodes) && can_fuse(aa, ba)) {
        loops[i] = fuse(a, b, m);
        loops.erase(loops.begin() + static_cast<long>(i) + 1);
        changed = true;
        continue;
      }
      // Rule 2: an edge loop without GEMM work joins a neighbouring node loop.
      for (int side = 0; side < 2 && !changed; ++side) {
        const StmtP& edge = side == 0 ? a : b;
        const StmtP& node = side == 0 ? b : a;
        if (!is_graph_edge_loop(*edge) || !is_graph_node_loop(*node)) continue;
        Access ea = side == 0 ? aa : ba;
        // Scatters into e.dst become the loop node's own aggregation in the node form.
        if (ea.has_gemm || !ea.other_writes_only_via_dst) continue;
        StmtP converted = to_node_form(edge, node->var, m);
        Access ca = an.run(*converted);
        Access na = side == 0 ? ba : aa;
        if (side == 0 ? !can_fuse(ca, na) : !can_fuse(na, ca)) continue;
        loops[i] = side == 0 ? fuse(converted, node, m) : fuse(node, converted, m);
        loops.erase(loops.begin() + static_cast<long>(i) + 1);
        changed = true;
      }
    }
  }
  // Rule 5: an edge loop that scatters into e.dst (and has no GEMM work) runs node-centric: its scatters
  // become register aggregation, without atomics.
  for (StmtP& s : loops) {
    if (!is_graph_edge_loop(*s)) continue;
    Access a = an.run(*s);
    if (!a.has_gemm && !a.node_writes_other.empty() && a.other_writes_only_via_dst) s = to_node_form(s, "n", m);
  }
  Module out;
  out.decl = m.decl;
  out.functions = m.functions;
  out.node_fields = m.node_fields;
  out.edge_fields = m.edge_fields;
  out.pair_fields = m.pair_fields;
  for (const StmtP& s : loops) out.body.push_back(is_graph_node_loop(*s) ? fuse_inner(s, m) : s);
  return out;
}

}  // namespace hectorgen::passes
