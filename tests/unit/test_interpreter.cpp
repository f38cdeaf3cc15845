// The CPU reference interpreter against values computed by hand on a tiny graph:
// 5 nodes (types [0, 1, 1, 1, 1]), 7 edges, 2 relations, 2-dimensional features x[n] = [n + 1, 1].
//   e0: 4->2 r1   e1: 0->1 r0   e2: 2->3 r1   e3: 4->2 r1   e4: 3->1 r1   e5: 0->2 r0   e6: 1->4 r1
// Node 0 has no incoming edges; node 2 has two parallel r1 edges from node 4.
#include <catch2/catch.hpp>

#include <cmath>

#include "helpers.h"
#include "ir/inter/interpreter.h"

using namespace hectorgen;
using namespace hectorgen::inter;
using namespace hectorgen::test;

namespace {


Tensor64 tensor(std::vector<int64_t> shape, std::vector<double> data) {
  Tensor64 t{std::move(shape), std::move(data)};
  REQUIRE(static_cast<int64_t>(t.data.size()) == t.numel());
  return t;
}

Tensor64 features() { return tensor({5, 2}, {1, 1, 2, 1, 3, 1, 4, 1, 5, 1}); }

// Compiles a bundled spec with 2-dimensional features.
Module small_model(const std::string& spec, const std::vector<std::pair<std::string, std::string>>& edits) {
  std::string text = read_file(spec_path(spec));
  for (const auto& [from, to] : edits) text = replace(text, from, to);
  auto c = compile_text(spec, text);
  INFO(c->rendered());
  REQUIRE(c->module);
  return *c->module;
}

void check_rows(const Tensor64& got, const std::vector<std::vector<double>>& want) {
  REQUIRE(got.shape[0] == static_cast<int64_t>(want.size()));
  int64_t width = got.numel() / got.shape[0];
  for (size_t n = 0; n < want.size(); ++n) {
    REQUIRE(static_cast<int64_t>(want[n].size()) == width);
    for (int64_t k = 0; k < width; ++k) {
      CAPTURE(n, k);
      CHECK(got.data[n * width + k] == Approx(want[n][k]).epsilon(1e-12));
    }
  }
}

}  // namespace

TEST_CASE("reference: RGCN on the tiny graph", "[interpreter]") {
  Module m = small_model("rgcn.yaml", {{"in_dim: 64", "in_dim: 2"}, {"out_dim: 64", "out_dim: 2"}});
  TensorMap t;
  t["feature"] = features();
  t["W0"] = tensor({2, 2}, {1, 0, 0, 1});                 // identity
  t["W"] = tensor({2, 2, 2}, {1, 0, 0, 0,                 // r0: keep the first component
                              0, 1, 1, 0});               // r1: swap the components
  // norm is computed from the graph: 1/2 for e0 and e3 (two r1 edges into node 2), 1 elsewhere.
  InterpretResult r = interpret(m, tiny_graph(), t);
  INFO(r.error);
  REQUIRE(r.ok);
  // h0 = x0                                   = [1, 1]
  // h1 = x1 + x0 W_0 + x3 W_1 = [2,1]+[1,0]+[1,4] = [4, 5]
  // h2 = x2 + 2 * 0.5 * x4 W_1 + x0 W_0 = [3,1]+[1,5]+[1,0] = [5, 6]
  // h3 = x3 + x2 W_1 = [4,1]+[1,3]            = [5, 4]
  // h4 = x4 + x1 W_1 = [5,1]+[1,2]            = [6, 3]
  check_rows(r.outputs.at("h"), {{1, 1}, {4, 5}, {5, 6}, {5, 4}, {6, 3}});
  check_rows(r.fields.at("h"), {{1, 1}, {4, 5}, {5, 6}, {5, 4}, {6, 3}});
}

TEST_CASE("reference: RGAT on the tiny graph", "[interpreter]") {
  Module m = small_model("rgat.yaml", {{"in_dim: 64", "in_dim: 2"}, {"out_dim: 64", "out_dim: 2"}});
  TensorMap t;
  t["feature"] = features();
  t["W"] = tensor({2, 2, 2}, {1, 0, 0, 0, 0, 1, 1, 0});
  t["w_s"] = tensor({2, 1, 2}, {1, 0, 0, 1});
  t["w_t"] = tensor({2, 1, 2}, {-1, 0, 1, 0});
  InterpretResult r = interpret(m, tiny_graph(), t);
  INFO(r.error);
  REQUIRE(r.ok);
  // Scores a = leakyrelu(hs . w_s[r] + ht . w_t[r], 0.2), hs = x_src W_r, ht = x_dst W_r:
  //   e1 (0->1 r0): hs=[1,0] ht=[2,0]: 1 - 2 = -1 -> -0.2     e4 (3->1 r1): hs=[1,4] ht=[1,2]: 4 + 1 = 5
  //   e0, e3 (4->2 r1): hs=[1,5] ht=[1,3]: 5 + 1 = 6           e5 (0->2 r0): hs=[1,0] ht=[3,0]: 1 - 3 -> -0.4
  double z1 = std::exp(-0.2) + std::exp(5.0);
  double z2 = 2 * std::exp(6.0) + std::exp(-0.4);
  std::vector<std::vector<double>> want = {
      {0, 0},  // no incoming edges
      {(std::exp(-0.2) * 1 + std::exp(5.0) * 1) / z1, (std::exp(5.0) * 4) / z1},
      {(2 * std::exp(6.0) * 1 + std::exp(-0.4) * 1) / z2, (2 * std::exp(6.0) * 5) / z2},
      {1, 3},  // single edge e2: hs = x2 W_1
      {1, 2},  // single edge e6: hs = x1 W_1
  };
  check_rows(r.outputs.at("h"), want);
  // Attention sums to one per destination.
  const Tensor64& att = r.fields.at("att");
  CHECK(att.data[0] + att.data[3] + att.data[5] == Approx(1.0));
  CHECK(att.data[1] == Approx(std::exp(-0.2) / z1));
}

TEST_CASE("reference: HGT on the tiny graph", "[interpreter]") {
  Module m = small_model("hgt.yaml", {{"in_dim: 64", "in_dim: 2"}, {"out_dim: 64", "out_dim: 2"}});
  TensorMap t;
  t["feature"] = features();
  std::vector<double> eye = {1, 0, 0, 1};
  std::vector<double> eye2 = {1, 0, 0, 1, 1, 0, 0, 1};
  t["W_k"] = tensor({2, 2, 2}, eye2);
  t["W_q"] = tensor({2, 2, 2}, eye2);
  t["W_v"] = tensor({2, 2, 2}, eye2);
  t["W_att"] = tensor({2, 1, 2, 2}, eye2);
  t["W_msg"] = tensor({2, 1, 2, 2}, {1, 0, 0, 1, 0, 1, 1, 0});  // r0: identity, r1: swap
  t["mu"] = tensor({2, 1}, {1, 2});
  t["W_a"] = tensor({2, 2, 2}, {1, 0, 0, 1, 2, 0, 0, 2});      // type 0: identity, type 1: doubling
  InterpretResult r = interpret(m, tiny_graph(), t);
  INFO(r.error);
  REQUIRE(r.ok);
  // k = q = v = x. Raw attention = (x_src . x_dst) * mu[r] / sqrt(2); msg = x_src W_msg[r].
  //   node 1: e1 (0->1 r0): 3 * 1 / sqrt2, msg [1,1];   e4 (3->1 r1): 9 * 2 / sqrt2, msg [1,4]
  //   node 2: e0, e3 (4->2 r1): 16 * 2 / sqrt2, msg [1,5] each;   e5 (0->2 r0): 4 / sqrt2, msg [1,1]
  //   node 3: e2 alone, msg [1,3];   node 4: e6 alone, msg [1,2];   node 0: nothing.
  double s = std::sqrt(2.0);
  double a1 = std::exp(3 / s), b1 = std::exp(18 / s);
  double a2 = std::exp(32 / s), b2 = std::exp(4 / s);
  std::vector<std::vector<double>> agg = {
      {0, 0},
      {(a1 + b1) / (a1 + b1), (a1 + 4 * b1) / (a1 + b1)},
      {(2 * a2 + b2) / (2 * a2 + b2), (2 * a2 * 5 + b2) / (2 * a2 + b2)},
      {1, 3},
      {1, 2},
  };
  std::vector<std::vector<double>> want;
  for (size_t n = 0; n < agg.size(); ++n) {
    double scale = n == 0 ? 1.0 : 2.0;  // W_a of the node's type
    want.push_back({scale * agg[n][0], scale * agg[n][1]});
  }
  check_rows(r.outputs.at("h"), want);
}

TEST_CASE("reference: reports missing and ill-shaped tensors", "[interpreter]") {
  Module m = small_model("rgcn.yaml", {{"in_dim: 64", "in_dim: 2"}, {"out_dim: 64", "out_dim: 2"}});
  TensorMap t;
  t["feature"] = features();
  t["W0"] = tensor({2, 2}, {1, 0, 0, 1});
  InterpretResult r = interpret(m, tiny_graph(), t);
  CHECK_FALSE(r.ok);
  CHECK(r.error == "missing tensor 'W'");
  t["W"] = tensor({3, 2, 2}, std::vector<double>(12, 0.0));
  r = interpret(m, tiny_graph(), t);
  CHECK_FALSE(r.ok);
  CHECK(r.error == "tensor 'W' has shape [3, 2, 2], expected [2, 2, 2]");
}

// rows: indexed: the input is a table of any number of rows and <name>_rows maps each node to its row; the program
// reads table[map[v]] as node v's row, so it computes what the plain model computes on table[map].
TEST_CASE("reference: an indexed input reads its table through the node-to-row map", "[interpreter]") {
  const std::vector<std::pair<std::string, std::string>> small = {{"in_dim: 64", "in_dim: 2"}, {"out_dim: 64", "out_dim: 2"}};
  auto indexed = small;
  indexed.push_back({"feature: {per: node, shape: [in_dim]}", "feature: {per: node, shape: [in_dim], rows: indexed}"});
  // 8 table rows; the 5 nodes read rows 6, 0, 3, 6, 1 (row 6 twice, rows 2, 4, 5 and 7 by nobody).
  const Tensor64 table = tensor({8, 2}, {0.5, -1, 2, 0.25, 9, 9, -3, 1.5, 7, 7, 8, 8, 1.25, -0.75, 6, 6});
  const std::vector<int64_t> map = {6, 0, 3, 6, 1};
  Tensor64 gathered = Tensor64::zeros({5, 2});
  for (size_t v = 0; v < map.size(); ++v)
    for (int k = 0; k < 2; ++k) gathered.data[v * 2 + k] = table.data[map[v] * 2 + k];
  Tensor64 rows = Tensor64::zeros({5});
  for (size_t v = 0; v < map.size(); ++v) rows.data[v] = static_cast<double>(map[v]);

  for (const char* spec : {"rgcn.yaml", "rgat.yaml"}) {
    CAPTURE(spec);
    TensorMap weights;
    weights["W0"] = tensor({2, 2}, {1, 0.5, -0.25, 1});
    weights["W"] = tensor({2, 2, 2}, {1, 0, 0.5, -1, 0, 1, 1, 0.75});
    weights["w_s"] = tensor({2, 1, 2}, {1, 0.5, 0, 1});
    weights["w_t"] = tensor({2, 1, 2}, {-1, 0, 1, 0.25});
    Module plain = small_model(spec, small), with_map = small_model(spec, indexed);
    REQUIRE(with_map.decl.find_input("feature")->indexed_rows);
    CHECK_FALSE(with_map.decl.find_input("feature")->requires_grad);  // indexed inputs have no gradient
    TensorMap a = weights, b = weights;
    if (std::string(spec) == "rgcn.yaml") a.erase("w_s"), a.erase("w_t"), b.erase("w_s"), b.erase("w_t");
    else a.erase("W0"), b.erase("W0");
    a["feature"] = gathered;
    b["feature"] = table;
    b["feature_rows"] = rows;
    InterpretResult want = interpret(plain, tiny_graph(), a), got = interpret(with_map, tiny_graph(), b);
    INFO(want.error << got.error);
    REQUIRE(want.ok);
    REQUIRE(got.ok);
    CHECK(got.outputs.at("h").data == want.outputs.at("h").data);  // the same arithmetic: bit-identical
  }

  Module m = small_model("rgcn.yaml", indexed);
  TensorMap t;
  t["feature"] = table;
  t["W0"] = tensor({2, 2}, {1, 0, 0, 1});
  t["W"] = tensor({2, 2, 2}, std::vector<double>(8, 1.0));
  InterpretResult r = interpret(m, tiny_graph(), t);
  CHECK(r.error == "missing tensor 'feature_rows' (the node-to-row map of 'feature')");
  t["feature_rows"] = tensor({4}, {0, 1, 2, 3});
  r = interpret(m, tiny_graph(), t);
  CHECK(r.error == "tensor 'feature_rows' has shape [4], expected [5]");
  t["feature_rows"] = tensor({5}, {0, 1, 8, 3, 4});
  r = interpret(m, tiny_graph(), t);
  CHECK(r.error == "'feature_rows'[2] = 8 is not a row of 'feature' (it has 8)");
  t["feature_rows"] = rows;
  t["feature"] = tensor({8, 3}, std::vector<double>(24, 0.0));
  r = interpret(m, tiny_graph(), t);
  CHECK(r.error == "tensor 'feature' has shape [8, 3], expected [rows, 2] (any number of rows)");
}
