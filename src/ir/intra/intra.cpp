#include "ir/intra/intra.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>

#include "ir/inter/names.h"
#include "ir/inter/ops.h"
#include "ir/inter/printer.h"
#include "ir/inter/verifier.h"
#include "ir/intra/launch.h"

namespace hectorgen::intra {

const TensorInfo* Program::find(const std::string& name) const {
  for (const TensorInfo& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string in_position_quantity(const std::string& from_graph) {
  return from_graph == layout::kInvRelInDegree ? layout::kInColInvRelInDegree : "";
}

std::string in_position_twin(const std::string& tensor) { return inter::derived_name("in", tensor); }

bool by_in_position(const TensorInfo& t) { return t.from_graph == layout::kInColInvRelInDegree; }

const std::string& kernel_name(const Kernel& k) {
  return std::visit([](const auto& x) -> const std::string& { return x.name; }, k);
}

namespace {
void traversal_stores(const std::vector<Instr>& body, std::set<std::string>& out) {
  for (const Instr& in : body) {
    if (auto* s = std::get_if<Store>(&in.v)) out.insert(s->tensor);
    if (auto* l = std::get_if<EdgeLoop>(&in.v)) traversal_stores(l->body, out);
  }
}
}  // namespace

std::set<std::string> kernel_writes(const Kernel& k) {
  std::set<std::string> out;
  if (auto* g = std::get_if<GemmInstance>(&k)) out.insert(g->y);
  if (auto* w = std::get_if<WeightGradInstance>(&k)) out.insert(w->dw);
  if (auto* s = std::get_if<SegmentSumInstance>(&k)) out.insert(s->dw);
  if (auto* s = std::get_if<GatherSumInstance>(&k)) out.insert(s->y);
  if (auto* t = std::get_if<TorchInstance>(&k)) out.insert(t->target);
  if (auto* t = std::get_if<TraversalInstance>(&k)) traversal_stores(t->body, out);
  return out;
}

std::set<std::string> returned_tensors(const Program& p) {
  std::set<std::string> out;
  for (const TensorInfo& t : p.tensors)
    if (t.role == Role::Output) out.insert(t.name);
  for (const std::string& s : p.saved) {
    auto it = p.aliases.find(s);
    out.insert(it == p.aliases.end() ? s : it->second);
  }
  return out;
}

bool read_by_torch(const Program& p, const std::string& tensor, size_t from) {
  return std::any_of(p.kernels.begin() + static_cast<long>(from), p.kernels.end(), [&](const Kernel& k) {
    return std::holds_alternative<TorchInstance>(k) && kernel_reads(k).count(tensor);
  });
}

namespace {

// The graph array an indexed input's map is composed with ("" for node rows).
std::string indexed_gather_array(Rows rows, Gather gather) {
  if (gather == Gather::Src) return rows == Rows::Pairs ? "pair_src" : "src";
  if (gather == Gather::Dst) return "dst";
  return "";
}

bool is_indexed(const Program& p, const std::string& name) {
  const inter::TensorDecl* d = p.decl.find_input(name);
  return d && d->indexed_rows;
}

}  // namespace

std::string indexed_list(const Program& p, const std::string& x, Rows rows, Gather gather) {
  if (!is_indexed(p, x)) return "";
  const std::string array = indexed_gather_array(rows, gather);
  return x + "_rows_" + (array.empty() ? "nodes" : array);
}

std::vector<std::pair<std::string, std::string>> indexed_lists(const Program& p, const std::string& x) {
  std::vector<std::pair<std::string, std::string>> out;
  auto add = [&](Rows rows, Gather gather) {
    std::pair<std::string, std::string> l{indexed_list(p, x, rows, gather), indexed_gather_array(rows, gather)};
    if (!l.first.empty() && std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
  };
  for (const Kernel& k : p.kernels) {
    if (auto* g = std::get_if<GemmInstance>(&k); g && g->x == x) add(g->rows, g->gather);
    if (auto* w = std::get_if<WeightGradInstance>(&k); w && w->x == x) add(w->rows, w->x_gather);
  }
  return out;
}

std::string indexed_input_obstacle(const Program& p, std::string* input) {
  for (const Kernel& k : p.kernels)
    for (const std::string& name : kernel_reads(k)) {
      if (!is_indexed(p, name)) continue;
      const auto* g = std::get_if<GemmInstance>(&k);
      const auto* w = std::get_if<WeightGradInstance>(&k);
      if (g && g->x == name && g->w != name && g->row_scalar != name) continue;
      if (w && w->x == name && w->dy != name && w->row_scalar != name) continue;
      if (input) *input = name;
      return fmt::format("{} ({}) reads input '{}' other than as the X of a GEMM or weight gradient; an input with "
                         "'rows: indexed' is read only by those",
                         kernel_name(k), p.phase, name);
    }
  return "";
}

std::set<std::string> kernel_reads(const Kernel& k) {
  std::set<std::string> out;
  if (auto* g = std::get_if<GemmInstance>(&k)) out = {g->x, g->w};
  if (auto* g = std::get_if<GemmInstance>(&k); g && (g->accumulate || g->scatter != Gather::None)) out.insert(g->y);
  if (auto* w = std::get_if<WeightGradInstance>(&k)) out = {w->x, w->dy};
  if (auto* w = std::get_if<WeightGradInstance>(&k); w && w->accumulate) out.insert(w->dw);
  if (auto* s = std::get_if<SegmentSumInstance>(&k)) out = {s->v, s->dw};
  if (auto* s = std::get_if<GatherSumInstance>(&k)) out = {s->x};
  if (auto* s = std::get_if<GatherSumInstance>(&k); s && !s->scale.empty()) out.insert(s->scale);
  if (auto* s = std::get_if<GatherSumInstance>(&k); s && s->accumulate) out.insert(s->y);
  for (const std::string* scalar : {std::get_if<GemmInstance>(&k) ? &std::get<GemmInstance>(k).row_scalar : nullptr,
                                    std::get_if<WeightGradInstance>(&k) ? &std::get<WeightGradInstance>(k).row_scalar : nullptr})
    if (scalar && !scalar->empty()) out.insert(*scalar);
  if (auto* t = std::get_if<TraversalInstance>(&k)) {
    for_each_instr(t->body, [&](const Instr& in) {
      if (auto* d = std::get_if<Def>(&in.v))
        if (auto* l = std::get_if<Load>(&d->source)) out.insert(l->tensor);
      if (auto* s = std::get_if<Store>(&in.v); s && s->atomic) out.insert(s->tensor);
    });
  }
  if (auto* t = std::get_if<TorchInstance>(&k)) {
    // Every tensor the statement names: materialised locals, fields (through their aliases), inputs, weights.
    std::function<void(const inter::ExprP&)> expr = [&](const inter::ExprP& e) {
      if (e->kind == inter::ExprKind::Name) {
        if (auto it = t->materialized.find(e->name); it != t->materialized.end()) out.insert(it->second);
        out.insert(e->name);
      }
      if (e->kind == inter::ExprKind::Attr) out.insert(e->name);
      if (e->kind == inter::ExprKind::String) {
        auto it = t->field_tensor.find(e->name);
        out.insert(it == t->field_tensor.end() ? e->name : it->second);
      }
      for (const inter::ExprP& a : e->args) expr(a);
    };
    std::function<void(const inter::StmtP&)> stmt = [&](const inter::StmtP& s) {
      if (s->target) expr(s->target);
      if (s->value) expr(s->value);
      for (const inter::StmtP& b : s->body) stmt(b);
    };
    stmt(t->loop);
  }
  return out;
}

const char* cuda_type(inter::DType storage) {
  switch (storage) {
    case inter::DType::FP32:
    case inter::DType::TF32: return "float";
    case inter::DType::BF16: return "__nv_bfloat16";
    case inter::DType::FP16: return "__half";
  }
  return "float";
}

std::string wgrad_tc_obstacle(const WeightGradInstance& w) {
  if (w.heads != 1) return "heads > 1";
  if (w.k % 64) return "k % 64";
  if (w.n % 64) return "n % 64";
  return {};
}

WgradKernel choose_wgrad_kernel(const WeightGradInstance& w) {
  return wgrad_tc_obstacle(w).empty() ? WgradKernel::TensorCore : WgradKernel::Simt;
}

std::string wgrad_kernel_text(const WeightGradInstance& w) {
  if (w.kernel == WgradKernel::TensorCore) return "tc";
  const std::string why = wgrad_tc_obstacle(w);
  return why.empty() ? "simt" : fmt::format("simt(tc: {})", why);
}

GemmKernelChoice gemm_kernel_choice(const Program& p, const GemmInstance& g) {
  auto no = [](std::string reason) { return GemmKernelChoice{false, std::move(reason)}; };
  if (g.rows == Rows::Etypes) return no("rows=etypes");
  if (g.heads != 1) return no("heads > 1");
  if (g.k % 32 != 0) return no("k % 32");
  if (g.n % 64 != 0) return no("n % 64");
  // The kernel reads x and w as T, the dtype's storage type, and writes y as T or fp32 (fp32 only when it adds
  // atomically); the row scalar is fp32. A 16-bit model's fp32 x (a gradient the backward keeps in fp32) is read as
  // it is, its 16-bit weights widened as they are loaded (tf32 MMAs, gemm_widens_weights).
  const inter::DType storage = model_storage(g.dtype);
  const inter::DType y_storage = g.scatter != Gather::None ? inter::DType::FP32 : storage;
  const std::pair<const std::string*, inter::DType> operands[] = {
      {&g.x, storage}, {&g.w, storage}, {&g.y, y_storage}, {&g.row_scalar, inter::DType::FP32}};
  for (const auto& [name, want] : operands) {
    if (name->empty()) continue;
    const TensorInfo* t = p.find(*name);
    if (!t) continue;  // not a reason for either kernel: the verifier rejects the instance
    const bool fp32_ok = (name == &g.y || name == &g.x) && t->storage == inter::DType::FP32;
    if (t->storage != want && !fp32_ok) return no(fmt::format("{} stored as {}", *name, inter::to_string(t->storage)));
  }
  return {true, ""};
}

bool gemm_widens_weights(const Program& p, const GemmInstance& g) {
  const TensorInfo *x = p.find(g.x), *w = p.find(g.w);
  return x && w && x->storage == inter::DType::FP32 && w->storage != inter::DType::FP32;
}

bool wgrad_tc_reads(inter::DType model, inter::DType x, inter::DType dy) {
  const inter::DType t = model_storage(model);
  return (x == t || x == inter::DType::FP32) && (dy == t || dy == inter::DType::FP32);
}

bool wgrad_widens(const Program& p, const WeightGradInstance& w) {
  const TensorInfo *x = p.find(w.x), *dy = p.find(w.dy);
  return w.kernel == WgradKernel::TensorCore && x && dy && x->storage != dy->storage;
}

bool reads_tile_offsets(const GemmInstance& g) {
  return g.segments != Segments::None && g.rows != Rows::Etypes;
}

int graph_gemm_tile(const Program& p) {
  if (p.graph_tile) return p.graph_tile;
  int tile = 16;
  for (const Kernel& k : p.kernels)
    if (auto* g = std::get_if<GemmInstance>(&k)) tile = g->tile;
  return tile;
}

std::string gemm_kernel_text(const Program& p, const GemmInstance& g) {
  if (g.tensor_cores) return "tc";
  const GemmKernelChoice c = gemm_kernel_choice(p, g);
  return c.reason.empty() ? "simt" : fmt::format("simt(tc: {})", c.reason);
}

inter::DType model_storage(inter::DType model) {
  return model == inter::DType::BF16 || model == inter::DType::FP16 ? model : inter::DType::FP32;
}

int storage_bytes(inter::DType storage) {
  return storage == inter::DType::BF16 || storage == inter::DType::FP16 ? 2 : 4;
}

namespace {
void traversal_atomic_stores(const std::vector<Instr>& body, std::set<std::string>& out) {
  for (const Instr& in : body) {
    if (auto* s = std::get_if<Store>(&in.v); s && s->atomic) out.insert(s->tensor);
    if (auto* l = std::get_if<EdgeLoop>(&in.v)) traversal_atomic_stores(l->body, out);
  }
}
}  // namespace

std::set<std::string> atomic_writes(const Kernel& k) {
  std::set<std::string> out;
  if (auto* g = std::get_if<GemmInstance>(&k); g && g->scatter != Gather::None) out.insert(g->y);
  if (auto* t = std::get_if<TraversalInstance>(&k)) traversal_atomic_stores(t->body, out);
  return out;
}

const char* to_string(Role r) {
  switch (r) {
    case Role::Input: return "input";
    case Role::Weight: return "weight";
    case Role::Output: return "output";
    case Role::Field: return "field";
    case Role::Temp: return "temp";
  }
  return "?";
}

const char* to_string(Segments s) { return s == Segments::None ? "-" : s == Segments::Etype ? "etype" : "ntype"; }

std::string gathered_row(Gather g) { return g == Gather::None ? "row" : g == Gather::Src ? "src[row]" : "dst[row]"; }

const char* to_string(GatherCsr c) { return c == GatherCsr::PairEdges ? "pair_edges" : "node_pairs"; }

const char* to_string(Rows r) {
  switch (r) {
    case Rows::Nodes: return "nodes";
    case Rows::Edges: return "edges";
    case Rows::Etypes: return "etypes";
    case Rows::Pairs: return "pairs";
  }
  return "?";
}

bool traversal_supports(const inter::ExprP& e) {
  using inter::ExprKind;
  bool op = e->kind == ExprKind::Call || e->kind == ExprKind::Binary || e->kind == ExprKind::Neg;
  if (!op) {
    for (const auto& a : e->args)
      if (!traversal_supports(a)) return false;
    return true;
  }
  const inter::OpInfo& info = inter::op_info(e->fn);
  if (!info.templates.traversal) return false;
  for (size_t i = 0; i < e->args.size(); ++i)  // constant parameters are literals in the kernel
    if (info.param(i).kind != inter::ParamKind::Constant && !traversal_supports(e->args[i])) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------------
// Printer
// ---------------------------------------------------------------------------------------------------
namespace {

std::string print_gemm(const Program& p, const GemmInstance& g) {
  std::string x = fmt::format("{}[{}]", g.x, gathered_row(g.gather));
  std::string y = g.scatter != Gather::None ? fmt::format("{}[{}] +=", g.y, gathered_row(g.scatter))
                                            : fmt::format("{}[row] {}=", g.y, g.accumulate ? "+" : "");
  std::string out = fmt::format("gemm {}:  {} {} · {}[{}]{}{}\n", g.name, y, x, g.w, to_string(g.segments), g.transpose_w ? "^T" : "",
                                g.row_scalar.empty() ? "" : fmt::format(" * {}[row]", g.row_scalar));
  out += fmt::format("    rows={} heads={} k={} n={} dtype={} tile={} coarsen={} store={} kernel={}{}{}\n",
                     to_string(g.rows), g.heads, g.k, g.n, inter::to_string(g.dtype), g.tile, g.coarsen,
                     g.scatter != Gather::None ? "atomic" : g.accumulate ? "add" : "plain", gemm_kernel_text(p, g),
                     g.graph_tiles ? " tiles=graph" : "",
                     g.launch_bounds ? fmt::format(" launch_bounds={}", *g.launch_bounds) : "");
  return out + fmt::format("    from: {}\n", g.source);
}

std::string print_wgrad(const WeightGradInstance& w) {
  std::string out = fmt::format("wgrad {}:  {}[{}] {}= sum over rows {}[{}]^T · {}[{}]{}\n", w.name, w.dw, to_string(w.segments),
                                w.accumulate ? "+" : "", w.x, gathered_row(w.x_gather), w.dy, gathered_row(w.dy_gather),
                                w.row_scalar.empty() ? "" : fmt::format(" * {}[row]", w.row_scalar));
  out += fmt::format("    rows={} heads={} k={} n={} dtype={} kernel={} deterministic\n", to_string(w.rows),
                     w.heads, w.k, w.n, inter::to_string(w.dtype), wgrad_kernel_text(w));
  return out + fmt::format("    from: {}\n", w.source);
}

std::string print_segsum(const SegmentSumInstance& s) {
  return fmt::format("segsum {}:  {}[{}] += sum over rows {}[row]\n    rows={} numel={} deterministic\n    from: {}\n", s.name, s.dw,
                     to_string(s.segments), s.v, to_string(s.rows), s.numel, s.source);
}

std::string print_gathersum(const GatherSumInstance& s) {
  return fmt::format("gathersum {}:  {}[row] {}= sum over {}.{}(row) {}[{}]{}\n    numel={} deterministic{}{}{}{}\n    from: {}\n",
                     s.name, s.y, s.accumulate ? "+" : "", layout::kCompactSrc, to_string(s.csr), s.x,
                     s.x_gather == Gather::Dst ? "dst[i]" : s.x_gather == Gather::Src ? "src[i]" : "i",
                     s.scale.empty() ? "" : fmt::format(" * {}[i]", s.scale), s.numel,
                     s.edge_batch != 1 ? fmt::format(" edge_batch={}", s.edge_batch) : "",
                     s.row_lanes != 32 ? fmt::format(" row_lanes={}", s.row_lanes) : "",
                     s.vector != kDefaultVector ? fmt::format(" vector={}", s.vector) : "",
                     s.group_rows_below != -1 ? fmt::format(" group_rows_below={}", s.group_rows_below) : "", s.source);
}

std::string print_torch(const TorchInstance& t) {
  std::string out = fmt::format("torch {}: target={}\n", t.name, t.target);
  for (const auto& [local, tensor] : t.materialized) out += fmt::format("    local {} -> {}\n", local, tensor);
  for (const auto& [field, tensor] : t.field_tensor) out += fmt::format("    field {} -> {}\n", field, tensor);
  return out + inter::print_stmt(t.loop, "    ");
}

// The model's declarations as the inter-operator IR's header prints them, without its first line and
// without `program:`.
std::string print_decl(const inter::ModelDecl& d) {
  inter::Module m;
  m.decl = d;
  std::string text = inter::print_module(m);
  size_t model = text.find("\nmodel ");
  size_t first = text.find('\n', model + 1) + 1;
  size_t program = text.rfind("program:\n");
  return text.substr(first, program - first);
}

}  // namespace

std::string print_program(const Program& p) {
  std::string out = "# hectorgen intra-operator IR\n";
  for (const std::string& note : p.notes) out += fmt::format("# {}\n", note);
  out += fmt::format("model {}\nphase {}\n", p.model, p.phase);
  out += print_decl(p.decl);
  std::string lay;
  for (const auto& l : p.layouts) lay += (lay.empty() ? "" : ", ") + l;
  out += fmt::format("layouts {}\n", lay);
  if (p.graph_tile) out += fmt::format("graph_tile {}\n", p.graph_tile);
  for (const TensorInfo& t : p.tensors) {
    out += fmt::format("tensor {}: {} {}{}", t.name, to_string(t.role), inter::to_string(t.per), inter::shape_str(t.shape));
    if (t.storage != inter::DType::FP32) out += fmt::format(" {}", inter::to_string(t.storage));  // fp32 is not printed
    if (t.zero_init) out += " zero_init";
    if (!t.from_graph.empty()) out += fmt::format(" from_graph={}", t.from_graph);
    out += "\n";
  }
  for (const auto& [field, tensor] : p.aliases) out += fmt::format("alias {} -> {}\n", field, tensor);
  if (!p.saved.empty()) {
    std::string s;
    for (const auto& n : p.saved) s += (s.empty() ? "" : ", ") + n;
    out += fmt::format("saved {}\n", s);
  }
  for (const Kernel& k : p.kernels) {
    out += "\n";
    out += std::visit(
        [&p](const auto& x) -> std::string {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, GemmInstance>) return print_gemm(p, x);
          else if constexpr (std::is_same_v<T, WeightGradInstance>) return print_wgrad(x);
          else if constexpr (std::is_same_v<T, SegmentSumInstance>) return print_segsum(x);
          else if constexpr (std::is_same_v<T, GatherSumInstance>) return print_gathersum(x);
          else if constexpr (std::is_same_v<T, TorchInstance>) return print_torch(x);
          else return print_traversal(x);
        },
        k);
  }
  return out;
}

std::string print_programs(const std::vector<Program>& phases) {
  std::string out;
  for (const Program& p : phases) out += (out.empty() ? "" : "\n") + fmt::format("# ==== {} ====\n", p.phase) + print_program(p);
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Verifier
// ---------------------------------------------------------------------------------------------------
namespace {

class ProgramVerifier {
 public:
  explicit ProgramVerifier(const Program& p) : p_(p) {}

  std::string run() {
    if (p_.graph_tile != 0 && p_.graph_tile != kTcTileRows)
      return fmt::format("graph_tile {}: the graph's tile offsets are read from it only by the tensor-core kernel, "
                         "whose row tile is {}", p_.graph_tile, kTcTileRows);
    std::set<std::string> names, kernels;
    for (const TensorInfo& t : p_.tensors)
      if (!names.insert(t.name).second) return fmt::format("tensor '{}' is defined twice", t.name);
    for (const TensorInfo& t : p_.tensors) {
      int64_t n = 1;
      for (int64_t d : t.shape) {
        if (d < 1) return fmt::format("tensor '{}' has an empty dimension", t.name);
        n = n > limits::kRowElements ? n : n * d;  // n <= 2^31 before a product: no overflow
      }
      if (n > limits::kRowElements) return fmt::format("tensor '{}' has {} or more elements per row or type", t.name, n);
    }
    if (std::string e = storage(); !e.empty()) return e;
    for (const auto& [field, tensor] : p_.aliases)
      if (!p_.find(tensor)) return fmt::format("alias {} -> {}: unknown tensor", field, tensor);
    for (const Kernel& k : p_.kernels) {
      const std::string& name = kernel_name(k);
      if (!kernels.insert(name).second) return fmt::format("kernel '{}' is defined twice", name);
      std::string e = verify_launch(p_, k);
      if (e.empty()) e = std::visit([&](const auto& x) { return check(x); }, k);
      if (!e.empty()) return e;
    }
    return {};
  }

 private:
  // A tensor operand: known, and (when it is written) not an input or weight.
  const TensorInfo* operand(const std::string& kernel, const std::string& name, bool written, std::string& err) const {
    const TensorInfo* t = p_.find(name);
    if (!t) err = fmt::format("{}: unknown tensor '{}'", kernel, name);
    else if (written && (t->role == Role::Input || t->role == Role::Weight))
      err = fmt::format("{}: writes '{}', an {}", kernel, name, to_string(t->role));
    return err.empty() ? t : nullptr;
  }

  // A row operand of an instance over rows `r`: its own rows (a row per node, edge or pair), or node rows gathered
  // through the edge's (the pair's) source or destination.
  std::string rows(const std::string& kernel, const TensorInfo& t, Rows r, Gather g, const char* what) const {
    if (t.per != inter::Per::Edge && t.per != inter::Per::Node && t.per != inter::Per::Pair)
      return fmt::format("{}: {} '{}' is a weight, not a row operand", kernel, what, t.name);
    if (g != Gather::None && r != Rows::Edges && r != Rows::Pairs)
      return fmt::format("{}: {} '{}' is gathered through src/dst, which needs edge or pair rows", kernel, what, t.name);
    if (g == Gather::Dst && r == Rows::Pairs)
      return fmt::format("{}: {} '{}' is gathered through dst, but a (source, edge type) pair has no destination", kernel,
                         what, t.name);
    const inter::Per own = r == Rows::Edges ? inter::Per::Edge : r == Rows::Pairs ? inter::Per::Pair : inter::Per::Node;
    if (g == Gather::None && t.per != own)
      return fmt::format("{}: {} '{}' has a row per {}, read per {} without a gather", kernel, what, t.name,
                         inter::to_string(t.per), inter::to_string(own));
    if (g != Gather::None && t.per != inter::Per::Node)
      return fmt::format("{}: {} '{}' has a row per {}, but only node rows are gathered", kernel, what, t.name,
                         inter::to_string(t.per));
    if (r == Rows::Pairs && !p_.layouts.count(layout::kCompactSrc))
      return fmt::format("{}: pair rows need the layout '{}'", kernel, layout::kCompactSrc);
    if (r == Rows::Edges && g != Gather::None && !p_.layouts.count(layout::kSortedCoo))
      return fmt::format("{}: gathers through src/dst need the layout '{}'", kernel, layout::kSortedCoo);
    return {};
  }

  // Rows over the edge types: every row operand holds a row per edge type; nothing is gathered, scattered or
  // scaled per row. (A GEMM's segments may be the edge types, one row each; a weight gradient has none.)
  std::string etype_rows(const std::string& kernel, std::initializer_list<const TensorInfo*> operands, bool plain) const {
    if (!plain) return fmt::format("{}: rows=etypes has no gathers, scatters or row scalars", kernel);
    for (const TensorInfo* t : operands)
      if (t->per != inter::Per::Etype) return fmt::format("{}: '{}' has no row per edge type (rows=etypes)", kernel, t->name);
    return {};
  }

  std::string segments(const std::string& kernel, Rows r, Segments s, const TensorInfo& w) const {
    if (s == Segments::Etype && r == Rows::Nodes)
      return fmt::format("{}: per-edge-type segments need edge, edge-type or pair rows", kernel);
    if (s == Segments::Ntype && r != Rows::Nodes) return fmt::format("{}: per-node-type segments need node rows", kernel);
    if (s == Segments::Etype && (w.per != inter::Per::Etype || !p_.layouts.count(layout::kSortedCoo)))
      return fmt::format("{}: per-edge-type segments need '{}' per etype and the layout '{}'", kernel, w.name, layout::kSortedCoo);
    if (s == Segments::Ntype && (w.per != inter::Per::Ntype || !p_.layouts.count(layout::kNtypePtr)))
      return fmt::format("{}: per-node-type segments need '{}' per ntype and the layout '{}'", kernel, w.name, layout::kNtypePtr);
    if (s == Segments::None && w.per != inter::Per::None)
      return fmt::format("{}: '{}' has a slice per type but the kernel has no segments", kernel, w.name);
    return {};
  }

  // Element storage types (docs/dtype_plan.md): fp32, or the 16-bit type of a bf16/fp16 model; the module's
  // arguments and results (inputs, weights, outputs) in the model's storage type; atomics only on fp32.
  std::string storage() const {
    const inter::DType model = model_storage(p_.decl.options.dtype);
    for (const TensorInfo& t : p_.tensors) {
      if (t.storage == inter::DType::TF32) return fmt::format("tensor '{}': tf32 is an arithmetic class, not a storage type", t.name);
      if (t.storage != inter::DType::FP32 && t.storage != model)
        return fmt::format("tensor '{}' is stored as {} in a {} model", t.name, inter::to_string(t.storage),
                           inter::to_string(p_.decl.options.dtype));
      // Inputs may be fp32 too: those computed from the graph, and saved fields with narrow rows (the backward).
      if ((t.role == Role::Weight || t.role == Role::Output) && t.storage != model)
        return fmt::format("{} '{}' is stored as {}, but the {} model's parameters and results are {}", to_string(t.role), t.name,
                           inter::to_string(t.storage), inter::to_string(p_.decl.options.dtype), inter::to_string(model));
    }
    for (const Kernel& k : p_.kernels) {
      const std::string* scalar = std::get_if<GemmInstance>(&k)         ? &std::get<GemmInstance>(k).row_scalar
                                  : std::get_if<WeightGradInstance>(&k) ? &std::get<WeightGradInstance>(k).row_scalar
                                                                        : nullptr;
      if (const TensorInfo* t = scalar && !scalar->empty() ? p_.find(*scalar) : nullptr; t && t->storage != inter::DType::FP32)
        return fmt::format("{}: row scalar '{}' is stored as {} (row scalars multiply the fp32 accumulator: fp32)", kernel_name(k),
                           t->name, inter::to_string(t->storage));
    }
    for (const Kernel& k : p_.kernels)
      for (const std::string& a : atomic_writes(k))
        if (const TensorInfo* t = p_.find(a); t && t->storage != inter::DType::FP32)
          return fmt::format("{}: adds atomically into '{}', stored as {} (atomics need fp32 storage)", kernel_name(k), a,
                             inter::to_string(t->storage));
    return {};
  }

  // One dtype per model (the spec's `options: dtype`): every GEMM and weight gradient computes in it.
  std::string dtype(const std::string& kernel, inter::DType d) const {
    if (d != p_.decl.options.dtype)
      return fmt::format("{}: dtype={} but the model's dtype is {}", kernel, inter::to_string(d), inter::to_string(p_.decl.options.dtype));
    return {};
  }

  std::string check(const GemmInstance& g) const {
    if (std::string e = dtype(g.name, g.dtype); !e.empty()) return e;
    if (const GemmKernelChoice c = gemm_kernel_choice(p_, g); c.tensor_cores != g.tensor_cores) {
      if (g.tensor_cores) return fmt::format("{}: kernel=tc, but the tensor-core kernel cannot run it ({})", g.name, c.reason);
      return fmt::format("{}: kernel=simt, but the instance fits the tensor-core kernel (dtype={})", g.name,
                         inter::to_string(g.dtype));
    }
    if (g.graph_tiles && !(g.tensor_cores && reads_tile_offsets(g)))
      return fmt::format("{}: tiles=graph needs the tensor-core kernel over segments of edge, node or pair rows", g.name);
    if (g.graph_tiles && p_.graph_tile != kTcTileRows)
      return fmt::format("{}: tiles=graph, but the graph's tile offsets are for {}-row tiles, not the tensor-core "
                         "kernel's {} (graph_tile)", g.name, graph_gemm_tile(p_), kTcTileRows);
    if (p_.graph_tile && !g.tensor_cores && reads_tile_offsets(g))
      return fmt::format("{}: kernel=simt reads tile offsets of {}-row tiles, but the graph's are for {} (graph_tile)",
                         g.name, g.tile, p_.graph_tile);
    std::string err;
    const TensorInfo *x = operand(g.name, g.x, false, err), *w = x ? operand(g.name, g.w, false, err) : nullptr,
                     *y = w ? operand(g.name, g.y, true, err) : nullptr;
    if (!y) return err;
    if (x->row_numel() != g.heads * g.k)
      return fmt::format("{}: input rows of {} have {} elements, expected {} x {}", g.name, g.x, x->row_numel(), g.heads, g.k);
    if (y->row_numel() != g.heads * g.n)
      return fmt::format("{}: output rows of {} have {} elements, expected {} x {}", g.name, g.y, y->row_numel(), g.heads, g.n);
    int64_t slice = w->row_numel() / (w->shape.size() == 3 ? g.heads : 1);
    if (slice != g.k * g.n) return fmt::format("{}: weight {} slices have {} elements, expected {} x {}", g.name, g.w, slice, g.k, g.n);
    if (g.rows == Rows::Etypes) {
      // Per-edge-type segments over rows=etypes: row t is segment t, its weight W[t] (a product of two weights
      // of the edge type, reorder-linear's W[t] · w[t] and its gradients). Node-type segments have no meaning here.
      if (g.segments == Segments::Ntype) return fmt::format("{}: rows=etypes with node-type segments", g.name);
      bool plain = g.gather == Gather::None && g.scatter == Gather::None && g.row_scalar.empty();
      if (std::string e = etype_rows(g.name, {x, y}, plain); !e.empty()) return e;
      return segments(g.name, g.rows, g.segments, *w);
    }
    if (std::string e = rows(g.name, *x, g.rows, g.gather, "input"); !e.empty()) return e;
    if (std::string e = rows(g.name, *y, g.rows, g.scatter, "output"); !e.empty()) return e;
    if (g.scatter != Gather::None && g.accumulate) return fmt::format("{}: a scatter is an accumulation already", g.name);
    if (!g.row_scalar.empty()) {
      const TensorInfo* s = operand(g.name, g.row_scalar, false, err);
      if (!s) return err;
      if (std::string e = rows(g.name, *s, g.rows, Gather::None, "row scalar"); !e.empty()) return e;
      if (s->row_numel() != 1) return fmt::format("{}: row scalar '{}' is not one value per row", g.name, s->name);
    }
    return segments(g.name, g.rows, g.segments, *w);
  }

  std::string check(const WeightGradInstance& wg) const {
    if (std::string e = dtype(wg.name, wg.dtype); !e.empty()) return e;
    if (wg.kernel == WgradKernel::TensorCore)
      if (std::string why = wgrad_tc_obstacle(wg); !why.empty())
        return fmt::format("{}: kernel=tc, but the tensor-core kernel cannot compute it ({})", wg.name, why);
    std::string err;
    const TensorInfo *x = operand(wg.name, wg.x, false, err), *dy = x ? operand(wg.name, wg.dy, false, err) : nullptr,
                     *dw = dy ? operand(wg.name, wg.dw, true, err) : nullptr;
    if (!dw) return err;
    // The tensor-core kernel reads each operand in the dtype's storage type or fp32 (wgrad_tc_reads); the CUDA-core
    // one converts each from its own. dW and the partial sums have their own types.
    const inter::DType t = model_storage(wg.dtype);
    if (wg.kernel == WgradKernel::TensorCore && !wgrad_tc_reads(wg.dtype, x->storage, dy->storage))
      return fmt::format("{}: kernel=tc, but '{}' and '{}' are stored as {} and {}; the tensor-core kernel reads each as {} "
                         "or float",
                         wg.name, wg.x, wg.dy, cuda_type(x->storage), cuda_type(dy->storage), cuda_type(t));
    if (x->row_numel() != wg.heads * wg.k || dy->row_numel() != wg.heads * wg.n)
      return fmt::format("{}: rows of {} and {} have {} and {} elements, expected {} x {} and {} x {}", wg.name, wg.x, wg.dy,
                         x->row_numel(), dy->row_numel(), wg.heads, wg.k, wg.heads, wg.n);
    if (dw->row_numel() != wg.heads * wg.k * wg.n)
      return fmt::format("{}: '{}' slices have {} elements, expected {} x {} x {}", wg.name, wg.dw, dw->row_numel(), wg.heads, wg.k, wg.n);
    if (wg.rows == Rows::Etypes) {
      bool plain = wg.x_gather == Gather::None && wg.dy_gather == Gather::None && wg.row_scalar.empty();
      if (std::string e = etype_rows(wg.name, {x, dy}, plain); !e.empty()) return e;
      if (wg.segments != Segments::None)  // dW[t] += x[t]^T dy[t] per type is a GEMM: rows=etypes, segments=etype
        return fmt::format("{}: a weight gradient over rows=etypes has no segments", wg.name);
      return segments(wg.name, wg.rows, wg.segments, *dw);
    }
    if (std::string e = rows(wg.name, *x, wg.rows, wg.x_gather, "input"); !e.empty()) return e;
    if (std::string e = rows(wg.name, *dy, wg.rows, wg.dy_gather, "input"); !e.empty()) return e;
    return segments(wg.name, wg.rows, wg.segments, *dw);
  }

  std::string check(const GatherSumInstance& s) const {
    std::string err;
    const TensorInfo *x = operand(s.name, s.x, false, err), *y = x ? operand(s.name, s.y, true, err) : nullptr;
    if (!y) return err;
    if (!p_.layouts.count(layout::kCompactSrc))
      return fmt::format("{}: a gather sum over {} needs the layout '{}'", s.name, to_string(s.csr), layout::kCompactSrc);
    if (x->row_numel() != s.numel || y->row_numel() != s.numel)
      return fmt::format("{}: rows of {} and {} have {} and {} elements, expected {}", s.name, s.x, s.y, x->row_numel(),
                         y->row_numel(), s.numel);
    const bool pairs = s.csr == GatherCsr::PairEdges;
    if ((s.x_gather != Gather::None || !s.scale.empty()) && !pairs)
      return fmt::format("{}: only a sum over pair_edges gathers or scales its rows", s.name);
    if (s.x_gather == Gather::Src) return fmt::format("{}: the rows of a pair's edges are gathered through dst", s.name);
    if (!s.scale.empty()) {
      const TensorInfo* sc = operand(s.name, s.scale, false, err);
      if (!sc) return err;
      if (sc->per != inter::Per::Edge || sc->row_numel() != 1)
        return fmt::format("{}: scale '{}' is not one value per edge", s.name, s.scale);
    }
    const inter::Per x_per = s.x_gather == Gather::Dst ? inter::Per::Node : pairs ? inter::Per::Edge : inter::Per::Pair;
    if (x->per != x_per || y->per != (pairs ? inter::Per::Pair : inter::Per::Node))
      return fmt::format("{}: {} sums {} rows into {} rows, not {} into {}", s.name, to_string(s.csr), pairs ? "edge" : "pair",
                         pairs ? "pair" : "node", inter::to_string(x->per), inter::to_string(y->per));
    return {};
  }

  std::string check(const SegmentSumInstance& s) const {
    std::string err;
    const TensorInfo *v = operand(s.name, s.v, false, err), *dw = v ? operand(s.name, s.dw, true, err) : nullptr;
    if (!dw) return err;
    if (v->row_numel() != s.numel || dw->row_numel() != s.numel)
      return fmt::format("{}: rows of {} and slices of {} have {} and {} elements, expected {}", s.name, s.v, s.dw, v->row_numel(),
                         dw->row_numel(), s.numel);
    if (s.rows == Rows::Etypes) return fmt::format("{}: a segment sum runs over node, edge or pair rows", s.name);
    if (std::string e = rows(s.name, *v, s.rows, Gather::None, "input"); !e.empty()) return e;
    return segments(s.name, s.rows, s.segments, *dw);
  }

  std::string check(const TorchInstance& t) const {
    std::string err;
    if (!operand(t.name, t.target, true, err)) return err;
    for (const auto& [local, tensor] : t.materialized)
      if (!p_.find(tensor)) return fmt::format("{}: local {} -> unknown tensor '{}'", t.name, local, tensor);
    if (!t.loop || t.loop->kind != inter::StmtKind::For) return fmt::format("{}: not a loop nest", t.name);
    return {};
  }

  std::string check(const TraversalInstance& t) const { return verify_traversal(p_, t); }

  const Program& p_;
};

}  // namespace

std::string verify_program(const Program& p) { return ProgramVerifier(p).run(); }

}  // namespace hectorgen::intra
