// Reverse-mode automatic differentiation of the inter-operator IR (see passes.h).
#include <fmt/format.h>

#include <functional>
#include <set>
#include <stdexcept>

#include "dsl/parser.h"
#include "ir/inter/names.h"
#include "ir/inter/verifier.h"
#include "passes/passes.h"

namespace hectorgen::passes {

using namespace inter;

namespace {

struct Unsupported : std::runtime_error {
  SourceLoc loc;
  Unsupported(SourceLoc l, const std::string& m) : std::runtime_error(m), loc(l) {}
};

ExprP field(const ExprP& base, const std::string& name, SourceLoc loc = {}) {
  return Expr::index(base, Expr::string_lit(name, loc), loc);
}
ExprP num(double v) { return Expr::number_lit(v, false); }
ExprP mul(ExprP a, ExprP b) { return Expr::binary(BinOp::Mul, std::move(a), std::move(b)); }
ExprP div(ExprP a, ExprP b) { return Expr::binary(BinOp::Div, std::move(a), std::move(b)); }
ExprP sub(ExprP a, ExprP b) { return Expr::binary(BinOp::Sub, std::move(a), std::move(b)); }
ExprP call(const std::string& f, std::vector<ExprP> args) { return Expr::call(f, std::move(args)); }

bool is_field(const ExprP& e) { return e->kind == ExprKind::Index && e->args[1]->kind == ExprKind::String; }

// ---------------------------------------------------------------------------------------------------
// Step 1: locals become fields of the loop element that defines them; fields get SSA versions.
// ---------------------------------------------------------------------------------------------------
class Normalizer {
 public:
  explicit Normalizer(const Module& m) : m_(m) {}

  Module run() {
    Module out;
    out.decl = m_.decl;
    count_sets(m_.body);
    for (const StmtP& s : m_.body) out.body.push_back(loop(*s));
    return out;
  }

 private:
  // Set-assignments per field decide the version names: the last one keeps the field's name.
  void count_sets(const std::vector<StmtP>& body) {
    for (const StmtP& s : body) {
      if (s->kind == StmtKind::For) count_sets(s->body);
      else if (is_field(s->target) && !is_max_aggregation(*s) &&
               (s->op == AssignOp::Set || s->op == AssignOp::Mul || s->op == AssignOp::Div))
        ++sets_[s->target->args[1]->name];
    }
  }

  std::string version_name(const std::string& f, int k) const {
    int total = sets_.count(f) ? sets_.at(f) : 0;
    return k >= total - 1 ? f : inter::version_name(f, k);
  }
  std::string current(const std::string& f) const {
    auto it = version_.find(f);
    return version_name(f, it == version_.end() ? 0 : it->second);
  }

  StmtP loop(const Stmt& L) {
    scopes_.emplace_back();
    std::vector<StmtP> body;
    for (const StmtP& s : L.body) {
      if (s->kind == StmtKind::For) body.push_back(loop(*s));
      else body.push_back(assign(*s, L));
    }
    scopes_.pop_back();
    return Stmt::for_loop(L.var, L.loop, L.parent, body, L.loc);
  }

  StmtP assign(const Stmt& s, const Stmt& L) {
    ExprP value = rewrite(s.value);
    const Expr& t = *s.target;
    if (t.kind == ExprKind::Name) {
      // Every value of a local gets a field of its own (x, then x$2 ...): the backward reads each one saved.
      // An aggregation into a local of an enclosing loop (x += v in an inner edge loop) accumulates in place.
      bool own = scopes_.back().count(t.name) > 0;
      if (s.op == AssignOp::Set || own) {
        ExprP cur = s.op == AssignOp::Set ? nullptr : rewrite(s.target);
        std::string f = new_local_field(t.name);
        scopes_.back()[t.name] = {L.var, f};
        ExprP target = field(Expr::name_ref(L.var, t.loc), f, t.loc);  // the innermost loop's element
        if (s.op == AssignOp::Set) return Stmt::assign(target, AssignOp::Set, value, s.loc);
        static const std::map<AssignOp, BinOp> kOp = {
            {AssignOp::Add, BinOp::Add}, {AssignOp::Sub, BinOp::Sub}, {AssignOp::Mul, BinOp::Mul}, {AssignOp::Div, BinOp::Div}};
        return Stmt::assign(target, AssignOp::Set, Expr::binary(kOp.at(s.op), cur, value, s.loc), s.loc);
      }
      std::string f = local_field(t.name);
      ExprP target = field(Expr::name_ref(L.var, t.loc), f, t.loc);
      ExprP cur = rewrite(s.target);
      return update(target, s.op, cur, value, s.loc);
    }
    if (!is_field(s.target)) return Stmt::assign(s.target, s.op, value, s.loc);
    const std::string& f = t.args[1]->name;
    ExprP base = rewrite(t.args[0]);
    if (s.op == AssignOp::Add || s.op == AssignOp::Sub || is_max_aggregation(s))
      return Stmt::assign(field(base, current(f), t.loc), s.op, value, s.loc);
    ExprP old = field(base, current(f), t.loc);
    bool first = !version_.count(f);
    if (!first) ++version_[f];
    else version_[f] = 0;
    ExprP target = field(base, current(f), t.loc);
    if (s.op == AssignOp::Set) return Stmt::assign(target, AssignOp::Set, value, s.loc);
    return Stmt::assign(target, AssignOp::Set, Expr::binary(s.op == AssignOp::Mul ? BinOp::Mul : BinOp::Div, old, value, s.loc), s.loc);
  }

  StmtP update(ExprP target, AssignOp op, ExprP cur, ExprP value, SourceLoc loc) {
    if (op == AssignOp::Add || op == AssignOp::Sub) return Stmt::assign(target, op, value, loc);
    return Stmt::assign(target, AssignOp::Set, Expr::binary(op == AssignOp::Mul ? BinOp::Mul : BinOp::Div, cur, value, loc), loc);
  }

  // The field of a local's current value (see new_local_field).
  std::string local_field(const std::string& local) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(local); f != it->end()) return f->second.second;
    return new_local_field(local);
  }
  // A field name for a new value of a local: the local's own name unless a declared tensor, a hyper-parameter,
  // a field of the program, one of its versions or an earlier value has it (x, x$2, ...).
  std::string new_local_field(const std::string& local) {
    if (taken_.empty()) collect_taken();
    std::string name = fresh_name(local, [&](const std::string& n) { return taken_.count(n) > 0; });
    taken_.insert(name);
    return name;
  }
  void collect_taken() {
    const ModelDecl& d = m_.decl;
    for (const auto& list : {&d.inputs, &d.weights, &d.outputs})
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

  ExprP rewrite(const ExprP& e) {
    if (e->kind == ExprKind::Name) {
      for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
        if (auto f = it->find(e->name); f != it->end())
          return field(Expr::name_ref(f->second.first, e->loc), f->second.second, e->loc);
      return e;
    }
    if (is_field(e)) return field(rewrite(e->args[0]), current(e->args[1]->name), e->loc);
    if (e->args.empty()) return e;
    auto copy = std::make_shared<Expr>(*e);
    for (ExprP& a : copy->args) a = rewrite(a);
    return copy;
  }

  const Module& m_;
  std::map<std::string, int> sets_, version_;
  std::set<std::string> taken_;  // names a local's field must not take
  std::vector<std::map<std::string, std::pair<std::string, std::string>>> scopes_;  // local -> (element var, field)
};

// ---------------------------------------------------------------------------------------------------
// Step 2: the backward program.
// ---------------------------------------------------------------------------------------------------
class Differentiator {
 public:
  Differentiator(const Module& fwd, const Analysis& a) : f_(fwd), a_(a) {}

  Module run(std::vector<std::string>& saved) {
    Module b;
    b.decl.name = f_.decl.name;
    b.decl.hyper = f_.decl.hyper;
    b.decl.options = f_.decl.options;
    b.decl.loc = f_.decl.loc;
    for (const TensorDecl& o : f_.decl.outputs) grad_.insert(o.name);  // output gradients come in
    std::vector<StmtP> body;
    for (auto it = f_.body.rbegin(); it != f_.body.rend(); ++it)
      if (StmtP s = loop(**it)) body.push_back(s);
    b.body = body;
    // Declarations: forward inputs and weights, saved fields, output gradients; gradients out.
    for (const TensorDecl& t : f_.decl.inputs) b.decl.inputs.push_back(t);
    for (const std::string& name : saved_) {
      saved.push_back(name);
      bool edge = a_.edge_fields.count(name) > 0;
      TensorDecl t;
      t.name = name;
      t.per = edge ? Per::Edge : Per::Node;
      t.shape = edge ? a_.edge_fields.at(name).shape : a_.node_fields.at(name).shape;
      t.shape_exprs = shape_exprs(t.shape);
      t.requires_grad = false;
      b.decl.inputs.push_back(t);
    }
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
    return b;
  }

 private:
  static std::vector<ExprP> shape_exprs(const std::vector<int64_t>& shape) {
    std::vector<ExprP> v;
    for (int64_t d : shape) v.push_back(Expr::number_lit(static_cast<double>(d), true));
    return v;
  }

  StmtP loop(const Stmt& L) {
    std::vector<StmtP> body;
    for (auto it = L.body.rbegin(); it != L.body.rend(); ++it) {
      const StmtP& s = *it;
      if (s->kind == StmtKind::For) {
        if (StmtP inner = loop(*s)) body.push_back(inner);
        continue;
      }
      statement(*s, body);
    }
    if (body.empty()) return nullptr;
    return Stmt::for_loop(L.var, L.loop, L.parent, body, L.loc);
  }

  // The gradient of the value a statement stores, or null when nothing depends on it. An output's gradient
  // comes in as the input d$h; when the program also reads the output (n["y"] = n["h"] * 2), what flows back
  // through those reads is accumulated in a field of its own, d$h$reads, and added.
  ExprP grad_of(const Expr& target) {
    const std::string& f = target.args[1]->name;
    if (!grad_.count(f)) return nullptr;
    if (!f_.decl.find_output(f)) return field(target.args[0], grad_name(f));
    ExprP g = Expr::attr(target.args[0], grad_name(f));
    if (read_grads_.count(f)) g = Expr::binary(BinOp::Add, g, field(target.args[0], read_grad_field(f)));
    return g;
  }
  static std::string read_grad_field(const std::string& output) { return derived_name(grad_name(output), "reads"); }
  // The field that accumulates the gradient of forward field (or output) f.
  std::string grad_field(const std::string& f) {
    std::string g = f_.decl.find_output(f) ? read_grad_field(f) : grad_name(f);
    if (f_.decl.find_output(f)) read_grads_.insert(f);
    grad_fields_[g] = f;
    return g;
  }

  void statement(const Stmt& s, std::vector<StmtP>& out) {
    if (!is_field(s.target)) throw Unsupported(s.loc, "autodiff: only field assignments are differentiated");
    ExprP g = grad_of(*s.target);
    if (!g) return;
    if (s.op == AssignOp::Sub) g = Expr::neg(g);
    std::vector<std::pair<ExprP, ExprP>> contributions;  // (leaf, gradient)
    if (is_max_aggregation(s)) {
      // m = max(m, x) over edges: the gradient goes to the x that equal the final maximum.
      const ExprP& x = s.value->args[1];
      diff(x, reduce(mul(g, call("max_grad", {saved(x), saved(s.target)})), shape(x)), contributions);
      for (auto& [leaf, grad] : contributions) accumulate(leaf, grad, s.loc, out);
      return;
    }
    diff(s.value, g, contributions);
    for (auto& [leaf, grad] : contributions) accumulate(leaf, grad, s.loc, out);
  }

  // Emits `d_leaf += grad` for a leaf that needs a gradient.
  void accumulate(const ExprP& leaf, const ExprP& grad, SourceLoc loc, std::vector<StmtP>& out) {
    if (is_field(leaf)) {
      const std::string& f = leaf->args[1]->name;
      grad_.insert(f);
      out.push_back(Stmt::assign(field(leaf->args[0], grad_field(f)), AssignOp::Add, grad, loc));
      return;
    }
    if (leaf->kind == ExprKind::Attr) {
      const TensorDecl* in = f_.decl.find_input(leaf->name);
      if (!in || !in->requires_grad || !in->from_graph.empty()) return;
      out.push_back(Stmt::assign(field(leaf->args[0], grad_name(in->name)), AssignOp::Add, grad, loc));
      return;
    }
    // A weight: W0, or W[sel].
    const std::string& w = leaf->kind == ExprKind::Name ? leaf->name : leaf->args[0]->name;
    const TensorDecl* wd = f_.decl.find_weight(w);
    if (!wd || !wd->requires_grad) return;
    ExprP target = leaf->kind == ExprKind::Name ? Expr::name_ref(grad_name(w)) : Expr::index(Expr::name_ref(grad_name(w)), leaf->args[1]);
    out.push_back(Stmt::assign(target, AssignOp::Add, grad, loc));
  }

  // ---- shapes of forward and backward expressions -------------------------------------------------
  std::vector<int64_t> shape(const ExprP& e) {
    switch (e->kind) {
      case ExprKind::Number: return {};
      case ExprKind::String: return {};
      case ExprKind::Name: {
        if (const TensorDecl* w = f_.decl.find_weight(e->name)) return w->shape;
        return {};
      }
      case ExprKind::Attr: {
        if (auto x = grad_target(e->name)) return shape_of_field(*x);
        if (const TensorDecl* in = f_.decl.find_input(e->name)) return in->shape;
        return shape_of_field(e->name);
      }
      case ExprKind::Index: {
        if (e->args[0]->kind == ExprKind::Name && f_.decl.find_weight(e->args[0]->name))
          return f_.decl.find_weight(e->args[0]->name)->shape;
        const std::string& f = e->args[1]->name;
        if (auto it = grad_fields_.find(f); it != grad_fields_.end()) return shape_of_field(it->second);
        return shape_of_field(grad_target(f).value_or(f));
      }
      case ExprKind::Neg: return shape(e->args[0]);
      case ExprKind::Binary: {
        if (e->op == BinOp::Mul && is_linear(e)) return linear_shape(shape(e->args[0]), weight_shape(e->args[1]));
        auto a = shape(e->args[0]), b = shape(e->args[1]);
        return a.size() >= b.size() ? a : b;
      }
      case ExprKind::Call: {
        const std::string& f = e->name;
        if (f == "dot" || f == "sum") {
          auto a = shape(e->args[0]);
          a.pop_back();
          return a;
        }
        if (f == "linear") return linear_shape(shape(e->args[0]), weight_shape(e->args[1]));
        if (f == "linear_t") {
          auto y = shape(e->args[0]);
          auto ws = weight_shape(e->args[1]);
          if (ws.size() == 2) { y.back() = ws[0]; return y; }
          return {ws[0], ws[1]};
        }
        if (f == "outer") {
          auto a = shape(e->args[0]);
          a.push_back(shape(e->args[1]).back());
          return a;
        }
        if (f == "reshape") {
          std::vector<int64_t> s;
          Diagnostics scratch;
          for (size_t i = 1; i < e->args.size(); ++i) s.push_back(static_cast<int64_t>(*dsl::eval_constant(e->args[i], f_.decl, scratch)));
          return s;
        }
        if (f == "concat") {
          auto a = shape(e->args[0]);
          for (size_t i = 1; i < e->args.size(); ++i) a.back() += shape(e->args[i]).back();
          return a;
        }
        if (f == "max" || f == "max_grad") {
          auto a = shape(e->args[0]), b = shape(e->args[1]);
          return a.size() >= b.size() ? a : b;
        }
        return shape(e->args[0]);  // element-wise
      }
    }
    return {};
  }
  std::vector<int64_t> shape_of_field(const std::string& f) {
    if (auto it = a_.node_fields.find(f); it != a_.node_fields.end()) return it->second.shape;
    if (auto it = a_.edge_fields.find(f); it != a_.edge_fields.end()) return it->second.shape;
    if (const TensorDecl* o = f_.decl.find_output(f)) return o->shape;
    if (const TensorDecl* in = f_.decl.find_input(f)) return in->shape;
    throw std::logic_error("autodiff: unknown field " + f);
  }
  std::vector<int64_t> weight_shape(const ExprP& w) {
    const ExprP& n = w->kind == ExprKind::Index ? w->args[0] : w;
    return f_.decl.find_weight(n->name)->shape;
  }
  static std::vector<int64_t> linear_shape(std::vector<int64_t> x, const std::vector<int64_t>& ws) {
    if (ws.size() == 2) {
      x.back() = ws[1];
      return x;
    }
    return {ws[0], ws[2]};
  }
  bool is_linear(const ExprP& e) {
    if (e->kind == ExprKind::Call && e->name == "linear") return true;
    if (e->kind != ExprKind::Binary || e->op != BinOp::Mul) return false;
    const ExprP& w = e->args[1]->kind == ExprKind::Index ? e->args[1]->args[0] : e->args[1];
    if (w->kind != ExprKind::Name) return false;
    const TensorDecl* d = f_.decl.find_weight(w->name);
    return d && d->shape.size() >= 2;
  }

  // Sums `g` over trailing axes until it has `target`'s rank (undoing prefix broadcasting).
  ExprP reduce(ExprP g, const std::vector<int64_t>& target) {
    auto gs = shape(g);
    while (gs.size() > target.size()) {
      g = call("sum", {g});
      gs.pop_back();
    }
    return g;
  }

  // Reads of forward fields become reads of the saved tensors (inputs of the backward program). A weight
  // of rank >= 2 used as a value is wrapped in a no-op reshape: `g * W[...]` would read as a linear transform.
  ExprP saved(const ExprP& e) {
    const ExprP& wn = e->kind == ExprKind::Index ? e->args[0] : e;
    if (wn->kind == ExprKind::Name && (e->kind == ExprKind::Name || e->kind == ExprKind::Index)) {
      const TensorDecl* w = f_.decl.find_weight(wn->name);
      if (w && w->shape.size() >= 2) {
        std::vector<ExprP> args{e};
        for (int64_t d : w->shape) args.push_back(Expr::number_lit(static_cast<double>(d), true));
        return call("reshape", args);
      }
    }
    return saved_fields(e);
  }
  ExprP saved_fields(const ExprP& e) {
    if (is_field(e)) {
      const std::string& f = e->args[1]->name;
      saved_.insert(f);
      return Expr::attr(saved_fields(e->args[0]), f, e->loc);
    }
    if (e->args.empty()) return e;
    auto copy = std::make_shared<Expr>(*e);
    for (ExprP& a : copy->args) a = saved_fields(a);
    return copy;
  }

  // ---- reverse-mode rules ---------------------------------------------------------------------------
  void diff(const ExprP& e, const ExprP& g, std::vector<std::pair<ExprP, ExprP>>& out) {
    switch (e->kind) {
      case ExprKind::Number:
      case ExprKind::String:
        return;
      case ExprKind::Name:
        if (f_.decl.find_weight(e->name)) out.push_back({e, g});
        return;  // hyper-parameters
      case ExprKind::Attr:
        out.push_back({e, g});
        return;
      case ExprKind::Index:
        out.push_back({e, g});  // a field or a weight slice
        return;
      case ExprKind::Neg:
        diff(e->args[0], Expr::neg(g), out);
        return;
      case ExprKind::Binary: {
        const ExprP& a = e->args[0];
        const ExprP& b = e->args[1];
        switch (e->op) {
          case BinOp::Add:
            diff(a, reduce(g, shape(a)), out);
            diff(b, reduce(g, shape(b)), out);
            return;
          case BinOp::Sub:
            diff(a, reduce(g, shape(a)), out);
            diff(b, reduce(Expr::neg(g), shape(b)), out);
            return;
          case BinOp::Mul:
            if (is_linear(e)) return linear(a, b, g, out);
            diff(a, reduce(mul(g, saved(b)), shape(a)), out);
            diff(b, reduce(mul(g, saved(a)), shape(b)), out);
            return;
          case BinOp::Div:
            diff(a, reduce(div(g, saved(b)), shape(a)), out);
            diff(b, reduce(Expr::neg(div(mul(g, saved(a)), mul(saved(b), saved(b)))), shape(b)), out);
            return;
        }
        return;
      }
      case ExprKind::Call: {
        const std::string& f = e->name;
        const ExprP& x = e->args[0];
        if (f == "exp") return diff(x, mul(g, call("exp", {saved(x)})), out);
        if (f == "relu") return diff(x, mul(g, call("leakyrelu_grad", {saved(x), num(0.0)})), out);
        if (f == "leakyrelu") {
          std::vector<ExprP> args{saved(x)};
          if (e->args.size() > 1) args.push_back(e->args[1]);
          else args.push_back(num(0.01));
          return diff(x, mul(g, call("leakyrelu_grad", args)), out);
        }
        if (f == "tanh") {
          ExprP t = call("tanh", {saved(x)});
          return diff(x, mul(g, sub(num(1.0), mul(t, t))), out);
        }
        if (f == "sigmoid") {
          ExprP sg = call("sigmoid", {saved(x)});
          return diff(x, mul(g, mul(sg, sub(num(1.0), sg))), out);
        }
        if (f == "sqrt") return diff(x, div(mul(g, num(0.5)), call("sqrt", {saved(x)})), out);
        if (f == "dot") {
          diff(x, mul(g, saved(e->args[1])), out);
          diff(e->args[1], mul(g, saved(x)), out);
          return;
        }
        if (f == "sum") return diff(x, g, out);  // broadcast back by prefix
        if (f == "reshape") {
          std::vector<ExprP> args{g};
          for (int64_t d : shape(x)) args.push_back(Expr::number_lit(static_cast<double>(d), true));
          if (args.size() == 1) return diff(x, g, out);
          return diff(x, call("reshape", args), out);
        }
        if (f == "linear") return linear(x, e->args[1], g, out);
        if (f == "max") {
          const ExprP& y = e->args[1];
          diff(x, reduce(mul(g, call("max_grad", {saved(x), saved(y)})), shape(x)), out);
          diff(y, reduce(mul(g, sub(num(1.0), call("max_grad", {saved(x), saved(y)}))), shape(y)), out);
          return;
        }
        throw Unsupported(e->loc, fmt::format("autodiff does not support '{}' yet", f));
      }
    }
  }

  // y = x * W:  dx = dy * W^T;  dW = outer(x, dy).
  void linear(const ExprP& x, const ExprP& w, const ExprP& g, std::vector<std::pair<ExprP, ExprP>>& out) {
    auto xs = shape(x), ws = weight_shape(w);
    diff(x, call("linear_t", {g, w}), out);
    bool shared_over_rows = ws.size() == 2 && xs.size() > 1;
    if (shared_over_rows) throw Unsupported(x->loc, "autodiff: a 2-D weight applied to each head of a value is not supported yet");
    out.push_back({w, call("outer", {saved(x), g})});
  }

  const Module& f_;
  const Analysis& a_;
  std::set<std::string> grad_;   // fields with a gradient (some later statement depends on them)
  std::set<std::string> saved_;  // forward fields the backward reads
  std::set<std::string> read_grads_;  // outputs the program reads (their gradient has a d$h$reads part)
  std::map<std::string, std::string> grad_fields_;  // gradient field -> forward field
};

}  // namespace

std::optional<TrainingModules> autodiff(const Module& m, Diagnostics& diags) {
  TrainingModules out;
  out.forward = Normalizer(m).run();
  Analysis fa;
  if (!verify(out.forward, diags, &fa)) {
    diags.error(m.decl.loc, "internal", "autodiff: the training forward does not verify");
    return std::nullopt;
  }
  try {
    out.backward = Differentiator(out.forward, fa).run(out.saved);
  } catch (const Unsupported& u) {
    diags.error(u.loc, "unsupported", u.what());
    return std::nullopt;
  }
  return out;
}

}  // namespace hectorgen::passes
