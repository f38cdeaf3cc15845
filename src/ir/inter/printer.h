// Prints the inter-operator IR as text that dsl::parse_module reads back to the same IR: a declaration
// header, `program:`, then the program in canonical DSL form. Optional per-statement annotations (e.g.
// inferred domain and shape) are printed as trailing comments, which the parser ignores.
#pragma once

#include <functional>
#include <string>

#include "ir/inter/ir.h"

namespace hectorgen::inter {

using Annotator = std::function<std::string(const Stmt&)>;

std::string print_expr(const ExprP& e);
std::string print_module(const Module& m, const Annotator& annotate = nullptr);

// One statement (a loop nest with its body) in DSL form, each line starting with `prefix`.
std::string print_stmt(const StmtP& s, const std::string& prefix = "");

}  // namespace hectorgen::inter
