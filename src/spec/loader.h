// Loads a model spec (YAML or JSON, one schema) into the inter-operator IR's declarations and program.
// Every schema error points at the offending key or value; the DSL program keeps its real file positions.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "diag/diagnostics.h"
#include "dsl/lexer.h"
#include "ir/inter/ir.h"

namespace hectorgen::spec {

enum class Format { Yaml, Json };

// Picks the format from the extension (.json / .yaml / .yml), else from the content's first character.
Format detect_format(const std::string& path, const std::string& text);

struct LoadedSpec {
  inter::ModelDecl decl;
  dsl::ProgramText program;
};

// Parses `file` and checks the schema. On error reports to `diags` and returns nullopt.
std::optional<LoadedSpec> load_spec(const SourceFile& file, Diagnostics& diags);

// load_spec + parse the program into a Module (not yet verified).
std::optional<inter::Module> load_module(const SourceFile& file, Diagnostics& diags);

}  // namespace hectorgen::spec
