// Lexer of the inter-operator DSL (a small Python subset): names, numbers, strings, operators, and
// Python's significant indentation as INDENT/DEDENT tokens. Positions are mapped back into the file
// that holds the program (a YAML block scalar keeps its lines but shifts its columns).
#pragma once

#include <string>
#include <vector>

#include "diag/diagnostics.h"

namespace hectorgen::dsl {

// A program text and where each of its lines sits in the source file.
struct ProgramText {
  std::string text;
  const SourceFile* file = nullptr;
  struct Origin {
    int line;        // 1-based line in `file`
    int col_offset;  // added to the 1-based column inside the program line
  };
  std::vector<Origin> origins;  // one per program line; empty: the program *is* the file
  // Optional, per program line: where each of its bytes sits in `file`. For lines that do not map
  // column for column (escapes in quoted strings, lines folded into one); takes precedence over origins.
  std::vector<std::vector<SourceLoc>> byte_locs;

  SourceLoc map(int line, int col) const;
};

enum class Tok {
  Name, Number, String,
  LParen, RParen, LBracket, RBracket, Comma, Colon, Dot,
  Plus, Minus, Star, Slash,
  Assign, PlusAssign, MinusAssign, StarAssign, SlashAssign,
  Newline, Indent, Dedent, End,
};

struct Token {
  Tok kind;
  std::string text;
  SourceLoc loc;
};

const char* describe(Tok t);

// Which names the text may contain. A spec's program is user text: the sigil '$' of the names the compiler
// derives (ir/inter/names.h) is an error there, in names and strings alike. Printed IR contains them.
enum class NameSpace { User, Compiler };

// Returns the tokens, always ending in End; reports lexical errors (and keeps going past them).
std::vector<Token> lex(const ProgramText& program, Diagnostics& diags, NameSpace names = NameSpace::User);

}  // namespace hectorgen::dsl
