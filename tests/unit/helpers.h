// Test helpers: load bundled specs (optionally with edited text) through the real front end.
#pragma once

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "diag/diagnostics.h"
#include "driver/driver.h"
#include "driver/pipeline.h"
#include "ir/inter/interpreter.h"
#include "ir/inter/ir.h"

namespace hectorgen::test {

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
