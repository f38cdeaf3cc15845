#include "ir/intra/launch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <set>

#include "hectorgen/segments.h"  // kWgradTargetBlocks: the split-K partition the generated code computes

namespace hectorgen::intra {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool contains(const int* begin, const int* end, int v) { return std::find(begin, end, v) != end; }
bool valid_tile(int t) { return contains(std::begin(kGemmTiles), std::end(kGemmTiles), t); }
bool valid_coarsen(int c) { return contains(std::begin(kGemmCoarsenings), std::end(kGemmCoarsenings), c); }

// Threads of a GEMM-template block: a tile x tile output (or dW) tile, `coarsen` rows per thread.
int64_t gemm_threads(int tile, int coarsen) {
  return coarsen > 0 ? static_cast<int64_t>(tile) * tile / coarsen : 0;
}

// The two [tile][tile + 1] float staging arrays of templates/cuda/gemm.cu.in.
int64_t gemm_shared_bytes(int tile) { return 2 * static_cast<int64_t>(tile) * (tile + 1) * 4; }

constexpr int64_t kSegsumThreads = 256;  // hectorgen::segment_sum_partials_kernel (runtime/include/hectorgen/segments.cuh)
constexpr int64_t kGatherSumThreads = 256;  // gather-sum kernels: one warp per row (emit/cuda.cpp emit_gathersum)

// The weight gradient's partial-sums kernels (runtime/include/hectorgen/simt_wgrad.cuh and tc_gemm.cuh, struct
// Wgrad): 64 x 64 tiles of dW over slabs of 32 rows, staged in shared memory (SIMT: fp32 rows of 64 + 4; tensor
// cores: storage-type rows of 64 + 8 in a ring of 2 (4-byte types) or 3 stages).
constexpr int64_t kWgradTile = 64, kWgradSlab = 32;
constexpr int64_t kSimtWgradThreads = 256, kTcWgradThreads = 128;
int64_t wgrad_shared_bytes(bool tc, int64_t elem_bytes) {
  if (!tc) return 2 * kWgradSlab * (kWgradTile + 4) * 4;
  const int64_t stages = elem_bytes == 4 ? 2 : 3;
  return 2 * stages * kWgradSlab * (kWgradTile + 8) * elem_bytes;
}

std::string kib(int64_t bytes) {
  return bytes % 1024 ? fmt::format("{} bytes", bytes) : fmt::format("{} KiB", bytes / 1024);
}

}  // namespace

int64_t GridExtent::at(int64_t rows, int64_t segments) const {
  int64_t v = fixed + per_segment * segments + (rows_per_block ? ceil_div(rows, rows_per_block) : 0);
  if (at_most_rows) v = std::min(v, rows);
  if (cap) v = std::min(v, cap);
  return v;
}

std::string GridExtent::expr(const std::string& rows, const std::string& segments) const {
  if (is_constant()) return std::to_string(cap ? std::min(fixed, cap) : fixed);
  std::vector<std::string> terms;
  if (rows_per_block == 1) terms.push_back(rows);
  else if (rows_per_block) terms.push_back(fmt::format("({} + {} - 1) / {}", rows, rows_per_block, rows_per_block));
  if (per_segment == 1) terms.push_back(segments);
  else if (per_segment) terms.push_back(fmt::format("{} * {}", per_segment, segments));
  if (fixed) terms.push_back(std::to_string(fixed));
  std::string e;
  for (const std::string& t : terms) e += (e.empty() ? "" : " + ") + t;
  if (at_most_rows) e = fmt::format("std::min<int64_t>({}, {})", e, rows);
  if (cap) e = fmt::format("std::min<int64_t>({}, {})", e, cap);
  return fmt::format("static_cast<unsigned>({})", e);
}

LaunchConfig launch_config(const Program& p, const Kernel& k) {
  (void)p;
  LaunchConfig c;
  if (auto* gp = std::get_if<GemmInstance>(&k)) {
    const GemmInstance& g = *gp;
    c.threads = gemm_threads(g.tile, g.coarsen);
    c.static_shared_bytes = gemm_shared_bytes(g.tile);
    c.min_blocks_per_sm = g.launch_bounds.value_or(0);
    c.x.rows_per_block = g.tile;
    if (g.rows == Rows::Etypes && g.segments != Segments::None) {
      c.x.rows_per_block = 1;  // row t is edge type t and its own segment (W[t]): a block per row
    } else if (g.segments != Segments::None) {
      // Every segment's last tile may be partial: one extra tile per segment, but never more tiles than rows.
      c.x.per_segment = 1;
      c.x.at_most_rows = true;
    }
    const int64_t col_tiles = g.tile > 0 ? ceil_div(g.n, g.tile) : 0;
    if (col_tiles <= limits::kGridYZ && g.heads <= limits::kGridYZ) {
      c.y = GridExtent::constant(col_tiles);
      c.z = GridExtent::constant(g.heads);
    } else {
      const int64_t blocks = col_tiles * g.heads;
      c.fold_yz = true;
      c.y = GridExtent::constant(std::min(blocks, limits::kGridYZ));
      c.z = GridExtent::constant(ceil_div(blocks, c.y.fixed));
    }
  } else if (auto* wp = std::get_if<WeightGradInstance>(&k)) {
    // The partial-sums kernel, the one of the three the launcher runs (chunk offsets, partials, ordered
    // reduction) whose grid grows with the graph: a block per (chunk, dW tile, head).
    const WeightGradInstance& w = *wp;
    const bool tc = w.kernel == WgradKernel::TensorCore;
    const TensorInfo *x = p.find(w.x), *dy = p.find(w.dy);
    c.threads = tc ? kTcWgradThreads : kSimtWgradThreads;
    // The tensor-core kernel's tiles are 16-bit when both operands are (else fp32, hectorgen::tc::WgradMathT).
    auto bytes = [](const TensorInfo* t) { return t ? storage_bytes(t->storage) : 4; };
    c.static_shared_bytes = wgrad_shared_bytes(tc, std::max(bytes(x), bytes(dy)));
    const int64_t per_chunk = ceil_div(w.k, kWgradTile) * ceil_div(w.n, kWgradTile) * w.heads;
    // chunk_rows >= rows / target (hectorgen::wgrad_chunk_rows): at most `target` chunks, plus one partial chunk
    // per segment. Past 2^31 - 1 blocks (hundreds of millions of segments) the runtime's launcher returns
    // cudaErrorInvalidConfiguration instead of launching a truncated grid.
    const int64_t target = std::max<int64_t>(1, kWgradTargetBlocks / std::max<int64_t>(1, per_chunk));
    c.x = w.segments == Segments::None ? GridExtent::constant(per_chunk * (target + 1))
                                       : GridExtent{per_chunk * target, per_chunk, 0, limits::kGridX, false};
    c.y = GridExtent::constant(1);
    c.z = GridExtent::constant(1);
  } else if (auto* sp = std::get_if<SegmentSumInstance>(&k)) {
    const SegmentSumInstance& s = *sp;
    // The per-chunk partial sums (the second kernel, the ordered reduction, is elementwise): one block per
    // chunk of at least 128 rows (at most one partial chunk per segment), 32 columns per block in y.
    c.threads = kSegsumThreads;
    c.static_shared_bytes = kSegsumThreads * 4;
    c.x = GridExtent{s.segments == Segments::None ? 1 : 0, s.segments == Segments::None ? 0 : 1, 128, 0, true};
    c.y = GridExtent::constant(std::min(ceil_div(s.numel, limits::kWarp), limits::kGridYZ));
    c.z = GridExtent::constant(1);
  } else if (std::holds_alternative<GatherSumInstance>(k)) {
    // One warp (or row_lanes lanes) per row (a pair or a node), striding over the rows past its grid.
    c.threads = kGatherSumThreads;
    c.x.rows_per_block = kGatherSumThreads / std::max(1, std::get<GatherSumInstance>(k).row_lanes);
    c.y = GridExtent::constant(1);
    c.z = GridExtent::constant(1);
  } else if (auto* tp = std::get_if<TraversalInstance>(&k)) {
    // One warp per row (a thread per row for scalar work); the kernel strides over the rows past its grid.
    c.threads = tp->threads;
    c.x.rows_per_block = one_thread_per_row(*tp) ? tp->threads : std::max(1, tp->threads / std::max(1, tp->row_lanes));
    c.y = GridExtent::constant(1);
    c.z = GridExtent::constant(1);
  }
  return c;
}

SplitLayout split_layout(int64_t numel, int vector, bool few_entries) {
  SplitLayout l;
  l.run = slot_vector(numel, numel, vector);
  while (few_entries && l.run > 1 && numel / l.run < 32) l.run /= 2;
  const int64_t runs = numel / l.run;
  l.group_lanes = 1;
  while (l.group_lanes < runs && l.group_lanes < 32) l.group_lanes *= 2;
  l.runs_per_lane = static_cast<int>((runs + l.group_lanes - 1) / l.group_lanes);
  return l;
}

GatherSumRows gather_sum_rows(const GatherSumInstance& s) {
  GatherSumRows r;
  if (s.row_lanes != 32 || s.edge_batch != 1) return r;  // rows in step, or entries in batches: gather_sum.cu.in
  r.row_groups = 32 / split_layout(s.numel, s.vector, /*few_entries=*/false).group_lanes;
  // auto: kAutoGroupRowsBelow (measured on a GPU); 0: never
  r.below = r.row_groups == 1 ? 0 : s.group_rows_below < 0 ? kAutoGroupRowsBelow : s.group_rows_below;
  if (r.below == 0) r.row_groups = 1;
  return r;
}

std::string group_rows_below_problem(int value) {
  return fmt::format("'group_rows_below' (the average entries a row below which each group of a gather sum's warp "
                     "takes a row of its own) must be auto or 0 to 1024, got {}",
                     value);
}

std::string check_launch_limits(const LaunchConfig& c) {
  if (c.threads < 1 || c.threads > limits::kThreadsPerBlock)
    return fmt::format("{} threads per block (the limit is {})", c.threads, limits::kThreadsPerBlock);
  if (c.static_shared_bytes > limits::kStaticSharedBytes)
    return fmt::format("{} of static shared memory per block (the limit is {})", kib(c.static_shared_bytes),
                       kib(limits::kStaticSharedBytes));
  const std::pair<const char*, const GridExtent*> dims[] = {{"x", &c.x}, {"y", &c.y}, {"z", &c.z}};
  for (const auto& [axis, d] : dims) {
    const int64_t limit = *axis == 'x' ? limits::kGridX : limits::kGridYZ;
    if (d->at(1, 1) < 1) return fmt::format("grid {} is empty for a graph of one row", axis);
    if (int64_t largest = d->largest(); largest > limit)
      return fmt::format("grid {} reaches {} blocks for {} rows and {} segments (the limit is {})", axis, largest,
                         limits::kMaxRows, limits::kMaxSegments, limit);
  }
  if (const int64_t b = c.min_blocks_per_sm) {
    if (b < 1 || b > limits::kBlocksPerSm)
      return fmt::format("__launch_bounds__ asks for {} resident blocks per multiprocessor (the limit is {})", b,
                         limits::kBlocksPerSm);
    if (b * c.threads > limits::kThreadsPerSm)
      return fmt::format("__launch_bounds__ asks for {} resident blocks of {} threads (a multiprocessor holds {})", b,
                         c.threads, limits::kThreadsPerSm);
    const int64_t shared = c.static_shared_bytes + limits::kSharedBytesReservedPerBlock;
    if (b * shared > limits::kSharedBytesPerSm)
      return fmt::format("__launch_bounds__ asks for {} resident blocks of {} of shared memory (a multiprocessor has {})", b,
                         kib(shared), kib(limits::kSharedBytesPerSm));
  }
  return {};
}

std::string verify_launch(const Program& p, const Kernel& k) {
  if (std::holds_alternative<TorchInstance>(k)) return {};
  const std::string& name = kernel_name(k);
  const LaunchConfig c = launch_config(p, k);
  if (std::string e = check_launch_limits(c); !e.empty()) return fmt::format("{}: {}", name, e);
  // What each template assumes of its configuration.
  if (std::holds_alternative<TraversalInstance>(k) && c.threads % limits::kWarp)
    return fmt::format("{}: {} threads per block is not a whole number of warps (one warp per row)", name, c.threads);
  if (const auto* t = std::get_if<TraversalInstance>(&k); t && !inter::valid_edge_batch(t->edge_batch))
    return fmt::format("{}: edge_batch={} is not 1, 2, 4 or 8", name, t->edge_batch);
  if (const auto* t = std::get_if<TraversalInstance>(&k); t && (t->row_lanes == 0 || !inter::valid_row_lanes(t->row_lanes)))
    return fmt::format("{}: row_lanes={} is not 8, 16 or 32", name, t->row_lanes);
  if (const auto* t = std::get_if<TraversalInstance>(&k); t && (t->vector == 0 || !inter::valid_vector(t->vector)))
    return fmt::format("{}: vector={} is not 1, 2, 4 or 8", name, t->vector);
  if (const auto* t = std::get_if<TraversalInstance>(&k); t && t->row_lanes != 32) {
    if (std::string why = row_lanes_blocker(*t); !why.empty())
      return fmt::format("{}: row_lanes={} but {}", name, t->row_lanes, why);
  }
  if (const auto* g = std::get_if<GatherSumInstance>(&k); g && !inter::valid_edge_batch(g->edge_batch))
    return fmt::format("{}: edge_batch={} is not 1, 2, 4 or 8", name, g->edge_batch);
  if (const auto* g = std::get_if<GatherSumInstance>(&k); g && (g->row_lanes == 0 || !inter::valid_row_lanes(g->row_lanes)))
    return fmt::format("{}: row_lanes={} is not 8, 16 or 32", name, g->row_lanes);
  if (const auto* g = std::get_if<GatherSumInstance>(&k); g && (g->vector == 0 || !inter::valid_vector(g->vector)))
    return fmt::format("{}: vector={} is not 1, 2, 4 or 8", name, g->vector);
  auto tile_coarsen = [&](int tile, int coarsen) -> std::string {
    if (!valid_tile(tile)) return fmt::format("{}: tile {} is not one of 8, 16, 32, 64", name, tile);
    if (!valid_coarsen(coarsen) || tile % coarsen)
      return fmt::format("{}: coarsening {} is not 1, 2 or 4, or does not divide tile {}", name, coarsen, tile);
    return {};
  };
  if (std::holds_alternative<WeightGradInstance>(k)) {
    // Grid x's cap stands for the launcher's refusal of too many segments; a graph of one segment must fit.
    GridExtent uncapped = c.x;
    uncapped.cap = 0;
    if (const int64_t blocks = uncapped.at(1, 1); blocks > limits::kGridX)
      return fmt::format("{}: grid x reaches {} blocks for one segment (the limit is {})", name, blocks, limits::kGridX);
  }
  if (auto* gp = std::get_if<GemmInstance>(&k)) {
    const GemmInstance& g = *gp;
    if (std::string e = tile_coarsen(g.tile, g.coarsen); !e.empty()) return e;
    const int64_t blocks = ceil_div(g.n, g.tile) * g.heads;
    if (c.y.fixed * c.z.fixed < blocks || (!c.fold_yz && c.z.fixed != g.heads))
      return fmt::format("{}: grid y x z ({} x {}) does not cover {} column tiles x {} heads", name, c.y.fixed, c.z.fixed,
                         ceil_div(g.n, g.tile), g.heads);
  }
  return {};
}

std::vector<ScheduleProblem> check_schedule(const inter::Schedule& s) {
  std::vector<ScheduleProblem> out;
  const bool tile_ok = valid_tile(s.gemm_tile), coarsen_ok = valid_coarsen(s.gemm_coarsen);
  if (!tile_ok)
    out.push_back({ScheduleKey::Tile, fmt::format("'tile' must be 8, 16, 32 or 64, got {}", s.gemm_tile)});
  if (!coarsen_ok)
    out.push_back({ScheduleKey::Coarsen,
                   fmt::format("'coarsen' (rows of the tile per thread) must be 1, 2 or 4, got {}", s.gemm_coarsen)});
  const int64_t threads = gemm_threads(s.gemm_tile, s.gemm_coarsen);
  if (tile_ok && coarsen_ok && threads > limits::kThreadsPerBlock) {
    int need = static_cast<int>(threads / limits::kThreadsPerBlock) * s.gemm_coarsen;
    out.push_back({ScheduleKey::Tile,
                   fmt::format("'tile: {}' with 'coarsen: {}' gives GEMM blocks of {} threads ({} x {} / {}), more than the {} "
                               "a block can have: use 'coarsen: {}' or a smaller tile",
                               s.gemm_tile, s.gemm_coarsen, threads, s.gemm_tile, s.gemm_tile, s.gemm_coarsen,
                               limits::kThreadsPerBlock, need)});
  }
  if (s.launch_bounds) {
    const int b = *s.launch_bounds;
    if (b < 1 || b > limits::kBlocksPerSm) {
      out.push_back({ScheduleKey::LaunchBounds,
                     fmt::format("'launch_bounds' (resident GEMM blocks per multiprocessor) must be from 1 to {}, got {}",
                                 limits::kBlocksPerSm, b)});
    } else if (tile_ok && coarsen_ok && threads <= limits::kThreadsPerBlock) {
      const int64_t shared = gemm_shared_bytes(s.gemm_tile) + limits::kSharedBytesReservedPerBlock;
      const int64_t fit = std::min(limits::kThreadsPerSm / threads, limits::kSharedBytesPerSm / shared);
      if (b > fit)
        out.push_back({ScheduleKey::LaunchBounds,
                       fmt::format("'launch_bounds: {}' asks for {} resident blocks of {} threads (tile {}, coarsen {}) per "
                                   "multiprocessor; sm_80 and sm_90 hold {} threads, so at most {} such blocks",
                                   b, b, threads, s.gemm_tile, s.gemm_coarsen, limits::kThreadsPerSm, fit)});
    }
  }
  const int t = s.traversal_threads;
  if (t < limits::kWarp || t > limits::kThreadsPerBlock || t % limits::kWarp)
    out.push_back({ScheduleKey::TraversalThreads,
                   fmt::format("'threads' must be a multiple of 32 (whole warps) from 32 to {}, got {}", limits::kThreadsPerBlock,
                               t)});
  if (!inter::valid_edge_batch(s.traversal_edge_batch))
    out.push_back({ScheduleKey::TraversalEdgeBatch,
                   fmt::format("'edge_batch' (edges a warp's edge loop takes per step) must be 1, 2, 4 or 8, got {}",
                               s.traversal_edge_batch)});
  if (!inter::valid_row_lanes(s.traversal_row_lanes))
    out.push_back({ScheduleKey::TraversalRowLanes,
                   fmt::format("'row_lanes' (lanes that hold one row of a traversal) must be auto, 8, 16 or 32, got {}",
                               s.traversal_row_lanes)});
  if (!inter::valid_row_lanes(s.gather_sum_row_lanes))
    out.push_back({ScheduleKey::GatherSumRowLanes,
                   fmt::format("'row_lanes' (lanes that hold one row of a gather sum) must be auto, 8, 16 or 32, got {}",
                               s.gather_sum_row_lanes)});
  if (!inter::valid_group_rows_below(s.gather_sum_group_rows_below))
    out.push_back({ScheduleKey::GatherSumGroupRowsBelow, group_rows_below_problem(s.gather_sum_group_rows_below)});
  if (!inter::valid_vector(s.traversal_vector))
    out.push_back({ScheduleKey::TraversalVector,
                   fmt::format("'vector' (the most consecutive elements of a row one lane holds) must be auto, 1, 2, 4 or 8, got {}",
                               s.traversal_vector)});
  if (!inter::valid_position_indices(s.traversal_position_indices))
    out.push_back({ScheduleKey::TraversalPositionIndices,
                   fmt::format("'position_indices' (a node's edges' pairs and relations read by CSR position) must be 0 or "
                               "1, got {}",
                               s.traversal_position_indices)});
  return out;
}

// ---- shape limits --------------------------------------------------------------------------------------------
namespace {

using inter::Expr;
using inter::ExprKind;
using inter::ExprP;
using inter::Stmt;
using inter::StmtKind;
using inter::StmtP;

// Elements of a shape (dimensions are positive), saturated at INT64_MAX.
int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n = d > 0 && n > INT64_MAX / d ? INT64_MAX : n * d;
  return n;
}

const inter::TensorDecl* declared(const inter::ModelDecl& d, const std::string& name) {
  if (const auto* t = d.find_input(name)) return t;
  if (const auto* t = d.find_weight(name)) return t;
  return d.find_output(name);
}

// Where a declared tensor's shape is written: its largest dimension, else the declaration.
SourceLoc shape_loc(const inter::TensorDecl& t) {
  size_t largest = 0;
  for (size_t i = 1; i < t.shape.size() && i < t.shape_exprs.size(); ++i)
    if (t.shape[i] > t.shape[largest]) largest = i;
  return largest < t.shape_exprs.size() && t.shape_exprs[largest]->loc.valid() ? t.shape_exprs[largest]->loc : t.loc;
}

// A row a traversal reads or writes: the tensor (declared name or field) and its elements.
struct RowUse {
  std::string name;
  int64_t elements = 0;
  SourceLoc at;  // the expression that reads or writes it
};

// Every row an expression of a traversal touches, resolved as emit/traversal.cpp resolves them: inputs
// (n.feature), weight rows (w[e.etype], a shared w), fields (e["att"]) and materialised locals.
void rows_of(const Program& p, const TraversalSource& t, const ExprP& e, std::vector<RowUse>& out) {
  if (!e) return;
  switch (e->kind) {
    case ExprKind::Attr:
      if (const auto* in = p.decl.find_input(e->name)) out.push_back({in->name, numel(in->shape), e->loc});
      break;
    case ExprKind::Name:
      if (auto it = t.materialized.find(e->name); it != t.materialized.end()) {
        if (const TensorInfo* ti = p.find(it->second)) out.push_back({e->name, ti->row_numel(), e->loc});
      } else if (const auto* w = p.decl.find_weight(e->name)) {
        out.push_back({w->name, numel(w->shape), e->loc});
      }
      break;
    case ExprKind::Index: {
      const ExprP& base = e->args[0];
      if (base->kind == ExprKind::Name && p.decl.find_weight(base->name)) {
        out.push_back({base->name, numel(p.decl.find_weight(base->name)->shape), e->loc});
        return;
      }
      if (e->args.size() > 1 && e->args[1]->kind == ExprKind::String) {
        const std::string& field = e->args[1]->name;
        auto it = t.field_tensor.find(field);
        if (const TensorInfo* ti = p.find(it == t.field_tensor.end() ? field : it->second)) out.push_back({field, ti->row_numel(), e->loc});
      }
      break;
    }
    default: break;
  }
  for (const ExprP& a : e->args) rows_of(p, t, a, out);
}

void for_each_stmt(const StmtP& s, const std::function<void(const Stmt&)>& f) {
  f(*s);
  for (const StmtP& b : s->body) for_each_stmt(b, f);
}

}  // namespace

bool check_shape_limits(const Program& p, const std::vector<TraversalSource>& traversals, Diagnostics& diags) {
  const int before = diags.error_count();
  // Rows and weight slices: below 2^31 elements.
  for (const TensorInfo& t : p.tensors) {
    const int64_t n = numel(t.shape);
    if (n <= limits::kRowElements) continue;
    const inter::TensorDecl* d = declared(p.decl, t.name);
    const char* per = t.per == inter::Per::Node ? " per node" : t.per == inter::Per::Edge ? " per edge"
                      : t.per == inter::Per::None ? "" : " per type";
    diags.error(d ? shape_loc(*d) : p.decl.loc, "too-large",
                fmt::format("'{}' has {} elements{}; the kernels support at most {} (2^31 - 1)", t.name, n, per,
                            limits::kRowElements));
  }
  if (diags.error_count() != before) return false;
  // Traversals hold their rows in registers.
  std::set<std::string> reported;
  for (const TraversalSource& t : traversals) {
    bool done = false;
    for_each_stmt(t.loop, [&](const Stmt& s) {
      if (done || s.kind == StmtKind::For) return;
      std::vector<RowUse> rows;
      rows_of(p, t, s.target, rows);
      rows_of(p, t, s.value, rows);
      for (const RowUse& r : rows) {
        if (r.elements <= limits::kTraversalRowElements) continue;
        done = true;
        if (!reported.insert(r.name).second) return;
        // At the declared shape to change, else at the statement that computes the row.
        const inter::TensorDecl* d = declared(p.decl, r.name);
        SourceLoc at = d ? shape_loc(*d) : r.at.valid() ? r.at : s.loc.valid() ? s.loc : p.decl.loc;
        diags.error(at, "row-too-wide",
                    fmt::format("'{}' has rows of {} elements, but a traversal kernel (one warp per {}, holding the row in "
                                "registers) supports at most {}",
                                r.name, r.elements, inter::is_edge_loop(t.loop->loop) ? "edge" : "node",
                                limits::kTraversalRowElements));
        return;
      }
    });
  }
  return diags.error_count() == before;
}

}  // namespace hectorgen::intra
