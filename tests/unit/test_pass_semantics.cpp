// Semantic pass tests: for every bundled and test spec (specs/, tests/gpu/specs/, tests/specs/), on random
// graphs and random inputs, the float64 interpreter gives the same results before and after each pass of the
// pipeline over the inter IR:
//   fuse-loops  the forward's outputs; the training forward's outputs and fields; the backward's gradients;
//   autodiff    the training forward's outputs equal the forward's (SSA versions and saved locals change
//               nothing the model returns).
// inline-functions is covered by the interpreter needing inlined programs (every module here went through it)
// and by tests/passes/inline_functions.ir; lower by the GPU check (tools/gpu_check.sh), which runs the kernels
// against this interpreter. The pipeline tests at the end check --print-ir-after=all and --run-pass.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>

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

std::vector<std::string> all_specs() {
  std::vector<std::string> specs;
  for (const char* dir : {"specs", "tests/gpu/specs", "tests/specs"})
    for (const auto& entry : std::filesystem::directory_iterator(std::string(HECTORGEN_SOURCE_DIR) + "/" + dir)) {
      std::string ext = entry.path().extension().string();
      if (ext == ".yaml" || ext == ".yml" || ext == ".json") specs.push_back(entry.path().string());
    }
  std::sort(specs.begin(), specs.end());
  return specs;
}

// A random typed graph: isolated nodes, parallel edges and self-loops all possible.
HeteroGraph random_graph(std::mt19937& rng) {
  HeteroGraph g;
  g.num_nodes = std::uniform_int_distribution<int64_t>(1, 7)(rng);
  g.num_ntypes = std::uniform_int_distribution<int>(1, 3)(rng);
  g.num_etypes = std::uniform_int_distribution<int>(1, 3)(rng);
  for (int64_t n = 0; n < g.num_nodes; ++n) g.ntype.push_back(std::uniform_int_distribution<int>(0, g.num_ntypes - 1)(rng));
  int edges = std::uniform_int_distribution<int>(0, 14)(rng);
  std::uniform_int_distribution<int64_t> node(0, g.num_nodes - 1);
  for (int i = 0; i < edges; ++i) {
    g.src.push_back(node(rng));
    g.dst.push_back(node(rng));
    g.etype.push_back(std::uniform_int_distribution<int>(0, g.num_etypes - 1)(rng));
  }
  return g;
}

Tensor64 random_tensor(std::vector<int64_t> shape, std::mt19937& rng) {
  Tensor64 t = Tensor64::zeros(std::move(shape));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (double& v : t.data) v = u(rng);
  return t;
}

InterpretResult run(const Module& m, const HeteroGraph& g, const TensorMap& t, const std::string& what) {
  InterpretResult r = interpret(m, g, t);
  INFO(what << ": " << r.error);
  REQUIRE(r.ok);
  return r;
}

// Equal up to rounding: a pass may reorder independent loops, never an element's own arithmetic, so the
// tolerance is a few ulps.
void require_equal(const TensorMap& before, const TensorMap& after, const std::string& what) {
  for (const auto& [name, a] : before) {
    INFO(what << ": " << name);
    REQUIRE(after.count(name));
    const Tensor64& b = after.at(name);
    REQUIRE(a.shape == b.shape);
    size_t i = 0;
    while (i < a.data.size() && std::abs(a.data[i] - b.data[i]) <= 1e-12 * std::max(1.0, std::abs(a.data[i]))) ++i;
    if (i == a.data.size()) continue;
    INFO("element " << i << ": " << a.data[i] << " vs " << b.data[i]);
    FAIL("the results differ");
  }
}

void require_verifies(const Module& m, const std::string& what) {
  Diagnostics d;
  bool ok = verify(m, d);
  std::ostringstream s;
  d.render(s);
  INFO(what << "\n" << s.str() << print_module(m));
  REQUIRE(ok);
}

}  // namespace

TEST_CASE("every pass keeps the interpreter's results on random graphs, for every bundled and test spec",
          "[passes][semantics]") {
  std::vector<std::string> specs = all_specs();
  REQUIRE(specs.size() >= 10);
  for (const std::string& path : specs) {
    SECTION(std::filesystem::path(path).filename().string()) {
      auto c = compile_text(path, read_file(path));
      INFO(c->rendered());
      REQUIRE(c->module);
      const Module& forward = *c->module;

      Module fused = passes::fuse_loops(forward);
      require_verifies(fused, "fuse-loops (forward)");
      Diagnostics ad;
      std::optional<passes::TrainingModules> tm = passes::autodiff(forward, ad);
      std::optional<Module> fused_train, fused_backward;
      if (tm) {
        require_verifies(tm->forward, "autodiff (forward_train)");
        require_verifies(tm->backward, "autodiff (backward)");
        fused_train = passes::fuse_loops(tm->forward);
        fused_backward = passes::fuse_loops(tm->backward);
        require_verifies(*fused_train, "fuse-loops (forward_train)");
        require_verifies(*fused_backward, "fuse-loops (backward)");
      }

      std::mt19937 rng(1234);
      for (int trial = 0; trial < 3; ++trial) {
        HeteroGraph g = random_graph(rng);
        TensorMap t;
        for (const TensorDecl& d : forward.decl.inputs)
          if (d.from_graph.empty()) t[d.name] = random_tensor(full_shape(d, g), rng);
        for (const TensorDecl& d : forward.decl.weights) t[d.name] = random_tensor(full_shape(d, g), rng);
        add_row_maps(forward.decl, g, t, rng);
        std::string graph = fmt::format("graph {}: {} nodes, {} edges, {} node types, {} edge types", trial,
                                        g.num_nodes, g.num_edges(), g.num_ntypes, g.num_etypes);
        INFO(graph);

        InterpretResult before = run(forward, g, t, "forward");
        require_equal(before.outputs, run(fused, g, t, "fuse-loops (forward)").outputs, "fuse-loops (forward)");
        if (!tm) continue;

        InterpretResult train = run(tm->forward, g, t, "autodiff (forward_train)");
        require_equal(before.outputs, train.outputs, "autodiff: training forward vs forward");
        InterpretResult train_fused = run(*fused_train, g, t, "fuse-loops (forward_train)");
        require_equal(train.outputs, train_fused.outputs, "fuse-loops (forward_train) outputs");
        TensorMap saved_before, saved_after;
        for (const std::string& s : tm->saved) {
          saved_before[s] = train.fields.at(s);
          saved_after[s] = train_fused.fields.at(s);
        }
        require_equal(saved_before, saved_after, "fuse-loops (forward_train) saved fields");

        TensorMap bt = t;
        for (const auto& [s, v] : saved_before) bt[s] = v;
        for (const TensorDecl& o : forward.decl.outputs) bt[inter::grad_name(o.name)] = random_tensor(full_shape(o, g), rng);
        InterpretResult grads = run(tm->backward, g, bt, "autodiff (backward)");
        require_equal(grads.outputs, run(*fused_backward, g, bt, "fuse-loops (backward)").outputs,
                      "fuse-loops (backward) gradients");
      }
    }
  }
}

namespace {

// Linear transforms inside edge loops (what hoist-node-transforms moves out).
int edge_loop_linears(const std::vector<StmtP>& body, bool in_edge_loop = false) {
  int n = 0;
  std::function<void(const ExprP&)> count = [&](const ExprP& e) {
    if ((e->kind == ExprKind::Binary || e->kind == ExprKind::Call) && e->fn == Op::Linear) ++n;
    for (const ExprP& a : e->args) count(a);
  };
  for (const StmtP& s : body) {
    if (s->kind == StmtKind::For) n += edge_loop_linears(s->body, in_edge_loop || is_edge_loop(s->loop));
    else if (in_edge_loop && s->value) count(s->value);
  }
  return n;
}

}  // namespace

// hoist-node-transforms runs before autodiff: the forward's outputs must not change, and neither may the
// gradients the backward of the hoisted module computes (with its own saved fields) -- the whole training
// chain, hoist -> autodiff -> fuse-loops, against autodiff of the unhoisted module.
TEST_CASE("hoist-node-transforms keeps the outputs and the gradients, for every bundled and test spec",
          "[passes][semantics][hoist]") {
  for (const std::string& path : all_specs()) {
    SECTION(std::filesystem::path(path).filename().string()) {
      auto c = compile_text(path, read_file(path));
      INFO(c->rendered());
      REQUIRE(c->module);
      const Module& forward = *c->module;
      Module hoisted = passes::hoist_node_transforms(forward);
      require_verifies(hoisted, "hoist-node-transforms");
      CHECK(edge_loop_linears(hoisted.body) <= edge_loop_linears(forward.body));
      Diagnostics ad, hd;
      std::optional<passes::TrainingModules> tm = passes::autodiff(forward, ad);
      std::optional<passes::TrainingModules> th = passes::autodiff(hoisted, hd);
      REQUIRE(tm.has_value() == th.has_value());
      std::optional<Module> hb;
      if (th) hb = passes::fuse_loops(th->backward);

      std::mt19937 rng(4321);
      for (int trial = 0; trial < 3; ++trial) {
        HeteroGraph g = random_graph(rng);
        TensorMap t;
        for (const TensorDecl& d : forward.decl.inputs)
          if (d.from_graph.empty()) t[d.name] = random_tensor(full_shape(d, g), rng);
        for (const TensorDecl& d : forward.decl.weights) t[d.name] = random_tensor(full_shape(d, g), rng);
        add_row_maps(forward.decl, g, t, rng);
        INFO(fmt::format("graph {}: {} nodes, {} edges", trial, g.num_nodes, g.num_edges()));
        InterpretResult before = run(forward, g, t, "forward");
        require_equal(before.outputs, run(hoisted, g, t, "hoisted").outputs, "hoist-node-transforms (forward)");
        if (!tm) continue;
        TensorMap d_out;
        for (const TensorDecl& o : forward.decl.outputs) d_out[inter::grad_name(o.name)] = random_tensor(full_shape(o, g), rng);
        auto gradients = [&](const passes::TrainingModules& m, const Module& backward, const std::string& what) {
          InterpretResult train = run(m.forward, g, t, what + " (forward_train)");
          TensorMap bt = t;
          for (const std::string& s : m.saved) bt[s] = train.fields.at(s);
          for (const auto& [n, v] : d_out) bt[n] = v;
          return run(backward, g, bt, what + " (backward)").outputs;
        };
        require_equal(gradients(*tm, tm->backward, "unhoisted"), gradients(*th, *hb, "hoisted"),
                      "hoist-node-transforms (gradients)");
      }
    }
  }
}

namespace {

void require_close(const TensorMap& before, const TensorMap& after, const std::string& what);

int count_pair_loops(const std::vector<StmtP>& body) {
  int n = 0;
  for (const StmtP& s : body)
    if (s->kind == StmtKind::For && s->loop == LoopKind::SrcPairs) ++n;
  return n;
}

}  // namespace

// compact-materialization runs before autodiff (after hoist-node-transforms, as in the pipeline): the forward's
// outputs and the gradients of the whole training chain (compact -> autodiff -> fuse-loops) must equal those of
// the uncompacted module, on random graphs with parallel edges (pairs shared by several edges) and self-loops.
TEST_CASE("compact-materialization keeps the outputs and the gradients, for every bundled and test spec",
          "[passes][semantics][compact]") {
  for (const std::string& path : all_specs()) {
    SECTION(std::filesystem::path(path).filename().string()) {
      auto c = compile_text(path, read_file(path));
      INFO(c->rendered());
      REQUIRE(c->module);
      const Module forward = passes::hoist_node_transforms(*c->module);
      Module compact = passes::compact_materialization(forward, Materialization::Compact);
      require_verifies(compact, "compact-materialization");
      CHECK(passes::compact_materialization(forward, Materialization::Vanilla).body == forward.body);
      INFO(print_module(compact));
      Diagnostics ad, cd;
      std::optional<passes::TrainingModules> tm = passes::autodiff(forward, ad);
      std::optional<passes::TrainingModules> tc = passes::autodiff(compact, cd);
      REQUIRE(tm.has_value() == tc.has_value());
      std::optional<Module> cb;
      if (tc) {
        require_verifies(tc->forward, "compact: autodiff (forward_train)");
        require_verifies(tc->backward, "compact: autodiff (backward)");
        cb = passes::fuse_loops(tc->backward);
        require_verifies(*cb, "compact: fuse-loops (backward)");
      }
      std::mt19937 rng(2468);
      for (int trial = 0; trial < 4; ++trial) {
        HeteroGraph g = random_graph(rng);
        TensorMap t;
        for (const TensorDecl& d : forward.decl.inputs)
          if (d.from_graph.empty()) t[d.name] = random_tensor(full_shape(d, g), rng);
        for (const TensorDecl& d : forward.decl.weights) t[d.name] = random_tensor(full_shape(d, g), rng);
        add_row_maps(forward.decl, g, t, rng);
        INFO(fmt::format("graph {}: {} nodes, {} edges, {} pairs", trial, g.num_nodes, g.num_edges(), num_src_etype_pairs(g)));
        InterpretResult before = run(forward, g, t, "forward");
        require_equal(before.outputs, run(compact, g, t, "compact").outputs, "compact-materialization (forward)");
        require_equal(before.outputs, run(passes::fuse_loops(compact), g, t, "compact, fused").outputs,
                      "compact-materialization + fuse-loops (forward)");
        if (!tm) continue;
        TensorMap d_out;
        for (const TensorDecl& o : forward.decl.outputs) d_out[inter::grad_name(o.name)] = random_tensor(full_shape(o, g), rng);
        auto gradients = [&](const passes::TrainingModules& m, const Module& backward, const std::string& what) {
          InterpretResult train = run(m.forward, g, t, what + " (forward_train)");
          TensorMap bt = t;
          for (const std::string& s : m.saved) bt[s] = train.fields.at(s);
          for (const auto& [n, v] : d_out) bt[n] = v;
          return run(backward, g, bt, what + " (backward)").outputs;
        };
        require_close(gradients(*tm, tm->backward, "vanilla"), gradients(*tc, *cb, "compact"),
                      "compact-materialization (gradients)");
      }
    }
  }
}

TEST_CASE("compact-materialization: RGAT's message and attention half, HGT's message and key transform move to pairs",
          "[passes][compact]") {
  auto pair_fields = [](const char* spec) {
    auto c = compile_spec(spec);
    REQUIRE(c->module);
    Module m = passes::compact_materialization(passes::hoist_node_transforms(*c->module), Materialization::Compact);
    INFO(print_module(m));
    CHECK(count_pair_loops(m.body) == 1);
    std::set<std::string> names;
    for (const auto& [n, f] : m.pair_fields) names.insert(n);
    CHECK(m.edge_fields.count("msg") == 0);
    return names;
  };
  CHECK(pair_fields("rgat.yaml") == std::set<std::string>{"hs", "msg", "dot$hs"});
  CHECK(pair_fields("hgt.yaml") == std::set<std::string>{"lin$k", "msg"});
  // RGCN's message is scaled per edge (1/c_{v,r}) and scattered in one statement: its transform is hoisted to the
  // pairs, the per-edge scale stays.
  auto c = compile_spec("rgcn.yaml");
  REQUIRE(c->module);
  Module m = passes::compact_materialization(passes::hoist_node_transforms(*c->module), Materialization::Compact);
  INFO(print_module(m));
  CHECK(count_pair_loops(m.body) == 1);
}

TEST_CASE("hoist-node-transforms: gcn_shared's shared projection becomes an N-row GEMM in every phase",
          "[passes][hoist]") {
  std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/tests/specs/gcn_shared.yaml";
  auto c = compile_text(path, read_file(path));
  REQUIRE(c->module);
  CHECK(edge_loop_linears(c->module->body) == 1);
  Module hoisted = passes::hoist_node_transforms(*c->module);
  CHECK(edge_loop_linears(hoisted.body) == 0);
  REQUIRE(hoisted.node_fields.count("feature$W"));
  Diagnostics d;
  std::optional<passes::TrainingModules> tm = passes::autodiff(hoisted, d);
  REQUIRE(tm);
  for (const Module* m : {&tm->forward, &tm->backward}) {
    Module fused = passes::fuse_loops(*m);
    CHECK(edge_loop_linears(fused.body) == 0);
    std::optional<intra::Program> p = passes::lower(fused, d, m == &tm->forward ? "forward_train" : "backward", tm->saved);
    INFO(print_module(fused));
    REQUIRE(p);
    int gemms = 0;
    for (const intra::Kernel& k : p->kernels) {
      if (const auto* g = std::get_if<intra::GemmInstance>(&k)) {
        CHECK(g->rows == intra::Rows::Nodes);  // x W and dX = dY W^T over the nodes
        ++gemms;
      }
      if (const auto* w = std::get_if<intra::WeightGradInstance>(&k)) CHECK(w->rows == intra::Rows::Nodes);  // dW = X^T dY
    }
    CHECK(gemms == 1);
  }
}

TEST_CASE("pipeline: --print-ir-after=all prints every phase after every pass, in pass_names() order",
          "[passes][pipeline]") {
  driver::Options o;
  o.spec_path = spec_path("rgat.yaml");
  o.print_ir_after = "all";
  o.verify_each = true;
  auto spec = driver::read_source(o.spec_path, std::cerr);
  REQUIRE(spec);
  OutputSet files;
  std::ostringstream log, err;
  REQUIRE(driver::compile(*spec, o, files, log, err) == 0);
  INFO(err.str());
  std::vector<std::string> expected;
  for (const std::string& pass : driver::pass_names()) {
    bool front = pass == "parse" || pass == "inline-functions" || pass == "typecheck" || pass == "reorder-linear" ||
                 pass == "hoist-node-transforms" || pass == "compact-materialization";
    for (const char* phase : {"forward", "forward_train", "backward"}) {
      if (front && std::string(phase) != "forward") continue;
      expected.push_back(fmt::format("# ---- IR after {} ({}) ----", pass, phase));
    }
  }
  std::vector<std::string> banners;
  std::istringstream lines(log.str());
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("# ---- IR after ", 0) == 0) banners.push_back(line);
  CHECK(banners == expected);
  // compile() does no I/O: the files are in the OutputSet, the output directory is not touched.
  CHECK(files.files().count("rgat_kernels.cu") == 1);
  CHECK(files.files().count("rgat.backward.inter.ir") == 1);
}

TEST_CASE("pipeline: one pass on printed IR equals that pass in the pipeline", "[passes][pipeline]") {
  // fuse-loops on the printed typed forward (what --run-pass reads) gives the pipeline's forward IR.
  for (const char* name : {"rgcn.yaml", "rgat.yaml", "hgt.yaml"}) {
    auto c = compile_spec(name);
    REQUIRE(c->module);
    std::string text = print_module(*c->module);
    SourceFile f("<typed>", text);
    driver::Options o;
    o.run_pass = "fuse-loops";
    o.verify_each = true;
    std::ostringstream out, err;
    REQUIRE(driver::run_pass(f, o, out, err) == 0);
    INFO(err.str());
    std::string expected = read_file(std::string(HECTORGEN_SOURCE_DIR) + "/generated/" +
                                     std::string(name).substr(0, std::string(name).find('.')) + "/" +
                                     std::string(name).substr(0, std::string(name).find('.')) + ".inter.ir");
    CHECK(out.str() == expected);
  }
}

namespace {

// Equal up to the rounding of reassociated sums (reorder-linear computes x · (W wᵀ) instead of (x W) · w).
void require_close(const TensorMap& before, const TensorMap& after, const std::string& what) {
  for (const auto& [name, a] : before) {
    INFO(what << ": " << name);
    REQUIRE(after.count(name));
    const Tensor64& b = after.at(name);
    REQUIRE(a.shape == b.shape);
    size_t i = 0;
    while (i < a.data.size() && std::abs(a.data[i] - b.data[i]) <= 1e-9 * std::max(1.0, std::abs(a.data[i]))) ++i;
    if (i == a.data.size()) continue;
    INFO("element " << i << ": " << a.data[i] << " vs " << b.data[i]);
    FAIL("the results differ");
  }
}

int count_op(const std::vector<StmtP>& body, Op op) {
  int n = 0;
  std::function<void(const ExprP&)> count = [&](const ExprP& e) {
    if ((e->kind == ExprKind::Binary || e->kind == ExprKind::Call) && e->fn == op) ++n;
    for (const ExprP& a : e->args) count(a);
  };
  for (const StmtP& s : body) {
    if (s->kind == StmtKind::For) n += count_op(s->body, op);
    else if (s->value) count(s->value);
  }
  return n;
}

}  // namespace

// reorder-linear (on and auto) runs before autodiff: the outputs and the gradients of the whole training chain,
// reorder -> autodiff -> fuse-loops, equal those of the unreordered module's on random graphs.
TEST_CASE("reorder-linear keeps the outputs and the gradients, for every bundled and test spec",
          "[passes][semantics][reorder]") {
  for (const std::string& path : all_specs()) {
    for (Reorder mode : {Reorder::On, Reorder::Auto}) {
      SECTION(std::filesystem::path(path).filename().string() + " reorder " + to_string(mode)) {
        auto c = compile_text(path, read_file(path));
        INFO(c->rendered());
        REQUIRE(c->module);
        const Module& forward = *c->module;
        Module reordered = passes::reorder_linear(forward, mode);
        require_verifies(reordered, "reorder-linear");
        CHECK(edge_loop_linears(reordered.body) <= edge_loop_linears(forward.body));
        Diagnostics ad, rd;
        std::optional<passes::TrainingModules> tm = passes::autodiff(forward, ad);
        std::optional<passes::TrainingModules> tr = passes::autodiff(reordered, rd);
        INFO((rd.all().empty() ? std::string() : rd.all().front().message));
        REQUIRE(tm.has_value() == tr.has_value());
        std::optional<Module> rb;
        if (tr) rb = passes::fuse_loops(tr->backward);

        std::mt19937 rng(9876);
        for (int trial = 0; trial < 3; ++trial) {
          HeteroGraph g = random_graph(rng);
          TensorMap t;
          for (const TensorDecl& d : forward.decl.inputs)
            if (d.from_graph.empty()) t[d.name] = random_tensor(full_shape(d, g), rng);
          for (const TensorDecl& d : forward.decl.weights) t[d.name] = random_tensor(full_shape(d, g), rng);
        add_row_maps(forward.decl, g, t, rng);
          INFO(fmt::format("graph {}: {} nodes, {} edges", trial, g.num_nodes, g.num_edges()));
          InterpretResult before = run(forward, g, t, "forward");
          require_close(before.outputs, run(reordered, g, t, "reordered").outputs, "reorder-linear (forward)");
          if (!tm) continue;
          TensorMap d_out;
          for (const TensorDecl& o : forward.decl.outputs)
            d_out[inter::grad_name(o.name)] = random_tensor(full_shape(o, g), rng);
          auto gradients = [&](const passes::TrainingModules& m, const Module& backward, const std::string& what) {
            InterpretResult train = run(m.forward, g, t, what + " (forward_train)");
            TensorMap bt = t;
            for (const std::string& s : m.saved) bt[s] = train.fields.at(s);
            for (const auto& [n, v] : d_out) bt[n] = v;
            return run(backward, g, bt, what + " (backward)").outputs;
          };
          require_close(gradients(*tm, passes::fuse_loops(tm->backward), "unreordered"),
                        gradients(*tr, *rb, "reordered"), "reorder-linear (gradients)");
        }
      }
    }
  }
}

// RGAT (one head): `on` reorders both attention dots; `auto` only dot(ht, w_t), whose transform then dies (the
// E-row GEMM of ht is gone), and leaves dot(hs, w_s), whose hs the message still needs. Off changes nothing.
TEST_CASE("reorder-linear: rgat's attention halves become weight-weight products", "[passes][reorder]") {
  std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/specs/rgat.yaml";
  auto c = compile_text(path, read_file(path));
  REQUIRE(c->module);
  const Module& m = *c->module;
  CHECK(edge_loop_linears(m.body) == 2);
  CHECK(print_module(passes::reorder_linear(m, Reorder::Off)) == print_module(m));
  Module on = passes::reorder_linear(m, Reorder::On);
  CHECK(count_op(on.body, Op::LinearT) == 2);
  CHECK(edge_loop_linears(on.body) == 1);  // hs (the message) stays
  Module au = passes::reorder_linear(m, Reorder::Auto);
  CHECK(count_op(au.body, Op::LinearT) == 1);
  CHECK(edge_loop_linears(au.body) == 1);
  CHECK(print_module(au).find("ht =") == std::string::npos);
  CHECK(print_module(au).find("dot(hs, w_s[e.etype])") != std::string::npos);
  // The backward differentiates the weight product: d$W and d$w_t get contributions through linear_t.
  Diagnostics d;
  std::optional<passes::TrainingModules> tm = passes::autodiff(au, d);
  REQUIRE(tm);
  std::string bw = print_module(tm->backward);
  INFO(bw);
  CHECK(bw.find("d$w_t[e.etype] +=") != std::string::npos);
  CHECK(bw.find("d$W[e.etype] +=") != std::string::npos);
}

// Several heads: the weight product of a head needs a column block of W, which no operator selects: no rewrite.
TEST_CASE("reorder-linear leaves multi-head dots alone", "[passes][reorder]") {
  std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/specs/rgat.yaml";
  std::string text = read_file(path);
  size_t at = text.find("heads: 1");
  REQUIRE(at != std::string::npos);
  text.replace(at, 8, "heads: 2");
  auto c = compile_text(path, text);
  INFO(c->rendered());
  REQUIRE(c->module);
  Module on = passes::reorder_linear(*c->module, Reorder::On);
  CHECK(count_op(on.body, Op::LinearT) == 0);
}
