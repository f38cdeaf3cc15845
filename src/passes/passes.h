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

#include <optional>

#include "ir/inter/verifier.h"
#include "ir/intra/intra.h"

namespace hectorgen::passes {

// Lowers a verified module to kernels, greedily by preference: linear transforms become GEMM instances
// (fusing a following per-row scale and scatter-aggregation into the GEMM when the statement has that
// shape), the remaining statements of each loop nest become one traversal instance (split only where a
// GEMM needs a value the loop computes). Locals used inside one instance stay in registers.
// `phase` (forward | forward_train | backward) names the kernels: <model>_fw_*, <model>_fwt_*, <model>_bw_*.
std::optional<intra::Program> lower(const inter::Module& m, const inter::Analysis& a, Diagnostics& diags,
                                    const std::string& phase = "forward");

// Canonicalises loops with the graph-semantic rule (an edge loop is a loop over the destination nodes'
// incoming edges) and fuses adjacent loop nests when no element reads what another element of the
// same loop writes. Returns the rewritten module (verified by the caller).
inter::Module fuse_loops(const inter::Module& m);

}  // namespace hectorgen::passes

namespace hectorgen::passes {

// Autodiff at the inter-operator level (thesis: "Backward Propagation").
//   forward   the training forward: locals become fields (so the backward can read them) and every field
//             is in SSA form (a re-assigned field gets a new version `f$k`; the last keeps the name);
//   backward  reads the forward's saved fields as inputs (`e.att`) and the output gradients (`n.d$h`),
//             accumulates gradient fields `d$f`, and writes the gradients of node/edge inputs (`d$feature`)
//             and of weights (`d$W[e.etype] += ...`). Gradients of inputs marked requires_grad: false are
//             never computed; statements whose target gets no gradient are dropped.
//             Derived names carry the sigil '$' (ir/inter/names.h): they cannot collide with user names.
struct TrainingModules {
  inter::Module forward;
  inter::Module backward;
  std::vector<std::string> saved;  // forward fields the backward reads (its extra inputs)
};
std::optional<TrainingModules> autodiff(const inter::Module& m, Diagnostics& diags);

}  // namespace hectorgen::passes
