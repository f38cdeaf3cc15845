// Parser of the intra-operator IR's text form (the output of print_traversal / print_program): print,
// parse and print again gives the same bytes. Errors are positioned diagnostics into `file`
// (`rgat.intra.ir:12:9: error: ... [intra-syntax]`); parsing stops at the first one.
#pragma once

#include <optional>
#include <vector>

#include "diag/diagnostics.h"
#include "ir/intra/intra.h"

namespace hectorgen::intra {

// One program (print_program's output), the whole text of `file`.
std::optional<Program> parse_program(const SourceFile& file, Diagnostics& diags);

// The phases of an .intra.ir file (print_programs' output): each program after its `# ==== <phase> ====`; comment
// lines may precede the first.
std::optional<std::vector<Program>> parse_programs(const SourceFile& file, Diagnostics& diags);

// One traversal instance (its header line and indented body), the whole text of `file`.
std::optional<TraversalInstance> parse_traversal(const SourceFile& file, Diagnostics& diags);

}  // namespace hectorgen::intra
