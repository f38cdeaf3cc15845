// Runs the float64 CPU reference interpreter on tensors exchanged through a directory, so any language
// (the Python GPU checks) can use it as the oracle:
//   DIR/meta.json   {"num_nodes": N, "num_ntypes": T, "num_etypes": R,
//                    "src": [...], "dst": [...], "etype": [...], "ntype": [...],
//                    "tensors": {"feature": {"shape": [N, 64], "file": "feature.f64"}, ...}}
//   DIR/<file>      raw little-endian float64, row-major
// Writes DIR/out/meta.json {"outputs": {"h": {"shape": [...], "file": "h.f64"}}} and the .f64 files.
//
// Gradients: with "output_grads": {"h": {"shape": [N, ...], "file": "d_h.f64"}} in DIR/meta.json (an output left
// out gets zeros), the backward program that autodiff() derives is run too, on the saved fields of the training
// forward and those output gradients, and DIR/out/meta.json also lists
//   "gradients": {"feature": {"shape": [...], "file": "grad/feature.f64"}, "W": {...}, ...}
// keyed by the forward's input and weight names (inputs with requires_grad and not from_graph, then weights
// with requires_grad). A model autodiff() cannot differentiate is an error ("no backward pass: ...").
#pragma once

#include <string>

#include "ir/inter/ir.h"

namespace hectorgen::driver {

// Returns an error message, empty on success.
std::string run_reference(const inter::Module& m, const std::string& dir);

}  // namespace hectorgen::driver
