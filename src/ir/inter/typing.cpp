#include "ir/inter/typing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "ir/inter/mutator.h"
#include "ir/inter/ops.h"
#include "ir/inter/printer.h"

namespace hectorgen::inter {

// ---- Type ----------------------------------------------------------------------------------------------------
std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t Type::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Type::str() const {
  switch (kind) {
    case ValueKind::Untyped: return "untyped";
    case ValueKind::Graph: return "graph";
    case ValueKind::Edge: return "edge";
    case ValueKind::Node: return "node";
    case ValueKind::Pair: return "pair";
    case ValueKind::TypeIndex: return etype ? "etype" : "ntype";
    case ValueKind::Weight: return "weight " + weight;
    case ValueKind::String: return "string";
    case ValueKind::Tensor: break;
  }
  const char* d = "const";
  switch (domain) {
    case Domain::Const: d = "const"; break;
    case Domain::Weight: d = "weight"; break;
    case Domain::Node: d = "node"; break;
    case Domain::Edge: d = is_src_etype() && dep_src ? "src_etype" : "edge"; break;
  }
  return d + shape_str(shape);
}

Type Type::tensor(Domain d, std::vector<int64_t> shape) {
  Type t;
  t.kind = ValueKind::Tensor;
  t.domain = d;
  t.shape = std::move(shape);
  return t;
}

Type Type::constant(double v) {
  Type t = tensor(Domain::Const);
  t.value = v;
  return t;
}

Type Type::edge_var(LoopKind loop) {
  Type t = of_kind(ValueKind::Edge);
  t.loop = loop;
  return t;
}

Type Type::node_var() { return of_kind(ValueKind::Node); }

Type Type::pair_var() { return of_kind(ValueKind::Pair); }

Type Type::loop_var(LoopKind loop) {
  if (is_edge_loop(loop)) return edge_var(loop);
  return loop == LoopKind::SrcPairs ? pair_var() : node_var();
}

Type Type::of_kind(ValueKind k) {
  Type t;
  t.kind = k;
  return t;
}

// ---- shared rules ------------------------------------------------------------------------------------------
Type join(const Type& a, const Type& b) {
  Type t = Type::tensor(std::max(a.domain, b.domain));
  t.dtype = a.dtype == b.dtype ? a.dtype : DType::FP32;  // mixed element types compute in fp32
  t.dep_src = a.dep_src || b.dep_src;
  t.dep_dst = a.dep_dst || b.dep_dst;
  t.dep_etype = a.dep_etype || b.dep_etype;
  t.dep_edge = a.dep_edge || b.dep_edge;
  return t;
}

bool is_prefix(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

std::optional<std::vector<int64_t>> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  if (is_prefix(a, b)) return b;
  if (is_prefix(b, a)) return a;
  return std::nullopt;
}

Type value_type(const Type& t) {
  if (t.kind == ValueKind::Tensor) return t;
  if (t.kind != ValueKind::Weight) return Type{};
  Type v = Type::tensor(std::max(t.domain, Domain::Weight), t.shape);
  v.dtype = t.dtype;
  v.dep_src = t.dep_src;
  v.dep_dst = t.dep_dst;
  v.dep_etype = t.dep_etype;
  v.dep_edge = t.dep_edge;
  return v;
}

Type node_data(const Type& node) {
  if (node.role == NodeRole::Loop || node.outer) return Type::tensor(Domain::Node);
  Type t = Type::tensor(Domain::Edge);
  (node.role == NodeRole::Src ? t.dep_src : t.dep_dst) = true;
  return t;
}

Type pair_data() {
  Type t = Type::tensor(Domain::Edge);
  t.dep_src = t.dep_etype = true;
  return t;
}

Type weight_ref(const TensorDecl& w) {
  Type t = Type::of_kind(ValueKind::Weight);
  t.domain = Domain::Weight;
  t.weight = w.name;
  t.per = w.per;
  t.shape = w.shape;
  return t;
}

const TensorDecl* weight_grad_output(const ModelDecl& decl, const std::string& name) {
  const TensorDecl* o = decl.find_output(name);
  return o && o->per != Per::Node && o->per != Per::Edge ? o : nullptr;
}

namespace {

TypeError error(SourceLoc loc, const char* kind, std::string message) { return TypeError{loc, kind, std::move(message)}; }

std::string edge_inputs(const ModelDecl& d) {
  std::string s;
  for (const auto& i : d.inputs)
    if (i.per == Per::Edge) s += ", " + i.name;
  return s;
}
std::string node_inputs(const ModelDecl& d) {
  std::string s;
  for (const auto& i : d.inputs)
    if (i.per == Per::Node) s += ", " + i.name;
  return s;
}

// e.etype, p.etype: an edge type, per edge.
Type etype_index() {
  Type t = Type::of_kind(ValueKind::TypeIndex);
  t.etype = true;
  t.domain = Domain::Edge;
  t.dep_etype = true;
  return t;
}

}  // namespace

TypeResult type_attr(const Type& base, const std::string& a, SourceLoc loc, const TypeContext& ctx) {
  if (base.kind == ValueKind::Edge) {
    if (a == "src" || a == "dst") {
      Type n = Type::node_var();
      n.role = a == "src" ? NodeRole::Src : NodeRole::Dst;
      // In `for n ...: for e in n.incoming_edges()`, e.dst is n itself (and e.src in outgoing edges).
      n.outer = (base.loop == LoopKind::IncomingEdges && n.role == NodeRole::Dst) ||
                (base.loop == LoopKind::OutgoingEdges && n.role == NodeRole::Src);
      return n;
    }
    if (a == "etype") return etype_index();
    if (a == "pair") {
      Type p = Type::pair_var();
      p.role = NodeRole::Src;
      return p;
    }
    if (const TensorDecl* in = ctx.decl->find_input(a); in && in->per == Per::Edge) {
      Type t = Type::tensor(Domain::Edge, in->shape);
      t.dep_edge = true;
      return t;
    }
    return error(loc, "unknown-attribute",
                 fmt::format("an edge has no attribute '{}' (edges have src, dst, etype, pair{})", a, edge_inputs(*ctx.decl)));
  }
  if (base.kind == ValueKind::Pair) {
    if (a == "src") {
      Type n = Type::node_var();
      n.role = NodeRole::Src;
      return n;
    }
    if (a == "etype") return etype_index();
    if (const TensorDecl* in = ctx.decl->find_input(a); in && in->per == Per::Pair) {
      Type t = pair_data();
      t.shape = in->shape;
      return t;
    }
    return error(loc, "unknown-attribute",
                 fmt::format("a (source, edge type) pair has no attribute '{}' (pairs have src and etype)", a));
  }
  if (base.kind == ValueKind::Node) {
    if (a == "ntype") {
      Type d = node_data(base);
      Type t = Type::of_kind(ValueKind::TypeIndex);
      t.domain = d.domain;
      t.dep_src = d.dep_src;
      t.dep_dst = d.dep_dst;
      return t;
    }
    if (const TensorDecl* in = ctx.decl->find_input(a); in && in->per == Per::Node) {
      Type t = node_data(base);
      t.shape = in->shape;
      return t;
    }
    return error(loc, "unknown-attribute", fmt::format("a node has no attribute '{}' (nodes have ntype{})", a, node_inputs(*ctx.decl)));
  }
  return error(loc, "unknown-attribute", fmt::format("'{}' has no attribute '{}'", base.str(), a));
}

TypeResult type_index(const Type& base, const Expr& idx, SourceLoc loc, const TypeContext& ctx, const Type* previous) {
  if (base.kind == ValueKind::Weight) {
    if (base.selected) return error(loc, "weight-indexing", fmt::format("weight '{}' is indexed twice", base.weight));
    const Type& ti = idx.type;
    bool want_etype = base.per == Per::Etype;
    if (base.per == Per::None || ti.kind != ValueKind::TypeIndex || ti.etype != want_etype)
      return error(idx.loc, "weight-indexing", fmt::format("weight '{}' cannot be indexed with '{}'", base.weight, print_expr(std::make_shared<Expr>(idx))));
    Type t = base;
    t.selected = true;
    t.domain = ti.domain;
    t.dep_src = ti.dep_src;
    t.dep_dst = ti.dep_dst;
    t.dep_etype = ti.dep_etype;
    t.dep_edge = ti.dep_edge;
    return t;
  }
  if (base.kind == ValueKind::Edge || base.kind == ValueKind::Node || base.kind == ValueKind::Pair) {
    if (idx.kind != ExprKind::String) return error(idx.loc, "bad-field", "field names must be string literals such as e[\"att\"]");
    bool is_edge = base.kind == ValueKind::Edge;
    Type t;
    if (is_edge) {
      t = Type::tensor(Domain::Edge);
      t.dep_edge = true;
    } else if (base.kind == ValueKind::Pair) {
      t = pair_data();
    } else {
      t = node_data(base);
    }
    if (previous && previous->kind == ValueKind::Tensor) {
      t.shape = previous->shape;
      t.dtype = previous->dtype;
      return t;
    }
    const FieldTable* fields = is_edge ? ctx.edge_fields : base.kind == ValueKind::Pair ? ctx.pair_fields : ctx.node_fields;
    auto it = fields ? fields->find(idx.name) : FieldTable::const_iterator{};
    if (!fields || it == fields->end())
      return error(idx.loc, "undefined-field", fmt::format("field '{}' is read before it is written", idx.name));
    t.shape = it->second.shape;
    t.dtype = it->second.dtype;
    return t;
  }
  return error(loc, "bad-index", fmt::format("a {} cannot be indexed", base.str()));
}

Op resolve_mul(const Type& lhs, const Type& rhs) {
  (void)lhs;
  return rhs.kind == ValueKind::Weight && rhs.shape.size() >= 2 ? Op::Linear : Op::Mul;
}

TypeResult type_op(Op op, const std::vector<ExprP>& args, SourceLoc loc) {
  const OpInfo& info = op_info(op);
  if (args.size() < info.min_args() || args.size() > info.max_args())
    return error(loc, "wrong-arguments", fmt::format("'{}' takes {} arguments, got {}", info.name, info.params.size(), args.size()));
  std::vector<Type> types;
  bool all_constant = true;
  for (size_t i = 0; i < args.size(); ++i) {
    const Param& p = info.param(i);
    const Type& t = args[i]->type;
    switch (p.kind) {
      case ParamKind::Tensor: {
        Type v = value_type(t);
        if (!v.typed())
          return error(args[i]->loc, "type-mismatch",
                       fmt::format("{} of '{}' must be a tensor value, but it is {}", p.role, info.name, t.str()));
        types.push_back(v);
        break;
      }
      case ParamKind::Weight:
        if (t.kind != ValueKind::Weight)
          return error(args[i]->loc, "type-mismatch", fmt::format("{} of '{}' must be a weight", p.role, info.name));
        types.push_back(t);
        break;
      case ParamKind::Constant:
        if (!t.value) return error(args[i]->loc, p.error_kind, p.error);
        types.push_back(t);
        break;
    }
    all_constant = all_constant && types.back().value.has_value();
  }
  TypeResult r = info.type(OpArgs{info, loc, args, types});
  if (Type* t = std::get_if<Type>(&r)) {
    t->kind = ValueKind::Tensor;
    t->value.reset();
    if (info.folds && all_constant) {
      std::vector<Value64> values;
      for (const Type& a : types) values.push_back(Value64::scalar(*a.value));
      Value64 v = info.eval(values, *t);
      if (v.data.size() == 1 && std::isfinite(v.data[0])) t->value = v.data[0];
    }
  }
  return r;
}

namespace {

Type unwrap(TypeResult r, const Expr& e) {
  if (auto* err = std::get_if<TypeError>(&r))
    throw std::logic_error(fmt::format("ill-typed IR at '{}': {}", print_expr(std::make_shared<Expr>(e)), err->message));
  return std::get<Type>(std::move(r));
}

}  // namespace

Type infer(const Expr& e, const TypeContext& ctx, const Type* previous) {
  switch (e.kind) {
    case ExprKind::Number: return Type::constant(e.number);
    case ExprKind::String: return Type::of_kind(ValueKind::String);
    case ExprKind::Name:
      if (e.type.typed()) return e.type;
      if (const HyperParam* h = ctx.decl->find_hyper(e.name)) return Type::constant(h->value);
      if (const TensorDecl* w = ctx.decl->find_weight(e.name)) return weight_ref(*w);
      if (e.name == "g") return Type::of_kind(ValueKind::Graph);
      throw std::logic_error(fmt::format("ill-typed IR: the type of '{}' is unknown", e.name));
    case ExprKind::Attr: return unwrap(type_attr(e.args[0]->type, e.name, e.loc, ctx), e);
    case ExprKind::Index: return unwrap(type_index(e.args[0]->type, *e.args[1], e.loc, ctx, previous), e);
    case ExprKind::Call: return unwrap(type_op(e.fn, e.args, e.loc), e);
    case ExprKind::Neg: return unwrap(type_op(Op::Neg, e.args, e.loc), e);
    case ExprKind::Binary: {
      Op op = e.op == BinOp::Mul ? resolve_mul(e.args[0]->type, e.args[1]->type) : binary_op(e.op);
      return unwrap(type_op(op, e.args, e.loc), e);
    }
  }
  throw std::logic_error("infer: unknown expression kind");
}

Type stored_type(const Expr& target, AssignOp op, const Type& value0, const TypeContext& ctx, const Type* local,
                 const Type* previous) {
  Type value = value_type(value0);
  value.value.reset();
  if (target.kind == ExprKind::Name) {
    if (weight_grad_output(*ctx.decl, target.name)) return value;
    if (op == AssignOp::Set || !local) return value;
    Type merged = join(*local, value);
    merged.shape = local->shape;
    merged.dtype = local->dtype;
    return merged;
  }
  const Type& base = target.args[0]->type;
  if (base.kind == ValueKind::Weight) return value;  // d_W[e.etype] += ...
  if (target.args[1]->kind != ExprKind::String ||
      (base.kind != ValueKind::Edge && base.kind != ValueKind::Node && base.kind != ValueKind::Pair))
    throw std::logic_error("stored_type: not an assignable target");
  const std::string& name = target.args[1]->name;
  bool on_edge = base.kind == ValueKind::Edge;
  bool on_pair = base.kind == ValueKind::Pair;
  std::vector<int64_t> shape;
  if (previous && previous->typed()) {
    shape = previous->shape;
  } else {
    const FieldTable* fields = on_edge ? ctx.edge_fields : on_pair ? ctx.pair_fields : ctx.node_fields;
    auto it = fields->find(name);
    if (it == fields->end()) throw std::logic_error("stored_type: unknown field " + name);
    shape = it->second.shape;
  }
  Type stored = value;
  if (on_pair) {
    Type p = pair_data();
    stored.domain = p.domain;
    stored.dep_src = p.dep_src;
    stored.dep_etype = p.dep_etype;
    stored.dep_dst = stored.dep_edge = false;
  } else if (!on_edge) {
    stored.domain = Domain::Node;
    stored.dep_src = stored.dep_dst = stored.dep_etype = stored.dep_edge = false;
  }
  stored.shape = shape;
  return stored;
}

bool record_field_write(FieldTable& table, const std::string& name, bool on_edges, bool accumulates, bool may_grow,
                        const std::vector<int64_t>& value_shape) {
  auto it = table.find(name);
  if (it == table.end()) {
    table.emplace(name, FieldInfo{on_edges, value_shape, DType::FP32});
    return true;
  }
  std::vector<int64_t>& shape = it->second.shape;
  if (value_shape == shape) return true;
  // A field first set from a scalar (e.g. n["s"] = 0.0) takes the shape of what is accumulated into it.
  if (is_prefix(shape, value_shape) && accumulates && may_grow) {
    shape = value_shape;
    return true;
  }
  return is_prefix(value_shape, shape) && accumulates;
}

// ---- typed builders ---------------------------------------------------------------------------------------
namespace typed {

ExprP with_type(const ExprP& e, Type t) {
  if (e->type == t) return e;
  auto c = std::make_shared<Expr>(*e);
  c->type = std::move(t);
  return c;
}

ExprP number(double v, bool is_integer, SourceLoc loc) {
  return with_type(Expr::number_lit(v, is_integer, loc), Type::constant(v));
}

ExprP string(std::string s, SourceLoc loc) {
  return with_type(Expr::string_lit(std::move(s), loc), Type::of_kind(ValueKind::String));
}

ExprP name(std::string n, Type t, SourceLoc loc) { return with_type(Expr::name_ref(std::move(n), loc), std::move(t)); }

ExprP apply(Op op, std::vector<ExprP> args, SourceLoc loc) {
  const OpInfo& info = op_info(op);
  ExprP e;
  switch (info.syntax) {
    case Syntax::Call: e = Expr::call(op, std::move(args), loc); break;
    case Syntax::Prefix: e = Expr::neg(std::move(args.at(0)), loc); break;
    case Syntax::Infix: {
      BinOp b = op == Op::Add ? BinOp::Add : op == Op::Sub ? BinOp::Sub : op == Op::Mul ? BinOp::Mul : BinOp::Div;
      e = Expr::binary(b, std::move(args.at(0)), std::move(args.at(1)), loc);
      break;
    }
  }
  auto c = std::make_shared<Expr>(*e);
  if (c->kind == ExprKind::Binary && c->op == BinOp::Mul) c->fn = resolve_mul(c->args[0]->type, c->args[1]->type);
  c->type = unwrap(type_op(c->fn, c->args, loc), *c);
  return c;
}

ExprP attr(ExprP base, std::string attribute, const TypeContext& ctx, SourceLoc loc) {
  auto c = std::make_shared<Expr>(*Expr::attr(std::move(base), std::move(attribute), loc));
  c->type = infer(*c, ctx);
  return c;
}

ExprP index(ExprP base, ExprP idx, const TypeContext& ctx, SourceLoc loc) {
  auto c = std::make_shared<Expr>(*Expr::index(std::move(base), std::move(idx), loc));
  c->type = infer(*c, ctx);
  return c;
}

ExprP field(ExprP base, std::string f, const TypeContext& ctx, SourceLoc loc) {
  return index(std::move(base), string(std::move(f), loc), ctx, loc);
}

ExprP rebuild(const ExprP& e, std::vector<ExprP> args, const TypeContext& ctx) {
  if (args == e->args) return e;
  auto c = std::make_shared<Expr>(*e);
  c->args = std::move(args);
  if (c->kind == ExprKind::Binary && c->op == BinOp::Mul) c->fn = resolve_mul(c->args[0]->type, c->args[1]->type);
  c->type = infer(*c, ctx, &e->type);
  return c;
}

StmtP assign(ExprP target, AssignOp op, ExprP value, const TypeContext& ctx, const Type* local, const Type* previous,
             SourceLoc loc) {
  Type stored = stored_type(*target, op, value->type, ctx, local, previous);
  return Stmt::assign(with_type(target, std::move(stored)), op, std::move(value), loc);
}

}  // namespace typed

namespace {
// Finds an expression without a type.
class UntypedFinder : public Visitor {
 public:
  bool found = false;
  using Visitor::visit;
  void visit(const ExprP& e) override {
    found = found || !e->type.typed();
    Visitor::visit(e);
  }
};
}  // namespace

bool is_typed(const Module& m) {
  UntypedFinder f;
  f.visit(m.body);
  return m.functions.empty() && !f.found;
}

}  // namespace hectorgen::inter
