#include <catch2/catch.hpp>

#include "dsl/parser.h"
#include "helpers.h"
#include "ir/inter/printer.h"
#include "ir/inter/verifier.h"
#include "passes/passes.h"
#include "spec/loader.h"

using namespace hectorgen;
using namespace hectorgen::test;

TEST_CASE("bundled specs compile without diagnostics", "[frontend]") {
  for (const char* spec : {"rgcn.yaml", "rgat.yaml", "hgt.yaml", "rgcn.json"}) {
    CAPTURE(spec);
    auto c = compile_spec(spec);
    INFO(c->rendered());
    REQUIRE(c->module);
    CHECK(c->diags.all().empty());
  }
}

TEST_CASE("printed IR parses back to the same IR, byte for byte", "[frontend][roundtrip]") {
  for (const char* spec : {"rgcn.yaml", "rgat.yaml", "hgt.yaml"}) {
    CAPTURE(spec);
    // Before inlining (functions kept) and after the front end (inlined, verified).
    SourceFile file(spec_path(spec), read_file(spec_path(spec)));
    Diagnostics diags;
    auto parsed = spec::load_module(file, diags);
    REQUIRE(parsed);
    auto inlined = compile_spec(spec);
    REQUIRE(inlined->module);
    for (const inter::Module* m : {&*parsed, &*inlined->module}) {
      std::string first = inter::print_module(*m);
      SourceFile printed("<printed>", first);
      dsl::ProgramText text{first, &printed, {}, {}};
      Diagnostics d2;
      auto reparsed = dsl::parse_module(text, d2);
      std::ostringstream err;
      d2.render(err);
      INFO(err.str());
      REQUIRE(reparsed);
      CHECK(inter::print_module(*reparsed) == first);
      REQUIRE(reparsed->body.size() == m->body.size());
      for (size_t i = 0; i < m->body.size(); ++i) CHECK(inter::equal(reparsed->body[i], m->body[i]));
    }
  }
}

TEST_CASE("the JSON and YAML front ends build the same IR", "[frontend]") {
  auto yaml = compile_spec("rgcn.yaml");
  auto json = compile_spec("rgcn.json");
  REQUIRE(yaml->module);
  REQUIRE(json->module);
  CHECK(inter::print_module(*yaml->module) == inter::print_module(*json->module));
}

TEST_CASE("the verifier infers domains and shapes", "[verifier]") {
  auto c = compile_spec("rgat.yaml");
  REQUIRE(c->module);
  Diagnostics d;
  REQUIRE(inter::verify(*c->module, d));
  const auto& first_loop = c->module->body[0];
  // hs depends only on the source node and the edge type: compact-materialisable.
  CHECK(first_loop->body[0]->target->type.str() == "src_etype[1, 64]");
  CHECK(first_loop->body[1]->target->type.str() == "edge[1, 64]");
  CHECK(first_loop->body[3]->target->type.str() == "edge[1]");
  CHECK(c->module->node_fields.at("h").shape == std::vector<int64_t>{1, 64});
  CHECK(c->module->edge_fields.at("att").shape == std::vector<int64_t>{1});
}

// Each case: a text edit to a bundled spec, and the diagnostic it must produce (kind and position).
struct Rejection {
  const char* spec;
  const char* from;
  const char* to;
  const char* kind;
  int line;
  int col;
};

TEST_CASE("the verifier rejects ill-formed programs at the right position", "[verifier][diagnostics]") {
  const Rejection cases[] = {
      // undefined names
      {"rgcn.yaml", "e.src.feature * W[e.etype]", "e.src.feature * Wx[e.etype]", "undefined-name", 25, 47},
      {"rgat.yaml", "e[\"msg\"] = hs", "e[\"msg\"] = hz", "undefined-name", 43, 18},
      // shape mismatches
      {"rgat.yaml", "dot(hs, w_s[e.etype])", "dot(e.src.feature, w_s[e.etype])", "shape-mismatch", 44, 28},
      {"rgcn.yaml", "n[\"h\"] = n.feature * W0", "n[\"h\"] = concat(n.feature, n.feature) * W0", "shape-mismatch", 23, 45},
      // an edge value in a node loop without aggregation
      {"rgcn.yaml", "n[\"h\"] += e.norm", "n[\"h\"] = e.norm", "needs-aggregation", 25, 11},
      {"hgt.yaml", "n[\"h\"] = reshape(n[\"agg\"]", "n[\"h\"] = e[\"msg\"] + reshape(n[\"agg\"]", "undefined-name", 53, 16},
      // wrong weight indexing
      {"rgcn.yaml", "W[e.etype]", "W[e.src.ntype]", "weight-indexing", 25, 55},
      {"rgcn.yaml", "n.feature * W0", "n.feature * W0[n.ntype]", "weight-indexing", 23, 30},
      {"rgcn.yaml", "* W[e.etype]", "* W", "weight-indexing", 25, 47},
      // unknown functions
      {"rgat.yaml", "exp(e[att] -", "expo(e[att] -", "unknown-function", 32, 20},
      // misc
      {"rgcn.yaml", "n.incoming_edges()", "n.incoming()", "unknown-iterator", 24, 18},
      {"rgat.yaml", "edge_softmax(g, \"att\")", "edge_softmax(g)", "wrong-arguments", 45, 3},
  };
  for (const Rejection& r : cases) {
    CAPTURE(r.spec, r.to);
    auto c = compile_text(spec_path(r.spec), replace(read_file(spec_path(r.spec)), r.from, r.to));
    INFO(c->rendered());
    REQUIRE_FALSE(c->module);
    REQUIRE(c->diags.has_errors());
    const Diagnostic& d = c->diags.all().front();
    CHECK(d.kind == r.kind);
    CHECK(d.loc.line == r.line);
    CHECK(d.loc.col == r.col);
  }
}

TEST_CASE("edge values in node loops need aggregation", "[verifier]") {
  std::string text = read_file(spec_path("hgt.yaml"));
  // Use an edge local outside the inner edge loop.
  text = replace(text, "      n[\"h\"] = reshape(n[\"agg\"], heads * d_k) * W_a[n.ntype]",
                 "      n[\"h\"] = reshape(n[\"agg\"], heads * d_k) * W_a[n.ntype]\n"
                 "  for n in g.dst_nodes():\n"
                 "      for e in n.incoming_edges():\n"
                 "          m = e[\"msg\"]\n"
                 "      n[\"z\"] = m");
  auto c = compile_text("hgt_bad.yaml", text);
  REQUIRE_FALSE(c->module);
  CHECK(c->diags.all().front().kind == "undefined-name");  // m is scoped to the edge loop

  std::string text2 = replace(read_file(spec_path("rgat.yaml")), "          n[\"h\"] += e[\"att\"] * e[\"msg\"]",
                              "          n[\"h\"] += e[\"att\"] * e[\"msg\"]\n      n[\"bad\"] = n.feature * W[n.ntype]");
  auto c2 = compile_text("rgat_bad.yaml", text2);
  REQUIRE_FALSE(c2->module);
  CHECK(c2->diags.all().front().kind == "weight-indexing");
}

TEST_CASE("options.reorder is off, on or auto (true/false and yes/no as on/off)", "[spec][reorder]") {
  for (auto [from, want] : {std::pair{"off", inter::Reorder::Off}, {"on", inter::Reorder::On}, {"auto", inter::Reorder::Auto},
                            {"true", inter::Reorder::On}, {"no", inter::Reorder::Off}}) {
    CAPTURE(from);
    auto c = compile_text("specs/rgat.yaml", replace(read_file(spec_path("rgat.yaml")), "  reorder: off",
                                                     std::string("  reorder: ") + from));
    INFO(c->rendered());
    REQUIRE(c->module);
    CHECK(c->module->decl.options.reorder == want);
  }
}

TEST_CASE("schema errors point at the key or value", "[spec][diagnostics]") {
  struct Case {
    const char* from;
    const char* to;
    const char* kind;
    int line;
    int col;
  };
  const Case cases[] = {
      {"  materialization: vanilla", "  materialisation: vanilla", "unknown-key", 18, 3},
      {"  dtype: fp32", "  dtype: fp64", "bad-value", 20, 10},
      {"  reorder: off", "  reorder: sometimes", "bad-value", 19, 12},
      {"  W: {per: etype, shape: [in_dim, out_dim]}", "  W: {per: etype}", "missing-field", 14, 3},
      {"  in_dim: 64", "  in_dim: [64]", "wrong-type", 6, 11},
      {"  out_dim: 64", "  out_dim: in_dim / 0", "division-by-zero", 7, 19},
      {"shape: [in_dim, out_dim]}\noutputs", "shape: [in_dim, -3]}\noutputs", "bad-shape", 14, 35},
      {"model: rgcn", "model: 3rgcn", "bad-name", 4, 8},
      {"program: |", "programme: |", "unknown-key", 21, 1},
      // An empty value is marked where the next token starts: the error points at its key instead.
      {"model: rgcn", "model:", "wrong-type", 4, 1},
      {"  dtype: fp32", "  dtype:", "wrong-type", 20, 3},
      {"  W0: {per: none, shape: [in_dim, out_dim]}", "  W0:", "wrong-type", 13, 3},
      // A plain scalar continued on the next line: positions follow the folded lines.
      {"  in_dim: 64", "  in_dim: 64\n    + foo", "undefined-name", 7, 7},
      {"  in_dim: 64", "  in_dim: 64 +\n    foo", "undefined-name", 7, 5},
      // Escapes in a quoted scalar: positions after them stay exact.
      {"  in_dim: 64", "  in_dim: \"\\x36\\u0034 + foo\"", "undefined-name", 6, 25},
  };
  for (const Case& k : cases) {
    CAPTURE(k.to);
    auto c = compile_text("specs/rgcn.yaml", replace(read_file(spec_path("rgcn.yaml")), k.from, k.to));
    INFO(c->rendered());
    REQUIRE_FALSE(c->module);
    const Diagnostic& d = c->diags.all().front();
    CHECK(d.kind == k.kind);
    CHECK(d.loc.line == k.line);
    CHECK(d.loc.col == k.col);
  }
}

TEST_CASE("DSL positions map to the real line and column in the spec file", "[spec][diagnostics]") {
  auto c = compile_text("specs/rgat.yaml", replace(read_file(spec_path("rgat.yaml")), "ht = reshape(", "ht = reshape(@"));
  REQUIRE_FALSE(c->module);
  const Diagnostic& d = c->diags.all().front();
  CHECK(d.kind == "bad-character");
  CHECK(d.loc.line == 42);
  CHECK(d.loc.col == 20);
  CHECK(c->rendered().find("specs/rgat.yaml:42:20: error: unexpected character '@' [bad-character]\n"
                           "   42 |       ht = reshape(@e.dst.feature") != std::string::npos);
}

TEST_CASE("a NUL byte in a YAML spec is reported where it is", "[spec][diagnostics]") {
  std::string text = replace(read_file(spec_path("rgcn.yaml")), "model: rgcn", std::string("model: rg\0cn", 12));
  auto c = compile_text("specs/rgcn.yaml", text);
  REQUIRE_FALSE(c->module);
  const Diagnostic& d = c->diags.all().front();
  CHECK(d.kind == "yaml-syntax");
  CHECK(d.loc.line == 4);
  CHECK(d.loc.col == 10);
  CHECK(c->rendered().find("    4 | model: rg?cn\n") != std::string::npos);
}

TEST_CASE("JSON errors point at the first character of the offending token", "[spec][diagnostics]") {
  struct Case {
    const char* text;
    int col;
    const char* message;
  };
  const Case cases[] = {
      {R"({"a" "b\"c"})", 6, "syntax error while parsing object separator - unexpected string literal; expected ':'"},
      {R"({"a": [12 345]})", 11, "syntax error while parsing array - unexpected number literal; expected ']'"},
      {R"({"model": tru, "x": 1})", 11, "syntax error while parsing value - invalid literal"},
      {R"({"a": -1.5e400 })", 7, "number -1.5e400 is out of range (JSON numbers must fit in a double)"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.text);
    auto c = compile_text("x.json", k.text);
    REQUIRE_FALSE(c->module);
    const Diagnostic& d = c->diags.all().front();
    CHECK(d.kind == "json-syntax");
    CHECK(d.loc.line == 1);
    CHECK(d.loc.col == k.col);
    CHECK(d.message == k.message);
  }
}

TEST_CASE("diagnostics escape control characters in messages and quote source lines printably", "[diagnostics]") {
  SourceFile f("x.yaml", "name: a\rb\x1b[1m\t\xc3\xa9\xff!\n");
  Diagnostic d{Severity::Error, {&f, 1, 17}, "bad 'a\rb\x1b[1m\n\t\xc3\xa9\xff\xc2\x9b\x7f'", "bad-name"};
  CHECK(Diagnostics::format(d) ==
        "x.yaml:1:17: error: bad 'a\\rb\\x1b[1m\\n\\t\xc3\xa9\\xff\\xc2\\x9b\\x7f' [bad-name]\n"
        "    1 | name: a?b?[1m\t\xc3\xa9?!\n"
        "      |              \t ^\n");  // under the \xff: the tab is kept, the two bytes of e acute take one column
}

TEST_CASE("'did you mean' breaks ties by case, shared prefix, then the innermost scope", "[diagnostics]") {
  std::string text = read_file(spec_path("rgcn.yaml"));
  const std::string at = "n[\"h\"] = n.feature * W0";
  auto message = [&](const std::string& to) {
    auto c = compile_text("specs/rgcn.yaml", replace(text, at, to));
    REQUIRE_FALSE(c->module);
    return c->diags.all().front().message;
  };
  // 'w' is one edit from W (case only) and from W0's neighbours; the case-only difference wins.
  CHECK(message("n[\"h\"] = n.feature * w0") == "undefined name 'w0'; did you mean 'W0'?");
  // One edit from the local Wa and the weight W0: W0 shares the longer prefix.
  CHECK(message(at + "\n      Wa = n.feature * W0\n      n[\"h\"] = n.feature * W0a") ==
        "undefined name 'W0a'; did you mean 'W0'?");
  // A full tie between the local Wx and the weight W0: the innermost scope (the local) wins.
  CHECK(message(at + "\n      Wx = n.feature * W0\n      n[\"h\"] = n.feature * W1") ==
        "undefined name 'W1'; did you mean 'Wx'?");
}
