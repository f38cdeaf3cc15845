// Reverse-mode automatic differentiation of the inter-operator IR (see passes.h). The derivative of each
// operator is its row's rule in the operator table (ir/inter/ops.h); this pass applies them statement by
// statement, in reverse, and builds typed nodes throughout (no type inference afterwards).
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>
#include <stdexcept>

#include "ir/inter/mutator.h"
#include "ir/inter/names.h"
#include "ir/inter/ops.h"
#include "ir/inter/typing.h"
#include "passes/passes.h"

namespace hectorgen::passes {

using namespace inter;

namespace {

bool is_field(const ExprP& e) { return e->kind == ExprKind::Index && e->args[1]->kind == ExprKind::String; }

Type loop_var_type(const Stmt& loop) { return Type::loop_var(loop.loop); }

// ---------------------------------------------------------------------------------------------------
// Step 1: locals become fields of the loop element that defines them; fields get SSA versions.
// ---------------------------------------------------------------------------------------------------
class Normalizer : public Mutator {
 public:
  explicit Normalizer(const Module& m) : Mutator(TypeContext{}), m_(m) {
    out_.decl = m.decl;
    set_context(TypeContext::of(out_));  // the field table grows in program order, as inference builds it
  }

  Module run() {
    count_sets(m_.body);
    frames_.push_back({"", {}});  // the top level: copy loops of new versions go before the loop that needs them
    for (const StmtP& s : m_.body) {
      StmtP r = mutate(s);
      flush_frame(out_.body);
      out_.body.push_back(r);
      ++top_index_;
    }
    return std::move(out_);
  }

 protected:
  StmtP visit_for(const StmtP& L) override {
    push_scope();
    bind(L->var, loop_var_type(*L));
    scopes_.emplace_back();
    frames_.push_back({L->var, {}});
    std::vector<StmtP> body;
    for (const StmtP& s : L->body) {
      StmtP r = s->kind == StmtKind::For ? mutate(s) : assign(*s, *L);
      flush_frame(body);
      body.push_back(r);
    }
    frames_.pop_back();
    scopes_.pop_back();
    pop_scope();
    return Stmt::for_loop(L->var, L->loop, L->parent, body, L->loc);
  }

  // A local's read becomes a read of its field; a field's read names its current version.
  ExprP visit_name(const ExprP& e) override {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(e->name); f != it->end()) {
        read_since_write_.insert(f->second.second);
        return field(element(f->second.first, e->loc), f->second.second, e->loc);
      }
    return Mutator::visit_name(e);
  }
  ExprP visit_index(const ExprP& e) override {
    if (!is_field(e)) return Mutator::visit_index(e);
    ExprP base = mutate(e->args[0]);
    return typed::rebuild(e, {base, typed::with_type(Expr::string_lit(current(e->args[1]->name), e->args[1]->loc),
                                                     e->args[1]->type)},
                          context());
  }

 private:
  // Each value a field takes is a version of its own (SSA): the first write, every set (=, *=, /=), and a `+=`
  // or `-=` after the field was read since its last version (the read value must stay as it was for the
  // backward, which reads it saved and gives it a gradient of its own). The last version keeps the field's
  // name. The pass below decides versions in the same order: `versioned_` marks the accumulations that start one.
  void count_sets(const std::vector<StmtP>& body) {
    for (const StmtP& s : body) {
      if (s->kind == StmtKind::For) {
        count_sets(s->body);
        continue;
      }
      std::set<std::string> reads;
      collect_field_reads(s->value, reads);
      for (const std::string& r : reads) read_in_count_.insert(r);
      if (!is_field(s->target)) continue;
      const std::string& f = s->target->args[1]->name;
      bool first = !sets_.count(f), starts = starts_version(*s, read_in_count_.count(f) > 0);
      if (first) {
        sets_[f] = 1;
      } else if (starts) {
        ++sets_[f];
        if (s->op == AssignOp::Add || s->op == AssignOp::Sub) versioned_.insert(s.get());
      }
      if (first || starts) read_in_count_.erase(f);
    }
  }
  static bool starts_version(const Stmt& s, bool read_since) {
    if (is_max_aggregation(s)) return false;
    if (s.op == AssignOp::Set || s.op == AssignOp::Mul || s.op == AssignOp::Div) return true;
    return read_since;
  }
  static void collect_field_reads(const ExprP& e, std::set<std::string>& out) {
    if (is_field(e)) out.insert(e->args[1]->name);
    for (const ExprP& a : e->args) collect_field_reads(a, out);
  }

  // Statements to insert before the next statement of a loop body (or, at the top level, before the next loop).
  struct Frame {
    std::string var;
    std::vector<StmtP> pending;
  };
  void flush_frame(std::vector<StmtP>& body) {
    Frame& f = frames_.back();
    for (StmtP& s : f.pending) body.push_back(std::move(s));
    f.pending.clear();
  }

  // `f_new = f_old` for the element `base` denotes, before the statement (or the inner loop holding it) that
  // starts accumulating into the new version: in the loop of that element, or, for another node reached through
  // an edge, in a node loop of its own before the current top-level loop.
  void copy_version(const ExprP& base, const std::string& f, const std::string& from, const std::string& to, const Stmt& L,
                    SourceLoc loc) {
    if (base->type.kind == ValueKind::Pair && base->kind != ExprKind::Name)
      throw UnsupportedGradient(loc, fmt::format("autodiff: pair field '{}' is accumulated through the edges after a read", f));
    std::string var;
    if (base->kind == ExprKind::Name) var = base->name;
    else if (base->kind == ExprKind::Attr &&
             ((base->name == "dst" && L.loop == LoopKind::IncomingEdges) || (base->name == "src" && L.loop == LoopKind::OutgoingEdges)))
      var = L.parent;  // the edge's endpoint is the enclosing loop's node
    for (auto it = frames_.rbegin(); !var.empty() && it != frames_.rend(); ++it)
      if (it->var == var) {
        ExprP el = element(var, loc);
        it->pending.push_back(write(target(el, to, loc), AssignOp::Set, field(el, from, loc), loc));
        return;
      }
    // Another node: all nodes copy before this top-level loop, which must not be writing the old version.
    if (last_top_write_.count(from) && last_top_write_.at(from) == top_index_)
      throw UnsupportedGradient(loc, fmt::format("autodiff: node field '{}' is accumulated again after a read, in the loop "
                                                 "that accumulated it through its edges; split the loop",
                                                 f));
    // The copy loop's own node variable, typed as node loops bind it.
    push_scope();
    bind("n", Type::node_var());
    ExprP n = typed::name("n", Type::node_var(), loc);
    StmtP copy = write(target(n, to, loc), AssignOp::Set, field(n, from, loc), loc);
    pop_scope();
    frames_.front().pending.push_back(Stmt::for_loop("n", LoopKind::DstNodes, "g", {copy}, loc));
  }

  std::string version_name(const std::string& f, int k) const {
    int total = sets_.count(f) ? sets_.at(f) : 0;
    return k >= total - 1 ? f : inter::version_name(f, k);
  }
  std::string current(const std::string& f) const {
    auto it = version_.find(f);
    return version_name(f, it == version_.end() ? 0 : it->second);
  }

  ExprP element(const std::string& var, SourceLoc loc) { return typed::name(var, *binding(var), loc); }
  ExprP field(ExprP base, const std::string& f, SourceLoc loc) { return typed::field(std::move(base), f, context(), loc); }
  // The target of a write: typed as what it stores by write().
  static ExprP target(ExprP base, const std::string& f, SourceLoc loc) { return Expr::index(std::move(base), typed::string(f, loc), loc); }

  // `target op= value` into a field: recorded in the field table (the verifier's rule), then typed.
  StmtP write(ExprP target, AssignOp op, ExprP value, SourceLoc loc, bool max_aggregation = false) {
    ValueKind home = target->args[0]->type.kind;
    bool on_edges = home == ValueKind::Edge;
    read_since_write_.erase(target->args[1]->name);
    last_top_write_[target->args[1]->name] = top_index_;
    bool accumulates = op != AssignOp::Set || max_aggregation;
    record_field_write(on_edges ? out_.edge_fields : home == ValueKind::Pair ? out_.pair_fields : out_.node_fields,
                       target->args[1]->name, on_edges, accumulates, /*may_grow=*/true, value_type(value->type).shape);
    return typed::assign(std::move(target), op, std::move(value), context(), nullptr, nullptr, loc);
  }

  StmtP assign(const Stmt& s, const Stmt& L) {
    ExprP value = mutate(s.value);
    const Expr& t = *s.target;
    if (t.kind == ExprKind::Name && !weight_grad_output(m_.decl, t.name)) {
      // A local bound in this loop body that is set again after a read, or updated in place (*=, /=, or += / -=
      // after a read), becomes a new field: the value read keeps its own field, saved for the backward.
      auto bound = scopes_.back().find(t.name);
      bool here = bound != scopes_.back().end();
      bool rebind = here && (s.op == AssignOp::Mul || s.op == AssignOp::Div || read_since_write_.count(bound->second.second));
      if (rebind) {
        ExprP cur = visit_name(s.target);
        std::string f = fresh_local_field(t.name);
        scopes_.back()[t.name] = {L.var, f};
        ExprP to = this->target(element(L.var, t.loc), f, t.loc);
        if (s.op == AssignOp::Set) return write(to, AssignOp::Set, value, s.loc);
        Op op = s.op == AssignOp::Add ? Op::Add : s.op == AssignOp::Sub ? Op::Sub : s.op == AssignOp::Mul ? Op::Mul : Op::Div;
        return write(to, AssignOp::Set, typed::apply(op, {cur, value}, s.loc), s.loc);
      }
      std::string f = local_field(t.name);
      ExprP target = this->target(element(L.var, t.loc), f, t.loc);  // the innermost loop's element
      if (s.op == AssignOp::Set) {
        scopes_.back()[t.name] = {L.var, f};
        return write(target, AssignOp::Set, value, s.loc);
      }
      ExprP cur = visit_name(s.target);
      return update(target, s.op, cur, value, s.loc);
    }
    if (!is_field(s.target)) return typed::assign(mutate_target(s.target), s.op, value, context(), nullptr, &s.target->type, s.loc);
    const std::string& f = t.args[1]->name;
    ExprP base = mutate(t.args[0]);
    bool first = !version_.count(f);
    if (first) version_[f] = 0;
    if ((s.op == AssignOp::Add || s.op == AssignOp::Sub) && versioned_.count(&s)) {
      // A new version, starting from the old value.
      std::string from = current(f);
      ++version_[f];
      copy_version(base, f, from, current(f), L, s.loc);
      return write(target(base, current(f), t.loc), s.op, value, s.loc);
    }
    if (s.op == AssignOp::Add || s.op == AssignOp::Sub || is_max_aggregation(s))
      return write(target(base, current(f), t.loc), s.op, value, s.loc, is_max_aggregation(s));
    ExprP old = s.op == AssignOp::Set ? nullptr : field(base, current(f), t.loc);
    if (!first) ++version_[f];
    ExprP to = target(base, current(f), t.loc);
    if (s.op == AssignOp::Set) return write(to, AssignOp::Set, value, s.loc);
    return write(to, AssignOp::Set, typed::apply(s.op == AssignOp::Mul ? Op::Mul : Op::Div, {old, value}, s.loc), s.loc);
  }

  StmtP update(ExprP target, AssignOp op, ExprP cur, ExprP value, SourceLoc loc) {
    if (op == AssignOp::Add || op == AssignOp::Sub) return write(target, op, value, loc);
    return write(target, AssignOp::Set, typed::apply(op == AssignOp::Mul ? Op::Mul : Op::Div, {cur, value}, loc), loc);
  }

  // The field of a local's current value (see new_local_field).
  std::string local_field(const std::string& local) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(local); f != it->end()) return f->second.second;
    return fresh_local_field(local);
  }
  // A field name for a new value of a local: the local's own name unless a declared tensor, a hyper-parameter,
  // a field of the program, one of its versions or an earlier value has it (x, x$2, ...).
  std::string fresh_local_field(const std::string& local) {
    if (taken_.empty()) collect_taken();
    std::string name = fresh_name(local, [&](const std::string& n) { return taken_.count(n) > 0 || sets_.count(n) > 0; });
    taken_.insert(name);
    return name;
  }
  void collect_taken() {
    const ModelDecl& d = m_.decl;
    for (const auto* list : {&d.inputs, &d.weights, &d.outputs})
      for (const TensorDecl& t : *list) taken_.insert(t.name);
    for (const HyperParam& h : d.hyper) taken_.insert(h.name);
    std::function<void(const ExprP&)> fields = [&](const ExprP& e) {
      if (is_field(e)) taken_.insert(e->args[1]->name);
      for (const ExprP& a : e->args) fields(a);
    };
    std::function<void(const std::vector<StmtP>&)> walk = [&](const std::vector<StmtP>& body) {
      for (const StmtP& s : body) {
        if (s->target) fields(s->target);
        if (s->value) fields(s->value);
        walk(s->body);
      }
    };
    walk(m_.body);
    for (const auto& [f, total] : sets_)
      for (int k = 0; k + 1 < total; ++k) taken_.insert(version_name(f, k));
  }

  const Module& m_;
  Module out_;
  std::map<std::string, int> sets_, version_;  // versions per field (count_sets), the current one
  std::set<std::string> read_in_count_;        // count_sets: fields read since their last version
  std::set<const Stmt*> versioned_;            // accumulations that start a new version
  std::set<std::string> read_since_write_;     // fields of locals read since they were last written
  std::map<std::string, size_t> last_top_write_;  // field version -> the top-level loop that last wrote it
  size_t top_index_ = 0;
  std::vector<Frame> frames_;
  std::set<std::string> taken_;  // names a local's field must not take
  std::vector<std::map<std::string, std::pair<std::string, std::string>>> scopes_;  // local -> (element var, field)
};

// ---------------------------------------------------------------------------------------------------
// Step 2: the backward program.
// ---------------------------------------------------------------------------------------------------
// Operands the training forward stores for the backward instead of the backward recomputing them (see
// Differentiator::worth_storing): (forward statement, operand node in its value) -> the field.
using OperandStores = std::map<std::pair<const Stmt*, const Expr*>, std::string>;

// A stored operand has at most this many elements per row (a float or a few per edge)...
constexpr int64_t kMaxStoredElements = 4;
// ... and reduces a row of at least this many elements (a warp's width: recomputing it re-reads whole rows).
constexpr int64_t kMinReducedRow = 32;

class Differentiator {
 public:
  explicit Differentiator(const Module& fwd) : f_(fwd) {}

  // After run(): the operands the backward reads from fields that the training forward must store.
  const OperandStores& stores() const { return stores_; }

  Module run(std::vector<std::string>& saved) {
    Module b;
    b.decl.name = f_.decl.name;
    b.decl.hyper = f_.decl.hyper;
    b.decl.options = f_.decl.options;
    b.decl.loc = f_.decl.loc;
    // Declarations: forward inputs and weights, output gradients (and the saved fields, added as the rules
    // read them); gradients out.
    b.decl.inputs = f_.decl.inputs;
    for (const TensorDecl& o : f_.decl.outputs) {
      TensorDecl t = o;
      t.name = grad_name(o.name);
      t.requires_grad = false;
      b.decl.inputs.push_back(t);
    }
    b.decl.weights = f_.decl.weights;
    for (const TensorDecl& t : f_.decl.inputs)
      if (t.requires_grad && t.from_graph.empty()) {
        TensorDecl g = t;
        g.name = grad_name(t.name);
        b.decl.outputs.push_back(g);
      }
    for (const TensorDecl& w : f_.decl.weights)
      if (w.requires_grad) {
        TensorDecl g = w;
        g.name = grad_name(w.name);
        g.init.clear();
        b.decl.outputs.push_back(g);
      }
    b_ = &b;
    ctx_ = TypeContext::of(b);
    for (const TensorDecl& o : f_.decl.outputs) grad_.insert(o.name);  // output gradients come in
    std::vector<StmtP> body;
    for (auto it = f_.body.rbegin(); it != f_.body.rend(); ++it) loop(**it, body);
    drop_unread_stores(body);
    zero_unreached_gradients(b, body);
    b.body = body;
    // Every node and edge gradient is written, with its declared shape (the rules broadcast explicitly).
    for (const TensorDecl& o : b.decl.outputs) {
      if (o.per != Per::Node && o.per != Per::Edge) continue;
      const FieldTable& fields = o.per == Per::Edge ? b.edge_fields : b.node_fields;
      auto it = fields.find(o.name);
      if (it == fields.end() || it->second.shape != o.shape)
        throw std::logic_error(fmt::format("autodiff: gradient '{}' is computed with shape {}, declared {}", o.name,
                                           it == fields.end() ? "(none)" : shape_str(it->second.shape), shape_str(o.shape)));
    }
    // Inputs in a fixed order: the forward's, the saved fields (by name), the output gradients.
    std::vector<TensorDecl> inputs = f_.decl.inputs;
    for (const std::string& name : saved_) {
      saved.push_back(name);
      inputs.push_back(*b.decl.find_input(name));
    }
    for (const TensorDecl& o : f_.decl.outputs) inputs.push_back(*b.decl.find_input(grad_name(o.name)));
    b.decl.inputs = std::move(inputs);
    return b;
  }

 private:
  // Appends the backward of loop L to `out` (nothing when no gradient flows through it), preceded by a loop of
  // the same kind that counts tied maxima when L's max-aggregations need one.
  void loop(const Stmt& L, std::vector<StmtP>& out) {
    std::vector<StmtP> body, outer_ties;
    std::swap(outer_ties, ties_);
    for (auto it = L.body.rbegin(); it != L.body.rend(); ++it) {
      const StmtP& s = *it;
      if (s->kind == StmtKind::For) {
        loop(*s, body);
        continue;
      }
      loop_ = &L;
      stmt_ = s.get();
      statement(*s, body);
    }
    std::swap(outer_ties, ties_);
    if (!outer_ties.empty()) out.push_back(Stmt::for_loop(L.var, L.loop, L.parent, outer_ties, L.loc));
    if (!body.empty()) out.push_back(Stmt::for_loop(L.var, L.loop, L.parent, body, L.loc));
  }

  // The gradient of an input that no value with a gradient depends on is zero: written explicitly, in a
  // loop of its own (weight gradients start at zero anyway).
  void zero_unreached_gradients(Module& b, std::vector<StmtP>& body) {
    for (const TensorDecl& o : b.decl.outputs) {
      if (o.per != Per::Node && o.per != Per::Edge) continue;
      bool edge = o.per == Per::Edge;
      FieldTable& fields = edge ? b.edge_fields : b.node_fields;
      if (fields.count(o.name)) continue;
      std::vector<ExprP> args{typed::number(0.0)};
      for (int64_t d : o.shape) args.push_back(typed::number(static_cast<double>(d), true));
      ExprP zero = o.shape.empty() ? args[0] : typed::apply(Op::Expand, std::move(args));
      record_field_write(fields, o.name, edge, /*accumulates=*/false, /*may_grow=*/false, o.shape);
      const char* var = edge ? "e" : "n";
      ExprP target = Expr::index(typed::name(var, edge ? Type::edge_var(LoopKind::Edges) : Type::node_var()), typed::string(o.name));
      StmtP s = typed::assign(target, AssignOp::Set, zero, ctx_);
      body.push_back(Stmt::for_loop(var, edge ? LoopKind::Edges : LoopKind::DstNodes, "g", {s}));
    }
  }

  // The gradient of the value a statement stores, or null when nothing depends on it.
  // An output's gradient comes in as the input d$h; reads of the output after its last write add theirs into a
  // field of its own, d$h$reads (the input is not written).
  ExprP grad_of(const Expr& target) {
    const std::string& f = target.args[1]->name;
    if (!grad_.count(f)) return nullptr;
    if (f_.decl.find_output(f)) {
      ExprP g = typed::attr(target.args[0], grad_name(f), ctx_);
      if (!output_reads_.count(f)) return g;
      return typed::apply(Op::Add, {g, typed::field(target.args[0], grad_field(f), ctx_)});
    }
    return typed::field(target.args[0], grad_field(f), ctx_);
  }
  // The field that accumulates the gradient of forward field (or output) f.
  std::string grad_field(const std::string& f) const {
    return f_.decl.find_output(f) ? derived_name(grad_name(f), "reads") : grad_name(f);
  }

  void statement(const Stmt& s, std::vector<StmtP>& out) {
    if (!is_field(s.target)) {
      const Expr& t = *s.target;
      // A user's output per edge type, node type or none (`acc[e.etype] += v`), written like a weight gradient.
      const std::string& name = t.kind == ExprKind::Index ? t.args[0]->name : t.name;
      const TensorDecl* o = f_.decl.find_output(name);
      throw UnsupportedGradient(s.loc, fmt::format("autodiff: output '{}' is per {}; only outputs per node or per edge are "
                                                   "differentiated yet",
                                                   name, o ? to_string(o->per) : "none"));
    }
    ExprP g = grad_of(*s.target);
    if (!g) return;
    if (s.op == AssignOp::Sub) g = typed::apply(Op::Neg, {g});
    std::vector<std::pair<ExprP, ExprP>> contributions;  // (leaf, gradient)
    if (is_max_aggregation(s)) {
      // m = max(m, x) over edges: the gradient goes to the x that equal the final maximum, split evenly among
      // tied ones (parallel edges tie exactly). Every convex split over the maxima is a valid subgradient; the
      // even one is torch's (amax, maximum) and does not depend on the order the edges are visited in, which
      // the generated kernels choose (edges sorted by type) and the user's graph does not. A loop before this
      // one counts the ties per element; a maximum that no x reaches (the initial value) gives x no gradient.
      const ExprP& x = s.value->args[1];
      ExprP mask = typed::apply(Op::MaxGrad, {saved(x), saved(s.target)});
      const ExprP& base = s.target->args[0];
      std::string ties = derived_name(s.target->args[1]->name, "ties");
      ties_.push_back(write(base, ties, mask, s.loc));
      ExprP count = typed::apply(Op::Max, {typed::field(base, ties, ctx_), typed::number(1.0, false)});
      diff(x, reduce(typed::apply(Op::Div, {typed::apply(Op::Mul, {g, mask}), count}), x), contributions);
    } else {
      // A whole stored value (`f = call(...)`): its derivative may read f's saved value (GradArgs::result).
      diff(s.value, g, contributions, s.op == AssignOp::Set ? s.target : nullptr);
    }
    for (auto& [leaf, grad] : contributions) accumulate(leaf, grad, s.loc, out);
  }

  // Emits `d_leaf += grad` for a leaf that needs a gradient.
  void accumulate(const ExprP& leaf, const ExprP& grad, SourceLoc loc, std::vector<StmtP>& out) {
    if (is_field(leaf)) {
      const std::string& f = leaf->args[1]->name;
      grad_.insert(f);
      if (f_.decl.find_output(f)) output_reads_.insert(f);
      out.push_back(write(leaf->args[0], grad_field(f), grad, loc));
      return;
    }
    if (leaf->kind == ExprKind::Attr) {
      const TensorDecl* in = f_.decl.find_input(leaf->name);
      if (!in || !in->requires_grad || !in->from_graph.empty()) return;
      out.push_back(write(leaf->args[0], grad_name(in->name), grad, loc));
      return;
    }
    // A weight: W0, or W[sel].
    const std::string& w = leaf->kind == ExprKind::Name ? leaf->name : leaf->args[0]->name;
    const TensorDecl* wd = f_.decl.find_weight(w);
    if (!wd || !wd->requires_grad) return;
    ExprP dw = typed::name(grad_name(w), weight_ref(*b_->decl.find_output(grad_name(w))));
    ExprP target = leaf->kind == ExprKind::Name ? dw : typed::with_type(Expr::index(dw, leaf->args[1]), leaf->type);
    out.push_back(typed::assign(target, AssignOp::Add, grad, ctx_, nullptr, nullptr, loc));
  }

  // `base["field"] += grad`, recorded in the backward's field table.
  StmtP write(const ExprP& base, const std::string& field, const ExprP& grad, SourceLoc loc) {
    bool on_edges = base->type.kind == ValueKind::Edge;
    FieldTable& table = on_edges ? b_->edge_fields : base->type.kind == ValueKind::Pair ? b_->pair_fields : b_->node_fields;
    record_field_write(table, field, on_edges, /*accumulates=*/true, /*may_grow=*/true, value_type(grad->type).shape);
    ExprP target = typed::with_type(Expr::index(base, typed::string(field)), Type{});
    return typed::assign(target, AssignOp::Add, grad, ctx_, nullptr, nullptr, loc);
  }

  // Sums `g` over trailing axes until it has the rank of `operand` (undoing prefix broadcasting).
  ExprP reduce(ExprP g, const ExprP& operand) {
    size_t rank = value_type(operand->type).shape.size();
    while (g->type.shape.size() > rank) g = typed::apply(Op::Sum, {g});
    return g;
  }

  // Reads of forward fields become reads of the saved tensors (inputs of the backward program), and operands
  // worth storing become reads of the fields the training forward stores them in (stored_operand). A weight
  // of rank >= 2 used as a value is wrapped in a no-op reshape: `g * W[...]` would read as a linear transform.
  ExprP saved(const ExprP& e) {
    if (e->type.kind == ValueKind::Weight && e->type.shape.size() >= 2) {
      std::vector<ExprP> args{e};
      for (int64_t d : e->type.shape) args.push_back(typed::number(static_cast<double>(d), true));
      return typed::apply(Op::Reshape, std::move(args));
    }
    return SavedFields(*this).mutate(e);
  }

  // Field reads -> reads of the saved inputs; stored operands -> reads of their fields.
  class SavedFields : public Mutator {
   public:
    explicit SavedFields(Differentiator& d) : Mutator(d.ctx_), d_(d) {}

   protected:
    ExprP visit_index(const ExprP& e) override {
      if (!is_field(e)) return Mutator::visit_index(e);
      const std::string& f = e->args[1]->name;
      d_.declare_saved(f);
      return typed::attr(mutate(e->args[0]), f, context(), e->loc);
    }
    ExprP visit_call(const ExprP& e) override { return stored_or_children(e); }
    ExprP visit_binary(const ExprP& e) override { return stored_or_children(e); }
    ExprP visit_neg(const ExprP& e) override { return stored_or_children(e); }

   private:
    ExprP stored_or_children(const ExprP& e) { return d_.worth_storing(*e) ? d_.stored_operand(e) : mutate_children(e); }
    Differentiator& d_;
  };

  // Whether the backward reads `e`, a value of the forward statement being differentiated, from a field the
  // training forward stores it in, rather than recomputing it from saved fields: a value per edge (or per pair)
  // of the statement's loop, of at most kMaxStoredElements elements, whose recomputation would re-read whole
  // rows (rereads_rows). Recomputing HGT's dot(k * W_att, q) for the gradient of mu re-reads two feature rows
  // per edge; storing it costs a float per edge. Of nested candidates only the innermost are stored
  // (sigmoid(w * dot(a, b)) stores the dot; the backward recomputes the rest from it), so that nothing is
  // stored twice.
  //
  // The forward is rewritten after differentiation (StoreOperands), not before: which operands the backward
  // reads is what the operator table's derivative rules ask for (GradArgs::saved), and only they know it. A
  // read that no gradient ends up using (the adjoint of a constant factor) is dropped again
  // (drop_unread_stores): the forward stores only what the backward reads.
  bool worth_storing(const Expr& e) const {
    if (!loop_ || !(is_edge_loop(loop_->loop) || loop_->loop == LoopKind::SrcPairs)) return false;
    if (e.kind != ExprKind::Call && e.kind != ExprKind::Binary && e.kind != ExprKind::Neg) return false;
    const Type& t = e.type;
    return t.is_tensor() && t.domain == Domain::Edge && t.numel() <= kMaxStoredElements && rereads_rows(e);
  }
  // True when recomputing `e` sums over rows of kMinReducedRow elements or more of node or edge data (the
  // operators the traversal template computes as warp reductions): e is such a sum, or a part of it that is
  // not stored is.
  bool rereads_rows(const Expr& e) const {
    if (e.kind == ExprKind::Call && op_info(e.fn).form == Form::ReduceLast) {
      const Type& x = value_type(e.args[0]->type);
      bool per_row = e.type.domain == Domain::Node || e.type.domain == Domain::Edge;
      if (per_row && !x.shape.empty() && x.shape.back() >= kMinReducedRow) return true;
    }
    return std::any_of(e.args.begin(), e.args.end(), [&](const ExprP& a) { return !worth_storing(*a) && rereads_rows(*a); });
  }
  // The read of the field the training forward stores `e` in (worth_storing), declared saved.
  ExprP stored_operand(const ExprP& e) {
    auto [it, added] = stores_.try_emplace({stmt_, e.get()});
    if (added) {
      // Named after the statement's field and the operator: att$0$dot.
      std::string base = derived_name(stmt_->target->args[1]->name, e->kind == ExprKind::Call ? op_info(e->fn).name : "value");
      it->second = fresh_name(base, [&](const std::string& n) { return is_forward_name(n); });
      store_fields_.insert(it->second);
    }
    bool pair = loop_->loop == LoopKind::SrcPairs;
    declare_saved(it->second, pair ? Per::Pair : Per::Edge, e->type.shape);
    return typed::attr(typed::name(loop_->var, Type::loop_var(loop_->loop)), it->second, ctx_, e->loc);
  }
  // A name the forward uses: a declaration, a hyper-parameter, a field, or a stored operand's field.
  bool is_forward_name(const std::string& n) const {
    const ModelDecl& d = f_.decl;
    return d.find_input(n) || d.find_weight(n) || d.find_output(n) || d.find_hyper(n) || f_.node_fields.count(n) ||
           f_.edge_fields.count(n) || f_.pair_fields.count(n) || store_fields_.count(n);
  }

  // Forgets the stored operands that no statement of the backward reads (their reads were built for adjoints
  // nothing accumulates), so that the forward does not store them.
  void drop_unread_stores(const std::vector<StmtP>& body) {
    struct Reads : Visitor {
      std::set<std::string> names;
      void visit_attr(const ExprP& e) override {
        names.insert(e->name);
        visit_children(e);
      }
    } reads;
    reads.visit(body);
    for (auto it = stores_.begin(); it != stores_.end();) {
      if (reads.names.count(it->second)) {
        ++it;
        continue;
      }
      saved_.erase(it->second);
      it = stores_.erase(it);
    }
  }

  void declare_saved(const std::string& name) {
    if (f_.edge_fields.count(name)) return declare_saved(name, Per::Edge, f_.edge_fields.at(name).shape);
    if (f_.pair_fields.count(name)) return declare_saved(name, Per::Pair, f_.pair_fields.at(name).shape);
    declare_saved(name, Per::Node, f_.node_fields.at(name).shape);
  }
  void declare_saved(const std::string& name, Per per, const std::vector<int64_t>& shape) {
    if (!saved_.insert(name).second) return;
    TensorDecl t;
    t.name = name;
    t.per = per;
    t.shape = shape;
    for (int64_t d : t.shape) t.shape_exprs.push_back(Expr::number_lit(static_cast<double>(d), true));
    t.requires_grad = false;
    b_->decl.inputs.push_back(t);
  }

  // ---- reverse mode: the operator table's derivative rules -----------------------------------------------
  // `stored`: the field that holds e's value after its statement (null: none), for GradArgs::result.
  void diff(const ExprP& e, const ExprP& g, std::vector<std::pair<ExprP, ExprP>>& out, const ExprP& stored = nullptr) {
    switch (e->kind) {
      case ExprKind::Number:
      case ExprKind::String:
        return;
      case ExprKind::Name:
        if (e->type.kind == ValueKind::Weight) out.push_back({e, g});
        return;  // hyper-parameters
      case ExprKind::Attr:
      case ExprKind::Index:
        out.push_back({e, g});  // an input, a field or a weight slice
        return;
      case ExprKind::Neg:
      case ExprKind::Binary:
      case ExprKind::Call: {
        const OpInfo& op = op_info(e->fn);
        if (!op.grad) throw UnsupportedGradient(e->loc, fmt::format("autodiff does not support '{}' yet", op.name));
        std::function<ExprP(const ExprP&)> save = [this](const ExprP& x) { return saved(x); };
        std::function<ExprP()> result = [this, &stored]() { return stored ? saved(stored) : nullptr; };
        std::function<std::optional<double>(const ExprP&)> constant = [this](const ExprP& x) -> std::optional<double> {
          if (x->kind == ExprKind::Number) return x->number;
          if (x->kind != ExprKind::Name) return std::nullopt;
          const HyperParam* h = f_.decl.find_hyper(x->name);
          return h ? std::optional<double>(h->value) : std::nullopt;
        };
        std::vector<ExprP> adjoints = op.grad(GradArgs{*e, g, save, result, constant});
        for (size_t i = 0; i < e->args.size(); ++i)
          if (i < adjoints.size() && adjoints[i]) diff(e->args[i], reduce(adjoints[i], e->args[i]), out);
        return;
      }
    }
  }

  const Module& f_;
  Module* b_ = nullptr;
  TypeContext ctx_;
  std::set<std::string> grad_;   // fields with a gradient (some later statement depends on them)
  std::set<std::string> saved_;  // forward fields the backward reads
  std::set<std::string> output_reads_;  // outputs read after their last write (their gradient has two parts)
  std::vector<StmtP> ties_;      // tie counts of the max-aggregations of the loop being differentiated
  const Stmt* loop_ = nullptr;   // the forward loop and statement being differentiated
  const Stmt* stmt_ = nullptr;
  OperandStores stores_;                // operands the backward reads stored (worth_storing)
  std::set<std::string> store_fields_;  // their fields
};

// ---------------------------------------------------------------------------------------------------
// Step 3: the training forward stores the operands the backward reads stored (Differentiator::worth_storing):
// `e["att$0$dot"] = dot(...)` right before the statement that computes the operand, which then reads the field
// instead. The forward computes the same values in the same order; the inference forward is not touched.
// ---------------------------------------------------------------------------------------------------
class StoreOperands : public Mutator {
 public:
  StoreOperands(const Module& fwd, const OperandStores& stores) : Mutator(TypeContext{}), out_(fwd), stores_(stores) {
    set_context(TypeContext::of(out_));
  }

  Module run() {
    if (stores_.empty()) return std::move(out_);
    out_.body = mutate(out_.body);
    return std::move(out_);
  }

 protected:
  StmtP visit_for(const StmtP& L) override {
    push_scope();
    bind(L->var, loop_var_type(*L));
    std::vector<StmtP> body;
    for (const StmtP& s : L->body) {
      if (s->kind == StmtKind::For) {
        body.push_back(mutate(s));
        continue;
      }
      stmt_ = s.get();
      element_ = typed::name(L->var, loop_var_type(*L), L->loc);
      StmtP r = mutate(s);
      for (StmtP& store : pending_) body.push_back(std::move(store));
      pending_.clear();
      body.push_back(r);
    }
    pop_scope();
    if (body == L->body) return L;
    return Stmt::for_loop(L->var, L->loop, L->parent, body, L->loc);
  }
  // Children first: an operand stored inside another one is stored before it.
  ExprP visit_call(const ExprP& e) override { return store(e, Mutator::visit_call(e)); }
  ExprP visit_binary(const ExprP& e) override { return store(e, Mutator::visit_binary(e)); }
  ExprP visit_neg(const ExprP& e) override { return store(e, Mutator::visit_neg(e)); }

 private:
  // `value` (the operand `original` with its own stored parts read from their fields), stored when requested.
  ExprP store(const ExprP& original, ExprP value) {
    auto it = stores_.find({stmt_, original.get()});
    if (it == stores_.end()) return value;
    const std::string& f = it->second;
    bool on_edges = element_->type.kind == ValueKind::Edge;
    record_field_write(on_edges ? out_.edge_fields : out_.pair_fields, f, on_edges, /*accumulates=*/false,
                       /*may_grow=*/false, value_type(value->type).shape);
    ExprP target = Expr::index(element_, typed::string(f, original->loc), original->loc);
    pending_.push_back(typed::assign(target, AssignOp::Set, value, context(), nullptr, nullptr, stmt_->loc));
    return typed::field(element_, f, context(), original->loc);
  }

  Module out_;
  const OperandStores& stores_;
  const Stmt* stmt_ = nullptr;  // the forward statement being rewritten (the stores' key) and its loop's element
  ExprP element_;
  std::vector<StmtP> pending_;  // stores to insert before it
};

}  // namespace

std::optional<TrainingModules> autodiff(const Module& m, Diagnostics& diags) {
  TrainingModules out;
  try {
    out.forward = Normalizer(m).run();
    Differentiator d(out.forward);
    out.backward = d.run(out.saved);
    out.forward = StoreOperands(out.forward, d.stores()).run();
  } catch (const UnsupportedGradient& u) {
    diags.error(u.loc, "unsupported", u.what());
    return std::nullopt;
  }
  return out;
}

}  // namespace hectorgen::passes
