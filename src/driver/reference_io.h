// Runs the float64 CPU reference interpreter on tensors exchanged through a directory, so any language
// (the Python GPU checks) can use it as the oracle:
//   DIR/meta.json   {"num_nodes": N, "num_ntypes": T, "num_etypes": R,
//                    "src": [...], "dst": [...], "etype": [...], "ntype": [...],
//                    "tensors": {"feature": {"shape": [N, 64], "file": "feature.f64"}, ...}}
//   DIR/<file>      raw little-endian float64, row-major
// Writes DIR/out/meta.json {"outputs": {"h": {"shape": [...], "file": "h.f64"}}} and the .f64 files.
#pragma once

#include <string>

#include "ir/inter/ir.h"

namespace hectorgen::driver {

// Returns an error message, empty on success.
std::string run_reference(const inter::Module& m, const std::string& dir);

}  // namespace hectorgen::driver
