// materialization: auto: the cost model (emit/cost.h) and the module that holds both programs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "emit/cost.h"
#include "emit/emit.h"
#include "emit/traversal.h"
#include "ir/intra/launch.h"
#include "helpers.h"
#include "ir/intra/parser.h"

using namespace hectorgen;
using emit::CostDomain;
using emit::PhaseCost;
using intra::Program;
using intra::TensorInfo;
using inter::Per;

namespace {

double bytes(const PhaseCost& c, CostDomain d) { return c.bytes[static_cast<size_t>(d)]; }
double gather_rows(const PhaseCost& c, CostDomain d) { return c.gather_rows[static_cast<size_t>(d)]; }
double search_rows(const PhaseCost& c, CostDomain d) { return c.search_rows[static_cast<size_t>(d)]; }

// A program with the tensors the hand-built kernels below read.
Program tensors_program() {
  Program p;
  p.model = "m";
  auto tensor = [](const char* name, intra::Role role, Per per, std::vector<int64_t> shape,
                   inter::DType storage = inter::DType::FP32) {
    TensorInfo t;
    t.name = name;
    t.role = role;
    t.per = per;
    t.shape = std::move(shape);
    t.storage = storage;
    return t;
  };
  p.tensors = {tensor("x", intra::Role::Input, Per::Node, {64}),      tensor("W", intra::Role::Weight, Per::Etype, {64, 32}),
               tensor("y", intra::Role::Temp, Per::Edge, {32}),       tensor("s", intra::Role::Temp, Per::Edge, {}),
               tensor("hp", intra::Role::Temp, Per::Pair, {32}),      tensor("dW", intra::Role::Output, Per::Etype, {64, 32}),
               tensor("b", intra::Role::Input, Per::Node, {64}, inter::DType::BF16)};
  return p;
}

struct Generated {
  int status = 0;
  std::string err;
  OutputSet files;
  const std::string& file(const std::string& name) const {
    auto it = files.files().find(name);
    if (it == files.files().end()) throw std::runtime_error("test: no generated file " + name);
    return it->second;
  }
  std::vector<Program> programs() const {
    for (const auto& [name, text] : files.files())
      if (name.size() > 9 && name.compare(name.size() - 9, 9, ".intra.ir") == 0) {
        SourceFile f(name, text);
        Diagnostics d;
        auto parsed = intra::parse_programs(f, d);
        if (!parsed) throw std::runtime_error("test: the intra IR does not parse");
        return *parsed;
      }
    throw std::runtime_error("test: no .intra.ir");
  }
};

Generated generate(const std::string& path, const std::string& text, const std::string& materialization = "") {
  Generated g;
  SourceFile spec(path, text);
  driver::Options opts;
  opts.spec_path = path;
  opts.materialization = materialization;
  std::ostringstream log, err;
  g.status = driver::compile(spec, opts, g.files, log, err);
  g.err = err.str();
  return g;
}

Generated generate_spec(const std::string& relpath, const std::string& materialization = "") {
  const std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/" + relpath;
  return generate(path, test::read_file(path), materialization);
}

std::vector<PhaseCost> costs(const std::vector<Program>& phases, bool compact, bool training) {
  std::vector<PhaseCost> out;
  for (const Program& p : emit::program_phases(phases, compact)) {
    const std::string phase = compact ? p.phase.substr(8) : p.phase;
    if (training ? phase != "forward" : phase == "forward") out.push_back(emit::phase_cost(p));
  }
  return out;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("cost: a GEMM moves its gathered input and output rows per row, its weight once", "[cost]") {
  Program p = tensors_program();
  intra::GemmInstance g;
  g.name = "m_fw_gemm_y";
  g.rows = intra::Rows::Edges;
  g.x = "x";
  g.gather = intra::Gather::Src;
  g.w = "W";
  g.segments = intra::Segments::Etype;
  g.y = "y";
  g.row_scalar = "s";
  g.k = 64;
  g.n = 32;
  PhaseCost c = emit::kernel_cost(p, g);
  CHECK(c.launches == 1);
  CHECK(bytes(c, CostDomain::Edge) == 64 * 4 + 4 + 32 * 4 + 4);  // x row, src index, y row, row scalar
  CHECK(bytes(c, CostDomain::Etype) == 64 * 32 * 4);              // W[t]
  CHECK(bytes(c, CostDomain::Node) == 0);
  CHECK(bytes(c, CostDomain::Fixed) == 0);
  g.accumulate = true;  // y[row] += : read and written
  CHECK(bytes(emit::kernel_cost(p, g), CostDomain::Edge) == 64 * 4 + 4 + 2 * 32 * 4 + 4);
  g.x = "b";  // a bf16 row is half the bytes
  CHECK(bytes(emit::kernel_cost(p, g), CostDomain::Edge) == 64 * 2 + 4 + 2 * 32 * 4 + 4);
}

TEST_CASE("cost: a gather sum reads per entry of its CSR, writes per row; a weight gradient launches twice", "[cost]") {
  Program p = tensors_program();
  intra::GatherSumInstance gs;
  gs.name = "m_bw_sum_hp";
  gs.x = "y";
  gs.y = "hp";
  gs.csr = intra::GatherCsr::PairEdges;
  gs.scale = "s";
  PhaseCost c = emit::kernel_cost(p, gs);
  CHECK(bytes(c, CostDomain::Pair) == 2 * 4 + 32 * 4);  // CSR offsets, the pair's row
  CHECK(bytes(c, CostDomain::Edge) == 4 + 32 * 4 + 4);  // edge id, the edge's row, its scale
  intra::WeightGradInstance w;
  w.name = "m_bw_wgrad_W";
  w.rows = intra::Rows::Pairs;
  w.x = "x";
  w.x_gather = intra::Gather::Src;
  w.dy = "hp";
  w.dw = "dW";
  w.segments = intra::Segments::Etype;
  w.accumulate = false;
  PhaseCost wc = emit::kernel_cost(p, w);
  CHECK(wc.launches == 2);
  CHECK(bytes(wc, CostDomain::Pair) == 64 * 4 + 4 + 32 * 4);
  CHECK(bytes(wc, CostDomain::Etype) == 2 * 64 * 32 * 4);  // the partials written and read: dW's size each
}

TEST_CASE("cost: each row of a gather sum is a gather row; traversals, GEMMs and weight gradients have none", "[cost]") {
  Program p = tensors_program();
  intra::GatherSumInstance gs;
  gs.name = "m_bw_sum_hp";
  gs.x = "y";
  gs.y = "hp";
  gs.csr = intra::GatherCsr::PairEdges;  // a pair's edges: one row per pair
  gs.scale = "s";
  gs.group_rows_below = 0;  // no rows variant (below: the grouped rows)
  PhaseCost c = emit::kernel_cost(p, gs);
  CHECK(c.grouped_rows.empty());
  CHECK(gather_rows(c, CostDomain::Pair) == 1);
  CHECK(gather_rows(c, CostDomain::Edge) == 0);
  gs.csr = intra::GatherCsr::NodePairs;  // a node's pairs: one row per node
  gs.x = "hp";
  gs.y = "x";
  gs.scale.clear();
  c = emit::kernel_cost(p, gs);
  CHECK(gather_rows(c, CostDomain::Node) == 1);
  CHECK(gather_rows(c, CostDomain::Pair) == 0);
  // the bytes are counted as before, beside the rows
  CHECK(bytes(c, CostDomain::Node) == 2 * 4 + 64 * 4);  // CSR offsets, the node's row
  CHECK(bytes(c, CostDomain::Pair) == 4 + 32 * 4);      // pair id, the pair's row
  // a CSR walk of a traversal reads long rows (a node's edges) and is charged its bytes only
  using intra::Def, intra::Instr, intra::Load;
  intra::EdgeLoop walk;
  walk.var = "e";
  walk.pos = "i_e";
  walk.node = "n";
  walk.body = {Instr{intra::IndexDef{"e_pair", intra::GraphArray::EdgePair, "e"}},
               Instr{Def{"v_hp", false, {}, Load{"hp", "e_pair"}}}};
  intra::TraversalInstance t;
  t.name = "m_fw_nodes_h";
  t.rows = inter::LoopKind::DstNodes;
  t.row = "n";
  t.body = {Instr{walk}};
  PhaseCost tc = emit::kernel_cost(p, t);
  CHECK(tc.gather_rows == emit::Bytes{});
  CHECK(bytes(tc, CostDomain::Edge) == 4 + 4 + 32 * 4);  // edge id, edge_pair, the pair's row
  intra::GemmInstance g;
  g.name = "m_fw_gemm_y";
  g.rows = intra::Rows::Edges;
  g.x = "x";
  g.gather = intra::Gather::Src;
  g.w = "W";
  g.y = "y";
  CHECK(emit::kernel_cost(p, g).gather_rows == emit::Bytes{});
  // a phase sums its kernels' gather rows
  p.kernels = {gs, gs, t};
  CHECK(gather_rows(emit::phase_cost(p), CostDomain::Node) == 2);
}

TEST_CASE("cost: a gather sum with a rows variant counts a row 1 / groups of a gather row where the launcher runs it",
          "[cost]") {
  Program p = tensors_program();
  intra::GatherSumInstance gs;
  gs.name = "m_bw_sum_hp";
  gs.x = "y";
  gs.y = "hp";
  gs.numel = 32;
  gs.csr = intra::GatherCsr::PairEdges;
  const intra::GatherSumRows variant = intra::gather_sum_rows(gs);  // auto: below 4, the groups of a row of 32
  REQUIRE(variant.below == intra::kAutoGroupRowsBelow);
  REQUIRE(variant.row_groups > 1);
  PhaseCost c = emit::kernel_cost(p, gs);
  CHECK(c.gather_rows == emit::Bytes{});
  REQUIRE(c.grouped_rows.size() == 1);
  CHECK(c.grouped_rows[0] == emit::GroupedRows{CostDomain::Pair, CostDomain::Edge, variant.below, variant.row_groups});
  // 3 edges a pair: below 4, the rows variant (a group a row); 5 edges a pair: the split kernel (a warp a row)
  emit::GraphCounts few{1000, 3000, 1000, 10, 1}, many{1000, 5000, 1000, 10, 1};
  CHECK(emit::phase_gather_rows(c, few) == Approx(1000.0 / variant.row_groups));
  CHECK(emit::phase_gather_rows(c, many) == 1000);
  emit::Tuning t{0, 1e9, 1, 2.0, 0};  // the gather rows' latency only
  CHECK(emit::estimated_seconds(c, few, t) == Approx(1000.0 / variant.row_groups * 2e-9));
  // a node's pairs: rows per node, entries per pair
  gs.csr = intra::GatherCsr::NodePairs;
  gs.x = "hp";
  gs.y = "x";
  gs.numel = 64;
  c = emit::kernel_cost(p, gs);
  REQUIRE(c.grouped_rows.size() == 1);
  CHECK(c.grouped_rows[0].rows == CostDomain::Node);
  CHECK(c.grouped_rows[0].entries == CostDomain::Pair);
  // never (group_rows_below 0), rows in step (16 lanes) or entries in batches: no rows variant, a gather row a row
  for (auto change : {+[](intra::GatherSumInstance& s) { s.group_rows_below = 0; },
                      +[](intra::GatherSumInstance& s) { s.row_lanes = 16; },
                      +[](intra::GatherSumInstance& s) { s.edge_batch = 2; }}) {
    intra::GatherSumInstance plain = gs;
    change(plain);
    CHECK(intra::gather_sum_rows(plain).below == 0);
    PhaseCost pc = emit::kernel_cost(p, plain);
    CHECK(pc.grouped_rows.empty());
    CHECK(gather_rows(pc, CostDomain::Node) == 1);
  }
  // a phase keeps each kernel's grouped rows
  p.kernels = {gs, gs};
  CHECK(emit::phase_cost(p).grouped_rows.size() == 2);
}

TEST_CASE("cost: a row that finds its edge type by a search of the type offsets is a search row", "[cost]") {
  Program p = tensors_program();
  using intra::Def, intra::Instr, intra::Load;
  intra::TraversalInstance t;
  t.name = "m_fw_pairs_dot";
  t.rows = inter::LoopKind::SrcPairs;
  t.row = "p";
  // A row of 64 values: one warp per row, whose lanes search together (one search row).
  t.body = {Instr{intra::IndexDef{"p_etype", intra::GraphArray::PairEtype, "p"}},
            Instr{Def{"v_hp", false, intra::RegType{{64}, intra::LaneLayout::Lanes}, Load{"hp", "p"}}}};
  REQUIRE_FALSE(intra::one_thread_per_row(t));
  PhaseCost c = emit::kernel_cost(p, t);
  CHECK(search_rows(c, CostDomain::Pair) == 1);
  CHECK(c.gather_rows == emit::Bytes{});
  // ceil(log2(etypes) / 5) rounds of the warp's 32-way search each: 1e5 pairs over 512 relations, 2 rounds
  emit::GraphCounts g;
  g.pairs = 1e5;
  g.etypes = 512;
  CHECK(emit::phase_search_rounds(c, g) == Approx(2e5));
  CHECK(emit::search_rounds(32) == 1);
  CHECK(emit::search_rounds(33) == 2);
  CHECK(emit::search_rounds(535) == 2);
  CHECK(emit::search_rounds(1024) == 2);
  CHECK(emit::search_rounds(1025) == 3);
  CHECK(emit::search_rounds(4) == 1);
  g.etypes = 1;  // one relation: nothing to search
  CHECK(emit::phase_search_rounds(c, g) == 0);
  // A scalar row: one thread per row, searching alone (a binary search, counted as 4 rounds)
  t.body = {Instr{intra::IndexDef{"p_etype", intra::GraphArray::PairEtype, "p"}},
            Instr{Def{"v_hp", false, {}, Load{"hp", "p"}}}};
  REQUIRE(intra::one_thread_per_row(t));
  CHECK(search_rows(emit::kernel_cost(p, t), CostDomain::Pair) == 4);
  // an edge's type is read directly (etype[e]): no search
  t.rows = inter::LoopKind::Edges;
  t.row = "e";
  t.body = {Instr{intra::IndexDef{"e_etype", intra::GraphArray::Etype, "e"}}};
  CHECK(emit::kernel_cost(p, t).search_rows == emit::Bytes{});
}

TEST_CASE("cost: seconds add gather_row_ns per gather row and search_round_ns per search round", "[cost]") {
  PhaseCost c;
  c.launches = 2;
  c.bytes = {0, 0, 100, 0, 0, 0};
  c.gather_rows = {0, 1, 0, 2, 0, 0};
  emit::GraphCounts g;
  g.nodes = 1e3;
  g.edges = 1e6;
  g.pairs = 1e5;
  emit::Tuning t{5, 1, 1, 0};
  const double base = 2 * 5e-6 + 100 * 1e6 / 1e9;
  CHECK(emit::estimated_seconds(c, g, t) == Approx(base));
  t.gather_row_ns = 0.5;
  CHECK(emit::estimated_seconds(c, g, t) == Approx(base + (1e3 + 2 * 1e5) * 0.5e-9));
  CHECK(emit::evaluate(c.gather_rows, g) == 1e3 + 2 * 1e5);
  c.search_rows = {0, 0, 0, 1, 0, 0};
  g.etypes = 8;
  t.search_round_ns = 0.25;
  CHECK(emit::estimated_seconds(c, g, t) == Approx(base + (1e3 + 2 * 1e5) * 0.5e-9 + 1 * 1e5 * 0.25e-9));
  g.etypes = 535;  // two rounds
  CHECK(emit::estimated_seconds(c, g, t) == Approx(base + (1e3 + 2 * 1e5) * 0.5e-9 + 2 * 1e5 * 0.25e-9));
}

TEST_CASE("cost: a phase sums its kernels and the zeroing of zero-initialised tensors", "[cost]") {
  Program p = tensors_program();
  p.tensors[2].zero_init = true;  // y: one fill, one write of E rows
  intra::SegmentSumInstance ss;
  ss.name = "m_bw_segsum_dW";
  ss.rows = intra::Rows::Edges;
  ss.v = "y";
  ss.dw = "dW";
  ss.segments = intra::Segments::Etype;
  p.kernels = {ss, ss};
  PhaseCost c = emit::phase_cost(p);
  CHECK(c.launches == 3);
  CHECK(bytes(c, CostDomain::Edge) == 3 * 32 * 4);
  CHECK(bytes(c, CostDomain::Etype) == 2 * 2 * 64 * 32 * 4);
}

TEST_CASE("cost: seconds are launches times the launch time plus bytes over the bandwidth", "[cost]") {
  PhaseCost c;
  c.launches = 10;
  c.bytes = {1000, 2, 100, 50, 8, 0};
  emit::GraphCounts g;
  g.nodes = 1e3;
  g.edges = 1e6;
  g.pairs = 1e5;
  g.etypes = 4;
  emit::Tuning t{5, 1, 1};
  const double moved = 1000 + 2 * 1e3 + 100 * 1e6 + 50 * 1e5 + 8 * 4;
  CHECK(emit::estimated_seconds(c, g, t) == Approx(10 * 5e-6 + moved / 1e9));
  CHECK(emit::estimated_seconds(std::vector<PhaseCost>{c, c}, g, t) == Approx(2 * (10 * 5e-6 + moved / 1e9)));
}

TEST_CASE("cost: the tuning table parses, has a default row, and refuses bad values", "[cost]") {
  const emit::TuningTable& table = emit::tuning_table();
  REQUIRE(table.count("default"));
  CHECK(table.count("sm_80"));
  CHECK(table.count("sm_90"));
  for (const auto& [arch, t] : table) {
    CAPTURE(arch);
    CHECK(t.launch_us > 0);
    CHECK(t.bandwidth_gbs > 0);
    CHECK(t.theta >= 0);
    CHECK(t.theta <= 1);
  }
  auto row = [](const std::string& body) { return "{\"architectures\": {" + body + "}}"; };
  CHECK(emit::parse_tuning(row("\"default\": {\"launch_us\": 2, \"bandwidth_gbs\": 100, \"theta\": 0.25}"))
            .at("default")
            .theta == 0.25);
  CHECK_THROWS_WITH(emit::parse_tuning(row("\"sm_90\": {\"launch_us\": 2, \"bandwidth_gbs\": 100, \"theta\": 0.25}")),
                    "tuning table: the 'default' architecture is missing");
  CHECK_THROWS_WITH(emit::parse_tuning(row("\"default\": {\"launch_us\": 2, \"bandwidth_gbs\": 100, \"theta\": 2}")),
                    "tuning table: 'theta' of 'default' must be in [0, 1], got 2");
  CHECK_THROWS_WITH(emit::parse_tuning(row("\"default\": {\"launch_us\": 2, \"theta\": 1}")),
                    "tuning table: architecture 'default' needs a number 'bandwidth_gbs'");
  // gather_row_ns is optional (0: the model without it) and not negative
  CHECK(emit::parse_tuning(row("\"default\": {\"launch_us\": 2, \"bandwidth_gbs\": 100, \"theta\": 1}")).at("default").gather_row_ns == 0);
  CHECK(emit::parse_tuning(row("\"default\": {\"launch_us\": 2, \"bandwidth_gbs\": 100, \"theta\": 1, \"gather_row_ns\": 0.25}"))
            .at("default")
            .gather_row_ns == 0.25);
  CHECK_THROWS_WITH(
      emit::parse_tuning(row("\"default\": {\"launch_us\": 2, \"bandwidth_gbs\": 100, \"theta\": 1, \"gather_row_ns\": -1}")),
      "tuning table: 'gather_row_ns' of 'default' must be in [0, 1000000], got -1");
  CHECK(emit::parse_tuning(row("\"default\": {\"launch_us\": 2, \"bandwidth_gbs\": 100, \"theta\": 1, \"search_round_ns\": 0.5}"))
            .at("default")
            .search_round_ns == 0.5);
  CHECK_THROWS_WITH(
      emit::parse_tuning(row("\"default\": {\"launch_us\": 2, \"bandwidth_gbs\": 100, \"theta\": 1, \"search_step_ns\": 0.5}")),
      Catch::Contains("architecture 'default' has an unknown key 'search_step_ns'"));
  CHECK_THROWS(emit::parse_tuning("{"));
}

TEST_CASE("cost: RGAT's compact program wins on graphs with many edges per unique pair, not on tiny or pair-free ones",
          "[cost][auto]") {
  Generated g = generate_spec("tests/gpu/specs/rgat_auto.yaml");
  INFO(g.err);
  REQUIRE(g.status == 0);
  const std::vector<Program> programs = g.programs();
  const emit::Tuning& h100 = emit::tuning_table().at("sm_90");
  for (bool training : {false, true}) {
    CAPTURE(training);
    const auto vanilla = costs(programs, false, training), compact = costs(programs, true, training);
    REQUIRE(vanilla.size() == (training ? 2u : 1u));
    REQUIRE(compact.size() == vanilla.size());
    // mag's statistics (the benchmark's synthetic graph): 1.9M nodes, 21M edges, 0.87M unique (source, relation)
    // pairs, 4 relations.
    emit::GraphCounts mag{1.9e6, 21e6, 0.87e6, 4, 4};
    CHECK(emit::estimated_seconds(compact, mag, h100) < 0.8 * emit::estimated_seconds(vanilla, mag, h100));
    // Every pair unique: the compact program only adds its indirections.
    emit::GraphCounts unique{1e6, 5e6, 5e6, 4, 1};
    CHECK(emit::estimated_seconds(compact, unique, h100) > emit::estimated_seconds(vanilla, unique, h100));
    // A graph of a few hundred edges: the launches decide.
    emit::GraphCounts tiny{300, 600, 500, 4, 1};
    CHECK(emit::estimated_seconds(compact, tiny, h100) > emit::estimated_seconds(vanilla, tiny, h100));
  }
  // wikikg2's statistics (the benchmark's synthetic graph): 2.5M nodes, 16.1M edges, 10.07M pairs over 535 relations.
  // The compact program moves fewer bytes, but its training walks 10M short pair rows and searches each pair's
  // relation: measured 25.2 vs 22.3 ms on an H200 (bench/results/tf32-all-variants-h200.jsonl), and the bytes alone
  // picked compact.
  emit::GraphCounts wikikg2{2.5e6, 16.1e6, 10.07e6, 535, 1};
  const auto vanilla = costs(programs, false, true), compact = costs(programs, true, true);
  emit::Tuning bytes_only = h100;
  bytes_only.gather_row_ns = bytes_only.search_round_ns = 0;
  CHECK(emit::estimated_seconds(compact, wikikg2, bytes_only) < emit::estimated_seconds(vanilla, wikikg2, bytes_only));
  CHECK(emit::estimated_seconds(compact, wikikg2, h100) > emit::estimated_seconds(vanilla, wikikg2, h100));
}

TEST_CASE("cost: a backward's cost splits by the gradients its kernels feed; the parts add up to the phase",
          "[cost][auto]") {
  Generated g = generate_spec("tests/specs/rgcn_auto.yaml");
  INFO(g.err);
  REQUIRE(g.status == 0);
  const std::vector<Program> programs = g.programs();
  for (bool compact : {false, true}) {
    CAPTURE(compact);
    const std::vector<Program> phases = emit::program_phases(programs, compact);
    REQUIRE(phases.size() == 3);
    const Program& bw = phases[2];
    std::vector<std::string> results;
    for (const TensorInfo& t : bw.tensors)
      if (t.role == intra::Role::Output) results.push_back(t.name);
    const std::map<uint64_t, PhaseCost> parts = emit::cost_by_results(bw, results, emit::results_fed(bw, results));
    PhaseCost sum;
    for (const auto& [mask, c] : parts) {
      CHECK(mask != 0);  // every kernel feeds a gradient
      sum.launches += c.launches;
      for (size_t i = 0; i < emit::kCostDomains; ++i) {
        sum.bytes[i] += c.bytes[i];
        sum.gather_rows[i] += c.gather_rows[i];
      }
      sum.grouped_rows.insert(sum.grouped_rows.end(), c.grouped_rows.begin(), c.grouped_rows.end());
    }
    const PhaseCost whole = emit::phase_cost(bw);
    CHECK(sum.launches == whole.launches);
    CHECK(sum.bytes == whole.bytes);
    CHECK(sum.gather_rows == whole.gather_rows);
    CHECK(sum.grouped_rows.size() == whole.grouped_rows.size());
    // The feature's gradient alone needs its own kernels (the transposed GEMMs and the sum into feature rows):
    // a layer whose features do not require grad skips them.
    const auto d_feature = std::find(results.begin(), results.end(), "d$feature");
    REQUIRE(d_feature != results.end());
    const uint64_t feature_only = uint64_t{1} << (d_feature - results.begin());
    REQUIRE(parts.count(feature_only));
    CHECK(parts.at(feature_only).launches >= 2);
    // ... in the compact program, the sum over each node's pairs: a gather sum over node rows (grouped: it has
    // a rows variant for nodes of few pairs).
    const auto& grouped = parts.at(feature_only).grouped_rows;
    CHECK(std::count_if(grouped.begin(), grouped.end(),
                        [](const emit::GroupedRows& k) { return k.rows == CostDomain::Node; }) == (compact ? 1 : 0));
  }
}

TEST_CASE("materialization: auto emits the vanilla and the compact program in one module, shared kernels once",
          "[auto][emit]") {
  Generated g = generate_spec("tests/gpu/specs/rgat_auto.yaml");
  INFO(g.err);
  REQUIRE(g.status == 0);
  const std::vector<Program> programs = g.programs();
  std::vector<std::string> phases;
  for (const Program& p : programs) phases.push_back(p.phase);
  CHECK(phases == std::vector<std::string>{"forward", "forward_train", "backward", "compact_forward",
                                           "compact_forward_train", "compact_backward"});
  for (const Program& p : programs)
    for (const intra::Kernel& k : p.kernels) {
      CAPTURE(p.phase);
      const std::string& name = intra::kernel_name(k);
      CHECK(name.rfind(p.phase.rfind("compact_", 0) == 0 ? "rgat_auto_compact_" : "rgat_auto_", 0) == 0);
    }
  // The vanilla program reads no pair layout; the compact one does; GRAPH_LAYOUTS is their union.
  CHECK(programs.front().layouts.count("compact_src_etype") == 0);
  CHECK(programs.back().layouts.count("compact_src_etype") == 1);
  const std::string& py = g.file("rgat_auto.py");
  CHECK(py.find("GRAPH_LAYOUTS = (\"compact_src_etype\", \"csr_by_dst\", \"csr_by_dst_pairs\", \"csr_by_src\", "
                "\"etype_sorted_coo\", )") != std::string::npos);
  CHECK(programs.front().layouts.count("csr_by_dst_pairs") == 0);  // the pairs of the compact node kernels' edges
  CHECK(programs.back().layouts.count("csr_by_dst_pairs") == 1);
  CHECK(py.find("RUNTIME_VERSION = \"1.5\"") != std::string::npos);  // RGAT reads no graph-derived input
  CHECK(py.find("def materialization(g, training=False, grads=None):") != std::string::npos);
  CHECK(py.find("def estimated_seconds(g, training=False, grads=None):") != std::string::npos);
  CHECK(py.find("compact_relations=compact_relations)") != std::string::npos);
  // Ops of both programs, each with its own Args struct.
  const std::string& host = g.file("rgat_auto_host.cpp");
  for (const char* op : {"forward", "forward_train", "backward", "compact_forward", "compact_forward_train", "compact_backward"}) {
    CAPTURE(op);
    CHECK(count(host, std::string("m.def(\"") + op + "(") == 1);
  }
  // Kernels identical in both programs are emitted once: the compact program's launchers call the vanilla ones.
  const std::string& cu = g.file("rgat_auto_kernels.cu");
  const size_t shared = count(cu, "  // same kernel as rgat_auto_f") + count(cu, "  // same kernel as rgat_auto_b");
  CHECK(shared > 0);
  Generated vanilla = generate_spec("tests/gpu/specs/rgat_auto.yaml", "vanilla");
  Generated compact = generate_spec("tests/gpu/specs/rgat_auto.yaml", "compact");
  REQUIRE(vanilla.status == 0);
  REQUIRE(compact.status == 0);
  const size_t both = count(cu, "__global__"), v = count(vanilla.file("rgat_auto_kernels.cu"), "__global__"),
               c = count(compact.file("rgat_auto_kernels.cu"), "__global__");
  CHECK(both < v + c);
  CHECK(both >= std::max(v, c));
  // Both programs' inter IR, listed in the manifest with both programs' cost coefficients.
  CHECK(g.files.files().count("rgat_auto.compact.inter.ir"));
  CHECK(g.files.files().count("rgat_auto.compact.backward.inter.ir"));
  const std::string& manifest = g.file("manifest.json");
  CHECK(manifest.find("\"rgat_auto.compact.inter.ir\"") != std::string::npos);
  CHECK(manifest.find("\"materialization\": \"auto\"") != std::string::npos);
  CHECK(manifest.find("\"compact_forward_train\"") != std::string::npos);
  // A fixed choice generates one program, as before.
  CHECK(vanilla.files.files().count("rgat_auto.compact.inter.ir") == 0);
  CHECK(vanilla.file("rgat_auto.py").find("def materialization(") == std::string::npos);
}

TEST_CASE("materialization: auto output is deterministic, and the spec's compact_relations reaches the module",
          "[auto][emit]") {
  Generated a = generate_spec("tests/specs/rgcn_auto.yaml"), b = generate_spec("tests/specs/rgcn_auto.yaml");
  INFO(a.err);
  REQUIRE(a.status == 0);
  CHECK(a.files.files() == b.files.files());
  CHECK(a.file("rgcn_auto.py").find("COMPACT_RELATIONS = 0.6\n") != std::string::npos);
  // The intra IR holds both programs: the emitters print the same files from it.
  OutputSet from_ir;
  emit::emit_all(a.programs(), {"rgcn_auto.yaml", HECTORGEN_VERSION}, from_ir);  // banners: an absolute spec's name
  for (const auto& [name, text] : from_ir.files()) {
    CAPTURE(name);
    if (name == "manifest.json" || name.find(".inter.ir") != std::string::npos) continue;
    CHECK(text == a.file(name));
  }
}

TEST_CASE("options.compact_relations: a ratio in [0, 1], printed and parsed back by the inter IR; ignored with a warning "
          "unless auto",
          "[auto][frontend]") {
  const std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/tests/specs/rgcn_auto.yaml";
  const std::string text = test::read_file(path);
  auto c = test::compile_text(path, text);
  REQUIRE(c->module);
  REQUIRE(c->module->decl.options.compact_relations);
  CHECK(*c->module->decl.options.compact_relations == 0.6);
  Generated fixed = generate(path, test::replace(text, "  materialization: auto\n", "  materialization: compact\n"));
  CHECK(fixed.status == 0);
  CHECK(fixed.err.find("warning: options.compact_relations is ignored") != std::string::npos);
  Generated bad = generate(path, test::replace(text, "compact_relations: 0.6", "compact_relations: 1.5"));
  CHECK(bad.status == 1);
  CHECK(bad.err.find(":18:22: error: 'compact_relations' must be between 0 and 1") != std::string::npos);
}

namespace {

// The search warp_segment_of emits (emit/traversal.cpp device_helpers), one round at a time over the 32 lanes: the
// lanes' ballot is the predicate of every lane.
int emulated_warp_segment_of(const std::vector<int32_t>& ptr, int count, int64_t row, int* rounds) {
  int lo = 0, span = count;
  *rounds = 0;
  while (span > 1) {
    const int step = (span + 31) / 32;
    unsigned below = 0;
    for (int lane = 0; lane < 32; ++lane) {
      const int s = lo + lane * step;
      if (s < lo + span && ptr[static_cast<size_t>(s)] <= row) below |= 1u << lane;
    }
    REQUIRE(below != 0);
    const int end = lo + span;
    lo += (31 - __builtin_clz(below)) * step;
    span = std::min(step, end - lo);
    ++*rounds;
  }
  return lo;
}

}  // namespace

TEST_CASE("warp_segment_of: the warp's 32-way search finds what a binary search finds, in search_rounds rounds",
          "[cost]") {
  const std::string helper = emit::device_helpers({"warp_segment_of"});
  // The emulation above follows these lines; a change to one is a change to the other.
  for (const char* line : {"const int step = (span + 31) / 32;", "const int s = lo + lane * step;",
                           "__ballot_sync(0xffffffffu, s < lo + span && ptr[s] <= row)",
                           "lo += (31 - __clz(below)) * step;", "span = min(step, end - lo);"})
    CHECK(helper.find(line) != std::string::npos);
  std::mt19937 rng(7);
  for (int count : {1, 2, 3, 4, 31, 32, 33, 51, 100, 535, 1024, 1025, 3000}) {
    // Offsets with empty segments (runs of equal offsets), as relations without pairs give.
    std::vector<int32_t> ptr{0};
    for (int s = 0; s < count; ++s) ptr.push_back(ptr.back() + static_cast<int32_t>(rng() % 4 == 0 ? 0 : rng() % 5));
    const int64_t rows = ptr.back();
    for (int64_t row = 0; row < rows; ++row) {
      int expected = 0;  // the last s < count with ptr[s] <= row
      for (int s = 0; s < count; ++s)
        if (ptr[static_cast<size_t>(s)] <= row) expected = s;
      int rounds = 0;
      REQUIRE(emulated_warp_segment_of(ptr, count, row, &rounds) == expected);
      CHECK(rounds <= emit::search_rounds(count));  // fewer where the last lane's range is short
      CHECK(ptr[static_cast<size_t>(expected)] <= row);
      CHECK(row < ptr[static_cast<size_t>(expected) + 1]);
    }
  }
}

// `text` (a spec without options.schedule) with options.schedule.traversal set to `entries`.
std::string with_traversal_schedule(const std::string& text, const std::string& entries) {
  const size_t at = text.find("\nprogram:");
  REQUIRE(at != std::string::npos);
  REQUIRE(text.find("\n  schedule:") == std::string::npos);
  return text.substr(0, at + 1) + "  schedule:\n    traversal: {" + entries + "}\n" + text.substr(at + 1);
}

// The source of kernel `name` in a generated kernels file `cu`: from its launch bounds to its closing brace.
std::string kernel_source(const std::string& cu, const std::string& name) {
  const size_t at = cu.find("__launch_bounds__(256) " + name + "(");
  REQUIRE(at != std::string::npos);
  return cu.substr(at, cu.find("\n}\n", at) - at);
}

// Requires each of `lines` in `text`, in this order (each found after the one before it).
void require_in_order(const std::string& text, std::initializer_list<const char*> lines) {
  size_t pos = 0;
  for (const char* line : lines) {
    const size_t next = text.find(line, pos);
    INFO(line);
    REQUIRE(next != std::string::npos);
    pos = next + 1;
  }
}

// Parses an .intra.ir text back and checks that it prints to the same text; returns the phases.
std::vector<intra::Program> round_trip(const std::string& name, const std::string& text) {
  SourceFile f(name, text);
  Diagnostics d;
  auto phases = intra::parse_programs(f, d);
  REQUIRE(phases);
  CHECK(intra::print_programs(*phases) == text);
  return *phases;
}

TEST_CASE("a warp's edge loop and a gather sum fetch 32 edges' indices at a time; the split loops do not",
          "[intra][emit]") {
  const std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/hgt_compact.yaml";
  const Generated g = generate(path, with_traversal_schedule(test::read_file(path), "row_lanes: 32"));
  REQUIRE(g.status == 0);
  const std::string cu = g.file("hgt_compact_kernels.cu");
  auto kernel = [&](const std::string& name) { return kernel_source(cu, name); };
  // HGT's node kernel: the edge loop reading each edge's pair row, in blocks of 32 edges; lane l fetches edge
  // first + l's id, its pair and its relation (by its CSR position: in_pair and in_etype, not edge_pair[e] and
  // etype[e], second dependent and scattered reads), and every iteration takes them from lane j, in the edges' order.
  const std::string att = kernel("hgt_compact_fw_nodes_att");
  for (const char* line : {"const int32_t i_e_end = in_ptr[n + 1];",
                           "for (int32_t i_e_first = in_ptr[n]; i_e_first < i_e_end; i_e_first += 32) {",
                           "const int i_e_count = i_e_end - i_e_first < 32 ? i_e_end - i_e_first : 32;",
                           "if (lane < i_e_count) {", "e_lane = in_eid[i_e_first + lane];",
                           "e_pair_lane = in_pair[i_e_first + lane];", "e_etype_lane = in_etype[i_e_first + lane];",
                           "for (int i_e_j = 0; i_e_j < i_e_count; ++i_e_j) {",
                           "const int64_t e = __shfl_sync(0xffffffffu, e_lane, i_e_j);",
                           "const int64_t e_pair = __shfl_sync(0xffffffffu, e_pair_lane, i_e_j);",
                           "const int e_etype = __shfl_sync(0xffffffffu, e_etype_lane, i_e_j);"})
    CHECK(att.find(line) != std::string::npos);
  // The position is declared only where the body reads it (here it does not); the split loops (the softmax's)
  // still walk the edges lane by lane, each lane loading its own edges' ids.
  CHECK(att.find("const int32_t i_e = ") == std::string::npos);
  CHECK(att.find("for (int32_t i_e = in_ptr[n] + lane; i_e < in_ptr[n + 1]; i_e += 32) {") != std::string::npos);
  CHECK(att.find("const int64_t e = in_eid[i_e];") != std::string::npos);
  // The gather sums of the compact backward fetch their entries' indices the same way (templates/cuda/gather_sum.cu.in).
  const Generated r = generate_spec("tests/gpu/specs/rgcn_compact.yaml");
  REQUIRE(r.status == 0);
  const std::string rcu = r.file("rgcn_compact_kernels.cu");
  for (const char* line : {"const int64_t from_row = csr_col[first + lane];", "lane_x_row = dst[from_row];",
                           "lane_scale = scale[from_row];",
                           "const int64_t x_row = __shfl_sync(0xffffffffu, lane_x_row, j);",
                           "const float entry_scale = __shfl_sync(0xffffffffu, lane_scale, j);"})
    CHECK(rcu.find(line) != std::string::npos);
}

TEST_CASE("schedule.traversal.position_indices: 0 reads a node's edges' pairs and relations through their ids",
          "[intra][emit]") {
  const std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/hgt_compact.yaml";
  for (const int by_position : {1, 0}) {
    CAPTURE(by_position);
    const Generated g = generate(path, with_traversal_schedule(test::read_file(path),
                                                               "position_indices: " + std::to_string(by_position)));
    REQUIRE(g.status == 0);
    const std::string att = kernel_source(g.file("hgt_compact_kernels.cu"), "hgt_compact_fw_nodes_att");
    const bool ids = by_position == 0;
    CHECK((att.find("e_pair_lane = edge_pair[e_lane];") != std::string::npos) == ids);
    CHECK((att.find("e_etype_lane = etype[e_lane];") != std::string::npos) == ids);
    CHECK((att.find("e_pair_lane = in_pair[i_e_first + lane];") != std::string::npos) == !ids);
    CHECK((att.find("e_etype_lane = in_etype[i_e_first + lane];") != std::string::npos) == !ids);
    // Only the kernels that read in_pair need the runtime's csr_by_dst_pairs.
    CHECK((g.file("hgt_compact.py").find("\"csr_by_dst_pairs\"") != std::string::npos) == !ids);
    CHECK((g.file("hgt_compact.inter.ir").find("option traversal_position_indices = 0\n") != std::string::npos) == ids);
  }
  // RGCN's norm (from_graph: inv_relation_in_degree) by position: the twin in$norm, laid out in CSR order by the
  // runtime (in_col_inv_relation_in_degree), an input of every phase; a node kernel reading nothing else of the
  // edge itself no longer fetches in_eid.
  const std::string rpath = std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/rgcn_compact.yaml";
  for (const int by_position : {1, 0}) {
    CAPTURE(by_position);
    const Generated g = generate(rpath, with_traversal_schedule(test::read_file(rpath),
                                                                "position_indices: " + std::to_string(by_position)));
    REQUIRE(g.status == 0);
    const bool ids = by_position == 0;
    const std::string nodes = kernel_source(g.file("rgcn_compact_kernels.cu"), "rgcn_compact_fw_nodes_h");
    CHECK((nodes.find("const float v_norm = norm[e];") != std::string::npos) == ids);
    // By position, the edge's lane fetches it with the pair (one coalesced load for the block's edges).
    CHECK((nodes.find("v_norm_lane = in_norm[i_e_first + lane];") != std::string::npos) == !ids);
    CHECK((nodes.find("in_eid") != std::string::npos) == ids);
    const std::string ir = g.file("rgcn_compact.intra.ir");
    CHECK((ir.find("let v_norm: [] replicated(1) = load in$norm[i_e]") != std::string::npos) == !ids);
    CHECK((ir.find("tensor in$norm: input edge[] from_graph=in_col_inv_relation_in_degree\n") != std::string::npos) == !ids);
    const std::string py = g.file("rgcn_compact.py");
    CHECK((py.find("\"in_col_inv_relation_in_degree\"") != std::string::npos) == !ids);
    // The twin's layout is new in runtime 1.6: only a module that reads it asks for 1.6 on its account (emitted
    // without the tensor-core instances' needs); with them both ask for 1.7 (the self GEMM, one segment, numbers its
    // tiles without offsets: emit::tc_runtime_minor).
    CHECK(py.find("RUNTIME_VERSION = \"1.7\"") != std::string::npos);
    const std::string layouts_only = emit::emit_python(round_trip("rgcn_compact.intra.ir", ir), {"rgcn_compact.yaml", "test"});
    CHECK(layouts_only.find(ids ? "RUNTIME_VERSION = \"1.5\"" : "RUNTIME_VERSION = \"1.6\"") != std::string::npos);
    // One list of graph-derived arguments for the forward, forward_train and backward ops.
    const std::string both = "g.array(\"inv_relation_in_degree\"), g.array(\"in_col_inv_relation_in_degree\"), ";
    size_t calls = 0;
    for (size_t at = py.find(both); at != std::string::npos; at = py.find(both, at + 1)) ++calls;
    CHECK(calls == (ids ? 0u : 3u));
    round_trip("rgcn_compact.intra.ir", ir);
    if (ids) continue;
    // The verifier holds each to its rows: the twin by a position of a node's incoming edges, the input by its edge.
    auto forward_nodes_error = [](const std::string& text) {
      SourceFile f("rgcn_compact.intra.ir", text);
      Diagnostics d;
      auto phases = intra::parse_programs(f, d);
      REQUIRE(phases);
      const intra::Program& forward = phases->front();
      return intra::verify_traversal(forward, std::get<intra::TraversalInstance>(forward.kernels.back()));
    };
    const std::string load = "load in$norm[i_e]";
    REQUIRE(ir.find(load) != std::string::npos);
    CHECK(forward_nodes_error(ir) == "");
    CHECK(forward_nodes_error(test::replace(ir, load, "load in$norm[e]"))
              .find("'in$norm' is indexed by a position of a node's incoming edges, not by 'e'") != std::string::npos);
    CHECK(forward_nodes_error(test::replace(ir, load, "load norm[i_e]")).find("'norm' is indexed by an edge, not by 'i_e'") !=
          std::string::npos);
  }
}

TEST_CASE("schedule.traversal.edge_batch: a warp's edge loop shuffles out a batch's indices, then runs its steps "
          "unrolled with their commits guarded",
          "[intra][emit]") {
  const Generated g = generate_spec("tests/gpu/specs/rgcn_compact_eb4.yaml");
  REQUIRE(g.status == 0);
  const std::string cu = g.file("rgcn_compact_eb4_kernels.cu");
  const std::string nodes = kernel_source(cu, "rgcn_compact_eb4_fw_nodes_h");
  // In this order: the batch's indices (a step past the last edge takes the batch's first), then the steps, each
  // reading them from the batch, loading unconditionally and adding only for a live edge.
  size_t from = 0;
  // (The step's norm is read by its CSR position, fetched by the edge's lane and batched like an index, so the
  // edge's id is not fetched at all.)
  for (const char* line : {"if (lane < i_e_count) {", "for (int i_e_j0 = 0; i_e_j0 < i_e_count; i_e_j0 += 4) {",
                           "int64_t e_pair_batch[4];", "#pragma unroll",
                           "for (int i_e_u = 0; i_e_u < 4; ++i_e_u) {",
                           "const int i_e_j = i_e_j0 + i_e_u < i_e_count ? i_e_j0 + i_e_u : i_e_j0;",
                           "e_pair_batch[i_e_u] = __shfl_sync(0xffffffffu, e_pair_lane, i_e_j);",
                           "v_norm_batch[i_e_u] = __shfl_sync(0xffffffffu, v_norm_lane, i_e_j);",
                           "for (int i_e_u = 0; i_e_u < 4; ++i_e_u) {", "const bool i_e_live = i_e_j0 + i_e_u < i_e_count;",
                           "const int64_t e_pair = e_pair_batch[i_e_u];",
                           "const float v_norm = v_norm_batch[i_e_u];", "if (i_e_live) {", "v_h[j] += v_norm * v_pair_lin_feature[j];"}) {
    const size_t next = nodes.find(line, from);
    INFO(line);
    REQUIRE(next != std::string::npos);
    from = next + 1;
  }
  CHECK(nodes.find("for (int i_e_j = 0;") == std::string::npos);  // no one-edge loop left
  // The backward's gather sum batches its entries the same way: rows and scales shuffled out, the 4 entries'
  // values loaded, then added in order, a live entry's only.
  const std::string sum = kernel_source(cu, "rgcn_compact_eb4_bw_sum_d_lin_feature");
  from = 0;
  for (const char* line : {"for (int j0 = 0; j0 < count; j0 += 4) {", "int64_t x_row_batch[4];", "float scale_batch[4];",
                           "const int j = j0 + u < count ? j0 + u : j0;",
                           "x_row_batch[u] = __shfl_sync(0xffffffffu, lane_x_row, j);",
                           "scale_batch[u] = __shfl_sync(0xffffffffu, lane_scale, j);", "float value[4][kSlots];",
                           "const int64_t x_row = x_row_batch[u];", "value[u][c] = col < kNumel ? x[x_row * kNumel + col] : 0.0f;",
                           "const float entry_scale = scale_batch[u];",
                           "if (j0 + u < count && lane + 32 * c < kNumel) acc[c] += entry_scale * value[u][c];"}) {
    const size_t next = sum.find(line, from);
    INFO(line);
    REQUIRE(next != std::string::npos);
    from = next + 1;
  }
  CHECK(sum.find("#pragma unroll 4") == std::string::npos);
  // Every phase of the .intra.ir (traversals and gather sums with edge_batch=4) parses back to the same text.
  const std::string intra_ir = g.file("rgcn_compact_eb4.intra.ir");
  CHECK(intra_ir.find("numel=64 deterministic edge_batch=4\n") != std::string::npos);
  round_trip("rgcn_compact_eb4.intra.ir", intra_ir);
  // The IR says so, and only where the schedule is not the default.
  CHECK(g.file("rgcn_compact_eb4.intra.ir").find("threads=256 edge_batch=4\n") != std::string::npos);
  CHECK(g.file("rgcn_compact_eb4.inter.ir").find("option traversal_edge_batch = 4\n") != std::string::npos);
  const Generated plain = generate_spec("tests/gpu/specs/rgcn_compact.yaml");
  REQUIRE(plain.status == 0);
  CHECK(plain.file("rgcn_compact.intra.ir").find("edge_batch") == std::string::npos);
  // HGT's node kernels (softmax maximum and sum, messages, backward sums) batch 8 edges; a store of a step is
  // guarded like its updates.
  const Generated h = generate_spec("tests/gpu/specs/hgt_eb8.yaml");
  REQUIRE(h.status == 0);
  const std::string hcu = h.file("hgt_eb8_kernels.cu");
  size_t batches = 0;
  for (size_t p = hcu.find("_j0 += 8) {"); p != std::string::npos; p = hcu.find("_j0 += 8) {", p + 1)) ++batches;
  CHECK(batches == 6);
  CHECK(hcu.find("_j0 += 4") == std::string::npos);
  CHECK(std::regex_search(hcu, std::regex(R"(if \(i_e_live\) \{\n\s+if \(lane == 0\) \w+\[e\] = )")));
}

TEST_CASE("schedule.traversal.row_lanes: rows of 8 or 16 lanes, the warp's rows walking their edges in step",
          "[intra][emit]") {
  // auto (the default): HGT's attention kernel reduces over its rows' lanes (dot products, the softmax's split
  // loops): 8 lanes a row; RGCN's plain sums: 16.
  const Generated g = generate_spec("tests/gpu/specs/hgt_compact.yaml");
  REQUIRE(g.status == 0);
  const std::string cu = g.file("hgt_compact_kernels.cu");
  const std::string att = kernel_source(cu, "hgt_compact_fw_nodes_att");
  size_t from = 0;
  for (const char* line : {"const int lane = threadIdx.x & 7;  // the lane within its row's 8",
                           "const int row_group = (threadIdx.x & 31) >> 3;  // which of the warp's 4 rows",
                           "for (int64_t warp_row = first_row - row_group; warp_row < num_rows; warp_row += row_stride) {",
                           "const bool row_live = warp_row + row_group < num_rows;",
                           "const int64_t n = row_live ? warp_row + row_group : num_rows - 1;",
                           "const int32_t i_e_end = row_live ? in_ptr[n + 1] : i_e_begin;",
                           "const int i_e_todo = __reduce_max_sync(0xffffffffu, i_e_end - i_e_begin);",
                           "for (int i_e_done = 0; i_e_done < i_e_todo; i_e_done += 8) {",
                           "const int i_e_steps = i_e_todo - i_e_done < 8 ? i_e_todo - i_e_done : 8;",
                           "const int i_e_count = i_e_end - i_e_first < 8 ? max(i_e_end - i_e_first, 0) : 8;",
                           "for (int i_e_j = 0; i_e_j < i_e_steps; ++i_e_j) {", "const bool i_e_live = i_e_j < i_e_count;",
                           "const int64_t e = __shfl_sync(0xffffffffu, e_lane, i_e_j, 8);",
                           "dot_lin_k_q = group_sum<8>(dot_lin_k_q);", "if (i_e_live) {", "if (lane == 0) att[e] = v_att;",
                           "for (int32_t i_e = in_ptr[n] + lane; row_live && i_e < in_ptr[n + 1]; i_e += 8) {",
                           "v_att_max = group_max<8>(v_att_max);"}) {
    const size_t next = att.find(line, from);
    INFO(line);
    REQUIRE(next != std::string::npos);
    from = next + 1;
  }
  // A store outside the edge loops is made by live rows only.
  CHECK(std::regex_search(att, std::regex(R"(if \(row_live\) \{\n\s+store_run<8>\(&agg\[n \* 64 \+ lane \* 8\], v_agg\);)")));
  const std::string ir = g.file("hgt_compact.intra.ir");
  CHECK(ir.find("traversal hgt_compact_fw_nodes_att: rows=dst_nodes(n) threads=256 row_lanes=8\n") != std::string::npos);
  CHECK(ir.find("let v_q: [1, 64] lanes(8) = load q[n]") != std::string::npos);  // 64 elements over 8 lanes
  // The search of a pair's relation is the whole warp's: those kernels keep a warp a row.
  const Generated rgat = generate_spec("tests/gpu/specs/rgat_compact.yaml");
  REQUIRE(rgat.status == 0);
  CHECK(std::regex_search(rgat.file("rgat_compact.intra.ir"), std::regex(R"(traversal \w+_pairs_\w+: rows=compact_src_etype.src_etype_pairs\(p\) threads=256\n)")));
  // Every phase parses back to the same text (slot counts per lane follow the instance's row_lanes).
  round_trip("hgt_compact.intra.ir", ir);
  // RGCN's node kernel: 16 lanes; with rows of 36 held by 8 lanes and 8-edge batches (the GPU check's spec), the
  // steps shuffle from their own lane (a lane past the row's edges holds index 0) and the partial last slot is
  // guarded.
  const Generated r = generate_spec("tests/gpu/specs/rgcn_compact.yaml");
  REQUIRE(r.status == 0);
  CHECK(r.file("rgcn_compact.intra.ir").find("traversal rgcn_compact_fw_nodes_h: rows=dst_nodes(n) threads=256 row_lanes=16\n") !=
        std::string::npos);
  const Generated r8 = generate_spec("tests/gpu/specs/rgcn_compact_rl8.yaml");
  REQUIRE(r8.status == 0);
  const std::string r8cu = r8.file("rgcn_compact_rl8_kernels.cu");
  for (const char* line : {"const int i_e_j = i_e_j0 + i_e_u;", "e_pair_batch[i_e_u] = __shfl_sync(0xffffffffu, e_pair_lane, i_e_j, 8);",
                           "for (int i_e_j0 = 0; i_e_j0 < i_e_steps; i_e_j0 += 8) {",
                           "v_pair_lin_feature[j] = lane + 8 * j < 36 ? lin_feature[e_pair * 36 + lane + 8 * j] : 0.f;"})
    CHECK(r8cu.find(line) != std::string::npos);
  // schedule.gather_sum.row_lanes gives the gather sums of the compact backward rows of 8 lanes (auto leaves them a
  // warp a row): the rows' entries in step, a step past a row's entries adding nothing, a row past the last storing
  // nothing.
  const std::string sum = kernel_source(r8cu, "rgcn_compact_rl8_bw_sum_d_lin_feature");
  require_in_order(sum, {"constexpr int kNumel = 36, kSlots = (kNumel + 7) / 8;", "const int lane = threadIdx.x & 7;",
                         "const int64_t row = row_live ? warp_row + row_group : num_rows - 1;",
                         "const int64_t end = row_live ? csr_ptr[row + 1] : begin;",
                         "const int todo = __reduce_max_sync(0xffffffffu, static_cast<int>(end - begin));",
                         "for (int j0 = 0; j0 < steps; j0 += 8) {", "const int j = j0 + u;",
                         "x_row_batch[u] = __shfl_sync(0xffffffffu, lane_x_row, j, 8);",
                         "if (j0 + u < count && lane + 8 * c < kNumel) acc[c] += entry_scale * value[u][c];",
                         "if (row_live && col < kNumel) y[row * kNumel + col] = acc[c];"});
  const std::string r8ir = r8.file("rgcn_compact_rl8.intra.ir");
  CHECK(r8ir.find("numel=36 deterministic edge_batch=8 row_lanes=8\n") != std::string::npos);
  round_trip("rgcn_compact_rl8.intra.ir", r8ir);
  CHECK(r8.file("rgcn_compact_rl8.inter.ir").find("option gather_sum_row_lanes = 8\n") != std::string::npos);
  CHECK(r.file("rgcn_compact.intra.ir").find("deterministic row_lanes") == std::string::npos);  // auto: a warp
  // A traversal's row_lanes alone leaves the gather sums a warp a row.
  const Generated t8 = generate(std::string(HECTORGEN_SOURCE_DIR) + "/rl8_traversal_only.yaml",
                                test::replace(test::read_file(std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/rgcn_compact_rl8.yaml"),
                                              "    gather_sum: {row_lanes: 8}\n", ""));
  REQUIRE(t8.status == 0);
  CHECK(t8.file("rgcn_compact_rl8.intra.ir").find("numel=36 deterministic edge_batch=8\n") != std::string::npos);
}

TEST_CASE("schedule.traversal.vector: a lane's slots move in vector runs, guarded past the row's end; 1 interleaves",
          "[intra][codegen]") {
  // bf16 RGCN: 64 elements over 8 lanes (auto: a lane's share of the row in one 16-byte run), loaded and stored whole.
  const Generated b = generate(std::string(HECTORGEN_SOURCE_DIR) + "/rgcn_bf16.yaml",
                              test::replace(test::read_file(std::string(HECTORGEN_SOURCE_DIR) + "/specs/rgcn.yaml"), "dtype: fp32",
                                      "dtype: bf16"));
  REQUIRE(b.status == 0);
  const std::string bcu = b.file("rgcn_kernels.cu");
  CHECK(bcu.find("load_run<8>(v_h, &h[n * 64 + lane * 8]);") != std::string::npos);
  CHECK(bcu.find("store_run<8>(&h[n * 64 + lane * 8], v_h);") != std::string::npos);
  CHECK(bcu.find("__device__ __forceinline__ void run_from_float(__nv_bfloat16& e, float v)") != std::string::npos);
  // Rows of 56 over 16 lanes: runs of 4, the last two lanes' past the end (neither loaded nor stored).
  const Generated w = generate_spec("tests/gpu/specs/rgcn_compact_w56.yaml");
  REQUIRE(w.status == 0);
  const std::string wcu = w.file("rgcn_compact_w56_kernels.cu");
  for (const char* line : {"if (lane * 4 < 56) load_run<4>(v_h, &h[n * 56 + lane * 4]);",
                           "else for (int j = 0; j < 4; ++j) v_h[j] = 0.f;",
                           "if (lane * 4 < 56) load_run<4>(v_pair_lin_feature, &lin_feature[e_pair * 56 + lane * 4]);",
                           "if (lane * 4 < 56) store_run<4>(&h[n * 56 + lane * 4], v_h);"})
    CHECK(wcu.find(line) != std::string::npos);
  // Rows of 60 over 8 lanes: two runs of 4 a lane, run r of lane l at element (l + 8 r) 4.
  const Generated g = generate_spec("tests/gpu/specs/rgat_w60.yaml");
  REQUIRE(g.status == 0);
  const std::string gcu = g.file("rgat_w60_kernels.cu");
  for (const char* line : {"for (int run = 0; run < 2; ++run) {",
                           "if ((lane + 8 * run) * 4 < 60) load_run<4>(hs + run * 4, &t_hs[e * 60 + (lane + 8 * run) * 4]);",
                           "else for (int j = 0; j < 4; ++j) hs[run * 4 + j] = 0.f;"})
    CHECK(gcu.find(line) != std::string::npos);
  // vector: 1, the layout before runs: element lane + 16 j, one scalar access each; the option reaches both IRs.
  const Generated v1 = generate(std::string(HECTORGEN_SOURCE_DIR) + "/w56_v1.yaml",
                               test::replace(test::read_file(std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/rgcn_compact_w56.yaml"),
                                       "{row_lanes: 16}", "{row_lanes: 16, vector: 1}"));
  REQUIRE(v1.status == 0);
  const std::string v1cu = v1.file("rgcn_compact_w56_kernels.cu");
  CHECK(v1cu.find("load_run") == std::string::npos);
  CHECK(v1cu.find("v_h[j] = lane + 16 * j < 56 ? h[n * 56 + lane + 16 * j] : 0.f;") != std::string::npos);
  CHECK(v1.file("rgcn_compact_w56.inter.ir").find("option traversal_vector = 1\n") != std::string::npos);
  CHECK(v1.file("rgcn_compact_w56.intra.ir").find("threads=256 row_lanes=16 vector=1\n") != std::string::npos);
}

TEST_CASE("a gather sum a warp a row splits its entries over groups of lanes, each lane's elements in vector runs",
          "[intra][emit]") {
  auto kernel = kernel_source;
  // bf16 rows of 64: runs of 8 (one 16-byte load), 8 lanes a row of x, 4 groups taking every 4th entry; the groups'
  // sums added by a butterfly, group 0 storing.
  const std::string hgt_path = std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/hgt_compact.yaml";
  const Generated h = generate(hgt_path, test::replace(test::read_file(hgt_path), "dtype: fp32", "dtype: bf16"));
  REQUIRE(h.status == 0);
  const std::string hcu = h.file("hgt_compact_kernels.cu");
  CHECK(hcu.find("// A warp a row, its lanes in 4 groups of 8, a group an entry: lane l of a group holds elements 8l .. 8l + 7") !=
        std::string::npos);
  const std::string msg = kernel(hcu, "hgt_compact_bw_sum_d_msg");
  require_in_order(msg, {"constexpr int kNumel = 64, kRun = 8, kGroupLanes = 8, kGroups = 32 / kGroupLanes;",
                         "const int lane = threadIdx.x & 31, group = lane / kGroupLanes, group_lane = lane % kGroupLanes;",
                         "for (int j0 = 0; j0 < count; j0 += kGroups) {", "const int j = j0 + group;",
                         "const int64_t x_row = __shfl_sync(0xffffffffu, lane_x_row, j);",
                         "const float entry_scale = __shfl_sync(0xffffffffu, lane_scale, j);", "if (j < count) {",
                         "const int col = (group_lane + kGroupLanes * r) * kRun;",
                         "load_run<kRun>(value, &x[x_row * kNumel + col]);",
                         "for (int i = 0; i < kRun; ++i) acc[r][i] += entry_scale * value[i];",
                         "for (int offset = kGroupLanes; offset < 32; offset *= 2) {",
                         "acc[r][i] += __shfl_xor_sync(0xffffffffu, acc[r][i], offset);", "if (group == 0) {",
                         "store_run<kRun>(&y[row * kNumel + col], acc[r]);"});
  // A node's pairs (a few entries a row): one group, runs of 2 spanning the warp (no butterfly).
  CHECK(kernel(hcu, "hgt_compact_bw_sum_d_v").find("constexpr int kNumel = 64, kRun = 2, kGroupLanes = 32,") != std::string::npos);
  // fp32 rows of 56: runs of 8 (two 16-byte words), 7 runs over 8 lanes (the last lane's past the end, skipped); the
  // sum into d_feature (a node's pairs: runs of 2 over the warp) adds to what it holds.
  const Generated w = generate_spec("tests/gpu/specs/rgcn_compact_w56.yaml");
  REQUIRE(w.status == 0);
  const std::string wcu = w.file("rgcn_compact_w56_kernels.cu");
  CHECK(kernel(wcu, "rgcn_compact_w56_bw_sum_d_lin_feature").find("constexpr int kNumel = 56, kRun = 8, kGroupLanes = 8,") != std::string::npos);
  const std::string acc = kernel(wcu, "rgcn_compact_w56_bw_sum_d_feature");
  for (const char* line : {"load_run<kRun>(old, &y[row * kNumel + col]);", "for (int i = 0; i < kRun; ++i) acc[r][i] += old[i];"})
    CHECK(acc.find(line) != std::string::npos);
  // A scalar per row (RGAT's attention half): each lane an entry of its own, plain scalar loads and store.
  const Generated r = generate_spec("tests/gpu/specs/rgat_compact.yaml");
  REQUIRE(r.status == 0);
  const std::string rcu = r.file("rgat_compact_kernels.cu");
  const std::string dot = kernel(rcu, "rgat_compact_bw_sum_d_dot_hs");
  CHECK(rcu.find("// A warp a row, each lane an entry of its own.") != std::string::npos);
  for (const char* line : {"kRun = 1, kGroupLanes = 1,",
                           "value[0] = x[x_row * kNumel + col];", "y[row * kNumel + col] = acc[r][0];"})
    CHECK(dot.find(line) != std::string::npos);
  CHECK(dot.find("load_run") == std::string::npos);
  // vector: 1: scalar elements lane + 32 r over the warp, entries one at a time; printed on the gathersum's line,
  // parsed back.
  const Generated v1 = generate(std::string(HECTORGEN_SOURCE_DIR) + "/rgcn_compact_v1.yaml",
                                with_traversal_schedule(test::read_file(std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/rgcn_compact.yaml"),
                                                        "vector: 1"));
  REQUIRE(v1.status == 0);
  const std::string v1sum = kernel(v1.file("rgcn_compact_kernels.cu"), "rgcn_compact_bw_sum_d_lin_feature");
  CHECK(v1.file("rgcn_compact_kernels.cu").find("// A warp a row, its 32 lanes on each entry together: lane l holds elements l + 32 r of the entry's row, r < 2.") !=
        std::string::npos);
  CHECK(v1sum.find("constexpr int kNumel = 64, kRun = 1, kGroupLanes = 32,") != std::string::npos);
  const std::string v1ir = v1.file("rgcn_compact.intra.ir");
  CHECK(v1ir.find("numel=64 deterministic vector=1\n") != std::string::npos);
  CHECK(std::get<intra::GatherSumInstance>(round_trip("rgcn_compact.intra.ir", v1ir).back().kernels.back()).vector == 1);
  SourceFile bad("rgcn_compact.intra.ir", test::replace(v1ir, "numel=64 deterministic vector=1\n", "numel=64 deterministic vector=3\n"));
  Diagnostics db;
  CHECK_FALSE(intra::parse_programs(bad, db));
  std::ostringstream err;
  db.render(err);
  CHECK_THAT(err.str(), Catch::Contains("error: vector=3 is not 1, 2, 4 or 8"));
}

TEST_CASE("a gather sum's rows variant: a row a group of lanes, launched where the rows have few entries on average",
          "[intra][emit]") {
  auto kernel = kernel_source;
  // group_rows_below: auto (intra::kAutoGroupRowsBelow, 4): beside the split kernel, <kernel>_rows (groups of 8
  // lanes, 4 rows a warp in step, no butterfly), which the launcher runs below 4 entries a row on average: a pair's
  // edges (num_edges over num_pairs), a node's pairs (num_pairs over num_nodes).
  STATIC_REQUIRE(intra::kAutoGroupRowsBelow == 4);
  const std::string hgt_path = std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/hgt_compact.yaml";
  const Generated h = generate(hgt_path, test::replace(test::read_file(hgt_path), "dtype: fp32", "dtype: bf16"));
  REQUIRE(h.status == 0);
  const std::string hcu = h.file("hgt_compact_kernels.cu");
  const std::string rows = kernel(hcu, "hgt_compact_bw_sum_d_msg_rows");
  CHECK(hcu.find("// A warp 4 rows, a group of 8 lanes a row, an entry at a time: lane l of a group holds elements 8l .. 8l + 7") !=
        std::string::npos);
  require_in_order(rows, {"constexpr int kNumel = 64, kRun = 8, kGroupLanes = 8, kGroups = 32 / kGroupLanes;",
                          "for (int64_t warp_row = first_warp_row; warp_row < num_rows; warp_row += row_stride) {",
                          "const int64_t row = warp_row + group;", "const bool live = row < num_rows;",
                          "const int todo = __reduce_max_sync(0xffffffffu, static_cast<int>(end - begin));",
                          "if (group_lane < count) {", "const int64_t from_row = csr_col[first + group_lane];",
                          "for (int j = 0; j < steps; ++j) {",
                          "const int64_t x_row = __shfl_sync(0xffffffffu, lane_x_row, group * kGroupLanes + j);",
                          "const float entry_scale = __shfl_sync(0xffffffffu, lane_scale, group * kGroupLanes + j);",
                          "if (j < count) {", "load_run<kRun>(value, &x[x_row * kNumel + col]);", "if (live) {",
                          "store_run<kRun>(&y[row * kNumel + col], acc[r]);"});
  CHECK(rows.find("__shfl_xor_sync") == std::string::npos);
  CHECK(hcu.find("if (a.num_edges < 4 * a.num_pairs) {") != std::string::npos);
  CHECK(hcu.find("if (a.num_pairs < 4 * a.num_nodes) {") != std::string::npos);
  CHECK(hcu.find("hgt_compact_bw_sum_d_msg_rows<<<blocks, 256, 0, stream>>>") != std::string::npos);
  CHECK(hcu.find("static_cast<unsigned>((a.num_pairs + 32 - 1) / 32)") != std::string::npos);  // 8 warps x 4 rows
  // d_lin_k's sum is the same kernel as d_msg's: its launcher runs both of d_msg's kernels.
  CHECK(hcu.find("hgt_compact_bw_sum_d_lin_k_rows") == std::string::npos);
  // auto is not printed on the gathersum's line; 0: the split kernel alone; a number: the threshold, printed on the
  // gathersum's line and parsed back.
  CHECK(h.file("hgt_compact.intra.ir").find("group_rows_below") == std::string::npos);
  const Generated off = generate_spec("tests/gpu/specs/hgt_compact_split.yaml");
  REQUIRE(off.status == 0);
  CHECK(off.file("hgt_compact_split_kernels.cu").find("_rows<<<") == std::string::npos);
  CHECK(off.file("hgt_compact_split_kernels.cu").find("bw_sum_d_msg_rows") == std::string::npos);
  CHECK(off.file("hgt_compact_split.intra.ir").find(" deterministic group_rows_below=0\n") != std::string::npos);
  const Generated on = generate_spec("tests/gpu/specs/rgcn_compact_rows.yaml");
  REQUIRE(on.status == 0);
  CHECK(on.file("rgcn_compact_rows_kernels.cu").find("if (a.num_edges < 1024 * a.num_pairs) {") != std::string::npos);
  const std::string ir = on.file("rgcn_compact_rows.intra.ir");
  CHECK(ir.find("numel=64 deterministic group_rows_below=1024\n") != std::string::npos);
  CHECK(std::get<intra::GatherSumInstance>(round_trip("rgcn_compact_rows.intra.ir", ir).back().kernels.back()).group_rows_below ==
        1024);
  SourceFile bad("rgcn_compact_rows.intra.ir",
                 test::replace(ir, "deterministic group_rows_below=1024\n", "deterministic group_rows_below=2000\n"));
  Diagnostics db;
  CHECK_FALSE(intra::parse_programs(bad, db));
  std::ostringstream err;
  db.render(err);
  CHECK_THAT(err.str(), Catch::Contains("error: group_rows_below=2000 is not 0 to 1024"));
  // The inter IR carries the option (printed, parsed back by the pass tests' --run-pass).
  CHECK(on.file("rgcn_compact_rows.inter.ir").find("option gather_sum_group_rows_below = 1024\n") != std::string::npos);
}

TEST_CASE("row_lanes in the intra IR text: checked values, and only where the kernel can hold rows in step", "[intra]") {
  intra::TraversalInstance t;
  t.name = "k";
  t.rows = inter::LoopKind::DstNodes;
  t.row = "n";
  intra::EdgeLoop l;
  l.var = "e";
  l.pos = "i_e";
  l.node = "n";
  l.body.push_back(intra::Instr{intra::Sync{}});
  t.body.push_back(intra::Instr{intra::Def{"x", true, {{64}, intra::LaneLayout::Lanes}, intra::Eval{intra::Value::constant(0.0)}}});
  t.body.push_back(intra::Instr{l});
  CHECK(intra::row_lanes_blocker(t) == "the loop over n's edges holds a sync");
  intra::choose_row_lanes(t, 8);
  CHECK(t.row_lanes == 32);
  t.body.pop_back();
  CHECK(intra::row_lanes_blocker(t).empty());
  intra::choose_row_lanes(t, 0);
  CHECK(t.row_lanes == 16);  // auto: no reduction over the lanes
  t.body[0] = intra::Instr{intra::Def{"x", true, {{512}, intra::LaneLayout::Lanes}, intra::Eval{intra::Value::constant(0.0)}}};
  CHECK(intra::auto_row_lanes(t) == 32);  // 512 elements: 16 lanes would take 32 slots a lane
  t.body[0] = intra::Instr{intra::Def{"x", true, {{200}, intra::LaneLayout::Lanes}, intra::Eval{intra::Value::constant(0.0)}}};
  CHECK(intra::auto_row_lanes(t) == 32);  // 200 > 8 x 16
  t.body[0] = intra::Instr{intra::Def{"x", true, {{128}, intra::LaneLayout::Lanes}, intra::Eval{intra::Value::constant(0.0)}}};
  CHECK(intra::auto_row_lanes(t) == 16);
  CHECK(intra::auto_row_lanes(t, 2) == 16);  // 16-bit: 8 lanes would hold 32 bytes of the row each
  t.body[0] = intra::Instr{intra::Def{"x", true, {{64}, intra::LaneLayout::Lanes}, intra::Eval{intra::Value::constant(0.0)}}};
  CHECK(intra::auto_row_lanes(t) == 16);     // 64 fp32 values: 16 lanes of 16 bytes
  CHECK(intra::auto_row_lanes(t, 2) == 8);   // 64 bf16 values: 8 lanes of 16 bytes
  t.body[0] = intra::Instr{intra::Def{"x", true, {{32}, intra::LaneLayout::Lanes}, intra::Eval{intra::Value::constant(0.0)}}};
  CHECK(intra::auto_row_lanes(t) == 8);
  CHECK(intra::print_reg_type({{40}, intra::LaneLayout::Lanes}, 16) == "[40] lanes(3)");
  CHECK(intra::print_reg_type({{40}, intra::LaneLayout::Lanes}) == "[40] lanes(2)");
}

TEST_CASE("a module whose tensor-core instances mix fp32 and 16-bit operands asks for runtime 1.7, others do not",
          "[emit][dtype][tc]") {
  // fp16's backward meets fp32 gradients with fp16 weights and activations (tc_gemm.cuh's widened operands, runtime
  // 1.7); bf16 keeps both operands in bf16 and (HGT: no GEMM over one segment) asks for what it asked for before.
  const std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/specs/hgt.yaml";
  const std::string fp32 = test::read_file(path);
  const Generated fp16 = generate(path, test::replace(fp32, "dtype: fp32", "dtype: fp16"));
  REQUIRE(fp16.status == 0);
  CHECK(fp16.file("hgt.py").find("RUNTIME_VERSION = \"1.7\"") != std::string::npos);
  CHECK(fp16.file("CMakeLists.txt").find("find_package(hectorgen_runtime 1.7 CONFIG)") != std::string::npos);
  const std::string cu = fp16.file("hgt_kernels.cu");
  CHECK(cu.find("hectorgen::tc::SegmentGemmArgs<float, float, __half> gemm{};") != std::string::npos);
  CHECK(cu.find("hectorgen::tc::WgradArgs<__half, float> wgrad{};") != std::string::npos);
  CHECK(cu.find("the weights are widened to fp32 as they are loaded, tf32 MMAs.") != std::string::npos);
  const Generated bf16 = generate(path, test::replace(fp32, "dtype: fp32", "dtype: bf16"));
  REQUIRE(bf16.status == 0);
  CHECK(bf16.file("hgt.py").find("RUNTIME_VERSION = \"1.7\"") == std::string::npos);
  CHECK(bf16.file("hgt_kernels.cu").find("widened") == std::string::npos);
}
