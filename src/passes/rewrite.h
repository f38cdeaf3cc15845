// Helpers of the passes that rewrite a typed module into untyped statements and let type inference type the result
// again (hoist-node-transforms, compact-materialization): copies without types, a new loop's variable bound to a
// placeholder, a loop variable no declaration shadows, and the final typecheck.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "ir/inter/ir.h"

namespace hectorgen::passes {

// x["f"]: a field access (its base an element, its key a string).
bool is_field(const inter::ExprP& e);

// The fields a loop nest writes, added to `out`.
void written_fields(const std::vector<inter::StmtP>& body, std::set<std::string>& out);

// A copy of `e` without types, with every node for which `replace` returns an expression replaced by it.
inter::ExprP untyped_copy(const inter::ExprP& e, const std::function<inter::ExprP(const inter::ExprP&)>& replace = {});

// `def` (an assignment) with the placeholder name `placeholder` (e.g. "$node") renamed to `var`, untyped.
inter::StmtP bind_placeholder(const inter::StmtP& def, const std::string& placeholder, const std::string& var);

// `base` ("n", "p"), or base_2, base_3, ... when a declaration, a hyper-parameter or the model has that name (a loop
// variable would shadow it).
std::string free_loop_var(const inter::Module& m, const std::string& base);

// The rewritten module `out` typed again (its field tables rebuilt by inference); a module that does not typecheck
// is a bug of `pass`: std::logic_error with the diagnostics and the module.
inter::Module retype(inter::Module out, const std::string& pass);

}  // namespace hectorgen::passes
