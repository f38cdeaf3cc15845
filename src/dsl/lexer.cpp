#include "dsl/lexer.h"

#include <fmt/format.h>

#include <cctype>
#include <utility>

#include "ir/inter/names.h"

namespace hectorgen::dsl {

SourceLoc ProgramText::map(int line, int col) const {
  if (line >= 1 && line <= static_cast<int>(byte_locs.size()) && !byte_locs[line - 1].empty()) {
    const std::vector<SourceLoc>& at = byte_locs[line - 1];
    if (col < 1) col = 1;
    if (col <= static_cast<int>(at.size())) return at[col - 1];
    SourceLoc past = at.back();  // past the end of the line: after its last byte
    past.col += col - static_cast<int>(at.size());
    return past;
  }
  if (origins.empty()) return {file, line, col};
  if (line < 1) line = 1;
  if (line > static_cast<int>(origins.size())) {
    const Origin& last = origins.back();
    return {file, last.line, last.col_offset + 1};
  }
  const Origin& o = origins[line - 1];
  return {file, o.line, col + o.col_offset};
}

const char* describe(Tok t) {
  switch (t) {
    case Tok::Name: return "name";
    case Tok::Number: return "number";
    case Tok::String: return "string";
    case Tok::LParen: return "'('";
    case Tok::RParen: return "')'";
    case Tok::LBracket: return "'['";
    case Tok::RBracket: return "']'";
    case Tok::Comma: return "','";
    case Tok::Colon: return "':'";
    case Tok::Dot: return "'.'";
    case Tok::Plus: return "'+'";
    case Tok::Minus: return "'-'";
    case Tok::Star: return "'*'";
    case Tok::Slash: return "'/'";
    case Tok::Assign: return "'='";
    case Tok::PlusAssign: return "'+='";
    case Tok::MinusAssign: return "'-='";
    case Tok::StarAssign: return "'*='";
    case Tok::SlashAssign: return "'/='";
    case Tok::Newline: return "end of line";
    case Tok::Indent: return "indentation";
    case Tok::Dedent: return "dedent";
    case Tok::End: return "end of program";
  }
  return "token";
}

namespace {

class Lexer {
 public:
  Lexer(const ProgramText& p, Diagnostics& d, NameSpace names) : p_(p), d_(d), names_(names) {}

  std::vector<Token> run() {
    const std::string& s = p_.text;
    size_t i = 0;
    int line = 1;
    std::vector<int> indents{0};
    int paren_depth = 0;
    while (i <= s.size()) {
      // ---- start of a logical line: measure indentation, skip blank/comment lines
      size_t line_begin = i;
      int width = 0;
      bool tab_reported = false;  // once per line
      while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) {
        if (s[i] == '\t' && !std::exchange(tab_reported, true)) {
          d_.error(p_.map(line, static_cast<int>(i - line_begin) + 1), "tab-indent",
                   "tabs are not allowed in indentation; use spaces");
        }
        ++width;
        ++i;
      }
      if (i >= s.size()) break;
      if (s[i] == '\n' || s[i] == '\r' || s[i] == '#') {
        while (i < s.size() && s[i] != '\n') ++i;
        ++i;
        ++line;
        continue;
      }
      SourceLoc here = p_.map(line, width + 1);
      if (width > indents.back()) {
        indents.push_back(width);
        push(Tok::Indent, "", here);
      } else {
        while (width < indents.back()) {
          indents.pop_back();
          push(Tok::Dedent, "", here);
        }
        if (width != indents.back())
          d_.error(here, "bad-indent", "unindent does not match any outer indentation level");
      }
      // ---- tokens of the line (a line continues while brackets are open)
      while (i < s.size()) {
        char c = s[i];
        int col = static_cast<int>(i - line_begin) + 1;
        SourceLoc loc = p_.map(line, col);
        if (c == '\n') {
          ++line;
          ++i;
          line_begin = i;
          if (paren_depth > 0) continue;
          break;
        }
        if (c == ' ' || c == '\t' || c == '\r') { ++i; continue; }
        if (c == '#') { while (i < s.size() && s[i] != '\n') ++i; continue; }
        if (std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == inter::kSigil) {
          size_t b = i;
          while (i < s.size() && (std::isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_' || s[i] == inter::kSigil)) ++i;
          push(Tok::Name, s.substr(b, i - b), loc);
          check_sigil(toks_.back());
          continue;
        }
        if (std::isdigit(static_cast<unsigned char>(c)) ||
            (c == '.' && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1])))) {
          size_t b = i;
          while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
          if (i < s.size() && s[i] == '.') {
            ++i;
            while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
          }
          if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
            size_t save = i++;
            if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
            if (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
              while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
            } else {
              i = save;
            }
          }
          if (i < s.size() && (std::isalpha(static_cast<unsigned char>(s[i])) || s[i] == '_')) {
            d_.error(loc, "bad-number", fmt::format("malformed number '{}'", s.substr(b, i - b + 1)));
            while (i < s.size() && std::isalnum(static_cast<unsigned char>(s[i]))) ++i;
            continue;
          }
          push(Tok::Number, s.substr(b, i - b), loc);
          continue;
        }
        if (c == '"' || c == '\'') {
          size_t b = ++i;
          while (i < s.size() && s[i] != c && s[i] != '\n') ++i;
          if (i >= s.size() || s[i] != c) {
            d_.error(loc, "unterminated-string", "missing closing quote");
            continue;
          }
          push(Tok::String, s.substr(b, i - b), loc);
          check_sigil(toks_.back());
          ++i;
          continue;
        }
        auto two = [&](char next) { return i + 1 < s.size() && s[i + 1] == next; };
        Tok t;
        int len = 1;
        switch (c) {
          case '(': t = Tok::LParen; ++paren_depth; break;
          case ')': t = Tok::RParen; paren_depth = paren_depth > 0 ? paren_depth - 1 : 0; break;
          case '[': t = Tok::LBracket; ++paren_depth; break;
          case ']': t = Tok::RBracket; paren_depth = paren_depth > 0 ? paren_depth - 1 : 0; break;
          case ',': t = Tok::Comma; break;
          case ':': t = Tok::Colon; break;
          case '.': t = Tok::Dot; break;
          case '+': t = two('=') ? (len = 2, Tok::PlusAssign) : Tok::Plus; break;
          case '-': t = two('=') ? (len = 2, Tok::MinusAssign) : Tok::Minus; break;
          case '*': t = two('=') ? (len = 2, Tok::StarAssign) : Tok::Star; break;
          case '/': t = two('=') ? (len = 2, Tok::SlashAssign) : Tok::Slash; break;
          case '=': t = Tok::Assign; break;
          default: {
            unsigned char uc = static_cast<unsigned char>(c);
            std::string shown = std::isprint(uc) ? fmt::format("'{}'", c) : fmt::format("byte 0x{:02x}", uc);
            d_.error(loc, "bad-character", fmt::format("unexpected character {}", shown));
            ++i;
            continue;
          }
        }
        push(t, s.substr(i, len), loc);
        i += len;
      }
      SourceLoc eol = p_.map(line > 1 ? line - 1 : 1, 1);
      if (!toks_.empty() && toks_.back().kind != Tok::Newline) push(Tok::Newline, "", last_loc(eol));
      if (i >= s.size()) break;
    }
    SourceLoc end = p_.map(line, 1);
    if (!toks_.empty() && toks_.back().kind != Tok::Newline && toks_.back().kind != Tok::Dedent)
      push(Tok::Newline, "", end);
    while (indents.size() > 1) {
      indents.pop_back();
      push(Tok::Dedent, "", end);
    }
    push(Tok::End, "", end);
    return std::move(toks_);
  }

 private:
  void push(Tok k, std::string text, SourceLoc loc) { toks_.push_back({k, std::move(text), loc}); }
  // User text cannot name what the compiler derives (a field "d$att" would be the gradient of att).
  void check_sigil(const Token& t) {
    if (names_ == NameSpace::User && inter::is_derived_name(t.text))
      d_.error(t.loc, "reserved-name", fmt::format("{} '{}' {}", t.kind == Tok::String ? "field name" : "name", t.text,
                                                   inter::reserved_name_reason(t.text)));
  }
  // A newline token points just past the last token of its line.
  SourceLoc last_loc(SourceLoc fallback) const {
    if (toks_.empty()) return fallback;
    SourceLoc l = toks_.back().loc;
    l.col += static_cast<int>(toks_.back().text.size()) + (toks_.back().kind == Tok::String ? 2 : 0);
    return l;
  }

  const ProgramText& p_;
  Diagnostics& d_;
  NameSpace names_;
  std::vector<Token> toks_;
};

}  // namespace

std::vector<Token> lex(const ProgramText& program, Diagnostics& diags, NameSpace names) {
  return Lexer(program, diags, names).run();
}

}  // namespace hectorgen::dsl
