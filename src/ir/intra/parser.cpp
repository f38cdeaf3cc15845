#include "ir/intra/parser.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace hectorgen::intra {

namespace {

struct ParseError {};

struct Line {
  int no = 0;       // 1-based
  int indent = 0;   // leading spaces
  std::string_view text;  // without the indentation and the newline
};

std::vector<Line> split_lines(const SourceFile& f) {
  std::vector<Line> out;
  for (int i = 1; i <= f.line_count(); ++i) {
    std::string_view l = f.line(i);
    size_t ind = l.find_first_not_of(' ');
    if (ind == std::string_view::npos) continue;  // blank
    out.push_back(Line{i, static_cast<int>(ind), l.substr(ind)});
  }
  return out;
}

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// A cursor over one line, with the helpers every line form needs.
class Cursor {
 public:
  Cursor(const SourceFile& f, Diagnostics& d, const Line& l) : f_(f), d_(d), l_(l) {}

  [[noreturn]] void fail(const std::string& msg) const { fail_at(i_, msg); }
  [[noreturn]] void fail_at(size_t at, const std::string& msg) const {
    d_.error(SourceLoc{&f_, l_.no, l_.indent + static_cast<int>(at) + 1}, "intra-syntax", msg);
    throw ParseError{};
  }
  void ws() {
    while (i_ < s().size() && s()[i_] == ' ') ++i_;
  }
  bool done() {
    ws();
    return i_ >= s().size();
  }
  void end() {
    if (!done()) fail(fmt::format("unexpected '{}'", s().substr(i_)));
  }
  bool peek(std::string_view lit) {
    ws();
    return s().substr(i_, lit.size()) == lit;
  }
  bool accept(std::string_view lit) {
    if (!peek(lit)) return false;
    // A keyword must not run into an identifier character.
    if (ident_char(lit.back()) && i_ + lit.size() < s().size() && ident_char(s()[i_ + lit.size()])) return false;
    i_ += lit.size();
    return true;
  }
  void expect(std::string_view lit) {
    if (!accept(lit)) fail(fmt::format("expected '{}'", lit));
  }
  bool at_ident() {
    ws();
    return i_ < s().size() && ident_start(s()[i_]);
  }
  std::string ident(const char* what = "a name") {
    ws();
    if (i_ >= s().size() || !ident_start(s()[i_])) fail(fmt::format("expected {}", what));
    size_t b = i_;
    while (i_ < s().size() && ident_char(s()[i_])) ++i_;
    return std::string(s().substr(b, i_ - b));
  }
  int64_t integer(const char* what = "an integer") {
    ws();
    size_t b = i_;
    while (i_ < s().size() && std::isdigit(static_cast<unsigned char>(s()[i_]))) ++i_;
    int64_t v = 0;
    auto r = std::from_chars(s().data() + b, s().data() + i_, v);
    if (b == i_ || r.ec != std::errc()) fail_at(b, fmt::format("expected {}", what));
    return v;
  }
  bool at_number() {
    ws();
    if (i_ >= s().size()) return false;
    char c = s()[i_];
    return std::isdigit(static_cast<unsigned char>(c)) || c == '.' || at_word("inf") || at_word("nan");
  }
  bool at_word(std::string_view w) const {
    return s().substr(i_, w.size()) == w && (i_ + w.size() >= s().size() || !ident_char(s()[i_ + w.size()]));
  }
  double number() {
    ws();
    size_t b = i_;
    if (at_word("inf") || at_word("nan")) {
      i_ += 3;
      return s()[b] == 'i' ? HUGE_VAL : std::nan("");
    }
    while (i_ < s().size() && (std::isdigit(static_cast<unsigned char>(s()[i_])) || s()[i_] == '.')) ++i_;
    if (i_ < s().size() && (s()[i_] == 'e' || s()[i_] == 'E')) {
      ++i_;
      if (i_ < s().size() && (s()[i_] == '+' || s()[i_] == '-')) ++i_;
      while (i_ < s().size() && std::isdigit(static_cast<unsigned char>(s()[i_]))) ++i_;
    }
    std::string text(s().substr(b, i_ - b));
    char* endp = nullptr;
    double v = std::strtod(text.c_str(), &endp);
    if (text.empty() || endp != text.c_str() + text.size()) fail_at(b, "expected a number");
    return v;
  }
  std::string rest() {
    ws();
    std::string r(s().substr(i_));
    i_ = s().size();
    return r;
  }
  size_t pos() const { return i_; }

 private:
  std::string_view s() const { return l_.text; }
  const SourceFile& f_;
  Diagnostics& d_;
  const Line& l_;
  size_t i_ = 0;
};

// value := term (('+' | '-') term)*;  term := unary (('*' | '/') unary)*;  unary := '-' unary | atom
// atom := number | name | function '(' value {',' value} [',' number] ')' | '(' value ')'
ValueP parse_value(Cursor& c);

ValueP parse_atom(Cursor& c) {
  if (c.accept("(")) {
    ValueP v = parse_value(c);
    c.expect(")");
    return v;
  }
  if (c.at_number()) return Value::constant(c.number());
  size_t at = c.pos();
  std::string name = c.ident("a register, a number or a function");
  if (!c.peek("(")) return Value::reg_ref(name);
  c.expect("(");
  std::optional<EwOp> op = ew_function(name);
  if (!op) c.fail_at(at, fmt::format("unknown element-wise function '{}'", name));
  const EwOpInfo& i = info(*op);
  std::vector<ValueP> args;
  for (int k = 0; k < i.arity; ++k) {
    if (k) c.expect(",");
    args.push_back(parse_value(c));
  }
  double param = 0;
  if (i.has_param) {
    c.expect(",");
    bool neg = c.accept("-");
    param = c.number();
    if (neg) param = -param;
  }
  c.expect(")");
  return Value::apply(*op, std::move(args), param);
}

ValueP parse_unary(Cursor& c) {
  if (c.accept("-")) {
    if (c.at_number()) return Value::constant(-c.number());
    return Value::apply(EwOp::Neg, {parse_unary(c)});
  }
  return parse_atom(c);
}

ValueP parse_term(Cursor& c) {
  ValueP v = parse_unary(c);
  for (;;) {
    if (c.peek("*")) {
      c.expect("*");
      v = Value::apply(EwOp::Mul, {v, parse_unary(c)});
    } else if (c.peek("/")) {
      c.expect("/");
      v = Value::apply(EwOp::Div, {v, parse_unary(c)});
    } else {
      return v;
    }
  }
}

ValueP parse_value(Cursor& c) {
  ValueP v = parse_term(c);
  for (;;) {
    if (c.peek("+")) {
      c.expect("+");
      v = Value::apply(EwOp::Add, {v, parse_term(c)});
    } else if (c.peek("-")) {
      c.expect("-");
      v = Value::apply(EwOp::Sub, {v, parse_term(c)});
    } else {
      return v;
    }
  }
}

// `name` or `0` (a weight without rows).
std::string parse_row(Cursor& c) {
  if (c.accept("0")) return "0";
  return c.ident("a row (a variable, an index, or 0)");
}

RegType parse_reg_type(Cursor& c) {
  RegType t;
  c.expect("[");
  if (!c.accept("]")) {
    do t.shape.push_back(c.integer("a dimension"));
    while (c.accept(","));
    c.expect("]");
  }
  size_t at = c.pos();
  std::string layout = c.ident("a lane layout (lanes or replicated)");
  if (layout == "lanes") t.layout = LaneLayout::Lanes;
  else if (layout == "replicated") t.layout = LaneLayout::Replicated;
  else c.fail_at(at, fmt::format("unknown lane layout '{}' (lanes or replicated)", layout));
  c.expect("(");
  at = c.pos();
  int64_t slots = c.integer("a slot count");
  if (slots != t.slots())
    c.fail_at(at, fmt::format("{} elements {} take {} slot(s) per lane, not {}", t.numel(), layout == "lanes" ? "spread over the lanes" : "replicated", t.slots(), slots));
  c.expect(")");
  return t;
}

Source parse_source(Cursor& c) {
  if (c.accept("load")) {
    Load l;
    l.tensor = c.ident("a tensor");
    c.expect("[");
    l.row = parse_row(c);
    c.expect("]");
    return l;
  }
  for (const char* kw : {"warp_sum", "warp_max", "lane_sum", "lane_max"}) {
    if (!c.peek(std::string(kw) + "(")) continue;
    c.expect(kw);
    c.expect("(");
    Reduce r;
    r.warp = kw[0] == 'w';
    r.op = std::string_view(kw).substr(5) == "sum" ? ReduceOp::Sum : ReduceOp::Max;
    r.value = parse_value(c);
    c.expect(",");
    r.axis = c.integer("the size of the reduced axis");
    c.expect(")");
    return r;
  }
  return Eval{parse_value(c)};
}

class TraversalParser {
 public:
  TraversalParser(const SourceFile& f, Diagnostics& d, const std::vector<Line>& lines, size_t& pos)
      : f_(f), d_(d), lines_(lines), pos_(pos) {}

  TraversalInstance instance() {
    const Line& h = lines_[pos_++];
    Cursor c(f_, d_, h);
    TraversalInstance t;
    c.expect("traversal");
    t.name = c.ident("a kernel name");
    c.expect(":");
    c.expect("rows=");
    size_t at = c.pos();
    std::string rows = c.ident("edges, dst_nodes or src_nodes");
    if (rows == "edges") t.rows = inter::LoopKind::Edges;
    else if (rows == "dst_nodes") t.rows = inter::LoopKind::DstNodes;
    else if (rows == "src_nodes") t.rows = inter::LoopKind::SrcNodes;
    else c.fail_at(at, fmt::format("unknown row loop '{}' (edges, dst_nodes or src_nodes)", rows));
    c.expect("(");
    t.row = c.ident("the row variable");
    c.expect(")");
    c.expect("threads=");
    t.threads = static_cast<int>(c.integer("a thread count"));
    c.end();
    t.body = body(h.indent + 4);
    return t;
  }

 private:
  std::vector<Instr> body(int indent) {
    std::vector<Instr> out;
    while (pos_ < lines_.size() && lines_[pos_].indent >= indent) {
      const Line& l = lines_[pos_];
      if (l.indent != indent) {
        Cursor c(f_, d_, l);
        c.fail(fmt::format("unexpected indentation (expected {} spaces)", indent));
      }
      ++pos_;
      out.push_back(instr(l));
    }
    return out;
  }

  Instr instr(const Line& l) {
    Cursor c(f_, d_, l);
    if (l.text.rfind("# ", 0) == 0 || l.text == "#") {
      c.expect("#");
      std::string_view t = l.text.size() > 2 ? l.text.substr(2) : std::string_view{};
      c.rest();
      return Instr{Comment{std::string(t)}};
    }
    if (c.accept("index")) {
      IndexDef x;
      x.name = c.ident();
      c.expect("=");
      size_t at = c.pos();
      std::string arr = c.ident("a graph array");
      auto a = parse_graph_array(arr);
      if (!a) c.fail_at(at, fmt::format("unknown graph array '{}' (src, dst, etype, in_src, out_dst, ntype)", arr));
      x.array = *a;
      c.expect("[");
      x.of = c.ident("an edge, node or position variable");
      c.expect("]");
      c.end();
      return Instr{x};
    }
    if (c.peek("let ") || c.peek("var ")) {
      Def d;
      d.is_mutable = c.accept("var");
      if (!d.is_mutable) c.expect("let");
      d.name = c.ident("a register name");
      c.expect(":");
      d.type = parse_reg_type(c);
      c.expect("=");
      d.source = parse_source(c);
      c.end();
      return Instr{d};
    }
    if (c.accept("store")) {
      Store s;
      s.tensor = c.ident("a tensor");
      c.expect("[");
      s.row = parse_row(c);
      c.expect("]");
      s.atomic = c.accept("+=");
      if (!s.atomic) c.expect("=");
      s.reg = c.ident("a register");
      c.expect("by");
      size_t at = c.pos();
      std::string lanes = c.ident("lanes or lane0");
      if (lanes == "lanes") s.lanes = StoreLanes::Partitioned;
      else if (lanes == "lane0") s.lanes = StoreLanes::Lane0;
      else c.fail_at(at, fmt::format("unknown store lanes '{}' (lanes or lane0)", lanes));
      if (s.atomic) c.expect("atomic");
      c.end();
      return Instr{s};
    }
    if (l.text == "sync") return Instr{Sync{}};
    if (c.accept("for")) {
      EdgeLoop loop;
      loop.var = c.ident("an edge variable");
      c.expect("in");
      size_t at = c.pos();
      std::string dir = c.ident("incoming or outgoing");
      if (dir == "incoming") loop.kind = inter::LoopKind::IncomingEdges;
      else if (dir == "outgoing") loop.kind = inter::LoopKind::OutgoingEdges;
      else c.fail_at(at, fmt::format("unknown edge loop '{}' (incoming or outgoing)", dir));
      c.expect("(");
      loop.node = c.ident("the row node");
      c.expect(")");
      c.expect("at");
      loop.pos = c.ident("a position variable");
      c.expect(":");
      c.end();
      loop.body = body(l.indent + 4);
      return Instr{std::move(loop)};
    }
    Update u;
    u.name = c.ident("an instruction");
    static const std::pair<const char*, inter::AssignOp> kOps[] = {{"+=", inter::AssignOp::Add}, {"-=", inter::AssignOp::Sub},
                                                                  {"*=", inter::AssignOp::Mul}, {"/=", inter::AssignOp::Div},
                                                                  {"=", inter::AssignOp::Set}};
    bool found = false;
    for (const auto& [text, op] : kOps)
      if (c.accept(text)) {
        u.op = op;
        found = true;
        break;
      }
    if (!found) c.fail("expected an instruction (index, let, var, store, sync, for, or an update 'x = ...')");
    u.value = parse_value(c);
    c.end();
    return Instr{u};
  }

  const SourceFile& f_;
  Diagnostics& d_;
  const std::vector<Line>& lines_;
  size_t& pos_;
};

}  // namespace

std::optional<TraversalInstance> parse_traversal(const SourceFile& file, Diagnostics& diags) {
  std::vector<Line> lines = split_lines(file);
  size_t pos = 0;
  try {
    if (lines.empty()) {
      diags.error(SourceLoc{&file, 1, 1}, "intra-syntax", "expected a traversal instance");
      return std::nullopt;
    }
    TraversalInstance t = TraversalParser(file, diags, lines, pos).instance();
    if (pos < lines.size()) {
      Cursor c(file, diags, lines[pos]);
      c.fail("unexpected text after the instance");
    }
    return t;
  } catch (const ParseError&) {
    return std::nullopt;
  }
}

}  // namespace hectorgen::intra
