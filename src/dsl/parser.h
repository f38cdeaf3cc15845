// Parser of the inter-operator DSL. Two entry points share one grammar:
//  - parse_program: the `program` of a spec (function definitions and statements);
//  - parse_module:  the printed IR (a declaration header, then `program:` and the statements), so that
//                   print -> parse -> print is the identity.
// Errors are reported to Diagnostics; the parser recovers at the next line and keeps going.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "diag/diagnostics.h"
#include "dsl/lexer.h"
#include "ir/inter/ir.h"

namespace hectorgen::dsl {

// Parses the program into `module` (functions and body). Returns false if any error was reported.
// `names`: Compiler for printed IR (derived names with '$' allowed).
bool parse_program(const ProgramText& program, inter::Module& module, Diagnostics& diags, NameSpace names = NameSpace::User);

// Parses a whole printed module (header + program). Hyper-parameters and shapes are evaluated.
std::optional<inter::Module> parse_module(const ProgramText& text, Diagnostics& diags);

// Parses one expression (used for hyper-parameter values and shape entries inside the spec).
inter::ExprP parse_expression(const ProgramText& text, Diagnostics& diags);

// The keywords of the language (for, in, def, if, else, while, return, lambda): no name can be one.
bool is_language_keyword(std::string_view word);

// Why a hyper-parameter or weight, which the program names bare, cannot have `name` ("" if it can): a keyword,
// or g (the graph).
std::string bare_name_reason(std::string_view name);

}  // namespace hectorgen::dsl
