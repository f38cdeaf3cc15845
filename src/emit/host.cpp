// Emission of everything around the kernels: libtorch host stubs, the Python module, the extension's
// CMakeLists.txt and manifest.json.
#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "emit/cost.h"
#include "emit/emit.h"
#include "emit/names.h"
#include "ir/inter/names.h"
#include "emit/printer.h"
#include "hectorgen/runtime_version.h"
#include "ir/inter/printer.h"

namespace hectorgen::emit {

using namespace inter;
using intra::Program;
using intra::Role;
using intra::TensorInfo;

namespace {

// The size expression (in host code) of a tensor's leading dimension.
std::string rows_of(Per per) {
  switch (per) {
    case Per::Node: return "num_nodes";
    case Per::Edge: return "num_edges";
    case Per::Etype: return "num_etypes";
    case Per::Ntype: return "num_ntypes";
    case Per::None: return "";
    case Per::Pair: return "num_pairs";
  }
  return "";
}

// Whether the program reads the compact (source, edge type) pair layout: its ops then take the pair count too.
bool has_pairs(const Program& p) { return p.layouts.count(intra::layout::kCompactSrc) > 0; }
bool is_backward(const Program& p) { return p.phase == "backward" || p.phase == "compact_backward"; }

std::string shape_list(const TensorInfo& t) {
  std::string s = rows_of(t.per);
  for (int64_t d : t.shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "{" + s + "}";
}

// ATen's scalar type of a storage type, and the element type data_ptr<T>() takes.
const char* aten_scalar(DType storage) {
  return storage == DType::BF16 ? "at::kBFloat16" : storage == DType::FP16 ? "at::kHalf" : "at::kFloat";
}

// `t`'s data pointer as the Args struct types it (intra::cuda_type): ATen's 16-bit types have the layout of CUDA's.
std::string data_ptr(const TensorInfo& t) {
  if (t.storage == DType::BF16) return fmt::format("reinterpret_cast<__nv_bfloat16*>({}.data_ptr<at::BFloat16>())", t.name);
  if (t.storage == DType::FP16) return fmt::format("reinterpret_cast<__half*>({}.data_ptr<at::Half>())", t.name);
  return fmt::format("{}.data_ptr<float>()", t.name);
}

std::string graph_array_rows(const std::string& g) {
  if (g == "etype_ptr" || g == "etype_tile_ptr") return "num_etypes + 1";
  if (g == "ntype_ptr" || g == "ntype_tile_ptr") return "num_ntypes + 1";
  if (g == "in_ptr" || g == "out_ptr") return "num_nodes + 1";
  if (g == "ntype") return "num_nodes";
  if (g == "pair_etype_ptr" || g == "pair_tile_ptr") return "num_etypes + 1";
  if (g == "pair_src" || g == "node_pair") return "num_pairs";
  if (g == "pair_edge_ptr") return "num_pairs + 1";
  if (g == "node_pair_ptr") return "num_nodes + 1";
  return "num_edges";
}

// Op arguments after the graph: inputs from the graph, user inputs, weights (spec order).
std::vector<const TensorDecl*> op_tensors(const Program& p) {
  std::vector<const TensorDecl*> v;
  for (const auto& t : p.decl.inputs)
    if (!t.from_graph.empty()) v.push_back(&t);
  for (const auto& t : p.decl.inputs)
    if (t.from_graph.empty()) v.push_back(&t);
  for (const auto& t : p.decl.weights) v.push_back(&t);
  return v;
}

// The runtime minor version that generated code needs: the newest runtime interface it uses, which can be older
// than the runtime beside this compiler (runtime/include/hectorgen/runtime_version.h). 1.5 added the layout
// csr_by_dst_pairs (in_col_unique_src, each incoming-edge position's pair), which compact node traversals read;
// 1.4 the split operands of fp32 on tensor cores (tc_gemm.cuh's Fp32Math), which every fp32 model's GEMMs use; 1.3
// the per-relation compaction choice (prepare_graph's compact_relations and the statistics on Graph) of
// materialization: auto. Raise it with the first generated code that needs a newer interface.
constexpr int kRequiredRuntimeMinor = 5;
static_assert(kRequiredRuntimeMinor <= HECTORGEN_RUNTIME_VERSION_MINOR,
              "generated code cannot need a runtime newer than the one it ships with");

// materialization: auto modules pass compact_relations to hectorgen_runtime.prepare_graph (the per-relation
// compaction choice), new in runtime 1.3: they need at least that minor version.
constexpr int kAutoRuntimeMinor = 3;
// Node kernels that read a graph-derived input by CSR position (intra::in_position_twin) need the layout
// in_col_inv_relation_in_degree, new in runtime 1.6.
constexpr int kInPositionRuntimeMinor = 6;
// Tensor-core instances of mixed operand types (intra::gemm_widens_weights, a weight gradient of an fp32 and a 16-bit
// operand: fp16's backward) and tensor-core GEMMs over one segment without tile offsets need tc_gemm.cuh of runtime
// 1.7 (EmitContext::tc_runtime_minor).
constexpr int kTcRuntimeMinor = 7;
static_assert(kAutoRuntimeMinor <= HECTORGEN_RUNTIME_VERSION_MINOR && kInPositionRuntimeMinor <= HECTORGEN_RUNTIME_VERSION_MINOR &&
                  kTcRuntimeMinor <= HECTORGEN_RUNTIME_VERSION_MINOR,
              "generated code cannot need a runtime newer than the one it ships with");
// `p`: the module's first phase (every phase and program of a module has the same layouts, twins included).
int module_runtime_minor(const Program& p, const EmitContext& ctx) {
  int minor = ctx.auto_materialization ? std::max(kAutoRuntimeMinor, kRequiredRuntimeMinor) : kRequiredRuntimeMinor;
  if (p.layouts.count(intra::layout::kInColInvRelInDegree)) minor = std::max(minor, kInPositionRuntimeMinor);
  minor = std::max(minor, ctx.tc_runtime_minor);
  return minor;
}
// The hectorgen runtime version a module is written for, "MAJOR.MINOR": it runs on any runtime MAJOR.x with x >= MINOR.
std::string module_runtime_version(const Program& p, const EmitContext& ctx) {
  return fmt::format("{}.{}", HECTORGEN_RUNTIME_VERSION_MAJOR, module_runtime_minor(p, ctx));
}

// The runtime's name (a key of hectorgen_runtime.Graph, see runtime/python/hectorgen_runtime) of the graph array
// that kernels take as `array` (emit/cuda.cpp graph_arrays).
std::string runtime_graph_key(const std::string& array) {
  static const std::map<std::string, std::string> kKeys = {
      {"src", "sorted_src"},         {"dst", "sorted_dst"},         {"etype", "sorted_etype"},
      {"etype_ptr", "etype_ptr"},    {"etype_tile_ptr", "etype_tile_ptr"},
      {"in_ptr", "in_row_ptr"},      {"in_eid", "in_col_eid"},      {"in_src", "in_col_src"},
      {"in_pair", "in_col_unique_src"},  {"in_etype", "in_col_etype"},  {"out_etype", "out_col_etype"},
      {"out_ptr", "out_row_ptr"},    {"out_eid", "out_col_eid"},    {"out_dst", "out_col_dst"},
      {"ntype", "ntype"},            {"ntype_ptr", "ntype_ptr"},    {"ntype_tile_ptr", "ntype_tile_ptr"},
      {"pair_src", "unique_src"},    {"pair_etype_ptr", "unique_src_etype_ptr"},
      {"pair_tile_ptr", "unique_src_tile_ptr"},                     {"edge_pair", "edge_to_unique_src"},
      {"pair_edge_ptr", "unique_src_edge_ptr"},                     {"pair_edge_eid", "unique_src_edge_eid"},
      {"node_pair_ptr", "unique_src_node_ptr"},                     {"node_pair", "unique_src_node_pair"}};
  auto it = kKeys.find(array);
  if (it == kKeys.end()) throw std::logic_error("emit: graph array '" + array + "' has no hectorgen runtime key");
  return it->second;
}

// The host function of models with unified inputs (placement: unified): the device address through which the
// kernels read a CPU tensor in pinned, GPU-mapped memory (hectorgen_runtime.to_unified / unified, or pin_memory()),
// found as the runtime finds it (runtime/src/unified.cu); a CUDA tensor on the device (a unified tensor's cuda_view(),
// or any copy) is read as it is.
constexpr const char* kMappedAddress = R"cpp(

void* mapped_address(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape, at::Device device) {
  TORCH_CHECK(t.defined(), "$model$: ", name, " is undefined");
  TORCH_CHECK(t.is_cpu() || t.device() == device, "$model$: ", name, " must be a unified tensor (a CPU tensor in pinned, ",
              "GPU-mapped memory: hectorgen_runtime.to_unified) or on ", device, ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, "$model$: ", name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.sizes() == shape, "$model$: ", name, " must have shape ", shape_str(shape), ", got ", shape_str(t.sizes()));
  TORCH_CHECK(t.is_contiguous(), "$model$: ", name, " must be contiguous");
  // The kernels move rows in vectors of up to 16 bytes.
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "$model$: ", name,
              " must start at a 16-byte aligned address (a view at an offset that is not a multiple of 16 bytes; ",
              "pass a copy, t.clone())");
  if (t.is_cuda() || t.numel() == 0) return t.data_ptr();
  // The first and the last byte: pinned by cudaHostAlloc or cudaHostRegister, mapped, one range for the device.
  const size_t bytes = t.numel() * t.element_size();
  cudaPointerAttributes first{}, last{};
  const bool mapped = cudaPointerGetAttributes(&first, t.data_ptr()) == cudaSuccess && first.type == cudaMemoryTypeHost &&
                      first.devicePointer != nullptr &&
                      cudaPointerGetAttributes(&last, static_cast<char*>(t.data_ptr()) + bytes - 1) == cudaSuccess &&
                      last.type == cudaMemoryTypeHost &&
                      static_cast<char*>(last.devicePointer) == static_cast<char*>(first.devicePointer) + (bytes - 1);
  cudaGetLastError();  // an unregistered pointer leaves an error behind on older drivers
  TORCH_CHECK(mapped, "$model$: ", name, " is a CPU tensor in memory the GPU cannot read (not pinned and mapped); ",
              "make it unified with hectorgen_runtime.to_unified(t) (a copy) or hectorgen_runtime.unified(t) (in place)");
  return first.devicePointer;
})cpp";

// The host function of models with indexed inputs (rows: indexed): the node-to-row map checked and made int32 (the
// gather lists of the kernels). HECTORGEN_CHECK_ROWS=1 in the environment also checks every entry against the
// table's rows (a device-to-host copy: a sync).
constexpr const char* kRowMap = R"cpp(

at::Tensor row_map(const at::Tensor& rows, const char* name, int64_t num_nodes, int64_t table_rows, at::Device device) {
  TORCH_CHECK(rows.defined(), "$model$: ", name, " is undefined");
  TORCH_CHECK(rows.scalar_type() == at::kInt || rows.scalar_type() == at::kLong, "$model$: ", name,
              " must be int32 or int64, got ", rows.scalar_type());
  TORCH_CHECK(rows.device() == device, "$model$: ", name, " must be on ", device, ", got ", rows.device());
  TORCH_CHECK(rows.dim() == 1 && rows.size(0) == num_nodes, "$model$: ", name, " must have shape [",
              std::to_string(num_nodes), "] (a row of the table per node), got ", shape_str(rows.sizes()));
  TORCH_CHECK(table_rows <= std::numeric_limits<int32_t>::max(), "$model$: the table of ", name, " has ",
              std::to_string(table_rows), " rows; the kernels index at most 2^31 - 1");
  static const bool check_range = [] {
    const char* v = std::getenv("HECTORGEN_CHECK_ROWS");
    return v != nullptr && std::string(v) == "1";
  }();
  if (check_range && num_nodes > 0) {
    const auto [lo, hi] = at::aminmax(rows);
    const int64_t min = lo.item<int64_t>(), max = hi.item<int64_t>();
    TORCH_CHECK(min >= 0 && max < table_rows, "$model$: ", name, " holds rows from ", std::to_string(min), " to ",
                std::to_string(max), ", outside the table's [0, ", std::to_string(table_rows), ")");
  }
  return rows.to(at::kInt).contiguous();
})cpp";

}  // namespace

// The backward op's allocations of tensors that only some gradients need (emit_op: grad_mask).
constexpr const char* kGradMaskHelpers = R"cpp(

// A tensor of `shape` when a gradient the caller asked for needs it (the backward's grad_mask), else an empty one.
at::Tensor empty_if(bool needed, at::IntArrayRef shape, const at::TensorOptions& options) {
  return needed ? at::empty(shape, options) : at::empty({0}, options);
}

at::Tensor zeros_if(bool needed, at::IntArrayRef shape, const at::TensorOptions& options) {
  return needed ? at::zeros(shape, options) : at::empty({0}, options);
})cpp";

// `text` as `//` comment lines of at most 118 columns, broken between words.
std::string comment_lines(const std::string& text) {
  std::string out, line = "//";
  for (size_t at = 0; at < text.size();) {
    size_t end = std::min(text.find(' ', at), text.size());
    const std::string word = text.substr(at, end - at);
    if (line.size() > 2 && line.size() + 1 + word.size() > 118) {
      out += line + "\n";
      line = "//";
    }
    line += " " + word;
    at = end + 1;
  }
  return out + line;
}

// The tensors an op returns: its outputs, then (forward_train) the saved fields.
std::vector<std::string> op_results(const Program& p) {
  std::vector<std::string> r;
  for (const TensorInfo& t : p.tensors)
    if (t.role == Role::Output) r.push_back(t.name);
  for (const std::string& f : p.saved) {
    auto it = p.aliases.find(f);
    r.push_back(it == p.aliases.end() ? f : it->second);
  }
  return r;
}

// An op's arguments, in order: graph arrays, graph sizes, then tensors (see op_tensors).
struct OpArg {
  std::string name;
  bool is_tensor;
};
static std::vector<OpArg> op_args(const Program& p) {
  std::vector<OpArg> args;
  for (const std::string& g : graph_arrays(p)) args.push_back({g, true});
  for (const char* n : {"num_nodes", "num_edges", "num_etypes", "num_ntypes"}) args.push_back({n, false});
  if (has_pairs(p)) args.push_back({"num_pairs", false});
  for (const TensorDecl* t : op_tensors(p)) {
    args.push_back({t->name, true});
    if (t->indexed_rows) args.push_back({t->name + "_rows", true});  // its node-to-row map
  }
  if (is_backward(p)) args.push_back({"grad_mask", false});  // which results to compute (results_fed)
  return args;
}

// When the op's tensors hold memory. Its results (outputs, then the tensors saved for the backward) live from the
// start to the return; every other tensor and every workspace lives from the kernel that first touches it to the
// last: allocated right before the first, released right after the last, so that later allocations reuse its memory
// through the stream-ordered caching allocator (HGT's compact backward holds at most three of its four [pairs, 64]
// gradients at once). A tensor no kernel touches is not allocated at all.
struct Lifetime {
  size_t first = 0, last = 0;  // kernel indices
};
using Lifetimes = std::map<std::string, Lifetime>;  // the tensors and workspaces allocated late

static Lifetimes plan_memory(const Program& p, const std::vector<std::string>& results) {
  Lifetimes plan;
  const std::set<std::string> keep(results.begin(), results.end());
  auto touch = [&](const std::string& name, size_t i) {
    if (keep.count(name)) return;
    auto [it, fresh] = plan.try_emplace(name, Lifetime{i, i});
    if (!fresh) it->second.last = i;
  };
  std::map<std::string, size_t> kernel_index;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    kernel_index[intra::kernel_name(p.kernels[i])] = i;
    for (const std::string& n : intra::kernel_reads(p.kernels[i])) touch(n, i);
    for (const std::string& n : intra::kernel_writes(p.kernels[i])) touch(n, i);
  }
  const std::vector<Workspace> all_workspaces = workspaces(p);
  std::set<std::string> workspace_names;
  for (const Workspace& w : all_workspaces) {
    workspace_names.insert(w.name);
    if (auto it = kernel_index.find(w.kernel); it != kernel_index.end()) plan[w.name] = Lifetime{it->second, it->second};
  }
  // Only the op's own tensors are planned: reads of inputs, weights and graph arrays are not allocations.
  for (auto it = plan.begin(); it != plan.end();) {
    const TensorInfo* t = p.find(it->first);
    const bool own = t ? t->role != Role::Input && t->role != Role::Weight : workspace_names.count(it->first) > 0;
    it = own ? std::next(it) : plan.erase(it);
  }
  return plan;
}

// A kernel feeds the results it writes, and those of every later kernel that reads a tensor it writes (kernels in
// reverse order; a tensor read earlier than it is written adds to its older writers, which can only keep a kernel
// that could be skipped, never skip one that is needed).
std::vector<std::set<size_t>> results_fed(const Program& p, const std::vector<std::string>& results) {
  std::map<std::string, std::set<size_t>> demand;  // tensor -> results that read it, directly or not
  for (size_t r = 0; r < results.size(); ++r) demand[results[r]].insert(r);
  std::vector<std::set<size_t>> fed(p.kernels.size());
  for (size_t i = p.kernels.size(); i-- > 0;) {
    for (const std::string& n : intra::kernel_writes(p.kernels[i])) {
      const std::set<size_t>& d = demand[n];
      fed[i].insert(d.begin(), d.end());
    }
    for (const std::string& n : intra::kernel_reads(p.kernels[i])) demand[n].insert(fed[i].begin(), fed[i].end());
  }
  return fed;
}

// `p` with the C++ names (emit/names.h), `ir` the same program with the IR's: messages name the user's tensors.
static std::string emit_op(const Program& p, const Program& ir) {
  Vars v;
  v["model"] = p.model;
  v["phase"] = p.phase;
  v["Args"] = args_struct(p);
  std::string plist;
  for (const OpArg& a : op_args(p))
    plist += (plist.empty() ? "    " : ",\n    ") + std::string(a.is_tensor ? "const at::Tensor& " : "int64_t ") + a.name;
  v["params"] = plist;
  auto tensors = op_tensors(p);
  std::string device_from = tensors.empty() ? graph_arrays(p).front() : tensors.front()->name;
  for (const TensorDecl* t : tensors)
    if (t->from_graph.empty() && !t->unified) {  // a unified input is a CPU tensor
      device_from = t->name;
      break;
    }
  v["first_input"] = device_from;
  std::string checks;
  for (const std::string& g : graph_arrays(p))
    checks += fmt::format("  check({}, \"graph array '{}'\", at::kInt, {{{}}}, device);\n", g, g, graph_array_rows(g));
  const auto user_tensors = op_tensors(ir);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorDecl* t = tensors[i];
    const TensorInfo* ti = p.find(t->name);
    std::vector<int64_t> shape = t->shape;
    TensorInfo info = ti ? *ti : TensorInfo{t->name, Role::Input, t->per, shape, false, ""};
    if (!ti) info.storage = intra::model_storage(p.decl.options.dtype);  // an input no kernel reads
    std::string shape_arg = shape_list(info);
    if (t->indexed_rows) {  // rows: indexed: a table of any number of rows, read through its map
      shape_arg = fmt::format("{{{}.size(0){}", t->name, shape_arg.substr(std::min(shape_arg.find(','), shape_arg.size() - 1)));
      checks += fmt::format("  TORCH_CHECK({0}.dim() >= 1, \"{1}: input '{2}' must have a row dimension\");\n", t->name, p.model,
                            user_tensors.at(i)->name);
    }
    if (t->unified) {  // placement: unified: the kernels read it through its GPU mapping
      checks += fmt::format("  void* const {}_mapped = mapped_address({}, \"input '{}'\", {}, {}, device);\n", t->name, t->name,
                            user_tensors.at(i)->name, aten_scalar(info.storage), shape_arg);
    } else {
      checks += fmt::format("  check({}, \"{} '{}'\", {}, {}, device);\n", t->name, info.role == Role::Weight ? "weight" : "input",
                            is_derived_name(user_tensors.at(i)->name) ? t->name : user_tensors.at(i)->name,
                            aten_scalar(info.storage), shape_arg);
    }
    if (t->indexed_rows) {
      // The map as int32, checked, then composed with each gather list of the kernels that read the table.
      checks += fmt::format("  const at::Tensor {0}_rows_i32 = row_map({0}_rows, \"{1}_rows\", num_nodes, {0}.size(0), device);\n",
                            t->name, user_tensors.at(i)->name);
      for (const auto& [list, array] : intra::indexed_lists(p, t->name))
        checks += array.empty() ? fmt::format("  const at::Tensor& {} = {}_rows_i32;\n", list, t->name)
                                : fmt::format("  const at::Tensor {} = {}_rows_i32.index_select(0, {});\n", list, t->name, array);
    }
  }
  v["checks"] = checks.substr(0, checks.size() - 1);
  v["pair_count"] = has_pairs(p) ? "\n  TORCH_CHECK(num_pairs >= 0 && num_pairs <= num_edges, \"" + p.model +
                                       ": bad pair count\");\n  a.num_pairs = num_pairs;" : "";
  std::string alloc, meta, assign;
  std::vector<std::string> results = op_results(p);
  const Lifetimes plan = plan_memory(p, results);
  // Backward: the condition under which a kernel runs or a tensor is allocated ("" always: it feeds every result).
  std::vector<std::string> kernel_when(p.kernels.size());
  std::map<std::string, uint64_t> tensor_mask;  // the results each tensor and workspace feeds
  std::string mask_doc;
  const uint64_t all = (uint64_t{1} << results.size()) - 1;
  auto when = [&](uint64_t mask) { return mask == all ? std::string() : fmt::format("grad_mask & {}", mask); };
  if (is_backward(p)) {
    if (results.size() > 63) throw std::logic_error("emit: more than 63 gradients in one backward op");
    const std::vector<std::set<size_t>> fed = results_fed(p, results);
    std::map<std::string, uint64_t> kernel_mask;
    for (size_t i = 0; i < p.kernels.size(); ++i) {
      uint64_t mask = 0;
      for (size_t r : fed[i]) mask |= uint64_t{1} << r;
      kernel_when[i] = when(mask);
      kernel_mask[intra::kernel_name(p.kernels[i])] = mask;
      for (const std::string& n : intra::kernel_reads(p.kernels[i])) tensor_mask[n] |= mask;
      for (const std::string& n : intra::kernel_writes(p.kernels[i])) tensor_mask[n] |= mask;
    }
    for (const Workspace& w : workspaces(p))
      if (auto it = kernel_mask.find(w.kernel); it != kernel_mask.end()) tensor_mask[w.name] = it->second;
    for (size_t r = 0; r < results.size(); ++r) {
      mask_doc += fmt::format("{}bit {} {}", mask_doc.empty() ? "" : ", ", r, results[r]);
      tensor_mask[results[r]] |= uint64_t{1} << r;
    }
  }
  // The expression that allocates tensor `name` (`how`: empty or zeros); in the backward, one that feeds no requested
  // gradient gets an empty tensor instead (kGradMaskHelpers).
  auto allocate = [&](const std::string& name, const char* how, const std::string& shape, const std::string& options) {
    auto it = tensor_mask.find(name);
    const std::string cond = it == tensor_mask.end() ? "" : when(it->second);
    return cond.empty() ? fmt::format("at::{}({}, {})", how, shape, options) : fmt::format("{}_if({}, {}, {})", how, cond, shape, options);
  };
  // fp32 and tf32 models: every tensor is float, as the first input. 16-bit models name each tensor's type.
  const bool mixed = intra::model_storage(p.decl.options.dtype) != DType::FP32;
  std::vector<std::string> before(p.kernels.size());
  std::vector<std::vector<std::string>> after(p.kernels.size());
  for (const TensorInfo& t : p.tensors) {
    if (t.role == Role::Input || t.role == Role::Weight) {
      const TensorDecl* decl = p.decl.find_input(t.name);
      assign += decl && decl->unified ? fmt::format("  a.{0} = static_cast<{1}*>({0}_mapped);\n", t.name, intra::cuda_type(t.storage))
                                      : fmt::format("  a.{} = {};\n", t.name, data_ptr(t));
      for (const auto& l : intra::indexed_lists(p, t.name)) assign += fmt::format("  a.{0} = {0}.data_ptr<int32_t>();\n", l.first);
      continue;
    }
    std::string options = mixed ? fmt::format("options.dtype({})", aten_scalar(t.storage)) : "options";
    const std::string line = fmt::format("  at::Tensor {} = {};{}\n", t.name,
                                         allocate(t.name, t.zero_init ? "zeros" : "empty", shape_list(t), options),
                                         t.role == Role::Output ? "" : t.role == Role::Field ? "  // field" : "  // intermediate");
    const bool result = std::find(results.begin(), results.end(), t.name) != results.end();
    if (auto it = plan.find(t.name); it != plan.end()) {
      before[it->second.first] += line + fmt::format("  a.{} = {};\n", t.name, data_ptr(t));
      after[it->second.last].push_back(t.name);
    } else if (result) {
      alloc += line;
      assign += fmt::format("  a.{} = {};\n", t.name, data_ptr(t));
    }
    if (result) {
      const std::string meta_options =
          fmt::format("{}.options(){}", device_from, mixed ? fmt::format(".dtype({})", aten_scalar(t.storage)) : "");
      meta += fmt::format("  at::Tensor {} = {};\n", t.name, allocate(t.name, "empty", shape_list(t), meta_options));
    }
  }
  // A workspace's element type (Workspace::ctype) as ATen's dtype and as the data_ptr<> type behind the pointer.
  auto at_type = [](const std::string& ctype) -> std::pair<const char*, const char*> {
    if (ctype == "int32_t") return {"at::kInt", "int32_t"};
    if (ctype == "__nv_bfloat16") return {"at::kBFloat16", "at::BFloat16"};
    if (ctype == "__half") return {"at::kHalf", "at::Half"};
    if (ctype == "float") return {"at::kFloat", "float"};
    throw std::logic_error("emit: workspace of unknown type " + ctype);
  };
  for (const Workspace& w : workspaces(p)) {
    const std::string w_options = fmt::format("options.dtype({})", at_type(w.ctype).first);
    const std::string line = fmt::format("  at::Tensor {} = {};  // workspace: {}\n", w.name,
                                         allocate(w.name, "empty", "{" + w.numel + "}", w_options),
                                         w.comment);
    const char* elem = at_type(w.ctype).second;
    const std::string set = w.ctype == elem ? fmt::format("  a.{} = {}.data_ptr<{}>();\n", w.name, w.name, elem)
                                            : fmt::format("  a.{} = reinterpret_cast<{}*>({}.data_ptr<{}>());\n", w.name, w.ctype,
                                                          w.name, elem);
    if (auto it = plan.find(w.name); it != plan.end()) {
      before[it->second.first] += line + set;
      after[it->second.last].push_back(w.name);
    } else {
      alloc += line;
      assign += set;
    }
  }
  v["allocations"] = alloc.substr(0, alloc.size() - 1);
  v["meta_allocations"] = meta.substr(0, meta.size() - 1);
  std::string graph_assign;
  for (const std::string& g : graph_arrays(p)) graph_assign += fmt::format("  a.{} = {}.data_ptr<int32_t>();\n", g, g);
  assign = graph_assign + assign;
  v["assignments"] = assign.substr(0, assign.size() - 1);
  std::string res;
  for (const auto& r : results) res += (res.empty() ? "" : ", ") + r;
  v["results"] = res;
  std::string doc = fmt::format("The {} pass. Returns {}", p.phase,
                                 p.saved.empty() ? "the outputs" : "the outputs, then the tensors the backward pass needs");
  if (!mask_doc.empty())
    doc += fmt::format(", the gradients grad_mask asks for ({}; one not asked for is an empty tensor: the kernels and "
                       "tensors that feed only such gradients are skipped)", mask_doc);
  v["doc"] = comment_lines(doc + ".");
  std::string launches;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const intra::Kernel& k = p.kernels[i];
    launches += before[i];
    const std::string guard = kernel_when[i].empty() ? "  " : fmt::format("  if ({}) ", kernel_when[i]);
    if (auto* t = std::get_if<intra::TorchInstance>(&k)) launches += guard + emit_torch_block(p, *t).substr(2);
    else launches += fmt::format("{}C10_CUDA_CHECK(launch_{}(a, stream));\n", guard, intra::kernel_name(k));
    if (after[i].empty() || i + 1 == p.kernels.size()) continue;
    std::string names;
    for (const std::string& n : after[i]) names += (names.empty() ? "" : ", ") + n;
    launches += fmt::format("  // No kernel below uses {}: {} memory goes back to the caching allocator.\n", names,
                            after[i].size() == 1 ? "its" : "their");
    for (const std::string& n : after[i]) launches += fmt::format("  {}.reset();\n", n);
  }
  v["launches"] = launches.substr(0, launches.size() - 1);
  return render_template("host/op.cpp.in", v);
}

static std::string op_schema(const Program& p) {
  std::string sch;
  for (const OpArg& a : op_args(p)) sch += (sch.empty() ? "" : ", ") + std::string(a.is_tensor ? "Tensor " : "int ") + a.name;
  return sch;
}

std::string emit_host_cpp(const std::vector<Program>& ir_phases, const EmitContext& ctx) {
  const std::vector<Program> phases = with_cpp_names(ir_phases);
  const Program& p = phases.front();
  Vars v = banner_vars(p, ctx);
  std::string functions, defs, cuda, meta, pyb, names;
  for (size_t i = 0; i < phases.size(); ++i) {
    const Program& ph = phases[i];
    functions += emit_op(ph, ir_phases[i]);
    defs += fmt::format("  m.def(\"{}({}) -> Tensor[]\");\n", ph.phase, op_schema(ph));
    cuda += fmt::format("  m.impl(\"{}\", &{}_{}_op);\n", ph.phase, ph.model, ph.phase);
    meta += fmt::format("  m.impl(\"{}\", &{}_{}_meta);\n", ph.phase, ph.model, ph.phase);
    pyb += fmt::format("  m.def(\"{0}\", &{1}_{0}_op, \"Runs the {0} pass; see {1}.py\");\n", ph.phase, ph.model);
    names += (names.empty() ? "" : ", ") + ph.phase;
  }
  v["phases"] = names;
  v["runtime_major"] = std::to_string(HECTORGEN_RUNTIME_VERSION_MAJOR);
  v["runtime_minor"] = std::to_string(module_runtime_minor(ir_phases.front(), ctx));
  v["functions"] = functions;
  bool any_workspace = false;
  for (const Program& ph : phases) any_workspace |= !workspaces(ph).empty();
  v["runtime_includes"] = any_workspace ? "\n#include \"hectorgen/segments.h\"  // workspace sizes" : "";
  bool any_unified = false;
  for (const auto& t : p.decl.inputs) any_unified |= t.unified;
  bool any_indexed = false;
  for (const auto& t : p.decl.inputs) any_indexed |= t.indexed_rows;
  std::string mapped = std::string(any_unified ? kMappedAddress : "") + (any_indexed ? kRowMap : "");
  for (size_t at = mapped.find("$model$"); at != std::string::npos; at = mapped.find("$model$", at))
    mapped.replace(at, 7, p.model);
  bool any_backward = false;
  for (const Program& ph : phases) any_backward |= is_backward(ph);
  v["mapped_address"] = mapped + (any_backward ? kGradMaskHelpers : "");
  // 16-bit models: a float tensor of the wrong type is told the model's dtype (fp32 models: the plain check).
  const DType model = p.decl.options.dtype;
  v["dtype_check"] =
      intra::model_storage(model) == DType::FP32
          ? ""
          : fmt::format("\n  TORCH_CHECK(!at::isFloatingType(dtype) || t.scalar_type() == dtype, \"{}: \", name, \" must be \", dtype,\n"
                        "              \" (the spec's dtype is {}: hectorgen generated the kernels for it; no tensor is cast \"\n"
                        "              \"silently), got \", t.scalar_type());",
                        p.model, inter::to_string(model));
  v["defs"] = defs.substr(0, defs.size() - 1);
  v["cuda_impls"] = cuda.substr(0, cuda.size() - 1);
  v["meta_impls"] = meta.substr(0, meta.size() - 1);
  v["pybind_defs"] = pyb.substr(0, pyb.size() - 1);
  return render_template("host/host.cpp.in", v);
}

std::string python_training(const std::vector<Program>& phases, const std::vector<std::string>& user_inputs,
                            const std::vector<std::string>& weights, const std::string& from_graph_args,
                            const std::string& no_training_reason, const std::vector<Program>& compact = {});

std::vector<Program> program_phases(const std::vector<Program>& phases, bool compact) {
  std::vector<Program> out;
  for (const Program& p : phases)
    if ((p.phase.rfind("compact_", 0) == 0) == compact) out.push_back(p);
  return out;
}

namespace {

// A byte count or launch count as a Python number (an int when whole).
std::string py_number(double x) {
  if (x == static_cast<double>(static_cast<long long>(x))) return std::to_string(static_cast<long long>(x));
  return fmt::format("{}", x);
}

std::string py_strings(const std::vector<std::string>& xs) {
  std::string s;
  for (const auto& x : xs) s += fmt::format("\"{}\", ", x);
  return s;
}

std::set<std::string> union_layouts(const std::vector<Program>& phases) {
  std::set<std::string> out;
  for (const Program& p : phases) out.insert(p.layouts.begin(), p.layouts.end());
  return out;
}

std::string py_cost_tuple(const emit::Bytes& b) {
  std::string s;
  for (double x : b) s += (s.empty() ? "" : ", ") + py_number(x);
  return "(" + s + ")";
}

// The grouped gather rows of a phase (emit::GroupedRows) as a Python tuple of (rows, entries, below, groups), rows
// and entries as indices of the graph's counts.
std::string py_grouped_rows(const std::vector<emit::GroupedRows>& grouped) {
  std::string s;
  for (const emit::GroupedRows& k : grouped)
    s += fmt::format("({}, {}, {}, {}), ", static_cast<int>(k.rows), static_cast<int>(k.entries), k.below, k.groups);
  return "(" + s + ")";
}

// One phase's (or part's) terms as COST_MODEL and BACKWARD_PARTS write them.
std::string py_cost_terms(const emit::PhaseCost& c) {
  return fmt::format("{}, {}, {}, {}, {}", c.launches, py_cost_tuple(c.bytes), py_cost_tuple(c.gather_rows),
                     py_cost_tuple(c.search_rows), py_grouped_rows(c.grouped_rows));
}

// BACKWARD_PARTS: per program, the backward's kernels (and fills) that only some gradients need, with the forward()
// arguments whose gradients they feed (cost_by_results; "" without a backward).
std::string backward_parts(const std::vector<Program>& vanilla, const std::vector<Program>& compact,
                           const std::map<std::string, std::string>& param) {
  if (vanilla.size() < 3 || compact.size() < 3) return "";
  std::string out =
      "# The backward's kernels that only some gradients need, per program: (the forward() arguments whose gradients\n"
      "# they feed, then their terms as in COST_MODEL, whose backward counts them all). The op skips them when none of\n"
      "# those gradients is asked for (a layer's input features that do not require grad), and so does\n"
      "# cost_terms(g, training=True, grads=...).\n"
      "BACKWARD_PARTS = {\n";
  for (const auto* program : {&vanilla, &compact}) {
    const Program& b = (*program)[2];
    const std::vector<std::string> results = op_results(b);
    const uint64_t all = (uint64_t{1} << results.size()) - 1;
    out += fmt::format("    \"{}\": (\n", program == &vanilla ? "vanilla" : "compact");
    for (const auto& [mask, cost] : cost_by_results(b, results, results_fed(b, results))) {
      if (mask == all) continue;
      std::vector<std::string> args;
      for (size_t r = 0; r < results.size(); ++r) {
        if (!(mask >> r & 1)) continue;
        const std::optional<std::string> of = grad_target(results[r]);
        auto it = of ? param.find(*of) : param.end();
        if (it == param.end()) throw std::logic_error("emit: backward result " + results[r] + " is no argument's gradient");
        args.push_back(it->second);
      }
      out += fmt::format("        (({}), {}),\n", py_strings(args), py_cost_terms(cost));
    }
    out += "    ),\n";
  }
  return out + "}\n";
}

// materialization: auto: the constants after GRAPH_ARRAYS (the programs, their layouts and arrays, the cost model,
// the tuning table).
// `arguments`: forward()'s tensor parameters (user inputs, then weights), of which the last `num_weights` are weights;
// `param`: a spec input's or weight's forward() parameter.
std::string python_auto_constants(const std::vector<Program>& vanilla, const std::vector<Program>& compact,
                                  const inter::Options& options, const std::vector<std::string>& arguments,
                                  size_t num_weights, const std::map<std::string, std::string>& param) {
  const Program& v = vanilla.front();
  const Program& c = compact.front();
  std::vector<std::string> compact_keys;
  for (const auto& g : graph_arrays(c)) compact_keys.push_back(runtime_graph_key(g));
  std::string ops;
  for (const Program& x : compact) ops += (ops.empty() ? "" : ", ") + x.phase;
  std::string vops;
  for (const Program& x : vanilla) vops += (vops.empty() ? "" : ", ") + x.phase;
  std::string out = "\n\n";
  out += fmt::format(
      "# materialization: auto. This module holds two programs of {0}, and prepare_graph picks one per graph for\n"
      "# inference and one for training with the cost model below (hectorgen's docs/materialization.md):\n"
      "#   \"vanilla\" (ops {1}): every edge value stored per edge;\n"
      "#   \"compact\" (ops {2}): edge values that depend only on the edge's source and type\n"
      "#   stored once per unique (source, edge type) pair.\n"
      "# choose_by_timing(g, ...) (or the layer's method) times both on the graph and keeps the faster instead.\n",
      v.model, vops, ops);
  out += "MATERIALIZATION = \"auto\"\n";
  out += "PROGRAMS = (\"vanilla\", \"compact\")\n";
  out += "_OP_PREFIX = {\"vanilla\": \"\", \"compact\": \"compact_\"}\n";
  out += "_MODES = (\"inference\", \"training\")\n";
  out += fmt::format("ARGUMENTS = ({})  # forward()'s tensor arguments after g: user inputs, then weights\n", py_strings(arguments));
  out += fmt::format("WEIGHTS = ({})\n",
                     py_strings({arguments.end() - static_cast<std::ptrdiff_t>(num_weights), arguments.end()}));
  out += "# Each program's graph layouts, graph arrays (its ops' leading arguments) and whether its ops take the pair count.\n";
  out += fmt::format("PROGRAM_LAYOUTS = {{\"vanilla\": ({}), \"compact\": ({})}}\n",
                     py_strings({v.layouts.begin(), v.layouts.end()}), py_strings({c.layouts.begin(), c.layouts.end()}));
  out += fmt::format("PROGRAM_GRAPH_ARRAYS = {{\"vanilla\": GRAPH_ARRAYS, \"compact\": ({})}}\n", py_strings(compact_keys));
  out += fmt::format("PROGRAM_PAIR_COUNT = {{\"vanilla\": {}, \"compact\": {}}}\n", has_pairs(v) ? "True" : "False",
                     has_pairs(c) ? "True" : "False");
  out += "# The cost model (hectorgen's src/emit/cost.h), per program and phase: (kernel launches, bytes moved per\n"
         "# (1, node, edge, unique (source, edge type) pair, edge type, node type), rows of gather sums per the same, rows\n"
         "# that search their edge type per the same (ceil(log2(edge types) / 5) rounds each), and the gather sums whose\n"
         "# rows share a warp where they have few entries: (rows, entries) as indices of those counts, then below and\n"
         "# groups (a row counts 1 / groups of a gather row where entries < below * rows)), counted from the generated\n"
         "# kernels.\n";
  out += "COST_MODEL = {\n";
  for (const auto* program : {&vanilla, &compact}) {
    out += fmt::format("    \"{}\": {{\n", program == &vanilla ? "vanilla" : "compact");
    for (const Program& x : *program) {
      const std::string phase = x.phase.rfind("compact_", 0) == 0 ? x.phase.substr(8) : x.phase;
      out += fmt::format("        \"{}\": ({}),\n", phase, py_cost_terms(phase_cost(x)));
    }
    out += "    },\n";
  }
  out += "}\n";
  out += backward_parts(vanilla, compact, param);
  out += "# hectorgen's templates/tuning/materialization.json: per GPU architecture, launch_us (microseconds per kernel\n"
         "# launch), bandwidth_gbs (achieved global-memory GB/s), theta (the compact program compacts relation r iff its\n"
         "# unique (source, r) pairs / edges <= theta), gather_row_ns (nanoseconds per row of a gather sum beyond its\n"
         "# bytes) and search_round_ns (nanoseconds per round of a warp's search of a row's edge type). Rows not measured on\n"
         "# their GPU are ESTIMATES (the file says which).\n";
  out += "TUNING = {\n";
  for (const auto& [arch, t] : tuning_table())
    out += fmt::format("    \"{}\": {{\"launch_us\": {}, \"bandwidth_gbs\": {}, \"theta\": {}, \"gather_row_ns\": {}, "
                       "\"search_round_ns\": {}}},\n",
                       arch, py_number(t.launch_us), py_number(t.bandwidth_gbs), py_number(t.theta), py_number(t.gather_row_ns),
                       py_number(t.search_round_ns));
  out += "}\n";
  out += "# The spec's options.compact_relations (theta on every GPU), or None for TUNING's theta of the graph's GPU.\n";
  out += fmt::format("COMPACT_RELATIONS = {}", options.compact_relations ? py_number(*options.compact_relations) : "None");
  return out;
}

}  // namespace

std::string emit_python(const std::vector<Program>& all_phases, const EmitContext& ctx) {
  const std::vector<Program> phases = ctx.auto_materialization ? program_phases(all_phases, false) : all_phases;
  const std::vector<Program> compact = ctx.auto_materialization ? program_phases(all_phases, true) : std::vector<Program>{};
  const Program& p = phases.front();
  Vars v = banner_vars(p, ctx);
  const PythonNames py = python_names(p.decl);
  v["Model"] = py.model_class;
  bool ntype = p.layouts.count(intra::layout::kNtypePtr) > 0;
  v["ntype_args_doc"] = ntype ? ", ntype=ntype, num_ntypes=T" : "";
  v["ctor_doc"] = ntype ? ", num_ntypes=T" : "";
  std::vector<std::string> user_inputs, weights;
  for (const auto& t : p.decl.inputs)
    if (t.from_graph.empty()) {
      user_inputs.push_back(t.name);
      if (t.indexed_rows) user_inputs.push_back(t.name + "_rows");  // its node-to-row map, right after it
    }
  for (const auto& t : p.decl.weights) weights.push_back(t.name);
  auto join = [](const std::vector<std::string>& xs, const std::string& sep) {
    std::string s;
    for (size_t i = 0; i < xs.size(); ++i) s += (i ? sep : "") + xs[i];
    return s;
  };
  auto params = [&](const std::vector<std::string>& names) {
    std::vector<std::string> out;
    for (const std::string& n : names) out.push_back(py.param.at(n));
    return out;
  };
  v["input_names"] = join(params(user_inputs), ", ");
  std::string dims;
  for (const auto& h : p.decl.hyper) dims += (dims.empty() ? "" : ", ") + fmt::format("{}={}", h.name, h.is_integer ? fmt::format("{}", static_cast<long long>(h.value)) : fmt::format("{}", h.value));
  v["dims_doc"] = dims;
  std::string hyper_dict;
  for (const auto& h : p.decl.hyper)
    hyper_dict += (hyper_dict.empty() ? "" : ", ") +
                  fmt::format("\"{}\": {}", h.name, h.is_integer ? fmt::format("{}", static_cast<long long>(h.value)) : fmt::format("{}", h.value));
  v["hyper_dict"] = hyper_dict;
  std::set<std::string> all_layouts = ctx.auto_materialization ? union_layouts(all_phases) : p.layouts;
  std::vector<std::string> layouts(all_layouts.begin(), all_layouts.end());
  std::string lay;
  for (const auto& l : layouts) lay += fmt::format("\"{}\", ", l);
  v["layouts"] = lay;
  std::string arr;
  for (const auto& g : graph_arrays(p)) arr += fmt::format("\"{}\", ", runtime_graph_key(g));
  v["graph_arrays"] = arr;
  v["import_math"] = ctx.auto_materialization ? "import math\n" : "";  // the cost model's log2
  v["import_statistics"] = ctx.auto_materialization ? "import statistics\n" : "";  // time_programs' medians
  v["import_time"] = ctx.auto_materialization ? "import time\n" : "";  // time_programs on the CPU
  if (ctx.auto_materialization) {
    std::vector<std::string> arguments = params(user_inputs);
    for (const std::string& n : params(weights)) arguments.push_back(n);
    v["auto_constants"] = python_auto_constants(phases, compact, p.decl.options, arguments, weights.size(), py.param);
    v["graph_api"] = render_template("python/auto.py.in", {{"model", p.model}});
  } else {
    v["auto_constants"] = "";
    v["graph_api"] = render_template("python/graph_api.py.in",
                                     {{"model", p.model}, {"pair_count", has_pairs(p) ? ", g.num_unique_src" : ""}});
  }
  v["tile"] = std::to_string(intra::graph_gemm_tile(p));
  v["runtime_version"] = module_runtime_version(p, ctx);
  v["runtime_major"] = std::to_string(HECTORGEN_RUNTIME_VERSION_MAJOR);
  std::vector<std::string> fn_params{"g"};
  for (const std::string& n : params(user_inputs)) fn_params.push_back(n);
  for (const std::string& n : params(weights)) fn_params.push_back(n);
  v["fn_params"] = join(fn_params, ", ");
  std::string perm;
  for (const auto& t : p.decl.inputs)
    if (t.from_graph.empty() && t.per == Per::Edge)
      perm += fmt::format("    {0} = {0}.index_select(0, g.perm)  # edge rows in edge-type-sorted order\n", py.param.at(t.name));
  for (const auto& t : p.decl.inputs)
    if (t.indexed_rows)
      perm += fmt::format("    if {0}.requires_grad:\n"
                          "        raise ValueError(\"{1}.forward: {0} is read through {0}_rows (rows: indexed) and gets no gradient; \"\n"
                          "                         \"pass {0}.detach()\")\n",
                          py.param.at(t.name), p.model);
  v["edge_input_perm"] = perm;
  std::vector<std::string> tensor_args = params(user_inputs);
  for (const std::string& n : params(weights)) tensor_args.push_back(n);
  v["tensor_args"] = join(tensor_args, ", ");
  std::string fg;
  for (const auto& t : p.decl.inputs)  // computed by the runtime, in edge-type-sorted order
    if (!t.from_graph.empty()) fg += fmt::format("g.array(\"{}\"), ", t.from_graph);
  const DType dtype = p.decl.options.dtype;
  const DType storage = intra::model_storage(dtype);
  v["dtype"] = inter::to_string(dtype);
  v["torch_dtype"] = storage == DType::BF16 ? "torch.bfloat16" : storage == DType::FP16 ? "torch.float16" : "torch.float32";
  std::string fp32_inputs;  // of a 16-bit model: per-row scalars (norm), read by the GEMMs as float32
  for (const TensorInfo& t : p.tensors)
    if (t.role == Role::Input && t.from_graph.empty() && t.storage != storage)
      fp32_inputs += (fp32_inputs.empty() ? "" : ", ") + py.param.at(t.name);
  v["dtype_note"] = dtype == DType::TF32 ? "\n# tf32 stores float32; the GEMMs round their operands to TF32."
                    : storage == DType::FP32 ? ""
                    : "\n# Inside the kernels every sum, and the softmax's statistics, are float32." +
                          (fp32_inputs.empty() ? std::string()
                                               : fmt::format("\n# Inputs that scale rows ({}) are float32.", fp32_inputs));
  v["training"] = python_training(phases, user_inputs, weights, fg, ctx.no_training_reason, compact);
  const std::string contiguous = "*[t.contiguous() for t in tensors]";
  if (!ctx.auto_materialization) {
    v["run"] = fmt::format("    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):\n"
                           "        {}\n"
                           "    else:\n"
                           "        outs = torch.ops.hectorgen_{}.forward(*_graph_args(g), {}{})",
                           phases.size() < 3 ? "_refuse_grad(tensors)"
                                             : "outs = _Function.apply(g, *tensors)\n        outs = outs if isinstance(outs, tuple) else (outs,)",
                           p.model, fg, contiguous);
  } else {
    v["run"] = fmt::format("    training = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)\n"
                           "    grads = tuple(n for n, t in zip(ARGUMENTS, tensors) if t.requires_grad) if training else None\n"
                           "    program = materialization(g, training, grads)  # \"vanilla\" or \"compact\", chosen per graph\n"
                           "    if training:\n"
                           "        {}\n"
                           "    else:\n"
                           "        outs = _op(program, \"forward\")(*_graph_args(g, program), {}{})",
                           phases.size() < 3 ? "_refuse_grad(tensors)"
                                             : "outs = _Function.apply(g, program, *tensors)\n        outs = outs if isinstance(outs, tuple) else (outs,)",
                           fg, contiguous);
  }
  std::vector<std::string> outs;
  std::string ret;
  for (size_t i = 0; i < p.decl.outputs.size(); ++i) {
    const auto& o = p.decl.outputs[i];
    std::string val = fmt::format("outs[{}]", i);
    if (o.per == Per::Edge) val = fmt::format("torch.empty_like({0}).index_copy_(0, g.perm, {0})", val);
    outs.push_back(fmt::format("\"{}\": {}", o.name, val));
    if (p.decl.outputs.size() == 1) ret = val;
  }
  v["return_value"] = p.decl.outputs.size() == 1 ? ret : "{" + join(outs, ", ") + "}";
  std::string wdoc, init, reset;
  for (const auto& w : p.decl.weights) {
    std::string shape;
    std::string rows = w.per == Per::Etype ? "num_etypes" : w.per == Per::Ntype ? "num_ntypes" : "";
    std::vector<std::string> dims;
    if (!rows.empty()) dims.push_back(rows);
    for (int64_t d : w.shape) dims.push_back(std::to_string(d));
    const std::string& attr = py.attr.at(w.name);
    wdoc += (wdoc.empty() ? "" : ", ") + fmt::format("{} [{}]", attr, join(dims, ", "));
    std::string tuple = dims.size() == 1 ? dims[0] + "," : join(dims, ", ");
    init += fmt::format("        self.{} = torch.nn.Parameter(torch.empty(({}), device=device, dtype=dtype))\n", attr, tuple);
    if (w.init == "ones") reset += fmt::format("        torch.nn.init.ones_(self.{})\n", attr);
    else if (w.init == "zeros") reset += fmt::format("        torch.nn.init.zeros_(self.{})\n", attr);
    else {
      int64_t fan_in = w.shape.size() >= 2 ? w.shape[w.shape.size() - 2] : 1, fan_out = w.shape.empty() ? 1 : w.shape.back();
      reset += fmt::format("        torch.nn.init.uniform_(self.{}, -{:.6f}, {:.6f})  # Glorot: fan_in {}, fan_out {}\n", attr,
                           std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)), std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)),
                           fan_in, fan_out);
    }
  }
  v["weights_doc"] = wdoc;
  v["params_init"] = init.substr(0, init.size() - 1);
  v["reset"] = reset.substr(0, reset.size() - 1);
  std::vector<std::string> wargs;
  for (const auto& n : weights) wargs.push_back("self." + py.attr.at(n));
  v["weight_args"] = join(wargs, ", ");
  v["layer_methods"] =
      !ctx.auto_materialization
          ? ""
          : fmt::format("\n"
                        "    def choose_by_timing(self, g, {0}, training=False, rounds=5, calls=3):\n"
                        "        \"\"\"Times the two programs on `g` with these inputs and this layer's weights, and keeps the faster\n"
                        "        for that mode (the module's choose_by_timing): forward() runs it on `g` from then on.\"\"\"\n"
                        "        return choose_by_timing(g, {0}, {1}, training=training, rounds=rounds, calls=calls)\n",
                        v["input_names"], v["weight_args"]);
  return render_template("python/module.py.in", v);
}

// The autograd.Function that pairs the forward_train op with the backward op.
// A Python string literal (JSON's escapes are Python's; non-ASCII stays UTF-8, which Python source is).
std::string python_string(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// An untrainable model: the module refuses to run under autograd when an argument requires grad, naming the
// arguments and the reason, instead of silently returning outputs with no gradient.
std::string python_untrainable(const std::vector<std::string>& user_inputs, const std::vector<std::string>& weights,
                               const std::string& model, const std::string& reason) {
  std::string names;
  for (const auto& n : user_inputs) names += python_string(n) + ", ";
  for (const auto& n : weights) names += python_string(n) + ", ";
  std::string out;
  out += "TRAINABLE = False  # hectorgen generated no backward pass for this model (it warned why)\n";
  out += fmt::format("NO_BACKWARD_REASON = {}\n", python_string(reason.empty() ? "the backward pass is not supported" : reason));
  out += fmt::format("_ARGUMENT_NAMES = ({})  # user inputs, then weights\n\n\n", names);
  out += "def _refuse_grad(tensors):\n";
  out += "    \"\"\"Raises instead of running kernels that would return outputs with no gradient.\"\"\"\n";
  out += "    names = \", \".join(n for n, t in zip(_ARGUMENT_NAMES, tensors) if t.requires_grad)\n";
  out += fmt::format("    raise RuntimeError(\n"
                     "        f\"{0}: {{names}} requires grad, but hectorgen generated no backward pass for {0} \"\n"
                     "        f\"({{NO_BACKWARD_REASON}}). For inference, call it under torch.no_grad() or set requires_grad_(False) \"\n"
                     "        f\"on {{names}}; to train, change the spec so that it avoids the reason given\")",
                     model);
  return out;
}

std::string python_training(const std::vector<Program>& phases, const std::vector<std::string>& user_inputs,
                            const std::vector<std::string>& weights, const std::string& from_graph_args,
                            const std::string& no_training_reason, const std::vector<Program>& compact) {
  if (phases.size() < 3) return python_untrainable(user_inputs, weights, phases.front().model, no_training_reason);
  const bool both = !compact.empty();  // materialization: auto: the Function runs the program it is given
  const Program& f = phases[0];
  const Program& b = phases[2];
  size_t n_out = 0;
  for (const TensorInfo& x : f.tensors)
    if (x.role == Role::Output) ++n_out;
  size_t n_in = user_inputs.size(), n_t = user_inputs.size() + weights.size();
  // Which backward result is the gradient of which Function argument.
  auto grad_slots = [&](const Program& backward) {
    std::string slots;
    size_t result = 0;
    for (const TensorInfo& x : backward.tensors) {
      if (x.role != Role::Output) continue;
      std::string of = grad_target(x.name).value_or("");
      for (size_t i = 0; i < n_t; ++i) {
        std::string name = i < n_in ? user_inputs[i] : weights[i - n_in];
        if (name == of) slots += fmt::format("({}, {}), ", result, i);
      }
      ++result;
    }
    return slots;
  };
  std::vector<Program> all = phases;  // the host code names the tensors of every phase of the module at once
  all.insert(all.end(), compact.begin(), compact.end());
  const std::vector<Program> cpp = with_cpp_names(all);
  auto saved_fields = [&](size_t forward_train) {  // the host code's names of the saved fields
    std::string s;
    for (const auto& x : cpp[forward_train].saved) s += "\"" + x + "\", ";
    return s;
  };
  std::string out;
  out += "TRAINABLE = True\n";
  out += fmt::format("_NUM_OUTPUTS = {}\n", n_out);
  out += fmt::format("_NUM_INPUTS = {}  # user inputs, then weights\n", n_in);
  if (!both) {
    out += fmt::format("_GRAD_SLOTS = ({})  # (backward result, argument) pairs\n", grad_slots(b));
    out += fmt::format("SAVED_FOR_BACKWARD = ({})  # forward fields the backward reads\n\n\n", saved_fields(1));
  } else {
    out += fmt::format("_GRAD_SLOTS = {{\"vanilla\": ({}), \"compact\": ({})}}  # (backward result, argument) pairs\n",
                       grad_slots(b), grad_slots(compact[2]));
    out += fmt::format("SAVED_FOR_BACKWARD = {{\"vanilla\": ({}), \"compact\": ({})}}  # forward fields the backward reads\n\n\n",
                       saved_fields(1), saved_fields(phases.size() + 1));
  }
  out += "class _Function(torch.autograd.Function):\n";
  if (!both) {
    out += "    \"\"\"Pairs the generated forward_train kernels with the generated backward kernels.\"\"\"\n\n";
    out += "    @staticmethod\n";
    out += "    def forward(ctx, g, *tensors):\n";
    out += fmt::format("        res = torch.ops.hectorgen_{}.forward_train(*_graph_args(g), {}*[t.contiguous() for t in tensors])\n",
                       f.model, from_graph_args);
  } else {
    out += "    \"\"\"Pairs the generated forward_train kernels with the generated backward kernels of one program.\"\"\"\n\n";
    out += "    @staticmethod\n";
    out += "    def forward(ctx, g, program, *tensors):\n";
    out += fmt::format("        res = _op(program, \"forward_train\")(*_graph_args(g, program), {}*[t.contiguous() for t in tensors])\n",
                       from_graph_args);
    out += "        ctx.program = program\n";
  }
  out += "        outs, saved = res[:_NUM_OUTPUTS], res[_NUM_OUTPUTS:]\n";
  out += "        ctx.graph = g\n";
  out += "        ctx.out_shapes = [o.shape for o in outs]  # for outputs that get no gradient\n";
  out += "        ctx.save_for_backward(*tensors, *saved)\n";
  out += "        return outs[0] if _NUM_OUTPUTS == 1 else tuple(outs)\n\n";
  out += "    @staticmethod\n";
  out += "    @torch.autograd.function.once_differentiable\n";
  out += "    def backward(ctx, *grads):\n";
  out += "        g = ctx.graph\n";
  out += fmt::format("        stored = ctx.saved_tensors\n        tensors, saved = stored[:{}], stored[{}:]\n", n_t, n_t);
  size_t on_device = 0;  // the first argument that is not a unified input (a CPU tensor)
  for (const TensorDecl* t; on_device < n_in && (t = f.decl.find_input(user_inputs[on_device])) && t->unified;) ++on_device;
  out += fmt::format("        device = tensors[{}].device\n", on_device);
  out += "        d_outs = [torch.zeros(s, device=device, dtype=DTYPE) if d is None else d.contiguous()\n"
         "                  for d, s in zip(grads, ctx.out_shapes)]\n";
  if (!both) {
    out += "        grad_mask = sum(1 << r for r, i in _GRAD_SLOTS if ctx.needs_input_grad[1 + i])  # the kernels compute only these\n";
    out += fmt::format("        res = torch.ops.hectorgen_{}.backward(\n            *_graph_args(g), {}*[t.contiguous() for t in tensors[:_NUM_INPUTS]],\n"
                       "            *saved, *d_outs, *[t.contiguous() for t in tensors[_NUM_INPUTS:]], grad_mask)\n",
                       b.model, from_graph_args);
    out += fmt::format("        result = [None] * {}\n", n_t);
    out += "        for r, i in _GRAD_SLOTS:\n";
    out += "            if ctx.needs_input_grad[1 + i]:\n";
    out += "                result[i] = res[r]\n";
    out += "        return (None, *result)";
    return out;
  }
  out += "        grad_mask = sum(1 << r for r, i in _GRAD_SLOTS[ctx.program] if ctx.needs_input_grad[2 + i])  # the kernels compute only these\n";
  out += fmt::format("        res = _op(ctx.program, \"backward\")(\n            *_graph_args(g, ctx.program), {}*[t.contiguous() for t in tensors[:_NUM_INPUTS]],\n"
                     "            *saved, *d_outs, *[t.contiguous() for t in tensors[_NUM_INPUTS:]], grad_mask)\n",
                     from_graph_args);
  out += fmt::format("        result = [None] * {}\n", n_t);
  out += "        for r, i in _GRAD_SLOTS[ctx.program]:\n";
  out += "            if ctx.needs_input_grad[2 + i]:\n";
  out += "                result[i] = res[r]\n";
  out += "        return (None, None, *result)";
  return out;
}

std::string emit_cmake(const Program& p, const EmitContext& ctx) {
  Vars v = banner_vars(p, ctx);
  v["runtime_version"] = module_runtime_version(p, ctx);
  v["runtime_major"] = std::to_string(HECTORGEN_RUNTIME_VERSION_MAJOR);
  return render_template("cmake/CMakeLists.txt.in", v);
}

std::string emit_manifest(const std::vector<Program>& ir_phases, const EmitContext& ctx) {
  const std::vector<Program> phases = with_cpp_names(ir_phases);
  const Program& p = phases.front();
  nlohmann::ordered_json j;
  j["generator"] = "hectorgen " + ctx.version;
  j["spec"] = ctx.spec_name;
  j["model"] = p.model;
  j["dtype"] = to_string(p.decl.options.dtype);
  j["files"] = {p.model + "_kernels.cu", p.model + "_kernels.h", p.model + "_host.cpp", p.model + ".py",
                "CMakeLists.txt", "manifest.json", p.model + ".inter.ir", p.model + ".intra.ir"};
  const std::vector<Program> vanilla = ctx.auto_materialization ? program_phases(phases, false) : phases;
  if (vanilla.size() > 1) j["files"].push_back(p.model + ".backward.inter.ir");
  if (ctx.auto_materialization) {
    j["files"].push_back(p.model + ".compact.inter.ir");
    if (vanilla.size() > 1) j["files"].push_back(p.model + ".compact.backward.inter.ir");
    const std::set<std::string> layouts = union_layouts(phases);
    j["graph_layouts"] = std::vector<std::string>(layouts.begin(), layouts.end());
  } else {
    j["graph_layouts"] = std::vector<std::string>(p.layouts.begin(), p.layouts.end());
  }
  j["graph_arrays"] = graph_arrays(p);
  if (ctx.auto_materialization) {
    // Both programs: their ops (phases), layouts and graph arrays, and the cost model's coefficients per phase.
    j["materialization"] = "auto";
    for (bool compact : {false, true}) {
      const std::vector<Program> program = program_phases(phases, compact);
      nlohmann::ordered_json x;
      for (const Program& ph : program) x["ops"].push_back(ph.phase);
      x["graph_layouts"] = std::vector<std::string>(program.front().layouts.begin(), program.front().layouts.end());
      x["graph_arrays"] = graph_arrays(program.front());
      for (const Program& ph : program) {
        const PhaseCost cost = phase_cost(ph);
        nlohmann::ordered_json c;
        c["launches"] = cost.launches;
        for (size_t i = 0; i < kCostDomains; ++i) c["bytes_per"][to_string(static_cast<CostDomain>(i))] = cost.bytes[i];
        for (size_t i = 0; i < kCostDomains; ++i) c["gather_rows_per"][to_string(static_cast<CostDomain>(i))] = cost.gather_rows[i];
        for (size_t i = 0; i < kCostDomains; ++i) c["search_rows_per"][to_string(static_cast<CostDomain>(i))] = cost.search_rows[i];
        x["cost"][ph.phase] = c;
      }
      j["programs"][compact ? "compact" : "vanilla"] = x;
    }
  }
  for (const TensorInfo& t : p.tensors) {
    const char* role = t.role == Role::Input ? "input" : t.role == Role::Weight ? "weight" : t.role == Role::Output ? "output"
                       : t.role == Role::Field ? "field" : "intermediate";
    nlohmann::ordered_json x;
    x["name"] = t.name;
    x["role"] = role;
    x["per"] = to_string(t.per);
    x["shape"] = t.shape;
    x["storage"] = to_string(t.storage);
    if (t.zero_init) x["zero_init"] = true;
    if (!t.from_graph.empty()) x["from_graph"] = t.from_graph;
    if (const TensorDecl* d = p.decl.find_input(t.name); d && d->unified) x["placement"] = "unified";
    if (const TensorDecl* d = p.decl.find_input(t.name); d && d->indexed_rows) x["rows"] = "indexed";
    j["tensors"].push_back(x);
  }
  for (const Program& ph : phases)
  for (const auto& k : ph.kernels) {
    nlohmann::ordered_json x;
    x["name"] = intra::kernel_name(k);
    x["phase"] = ph.phase;
    if (auto* gp = std::get_if<intra::GemmInstance>(&k)) {
      const auto& g = *gp;
      x["template"] = "gemm";
      x["rows"] = intra::to_string(g.rows);
      x["x"] = g.x;
      x["w"] = g.w;
      x["y"] = g.y;
      x["gather"] = g.gather == intra::Gather::None ? "none" : g.gather == intra::Gather::Src ? "src" : "dst";
      x["segments"] = g.segments == intra::Segments::None ? "none" : g.segments == intra::Segments::Etype ? "etype" : "ntype";
      x["scatter"] = g.scatter == intra::Gather::None ? (g.accumulate ? "accumulate" : "none") : g.scatter == intra::Gather::Src ? "src_atomic" : "dst_atomic";
      if (g.transpose_w) x["transpose_w"] = true;
      if (!g.row_scalar.empty()) x["row_scalar"] = g.row_scalar;
      x["heads"] = g.heads;
      x["k"] = g.k;
      x["n"] = g.n;
      x["tile"] = g.tile;
      x["coarsen"] = g.coarsen;
      if (g.graph_tiles) x["tiles"] = "graph";
    } else if (auto* w = std::get_if<intra::WeightGradInstance>(&k)) {
      x["template"] = "weight_grad";
      x["dw"] = w->dw;
      x["kernel"] = intra::wgrad_kernel_text(*w);
    } else if (auto* ss = std::get_if<intra::SegmentSumInstance>(&k)) {
      x["template"] = "segment_sum";
      x["dw"] = ss->dw;
    } else if (auto* gs = std::get_if<intra::GatherSumInstance>(&k)) {
      x["template"] = "gather_sum";
      x["csr"] = intra::to_string(gs->csr);
    } else if (auto* t = std::get_if<intra::TorchInstance>(&k)) {
      x["template"] = "pytorch";
      x["rows"] = is_edge_loop(t->loop->loop) ? "edges" : "nodes";
    } else {
      const auto& tr = std::get<intra::TraversalInstance>(k);
      x["template"] = "traversal";
      x["rows"] = tr.rows == LoopKind::Edges ? "edges" : tr.rows == LoopKind::SrcPairs ? "pairs" : "nodes";
      x["threads"] = tr.threads;
    }
    j["kernels"].push_back(x);
  }
  // Names are identifiers (checked by the loader and the verifier); still, never throw on invalid UTF-8.
  return j.dump(2, ' ', true, nlohmann::json::error_handler_t::replace) + "\n";
}

int tc_runtime_minor(const std::vector<Program>& phases) {
  for (const Program& p : phases)
    for (const intra::Kernel& k : p.kernels) {
      if (auto* g = std::get_if<intra::GemmInstance>(&k);
          g && g->tensor_cores && (intra::gemm_widens_weights(p, *g) || g->segments == intra::Segments::None))
        return kTcRuntimeMinor;
      if (auto* w = std::get_if<intra::WeightGradInstance>(&k); w && intra::wgrad_widens(p, *w)) return kTcRuntimeMinor;
    }
  return 0;
}

void emit_all(const std::vector<Program>& phases, const EmitContext& given, OutputSet& out) {
  const Program& p = phases.front();
  EmitContext ctx = given;  // the phases say whether the module holds both programs (also when read from .intra.ir)
  ctx.auto_materialization = ctx.auto_materialization || !program_phases(phases, true).empty();
  ctx.tc_runtime_minor = std::max(ctx.tc_runtime_minor, tc_runtime_minor(phases));
  out.add(p.model + "_kernels.cu", emit_kernels_cu(phases, ctx));
  out.add(p.model + "_kernels.h", emit_kernels_h(phases, ctx));
  out.add(p.model + "_host.cpp", emit_host_cpp(phases, ctx));
  out.add(p.model + ".py", emit_python(phases, ctx));
  out.add("CMakeLists.txt", emit_cmake(p, ctx));
  out.add("manifest.json", emit_manifest(phases, ctx));
  out.add(p.model + ".intra.ir", intra::print_programs(phases));
}

}  // namespace hectorgen::emit
