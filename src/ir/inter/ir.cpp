#include "ir/inter/ir.h"

#include <algorithm>

#include "ir/inter/names.h"
#include "ir/inter/ops.h"

namespace hectorgen::inter {

static std::shared_ptr<Expr> make_expr(ExprKind kind, SourceLoc loc) {
  auto e = std::make_shared<Expr>();
  e->kind = kind;
  e->loc = loc;
  return e;
}

static std::shared_ptr<Stmt> make_stmt(StmtKind kind, SourceLoc loc) {
  auto s = std::make_shared<Stmt>();
  s->kind = kind;
  s->loc = loc;
  return s;
}

ExprP Expr::number_lit(double v, bool is_integer, SourceLoc loc) {
  auto e = make_expr(ExprKind::Number, loc);
  e->number = v;
  e->is_integer = is_integer;
  return e;
}
ExprP Expr::string_lit(std::string v, SourceLoc loc) {
  auto e = make_expr(ExprKind::String, loc);
  e->name = std::move(v);
  return e;
}
ExprP Expr::name_ref(std::string n, SourceLoc loc) {
  auto e = make_expr(ExprKind::Name, loc);
  e->name = std::move(n);
  return e;
}
ExprP Expr::attr(ExprP base, std::string attribute, SourceLoc loc) {
  auto e = make_expr(ExprKind::Attr, loc);
  e->name = std::move(attribute);
  e->args = {std::move(base)};
  return e;
}
ExprP Expr::index(ExprP base, ExprP idx, SourceLoc loc) {
  auto e = make_expr(ExprKind::Index, loc);
  e->args = {std::move(base), std::move(idx)};
  return e;
}
ExprP Expr::call(std::string callee, std::vector<ExprP> args, SourceLoc loc) {
  auto e = make_expr(ExprKind::Call, loc);
  e->fn = call_op(callee).value_or(Op::None);
  e->name = std::move(callee);
  e->args = std::move(args);
  return e;
}
ExprP Expr::call(Op op, std::vector<ExprP> args, SourceLoc loc) {
  auto e = make_expr(ExprKind::Call, loc);
  e->fn = op;
  e->name = op_info(op).name;
  e->args = std::move(args);
  return e;
}
ExprP Expr::binary(BinOp op, ExprP lhs, ExprP rhs, SourceLoc loc) {
  auto e = make_expr(ExprKind::Binary, loc);
  e->op = op;
  e->fn = binary_op(op);
  e->args = {std::move(lhs), std::move(rhs)};
  return e;
}
ExprP Expr::neg(ExprP x, SourceLoc loc) {
  auto e = make_expr(ExprKind::Neg, loc);
  e->fn = Op::Neg;
  e->args = {std::move(x)};
  return e;
}

StmtP Stmt::for_loop(std::string var, LoopKind loop, std::string parent, std::vector<StmtP> body,
                     SourceLoc loc) {
  auto s = make_stmt(StmtKind::For, loc);
  s->var = std::move(var);
  s->loop = loop;
  s->parent = std::move(parent);
  s->body = std::move(body);
  return s;
}
StmtP Stmt::assign(ExprP target, AssignOp op, ExprP value, SourceLoc loc) {
  auto s = make_stmt(StmtKind::Assign, loc);
  s->target = std::move(target);
  s->op = op;
  s->value = std::move(value);
  return s;
}
StmtP Stmt::call(ExprP call, SourceLoc loc) {
  auto s = make_stmt(StmtKind::Call, loc);
  s->value = std::move(call);
  return s;
}

template <class T>
static const T* find_named(const std::vector<T>& v, std::string_view n) {
  for (const auto& x : v)
    if (x.name == n) return &x;
  return nullptr;
}
const HyperParam* ModelDecl::find_hyper(std::string_view n) const { return find_named(hyper, n); }
const TensorDecl* ModelDecl::find_input(std::string_view n) const { return find_named(inputs, n); }
const TensorDecl* ModelDecl::find_weight(std::string_view n) const { return find_named(weights, n); }
const TensorDecl* ModelDecl::find_output(std::string_view n) const { return find_named(outputs, n); }

const char* to_string(Per p) {
  switch (p) {
    case Per::Node: return "node";
    case Per::Edge: return "edge";
    case Per::Etype: return "etype";
    case Per::Ntype: return "ntype";
    case Per::None: return "none";
    case Per::Pair: return "pair";
  }
  return "?";
}
const char* to_string(LoopKind k) {
  switch (k) {
    case LoopKind::Edges: return "edges";
    case LoopKind::DstNodes: return "dst_nodes";
    case LoopKind::SrcNodes: return "src_nodes";
    case LoopKind::IncomingEdges: return "incoming_edges";
    case LoopKind::OutgoingEdges: return "outgoing_edges";
    case LoopKind::SrcPairs: return "src_etype_pairs";
  }
  return "?";
}
const char* to_string(AssignOp op) {
  switch (op) {
    case AssignOp::Set: return "=";
    case AssignOp::Add: return "+=";
    case AssignOp::Sub: return "-=";
    case AssignOp::Mul: return "*=";
    case AssignOp::Div: return "/=";
  }
  return "?";
}
const char* to_string(BinOp op) {
  switch (op) {
    case BinOp::Add: return "+";
    case BinOp::Sub: return "-";
    case BinOp::Mul: return "*";
    case BinOp::Div: return "/";
  }
  return "?";
}
const char* to_string(Materialization m) {
  switch (m) {
    case Materialization::Vanilla: return "vanilla";
    case Materialization::Compact: return "compact";
    case Materialization::Auto: return "auto";
  }
  return "?";
}
const char* to_string(Reorder r) {
  switch (r) {
    case Reorder::Off: return "off";
    case Reorder::On: return "on";
    case Reorder::Auto: return "auto";
  }
  return "?";
}
const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::Auto: return "auto";
    case Recompute::On: return "on";
    case Recompute::Off: return "off";
  }
  return "?";
}
const char* to_string(DType d) {
  switch (d) {
    case DType::FP32: return "fp32";
    case DType::TF32: return "tf32";
    case DType::BF16: return "bf16";
    case DType::FP16: return "fp16";
  }
  return "?";
}
std::optional<Per> parse_per(std::string_view s) {
  for (Per p : {Per::Node, Per::Edge, Per::Etype, Per::Ntype, Per::None, Per::Pair})
    if (s == to_string(p)) return p;
  return std::nullopt;
}
std::optional<Materialization> parse_materialization(std::string_view s) {
  for (auto m : {Materialization::Vanilla, Materialization::Compact, Materialization::Auto})
    if (s == to_string(m)) return m;
  return std::nullopt;
}
std::optional<Reorder> parse_reorder(std::string_view s) {
  for (auto r : {Reorder::Off, Reorder::On, Reorder::Auto})
    if (s == to_string(r)) return r;
  return std::nullopt;
}
std::optional<Recompute> parse_recompute(std::string_view s) {
  for (auto r : {Recompute::Auto, Recompute::On, Recompute::Off})
    if (s == to_string(r)) return r;
  return std::nullopt;
}
std::optional<DType> parse_dtype(std::string_view s) {
  for (auto d : {DType::FP32, DType::TF32, DType::BF16, DType::FP16})
    if (s == to_string(d)) return d;
  return std::nullopt;
}

std::string bad_name_reason(std::string_view name) {
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == kSigil; };
  auto alnum = [&](char c) { return alpha(c) || (c >= '0' && c <= '9'); };
  if (name.empty() || !alpha(name[0]) || !std::all_of(name.begin(), name.end(), alnum))
    return "is not an identifier ([A-Za-z_][A-Za-z0-9_]*)";
  return "";
}

bool is_max_aggregation(const Stmt& s) {
  return s.kind == StmtKind::Assign && s.op == AssignOp::Set && s.value->kind == ExprKind::Call &&
         s.value->fn == Op::Max && s.value->args.size() == 2 && equal(s.value->args[0], s.target);
}

bool equal(const ExprP& a, const ExprP& b) {
  if (a == b) return true;
  if (!a || !b) return false;
  if (a->kind != b->kind || a->name != b->name || a->op != b->op || a->number != b->number ||
      a->is_integer != b->is_integer || a->args.size() != b->args.size())
    return false;
  for (size_t i = 0; i < a->args.size(); ++i)
    if (!equal(a->args[i], b->args[i])) return false;
  return true;
}

bool equal(const StmtP& a, const StmtP& b) {
  if (a == b) return true;
  if (!a || !b) return false;
  if (a->kind != b->kind || a->var != b->var || a->loop != b->loop || a->parent != b->parent ||
      a->op != b->op || !equal(a->target, b->target) || !equal(a->value, b->value) ||
      a->body.size() != b->body.size())
    return false;
  for (size_t i = 0; i < a->body.size(); ++i)
    if (!equal(a->body[i], b->body[i])) return false;
  return true;
}

}  // namespace hectorgen::inter
