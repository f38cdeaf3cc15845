#include "ir/inter/constant.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "ir/inter/ops.h"

namespace hectorgen::inter {

std::optional<double> eval_constant(const ExprP& e, const ModelDecl& decl, Diagnostics& diags) {
  switch (e->kind) {
    case ExprKind::Number: return e->number;
    case ExprKind::Name: {
      if (const HyperParam* h = decl.find_hyper(e->name)) return h->value;
      diags.error(e->loc, "undefined-name", fmt::format("'{}' is not a hyper-parameter defined above", e->name));
      return std::nullopt;
    }
    case ExprKind::Neg: {
      auto x = eval_constant(e->args[0], decl, diags);
      if (!x) return std::nullopt;
      return -*x;
    }
    case ExprKind::Binary: {
      auto a = eval_constant(e->args[0], decl, diags);
      if (!a) return std::nullopt;
      auto b = eval_constant(e->args[1], decl, diags);
      if (!b) return std::nullopt;
      switch (e->op) {
        case BinOp::Add: return *a + *b;
        case BinOp::Sub: return *a - *b;
        case BinOp::Mul: return *a * *b;
        case BinOp::Div:
          if (*b == 0) {
            diags.error(e->loc, "division-by-zero", "division by zero in a constant expression");
            return std::nullopt;
          }
          return *a / *b;
      }
      return std::nullopt;
    }
    case ExprKind::Call:
      if (e->fn == Op::Sqrt && e->args.size() == 1) {
        auto x = eval_constant(e->args[0], decl, diags);
        if (!x) return std::nullopt;
        if (*x < 0) {
          diags.error(e->loc, "bad-value", "sqrt of a negative number");
          return std::nullopt;
        }
        return std::sqrt(*x);
      }
      [[fallthrough]];
    default:
      diags.error(e->loc, "not-constant", "expected a constant expression of numbers and hyper-parameters");
      return std::nullopt;
  }
}

// True when every number in the expression is an integer and it only divides evenly.
static bool is_integer_expr(const ExprP& e, const ModelDecl& decl) {
  switch (e->kind) {
    case ExprKind::Number: return e->is_integer;
    case ExprKind::Name: {
      const HyperParam* h = decl.find_hyper(e->name);
      return h && h->is_integer;
    }
    case ExprKind::Neg: return is_integer_expr(e->args[0], decl);
    case ExprKind::Binary: return is_integer_expr(e->args[0], decl) && is_integer_expr(e->args[1], decl);
    default: return false;
  }
}

bool evaluate_declarations(ModelDecl& decl, Diagnostics& diags) {
  int before = diags.error_count();
  ModelDecl upto;  // the hyper-parameters evaluated so far: only earlier ones are visible
  std::set<std::string> seen;
  for (HyperParam& h : decl.hyper) {
    if (!seen.insert(h.name).second) {
      diags.error(h.loc, "duplicate-name", fmt::format("hyper-parameter '{}' is defined twice", h.name));
      continue;
    }
    auto v = eval_constant(h.expr, upto, diags);
    if (!v) continue;
    h.value = *v;
    h.is_integer = is_integer_expr(h.expr, upto) && std::floor(*v) == *v;
    upto.hyper.push_back(h);
  }
  if (diags.error_count() != before) return false;
  auto eval_shapes = [&](std::vector<TensorDecl>& tensors, const char* what) {
    std::set<std::string> names;
    for (TensorDecl& t : tensors) {
      if (!names.insert(t.name).second)
        diags.error(t.loc, "duplicate-name", fmt::format("{} '{}' is declared twice", what, t.name));
      if (decl.find_hyper(t.name))
        diags.error(t.loc, "duplicate-name", fmt::format("{} '{}' has the name of a hyper-parameter", what, t.name));
      t.shape.clear();
      for (const ExprP& d : t.shape_exprs) {
        auto v = eval_constant(d, decl, diags);
        if (!v) continue;
        if (*v < 1 || std::floor(*v) != *v || *v > (1 << 24)) {
          diags.error(d->loc, "bad-shape", fmt::format("dimension must be a positive integer, got {}", *v));
          continue;
        }
        t.shape.push_back(static_cast<int64_t>(*v));
      }
    }
  };
  eval_shapes(decl.inputs, "input");
  eval_shapes(decl.weights, "weight");
  eval_shapes(decl.outputs, "output");
  for (const TensorDecl& w : decl.weights)
    if (decl.find_input(w.name))
      diags.error(w.loc, "duplicate-name", fmt::format("weight '{}' has the name of an input", w.name));
  return diags.error_count() == before;
}

}  // namespace hectorgen::inter
