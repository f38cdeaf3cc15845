// Hygienic names: derived names in the IR (ir/inter/names.h), the emitters' name scopes (emit/names.h), and
// the properties the generated code relies on. tests/names/name_test.py compiles the output for many names.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <tuple>

#include <unistd.h>
#include <set>

#include "dsl/parser.h"
#include "emit/names.h"
#include "emit/templates.h"
#include "helpers.h"
#include "ir/inter/names.h"
#include "ir/inter/ops.h"
#include "ir/inter/printer.h"
#include "ir/inter/verifier.h"
#include "passes/passes.h"

using namespace hectorgen;
using namespace hectorgen::test;
using inter::print_module;
namespace fs = std::filesystem;

namespace {

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) text.replace(at, from.size(), to);
  return text;
}

// Renames the IR name `from` to `to` in printed IR: every identifier or string whose '$'-separated parts
// include `from` (so msg, d$msg and msg$0 follow).
std::string rename_ir(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  size_t i = 0;
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$'; };
  while (i < text.size()) {
    if (!ident(text[i])) {
      out += text[i++];
      continue;
    }
    size_t b = i;
    while (i < text.size() && ident(text[i])) ++i;
    std::string word = text.substr(b, i - b), renamed;
    size_t p = 0;
    while (true) {
      size_t d = word.find('$', p);
      std::string part = word.substr(p, d == std::string::npos ? std::string::npos : d - p);
      renamed += part == from ? to : part;
      if (d == std::string::npos) break;
      renamed += '$';
      p = d + 1;
    }
    out += renamed;
  }
  return out;
}

std::string program_part(const std::string& printed) { return printed.substr(printed.find("program:\n")); }
std::multiset<std::string> header_lines(const std::string& printed) {
  std::multiset<std::string> lines;
  std::istringstream in(printed.substr(0, printed.find("program:\n")));
  for (std::string l; std::getline(in, l);) lines.insert(l);
  return lines;
}

std::optional<passes::TrainingModules> training(const std::string& text) {
  auto c = compile_text("rgat.yaml", text);
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics d;
  auto tm = passes::autodiff(*c->module, d);
  std::ostringstream err;
  d.render(err);
  INFO(err.str());
  REQUIRE(tm);
  return tm;
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("hectorgen-names-" + tag + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Generates `text` into a fresh directory; returns file name -> contents. `trainable`: the backward must exist.
std::map<std::string, std::string> generate(const std::string& tag, const std::string& text, bool trainable = true) {
  TempDir tmp(tag);
  fs::path spec = tmp.path / "spec.yaml";
  std::ofstream(spec, std::ios::binary) << text;
  driver::Options o;
  o.spec_path = spec.string();
  o.out_dir = (tmp.path / "out").string();
  std::ostringstream out, err;
  int code = driver::run(o, out, err);
  INFO(err.str());
  REQUIRE(code == 0);
  CHECK((err.str().find("no backward pass") == std::string::npos) == trainable);
  std::map<std::string, std::string> files;
  for (const auto& f : fs::directory_iterator(tmp.path / "out")) files[f.path().filename().string()] = read_file(f.path().string());
  return files;
}

}  // namespace

// ---- the IR -----------------------------------------------------------------------------------------
TEST_CASE("derived names carry the sigil; fresh names leave the user's namespace", "[names]") {
  CHECK(inter::grad_name("att") == "d$att");
  CHECK(inter::grad_target("d$att") == "att");
  CHECK(inter::grad_target("d_att") == std::nullopt);
  CHECK(inter::version_name("att", 0) == "att$0");
  std::set<std::string> taken{"hs", "hs$2", "t$hs"};
  auto is_taken = [&](const std::string& n) { return taken.count(n) > 0; };
  CHECK(inter::fresh_name("hs", is_taken) == "hs$3");
  CHECK(inter::fresh_name("t$hs", is_taken) == "t$hs_2");
  CHECK(inter::fresh_name("x", is_taken) == "x");
  CHECK(inter::reserved_name_reason("d$att") != "");
  CHECK(inter::reserved_name_reason("__x") != "");
  CHECK(inter::reserved_name_reason("d_att") == "");
  CHECK(inter::reserved_name_reason("att__0") == "");
}

TEST_CASE("the sigil is an error in a spec's program, in names and in field strings", "[names][diagnostics]") {
  const std::string text = read_file(spec_path("rgat.yaml"));
  for (const auto& [from, to, col] : {std::tuple{"e[\"msg\"] = hs", "e[\"d$att\"] = hs", 9},
                                      std::tuple{"hs = reshape(e.src", "h$s = reshape(e.src", 7}}) {
    CAPTURE(to);
    auto c = compile_text("rgat.yaml", replace(text, from, to));
    REQUIRE_FALSE(c->module);
    const Diagnostic& d = c->diags.all().front();
    CHECK(d.kind == "reserved-name");
    CHECK(d.loc.col == col);
  }
  auto c = compile_text("rgat.yaml", replace(text, "model: rgat", "model: rg$at"));
  REQUIRE_FALSE(c->module);
  CHECK(c->diags.all().front().kind == "reserved-name");
}

// The cases: user fields named like what autodiff and lowering derive. Before, `d_att` made the
// gradient field and the saved activation one tensor; `t_hs`, `d_feature`, `d_W` were internal errors and
// `att__0` dropped the backward. Now the backward is the original's, renamed, and matches finite differences.
TEST_CASE("autodiff of user fields named like gradients, versions and temporaries", "[names][autodiff]") {
  const std::string original = read_file(spec_path("rgat.yaml"));
  auto base = training(original);
  const std::string base_bw = print_module(base->backward), base_fw = print_module(base->forward);
  for (const char* name : {"d_att", "t_hs", "d_feature", "d_W", "att__0", "d_msg", "msg__0", "d_h", "hs_2"}) {
    CAPTURE(name);
    std::string text = replace_all(original, "\"msg\"", std::string("\"") + name + "\"");
    auto tm = training(text);
    const std::string bw = print_module(tm->backward), fw = print_module(tm->forward);
    CHECK(program_part(bw) == rename_ir(program_part(base_bw), "msg", name));
    CHECK(header_lines(bw) == header_lines(rename_ir(base_bw, "msg", name)));
    CHECK(program_part(fw) == rename_ir(program_part(base_fw), "msg", name));
    std::set<std::string> renamed_saved;
    for (const std::string& s : base->saved) renamed_saved.insert(rename_ir(s, "msg", name));
    CHECK(std::set<std::string>(tm->saved.begin(), tm->saved.end()) == renamed_saved);
    Diagnostics d;
    CHECK(inter::verify(tm->backward, d));
  }
  // A local named like lowering's temporary of another local, and a field named like a version.
  std::string text = std::regex_replace(replace_all(original, "\"att\"", "\"att__0\""), std::regex("\\bht\\b"), "t_hs");
  auto tm = training(text);
  CHECK(program_part(print_module(tm->backward)) ==
        rename_ir(rename_ir(program_part(base_bw), "ht", "t_hs"), "att", "att__0"));
}

TEST_CASE("an output read by the program gets the gradient of those reads too", "[names][autodiff]") {
  // n["y"] = n["h"] * 2 reads the output h: the gradient reaching h is d$h plus what flows back from y.
  std::string text = replace(read_file(spec_path("rgcn.yaml")), "  h: {per: node, shape: [out_dim]}",
                             "  h: {per: node, shape: [out_dim]}\n  y: {per: node, shape: [out_dim]}");
  text += "  for n in g.dst_nodes():\n      n[\"y\"] = n[\"h\"] * 2.0\n";
  auto c = compile_text("rgcn.yaml", text);
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics d;
  auto tm = passes::autodiff(*c->module, d);
  REQUIRE(tm);
  const std::string bw = print_module(tm->backward);
  INFO(bw);
  CHECK(bw.find("n[\"d$h$reads\"] += n.d$y * 2.0") != std::string::npos);
  CHECK(bw.find("n.d$h + n[\"d$h$reads\"]") != std::string::npos);
}

TEST_CASE("the printed training IR with derived names parses back byte-identically", "[names][roundtrip]") {
  std::string text = replace_all(read_file(spec_path("rgat.yaml")), "\"msg\"", "\"d_att\"");
  auto tm = training(text);
  for (const inter::Module* m : {&tm->forward, &tm->backward}) {
    std::string printed = print_module(*m);
    SourceFile f("<ir>", printed);
    dsl::ProgramText pt{printed, &f, {}, {}};
    Diagnostics d;
    auto back = dsl::parse_module(pt, d);
    std::ostringstream err;
    d.render(err);
    INFO(err.str());
    REQUIRE(back);
    CHECK(print_module(*back) == printed);
  }
}

TEST_CASE("inlined function locals and loop variables do not capture the caller's", "[names]") {
  // f's local x, called inside the caller's loop that has its own x: inlined as x$1.
  std::string text = replace(read_file(spec_path("rgcn.yaml")), "program: |\n",
                             "program: |\n  def f(g, field):\n      x = e.src.feature * W0\n      e[field] = x\n");
  text = replace(text, "          n[\"h\"] += e.norm * (e.src.feature * W[e.etype])",
                 "          x = e.norm\n          f(g, \"m\")\n          n[\"h\"] += x * e[\"m\"]");
  auto c = compile_text("rgcn.yaml", text);
  INFO(c->rendered());
  REQUIRE(c->module);
  std::string printed = print_module(*c->module);
  INFO(printed);
  CHECK(printed.find("x$1 = e.src.feature * W0") != std::string::npos);
  CHECK(printed.find("e[\"m\"] = x$1") != std::string::npos);
  CHECK(printed.find("n[\"h\"] += x * e[\"m\"]") != std::string::npos);
}

// ---- the name scopes ----------------------------------------------------------------------------------
TEST_CASE("a name scope keeps free names, mangles reserved and taken ones, deterministically", "[names]") {
  const std::set<std::string>& cpp = emit::cpp_reserved();
  for (const char* r : {"float", "class", "lambda", "threadIdx", "atomicAdd", "lane", "first_row", "row_stride",
                        "partial", "options", "device", "stream", "guard", "a", "src", "num_nodes", "linux", "Tensor"})
    CHECK(cpp.count(r));
  for (const char* free : {"att", "msg", "feature", "W", "h", "hs", "d_att", "t_hs", "att__0", "x", "y"}) CHECK_FALSE(cpp.count(free));
  emit::NameScope s(cpp);
  CHECK(s.get("tensor", "att") == "att");
  CHECK(s.get("tensor", "d$att") == "d_att");
  CHECK(s.get("tensor", "att$0") == "att__0");
  CHECK(s.get("tensor", "float") == "float_");
  CHECK(s.get("tensor", "t_hs") == "t_hs");
  CHECK(s.get("tensor", "t$hs") == "t_hs_");
  CHECK(s.get("tensor", "t_hs_") == "t_hs__");
  CHECK(s.get("tensor", "t$hs_") == "t_hs__2");
  CHECK(s.get("loop", "att") == "att_");  // another namespace, another identifier
  CHECK(s.get("tensor", "d$att") == "d_att");  // stable
  CHECK(s.fresh("v0") == "v0");
  CHECK(s.fresh("v0") == "v0_");
  CHECK(emit::NameScope::spell("t$lin_3") == "t_lin_3");
}

TEST_CASE("a kernel's name brings its launcher's and workspaces' names: all free, all reserved", "[names]") {
  const std::set<std::string> reserved{"float"};
  emit::NameScope s(reserved);
  const std::vector<std::string> derived{"launch_{}", "{}_partial", "{}_chunk_ptr"};
  CHECK(s.get("tensor", "k_partial") == "k_partial");  // a user's tensor takes a look-alike first
  CHECK(s.get("kernel", "k", derived) == "k_");         // so the kernel and everything derived from it move
  for (const char* taken : {"k_", "launch_k_", "k__partial", "k__chunk_ptr"}) CHECK_FALSE(s.available(taken));
  CHECK(s.available("launch_k"));
  CHECK(s.get("kernel", "k", derived) == "k_");  // stable
  CHECK(s.get("tensor", "k__chunk_ptr") == "k__chunk_ptr_");  // a later name avoids the derived ones
  CHECK(s.get("kernel", "float", derived) == "float_");
  CHECK(emit::workspace_name("m_bw_wgrad_d_W", "partial") == "m_bw_wgrad_d_W_partial");
  CHECK(emit::launcher_name("m_bw_wgrad_d_W") == "launch_m_bw_wgrad_d_W");
}

TEST_CASE("identifiers of a text skip comments, strings and holes, and keep f-string expressions", "[names]") {
  using emit::Lang;
  auto cpp = emit::identifiers("// comment word\nconst int x = f(\"str\", y); /* c */ $hole$ a.b; p->q; at::zeros\n#pragma unroll\n",
                               Lang::Cpp, false);
  CHECK(cpp == std::set<std::string>{"const", "int", "x", "f", "y", "a", "p", "at"});
  auto py = emit::identifiers("x = f\"{name!r} and {y}\"  # note\ns = 'z' + \"\"\"doc w\"\"\"\nobj.attr\n", Lang::Python, false);
  CHECK(py == std::set<std::string>{"x", "name", "r", "y", "s", "obj"});
  CHECK(emit::attribute_names("self.W = 1\ng.num_nodes\ntorch.empty\nclass G:\n    perm: int\n", {"self", "g"}, true) ==
        std::set<std::string>{"W", "num_nodes", "perm"});
  CHECK(emit::attribute_names("self.W = 1\ng.num_nodes\nclass G:\n    perm: int\n", {"self"}, false) == std::set<std::string>{"W"});
}

TEST_CASE("Python names: public names keep their spelling where Python allows it", "[names]") {
  inter::ModelDecl d;
  d.name = "prepare_graph";  // a function of the module: the class Prepare_graph is free
  auto tensor = [](const char* name, const char* from_graph = "") {
    inter::TensorDecl t;
    t.name = name;
    t.from_graph = from_graph;
    return t;
  };
  for (const char* n : {"g", "self", "torch", "lambda", "feature"}) d.inputs.push_back(tensor(n));
  d.inputs.push_back(tensor("torch_norm", "inv_relation_in_degree"));  // read from the graph: no Python name
  for (const char* n : {"W", "forward", "cuda", "options", "num_nodes"}) d.weights.push_back(tensor(n));
  emit::PythonNames py = emit::python_names(d);
  CHECK(py.model_class == "Prepare_graph");
  inter::ModelDecl hyper_model;
  hyper_model.name = "hYPER";  // its class would be HYPER, a global of the module
  CHECK(emit::python_names(hyper_model).model_class == "HYPER_");
  CHECK(py.param.at("feature") == "feature");
  CHECK(py.param.at("g") == "g_");
  CHECK(py.param.at("self") == "self_");
  CHECK(py.param.at("torch") == "torch_");
  CHECK(py.param.at("lambda") == "lambda_");
  CHECK(py.attr.at("W") == "W");
  CHECK(py.attr.at("options") == "options");  // self.options is fine
  CHECK(py.attr.at("forward") == "forward_");  // nn.Module.forward
  CHECK(py.attr.at("cuda") == "cuda_");
  CHECK(py.attr.at("num_nodes") == "num_nodes");  // an attribute of the graph, not of the module
  CHECK_FALSE(py.param.count("torch_norm"));
}

TEST_CASE("names no generated module can carry are positioned reserved-name errors", "[names][diagnostics]") {
  const std::string text = read_file(spec_path("rgcn.yaml"));
  struct Case {
    const char* from;
    const char* to;
    int line, col;
  };
  const Case cases[] = {
      {"model: rgcn", "model: class", 4, 1},       // a Python keyword: class.py cannot be imported
      {"model: rgcn", "model: torch", 4, 1},       // torch.py would shadow torch
      {"model: rgcn", "model: json", 4, 1},        // and json.py the standard library's json
      {"  in_dim: 64", "  in_dim: 64\n  device: 2", 7, 3},  // Rgcn(num_etypes, num_ntypes, device, dtype, ...)
      {"  W0: {per: none", "  for: {per: none", 13, 3},  // the program could not name it
      {"  in_dim: 64", "  in_dim: 64\n  g: 2", 7, 3},  // g is the graph
      {"  W0: {per: none", "  __W0: {per: none", 13, 3},
  };
  for (const Case& k : cases) {
    CAPTURE(k.to);
    auto c = compile_text("rgcn.yaml", replace(text, k.from, k.to));
    REQUIRE_FALSE(c->module);
    const Diagnostic& d = c->diags.all().front();
    CHECK(d.kind == "reserved-name");
    CHECK(d.loc.line == k.line);
    CHECK(d.loc.col == k.col);
  }
}

// ---- the generated code ---------------------------------------------------------------------------------
// Every identifier the emitters print that does not come from a user name must be reserved, else a user name
// could take it: generate the bundled models with every user name prefixed zq_ and look at the rest.
TEST_CASE("the emitters print no fixed identifier that is not reserved", "[names]") {
  const std::set<std::string> dsl_words = {"model", "hyper", "inputs", "weights", "outputs", "options", "program",
                                           "per", "shape", "node", "edge", "etype", "ntype", "none", "from_graph",
                                           "requires_grad", "inv_relation_in_degree", "false", "true", "materialization",
                                           "vanilla", "reorder", "off", "dtype", "fp32", "schedule", "gemm", "tile",
                                           "coarsen", "traversal", "threads", "init", "glorot", "ones", "zeros",
                                           "for", "in", "def", "g", "edges", "dst_nodes", "src_nodes", "nodes",
                                           "incoming_edges", "outgoing_edges", "src", "dst", "auto",
                                           "compact_relations"};
  // Derived and numbered names the scopes allocate: the emitters' temporaries v0, v1, ... and lowering's
  // tensors of its own locals (t$wg0, t$lin_3).
  // Registers lower-traversal names after the lowering's locals ($lin_3, $wg0, $scatter) and operands
  // (leakyrelu_in): bind() keeps them distinct from every name visible in the kernel, the C++ names of the
  // tensors included (emit/names.cpp).
  const std::regex allocated(
      "v[0-9]+_?|t_(lin_|wg|sc|op)[0-9]+(_[0-9]+)?|[en]|i_[en]|(lin_|op|sc|wg)[0-9]+(_[0-9]+)?|scatter(_[0-9]+)?|"
      "leakyrelu_in(_[0-9]+)?|"
      // a fetched edge loop's block, lane and fetched indices, its batches and, with rows in step, its walk (the
      // loop's names plus a suffix, made unique in the kernel by the traversal printer's unique_name)
      "(i_[en]|[en](_[a-z0-9]+)*)_(first|end|count|j|lane|j0|u|live|batch|begin|todo|done|steps)_*");
  // Kernels of these templates take fixed parameters only: no user name enters them.
  std::set<std::string> kernel_templates;
  for (const char* t : {"cuda/gemm.cu.in", "cuda/gather_sum.cu.in", "cuda/gather_sum_split.cu.in"})
    kernel_templates.merge(emit::identifiers(emit::embedded_templates().find(t)->second, emit::Lang::Cpp));
  // ... nor the row ranges emit/cuda.cpp substitutes into them, nor the warp_sum helper (its own parameter).
  kernel_templates.insert({"head", "tile", "tile_ptr", "seg_ptr", "lo", "hi", "mid", "type", "row", "row_scalar", "row_begin",
                           "row_end", "num_segments", "v", "offset", "x_row", "entry_scale", "scale", "from_row", "lane_x_row",
                           "lane_scale",
                           // the gather sum's row and entry loops (emit_gathersum prints them into the template)
                           "first", "end", "count", "begin", "todo", "done", "steps", "old"});
  // The bundled models, and an untrainable one (its module refuses requires_grad: other fixed names):
  // rgat_concat_outer with its attention through leakyrelu_grad, an operator without a derivative rule.
  const std::string untrainable = std::string(HECTORGEN_SOURCE_DIR) + "/tests/specs/rgat_concat_outer.yaml";
  // And a materialization: auto module (both programs, the choice and the cost tables).
  const std::string both = std::string(HECTORGEN_SOURCE_DIR) + "/tests/specs/rgcn_auto.yaml";
  for (const std::string& path : {spec_path("rgcn.yaml"), spec_path("rgat.yaml"), spec_path("hgt.yaml"), untrainable, both}) {
    const std::string spec = fs::path(path).filename().string();
    CAPTURE(spec);
    std::string text = read_file(path);
    if (path == untrainable) text = replace_all(text, "leakyrelu(", "leakyrelu_grad(");
    // The user's names: every identifier of the text that is not the spec's or the language's vocabulary.
    std::set<std::string> user;
    std::regex word("[A-Za-z_][A-Za-z0-9_]*");
    std::string body;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);)
      if (l.find('#') == std::string::npos || l.find('#') > l.find_first_not_of(' ')) body += l.substr(0, l.find('#')) + "\n";
    for (auto it = std::sregex_iterator(body.begin(), body.end(), word); it != std::sregex_iterator(); ++it) {
      std::string w = it->str();
      if (!dsl_words.count(w) && !inter::call_op(w) && !std::isdigit(static_cast<unsigned char>(w[0])))
        user.insert(w);
    }
    std::string renamed = body;
    for (const std::string& u : user) renamed = std::regex_replace(renamed, std::regex("\\b" + u + "\\b"), "zq_" + u);
    // fp32 (SIMT GEMMs) and tf32 (tensor-core launchers and their workspaces)
    REQUIRE(renamed.find("dtype: fp32") != std::string::npos);
    auto files = generate("zq-" + spec, renamed, path != untrainable);
    REQUIRE(files.size() >= 6);
    for (const auto& [name, content] : generate("zq-" + spec, replace_all(renamed, "dtype: fp32", "dtype: tf32"), path != untrainable))
      files.emplace("tf32/" + name, content);
    for (const auto& [name, content] : files) {
      bool py = name.size() > 3 && name.substr(name.size() - 3) == ".py";
      bool cpp = name.find(".cu") != std::string::npos || name.find(".h") != std::string::npos ||
                 name.find(".cpp") != std::string::npos;
      if (!py && !cpp) continue;
      CAPTURE(name);
      const std::set<std::string>& reserved = py ? emit::python_reserved() : emit::cpp_reserved();
      for (const std::string& id : emit::identifiers(content, py ? emit::Lang::Python : emit::Lang::Cpp, false)) {
        if (id.find("zq") != std::string::npos || id.find("Zq") != std::string::npos || id.rfind("__", 0) == 0 ||
            std::regex_match(id, allocated) || reserved.count(id) || kernel_templates.count(id))
          continue;
        FAIL_CHECK("generated identifier '" << id << "' is not reserved: a user name could take it");
      }
    }
  }
}
