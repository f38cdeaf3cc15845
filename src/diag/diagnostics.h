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
#include <string_view>
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
  // The message as one printable line: control bytes (CR, LF, ESC, NUL, DEL, ...), C1 controls and
  // bytes that are not valid UTF-8 become \n, \t, \r or \xNN; valid UTF-8 stays as it is.
  static std::string escape_message(std::string_view message);
  // A source line for quoting: the same bytes become '?' (one per byte, so columns still line up).
  static std::string printable_source_line(std::string_view line);

  // Errors past this many are counted but not stored (one bad line can cascade).
  static constexpr int kMaxErrors = 20;

 private:
  std::vector<Diagnostic> diags_;
  int error_count_ = 0;
};

}  // namespace hectorgen
