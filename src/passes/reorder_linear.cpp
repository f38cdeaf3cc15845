// reorder-linear (thesis: "Linear Operator Reordering"): a per-edge linear transform by a per-relation weight
// followed by a dot product with a per-relation vector of the same relation is two linear operators in a
// row; swapping them multiplies the two weights first:
//
//   hs = reshape(e.src.feature * W[e.etype], 1, D)          (W [K, D], w_s [1, D])
//   ... dot(hs, w_s[e.etype]) ...
//                         ==>  ... reshape(dot(e.src.feature, linear_t(reshape(w_s[e.etype], D), W[e.etype])), 1) ...
//
// linear_t(w, W) = w · Wᵀ = W · wᵀ is the weight-weight product Ww_s[r] (K values per relation): lowering computes
// it by a GEMM over the edge types (rows = etypes, each row its own W[r]: segments = etype; recomputed in every
// phase since the weights train), and autodiff differentiates it (d_W[r] += outer(d_Ww_s[r], w_s[r]),
// d_w_s[r] += W[r] · d_Ww_s[r]), which lowering sums per relation first (passes/lower.cpp, weight_weight_grad).
// A local that only the rewritten dots read (RGAT's ht) becomes dead and is removed: its E x D rows and its
// E-row GEMM disappear.
//
// The count (multiply-adds; E edges, R relations, K = the input width, D = the transform's output width):
//   before  E·D for the dot, plus E·K·D for the transform when nothing else reads it
//   after   E·K for the dot of the input with Ww, plus R·K·D for the weight product
// `on` rewrites every candidate; `auto` rewrites those whose per-edge cost falls (the transform becomes dead:
// E·K·D + E·D > E·K, and the R·K·D of the weight product is paid back by fewer than one edge per relation for
// K = D = 64). A dot whose transform stays live (RGAT's hs, also the message) would trade E·D for E·K + R·K·D:
// never cheaper, so `auto` leaves it.
//
// Only single-head dots are candidates: the weight product of head h needs the columns h·D .. h·D + D - 1 of
// W, which the operator table cannot select from a weight. Neither is HGT's attention: its second operand
// dot(k · W_att[r], q[dst]) is node data, not a weight, so reordering would give a per-edge product of the
// same size (no weight-weight product).
#include <fmt/format.h>

#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "ir/inter/ops.h"
#include "ir/inter/verifier.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace hectorgen::passes {

using namespace inter;

namespace {

// `W[<loop>.etype]` with W a weight per edge type: its name.
std::optional<std::string> etype_weight(const Module& m, const ExprP& e, std::vector<int64_t>* shape = nullptr) {
  if (e->kind != ExprKind::Index || e->args[0]->kind != ExprKind::Name) return std::nullopt;
  const ExprP& idx = e->args[1];
  if (idx->kind != ExprKind::Attr || idx->name != "etype") return std::nullopt;
  const TensorDecl* w = m.decl.find_weight(e->args[0]->name);
  if (!w || w->per != Per::Etype) return std::nullopt;
  if (shape) *shape = w->shape;
  return w->name;
}

bool is_linear(const ExprP& e) {
  return (e->kind == ExprKind::Binary || e->kind == ExprKind::Call) && e->fn == Op::Linear && e->args.size() == 2;
}

int64_t product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

void count_reads(const ExprP& e, std::map<std::string, int>& reads) {
  if (e->kind == ExprKind::Name) ++reads[e->name];
  for (const ExprP& a : e->args) count_reads(a, reads);
}

class Reorderer {
 public:
  Reorderer(const Module& m, Reorder mode) : m_(m), mode_(mode) {}

  std::vector<StmtP> body(const std::vector<StmtP>& in, bool in_edge_loop) {
    std::vector<StmtP> out;
    for (const StmtP& s : in) {
      if (s->kind == StmtKind::For) {
        auto c = std::make_shared<Stmt>(*s);
        c->body = body(s->body, is_edge_loop(s->loop));
        out.push_back(c);
        continue;
      }
      out.push_back(s);
    }
    if (!in_edge_loop) return out;
    return edge_body(out);
  }

  bool changed() const { return changed_; }

 private:
  struct Candidate {
    ExprP x;             // the transform's input
    ExprP weight;        // W[e.etype]
    int64_t k = 0, d = 0;
    bool reshaped = false;  // the transform's row viewed as [1, D]
    std::string local;      // the local that holds the transform ("" when written in place)
  };

  // `linear(x, W[e.etype])` or `reshape(linear(x, W[e.etype]), 1, D)`, through a local defined once in the body.
  std::optional<Candidate> transform(const ExprP& e) {
    ExprP v = e;
    std::string local;
    if (v->kind == ExprKind::Name) {
      auto it = defs_.find(v->name);
      if (it == defs_.end()) return std::nullopt;
      local = v->name;
      v = it->second;
    }
    Candidate c;
    c.local = local;
    if (v->kind == ExprKind::Call && v->fn == Op::Reshape) {
      if (v->type.shape.size() != 2 || v->type.shape[0] != 1) return std::nullopt;
      c.reshaped = true;
      v = v->args[0];
    }
    if (!is_linear(v)) return std::nullopt;
    std::vector<int64_t> ws;
    if (!etype_weight(m_, v->args[1], &ws) || ws.size() != 2) return std::nullopt;
    if (v->args[0]->type.shape.size() != 1) return std::nullopt;
    // Read where the dot is instead of where the local was set: only when nothing it reads changes in between
    // (no local set twice, no field the loop writes).
    if (!local.empty() && !stable(v->args[0])) return std::nullopt;
    c.x = v->args[0];
    c.weight = v->args[1];
    c.k = ws[0];
    c.d = ws[1];
    return c;
  }

  bool stable(const ExprP& e) const {
    if (e->kind == ExprKind::Name && sets_.count(e->name) && sets_.at(e->name) > 1) return false;
    if (e->kind == ExprKind::Index && e->args[1]->kind == ExprKind::String && written_.count(e->args[1]->name))
      return false;
    for (const ExprP& a : e->args)
      if (!stable(a)) return false;
    return true;
  }

  // dot(transform, w[e.etype]) (either order) -> the reordered expression, or null.
  ExprP rewrite_dot(const ExprP& e, const std::map<std::string, int>& reads) {
    if (e->kind != ExprKind::Call || e->fn != Op::Dot) return nullptr;
    for (int side : {0, 1}) {
      std::optional<Candidate> c = transform(e->args[side]);
      const ExprP& vec = e->args[1 - side];
      std::vector<int64_t> vs;
      if (!c || !etype_weight(m_, vec, &vs) || product(vs) != c->d) continue;
      if (c->reshaped ? vs != std::vector<int64_t>{1, c->d} : vs != std::vector<int64_t>{c->d}) continue;
      // The count: does the transform become dead (its local read by this dot only, or written in place)?
      bool dead = c->local.empty() || reads.at(c->local) == 1;
      int64_t before = c->d + (dead ? c->k * c->d : 0), after = c->k;  // per edge
      if (mode_ == Reorder::Auto && !(after < before)) continue;
      ExprP w = untyped_copy(vec);
      if (c->reshaped) w = Expr::call(Op::Reshape, {w, Expr::number_lit(static_cast<double>(c->d), true)}, e->loc);
      ExprP ww = Expr::call(Op::LinearT, {w, untyped_copy(c->weight)}, e->loc);
      ExprP r = Expr::call(Op::Dot, {untyped_copy(c->x), ww}, e->loc);
      if (c->reshaped) r = Expr::call(Op::Reshape, {r, Expr::number_lit(1, true)}, e->loc);
      changed_ = true;
      return r;
    }
    return nullptr;
  }

  ExprP rewrite(const ExprP& e, const std::map<std::string, int>& reads) {
    if (ExprP r = rewrite_dot(e, reads)) return r;
    bool any = false;
    std::vector<ExprP> args;
    for (const ExprP& a : e->args) {
      args.push_back(rewrite(a, reads));
      any = any || args.back() != a;
    }
    if (!any) return e;
    auto c = std::make_shared<Expr>(*e);
    c->type = Type{};
    c->args = std::move(args);
    return c;
  }

  // A straight edge-loop body: locals assigned once are looked through; rewritten dots; dead locals dropped.
  std::vector<StmtP> edge_body(const std::vector<StmtP>& in) {
    defs_.clear();
    written_.clear();
    std::map<std::string, int>& sets = sets_;
    sets.clear();
    std::map<std::string, int> reads;
    for (const StmtP& s : in) {
      if (s->kind == StmtKind::For) return in;  // nested loops: left as they are
      if (s->target && s->target->kind == ExprKind::Name) ++sets[s->target->name];
      if (s->target && s->target->kind == ExprKind::Index && s->target->args[1]->kind == ExprKind::String)
        written_.insert(s->target->args[1]->name);
      if (s->value) count_reads(s->value, reads);
      if (s->target && s->target->kind != ExprKind::Name) count_reads(s->target, reads);
    }
    for (const StmtP& s : in)
      if (s->kind == StmtKind::Assign && s->op == AssignOp::Set && s->target->kind == ExprKind::Name &&
          sets[s->target->name] == 1)
        defs_[s->target->name] = s->value;
    for (const auto& [n, v] : defs_) reads.try_emplace(n, 0);
    std::vector<StmtP> out;
    std::set<std::string> touched;
    for (const StmtP& s : in) {
      ExprP v = s->value ? rewrite(s->value, reads) : nullptr;
      if (v == s->value) {
        out.push_back(s);
        continue;
      }
      auto c = std::make_shared<Stmt>(*s);
      c->value = v;
      c->target = untyped_copy(s->target);
      out.push_back(c);
    }
    // Locals nobody reads any more (a transform only the rewritten dots read).
    std::map<std::string, int> left;
    for (const StmtP& s : out) {
      if (s->value) count_reads(s->value, left);
      if (s->target && s->target->kind != ExprKind::Name) count_reads(s->target, left);
    }
    std::vector<StmtP> kept;
    for (const StmtP& s : out) {
      bool local = s->kind == StmtKind::Assign && s->target->kind == ExprKind::Name && defs_.count(s->target->name);
      if (local && reads[s->target->name] > 0 && left[s->target->name] == 0) continue;
      kept.push_back(s);
    }
    return kept;
  }

  const Module& m_;
  Reorder mode_;
  std::map<std::string, ExprP> defs_;
  std::map<std::string, int> sets_;  // locals of the edge-loop body: how often each is set
  std::set<std::string> written_;    // fields the edge-loop body writes
  bool changed_ = false;
};

}  // namespace

Module reorder_linear(const Module& m, Reorder mode) {
  if (mode == Reorder::Off) return m;
  Reorderer r(m, mode);
  Module out = m;
  out.body = r.body(m.body, false);
  if (!r.changed()) return m;
  return retype(std::move(out), "reorder-linear");
}

}  // namespace hectorgen::passes
