// The inter-operator IR: the model as the thesis writes it (Python-like loops over the graph), as plain
// data. Nodes are immutable and shared; passes build new trees. Meaning (domains, shapes) is computed by
// the verifier (verifier.h) and kept beside the tree, never inside it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "diag/source.h"

namespace hectorgen::inter {

// ---------------------------------------------------------------------------------------------------
// Expressions
// ---------------------------------------------------------------------------------------------------
enum class ExprKind {
  Number,  // 1.0, 64
  String,  // "att"
  Name,    // hs, W0, heads, g
  Attr,    // base.name          e.src, n.feature, e.etype
  Index,   // base[index]        e["att"], W[e.etype]
  Call,    // name(args...)      exp(x), dot(a, b), edge_softmax(g, "att")
  Binary,  // lhs op rhs
  Neg,     // -operand
};

enum class BinOp { Add, Sub, Mul, Div };

struct Expr;
using ExprP = std::shared_ptr<const Expr>;

struct Expr {
  ExprKind kind = ExprKind::Number;
  SourceLoc loc;
  double number = 0;      // Number
  bool is_integer = false;  // Number: written without a fraction
  std::string name;       // Name, Attr (attribute), Call (callee), String (value)
  BinOp op = BinOp::Add;  // Binary
  std::vector<ExprP> args;  // Attr/Index: {base[, index]}; Call: arguments; Binary: {lhs, rhs}; Neg: {x}

  static ExprP number_lit(double v, bool is_integer, SourceLoc loc = {});
  static ExprP string_lit(std::string v, SourceLoc loc = {});
  static ExprP name_ref(std::string n, SourceLoc loc = {});
  static ExprP attr(ExprP base, std::string attribute, SourceLoc loc = {});
  static ExprP index(ExprP base, ExprP idx, SourceLoc loc = {});
  static ExprP call(std::string callee, std::vector<ExprP> args, SourceLoc loc = {});
  static ExprP binary(BinOp op, ExprP lhs, ExprP rhs, SourceLoc loc = {});
  static ExprP neg(ExprP x, SourceLoc loc = {});
};

// ---------------------------------------------------------------------------------------------------
// Statements
// ---------------------------------------------------------------------------------------------------
enum class LoopKind { Edges, DstNodes, SrcNodes, IncomingEdges, OutgoingEdges };
enum class AssignOp { Set, Add, Sub, Mul, Div };
enum class StmtKind { For, Assign, Call };

struct Stmt;
using StmtP = std::shared_ptr<const Stmt>;

struct Stmt {
  StmtKind kind = StmtKind::Assign;
  SourceLoc loc;
  // For: `for var in <graph or parent>.<loop>():`
  std::string var;
  LoopKind loop = LoopKind::Edges;
  std::string parent;  // "g" for graph loops, the node variable for incoming/outgoing edges
  std::vector<StmtP> body;
  // Assign: target op= value
  ExprP target;
  AssignOp op = AssignOp::Set;
  ExprP value;  // Assign: right-hand side; Call: the call expression

  static StmtP for_loop(std::string var, LoopKind loop, std::string parent, std::vector<StmtP> body,
                        SourceLoc loc = {});
  static StmtP assign(ExprP target, AssignOp op, ExprP value, SourceLoc loc = {});
  static StmtP call(ExprP call, SourceLoc loc = {});
};

struct FuncDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<StmtP> body;
  SourceLoc loc;
};

// ---------------------------------------------------------------------------------------------------
// Declarations (from the spec's YAML/JSON, or the header of the printed IR)
// ---------------------------------------------------------------------------------------------------
enum class Per { Node, Edge, Etype, Ntype, None };

struct HyperParam {
  std::string name;
  ExprP expr;        // as written: a number, or an expression over earlier hyper-parameters
  double value = 0;  // evaluated
  bool is_integer = true;
  SourceLoc loc;
};

struct TensorDecl {
  std::string name;
  Per per = Per::Node;
  std::vector<ExprP> shape_exprs;  // as written
  std::vector<int64_t> shape;      // evaluated
  std::string from_graph;          // inputs: computed from the graph by preprocessing (e.g. norms)
  bool requires_grad = true;       // inputs and weights
  std::string init;                // weights: "glorot" (default), "ones", "zeros"
  SourceLoc loc;
};

enum class Materialization { Vanilla, Compact, Auto };
enum class DType { FP32, TF32, BF16, FP16 };

struct Schedule {
  int gemm_tile = 16;      // output tile edge (rows and columns) of GEMM instances
  int gemm_coarsen = 1;    // elements per thread: 1, 2 or 4
  int traversal_threads = 256;
  std::optional<int> launch_bounds;  // GEMM __launch_bounds__ min blocks per SM
};

struct Options {
  Materialization materialization = Materialization::Vanilla;
  bool reorder = false;
  DType dtype = DType::FP32;
  Schedule schedule;
};

struct ModelDecl {
  std::string name;
  std::vector<HyperParam> hyper;
  std::vector<TensorDecl> inputs;
  std::vector<TensorDecl> weights;
  std::vector<TensorDecl> outputs;
  Options options;
  SourceLoc loc;

  const HyperParam* find_hyper(std::string_view n) const;
  const TensorDecl* find_input(std::string_view n) const;
  const TensorDecl* find_weight(std::string_view n) const;
  const TensorDecl* find_output(std::string_view n) const;
};

struct Module {
  ModelDecl decl;
  std::vector<FuncDef> functions;
  std::vector<StmtP> body;
};

// ---------------------------------------------------------------------------------------------------
// Small helpers shared by the printer, verifier and passes
// ---------------------------------------------------------------------------------------------------
const char* to_string(Per p);
const char* to_string(LoopKind k);
const char* to_string(AssignOp op);  // "=", "+=", ...
const char* to_string(BinOp op);
const char* to_string(Materialization m);
const char* to_string(DType d);
std::optional<Per> parse_per(std::string_view s);
std::optional<Materialization> parse_materialization(std::string_view s);
std::optional<DType> parse_dtype(std::string_view s);

// True for the loops whose variable is an edge.
inline bool is_edge_loop(LoopKind k) {
  return k == LoopKind::Edges || k == LoopKind::IncomingEdges || k == LoopKind::OutgoingEdges;
}

// Names of the built-in functions of the DSL (the last three mostly appear in generated backward code:
// sum reduces the last axis, linear_t(y, W) is y times W transposed, leakyrelu_grad(x, s) is 1 or s;
// max(a, b) is element-wise, max_grad(a, b) is 1 where a >= b, else 0).
const std::set<std::string, std::less<>>& builtin_functions();

// Names must be identifiers (the sigil of derived names, ir/inter/names.h, included). Returns "" when
// `name` is one, otherwise why not (to follow "'<name>' "). Keywords are fine: the emitters mangle what
// collides in a target language (emit/names.h); reserved_name_reason() says what users cannot name.
std::string bad_name_reason(std::string_view name);

// `x = max(x, v)`: a max-aggregation (legal where `+=` is: into a node from its edges).
bool is_max_aggregation(const Stmt& s);

// Structural equality (ignores source locations).
bool equal(const ExprP& a, const ExprP& b);
bool equal(const StmtP& a, const StmtP& b);

}  // namespace hectorgen::inter
