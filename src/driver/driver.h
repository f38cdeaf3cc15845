// The driver: reads the spec (file -> SourceFile), compiles it (pipeline.h: SourceFile -> OutputSet, no I/O)
// and writes the result (OutputSet -> directory, atomically), three separate steps. main.cpp is a thin CLI
// over run().
#pragma once

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "diag/diagnostics.h"
#include "diag/source.h"
#include "ir/inter/verifier.h"
#include "support/output.h"

namespace hectorgen::driver {

struct Options {
  std::string spec_path;
  std::string out_dir;           // empty or "-": print the emitted files to stdout
  std::string emit = "all";      // all | inter-ir | intra-ir
  std::string print_ir_after;    // a pass name (pipeline.h pass_names()), or "all"
  std::string run_pass;          // a pass name: run only it on printed inter IR (pipeline.h run_pass)
  std::string phase = "forward"; // for --run-pass=lower and fuse-loops: the phase the module is
  std::string reorder;           // --reorder=on|off|auto: overrides the spec's options.reorder (empty: the spec's)
  std::string materialization;   // --materialization=vanilla|compact|auto: overrides the spec's options.materialization
  std::string recompute;         // --recompute=auto|on|off: overrides the spec's options.recompute (empty: the spec's)
  std::vector<std::string> unified_inputs;  // --unified-inputs: inputs given 'placement: unified'
  std::vector<std::string> indexed_inputs;  // --indexed-inputs: inputs given 'rows: indexed'
  std::string reference_dir;     // run the float64 CPU reference on tensors in this directory
  bool verbose = false;
  bool verify_each = inter::kVerifyEachPassByDefault;  // verify the IR after every pass (debug builds: on)
};

// Reads a file into a SourceFile; on failure reports to `err` and returns nullopt.
std::optional<SourceFile> read_source(const std::string& path, std::ostream& err);

// Writes the compiled files into opts.out_dir (or prints them to `out` when it is empty or "-").
// Returns the exit code.
int write_outputs(const OutputSet& files, const Options& opts, std::ostream& out, std::ostream& err);

// Runs the compiler: read, compile, write. Returns the process exit code: 0 success, 1 user error
// (diagnostics rendered to `err`), 2 internal error.
int run(const Options& opts, std::ostream& out, std::ostream& err);

}  // namespace hectorgen::driver
