// Autodiff: the backward program, run by the float64 reference interpreter, against central finite
// differences of the forward program, for every input and weight gradient of the bundled models.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "dsl/parser.h"
#include "helpers.h"
#include "ir/inter/interpreter.h"
#include "ir/inter/names.h"
#include "ir/inter/printer.h"
#include "ir/inter/verifier.h"
#include "passes/passes.h"

using namespace hectorgen;
using namespace hectorgen::inter;
using namespace hectorgen::test;

namespace {


Tensor64 random_tensor(std::vector<int64_t> shape, std::mt19937& rng, double scale) {
  Tensor64 t = Tensor64::zeros(std::move(shape));
  std::uniform_real_distribution<double> u(-scale, scale);
  for (double& v : t.data) v = u(rng);
  return t;
}

double loss(const Module& fwd, const HeteroGraph& g, const TensorMap& t, const TensorMap& d_out) {
  InterpretResult r = interpret(fwd, g, t);
  REQUIRE(r.ok);
  double l = 0;
  for (const auto& [name, dy] : d_out) {
    const Tensor64& y = r.outputs.at(*grad_target(name));
    for (size_t i = 0; i < y.data.size(); ++i) l += y.data[i] * dy.data[i];
  }
  return l;
}

void check_gradients(const std::string& spec, const std::vector<std::pair<std::string, std::string>>& edits) {
  std::string text = read_file(spec_path(spec));
  for (const auto& [from, to] : edits) text = replace(text, from, to);
  auto c = compile_text(spec, text);
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics diags;
  auto tm = passes::autodiff(*c->module, diags);
  std::ostringstream err;
  diags.render(err);
  INFO(err.str());
  REQUIRE(tm);
  Analysis ba;
  Diagnostics bd;
  bool ok = verify(tm->backward, bd, &ba);
  std::ostringstream berr;
  bd.render(berr);
  INFO(print_module(tm->backward) << berr.str());
  REQUIRE(ok);

  HeteroGraph g = tiny_graph();
  std::mt19937 rng(7);
  TensorMap t;
  for (const TensorDecl& d : c->module->decl.inputs)
    if (d.from_graph.empty()) t[d.name] = random_tensor(full_shape(d, g), rng, 1.0);
  for (const TensorDecl& d : c->module->decl.weights) t[d.name] = random_tensor(full_shape(d, g), rng, 0.7);
  TensorMap d_out;
  for (const TensorDecl& o : c->module->decl.outputs) d_out[grad_name(o.name)] = random_tensor(full_shape(o, g), rng, 1.0);

  // Backward: forward inputs and weights, the saved fields, the output gradients.
  InterpretResult fr = interpret(tm->forward, g, t);
  REQUIRE(fr.ok);
  TensorMap bt = t;
  for (const std::string& s : tm->saved) bt[s] = fr.fields.at(s);
  for (const auto& [k, v] : d_out) bt[k] = v;
  InterpretResult br = interpret(tm->backward, g, bt);
  INFO(br.error);
  REQUIRE(br.ok);

  const double eps = 1e-6;
  int checked = 0;
  for (const TensorDecl& o : tm->backward.decl.outputs) {
    std::string x = *grad_target(o.name);
    const Tensor64& grad = br.outputs.at(o.name);
    REQUIRE(grad.data.size() == t.at(x).data.size());
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < grad.data.size(); ++i) {
      TensorMap plus = t, minus = t;
      plus[x].data[i] += eps;
      minus[x].data[i] -= eps;
      double fd = (loss(tm->forward, g, plus, d_out) - loss(tm->forward, g, minus, d_out)) / (2 * eps);
      max_err = std::max(max_err, std::abs(fd - grad.data[i]));
      max_ref = std::max(max_ref, std::abs(fd));
    }
    CAPTURE(spec, o.name, max_err, max_ref);
    CHECK(max_ref > 0);
    CHECK(max_err <= 1e-6 * std::max(1.0, max_ref));
    ++checked;
  }
  CHECK(checked == static_cast<int>(tm->backward.decl.outputs.size()));
}

const std::vector<std::pair<std::string, std::string>> kSmall = {{"in_dim: 64", "in_dim: 3"}, {"out_dim: 64", "out_dim: 2"}};

}  // namespace

TEST_CASE("autodiff: RGCN gradients match finite differences", "[autodiff]") { check_gradients("rgcn.yaml", kSmall); }

TEST_CASE("autodiff: RGAT gradients match finite differences", "[autodiff]") {
  check_gradients("rgat.yaml", kSmall);
  auto heads = kSmall;
  heads.push_back({"heads: 1", "heads: 2"});
  check_gradients("rgat.yaml", heads);
}

TEST_CASE("autodiff: HGT gradients match finite differences", "[autodiff]") {
  check_gradients("hgt.yaml", {{"in_dim: 64", "in_dim: 3"}, {"out_dim: 64", "out_dim: 4"}});
  check_gradients("hgt.yaml", {{"in_dim: 64", "in_dim: 3"}, {"out_dim: 64", "out_dim: 4"}, {"heads: 1", "heads: 2"}});
}

TEST_CASE("autodiff: the backward program prints and parses back", "[autodiff][roundtrip]") {
  auto c = compile_spec("rgat.yaml");
  REQUIRE(c->module);
  Diagnostics diags;
  auto tm = passes::autodiff(*c->module, diags);
  REQUIRE(tm);
  std::string text = print_module(tm->backward);
  SourceFile f("<backward>", text);
  dsl::ProgramText pt{text, &f, {}, {}};
  Diagnostics d2;
  auto back = dsl::parse_module(pt, d2);
  REQUIRE(back);
  CHECK(print_module(*back) == text);
}

TEST_CASE("autodiff: a local assigned twice is two values", "[autodiff][names]") {
  auto edits = kSmall;
  edits.push_back({"      e[\"msg\"] = hs\n", "      hs = hs * hs\n      e[\"msg\"] = hs\n"});
  check_gradients("rgat.yaml", edits);
}
