// Passes over the inter-operator IR. Each pass is a function Module -> Module that reports user errors
// to Diagnostics. The pipeline (src/driver/pipeline.cpp) lists them in order over the phases.
#pragma once

#include "diag/diagnostics.h"
#include "ir/inter/ir.h"

namespace hectorgen::passes {

// Replaces every call statement of a user-defined function (e.g. edge_softmax(g, "att")) with its body,
// substituting the arguments for the parameters. The graph parameter must be passed `g`; the others
// are string literals (field names) or constants. Functions are removed from the module afterwards.
inter::Module inline_functions(const inter::Module& m, Diagnostics& diags);

}  // namespace hectorgen::passes

#include <map>
#include <optional>
#include <set>

#include "ir/intra/intra.h"

namespace hectorgen::passes {

// Lowers a traversal stage to a traversal instance (lower_traversal.cpp), deciding everything the CUDA
// printer then just prints: one warp per row; values of 32 or more elements spread over the lanes, smaller
// ones replicated; locals, the row's edge fields and, in node loops, the node's fields kept in registers
// for the iteration (node aggregates without atomics) and stored once at its end; read-only rows loaded
// once, at the top of the loop that owns their row; dot/sum as warp reductions, computed once per value;
// element-wise values inlined into the instruction that consumes them; the syncs cross-lane exchanges
// through global memory need. `written_before`: tensors that hold data when the kernel starts (inputs,
// weights, what earlier kernels stored); other tensors read as zero. The caller adds the graph layouts the instance
// reads (intra::read_layouts) to its program and verifies the instance against it.
intra::TraversalInstance lower_traversal(const intra::Program& p, const intra::TraversalSource& src,
                                         const std::set<std::string>& written_before);

// Lowers a typed module (inter::typecheck) to kernels, greedily by preference: linear transforms become GEMM instances
// (fusing a following per-row scale and scatter-aggregation into the GEMM when the statement has that
// shape), the remaining statements of each loop nest become one traversal instance (split only where a
// GEMM needs a value the loop computes). Locals used inside one instance stay in registers.
// `phase` (forward | forward_train | backward) names the kernels: <model>_fw_*, <model>_fwt_*, <model>_bw_*.
// `saved` (forward_train): the fields the program returns for the backward, after the outputs. Stores that
// nothing reads afterwards are dropped (drop_dead_stores). Every tensor gets its storage type
// (TensorInfo::storage, docs/dtype_plan.md); bf16/fp16 models are lowered without atomics in every phase.
std::optional<intra::Program> lower(const inter::Module& m, Diagnostics& diags, const std::string& phase = "forward",
                                    const std::vector<std::string>& saved = {});

// Makes the phases (forward[, forward_train, backward]) agree on the storage of what they exchange: the backward's
// inputs that are saved fields take the type forward_train stores them in (a narrow field, e.g. a softmax statistic,
// stays fp32 in a 16-bit model), and an input fp32 in one phase (a GEMM's row scalar there) is fp32 in all.
void unify_storage(std::vector<intra::Program>& phases);

// Removes the CSR-order twins of graph-derived inputs (intra::in_position_twin, which lower adds to every phase) that
// no kernel of any of a module's programs reads, with their layouts: the runtime then builds nothing for them. All
// of a module's programs and phases keep one list of graph-derived arguments: a twin stays in all or in none.
void drop_unread_twins(const std::vector<std::vector<intra::Program>*>& module);

// Where every GEMM of a module that reads its segments' row-tile offsets runs on the tensor cores, the graph is
// prepared with their 64-row tile (every program's graph_tile = intra::kTcTileRows) and they read its offsets
// (graph_tiles) instead of numbering them with a kernel of their own at every call. A module with a SIMT GEMM over
// segments keeps the SIMT tile for the graph, and its tensor-core GEMMs number their own. Module-wide: one graph.
void share_gemm_tiles(const std::vector<std::vector<intra::Program>*>& module);

// Drops a GEMM instance that repeats an earlier one of the same phase (same inputs, weight, gather, segments,
// row scalar and shape, into a temporary only it writes) when no kernel in between writes what they read;
// later kernels read the earlier result (HGT's backward needs k[src] · W_att[etype] twice).
void merge_duplicate_gemms(intra::Program& p);
// The same for traversal instances: a later instance whose body repeats an earlier one's (up to the names of
// its registers and of the temporaries it stores, which only it writes), reading what the earlier read with
// nothing written to it in between, is dropped; its temporaries' readers read the earlier ones.
void merge_duplicate_traversals(intra::Program& p);
// Within one traversal instance: temporaries it alone writes that store the same value (a register computed by
// the same expression as an earlier one, of as many elements) on the same rows are one temporary; the later ones
// are dropped and their readers read the first (RGAT's backward scales each edge's attention gradient once for
// the weight gradient and once for each pair sum).
void merge_duplicate_stores(intra::Program& p);

// A traversal that stores, on each of its rows, the row of another tensor it loaded there unchanged (RGAT's compact
// backward: `d$hs[p] = d$msg[p]`, the gradient of the forward's `p["msg"] = p["hs"]`) makes a copy: where the copy
// is that tensor's only store in the program, of the same rows and shape, neither an output nor saved, and nothing
// writes the original from that kernel on, the store goes and later kernels read the original (one pair-sized
// tensor fewer at the backward's peak, and its write and re-read).
void forward_row_copies(intra::Program& p);

// A plain tensor-core GEMM from one temporary or field to a temporary of the same rows and row size (k = n = 64, no
// gather, scatter or accumulation) whose input nothing reads afterwards stores its product over its input (y := x):
// one such tensor live there instead of two (the backward's input gradients through a relation's weight, pair- or
// edge-sized). The tensor-core block owns whole rows of 64 and reads them before storing; SIMT GEMMs keep their
// output. The last pass of lowering (gemm_in_place.cpp).
void gemm_in_place(intra::Program& p);

// Orders independent kernels so that fewer temporaries are live at once (the host code allocates each right
// before the first kernel that touches it and releases it after the last): greedy list scheduling that runs,
// of the kernels whose inputs are ready, the one that grows the live temporaries least, kept only when its peak
// on a typical graph (8 edges and 4 (source, relation) pairs per node) is strictly lower. Kernels that read or
// write what another writes keep their relative order, so every result stays bit-identical.
void schedule_for_memory(intra::Program& p);

// The tensors of a graph of these sizes: rows per kind of tensor (a tensor per edge type has `etypes` rows, a
// shared one a single row).
struct GraphCounts {
  int64_t nodes = 0, edges = 0, pairs = 0, etypes = 0, ntypes = 0;
};
// A typical graph of `nodes` nodes: 8 edges and 4 unique (source, relation) pairs per node (mag: 11 and 0.8, wikikg2:
// 6.4 and 4), one node type and one edge type. schedule_for_memory orders kernels by its per-node rows;
// recompute_gemms estimates peaks on it.
GraphCounts typical_graph(int64_t nodes);
// The most bytes of tensors an op holds at once when it runs `p` on a graph of `counts`, as the host code allocates
// them (emit/host.cpp, plan_memory): its inputs and weights, and its results (outputs, saved fields), for the whole op;
// every other tensor from the first kernel that touches it to the last. Workspaces are not counted. A static
// estimate of the op's peak, e.g. on wikikg2's counts (tests/unit/test_intra_lowering.cpp, "[estimate]").
int64_t peak_bytes(const intra::Program& p, const GraphCounts& counts);
// The bytes of tensor `t` on a graph of `counts`.
int64_t tensor_bytes(const intra::TensorInfo& t, const GraphCounts& counts);

// Rematerialization (recompute_gemms.cpp), on a model's training programs after lowering (forward_train and
// backward, with their storage types unified): a field the training forward saves for the backward that a GEMM
// instance computes (its only writer: a plain, unscattered GEMM) with rows per edge or per pair, from operands the
// backward has anyway (inputs, weights, other saved fields, not written after the GEMM), is a candidate: instead of
// being saved, the backward runs the same instance (same operands, tile and kernel: the same bits) right before the
// first kernel that reads it (`<model>_bw_gemm_<name>_recompute`), then schedule-for-memory places it. The training
// forward drops the GEMM when nothing else of it reads the result.
//
// A candidate: the training forward's GEMM at `at` computes `tensor`, which holds `fields` (in saved order; several
// when fields alias one tensor, as RGAT's msg and hs) from `operands` (its tensors; none may be recomputed too).
struct RecomputeCandidate {
  size_t at = 0;
  std::string tensor;
  std::vector<std::string> fields;
  std::vector<std::string> operands;
};
// The candidates of two training programs, in kernel order.
std::vector<RecomputeCandidate> recompute_candidates(const intra::Program& forward_train, const intra::Program& backward);
// Recomputes `chosen` (candidates of these very programs, none an operand of another).
void apply_recompute(intra::Program& forward_train, intra::Program& backward, const std::vector<RecomputeCandidate>& chosen);
// The estimated peak of a training step on a graph of `counts`: the larger of its two ops' peak_bytes, where the
// backward's inputs that are one tensor of the training forward (saved fields it aliases, RGAT's hs and msg: the
// forward returns that tensor twice) count once.
int64_t training_step_peak(const intra::Program& forward_train, const intra::Program& backward, const GraphCounts& counts);
// The pass: Options::recompute on: every candidate (that is no operand of one taken before); off: none; auto: greedily
// in candidate order, those that lower training_step_peak on typical_graph(2^20) strictly (each evaluated on top of
// those taken before).
// Notes on the training forward say why each candidate was or was not taken (auto and on). Returns the fields no
// longer saved, in saved order.
std::vector<std::string> recompute_gemms(intra::Program& forward_train, intra::Program& backward);

// Makes every read of `from` in `k` read `to` (GEMM, weight-gradient, segment-sum and gather-sum operands, traversal
// loads; a PyTorch fallback's reads are in its statement and stay).
void redirect_reads(intra::Kernel& k, const std::string& from, const std::string& to);

// Removes what the traversal instances compute for nobody: stores of fields and temporaries that are neither
// outputs nor saved for the backward and that no later kernel reads (nor the kernel itself), then the
// registers and indices nothing reads any more; then re-decides which loads lane 0 makes alone (only rows
// lane 0 still overwrites) and the syncs. A traversal left without a store goes.
void drop_dead_stores(intra::Program& p);

// Canonicalises loops with the graph-semantic rule (an edge loop is a loop over the destination nodes'
// incoming edges) and fuses adjacent loop nests when no element reads what another element of the
// same loop writes. Takes and returns a typed module (the rewritten loops are re-typed by the Mutator).
inter::Module fuse_loops(const inter::Module& m);

// Linear operator reordering (reorder_linear.cpp): inside an edge loop, dot(x * W[e.etype], w[e.etype]) (through a
// local, and with the single-head view reshape(.., 1, D)) becomes dot(x, linear_t(w[e.etype], W[e.etype])): the
// weight-weight product W[r] · w[r]ᵀ, one row per relation, replaces the per-edge transform; locals that only the
// rewritten dots read are removed. `mode`: Off returns `m`; On rewrites every candidate; Auto those whose
// multiply-add count per edge falls (the transform becomes dead). Runs before hoist-node-transforms and autodiff.
// Takes and returns a typed module.
inter::Module reorder_linear(const inter::Module& m, inter::Reorder mode);

// Compact materialization (compact.cpp; thesis: "Compact Tensor Materialization"): an edge value that depends only
// on the edge's source node and type (a local or an edge field set once from e.src data and W[e.etype], and the
// largest such subexpressions doing work -- a linear transform or a dot -- inside values that stay per edge) is
// computed once per unique (source, edge type) pair in a pair loop (`for p in g.src_etype_pairs()`) before its
// loop nest, and the edges read it through their pair (`e.pair["hs"]`). An edge field moves when it is set once
// in the whole program and is not an output; its reads everywhere go through the pair. `mode`: Vanilla returns
// `m`; Compact applies it wherever it can. Runs after hoist-node-transforms and before autodiff (the backward sums
// the edges' gradients per pair). Takes and returns a typed module.
inter::Module compact_materialization(const inter::Module& m, inter::Materialization mode);

// Hoists linear transforms out of edge loops to the node domain: `x * W` inside an edge loop whose input x
// reads one endpoint of the edge only (e.src or e.dst: its inputs, fields the loop nest does not write,
// constants and shared weights) and whose weight is shared (per: none) or selected by that node's type
// (W[e.src.ntype]) becomes a node field computed in a node loop placed before the loop nest
// (`for n in g.src_nodes(): n["feature$W"] = n.feature * W`), read through the endpoint
// (`e.src["feature$W"]`): an N-row GEMM instead of an E-row one. Identical transforms share one field. Runs
// before autodiff, so the training forward and the backward inherit it. Takes and returns a typed module.
inter::Module hoist_node_transforms(const inter::Module& m);

}  // namespace hectorgen::passes

namespace hectorgen::passes {

// Autodiff at the inter-operator level (thesis: "Backward Propagation").
//   forward   the training forward: locals become fields (so the backward can read them; every value of a
//             local a field of its own: x, x$2) and every field is in SSA form (a re-assigned field gets a new
//             version `f$k`; the last keeps the name); an operand the backward needs that reduces a row to a few
//             elements per edge (HGT's dot(k * W_att, q), for the gradient of mu) is stored in a field of its
//             own right before its statement (`att$0$dot`), which then reads it: the backward reads one float
//             per edge instead of re-reading the rows;
//   backward  reads the forward's saved fields as inputs (`e.att`) and the output gradients (`n.d$h`),
//             accumulates gradient fields `d$f`, and writes the gradients of node/edge inputs (`d$feature`)
//             and of weights (`d$W[e.etype] += ...`). An output the program also reads gets what flows back
//             through those reads in a field `d$h$reads`. Gradients of inputs marked requires_grad: false are
//             never computed; statements whose target gets no gradient are dropped.
//             Derived names carry the sigil '$' (ir/inter/names.h): they cannot collide with user names.
// Takes a typed module; both results are typed (the derivative rules of the operator table build typed
// nodes), so neither needs type inference again.
struct TrainingModules {
  inter::Module forward;
  inter::Module backward;
  std::vector<std::string> saved;  // forward fields the backward reads (its extra inputs)
};
std::optional<TrainingModules> autodiff(const inter::Module& m, Diagnostics& diags);

}  // namespace hectorgen::passes
