// Emission of everything around the kernels: libtorch host stubs, the Python module, the extension's
// CMakeLists.txt and manifest.json.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "emit/emit.h"
#include "emit/printer.h"
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
  }
  return "";
}

std::string shape_list(const TensorInfo& t) {
  std::string s = rows_of(t.per);
  for (int64_t d : t.shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "{" + s + "}";
}

std::string graph_array_rows(const std::string& g) {
  if (g == "etype_ptr" || g == "etype_tile_ptr") return "num_etypes + 1";
  if (g == "ntype_ptr" || g == "ntype_tile_ptr") return "num_ntypes + 1";
  if (g == "in_ptr" || g == "out_ptr") return "num_nodes + 1";
  if (g == "ntype") return "num_nodes";
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

}  // namespace

std::string emit_host_cpp(const Program& p, const EmitContext& ctx) {
  Vars v;
  v["version"] = ctx.version;
  v["spec"] = ctx.spec_name;
  v["model"] = p.model;
  v["Model"] = capitalize(p.model);
  std::vector<std::string> params, schema;
  for (const std::string& g : graph_arrays(p)) {
    params.push_back("const at::Tensor& " + g);
    schema.push_back("Tensor " + g);
  }
  for (const char* n : {"num_nodes", "num_edges", "num_etypes", "num_ntypes"}) {
    params.push_back(fmt::format("int64_t {}", n));
    schema.push_back(fmt::format("int {}", n));
  }
  auto tensors = op_tensors(p);
  for (const TensorDecl* t : tensors) {
    params.push_back("const at::Tensor& " + t->name);
    schema.push_back("Tensor " + t->name);
  }
  std::string plist;
  for (size_t i = 0; i < params.size(); ++i) plist += "    " + params[i] + (i + 1 < params.size() ? ",\n" : "");
  v["params"] = plist;
  std::string sch;
  for (size_t i = 0; i < schema.size(); ++i) sch += (i ? ", " : "") + schema[i];
  v["schema"] = sch;
  // The device and options of the results follow the first user input (else the first tensor argument).
  std::string device_from = tensors.empty() ? graph_arrays(p).front() : tensors.front()->name;
  for (const TensorDecl* t : tensors)
    if (t->from_graph.empty()) {
      device_from = t->name;
      break;
    }
  v["first_input"] = device_from;
  std::string checks;
  for (const std::string& g : graph_arrays(p))
    checks += fmt::format("  check({}, \"graph array '{}'\", at::kInt, {{{}}}, device);\n", g, g, graph_array_rows(g));
  for (const TensorDecl* t : tensors) {
    const TensorInfo* ti = p.find(t->name);
    checks += fmt::format("  check({}, \"{} '{}'\", at::kFloat, {}, device);\n", t->name,
                          ti->role == Role::Weight ? "weight" : "input", t->name, shape_list(*ti));
  }
  v["checks"] = checks.substr(0, checks.size() - 1);
  std::string alloc, meta, assign, outs;
  for (const TensorInfo& t : p.tensors) {
    if (t.role == Role::Input || t.role == Role::Weight) continue;
    alloc += fmt::format("  at::Tensor {} = at::{}({}, options);{}\n", t.name, t.zero_init ? "zeros" : "empty", shape_list(t),
                         t.role == Role::Output ? "" : t.role == Role::Field ? "  // field" : "  // intermediate");
    if (t.role == Role::Output) {
      meta += fmt::format("  at::Tensor {} = at::empty({}, {}.options());\n", t.name, shape_list(t), v["first_input"]);
      outs += (outs.empty() ? "" : ", ") + t.name;
    }
  }
  v["allocations"] = alloc.substr(0, alloc.size() - 1);
  v["meta_allocations"] = meta.substr(0, meta.size() - 1);
  for (const std::string& g : graph_arrays(p)) assign += fmt::format("  a.{} = {}.data_ptr<int32_t>();\n", g, g);
  for (const TensorInfo& t : p.tensors) assign += fmt::format("  a.{} = {}.data_ptr<float>();\n", t.name, t.name);
  v["assignments"] = assign.substr(0, assign.size() - 1);
  v["outputs"] = outs;
  std::string launches;
  for (const auto& k : p.kernels) {
    if (k.kind == intra::Kernel::Kind::Torch) launches += emit_torch_block(p, k.trav);
    else launches += fmt::format("  C10_CUDA_CHECK(launch_{}(a, stream));\n", k.name());
  }
  v["launches"] = launches.substr(0, launches.size() - 1);
  return render_template("host/host.cpp.in", v);
}

std::string emit_python(const Program& p, const EmitContext& ctx) {
  Vars v;
  v["version"] = ctx.version;
  v["spec"] = ctx.spec_name;
  v["model"] = p.model;
  v["Model"] = capitalize(p.model);
  bool ntype = p.layouts.count(intra::layout::kNtypePtr) > 0;
  v["ntype_args_doc"] = ntype ? ", ntype=ntype, num_ntypes=T" : "";
  v["ctor_doc"] = ntype ? ", num_ntypes=T" : "";
  std::vector<std::string> user_inputs, weights;
  for (const auto& t : p.decl.inputs)
    if (t.from_graph.empty()) user_inputs.push_back(t.name);
  for (const auto& t : p.decl.weights) weights.push_back(t.name);
  auto join = [](const std::vector<std::string>& xs, const std::string& sep) {
    std::string s;
    for (size_t i = 0; i < xs.size(); ++i) s += (i ? sep : "") + xs[i];
    return s;
  };
  v["input_names"] = join(user_inputs, ", ");
  std::string dims;
  for (const auto& h : p.decl.hyper) dims += (dims.empty() ? "" : ", ") + fmt::format("{}={}", h.name, h.is_integer ? fmt::format("{}", static_cast<long long>(h.value)) : fmt::format("{}", h.value));
  v["dims_doc"] = dims;
  std::vector<std::string> layouts(p.layouts.begin(), p.layouts.end());
  std::string lay;
  for (const auto& l : layouts) lay += fmt::format("\"{}\", ", l);
  v["layouts"] = lay;
  std::string arr;
  for (const auto& g : graph_arrays(p)) arr += fmt::format("\"{}\", ", g);
  v["graph_arrays"] = arr;
  int tile = 16;
  for (const auto& k : p.kernels)
    if (k.kind == intra::Kernel::Kind::Gemm) tile = k.gemm.tile;
  v["tile"] = std::to_string(tile);
  // Arrays from the runtime's result keys.
  static const std::map<std::string, std::string> kKeys = {
      {"src", "sorted_src"}, {"dst", "sorted_dst"}, {"etype", "sorted_etype"}, {"etype_ptr", "etype_ptr"},
      {"in_ptr", "in_row_ptr"}, {"in_eid", "in_col_eid"}, {"in_src", "in_col_src"},
      {"out_ptr", "out_row_ptr"}, {"out_eid", "out_col_eid"}, {"out_dst", "out_col_dst"}, {"ntype_ptr", "ntype_ptr"}};
  std::string setup;
  for (const auto& g : graph_arrays(p)) {
    if (g == "etype_tile_ptr") setup += "    a[\"etype_tile_ptr\"] = _tile_ptr(got[\"etype_ptr\"])\n";
    else if (g == "ntype_tile_ptr") setup += "    a[\"ntype_tile_ptr\"] = _tile_ptr(got[\"ntype_ptr\"])\n";
    else if (g == "ntype") setup += "    a[\"ntype\"] = ntype.to(torch.int32).contiguous()\n";
    else setup += fmt::format("    a[\"{}\"] = got[\"{}\"]\n", g, kKeys.at(g));
  }
  v["array_setup"] = setup.substr(0, setup.size() - 1);
  std::string gfields, gvalues, from_graph_args;
  for (const auto& t : p.decl.inputs)
    if (!t.from_graph.empty()) {
      gfields += fmt::format("    {}: torch.Tensor = None  # {} (edge-type-sorted order)\n", t.name, t.from_graph);
      gvalues += fmt::format(", got[\"{}\"]", t.from_graph);
      from_graph_args += fmt::format("g.{}, ", t.name);
    }
  v["graph_fields"] = gfields;
  v["graph_values"] = gvalues;
  std::vector<std::string> fn_params{"g"};
  fn_params.insert(fn_params.end(), user_inputs.begin(), user_inputs.end());
  fn_params.insert(fn_params.end(), weights.begin(), weights.end());
  v["fn_params"] = join(fn_params, ", ");
  std::string perm;
  for (const auto& t : p.decl.inputs)
    if (t.from_graph.empty() && t.per == Per::Edge)
      perm += fmt::format("    {0} = {0}.index_select(0, g.perm)  # edge rows in edge-type-sorted order\n", t.name);
  v["edge_input_perm"] = perm;
  std::vector<std::string> op_args;
  for (const auto& t : p.decl.inputs)
    if (!t.from_graph.empty()) op_args.push_back("g." + t.name);
  for (const auto& n : user_inputs) op_args.push_back(n + ".contiguous()");
  for (const auto& n : weights) op_args.push_back(n + ".contiguous()");
  v["op_args"] = join(op_args, ", ");
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
    wdoc += (wdoc.empty() ? "" : ", ") + fmt::format("{} [{}]", w.name, join(dims, ", "));
    std::string tuple = dims.size() == 1 ? dims[0] + "," : join(dims, ", ");
    init += fmt::format("        self.{} = torch.nn.Parameter(torch.empty(({}), device=device, dtype=dtype))\n", w.name, tuple);
    if (w.init == "ones") reset += fmt::format("        torch.nn.init.ones_(self.{})\n", w.name);
    else if (w.init == "zeros") reset += fmt::format("        torch.nn.init.zeros_(self.{})\n", w.name);
    else {
      int64_t fan_in = w.shape.size() >= 2 ? w.shape[w.shape.size() - 2] : 1, fan_out = w.shape.empty() ? 1 : w.shape.back();
      reset += fmt::format("        torch.nn.init.uniform_(self.{}, -{:.6f}, {:.6f})  # Glorot: fan_in {}, fan_out {}\n", w.name,
                           std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)), std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)),
                           fan_in, fan_out);
    }
  }
  v["weights_doc"] = wdoc;
  v["params_init"] = init.substr(0, init.size() - 1);
  v["reset"] = reset.substr(0, reset.size() - 1);
  std::vector<std::string> wargs;
  for (const auto& n : weights) wargs.push_back("self." + n);
  v["weight_args"] = join(wargs, ", ");
  (void)from_graph_args;
  return render_template("python/module.py.in", v);
}

std::string emit_cmake(const Program& p, const EmitContext& ctx) {
  Vars v;
  v["version"] = ctx.version;
  v["spec"] = ctx.spec_name;
  v["model"] = p.model;
  return render_template("cmake/CMakeLists.txt.in", v);
}

std::string emit_manifest(const Program& p, const EmitContext& ctx) {
  nlohmann::ordered_json j;
  j["generator"] = "hectorgen " + ctx.version;
  j["spec"] = ctx.spec_name;
  j["model"] = p.model;
  j["files"] = {p.model + "_kernels.cu", p.model + "_kernels.h", p.model + "_host.cpp", p.model + ".py",
                "CMakeLists.txt", "manifest.json", p.model + ".inter.ir", p.model + ".intra.ir"};
  j["graph_layouts"] = std::vector<std::string>(p.layouts.begin(), p.layouts.end());
  j["graph_arrays"] = graph_arrays(p);
  for (const TensorInfo& t : p.tensors) {
    const char* role = t.role == Role::Input ? "input" : t.role == Role::Weight ? "weight" : t.role == Role::Output ? "output"
                       : t.role == Role::Field ? "field" : "intermediate";
    nlohmann::ordered_json x;
    x["name"] = t.name;
    x["role"] = role;
    x["per"] = to_string(t.per);
    x["shape"] = t.shape;
    if (t.zero_init) x["zero_init"] = true;
    if (!t.from_graph.empty()) x["from_graph"] = t.from_graph;
    j["tensors"].push_back(x);
  }
  for (const auto& k : p.kernels) {
    nlohmann::ordered_json x;
    x["name"] = k.name();
    if (k.kind == intra::Kernel::Kind::Gemm) {
      const auto& g = k.gemm;
      x["template"] = "gemm";
      x["rows"] = g.edge_rows ? "edges" : "nodes";
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
    } else {
      x["template"] = "traversal";
      x["rows"] = is_edge_loop(k.trav.loop->loop) ? "edges" : "nodes";
      x["threads"] = k.trav.threads;
    }
    j["kernels"].push_back(x);
  }
  return j.dump(2) + "\n";
}

void emit_all(const Program& p, const EmitContext& ctx, driver::OutputSet& out) {
  out.add(p.model + "_kernels.cu", emit_kernels_cu(p, ctx));
  out.add(p.model + "_kernels.h", emit_kernels_h(p, ctx));
  out.add(p.model + "_host.cpp", emit_host_cpp(p, ctx));
  out.add(p.model + ".py", emit_python(p, ctx));
  out.add("CMakeLists.txt", emit_cmake(p, ctx));
  out.add("manifest.json", emit_manifest(p, ctx));
  out.add(p.model + ".intra.ir", intra::print_program(p));
}

}  // namespace hectorgen::emit
