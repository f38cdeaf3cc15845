// The inter-operator IR: the model as the thesis writes it (Python-like loops over the graph), as plain
// data. Nodes are immutable and shared; passes build new trees (mutator.h rebuilds only what changed).
//
// The IR is typed: type inference (verifier.h: typecheck) gives every expression its Type -- what it denotes
// (a tensor value, the graph, an edge or node, a type index, a weight, a string), and for values their
// domain, per-element shape and element dtype -- and stores it in the node. Operators are the rows of one
// table (ops.h): Call, Binary and Neg nodes carry the row's enum value (Expr::fn).
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

enum class Op : uint8_t;  // the operator table's enum (ops.h); Op{} is Op::None

// SrcPairs: the unique (source node, edge type) pairs of the graph's edges (compact materialization: a pair
// holds the values every edge with that source and type shares).
enum class LoopKind { Edges, DstNodes, SrcNodes, IncomingEdges, OutgoingEdges, SrcPairs };
// Pair: one row per unique (source node, edge type) pair (compact materialization; the backward's saved pair
// fields: never a user declaration).
enum class Per { Node, Edge, Etype, Ntype, None, Pair };
enum class DType { FP32, TF32, BF16, FP16 };

// ---------------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------------
// Where a value lives, from the least to the most varying (the domain of a combination is the maximum):
//   const      numbers and hyper-parameters, broadcast anywhere
//   weight     a weight (slice), e.g. W[e.etype] or W0
//   node       one value per node
//   edge       one value per edge; `src_etype` (Type::is_src_etype) when it depends only on the source node
//              and the edge type: one value per unique (source, edge type) pair suffices (what compact
//              materialization exploits)
enum class Domain { Const, Weight, Node, Edge };

// What an expression denotes.
enum class ValueKind : uint8_t {
  Untyped,    // not inferred yet (parser output)
  Tensor,     // a value: domain, shape, dtype
  Graph,      // g
  Edge,       // an edge loop variable
  Node,       // a node loop variable, e.src, e.dst
  Pair,       // a (source, edge type) pair: a pair loop's variable, or an edge's pair `e.pair`
  TypeIndex,  // e.etype, n.ntype
  Weight,     // a weight, or a weight gradient written with +=; W[e.etype] once selected
  String,     // "att"
};
// Node: the loop node, or an edge's (or a pair's) source / destination. Pair: the loop's pair (Loop) or the
// pair of an edge's source and type (Src, `e.pair`).
enum class NodeRole : uint8_t { Loop, Src, Dst };

struct Type {
  ValueKind kind = ValueKind::Untyped;
  // Tensor (and what Weight and TypeIndex depend on):
  Domain domain = Domain::Const;
  std::vector<int64_t> shape;  // per element (Weight: the weight's shape)
  DType dtype = DType::FP32;
  bool dep_src = false, dep_dst = false, dep_etype = false, dep_edge = false;  // edge values: what they depend on
  std::optional<double> value;  // a compile-time constant (numbers, hyper-parameters, arithmetic of those)
  // References:
  LoopKind loop = LoopKind::Edges;  // Edge: the loop that binds it
  NodeRole role = NodeRole::Loop;   // Node: the loop node, or an edge's source / destination
  bool outer = false;               // Node: an edge endpoint that is the enclosing node loop's node
  bool etype = false;               // TypeIndex: an edge type (else a node type)
  std::string weight;               // Weight: its name
  Per per = Per::None;              // Weight: how it is indexed
  bool selected = false;            // Weight: indexed by its type (W[e.etype])

  bool typed() const { return kind != ValueKind::Untyped; }
  bool is_tensor() const { return kind == ValueKind::Tensor; }
  bool is_src_etype() const { return domain == Domain::Edge && !dep_dst && !dep_edge; }
  int64_t numel() const;
  std::string str() const;  // "edge[1, 64]", "src_etype[64]", "node[]"; references: "edge", "weight W" ...
  bool operator==(const Type&) const = default;

  static Type tensor(Domain d, std::vector<int64_t> shape = {});
  static Type constant(double v);
  static Type edge_var(LoopKind loop);
  static Type node_var();
  static Type pair_var();
  static Type loop_var(LoopKind loop);  // the type a loop binds its variable to
  static Type of_kind(ValueKind k);
};

std::string shape_str(const std::vector<int64_t>& shape);

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
  BinOp op = BinOp::Add;  // Binary: how it is written
  // Call, Binary, Neg: the operator (ops.h). Call: the built-in named `name`, or Op::None for a user function
  // (inlined before type inference). Binary: Add/Sub/Mul/Div; typing turns `x * W` with a matrix weight W
  // into Op::Linear (printed as written).
  Op fn{};
  std::vector<ExprP> args;  // Attr/Index: {base[, index]}; Call: arguments; Binary: {lhs, rhs}; Neg: {x}
  Type type;                // set by type inference (typing.h); Untyped before

  // Untyped nodes (the parser's); typing.h builds typed ones.
  static ExprP number_lit(double v, bool is_integer, SourceLoc loc = {});
  static ExprP string_lit(std::string v, SourceLoc loc = {});
  static ExprP name_ref(std::string n, SourceLoc loc = {});
  static ExprP attr(ExprP base, std::string attribute, SourceLoc loc = {});
  static ExprP index(ExprP base, ExprP idx, SourceLoc loc = {});
  static ExprP call(std::string callee, std::vector<ExprP> args, SourceLoc loc = {});  // fn looked up by name
  static ExprP call(Op op, std::vector<ExprP> args, SourceLoc loc = {});
  static ExprP binary(BinOp op, ExprP lhs, ExprP rhs, SourceLoc loc = {});
  static ExprP neg(ExprP x, SourceLoc loc = {});
};

// ---------------------------------------------------------------------------------------------------
// Statements
// ---------------------------------------------------------------------------------------------------
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
  // Assign: target op= value. Once typed, target->type is the type of what the statement stores (for a
  // field: the field's shape at this point of the program; for a node field: a node value).
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
  bool unified = false;            // inputs: placement unified (read by the kernels from mapped host memory)
  // inputs (per node): rows indexed: the tensor is a table of any number of rows, and node v's row is
  // table[<name>_rows[v]] (a node-to-row map the op takes as an extra argument). Never differentiated.
  bool indexed_rows = false;
  SourceLoc loc;
};

enum class Materialization { Vanilla, Compact, Auto };
// Linear operator reordering (passes::reorder_linear): never, wherever it applies, or where its count says it pays.
enum class Reorder { Off, On, Auto };
// Rematerialization (passes::recompute_gemms): a saved per-edge or per-pair GEMM result whose operands the backward has
// anyway is recomputed by the backward instead of saved: always (on), never (off), or where that lowers the training
// step's estimated peak memory (auto).
enum class Recompute { Auto, On, Off };

struct Schedule {
  int gemm_tile = 16;      // output tile edge (rows and columns) of GEMM instances
  int gemm_coarsen = 1;    // elements per thread: 1, 2 or 4
  int traversal_threads = 256;
  std::optional<int> launch_bounds;  // GEMM __launch_bounds__ min blocks per SM
  // Edges a warp's edge loop takes per step (1, 2, 4 or 8): its iterations are unrolled that many at a time, each
  // guarded by the edge count, so that the loads of several edges are in flight together (the same sums in the
  // same order). 1: one edge after the other.
  int traversal_edge_batch = 1;
  // Lanes that hold one row of a traversal (32, 16 or 8; 0: auto, intra::auto_row_lanes): below a warp, its 2 or
  // 4 rows run in step, so that a warp has as many rows' chains of dependent loads in flight. Kernels the narrower
  // groups cannot run keep 32 (intra::row_lanes_blocker).
  int traversal_row_lanes = 0;
  // The most consecutive elements of a row one lane of a traversal holds (1, 2, 4 or 8; 0: auto, 8): a lane's
  // slots are runs of that many elements (intra::slot_vector), each loaded and stored with one vector access of up
  // to 16 bytes. 1: every slot on its own, element lane + row_lanes j (one scalar access each).
  int traversal_vector = 0;
  // How a node's edge loop reads its edges' pairs and relations: 1 by CSR position (in_pair, in_etype / out_etype:
  // one coalesced read each), 0 through the edge id (edge_pair[e], etype[e]: a second, scattered read, the kernels
  // before runtime 1.5; kept to measure the two side by side).
  int traversal_position_indices = 1;
  // Lanes that hold one row of a gather sum (the compact backward's sums over a pair's edges or a node's pairs; 32,
  // 16 or 8; 0: auto, a warp a row), tuned apart from the traversals': another template, other rows.
  int gather_sum_row_lanes = 0;
  // The average entries a row below which a gather sum with a warp a row (row_lanes 32, edge_batch 1) lets each of
  // the warp's groups of lanes take a row of its own (gather_sum_rows.cu.in), chosen at launch from the graph's
  // counts; -1: auto (intra::kAutoGroupRowsBelow, 4), 0: never.
  int gather_sum_group_rows_below = -1;
};
// The values Schedule::traversal_edge_batch may take.
inline constexpr bool valid_edge_batch(int b) { return b == 1 || b == 2 || b == 4 || b == 8; }
// The values Schedule::traversal_row_lanes may take (0: auto).
inline constexpr bool valid_row_lanes(int g) { return g == 0 || g == 8 || g == 16 || g == 32; }
// The values Schedule::traversal_vector may take (0: auto).
inline constexpr bool valid_vector(int v) { return v == 0 || v == 1 || v == 2 || v == 4 || v == 8; }
// The values Schedule::gather_sum_group_rows_below may take (-1: auto).
inline constexpr bool valid_group_rows_below(int n) { return n >= -1 && n <= 1024; }
// The values Schedule::traversal_position_indices may take.
inline constexpr bool valid_position_indices(int v) { return v == 0 || v == 1; }

struct Options {
  Materialization materialization = Materialization::Vanilla;
  // materialization: auto: the compaction threshold theta, overriding the tuning table's
  // (templates/tuning/materialization.json): the compact program compacts relation r iff its unique (source, r)
  // pairs / edges <= theta. Unset: the table's value for the GPU the graph is on.
  std::optional<double> compact_relations;
  Reorder reorder = Reorder::Off;
  Recompute recompute = Recompute::Auto;
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

// The node, edge and pair fields a program writes, by name (computed by type inference). A pair field holds
// one row per unique (source node, edge type) pair; edges read it through their pair (`e.pair["x"]`).
struct FieldInfo {
  bool on_edges = false;  // an edge field (node and pair fields: false)
  std::vector<int64_t> shape;  // per element, after the program's last write
  DType dtype = DType::FP32;
};
using FieldTable = std::map<std::string, FieldInfo>;

struct Module {
  ModelDecl decl;
  std::vector<FuncDef> functions;
  std::vector<StmtP> body;
  // Filled by type inference (empty before):
  FieldTable node_fields, edge_fields, pair_fields;
};

// ---------------------------------------------------------------------------------------------------
// Small helpers shared by the printer, verifier and passes
// ---------------------------------------------------------------------------------------------------
const char* to_string(Per p);
const char* to_string(LoopKind k);
const char* to_string(AssignOp op);  // "=", "+=", ...
const char* to_string(BinOp op);
const char* to_string(Materialization m);
const char* to_string(Reorder r);
const char* to_string(Recompute r);
const char* to_string(DType d);
std::optional<Per> parse_per(std::string_view s);
std::optional<Materialization> parse_materialization(std::string_view s);
std::optional<Reorder> parse_reorder(std::string_view s);
std::optional<Recompute> parse_recompute(std::string_view s);
std::optional<DType> parse_dtype(std::string_view s);

// True for the loops whose variable is an edge.
inline bool is_edge_loop(LoopKind k) {
  return k == LoopKind::Edges || k == LoopKind::IncomingEdges || k == LoopKind::OutgoingEdges;
}
// True for the loops over the graph itself (g.edges(), g.dst_nodes(), g.src_nodes(), g.src_etype_pairs()).
inline bool is_graph_loop(LoopKind k) {
  return k == LoopKind::Edges || k == LoopKind::DstNodes || k == LoopKind::SrcNodes || k == LoopKind::SrcPairs;
}

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
