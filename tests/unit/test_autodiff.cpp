// Autodiff: the backward program, run by the float64 reference interpreter, against central finite
// differences of the forward program, for every input and weight gradient of the bundled models.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "dsl/parser.h"
#include "helpers.h"
#include "ir/inter/names.h"
#include "ir/inter/interpreter.h"
#include "ir/inter/ops.h"
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
    const Tensor64& y = r.outputs.at(*inter::grad_target(name));
    for (size_t i = 0; i < y.data.size(); ++i) l += y.data[i] * dy.data[i];
  }
  return l;
}

// Every gradient of the backward program against central finite differences of the forward's outputs.
// `prepare`: passes to run before autodiff (e.g. compact materialization), if any.
void check_gradients_of(const std::string& spec, const std::string& text,
                        const std::function<Module(const Module&)>& prepare = nullptr) {
  auto c = compile_text(spec, text);
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics diags;
  auto tm = passes::autodiff(prepare ? prepare(*c->module) : *c->module, diags);
  std::ostringstream err;
  diags.render(err);
  INFO(err.str());
  REQUIRE(tm);
  Diagnostics bd;
  bool ok = verify(tm->forward, bd) && verify(tm->backward, bd);
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
  for (const TensorDecl& o : c->module->decl.outputs) d_out[inter::grad_name(o.name)] = random_tensor(full_shape(o, g), rng, 1.0);

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
    std::string x = *inter::grad_target(o.name);
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

void check_gradients(const std::string& spec, const std::vector<std::pair<std::string, std::string>>& edits) {
  std::string text = read_file(spec_path(spec));
  for (const auto& [from, to] : edits) text = replace(text, from, to);
  check_gradients_of(spec, text);
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

TEST_CASE("autodiff: RGCN with basis decomposition: per-etype weights inside an edge loop", "[autodiff]") {
  // d_a0[e.etype] += ... inside `for e in n.incoming_edges()`: per-relation sums over edges.
  check_gradients("../tests/specs/rgcn_basis.yaml", kSmall);
}

TEST_CASE("autodiff: concat and outer in a multi-head attention model", "[autodiff]") {
  // rgat_concat_outer: the score of concat(hs, ht), the message outer(att, v).
  check_gradients("../tests/specs/rgat_concat_outer.yaml",
                  {{"in_dim: 64", "in_dim: 3"}, {"out_dim: 16", "out_dim: 2"}, {"heads: 4", "heads: 2"}});
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

// ---- every operator's derivative rule (ops.h) --------------------------------------------------------
namespace {

// A model computing e["y"] = expr over the tiny graph, with only the inputs and weights it uses.
struct GradCase {
  Op op;
  const char* decls;  // inputs/weights YAML
  const char* out_shape;
  const char* expr;
};

std::string grad_spec(const GradCase& c) {
  return fmt::format(
      "model: opgrad\n{}outputs:\n  y: {{per: edge, shape: {}}}\nprogram: |\n  for e in g.edges():\n      e[\"y\"] = {}\n",
      c.decls, c.out_shape, c.expr);
}

const char* kAB = "inputs:\n  a: {per: node, shape: [4]}\n  b: {per: node, shape: [4]}\n";
const char* kA = "inputs:\n  a: {per: node, shape: [4]}\n";
const char* kM = "inputs:\n  m: {per: node, shape: [2, 4]}\n";

const std::vector<GradCase> kGradCases = {
    {Op::Add, kAB, "[4]", "e.src.a + e.dst.b"},
    {Op::Sub, kAB, "[4]", "e.src.a - e.dst.b"},
    {Op::Mul, kAB, "[4]", "e.src.a * e.dst.b"},
    {Op::Mul, "inputs:\n  a: {per: node, shape: [4]}\n  s: {per: edge, shape: []}\n", "[4]", "e.s * e.src.a"},
    {Op::Div, kAB, "[4]", "e.src.a / (e.dst.b * e.dst.b + 1.0)"},
    {Op::Neg, kA, "[4]", "-e.src.a"},
    {Op::Exp, kA, "[4]", "exp(e.src.a)"},
    {Op::Relu, kA, "[4]", "relu(e.src.a)"},
    {Op::Tanh, kA, "[4]", "tanh(e.src.a)"},
    {Op::Sigmoid, kA, "[4]", "sigmoid(e.src.a)"},
    {Op::Sqrt, kA, "[4]", "sqrt(e.src.a * e.src.a + 1.0)"},
    {Op::LeakyRelu, kA, "[4]", "leakyrelu(e.src.a, 0.2)"},
    {Op::LeakyRelu, kA, "[4]", "leakyrelu(e.src.a)"},
    // A negative slope flips the sign: the derivative recomputes from the argument, not from the stored result.
    {Op::LeakyRelu, kAB, "[4]", "leakyrelu(e.src.a * e.dst.b, -0.5)"},
    {Op::LeakyRelu, kAB, "[4]", "leakyrelu(e.src.a * e.dst.b, 0.2) * 2.0"},
    {Op::Max, kAB, "[4]", "max(e.src.a, e.dst.b)"},
    {Op::Sum, kM, "[2]", "sum(e.src.m)"},
    {Op::Dot, kAB, "[]", "dot(e.src.a, e.dst.b)"},
    {Op::Reshape, kM, "[8]", "reshape(e.src.m, 8)"},
    {Op::Expand, kA, "[4, 3]", "expand(e.src.a, 4, 3) * 2.0"},
    {Op::Concat, "inputs:\n  a: {per: node, shape: [4]}\n  c: {per: node, shape: [3]}\n", "[7]",
     "concat(e.src.a, e.dst.c * e.dst.c)"},
    {Op::Concat, kM, "[2, 12]", "concat(e.src.m, exp(e.dst.m), e.src.m * e.dst.m)"},
    {Op::Slice, kA, "[2]", "slice(e.src.a * e.dst.a, 1, 2)"},
    {Op::Slice, kM, "[2, 3]", "slice(exp(e.src.m), 0, 3)"},
    {Op::Slice, kA, "[1]", "slice(e.src.a, 3, 1)"},
    {Op::Outer, kAB, "[4, 4]", "outer(e.src.a, e.dst.b * e.src.b)"},
    {Op::Outer, "inputs:\n  m: {per: node, shape: [2, 4]}\n  c: {per: node, shape: [2, 3]}\n", "[2, 4, 3]",
     "outer(exp(e.src.m), e.dst.c) * 0.5"},
    {Op::MatVec, "inputs:\n  a: {per: node, shape: [4]}\n  c: {per: node, shape: [3]}\n", "[4]",
     "matvec(outer(e.src.a, e.dst.c * e.dst.c), tanh(e.src.c))"},
    {Op::VecMat, "inputs:\n  a: {per: node, shape: [4]}\n  c: {per: node, shape: [3]}\n", "[3]",
     "vecmat(e.dst.a * e.dst.a, outer(e.src.a, e.dst.c)) + e.src.c"},
    {Op::Linear, "inputs:\n  a: {per: node, shape: [4]}\nweights:\n  W: {per: etype, shape: [4, 3]}\n", "[3]", "e.src.a * W[e.etype]"},
    {Op::Linear, "inputs:\n  m: {per: node, shape: [2, 4]}\nweights:\n  H: {per: etype, shape: [2, 4, 3]}\n", "[2, 3]",
     "linear(e.dst.m, H[e.etype])"},
    {Op::LinearT, "inputs:\n  c: {per: node, shape: [3]}\nweights:\n  W: {per: etype, shape: [4, 3]}\n", "[4]",
     "linear_t(e.src.c, W[e.etype])"},
    // The weight-weight product of reorder-linear: both adjoints are weight gradients.
    {Op::LinearT,
     "inputs:\n  a: {per: node, shape: [4]}\nweights:\n  W: {per: etype, shape: [4, 3]}\n  v: {per: etype, shape: [3]}\n",
     "[]", "dot(e.src.a, linear_t(v[e.etype], W[e.etype]))"},
};

// Operators without a derivative, and a use of each.
const std::vector<std::pair<Op, const char*>> kNoGradCases = {
    {Op::LeakyReluGrad, kA},
    {Op::MaxGrad, kAB},
};

}  // namespace

TEST_CASE("autodiff: leakyrelu's derivative reads the stored result when the slope keeps the argument's sign",
          "[autodiff][ops]") {
  auto backward_of = [](const char* slope, const char* tail) {
    const std::string text = fmt::format(
        "model: lr\nhyper:\n  slope: {}\n{}outputs:\n  y: {{per: edge, shape: [4]}}\nprogram: |\n  for e in g.edges():\n"
        "      e[\"y\"] = leakyrelu(e.src.a * e.dst.b, slope){}\n", slope, kAB, tail);
    auto c = compile_text("lr.yaml", text);
    INFO(c->rendered());
    REQUIRE(c->module);
    Diagnostics d;
    auto tm = passes::autodiff(*c->module, d);
    REQUIRE(tm);
    check_gradients_of("lr.yaml", text);
    return print_module(tm->backward);
  };
  // The whole stored value, slope >= 0 (a hyper-parameter): the sign of e.y is the argument's.
  CHECK(backward_of("0.2", "").find("leakyrelu_grad(e.y, slope)") != std::string::npos);
  CHECK(backward_of("0.0", "").find("leakyrelu_grad(e.y, slope)") != std::string::npos);
  // A negative slope, or a value that is not the whole stored value: from the argument.
  CHECK(backward_of("-0.5", "").find("leakyrelu_grad(e.src.a * e.dst.b, slope)") != std::string::npos);
  CHECK(backward_of("0.2", " * 2.0").find("leakyrelu_grad(e.src.a * e.dst.b, slope)") != std::string::npos);
}

// HGT's attention score (specs/hgt.yaml): dot(k * W_att, q) * mu / sqrt(d_k). The gradient of mu needs the dot
// per edge; the training forward stores it (one float per edge) instead of the backward re-reading both rows.
std::string stored_operand_spec(int dim, const std::string& value) {
  return fmt::format(R"(model: stored
inputs:
  a: {{per: node, shape: [{0}]}}
  b: {{per: node, shape: [{0}]}}
weights:
  W: {{per: etype, shape: [{0}, {0}]}}
  mu: {{per: etype, shape: [1]}}
outputs:
  y: {{per: edge, shape: [1]}}
program: |
  for e in g.edges():
      e["y"] = {1}
)",
                     dim, value);
}

TEST_CASE("autodiff: the training forward stores a per-edge dot product the backward needs", "[autodiff][stored]") {
  struct Result {
    std::string forward, backward;
    std::vector<std::string> saved;
  };
  auto train = [](int dim, const std::string& value, Materialization materialization = Materialization::Vanilla) {
    const std::string text = stored_operand_spec(dim, value);
    CAPTURE(value, dim);
    auto c = compile_text("stored.yaml", text);
    INFO(c->rendered());
    REQUIRE(c->module);
    auto prepare = [&](const Module& m) { return passes::compact_materialization(m, materialization); };
    Diagnostics d;
    auto tm = passes::autodiff(prepare(*c->module), d);
    REQUIRE(tm);
    check_gradients_of("stored.yaml", text, prepare);
    // The training forward computes the same outputs as the program itself, bit for bit.
    HeteroGraph g = tiny_graph();
    std::mt19937 rng(5);
    TensorMap t;
    for (const TensorDecl& in : c->module->decl.inputs) t[in.name] = random_tensor(full_shape(in, g), rng, 1.0);
    for (const TensorDecl& w : c->module->decl.weights) t[w.name] = random_tensor(full_shape(w, g), rng, 1.0);
    InterpretResult inference = interpret(*c->module, g, t), training = interpret(tm->forward, g, t);
    REQUIRE(inference.ok);
    REQUIRE(training.ok);
    CHECK(inference.outputs.at("y").data == training.outputs.at("y").data);
    return Result{print_module(tm->forward), print_module(tm->backward), tm->saved};
  };
  const std::string att = "dot(e.src.a * W[e.etype], e.dst.b) * mu[e.etype] / 2.0";

  SECTION("a dot over rows of 32 elements is stored before the statement and read by the backward") {
    Result r = train(32, att);
    CHECK(r.forward.find("    e[\"y$dot\"] = dot(e.src.a * W[e.etype], e.dst.b)\n"
                         "    e[\"y\"] = e[\"y$dot\"] * mu[e.etype] / 2.0\n") != std::string::npos);
    CHECK(r.backward.find("input y$dot: edge[] requires_grad=0") != std::string::npos);
    CHECK(r.backward.find("d$mu[e.etype] += e.d$y / 2.0 * e.y$dot") != std::string::npos);
    CHECK(r.backward.find("dot(") == std::string::npos);
    CHECK(std::count(r.saved.begin(), r.saved.end(), "y$dot") == 1);
  }
  SECTION("a dot per (source, edge type) pair is stored per pair") {
    // Compact materialization computes the score once per pair; the dot is stored in the pair loop.
    Result r = train(32, "dot(e.src.a * W[e.etype], e.src.b) * mu[e.etype]", Materialization::Compact);
    CHECK(r.forward.find("for p in g.src_etype_pairs():\n    p[\"pair$a$dot\"] = dot(") != std::string::npos);
    CHECK(r.backward.find("input pair$a$dot: pair[] requires_grad=0") != std::string::npos);
    CHECK(r.backward.find("* p.pair$a$dot") != std::string::npos);
    CHECK(r.backward.find("dot(") == std::string::npos);
  }
  SECTION("of nested candidates only the innermost is stored: the backward recomputes the rest from it") {
    Result r = train(32, "sigmoid(dot(e.src.a * W[e.etype], e.dst.b) * 0.5) * mu[e.etype]");
    CHECK(r.forward.find("e[\"y$dot\"] = dot(e.src.a * W[e.etype], e.dst.b)\n") != std::string::npos);
    CHECK(r.backward.find("sigmoid(e.y$dot * 0.5)") != std::string::npos);
    CHECK(r.saved == std::vector<std::string>{"y$dot"});
  }
  SECTION("a dot over short rows is recomputed") {
    Result r = train(8, att);
    CHECK(r.forward.find("y$dot") == std::string::npos);
    CHECK(r.backward.find("d$mu[e.etype] += e.d$y / 2.0 * dot(e.src.a * W[e.etype], e.dst.b)") != std::string::npos);
  }
  SECTION("an operand without a row reduction is recomputed") {
    const std::string product = "sigmoid(slice(e.src.a * W[e.etype], 0, 1) * slice(e.dst.b, 0, 1))";
    Result r = train(32, product + " * mu[e.etype]");
    CHECK(r.forward.find('$') == std::string::npos);
    CHECK(r.backward.find("d$mu[e.etype] += e.d$y * " + product) != std::string::npos);
  }
  SECTION("a dot that only a constant factor's adjoint would read is not stored") {
    Result r = train(32, "dot(e.src.a * W[e.etype], e.dst.b) * 2.0 + mu[e.etype]");
    CHECK(r.forward.find("y$dot") == std::string::npos);
    CHECK(r.backward.find("y$dot") == std::string::npos);
    CHECK(std::count(r.saved.begin(), r.saved.end(), "y$dot") == 0);
  }
}

TEST_CASE("autodiff: every operator's derivative rule matches finite differences", "[autodiff][ops]") {
  std::set<Op> covered;
  for (const GradCase& c : kGradCases) {
    CAPTURE(c.expr);
    check_gradients_of("opgrad.yaml", grad_spec(c));
    covered.insert(c.op);
  }
  // Every operator has a derivative rule covered above, or explicitly none (and autodiff says so).
  std::set<Op> without;
  for (const auto& [op, _] : kNoGradCases) without.insert(op);
  for (const OpInfo& op : all_ops()) {
    CAPTURE(op.name);
    if (op.grad) CHECK(covered.count(op.op));
    else CHECK(without.count(op.op));
  }
}

TEST_CASE("autodiff: an operator without a derivative rule is reported from the table, at its position", "[autodiff][ops]") {
  const std::map<Op, const char*> uses = {{Op::LeakyReluGrad, "leakyrelu_grad(e.src.a, 0.2)"},
                                          {Op::MaxGrad, "max_grad(e.src.a, e.dst.b)"}};
  const std::map<Op, const char*> shapes = {{Op::LeakyReluGrad, "[4]"}, {Op::MaxGrad, "[4]"}};
  for (const auto& [op, decls] : kNoGradCases) {
    const OpInfo& info = op_info(op);
    CAPTURE(info.name);
    REQUIRE(info.grad == nullptr);
    std::string text = grad_spec({op, decls, shapes.at(op), uses.at(op)});
    auto c = compile_text("nograd.yaml", text);
    INFO(c->rendered());
    REQUIRE(c->module);
    Diagnostics d;
    CHECK_FALSE(passes::autodiff(*c->module, d));
    REQUIRE(d.all().size() == 1);
    CHECK(d.all()[0].kind == "unsupported");
    CHECK(d.all()[0].message == fmt::format("autodiff does not support '{}' yet", info.name));
    CHECK(d.all()[0].loc.line == 6 + std::count(decls, decls + std::strlen(decls), '\n'));  // the statement
    CHECK(d.all()[0].loc.col == 16);  // the call, after `      e["y"] = `
  }
}

TEST_CASE("autodiff: a gradient nothing flows into is written as zero", "[autodiff]") {
  // `a` feeds a field no output depends on. The backward used to leave d_a unwritten (an internal error
  // when verified; uninitialised memory when not).
  auto c = compile_text("deadgrad.yaml", R"(model: deadgrad
inputs:
  a: {per: node, shape: [4]}
  b: {per: node, shape: [4]}
weights:
  U: {per: none, shape: [4]}
outputs:
  y: {per: edge, shape: [4]}
program: |
  for e in g.edges():
      e["t"] = e.src.a * U
      e["y"] = e.dst.b * 3.0
)");
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics d;
  auto tm = passes::autodiff(*c->module, d);
  REQUIRE(tm);
  Diagnostics v;
  CHECK(verify(tm->backward, v));
  CHECK(print_module(tm->backward).find("for n in g.dst_nodes():\n    n[\"d$a\"] = expand(0.0, 4)\n") != std::string::npos);
  HeteroGraph g = tiny_graph();
  std::mt19937 rng(3);
  TensorMap t;
  t["a"] = random_tensor({g.num_nodes, 4}, rng, 1.0);
  t["b"] = random_tensor({g.num_nodes, 4}, rng, 1.0);
  t["U"] = random_tensor({4}, rng, 1.0);
  t["d$y"] = random_tensor({g.num_edges(), 4}, rng, 1.0);
  InterpretResult r = interpret(tm->backward, g, t);
  INFO(r.error);
  REQUIRE(r.ok);
  for (double x : r.outputs.at("d$a").data) CHECK(x == 0.0);
  for (double x : r.outputs.at("d$U").data) CHECK(x == 0.0);  // U only feeds `t` too
  // The lowering allocates the never-accumulated weight gradient zeroed.
  auto p = passes::lower(passes::fuse_loops(tm->backward), d, "backward");
  REQUIRE(p);
  REQUIRE(p->find("d$U"));
  CHECK(p->find("d$U")->zero_init);
}

TEST_CASE("autodiff: tied maxima share the gradient evenly", "[autodiff]") {
  // tiny_graph: node 2 has two parallel edges from node 4 (e0, e3) and one from node 0 (e5); node 1 gets edges
  // from 0 and 3. x[4] > x[0] makes e0 and e3 tie for node 2's maximum: each gets half of d_m[2], so d_x[4]
  // is d_m[2] (it was twice that: every tied maximum got the full gradient).
  auto c = compile_text("ties.yaml", R"(model: ties
inputs:
  x: {per: node, shape: [2]}
outputs:
  m: {per: node, shape: [2]}
program: |
  for n in g.dst_nodes():
      n["m"] = -1e30
      for e in n.incoming_edges():
          n["m"] = max(n["m"], e.src.x)
)");
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics d;
  auto tm = passes::autodiff(*c->module, d);
  REQUIRE(tm);
  Diagnostics v;
  INFO(print_module(tm->backward));
  REQUIRE(verify(tm->backward, v));
  HeteroGraph g = tiny_graph();
  TensorMap t;
  t["x"] = Tensor64{{5, 2}, {1.0, -1.0, 0.5, 0.5, 0.0, 0.0, 3.0, -2.0, 2.0, 2.0}};
  InterpretResult fr = interpret(tm->forward, g, t);
  REQUIRE(fr.ok);
  TensorMap bt = t;
  for (const std::string& s : tm->saved) bt[s] = fr.fields.at(s);
  bt["d$m"] = Tensor64{{5, 2}, {0.0, 0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0}};
  InterpretResult br = interpret(tm->backward, g, bt);
  INFO(br.error);
  REQUIRE(br.ok);
  const std::vector<double>& dx = br.outputs.at("d$x").data;
  // node 1: max(x[0], x[3]) = (3, -1): x[3] wins column 0 and x[0] column 1 (no ties).
  // node 2: max(x[4], x[4], x[0]) = (2, 2): the two edges from 4 tie, x[0] loses.
  // node 3: x[2] = (0, 0) alone; node 4: x[1] = (0.5, 0.5) alone.
  CHECK(dx == std::vector<double>{0.0, 20.0, 70.0, 80.0, 50.0, 60.0, 10.0, 0.0, 30.0, 40.0});
  // A tie between different sources splits too: x[3] = x[0] in column 0 of node 1.
  bt["x"] = t["x"];
  bt["x"].data[6] = 1.0;
  fr = interpret(tm->forward, g, bt);
  REQUIRE(fr.ok);
  for (const std::string& s : tm->saved) bt[s] = fr.fields.at(s);
  br = interpret(tm->backward, g, bt);
  REQUIRE(br.ok);
  CHECK(br.outputs.at("d$x").data[0] == 5.0);
  CHECK(br.outputs.at("d$x").data[6] == 5.0);
}

// A reassigned local gets a field per value (hs, hs$2): before, both values shared one field and the backward
// read the second value where the first was meant (wrong gradients).
TEST_CASE("autodiff: a local assigned twice is two values", "[autodiff][names]") {
  auto edits = kSmall;
  edits.push_back({"      e[\"msg\"] = hs\n", "      hs = hs * hs\n      e[\"msg\"] = hs\n"});
  check_gradients("rgat.yaml", edits);
}

// An output the program reads again (n["y"] = n["h"] * 2): its gradient is d$h plus what flows back through
// the reads (d$h$reads); before, the reads' part was dropped.
TEST_CASE("autodiff: an output read later in the program", "[autodiff][names]") {
  auto edits = kSmall;
  edits.push_back({"  h: {per: node, shape: [out_dim]}", "  h: {per: node, shape: [out_dim]}\n  y: {per: node, shape: [out_dim]}"});
  edits.push_back({"          n[\"h\"] += e.norm * (e.src.feature * W[e.etype])\n",
                   "          n[\"h\"] += e.norm * (e.src.feature * W[e.etype])\n  for n in g.dst_nodes():\n      n[\"y\"] = n[\"h\"] * 2.0\n"});
  check_gradients("rgcn.yaml", edits);
}

TEST_CASE("autodiff: an output per edge type accumulated by the user is reported at its statement", "[autodiff]") {
  // `acc[e.etype] += v` into an output per etype: type checking crashed ("stored_type: not an assignable target",
  // exit 2). It now type-checks (the forward generates); its gradient is a positioned diagnostic.
  auto c = compile_text("acc.yaml", R"(model: acc
inputs:
  x: {per: node, shape: [4]}
weights:
  a: {per: etype, shape: []}
outputs:
  acc: {per: etype, shape: [4]}
program: |
  for e in g.edges():
      acc[e.etype] += a[e.etype] * e.src.x
)");
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics v;
  CHECK(verify(*c->module, v));
  // The float64 interpreter sums per edge type.
  HeteroGraph g = tiny_graph();
  std::mt19937 rng(5);
  TensorMap t;
  t["x"] = random_tensor({g.num_nodes, 4}, rng, 1.0);
  t["a"] = random_tensor({g.num_etypes}, rng, 1.0);
  InterpretResult r = interpret(*c->module, g, t);
  INFO(r.error);
  REQUIRE(r.ok);
  std::vector<double> want(static_cast<size_t>(g.num_etypes * 4), 0.0);
  for (int64_t e = 0; e < g.num_edges(); ++e)
    for (int k = 0; k < 4; ++k) want[g.etype[e] * 4 + k] += t["a"].data[g.etype[e]] * t["x"].data[g.src[e] * 4 + k];
  const std::vector<double>& got = r.outputs.at("acc").data;
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-12));
  Diagnostics d;
  CHECK_FALSE(passes::autodiff(*c->module, d));
  REQUIRE(d.all().size() == 1);
  CHECK(d.all()[0].kind == "unsupported");
  CHECK(d.all()[0].message == "autodiff: output 'acc' is per etype; only outputs per node or per edge are differentiated yet");
  CHECK(d.all()[0].loc.line == 10);
  CHECK(d.all()[0].loc.col == 7);
}

TEST_CASE("autodiff: a field read between two += gets the gradient of the value it read", "[autodiff][versions]") {
  // s is read (y = s * s) between two accumulations. The saved s the backward reads was the final one, and the
  // gradient of the output s and of the value y read were one field.
  const char* decls = R"(inputs:
  x: {per: node, shape: [3]}
outputs:
  y: {per: node, shape: [3]}
  s: {per: node, shape: [3]}
)";
  // Accumulations in separate loops, through the loop node.
  check_gradients_of("versions.yaml", std::string("model: versions\n") + decls + R"(program: |
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["s"] += e.src.x
  for n in g.dst_nodes():
      n["y"] = n["s"] * n["s"]
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["s"] += e.src.x * e.src.x
)");
  // In one node loop, the read between the two inner loops.
  check_gradients_of("versions.yaml", std::string("model: versions\n") + decls + R"(program: |
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["s"] += e.src.x
      n["y"] = exp(n["s"])
      for e in n.incoming_edges():
          n["s"] += e.src.x * e.src.x
)");
  // Scattered through e.dst from edge loops, read through e.src in between, then a set and a third +=.
  check_gradients_of("versions.yaml", std::string("model: versions\n") + decls + R"(program: |
  for e in g.edges():
      e.dst["s"] += e.src.x
  for n in g.dst_nodes():
      n["y"] = n["s"] * n.x
  for e in g.edges():
      e.dst["s"] += tanh(e.src["y"]) * e.src.x
  for n in g.dst_nodes():
      n["y"] += n["s"] * n["s"]
      n["s"] = n["s"] * 0.5
      n["s"] += n["y"] * n["s"]
)");
  // A local read between two updates.
  check_gradients_of("versions.yaml", std::string("model: versions\n") + decls + R"(program: |
  for n in g.dst_nodes():
      t = n.x * 2.0
      n["y"] = t * t
      t += n.x * n.x
      n["s"] = t * n.x
)");
  // A local reassigned after a read.
  check_gradients_of("versions.yaml", std::string("model: versions\n") + decls + R"(program: |
  for n in g.dst_nodes():
      t = n.x * 2.0
      n["y"] = t * t
      t = exp(n.x)
      n["s"] = t * t
)");
}

TEST_CASE("autodiff: a field accumulated again after a read in the loop that scatters into it is reported", "[autodiff][versions]") {
  // The new version of s would start from a copy made before the loop, while this loop still writes the old one.
  auto c = compile_text("v5.yaml", R"(model: v5
inputs:
  x: {per: node, shape: [3]}
outputs:
  y: {per: node, shape: [3]}
  s: {per: node, shape: [3]}
program: |
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          e.src["s"] += e.dst.x
      n["y"] = n["s"] * n.x
      for e in n.incoming_edges():
          e.src["s"] += e.dst.x * e.dst.x
)");
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics d;
  CHECK_FALSE(passes::autodiff(*c->module, d));
  REQUIRE(d.all().size() == 1);
  CHECK(d.all()[0].kind == "unsupported");
  CHECK(d.all()[0].message.find("node field 's' is accumulated again after a read") != std::string::npos);
  CHECK(d.all()[0].loc.line == 13);
  CHECK(d.all()[0].loc.col == 11);
}
