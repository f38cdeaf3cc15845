#include "ir/intra/parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <functional>
#include <map>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "dsl/parser.h"
#include "ir/inter/typing.h"

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

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == '$'; }  // '$': derived names (d$att)
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$'; }

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
  // The text up to `close` (which is consumed), or an error naming it.
  std::string until(char close) {
    const size_t at = s().find(close, i_);
    if (at == std::string_view::npos) fail(fmt::format("expected '{}'", close));
    std::string r(s().substr(i_, at - i_));
    i_ = at + 1;
    return r;
  }
  std::string rest() {
    ws();
    std::string r(s().substr(i_));
    i_ = s().size();
    return r;
  }
  size_t pos() {
    ws();
    return i_;
  }
  void rewind(size_t at) { i_ = at; }

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
  std::optional<inter::Op> op = inter::call_op(name);
  if (!op || !is_elementwise(*op)) c.fail_at(at, fmt::format("unknown element-wise function '{}'", name));
  const inter::OpInfo& i = inter::op_info(*op);
  std::vector<ValueP> args;
  if (!c.peek(")")) {
    do {
      size_t arg_at = c.pos();
      args.push_back(parse_value(c));
      if (i.param(args.size() - 1).kind == inter::ParamKind::Constant && args.back()->kind != Value::Kind::Const)
        c.fail_at(arg_at, fmt::format("{} of '{}' is a constant", i.param(args.size() - 1).role, name));
    } while (c.accept(","));
  }
  c.expect(")");
  if (args.size() < i.min_args() || args.size() > i.max_args())
    c.fail_at(at, fmt::format("'{}' takes {} to {} arguments, got {}", name, i.min_args(), i.max_args(), args.size()));
  return Value::apply(*op, std::move(args));
}

ValueP parse_unary(Cursor& c) {
  if (c.accept("-")) {
    if (c.at_number()) return Value::constant(-c.number());
    return Value::apply(inter::Op::Neg, {parse_unary(c)});
  }
  return parse_atom(c);
}

ValueP parse_term(Cursor& c) {
  ValueP v = parse_unary(c);
  for (;;) {
    if (c.accept("*")) v = Value::apply(inter::binary_op(inter::BinOp::Mul), {v, parse_unary(c)});
    else if (c.accept("/")) v = Value::apply(inter::binary_op(inter::BinOp::Div), {v, parse_unary(c)});
    else return v;
  }
}

ValueP parse_value(Cursor& c) {
  ValueP v = parse_term(c);
  for (;;) {
    if (c.accept("+")) v = Value::apply(inter::binary_op(inter::BinOp::Add), {v, parse_term(c)});
    else if (c.accept("-")) v = Value::apply(inter::binary_op(inter::BinOp::Sub), {v, parse_term(c)});
    else return v;
  }
}

// `name` or `0` (a weight without rows).
std::string parse_row(Cursor& c) {
  if (c.accept("0")) return "0";
  return c.ident("a row (a variable, an index, or 0)");
}

// ` row_lanes=G` where it comes next (G 8, 16 or 32, else a positioned error), or 32 (the default, not printed).
int parse_row_lanes(Cursor& c) {
  if (!c.accept("row_lanes=")) return 32;
  const size_t at = c.pos();
  const int lanes = static_cast<int>(c.integer("lanes per row"));
  if (lanes == 0 || !inter::valid_row_lanes(lanes)) c.fail_at(at, fmt::format("row_lanes={} is not 8, 16 or 32", lanes));
  return lanes;
}

// ` vector=V` where it comes next (V 1, 2, 4 or 8, else a positioned error), or kDefaultVector (not printed).
int parse_vector(Cursor& c) {
  if (!c.accept("vector=")) return kDefaultVector;
  const size_t at = c.pos();
  const int vector = static_cast<int>(c.integer("a vector length"));
  if (vector == 0 || !inter::valid_vector(vector)) c.fail_at(at, fmt::format("vector={} is not 1, 2, 4 or 8", vector));
  return vector;
}

// `row_lanes`: the lanes per row of the instance (a `lanes` vector's slot count depends on it).
RegType parse_reg_type(Cursor& c, int row_lanes) {
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
  if (slots != t.slots(row_lanes))
    c.fail_at(at, fmt::format("{} elements {} take {} slot(s) per lane, not {}", t.numel(),
                              layout == "lanes" ? "spread over the lanes" : "replicated", t.slots(row_lanes), slots));
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
    if (c.accept("by")) c.expect("lane0");
    else return l;
    l.lane0 = true;
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

// `layout.` before a loop kind, or "" when the next word is the kind itself.
std::string walked(Cursor& c) {
  size_t at = c.pos();
  std::string word = c.ident("a loop");
  if (c.accept(".")) return word;
  c.rewind(at);
  return "";
}

// The layout written before a loop must be the one the loop walks (`word`: the loop as written).
void check_layout(Cursor& c, size_t at, const std::string& layout, inter::LoopKind kind, const std::string& word) {
  std::string want = walked_layout(kind);
  if (layout == want) return;
  if (want.empty()) c.fail_at(at, fmt::format("{} walks no graph layout: write {}, not {}.{}", word, word, layout, word));
  c.fail_at(at, fmt::format("{} walks the layout {}: write {}.{}", word, want, want, word));
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
    std::string layout = walked(c);
    std::string rows = c.ident("edges, dst_nodes, src_nodes or src_etype_pairs");
    if (rows == "edges") t.rows = inter::LoopKind::Edges;
    else if (rows == "dst_nodes") t.rows = inter::LoopKind::DstNodes;
    else if (rows == "src_nodes") t.rows = inter::LoopKind::SrcNodes;
    else if (rows == "src_etype_pairs") t.rows = inter::LoopKind::SrcPairs;
    else c.fail_at(at + (layout.empty() ? 0 : layout.size() + 1),
                   fmt::format("unknown row loop '{}' (edges, dst_nodes, src_nodes or src_etype_pairs)", rows));
    check_layout(c, at, layout, t.rows, rows);
    c.expect("(");
    t.row = c.ident("the row variable");
    c.expect(")");
    c.expect("threads=");
    t.threads = static_cast<int>(c.integer("a thread count"));
    if (c.accept("edge_batch=")) t.edge_batch = static_cast<int>(c.integer("an edge batch"));
    t.row_lanes = parse_row_lanes(c);
    t.vector = parse_vector(c);
    c.end();
    row_lanes_ = t.row_lanes;
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
      if (!a) c.fail_at(at, fmt::format("unknown graph array '{}' ({})", arr, graph_array_names()));
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
      d.type = parse_reg_type(c, row_lanes_);
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
      std::string layout = walked(c);
      std::string dir = c.ident("incoming or outgoing");
      if (dir == "incoming") loop.kind = inter::LoopKind::IncomingEdges;
      else if (dir == "outgoing") loop.kind = inter::LoopKind::OutgoingEdges;
      else c.fail_at(at + (layout.empty() ? 0 : layout.size() + 1), fmt::format("unknown edge loop '{}' (incoming or outgoing)", dir));
      check_layout(c, at, layout, loop.kind, dir);
      c.expect("(");
      loop.node = c.ident("the row node");
      c.expect(")");
      c.expect("at");
      loop.pos = c.ident("a position variable");
      loop.split = c.accept("split");
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
  int row_lanes_ = 32;  // of the instance being parsed
};


// ---------------------------------------------------------------------------------------------------
// Programs
// ---------------------------------------------------------------------------------------------------
Gather parse_gathered_row(Cursor& c) {
  size_t at = c.pos();
  std::string r = c.ident("row, src[row] or dst[row]");
  if (r == "row") return Gather::None;
  if (r != "src" && r != "dst") c.fail_at(at, fmt::format("expected row, src[row] or dst[row], not '{}'", r));
  c.expect("[");
  c.expect("row");
  c.expect("]");
  return r == "src" ? Gather::Src : Gather::Dst;
}

Segments parse_segments(Cursor& c) {
  if (c.accept("-")) return Segments::None;
  size_t at = c.pos();
  std::string s = c.ident("etype, ntype or -");
  if (s == "etype") return Segments::Etype;
  if (s == "ntype") return Segments::Ntype;
  c.fail_at(at, fmt::format("unknown segments '{}' (etype, ntype or -)", s));
}

// rows=edges | nodes (| etypes, where `etypes` is given): whether the rows are edges.
Rows parse_rows(Cursor& c) {
  c.expect("rows=");
  size_t at = c.pos();
  std::string r = c.ident("nodes, edges, etypes or pairs");
  for (Rows k : {Rows::Nodes, Rows::Edges, Rows::Etypes, Rows::Pairs})
    if (r == to_string(k)) return k;
  c.fail_at(at, fmt::format("expected rows=nodes, edges, etypes or pairs, not '{}'", r));
  return Rows::Nodes;
}

int64_t parse_key(Cursor& c, const char* key) {
  c.expect(std::string(key) + "=");
  return c.integer();
}

// dtype=fp32 | tf32 | bf16 | fp16: the arithmetic class of a GEMM or weight-gradient instance.
inter::DType parse_dtype_key(Cursor& c) {
  c.expect("dtype=");
  size_t at = c.pos();
  std::string s = c.ident("fp32, tf32, bf16 or fp16");
  if (auto d = inter::parse_dtype(s)) return *d;
  c.fail_at(at, fmt::format("unknown dtype '{}' (fp32, tf32, bf16 or fp16)", s));
}

class ProgramParser {
 public:
  ProgramParser(const SourceFile& f, Diagnostics& d, const std::vector<Line>& lines, size_t begin, size_t end)
      : f_(f), d_(d), lines_(lines.begin() + static_cast<long>(begin), lines.begin() + static_cast<long>(end)) {}

  Program program() {
    Program p;
    program_ = &p;
    // Comment lines first; those after the header line are the program's notes.
    bool header = false;
    for (; pos_ < lines_.size() && lines_[pos_].text.rfind("#", 0) == 0 && lines_[pos_].indent == 0; ++pos_) {
      const std::string_view text = lines_[pos_].text;
      if (header) p.notes.emplace_back(text.size() > 2 ? text.substr(2) : std::string_view{});
      header = header || text == "# hectorgen intra-operator IR";
    }
    {
      Cursor c = line("model");
      c.expect("model");
      p.model = c.ident("a model name");
      c.end();
    }
    const Line& model_line = lines_[pos_ - 1];
    {
      Cursor c = line("phase");
      c.expect("phase");
      p.phase = c.ident("a phase");
      c.end();
    }
    p.decl = declarations(p.model, model_line);
    {
      Cursor c = line("layouts");
      c.expect("layouts");
      if (!c.done()) {
        do p.layouts.insert(c.ident("a layout name"));
        while (c.accept(","));
      }
      c.end();
    }
    if (at_word("graph_tile")) {
      Cursor c = line("graph_tile");
      c.expect("graph_tile");
      p.graph_tile = static_cast<int>(c.integer());
      c.end();
    }
    while (at_word("tensor")) p.tensors.push_back(tensor());
    while (at_word("alias")) {
      Cursor c = line("alias");
      c.expect("alias");
      std::string field = c.ident("a field");
      c.expect("->");
      p.aliases[field] = c.ident("a tensor");
      c.end();
    }
    if (at_word("saved")) {
      Cursor c = line("saved");
      c.expect("saved");
      do p.saved.push_back(c.ident("a field"));
      while (c.accept(","));
      c.end();
    }
    while (pos_ < lines_.size()) p.kernels.push_back(kernel());
    return p;
  }

 private:
  bool at_word(std::string_view w) const {
    if (pos_ >= lines_.size() || lines_[pos_].indent != 0) return false;
    std::string_view t = lines_[pos_].text;
    return t.substr(0, w.size()) == w && (t.size() == w.size() || t[w.size()] == ' ');
  }

  // The next line, which must be a top-level line (`what` names it in the error otherwise).
  Cursor line(const char* what) {
    if (pos_ >= lines_.size()) {
      int last = lines_.empty() ? 1 : lines_.back().no;
      d_.error(SourceLoc{&f_, last, 1}, "intra-syntax", fmt::format("expected '{}' before the end of the program", what));
      throw ParseError{};
    }
    const Line& l = lines_[pos_++];
    Cursor c(f_, d_, l);
    if (l.indent != 0) c.fail(fmt::format("unexpected indentation (expected '{}')", what));
    return c;
  }
  Cursor body_line(const char* what) {
    Cursor c = peek_body(what);
    ++pos_;
    return c;
  }
  Cursor peek_body(const char* what) {
    if (pos_ >= lines_.size() || lines_[pos_].indent != 4) {
      const Line& l = lines_[std::min(pos_, lines_.size() - 1)];
      Cursor c(f_, d_, l);
      c.fail(fmt::format("expected the indented line '{}'", what));
    }
    return Cursor(f_, d_, lines_[pos_]);
  }

  // hyper/input/weight/output/option lines: the inter-operator IR's header, read by its parser.
  inter::ModelDecl declarations(const std::string& model, const Line& model_line) {
    dsl::ProgramText text;
    text.file = &f_;
    text.text = "model " + model + "\n";
    text.origins.push_back({model_line.no, 0});
    static const char* kWords[] = {"hyper", "input", "weight", "output", "option"};
    while (pos_ < lines_.size() && std::any_of(std::begin(kWords), std::end(kWords), [&](const char* w) { return at_word(w); })) {
      text.text += std::string(lines_[pos_].text) + "\n";
      text.origins.push_back({lines_[pos_].no, 0});
      ++pos_;
    }
    text.text += "program:\n";
    text.origins.push_back({text.origins.back().line, 0});
    auto m = dsl::parse_module(text, d_);
    if (!m) throw ParseError{};
    return m->decl;
  }

  TensorInfo tensor() {
    Cursor c = line("tensor");
    c.expect("tensor");
    TensorInfo t;
    t.name = c.ident("a tensor name");
    c.expect(":");
    size_t at = c.pos();
    std::string role = c.ident("a role");
    bool found = false;
    for (Role r : {Role::Input, Role::Weight, Role::Output, Role::Field, Role::Temp})
      if (role == to_string(r)) {
        t.role = r;
        found = true;
      }
    if (!found) c.fail_at(at, fmt::format("unknown role '{}' (input, weight, output, field, temp)", role));
    at = c.pos();
    std::string per = c.ident("node, edge, etype, ntype or none");
    auto pp = inter::parse_per(per);
    if (!pp) c.fail_at(at, fmt::format("unknown rows '{}' (node, edge, etype, ntype, none)", per));
    t.per = *pp;
    c.expect("[");
    if (!c.accept("]")) {
      do t.shape.push_back(c.integer("a dimension"));
      while (c.accept(","));
      c.expect("]");
    }
    // The element storage type when it is not fp32 (print_program writes fp32 as nothing).
    if (c.accept("bf16")) t.storage = inter::DType::BF16;
    else if (c.accept("fp16")) t.storage = inter::DType::FP16;
    t.zero_init = c.accept("zero_init");
    if (c.accept("from_graph=")) t.from_graph = c.ident("a graph layout");
    c.end();
    return t;
  }

  std::string from() {
    Cursor c = body_line("from: ...");
    c.expect("from:");
    return c.rest();
  }

  Kernel kernel() {
    const Line& head = lines_[pos_];
    if (head.indent != 0) Cursor(f_, d_, head).fail("unexpected indentation");
    std::string_view t = head.text;
    if (t.rfind("traversal ", 0) == 0) return traversal();
    if (t.rfind("gemm ", 0) == 0) return gemm();
    if (t.rfind("wgrad ", 0) == 0) return wgrad();
    if (t.rfind("segsum ", 0) == 0) return segsum();
    if (t.rfind("gathersum ", 0) == 0) return gathersum();
    if (t.rfind("torch ", 0) == 0) return torch();
    Cursor(f_, d_, head).fail("expected a kernel (gemm, traversal, wgrad, segsum, gathersum or torch)");
  }

  Kernel traversal() {
    std::vector<Line> rest(lines_.begin() + static_cast<long>(pos_), lines_.end());
    size_t used = 0;
    TraversalInstance t = TraversalParser(f_, d_, rest, used).instance();
    pos_ += used;
    return t;
  }

  Kernel gemm() {
    GemmInstance g;
    {
      Cursor c = line("gemm");
      c.expect("gemm");
      g.name = c.ident("a kernel name");
      c.expect(":");
      g.y = c.ident("the output tensor");
      c.expect("[");
      g.scatter = parse_gathered_row(c);
      c.expect("]");
      bool add = c.accept("+=");
      if (!add) c.expect("=");
      if (g.scatter == Gather::None) g.accumulate = add;
      else if (!add) c.fail("a scatter into src[row] / dst[row] adds (+=)");
      g.x = c.ident("the input tensor");
      c.expect("[");
      g.gather = parse_gathered_row(c);
      c.expect("]");
      c.expect("·");
      g.w = c.ident("the weight");
      c.expect("[");
      g.segments = parse_segments(c);
      c.expect("]");
      g.transpose_w = c.accept("^T");
      if (c.accept("*")) {
        g.row_scalar = c.ident("a row scalar");
        c.expect("[");
        c.expect("row");
        c.expect("]");
      }
      c.end();
    }
    {
      Cursor c = body_line("rows=... heads=... k=... n=... dtype=... tile=... coarsen=... store=... kernel=...");
      g.rows = parse_rows(c);
      g.heads = parse_key(c, "heads");
      g.k = parse_key(c, "k");
      g.n = parse_key(c, "n");
      g.dtype = parse_dtype_key(c);
      g.tile = static_cast<int>(parse_key(c, "tile"));
      g.coarsen = static_cast<int>(parse_key(c, "coarsen"));
      c.expect("store=");
      size_t at = c.pos();
      std::string store = c.ident("plain, add or atomic");
      const char* want = g.scatter != Gather::None ? "atomic" : g.accumulate ? "add" : "plain";
      if (store != want) c.fail_at(at, fmt::format("the output is written '{}' (by its formula), not '{}'", want, store));
      // kernel=tc | simt | simt(tc: <why not>): must be what the dtype, the shape and the storage types decide.
      c.expect("kernel=");
      at = c.pos();
      std::string kernel = c.ident("tc or simt");
      if (kernel != "tc" && kernel != "simt") c.fail_at(at, fmt::format("unknown kernel '{}' (tc or simt)", kernel));
      g.tensor_cores = kernel == "tc";
      if (!g.tensor_cores && c.accept("(")) kernel += "(" + c.until(')') + ")";
      GemmInstance chosen = g;
      chosen.tensor_cores = gemm_kernel_choice(*program_, g).tensor_cores;
      if (const std::string expected = gemm_kernel_text(*program_, chosen); kernel != expected)
        c.fail_at(at, fmt::format("the instance runs on kernel={} (by its dtype, shape and storage types), not '{}'",
                                  expected, kernel));
      if (c.accept("tiles=")) {
        at = c.pos();
        if (c.ident("graph") != "graph") c.fail_at(at, "tiles= takes 'graph' (the graph's tile offsets)");
        g.graph_tiles = true;
      }
      if (c.accept("launch_bounds=")) g.launch_bounds = static_cast<int>(c.integer());
      c.end();
    }
    g.source = from();
    return g;
  }

  Kernel wgrad() {
    WeightGradInstance w;
    {
      Cursor c = line("wgrad");
      c.expect("wgrad");
      w.name = c.ident("a kernel name");
      c.expect(":");
      w.dw = c.ident("the gradient tensor");
      c.expect("[");
      w.segments = parse_segments(c);
      c.expect("]");
      w.accumulate = c.accept("+=");
      if (!w.accumulate) c.expect("=");
      c.expect("sum");
      c.expect("over");
      c.expect("rows");
      w.x = c.ident("the input tensor");
      c.expect("[");
      w.x_gather = parse_gathered_row(c);
      c.expect("]");
      c.expect("^T");
      c.expect("·");
      w.dy = c.ident("the output gradient tensor");
      c.expect("[");
      w.dy_gather = parse_gathered_row(c);
      c.expect("]");
      if (c.accept("*")) {
        w.row_scalar = c.ident("a row scalar");
        c.expect("[");
        c.expect("row");
        c.expect("]");
      }
      c.end();
    }
    {
      Cursor c = body_line("rows=... heads=... k=... n=... dtype=... kernel=... deterministic");
      w.rows = parse_rows(c);
      w.heads = parse_key(c, "heads");
      w.k = parse_key(c, "k");
      w.n = parse_key(c, "n");
      w.dtype = parse_dtype_key(c);
      c.expect("kernel=");
      size_t at = c.pos();
      std::string kind = c.ident("simt or tc");
      if (kind != "simt" && kind != "tc") c.fail_at(at, fmt::format("unknown weight-gradient kernel '{}' (simt or tc)", kind));
      w.kernel = kind == "tc" ? WgradKernel::TensorCore : WgradKernel::Simt;
      // The reason a tensor-core dtype runs on CUDA cores is printed from the instance: it must be that one.
      const std::string want = wgrad_kernel_text(w), tail = want.substr(kind.size());
      if (tail.empty() ? c.peek("(") : !c.accept(tail)) c.fail_at(at, fmt::format("expected 'kernel={}' here", want));
      c.expect("deterministic");
      c.end();
    }
    w.source = from();
    return w;
  }

  Kernel segsum() {
    SegmentSumInstance s;
    {
      Cursor c = line("segsum");
      c.expect("segsum");
      s.name = c.ident("a kernel name");
      c.expect(":");
      s.dw = c.ident("the gradient tensor");
      c.expect("[");
      s.segments = parse_segments(c);
      c.expect("]");
      c.expect("+=");
      c.expect("sum");
      c.expect("over");
      c.expect("rows");
      s.v = c.ident("the summed tensor");
      c.expect("[");
      c.expect("row");
      c.expect("]");
      c.end();
    }
    {
      Cursor c = body_line("rows=... numel=... deterministic");
      s.rows = parse_rows(c);
      s.numel = parse_key(c, "numel");
      c.expect("deterministic");
      c.end();
    }
    s.source = from();
    return s;
  }

  // gathersum NAME:  y[row] (+)= sum over compact_src_etype.pair_edges(row) x[i]
  Kernel gathersum() {
    GatherSumInstance s;
    {
      Cursor c = line("gathersum");
      c.expect("gathersum");
      s.name = c.ident("a kernel name");
      c.expect(":");
      s.y = c.ident("the summed-into tensor");
      c.expect("[");
      c.expect("row");
      c.expect("]");
      s.accumulate = c.accept("+=");
      if (!s.accumulate) c.expect("=");
      c.expect("sum");
      c.expect("over");
      c.expect(std::string(layout::kCompactSrc) + ".");
      size_t at = c.pos();
      std::string csr = c.ident("pair_edges or node_pairs");
      if (csr == "pair_edges") s.csr = GatherCsr::PairEdges;
      else if (csr == "node_pairs") s.csr = GatherCsr::NodePairs;
      else c.fail_at(at, fmt::format("unknown CSR '{}' (pair_edges or node_pairs)", csr));
      c.expect("(");
      c.expect("row");
      c.expect(")");
      s.x = c.ident("the summed tensor");
      c.expect("[");
      if (c.accept("dst[")) {
        s.x_gather = Gather::Dst;
        c.expect("i");
        c.expect("]");
      } else {
        c.expect("i");
      }
      c.expect("]");
      if (c.accept("*")) {
        s.scale = c.ident("the per-edge scale");
        c.expect("[");
        c.expect("i");
        c.expect("]");
      }
      c.end();
    }
    {
      Cursor c = body_line("numel=... deterministic");
      s.numel = parse_key(c, "numel");
      c.expect("deterministic");
      if (c.accept("edge_batch=")) s.edge_batch = static_cast<int>(c.integer("an edge batch"));
      s.row_lanes = parse_row_lanes(c);
      s.vector = parse_vector(c);
      if (c.accept("group_rows_below=")) {
        const size_t at = c.pos();
        s.group_rows_below = static_cast<int>(c.integer("an average number of entries"));
        if (s.group_rows_below < 0 || !inter::valid_group_rows_below(s.group_rows_below))
          c.fail_at(at, fmt::format("group_rows_below={} is not 0 to 1024", s.group_rows_below));
      }
      c.end();
    }
    s.source = from();
    return s;
  }

  Kernel torch() {
    TorchInstance t;
    {
      Cursor c = line("torch");
      c.expect("torch");
      t.name = c.ident("a kernel name");
      c.expect(":");
      c.expect("target=");
      t.target = c.ident("the tensor it writes");
      c.end();
    }
    for (const char* kw : {"local", "field"}) {
      auto& map = kw[0] == 'l' ? t.materialized : t.field_tensor;
      while (pos_ < lines_.size() && lines_[pos_].indent == 4 && lines_[pos_].text.rfind(std::string(kw) + " ", 0) == 0) {
        Cursor c = body_line(kw);
        c.expect(kw);
        std::string from_name = c.ident();
        c.expect("->");
        map[from_name] = c.ident("a tensor");
        c.end();
      }
    }
    // The loop nest, in the inter-operator IR's syntax (its parser reads it).
    peek_body("for ...");
    dsl::ProgramText text;
    text.file = &f_;
    while (pos_ < lines_.size() && lines_[pos_].indent >= 4) {
      const Line& l = lines_[pos_++];
      text.text += std::string(static_cast<size_t>(l.indent - 4), ' ') + std::string(l.text) + "\n";
      text.origins.push_back({l.no, 4});
    }
    inter::Module m;
    if (!dsl::parse_program(text, m, d_, dsl::NameSpace::Compiler)) throw ParseError{};
    if (m.body.size() != 1 || m.body[0]->kind != inter::StmtKind::For || !m.functions.empty()) {
      d_.error(SourceLoc{&f_, text.origins.front().line, 5}, "intra-syntax", "a PyTorch instance holds one loop nest");
      throw ParseError{};
    }
    t.loop = typed_loop(t, m.body[0]);
    return t;
  }

  // The loop nest of a PyTorch instance with the types the emitter reads (what the lowering left on it):
  // fields and materialised locals have their tensors' shapes, the rest the inter IR's type rules.
  inter::StmtP typed_loop(const TorchInstance& t, const inter::StmtP& loop) {
    using namespace inter;
    FieldTable node_fields, edge_fields;
    auto field = [&](const std::string& name, const std::string& tensor) {
      const TensorInfo* ti = program_->find(tensor);
      if (!ti || (ti->per != Per::Node && ti->per != Per::Edge)) return;
      (ti->per == Per::Edge ? edge_fields : node_fields)[name] = FieldInfo{ti->per == Per::Edge, ti->shape, DType::FP32};
    };
    for (const TensorInfo& ti : program_->tensors) field(ti.name, ti.name);
    for (const auto& [f, tensor] : program_->aliases) field(f, tensor);
    for (const auto& [f, tensor] : t.field_tensor) field(f, tensor);
    TypeContext ctx{&program_->decl, &node_fields, &edge_fields};
    std::map<std::string, Type> names;
    for (const auto& [local, tensor] : t.materialized)
      if (const TensorInfo* ti = program_->find(tensor)) {
        Type ty = Type::tensor(ti->per == Per::Edge ? Domain::Edge : Domain::Node, ti->shape);
        ty.dep_edge = ti->per == Per::Edge;
        names[local] = ty;
      }
    std::function<ExprP(const ExprP&)> expr = [&](const ExprP& e) -> ExprP {
      auto copy = std::make_shared<Expr>(*e);
      for (ExprP& a : copy->args) a = expr(a);
      if (e->kind == ExprKind::Name && names.count(e->name)) copy->type = names.at(e->name);
      else copy->type = infer(*copy, ctx);
      return copy;
    };
    std::function<StmtP(const StmtP&)> stmt = [&](const StmtP& s) -> StmtP {
      if (s->kind == StmtKind::For) {
        names[s->var] = is_edge_loop(s->loop) ? Type::edge_var(s->loop) : Type::node_var();
        std::vector<StmtP> body;
        for (const StmtP& b : s->body) body.push_back(stmt(b));
        return Stmt::for_loop(s->var, s->loop, s->parent, std::move(body), s->loc);
      }
      return Stmt::assign(expr(s->target), s->op, expr(s->value), s->loc);
    };
    try {
      return stmt(loop);
    } catch (const std::logic_error& e) {
      d_.error(SourceLoc{&f_, 1, 1}, "intra-syntax", fmt::format("{}: {}", t.name, e.what()));
      throw ParseError{};
    }
  }

  const SourceFile& f_;
  Diagnostics& d_;
  std::vector<Line> lines_;
  size_t pos_ = 0;
  const Program* program_ = nullptr;  // the program being read (tensors and declarations above its kernels)
};

}  // namespace

std::optional<Program> parse_program(const SourceFile& file, Diagnostics& diags) {
  std::vector<Line> lines = split_lines(file);
  try {
    return ProgramParser(file, diags, lines, 0, lines.size()).program();
  } catch (const ParseError&) {
    return std::nullopt;
  }
}

std::optional<std::vector<Program>> parse_programs(const SourceFile& file, Diagnostics& diags) {
  std::vector<Line> lines = split_lines(file);
  std::vector<size_t> starts;
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].indent == 0 && lines[i].text.rfind("# ==== ", 0) == 0) starts.push_back(i);
  // Comment lines may come first (a pass test's RUN-PASS and CHECK lines).
  const bool commented = !starts.empty() && std::all_of(lines.begin(), lines.begin() + static_cast<long>(starts.front()),
                                                        [](const Line& l) { return l.indent == 0 && l.text.rfind("#", 0) == 0; });
  if (starts.empty() || !commented) {
    diags.error(SourceLoc{&file, lines.empty() ? 1 : lines.front().no, 1}, "intra-syntax", "expected '# ==== <phase> ====' first");
    return std::nullopt;
  }
  std::vector<Program> out;
  try {
    for (size_t k = 0; k < starts.size(); ++k) {
      size_t end = k + 1 < starts.size() ? starts[k + 1] : lines.size();
      Program p = ProgramParser(file, diags, lines, starts[k] + 1, end).program();
      std::string_view head = lines[starts[k]].text;
      if (head != fmt::format("# ==== {} ====", p.phase)) {
        diags.error(SourceLoc{&file, lines[starts[k]].no, 1}, "intra-syntax",
                    fmt::format("the section of phase '{}' is headed '{}'", p.phase, head));
        return std::nullopt;
      }
      out.push_back(std::move(p));
    }
  } catch (const ParseError&) {
    return std::nullopt;
  }
  return out;
}

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
