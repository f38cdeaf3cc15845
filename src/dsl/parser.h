// Parser of the inter-operator DSL. Two entry points share one grammar:
//  - parse_program: the `program` of a spec (function definitions and statements);
//  - parse_module:  the printed IR (a declaration header, then `program:` and the statements), so that
//                   print -> parse -> print is the identity.
// Errors are reported to Diagnostics; the parser recovers at the next line and keeps going.
#pragma once

#include <optional>

#include "diag/diagnostics.h"
#include "dsl/lexer.h"
#include "ir/inter/ir.h"

namespace hectorgen::dsl {

// Parses the program into `module` (functions and body). Returns false if any error was reported.
bool parse_program(const ProgramText& program, inter::Module& module, Diagnostics& diags);

// Parses a whole printed module (header + program). Hyper-parameters and shapes are evaluated.
std::optional<inter::Module> parse_module(const ProgramText& text, Diagnostics& diags);

// Parses one expression (used for hyper-parameter values and shape entries inside the spec).
inter::ExprP parse_expression(const ProgramText& text, Diagnostics& diags);

}  // namespace hectorgen::dsl
