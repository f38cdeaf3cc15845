// Emission of the torch-free CUDA kernels file: GEMM, weight-gradient and segment-sum instances from
// templates/cuda/*.cu.in, traversal instances from traversal.cpp, one launcher per kernel, and the header.
#include <fmt/format.h>

#include <functional>
#include <set>
#include <stdexcept>

#include "emit/emit.h"
#include "emit/names.h"
#include "emit/printer.h"
#include "emit/traversal.h"
#include "ir/inter/printer.h"
#include "ir/intra/launch.h"

namespace hectorgen::emit {

using namespace inter;
using intra::GemmInstance;
using intra::Program;
using intra::TensorInfo;

std::string capitalize(const std::string& s) {
  std::string r = s;
  if (!r.empty()) r[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(r[0])));
  return r;
}

std::string camel(const std::string& s) {
  std::string r;
  bool up = true;
  for (char c : s) {
    if (c == '_') { up = true; continue; }
    r += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  return r;
}

std::map<std::string, std::string> banner_vars(const Program& p, const EmitContext& ctx) {
  return {{"version", ctx.version}, {"spec", ctx.spec_name}, {"model", p.model}};
}

std::string args_struct(const Program& p) { return capitalize(p.model) + camel(p.phase) + "Args"; }

std::vector<std::string> graph_arrays(const Program& p) {
  std::vector<std::string> v;
  auto has = [&](const char* l) { return p.layouts.count(l) > 0; };
  if (has(intra::layout::kSortedCoo)) {
    v.insert(v.end(), {"src", "dst", "etype", "etype_ptr", "etype_tile_ptr"});
  }
  if (has(intra::layout::kCsrByDst)) v.insert(v.end(), {"in_ptr", "in_eid", "in_src"});
  if (has(intra::layout::kCsrBySrc)) v.insert(v.end(), {"out_ptr", "out_eid", "out_dst"});
  if (has(intra::layout::kNtypePtr)) {
    v.insert(v.end(), {"ntype", "ntype_ptr", "ntype_tile_ptr"});
  }
  return v;
}

namespace {


bool is_const_tensor(const TensorInfo& t) { return t.role == intra::Role::Input || t.role == intra::Role::Weight; }

// ------------------------------------------------------------------------------------------------
// GEMM instances
// ------------------------------------------------------------------------------------------------
struct GemmCode {
  std::string kernel, launcher;
};

// dim3 grid(...) of a launcher, from the kernel's launch configuration.
std::string grid_expr(const intra::LaunchConfig& c, const std::string& rows, const std::string& segments) {
  std::string e = c.x.expr(rows, segments);
  auto one = [](const intra::GridExtent& d) { return d.is_constant() && d.fixed == 1; };
  if (!one(c.y) || !one(c.z)) e += ", " + c.y.expr(rows, segments) + ", " + c.z.expr(rows, segments);
  return e;
}

GemmCode emit_tc_gemm(const Program& p, const GemmInstance& g, const std::string& formula);

GemmCode emit_gemm(const Program& p, const intra::Kernel& k) {
  const GemmInstance& g = std::get<GemmInstance>(k);
  const intra::LaunchConfig launch = intra::launch_config(p, k);
  Vars v;
  v["name"] = g.name;
  std::string xrow = g.gather == intra::Gather::None ? "row"
                     : g.gather == intra::Gather::Src ? "static_cast<int64_t>(src[row])"
                                                      : "static_cast<int64_t>(dst[row])";
  std::string seg = g.segments == intra::Segments::Etype ? "etype" : g.segments == intra::Segments::Ntype ? "ntype" : "";
  const char* scat = g.scatter == intra::Gather::Src ? "src[row]" : g.scatter == intra::Gather::Dst ? "dst[row]" : "row";
  std::string formula = fmt::format("{}[{}] {}= {}[{}] * {}[{}]{}{}", g.y, scat,
                                    g.scatter != intra::Gather::None || g.accumulate ? "+" : "", g.x,
                                    g.gather == intra::Gather::None ? "row" : g.gather == intra::Gather::Src ? "src[row]" : "dst[row]",
                                    g.w, seg.empty() ? "-" : seg, g.transpose_w ? "^T" : "",
                                    g.row_scalar.empty() ? "" : " * " + g.row_scalar + "[row]");
  if (g.tensor_cores) return emit_tc_gemm(p, g, formula);
  v["formula"] = formula;
  v["source"] = g.source;
  v["threads"] = std::to_string(launch.threads);
  v["min_blocks"] = launch.min_blocks_per_sm ? fmt::format(", {}", launch.min_blocks_per_sm) : "";
  if (!launch.fold_yz) {
    v["block_coords"] = "const int head = blockIdx.z;\nconst int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTile;";
  } else {
    v["block_coords"] = fmt::format(
        "// kColTiles x kHeads blocks exceed 65535, the limit of grid y and z: they are numbered over both.\n"
        "constexpr int64_t kColTiles = {0};\n"
        "const int64_t block_yz = blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z;\n"
        "if (block_yz >= kColTiles * kHeads) return;  // the grid rounds up\n"
        "const int head = static_cast<int>(block_yz / kColTiles);\n"
        "const int64_t col0 = block_yz % kColTiles * kTile;",
        (g.n + g.tile - 1) / g.tile);
  }
  v["tile"] = std::to_string(g.tile);
  v["coarsen"] = std::to_string(g.coarsen);
  v["k"] = std::to_string(g.k);
  v["n"] = std::to_string(g.n);
  v["heads"] = std::to_string(g.heads);
  std::string params;
  std::vector<std::string> args;
  if (g.gather == intra::Gather::Src || g.scatter == intra::Gather::Src) { params += "\n    const int32_t* __restrict__ src,"; args.push_back("a.src"); }
  if (g.gather == intra::Gather::Dst || g.scatter == intra::Gather::Dst) { params += "\n    const int32_t* __restrict__ dst,"; args.push_back("a.dst"); }
  if (!g.row_scalar.empty()) { params += "\n    const float* __restrict__ row_scalar,"; args.push_back("a." + g.row_scalar); }
  if (!seg.empty()) {
    params += fmt::format("\n    const int32_t* __restrict__ seg_ptr, const int32_t* __restrict__ tile_ptr,");
    args.push_back(fmt::format("a.{}_ptr", seg));
    args.push_back(fmt::format("a.{}_tile_ptr", seg));
  }
  v["extra_params"] = params;
  if (seg.empty()) {
    v["tile_range"] =
        "const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * kTile;\n"
        "const int64_t row_end = row_begin + kTile < num_rows ? row_begin + kTile : num_rows;\n"
        "(void)num_segments;";
  } else {
    v["tile_range"] = fmt::format(
        "// Row tiles of all {0} segments are numbered consecutively: find this block's segment.\n"
        "const int tile = blockIdx.x;\n"
        "if (tile >= tile_ptr[num_segments]) return;  // the grid over-approximates the tile count\n"
        "int type = 0;\n"
        "for (int lo = 0, hi = num_segments - 1; lo < hi;) {{  // the last segment whose first tile <= tile\n"
        "  const int mid = (lo + hi + 1) / 2;\n"
        "  if (tile_ptr[mid] <= tile) lo = mid; else hi = mid - 1;\n"
        "  type = lo;\n"
        "}}\n"
        "const int64_t row_begin = seg_ptr[type] + static_cast<int64_t>(tile - tile_ptr[type]) * kTile;\n"
        "const int64_t row_end = row_begin + kTile < seg_ptr[type + 1] ? row_begin + kTile : seg_ptr[type + 1];\n"
        "(void)num_rows;",
        seg);
  }
  bool per_head_w = p.find(g.w)->shape.size() == 3;
  std::string type_stride = fmt::format("{}", g.k * g.n * (per_head_w ? g.heads : 1));
  v["w_offset"] = fmt::format("static_cast<int64_t>(type) * {}{}", type_stride,
                              per_head_w ? fmt::format(" + static_cast<int64_t>(head) * {}", g.k * g.n) : "");
  if (seg.empty() && !per_head_w) v["w_offset"] = "0";
  if (seg.empty() && per_head_w) v["w_offset"] = fmt::format("static_cast<int64_t>(head) * {}", g.k * g.n);
  std::string value = g.row_scalar.empty() ? "acc[c]" : "acc[c] * row_scalar[row]";
  // Element types of x, w and y (their storage types); the arithmetic is fp32, other types convert at the
  // loads and the store.
  const std::string xt = intra::cuda_type(p.find(g.x)->storage), wt = intra::cuda_type(p.find(g.w)->storage),
                    yt = intra::cuda_type(p.find(g.y)->storage);
  // (the conversion intrinsics, not casts: PyTorch's extension flags define __CUDA_NO_BFLOAT16_CONVERSIONS__)
  auto load = [](const std::string& type, const std::string& e) {
    return type == "float" ? e : fmt::format("{}({})", type == "__half" ? "__half2float" : "__bfloat162float", e);
  };
  auto store = [](const std::string& type, const std::string& e) {
    return type == "float" ? e : fmt::format("{}({})", type == "__half" ? "__float2half" : "__float2bfloat16", e);
  };
  v["x_type"] = xt;
  v["w_type"] = wt;
  v["y_type"] = yt;
  v["x_load"] = load(xt, fmt::format("x[{} * (kHeads * kK) + head * kK + k]", xrow));
  v["w_load"] = load(wt, fmt::format("w_slice[{}]", g.transpose_w ? "wn * kK + wk" : "wk * kN + wn"));
  const std::string y_elem = "y[row * (kHeads * kN) + head * kN + col]";
  if (g.accumulate && yt != "float") {
    v["store"] = fmt::format("{} = {};", y_elem, store(yt, load(yt, y_elem) + " + " + value));
  } else if (g.scatter != intra::Gather::None) {
    v["store"] = fmt::format("atomicAdd(&y[static_cast<int64_t>({}[row]) * (kHeads * kN) + head * kN + col], {});",
                             g.scatter == intra::Gather::Src ? "src" : "dst", store(yt, value));
  } else if (yt != "float") {
    v["store"] = fmt::format("{} = {};", y_elem, store(yt, value));
  } else {
    v["store"] = fmt::format("{} {}= {};", y_elem, g.accumulate ? "+" : "", value);
  }
  GemmCode code;
  code.kernel = render_template("cuda/gemm.cu.in", v);
  std::string rows = g.etype_rows ? "a.num_etypes" : g.edge_rows ? "a.num_edges" : "a.num_nodes";
  std::string segs = seg == "etype" ? "a.num_etypes" : seg == "ntype" ? "a.num_ntypes" : "1";
  std::string arglist = fmt::format("a.{}, a.{}, a.{}", g.x, g.w, g.y);
  for (const auto& a : args) arglist += ", " + a;
  code.launcher = fmt::format(
      "  if ({rows} > 0) {{  // {name}\n"
      "    const dim3 grid({grid});\n"
      "    {name}<<<grid, {threads}, 0, stream>>>({args}, {rows}, {segs});\n"
      "    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;\n"
      "  }}\n",
      fmt::arg("rows", rows), fmt::arg("name", g.name), fmt::arg("grid", grid_expr(launch, rows, segs)),
      fmt::arg("threads", launch.threads), fmt::arg("args", arglist), fmt::arg("segs", segs));
  return code;
}

// The segment array and count of an instance's rows, as launcher expressions (nullptr and 1: one segment).
std::pair<std::string, std::string> segment_args(intra::Segments s) {
  if (s == intra::Segments::Etype) return {"a.etype_ptr", "a.num_etypes"};
  if (s == intra::Segments::Ntype) return {"a.ntype_ptr", "a.num_ntypes"};
  return {"nullptr", "1"};
}

const Workspace& instance_workspace(const Program& p, const std::string& kernel, const std::string& use,
                                    const std::vector<Workspace>& all) {
  for (const Workspace& w : all)
    if (w.kernel == kernel && w.use == use) return w;
  throw std::logic_error(fmt::format("emit: no '{}' workspace for {} in {}", use, kernel, p.phase));
}

// A tensor-core instance: no kernel of its own (hectorgen/tc_gemm.cuh has it), a launcher that numbers the
// kernel's 64-row tiles per segment on the GPU (into a workspace: no host sync), transposes W first for
// Y = X W^T, and calls hectorgen::tc::launch_segment_gemm with the instance's lists and epilogue.
GemmCode emit_tc_gemm(const Program& p, const GemmInstance& g, const std::string& formula) {
  const std::vector<Workspace> all = workspaces(p);
  const std::string t = intra::cuda_type(p.find(g.x)->storage);
  const std::string out_t = intra::cuda_type(p.find(g.y)->storage);  // T, or fp32 (always for an atomic scatter)
  const char* epilogue = g.scatter != intra::Gather::None ? "kAtomic" : g.accumulate ? "kAccumulate" : "kStore";
  const std::string rows = g.edge_rows ? "a.num_edges" : "a.num_nodes";
  const auto [seg_ptr, segs] = segment_args(g.segments);
  const std::string tile_ptr = "a." + instance_workspace(p, g.name, "tile_ptr", all).name;
  auto list = [](intra::Gather l) { return l == intra::Gather::Src ? "a.src" : l == intra::Gather::Dst ? "a.dst" : "nullptr"; };
  CodeWriter w;
  CodeWriter::Indent launcher(w);  // the launcher function's body
  w.line(fmt::format("if ({} > 0) {{  // {}", rows, formula));
  {
    CodeWriter::Indent in(w);
    w.line(fmt::format("// Tensor cores ({}, hectorgen/tc_gemm.cuh). The first 64-row tile of each segment, numbered on",
                       inter::to_string(g.dtype)));
    w.line("// the GPU in this stream (no host sync):");
    w.line(fmt::format("cudaError_t err = hectorgen::launch_segment_tile_ptr({}, {}, {}, hectorgen::tc::kForwardTileRows,",
                       seg_ptr, segs, rows));
    w.line(fmt::format("                                                     {}, stream);", tile_ptr));
    w.line("if (err != cudaSuccess) return err;");
    std::string weights = "a." + g.w;
    if (g.transpose_w) {
      weights = "a." + instance_workspace(p, g.name, "w_t", all).name;
      w.line(fmt::format("// Y = X {0}^T: {0} is stored [n][k] = [{1}][{2}] per segment; the kernel reads {0}^T, [k][n].", g.w,
                         g.n, g.k));
      w.line(fmt::format("err = hectorgen::tc::launch_transpose_segments<{}>(a.{}, {}, {}, {}, {}, stream);", t, g.w,
                         weights, segs, g.n, g.k));
      w.line("if (err != cudaSuccess) return err;");
    }
    w.line(fmt::format("hectorgen::tc::SegmentGemmArgs<{}, {}> gemm{{}};", t, out_t));
    w.line(fmt::format("gemm.x = a.{};", g.x));
    w.line(fmt::format("gemm.w = {};", weights));
    w.line(fmt::format("gemm.y = a.{};", g.y));
    w.line(fmt::format("gemm.gather = {};", list(g.gather)));
    w.line(fmt::format("gemm.scatter = {};", list(g.scatter)));
    w.line(fmt::format("gemm.scale = {};", g.row_scalar.empty() ? "nullptr" : "a." + g.row_scalar));
    w.line(fmt::format("gemm.seg_ptr = {};", seg_ptr));
    w.line(fmt::format("gemm.tile_ptr = {};", tile_ptr));
    w.line(fmt::format("gemm.num_rows = {};", rows));
    w.line(fmt::format("gemm.num_segments = {};", segs));
    // the output type is named when it is not the epilogue's default (T; fp32 for atomics): a 16-bit GEMM into fp32
    const bool default_out = out_t == (g.scatter != intra::Gather::None ? std::string("float") : t);
    w.line(fmt::format("hectorgen::tc::launch_segment_gemm<{}, {}, {}, hectorgen::tc::Epilogue::{}{}>(gemm, stream);", t, g.k,
                       g.n, epilogue, default_out ? "" : ", " + out_t));
    w.line("err = cudaGetLastError();");
    w.line("if (err != cudaSuccess) return err;");
  }
  w.line("}");
  GemmCode code;
  code.launcher = w.str();
  return code;
}

}  // namespace

static std::string launcher_function(const Program& p, const std::string& kernel, const std::string& body) {
  return fmt::format("cudaError_t launch_{}(const {}& a, cudaStream_t stream) {{\n{}  return cudaSuccess;\n}}\n",
                     kernel, args_struct(p), body);
}

// Rows [row_begin, row_end) of this block's segment (`type`), or all rows.
std::string segment_rows(const std::string& seg) {
  if (seg.empty()) return "const int64_t row_begin = 0, row_end = num_rows;";
  return "const int64_t row_begin = seg_ptr[type], row_end = seg_ptr[type + 1];\n(void)num_rows;";
}

std::string gather_row(intra::Gather g) {
  return g == intra::Gather::None ? "row" : g == intra::Gather::Src ? "static_cast<int64_t>(src[row])" : "static_cast<int64_t>(dst[row])";
}

GemmCode emit_wgrad(const Program& p, const intra::Kernel& k) {
  const intra::WeightGradInstance& w = std::get<intra::WeightGradInstance>(k);
  const intra::LaunchConfig launch = intra::launch_config(p, k);
  Vars v;
  std::string seg = w.segments == intra::Segments::Etype ? "etype" : w.segments == intra::Segments::Ntype ? "ntype" : "";
  v["name"] = w.name;
  v["source"] = w.source;
  v["formula"] = fmt::format("{}[{}] += sum_row {}[{}]^T * {}[{}]{}", w.dw, seg.empty() ? "-" : seg, w.x, gather_row(w.x_gather),
                             w.dy, gather_row(w.dy_gather), w.row_scalar.empty() ? "" : " * " + w.row_scalar + "[row]");
  v["tile"] = std::to_string(w.tile);
  v["coarsen"] = std::to_string(w.coarsen);
  v["threads"] = std::to_string(launch.threads);
  v["k_tiles"] = std::to_string((w.k + w.tile - 1) / w.tile);
  v["n_tiles"] = std::to_string((w.n + w.tile - 1) / w.tile);
  v["k"] = std::to_string(w.k);
  v["n"] = std::to_string(w.n);
  v["heads"] = std::to_string(w.heads);
  std::string params;
  std::vector<std::string> args;
  bool src = w.x_gather == intra::Gather::Src || w.dy_gather == intra::Gather::Src;
  bool dst = w.x_gather == intra::Gather::Dst || w.dy_gather == intra::Gather::Dst;
  if (src) { params += "\n    const int32_t* __restrict__ src,"; args.push_back("a.src"); }
  if (dst) { params += "\n    const int32_t* __restrict__ dst,"; args.push_back("a.dst"); }
  if (!w.row_scalar.empty()) { params += "\n    const float* __restrict__ row_scalar,"; args.push_back("a." + w.row_scalar); }
  if (!seg.empty()) { params += "\n    const int32_t* __restrict__ seg_ptr,"; args.push_back(fmt::format("a.{}_ptr", seg)); }
  v["extra_params"] = params;
  v["row_range"] = segment_rows(seg);
  v["x_row"] = gather_row(w.x_gather);
  v["dy_row"] = gather_row(w.dy_gather);
  v["scale"] = w.row_scalar.empty() ? "" : " * row_scalar[row]";
  GemmCode c;
  c.kernel = render_template("cuda/wgrad.cu.in", v);
  std::string segs = seg == "etype" ? "a.num_etypes" : seg == "ntype" ? "a.num_ntypes" : "1";
  std::string arglist = fmt::format("a.{}, a.{}, a.{}", w.x, w.dy, w.dw);
  for (const auto& a : args) arglist += ", " + a;
  std::string rows = w.etype_rows ? "a.num_etypes" : w.edge_rows ? "a.num_edges" : "a.num_nodes";
  c.launcher = fmt::format(
      "  {{  // {name}\n"
      "    const dim3 grid({grid});\n"
      "    {name}<<<grid, {threads}, 0, stream>>>({args}, {rows}, {segs});\n"
      "    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;\n"
      "  }}\n",
      fmt::arg("name", w.name), fmt::arg("grid", grid_expr(launch, rows, segs)), fmt::arg("threads", launch.threads),
      fmt::arg("args", arglist), fmt::arg("rows", rows), fmt::arg("segs", segs));
  return c;
}

GemmCode emit_segsum(const Program& p, const intra::Kernel& k) {
  const intra::SegmentSumInstance& ss = std::get<intra::SegmentSumInstance>(k);
  const intra::LaunchConfig launch = intra::launch_config(p, k);
  Vars v;
  std::string seg = ss.segments == intra::Segments::Etype ? "etype" : ss.segments == intra::Segments::Ntype ? "ntype" : "";
  v["name"] = ss.name;
  v["source"] = ss.source;
  v["formula"] = fmt::format("{}[{}] += sum_row {}[row]", ss.dw, seg.empty() ? "-" : seg, ss.v);
  v["numel"] = std::to_string(ss.numel);
  v["extra_params"] = seg.empty() ? "" : "\n    const int32_t* __restrict__ seg_ptr,";
  v["row_range"] = segment_rows(seg);
  GemmCode c;
  c.kernel = render_template("cuda/segsum.cu.in", v);
  std::string segs = seg == "etype" ? "a.num_etypes" : seg == "ntype" ? "a.num_ntypes" : "1";
  std::string rows = ss.edge_rows ? "a.num_edges" : "a.num_nodes";
  c.launcher = fmt::format(
      "  {{  // {name}\n"
      "    const dim3 grid({grid});\n"
      "    {name}<<<grid, {threads}, 0, stream>>>(a.{v}, a.{dw}{seg_arg}, {rows}, {segs});\n"
      "    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;\n"
      "  }}\n",
      fmt::arg("name", ss.name), fmt::arg("grid", grid_expr(launch, rows, segs)), fmt::arg("threads", launch.threads),
      fmt::arg("v", ss.v), fmt::arg("dw", ss.dw), fmt::arg("seg_arg", seg.empty() ? "" : fmt::format(", a.{}_ptr", seg)),
      fmt::arg("rows", rows), fmt::arg("segs", segs));
  return c;
}

// The workspaces of one instance: a tensor-core GEMM numbers its 64-row tiles per call (tile_ptr, one entry
// per segment and one more), and transposes W first when it computes X W^T (w_t, W's size and storage type).
static std::vector<Workspace> kernel_workspaces(const Program& p, const intra::Kernel& k, NameScope& scope) {
  std::vector<Workspace> out;
  if (auto* g = std::get_if<GemmInstance>(&k); g && g->tensor_cores) {
    const char* segs = g->segments == intra::Segments::Etype   ? "num_etypes"
                       : g->segments == intra::Segments::Ntype ? "num_ntypes"
                                                               : nullptr;
    out.push_back({scope.fresh(g->name + "_tile_ptr"), "int32_t", segs ? fmt::format("{} + 1", segs) : "2",
                   "first 64-row tile of each segment (tensor-core kernel)", g->name, "tile_ptr"});
    if (g->transpose_w)
      out.push_back({scope.fresh(g->name + "_w_t"), intra::cuda_type(p.find(g->w)->storage),
                     segs ? fmt::format("{} * {}", segs, g->k * g->n) : std::to_string(g->k * g->n),
                     fmt::format("{}^T, [{}][{}] per segment", g->w, g->k, g->n), g->name, "w_t"});
  }
  return out;
}

std::vector<Workspace> workspaces(const Program& p) {
  NameScope scope(cpp_reserved());
  for (const TensorInfo& t : p.tensors) scope.take(t.name);
  for (const std::string& g : graph_arrays(p)) scope.take(g);
  for (const auto& k : p.kernels) scope.take(intra::kernel_name(k));
  std::vector<Workspace> all;
  for (const auto& k : p.kernels)
    for (Workspace& w : kernel_workspaces(p, k, scope)) all.push_back(std::move(w));
  return all;
}

static bool has_torch_fallback(const Program& p) {
  for (const auto& k : p.kernels)
    if (std::holds_alternative<intra::TorchInstance>(k)) return true;
  return false;
}

struct KernelsCode {
  std::string kernels, launchers;
  std::set<std::string> helpers;
  int gemms = 0, travs = 0;
};

// A kernel's code without comments and with its own name replaced: identical instances (often the forward
// and the training forward) are emitted once.
static std::string kernel_identity(const std::string& code, const std::string& name) {
  std::string out;
  size_t start = 0;
  while (start < code.size()) {
    size_t end = code.find('\n', start);
    if (end == std::string::npos) end = code.size();
    std::string line = code.substr(start, end - start);
    size_t first = line.find_first_not_of(' ');
    if (first != std::string::npos && line.compare(first, 2, "//") != 0) out += line + "\n";
    start = end + 1;
  }
  for (size_t at = out.find(name); at != std::string::npos; at = out.find(name, at)) out.replace(at, name.size(), "$KERNEL$");
  return out;
}

static KernelsCode phase_kernels(const Program& p, std::map<std::string, std::string>& emitted) {
  std::string kernels, launchers, forward;
  std::set<std::string> helpers;
  int gemms = 0, travs = 0;
  for (const auto& k : p.kernels) {
    std::string body;
    const size_t kernel_mark = kernels.size();
    if (std::holds_alternative<GemmInstance>(k)) {
      GemmCode c = emit_gemm(p, k);
      if (!c.kernel.empty()) kernels += "\n" + c.kernel;
      body = c.launcher;
      ++gemms;
    } else if (std::holds_alternative<intra::WeightGradInstance>(k)) {
      GemmCode c = emit_wgrad(p, k);
      kernels += "\n" + c.kernel;
      body = c.launcher;
      ++gemms;
    } else if (std::holds_alternative<intra::SegmentSumInstance>(k)) {
      GemmCode c = emit_segsum(p, k);
      kernels += "\n" + c.kernel;
      body = c.launcher;
    } else if (auto* t = std::get_if<intra::TraversalInstance>(&k)) {
      TraversalCode r = emit_traversal(p, *t);
      kernels += "\n" + r.kernel;
      body = r.launcher;
      helpers.insert(r.helpers.begin(), r.helpers.end());
      ++travs;
    } else {
      continue;  // a PyTorch instance runs in the host code
    }
    const std::string& name = intra::kernel_name(k);
    // Reuse an identical kernel emitted earlier (the launcher calls it instead).
    std::string kernel_code = kernels.substr(kernel_mark);
    std::string identity = kernel_identity(kernel_code, name);
    if (kernel_code.find_first_not_of('\n') == std::string::npos) {
      // a runtime kernel (tensor cores): nothing emitted to share
    } else if (auto it = emitted.find(identity); it != emitted.end()) {
      kernels.resize(kernel_mark);
      for (size_t at = body.find(name + "<<<"); at != std::string::npos; at = body.find(name + "<<<", at))
        body.replace(at, name.size(), it->second);
      body = fmt::format("  // same kernel as {}\n", it->second) + body;
    } else {
      emitted.emplace(identity, name);
    }
    launchers += "\n" + launcher_function(p, name, body);
    forward += fmt::format("  if (cudaError_t err = launch_{}(a, stream); err != cudaSuccess) return err;\n", name);
  }
  if (!has_torch_fallback(p))
    launchers += fmt::format("\ncudaError_t {}_{}(const {}& a, cudaStream_t stream) {{\n{}  return cudaSuccess;\n}}\n",
                             p.model, p.phase, args_struct(p), forward);
  return KernelsCode{kernels, launchers, helpers, gemms, travs};
}

std::string emit_kernels_cu(const std::vector<Program>& ir_phases, const EmitContext& ctx) {
  const std::vector<Program> phases = with_cpp_names(ir_phases);
  const Program& p = phases.front();
  KernelsCode all;
  std::string phase_names;
  std::map<std::string, std::string> emitted;  // kernel identity -> name of its first instance
  for (const Program& ph : phases) {
    KernelsCode c = phase_kernels(ph, emitted);
    all.kernels += fmt::format("\n// ==== {} ====\n", ph.phase) + c.kernels;
    all.launchers += c.launchers;
    all.helpers.insert(c.helpers.begin(), c.helpers.end());
    all.gemms += c.gemms;
    all.travs += c.travs;
    phase_names += (phase_names.empty() ? "" : ", ") + ph.phase;
  }
  Vars v = banner_vars(p, ctx);
  v["phases"] = phase_names;
  v["num_gemm"] = std::to_string(all.gemms);
  v["num_traversal"] = std::to_string(all.travs);
  bool tensor_cores = false;
  for (const Program& ph : phases)
    for (const auto& k : ph.kernels)
      if (auto* g = std::get_if<GemmInstance>(&k); g && g->tensor_cores) tensor_cores = true;
  v["runtime_includes"] = tensor_cores ? "\n\n#include \"hectorgen/tc_gemm.cuh\"" : "";
  v["helpers"] = device_helpers(all.helpers);
  v["kernels"] = all.kernels;
  v["launchers"] = all.launchers.substr(1);
  return render_template("cuda/kernels.cu.in", v);
}

std::string emit_kernels_h(const std::vector<Program>& ir_phases, const EmitContext& ctx) {
  const std::vector<Program> phases = with_cpp_names(ir_phases);
  const Program& p = phases.front();
  Vars v = banner_vars(p, ctx);
  v["Model"] = capitalize(p.model);
  std::string structs;
  for (const Program& ph : phases) {
    CodeWriter w;
    w.line(fmt::format("// Everything the {} pass reads and writes. Graph arrays come from the runtime's preprocessing.", ph.phase));
    w.line(fmt::format("struct {} {{", args_struct(ph)));
    {
      CodeWriter::Indent i(w);
      w.line("int64_t num_nodes = 0;");
      w.line("int64_t num_edges = 0;");
      w.line("int num_etypes = 0;");
      w.line("int num_ntypes = 1;");
      for (const std::string& g : graph_arrays(ph)) w.line(fmt::format("const int32_t* {} = nullptr;", g));
      for (const TensorInfo& t : ph.tensors) {
        std::string rows = t.per == Per::Node ? "num_nodes" : t.per == Per::Edge ? "num_edges" : t.per == Per::Etype ? "num_etypes"
                           : t.per == Per::Ntype ? "num_ntypes" : "";
        std::string dims = rows;
        for (int64_t d : t.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
        w.line(fmt::format("{}float* {} = nullptr;  // [{}]", is_const_tensor(t) ? "const " : "", t.name, dims));
      }
      for (const Workspace& ws : workspaces(ph))
        w.line(fmt::format("{}* {} = nullptr;  // workspace [{}]: {}", ws.ctype, ws.name, ws.numel, ws.comment));
    }
    w.line("};");
    w.line();
    w.line("// One launcher per kernel instance, in execution order; each returns the launch error, if any.");
    for (const auto& k : ph.kernels)
      if (!std::holds_alternative<intra::TorchInstance>(k))
        w.line(fmt::format("cudaError_t launch_{}(const {}& args, cudaStream_t stream);", intra::kernel_name(k), args_struct(ph)));
    if (has_torch_fallback(ph)) {
      w.line(fmt::format("// Parts of the {} pass run as PyTorch calls ({}_host.cpp): there is no torch-free {}_{}().", ph.phase,
                         ph.model, ph.model, ph.phase));
    } else {
      w.line(fmt::format("// Runs the whole {} pass on `stream`, in order. Returns the first launch error.", ph.phase));
      w.line(fmt::format("cudaError_t {}_{}(const {}& args, cudaStream_t stream);", ph.model, ph.phase, args_struct(ph)));
    }
    structs += w.str() + "\n";
  }
  v["structs"] = structs.substr(0, structs.size() - 2);
  int tile = 16;
  for (const auto& k : p.kernels)
    if (auto* g = std::get_if<GemmInstance>(&k)) tile = g->tile;
  v["tile"] = std::to_string(tile);
  return render_template("cuda/kernels.h.in", v);
}

}  // namespace hectorgen::emit
