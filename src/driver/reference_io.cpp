#include "driver/reference_io.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "support/output.h"
#include "ir/inter/interpreter.h"
#include "ir/inter/verifier.h"
#include "passes/passes.h"

namespace hectorgen::driver {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Reads one tensor listed in a meta.json section ({"shape": [...], "file": "x.f64"}).
std::string read_tensor(const fs::path& dir, const std::string& name, const json& t, inter::Tensor64& x) {
  x.shape = t.at("shape").get<std::vector<int64_t>>();
  x.data.resize(static_cast<size_t>(x.numel()));
  std::ifstream f(dir / t.at("file").get<std::string>(), std::ios::binary);
  f.read(reinterpret_cast<char*>(x.data.data()), static_cast<std::streamsize>(x.data.size() * sizeof(double)));
  if (!f) return fmt::format("cannot read {} values of '{}'", x.data.size(), name);
  return "";
}

std::string write_tensor(const fs::path& out, const std::string& file, const inter::Tensor64& t) {
  std::string bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(double));
  return write_file_atomically((out / file).string(), bytes);
}

// The backward program of autodiff() on the training forward's saved fields and the given output gradients.
// Its declarations pair with the forward's by position (autodiff's contract, see passes.h): its extra
// inputs are the saved fields, then one gradient per forward output; its outputs are the gradients of the
// forward inputs that require grad (not from_graph), then of the weights that do.
std::string run_backward(const inter::Module& m, const inter::HeteroGraph& g, const inter::TensorMap& tensors,
                         const json& output_grads, const fs::path& dir, const fs::path& out, json& result) {
  Diagnostics diags;
  std::optional<passes::TrainingModules> training = passes::autodiff(m, diags);
  if (!training) {
    std::string why;
    for (const auto& d : diags.all()) why += (why.empty() ? "" : "; ") + d.message;
    return "no backward pass: " + (why.empty() ? std::string("autodiff failed") : why);
  }
  inter::InterpretResult fw = inter::interpret(training->forward, g, tensors);
  if (!fw.ok) return "training forward: " + fw.error;
  inter::TensorMap bt = tensors;
  std::set<std::string> saved(training->saved.begin(), training->saved.end());
  for (const std::string& name : training->saved) {
    auto it = fw.fields.find(name);
    if (it == fw.fields.end()) return fmt::format("the training forward wrote no field '{}' for the backward", name);
    bt[name] = it->second;
  }
  std::vector<const inter::TensorDecl*> grad_inputs;
  for (const inter::TensorDecl& d : training->backward.decl.inputs)
    if (!m.decl.find_input(d.name) && !saved.count(d.name)) grad_inputs.push_back(&d);
  if (grad_inputs.size() != m.decl.outputs.size())
    return fmt::format("the backward takes {} output gradient(s), the model has {} output(s)", grad_inputs.size(),
                       m.decl.outputs.size());
  for (const auto& [name, _] : output_grads.items())
    if (!m.decl.find_output(name)) return fmt::format("output_grads: '{}' is not an output", name);
  for (size_t i = 0; i < grad_inputs.size(); ++i) {
    const std::string& out_name = m.decl.outputs[i].name;
    inter::Tensor64 x;
    if (output_grads.contains(out_name)) {
      if (std::string e = read_tensor(dir, out_name, output_grads.at(out_name), x); !e.empty()) return e;
    } else {
      x = inter::Tensor64::zeros(inter::full_shape(m.decl.outputs[i], g));
    }
    bt[grad_inputs[i]->name] = std::move(x);
  }
  std::vector<const inter::TensorDecl*> wrt;
  for (const inter::TensorDecl& d : m.decl.inputs)
    if (d.requires_grad && d.from_graph.empty()) wrt.push_back(&d);
  for (const inter::TensorDecl& d : m.decl.weights)
    if (d.requires_grad) wrt.push_back(&d);
  const auto& grads = training->backward.decl.outputs;
  if (grads.size() != wrt.size())
    return fmt::format("the backward computes {} gradient(s), the model has {} tensor(s) that require grad",
                       grads.size(), wrt.size());
  inter::InterpretResult bw = inter::interpret(training->backward, g, bt);
  if (!bw.ok) return "backward: " + bw.error;
  fs::create_directories(out / "grad");
  for (size_t i = 0; i < grads.size(); ++i) {
    const inter::Tensor64& t = bw.outputs.at(grads[i].name);
    if (t.shape != inter::full_shape(*wrt[i], g))
      return fmt::format("gradient '{}' has shape {}, '{}' has {}", grads[i].name, inter::shape_str(t.shape),
                         wrt[i]->name, inter::shape_str(inter::full_shape(*wrt[i], g)));
    std::string file = "grad/" + wrt[i]->name + ".f64";
    if (std::string e = write_tensor(out, file, t); !e.empty()) return e;
    result["gradients"][wrt[i]->name] = {{"shape", t.shape}, {"file", file}};
  }
  return "";
}

}  // namespace

std::string run_reference(const inter::Module& m, const std::string& dir) {
  try {
    std::ifstream in(fs::path(dir) / "meta.json");
    if (!in) return fmt::format("cannot read '{}/meta.json'", dir);
    json meta = json::parse(in);
    inter::HeteroGraph g;
    g.num_nodes = meta.at("num_nodes").get<int64_t>();
    g.num_ntypes = meta.value("num_ntypes", 1);
    g.num_etypes = meta.at("num_etypes").get<int>();
    g.src = meta.at("src").get<std::vector<int64_t>>();
    g.dst = meta.at("dst").get<std::vector<int64_t>>();
    g.etype = meta.at("etype").get<std::vector<int>>();
    g.ntype = meta.contains("ntype") ? meta.at("ntype").get<std::vector<int>>() : std::vector<int>(g.num_nodes, 0);
    inter::TensorMap tensors;
    for (const auto& [name, t] : meta.at("tensors").items()) {
      inter::Tensor64 x;
      if (std::string e = read_tensor(dir, name, t, x); !e.empty()) return e;
      tensors[name] = std::move(x);
    }
    inter::InterpretResult r = inter::interpret(m, g, tensors);
    if (!r.ok) return r.error;
    fs::path out = fs::path(dir) / "out";
    fs::create_directories(out);
    json result;
    for (const auto& [name, t] : r.outputs) {
      if (std::string e = write_tensor(out, name + ".f64", t); !e.empty()) return e;
      result["outputs"][name] = {{"shape", t.shape}, {"file", name + ".f64"}};
    }
    if (meta.contains("output_grads"))
      if (std::string e = run_backward(m, g, tensors, meta.at("output_grads"), dir, out, result); !e.empty()) return e;
    return write_file_atomically((out / "meta.json").string(), result.dump(2) + "\n");
  } catch (const json::exception& e) {
    return fmt::format("bad reference input in '{}': {}", dir, e.what());
  }
}

}  // namespace hectorgen::driver
