#include "dsl/parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <unordered_map>

#include "ir/inter/constant.h"

namespace hectorgen::dsl {

using namespace inter;

namespace {

class Parser {
 public:
  Parser(std::vector<Token> toks, Diagnostics& d) : t_(std::move(toks)), d_(d) {}

  // ---- programs ------------------------------------------------------------------------------
  void program(Module& m, bool allow_functions) {
    while (!at(Tok::End)) {
      if (at(Tok::Newline)) { ++p_; continue; }
      if (at(Tok::Indent)) {
        error(cur().loc, "bad-indent", "unexpected indentation");
        skip_block();
        continue;
      }
      if (at(Tok::Dedent)) { ++p_; continue; }
      if (is_keyword("def")) {
        if (!allow_functions) error(cur().loc, "syntax", "function definitions are not allowed here");
        if (auto f = funcdef()) m.functions.push_back(std::move(*f));
        continue;
      }
      if (auto s = statement()) m.body.push_back(s);
    }
  }

  // ---- the printed-IR header -----------------------------------------------------------------
  bool header(ModelDecl& decl) {
    bool seen_model = false;
    while (!at(Tok::End)) {
      if (at(Tok::Newline)) { ++p_; continue; }
      Token kw = cur();
      if (kw.kind != Tok::Name) {
        error(kw.loc, "syntax", fmt::format("expected a declaration, found {}", what(kw)));
        return false;
      }
      if (kw.text == "program") {
        ++p_;
        if (!expect(Tok::Colon, "after 'program'") || !expect(Tok::Newline, "after 'program:'")) return false;
        if (!seen_model) error(kw.loc, "missing-field", "missing 'model' declaration");
        return !d_.has_errors();
      }
      ++p_;
      bool ok = true;
      if (kw.text == "model") {
        ok = expect_name(decl.name, "model name");
        decl.loc = kw.loc;
        seen_model = true;
      } else if (kw.text == "hyper") {
        HyperParam h;
        h.loc = cur().loc;
        ok = expect_name(h.name, "hyper-parameter name") && expect(Tok::Assign, "after the name");
        if (ok && (h.expr = expression())) decl.hyper.push_back(std::move(h));
        else ok = false;
      } else if (kw.text == "input" || kw.text == "weight" || kw.text == "output") {
        TensorDecl td;
        ok = tensor_decl(td);
        if (ok) (kw.text == "input" ? decl.inputs : kw.text == "weight" ? decl.weights : decl.outputs).push_back(td);
      } else if (kw.text == "option") {
        ok = option(decl.options);
      } else {
        error(kw.loc, "syntax", fmt::format("unknown declaration '{}'", kw.text));
        ok = false;
      }
      if (ok) ok = expect(Tok::Newline, "at the end of the declaration");
      if (!ok) sync_line();
    }
    error(cur().loc, "syntax", "missing 'program:'");
    return false;
  }

  ExprP lone_expression() {
    while (at(Tok::Newline)) ++p_;
    ExprP e = expression();
    while (at(Tok::Newline)) ++p_;
    if (e && !at(Tok::End)) {
      error(cur().loc, "syntax", fmt::format("unexpected {} after the expression", what(cur())));
      return nullptr;
    }
    return e;
  }

 private:
  // ---- limits ------------------------------------------------------------------------------------
  // Every later stage walks expressions and blocks recursively: bound what the parser builds so that
  // none of them can run out of stack. Nesting counts open parentheses, brackets, calls, unary minus
  // signs and blocks; depth counts the levels of the expression tree (a + b + c is two levels deep).
  static constexpr int kMaxNesting = 256;
  static constexpr int kMaxExprDepth = 1000;

  struct Nesting {
    Parser& p;
    bool ok;
    Nesting(Parser& parser, SourceLoc loc) : p(parser), ok(++p.nesting_ <= kMaxNesting) {
      if (!ok)
        p.error(loc, "too-deep", fmt::format("nested too deeply (more than {} levels of parentheses, brackets, "
                                             "calls, unary minus signs or blocks)", kMaxNesting));
    }
    ~Nesting() { --p.nesting_; }
  };

  int depth(const ExprP& e) const {
    auto it = depth_.find(e);
    return it == depth_.end() ? 1 : it->second;
  }
  // Records the depth of a new node; null (and an error) when it is too deep.
  ExprP bounded(ExprP e) {
    int d = 0;
    for (const ExprP& a : e->args) d = std::max(d, depth(a));
    if (++d > kMaxExprDepth) {
      error(e->loc, "too-deep", fmt::format("expression too long or too deeply nested (more than {} levels); split "
                                            "it into several statements", kMaxExprDepth));
      return nullptr;
    }
    depth_[e] = d;
    return e;
  }

  // ---- token helpers ---------------------------------------------------------------------------
  const Token& cur() const { return t_[p_]; }
  const Token& peek(int k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool at(Tok k) const { return cur().kind == k; }
  bool is_keyword(std::string_view kw) const { return at(Tok::Name) && cur().text == kw; }
  static std::string what(const Token& t) {
    if (t.kind == Tok::Name) return fmt::format("'{}'", t.text);
    if (t.kind == Tok::Number) return fmt::format("number {}", t.text);
    if (t.kind == Tok::String) return fmt::format("string \"{}\"", t.text);
    return describe(t.kind);
  }
  void error(SourceLoc loc, const char* kind, std::string msg) {
    if (!in_error_) d_.error(loc, kind, std::move(msg));
    in_error_ = true;
  }
  bool expect(Tok k, std::string_view context) {
    if (at(k)) { ++p_; return true; }
    error(cur().loc, "syntax", fmt::format("expected {} {}, found {}", describe(k), context, what(cur())));
    return false;
  }
  bool expect_name(std::string& out, std::string_view what_for) {
    if (at(Tok::Name)) { out = cur().text; ++p_; return true; }
    error(cur().loc, "syntax", fmt::format("expected {}, found {}", what_for, what(cur())));
    return false;
  }
  // Skips to the start of the next line (past any block opened on it).
  void sync_line() {
    while (!at(Tok::End) && !at(Tok::Newline)) ++p_;
    if (at(Tok::Newline)) ++p_;
    if (at(Tok::Indent)) skip_block();
    in_error_ = false;
  }
  void skip_block() {
    int depth = 0;
    do {
      if (at(Tok::Indent)) ++depth;
      if (at(Tok::Dedent)) --depth;
      ++p_;
    } while (depth > 0 && !at(Tok::End));
    in_error_ = false;
  }

  // ---- statements ------------------------------------------------------------------------------
  std::optional<FuncDef> funcdef() {
    FuncDef f;
    f.loc = cur().loc;
    ++p_;  // def
    bool ok = expect_name(f.name, "a function name") && expect(Tok::LParen, "after the function name");
    while (ok && !at(Tok::RParen)) {
      std::string param;
      ok = expect_name(param, "a parameter name");
      if (ok) f.params.push_back(param);
      if (ok && !at(Tok::RParen)) ok = expect(Tok::Comma, "between parameters");
    }
    ok = ok && expect(Tok::RParen, "") && expect(Tok::Colon, "after the parameters");
    if (!ok) { sync_line(); return std::nullopt; }
    if (!block(f.body)) return std::nullopt;
    return f;
  }

  // NEWLINE INDENT stmt+ DEDENT
  bool block(std::vector<StmtP>& body) {
    if (!expect(Tok::Newline, "after ':'")) { sync_line(); return false; }
    if (!at(Tok::Indent)) {
      error(cur().loc, "bad-indent", "expected an indented block");
      in_error_ = false;
      return false;
    }
    Nesting n(*this, cur().loc);
    if (!n.ok) {
      skip_block();
      return false;
    }
    ++p_;
    while (!at(Tok::Dedent) && !at(Tok::End)) {
      if (at(Tok::Newline)) { ++p_; continue; }
      if (at(Tok::Indent)) {
        error(cur().loc, "bad-indent", "unexpected indentation");
        skip_block();
        continue;
      }
      if (is_keyword("def")) {
        error(cur().loc, "syntax", "function definitions are only allowed at the top level");
        sync_line();
        continue;
      }
      if (auto s = statement()) body.push_back(s);
    }
    if (at(Tok::Dedent)) ++p_;
    return true;
  }

  StmtP statement() {
    in_error_ = false;
    if (is_keyword("for")) return for_stmt();
    SourceLoc loc = cur().loc;
    ExprP lhs = expression();
    if (!lhs) { sync_line(); return nullptr; }
    std::optional<AssignOp> op;
    switch (cur().kind) {
      case Tok::Assign: op = AssignOp::Set; break;
      case Tok::PlusAssign: op = AssignOp::Add; break;
      case Tok::MinusAssign: op = AssignOp::Sub; break;
      case Tok::StarAssign: op = AssignOp::Mul; break;
      case Tok::SlashAssign: op = AssignOp::Div; break;
      default: break;
    }
    StmtP s;
    if (op) {
      ++p_;
      if (lhs->kind != ExprKind::Name && lhs->kind != ExprKind::Index && lhs->kind != ExprKind::Attr) {
        error(lhs->loc, "bad-assign-target", "cannot assign to this expression");
        sync_line();
        return nullptr;
      }
      ExprP rhs = expression();
      if (!rhs) { sync_line(); return nullptr; }
      s = Stmt::assign(lhs, *op, rhs, loc);
    } else {
      if (lhs->kind != ExprKind::Call) {
        error(lhs->loc, "useless-expression", "expression statement has no effect (expected an assignment or a call)");
        sync_line();
        return nullptr;
      }
      s = Stmt::call(lhs, loc);
    }
    if (!at(Tok::Newline) && !at(Tok::End)) {
      error(cur().loc, "syntax", fmt::format("unexpected {} at the end of the statement", what(cur())));
      sync_line();
      return nullptr;
    }
    if (at(Tok::Newline)) ++p_;
    return s;
  }

  StmtP for_stmt() {
    SourceLoc loc = cur().loc;
    ++p_;  // for
    std::string var, parent, method;
    SourceLoc iter_loc;
    bool ok = expect_name(var, "a loop variable");
    if (ok && !is_keyword("in")) {
      error(cur().loc, "syntax", fmt::format("expected 'in', found {}", what(cur())));
      ok = false;
    }
    if (ok) {
      ++p_;
      iter_loc = cur().loc;
      ok = expect_name(parent, "an iterator such as g.edges()") && expect(Tok::Dot, "in the iterator");
    }
    SourceLoc method_loc = cur().loc;
    ok = ok && expect_name(method, "an iterator method") && expect(Tok::LParen, "after the iterator method") &&
         expect(Tok::RParen, "(iterators take no arguments)") && expect(Tok::Colon, "after the loop header");
    if (!ok) { sync_line(); return nullptr; }
    static const std::pair<const char*, LoopKind> kMethods[] = {
        {"edges", LoopKind::Edges},
        {"dst_nodes", LoopKind::DstNodes},
        {"src_nodes", LoopKind::SrcNodes},
        {"nodes", LoopKind::DstNodes},
        {"incoming_edges", LoopKind::IncomingEdges},
        {"outgoing_edges", LoopKind::OutgoingEdges},
        {"src_etype_pairs", LoopKind::SrcPairs},
    };
    std::optional<LoopKind> kind;
    for (auto& [n, k] : kMethods)
      if (method == n) kind = k;
    if (!kind) {
      error(method_loc, "unknown-iterator",
            fmt::format("unknown iterator '{}'; expected edges, dst_nodes, src_nodes, src_etype_pairs, "
                        "incoming_edges or outgoing_edges",
                        method));
      in_error_ = false;
    }
    std::vector<StmtP> body;
    if (!block(body) || !kind) return nullptr;
    return Stmt::for_loop(var, *kind, parent, std::move(body), loc);
  }

  // ---- expressions -----------------------------------------------------------------------------
  // expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)* ; unary := '-' unary | postfix
  ExprP expression() {
    Nesting n(*this, cur().loc);
    if (!n.ok) return nullptr;
    ExprP lhs = term();
    while (lhs && (at(Tok::Plus) || at(Tok::Minus))) {
      Token op = cur();
      ++p_;
      ExprP rhs = term();
      if (!rhs) return nullptr;
      lhs = bounded(Expr::binary(op.kind == Tok::Plus ? BinOp::Add : BinOp::Sub, lhs, rhs, op.loc));
    }
    return lhs;
  }
  ExprP term() {
    ExprP lhs = unary();
    while (lhs && (at(Tok::Star) || at(Tok::Slash))) {
      Token op = cur();
      ++p_;
      ExprP rhs = unary();
      if (!rhs) return nullptr;
      lhs = bounded(Expr::binary(op.kind == Tok::Star ? BinOp::Mul : BinOp::Div, lhs, rhs, op.loc));
    }
    return lhs;
  }
  ExprP unary() {
    if (at(Tok::Minus)) {
      SourceLoc loc = cur().loc;
      Nesting n(*this, loc);
      if (!n.ok) return nullptr;
      ++p_;
      ExprP x = unary();
      return x ? bounded(Expr::neg(x, loc)) : nullptr;
    }
    return postfix();
  }
  ExprP postfix() {
    ExprP e = atom();
    while (e) {
      if (at(Tok::Dot)) {
        ++p_;
        SourceLoc loc = cur().loc;
        std::string attr;
        if (!expect_name(attr, "an attribute name after '.'")) return nullptr;
        if (at(Tok::LParen)) {
          error(cur().loc, "syntax", fmt::format("method call '.{}()' is only allowed as a loop iterator", attr));
          return nullptr;
        }
        e = bounded(Expr::attr(e, attr, loc));
      } else if (at(Tok::LBracket)) {
        SourceLoc loc = cur().loc;
        ++p_;
        ExprP idx = expression();
        if (!idx || !expect(Tok::RBracket, "after the subscript")) return nullptr;
        e = bounded(Expr::index(e, idx, loc));
      } else if (at(Tok::LParen)) {
        if (e->kind != ExprKind::Name) {
          error(cur().loc, "syntax", "only named functions can be called");
          return nullptr;
        }
        ++p_;
        std::vector<ExprP> args;
        while (!at(Tok::RParen)) {
          ExprP a = expression();
          if (!a) return nullptr;
          args.push_back(a);
          if (!at(Tok::RParen) && !expect(Tok::Comma, "between arguments")) return nullptr;
        }
        ++p_;
        e = bounded(Expr::call(e->name, std::move(args), e->loc));
      } else {
        break;
      }
    }
    return e;
  }
  ExprP atom() {
    Token t = cur();
    switch (t.kind) {
      case Tok::Number: {
        ++p_;
        bool is_int = t.text.find_first_of(".eE") == std::string::npos;
        double v = std::strtod(t.text.c_str(), nullptr);
        if (!std::isfinite(v)) {
          error(t.loc, "bad-number", fmt::format("number '{}' is out of range", t.text));
          return nullptr;
        }
        return Expr::number_lit(v, is_int, t.loc);
      }
      case Tok::String: ++p_; return Expr::string_lit(t.text, t.loc);
      case Tok::Name: {
        if (is_language_keyword(t.text)) {
          error(t.loc, "syntax", fmt::format("unexpected keyword '{}'", t.text));
          return nullptr;
        }
        ++p_;
        return Expr::name_ref(t.text, t.loc);
      }
      case Tok::LParen: {
        ++p_;
        ExprP e = expression();
        if (!e || !expect(Tok::RParen, "to close '('")) return nullptr;
        return e;
      }
      default:
        error(t.loc, "syntax", fmt::format("expected an expression, found {}", what(t)));
        return nullptr;
    }
  }

  // ---- header pieces -----------------------------------------------------------------------------
  // name ':' per '[' dims ']' (key '=' value)*
  bool tensor_decl(TensorDecl& td) {
    td.loc = cur().loc;
    std::string per;
    SourceLoc per_loc;
    if (!expect_name(td.name, "a tensor name") || !expect(Tok::Colon, "after the tensor name")) return false;
    per_loc = cur().loc;
    if (!expect_name(per, "node, edge, etype, ntype or none")) return false;
    auto p = parse_per(per);
    if (!p) {
      error(per_loc, "bad-value", fmt::format("unknown indexing '{}'", per));
      return false;
    }
    td.per = *p;
    if (!expect(Tok::LBracket, "before the shape")) return false;
    while (!at(Tok::RBracket)) {
      ExprP d = expression();
      if (!d) return false;
      td.shape_exprs.push_back(d);
      if (!at(Tok::RBracket) && !expect(Tok::Comma, "between dimensions")) return false;
    }
    ++p_;
    while (at(Tok::Name)) {
      Token key = cur();
      ++p_;
      if (!expect(Tok::Assign, "after the attribute name")) return false;
      Token val = cur();
      ++p_;
      if (key.text == "from_graph" && val.kind == Tok::String) td.from_graph = val.text;
      else if (key.text == "init" && val.kind == Tok::String) td.init = val.text;
      else if (key.text == "requires_grad" && val.kind == Tok::Number) td.requires_grad = val.text != "0";
      else if (key.text == "placement" && val.kind == Tok::String && (val.text == "unified" || val.text == "device"))
        td.unified = val.text == "unified";
      else if (key.text == "rows" && val.kind == Tok::String && (val.text == "indexed" || val.text == "nodes"))
        td.indexed_rows = val.text == "indexed";
      else {
        error(key.loc, "bad-value", fmt::format("bad tensor attribute '{}'", key.text));
        return false;
      }
    }
    return true;
  }

  bool option(Options& o) {
    Token key = cur();
    std::string k;
    if (!expect_name(k, "an option name") || !expect(Tok::Assign, "after the option name")) return false;
    Token val = cur();
    ++p_;
    auto number = [&](int& out) {
      if (val.kind != Tok::Number) return false;
      out = std::atoi(val.text.c_str());
      return true;
    };
    bool ok = false;
    if (k == "materialization" && val.kind == Tok::String) {
      if (auto m = parse_materialization(val.text)) { o.materialization = *m; ok = true; }
    } else if (k == "compact_relations" && val.kind == Tok::Number) {
      char* end = nullptr;
      double theta = std::strtod(val.text.c_str(), &end);
      ok = *end == '\0' && theta >= 0 && theta <= 1;
      if (ok) o.compact_relations = theta;
    } else if (k == "reorder" && val.kind == Tok::String) {
      if (auto r = parse_reorder(val.text)) { o.reorder = *r; ok = true; }
    } else if (k == "recompute" && val.kind == Tok::String) {
      if (auto r = parse_recompute(val.text)) { o.recompute = *r; ok = true; }
    } else if (k == "dtype" && val.kind == Tok::String) {
      if (auto dt = parse_dtype(val.text)) { o.dtype = *dt; ok = true; }
    } else if (k == "gemm_tile") {
      ok = number(o.schedule.gemm_tile);
    } else if (k == "gemm_coarsen") {
      ok = number(o.schedule.gemm_coarsen);
    } else if (k == "traversal_threads") {
      ok = number(o.schedule.traversal_threads);
    } else if (k == "traversal_edge_batch") {
      int b = 0;
      ok = number(b) && valid_edge_batch(b);
      if (ok) o.schedule.traversal_edge_batch = b;
    } else if (k == "traversal_row_lanes") {
      int g = 0;
      ok = number(g) && valid_row_lanes(g);
      if (ok) o.schedule.traversal_row_lanes = g;
    } else if (k == "gather_sum_row_lanes") {
      int g = 0;
      ok = number(g) && valid_row_lanes(g);
      if (ok) o.schedule.gather_sum_row_lanes = g;
    } else if (k == "gather_sum_group_rows_below") {
      int n = 0;
      ok = number(n) && n >= 0 && valid_group_rows_below(n);
      if (ok) o.schedule.gather_sum_group_rows_below = n;
    } else if (k == "traversal_vector") {
      int v = 0;
      ok = number(v) && valid_vector(v);
      if (ok) o.schedule.traversal_vector = v;
    } else if (k == "traversal_position_indices") {
      int v = 0;
      ok = number(v) && inter::valid_position_indices(v);
      if (ok) o.schedule.traversal_position_indices = v;
    } else if (k == "launch_bounds") {
      int lb = 0;
      ok = number(lb);
      o.schedule.launch_bounds = lb;
    }
    if (!ok) error(key.loc, "bad-value", fmt::format("bad option '{}'", k));
    return ok;
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  Diagnostics& d_;
  bool in_error_ = false;  // suppresses cascades until the parser resynchronises
  int nesting_ = 0;
  std::unordered_map<ExprP, int> depth_;  // of the nodes made by bounded(); leaves are 1 deep
};

}  // namespace

bool is_language_keyword(std::string_view word) {
  static const std::set<std::string, std::less<>> kKeywords = {"for", "in", "def", "if", "else", "while", "return", "lambda"};
  return kKeywords.count(word) > 0;
}

std::string bare_name_reason(std::string_view name) {
  if (is_language_keyword(name)) return "is a keyword of the model language: the program could not name it";
  if (name == "g") return "is the graph in the model language: the program could not name it";
  return "";
}

bool parse_program(const ProgramText& program, Module& module, Diagnostics& diags, NameSpace names) {
  int before = diags.error_count();
  auto toks = lex(program, diags, names);
  if (diags.error_count() != before) return false;
  Parser(std::move(toks), diags).program(module, /*allow_functions=*/true);
  return diags.error_count() == before;
}

std::optional<Module> parse_module(const ProgramText& text, Diagnostics& diags) {
  int before = diags.error_count();
  auto toks = lex(text, diags, NameSpace::Compiler);
  if (diags.error_count() != before) return std::nullopt;
  Parser p(std::move(toks), diags);
  Module m;
  if (!p.header(m.decl)) return std::nullopt;
  if (!evaluate_declarations(m.decl, diags)) return std::nullopt;
  p.program(m, /*allow_functions=*/true);
  if (diags.error_count() != before) return std::nullopt;
  return m;
}

ExprP parse_expression(const ProgramText& text, Diagnostics& diags) {
  int before = diags.error_count();
  auto toks = lex(text, diags);
  if (diags.error_count() != before) return nullptr;
  return Parser(std::move(toks), diags).lone_expression();
}

}  // namespace hectorgen::dsl
