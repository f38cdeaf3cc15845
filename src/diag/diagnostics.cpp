#include "diag/diagnostics.h"

#include <fmt/format.h>

#include <algorithm>
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

// Length of the valid UTF-8 sequence starting at s[i] (2-4 bytes), or 0 when there is none.
static size_t utf8_length(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
  if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f) || (c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 > 0x8f))
    return 0;  // overlong, surrogate or past U+10FFFF
  return n;
}

// True for U+0080..U+009F (C1 controls; U+009B is a terminal's CSI), encoded as C2 80..C2 9F.
static bool is_c1_control(std::string_view s, size_t i) {
  return static_cast<unsigned char>(s[i]) == 0xc2 && (static_cast<unsigned char>(s[i + 1]) & 0xe0) == 0x80;
}

std::string Diagnostics::escape_message(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += s[i++];
      continue;
    }
    if (c == '\n' || c == '\t' || c == '\r') {
      out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : "\\r";
      ++i;
      continue;
    }
    size_t n = c >= 0x80 ? utf8_length(s, i) : 0;
    if (n > 0 && !(n == 2 && is_c1_control(s, i))) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // Other control bytes, C1 controls and bytes that are not valid UTF-8: \xNN each.
    for (size_t k = 0; k < std::max<size_t>(n, 1); ++k)
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(s[i + k]));
    i += std::max<size_t>(n, 1);
  }
  return out;
}

std::string Diagnostics::printable_source_line(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c >= 0x20 && c < 0x7f) || c == '\t') {
      out += s[i++];
      continue;
    }
    size_t n = c >= 0x80 ? utf8_length(s, i) : 0;
    if (n > 0 && !(n == 2 && is_c1_control(s, i))) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    out.append(std::max<size_t>(n, 1), '?');  // one '?' per byte keeps the caret's column
    i += std::max<size_t>(n, 1);
  }
  return out;
}

std::string Diagnostics::format(const Diagnostic& d) {
  std::string out;
  if (d.loc.valid())
    out = fmt::format("{}:{}:{}: ", escape_message(d.loc.file->path()), d.loc.line, d.loc.col);
  else if (d.loc.file)
    out = fmt::format("{}: ", escape_message(d.loc.file->path()));
  else
    out = "hectorgen: ";
  out += fmt::format("{}: {}", severity_name(d.severity), escape_message(d.message));
  if (!d.kind.empty()) out += fmt::format(" [{}]", d.kind);
  out += '\n';
  if (d.loc.valid()) {
    std::string text = printable_source_line(d.loc.file->line(d.loc.line));
    std::string gutter = fmt::format("{:>5} | ", d.loc.line);
    out += gutter;
    out += text;
    out += '\n';
    // The caret line keeps tabs so the caret lines up under the same character; a multi-byte UTF-8
    // character takes one column.
    std::string pad(gutter.size() - 2, ' ');
    pad += "| ";
    for (int i = 1; i < d.loc.col && i - 1 < static_cast<int>(text.size()); ++i) {
      unsigned char c = static_cast<unsigned char>(text[i - 1]);
      if ((c & 0xc0) == 0x80) continue;  // a continuation byte (text is valid UTF-8 now)
      pad += c == '\t' ? '\t' : ' ';
    }
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
