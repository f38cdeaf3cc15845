// The typed inter-operator IR: the Mutator rebuilds only changed nodes and keeps types valid, the
// verifier catches nodes whose type is not what inference gives, every pass keeps the IR typed (the driver
// with --verify-each), and lowering reads its shapes from the node types.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "driver/driver.h"
#include "helpers.h"
#include "ir/inter/mutator.h"
#include "ir/inter/ops.h"
#include "ir/inter/printer.h"
#include "ir/inter/typing.h"
#include "ir/inter/verifier.h"
#include "passes/passes.h"

using namespace hectorgen;
using namespace hectorgen::inter;
using namespace hectorgen::test;

namespace {

// The front end's typed module (its source file stays alive: diagnostics point into it).
Module typed_module(const std::string& spec) {
  static std::vector<std::unique_ptr<Compiled>> alive;
  alive.push_back(compile_spec(spec));
  const auto& c = alive.back();
  INFO(c->rendered());
  REQUIRE(c->module);
  REQUIRE(is_typed(*c->module));
  return *c->module;
}

Module with_body(const Module& m, std::vector<StmtP> body) {
  Module out = m;
  out.body = std::move(body);
  return out;
}

// Replaces every name `from` (a hyper-parameter) with a number.
class ReplaceName : public Mutator {
 public:
  ReplaceName(const Module& m, std::string from, double to) : Mutator(TypeContext::of(m)), from_(std::move(from)), to_(to) {}

 protected:
  ExprP visit_name(const ExprP& e) override {
    if (e->name == from_) return typed::number(to_, false, e->loc);
    return Mutator::visit_name(e);
  }

 private:
  std::string from_;
  double to_;
};

std::string spec_file(const std::string& name, const std::string& text) {
  auto dir = std::filesystem::temp_directory_path() / "hectorgen_typed_ir_test";
  std::filesystem::create_directories(dir);
  auto path = dir / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

struct Run {
  int code;
  std::string out, err;
};
Run run_driver(const std::string& spec, bool verify_each, const std::string& emit = "all") {
  driver::Options o;
  o.spec_path = spec;
  o.emit = emit;
  o.verify_each = verify_each;
  std::ostringstream out, err;
  int code = driver::run(o, out, err);
  return {code, out.str(), err.str()};
}

}  // namespace

TEST_CASE("a Mutator that changes nothing returns the very same nodes", "[mutator]") {
  Module m = typed_module("rgat.yaml");
  Mutator id(TypeContext::of(m));
  std::vector<StmtP> body = id.mutate(m.body);
  REQUIRE(body.size() == m.body.size());
  for (size_t i = 0; i < body.size(); ++i) CHECK(body[i] == m.body[i]);
}

TEST_CASE("the Mutator rebuilds only the changed path and re-infers its types", "[mutator]") {
  Module m = typed_module("rgat.yaml");
  // e["att"] = leakyrelu(dot(hs, w_s[e.etype]) + dot(ht, w_t[e.etype]), negative_slope): the slope becomes 0.3.
  std::vector<StmtP> body = ReplaceName(m, "negative_slope", 0.3).mutate(m.body);
  REQUIRE(body.size() == m.body.size());
  for (size_t i = 1; i < body.size(); ++i) CHECK(body[i] == m.body[i]);  // no use of the hyper-parameter
  const StmtP& before = m.body[0]->body[3];
  const StmtP& after = body[0]->body[3];
  CHECK(print_stmt(after) == "e[\"att\"] = leakyrelu(dot(hs, w_s[e.etype]) + dot(ht, w_t[e.etype]), 0.3)\n");
  CHECK(after != before);
  CHECK(after->value != before->value);
  CHECK(after->value->args[0] == before->value->args[0]);  // the untouched subtree is shared
  CHECK(after->target == before->target);                  // so is the target: it stores the same type
  for (size_t i = 0; i < 3; ++i) CHECK(body[0]->body[i] == m.body[0]->body[i]);
  CHECK(after->value->type == before->value->type);
  CHECK(after->value->args[1]->type.value == 0.3);
  Diagnostics d;
  CHECK(verify(with_body(m, body), d));
}

TEST_CASE("the Mutator retypes what depends on a loop variable whose loop changed", "[mutator]") {
  Module m = typed_module("rgat.yaml");
  // for e in g.edges(): e["att"] = exp(e["att"] - e.dst["att_max"])  -- as the incoming edges of each node.
  const StmtP& edges = m.body[2];
  REQUIRE(edges->loop == LoopKind::Edges);
  const ExprP& read = edges->body[0]->value->args[0]->args[1];  // e.dst["att_max"]
  REQUIRE(print_expr(read) == "e.dst[\"att_max\"]");
  CHECK(read->type.str() == "edge[1]");  // gathered per edge through its destination
  StmtP inner = Stmt::for_loop("e", LoopKind::IncomingEdges, "n", edges->body, edges->loc);
  StmtP node_form = Mutator(TypeContext::of(m)).mutate(Stmt::for_loop("n", LoopKind::DstNodes, "g", {inner}, edges->loc));
  const ExprP& retyped = node_form->body[0]->body[0]->value->args[0]->args[1];
  CHECK(retyped->type.str() == "node[1]");  // e.dst is now the loop node
  CHECK(retyped->args[1] == read->args[1]);  // the field name is shared
  std::vector<StmtP> body = m.body;
  body[2] = node_form;
  Module changed = with_body(m, body);
  Diagnostics d;
  CHECK(verify(changed, d));
  // Exactly what inference gives from scratch.
  Diagnostics d2;
  auto again = typecheck(changed, d2);
  REQUIRE(again);
  CHECK(again->body[2] == node_form);
}

TEST_CASE("typechecking a typed module rebuilds nothing; a wrong type is an internal error", "[verifier]") {
  Module m = typed_module("hgt.yaml");
  Diagnostics d;
  auto again = typecheck(m, d);
  REQUIRE(again);
  for (size_t i = 0; i < m.body.size(); ++i) CHECK(again->body[i] == m.body[i]);
  // A statement whose value claims another shape.
  std::vector<StmtP> body = m.body;
  const StmtP& loop = body[0];
  const StmtP& s = loop->body[0];
  Type wrong = s->value->type;
  wrong.shape = {7};
  std::vector<StmtP> inner = loop->body;
  inner[0] = Stmt::assign(s->target, s->op, typed::with_type(s->value, wrong), s->loc);
  body[0] = Stmt::for_loop(loop->var, loop->loop, loop->parent, inner, loop->loc);
  Diagnostics bad;
  CHECK_FALSE(verify(with_body(m, body), bad));
  REQUIRE(bad.has_errors());
  CHECK(bad.all().front().kind == "internal");
  // A field table that is not what inference computes.
  Module fields = m;
  fields.node_fields.begin()->second.shape.push_back(2);
  Diagnostics bad2;
  CHECK_FALSE(verify(fields, bad2));
}

TEST_CASE("every pass keeps the IR typed: --verify-each verifies after each and changes nothing", "[verifier][driver]") {
  std::vector<std::string> specs;
  for (const char* s : {"rgcn.yaml", "rgat.yaml", "hgt.yaml", "rgcn.json"}) specs.push_back(spec_path(s));
  for (const auto& f : std::filesystem::directory_iterator(std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs"))
    specs.push_back(f.path().string());
  for (const std::string& spec : specs) {
    CAPTURE(spec);
    Run plain = run_driver(spec, false), verified = run_driver(spec, true);
    INFO(verified.err);
    CHECK(verified.code == 0);
    CHECK(verified.code == plain.code);
    CHECK(verified.err == plain.err);
    CHECK(verified.out == plain.out);
  }
}

TEST_CASE("autodiff's training forward and backward are typed, with the types inference gives", "[verifier][autodiff]") {
  for (const char* spec : {"rgcn.yaml", "rgat.yaml", "hgt.yaml"}) {
    CAPTURE(spec);
    Module m = typed_module(spec);
    Diagnostics d;
    auto tm = passes::autodiff(m, d);
    REQUIRE(tm);
    CHECK(is_typed(tm->forward));
    CHECK(is_typed(tm->backward));
    Diagnostics v;
    CHECK(verify(tm->forward, v));
    CHECK(verify(tm->backward, v));
    CHECK(verify(passes::fuse_loops(tm->forward), v));
    CHECK(verify(passes::fuse_loops(tm->backward), v));
    std::ostringstream err;
    v.render(err);
    INFO(err.str());
    CHECK_FALSE(v.has_errors());
  }
}

// The lowering used to recompute shapes (Lowering::operand_shape / linear_type), and got linear
// transforms of a shared weight applied per head, outer and concat wrong; it reads node types now.
TEST_CASE("lowering: a shared weight applied to each head gets the verifier's shape", "[lowering]") {
  auto c = compile_text("lin_heads.yaml", R"(model: lin_heads
inputs:
  x: {per: node, shape: [64]}
weights:
  V: {per: none, shape: [16, 8]}
outputs:
  z: {per: edge, shape: [4, 8]}
program: |
  for e in g.edges():
      e["z"] = exp(reshape(e.src.x, 4, 16) * V)
)");
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics d;
  auto p = passes::lower(passes::fuse_loops(*c->module), d, "forward");
  REQUIRE(p);
  CHECK(intra::verify_program(*p).empty());  // was: "output rows of t$lin_0 have 8 elements, expected 4 x 8"
  const intra::TensorInfo* t = p->find("t$lin_0");
  REQUIRE(t);
  CHECK(t->shape == std::vector<int64_t>{4, 8});
  REQUIRE(std::holds_alternative<intra::GemmInstance>(p->kernels.front()));
  CHECK(std::get<intra::GemmInstance>(p->kernels.front()).heads == 4);
}

TEST_CASE("lowering: a weight-gradient operand computed by concat is stored with its real shape", "[lowering]") {
  auto c = compile_text("outer_concat.yaml", R"(model: outer_concat
inputs:
  x: {per: node, shape: [4]}
  a: {per: node, shape: [4]}
weights:
  W: {per: none, shape: [4, 8]}
outputs:
  z: {per: edge, shape: [8]}
  dW: {per: none, shape: [4, 8]}
program: |
  for e in g.edges():
      e["z"] = e.src.x * W
      dW += outer(e.src.x, concat(e.src.a, e.dst.a))
)");
  INFO(c->rendered());
  REQUIRE(c->module);
  Diagnostics d;
  auto p = passes::lower(passes::fuse_loops(*c->module), d, "forward");
  REQUIRE(p);
  CHECK(intra::verify_program(*p).empty());
  const intra::TensorInfo* t = p->find("t$op0");
  REQUIRE(t);
  CHECK(t->shape == std::vector<int64_t>{8});  // operand_shape said [4] (concat's first argument)
  // concat is not a traversal operator: the operand is stored by the PyTorch fallback, then the GEMM reads it.
  std::vector<size_t> kinds;
  for (const auto& k : p->kernels) kinds.push_back(k.index());
  CHECK(kinds == std::vector<size_t>{intra::Kernel(intra::GemmInstance{}).index(), intra::Kernel(intra::TorchInstance{}).index(),
                                     intra::Kernel(intra::WeightGradInstance{}).index()});
  CHECK(std::get<intra::WeightGradInstance>(p->kernels.back()).n == 8);
  Run r = run_driver(spec_file("outer_concat.yaml", c->file->text()), true);
  INFO(r.err);
  CHECK(r.code == 0);  // was an internal error: "does not support 'concat' inside a traversal"
}

TEST_CASE("warnings are given once, by the front end (the passes no longer re-verify)", "[verifier][driver]") {
  // `b` is used by the forward only; `U` is unused. The old pipeline re-verified the backward and the
  // training forward and repeated (or invented, for `b`) "never used" warnings.
  std::string spec = spec_file("warn_once.yaml", R"(model: warn_once
inputs:
  x: {per: node, shape: [8]}
weights:
  W: {per: none, shape: [8, 8]}
  b: {per: none, shape: [8]}
  U: {per: none, shape: [8, 8]}
outputs:
  y: {per: node, shape: [8]}
program: |
  for n in g.src_nodes():
      n["t"] = linear(n.x, W) + b
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["y"] += e.src["t"]
)");
  Run r = run_driver(spec, false);
  INFO(r.err);
  CHECK(r.code == 0);
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = r.err.find(what); at != std::string::npos; at = r.err.find(what, at + 1)) ++n;
    return n;
  };
  CHECK(count("weight 'U' is never used") == 1);
  CHECK(count("weight 'b' is never used") == 0);
  CHECK(count("warning:") == 1);
}
