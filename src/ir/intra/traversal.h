// Traversal instances of the intra-operator IR: a small explicit program per kernel, one warp per row.
//
// A traversal instance holds every decision the CUDA printer needs, so the printer decides nothing:
//
//   rows        the row loop: edges (walked in edge-type-sorted order), dst_nodes, src_nodes, or the unique
//               (source, edge type) pairs of compact materialization (src_etype_pairs, ordered by (etype, source));
//               one warp owns one row at a time (grid-stride loop over the rows)
//   for         inner loops over the incoming (csr_by_dst) or outgoing (csr_by_src) edges of the row node
//   index       an integer read from a graph array: e_src = src[e], e_etype = etype[e]; in a node's edge loop
//               by the CSR position: e_src = in_src[i_e], e_etype = in_etype[i_e], e_pair = in_pair[i_e]
//   let / var   a register value (immutable / mutable) with its type: shape and per-lane layout.
//               `lanes`: element i sits in lane i % 32, slot i / 32 (vectors of 32 or more elements);
//               `replicated`: every lane holds every element (scalars and short vectors).
//               Defined by a load of a tensor row (each lane its elements; every lane all of them; or,
//               `by lane0`, lane 0 and a shuffle to the others), an element-wise expression, or a
//               reduction of the last axis (a warp reduction when the reduced value is spread over the
//               lanes, else per lane).
//   x op= v     an update of a mutable register (node aggregates and edge fields kept in registers)
//   store       a register into a tensor row: lane-partitioned (each lane its own elements), by lane 0
//               (replicated values), or atomically added (scatters into other rows)
//   sync        __syncwarp(): orders the warp's global-memory accesses (a lane-0 store read back by the
//               other lanes, or a row the other lanes read before lane 0 overwrites it)
//   # text      the source statement the following instructions implement (printed as a comment)
//
// Text form (see intra.h for the whole program):
//
//   traversal rgat_fw_nodes_att_max: rows=dst_nodes(n) threads=256
//       # n["att_max"] = -1e+30
//       var v_att_max: [1] replicated(1) = -1e+30
//       for e in csr_by_dst.incoming(n) at i_e:
//           # n["att_max"] = max(n["att_max"], e["att"])
//           let v_att: [1] replicated(1) = load att[e]
//           v_att_max = max(v_att_max, v_att)
//       sync
//       for e in csr_by_dst.incoming(n) at i_e:
//           # e["att"] = exp(e["att"] - e.dst["att_max"])
//           var v_att: [1] replicated(1) = load att[e] by lane0
//           v_att = exp(v_att - v_att_max)
//           store att[e] = v_att by lane0
//       ...
//
// (edge rows print as `rows=etype_sorted_coo.edges(e)`).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ir/inter/ir.h"
#include "ir/inter/ops.h"

namespace hectorgen::intra {

// ---------------------------------------------------------------------------------------------------
// Register types
// ---------------------------------------------------------------------------------------------------
enum class LaneLayout { Lanes, Replicated };

struct RegType {
  std::vector<int64_t> shape;
  LaneLayout layout = LaneLayout::Replicated;
  int64_t numel() const;
  int64_t slots(int row_lanes = 32) const;  // registers per lane, for rows held by `row_lanes` lanes
  bool operator==(const RegType&) const = default;
};

// The layout the lowering gives a value of `numel` elements: 32 or more are spread over the lanes.
LaneLayout layout_for(int64_t numel);
const char* to_string(LaneLayout l);

// ---------------------------------------------------------------------------------------------------
// Element-wise values over registers
// ---------------------------------------------------------------------------------------------------
// The operators are the element-wise rows of the operator table (inter::Form::Map: its name and syntax in
// the text, its CUDA spelling, its float64 evaluation); a constant parameter (leakyrelu's slope) is a constant
// argument.
struct Value;
using ValueP = std::shared_ptr<const Value>;

struct Value {
  enum class Kind { Reg, Const, Op };
  Kind kind = Kind::Const;
  std::string reg;    // Reg
  double number = 0;  // Const
  inter::Op op{};     // Op
  std::vector<ValueP> args;

  static ValueP reg_ref(std::string name);
  static ValueP constant(double v);
  static ValueP apply(inter::Op op, std::vector<ValueP> args);
};

// True for the operators a value may apply (the table's element-wise rows).
bool is_elementwise(inter::Op op);
// The operator's value on scalars, in float64 (the table's evaluation).
double evaluate(inter::Op op, const std::vector<double>& args);
// Infix operators bind as in C, C++ and Python: 1 additive, 2 multiplicative; 3 prefix; 4 anything else.
int binding(inter::Op op);

bool equal(const ValueP& a, const ValueP& b);
// Registers a value reads, in first-use order, without repeats.
std::vector<std::string> regs_of(const ValueP& v);

// ---------------------------------------------------------------------------------------------------
// Instructions
// ---------------------------------------------------------------------------------------------------
// Graph arrays an index reads: src/dst/etype are indexed by edge id, in_src/out_dst by the position in a
// CSR (the inner loop's position variable), ntype by node id; pair_src/pair_etype by pair (the pair's source and
// edge type), edge_pair by edge id (the edge's (source, edge type) pair), in_pair by the position in the CSR of
// incoming edges (edge_pair of the edge there: where edges are numbered in relation order, a node's in-edges have
// scattered ids, and in_pair[i] is one coalesced read where edge_pair[in_eid[i]] is a second, random one);
// in_etype / out_etype the relation of the edge at a position of the incoming / outgoing CSR, likewise.
enum class GraphArray { Src, Dst, Etype, InSrc, OutDst, Ntype, PairSrc, PairEtype, EdgePair, InPair, InEtype, OutEtype };
const char* to_string(GraphArray a);
std::optional<GraphArray> parse_graph_array(std::string_view s);
std::string graph_array_names();  // every graph array's name, comma separated (for error messages)

struct Comment {
  std::string text;
};

struct IndexDef {
  std::string name;
  GraphArray array = GraphArray::Src;
  std::string of;  // an edge variable, a loop position, or the row node
};

struct Load {
  std::string tensor;
  std::string row;     // a row variable or index; "0" for a weight without rows
  bool lane0 = false;  // replicated values: lane 0 loads, the other lanes get it by a shuffle (a row lane 0
                       // also stores is then touched by lane 0 alone); else every lane loads
};
struct Eval {
  ValueP value;
};
enum class ReduceOp { Sum, Max };
struct Reduce {
  ReduceOp op = ReduceOp::Sum;
  bool warp = true;  // over the lanes (the value is spread over them), or within each lane (replicated)
  ValueP value;      // the reduced element-wise value
  int64_t axis = 1;  // size of its last axis, the one reduced
};
using Source = std::variant<Load, Eval, Reduce>;

struct Def {
  std::string name;
  bool is_mutable = false;  // var (updated later) or let
  RegType type;
  Source source;
};

struct Update {
  std::string name;
  inter::AssignOp op = inter::AssignOp::Set;
  ValueP value;
};

enum class StoreLanes { Partitioned, Lane0 };
struct Store {
  std::string tensor;
  std::string row;
  std::string reg;
  StoreLanes lanes = StoreLanes::Partitioned;
  bool atomic = false;  // atomicAdd into the row (a scatter into rows other warps also own)
};

struct Sync {};

struct Instr;
// An inner loop runs in one of two ways:
//   whole warp  every lane runs every iteration (the body may hold `lanes` vectors and warp reductions);
//   split       (`at i_e split`) the lanes split the iterations: lane l runs positions begin + l,
//               begin + l + 32, ...  Inside, a `replicated` register holds the lane's own edge's value,
//               loads and stores `by lane0` are made by every lane for its own edge, and an update of a
//               register of the enclosing scope is an accumulation (`x += v`, or `x = max(x, v)`) whose
//               per-lane shares combine over the warp after the loop, so every lane holds the total again.
// split_edge_loops() splits the loops whose body allows it (split_blocker); a loop of scalar work then
// takes ceil(degree / 32) steps instead of degree steps of dependent loads.
struct EdgeLoop {
  std::string var;    // the edge id
  std::string pos;    // the position in the CSR
  inter::LoopKind kind = inter::LoopKind::IncomingEdges;  // IncomingEdges or OutgoingEdges
  std::string node;   // the row node
  std::vector<Instr> body;
  bool split = false;  // the lanes split the iterations (above)
};

struct Instr {
  std::variant<Comment, IndexDef, Def, Update, Store, Sync, EdgeLoop> v;
};

// ---- the lane layout of `lanes` registers -------------------------------------------------------------------
// A register of n elements spread over a row's G lanes has S = ceil(n / G) slots per lane. Its slots come in runs
// of V = slot_vector(n, S, vector) elements that are consecutive in the row: slot j of lane l holds element
// (l + G (j / V)) V + j % V. V = S: lane l holds elements l S .. l S + S - 1 (a lane's slots are one block);
// V = 1: element l + G j (the lanes interleave). A run is loaded and stored with one access of V elements (two
// for 8 fp32 values): 16 bytes for 8 bf16 or 4 fp32 values, where scalar accesses took 8 or 4.
inline constexpr int kDefaultVector = 8;
// The run length of a register of `numel` elements in `slots` slots: the largest power of two up to `vector` that
// divides both (a run never crosses the row's end: it is whole in the row or wholly past it).
int slot_vector(int64_t numel, int64_t slots, int vector);

struct TraversalInstance {
  std::string name;
  inter::LoopKind rows = inter::LoopKind::Edges;  // Edges, DstNodes, SrcNodes or SrcPairs
  std::string row;                                 // the row variable
  int threads = 256;
  int edge_batch = 1;  // edges a warp's (fetched) edge loop takes per step: inter::Schedule::traversal_edge_batch
  // Lanes per row (32, 16 or 8; inter::Schedule::traversal_row_lanes): below 32 each warp holds 32 / row_lanes
  // consecutive rows, which run in step (warp-wide trip counts; a row past the last repeats it and stores nothing).
  int row_lanes = 32;
  // The most consecutive elements of a row one lane holds (1, 2, 4 or 8; inter::Schedule::traversal_vector, 8
  // under auto): a `lanes` register's slots come in runs of slot_vector(numel, slots, vector) elements, each run
  // loaded and stored with one vector access (the layout above).
  int vector = kDefaultVector;
  std::vector<Instr> body;
};

// Identifiers a traversal kernel cannot give its variables: what the CUDA printer declares or calls in
// every kernel (lane, first_row, warp_sum, the graph arrays, ...), C++ keywords and CUDA built-ins.
bool is_kernel_reserved(std::string_view name);

// The graph layout a loop walks (etype_sorted_coo for edge rows, compact_src_etype for pair rows, csr_by_dst /
// csr_by_src for inner loops), or "" (node rows: the nodes in order).
const char* walked_layout(inter::LoopKind k);
// The graph layouts an instance reads beyond those its loops walk: csr_by_dst_pairs where it reads in_pair.
std::set<std::string> read_layouts(const TraversalInstance& t);
// Calls `fn` on every instruction of `body` in program order, an edge loop before the instructions of its body.
void for_each_instr(const std::vector<Instr>& body, const std::function<void(const Instr&)>& fn);

// Why the lanes cannot split the loop's iterations, or "" when they can: the body holds only scalar or
// short `replicated` work (no `lanes` vectors, warp reductions, nested loops or syncs), stores only into the
// loop edge's own rows (or atomically), and updates registers of the enclosing scope only by accumulation
// (`+=` of a value that does not read the register, or `x = max(x, v)`), reading them nowhere else.
std::string split_blocker(const EdgeLoop& l);
// Whether each thread can take a row of its own, instead of a warp per row: the body is scalar work only (every
// register `replicated`, no warp reductions, loops or syncs) and stores only into the row's own entries (or
// atomically). Per-edge scalar kernels (RGAT's and HGT's attention gradients) then use all 32 lanes.
bool one_thread_per_row(const TraversalInstance& t);
// Splits every inner loop of the instance that split_blocker allows and unsplits the others; run before
// insert_warp_syncs (a split loop's accesses belong to the lane that owns the edge).
void split_edge_loops(TraversalInstance& t);
// Why the instance's rows cannot be held by fewer than 32 lanes, or "" when they can: a warp's rows run in
// step, so every loop the lanes walk together must be a fetched one (whose trip count the printer makes the
// same for the warp: no nested loop or sync in its body) or split, and no pair's relation may be searched
// (the whole warp searches one row's). One thread per row needs no lanes at all.
std::string row_lanes_blocker(const TraversalInstance& t);
// The lanes per row auto gives the instance: 8 where its rows reduce over their lanes or split their edges over
// them (attention: each edge's dot product and the softmax's maximum and sum wait on shuffles, and more rows per
// warp hide more of that), else 16 (plain sums over the edges, where a warp's 4 rows walking in step to the
// longest one's degree cost more than they hide); doubled while its widest `lanes` register would take more than
// 8 slots a lane, at most 32. A plain sum then halves its lanes (down to 8) while a lane's share of its widest row
// still fits one 16-byte vector run of `element_bytes` elements (rows of 64 bf16 values: 8 lanes of 8; fp32: 16 of
// 4). Measured in bench/README.md ("Lanes per row", "Vector runs").
int auto_row_lanes(const TraversalInstance& t, int element_bytes = 4);
// Sets t.row_lanes to `requested` (0: auto_row_lanes) where row_lanes_blocker allows it, else to 32; run after
// split_edge_loops. element_bytes: the rows' storage size (2 for bf16 and fp16, else 4).
void choose_row_lanes(TraversalInstance& t, int requested, int element_bytes = 4);
// The accumulation an update of an enclosing register makes in a split loop: the sum or the maximum.
ReduceOp accumulation(const Update& u);

// ---------------------------------------------------------------------------------------------------
// Text form of one traversal instance (see the top of this file); `indent` prefixes the body lines.
std::string print_traversal(const TraversalInstance& t);
std::string print_value(const ValueP& v);
std::string print_reg_type(const RegType& t, int row_lanes = 32);

// The access pattern of every load and store of an instance, in program order, for the hazard analysis.
// Cross-lane conflicts: two accesses of one tensor, at least one a store, by different lane partitions
// (lane-partitioned rows vs lane 0 vs every lane), not separated by a sync.
struct Hazard {
  std::string tensor;
  std::string first, second;  // the two accesses as IR text
};
// The first unsynchronised cross-lane conflict, if any.
std::optional<Hazard> find_warp_hazard(const TraversalInstance& t);
// Inserts the syncs the instance needs (one before a loop rather than one per iteration where that
// suffices); afterwards find_warp_hazard returns nothing.
void insert_warp_syncs(TraversalInstance& t);

}  // namespace hectorgen::intra
