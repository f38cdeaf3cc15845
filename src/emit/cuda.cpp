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
  std::string kernel, launcher;
};

// dim3 grid(...) of a launcher, from the kernel's launch configuration.
std::string grid_expr(const intra::LaunchConfig& c, const std::string& rows, const std::string& segments) {
  std::string e = c.x.expr(rows, segments);
  auto one = [](const intra::GridExtent& d) { return d.is_constant() && d.fixed == 1; };
  if (!one(c.y) || !one(c.z)) e += ", " + c.y.expr(rows, segments) + ", " + c.z.expr(rows, segments);
  return e;
}

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
  if (!g.row_scalar.empty()) {
    params += fmt::format("\n    const {}* __restrict__ row_scalar,", intra::cuda_type(p.find(g.row_scalar)->storage));
    args.push_back("a." + g.row_scalar);
  }
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
  if (!w.row_scalar.empty()) {
    params += fmt::format("\n    const {}* __restrict__ row_scalar,", intra::cuda_type(p.find(w.row_scalar)->storage));
    args.push_back("a." + w.row_scalar);
  }
  if (!seg.empty()) { params += "\n    const int32_t* __restrict__ seg_ptr,"; args.push_back(fmt::format("a.{}_ptr", seg)); }
  v["extra_params"] = params;
  v["row_range"] = segment_rows(seg);
  v["scale"] = w.row_scalar.empty() ? "" : " * " + load_elem(*p.find(w.row_scalar), "row_scalar[row]");
  const TensorInfo &xt = *p.find(w.x), &dyt = *p.find(w.dy), &dwt = *p.find(w.dw);
  v["x_type"] = intra::cuda_type(xt.storage);
  v["dy_type"] = intra::cuda_type(dyt.storage);
  v["dw_type"] = intra::cuda_type(dwt.storage);
  v["x_load"] = load_elem(xt, fmt::format("x[{} * (kHeads * kK) + head * kK + k0 + c]", gather_row(w.x_gather)));
  v["dy_load"] = load_elem(dyt, fmt::format("dy[{} * (kHeads * kN) + head * kN + n0 + c]", gather_row(w.dy_gather)));
  v["dw_store"] = store_elem(dwt, "dw[(type * kHeads + head) * kK * kN + k * kN + n]", "acc[c]", true);
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
  const TensorInfo &vt = *p.find(ss.v), &dwt = *p.find(ss.dw);
  v["v_type"] = intra::cuda_type(vt.storage);
  v["dw_type"] = intra::cuda_type(dwt.storage);
  v["v_load"] = load_elem(vt, "v[r * kNumel + j]");
  v["dw_store"] = store_elem(dwt, "dw[type * kNumel + j]", "partial[0]", true);
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

// The workspaces of one instance (none yet: every instance is a single kernel over the Args' tensors).
static std::vector<Workspace> kernel_workspaces(const Program& p, const intra::Kernel& k) {
  (void)p;
  (void)k;
  return {};
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
      kernels += "\n" + c.kernel;
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
    if (auto it = emitted.find(identity); it != emitted.end()) {
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
  const std::string conversions = storage_helpers(storage_types(phases));
  const std::string helpers = device_helpers(all.helpers);
  v["helpers"] = conversions.empty() ? helpers : helpers.empty() ? conversions : conversions + "\n" + helpers;
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
      for (const std::string& g : graph_arrays(ph)) w.line(fmt::format("const int32_t* {} = nullptr;", g));
      for (const TensorInfo& t : ph.tensors) {
        std::string rows = t.per == Per::Node ? "num_nodes" : t.per == Per::Edge ? "num_edges" : t.per == Per::Etype ? "num_etypes"
                           : t.per == Per::Ntype ? "num_ntypes" : "";
        std::string dims = rows;
        for (int64_t d : t.shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
        w.line(fmt::format("{}{}* {} = nullptr;  // [{}]", is_const_tensor(t) ? "const " : "", intra::cuda_type(t.storage), t.name,
                           dims));
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
