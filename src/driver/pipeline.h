// The pipeline as data: the named passes, in order, over the phases a model generates code for
// (forward; with training, the training forward and the backward). pipeline.cpp lists them in one function.
// Nothing here reads or writes files: compile() fills an OutputSet, the driver writes it.
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "diag/diagnostics.h"
#include "driver/driver.h"
#include "ir/inter/ir.h"
#include "support/output.h"

namespace hectorgen::driver {

// One program of the generated code: "forward" (inference), "forward_train" and "backward" (training).
struct Phase {
  std::string name;
  inter::Module module;
};

// The passes, in pipeline order: parse, inline-functions, typecheck, reorder-linear, hoist-node-transforms,
// compact-materialization, autodiff, fuse-loops, lower, recompute-gemms. The valid values of --print-ir-after (besides "all") and --run-pass.
const std::vector<std::string>& pass_names();
bool is_pass_name(const std::string& name);

// parse, inline-functions, typecheck: the typed module, ready for the passes (and the reference interpreter).
// The IR after each goes to `log` when opts.print_ir_after names it.
std::optional<inter::Module> frontend(const SourceFile& spec, Diagnostics& diags, const Options& opts,
                                      std::ostream& log);

// Compiles a spec into `files`. Diagnostics and warnings go to `err`, --print-ir-after's IR to `log`.
// Returns the exit code: 0 success, 1 user error, 2 internal error.
int compile(const SourceFile& spec, const Options& opts, OutputSet& files, std::ostream& log, std::ostream& err);

// --run-pass: reads printed inter-operator IR (ir/inter/printer.h), runs the one pass opts.run_pass on it and
// prints the result to `out`: inter IR (typed passes annotate each assignment with its type; autodiff prints
// the training forward and the backward, each after a `# phase NAME` line) or, for lower, the intra IR of
// opts.phase. The passes after inline-functions take the module through typecheck first. recompute-gemms reads
// printed intra IR instead (an .intra.ir file with the phases forward_train and backward) and prints every phase.
int run_pass(const SourceFile& ir, const Options& opts, std::ostream& out, std::ostream& err);

}  // namespace hectorgen::driver
