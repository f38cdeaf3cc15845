// The intra-operator IR as a level of its own: traversal instances print, parse back to the same text,
// verify (one negative test per rule), and get the warp syncs they need.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <regex>
#include <sstream>

#include "ir/intra/interpreter.h"
#include "ir/intra/intra.h"
#include "ir/intra/launch.h"
#include "ir/intra/parser.h"
#include "emit/traversal.h"
#include "passes/passes.h"

using namespace hectorgen;
using namespace hectorgen::intra;

namespace {

// The tensors and layouts of RGAT's forward, enough for its traversal instances.
Program rgat_like() {
  Program p;
  p.model = "rgat";
  auto add = [&](std::string name, Role role, inter::Per per, std::vector<int64_t> shape) {
    TensorInfo t;
    t.name = std::move(name);
    t.role = role;
    t.per = per;
    t.shape = std::move(shape);
    p.tensors.push_back(t);
  };
  add("feature", Role::Input, inter::Per::Node, {64});
  add("w_s", Role::Weight, inter::Per::Etype, {1, 64});
  add("w_t", Role::Weight, inter::Per::Etype, {1, 64});
  add("shared", Role::Weight, inter::Per::None, {4});
  add("h", Role::Output, inter::Per::Node, {1, 64});
  add("att_max", Role::Field, inter::Per::Node, {1});
  add("att_sum", Role::Field, inter::Per::Node, {1});
  add("att", Role::Field, inter::Per::Edge, {1});
  add("t_hs", Role::Temp, inter::Per::Edge, {1, 64});
  add("t_ht", Role::Temp, inter::Per::Edge, {1, 64});
  p.layouts = {layout::kCsrByDst, layout::kSortedCoo};
  return p;
}

// RGAT's node softmax as the lowering builds it, before the syncs.
const char* kSoftmax = R"(traversal rgat_fw_nodes_att_max: rows=dst_nodes(n) threads=256
    # n["att_max"] = -1e+30
    var v_att_max: [1] replicated(1) = -1e+30
    for e in csr_by_dst.incoming(n) at i_e:
        # n["att_max"] = max(n["att_max"], e["att"])
        let v_att: [1] replicated(1) = load att[e]
        v_att_max = max(v_att_max, v_att)
    for e in csr_by_dst.incoming(n) at i_e:
        # e["att"] = exp(e["att"] - e.dst["att_max"])
        var v_att: [1] replicated(1) = load att[e]
        v_att = exp(v_att - v_att_max)
        store att[e] = v_att by lane0
    # n["att_sum"] = 0.0
    var v_att_sum: [1] replicated(1) = 0
    for e in csr_by_dst.incoming(n) at i_e:
        # n["att_sum"] += e["att"]
        let v_att: [1] replicated(1) = load att[e]
        v_att_sum += v_att
    var v_h: [1, 64] lanes(2) = 0
    for e in csr_by_dst.incoming(n) at i_e:
        let v_msg: [1, 64] lanes(2) = load t_hs[e]
        # e["att"] = e["att"] / e.dst["att_sum"]
        var v_att: [1] replicated(1) = load att[e]
        v_att = v_att / v_att_sum
        # n["h"] += e["att"] * e["msg"]
        v_h += v_att * v_msg
        store att[e] = v_att by lane0
    store att_max[n] = v_att_max by lane0
    store att_sum[n] = v_att_sum by lane0
    store h[n] = v_h by lanes
)";

// RGAT's edge kernel: warp reductions, gathers through etype.
const char* kEdges = R"(traversal rgat_fw_edges_att: rows=etype_sorted_coo.edges(e) threads=256
    index e_etype = etype[e]
    let hs: [1, 64] lanes(2) = load t_hs[e]
    let ht: [1, 64] lanes(2) = load t_ht[e]
    let v_w_s: [1, 64] lanes(2) = load w_s[e_etype]
    let v_w_t: [1, 64] lanes(2) = load w_t[e_etype]
    # e["att"] = leakyrelu(dot(hs, w_s[e.etype]) + dot(ht, w_t[e.etype]), negative_slope)
    let dot_hs_w_s: [1] replicated(1) = warp_sum(hs * v_w_s, 64)
    let dot_ht_w_t: [1] replicated(1) = warp_sum(ht * v_w_t, 64)
    let v_att: [1] replicated(1) = leakyrelu(dot_hs_w_s + dot_ht_w_t, 0.2)
    store att[e] = v_att by lane0
)";

TraversalInstance parse(const std::string& text) {
  SourceFile f("test.intra.ir", text);
  Diagnostics d;
  auto t = parse_traversal(f, d);
  std::ostringstream err;
  d.render(err);
  INFO(err.str());
  REQUIRE(t);
  return *t;
}

std::string parse_error(const std::string& text) {
  SourceFile f("test.intra.ir", text);
  Diagnostics d;
  auto t = parse_traversal(f, d);
  REQUIRE_FALSE(t);
  std::ostringstream err;
  d.render(err);
  return err.str();
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  size_t at = text.find(from);
  if (at == std::string::npos) throw std::runtime_error("test: pattern not found: " + from);
  return text.replace(at, from.size(), to);
}

// The verifier's message for `text` (empty when it verifies).
std::string verify(const std::string& text, const Program& p = rgat_like()) { return verify_traversal(p, parse(text)); }

}  // namespace

TEST_CASE("traversal instances print, parse back and print the same text", "[intra][roundtrip]") {
  for (const char* text : {kSoftmax, kEdges}) {
    TraversalInstance t = parse(text);
    CHECK(print_traversal(t) == text);
    CHECK(print_traversal(parse(print_traversal(t))) == text);
  }
}

TEST_CASE("a traversal's edge batch prints after its threads when it is not 1, and parses back", "[intra][roundtrip]") {
  const std::string batched = replace(kSoftmax, "threads=256\n", "threads=256 edge_batch=4\n");
  TraversalInstance t = parse(batched);
  CHECK(t.edge_batch == 4);
  CHECK(print_traversal(t) == batched);
  t.edge_batch = 1;
  CHECK(print_traversal(t) == kSoftmax);  // the default prints nothing: texts from before it parse as they were
  CHECK(parse(kSoftmax).edge_batch == 1);
}

TEST_CASE("a traversal's row lanes print last when not 32; slot counts follow them; bad values are positioned",
          "[intra][roundtrip]") {
  // 64 elements over 16 lanes: 4 slots a lane.
  std::string grouped = replace(kEdges, "threads=256\n", "threads=256 row_lanes=16\n");
  for (int k = 0; k < 4; ++k) grouped = replace(grouped, "[1, 64] lanes(2)", "[1, 64] lanes(4)");
  TraversalInstance t = parse(grouped);
  CHECK(t.row_lanes == 16);
  CHECK(print_traversal(t) == grouped);
  CHECK(parse(kEdges).row_lanes == 32);
  // The slot count written must be the instance's.
  CHECK(parse_error(replace(kEdges, "threads=256\n", "threads=256 row_lanes=16\n"))
            .find("64 elements spread over the lanes take 4 slot(s) per lane, not 2") != std::string::npos);
  CHECK(parse_error(replace(kEdges, "threads=256\n", "threads=256 row_lanes=4\n")).find("test.intra.ir:1:") == 0);
  CHECK(parse_error(replace(kEdges, "threads=256\n", "threads=256 row_lanes=4\n")).find("row_lanes=4 is not 8, 16 or 32") !=
        std::string::npos);
}

TEST_CASE("a traversal's vector length prints after its row lanes when not 8; bad values are positioned",
          "[intra][roundtrip]") {
  std::string scalar = replace(kEdges, "threads=256\n", "threads=256 row_lanes=16 vector=1\n");
  for (int k = 0; k < 4; ++k) scalar = replace(scalar, "[1, 64] lanes(2)", "[1, 64] lanes(4)");
  TraversalInstance t = parse(scalar);
  CHECK(t.vector == 1);
  CHECK(print_traversal(t) == scalar);
  CHECK(parse(kEdges).vector == kDefaultVector);  // not printed: texts from before it parse as they were
  CHECK(parse_error(replace(kEdges, "threads=256\n", "threads=256 vector=3\n")).find("vector=3 is not 1, 2, 4 or 8") !=
        std::string::npos);
  t.vector = 0;
  CHECK(verify_launch(rgat_like(), Kernel{t}).find("vector=0 is not 1, 2, 4 or 8") != std::string::npos);
}

TEST_CASE("slot runs: the largest power of two up to the vector length dividing the slots and the row", "[intra]") {
  CHECK(slot_vector(64, 4, 8) == 4);   // 64 over 16 lanes: one run of 4 a lane
  CHECK(slot_vector(64, 8, 8) == 8);   // over 8 lanes: one run of 8 (16 bytes of bf16)
  CHECK(slot_vector(64, 2, 8) == 2);   // over 32 lanes
  CHECK(slot_vector(64, 8, 4) == 4);   // capped: two runs of 4 a lane
  CHECK(slot_vector(64, 4, 1) == 1);   // vector: 1, the interleaved layout
  CHECK(slot_vector(60, 8, 8) == 4);   // 60 over 8 lanes: runs of 4, the last lane's second past the end
  CHECK(slot_vector(36, 5, 8) == 1);   // 5 slots: interleaved
  CHECK(slot_vector(96, 6, 8) == 2);
  CHECK(slot_vector(1, 1, 8) == 1);
}

TEST_CASE("the launch check refuses row lanes a kernel cannot hold rows in step with, and sizes the grid by them",
          "[intra][launch]") {
  Program p = rgat_like();
  TraversalInstance t = parse(kEdges);
  t.row_lanes = 8;
  CHECK(verify_launch(p, Kernel{t}).empty());
  CHECK(launch_config(p, Kernel{t}).x.rows_per_block == 32);  // 256 threads, 8 lanes a row
  t.row_lanes = 32;
  CHECK(launch_config(p, Kernel{t}).x.rows_per_block == 8);
  // A loop with a sync walks edge by edge with the whole warp: its rows cannot run in step.
  TraversalInstance s = parse(kSoftmax);
  for (Instr& in : s.body)
    if (auto* l = std::get_if<EdgeLoop>(&in.v)) l->body.push_back(Instr{Sync{}});
  s.row_lanes = 16;
  CHECK(verify_launch(p, Kernel{s}).find("row_lanes=16 but the loop over n's edges holds a sync") != std::string::npos);
  s.row_lanes = 0;
  CHECK(verify_launch(p, Kernel{s}).find("row_lanes=0 is not 8, 16 or 32") != std::string::npos);
}

TEST_CASE("element-wise values print with the fewest parentheses and parse back", "[intra][roundtrip]") {
  using V = Value;
  using inter::Op;
  auto a = V::reg_ref("a"), b = V::reg_ref("b"), c = V::reg_ref("c");
  struct Case {
    ValueP v;
    const char* text;
  } cases[] = {
      {V::apply(Op::Sub, {a, V::apply(Op::Sub, {b, c})}), "a - (b - c)"},
      {V::apply(Op::Sub, {V::apply(Op::Sub, {a, b}), c}), "a - b - c"},
      {V::apply(Op::Mul, {V::apply(Op::Add, {a, b}), c}), "(a + b) * c"},
      {V::apply(Op::Div, {a, V::apply(Op::Mul, {b, c})}), "a / (b * c)"},
      {V::apply(Op::Neg, {V::apply(Op::Mul, {a, b})}), "-(a * b)"},
      {V::apply(Op::Mul, {V::apply(Op::Neg, {a}), b}), "-a * b"},
      {V::apply(Op::Sub, {a, V::constant(-1e30)}), "a - -1e+30"},
      {V::apply(Op::LeakyReluGrad, {V::apply(Op::Add, {a, b}), V::constant(0.01)}), "leakyrelu_grad(a + b, 0.01)"},
      {V::apply(Op::MaxGrad, {a, V::constant(0.5)}), "max_grad(a, 0.5)"},
      {V::apply(Op::Sigmoid, {V::apply(Op::Tanh, {V::apply(Op::Sqrt, {V::apply(Op::Relu, {a})})})}), "sigmoid(tanh(sqrt(relu(a))))"},
  };
  for (const Case& c : cases) {
    CHECK(print_value(c.v) == c.text);
    std::string text = std::string("traversal k: rows=etype_sorted_coo.edges(e) threads=32\n    let x: [] replicated(1) = ") + c.text + "\n";
    CHECK(print_traversal(parse(text)) == text);
  }
}

TEST_CASE("the intra parser reports positioned errors", "[intra][parser]") {
  CHECK(parse_error("traversal k: rows=etype_sorted_coo.edges(e) threads=32\n    let x: [64] lanes(3) = 0\n") ==
        "test.intra.ir:2:23: error: 64 elements spread over the lanes take 2 slot(s) per lane, not 3 [intra-syntax]\n"
        "    2 |     let x: [64] lanes(3) = 0\n"
        "      |                       ^\n");
  CHECK(parse_error("traversal k: rows=etype_sorted_coo.edges(e) threads=32\n    let x: [] replicated(1) = frob(y)\n")
            .find("2:31: error: unknown element-wise function 'frob'") != std::string::npos);
  CHECK(parse_error("traversal k: rows=nodes(n) threads=32\n").find("unknown row loop 'nodes'") != std::string::npos);
  CHECK(parse_error("traversal k: rows=edges(e) threads=32\n").find("1:19: error: edges walks the layout etype_sorted_coo: write "
                                                                   "etype_sorted_coo.edges") != std::string::npos);
  CHECK(parse_error("traversal k: rows=dst_nodes(n) threads=32\n    for e in csr_by_src.incoming(n) at i:\n        sync\n")
            .find("2:14: error: incoming walks the layout csr_by_dst: write csr_by_dst.incoming") != std::string::npos);
  CHECK(parse_error("traversal k: rows=etype_sorted_coo.edges(e) threads=32\n    store att[e] = v by warp\n").find("unknown store lanes 'warp'") !=
        std::string::npos);
  CHECK(parse_error("traversal k: rows=etype_sorted_coo.edges(e) threads=32\n      sync\n").find("unexpected indentation") != std::string::npos);
  CHECK(parse_error("traversal k: rows=etype_sorted_coo.edges(e) threads=32\n    sync now\n").find("expected an instruction") != std::string::npos);
}

TEST_CASE("the traversal verifier accepts the lowered kernels", "[intra][verifier]") {
  CHECK(verify(kEdges) == "");
  TraversalInstance t = parse(kSoftmax);
  insert_warp_syncs(t);
  CHECK(verify_traversal(rgat_like(), t) == "");
}

TEST_CASE("the traversal verifier rejects each broken rule", "[intra][verifier]") {
  const std::string sm = kSoftmax, ed = kEdges;
  // Without its syncs the softmax races: lane 0 overwrites att[e] that the other lanes read.
  CHECK(verify(sm) == "rgat_fw_nodes_att_max: lanes race on 'att': 'load att[e] into v_att' and then 'store att[e] by lane0' "
                      "with no sync between them");
  struct Case {
    std::string text;
    const char* message;
  } cases[] = {
      // names
      {replace(ed, "let ht:", "let hs:"), "'hs' is defined twice"},
      {replace(ed, "let ht:", "let att:"), "'att' is also a tensor (a kernel parameter)"},
      {replace(ed, "let ht:", "let lane:"), "'lane' is reserved in kernels (the printer's own names, C++ and CUDA)"},
      {replace(ed, "hs * v_w_s", "hs * v_w_q"), "register 'v_w_q' is read before it is defined"},
      {replace(ed, "store att[e] = v_att", "store att[e] = v_at"), "store of undefined register 'v_at'"},
      {replace(ed, "store att[e] = v_att by lane0\n", "v_att = 1\n"), "'v_att' is a let: it cannot be updated"},
      {replace(ed, "store att[e] = v_att by lane0\n", "v_x = 1\n"), "update of undefined register 'v_x'"},
      // rows
      {replace(ed, "load w_s[e_etype]", "load w_s[e]"), "'w_s' is indexed by an edge type (index = etype[e]), not by 'e'"},
      {replace(ed, "load t_hs[e]", "load t_hs[e_etype]"), "'t_hs' is indexed by an edge, not by 'e_etype'"},
      {replace(ed, "load t_hs[e]", "load t_hs[f]"), "row 'f' of 't_hs' is not defined"},
      {replace(ed, "index e_etype = etype[e]", "index e_etype = ntype[e]"), "index 'e_etype': ntype[] cannot be indexed by 'e'"},
      {replace(ed, "index e_etype = etype[e]", "index e_etype = in_src[e]"), "index 'e_etype': in_src[] cannot be indexed by 'e'"},
      {replace(ed, "store att[e] = v_att by lane0", "store feature[e] = v_att by lane0"), "store to 'feature', an input"},
      {replace(ed, "store att[e] = v_att by lane0", "store shared[0] = v_att by lane0"), "store to 'shared', a weight"},
      // types and lane layouts
      {replace(ed, "let hs: [1, 64] lanes(2)", "let hs: [1, 32] lanes(1)"), "'hs' has 32 elements, rows of 't_hs' have 64"},
      {replace(ed, "load t_hs[e]", "load t_hs[e] by lane0"), "'hs' is spread over the lanes: each lane loads its elements, not lane 0"},
      {replace(ed, "let hs: [1, 64] lanes(2)", "let hs: [1, 64] replicated(64)"), "'hs' is laid out replicated where the instruction computes lanes"},
      {replace(ed, "warp_sum(hs * v_w_s, 64)", "warp_sum(hs * v_w_s, 32)"), "'dot_hs_w_s' reduces 64 elements by 32 into 1: the counts do not match"},
      {replace(ed, "warp_sum(hs * v_w_s, 64)", "lane_sum(hs * v_w_s, 64)"), "'hs' is laid out lanes where the instruction computes replicated"},
      {replace(ed, "let v_att: [1] replicated(1) = leakyrelu(dot_hs_w_s + dot_ht_w_t, 0.2)",
               "let v_att: [3] replicated(3) = hs"),
       "'hs' has 64 elements, which do not broadcast to 3"},
      {replace(ed, "store att[e] = v_att by lane0", "store att[e] = v_att by lanes"), "'v_att' is replicated: it is stored by lane0"},
      {replace(ed, "store att[e] = v_att by lane0", "store att[e] = hs by lane0"), "store of 'hs' (64 elements) into rows of 'att' (1 elements)"},
      // layouts, loops and ownership
      {replace(sm, "for e in csr_by_dst.incoming(n) at i_e:\n        # n[\"att_max\"]", "for e in csr_by_src.outgoing(n) at i_e:\n        # n[\"att_max\"]"),
       "loop over 'e' needs the graph layout 'csr_by_src', which the program does not have"},
      {replace(sm, "csr_by_dst.incoming(n) at i_e:\n        # n[\"att_max\"]", "csr_by_dst.incoming(m) at i_e:\n        # n[\"att_max\"]"),
       "edge loop over 'm': inner loops walk the edges of the row node"},
      {replace(ed, "store att[e] = v_att by lane0", "index e_src = src[e]\n    store att_max[e_src] = v_att by lane0"),
       "'att_max' is stored by this kernel but stored through row 'e_src', which other warps own"},
      {replace(ed, "store att[e] = v_att by lane0", "index e_src = src[e]\n    store att_max[e_src] += v_att by lane0 atomic\n"
                                                   "    let back: [1] replicated(1) = load att_max[e_src]"),
       "'att_max' is atomically updated by other warps while this kernel loads it"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    std::string msg = verify(c.text);
    CHECK(msg.find(c.message) != std::string::npos);
    CHECK(msg.rfind(msg.find("rgat_fw_nodes") == 0 ? "rgat_fw_nodes_att_max: " : "rgat_fw_edges_att: ", 0) == 0);
  }
  TraversalInstance inner = parse(ed);
  inner.rows = inter::LoopKind::IncomingEdges;
  CHECK(verify_traversal(rgat_like(), inner) == "rgat_fw_edges_att: the row loop must be over edges, dst_nodes, src_nodes or src_etype_pairs");
  Program no_coo = rgat_like();
  no_coo.layouts.erase(layout::kSortedCoo);
  CHECK(verify(ed, no_coo) == "rgat_fw_edges_att: an edge row loop walks the layout 'etype_sorted_coo', which the program does not have");
}

TEST_CASE("warp syncs go where lanes exchange values through global memory", "[intra][sync]") {
  TraversalInstance t = parse(kSoftmax);
  insert_warp_syncs(t);
  // One sync before each lane-0 overwrite of a row the other lanes have read, one before the loop that
  // reads back what lane 0 wrote; none per iteration where one before the loop suffices.
  CHECK(print_traversal(t) == replace(replace(replace(kSoftmax,
                                                      "        v_att = exp(v_att - v_att_max)\n",
                                                      "        v_att = exp(v_att - v_att_max)\n        sync\n"),
                                              "    for e in csr_by_dst.incoming(n) at i_e:\n        # n[\"att_sum\"] += e[\"att\"]",
                                              "    sync\n    for e in csr_by_dst.incoming(n) at i_e:\n        # n[\"att_sum\"] += e[\"att\"]"),
                                      "        v_h += v_att * v_msg\n", "        v_h += v_att * v_msg\n        sync\n"));
  // Loaded by lane 0 where lane 0 overwrites them, the rows of att are exchanged only between loops.
  TraversalInstance owned = parse(replace(replace(kSoftmax, "        var v_att: [1] replicated(1) = load att[e]\n        v_att = exp",
                                                  "        var v_att: [1] replicated(1) = load att[e] by lane0\n        v_att = exp"),
                                          "        var v_att: [1] replicated(1) = load att[e]\n        v_att = v_att /",
                                          "        var v_att: [1] replicated(1) = load att[e] by lane0\n        v_att = v_att /"));
  insert_warp_syncs(owned);
  std::string synced = print_traversal(owned);
  CHECK(synced.find("    sync\n    for e in csr_by_dst.incoming(n) at i_e:\n        # e[\"att\"] = exp") != std::string::npos);
  CHECK(synced.find("    sync\n    for e in csr_by_dst.incoming(n) at i_e:\n        # n[\"att_sum\"]") != std::string::npos);
  CHECK(synced.find("    sync\n    for e in csr_by_dst.incoming(n) at i_e:\n        let v_msg") != std::string::npos);
  CHECK(synced.find("        sync\n") == std::string::npos);
  // Inserting again changes nothing.
  std::string once = print_traversal(t);
  insert_warp_syncs(t);
  CHECK(print_traversal(t) == once);
  // Lane-partitioned rows read back by the same lanes need no sync; read back by all lanes they do.
  const std::string lanes = R"(traversal k: rows=etype_sorted_coo.edges(e) threads=32
    let x: [1, 64] lanes(2) = load t_hs[e]
    store t_ht[e] = x by lanes
    let y: [1, 64] lanes(2) = load t_ht[e]
    let s: [1] replicated(1) = warp_sum(y, 64)
    store att[e] = s by lane0
)";
  TraversalInstance u = parse(lanes);
  insert_warp_syncs(u);
  CHECK(print_traversal(u) == lanes);
  TraversalInstance v = parse(replace(lanes, "let y: [1, 64] lanes(2) = load t_ht[e]\n    let s: [1] replicated(1) = warp_sum(y, 64)",
                                      "let y: [1, 64] replicated(64) = load t_ht[e]\n    let s: [1] replicated(1) = lane_sum(y, 64)"));
  CHECK(find_warp_hazard(v)->tensor == "t_ht");
  insert_warp_syncs(v);
  CHECK(print_traversal(v).find("    store t_ht[e] = x by lanes\n    sync\n    let y:") != std::string::npos);
}

TEST_CASE("the lanes split the loops of scalar work; syncs follow who owns each edge's rows", "[intra][split][sync]") {
  TraversalInstance t = parse(kSoftmax);
  split_edge_loops(t);
  // The max, the exp and the sum loops hold scalar work only; the last loop holds 64-wide messages.
  std::string split = print_traversal(t);
  CHECK(std::count(split.begin(), split.end(), '\n') == std::count(kSoftmax, kSoftmax + std::strlen(kSoftmax), '\n'));
  size_t n_split = 0;
  for (size_t at = split.find(" at i_e split:"); at != std::string::npos; at = split.find(" at i_e split:", at + 1)) ++n_split;
  CHECK(n_split == 3);
  CHECK(split.find("    for e in csr_by_dst.incoming(n) at i_e:\n        let v_msg") != std::string::npos);
  // The split text parses back to the same instance.
  CHECK(print_traversal(parse(split)) == split);
  // A lane reads back its own edges' att (written by the same lane in the exp loop): no sync between the
  // split loops, none inside them; the whole-warp loop reads every edge's att, so one sync before it (and
  // one inside it, where lane 0 overwrites the att the other lanes have read).
  insert_warp_syncs(t);
  std::string synced = print_traversal(t);
  INFO(synced);
  CHECK(verify(synced).empty());
  CHECK(synced.find("    sync\n    for e in csr_by_dst.incoming(n) at i_e:\n        let v_msg") != std::string::npos);
  CHECK(synced.find("    sync\n    for e in csr_by_dst.incoming(n) at i_e split:") == std::string::npos);
  bool in_split = false;
  std::istringstream lines(synced);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("    for ", 0) == 0) in_split = line.find(" split:") != std::string::npos;
    else if (line.rfind("        ", 0) != 0) in_split = false;
    CHECK_FALSE((in_split && line == "        sync"));
  }
  // A split loop after the whole-warp loop that reads att must wait for lane 0's stores.
  TraversalInstance after = parse(std::string(kSoftmax) + "    var v_chk: [1] replicated(1) = 0\n"
                                  "    for e in csr_by_dst.incoming(n) at i_e:\n"
                                  "        let v_a2: [1] replicated(1) = load att[e]\n"
                                  "        v_chk += v_a2\n");
  split_edge_loops(after);
  insert_warp_syncs(after);
  std::string tail = print_traversal(after);
  CHECK(tail.find("    sync\n    for e in csr_by_dst.incoming(n) at i_e split:\n        let v_a2") != std::string::npos);
  // Splitting is recomputed: a loop that gains a vector value is unsplit.
  for (Instr& in : after.body)
    if (auto* l = std::get_if<EdgeLoop>(&in.v)) l->split = true;
  split_edge_loops(after);
  CHECK(print_traversal(after).find("at i_e split:\n        let v_msg") == std::string::npos);
}

TEST_CASE("the verifier rejects split loops whose body the lanes cannot split", "[intra][split][verifier]") {
  auto with_split = [](std::string text) { return replace(text, "at i_e:\n        let v_msg", "at i_e split:\n        let v_msg"); };
  CHECK(verify(with_split(kSoftmax)).find("the lanes cannot split the loop over 'e': 'v_msg' is spread over the lanes") != std::string::npos);
  const std::string base = R"(traversal k: rows=dst_nodes(n) threads=256
    var acc: [1] replicated(1) = 0
    for e in csr_by_dst.incoming(n) at i_e split:
        let a: [1] replicated(1) = load att[e]
        acc += a
    store att_sum[n] = acc by lane0
)";
  CHECK(verify(base).empty());
  CHECK(verify(replace(base, "acc += a", "acc *= a")).find("updated by more than a sum or a maximum") != std::string::npos);
  CHECK(verify(replace(base, "acc += a", "acc = max(acc, a)\n        acc += a")).find("both summed and maximised") != std::string::npos);
  CHECK(verify(replace(base, "acc += a", "acc += a\n        let b: [1] replicated(1) = a + acc")).find("accumulated and read") != std::string::npos);
  CHECK(verify(replace(base, "acc += a", "acc += a\n        store att_max[n] = a by lane0")).find("not the loop edge's") != std::string::npos);
  CHECK(verify(replace(base, "acc += a", "acc = max(a, acc)")).empty());
  CHECK(verify(replace(base, "acc += a", "acc += a * acc")).find("more than a sum") != std::string::npos);
}

namespace {

// A program with one instance of each template kind (what the verifier checks of each).
const char* kProgram = R"(# hectorgen intra-operator IR
model m
phase backward
hyper d = 64
input x: node[d]
input norm: edge[]
weight W: etype[d, d] init="glorot"
weight b: etype[4] init="zeros"
output y: node[d]
option materialization = "vanilla"
option reorder = "off"
option dtype = "fp32"
option gemm_tile = 16
option gemm_coarsen = 1
option traversal_threads = 256
layouts etype_sorted_coo
tensor x: input node[64]
tensor norm: input edge[]
tensor W: weight etype[64, 64]
tensor b: weight etype[4]
tensor y: output node[64] zero_init
tensor d_W: output etype[64, 64] zero_init
tensor d_b: output etype[4] zero_init
tensor t_e: temp edge[64]
tensor t_b: temp edge[4]
alias tb -> t_b

gemm m_gemm:  t_e[row] = x[src[row]] · W[etype] * norm[row]
    rows=edges heads=1 k=64 n=64 dtype=fp32 tile=16 coarsen=1 store=plain kernel=tc
    from: e["t"] = e.src.x * W[e.etype] * e.norm

wgrad m_wgrad:  d_W[etype] += sum over rows x[src[row]]^T · t_e[row]
    rows=edges heads=1 k=64 n=64 dtype=fp32 kernel=tc deterministic
    from: d_W[e.etype] += outer(e.src.x, e["t"])

torch m_torch: target=t_b
    field tb -> t_b
    for e in g.edges():
        e["tb"] = b[e.etype] * e.norm

segsum m_segsum:  d_b[etype] += sum over rows t_b[row]
    rows=edges numel=4 deterministic
    from: d_b[e.etype] += e["tb"]
)";

std::optional<Program> parse_program_text(const std::string& text, std::string* err = nullptr) {
  SourceFile f("m.intra.ir", text);
  Diagnostics d;
  auto p = parse_program(f, d);
  if (err) {
    std::ostringstream s;
    d.render(s);
    *err = s.str();
  }
  return p;
}

std::string verify_text(const std::string& text) {
  std::string err;
  auto p = parse_program_text(text, &err);
  INFO(err);
  REQUIRE(p);
  return verify_program(*p);
}

}  // namespace

TEST_CASE("a program with every instance kind prints, parses back and verifies", "[intra][roundtrip][verifier]") {
  std::string err;
  auto p = parse_program_text(kProgram, &err);
  INFO(err);
  REQUIRE(p);
  CHECK(print_program(*p) == kProgram);
  CHECK(verify_program(*p) == "");
  REQUIRE(p->kernels.size() == 4);
  CHECK(std::get<GemmInstance>(p->kernels[0]).row_scalar == "norm");
  CHECK(std::get<TorchInstance>(p->kernels[2]).field_tensor.at("tb") == "t_b");
  CHECK(p->decl.find_hyper("d")->value == 64);
}

namespace {

// kProgram in bf16: the header option, both instances, and the tensors' storage (the row scalar norm and the narrow
// t_b stay fp32).
std::string bf16_program() {
  // (x, W and t_e in bf16, norm in fp32: the GEMM and the weight gradient run on tensor cores)
  std::string t = replace(replace(replace(kProgram, "option dtype = \"fp32\"", "option dtype = \"bf16\""),
                                  "n=64 dtype=fp32 tile=16 coarsen=1 store=plain kernel=tc",
                                  "n=64 dtype=bf16 tile=16 coarsen=1 store=plain kernel=tc"),
                          "n=64 dtype=fp32 kernel=tc deterministic", "n=64 dtype=bf16 kernel=tc deterministic");
  for (const char* line : {"tensor x: input node[64]\n", "tensor W: weight etype[64, 64]\n", "tensor b: weight etype[4]\n",
                           "tensor y: output node[64] ", "tensor d_W: output etype[64, 64] ", "tensor d_b: output etype[4] ",
                           "tensor t_e: temp edge[64]\n"}) {
    std::string from = line, to = from.substr(0, from.size() - 1) + " bf16" + from.back();
    t = replace(t, from, to);
  }
  return t;
}

}  // namespace

TEST_CASE("GEMMs and weight gradients carry the model's dtype through print, parse and verify", "[intra][roundtrip][verifier]") {
  // The same program in tf32 (stored as fp32): the header option and both instances say so, both on tensor cores.
  // (bf16 and fp16 programs also store their tensors in 16 bits: "tensors carry their storage type ..." below.)
  const std::string tf32 = replace(replace(replace(kProgram, "option dtype = \"fp32\"", "option dtype = \"tf32\""),
                                           "n=64 dtype=fp32 tile=16 coarsen=1 store=plain kernel=tc",
                                           "n=64 dtype=tf32 tile=16 coarsen=1 store=plain kernel=tc"),
                                   "n=64 dtype=fp32 kernel=tc deterministic", "n=64 dtype=tf32 kernel=tc deterministic");
  REQUIRE(tf32 != kProgram);
  std::string err;
  auto p = parse_program_text(tf32, &err);
  INFO(err);
  REQUIRE(p);
  CHECK(print_program(*p) == tf32);
  CHECK(verify_program(*p) == "");
  CHECK(std::get<GemmInstance>(p->kernels[0]).dtype == inter::DType::TF32);
  CHECK(std::get<WeightGradInstance>(p->kernels[1]).dtype == inter::DType::TF32);
  auto q = parse_program_text(bf16_program(), &err);
  INFO(err);
  REQUIRE(q);
  CHECK(std::get<GemmInstance>(q->kernels[0]).dtype == inter::DType::BF16);
  CHECK(std::get<WeightGradInstance>(q->kernels[1]).dtype == inter::DType::BF16);
  // One dtype per model: an instance that disagrees with the header is rejected, either way round.
  CHECK(verify_text(replace(tf32, "dtype=tf32 tile=16 coarsen=1 store=plain kernel=tc",
                            "dtype=fp32 tile=16 coarsen=1 store=plain kernel=tc")) ==
        "m_gemm: dtype=fp32 but the model's dtype is tf32");
  CHECK(verify_text(replace(kProgram, "dtype=fp32 kernel=tc deterministic", "dtype=fp16 kernel=tc deterministic")) ==
        "m_wgrad: dtype=fp16 but the model's dtype is fp32");
  // A misspelt dtype is a positioned syntax error.
  CHECK_FALSE(parse_program_text(replace(kProgram, "dtype=fp32 tile=16 coarsen=1 store", "dtype=fp8 tile=16 coarsen=1 store"), &err));
  CHECK_THAT(err, Catch::StartsWith("m.intra.ir:29:40: error: unknown dtype 'fp8' (fp32, tf32, bf16 or fp16) [intra-syntax]"));
}

TEST_CASE("a GEMM runs on tensor cores when its dtype, shape and storage types allow, else SIMT saying why",
          "[intra][roundtrip][verifier][tc]") {
  const std::string tf32 = replace(replace(replace(kProgram, "option dtype = \"fp32\"", "option dtype = \"tf32\""),
                                           "dtype=fp32 tile=16 coarsen=1 store=plain kernel=tc",
                                           "dtype=tf32 tile=16 coarsen=1 store=plain kernel=tc"),
                                   "dtype=fp32 kernel=tc deterministic", "dtype=tf32 kernel=tc deterministic");
  std::string err;
  auto p = parse_program_text(tf32, &err);
  INFO(err);
  REQUIRE(p);
  CHECK(print_program(*p) == tf32);
  CHECK(verify_program(*p) == "");
  const GemmInstance base = std::get<GemmInstance>(p->kernels[0]);
  CHECK(base.tensor_cores);
  auto choice = [&](const std::function<void(GemmInstance&, Program&)>& change) {
    Program q = *p;
    GemmInstance g = base;
    change(g, q);
    const GemmKernelChoice c = gemm_kernel_choice(q, g);
    return c.tensor_cores ? std::string("tc") : "simt(" + c.reason + ")";
  };
  auto storage = [](Program& q, const char* name, inter::DType d) {
    for (TensorInfo& t : q.tensors)
      if (t.name == name) t.storage = d;
  };
  CHECK(choice([](GemmInstance&, Program&) {}) == "tc");
  CHECK(choice([](GemmInstance& g, Program&) { g.dtype = inter::DType::FP32; }) == "tc");  // as 3xTF32
  CHECK(choice([](GemmInstance& g, Program&) { g.heads = 2; }) == "simt(heads > 1)");
  CHECK(choice([](GemmInstance& g, Program&) { g.k = 48; }) == "simt(k % 32)");
  CHECK(choice([](GemmInstance& g, Program&) { g.k = 96; }) == "tc");
  CHECK(choice([](GemmInstance& g, Program&) { g.n = 96; }) == "simt(n % 64)");
  CHECK(choice([](GemmInstance& g, Program&) { g.n = 128; }) == "tc");
  CHECK(choice([](GemmInstance& g, Program&) { g.rows = Rows::Etypes; }) == "simt(rows=etypes)");
  CHECK(choice([](GemmInstance& g, Program&) { g.transpose_w = true; }) == "tc");
  CHECK(choice([](GemmInstance& g, Program&) { g.accumulate = true; }) == "tc");
  CHECK(choice([](GemmInstance& g, Program&) { g.segments = Segments::None; }) == "tc");
  // Storage types: x and w in the dtype's (tf32: fp32), y too or fp32 when it adds atomically, an fp32 scalar; x
  // may be fp32 in a 16-bit model (the weights widened as loaded, tf32 MMAs), the weights may not.
  CHECK(choice([&](GemmInstance& g, Program&) { g.dtype = inter::DType::BF16; }) == "simt(W stored as fp32)");
  auto bf16 = [&](GemmInstance& g, Program& q) {
    g.dtype = inter::DType::BF16;
    for (const char* t : {"x", "W", "t_e"}) storage(q, t, inter::DType::BF16);
  };
  CHECK(choice(bf16) == "tc");
  CHECK_FALSE(gemm_widens_weights(*p, base));
  {
    Program q = *p;
    GemmInstance g = base;
    bf16(g, q);
    CHECK_FALSE(gemm_widens_weights(q, g));
    storage(q, "x", inter::DType::FP32);
    CHECK(gemm_kernel_choice(q, g).tensor_cores);
    CHECK(gemm_widens_weights(q, g));
    storage(q, "t_e", inter::DType::FP32);
    CHECK(gemm_kernel_choice(q, g).tensor_cores);
  }
  CHECK(choice([&](GemmInstance& g, Program& q) { bf16(g, q), storage(q, "W", inter::DType::FP16); }) == "simt(W stored as fp16)");
  CHECK(choice([&](GemmInstance& g, Program& q) { bf16(g, q), storage(q, "norm", inter::DType::BF16); }) ==
        "simt(norm stored as bf16)");
  CHECK(choice([&](GemmInstance& g, Program& q) { bf16(g, q), g.scatter = Gather::Dst; }) == "simt(t_e stored as bf16)");
  CHECK(choice([&](GemmInstance& g, Program& q) { bf16(g, q), storage(q, "t_e", inter::DType::FP32); }) == "tc");  // fp32 out
  CHECK(choice([&](GemmInstance& g, Program& q) { bf16(g, q), storage(q, "t_e", inter::DType::FP16); }) ==
        "simt(t_e stored as fp16)");
  CHECK(choice([&](GemmInstance& g, Program& q) { bf16(g, q), g.scatter = Gather::Dst, storage(q, "t_e", inter::DType::FP32); }) ==
        "tc");
  CHECK(choice([&](GemmInstance& g, Program& q) { g.dtype = inter::DType::TF32, storage(q, "x", inter::DType::BF16); }) ==
        "simt(x stored as bf16)");

  // The instance line says which, and why not: printed, parsed back, and checked against the rule.
  // (k=48 parses; the verifier would also reject x's 64-element rows, after the kernel's choice)
  const std::string k48 = replace(tf32, "heads=1 k=64 n=64 dtype=tf32 tile=16 coarsen=1 store=plain kernel=tc",
                                  "heads=1 k=48 n=64 dtype=tf32 tile=16 coarsen=1 store=plain kernel=simt(tc: k % 32)");
  auto q = parse_program_text(k48, &err);
  INFO(err);
  REQUIRE(q);
  CHECK(print_program(*q) == k48);
  CHECK_FALSE(std::get<GemmInstance>(q->kernels[0]).tensor_cores);
  CHECK_FALSE(parse_program_text(replace(k48, "kernel=simt(tc: k % 32)", "kernel=tc"), &err));
  CHECK_THAT(err, Catch::Contains("29:82: error: the instance runs on kernel=simt(tc: k % 32) (by its dtype, shape and storage "
                                  "types), not 'tc'"));
  CHECK_FALSE(parse_program_text(replace(k48, "kernel=simt(tc: k % 32)", "kernel=simt(tc: n % 64)"), &err));
  CHECK_THAT(err, Catch::Contains("error: the instance runs on kernel=simt(tc: k % 32) (by its dtype, shape and storage types), "
                                  "not 'simt(tc: n % 64)'"));
  CHECK_FALSE(parse_program_text(replace(tf32, "kernel=tc", "kernel=simt"), &err));
  CHECK_THAT(err, Catch::Contains("error: the instance runs on kernel=tc (by its dtype, shape and storage types), not 'simt'"));
  CHECK_FALSE(parse_program_text(replace(kProgram, "kernel=tc", "kernel=simt"), &err));  // fp32 too
  CHECK_THAT(err, Catch::Contains("error: the instance runs on kernel=tc (by its dtype, shape and storage types), not 'simt'"));
  CHECK_FALSE(parse_program_text(replace(kProgram, "kernel=tc", "kernel=wmma"), &err));
  CHECK_THAT(err, Catch::Contains("29:82: error: unknown kernel 'wmma' (tc or simt)"));
  CHECK_FALSE(parse_program_text(replace(kProgram, "kernel=tc", "kernel=simt(tc: k % 32"), &err));
  CHECK_THAT(err, Catch::Contains("error: expected ')'"));
  // A program built in code that disagrees with the rule is rejected by the verifier, either way round.
  Program wrong = *p;
  std::get<GemmInstance>(wrong.kernels[0]).tensor_cores = false;
  CHECK(verify_program(wrong) == "m_gemm: kernel=simt, but the instance fits the tensor-core kernel (dtype=tf32)");
  wrong = *q;
  std::get<GemmInstance>(wrong.kernels[0]).tensor_cores = true;
  CHECK(verify_program(wrong) == "m_gemm: kernel=tc, but the tensor-core kernel cannot run it (k % 32)");
}

TEST_CASE("the graph's tile offsets: graph_tile and tiles=graph print, parse back and verify; misuse is rejected",
          "[intra][roundtrip][verifier][tc]") {
  const std::string graph = replace(replace(kProgram, "layouts etype_sorted_coo\n", "layouts etype_sorted_coo\ngraph_tile 64\n"),
                                    "store=plain kernel=tc\n", "store=plain kernel=tc tiles=graph\n");
  std::string err;
  auto p = parse_program_text(graph, &err);
  INFO(err);
  REQUIRE(p);
  CHECK(print_program(*p) == graph);
  CHECK(verify_program(*p) == "");
  CHECK(p->graph_tile == kTcTileRows);
  CHECK(std::get<GemmInstance>(p->kernels[0]).graph_tiles);
  CHECK(graph_gemm_tile(*p) == 64);
  // Without the line: the GEMMs' own tile (16), and the tensor-core GEMM numbers its tiles itself.
  auto plain = parse_program_text(kProgram, &err);
  REQUIRE(plain);
  CHECK(plain->graph_tile == 0);
  CHECK(graph_gemm_tile(*plain) == 16);
  CHECK_FALSE(std::get<GemmInstance>(plain->kernels[0]).graph_tiles);
  // A graph prepared for 64-row tiles with a GEMM reading its own: fine (it numbers them at every call).
  CHECK(verify_text(replace(graph, " tiles=graph", "")) == "");
  // The rules: tiles=graph needs graph_tile 64 and a tensor-core GEMM over segments; graph_tile is 64 or absent.
  CHECK(verify_text(replace(graph, "graph_tile 64\n", "")) ==
        "m_gemm: tiles=graph, but the graph's tile offsets are for 16-row tiles, not the tensor-core kernel's 64 (graph_tile)");
  CHECK(verify_text(replace(graph, "graph_tile 64", "graph_tile 32")) ==
        "graph_tile 32: the graph's tile offsets are read from it only by the tensor-core kernel, whose row tile is 64");
  Program wrong = *p;
  std::get<GemmInstance>(wrong.kernels[0]).segments = Segments::None;
  CHECK(verify_program(wrong) == "m_gemm: tiles=graph needs the tensor-core kernel over segments of edge, node or pair rows");
  wrong = *p;
  GemmInstance& g = std::get<GemmInstance>(wrong.kernels[0]);
  g.graph_tiles = false;
  g.tensor_cores = false;
  g.dtype = inter::DType::FP32;
  g.k = 48;  // a SIMT GEMM over segments reads tile offsets of its own 16-row tiles: not the graph's 64
  CHECK_THAT(verify_program(wrong), Catch::Contains("kernel=simt reads tile offsets of 16-row tiles, but the graph's are for 64"));
  CHECK_FALSE(parse_program_text(replace(graph, "tiles=graph", "tiles=call"), &err));
  CHECK_THAT(err, Catch::Contains("error: tiles= takes 'graph' (the graph's tile offsets)"));
}

TEST_CASE("share-gemm-tiles: IR in, IR out, over a module's programs", "[intra][pass][tc]") {
  std::string err;
  auto parse = [&](const std::string& text) {
    auto p = parse_program_text(text, &err);
    INFO(err);
    REQUIRE(p);
    return *p;
  };
  const std::string graph = replace(replace(kProgram, "layouts etype_sorted_coo\n", "layouts etype_sorted_coo\ngraph_tile 64\n"),
                                    "store=plain kernel=tc\n", "store=plain kernel=tc tiles=graph\n");
  // Every GEMM over segments on the tensor cores: every program's graph gets 64-row offsets, the GEMMs read them.
  std::vector<Program> programs{parse(kProgram)}, compact{parse(kProgram)};
  passes::share_gemm_tiles({&programs, &compact});
  CHECK(print_program(programs[0]) == graph);
  CHECK(print_program(compact[0]) == graph);
  CHECK(verify_program(programs[0]) == "");
  // One SIMT GEMM over segments anywhere in the module (here a k=48 one in the other program): nothing changes,
  // since the one graph keeps the SIMT tile.
  const std::string simt = replace(replace(kProgram, "tensor x: input node[64]", "tensor x: input node[48]"),
                                   "heads=1 k=64 n=64 dtype=fp32 tile=16 coarsen=1 store=plain kernel=tc",
                                   "heads=1 k=48 n=64 dtype=fp32 tile=16 coarsen=1 store=plain kernel=simt(tc: k % 32)");
  programs = {parse(kProgram)};
  compact = {parse(simt)};
  passes::share_gemm_tiles({&programs, &compact});
  CHECK(print_program(programs[0]) == kProgram);
  CHECK(print_program(compact[0]) == simt);
  // No GEMM over segments: nothing to share.
  Program none = parse(kProgram);
  std::get<GemmInstance>(none.kernels[0]).segments = Segments::None;
  programs = {none};
  passes::share_gemm_tiles({&programs});
  CHECK(programs[0].graph_tile == 0);
  CHECK_FALSE(std::get<GemmInstance>(programs[0].kernels[0]).graph_tiles);
}

// The backward of tests/passes/lower_reorder_backward.ir as lowering leaves it before forward-row-copies: its edge
// traversal stores a copy of the input d_s (t$op0) for the weight gradient to read.
const char* kRowCopy = R"(# hectorgen intra-operator IR
model rrb
phase backward
hyper dim = 4
hyper out_dim = 8
input feature: node[dim]
input d_s: edge[] requires_grad=0
weight W: etype[dim, out_dim] init="glorot"
weight v: etype[out_dim] init="glorot"
output d_feature: node[dim]
output d_v: etype[out_dim]
output d_W: etype[dim, out_dim]
option materialization = "vanilla"
option reorder = "off"
option dtype = "fp32"
option gemm_tile = 16
option gemm_coarsen = 1
option traversal_threads = 256
layouts csr_by_src, etype_sorted_coo
tensor feature: input node[4]
tensor d_s: input edge[]
tensor W: weight etype[4, 8]
tensor v: weight etype[8]
tensor d_feature: output node[4]
tensor d_v: output etype[8] zero_init
tensor d_W: output etype[4, 8] zero_init
tensor t$v$W: temp etype[4]
tensor t$op0$per_etype: temp etype[4]
tensor t$op0: temp edge[]

gemm rrb_bw_gemm_v_W:  t$v$W[row] = v[row] · W[etype]^T
    rows=etypes heads=1 k=8 n=4 dtype=fp32 tile=16 coarsen=1 store=plain kernel=simt(tc: rows=etypes)
    from: e.src["d_feature"] += e.d_s * linear_t(v[e.etype], W[e.etype])

traversal rrb_bw_edges_loop: rows=etype_sorted_coo.edges(e) threads=256
    let v_d_s: [] replicated(1) = load d_s[e]
    # $op0 = e.d_s
    store t$op0[e] = v_d_s by lane0

wgrad rrb_bw_wgrad_op0_per_etype:  t$op0$per_etype[etype] = sum over rows feature[dst[row]]^T · t$op0[row]
    rows=edges heads=1 k=4 n=1 dtype=fp32 kernel=simt(tc: k % 64) deterministic
    from: t$op0$per_etype[t] = sum over the edges e of type t of e.d_s * e.dst.feature

gemm rrb_bw_gemm_d_v:  d_v[row] += t$op0$per_etype[row] · W[etype]
    rows=etypes heads=1 k=4 n=8 dtype=fp32 tile=16 coarsen=1 store=add kernel=simt(tc: rows=etypes)
    from: d_v[e.etype] += linear(e.d_s * e.dst.feature, W[e.etype])

gemm rrb_bw_gemm_d_W:  d_W[row] += t$op0$per_etype[row] · v[etype]
    rows=etypes heads=4 k=1 n=8 dtype=fp32 tile=16 coarsen=1 store=add kernel=simt(tc: rows=etypes)
    from: d_W[e.etype] += outer(e.d_s * e.dst.feature, v[e.etype])

traversal rrb_bw_sum_d_feature: rows=src_nodes(n) threads=256 row_lanes=8
    var v_d_feature: [4] replicated(4) = 0
    for e in csr_by_src.outgoing(n) at i_e split:
        index e_etype = out_etype[i_e]
        let scatter: [] replicated(1) = load d_s[e]
        let t_v_W: [4] replicated(4) = load t$v$W[e_etype]
        # n["d_feature"] += $scatter * $t$v$W
        v_d_feature += scatter * t_v_W
    store d_feature[n] = v_d_feature by lane0
)";

TEST_CASE("forward-row-copies: IR in, IR out; outputs, saved fields and rewritten originals keep their copies",
          "[intra][pass]") {
  std::string err;
  auto parsed = parse_program_text(kRowCopy, &err);
  INFO(err);
  REQUIRE(parsed);
  REQUIRE(verify_program(*parsed) == "");
  // The copy goes with the traversal that only made it; the weight gradient reads d_s itself.
  Program p = *parsed;
  passes::forward_row_copies(p);
  CHECK(verify_program(p) == "");
  CHECK_FALSE(p.find("t$op0"));
  CHECK(p.kernels.size() == parsed->kernels.size() - 1);
  CHECK(std::none_of(p.kernels.begin(), p.kernels.end(),
                     [](const Kernel& k) { return kernel_name(k) == "rrb_bw_edges_loop"; }));
  CHECK(std::get<WeightGradInstance>(p.kernels[1]).dy == "d_s");
  const std::string text = print_program(p);
  CHECK(text.find("t$op0[row]") == std::string::npos);
  // The rest is as it was.
  std::string expected = kRowCopy;
  expected = replace(expected, "tensor t$op0: temp edge[]\n", "");
  expected = replace(expected, "traversal rrb_bw_edges_loop: rows=etype_sorted_coo.edges(e) threads=256\n"
                               "    let v_d_s: [] replicated(1) = load d_s[e]\n"
                               "    # $op0 = e.d_s\n"
                               "    store t$op0[e] = v_d_s by lane0\n\n", "");
  expected = replace(expected, "feature[dst[row]]^T · t$op0[row]", "feature[dst[row]]^T · d_s[row]");
  CHECK(text == expected);
  // Nothing changes where the copy is a result of the op, a field saved for the backward (or its tensor), or where a
  // later kernel writes the original.
  for (int variant = 0; variant < 4; ++variant) {
    CAPTURE(variant);
    Program q = *parsed;
    if (variant == 0) {
      for (TensorInfo& t : q.tensors)
        if (t.name == "t$op0") t.role = Role::Output;
    } else if (variant == 1) {
      q.saved = {"t$op0"};
    } else if (variant == 2) {  // a saved field held in the copy's tensor
      q.aliases["op0"] = "t$op0";
      q.saved = {"op0"};
    } else {
      for (TensorInfo& t : q.tensors)
        if (t.name == "d_s") t.role = Role::Temp;
      std::get<GemmInstance>(q.kernels[3]).y = "d_s";  // rrb_bw_gemm_d_v, after the copy
    }
    const std::string unchanged = print_program(q);
    passes::forward_row_copies(q);
    CHECK(print_program(q) == unchanged);
  }
}

// A GEMM from an edge temporary to another of the same row size that only a weight gradient reads afterwards.
const char* kInPlace = R"(# hectorgen intra-operator IR
model m
phase backward
hyper d = 64
input x: node[d]
weight W: etype[d, d] init="glorot"
output d_W: etype[d, d]
option materialization = "vanilla"
option reorder = "off"
option dtype = "fp32"
option gemm_tile = 16
option gemm_coarsen = 1
option traversal_threads = 256
layouts etype_sorted_coo
tensor x: input node[64]
tensor W: weight etype[64, 64]
tensor d_W: output etype[64, 64] zero_init
tensor t_a: temp edge[64]
tensor t_b: temp edge[64]

gemm m_a:  t_a[row] = x[src[row]] · W[etype]
    rows=edges heads=1 k=64 n=64 dtype=fp32 tile=16 coarsen=1 store=plain kernel=tc
    from: e["a"] = e.src.x * W[e.etype]

gemm m_b:  t_b[row] = t_a[row] · W[etype]^T
    rows=edges heads=1 k=64 n=64 dtype=fp32 tile=16 coarsen=1 store=plain kernel=tc
    from: e["b"] = linear_t(e["a"], W[e.etype])

wgrad m_w:  d_W[etype] += sum over rows x[src[row]]^T · t_b[row]
    rows=edges heads=1 k=64 n=64 dtype=fp32 kernel=tc deterministic
    from: d_W[e.etype] += outer(e.src.x, e["b"])
)";

TEST_CASE("gemm-in-place: IR in, IR out; SIMT GEMMs, live inputs and returned tensors keep their output", "[intra][pass]") {
  std::string err;
  auto parsed = parse_program_text(kInPlace, &err);
  INFO(err);
  REQUIRE(parsed);
  REQUIRE(verify_program(*parsed) == "");
  Program p = *parsed;
  passes::gemm_in_place(p);
  CHECK(verify_program(p) == "");
  std::string expected = replace(kInPlace, "tensor t_b: temp edge[64]\n", "");
  expected = replace(expected, "gemm m_b:  t_b[row] = t_a[row]", "gemm m_b:  t_a[row] = t_a[row]");
  expected = replace(expected, "x[src[row]]^T · t_b[row]", "x[src[row]]^T · t_a[row]");
  CHECK(print_program(p) == expected);
  auto back = parse_program_text(expected, &err);
  INFO(err);
  REQUIRE(back);
  CHECK(print_program(*back) == expected);
  // A kernel that only reads the GEMM's input comes after it (RGAT's weight gradient reading d$ht): the GEMM moves
  // after that reader and stores over its input there.
  {
    Program q = *parsed;
    WeightGradInstance reader = std::get<WeightGradInstance>(q.kernels[2]);
    reader.name = "m_w_a";
    reader.dy = "t_a";
    q.kernels.insert(q.kernels.begin() + 2, reader);
    passes::gemm_in_place(q);
    CHECK(verify_program(q) == "");
    REQUIRE(q.kernels.size() == 4);
    CHECK(kernel_name(q.kernels[1]) == "m_w_a");
    CHECK(std::get<WeightGradInstance>(q.kernels[1]).dy == "t_a");
    CHECK(kernel_name(q.kernels[2]) == "m_b");
    CHECK(std::get<GemmInstance>(q.kernels[2]).y == "t_a");
    CHECK(std::get<WeightGradInstance>(q.kernels[3]).dy == "t_a");
    CHECK_FALSE(q.find("t_b"));
  }
  for (int variant = 0; variant < 4; ++variant) {
    CAPTURE(variant);
    Program q = *parsed;
    auto& b = std::get<GemmInstance>(q.kernels[1]);
    if (variant == 0) {
      b.tensor_cores = false;  // SIMT blocks split a row's columns
    } else if (variant == 1) {
      // t_a still read after the GEMM, by a kernel that also reads its output: it cannot move past that reader
      std::get<WeightGradInstance>(q.kernels[2]).x = "t_a";
      std::get<WeightGradInstance>(q.kernels[2]).x_gather = Gather::None;
    } else if (variant == 2) {
      q.saved = {"t_a"};  // returned by the op
    } else {
      b.gather = Gather::Src;  // another row of x
      b.x = "x";
    }
    const std::string unchanged = print_program(q);
    passes::gemm_in_place(q);
    CHECK(print_program(q) == unchanged);
  }
}

TEST_CASE("tensors carry their storage type through print, parse and verify", "[intra][roundtrip][verifier][dtype]") {
  const std::string bf16 = bf16_program();
  CHECK(bf16.find("tensor y: output node[64] bf16 zero_init\n") != std::string::npos);
  CHECK(bf16.find("tensor norm: input edge[]\n") != std::string::npos);
  std::string err;
  auto p = parse_program_text(bf16, &err);
  INFO(err);
  REQUIRE(p);
  CHECK(print_program(*p) == bf16);
  CHECK(verify_program(*p) == "");
  CHECK(p->find("x")->storage == inter::DType::BF16);
  CHECK(p->find("t_e")->storage == inter::DType::BF16);
  CHECK(p->find("norm")->storage == inter::DType::FP32);
  CHECK(p->find("t_b")->storage == inter::DType::FP32);
  // fp16 is the other 16-bit storage type.
  const std::string fp16 = replace(std::regex_replace(bf16, std::regex(" bf16"), " fp16"), "option dtype = \"bf16\"", "option dtype = \"fp16\"");
  auto q = parse_program_text(std::regex_replace(fp16, std::regex("dtype=bf16"), "dtype=fp16"), &err);
  REQUIRE(q);
  CHECK(q->find("W")->storage == inter::DType::FP16);
  CHECK(verify_program(*q) == "");
  // Each rule of the storage types.
  CHECK(verify_text(replace(replace(bf16, "tensor x: input node[64] bf16", "tensor x: input node[64] fp16"),
                            "store=plain kernel=tc", "store=plain kernel=simt(tc: x stored as fp16)")) ==
        "tensor 'x' is stored as fp16 in a bf16 model");
  CHECK(verify_text(replace(replace(kProgram, "tensor t_e: temp edge[64]", "tensor t_e: temp edge[64] bf16"),
                            "store=plain kernel=tc", "store=plain kernel=simt(tc: t_e stored as bf16)")) ==
        "tensor 't_e' is stored as bf16 in a fp32 model");
  CHECK(verify_text(replace(replace(bf16, "tensor W: weight etype[64, 64] bf16", "tensor W: weight etype[64, 64]"),
                            "store=plain kernel=tc", "store=plain kernel=simt(tc: W stored as fp32)")) ==
        "weight 'W' is stored as fp32, but the bf16 model's parameters and results are bf16");
  CHECK(verify_text(replace(bf16, "tensor d_W: output etype[64, 64] bf16", "tensor d_W: output etype[64, 64]")) ==
        "output 'd_W' is stored as fp32, but the bf16 model's parameters and results are bf16");
  CHECK(verify_text(replace(replace(bf16, "tensor norm: input edge[]", "tensor norm: input edge[] bf16"),
                            "store=plain kernel=tc", "store=plain kernel=simt(tc: norm stored as bf16)")) ==
        "m_gemm: row scalar 'norm' is stored as bf16 (row scalars multiply the fp32 accumulator: fp32)");
  CHECK(verify_text(replace(replace(bf16, "t_e[row] = x[src[row]] · W[etype] * norm[row]", "y[dst[row]] += x[src[row]] · W[etype] * norm[row]"),
                            "store=plain kernel=tc", "store=atomic kernel=simt(tc: y stored as bf16)")) ==
        "m_gemm: adds atomically into 'y', stored as bf16 (atomics need fp32 storage)");
  // An fp32 tensor needs no word (fp32 goldens are unchanged); `fp32` or `tf32` after the shape is no storage word.
  CHECK_FALSE(parse_program_text(replace(kProgram, "tensor t_e: temp edge[64]", "tensor t_e: temp edge[64] tf32"), &err));
  CHECK_THAT(err, Catch::Contains("error:"));
}

TEST_CASE("the program verifier rejects each broken rule", "[intra][verifier]") {
  const std::string p = kProgram;
  struct Case {
    std::string text;
    const char* message;
  } cases[] = {
      {replace(p, "tensor t_b: temp edge[4]\n", "tensor t_b: temp edge[4]\ntensor x: input node[64]\n"), "tensor 'x' is defined twice"},
      {replace(p, "alias tb -> t_b", "alias tb -> t_c"), "alias tb -> t_c: unknown tensor"},
      {replace(p, "wgrad m_wgrad:", "wgrad m_gemm:"), "kernel 'm_gemm' is defined twice"},
      {replace(p, "= x[src[row]] · W", "= q[src[row]] · W"), "m_gemm: unknown tensor 'q'"},
      {replace(p, "t_e[row] = x[src[row]]", "norm[row] = x[src[row]]"), "m_gemm: writes 'norm', an input"},
      {replace(p, "tile=16 coarsen=1 store", "tile=16 coarsen=3 store"), "m_gemm: coarsening 3 is not 1, 2 or 4, or does not divide tile 16"},
      {replace(p, "heads=1 k=64 n=64 dtype=fp32 tile=16 coarsen=1", "heads=1 k=32 n=64 dtype=fp32 tile=16 coarsen=1"),
       "m_gemm: input rows of x have 64 elements, expected 1 x 32"},
      {replace(p, "heads=1 k=64 n=64 dtype=fp32 tile=16 coarsen=1 store=plain kernel=tc",
               "heads=1 k=64 n=32 dtype=fp32 tile=16 coarsen=1 store=plain kernel=simt(tc: n % 64)"),
       "m_gemm: output rows of t_e have 64 elements, expected 1 x 32"},
      {replace(p, "tensor W: weight etype[64, 64]", "tensor W: weight etype[64, 32]"), "m_gemm: weight W slices have 2048 elements, expected 64 x 64"},
      {replace(p, "    rows=edges heads=1 k=64 n=64 dtype=fp32 tile=16 coarsen=1", "    rows=nodes heads=1 k=64 n=64 dtype=fp32 tile=16 coarsen=1"),
       "m_gemm: input 'x' is gathered through src/dst, which needs edge or pair rows"},
      {replace(p, "t_e[row] = x[src[row]]", "t_e[row] = x[row]"), "m_gemm: input 'x' has a row per node, read per edge without a gather"},
      {replace(p, "· W[etype] * norm[row]", "· W[ntype] * norm[row]"),
       "m_gemm: per-node-type segments need node rows"},
      {replace(p, "· W[etype] * norm[row]", "· W[-] * norm[row]"), "m_gemm: 'W' has a slice per type but the kernel has no segments"},
      {replace(p, "layouts etype_sorted_coo", "layouts csr_by_dst"), "m_gemm: gathers through src/dst need the layout 'etype_sorted_coo'"},
      {replace(p, "* norm[row]\n", "* t_e[row]\n"), "m_gemm: row scalar 't_e' is not one value per row"},
      {replace(p, "    rows=edges heads=1 k=64 n=64 dtype=fp32 kernel=tc deterministic",
               "    rows=edges heads=1 k=64 n=32 dtype=fp32 kernel=simt(tc: n % 64) deterministic"),
       "m_wgrad: rows of x and t_e have 64 and 64 elements, expected 1 x 64 and 1 x 32"},
      {replace(p, "d_W[etype] += sum over rows x[src[row]]^T · t_e[row]", "W[etype] += sum over rows x[src[row]]^T · t_e[row]"),
       "m_wgrad: writes 'W', an weight"},
      {replace(p, "numel=4", "numel=5"), "m_segsum: rows of t_b and slices of d_b have 4 and 4 elements, expected 5"},
      {replace(p, "target=t_b", "target=t_c"), "m_torch: unknown tensor 't_c'"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.message);
    CHECK(verify_text(c.text) == c.message);
  }
}

// Rows over the edge types: a product that depends on the edge type only (a weight row projected by a shared
// weight), and its weight gradient from the per-type sums of the edges' gradients.
const char* kEtypeRows = R"(# hectorgen intra-operator IR
model m
phase backward
weight V: etype[4] init="glorot"
weight W: none[4, 8] init="glorot"
output d_W: none[4, 8]
option materialization = "vanilla"
option reorder = "off"
option dtype = "fp32"
option gemm_tile = 16
option gemm_coarsen = 1
option traversal_threads = 256
layouts etype_sorted_coo
tensor V: weight etype[4]
tensor W: weight none[4, 8]
tensor d_W: output none[4, 8] zero_init
tensor t_v: temp etype[8]
tensor t_s: temp etype[8] zero_init
tensor t_n: temp node[4]

gemm m_gemm_v:  t_v[row] = V[row] · W[-]
    rows=etypes heads=1 k=4 n=8 dtype=fp32 tile=16 coarsen=1 store=plain kernel=simt(tc: rows=etypes)
    from: r = linear(V[e.etype], W)

wgrad m_wgrad:  d_W[-] += sum over rows V[row]^T · t_s[row]
    rows=etypes heads=1 k=4 n=8 dtype=fp32 kernel=simt(tc: k % 64) deterministic
    from: d_W += outer(V[e.etype], e["d_r"])
)";

TEST_CASE("GEMMs and weight gradients over the edge types print, parse back and verify; misuse is rejected",
          "[intra][roundtrip][verifier]") {
  std::string err;
  auto p = parse_program_text(kEtypeRows, &err);
  INFO(err);
  REQUIRE(p);
  CHECK(print_program(*p) == kEtypeRows);
  CHECK(verify_program(*p) == "");
  CHECK(std::get<GemmInstance>(p->kernels[0]).rows == Rows::Etypes);
  CHECK(std::get<WeightGradInstance>(p->kernels[1]).rows == Rows::Etypes);
  const std::string t = kEtypeRows;
  CHECK(verify_text(replace(t, "t_v[row] = V[row]", "t_v[row] = t_n[row]")) == "m_gemm_v: 't_n' has no row per edge type (rows=etypes)");
  CHECK(verify_text(replace(t, "t_v[row] = V[row]", "t_v[row] = V[src[row]]")) ==
        "m_gemm_v: rows=etypes has no gathers, scatters or row scalars");
  CHECK(verify_text(replace(t, "sum over rows V[row]^T", "sum over rows t_n[row]^T")) ==
        "m_wgrad: 't_n' has no row per edge type (rows=etypes)");
  std::string perr;
  CHECK_FALSE(parse_program_text(replace(t, "rows=etypes heads=1 k=4 n=8 dtype=fp32 tile=16 coarsen=1 store", "rows=types heads=1 k=4 n=8 dtype=fp32 tile=16 coarsen=1 store"), &perr));
  CHECK(perr.find("expected rows=nodes, edges, etypes or pairs, not 'types'") != std::string::npos);
}

// Rows over the edge types, each row its own segment (segments=etype): reorder-linear's weight-weight product
// P[t] = w[t] · W[t]^T, and its gradients from S[t], the per-type sum of the edges' gradient of P:
// d_w[t] += S[t] · W[t], and d_W[t] += outer(S[t], w[t]) as K heads of k = 1.
const char* kEtypeRowSegments = R"(# hectorgen intra-operator IR
model m
phase backward
weight W: etype[3, 5] init="glorot"
weight w: etype[1, 5] init="glorot"
output d_W: etype[3, 5]
output d_w: etype[1, 5]
option materialization = "vanilla"
option reorder = "on"
option dtype = "fp32"
option gemm_tile = 16
option gemm_coarsen = 1
option traversal_threads = 256
layouts etype_sorted_coo
tensor W: weight etype[3, 5]
tensor w: weight etype[1, 5]
tensor d_W: output etype[3, 5] zero_init
tensor d_w: output etype[1, 5] zero_init
tensor t_p: temp etype[3]
tensor t_s: temp etype[3]
tensor t_n: temp node[5]

gemm m_gemm_p:  t_p[row] = w[row] · W[etype]^T
    rows=etypes heads=1 k=5 n=3 dtype=fp32 tile=16 coarsen=1 store=plain kernel=simt(tc: rows=etypes)
    from: p = linear_t(reshape(w[e.etype], 5), W[e.etype])

gemm m_gemm_d_w:  d_w[row] += t_s[row] · W[etype]
    rows=etypes heads=1 k=3 n=5 dtype=fp32 tile=16 coarsen=1 store=add kernel=simt(tc: rows=etypes)
    from: d_w[e.etype] += reshape(linear(e["d_p"], W[e.etype]), 1, 5)

gemm m_gemm_d_W:  d_W[row] += t_s[row] · w[etype]
    rows=etypes heads=3 k=1 n=5 dtype=fp32 tile=16 coarsen=1 store=add kernel=simt(tc: rows=etypes)
    from: d_W[e.etype] += outer(e["d_p"], reshape(w[e.etype], 5))
)";

TEST_CASE("GEMMs over the edge types with a weight per row: print, parse back, verify, run; misuse is rejected",
          "[intra][roundtrip][verifier][reorder]") {
  std::string err;
  auto p = parse_program_text(kEtypeRowSegments, &err);
  INFO(err);
  REQUIRE(p);
  CHECK(print_program(*p) == kEtypeRowSegments);
  CHECK(verify_program(*p) == "");
  // Row t reads its own W[t] and w[t]: the float64 interpreter against the products written out.
  inter::HeteroGraph g;
  g.num_nodes = 2;
  g.num_etypes = 2;
  g.ntype = {0, 0};
  inter::TensorMap t;
  auto tensor = [](std::vector<int64_t> shape, std::vector<double> data) {
    inter::Tensor64 x;
    x.shape = std::move(shape);
    x.data = std::move(data);
    return x;
  };
  std::vector<double> W(30), w(10), s(6);
  for (size_t i = 0; i < W.size(); ++i) W[i] = 0.1 * static_cast<double>(i) - 1.0;
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.3 * static_cast<double>(i) + 0.5;
  for (size_t i = 0; i < s.size(); ++i) s[i] = 1.0 - 0.25 * static_cast<double>(i);
  t["W"] = tensor({2, 3, 5}, W);
  t["w"] = tensor({2, 1, 5}, w);
  t["t_s"] = tensor({2, 3}, s);
  REQUIRE(intra::interpret(*p, g, t) == "");
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 3; ++i) {
      double pv = 0;
      for (int j = 0; j < 5; ++j) pv += W[r * 15 + i * 5 + j] * w[r * 5 + j];
      CHECK(t.at("t_p").data[r * 3 + i] == Approx(pv));
      for (int j = 0; j < 5; ++j) CHECK(t.at("d_W").data[r * 15 + i * 5 + j] == Approx(s[r * 3 + i] * w[r * 5 + j]));
    }
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 5; ++j) {
      double dv = 0;
      for (int i = 0; i < 3; ++i) dv += s[r * 3 + i] * W[r * 15 + i * 5 + j];
      CHECK(t.at("d_w").data[r * 5 + j] == Approx(dv));
    }
  // A block per row (its own segment), no segment arrays.
  const LaunchConfig c = launch_config(*p, p->kernels[0]);
  CHECK(c.x.expr("a.num_etypes", "a.num_etypes") == "static_cast<unsigned>(a.num_etypes)");
  const std::string text = kEtypeRowSegments;
  CHECK(verify_text(replace(text, "tensor t_p: temp etype[3]", "tensor t_p: temp edge[3]")) ==
        "m_gemm_p: 't_p' has no row per edge type (rows=etypes)");
  CHECK(verify_text(replace(text, "t_p[row] = w[row] · W[etype]^T", "t_p[row] = t_n[row] · W[etype]^T")) ==
        "m_gemm_p: 't_n' has no row per edge type (rows=etypes)");
  CHECK(verify_text(replace(text, "t_p[row] = w[row] · W[etype]^T", "t_p[row] = w[src[row]] · W[etype]^T")) ==
        "m_gemm_p: rows=etypes has no gathers, scatters or row scalars");
}

TEST_CASE("the weight gradient's kernel: tensor cores where the dtype and the shape allow, else SIMT with the reason",
          "[intra][wgrad]") {
  WeightGradInstance w;
  w.k = 64;
  w.n = 128;
  struct Case {
    inter::DType dtype;
    int64_t heads, k, n;
    const char* obstacle;
    const char* text;  // of the chosen kernel
  } cases[] = {
      {inter::DType::FP32, 1, 64, 64, "", "tc"},  // fp32 as 3xTF32
      {inter::DType::TF32, 1, 64, 128, "", "tc"},
      {inter::DType::BF16, 1, 128, 64, "", "tc"},
      {inter::DType::FP16, 1, 192, 256, "", "tc"},
      {inter::DType::BF16, 2, 64, 64, "heads > 1", "simt(tc: heads > 1)"},
      {inter::DType::TF32, 1, 32, 64, "k % 64", "simt(tc: k % 64)"},
      {inter::DType::FP16, 1, 64, 96, "n % 64", "simt(tc: n % 64)"},
      {inter::DType::BF16, 4, 16, 8, "heads > 1", "simt(tc: heads > 1)"},  // the first obstacle
  };
  for (const Case& c : cases) {
    CAPTURE(c.text);
    w.dtype = c.dtype;
    w.heads = c.heads;
    w.k = c.k;
    w.n = c.n;
    CHECK(wgrad_tc_obstacle(w) == c.obstacle);
    w.kernel = choose_wgrad_kernel(w);
    CHECK((w.kernel == WgradKernel::TensorCore) == std::string(c.obstacle).empty());
    CHECK(wgrad_kernel_text(w) == c.text);
  }
  // A hand-written program may keep a tensor-core instance on CUDA cores: plain `simt`, nothing to explain.
  w.kernel = WgradKernel::Simt;
  CHECK(wgrad_kernel_text(w) == "simt(tc: heads > 1)");
  w.heads = 1;
  w.k = w.n = 64;
  CHECK(wgrad_kernel_text(w) == "simt");
}

TEST_CASE("the weight gradient's kernel and overwrite print, parse back and verify", "[intra][wgrad][roundtrip][verifier]") {
  // (its GEMM's rows are the edge types: SIMT, saying so)
  const std::string tc32 = replace(replace(replace(kEtypeRows, "option dtype = \"fp32\"", "option dtype = \"tf32\""),
                                           "dtype=fp32 tile=16 coarsen=1 store=plain kernel=simt(tc: rows=etypes)",
                                           "dtype=tf32 tile=16 coarsen=1 store=plain kernel=simt(tc: rows=etypes)"),
                                   "dtype=fp32 kernel=simt(tc: k % 64) deterministic",
                                   "dtype=tf32 kernel=simt(tc: k % 64) deterministic");
  std::string err;
  auto p = parse_program_text(tc32, &err);
  INFO(err);
  REQUIRE(p);
  CHECK(print_program(*p) == tc32);
  CHECK(verify_program(*p) == "");
  CHECK(std::get<WeightGradInstance>(p->kernels[1]).kernel == WgradKernel::Simt);
  // kernel=tc where the tensor cores cannot compute it: the verifier says why.
  CHECK(verify_text(replace(tc32, "kernel=simt(tc: k % 64)", "kernel=tc")) ==
        "m_wgrad: kernel=tc, but the tensor-core kernel cannot compute it (k % 64)");
  // The printed reason must be the instance's; an unknown kernel is a syntax error.
  CHECK_FALSE(parse_program_text(replace(tc32, "kernel=simt(tc: k % 64)", "kernel=simt(tc: n % 64)"), &err));
  CHECK_THAT(err, Catch::Contains("error: expected 'kernel=simt(tc: k % 64)' here [intra-syntax]"));
  CHECK_FALSE(parse_program_text(replace(tc32, "kernel=simt(tc: k % 64)", "kernel=simt"), &err));
  CHECK_THAT(err, Catch::Contains("error: expected 'kernel=simt(tc: k % 64)' here [intra-syntax]"));
  CHECK_FALSE(parse_program_text(replace(kProgram, "kernel=tc deterministic", "kernel=cutlass deterministic"), &err));
  CHECK_THAT(err, Catch::Contains("error: unknown weight-gradient kernel 'cutlass' (simt or tc) [intra-syntax]"));
  CHECK_FALSE(parse_program_text(replace(kProgram, "kernel=tc deterministic", "kernel=simt(tc: k % 64) deterministic"), &err));
  CHECK_THAT(err, Catch::Contains("error: expected 'kernel=simt' here [intra-syntax]"));
  // `=`: the instance overwrites dW (it is its first write), so it does not read it.
  const std::string overwrite = replace(kProgram, "d_W[etype] += sum over rows", "d_W[etype] = sum over rows");
  auto q = parse_program_text(overwrite, &err);
  INFO(err);
  REQUIRE(q);
  CHECK(print_program(*q) == overwrite);
  const WeightGradInstance& w = std::get<WeightGradInstance>(q->kernels[1]);
  CHECK_FALSE(w.accumulate);
  CHECK_FALSE(kernel_reads(q->kernels[1]).count("d_W"));
  CHECK(kernel_reads(p->kernels[1]).count("d_W"));
}

TEST_CASE("the program parser reports positioned errors, into the declarations too", "[intra][parser]") {
  const std::string p = kProgram;
  std::string err;
  CHECK_FALSE(parse_program_text(replace(p, "tensor y: output", "tensor y: outptu"), &err));
  CHECK_THAT(err, Catch::StartsWith("m.intra.ir:21:11: error: unknown role 'outptu' (input, weight, output, field, temp) [intra-syntax]"));
  CHECK_FALSE(parse_program_text(replace(p, "hyper d = 64", "hyper d = q"), &err));
  CHECK_THAT(err, Catch::StartsWith("m.intra.ir:4:11: error: "));
  CHECK_FALSE(parse_program_text(replace(p, "coarsen=1 store=plain", "coarsen=1 store=add"), &err));
  CHECK_THAT(err, Catch::Contains("29:69: error: the output is written 'plain' (by its formula), not 'add'"));
  CHECK_FALSE(parse_program_text(replace(p, "segsum m_segsum:", "segment m_segsum:"), &err));
  CHECK_THAT(err, Catch::Contains("error: expected a kernel (gemm, traversal, wgrad, segsum, gathersum or torch)"));
  CHECK_FALSE(parse_program_text(replace(p, "        e[\"tb\"] = b[e.etype] * e.norm", "        e[\"tb\"] = (b[e.etype] * e.norm"), &err));
  CHECK_THAT(err, Catch::StartsWith("m.intra.ir:39:39: error: expected ')' to close '('"));
  // The phases of an .intra.ir file must be headed by their own name.
  SourceFile f("two.intra.ir", "# ==== forward ====\n" + p);
  Diagnostics d;
  CHECK_FALSE(parse_programs(f, d));
  std::ostringstream s;
  d.render(s);
  CHECK(s.str().find("the section of phase 'backward' is headed '# ==== forward ===='") != std::string::npos);
}

TEST_CASE("drop-dead-stores: IR in, IR out", "[intra][pass]") {
  const std::string head = R"(# hectorgen intra-operator IR
model m
phase forward
input x: edge[]
output y: edge[]
option materialization = "vanilla"
option reorder = "off"
option dtype = "fp32"
option gemm_tile = 16
option gemm_coarsen = 1
option traversal_threads = 256
layouts etype_sorted_coo
tensor x: input edge[]
tensor y: output edge[]
tensor t: temp edge[]
tensor u: field edge[]
)";
  const std::string before = head + R"(
traversal m_a: rows=etype_sorted_coo.edges(e) threads=256
    let v_x: [] replicated(1) = load x[e]
    # t = exp(x)
    let v_t: [] replicated(1) = exp(v_x)
    # u = 2 * x
    let v_u: [] replicated(1) = v_x * 2
    store t[e] = v_t by lane0
    store u[e] = v_u by lane0

traversal m_b: rows=etype_sorted_coo.edges(e) threads=256
    let v_u: [] replicated(1) = load u[e]
    store y[e] = v_u by lane0
)";
  // Nothing reads t: its store goes, and then exp(x). u is read by m_b, y is an output.
  const std::string after = head + R"(
traversal m_a: rows=etype_sorted_coo.edges(e) threads=256
    let v_x: [] replicated(1) = load x[e]
    # t = exp(x)
    # u = 2 * x
    let v_u: [] replicated(1) = v_x * 2
    store u[e] = v_u by lane0

traversal m_b: rows=etype_sorted_coo.edges(e) threads=256
    let v_u: [] replicated(1) = load u[e]
    store y[e] = v_u by lane0
)";
  auto p = parse_program_text(before);
  REQUIRE(p);
  CHECK(print_program(*p) == before);
  passes::drop_dead_stores(*p);
  CHECK(print_program(*p) == after);
  CHECK(verify_program(*p) == "");
  // Saved for the backward, u stays even without a reader.
  auto q = parse_program_text(replace(before, "    let v_u: [] replicated(1) = load u[e]\n    store y[e] = v_u by lane0\n",
                                             "    let v_x: [] replicated(1) = load x[e]\n    store y[e] = v_x by lane0\n"));
  REQUIRE(q);
  CHECK(verify_program(*q) == "");
  q->saved = {"u"};
  passes::drop_dead_stores(*q);
  CHECK(print_program(*q).find("store u[e] = v_u by lane0") != std::string::npos);
  q->saved = {};
  passes::drop_dead_stores(*q);
  CHECK(print_program(*q).find("store u[e]") == std::string::npos);
}

TEST_CASE("a traversal that repeats an earlier one up to its own names is dropped; its readers read the earlier result",
          "[intra][merge]") {
  Program p = rgat_like();
  for (const char* name : {"t_a", "t_b", "t_c", "t_d"}) {
    TensorInfo t;
    t.name = name;
    t.role = Role::Temp;
    t.per = inter::Per::Edge;
    t.shape = {1};
    p.tensors.push_back(t);
  }
  auto kernel = [](const std::string& name, const std::string& fn, const std::string& x, const std::string& out) {
    return Kernel{parse(fmt::format("traversal {}: rows=etype_sorted_coo.edges(e) threads=256\n"
                                    "    # a comment that differs: {}\n"
                                    "    let {}: [1] replicated(1) = load att[e]\n"
                                    "    let y_{}: [1] replicated(1) = {}({})\n"
                                    "    store {}[e] = y_{} by lane0\n",
                                    name, name, x, x, fn, x, out, x))};
  };
  auto reader = [](const std::string& name, const std::string& in) {
    return Kernel{parse(fmt::format("traversal {}: rows=etype_sorted_coo.edges(e) threads=256\n"
                                    "    let v: [1] replicated(1) = load {}[e]\n"
                                    "    store h_e[e] = v by lane0\n",
                                    name, in))};
  };
  TensorInfo h;
  h.name = "h_e";
  h.role = Role::Field;
  h.per = inter::Per::Edge;
  h.shape = {1};
  p.tensors.push_back(h);
  p.kernels = {kernel("k1", "exp", "x", "t_a"), kernel("k2", "exp", "z", "t_b"), kernel("k3", "tanh", "w", "t_c"), reader("r", "t_b")};
  passes::merge_duplicate_traversals(p);
  std::vector<std::string> names;
  for (const Kernel& k : p.kernels) names.push_back(kernel_name(k));
  // k2 is k1 with other names: dropped, r reads t_a; k3 applies another function: kept.
  CHECK(names == std::vector<std::string>{"k1", "k3", "r"});
  CHECK(kernel_reads(p.kernels[2]).count("t_a") == 1);
  CHECK(p.find("t_b") == nullptr);
  CHECK(p.find("t_c") != nullptr);
  // Once att is rewritten in between, a repeat reads other values: kept.
  Program q = rgat_like();
  q.tensors = p.tensors;
  q.kernels = {kernel("k1", "exp", "x", "t_a"), kernel("w", "tanh", "x", "att"), kernel("k2", "exp", "z", "t_b")};
  passes::merge_duplicate_traversals(q);
  CHECK(q.kernels.size() == 3);
}

TEST_CASE("split loops print each lane's share of a sum under its own name, combined over the warp after the loop",
          "[intra][split][emit]") {
  const std::string text = R"(traversal k: rows=dst_nodes(n) threads=256
    var acc: [1] replicated(1) = 0
    var top: [1] replicated(1) = -1e+30
    for e in csr_by_dst.incoming(n) at i_e split:
        let a: [1] replicated(1) = load att[e]
        acc += a
        top = max(top, a)
    for e in csr_by_dst.incoming(n) at i_e split:
        let b: [1] replicated(1) = load att[e]
        acc += b * b
    store att_sum[n] = acc by lane0
    store att_max[n] = top by lane0
)";
  const Program p = rgat_like();
  const TraversalInstance t = parse(text);
  REQUIRE(verify_traversal(p, t).empty());
  const std::string cu = emit::emit_traversal(p, t).kernel;
  INFO(cu);
  CHECK(cu.find("for (int32_t i_e = in_ptr[n] + lane; i_e < in_ptr[n + 1]; i_e += 32) {") != std::string::npos);
  // Two loops summing acc: two shares; the maximum runs in top itself.
  CHECK(cu.find("float acc_share = 0.0f;") != std::string::npos);
  CHECK(cu.find("float acc_share_ = 0.0f;") != std::string::npos);
  CHECK(cu.find("acc += warp_sum(acc_share);") != std::string::npos);
  CHECK(cu.find("acc += warp_sum(acc_share_);") != std::string::npos);
  CHECK(cu.find("top = fmaxf(top, a);") != std::string::npos);
  CHECK(cu.find("top = warp_max(top);") != std::string::npos);
  // Every lane loads its own edge's att (no lane-0 shuffle) in a split loop.
  CHECK(cu.find("__shfl_sync") == std::string::npos);
}
