// fuse-loops at the pass level: a program in, the pass, the printed IR out; and the fused IR must lower.
#include <catch2/catch.hpp>

#include "helpers.h"
#include "ir/inter/printer.h"
#include "ir/inter/verifier.h"
#include "passes/passes.h"

using namespace hectorgen;
using namespace hectorgen::test;

namespace {

// The spec header shared by the programs below (tests/specs/split_loops.yaml's declarations).
const char* kHeader = R"(model: split
hyper:
  in_dim: 8
  mid_dim: 8
  out_dim: 8
inputs:
  feature: {per: node, shape: [in_dim]}
weights:
  W1: {per: none, shape: [in_dim, mid_dim]}
  W2: {per: etype, shape: [mid_dim, out_dim]}
  gate: {per: etype, shape: []}
outputs:
  h: {per: node, shape: [out_dim]}
program: |
  for n in g.src_nodes():
      n["z"] = n.feature * W1
)";

std::string fused_ir(const std::string& program) {
  auto c = compile_text("split.yaml", std::string(kHeader) + program);
  INFO(c->rendered());
  REQUIRE(c->module);
  inter::Module fused = passes::fuse_loops(*c->module);
  Diagnostics d;
  REQUIRE(inter::verify(fused, d));
  auto p = passes::lower(fused, d, "forward");
  std::ostringstream err;
  d.render(err);
  INFO(err.str());
  CHECK(p);
  return inter::print_module(fused);
}

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("fuse-loops: keeps inner loops split when the second one's GEMM reads the first one's field", "[fuse]") {
  // The message m is computed in one inner loop and projected per relation in the next: fused, the GEMM would
  // depend on a value of the same inner loop ("split the loop"), the dependency the user split them for.
  std::string ir = fused_ir(R"(  for n in g.dst_nodes():
      for e in n.incoming_edges():
          e["m"] = sigmoid(gate[e.etype] * dot(e.src["z"], e.dst["z"])) * e.src["z"]
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["h"] += e["m"] * W2[e.etype]
)");
  INFO(ir);
  CHECK(occurrences(ir, "for n in g.dst_nodes()") == 1);  // the node loops still fuse
  CHECK(occurrences(ir, "in n.incoming_edges()") == 2);   // their inner loops do not
}

TEST_CASE("fuse-loops: still fuses inner loops whose GEMM work is independent", "[fuse]") {
  // The second inner loop's GEMM reads only z (computed before both loops): one inner loop.
  std::string ir = fused_ir(R"(  for n in g.dst_nodes():
      for e in n.incoming_edges():
          e["m"] = sigmoid(gate[e.etype] * dot(e.src["z"], e.dst["z"])) * e.src["z"]
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["h"] += e.src["z"] * W2[e.etype]
)");
  INFO(ir);
  CHECK(occurrences(ir, "for n in g.dst_nodes()") == 1);
  CHECK(occurrences(ir, "in n.incoming_edges()") == 1);
}

TEST_CASE("fuse-loops: the split_loops spec lowers in every phase without re-fused dependencies", "[fuse]") {
  auto c = compile_text("tests/specs/split_loops.yaml",
                        read_file(std::string(HECTORGEN_SOURCE_DIR) + "/tests/specs/split_loops.yaml"));
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics ad;
  auto tm = passes::autodiff(*c->module, ad);
  REQUIRE(tm);
  const std::pair<const char*, const inter::Module*> phases[] = {
      {"forward", &*c->module}, {"forward_train", &tm->forward}, {"backward", &tm->backward}};
  for (const auto& [phase, m] : phases) {
    INFO(phase);
    Diagnostics d;
    auto p = passes::lower(passes::fuse_loops(*m), d, phase);
    std::ostringstream err;
    d.render(err);
    INFO(err.str());
    CHECK(err.str().find("split the loop") == std::string::npos);
    // The backward accumulates the gate's gradient inside an inner edge loop (a per-edge value and a segment
    // sum per edge type): every phase lowers.
    CHECK(p);
  }
}
