#include "passes/rewrite.h"

#include <fmt/format.h>

#include <set>
#include <sstream>
#include <stdexcept>

#include "ir/inter/printer.h"
#include "ir/inter/verifier.h"

namespace hectorgen::passes {

using namespace inter;

bool is_field(const ExprP& e) { return e->kind == ExprKind::Index && e->args[1]->kind == ExprKind::String; }

void written_fields(const std::vector<StmtP>& body, std::set<std::string>& out) {
  for (const StmtP& s : body) {
    if (s->kind == StmtKind::For) written_fields(s->body, out);
    else if (s->kind == StmtKind::Assign && is_field(s->target)) out.insert(s->target->args[1]->name);
  }
}

ExprP untyped_copy(const ExprP& e, const std::function<ExprP(const ExprP&)>& replace) {
  if (replace)
    if (ExprP r = replace(e)) return r;
  auto c = std::make_shared<Expr>(*e);
  c->type = Type{};
  for (ExprP& a : c->args) a = untyped_copy(a, replace);
  return c;
}

StmtP bind_placeholder(const StmtP& def, const std::string& placeholder, const std::string& var) {
  auto rename = [&](const ExprP& e) -> ExprP {
    if (e->kind == ExprKind::Name && e->name == placeholder) return Expr::name_ref(var, e->loc);
    return nullptr;
  };
  return Stmt::assign(untyped_copy(def->target, rename), def->op, untyped_copy(def->value, rename), def->loc);
}

std::string free_loop_var(const Module& m, const std::string& base) {
  std::set<std::string> declared{m.decl.name};
  for (const HyperParam& h : m.decl.hyper) declared.insert(h.name);
  for (const auto* list : {&m.decl.inputs, &m.decl.weights, &m.decl.outputs})
    for (const TensorDecl& t : *list) declared.insert(t.name);
  std::string v = base;
  for (int k = 2; declared.count(v); ++k) v = fmt::format("{}_{}", base, k);
  return v;
}

Module retype(Module out, const std::string& pass) {
  out.node_fields.clear();
  out.edge_fields.clear();
  out.pair_fields.clear();
  Diagnostics d;
  std::optional<Module> typed = typecheck(out, d);
  if (!typed) {
    std::ostringstream s;
    d.render(s);
    throw std::logic_error(pass + ": the rewritten module does not typecheck:\n" + s.str() + print_module(out));
  }
  return std::move(*typed);
}

}  // namespace hectorgen::passes
