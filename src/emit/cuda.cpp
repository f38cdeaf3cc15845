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

// Row count and segment count expressions of an instance's rows, over the Args struct `a` (prefix "a.") or the
// host function's parameters (prefix "").
std::string rows_expr(intra::Rows r, const std::string& prefix) {
  switch (r) {
    case intra::Rows::Nodes: return prefix + "num_nodes";
    case intra::Rows::Edges: return prefix + "num_edges";
    case intra::Rows::Etypes: return prefix + "num_etypes";
    case intra::Rows::Pairs: return prefix + "num_pairs";
  }
  return "";
}
std::string segments_expr(intra::Segments s, const std::string& prefix) {
  return s == intra::Segments::Etype ? prefix + "num_etypes" : s == intra::Segments::Ntype ? prefix + "num_ntypes" : "1";
}
// The graph array of an instance's segments (edge-type segments of pair rows: the pairs of each relation).
std::string segment_ptr_expr(intra::Rows r, intra::Segments s, const std::string& prefix) {
  if (s == intra::Segments::Etype) return prefix + (r == intra::Rows::Pairs ? "pair_etype_ptr" : "etype_ptr");
  if (s == intra::Segments::Ntype) return prefix + "ntype_ptr";
  return "nullptr";
}
// The graph array of the row-tile offsets of an instance's segments (built for the module's GEMM_TILE).
std::string tile_ptr_expr(intra::Rows r, intra::Segments s, const std::string& prefix) {
  if (s == intra::Segments::Etype) return prefix + (r == intra::Rows::Pairs ? "pair_tile_ptr" : "etype_tile_ptr");
  if (s == intra::Segments::Ntype) return prefix + "ntype_tile_ptr";
  return "nullptr";
}
// The graph array a gather (or scatter) reads: the edge's (the pair's) source, or the edge's destination.
std::string gather_expr(intra::Rows r, intra::Gather g, const std::string& prefix) {
  if (g == intra::Gather::Src) return prefix + (r == intra::Rows::Pairs ? "pair_src" : "src");
  if (g == intra::Gather::Dst) return prefix + "dst";
  return "nullptr";
}

std::vector<std::string> graph_arrays(const Program& p) {
  std::vector<std::string> v;
  auto has = [&](const char* l) { return p.layouts.count(l) > 0; };
  if (has(intra::layout::kSortedCoo)) {
    v.insert(v.end(), {"src", "dst", "etype", "etype_ptr", "etype_tile_ptr"});
  }
  if (has(intra::layout::kCsrByDst)) v.insert(v.end(), {"in_ptr", "in_eid", "in_src", "in_etype"});
  if (has(intra::layout::kCsrByDstPairs)) v.push_back("in_pair");  // each incoming-edge position's pair
  if (has(intra::layout::kCsrBySrc)) v.insert(v.end(), {"out_ptr", "out_eid", "out_dst", "out_etype"});
  if (has(intra::layout::kNtypePtr)) {
    v.insert(v.end(), {"ntype", "ntype_ptr", "ntype_tile_ptr"});
  }
  if (has(intra::layout::kCompactSrc)) {
    // The unique (source, edge type) pairs: each pair's source, the pairs (and their row tiles) of each relation,
    // each edge's pair, and the pair -> edges and node -> pairs CSRs of the gather sums.
    v.insert(v.end(), {"pair_src", "pair_etype_ptr", "pair_tile_ptr", "edge_pair", "pair_edge_ptr", "pair_edge_eid",
                       "node_pair_ptr", "node_pair"});
  }
  return v;
}

std::string load_elem(const TensorInfo& t, const std::string& elem) {
  return t.storage == DType::BF16 || t.storage == DType::FP16 ? "to_float(" + elem + ")" : elem;
}

std::string store_elem(const TensorInfo& t, const std::string& lhs, const std::string& value, bool add) {
  if (t.storage != DType::BF16 && t.storage != DType::FP16) return fmt::format("{} {}= {};", lhs, add ? "+" : "", value);
  const char* type = intra::cuda_type(t.storage);
  if (add) return fmt::format("{0} = from_float<{1}>(to_float({0}) + {2});", lhs, type, value);
  return fmt::format("{} = from_float<{}>({});", lhs, type, value);
}

std::string storage_helpers(const std::set<DType>& types) {
  std::string out;
  const bool bf16 = types.count(DType::BF16) > 0, fp16 = types.count(DType::FP16) > 0;
  if (!bf16 && !fp16) return out;
  out += "// Storage-type conversions: 16-bit elements become float at every load and are rounded (to nearest) at\n"
         "// every store; all arithmetic, reductions and accumulators are float.\n";
  if (bf16) out += "__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }\n";
  if (fp16) out += "__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }\n";
  out += "template <class T>\n__device__ __forceinline__ T from_float(float v);\n";
  if (bf16)
    out += "template <>\n__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }\n";
  if (fp16) out += "template <>\n__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }\n";
  return out;
}

namespace {

// The storage types of the tensors of every phase.
std::set<DType> storage_types(const std::vector<Program>& phases) {
  std::set<DType> out;
  for (const Program& p : phases)
    for (const TensorInfo& t : p.tensors) out.insert(t.storage);
  return out;
}

bool is_const_tensor(const TensorInfo& t) { return t.role == intra::Role::Input || t.role == intra::Role::Weight; }

// ------------------------------------------------------------------------------------------------
// GEMM instances
// ------------------------------------------------------------------------------------------------
struct GemmCode {
  std::string kernel, launcher;  // kernel: empty when the launcher calls the runtime's kernels
  std::set<std::string> includes;  // runtime headers the launcher needs ("hectorgen/segments.cuh")
  std::set<std::string> helpers;   // device helpers the kernel calls (device_helpers: "runs", ...)
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
  // rows: indexed: X is a table read through its map, composed with the gather by the host code (x_rows).
  const std::string x_list = intra::indexed_list(p, g.x, g.rows, g.gather);
  std::string xrow = !x_list.empty()                    ? "static_cast<int64_t>(x_rows[row])"
                     : g.gather == intra::Gather::None ? "row"
                     : g.gather == intra::Gather::Src  ? "static_cast<int64_t>(src[row])"
                                                       : "static_cast<int64_t>(dst[row])";
  std::string x_index = g.gather == intra::Gather::None ? "row" : g.gather == intra::Gather::Src ? "src[row]" : "dst[row]";
  if (!x_list.empty()) x_index = fmt::format("{}_rows[{}]", g.x, x_index);
  std::string seg = g.segments == intra::Segments::Etype ? "etype" : g.segments == intra::Segments::Ntype ? "ntype" : "";
  const char* scat = g.scatter == intra::Gather::Src ? "src[row]" : g.scatter == intra::Gather::Dst ? "dst[row]" : "row";
  std::string formula = fmt::format("{}[{}] {}= {}[{}] * {}[{}]{}{}", g.y, scat,
                                    g.scatter != intra::Gather::None || g.accumulate ? "+" : "", g.x,
                                    x_index, g.w, seg.empty() ? "-" : seg, g.transpose_w ? "^T" : "",
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
  const bool gathers = x_list.empty() && g.gather != intra::Gather::None;  // through src or dst itself
  if (!x_list.empty()) {
    params += "\n    const int32_t* __restrict__ x_rows,";
    args.push_back("a." + x_list);
  }
  if ((gathers && g.gather == intra::Gather::Src) || g.scatter == intra::Gather::Src) {
    params += "\n    const int32_t* __restrict__ src,";
    args.push_back(gather_expr(g.rows, intra::Gather::Src, "a."));
  }
  if ((gathers && g.gather == intra::Gather::Dst) || g.scatter == intra::Gather::Dst) {
    params += "\n    const int32_t* __restrict__ dst,";
    args.push_back(gather_expr(g.rows, intra::Gather::Dst, "a."));
  }
  if (!g.row_scalar.empty()) {
    params += fmt::format("\n    const {}* __restrict__ row_scalar,", intra::cuda_type(p.find(g.row_scalar)->storage));
    args.push_back("a." + g.row_scalar);
  }
  // rows=etypes with segments: row t is segment t, one block per row (launch_config), no segment arrays.
  const bool row_segments = g.rows == intra::Rows::Etypes && !seg.empty();
  if (!seg.empty() && !row_segments) {
    params += fmt::format("\n    const int32_t* __restrict__ seg_ptr, const int32_t* __restrict__ tile_ptr,");
    args.push_back(segment_ptr_expr(g.rows, g.segments, "a."));
    args.push_back(tile_ptr_expr(g.rows, g.segments, "a."));
  }
  v["extra_params"] = params;
  if (row_segments) {
    v["tile_range"] =
        "// Row t is edge type t, and its own segment: this block's row and weight.\n"
        "const int type = blockIdx.x;\n"
        "const int64_t row_begin = type, row_end = type + 1;\n"
        "(void)num_rows;\n"
        "(void)num_segments;";
  } else if (seg.empty()) {
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
  const TensorInfo &xt = *p.find(g.x), &wt = *p.find(g.w), &yt = *p.find(g.y);
  v["x_type"] = intra::cuda_type(xt.storage);
  v["w_type"] = intra::cuda_type(wt.storage);
  v["y_type"] = intra::cuda_type(yt.storage);
  v["x_load"] = load_elem(xt, fmt::format("x[{} * (kHeads * kK) + head * kK + k]", xrow));
  v["w_load"] = load_elem(wt, g.transpose_w ? "w_slice[wn * kK + wk]" : "w_slice[wk * kN + wn]");
  std::string value = g.row_scalar.empty() ? "acc[c]" : "acc[c] * " + load_elem(*p.find(g.row_scalar), "row_scalar[row]");
  if (g.scatter != intra::Gather::None)  // atomics: fp32 storage only (the verifier checks)
    v["store"] = fmt::format("atomicAdd(&y[static_cast<int64_t>({}[row]) * (kHeads * kN) + head * kN + col], {});",
                             g.scatter == intra::Gather::Src ? "src" : "dst", value);
  else
    v["store"] = store_elem(yt, "y[row * (kHeads * kN) + head * kN + col]", value, g.accumulate);
  GemmCode code;
  code.kernel = render_template("cuda/gemm.cu.in", v);
  std::string rows = rows_expr(g.rows, "a.");
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
std::pair<std::string, std::string> segment_args(intra::Rows r, intra::Segments s) {
  return {segment_ptr_expr(r, s, "a."), segments_expr(s, "a.")};
}

const Workspace& instance_workspace(const Program& p, const std::string& kernel, const std::string& use,
                                    const std::vector<Workspace>& all) {
  for (const Workspace& w : all)
    if (w.kernel == kernel && w.use == use) return w;
  throw std::logic_error(fmt::format("emit: no '{}' workspace for {} in {}", use, kernel, p.phase));
}

// The tensor-core launchers' last template argument for the model's dtype: fp32's operands are split into tf32
// heads and tails (three MMAs, fp32-class products); empty for the others, which take the default.
std::string fp32_math_arg(inter::DType dtype) {
  return dtype == inter::DType::FP32 ? "hectorgen::tc::Fp32Math::kSplitTf32" : "";
}

// A tensor-core instance: no kernel of its own (hectorgen/tc_gemm.cuh has it), a launcher that numbers the
// kernel's 64-row tiles per segment on the GPU (into a workspace: no host sync), transposes W first for
// Y = X W^T, and calls hectorgen::tc::launch_segment_gemm with the instance's lists and epilogue.
GemmCode emit_tc_gemm(const Program& p, const GemmInstance& g, const std::string& formula) {
  const std::vector<Workspace> all = workspaces(p);
  const std::string t = intra::cuda_type(p.find(g.x)->storage);
  const std::string out_t = intra::cuda_type(p.find(g.y)->storage);  // T, or fp32 (always for an atomic scatter)
  const bool widen = intra::gemm_widens_weights(p, g);  // fp32 x, 16-bit weights: widened as loaded
  const std::string w_t = intra::cuda_type(p.find(g.w)->storage);
  const char* epilogue = g.scatter != intra::Gather::None ? "kAtomic" : g.accumulate ? "kAccumulate" : "kStore";
  const std::string rows = rows_expr(g.rows, "a.");
  const auto [seg_ptr, segs] = segment_args(g.rows, g.segments);
  // The graph's tile offsets (graph_tiles), none for one segment (the kernel numbers its tiles from 0), else a
  // workspace the launcher fills.
  const bool one_segment = g.segments == intra::Segments::None;
  const std::string tile_ptr = g.graph_tiles ? tile_ptr_expr(g.rows, g.segments, "a.")
                               : one_segment ? "nullptr"
                                             : "a." + instance_workspace(p, g.name, "tile_ptr", all).name;
  auto list = [&](intra::Gather l) { return gather_expr(g.rows, l, "a."); };
  CodeWriter w;
  CodeWriter::Indent launcher(w);  // the launcher function's body
  w.line(fmt::format("if ({} > 0) {{  // {}", rows, formula));
  {
    CodeWriter::Indent in(w);
    const std::string dtype = g.dtype == inter::DType::FP32 ? "fp32 as 3xTF32" : widen ? "tf32" : inter::to_string(g.dtype);
    if (widen)
      w.line(fmt::format("// {} is fp32, {} {}: the weights are widened to fp32 as they are loaded, tf32 MMAs.", g.x, g.w,
                         inter::to_string(p.find(g.w)->storage)));
    if (g.graph_tiles) {
      w.line(fmt::format("// Tensor cores ({}, hectorgen/tc_gemm.cuh); the first 64-row tile of each segment: {}, the", dtype,
                         tile_ptr.substr(2)));
      w.line("// graph's (prepared with gemm_tile 64).");
      w.line("cudaError_t err = cudaSuccess;");
    } else if (one_segment) {
      w.line(fmt::format("// Tensor cores ({}, hectorgen/tc_gemm.cuh); one weight for every row: 64-row tiles numbered from 0.",
                         dtype));
      w.line("cudaError_t err = cudaSuccess;");
    } else {
      w.line(fmt::format("// Tensor cores ({}, hectorgen/tc_gemm.cuh). The first 64-row tile of each segment, numbered on",
                         dtype));
      w.line("// the GPU in this stream (no host sync):");
      w.line(fmt::format("cudaError_t err = hectorgen::launch_segment_tile_ptr({}, {}, {}, hectorgen::tc::kForwardTileRows,",
                         seg_ptr, segs, rows));
      w.line(fmt::format("                                                     {}, stream);", tile_ptr));
      w.line("if (err != cudaSuccess) return err;");
    }
    std::string weights = "a." + g.w;
    if (g.transpose_w) {
      weights = "a." + instance_workspace(p, g.name, "w_t", all).name;
      w.line(fmt::format("// Y = X {0}^T: {0} is stored [n][k] = [{1}][{2}] per segment; the kernel reads {0}^T, [k][n].", g.w,
                         g.n, g.k));
      w.line(fmt::format("err = hectorgen::tc::launch_transpose_segments<{}>(a.{}, {}, {}, {}, {}, stream);", w_t, g.w,
                         weights, segs, g.n, g.k));
      w.line("if (err != cudaSuccess) return err;");
    }
    w.line(fmt::format("hectorgen::tc::SegmentGemmArgs<{}, {}{}> gemm{{}};", t, out_t, widen ? ", " + w_t : ""));
    w.line(fmt::format("gemm.x = a.{};", g.x));
    w.line(fmt::format("gemm.w = {};", weights));
    w.line(fmt::format("gemm.y = a.{};", g.y));
    const std::string x_list = intra::indexed_list(p, g.x, g.rows, g.gather);
    w.line(x_list.empty() ? fmt::format("gemm.gather = {};", list(g.gather))
                          : fmt::format("gemm.gather = a.{};  // {}'s rows: its map composed with the gather", x_list, g.x));
    w.line(fmt::format("gemm.scatter = {};", list(g.scatter)));
    w.line(fmt::format("gemm.scale = {};", g.row_scalar.empty() ? "nullptr" : "a." + g.row_scalar));
    w.line(fmt::format("gemm.seg_ptr = {};", seg_ptr));
    w.line(fmt::format("gemm.tile_ptr = {};", tile_ptr));
    w.line(fmt::format("gemm.num_rows = {};", rows));
    w.line(fmt::format("gemm.num_segments = {};", segs));
    // the output type is named when it is not the epilogue's default (T; fp32 for atomics): a 16-bit GEMM into fp32;
    // and before the operands' math when that is not tf32's
    const bool default_out = out_t == (g.scatter != intra::Gather::None ? std::string("float") : t);
    const std::string math = fp32_math_arg(g.dtype);
    const std::string call = "hectorgen::tc::launch_segment_gemm<";
    const std::string head = fmt::format("{}{}, {}, {}, hectorgen::tc::Epilogue::{}", call, t, g.k, g.n, epilogue);
    if (math.empty()) {
      w.line(fmt::format("{}{}>(gemm, stream);", head, default_out ? "" : ", " + out_t));
    } else {  // the math on a line of its own, under the template's first argument
      w.line(fmt::format("{}, {},", head, out_t));
      w.line(fmt::format("{}{}>(gemm, stream);", std::string(call.size(), ' '), math));
    }
    w.line("err = cudaGetLastError();");
    w.line("if (err != cudaSuccess) return err;");
  }
  w.line("}");
  GemmCode code;
  code.launcher = w.str();
  code.includes.insert("hectorgen/tc_gemm.cuh");
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

// A weight-gradient instance has no kernel of its own: its launcher runs the runtime's split-K kernels
// (hectorgen/segments.cuh, simt_wgrad.cuh, tc_gemm.cuh) over two workspaces (wgrad_workspaces):
//   1. chunk_ptr: the chunks of chunk_rows rows of every segment, numbered (launch_segment_tile_ptr);
//   2. partial:   one fp32 dW slice per chunk (launch_wgrad_partials, tensor cores or CUDA cores);
//   3. dW (+)=    the partials of each segment summed in chunk order (launch_reduce_partials): deterministic.
// chunk_rows depends only on the row count and the blocks per chunk, so it is known to the host code, which
// sizes the workspaces with the same function (hectorgen/segments.h), without reading anything back from the GPU.
namespace {

struct WgradShape {
  std::string rows, segments, seg_ptr;  // Args expressions (launcher: "a."-prefixed; host: plain)
  int64_t blocks_per_chunk = 0;         // 64 x 64 dW tiles x heads
};

WgradShape wgrad_shape(const intra::WeightGradInstance& w, const std::string& prefix) {
  WgradShape s;
  s.rows = rows_expr(w.rows, prefix);
  s.segments = segments_expr(w.segments, prefix);
  s.seg_ptr = segment_ptr_expr(w.rows, w.segments, prefix);
  constexpr int64_t kTile = 64;  // the dW tile of both partial-sums kernels
  s.blocks_per_chunk = (w.k + kTile - 1) / kTile * ((w.n + kTile - 1) / kTile) * w.heads;
  return s;
}

std::vector<Workspace> wgrad_workspaces(const intra::WeightGradInstance& w) {
  const WgradShape s = wgrad_shape(w, "");
  const std::string segments = s.segments == "1" ? "1" : fmt::format("static_cast<int>({})", s.segments);
  const std::string chunk_rows = fmt::format("hectorgen::wgrad_chunk_rows({}, {})", s.rows, s.blocks_per_chunk);
  return {
      Workspace{workspace_name(w.name, "partial"), "float",
                fmt::format("hectorgen::wgrad_max_chunks({}, {}, {}) * {}", s.rows, segments, chunk_rows, w.heads * w.k * w.n),
                fmt::format("{}'s fp32 partial sums, one [{}, {}, {}] slice per chunk", w.name, w.heads, w.k, w.n), w.name,
                "partial"},
      Workspace{workspace_name(w.name, "chunk_ptr"), "int32_t", s.segments == "1" ? "2" : s.segments + " + 1",
                fmt::format("{}'s first chunk of each segment", w.name), w.name, "chunk_ptr"},
  };
}

GemmCode emit_wgrad(const Program& p, const intra::Kernel& k) {
  const intra::WeightGradInstance& w = std::get<intra::WeightGradInstance>(k);
  const bool tc = w.kernel == intra::WgradKernel::TensorCore;
  const WgradShape s = wgrad_shape(w, "a.");
  const std::string T = intra::cuda_type(p.find(w.x)->storage), dy_type = intra::cuda_type(p.find(w.dy)->storage),
                    dw_type = intra::cuda_type(p.find(w.dw)->storage);
  if (tc && !intra::wgrad_tc_reads(w.dtype, p.find(w.x)->storage, p.find(w.dy)->storage))
    throw std::logic_error(fmt::format("emit: {} runs on tensor cores but stores x as {} and dy as {}", w.name, T, dy_type));
  const bool widen = intra::wgrad_widens(p, w);  // one operand fp32, the other 16-bit: fp32 tiles, tf32 MMAs
  const std::string partial = "a." + workspace_name(w.name, "partial"), chunk_ptr = "a." + workspace_name(w.name, "chunk_ptr");
  const std::string ns = tc ? "hectorgen::tc" : "hectorgen::simt";
  const std::string math = fp32_math_arg(w.dtype);
  const std::string params = tc ? fmt::format("{}, {}, {}{}", T, w.k, w.n, math.empty() ? "" : ", " + math)
                                : fmt::format("{}, {}, {}, {}", T, w.k, w.n, w.heads);
  CodeWriter c;
  CodeWriter::Indent body(c);
  c.line(fmt::format("// {}: weight-gradient instance  {}[{}] {}= sum_row {}[{}]^T * {}[{}]{}", w.name, w.dw,
                     w.segments == intra::Segments::None ? "-" : intra::to_string(w.segments), w.accumulate ? "+" : "", w.x,
                     intra::gathered_row(w.x_gather), w.dy, intra::gathered_row(w.dy_gather),
                     w.row_scalar.empty() ? "" : " * " + w.row_scalar + "[row]"));
  c.line(fmt::format("//   from: {}", w.source));
  c.line(fmt::format("// Split-K on {} (kernel={}): fixed chunks of each segment's rows, an fp32 partial sum per chunk,",
                     tc ? "tensor cores" : "CUDA cores", intra::wgrad_kernel_text(w)));
  c.line(fmt::format("// then {} {} the sum of its segment's chunks in chunk order: bit-identical over runs.", w.dw,
                     w.accumulate ? "+=" : "="));
  if (widen)
    c.line(fmt::format("// {} is {}, {} {}: fp32 tiles, the 16-bit operand widened as it is loaded, tf32 MMAs.", w.x,
                       inter::to_string(p.find(w.x)->storage), w.dy, inter::to_string(p.find(w.dy)->storage)));
  c.line(fmt::format("{}::WgradArgs<{}> wgrad{{}};", ns, dy_type == T ? T : T + ", " + dy_type));
  c.line(fmt::format("wgrad.x = a.{};", w.x));
  c.line(fmt::format("wgrad.dy = a.{};", w.dy));
  auto list = [&](intra::Gather g) { return gather_expr(w.rows, g, "a."); };
  if (const std::string x_list = intra::indexed_list(p, w.x, w.rows, w.x_gather); !x_list.empty())
    c.line(fmt::format("wgrad.gather = a.{};  // X rows: {}'s map composed with the gather", x_list, w.x));
  else if (w.x_gather != intra::Gather::None)
    c.line(fmt::format("wgrad.gather = {};  // X rows", list(w.x_gather)));
  if (w.dy_gather != intra::Gather::None) c.line(fmt::format("wgrad.scatter = {};  // dY rows", list(w.dy_gather)));
  if (!w.row_scalar.empty()) c.line(fmt::format("wgrad.scale = a.{};", w.row_scalar));
  if (w.segments != intra::Segments::None) c.line(fmt::format("wgrad.seg_ptr = {};", s.seg_ptr));
  c.line(fmt::format("wgrad.num_rows = {};", s.rows));
  c.line(fmt::format("wgrad.num_segments = {};", s.segments));
  c.line(fmt::format("// {} block(s) per chunk (64 x 64 tiles of dW x heads): the host code sized the workspaces alike.",
                     s.blocks_per_chunk));
  c.line(fmt::format("const int chunk_rows = hectorgen::wgrad_chunk_rows(wgrad.num_rows, {});", s.blocks_per_chunk));
  c.line(fmt::format("int32_t* const chunk_ptr = {};", chunk_ptr));
  c.line(fmt::format("float* const partial = {};", partial));
  auto call = [&](const std::string& e) { c.line(fmt::format("if (cudaError_t err = {}; err != cudaSuccess) return err;", e)); };
  call("hectorgen::launch_segment_tile_ptr(wgrad.seg_ptr, wgrad.num_segments, wgrad.num_rows, chunk_rows, chunk_ptr, stream)");
  call(fmt::format("{}::launch_wgrad_partials<{}>(wgrad, chunk_ptr, chunk_rows, partial, stream)", ns, params));
  call(fmt::format("hectorgen::launch_reduce_partials<{}>(partial, chunk_ptr, a.{}, wgrad.num_segments, {}, /*accumulate=*/{}, stream)",
                   dw_type, w.dw, w.heads * w.k * w.n, w.accumulate ? "true" : "false"));
  // segments.cuh (the chunk offsets, the reduction) comes with either header.
  return GemmCode{"", c.str(), {tc ? "hectorgen/tc_gemm.cuh" : "hectorgen/simt_wgrad.cuh"}, {}};
}

}  // namespace

// A segment sum is split over fixed row chunks (hectorgen/segments.cuh): per-chunk column sums, then the chunks
// of each segment added in order. Deterministic, and as parallel as the rows (one block a row per segment
// element walked a whole segment before).
GemmCode emit_segsum(const Program& p, const intra::Kernel& k) {
  const intra::SegmentSumInstance& ss = std::get<intra::SegmentSumInstance>(k);
  std::string seg = ss.segments == intra::Segments::Etype ? "etype" : ss.segments == intra::Segments::Ntype ? "ntype" : "";
  const std::string rows = rows_expr(ss.rows, "a."), segs = segments_expr(ss.segments, "a.");
  const TensorInfo* dw = p.find(ss.dw);
  GemmCode c;
  c.includes.insert("hectorgen/segments.cuh");
  c.launcher = fmt::format(
      "  // {name}: segment sum  {dw}[{seg}] += sum_row {v}[row]\n"
      "  //   from: {source}\n"
      "  const int64_t rows = {rows};\n"
      "  const int chunk_rows = hectorgen::segment_sum_chunk_rows(rows, {numel});\n"
      "  if (cudaError_t err = hectorgen::launch_segment_tile_ptr({seg_ptr}, {segs}, rows, chunk_rows, a.{chunks}, stream);\n"
      "      err != cudaSuccess) return err;\n"
      "  if (cudaError_t err = hectorgen::launch_segment_sum_partials(a.{v}, {numel}, {seg_ptr}, rows, {segs}, a.{chunks},\n"
      "                                                               chunk_rows, a.{partials}, stream);\n"
      "      err != cudaSuccess) return err;\n"
      "  if (cudaError_t err = hectorgen::launch_reduce_partials<{out_t}>(a.{partials}, a.{chunks}, a.{dw}, {segs}, {numel},\n"
      "                                                                 /*accumulate=*/true, stream);\n"
      "      err != cudaSuccess) return err;\n",
      fmt::arg("name", ss.name), fmt::arg("dw", ss.dw), fmt::arg("seg", seg.empty() ? "-" : seg), fmt::arg("v", ss.v),
      fmt::arg("source", ss.source), fmt::arg("rows", rows), fmt::arg("numel", ss.numel),
      fmt::arg("seg_ptr", segment_ptr_expr(ss.rows, ss.segments, "a.")), fmt::arg("segs", segs),
      fmt::arg("chunks", workspace_name(ss.name, "chunk_ptr")), fmt::arg("partials", workspace_name(ss.name, "partial")),
      fmt::arg("out_t", intra::cuda_type(dw ? dw->storage : inter::DType::FP32)));
  return c;
}

namespace {

// The comment lines of gather_sum_split.cu.in (and, with group_rows, gather_sum_rows.cu.in) that say how a row's
// entries and elements are spread over the lanes.
std::string split_layout_text(const intra::SplitLayout& l, int element_bytes, bool group_rows = false) {
  const int groups = 32 / l.group_lanes;
  std::string out = group_rows ? fmt::format("A warp {} rows, ", groups) : "A warp a row, ";
  out += group_rows ? (l.group_lanes == 1 ? "each lane a row of its own, an entry at a time"
                                          : fmt::format("a group of {} lanes a row, an entry at a time", l.group_lanes))
         : groups == 1 ? "its 32 lanes on each entry together"
         : l.group_lanes == 1 ? "each lane an entry of its own"
                              : fmt::format("its lanes in {} groups of {}, a group an entry", groups, l.group_lanes);
  const int last = l.run - 1;
  const std::string lane = groups == 1 ? "lane l" : "lane l of a group";
  if (l.group_lanes == 1 && l.run > 1)
    out += fmt::format(" (its {} elements, one load)", l.run);
  else if (l.group_lanes == 1) {
  } else if (l.runs_per_lane == 1)
    out += fmt::format(": {} holds element{} {} of the entry's row", lane, l.run == 1 ? "" : "s",
                       l.run == 1 ? "l" : fmt::format("{0}l .. {0}l + {1}", l.run, last));
  else if (l.run == 1)
    out += fmt::format(": {} holds elements l + {} r of the entry's row, r < {}", lane, l.group_lanes, l.runs_per_lane);
  else
    out += fmt::format(": {} holds {} runs of {} elements of the entry's row, run r from element {}(l + {} r)", lane,
                       l.runs_per_lane, l.run, l.run, l.group_lanes);
  const int bytes = l.run * element_bytes;
  if (l.run > 1 && l.group_lanes > 1)
    out += bytes <= 16 ? fmt::format(", {}-byte loads", bytes) : fmt::format(", {} 16-byte loads a run", bytes / 16);
  out += ".";
  // Wrapped into comment lines of at most 116 characters.
  std::string lines, line = "//";
  size_t at = 0;
  while (at < out.size()) {
    size_t end = out.find(' ', at);
    if (end == std::string::npos) end = out.size();
    const std::string word = out.substr(at, end - at);
    if (line.size() + 1 + word.size() > 116) {
      lines += line + "\n";
      line = "//";
    }
    line += " " + word;
    at = end + 1;
  }
  return lines + line;
}

}  // namespace

// A gather sum: a warp (or row_lanes lanes) per row, each lane its elements of the row (in registers), the CSR
// entries of the row added in a fixed order (deterministic; gathers only), then one store.
//   A warp a row, entries one at a time (edge_batch 1): gather_sum_split.cu.in, the entries split over groups of
//   lanes, each lane's elements in vector runs (split_layout).
//   Otherwise gather_sum.cu.in, each lane holding elements lane, lane + G, ... Below 32 lanes the warp's rows add
//   their entries in step, as a traversal's edge loops do (emit/traversal.cpp): the warp's longest row sets the
//   blocks and steps, a row's steps past its own entries add nothing, a row past the last stores nothing.
GemmCode emit_gathersum(const Program& p, const intra::Kernel& k) {
  const intra::GatherSumInstance& s = std::get<intra::GatherSumInstance>(k);
  const bool pairs = s.csr == intra::GatherCsr::PairEdges;
  const TensorInfo &x = *p.find(s.x), &y = *p.find(s.y);
  const intra::LaunchConfig launch = intra::launch_config(p, k);
  Vars v;
  v["name"] = s.name;
  v["formula"] = fmt::format("{}[row] {}= sum over the {} of the row i: {}[{}]{}", s.y, s.accumulate ? "+" : "",
                             pairs ? "edges of each (source, edge type) pair" : "pairs of each source node", s.x,
                             s.x_gather == intra::Gather::Dst ? "dst[i]" : "i", s.scale.empty() ? "" : " * " + s.scale + "[i]");
  v["source"] = s.source;
  v["threads"] = std::to_string(launch.threads);
  v["x_type"] = intra::cuda_type(x.storage);
  v["y_type"] = intra::cuda_type(y.storage);
  v["numel"] = std::to_string(s.numel);
  const int G = s.row_lanes;
  const bool in_step = G != 32;
  auto shfl = [&](const std::string& lane_v, const std::string& j) { return row_shuffle(G, lane_v, j); };
  // The entry's row of x (its own, or its edge's destination's) and its scale: `lane` j fetches them for entry
  // first + j of a block (of the warp's 32 entries; of a group's, where each group has a row of its own), and each
  // entry broadcasts them from its lane.
  auto fetch_code = [&](const std::string& lane) {
    std::string fetch = "      int64_t lane_x_row = 0;\n";
    std::string in_range = fmt::format("        lane_x_row = {};\n", s.x_gather == intra::Gather::Dst ? "dst[from_row]" : "from_row");
    if (!s.scale.empty()) {
      fetch += "      float lane_scale = 0.0f;\n";
      in_range += fmt::format("        lane_scale = {};\n", load_elem(*p.find(s.scale), "scale[from_row]"));
    }
    return fetch + fmt::format("      if ({0} < count) {{\n        const int64_t from_row = csr_col[first + {0}];\n", lane) +
           in_range + "      }\n";
  };
  std::string extra;
  if (s.x_gather == intra::Gather::Dst) extra += ", const int32_t* __restrict__ dst";
  if (!s.scale.empty())
    extra += fmt::format(", const {}* __restrict__ scale", intra::cuda_type(p.find(s.scale)->storage));
  v["extra_params"] = extra;
  v["fetch"] = fetch_code("lane");
  GemmCode c;
  const std::string scaled = s.scale.empty() ? "" : "entry_scale * ";
  // With rows of few entries, a warp's groups each take a row of their own (gather_sum_rows.cu.in, <name>_rows):
  // the launcher picks it when the rows have fewer entries than `below` on average (0: no rows variant).
  const intra::GatherSumRows rows_variant = intra::gather_sum_rows(s);
  const int below = rows_variant.below, row_groups = rows_variant.row_groups;
  if (!in_step && s.edge_batch == 1) {
    // The split kernel and its rows variant: each a layout's runs, loads and stores.
    auto render = [&](const intra::SplitLayout& l, bool group_rows) {
      Vars w = v;
      w["layout"] = split_layout_text(l, static_cast<int>(intra::storage_bytes(x.storage)), group_rows);
      w["run"] = std::to_string(l.run);
      w["group_lanes"] = std::to_string(l.group_lanes);
      w["fetch"] = fetch_code(group_rows ? "group_lane" : "lane");
      w["entry_scale"] = s.scale.empty() ? ""
                                         : fmt::format("        const float entry_scale = __shfl_sync(0xffffffffu, lane_scale, {});\n",
                                                       group_rows ? "group * kGroupLanes + j" : "j");
      w["scaled"] = scaled;
      // Runs of one element are plain scalar accesses (no 16-bit vector word exists).
      const std::string x_at = "x[x_row * kNumel + col]", y_at = "y[row * kNumel + col]";
      if (l.run > 1) {
        w["load"] = "load_run<kRun>(value, &" + x_at + ");";
        w["store"] = "store_run<kRun>(&" + y_at + ", acc[r]);";
        c.helpers.insert({"runs", std::string("runs_load_") + v["x_type"], std::string("runs_store_") + v["y_type"]});
      } else {
        w["load"] = "value[0] = " + load_elem(x, x_at) + ";";
        w["store"] = store_elem(y, y_at, "acc[r][0]", false);
      }
      w["add_old"] = "";
      if (s.accumulate && l.run > 1) {
        w["add_old"] = "          float old[kRun];\n"
                       "          load_run<kRun>(old, &" + y_at + ");\n"
                       "#pragma unroll\n"
                       "          for (int i = 0; i < kRun; ++i) acc[r][i] += old[i];\n";
        c.helpers.insert(std::string("runs_load_") + v["y_type"]);
      } else if (s.accumulate) {
        w["add_old"] = "          acc[r][0] += " + load_elem(y, y_at) + ";\n";
      }
      return render_template(group_rows ? "cuda/gather_sum_rows.cu.in" : "cuda/gather_sum_split.cu.in", w);
    };
    c.kernel = render(intra::split_layout(s.numel, s.vector, s.csr == intra::GatherCsr::NodePairs), false);
    if (below > 0) c.kernel += "\n" + render(intra::split_layout(s.numel, s.vector, /*few_entries=*/false), true);
  } else {
    const std::string lanes = std::to_string(G);
    v["lanes"] = lanes;
    v["lanes_minus_one"] = std::to_string(G - 1);
    v["live"] = in_step ? "row_live && " : "";
    v["fetchers"] = in_step ? fmt::format("The row's {} lanes fetch", G) : "The warp fetches";
    v["rows"] = row_loop_open(G, "row");
    if (!in_step) {
      v["blocks"] = "    const int64_t end = csr_ptr[row + 1];\n"
                    "    for (int64_t first = csr_ptr[row]; first < end; first += 32) {\n"
                    "      const int count = end - first < 32 ? static_cast<int>(end - first) : 32;\n";
    } else {
      v["blocks"] = fmt::format(
          "    const int64_t begin = csr_ptr[row];\n"
          "    const int64_t end = row_live ? csr_ptr[row + 1] : begin;  // a row past the last adds nothing\n"
          "    const int todo = __reduce_max_sync(0xffffffffu, static_cast<int>(end - begin));  // the warp's longest row\n"
          "    for (int done = 0; done < todo; done += {0}) {{\n"
          "      const int64_t first = begin + done;\n"
          "      const int steps = todo - done < {0} ? todo - done : {0};  // the block's steps, the same for the warp's rows\n"
          "      const int count = end - first < {0} ? static_cast<int>(end - first > 0 ? end - first : 0) : {0};\n",
          G);
    }
    const std::string col = "lane + " + lanes + " * c";
    v["acc_init"] = s.accumulate ? col + " < kNumel ? " + load_elem(y, "y[row * kNumel + " + col + "]") + " : 0.0f" : "0.0f";
    const std::string x_elem = load_elem(x, "x[x_row * kNumel + col]");
    if (s.edge_batch == 1) {
      std::string entry = "        const int64_t x_row = " + shfl("lane_x_row", "j") + ";\n";
      if (!s.scale.empty()) entry += "        const float entry_scale = " + shfl("lane_scale", "j") + ";\n";
      v["entries"] = "#pragma unroll 4\n"
                     "      for (int j = 0; j < " + std::string(in_step ? "steps" : "count") + "; ++j) {\n" +
                     entry +
                     "#pragma unroll\n"
                     "        for (int c = 0; c < kSlots; ++c) {\n"
                     "          const int col = " + col + ";\n"
                     "          if (" + std::string(in_step ? "j < count && " : "") + "col < kNumel) acc[c] += " + scaled + x_elem + ";\n"
                     "        }\n"
                     "      }\n";
    } else {
      // schedule.traversal.edge_batch b: the entries come b at a time. Their rows (and scales) are shuffled out
      // first, then the b entries' values are loaded (a step past the row's last entry loads the batch's first
      // again), then added, a live entry's only: the same additions in the same order (as the traversal's batched
      // edge loops, emit/traversal.cpp), with the b entries' loads in flight together.
      const int b = s.edge_batch;
      std::string e = fmt::format("      for (int j0 = 0; j0 < {}; j0 += {}) {{\n", in_step ? "steps" : "count", b);
      e += fmt::format("        int64_t x_row_batch[{}];\n", b);
      if (!s.scale.empty()) e += fmt::format("        float scale_batch[{}];\n", b);
      e += "#pragma unroll\n";
      e += fmt::format("        for (int u = 0; u < {}; ++u) {{\n", b);
      // (rows in step: a step past the row's entries takes its own lane's indices, 0, as its row of x)
      e += in_step ? "          const int j = j0 + u;\n" : "          const int j = j0 + u < count ? j0 + u : j0;\n";
      e += "          x_row_batch[u] = " + shfl("lane_x_row", "j") + ";\n";
      if (!s.scale.empty()) e += "          scale_batch[u] = " + shfl("lane_scale", "j") + ";\n";
      e += "        }\n";
      e += fmt::format("        float value[{}][kSlots];\n", b);
      e += "#pragma unroll\n";
      e += fmt::format("        for (int u = 0; u < {}; ++u) {{\n", b);
      e += "          const int64_t x_row = x_row_batch[u];\n";
      e += "#pragma unroll\n";
      e += "          for (int c = 0; c < kSlots; ++c) {\n";
      e += "            const int col = " + col + ";\n";
      e += "            value[u][c] = col < kNumel ? " + x_elem + " : 0.0f;\n";
      e += "          }\n";
      e += "        }\n";
      e += "#pragma unroll\n";
      e += fmt::format("        for (int u = 0; u < {}; ++u) {{\n", b);
      if (!s.scale.empty()) e += "          const float entry_scale = scale_batch[u];\n";
      e += "#pragma unroll\n";
      e += "          for (int c = 0; c < kSlots; ++c)\n";
      e += "            if (j0 + u < count && " + col + " < kNumel) acc[c] += " + scaled + "value[u][c];\n";
      e += "        }\n";
      e += "      }\n";
      v["entries"] = e;
    }
    v["store"] = store_elem(y, "y[row * kNumel + col]", "acc[c]", false);
    c.kernel = render_template("cuda/gather_sum.cu.in", v);
  }
  const std::string rows = pairs ? "a.num_pairs" : "a.num_nodes";
  // The CSR's entries: a pair's edges (every edge in one pair) or a node's pairs (every pair of one source).
  const std::string entries = pairs ? "a.num_edges" : "a.num_pairs";
  const std::string args = fmt::format(
      "({}, a.{}, a.{}, a.{}, a.{}{})", rows, pairs ? "pair_edge_ptr" : "node_pair_ptr", pairs ? "pair_edge_eid" : "node_pair",
      s.x, s.y, std::string(s.x_gather == intra::Gather::Dst ? ", a.dst" : "") + (s.scale.empty() ? "" : ", a." + s.scale));
  std::string launch_code;
  if (below > 0) {
    intra::GridExtent rows_grid = launch.x;  // a warp takes row_groups rows
    rows_grid.rows_per_block *= row_groups;
    launch_code = fmt::format(
        "    if ({entries} < {below} * {rows}) {{  // fewer than {below} entries a row, on average: a row a group of lanes\n"
        "      const unsigned blocks = {rows_blocks};\n"
        "      {name}_rows<<<blocks, {threads}, 0, stream>>>{args};\n"
        "    }} else {{\n"
        "      const unsigned blocks = {blocks};\n"
        "      {name}<<<blocks, {threads}, 0, stream>>>{args};\n"
        "    }}\n",
        fmt::arg("entries", entries), fmt::arg("below", below), fmt::arg("rows", rows), fmt::arg("name", s.name),
        fmt::arg("rows_blocks", rows_grid.expr(rows, "1")), fmt::arg("blocks", launch.x.expr(rows, "1")),
        fmt::arg("threads", launch.threads), fmt::arg("args", args));
  } else {
    launch_code = fmt::format("    const unsigned blocks = {};\n    {}<<<blocks, {}, 0, stream>>>{};\n",
                              launch.x.expr(rows, "1"), s.name, launch.threads, args);
  }
  c.launcher = fmt::format(
      "  if ({rows} > 0) {{  // {name}\n"
      "{launch}"
      "    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;\n"
      "  }}\n",
      fmt::arg("rows", rows), fmt::arg("name", s.name), fmt::arg("launch", launch_code));
  return c;
}

// The workspaces of one instance, named <kernel>_<what> (reserved with the kernel's name: emit/names.h):
//   weight gradients and segment sums: the split-K partials and chunk offsets ("partial", "chunk_ptr");
//   tensor-core GEMMs over segments whose tile offsets are not the graph's: the 64-row tiles of each segment,
//   numbered per call ("tile_ptr"); and W^T when the instance computes X W^T ("w_t", W's size and storage type).
static std::vector<Workspace> kernel_workspaces(const Program& p, const intra::Kernel& k) {
  if (auto* w = std::get_if<intra::WeightGradInstance>(&k)) return wgrad_workspaces(*w);
  std::vector<Workspace> out;
  if (auto* ss = std::get_if<intra::SegmentSumInstance>(&k)) {
    const std::string rows = rows_expr(ss->rows, ""), segs = segments_expr(ss->segments, "");
    out.push_back({workspace_name(ss->name, "chunk_ptr"), "int32_t", fmt::format("{} + 1", segs),
                   fmt::format("{}'s first chunk of each segment", ss->name), ss->name, "chunk_ptr"});
    out.push_back({workspace_name(ss->name, "partial"), "float",
                   fmt::format("hectorgen::wgrad_max_chunks({0}, {1}, hectorgen::segment_sum_chunk_rows({0}, {2})) * {2}",
                               rows, segs, ss->numel),
                   fmt::format("{}'s fp32 sums, one per chunk", ss->name), ss->name, "partial"});
  }
  if (auto* g = std::get_if<GemmInstance>(&k); g && g->tensor_cores) {
    const char* segs = g->segments == intra::Segments::Etype   ? "num_etypes"
                       : g->segments == intra::Segments::Ntype ? "num_ntypes"
                                                               : nullptr;
    if (!g->graph_tiles && segs)  // (one segment: the kernel numbers its tiles from 0)
      out.push_back({workspace_name(g->name, "tile_ptr"), "int32_t", fmt::format("{} + 1", segs),
                     "first 64-row tile of each segment (tensor-core kernel)", g->name, "tile_ptr"});
    if (g->transpose_w)
      out.push_back({workspace_name(g->name, "w_t"), intra::cuda_type(p.find(g->w)->storage),
                     segs ? fmt::format("{} * {}", segs, g->k * g->n) : std::to_string(g->k * g->n),
                     fmt::format("{}^T, [{}][{}] per segment", g->w, g->k, g->n), g->name, "w_t"});
  }
  return out;
}

std::vector<Workspace> workspaces(const Program& p) {
  std::vector<Workspace> all;
  for (const auto& k : p.kernels)
    for (Workspace& w : kernel_workspaces(p, k)) all.push_back(std::move(w));
  return all;
}

static bool has_torch_fallback(const Program& p) {
  for (const auto& k : p.kernels)
    if (std::holds_alternative<intra::TorchInstance>(k)) return true;
  return false;
}

struct KernelsCode {
  std::string kernels, launchers;
  std::set<std::string> helpers, includes;
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
  std::set<std::string> helpers, includes;
  int gemms = 0, travs = 0;
  for (const auto& k : p.kernels) {
    std::string body;
    const size_t kernel_mark = kernels.size();
    std::optional<GemmCode> gemm;
    if (std::holds_alternative<GemmInstance>(k)) {
      gemm = emit_gemm(p, k);
      ++gemms;
    } else if (std::holds_alternative<intra::WeightGradInstance>(k)) {
      gemm = emit_wgrad(p, k);
      ++gemms;
    } else if (std::holds_alternative<intra::SegmentSumInstance>(k)) {
      gemm = emit_segsum(p, k);
    } else if (std::holds_alternative<intra::GatherSumInstance>(k)) {
      gemm = emit_gathersum(p, k);
    }
    const std::string& name = intra::kernel_name(k);
    if (gemm && gemm->kernel.empty()) {  // the launcher calls the runtime's kernels: nothing to emit or share
      includes.insert(gemm->includes.begin(), gemm->includes.end());
      launchers += "\n" + launcher_function(p, name, gemm->launcher);
      forward += fmt::format("  if (cudaError_t err = launch_{}(a, stream); err != cudaSuccess) return err;\n", name);
      continue;
    }
    if (gemm) {
      includes.insert(gemm->includes.begin(), gemm->includes.end());
      helpers.insert(gemm->helpers.begin(), gemm->helpers.end());
      kernels += "\n" + gemm->kernel;
      body = gemm->launcher;
    } else if (auto* t = std::get_if<intra::TraversalInstance>(&k)) {
      TraversalCode r = emit_traversal(p, *t);
      kernels += "\n" + r.kernel;
      body = r.launcher;
      helpers.insert(r.helpers.begin(), r.helpers.end());
      ++travs;
    } else {
      continue;  // a PyTorch instance runs in the host code
    }
    // Reuse an identical kernel emitted earlier (the launcher calls it instead).
    std::string kernel_code = kernels.substr(kernel_mark);
    std::string identity = kernel_identity(kernel_code, name);
    if (kernel_code.find_first_not_of('\n') == std::string::npos) {
      // a runtime kernel (tensor cores): nothing emitted to share
    } else if (auto it = emitted.find(identity); it != emitted.end()) {
      kernels.resize(kernel_mark);
      for (const std::string& launched : {std::string("<<<"), std::string("_rows<<<")})  // the kernel, its rows variant
        for (size_t at = body.find(name + launched); at != std::string::npos; at = body.find(name + launched, at))
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
  return KernelsCode{kernels, launchers, helpers, includes, gemms, travs};
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
    all.includes.insert(c.includes.begin(), c.includes.end());
    all.gemms += c.gemms;
    all.travs += c.travs;
    phase_names += (phase_names.empty() ? "" : ", ") + ph.phase;
  }
  Vars v = banner_vars(p, ctx);
  v["phases"] = phase_names;
  v["num_gemm"] = std::to_string(all.gemms);
  v["num_traversal"] = std::to_string(all.travs);
  const std::string conversions = storage_helpers(storage_types(phases));
  const std::string helpers = device_helpers(all.helpers);
  v["helpers"] = conversions.empty() ? helpers : helpers.empty() ? conversions : conversions + "\n" + helpers;
  std::string includes;
  for (const std::string& h : all.includes) includes += fmt::format("#include \"{}\"\n", h);
  v["runtime_includes"] = includes.empty() ? "" : "\n" + includes;
  v["kernels"] = all.kernels;
  v["launchers"] = all.launchers.substr(1);
  return render_template("cuda/kernels.cu.in", v);
}

std::string emit_kernels_h(const std::vector<Program>& ir_phases, const EmitContext& ctx) {
  const std::vector<Program> phases = with_cpp_names(ir_phases);
  const Program& p = phases.front();
  Vars v = banner_vars(p, ctx);
  v["Model"] = capitalize(p.model);
  const std::set<DType> types = storage_types(phases);
  v["storage_includes"] = std::string(types.count(DType::BF16) ? "\n#include <cuda_bf16.h>" : "") +
                          (types.count(DType::FP16) ? "\n#include <cuda_fp16.h>" : "");
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
      if (ph.layouts.count(intra::layout::kCompactSrc)) w.line("int64_t num_pairs = 0;  // unique (source, edge type) pairs");
      for (const std::string& g : graph_arrays(ph)) w.line(fmt::format("const int32_t* {} = nullptr;", g));
      for (const TensorInfo& t : ph.tensors)
        for (const auto& [list, array] : intra::indexed_lists(ph, t.name))
          w.line(fmt::format("const int32_t* {} = nullptr;  // [{}] the rows of {}: {}_rows[{}]", list,
                             array.empty() ? "num_nodes" : array == "pair_src" ? "num_pairs" : "num_edges", t.name, t.name,
                             array.empty() ? "node" : array + "[row]"));
      for (const TensorInfo& t : ph.tensors) {
        std::string rows = t.per == Per::Node ? "num_nodes" : t.per == Per::Edge ? "num_edges" : t.per == Per::Etype ? "num_etypes"
                           : t.per == Per::Ntype ? "num_ntypes" : t.per == Per::Pair ? "num_pairs" : "";
        std::string dims = rows;
        for (int64_t d : t.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
        w.line(fmt::format("{}{}* {} = nullptr;  // [{}]", is_const_tensor(t) ? "const " : "", intra::cuda_type(t.storage), t.name,
                           dims));
      }
      for (const Workspace& ws : workspaces(ph))
        w.line(fmt::format("{}* {} = nullptr;  // workspace: {}", ws.ctype, ws.name, ws.comment));
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
  v["tile"] = std::to_string(intra::graph_gemm_tile(p));
  return render_template("cuda/kernels.h.in", v);
}

}  // namespace hectorgen::emit
