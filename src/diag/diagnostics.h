// One diagnostics engine for every stage: spec loading, DSL lexing/parsing, verification, emission.
//
//   specs/rgat.yaml:12:7: error: unknown edge type 'writes' [unknown-etype]
//      12 |     hs = e.src.feature * W[e.writes]
//         |                            ^
//
// Stages report into the engine and return; the driver decides the exit code (user errors: 1).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "diag/source.h"

namespace hectorgen {

enum class Severity { Error, Warning, Note };

struct Diagnostic {
  Severity severity = Severity::Error;
  SourceLoc loc;
  std::string message;
  std::string kind;  // short machine-readable name, e.g. "unknown-key"
};

class Diagnostics {
 public:
  void error(SourceLoc loc, std::string kind, std::string message);
  void warning(SourceLoc loc, std::string kind, std::string message);
  void note(SourceLoc loc, std::string message);

  bool has_errors() const { return error_count_ > 0; }
  int error_count() const { return error_count_; }
  const std::vector<Diagnostic>& all() const { return diags_; }

  // Renders every diagnostic in report order, clang style, to `out`.
  void render(std::ostream& out) const;
  static std::string format(const Diagnostic& d);

  // Errors past this many are counted but not stored (one bad line can cascade).
  static constexpr int kMaxErrors = 20;

 private:
  std::vector<Diagnostic> diags_;
  int error_count_ = 0;
};

}  // namespace hectorgen
