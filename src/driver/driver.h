// The pipeline as one readable function: load the spec, parse the DSL, inline, verify, run the passes,
// lower and emit. main.cpp is a thin CLI over this.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>

#include "diag/diagnostics.h"
#include "driver/output.h"
#include "ir/inter/ir.h"
#include "ir/inter/verifier.h"

namespace hectorgen::driver {

struct Options {
  std::string spec_path;
  std::string out_dir;           // empty or "-": print the single emitted file to stdout
  std::string emit = "all";      // all | inter-ir | intra-ir
  std::string print_ir_after;    // a pass name, or "all"
  std::string reference_dir;     // run the float64 CPU reference on tensors in this directory
  bool verbose = false;
  bool verify_each = inter::kVerifyEachPassByDefault;  // verify the IR after every pass (debug builds: on)
};

// Known pass names for --print-ir-after, in pipeline order.
const std::vector<std::string>& pass_names();

// Parses and verifies a spec; returns the inlined module ready for lowering.
std::optional<inter::Module> frontend(const SourceFile& spec, Diagnostics& diags, const Options& opts,
                                      std::ostream& log);

// Runs the compiler. Returns the process exit code: 0 success, 1 user error (diagnostics rendered to
// `err`), 2 internal error.
int run(const Options& opts, std::ostream& out, std::ostream& err);

}  // namespace hectorgen::driver
