#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "ir/inter/ops.h"
#include "passes/passes.h"

namespace hectorgen::passes {

using namespace inter;

namespace {

using Bindings = std::map<std::string, ExprP>;

ExprP subst(const ExprP& e, const Bindings& b) {
  if (e->kind == ExprKind::Name) {
    auto it = b.find(e->name);
    return it == b.end() ? e : it->second;
  }
  if (e->args.empty()) return e;
  std::vector<ExprP> args;
  bool changed = false;
  for (const ExprP& a : e->args) {
    args.push_back(subst(a, b));
    changed |= args.back() != a;
  }
  if (!changed) return e;
  auto copy = std::make_shared<Expr>(*e);
  copy->args = std::move(args);
  return copy;
}

class Inliner {
 public:
  Inliner(const Module& m, Diagnostics& d) : m_(m), d_(d) {}

  std::vector<StmtP> block(const std::vector<StmtP>& body, const Bindings& b) {
    std::vector<StmtP> out;
    for (const StmtP& s : body) {
      switch (s->kind) {
        case StmtKind::For: {
          std::string parent = s->parent;
          if (auto it = b.find(parent); it != b.end() && it->second->kind == ExprKind::Name) parent = it->second->name;
          out.push_back(Stmt::for_loop(s->var, s->loop, parent, block(s->body, b), s->loc));
          break;
        }
        case StmtKind::Assign:
          out.push_back(Stmt::assign(subst(s->target, b), s->op, subst(s->value, b), s->loc));
          break;
        case StmtKind::Call: {
          const FuncDef* f = find(s->value->name);
          if (!f) {
            out.push_back(s);  // not a user function: the verifier reports it
            break;
          }
          expand(*f, *s, b, out);
          break;
        }
      }
    }
    return out;
  }

 private:
  const FuncDef* find(const std::string& n) {
    if (by_name_.empty())
      for (const FuncDef& f : m_.functions) by_name_.emplace(f.name, &f);  // the first definition wins
    auto it = by_name_.find(n);
    return it == by_name_.end() ? nullptr : it->second;
  }

  // Calls nested deeper than this, or more expansions than that in all, are reported (the recursion
  // here and the size of the inlined program stay bounded).
  static constexpr size_t kMaxDepth = 64;
  static constexpr size_t kMaxExpansions = 10000;

  void expand(const FuncDef& f, const Stmt& call, const Bindings& outer, std::vector<StmtP>& out) {
    const ExprP& c = call.value;
    if (c->args.size() != f.params.size()) {
      d_.error(c->loc, "wrong-arguments", fmt::format("'{}' takes {} argument{}, got {}", f.name, f.params.size(),
                                                      f.params.size() == 1 ? "" : "s", c->args.size()));
      return;
    }
    if (std::find(active_.begin(), active_.end(), f.name) != active_.end()) {
      d_.error(c->loc, "recursion", fmt::format("'{}' calls itself; recursion is not supported", f.name));
      return;
    }
    if (active_.size() >= kMaxDepth) {
      d_.error(c->loc, "too-deep", fmt::format("function calls nested too deeply (more than {} levels) at this call of '{}'",
                                               kMaxDepth, f.name));
      return;
    }
    if (++expansions_ > kMaxExpansions) {
      if (expansions_ == kMaxExpansions + 1)
        d_.error(c->loc, "too-large", fmt::format("too many function calls to inline (more than {} in all)", kMaxExpansions));
      return;
    }
    Bindings b;
    for (size_t i = 0; i < f.params.size(); ++i) {
      ExprP arg = subst(c->args[i], outer);
      bool ok = arg->kind == ExprKind::String || arg->kind == ExprKind::Number ||
                (arg->kind == ExprKind::Name && arg->name == "g") ||
                (arg->kind == ExprKind::Neg && arg->args[0]->kind == ExprKind::Number);
      if (!ok) {
        d_.error(arg->loc, "bad-argument",
                 fmt::format("argument '{}' of '{}' must be the graph g, a string (field name) or a number", f.params[i], f.name));
        return;
      }
      b[f.params[i]] = arg;
    }
    active_.push_back(f.name);
    for (StmtP& s : block(f.body, b)) out.push_back(std::move(s));
    active_.pop_back();
  }

  const Module& m_;
  Diagnostics& d_;
  std::vector<std::string> active_;  // the chain of calls being expanded
  std::map<std::string, const FuncDef*> by_name_;
  size_t expansions_ = 0;
};

}  // namespace

Module inline_functions(const Module& m, Diagnostics& diags) {
  std::set<std::string> names;
  for (const FuncDef& f : m.functions) {
    if (!names.insert(f.name).second)
      diags.error(f.loc, "duplicate-name", fmt::format("function '{}' is defined twice", f.name));
    if (call_op(f.name))
      diags.error(f.loc, "duplicate-name", fmt::format("function '{}' has the name of a built-in", f.name));
    std::set<std::string> params;
    for (const auto& p : f.params)
      if (!params.insert(p).second)
        diags.error(f.loc, "duplicate-name", fmt::format("parameter '{}' of '{}' appears twice", p, f.name));
  }
  Module out;
  out.decl = m.decl;
  out.body = Inliner(m, diags).block(m.body, {});
  return out;
}

}  // namespace hectorgen::passes
