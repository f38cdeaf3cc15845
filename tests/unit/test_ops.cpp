// The operator table (ir/inter/ops.h): complete and consistent, each operator's float64 evaluation, and
// type inference on each operator through the real front end (good cases give the expected type; bad
// cases give a positioned error). Derivatives: tests/unit/test_autodiff.cpp.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <map>
#include <set>
#include <string>

#include "helpers.h"
#include "ir/inter/ops.h"
#include "ir/inter/typing.h"

using namespace hectorgen;
using namespace hectorgen::inter;
using namespace hectorgen::test;

TEST_CASE("the operator table has one row per operator, and its rows are consistent", "[ops]") {
  const auto& ops = all_ops();
  REQUIRE(ops.size() == static_cast<size_t>(Op::Count) - 1);  // every enum value but None and Count
  std::set<std::pair<Syntax, std::string>> spellings;
  for (size_t i = 1; i < static_cast<size_t>(Op::Count); ++i) {
    Op op = static_cast<Op>(i);
    const OpInfo& r = op_info(op);
    CAPTURE(r.name);
    CHECK(r.op == op);
    CHECK(std::string(r.name).size() > 0);
    CHECK(spellings.insert({r.syntax, r.name}).second);  // unique per syntax ("-" is Sub and Neg)
    if (r.syntax == Syntax::Call) CHECK(call_op(r.name) == op);
    else CHECK_FALSE(call_op(r.name));
    // Arity: the parameters fix it; optional parameters come last and have defaults.
    REQUIRE_FALSE(r.params.empty());
    CHECK(r.min_args() >= 1);
    CHECK(r.min_args() <= r.max_args());
    if (r.syntax == Syntax::Infix) CHECK((r.min_args() == 2 && r.max_args() == 2));
    if (r.syntax == Syntax::Prefix) CHECK((r.min_args() == 1 && r.max_args() == 1));
    bool optional = false;
    for (const Param& p : r.params) {
      CHECK(std::string(p.role).size() > 0);
      if (p.default_value) optional = true;
      else CHECK_FALSE(optional);
      if (p.kind == ParamKind::Constant) CHECK(std::string(p.error).size() > 0);
      else CHECK_FALSE(p.default_value);
    }
    CHECK(r.params.front().kind == ParamKind::Tensor);
    // Rules every consumer relies on.
    CHECK(r.type != nullptr);
    CHECK(r.eval != nullptr);
    CHECK((r.templates.gemm || r.templates.traversal || r.templates.torch));
    CHECK(r.templates.traversal == (r.form != Form::None));
    if (r.form == Form::Map) CHECK(std::string(r.cuda).size() > 0);
    if (r.templates.torch) CHECK(std::string(r.aten).size() > 0);
    // Spellings name only arguments the operator has.
    for (const char* pattern : {r.cuda, r.aten}) {
      std::string p(pattern);
      for (size_t k = 0; k + 2 < p.size(); ++k)
        if (p[k] == '{' && std::isdigit(static_cast<unsigned char>(p[k + 1])) && p[k + 2] == '}')
          CHECK(static_cast<size_t>(p[k + 1] - '0') < r.params.size());
    }
  }
  // The DSL's function names, sorted (for suggestions).
  const auto& names = call_op_names();
  CHECK(std::is_sorted(names.begin(), names.end()));
  CHECK(std::find(names.begin(), names.end(), "leakyrelu") != names.end());
  CHECK_THROWS_AS(op_info(Op::None), std::logic_error);
  CHECK(spell("at::cat({{*}}, -1)", {"a", "b"}, "a, b") == "at::cat({a, b}, -1)");
  CHECK(spell("{0}.reshape({{rows}{dims}})", {"x"}, "x", "num_edges", ", 4, 2") == "x.reshape({num_edges, 4, 2})");
}

TEST_CASE("each operator's float64 evaluation", "[ops][interpreter]") {
  auto v = [](std::vector<int64_t> shape, std::vector<double> data) { return Value64{std::move(shape), std::move(data)}; };
  auto s = [](double x) { return Value64::scalar(x); };
  auto eval = [](Op op, std::vector<Value64> args, std::vector<int64_t> result_shape = {}) {
    return op_info(op).eval(args, Type::tensor(Domain::Edge, std::move(result_shape)));
  };
  std::set<Op> checked;
  auto check = [&](Op op, const Value64& got, const Value64& want) {
    CAPTURE(op_info(op).name);
    CHECK(got.shape == want.shape);
    REQUIRE(got.data.size() == want.data.size());
    for (size_t i = 0; i < got.data.size(); ++i) CHECK(got.data[i] == Approx(want.data[i]).epsilon(1e-12));
    checked.insert(op);
  };
  Value64 a = v({2}, {1, -2}), b = v({2}, {3, 4});
  check(Op::Add, eval(Op::Add, {a, b}), v({2}, {4, 2}));
  check(Op::Sub, eval(Op::Sub, {v({2, 2}, {1, 2, 3, 4}), v({2}, {1, 2})}), v({2, 2}, {0, 1, 1, 2}));  // prefix broadcast
  check(Op::Mul, eval(Op::Mul, {a, s(3)}), v({2}, {3, -6}));
  check(Op::Div, eval(Op::Div, {b, a}), v({2}, {3, -2}));
  check(Op::Neg, eval(Op::Neg, {a}), v({2}, {-1, 2}));
  check(Op::Exp, eval(Op::Exp, {v({2}, {0, 1})}), v({2}, {1, std::exp(1.0)}));
  check(Op::Relu, eval(Op::Relu, {a}), v({2}, {1, 0}));
  check(Op::Tanh, eval(Op::Tanh, {a}), v({2}, {std::tanh(1.0), std::tanh(-2.0)}));
  check(Op::Sigmoid, eval(Op::Sigmoid, {v({1}, {0})}), v({1}, {0.5}));
  check(Op::Sqrt, eval(Op::Sqrt, {b}), v({2}, {std::sqrt(3.0), 2}));
  check(Op::LeakyRelu, eval(Op::LeakyRelu, {a, s(0.2)}), v({2}, {1, -0.4}));
  check(Op::LeakyReluGrad, eval(Op::LeakyReluGrad, {a, s(0.2)}), v({2}, {1, 0.2}));
  check(Op::Max, eval(Op::Max, {a, v({2}, {0, 0})}), v({2}, {1, 0}));
  check(Op::MaxGrad, eval(Op::MaxGrad, {v({2}, {1, 0}), v({2}, {1, 1})}), v({2}, {1, 0}));
  check(Op::Sum, eval(Op::Sum, {v({2, 2}, {1, 2, 3, 4})}), v({2}, {3, 7}));
  check(Op::Dot, eval(Op::Dot, {a, b}), v({}, {-5}));
  check(Op::Outer, eval(Op::Outer, {a, v({3}, {1, 2, 3})}), v({2, 3}, {1, 2, 3, -2, -4, -6}));
  // [[1, 2, 3], [4, 5, 6]] times [1, 0, -1]; [1, -2] times [[1, 2, 3], [4, 5, 6]].
  check(Op::MatVec, eval(Op::MatVec, {v({2, 3}, {1, 2, 3, 4, 5, 6}), v({3}, {1, 0, -1})}, {2}), v({2}, {-2, -2}));
  check(Op::VecMat, eval(Op::VecMat, {a, v({2, 3}, {1, 2, 3, 4, 5, 6})}, {3}), v({3}, {-7, -8, -9}));
  check(Op::Concat, eval(Op::Concat, {v({2, 1}, {1, 2}), v({2, 2}, {3, 4, 5, 6})}), v({2, 3}, {1, 3, 4, 2, 5, 6}));
  check(Op::Slice, eval(Op::Slice, {v({2, 3}, {1, 2, 3, 4, 5, 6}), s(1), s(2)}, {2, 2}), v({2, 2}, {2, 3, 5, 6}));
  check(Op::Reshape, eval(Op::Reshape, {v({2, 2}, {1, 2, 3, 4}), s(4)}, {4}), v({4}, {1, 2, 3, 4}));
  check(Op::Expand, eval(Op::Expand, {v({2}, {1, 2}), s(2), s(3)}, {2, 3}), v({2, 3}, {1, 1, 1, 2, 2, 2}));
  Value64 w = v({2, 3}, {1, 2, 3, 4, 5, 6});
  check(Op::Linear, eval(Op::Linear, {a, w}), v({3}, {-7, -8, -9}));
  check(Op::LinearT, eval(Op::LinearT, {v({3}, {1, 0, 1}), w}), v({2}, {4, 10}));
  // Per head: x [H, K] with W [H, K, N].
  check(Op::Linear, eval(Op::Linear, {v({2, 1}, {2, 3}), v({2, 1, 2}, {1, 2, 3, 4})}), v({2, 2}, {2, 4, 9, 12}));
  for (const OpInfo& op : all_ops()) {
    CAPTURE(op.name);
    CHECK(checked.count(op.op));
  }
}

// ---- type inference on each operator -------------------------------------------------------------------
namespace {

const char* kTypeSpec = R"(model: optypes
hyper:
  k: 4
inputs:
  a: {per: node, shape: [4]}
  b: {per: node, shape: [4]}
  c: {per: node, shape: [3]}
  m: {per: node, shape: [2, 4]}
  s: {per: edge, shape: []}
weights:
  W: {per: etype, shape: [4, 3]}
  V: {per: none, shape: [4, 3]}
  H: {per: etype, shape: [2, 4, 3]}
outputs:
  o: {per: node, shape: []}
program: |
  for e in g.edges():
      e["y"] = EXPR
  for n in g.dst_nodes():
      n["o"] = 0.0
)";
constexpr int kExprLine = 18;
constexpr int kExprCol = 16;

struct Good {
  Op op;
  const char* expr;
  const char* type;  // of the assigned value (what e["y"] stores)
};
struct Bad {
  Op op;
  const char* expr;
  const char* kind;
  const char* at;  // the error points at the first occurrence of this text in expr
};

const std::vector<Good> kGood = {
    {Op::Add, "e.src.a + e.dst.b", "edge[4]"},
    {Op::Add, "e.src.m + e.s", "edge[2, 4]"},  // prefix broadcasting
    {Op::Sub, "e.src.a - 1.0", "src_etype[4]"},
    {Op::Mul, "e.src.m * e.dst.m", "edge[2, 4]"},
    {Op::Div, "e.dst.a / k", "edge[4]"},
    {Op::Neg, "-e.dst.c", "edge[3]"},
    {Op::Exp, "exp(e.dst.a)", "edge[4]"},
    {Op::Relu, "relu(e.dst.m)", "edge[2, 4]"},
    {Op::Tanh, "tanh(e.s)", "edge[]"},
    {Op::Sigmoid, "sigmoid(e.dst.a)", "edge[4]"},
    {Op::Sqrt, "sqrt(e.dst.a) * sqrt(k)", "edge[4]"},
    {Op::LeakyRelu, "leakyrelu(e.dst.a, 0.5 * k)", "edge[4]"},
    {Op::LeakyRelu, "leakyrelu(e.dst.a)", "edge[4]"},
    {Op::LeakyReluGrad, "leakyrelu_grad(e.dst.a, 0.2)", "edge[4]"},
    {Op::Max, "max(e.dst.m, e.s)", "edge[2, 4]"},
    {Op::MaxGrad, "max_grad(e.dst.a, e.src.b)", "edge[4]"},
    {Op::Sum, "sum(e.dst.m)", "edge[2]"},
    {Op::Dot, "dot(e.src.m, e.dst.m)", "edge[2]"},
    {Op::Outer, "outer(e.src.m, e.dst.m)", "edge[2, 4, 4]"},
    {Op::MatVec, "matvec(outer(e.src.a, e.dst.c), e.dst.c)", "edge[4]"},
    {Op::VecMat, "vecmat(e.src.a, outer(e.src.a, e.src.c))", "src_etype[3]"},
    {Op::Concat, "concat(e.src.a, e.dst.b, e.dst.c)", "edge[11]"},
    {Op::Slice, "slice(e.dst.m, 1, 2)", "edge[2, 2]"},
    {Op::Slice, "slice(e.src.a, k - 1, 1)", "src_etype[1]"},
    {Op::Reshape, "reshape(e.dst.m, k, 2)", "edge[4, 2]"},
    {Op::Expand, "expand(e.dst.m, 2, k, 3)", "edge[2, 4, 3]"},
    {Op::Expand, "expand(0.0, 3)", "const[3]"},
    {Op::Linear, "e.src.a * W[e.etype]", "src_etype[3]"},  // depends on the source and the edge type only
    {Op::Linear, "linear(e.dst.a, V)", "edge[3]"},
    {Op::Linear, "e.dst.m * H[e.etype]", "edge[2, 3]"},  // per head
    {Op::Linear, "e.dst.m * V", "edge[2, 3]"},           // a shared weight applied to each head
    {Op::LinearT, "linear_t(e.dst.c, W[e.etype])", "edge[4]"},
    {Op::LinearT, "linear_t(reshape(concat(e.dst.c, e.src.c), 2, 3), H[e.etype])", "edge[2, 4]"},
};

const std::vector<Bad> kBad = {
    {Op::Add, "e.src.a + e.dst.m", "shape-mismatch", "+"},
    {Op::Sub, "e.src.a - e.etype", "type-mismatch", "etype"},
    {Op::Mul, "W[e.etype] * e.src.a", "operand-order", "*"},
    {Op::Div, "e.src / 2.0", "type-mismatch", "src"},
    {Op::Neg, "-e", "type-mismatch", "e"},
    {Op::Exp, "exp(e.dst.a, e.dst.b)", "wrong-arguments", "exp"},
    {Op::Relu, "relu(W)", "weight-indexing", "W"},
    {Op::Tanh, "tanh()", "wrong-arguments", "tanh"},
    {Op::Sigmoid, "sigmoid(g)", "type-mismatch", "g)"},
    {Op::Sqrt, "sqrt(\"a\")", "type-mismatch", "\"a\""},
    {Op::LeakyRelu, "leakyrelu(e.dst.a, e.s)", "not-constant", "e.s"},
    {Op::LeakyReluGrad, "leakyrelu_grad(e.dst.a, 1.0, 2.0)", "wrong-arguments", "leakyrelu_grad"},
    {Op::Max, "max(e.dst.a, e.dst.c)", "shape-mismatch", "max"},
    {Op::MaxGrad, "max_grad(e.dst.a)", "wrong-arguments", "max_grad"},
    {Op::Sum, "sum(e.s)", "shape-mismatch", "sum"},
    {Op::Dot, "dot(e.src.a, e.dst.c)", "shape-mismatch", "dot"},
    {Op::Dot, "dot(e.src.a, e.s)", "shape-mismatch", "dot"},
    {Op::Outer, "outer(e.src.a, e.dst.m)", "shape-mismatch", "outer"},
    {Op::MatVec, "matvec(e.src.m, e.dst.c)", "shape-mismatch", "matvec"},
    {Op::VecMat, "vecmat(e.src.a, e.dst.m)", "shape-mismatch", "vecmat"},
    {Op::Concat, "concat(e.src.a, e.s)", "shape-mismatch", "e.s)"},
    {Op::Concat, "concat(e.src.a, e.dst.m)", "shape-mismatch", "e.dst.m"},
    {Op::Concat, "concat(e.src.a)", "wrong-arguments", "concat"},
    {Op::Slice, "slice(e.dst.a, 2, 3)", "shape-mismatch", "slice"},
    {Op::Slice, "slice(e.dst.a, e.s, 1)", "bad-shape", "e.s"},
    {Op::Slice, "slice(e.dst.a, 0, 0)", "bad-shape", "0)"},
    {Op::Slice, "slice(e.s, 0, 1)", "shape-mismatch", "e.s"},
    {Op::Reshape, "reshape(e.dst.m, 3, 2)", "shape-mismatch", "reshape"},
    {Op::Reshape, "reshape(e.dst.m, 0, 8)", "bad-shape", "0"},
    {Op::Reshape, "reshape(e.dst.m, e.s)", "bad-shape", "e.s"},
    {Op::Expand, "expand(e.dst.m, 4, 2)", "shape-mismatch", "expand"},
    {Op::Expand, "expand(e.dst.a, 4, 0.5)", "bad-shape", "0.5"},
    {Op::Linear, "e.dst.c * W[e.etype]", "shape-mismatch", "*"},
    {Op::Linear, "linear(e.dst.a, e.dst.b)", "type-mismatch", "e.dst.b"},
    {Op::Linear, "linear(e.dst.a, W)", "weight-indexing", "W"},
    {Op::Linear, "2.0 * V", "type-mismatch", "*"},  // a linear transform needs node or edge data
    {Op::LinearT, "linear_t(e.dst.a, W[e.etype])", "shape-mismatch", "linear_t"},
};

// The column of the node the error is about: an attribute is positioned at its name (e.s at "s").
int error_column(const std::string& expr, const std::string& at) {
  size_t k = expr.find(at);
  REQUIRE(k != std::string::npos);
  if (at.size() > 2 && at.rfind("e.", 0) == 0) k += at.rfind('.') + 1;
  return kExprCol + static_cast<int>(k);
}

bool contains(const ExprP& e, Op op) {
  bool is_op = e->kind == ExprKind::Call || e->kind == ExprKind::Binary || e->kind == ExprKind::Neg;
  if (is_op && e->fn == op) return true;
  for (const ExprP& a : e->args)
    if (contains(a, op)) return true;
  return false;
}

std::unique_ptr<Compiled> compile_expr(const std::string& expr) {
  return compile_text("optypes.yaml", replace(kTypeSpec, "EXPR", expr));
}

}  // namespace

TEST_CASE("type inference on each operator: good cases", "[ops][verifier]") {
  std::set<Op> covered;
  for (const Good& g : kGood) {
    CAPTURE(g.expr);
    auto c = compile_expr(g.expr);
    INFO(c->rendered());
    REQUIRE(c->module);
    const StmtP& s = c->module->body[0]->body[0];
    CHECK(s->target->type.str() == g.type);
    CHECK(s->target->type.dtype == DType::FP32);
    CHECK(is_typed(*c->module));
    // The operator's node carries it (x * W is Linear once typed).
    CHECK(contains(s->value, g.op));
    covered.insert(g.op);
  }
  for (const OpInfo& op : all_ops()) {
    CAPTURE(op.name);
    CHECK(covered.count(op.op));
  }
}

TEST_CASE("type inference on each operator: bad cases are positioned errors", "[ops][verifier][diagnostics]") {
  std::set<Op> covered;
  for (const Bad& b : kBad) {
    CAPTURE(b.expr);
    auto c = compile_expr(b.expr);
    INFO(c->rendered());
    REQUIRE_FALSE(c->module);
    REQUIRE(c->diags.has_errors());
    const Diagnostic& d = c->diags.all().front();
    CHECK(d.kind == b.kind);
    CHECK(d.loc.line == kExprLine);
    CHECK(d.loc.col == error_column(b.expr, b.at));
    covered.insert(b.op);
  }
  for (const OpInfo& op : all_ops()) {
    CAPTURE(op.name);
    CHECK(covered.count(op.op));
  }
}

TEST_CASE("constants fold through the table (reshape dimensions, slopes)", "[ops][verifier]") {
  auto c = compile_expr("reshape(e.dst.m, sqrt(k * 4.0), -(-2))");
  INFO(c->rendered());
  REQUIRE(c->module);
  const ExprP& v = c->module->body[0]->body[0]->value;
  CHECK(v->type.str() == "edge[4, 2]");
  CHECK(v->args[1]->type.value == 4.0);
  CHECK(v->args[2]->type.value == 2.0);
  CHECK_FALSE(v->args[0]->type.value);  // not a constant
  // Division by zero is not a constant.
  auto z = compile_expr("leakyrelu(e.dst.a, 1.0 / 0.0)");
  REQUIRE_FALSE(z->module);
  CHECK(z->diags.all().front().kind == "not-constant");
}
