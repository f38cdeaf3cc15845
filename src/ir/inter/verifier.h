// The verifier of the inter-operator IR: type inference plus the legality checks.
//
// typecheck() walks a module whose functions have been inlined, in program order, once. It gives every
// expression its Type (typing.h: domain, shape, dtype; what references denote) and every assignment the
// type of what it stores, fills the module's field tables, and rejects what the code generator could not
// give a meaning to: undefined names, unknown functions, shape mismatches (the operator table's rules),
// wrong weight indexing, edge values used in node loops without aggregation, fields read before they are
// written, writes to outputs whose shape differs from the declaration.
//
// verify() re-checks a typed module after a pass (in tests, debug builds and with --verify-each): the
// legality checks again, and that every node carries the type inference gives it (passes keep types valid
// with the Mutator and the typed builders; a difference is a compiler bug, reported as an internal error).
#pragma once

#include <optional>

#include "diag/diagnostics.h"
#include "ir/inter/ir.h"

namespace hectorgen::inter {

// Type inference and legality checks. Returns the typed module, or nullopt after reporting errors.
// Nodes that already carry the inferred type are kept (pointer identity), so typechecking a typed module
// rebuilds nothing.
std::optional<Module> typecheck(const Module& m, Diagnostics& diags);

// For a typed module: true when it passes typecheck and every node carries the type typecheck infers
// (field tables included). Errors are reported to `diags`; warnings, already given once, are not.
bool verify(const Module& m, Diagnostics& diags);

// True in debug builds (NDEBUG not defined): the driver verifies the IR after every pass.
#ifdef NDEBUG
inline constexpr bool kVerifyEachPassByDefault = false;
#else
inline constexpr bool kVerifyEachPassByDefault = true;
#endif

}  // namespace hectorgen::inter
