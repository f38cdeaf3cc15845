// Passes over the inter-operator IR. Each pass is a function Module -> Module that reports user errors
// to Diagnostics. The pipeline (pipeline.cpp) lists them in order.
#pragma once

#include "diag/diagnostics.h"
#include "ir/inter/ir.h"

namespace hectorgen::passes {

// Replaces every call statement of a user-defined function (e.g. edge_softmax(g, "att")) with its body,
// substituting the arguments for the parameters. The graph parameter must be passed `g`; the others
// are string literals (field names) or constants. Functions are removed from the module afterwards.
inter::Module inline_functions(const inter::Module& m, Diagnostics& diags);

}  // namespace hectorgen::passes
