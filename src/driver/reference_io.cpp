#include "driver/reference_io.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "driver/output.h"
#include "ir/inter/interpreter.h"

namespace hectorgen::driver {

namespace fs = std::filesystem;
using nlohmann::json;

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
      x.shape = t.at("shape").get<std::vector<int64_t>>();
      x.data.resize(static_cast<size_t>(x.numel()));
      std::ifstream f(fs::path(dir) / t.at("file").get<std::string>(), std::ios::binary);
      f.read(reinterpret_cast<char*>(x.data.data()), static_cast<std::streamsize>(x.data.size() * sizeof(double)));
      if (!f) return fmt::format("cannot read {} values of '{}'", x.data.size(), name);
      tensors[name] = std::move(x);
    }
    inter::InterpretResult r = inter::interpret(m, g, tensors);
    if (!r.ok) return r.error;
    fs::path out = fs::path(dir) / "out";
    fs::create_directories(out);
    json result;
    for (const auto& [name, t] : r.outputs) {
      std::string bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(double));
      if (std::string e = write_file_atomically((out / (name + ".f64")).string(), bytes); !e.empty()) return e;
      result["outputs"][name] = {{"shape", t.shape}, {"file", name + ".f64"}};
    }
    return write_file_atomically((out / "meta.json").string(), result.dump(2) + "\n");
  } catch (const json::exception& e) {
    return fmt::format("bad reference input in '{}': {}", dir, e.what());
  }
}

}  // namespace hectorgen::driver
