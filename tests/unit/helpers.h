// Test helpers: load bundled specs (optionally with edited text) through the real front end.
#pragma once

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "diag/diagnostics.h"
#include "driver/driver.h"
#include "driver/pipeline.h"
#include "ir/inter/interpreter.h"
#include "ir/inter/ir.h"

namespace hectorgen::test {

// Inputs with 'rows: indexed' (a table read through a node-to-row map): replaces each such input of `t` (num_nodes
// rows, as for any input) by a table with 3 more rows, its rows shuffled, and adds <name>_rows mapping node v to
// the table row holding what was v's row: the program then computes what it computed on the plain input. Rows the
// map misses are filled with NaN, so that a read through the wrong row shows.
template <class Rng>
void add_row_maps(const inter::ModelDecl& d, const inter::HeteroGraph& g, inter::TensorMap& t, Rng& rng) {
  for (const inter::TensorDecl& in : d.inputs) {
    auto it = t.find(in.name);
    if (!in.indexed_rows || it == t.end()) continue;
    const int64_t nodes = g.num_nodes, table_rows = nodes + 3, width = nodes ? it->second.numel() / nodes : 0;
    std::vector<int64_t> order(static_cast<size_t>(table_rows));
    for (int64_t r = 0; r < table_rows; ++r) order[static_cast<size_t>(r)] = r;
    for (int64_t r = table_rows - 1; r > 0; --r)  // Fisher-Yates with the test's own generator: deterministic
      std::swap(order[static_cast<size_t>(r)], order[static_cast<size_t>(rng() % static_cast<uint64_t>(r + 1))]);
    inter::Tensor64 table = inter::Tensor64::zeros({table_rows});
    table.shape.insert(table.shape.end(), it->second.shape.begin() + 1, it->second.shape.end());
    table.data.assign(static_cast<size_t>(table_rows * width), std::numeric_limits<double>::quiet_NaN());
    inter::Tensor64 map = inter::Tensor64::zeros({nodes});
    for (int64_t v = 0; v < nodes; ++v) {
      const int64_t row = order[static_cast<size_t>(v)];
      map.data[static_cast<size_t>(v)] = static_cast<double>(row);
      std::copy_n(it->second.data.begin() + v * width, width, table.data.begin() + row * width);
    }
    it->second = std::move(table);
    t[in.name + "_rows"] = std::move(map);
  }
}


inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The hand-checked graph of the unit tests: 5 nodes (types [0, 1, 1, 1, 1]), 7 edges, 2 relations.
//   e0: 4->2 r1   e1: 0->1 r0   e2: 2->3 r1   e3: 4->2 r1   e4: 3->1 r1   e5: 0->2 r0   e6: 1->4 r1
// Node 0 has no incoming edges; node 2 has two parallel r1 edges from node 4.
inline inter::HeteroGraph tiny_graph() {
  inter::HeteroGraph g;
  g.num_nodes = 5;
  g.num_ntypes = 2;
  g.num_etypes = 2;
  g.ntype = {0, 1, 1, 1, 1};
  g.src = {4, 0, 2, 4, 3, 0, 1};
  g.dst = {2, 1, 3, 2, 1, 2, 4};
  g.etype = {1, 0, 1, 1, 1, 0, 1};
  return g;
}

inline std::string spec_path(const std::string& name) { return std::string(HECTORGEN_SOURCE_DIR) + "/specs/" + name; }

// Replaces the first occurrence of `from` (which must exist) with `to`.
inline std::string replace(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("test: pattern not found: " + from);
  return text.replace(at, from.size(), to);
}

struct Compiled {
  std::unique_ptr<SourceFile> file;
  Diagnostics diags;
  std::optional<inter::Module> module;
  std::string rendered() const {
    std::ostringstream s;
    diags.render(s);
    return s.str();
  }
};

inline std::unique_ptr<Compiled> compile_text(const std::string& path, const std::string& text) {
  auto c = std::make_unique<Compiled>();
  c->file = std::make_unique<SourceFile>(path, text);
  std::ostringstream log;
  c->module = driver::frontend(*c->file, c->diags, driver::Options{}, log);
  return c;
}

inline std::unique_ptr<Compiled> compile_spec(const std::string& name) {
  return compile_text(spec_path(name), read_file(spec_path(name)));
}

}  // namespace hectorgen::test
