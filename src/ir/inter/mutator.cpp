#include "ir/inter/mutator.h"

namespace hectorgen::inter {

// ---- Visitor -------------------------------------------------------------------------------------------------
void Visitor::visit(const ExprP& e) {
  switch (e->kind) {
    case ExprKind::Number: return visit_number(e);
    case ExprKind::String: return visit_string(e);
    case ExprKind::Name: return visit_name(e);
    case ExprKind::Attr: return visit_attr(e);
    case ExprKind::Index: return visit_index(e);
    case ExprKind::Call: return visit_call(e);
    case ExprKind::Binary: return visit_binary(e);
    case ExprKind::Neg: return visit_neg(e);
  }
}

void Visitor::visit(const StmtP& s) {
  switch (s->kind) {
    case StmtKind::For: return visit_for(s);
    case StmtKind::Assign: return visit_assign(s);
    case StmtKind::Call: return visit_call_stmt(s);
  }
}

void Visitor::visit(const std::vector<StmtP>& body) {
  for (const StmtP& s : body) visit(s);
}

void Visitor::visit_assign(const StmtP& s) {
  visit(s->target);
  visit(s->value);
}

void Visitor::visit_children(const ExprP& e) {
  for (const ExprP& a : e->args) visit(a);
}

// ---- Mutator -------------------------------------------------------------------------------------------------
ExprP Mutator::mutate(const ExprP& e) {
  switch (e->kind) {
    case ExprKind::Number: return visit_number(e);
    case ExprKind::String: return visit_string(e);
    case ExprKind::Name: return visit_name(e);
    case ExprKind::Attr: return visit_attr(e);
    case ExprKind::Index: return visit_index(e);
    case ExprKind::Call: return visit_call(e);
    case ExprKind::Binary: return visit_binary(e);
    case ExprKind::Neg: return visit_neg(e);
  }
  return e;
}

StmtP Mutator::mutate(const StmtP& s) {
  switch (s->kind) {
    case StmtKind::For: return visit_for(s);
    case StmtKind::Assign: return visit_assign(s);
    case StmtKind::Call: return visit_call_stmt(s);
  }
  return s;
}

std::vector<StmtP> Mutator::mutate(const std::vector<StmtP>& body) {
  std::vector<StmtP> out;
  out.reserve(body.size());
  for (const StmtP& s : body)
    if (StmtP m = mutate(s)) out.push_back(std::move(m));
  return out;
}

ExprP Mutator::mutate_children(const ExprP& e) {
  std::vector<ExprP> args;
  args.reserve(e->args.size());
  for (const ExprP& a : e->args) args.push_back(mutate(a));
  return typed::rebuild(e, std::move(args), ctx_);
}

ExprP Mutator::visit_name(const ExprP& e) {
  if (const Type* b = binding(e->name); b && *b != e->type) return typed::with_type(e, *b);
  return e;
}

StmtP Mutator::visit_for(const StmtP& s) {
  push_scope();
  bind(s->var, Type::loop_var(s->loop));
  std::vector<StmtP> body = mutate(s->body);
  pop_scope();
  if (body == s->body) return s;
  return Stmt::for_loop(s->var, s->loop, s->parent, std::move(body), s->loc);
}

ExprP Mutator::mutate_target(const ExprP& t) {
  if (t->kind != ExprKind::Index) return t;
  std::vector<ExprP> args{mutate(t->args[0]), mutate(t->args[1])};
  if (args == t->args) return t;
  auto c = std::make_shared<Expr>(*t);
  c->args = std::move(args);
  return c;
}

StmtP Mutator::visit_assign(const StmtP& s) {
  ExprP value = mutate(s->value);
  ExprP target = mutate_target(s->target);
  bool local = target->kind == ExprKind::Name && !weight_grad_output(*ctx_.decl, target->name);
  const Type* current = local && s->op != AssignOp::Set ? binding(target->name) : nullptr;
  Type stored = stored_type(*target, s->op, value->type, ctx_, current, &s->target->type);
  if (local) {
    if (s->op == AssignOp::Set) bind(target->name, stored);
    else rebind(target->name, stored);
  }
  target = typed::with_type(target, std::move(stored));
  if (target == s->target && value == s->value) return s;
  return Stmt::assign(std::move(target), s->op, std::move(value), s->loc);
}

StmtP Mutator::visit_call_stmt(const StmtP& s) {
  ExprP value = mutate(s->value);
  if (value == s->value) return s;
  return Stmt::call(std::move(value), s->loc);
}

const Type* Mutator::binding(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
    if (auto f = it->find(name); f != it->end()) return &f->second;
  return nullptr;
}

void Mutator::bind(const std::string& name, Type t) {
  if (scopes_.empty()) push_scope();
  scopes_.back()[name] = std::move(t);
}

void Mutator::rebind(const std::string& name, Type t) {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
    if (auto f = it->find(name); f != it->end()) {
      f->second = std::move(t);
      return;
    }
  bind(name, std::move(t));
}

}  // namespace hectorgen::inter
