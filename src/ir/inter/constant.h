// Compile-time constants: hyper-parameters, declared shapes, and the constant arguments of operators
// (reshape's dimensions, leakyrelu's slope) are arithmetic over numbers and earlier hyper-parameters.
#pragma once

#include <optional>

#include "diag/diagnostics.h"
#include "ir/inter/ir.h"

namespace hectorgen::inter {

// Evaluates a constant expression over already-evaluated hyper-parameters: numbers, hyper-parameters,
// + - * /, unary minus and sqrt. Reports and returns nullopt on unknown names, non-constant constructs,
// division by zero and the square root of a negative number.
std::optional<double> eval_constant(const ExprP& e, const ModelDecl& decl, Diagnostics& diags);

// Evaluates hyper-parameters in order and every declared shape. Returns false on error.
bool evaluate_declarations(ModelDecl& decl, Diagnostics& diags);

}  // namespace hectorgen::inter
