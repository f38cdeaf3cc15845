// The intra-operator IR: the kernels of one model (one phase: forward, training forward or backward), each
// an instance of one kind. Every kind prints, parses back to the same text (parser.h), and verifies.
//
//   GEMM instance        Y[S] = X[G] · W[T]  over the rows of a node or edge loop:
//                        G gathers input rows (the edge's source or destination node), T selects each row's
//                        weight (rows are grouped in per-type segments: edges sorted by edge type, nodes by
//                        node type), S scatters output rows (atomically, into the edge's destination node);
//                        an optional per-row scalar scales the output tile before it is stored.
//   traversal instance   one warp per row (an edge, or a node and its incoming/outgoing edges) running a
//                        small explicit program: registers with their lane layout, loads, element-wise
//                        values, warp reductions, stores, syncs (traversal.h).
//   weight gradient      dW[t] (+)= sum over the rows r of type t of X[G(r)]^T · DY[G'(r)], deterministic
//                        (split-K over fixed row chunks, on tensor cores or CUDA cores).
//   segment sum          dW[t] += sum over the rows r of type t of V[r], deterministic.
//   PyTorch fallback     a statement no template expresses, run as ATen calls from the host code.
//
// Edge rows are always in edge-type-sorted order; node rows in the caller's order (sorted by node type).
// The text form of a program (print_program) holds everything the emitters read: the model's declarations
// (as in the inter-operator IR's header), the graph layouts, the tensors, then the kernels in order:
//
//   # hectorgen intra-operator IR
//   model rgat
//   phase forward
//   hyper heads = 1
//   input feature: node[in_dim]
//   ...
//   layouts csr_by_dst, csr_by_src, etype_sorted_coo
//   tensor feature: input node[64]          (a bf16/fp16 storage type follows the shape: node[64] bf16)
//   tensor t_hs: temp edge[1, 64]
//   alias msg -> t_hs
//
//   gemm rgat_fw_gemm_hs:  t_hs[row] = feature[src[row]] · W[etype]
//       rows=edges heads=1 k=64 n=64 dtype=fp32 tile=16 coarsen=1 store=plain kernel=tc
//       from: hs = reshape(e.src.feature * W[e.etype], heads, out_dim)
//
//   traversal rgat_fw_edges_att: rows=edges(e) threads=256
//       ...
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "ir/inter/ir.h"
#include "ir/intra/traversal.h"

namespace hectorgen::intra {

enum class Role { Input, Weight, Output, Field, Temp };

struct TensorInfo {
  std::string name;            // C identifier in generated code
  Role role = Role::Temp;
  inter::Per per = inter::Per::Node;  // rows: node/edge data; etype/ntype/none: weights
  std::vector<int64_t> shape;  // per-row shape
  bool zero_init = false;      // its first write accumulates: allocate zeroed
  std::string from_graph;      // inputs computed by graph preprocessing
  // Element storage type: FP32, BF16 or FP16 (a tf32 model stores FP32). docs/dtype_plan.md has the rule.
  inter::DType storage = inter::DType::FP32;
  int64_t row_numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

enum class Gather { None, Src, Dst };
enum class Segments { None, Etype, Ntype };

const char* to_string(Role r);      // input, weight, output, field, temp
const char* cuda_type(inter::DType storage);  // float, __nv_bfloat16, __half (TF32 stores float)
// The storage type of a model's inputs, weights and outputs: BF16/FP16 for bf16/fp16 models, FP32 for fp32 and tf32.
inter::DType model_storage(inter::DType model);
// Bytes an element of storage type `storage` takes: 2 for bf16 and fp16, else 4 (tf32 stores float).
int storage_bytes(inter::DType storage);
const char* to_string(Segments s);  // -, etype, ntype
std::string gathered_row(Gather g); // row, src[row], dst[row]
// The rows a GEMM, weight-gradient or segment-sum instance runs over. Edge rows are in edge-type-sorted order
// (segments: etype_ptr; gathers: src[row], dst[row]); node rows in node order (segments: ntype_ptr); etype rows one
// per edge type; pair rows the unique (source node, edge type) pairs of compact materialization, ordered by
// (etype, source) (segments: unique_src_etype_ptr; gathers: the pair's source unique_src[row]).
enum class Rows { Nodes, Edges, Etypes, Pairs };
const char* to_string(Rows r);  // nodes, edges, etypes, pairs

struct GemmInstance {
  std::string name;
  std::string x, w, y;  // tensors
  // Rows::Etypes: X and Y hold a row per edge type (X a per-etype weight or tensor), no gather, scatter or row
  // scalar. A product that depends only on the edge type (a weight row projected by a shared weight) is computed once
  // per type and read by the edges through etype[e]. With segments=etype, row t is segment t and reads its own W[t]:
  // a product of two weights of the edge type (reorder-linear's W[t] · w[t]ᵀ, and its gradients), one block per row.
  Rows rows = Rows::Nodes;
  Gather gather = Gather::None;
  Segments segments = Segments::None;
  Gather scatter = Gather::None;  // Src/Dst: atomically add each output row into y[src[e]] / y[dst[e]]
  bool accumulate = false;        // y[row] += (rows are distinct: no atomics needed)
  bool transpose_w = false;       // Y = X · W^T (backward: input gradients)
  std::string row_scalar;    // tensor with one scalar per row, or empty
  int64_t heads = 1, k = 0, n = 0;
  // Arithmetic class (the model's `dtype`): every dtype runs the tensor-core kernel of hectorgen/tc_gemm.cuh
  // where the instance fits it (gemm_kernel_choice; fp32 as 3xTF32, tc_gemm.cuh's Fp32Math), else the SIMT
  // template.
  inter::DType dtype = inter::DType::FP32;
  // The tensor-core kernel runs the instance (printed `kernel=tc`), else the SIMT template (`kernel=simt`, with
  // `(tc: <reason>)` when the dtype asks for tensor cores): always what gemm_kernel_choice says (verified).
  bool tensor_cores = false;
  // Tensor cores over segments: the kernel's 64-row tile offsets of the segments are the graph's tile array
  // (etype_tile_ptr, ntype_tile_ptr, unique_src_tile_ptr: the module's graph is prepared with gemm_tile 64,
  // kTcTileRows), printed `tiles=graph`; else its launcher numbers them on the GPU at every call. Set module-wide by
  // passes::share_gemm_tiles where every GEMM that reads tile offsets runs on tensor cores (verified per program).
  bool graph_tiles = false;
  int tile = 16, coarsen = 1;
  std::optional<int> launch_bounds;
  std::string source;  // the inter-IR statement it implements, for comments
};

// The tensor-core GEMM's row tile (hectorgen::tc::kForwardTileRows): the graph's tile offsets are built for it when
// the module's GEMMs read them from the graph (GemmInstance::graph_tiles).
constexpr int kTcTileRows = 64;
// Whether a GEMM reads its segments' row-tile offsets (segments over edge or node rows, not one row per type).
bool reads_tile_offsets(const GemmInstance& g);
// The row tile the graph's tile offsets are built for (the module's GEMM_TILE): kTcTileRows where the GEMMs read
// them from the graph (graph_tiles), else the SIMT GEMMs' tile (16 unless a schedule says otherwise).
struct Program;
int graph_gemm_tile(const Program& p);

// Whether the tensor-core kernel (hectorgen::tc::launch_segment_gemm) can run `g`: it needs one head, k % 32 == 0,
// n % 64 == 0, rows that are edges or nodes (not edge types), x and w stored in the dtype's storage type (tf32 and
// fp32: fp32; x may be fp32 in a 16-bit model too: gemm_widens_weights), y too or in fp32 (fp32 for an atomic
// scatter), an fp32 row scalar.
// `reason` names the first condition that fails (printed as `kernel=simt(tc: <reason>)`).
struct GemmKernelChoice {
  bool tensor_cores = false;
  std::string reason;
};
struct Program;
GemmKernelChoice gemm_kernel_choice(const Program& p, const GemmInstance& g);
// Whether `g` multiplies an fp32 x with a 16-bit model's weights (fp16's backward keeps its gradients in fp32, and an
// atomically summed input is fp32): on tensor cores the weights are widened to fp32 as they are loaded and the MMAs
// are tf32's (hectorgen::tc::SegmentGemmArgs' WT); widening is exact, the products tf32-rounded (~5e-4 relative).
bool gemm_widens_weights(const Program& p, const GemmInstance& g);
// The `kernel=` text of an instance line: tc, simt or simt(tc: <reason>).
std::string gemm_kernel_text(const Program& p, const GemmInstance& g);

// Which kernels compute a weight gradient (both the same fixed split-K schedule: docs/dtype_plan.md).
enum class WgradKernel {
  Simt,        // hectorgen/simt_wgrad.cuh: CUDA cores, any k, n and heads (the fallback)
  TensorCore,  // hectorgen/tc_gemm.cuh: mma.sync in the dtype's class (fp32: 3xTF32); one head, k, n % 64 == 0
};

// A weight gradient as a grouped GEMM: dW[t] (+)= sum over the rows r of segment t of X[G(r)]^T · (s_r DY[G'(r)]).
// Split-K over a fixed partition of each segment into chunks of rows (hectorgen::wgrad_chunk_rows: a function of
// the row count only), one fp32 partial dW per chunk, summed in chunk order: two runs give bit-identical
// gradients, and the grid fills the GPU even for a few large segments.
struct WeightGradInstance {
  std::string name;
  std::string x, dy, dw;
  Gather x_gather = Gather::None, dy_gather = Gather::None;
  std::string row_scalar;  // scales DY rows, or empty
  Rows rows = Rows::Nodes;  // Rows::Etypes as for GemmInstance: no segments
  Segments segments = Segments::None;
  // dW += (another instance wrote dW before); else dW = (it overwrites every slice: dW needs no zeroing).
  bool accumulate = true;
  int64_t heads = 1, k = 0, n = 0;  // dW slice per head: k x n
  inter::DType dtype = inter::DType::FP32;  // arithmetic class, as GemmInstance::dtype (partials, sums: fp32)
  WgradKernel kernel = WgradKernel::Simt;
  std::string source;
};

// Why the tensor-core weight-gradient kernel cannot compute `w`: "heads > 1", "k % 64", "n % 64" (the first that
// applies), or "" when it can.
std::string wgrad_tc_obstacle(const WeightGradInstance& w);
// Whether the tensor-core weight-gradient kernel reads `x` and `dy` as stored: each in the dtype's storage type or
// fp32 (hectorgen::tc::WgradArgs<XT, DyT>; one fp32 and one 16-bit operand: fp32 tiles, the 16-bit one widened as it
// is loaded, tf32 MMAs). Else the SIMT kernel, which converts any types.
bool wgrad_tc_reads(inter::DType model, inter::DType x, inter::DType dy);
// Whether `w` runs on tensor cores with one fp32 and one 16-bit operand (the 16-bit one widened as it is loaded).
bool wgrad_widens(const Program& p, const WeightGradInstance& w);
// The kernel lowering chooses: tensor cores whenever wgrad_tc_obstacle is empty.
WgradKernel choose_wgrad_kernel(const WeightGradInstance& w);
// The instance line's `kernel=` value: "tc", or "simt(tc: <obstacle>)" when the instance falls back to the SIMT
// kernel (so a golden shows why).
std::string wgrad_kernel_text(const WeightGradInstance& w);

// dW[t] += sum over the rows r of segment t of V[r] (a per-row value a traversal stored); one thread per
// element of dW walks the rows in order (deterministic).
struct SegmentSumInstance {
  std::string name;
  std::string v, dw;
  Rows rows = Rows::Nodes;  // nodes, edges or pairs
  Segments segments = Segments::None;
  int64_t numel = 1;
  std::string source;
};

// y[r] (+)= the sum of x over the entries of row r of a CSR of the compact pair layout, in CSR order: the
// deterministic sum of per-edge (per-pair) values into the rows they belong to, gathers only. One warp per row.
//   pair_edges  rows are the (source, edge type) pairs, x has a row per edge: the edges of each pair
//   node_pairs  rows are the nodes, x has a row per pair: the pairs of each source node
enum class GatherCsr { PairEdges, NodePairs };
const char* to_string(GatherCsr c);  // pair_edges, node_pairs
// schedule.gather_sum.group_rows_below under auto: 4, the groups of a warp on rows of 64. Measured against the split
// kernel alone (H200, bench/gather_sum_rows/ab.md; bench variants *_auto_gs_split rerun it): training steps 1.01-1.03x geomean
// per model, up to 1.13x (HGT on am), nothing slower than 0.97x outside the small graphs' noise.
inline constexpr int kAutoGroupRowsBelow = 4;

struct GatherSumInstance {
  std::string name;
  std::string x, y;
  GatherCsr csr = GatherCsr::PairEdges;
  // pair_edges only: x read through the edge's destination (x has a row per node), and each edge's row scaled by
  // scale[e] (one value per edge): y[pair] += sum over its edges e of scale[e] * x[dst[e]]. The per-edge products
  // are never stored.
  Gather x_gather = Gather::None;
  std::string scale;
  bool accumulate = false;  // y += (y holds data already), else y =
  int64_t numel = 1;        // elements per row
  int edge_batch = 1;       // entries added per step (inter::Schedule::traversal_edge_batch)
  // Lanes per row (32, 16 or 8; inter::Schedule::traversal_row_lanes when set, 32 under auto): below 32 the warp's
  // rows add their entries in step, as a traversal's (emit_gathersum).
  int row_lanes = 32;
  // The most consecutive elements of a row one lane holds and loads as one vector (1, 2, 4 or 8; the traversals'
  // inter::Schedule::traversal_vector, kDefaultVector under auto), with a warp a row and edge_batch 1 only.
  int vector = kDefaultVector;
  // With a warp a row and edge_batch 1: the average entries a row below which the launcher runs the variant whose
  // groups of lanes each take a row (inter::Schedule::gather_sum_group_rows_below; -1: auto, 0: never).
  int group_rows_below = -1;
  std::string source;
};

// The lowest preference level: a statement the templates cannot express (e.g. concat, outer), run as
// vectorised PyTorch (ATen) calls over all rows of its loop from the host code. `loop` is the statement in
// its loop nest, reading materialised tensors by name.
struct TorchInstance {
  std::string name;
  inter::StmtP loop;
  std::map<std::string, std::string> materialized;  // local name -> tensor it is read from / stored to
  std::map<std::string, std::string> field_tensor;  // field name -> tensor (aliases)
  std::string target;                               // the tensor the statement writes
};

using Kernel =
    std::variant<GemmInstance, TraversalInstance, WeightGradInstance, SegmentSumInstance, GatherSumInstance, TorchInstance>;

// A traversal stage as the lowering cuts it out of the inter-operator IR (what a traversal instance is lowered
// from, passes::lower_traversal): the fused loop nest, its statements reading materialised tensors by name.
struct TraversalSource {
  std::string name;
  inter::StmtP loop;
  std::map<std::string, std::string> materialized;  // local name -> tensor it is read from / stored to
  std::map<std::string, std::string> field_tensor;  // field name -> tensor (aliases)
  int threads = 256;
  int edge_batch = 1;  // inter::Schedule::traversal_edge_batch
  int row_lanes = 0;  // inter::Schedule::traversal_row_lanes, 0: auto (choose_row_lanes)
  int vector = 0;     // inter::Schedule::traversal_vector, 0: auto (kDefaultVector)
  bool position_indices = true;  // inter::Schedule::traversal_position_indices
};

const std::string& kernel_name(const Kernel& k);
// The tensors a kernel stores into (the output of a GEMM, the rows a traversal stores, ...) and reads.
std::set<std::string> kernel_writes(const Kernel& k);
std::set<std::string> kernel_reads(const Kernel& k);
// Whether a PyTorch fallback among the kernels from `from` on reads `tensor`. Fallbacks name what they read in their
// own statement (redirect_reads cannot change it), so passes that rename or drop tensors leave such a tensor alone.
bool read_by_torch(const Program& p, const std::string& tensor, size_t from = 0);
// The tensors a kernel adds into atomically (a scattering GEMM's output, a traversal's atomic stores).
std::set<std::string> atomic_writes(const Kernel& k);
// The tensors a program hands back, live from its start to its return: its outputs and the fields saved for the
// backward (through their aliases).
std::set<std::string> returned_tensors(const Program& p);

// Inputs with 'rows: indexed' are tables read through a node-to-row map X_rows (int32 or int64, [num_nodes]): node
// v's row is X[X_rows[v]]. The kernels that read one are GEMMs and weight gradients taking it as X; each reads it
// through one row list, the map composed with the instance's gather: X_rows[row] (node rows), X_rows[src[row]],
// X_rows[dst[row]] or X_rows[pair_src[row]], composed by the host code (int32) and handed to the kernel as its gather
// list. indexed_list names that list (X_rows_nodes, X_rows_src, X_rows_dst, X_rows_pair_src), or "" when `x` is
// not an indexed input.
std::string indexed_list(const Program& p, const std::string& x, Rows rows, Gather gather);
// The lists of a program's kernels, each once, in kernel order: {list name, the graph array composed with the map
// ("" for node rows)}.
std::vector<std::pair<std::string, std::string>> indexed_lists(const Program& p, const std::string& x);
// Why the program cannot read an indexed input (a kernel that reads one other than as a GEMM's or a weight
// gradient's X: traversal, gather sum, PyTorch fallback), or ""; `input` gets the input's name.
std::string indexed_input_obstacle(const Program& p, std::string* input = nullptr);

// True when the traversal template can emit `e` (else the statement falls back to PyTorch calls).
bool traversal_supports(const inter::ExprP& e);

struct Program {
  std::string model;
  std::string phase = "forward";  // forward | forward_train | backward: names the kernels and the op
  inter::ModelDecl decl;
  std::vector<TensorInfo> tensors;  // inputs, weights, outputs, then fields and temporaries
  std::vector<Kernel> kernels;      // in execution order
  std::set<std::string> layouts;    // graph layouts the kernels need (see runtime/)
  // The row tile the graph's tile offsets are built for where the module's GEMMs read them from the graph
  // (kTcTileRows, printed `graph_tile 64`; passes::share_gemm_tiles), else 0: the GEMMs' own tile.
  int graph_tile = 0;
  std::vector<std::string> saved;   // forward_train: fields returned for the backward (after the outputs)
  std::map<std::string, std::string> aliases;  // field -> the tensor that holds it
  // Why a pass decided as it did (recompute-gemms: which saved fields the backward recomputes, on what estimate):
  // printed as comment lines right after the header line, read back by the parser.
  std::vector<std::string> notes;

  const TensorInfo* find(const std::string& name) const;
};

// Graph layout names (the keys of the runtime's preprocessing).
namespace layout {
inline constexpr const char* kSortedCoo = "etype_sorted_coo";  // src, dst, etype sorted by etype + etype_ptr
inline constexpr const char* kCompactSrc = "compact_src_etype";  // unique (src, etype) pairs and their mappings
inline constexpr const char* kCsrByDst = "csr_by_dst";         // incoming edges per node
inline constexpr const char* kCsrBySrc = "csr_by_src";         // outgoing edges per node
inline constexpr const char* kCsrByDstPairs = "csr_by_dst_pairs";  // the pair of each incoming-edge CSR position
inline constexpr const char* kNtypePtr = "ntype_ptr";          // node-type segments (nodes sorted by type)
inline constexpr const char* kInvRelInDegree = "inv_relation_in_degree";
// inv_relation_in_degree of each incoming-edge CSR position (inv_relation_in_degree[in_col_eid[i]]; runtime 1.6).
inline constexpr const char* kInColInvRelInDegree = "in_col_inv_relation_in_degree";
}  // namespace layout

// A graph-derived edge input (`from_graph`) that node traversals read in CSR order. Where edges are numbered in
// relation order, a node's incoming edges have scattered ids, and reading x[e] through the id is a random 4-byte
// read (a 32-byte sector) per edge; the runtime lays such a quantity out in incoming-CSR order as well, and a node's
// edge loop reads that twin at its position instead (schedule.traversal.position_indices, like in_pair).
//   in_position_quantity(q)  the layout (and key) of quantity q in CSR order, "" if q has none;
//   in_position_twin(x)      the twin tensor of input x: in$x, an input with from_graph = in_position_quantity(q);
//   by_in_position(t)        whether tensor t is such a twin: its rows are incoming-edge CSR positions.
std::string in_position_quantity(const std::string& from_graph);
std::string in_position_twin(const std::string& tensor);
bool by_in_position(const TensorInfo& t);

// The text form (see the top of this file); parser.h reads it back.
std::string print_program(const Program& p);
// Several phases in one text, each after a `# ==== <phase> ====` line (the .intra.ir file).
std::string print_programs(const std::vector<Program>& phases);

// Checks every kernel against the program: tensors known, of the roles and row shapes their operands need,
// graph layouts present, names unique; traversal instances by verify_traversal. Returns an error, or "".
std::string verify_program(const Program& p);

// Checks a traversal instance against the program's tensors and layouts: names defined once and before
// use, row variables of the right kind, register types and lane layouts consistent, graph layouts present,
// rows other warps own never read or written plainly, and every cross-lane read-after-write or
// write-after-read of global memory separated by a sync. Returns an error message, empty if valid.
std::string verify_traversal(const Program& p, const TraversalInstance& t);


}  // namespace hectorgen::intra
