#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "ir/inter/names.h"
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

  // `depth`: how many loops enclose `body` at its final place (after inlining).
  std::vector<StmtP> block(const std::vector<StmtP>& body, const Bindings& b, int depth = 0) {
    std::vector<StmtP> out;
    auto renamed = [&](const std::string& n) {
      auto it = b.find(n);
      return it != b.end() && it->second->kind == ExprKind::Name ? it->second->name : n;
    };
    for (const StmtP& s : body) {
      switch (s->kind) {
        case StmtKind::For:
          out.push_back(Stmt::for_loop(renamed(s->var), s->loop, renamed(s->parent), block(s->body, b, depth + 1), s->loc));
          break;
        case StmtKind::Assign:
          out.push_back(Stmt::assign(subst(s->target, b), s->op, subst(s->value, b), s->loc));
          break;
        case StmtKind::Call: {
          const FuncDef* f = find(s->value->name);
          if (!f) {
            out.push_back(s);  // not a user function: the verifier reports it
            break;
          }
          expand(*f, *s, b, depth, out);
          break;
        }
      }
    }
    return out;
  }

 private:
  // Locals assigned and loop variables bound in a body (calls inside are renamed when they are expanded).
  static void collect_defined(const std::vector<StmtP>& body, std::set<std::string>& out) {
    for (const StmtP& s : body) {
      if (s->kind == StmtKind::For) {
        out.insert(s->var);
        collect_defined(s->body, out);
      } else if (s->kind == StmtKind::Assign && s->target->kind == ExprKind::Name) {
        out.insert(s->target->name);
      }
    }
  }

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

  void expand(const FuncDef& f, const Stmt& call, const Bindings& outer, int depth, std::vector<StmtP>& out) {
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
    // Hygiene: inside a loop of the caller, the function's locals and loop variables get names of their own
    // (x$1), so they neither capture nor clobber the caller's. At the top level its loops are scopes of their own.
    if (depth > 0) {
      int k = ++renamings_;
      std::set<std::string> own;
      collect_defined(f.body, own);
      for (const std::string& n : own)
        if (!b.count(n)) b[n] = Expr::name_ref(derived_name(n, std::to_string(k)));
    }
    active_.push_back(f.name);
    for (StmtP& s : block(f.body, b, depth)) out.push_back(std::move(s));
    active_.pop_back();
  }

  const Module& m_;
  Diagnostics& d_;
  std::vector<std::string> active_;  // the chain of calls being expanded
  std::map<std::string, const FuncDef*> by_name_;
  size_t expansions_ = 0;
  int renamings_ = 0;
};

}  // namespace

Module inline_functions(const Module& m, Diagnostics& diags) {
  std::set<std::string> names;
  for (const FuncDef& f : m.functions) {
    if (!names.insert(f.name).second)
      diags.error(f.loc, "duplicate-name", fmt::format("function '{}' is defined twice", f.name));
    if (call_op(f.name))
      diags.error(f.loc, "duplicate-name", fmt::format("function '{}' has the name of a built-in", f.name));
    if (std::string why = reserved_name_reason(f.name); !why.empty())
      diags.error(f.loc, "reserved-name", fmt::format("function '{}' {}", f.name, why));
    for (const auto& p : f.params)
      if (std::string why = reserved_name_reason(p); !why.empty())
        diags.error(f.loc, "reserved-name", fmt::format("parameter '{}' of '{}' {}", p, f.name, why));
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
