#include "diag/diagnostics.h"

#include <fmt/format.h>

#include <ostream>

namespace hectorgen {

// Positions past the end of a line or file (errors at end of input) point just past its last character.
static SourceLoc clamp(SourceLoc loc) {
  if (!loc.valid()) return loc;
  int lines = loc.file->line_count();
  if (loc.line > lines) {
    loc.line = lines;
    loc.col = static_cast<int>(loc.file->line(lines).size()) + 1;
  }
  int width = static_cast<int>(loc.file->line(loc.line).size()) + 1;
  if (loc.col > width) loc.col = width;
  if (loc.col < 1) loc.col = 1;
  return loc;
}

void Diagnostics::error(SourceLoc loc, std::string kind, std::string message) {
  loc = clamp(loc);
  // The same error at the same place (e.g. from a function inlined twice) is reported once.
  for (const auto& d : diags_)
    if (d.severity == Severity::Error && d.loc.file == loc.file && d.loc.line == loc.line && d.loc.col == loc.col &&
        d.message == message)
      return;
  ++error_count_;
  if (error_count_ > kMaxErrors) return;
  diags_.push_back({Severity::Error, loc, std::move(message), std::move(kind)});
}

void Diagnostics::warning(SourceLoc loc, std::string kind, std::string message) {
  loc = clamp(loc);
  diags_.push_back({Severity::Warning, loc, std::move(message), std::move(kind)});
}

void Diagnostics::note(SourceLoc loc, std::string message) {
  diags_.push_back({Severity::Note, loc, std::move(message), {}});
}

static const char* severity_name(Severity s) {
  switch (s) {
    case Severity::Error: return "error";
    case Severity::Warning: return "warning";
    case Severity::Note: return "note";
  }
  return "error";
}

std::string Diagnostics::format(const Diagnostic& d) {
  std::string out;
  if (d.loc.valid())
    out = fmt::format("{}:{}:{}: ", d.loc.file->path(), d.loc.line, d.loc.col);
  else if (d.loc.file)
    out = fmt::format("{}: ", d.loc.file->path());
  else
    out = "hectorgen: ";
  out += fmt::format("{}: {}", severity_name(d.severity), d.message);
  if (!d.kind.empty()) out += fmt::format(" [{}]", d.kind);
  out += '\n';
  if (d.loc.valid()) {
    std::string_view text = d.loc.file->line(d.loc.line);
    std::string gutter = fmt::format("{:>5} | ", d.loc.line);
    out += gutter;
    out += text;
    out += '\n';
    // The caret line keeps tabs so the caret lines up under the same character.
    std::string pad(gutter.size() - 2, ' ');
    pad += "| ";
    for (int i = 1; i < d.loc.col && i - 1 < static_cast<int>(text.size()); ++i)
      pad += text[i - 1] == '\t' ? '\t' : ' ';
    out += pad + "^\n";
  }
  return out;
}

void Diagnostics::render(std::ostream& out) const {
  for (const auto& d : diags_) out << format(d);
  if (error_count_ > kMaxErrors)
    out << fmt::format("hectorgen: note: {} more errors not shown\n", error_count_ - kMaxErrors);
}

}  // namespace hectorgen
