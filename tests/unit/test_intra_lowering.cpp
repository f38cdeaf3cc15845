// The intra-operator IR of the bundled and test specs: it round-trips through its text form (and the
// emitters print the same files from the parsed text), verifies, and carries the lowering decisions:
// what stays in registers, where loads go, which reductions run over the warp, where the syncs are.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <iostream>
#include <iterator>
#include <random>
#include <regex>
#include <set>

#include "emit/emit.h"
#include "helpers.h"
#include "ir/inter/verifier.h"
#include "ir/inter/names.h"
#include "ir/intra/interpreter.h"
#include "ir/intra/parser.h"
#include "passes/passes.h"

using namespace hectorgen;
using namespace hectorgen::test;
using namespace hectorgen::intra;

namespace {

// y[row] (+)= x[row] · w[etype] over the edges, 4 wide: the GEMM of the hand-built programs of the intra pass tests.
Kernel edge_gemm(const char* name, const char* x, const char* y, bool accumulate = false) {
  GemmInstance g;
  g.name = name;
  g.x = x;
  g.w = "w";
  g.y = y;
  g.rows = Rows::Edges;
  g.segments = Segments::Etype;
  g.accumulate = accumulate;
  g.k = g.n = 4;
  return Kernel{g};
}

std::vector<std::string> all_specs() {
  std::vector<std::string> out;
  for (const char* dir : {"/specs", "/tests/gpu/specs", "/tests/specs"})
    for (const auto& f : std::filesystem::directory_iterator(std::string(HECTORGEN_SOURCE_DIR) + dir))
      if (f.path().extension() == ".yaml" || f.path().extension() == ".json") out.push_back(f.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The module autodiff and lowering start from, as the pipeline makes it: reorder-linear with the spec's option,
// then hoist-node-transforms.
inter::Module pipeline_forward(const inter::Module& m) {
  return passes::hoist_node_transforms(passes::reorder_linear(m, m.decl.options.reorder));
}

// A spec's phases through the driver's whole pipeline (compaction, reordering and every intra pass), as
// `--emit=intra-ir` prints them and the parser reads them back; `recompute` and `materialization` as --recompute and
// --materialization (empty: the spec's).
std::vector<Program> pipeline_programs(const std::string& spec, const std::string& recompute = "",
                                       const std::string& materialization = "") {
  driver::Options o;
  o.spec_path = spec;
  o.emit = "intra-ir";
  o.recompute = recompute;
  o.materialization = materialization;
  std::ostringstream out, err;
  const int code = driver::run(o, out, err);
  INFO(err.str());
  REQUIRE(code == 0);
  SourceFile file(spec + ".intra.ir", out.str());
  Diagnostics diags;
  auto phases = parse_programs(file, diags);
  REQUIRE(phases);
  return *phases;
}

std::vector<Program> lower_source(const std::string& path, const std::string& text) {
  auto c = compile_text(path, text);
  INFO(c->rendered());
  REQUIRE(c->module);
  std::vector<Program> out;
  Diagnostics d;
  auto lower = [&](const inter::Module& m, const std::string& phase, const std::vector<std::string>& saved) {
    REQUIRE(inter::verify(m, d));
    inter::Module fused = passes::fuse_loops(m);
    REQUIRE(inter::verify(fused, d));
    Diagnostics ld;
    auto p = passes::lower(fused, ld, phase, saved);
    std::ostringstream err;
    ld.render(err);
    INFO(err.str());
    if (!p && phase == "backward") return false;  // as the driver does: no training code, with a warning
    REQUIRE(p);
    out.push_back(*p);
    return true;
  };
  // As the pipeline does: reorder-linear (the spec's options.reorder), then hoist-node-transforms, before autodiff.
  const inter::Module forward = pipeline_forward(*c->module);
  lower(forward, "forward", {});
  if (auto tm = passes::autodiff(forward, d)) {
    lower(tm->forward, "forward_train", tm->saved);
    out.back().saved = tm->saved;
    if (!lower(tm->backward, "backward", {})) out.pop_back();
  }
  // As the driver does: the phases agree on the storage of what they exchange, and share one preprocessing; then the
  // backward recomputes the saved GEMM results it can.
  passes::unify_storage(out);
  std::set<std::string> layouts;
  for (const auto& p : out) layouts.insert(p.layouts.begin(), p.layouts.end());
  for (auto& p : out) p.layouts = layouts;
  if (out.size() == 3) passes::recompute_gemms(out[1], out[2]);
  return out;
}

std::vector<Program> lower_path(const std::string& path) { return lower_source(path, read_file(path)); }

const TraversalInstance& traversal(const std::vector<Program>& phases, const std::string& name) {
  for (const Program& p : phases)
    for (const Kernel& k : p.kernels)
      if (auto* t = std::get_if<TraversalInstance>(&k); t && t->name == name) return *t;
  throw std::runtime_error("test: no traversal instance " + name);
}

const EdgeLoop& loop_at(const TraversalInstance& t, size_t n) {
  for (const Instr& in : t.body)
    if (auto* l = std::get_if<EdgeLoop>(&in.v))
      if (n-- == 0) return *l;
  throw std::runtime_error("test: no such loop");
}

// The top-level instructions of a body, as their first words ("var v_h", "for e", "sync", "store att", ...).
std::vector<std::string> outline(const std::vector<Instr>& body) {
  std::vector<std::string> out;
  for (const Instr& in : body)
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, Def>) out.push_back(std::string(x.is_mutable ? "var " : "let ") + x.name);
          else if constexpr (std::is_same_v<T, Update>) out.push_back("update " + x.name);
          else if constexpr (std::is_same_v<T, Store>) out.push_back("store " + x.tensor);
          else if constexpr (std::is_same_v<T, Sync>) out.push_back("sync");
          else if constexpr (std::is_same_v<T, EdgeLoop>) out.push_back("for " + x.var);
          else if constexpr (std::is_same_v<T, IndexDef>) out.push_back("index " + x.name);
        },
        in.v);
  return out;
}

// The first definition of register `name` in `body` or its loops.
const Def* find_def(const std::vector<Instr>& body, const std::string& name) {
  for (const Instr& in : body) {
    if (auto* d = std::get_if<Def>(&in.v); d && d->name == name) return d;
    if (auto* l = std::get_if<EdgeLoop>(&in.v))
      if (const Def* d = find_def(l->body, name)) return d;
  }
  return nullptr;
}
const Def& def_named(const std::vector<Instr>& body, const std::string& name) {
  if (const Def* d = find_def(body, name)) return *d;
  throw std::runtime_error("test: no register " + name);
}

int count_instrs(const std::vector<Instr>& body, const std::function<bool(const Instr&)>& pred) {
  int n = 0;
  for (const Instr& in : body) {
    n += pred(in);
    if (auto* l = std::get_if<EdgeLoop>(&in.v)) n += count_instrs(l->body, pred);
  }
  return n;
}

bool is_reduce(const Instr& in) {
  auto* d = std::get_if<Def>(&in.v);
  return d && std::holds_alternative<Reduce>(d->source);
}
bool is_sync(const Instr& in) { return std::holds_alternative<Sync>(in.v); }

}  // namespace

TEST_CASE("every spec's intra IR prints, parses back to the same text and the same generated files", "[intra][roundtrip]") {
  for (const std::string& path : all_specs()) {
    CAPTURE(path);
    std::vector<Program> phases = lower_path(path);
    for (const Program& p : phases) CHECK(verify_program(p) == "");
    std::string text = print_programs(phases);
    SourceFile file("spec.intra.ir", text);
    Diagnostics d;
    auto parsed = parse_programs(file, d);
    std::ostringstream err;
    d.render(err);
    INFO(err.str());
    REQUIRE(parsed);
    CHECK(print_programs(*parsed) == text);
    for (const Program& p : *parsed) CHECK(verify_program(p) == "");
    // The text holds everything the emitters read: they print the same files from it.
    OutputSet from_ir, direct;
    emit::emit_all(*parsed, {"spec.yaml", "test"}, from_ir);
    emit::emit_all(phases, {"spec.yaml", "test"}, direct);
    CHECK(from_ir.files() == direct.files());
  }
}

TEST_CASE("the spec's dtype reaches every GEMM and weight-gradient instance, and round-trips", "[intra][lowering][dtype]") {
  const std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/specs/rgcn.yaml";
  const std::string fp32 = read_file(path);
  REQUIRE(fp32.find("dtype: fp32") != std::string::npos);
  for (const char* name : {"fp32", "tf32", "bf16", "fp16"}) {
    CAPTURE(name);
    const inter::DType want = *inter::parse_dtype(name);
    std::vector<Program> phases = lower_source(path, replace(fp32, "dtype: fp32", std::string("dtype: ") + name));
    int gemms = 0, wgrads = 0;
    for (const Program& p : phases) {
      CHECK(verify_program(p) == "");
      for (const Kernel& k : p.kernels) {
        if (auto* g = std::get_if<GemmInstance>(&k)) {
          CHECK(g->dtype == want);
          ++gemms;
        }
        if (auto* w = std::get_if<WeightGradInstance>(&k)) {
          CHECK(w->dtype == want);
          // 64 x 64 weights, one head: tensor cores for every dtype (fp32 as 3xTF32).
          CHECK(w->kernel == intra::WgradKernel::TensorCore);
          CHECK(w->kernel == intra::choose_wgrad_kernel(*w));
          ++wgrads;
        }
      }
    }
    CHECK(gemms > 0);
    CHECK(wgrads > 0);
    const std::string text = print_programs(phases);
    CHECK(text.find(std::string(" dtype=") + name + " tile=") != std::string::npos);
    SourceFile file("rgcn.intra.ir", text);
    Diagnostics d;
    auto parsed = parse_programs(file, d);
    REQUIRE(parsed);
    CHECK(print_programs(*parsed) == text);
  }
}

TEST_CASE("fp16's fp32 gradients meet its 16-bit weights and activations on tensor cores, widened as loaded",
          "[intra][lowering][dtype][tc]") {
  // fp16's backward keeps its gradient temporaries in fp32 (its exponent would flush them); the input-gradient GEMMs
  // read them with the weights widened, the weight gradients with the activations widened: tf32 MMAs, not the SIMT
  // kernels. Every tile-reading GEMM then being on tensor cores, the graph's tile offsets are shared (tiles=graph).
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "hectorgen_test_fp16_widened";
  std::filesystem::create_directories(dir);
  for (const char* model : {"hgt", "rgat"}) {
    CAPTURE(model);
    const std::string fp32 = read_file(std::string(HECTORGEN_SOURCE_DIR) + "/specs/" + model + ".yaml");
    const std::string path = (dir / (std::string(model) + ".yaml")).string();
    std::ofstream(path) << replace(fp32, "dtype: fp32", "dtype: fp16");
    const std::vector<Program> phases = pipeline_programs(path);
    int widened_gemms = 0, widened_wgrads = 0;
    for (const Program& p : phases) {
      CAPTURE(p.phase);
      CHECK(verify_program(p) == "");
      CHECK(p.graph_tile == intra::kTcTileRows);
      for (const Kernel& k : p.kernels) {
        if (auto* g = std::get_if<GemmInstance>(&k)) {
          CAPTURE(g->name);
          CHECK(g->tensor_cores);
          CHECK(g->graph_tiles == intra::reads_tile_offsets(*g));
          if (intra::gemm_widens_weights(p, *g)) {
            ++widened_gemms;
            CHECK(p.find(g->x)->storage == inter::DType::FP32);
            CHECK(p.find(g->w)->storage == inter::DType::FP16);
          }
        }
        if (auto* w = std::get_if<WeightGradInstance>(&k)) {
          CAPTURE(w->name);
          // (RGAT's attention vectors, n = 1, stay on CUDA cores for their shape)
          CHECK((w->kernel == intra::WgradKernel::TensorCore) == intra::wgrad_tc_obstacle(*w).empty());
          if (intra::wgrad_widens(p, *w)) {
            ++widened_wgrads;
            CHECK(p.find(w->x)->storage != p.find(w->dy)->storage);
          }
        }
      }
    }
    CHECK(widened_gemms > 0);
    CHECK(widened_wgrads > 0);
  }
  CHECK(intra::wgrad_tc_reads(inter::DType::FP16, inter::DType::FP16, inter::DType::FP32));
  CHECK(intra::wgrad_tc_reads(inter::DType::BF16, inter::DType::FP32, inter::DType::FP32));
  CHECK_FALSE(intra::wgrad_tc_reads(inter::DType::BF16, inter::DType::FP16, inter::DType::FP32));
  CHECK_FALSE(intra::wgrad_tc_reads(inter::DType::TF32, inter::DType::BF16, inter::DType::FP32));
}

TEST_CASE("the first weight gradient into a dW overwrites it, later ones add; dW is then not zeroed", "[intra][lowering][wgrad]") {
  // RGAT: d$W gets the gradients of both projections (hs and ht), two instances in that order.
  std::vector<Program> phases = lower_path(std::string(HECTORGEN_SOURCE_DIR) + "/specs/rgat.yaml");
  const Program& bw = phases.back();
  REQUIRE(bw.phase == "backward");
  std::map<std::string, int> writes;
  for (const Kernel& k : bw.kernels) {
    const auto* w = std::get_if<WeightGradInstance>(&k);
    if (!w) continue;
    CAPTURE(w->name);
    const bool first = writes[w->dw]++ == 0;
    bool written_before = false;  // by another kind of kernel
    for (const Kernel& o : bw.kernels) {
      if (&o == &k) break;
      if (!std::holds_alternative<WeightGradInstance>(o) && kernel_writes(o).count(w->dw)) written_before = true;
    }
    if (!w->accumulate) {
      CHECK(first);
      CHECK_FALSE(written_before);
      CHECK_FALSE(bw.find(w->dw)->zero_init);
    } else if (first && !written_before) {
      // d$w_s[e.etype] += s_e * e.hs: a weight gradient with n = 1 in place of a segment sum, which adds, into a
      // zeroed dW, as the segment sum did.
      CHECK(w->n == 1);
      CHECK(bw.find(w->dw)->zero_init);
    } else {
      CHECK(w->accumulate);
    }
  }
  CHECK(writes.at("d$W") == 2);
  CHECK(writes.at("d$w_s") == 1);
}

TEST_CASE("a weight-gradient instance is emitted as the runtime's split-K: chunk offsets, partials, ordered sum",
          "[intra][emit][wgrad]") {
  const std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/specs/rgcn.yaml";
  const std::string fp32 = read_file(path);
  for (const char* dtype : {"fp32", "tf32"}) {
    CAPTURE(dtype);
    const std::vector<Program> phases = lower_source(path, replace(fp32, "dtype: fp32", std::string("dtype: ") + dtype));
    const emit::EmitContext ctx{"rgcn.yaml", "test"};
    const std::string cu = emit::emit_kernels_cu(phases, ctx), host = emit::emit_host_cpp(phases, ctx);
    // Tensor cores either way; fp32 splits its operands (3xTF32).
    const bool split = std::string(dtype) == "fp32";
    CHECK(cu.find("#include \"hectorgen/tc_gemm.cuh\"") != std::string::npos);
    CHECK(cu.find("#include \"hectorgen/simt_wgrad.cuh\"") == std::string::npos);
    CHECK(cu.find(split ? "hectorgen::tc::launch_wgrad_partials<float, 64, 64, hectorgen::tc::Fp32Math::kSplitTf32>(wgrad, "
                          "chunk_ptr, chunk_rows, partial, stream)"
                        : "hectorgen::tc::launch_wgrad_partials<float, 64, 64>(wgrad, chunk_ptr, chunk_rows, partial, stream)") !=
          std::string::npos);
    // d_W over the edges of each type, d_W0 over the nodes: each the only write of its gradient (=).
    CHECK(cu.find("wgrad.seg_ptr = a.etype_ptr;") != std::string::npos);
    CHECK(cu.find("hectorgen::launch_reduce_partials<float>(partial, chunk_ptr, a.d_W, wgrad.num_segments, 4096, "
                  "/*accumulate=*/false, stream)") != std::string::npos);
    CHECK(cu.find("wgrad.num_segments, 4096, /*accumulate=*/true") == std::string::npos);
    CHECK(cu.find("__global__ void __launch_bounds__(256) rgcn_bw_wgrad") == std::string::npos);  // no kernel of its own
    // The launcher and the host code partition the rows alike (one 64 x 64 block per chunk), and the host code
    // sizes both workspaces from it.
    CHECK(cu.find("const int chunk_rows = hectorgen::wgrad_chunk_rows(wgrad.num_rows, 1);") != std::string::npos);
    CHECK(cu.find("int32_t* const chunk_ptr = a.rgcn_bw_wgrad_d_W_chunk_ptr;") != std::string::npos);
    CHECK(host.find("#include \"hectorgen/segments.h\"") != std::string::npos);
    // Bits of the backward's grad_mask: 0 d_feature, 1 d_W0, 2 d_W; each workspace is allocated only when its
    // gradient is asked for.
    CHECK(host.find("at::Tensor rgcn_bw_wgrad_d_W_partial = empty_if(grad_mask & 4, {hectorgen::wgrad_max_chunks(num_edges, "
                    "static_cast<int>(num_etypes), hectorgen::wgrad_chunk_rows(num_edges, 1)) * 4096}, "
                    "options.dtype(at::kFloat));") != std::string::npos);
    CHECK(host.find("at::Tensor rgcn_bw_wgrad_d_W0_chunk_ptr = empty_if(grad_mask & 2, {2}, options.dtype(at::kInt));") !=
          std::string::npos);
    CHECK(host.find("a.rgcn_bw_wgrad_d_W_partial = rgcn_bw_wgrad_d_W_partial.data_ptr<float>();") != std::string::npos);
    // Overwritten by their first (only) instance: the gradients are allocated without zeroing.
    CHECK(host.find("at::Tensor d_W = empty_if(grad_mask & 4, ") != std::string::npos);
  }
  // RGAT adds two instances into d$W: the second one accumulates.
  const std::vector<Program> rgat = lower_path(std::string(HECTORGEN_SOURCE_DIR) + "/specs/rgat.yaml");
  const std::string cu = emit::emit_kernels_cu(rgat, {"rgat.yaml", "test"});
  const size_t first = cu.find("wgrad.num_segments, 4096, /*accumulate=*/false"),
               second = cu.find("wgrad.num_segments, 4096, /*accumulate=*/true");
  CHECK(first != std::string::npos);
  CHECK(second != std::string::npos);
  CHECK(first < second);
}

// How often `needle` occurs in `text`.
static size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST_CASE("tf32 models run their GEMMs on the tensor-core kernel: launchers, workspaces, round trip", "[intra][emit][tc]") {
  for (const char* spec : {"rgcn.yaml", "rgat.yaml", "hgt.yaml"}) {
    CAPTURE(spec);
    const std::string path = spec_path(spec);
    const std::string fp32 = read_file(path);
    std::vector<Program> phases = lower_source(path, replace(fp32, "dtype: fp32", "dtype: tf32"));
    size_t tc = 0, transposed = 0, segmented = 0;
    for (const Program& p : phases) {
      CHECK(verify_program(p) == "");
      for (const Kernel& k : p.kernels)
        if (auto* g = std::get_if<GemmInstance>(&k)) {
          CAPTURE(g->name);
          const GemmKernelChoice c = gemm_kernel_choice(p, *g);
          CHECK(g->tensor_cores == c.tensor_cores);
          // the bundled models are one-headed, 64 wide: only rows over the edge types stay SIMT
          CHECK(g->tensor_cores == (g->rows != intra::Rows::Etypes));
          if (!g->tensor_cores) CHECK(c.reason == "rows=etypes");
          tc += g->tensor_cores;
          transposed += g->tensor_cores && g->transpose_w;
          // (tile offsets per call over segments: lower() alone shares no graph tiles; one segment needs none)
          segmented += g->tensor_cores && g->segments != intra::Segments::None;
        }
    }
    CHECK(tc > 0);
    CHECK(transposed > 0);  // the backward's input gradients
    const std::string ir = print_programs(phases);
    CHECK(occurrences(ir, " kernel=tc\n") + occurrences(ir, " kernel=tc launch_bounds") == tc);
    SourceFile file("m.intra.ir", ir);
    Diagnostics d;
    auto parsed = parse_programs(file, d);
    REQUIRE(parsed);
    CHECK(print_programs(*parsed) == ir);

    const emit::EmitContext ctx{"spec.yaml", "test"};
    const std::string cu = emit::emit_kernels_cu(phases, ctx), h = emit::emit_kernels_h(phases, ctx),
                      host = emit::emit_host_cpp(phases, ctx);
    CHECK(occurrences(cu, "#include \"hectorgen/tc_gemm.cuh\"") == 1);
    CHECK(occurrences(cu, "hectorgen::tc::launch_segment_gemm<float, ") == tc);
    CHECK(occurrences(cu, "hectorgen::tc::kForwardTileRows") == segmented);
    CHECK(occurrences(cu, "gemm.tile_ptr = nullptr;") == tc - segmented);
    CHECK(occurrences(cu, "hectorgen::tc::launch_transpose_segments<float>(") == transposed);
    // Each tile_ptr workspace: an Args field, allocated by the host from the caching allocator, passed in.
    CHECK(occurrences(h, "_tile_ptr = nullptr;  // workspace: ") == segmented);
    CHECK(occurrences(h, "_w_t = nullptr;  // workspace: ") == transposed);
    auto matches = [](const std::string& text, const char* pattern) {
      const std::regex re(pattern);
      return static_cast<size_t>(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
    };
    // (in the backward, only when a gradient the caller asked for needs it: empty_if(grad_mask & bits, ...))
    CHECK(matches(host, R"(at::Tensor \w+_gemm_\w+_tile_ptr = (at::empty\(|empty_if\(grad_mask & \d+, )\{num_[en]types \+ 1\}, options\.dtype\(at::kInt\)\);)") == segmented);
    CHECK(matches(host, R"(at::Tensor \w+_gemm_\w+_w_t = (at::empty\(|empty_if\(grad_mask & \d+, )\{(\w+ \* 4096|4096)\}, options\.dtype\(at::kFloat\)\);)") == transposed);
    CHECK(matches(host, R"(a\.(\w+_gemm_\w+_tile_ptr) = \1\.data_ptr<int32_t>\(\);)") == segmented);
    CHECK(host.find("cudaMalloc") == std::string::npos);
    CHECK(cu.find("cudaDeviceSynchronize") == std::string::npos);
    CHECK(cu.find("cudaMemcpy") == std::string::npos);
  }
  // RGCN's instances, argument by argument: the forward's scatter (atomic into h through dst, gathered through
  // src, scaled by norm, per edge type) and the backward's X W^T without segments (accumulating into d$feature).
  const std::string path = spec_path("rgcn.yaml");
  const std::vector<Program> phases = lower_source(path, replace(read_file(path), "dtype: fp32", "dtype: tf32"));
  const std::string cu = emit::emit_kernels_cu(phases, {"spec.yaml", "test"});
  CHECK(cu.find("  if (a.num_edges > 0) {  // h[dst[row]] += feature[src[row]] * W[etype] * norm[row]\n"
                "    // Tensor cores (tf32, hectorgen/tc_gemm.cuh). The first 64-row tile of each segment, numbered on\n"
                "    // the GPU in this stream (no host sync):\n"
                "    cudaError_t err = hectorgen::launch_segment_tile_ptr(a.etype_ptr, a.num_etypes, a.num_edges, "
                "hectorgen::tc::kForwardTileRows,\n"
                "                                                         a.rgcn_fw_gemm_h_2_tile_ptr, stream);\n"
                "    if (err != cudaSuccess) return err;\n"
                "    hectorgen::tc::SegmentGemmArgs<float, float> gemm{};\n"
                "    gemm.x = a.feature;\n"
                "    gemm.w = a.W;\n"
                "    gemm.y = a.h;\n"
                "    gemm.gather = a.src;\n"
                "    gemm.scatter = a.dst;\n"
                "    gemm.scale = a.norm;\n"
                "    gemm.seg_ptr = a.etype_ptr;\n"
                "    gemm.tile_ptr = a.rgcn_fw_gemm_h_2_tile_ptr;\n"
                "    gemm.num_rows = a.num_edges;\n"
                "    gemm.num_segments = a.num_etypes;\n"
                "    hectorgen::tc::launch_segment_gemm<float, 64, 64, hectorgen::tc::Epilogue::kAtomic>(gemm, stream);\n") !=
        std::string::npos);
  CHECK(cu.find("    err = hectorgen::tc::launch_transpose_segments<float>(a.W0, a.rgcn_bw_gemm_d_feature_w_t, 1, 64, 64, stream);\n"
                "    if (err != cudaSuccess) return err;\n"
                "    hectorgen::tc::SegmentGemmArgs<float, float> gemm{};\n"
                "    gemm.x = a.d_h;\n"
                "    gemm.w = a.rgcn_bw_gemm_d_feature_w_t;\n"
                "    gemm.y = a.d_feature;\n"
                "    gemm.gather = nullptr;\n"
                "    gemm.scatter = nullptr;\n"
                "    gemm.scale = nullptr;\n"
                "    gemm.seg_ptr = nullptr;\n") != std::string::npos);
  CHECK(cu.find("hectorgen::tc::launch_segment_gemm<float, 64, 64, hectorgen::tc::Epilogue::kAccumulate>(gemm, stream);") !=
        std::string::npos);
  // one segment (W0 for every node): no tile offsets, the kernel numbers its 64-row tiles from 0
  CHECK(cu.find("hectorgen::launch_segment_tile_ptr(nullptr, 1,") == std::string::npos);
  CHECK(cu.find("    // Tensor cores (tf32, hectorgen/tc_gemm.cuh); one weight for every row: 64-row tiles numbered from 0.\n"
                "    cudaError_t err = cudaSuccess;\n"
                "    // Y = X W0^T") != std::string::npos);
  // fp32: the same launchers, the operands split into tf32 heads and tails (the math on a line of its own)
  const std::string fp32 = emit::emit_kernels_cu(lower_source(path, read_file(path)), {"spec.yaml", "test"});
  CHECK(fp32.find("    hectorgen::tc::launch_segment_gemm<float, 64, 64, hectorgen::tc::Epilogue::kAtomic, float,\n"
                  "                                       hectorgen::tc::Fp32Math::kSplitTf32>(gemm, stream);\n") !=
        std::string::npos);
  CHECK(fp32.find("// Tensor cores (fp32 as 3xTF32, hectorgen/tc_gemm.cuh).") != std::string::npos);
  // Many heads: the SIMT template and the CUDA-core weight gradient, no tile or W^T workspaces
  const std::vector<Program> simt = lower_path(std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/many_heads.yaml");
  CHECK(emit::emit_kernels_cu(simt, {"spec.yaml", "test"}).find("hectorgen::tc::") == std::string::npos);
  CHECK(emit::emit_kernels_cu(simt, {"spec.yaml", "test"}).find("hectorgen::simt::launch_wgrad_partials<") != std::string::npos);
  CHECK(emit::emit_kernels_h(simt, {"spec.yaml", "test"}).find("_tile_ptr = nullptr;  // workspace") == std::string::npos);
  CHECK(emit::emit_kernels_h(simt, {"spec.yaml", "test"}).find("_w_t = nullptr;  // workspace") == std::string::npos);
}

TEST_CASE("bf16 storage: tensor-core launchers over __nv_bfloat16, W^T in bf16", "[intra][emit][tc]") {
  const std::string path = spec_path("rgcn.yaml");
  std::vector<Program> phases = lower_source(path, replace(read_file(path), "dtype: fp32", "dtype: bf16"));
  for (const Program& p : phases) {
    CHECK(verify_program(p) == "");
    for (const Kernel& k : p.kernels)
      if (auto* g = std::get_if<GemmInstance>(&k)) {
        CAPTURE(g->name);
        CHECK(g->tensor_cores);
      }
  }
  const emit::EmitContext ctx{"spec.yaml", "test"};
  const std::string cu = emit::emit_kernels_cu(phases, ctx), h = emit::emit_kernels_h(phases, ctx);
  CHECK(cu.find("hectorgen::tc::SegmentGemmArgs<__nv_bfloat16, __nv_bfloat16> gemm{};") != std::string::npos);
  CHECK(cu.find("hectorgen::tc::launch_segment_gemm<__nv_bfloat16, 64, 64, hectorgen::tc::Epilogue::kStore>(gemm, stream);") !=
        std::string::npos);
  CHECK(cu.find("Epilogue::kAtomic") == std::string::npos);  // 16-bit models are lowered without atomics
  CHECK(cu.find("hectorgen::tc::launch_transpose_segments<__nv_bfloat16>(") != std::string::npos);
  CHECK(h.find("__nv_bfloat16* rgcn_bw_gemm_d_feature_edges_w_t = nullptr;") != std::string::npos);
  CHECK(cu.find("hectorgen::tc::launch_wgrad_partials<__nv_bfloat16, 64, 64>(wgrad, chunk_ptr, chunk_rows, partial, stream)") !=
        std::string::npos);
}

TEST_CASE("bf16 and fp16 models store tensors in 16 bits, except narrow rows, row scalars and graph inputs", "[intra][lowering][dtype]") {
  for (const char* spec : {"/specs/rgcn.yaml", "/specs/rgat.yaml", "/specs/hgt.yaml", "/tests/specs/gcn_shared.yaml",
                           "/tests/specs/simplehgn.yaml"}) {
    const std::string path = std::string(HECTORGEN_SOURCE_DIR) + spec;
    const std::string fp32 = read_file(path);
    for (const char* name : {"fp32", "tf32", "bf16", "fp16"}) {
      CAPTURE(spec, name);
      const inter::DType dtype = *inter::parse_dtype(name);
      const inter::DType storage = model_storage(dtype);
      std::vector<Program> phases = lower_source(path, replace(fp32, "dtype: fp32", std::string("dtype: ") + name));
      int sixteen = 0;
      for (const Program& p : phases) {
        CAPTURE(p.phase);
        CHECK(verify_program(p) == "");
        std::set<std::string> row_scalars, recomputed;
        for (const Kernel& k : p.kernels) {
          if (auto* g = std::get_if<GemmInstance>(&k); g && g->name.ends_with("_recompute")) recomputed.insert(g->y);
          // bf16/fp16 models are lowered without atomics, inference too; fp32 and tf32 inference keeps its scatters.
          if (storage != inter::DType::FP32) CHECK(atomic_writes(k).empty());
          if (auto* g = std::get_if<GemmInstance>(&k); g && !g->row_scalar.empty()) row_scalars.insert(g->row_scalar);
        }
        for (const TensorInfo& t : p.tensors) {
          CAPTURE(t.name);
          sixteen += t.storage != inter::DType::FP32;
          if (storage == inter::DType::FP32) CHECK(t.storage == inter::DType::FP32);
          else if (t.role == Role::Weight || t.role == Role::Output) CHECK(t.storage == storage);
          else if (row_scalars.count(t.name) || !t.from_graph.empty()) CHECK(t.storage == inter::DType::FP32);
          // (the backward recomputes what the training forward saved, in the type it stored it: the same bits)
          else if (recomputed.count(t.name)) CHECK(t.storage == (t.row_numel() < 32 ? inter::DType::FP32 : storage));
          // (fp16: the backward's gradient temporaries stay fp32, away from fp16's subnormals)
          else if (storage == inter::DType::FP16 && p.phase == "backward" && t.role != Role::Input) CHECK(t.storage == inter::DType::FP32);
          else if (t.role != Role::Input) CHECK(t.storage == (t.row_numel() < 32 ? inter::DType::FP32 : storage));
        }
      }
      CHECK((sixteen > 0) == (storage != inter::DType::FP32));
      // What the phases exchange has one type: the saved fields, and each input in every phase.
      for (const std::string& field : phases.size() == 3 ? phases[1].saved : std::vector<std::string>{}) {
        auto alias = phases[1].aliases.find(field);
        const TensorInfo* stored = phases[1].find(alias == phases[1].aliases.end() ? field : alias->second);
        const TensorInfo* read = phases[2].find(field);
        REQUIRE(stored);
        REQUIRE(read);
        CHECK(stored->storage == read->storage);
      }
      for (const TensorInfo& t : phases[0].tensors)
        if (t.role == Role::Input)
          for (const Program& p : phases)
            if (const TensorInfo* u = p.find(t.name)) CHECK(u->storage == t.storage);
      // The text form carries the storage: it parses back to the same programs and the same generated files.
      const std::string text = print_programs(phases);
      CHECK((text.find(std::string("] ") + name) != std::string::npos) == (storage != inter::DType::FP32));
      SourceFile file("spec.intra.ir", text);
      Diagnostics d;
      auto parsed = parse_programs(file, d);
      REQUIRE(parsed);
      CHECK(print_programs(*parsed) == text);
      OutputSet from_ir, direct;
      emit::emit_all(*parsed, {"spec.yaml", "test"}, from_ir);
      emit::emit_all(phases, {"spec.yaml", "test"}, direct);
      CHECK(from_ir.files() == direct.files());
    }
  }
}

TEST_CASE("RGAT in bf16: feature rows in bf16, the softmax's statistics in fp32", "[intra][lowering][dtype]") {
  const std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/specs/rgat.yaml";
  std::vector<Program> phases = lower_source(path, replace(read_file(path), "dtype: fp32", "dtype: bf16"));
  const Program& fw = phases[0];
  for (const char* name : {"feature", "W", "w_s", "h"}) CHECK(fw.find(name)->storage == inter::DType::BF16);
  for (const char* name : {"att", "att_max", "att_sum"}) CHECK(fw.find(name)->storage == inter::DType::FP32);
  const Program& bw = phases[2];
  for (const char* name : {"d$feature", "d$W", "d$w_s", "d$h", "hs"}) CHECK(bw.find(name)->storage == inter::DType::BF16);
  for (const char* name : {"att", "att_max", "att_sum", "d$att"}) CHECK(bw.find(name)->storage == inter::DType::FP32);
  CHECK(print_programs(phases).find("tensor h: output node[1, 64] bf16\n") != std::string::npos);
}

TEST_CASE("bf16 and fp16 models: the generated files spell each tensor's storage type", "[intra][emit][dtype]") {
  const std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/specs/rgcn.yaml";
  struct Case {
    const char* dtype;
    const char* cuda;    // element type in the kernels
    const char* header;  // the CUDA header that declares it
    const char* aten;    // ATen's scalar type, and its element type
    const char* element;
    const char* torch;   // the Python module's DTYPE
  } cases[] = {{"bf16", "__nv_bfloat16", "#include <cuda_bf16.h>", "at::kBFloat16", "at::BFloat16", "torch.bfloat16"},
               {"fp16", "__half", "#include <cuda_fp16.h>", "at::kHalf", "at::Half", "torch.float16"}};
  for (const Case& c : cases) {
    CAPTURE(c.dtype);
    std::vector<Program> phases = lower_source(path, replace(read_file(path), "dtype: fp32", std::string("dtype: ") + c.dtype));
    OutputSet out;
    emit::emit_all(phases, {"rgcn.yaml", "test"}, out);
    const std::string &cu = out.files().at("rgcn_kernels.cu"), &h = out.files().at("rgcn_kernels.h"),
                      &host = out.files().at("rgcn_host.cpp"), &py = out.files().at("rgcn.py"), &manifest = out.files().at("manifest.json");
    // Kernels: 16-bit pointers, loads converted to float, stores rounded back, no atomics; norm (from the graph) is float.
    CHECK(h.find(c.header) != std::string::npos);
    CHECK(h.find(std::string("const ") + c.cuda + "* feature = nullptr;") != std::string::npos);
    CHECK(h.find("const float* norm = nullptr;") != std::string::npos);
    CHECK(h.find(std::string(c.cuda) + "* h = nullptr;") != std::string::npos);
    CHECK(cu.find(std::string("__device__ __forceinline__ float to_float(") + c.cuda + " v)") != std::string::npos);
    // the traversals' stores: rows in runs of 4 elements a lane, each rounded to the storage type
    CHECK(cu.find(std::string("__device__ __forceinline__ void run_from_float(") + c.cuda + "& e, float v)") != std::string::npos);
    CHECK(cu.find("store_run<8>(&h[n * 64 + lane * 8], v_h);") != std::string::npos);  // auto: 8 lanes of 16 bytes
    CHECK(cu.find(std::string("hectorgen::tc::launch_segment_gemm<") + c.cuda + ", 64, 64,") != std::string::npos);
    CHECK(cu.find("atomicAdd") == std::string::npos);
    CHECK(cu.find("const float* __restrict__ x") == std::string::npos);
    // Host: each tensor checked and passed as its type; allocations name it; the message names the spec's dtype.
    CHECK(host.find(std::string("check(feature, \"input 'feature'\", ") + c.aten) != std::string::npos);
    CHECK(host.find("check(norm, \"input 'norm'\", at::kFloat") != std::string::npos);
    CHECK(host.find(std::string("check(W, \"weight 'W'\", ") + c.aten) != std::string::npos);
    CHECK(host.find(std::string("reinterpret_cast<") + c.cuda + "*>(feature.data_ptr<" + c.element + ">())") != std::string::npos);
    CHECK(host.find(std::string("at::Tensor h = at::empty({num_nodes, 64}, options.dtype(") + c.aten + "));") != std::string::npos);
    CHECK(host.find(std::string("feature.options().dtype(") + c.aten + ")") != std::string::npos);  // the Meta function
    CHECK(host.find(std::string("(the spec's dtype is ") + c.dtype) != std::string::npos);
    CHECK(host.find("data_ptr<float>()") != std::string::npos);  // norm
    // Python: DTYPE, the parameters in it, another dtype refused naming the spec's.
    CHECK(py.find(std::string("\nDTYPE = ") + c.torch + "\n") != std::string::npos);
    CHECK(py.find("device=None, dtype=DTYPE, **hyper") != std::string::npos);
    CHECK(py.find("if dtype != DTYPE:") != std::string::npos);
    CHECK(py.find(std::string("(the spec's dtype: ") + c.dtype + ")") != std::string::npos);
    CHECK(py.find("torch.zeros(s, device=device, dtype=DTYPE)") != std::string::npos);
    CHECK(manifest.find(std::string("\"dtype\": \"") + c.dtype + "\"") != std::string::npos);
    CHECK(manifest.find(std::string("\"storage\": \"") + c.dtype + "\"") != std::string::npos);
  }
}

TEST_CASE("the committed .intra.ir goldens parse back to themselves", "[intra][roundtrip]") {
  for (const char* model : {"rgcn", "rgat", "hgt"}) {
    CAPTURE(model);
    std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/generated/" + model + "/" + model + ".intra.ir";
    std::string text = read_file(path);
    SourceFile file(path, text);
    Diagnostics d;
    auto parsed = parse_programs(file, d);
    REQUIRE(parsed);
    CHECK(print_programs(*parsed) == text);
  }
}

TEST_CASE("--emit=intra-ir prints the phases that parse back", "[intra][driver]") {
  driver::Options o;
  o.spec_path = spec_path("rgat.yaml");
  o.emit = "intra-ir";
  std::ostringstream out, err;
  REQUIRE(driver::run(o, out, err) == 0);
  SourceFile file("rgat.intra.ir", out.str());
  Diagnostics d;
  auto parsed = parse_programs(file, d);
  REQUIRE(parsed);
  REQUIRE(parsed->size() == 3);
  CHECK(print_programs(*parsed) == out.str());
  CHECK(out.str() == read_file(std::string(HECTORGEN_SOURCE_DIR) + "/generated/rgat/rgat.intra.ir"));
}

TEST_CASE("RGAT's node softmax keeps the node's values in registers and syncs where lanes exchange att", "[intra][lowering]") {
  auto phases = lower_path(spec_path("rgat.yaml"));
  const TraversalInstance& t = traversal(phases, "rgat_fw_nodes_att_max");
  CHECK(t.rows == inter::LoopKind::DstNodes);
  // att_max, att_sum and h are registers of the whole row (in inference only h is stored: nothing reads the
  // others afterwards). The max, exp and sum loops hold scalar work only: the lanes split their edges, and
  // the lane that overwrites an edge's att in the exp loop is the one that reads it in the others, so no
  // sync between them; one sync before the message loop, where every lane reads every edge's att. The last
  // loop's new att is not stored (nothing reads it in inference).
  CHECK(outline(t.body) == std::vector<std::string>{"var v_att_max", "for e", "for e", "var v_att_sum", "for e", "var v_h", "sync",
                                                    "for e", "store h"});
  for (size_t k = 0; k < 4; ++k) CHECK(loop_at(t, k).split == (k < 3));
  CHECK(outline(loop_at(t, 0).body) == std::vector<std::string>{"let v_att", "update v_att_max"});
  CHECK(outline(loop_at(t, 1).body) == std::vector<std::string>{"var v_att", "update v_att", "store att"});
  CHECK(std::get<Load>(def_named(loop_at(t, 1).body, "v_att").source).lane0);
  CHECK_FALSE(std::get<Load>(def_named(loop_at(t, 2).body, "v_att").source).lane0);
  CHECK(outline(loop_at(t, 3).body) == std::vector<std::string>{"let v_msg", "var v_att", "update v_att", "update v_h"});
  // Training saves att_max, att_sum and every att for the backward: all stored.
  const TraversalInstance& fwt = traversal(phases, "rgat_fwt_nodes_att_max");
  std::vector<std::string> top = outline(fwt.body);
  CHECK(std::vector<std::string>(top.end() - 3, top.end()) == std::vector<std::string>{"store att_max", "store att_sum", "store h"});
  CHECK(outline(loop_at(fwt, 3).body).back() == "store att");
  const Def& h = def_named(t.body, "v_h");
  CHECK(h.type == RegType{{1, 64}, LaneLayout::Lanes});  // spread over the lanes: 2 slots each
  CHECK(h.type.slots() == 2);
  const Store& att = std::get<Store>(loop_at(t, 1).body.back().v);
  CHECK(att.lanes == StoreLanes::Lane0);
  CHECK(std::get<Store>(t.body.back().v).lanes == StoreLanes::Partitioned);
  // The same kernel without its syncs races.
  TraversalInstance racy = t;
  std::function<void(std::vector<Instr>&)> strip = [&](std::vector<Instr>& b) {
    b.erase(std::remove_if(b.begin(), b.end(), is_sync), b.end());
    for (Instr& in : b)
      if (auto* l = std::get_if<EdgeLoop>(&in.v)) strip(l->body);
  };
  strip(racy.body);
  REQUIRE(find_warp_hazard(racy));
  CHECK(find_warp_hazard(racy)->tensor == "att");
}

TEST_CASE("RGAT's edge kernels reduce over the warp once per value, loading each row once", "[intra][lowering]") {
  auto phases = lower_path(spec_path("rgat.yaml"));
  const TraversalInstance& fw = traversal(phases, "rgat_fw_edges_att");
  CHECK(count_instrs(fw.body, is_reduce) == 2);
  CHECK(count_instrs(fw.body, is_sync) == 0);
  for (const Instr& in : fw.body)
    if (auto* d = std::get_if<Def>(&in.v); d && std::holds_alternative<Reduce>(d->source)) CHECK(std::get<Reduce>(d->source).warp);
  // The backward reads the stored score e.att$0 for leakyrelu's derivative (its slope is >= 0): no dot product
  // recomputed; hs is not loaded: d$w_s[e.etype] += s_e * e.hs is a weight gradient with n = 1 reading hs itself,
  // the traversal storing the scalar s_e alone (no row of s_e * hs per edge).
  const TraversalInstance& bw = traversal(phases, "rgat_bw_edges_d_hs");
  CHECK(count_instrs(bw.body, is_reduce) == 0);
  CHECK(count_instrs(bw.body, [](const Instr& in) {
          auto* d = std::get_if<Def>(&in.v);
          auto* l = d ? std::get_if<Load>(&d->source) : nullptr;
          return l && l->tensor == "att$0";
        }) == 1);
  CHECK(count_instrs(bw.body, [](const Instr& in) {
          auto* d = std::get_if<Def>(&in.v);
          auto* l = d ? std::get_if<Load>(&d->source) : nullptr;
          return l && l->tensor == "hs";
        }) == 0);
  const Program& bwp = phases.back();
  const auto d_w_s = std::find_if(bwp.kernels.begin(), bwp.kernels.end(), [](const Kernel& k) {
    auto* w = std::get_if<WeightGradInstance>(&k);
    return w && w->dw == "d$w_s";
  });
  REQUIRE(d_w_s != bwp.kernels.end());
  CHECK(std::get<WeightGradInstance>(*d_w_s).x == "hs");
  CHECK(std::get<WeightGradInstance>(*d_w_s).n == 1);
  // d_hs is accumulated twice in registers and stored once.
  CHECK(count_instrs(bw.body, [](const Instr& in) {
          auto* s = std::get_if<Store>(&in.v);
          return s && s->tensor == "d$hs";
        }) == 1);
}

TEST_CASE("HGT's training forward stores the attention dot product; the backward's mu gradient reads it, a thread per edge",
          "[intra][lowering]") {
  // With compact materialization (the benchmarked configuration's), through the driver's whole pipeline.
  const std::vector<Program> phases =
      pipeline_programs(std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/hgt_compact.yaml");
  auto loads = [](const TraversalInstance& t, const std::string& tensor) {
    return count_instrs(t.body, [&](const Instr& in) {
      auto* d = std::get_if<Def>(&in.v);
      auto* l = d ? std::get_if<Load>(&d->source) : nullptr;
      return l && l->tensor == tensor;
    });
  };
  // The forward's warp reduction is stored as it is computed, one float per edge.
  const TraversalInstance& fwt = traversal(phases, "hgt_compact_fwt_nodes_att__0_dot");
  CHECK(count_instrs(fwt.body, is_reduce) == 1);
  CHECK(count_instrs(fwt.body, [](const Instr& in) {
          auto* s = std::get_if<Store>(&in.v);
          return s && s->tensor == "att$0$dot";
        }) == 1);
  // The backward reads it instead of re-reading the rows lin$k[pair] and q[dst] and reducing them.
  const TraversalInstance& bw = traversal(phases, "hgt_compact_bw_edges_loop");
  CHECK(count_instrs(bw.body, is_reduce) == 0);
  CHECK(loads(bw, "att$0$dot") == 1);
  CHECK(loads(bw, "lin$k") == 0);
  CHECK(loads(bw, "q") == 0);
  CHECK(one_thread_per_row(bw));
}

TEST_CASE("RGAT's backward node kernel hoists the node's rows out of the edge loops, and lane 0 owns what it overwrites",
          "[intra][lowering]") {
  auto phases = lower_path(spec_path("rgat.yaml"));
  const TraversalInstance& t = traversal(phases, "rgat_bw_nodes_d_att");
  // n.d_h, att_sum and att_max of the row node: loaded once per node, not once per edge.
  std::vector<std::string> top = outline(t.body);
  CHECK(std::vector<std::string>(top.begin(), top.begin() + 3) == std::vector<std::string>{"let v_d_h", "let v_att_sum", "let v_att_max"});
  // Loop 2 reads d$att$1 that lane 0 stored in loop 1: one sync before it. Loop 3 accumulates into d$att$0
  // that loop 2 stored, for the next kernel: lane 0 loads it back itself, no sync. What nothing reads later
  // (d$att, loop 2's d$att$1, d$att_sum, d$att_max) is not stored.
  CHECK(std::count(top.begin(), top.end(), "sync") == 1);
  CHECK(top[std::find(top.begin(), top.end(), "sync") - top.begin() + 1] == "for e");
  CHECK_FALSE(std::get<Load>(def_named(loop_at(t, 1).body, "v_d_att__1").source).lane0);
  CHECK(std::get<Load>(def_named(loop_at(t, 2).body, "v_d_att__0").source).lane0);
  for (const char* dead : {"d$att", "d$att_sum", "d$att_max"})
    CHECK(count_instrs(t.body, [&](const Instr& in) {
            auto* st = std::get_if<Store>(&in.v);
            return st && st->tensor == dead;
          }) == 0);
}

TEST_CASE("HGT and RGCN: gathers through dst, node sums without atomics or syncs", "[intra][lowering]") {
  auto hgt = lower_path(spec_path("hgt.yaml"));
  const TraversalInstance& att = traversal(hgt, "hgt_fw_edges_att");
  CHECK(outline(att.body)[0] == "index e_dst");
  CHECK(std::get<IndexDef>(att.body[0].v).array == GraphArray::Dst);
  auto rgcn = lower_path(spec_path("rgcn.yaml"));
  const TraversalInstance& sum = traversal(rgcn, "rgcn_fwt_sum_h");
  // h starts from what the self-loop GEMM stored, adds the edge rows in a register, and is stored once.
  CHECK(outline(sum.body) == std::vector<std::string>{"var v_h", "for e", "store h"});
  CHECK(std::get<Load>(def_named(sum.body, "v_h").source).tensor == "h");
  // In RGAT's backward the first node sum of d_feature starts at zero (nothing to load), the second from it.
  auto rgat = lower_path(spec_path("rgat.yaml"));
  CHECK(std::get<Eval>(def_named(traversal(rgat, "rgat_bw_sum_d_feature").body, "v_d_feature").source).value->kind ==
        Value::Kind::Const);
  CHECK(std::get<Load>(def_named(traversal(rgat, "rgat_bw_sum_d_feature_2").body, "v_d_feature").source).tensor == "d$feature");
  CHECK(count_instrs(sum.body, is_sync) == 0);
}

TEST_CASE("generated traversal kernels: source names, no copies, no one-iteration loops", "[intra][emit]") {
  for (const std::string& path : all_specs()) {
    CAPTURE(path);
    auto phases = lower_path(path);
    std::string cu = emit::emit_kernels_cu(phases, {"spec.yaml", "test"});
    CHECK_FALSE(std::regex_search(cu, std::regex(R"(\bv[0-9]+\b)")));        // no v0, v1, ...
    CHECK_FALSE(std::regex_search(cu, std::regex(R"(< 1; \+\+)")));          // no loop of one iteration
    CHECK_FALSE(std::regex_search(cu, std::regex(R"(\b(\w+)\[0\] = (\w+)\[0\];)")));  // no copies
    for (const Program& p : phases)
      for (const Kernel& k : p.kernels)
        if (auto* t = std::get_if<TraversalInstance>(&k)) {
          CAPTURE(t->name);
          // A register defined as another register is a copy.
          CHECK(count_instrs(t->body, [](const Instr& in) {
                  auto* d = std::get_if<Def>(&in.v);
                  auto* e = d ? std::get_if<Eval>(&d->source) : nullptr;
                  return e && e->value->kind == Value::Kind::Reg;
                }) == 0);
          CHECK_FALSE(find_warp_hazard(*t));
        }
  }
}

namespace {

std::vector<Program> lower_text(const std::string& text) { return lower_source("spec.yaml", text); }

}  // namespace

TEST_CASE("a reshaped local keeps its shape: dot and sum reduce its last axis", "[intra][lowering]") {
  auto phases = lower_text(R"(model: ops
hyper: {d: 48, heads: 4}
inputs:
  feature: {per: node, shape: [d]}
weights:
  a: {per: etype, shape: [heads, 12]}
outputs:
  h: {per: node, shape: [heads, 12]}
program: |
  for e in g.edges():
      x = reshape(e.src.feature, heads, 12)
      e["att"] = exp(dot(x, a[e.etype]))
      e["z"] = sum(e["att"])
      e["m"] = x * e["att"] * e["z"]
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["h"] += e["m"]
)");
  const TraversalInstance& t = traversal(phases, "ops_fw_nodes_att");  // fused into the node loop
  const Def& dot = def_named(t.body, "dot_x_a");
  CHECK(dot.type == RegType{{4}, LaneLayout::Replicated});  // four heads of 12, not one sum of 48
  CHECK(std::get<Reduce>(dot.source).axis == 12);
  CHECK(std::get<Reduce>(dot.source).warp);
  const Def& z = def_named(t.body, "v_z");
  CHECK(std::get<Reduce>(z.source).axis == 4);
  CHECK_FALSE(std::get<Reduce>(z.source).warp);  // a replicated value: summed within each lane
}

TEST_CASE("an edge loop adding into its source's row stores atomically; training sums per node instead", "[intra][lowering]") {
  auto phases = lower_text(R"(model: scatter
hyper: {d: 40}
inputs:
  feature: {per: node, shape: [d]}
outputs:
  h: {per: node, shape: [d]}
program: |
  for e in g.edges():
      e.src["h"] += exp(e.src.feature) - e.dst.feature
)");
  const TraversalInstance& fw = traversal(phases, "scatter_fw_edges_h");
  const Store& s = std::get<Store>(fw.body.back().v);
  CHECK(s.atomic);
  CHECK(s.tensor == "h");
  CHECK(s.lanes == StoreLanes::Partitioned);
  CHECK(s.row == "e_src");
  for (size_t i = 1; i < phases.size(); ++i)
    for (const Kernel& k : phases[i].kernels)
      if (auto* t = std::get_if<TraversalInstance>(&k))
        CHECK(count_instrs(t->body, [](const Instr& in) {
                auto* st = std::get_if<Store>(&in.v);
                return st && st->atomic;
              }) == 0);
}

// ---- semantics -------------------------------------------------------------------------------------
namespace {

inter::HeteroGraph random_graph(uint64_t seed) {
  std::mt19937_64 rng(seed);
  inter::HeteroGraph g;
  g.num_nodes = 23;
  g.num_ntypes = 2;
  g.num_etypes = 3;
  for (int64_t n = 0; n < g.num_nodes; ++n) g.ntype.push_back(static_cast<int>(rng() % 2));
  for (int e = 0; e < 90; ++e) {
    g.src.push_back(static_cast<int64_t>(rng() % 23));
    g.dst.push_back(e < 3 ? 5 : static_cast<int64_t>(rng() % 20));  // nodes 20..22 have no incoming edge
    g.etype.push_back(static_cast<int>(rng() % 3));
  }
  return g;
}

inter::Tensor64 random_tensor(std::vector<int64_t> shape, std::mt19937_64& rng) {
  inter::Tensor64 t;
  t.shape = std::move(shape);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  t.data.resize(static_cast<size_t>(t.numel()));
  for (double& x : t.data) x = u(rng);
  return t;
}

// Inputs (not computed from the graph) and weights of a module, random.
inter::TensorMap random_inputs(const inter::ModelDecl& d, const inter::HeteroGraph& g, std::mt19937_64& rng,
                               const inter::TensorMap& given = {}) {
  inter::TensorMap out;
  for (const auto* list : {&d.inputs, &d.weights})
    for (const inter::TensorDecl& t : *list) {
      if (!t.from_graph.empty()) continue;
      if (auto it = given.find(t.name); it != given.end()) out[t.name] = it->second;
      else out[t.name] = random_tensor(inter::full_shape(t, g), rng);
      if (auto it = given.find(t.name + "_rows"); t.indexed_rows && it != given.end()) out[it->first] = it->second;
    }
  if (given.empty()) test::add_row_maps(d, g, out, rng);
  return out;
}

void check_close(const std::string& what, const inter::Tensor64& got, const inter::Tensor64& want) {
  CAPTURE(what);
  REQUIRE(got.data.size() == want.data.size());
  double worst = 0;
  for (size_t i = 0; i < got.data.size(); ++i) worst = std::max(worst, std::abs(got.data[i] - want.data[i]) / (1 + std::abs(want.data[i])));
  CHECK(worst < 1e-9);
}

// Runs phase `p` in the intra interpreter and compares `names` (outputs, saved fields) with the inter
// interpreter's `want` (outputs and fields); returns the tensors the program computed.
inter::TensorMap run_and_compare(const Program& p, const inter::HeteroGraph& g, inter::TensorMap tensors,
                                 const inter::InterpretResult& want, const std::vector<std::string>& names) {
  std::string err = intra::interpret(p, g, tensors);
  INFO(p.phase << ": " << err);
  REQUIRE(err.empty());
  for (const std::string& n : names) {
    auto alias = p.aliases.find(n);
    const std::string& tensor_name = alias == p.aliases.end() ? n : alias->second;
    const inter::Tensor64* ref = want.outputs.count(n) ? &want.outputs.at(n) : want.fields.count(n) ? &want.fields.at(n) : nullptr;
    REQUIRE(ref);
    check_close(p.phase + " " + n, tensors.at(tensor_name), *ref);
  }
  return tensors;
}

// The backward's tensors without the fields autodiff saved (`saved`) that the lowered training forward no longer hands
// it (recompute-gemms): the backward must compute those itself.
void only_saved(inter::TensorMap& backward_inputs, const std::vector<std::string>& saved, const Program& forward_train) {
  for (const std::string& s : saved)
    if (std::find(forward_train.saved.begin(), forward_train.saved.end(), s) == forward_train.saved.end()) backward_inputs.erase(s);
}

// The backward asked for one gradient at a time (the host code's grad_mask) runs only the kernels that feed it
// (emit::results_fed) and computes it bit for bit as the whole backward does. Returns how many kernel runs the
// requests skipped.
size_t check_gradient_requests(const Program& bw, const inter::HeteroGraph& g, const inter::TensorMap& in) {
  std::vector<std::string> results;
  for (const TensorInfo& t : bw.tensors)
    if (t.role == Role::Output) results.push_back(t.name);
  const std::vector<std::set<size_t>> fed = emit::results_fed(bw, results);
  inter::TensorMap all = in;
  REQUIRE(intra::interpret(bw, g, all).empty());
  size_t skipped = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    CAPTURE(results[r]);
    Program only = bw;
    only.kernels.clear();
    for (size_t i = 0; i < bw.kernels.size(); ++i)
      if (fed[i].count(r)) only.kernels.push_back(bw.kernels[i]);
    skipped += bw.kernels.size() - only.kernels.size();
    inter::TensorMap got = in;
    const std::string err = intra::interpret(only, g, got);
    INFO(err);
    REQUIRE(err.empty());
    CHECK(got.at(results[r]).data == all.at(results[r]).data);
  }
  return skipped;
}

}  // namespace

// Test specs (tests/specs/) of the model classes of issue 7 item 8 that train.
const char* kTestSpecs[] = {"gcn_shared.yaml", "rgat_concat_outer.yaml", "rgcn_basis.yaml", "split_loops.yaml"};

// Fields and locals read between two writes (test_autodiff.cpp "[versions]"): each value is a version of its own
// in the training forward, with copies where an accumulation starts from a read value. Every phase lowers.
const char* kVersionSpecs[] = {
    R"(model: versions0
inputs:
  x: {per: node, shape: [36]}
outputs:
  y: {per: node, shape: [36]}
  s: {per: node, shape: [36]}
program: |
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["s"] += e.src.x
  for n in g.dst_nodes():
      n["y"] = n["s"] * n["s"]
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["s"] += e.src.x * e.src.x
)",
    R"(model: versions1
inputs:
  x: {per: node, shape: [36]}
outputs:
  y: {per: node, shape: [36]}
  s: {per: node, shape: [36]}
program: |
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["s"] += e.src.x
      n["y"] = exp(n["s"])
      for e in n.incoming_edges():
          n["s"] += e.src.x * e.src.x
)",
    R"(model: versions2
inputs:
  x: {per: node, shape: [36]}
outputs:
  y: {per: node, shape: [36]}
  s: {per: node, shape: [36]}
program: |
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
)",
    R"(model: versions3
inputs:
  x: {per: node, shape: [36]}
outputs:
  y: {per: node, shape: [36]}
  s: {per: node, shape: [36]}
program: |
  for n in g.dst_nodes():
      t = n.x * 2.0
      n["y"] = t * t
      t += n.x * n.x
      n["s"] = t * n.x
)",
    R"(model: versions4
inputs:
  x: {per: node, shape: [36]}
outputs:
  y: {per: node, shape: [36]}
  s: {per: node, shape: [36]}
program: |
  for n in g.dst_nodes():
      t = n.x * 2.0
      n["y"] = t * t
      t = exp(n.x)
      n["s"] = t * t
)",
};

// Specs exercising what the bundled ones do not: reshaped locals reduced per head, element-wise operators,
// replicated vectors summed within a lane, a shared weight, outgoing-edge loops, atomic scatters, dot() with
// 32 or more outputs.
const char* kExtraSpecs[] = {
    // A user's output per edge type, accumulated in a top-level edge loop and in an inner one (forward only: its
    // gradient is not supported yet). Type checking crashed on it ("stored_type: not an assignable target").
    R"(model: per_etype_output
hyper: {d: 36}
inputs:
  x: {per: node, shape: [d]}
weights:
  a: {per: etype, shape: []}
outputs:
  acc: {per: etype, shape: [d]}
  tot: {per: etype, shape: []}
program: |
  for e in g.edges():
      acc[e.etype] += a[e.etype] * e.src.x
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          tot[e.etype] += dot(n.x, e.src.x)
)",
    // Weight gradients accumulated inside an outgoing-edge loop (per etype, a vector; shared, a scalar) and an
    // input gradient scattered into e.dst from it.
    R"(model: inner_wgrad
hyper: {d: 40}
inputs:
  feature: {per: node, shape: [d]}
weights:
  a: {per: etype, shape: [d]}
  c: {per: none, shape: []}
outputs:
  h: {per: node, shape: [d]}
program: |
  for n in g.src_nodes():
      for e in n.outgoing_edges():
          n["h"] += tanh(a[e.etype] * e.dst.feature) * c
)",
    R"(model: ops
hyper: {d: 48, heads: 4}
inputs:
  feature: {per: node, shape: [d]}
  w_e: {per: edge, shape: []}
weights:
  a: {per: etype, shape: [heads, 12]}
  s: {per: none, shape: [heads]}
outputs:
  h: {per: node, shape: [heads, 12]}
program: |
  for e in g.edges():
      x = reshape(e.src.feature, heads, 12)
      y = reshape(e.dst.feature, heads, 12)
      e["att"] = sigmoid(dot(x, a[e.etype])) * s + tanh(sum(y)) - relu(sqrt(e.w_e * e.w_e + 1.0))
      e["z"] = sum(e["att"])
      e["m"] = x * e["att"] + y * e["z"]
  for n in g.src_nodes():
      for e in n.outgoing_edges():
          n["h"] += e["m"] * e["z"]
)",
    R"(model: scatter
hyper: {d: 40}
inputs:
  feature: {per: node, shape: [d]}
outputs:
  h: {per: node, shape: [d]}
program: |
  for e in g.edges():
      e["v"] = exp(e.src.feature) * 0.5
  for e in g.edges():
      e.src["h"] += e["v"] - e.dst.feature
)",
    // reorder-linear in a node loop's incoming-edge loop (k != d): the weight-weight product over the edge types,
    // read per inner edge; the backward stores the edges' gradient of it per edge inside the inner loop and sums
    // it per edge type for d_v and d_W.
    R"(model: inner_reorder
hyper: {d: 36, k: 40}
inputs:
  feature: {per: node, shape: [k]}
weights:
  W: {per: etype, shape: [k, d]}
  v: {per: etype, shape: [d]}
outputs:
  h: {per: node, shape: [k]}
options:
  reorder: on
program: |
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["h"] += tanh(dot(e.src.feature * W[e.etype], v[e.etype])) * e.src.feature
)",
    // reorder-linear with an expression as the transform's input: the edges' gradient of the product is no scaled
    // input row, so it is stored per edge (in the edge kernel) and summed per edge type.
    R"(model: reorder_expr
hyper: {d: 40, k: 36}
inputs:
  feature: {per: node, shape: [k]}
weights:
  W: {per: etype, shape: [k, d]}
  v: {per: etype, shape: [d]}
outputs:
  h: {per: node, shape: [k]}
options:
  reorder: on
program: |
  for e in g.edges():
      e["att"] = exp(dot(tanh(e.src.feature) * W[e.etype], v[e.etype]))
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["h"] += e["att"] * e.src.feature
)",
    R"(model: heads40
hyper: {in_dim: 8, out_dim: 3, heads: 40}
inputs:
  feature: {per: node, shape: [in_dim]}
weights:
  W: {per: etype, shape: [in_dim, heads * out_dim]}
  w_s: {per: etype, shape: [heads, out_dim]}
outputs:
  h: {per: node, shape: [heads, out_dim]}
program: |
  for e in g.edges():
      hs = reshape(e.src.feature * W[e.etype], heads, out_dim)
      e["att"] = exp(dot(hs, w_s[e.etype]))
      e["msg"] = hs
  for n in g.dst_nodes():
      for e in n.incoming_edges():
          n["h"] += e["att"] * e["msg"]
)",
};

TEST_CASE("lowering keeps the meaning: the intra IR computes what the inter IR computes, forward and backward",
          "[intra][semantics]") {
  std::vector<std::pair<std::string, std::string>> specs;
  for (const std::string& path : all_specs()) specs.push_back({path, read_file(path)});
  for (const char* name : kTestSpecs) {
    std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/tests/specs/" + name;
    specs.push_back({path, read_file(path)});
  }
  for (const char* text : kExtraSpecs) specs.push_back({"extra.yaml", text});
  for (const char* text : kVersionSpecs) specs.push_back({"versions.yaml", text});
  size_t skipped = 0;  // kernel runs that requests for some of the gradients skip (check_gradient_requests)
  // Linear operator reordering: `auto` rewrites RGAT's dot(ht, w_t) only (tests/specs/rgat_reorder.yaml has `on`).
  const std::string rgat = std::string(HECTORGEN_SOURCE_DIR) + "/specs/rgat.yaml";
  specs.push_back({rgat, replace(read_file(rgat), "  reorder: off", "  reorder: auto")});
  for (const auto& [path, text] : specs) {
    CAPTURE(path, text);
    auto c = compile_text(path, text);
    REQUIRE(c->module);
    std::vector<Program> phases = lower_source(path, text);
    // The pipeline's forward: reorder-linear and hoist-node-transforms run before autodiff.
    const inter::Module forward = pipeline_forward(*c->module);
    Diagnostics d;
    auto tm = passes::autodiff(forward, d);
    for (uint64_t seed : {1u, 2u}) {
      CAPTURE(seed);
      inter::HeteroGraph g = seed == 1 ? tiny_graph() : random_graph(seed);
      std::mt19937_64 rng(seed);
      // forward
      inter::TensorMap in = random_inputs(forward.decl, g, rng);
      inter::InterpretResult fw = inter::interpret(passes::fuse_loops(forward), g, in);
      REQUIRE(fw.ok);
      std::vector<std::string> outputs;
      for (const auto& o : forward.decl.outputs) outputs.push_back(o.name);
      run_and_compare(phases[0], g, in, fw, outputs);
      if (!tm || phases.size() < 3) continue;
      // training forward: the outputs and every field the backward reads
      inter::InterpretResult fwt = inter::interpret(passes::fuse_loops(tm->forward), g, in);
      REQUIRE(fwt.ok);
      std::vector<std::string> kept = outputs;
      kept.insert(kept.end(), phases[1].saved.begin(), phases[1].saved.end());  // what it hands the backward
      run_and_compare(phases[1], g, in, fwt, kept);
      // backward, from the reference's saved fields and random output gradients
      inter::TensorMap given = in;
      for (const std::string& s : tm->saved) given[s] = fwt.fields.count(s) ? fwt.fields.at(s) : fwt.outputs.at(s);
      inter::TensorMap bin = random_inputs(tm->backward.decl, g, rng, given);
      inter::InterpretResult bw = inter::interpret(passes::fuse_loops(tm->backward), g, bin);
      REQUIRE(bw.ok);
      std::vector<std::string> grads;
      for (const auto& o : tm->backward.decl.outputs) grads.push_back(o.name);
      only_saved(bin, tm->saved, phases[1]);
      run_and_compare(phases[2], g, bin, bw, grads);
      skipped += check_gradient_requests(phases[2], g, bin);
    }
  }
  CHECK(skipped > 0);  // a request for some of the gradients skips kernels (RGAT's weights alone: those of d$feature)
}

// Compact materialization end to end: the compacted module (pair loops, pair fields, sums into pairs and from pairs
// into their sources) lowers to pair-row GEMMs, weight gradients, segment sums, traversals and gather sums that
// compute, on graphs with shared (source, edge type) pairs, the outputs and gradients of the uncompacted module.
TEST_CASE("compact materialization lowers to kernels that compute what the uncompacted program computes",
          "[intra][semantics][compact]") {
  std::vector<std::pair<std::string, std::string>> specs;
  for (const std::string& path : all_specs()) specs.push_back({path, read_file(path)});
  for (const char* text : kExtraSpecs) specs.push_back({"extra.yaml", text});
  int compacted = 0;
  for (const auto& [path, text] : specs) {
    CAPTURE(path, text);
    auto c = compile_text(path, text);
    REQUIRE(c->module);
    // As the pipeline does: reorder-linear (the spec's option) and hoist-node-transforms before compaction.
    const inter::Module forward =
        passes::hoist_node_transforms(passes::reorder_linear(*c->module, c->module->decl.options.reorder));
    const inter::Module compact = passes::compact_materialization(forward, inter::Materialization::Compact);
    bool pairs = false;
    for (const inter::StmtP& s : compact.body) pairs = pairs || (s->kind == inter::StmtKind::For && s->loop == inter::LoopKind::SrcPairs);
    if (!pairs) continue;
    Diagnostics d;
    auto tm = passes::autodiff(forward, d);
    auto tc = passes::autodiff(compact, d);
    std::vector<Program> phases;
    auto lower = [&](const inter::Module& m, const std::string& phase, const std::vector<std::string>& saved) {
      Diagnostics ld;
      auto p = passes::lower(passes::fuse_loops(m), ld, phase, saved);
      std::ostringstream err;
      ld.render(err);
      INFO(phase << ": " << err.str());
      REQUIRE(p);
      REQUIRE(intra::verify_program(*p).empty());
      phases.push_back(*p);
    };
    lower(compact, "forward", {});
    if (tc) {
      lower(tc->forward, "forward_train", tc->saved);
      lower(tc->backward, "backward", {});
      passes::unify_storage(phases);
      passes::recompute_gemms(phases[1], phases[2]);
    }
    ++compacted;
    for (uint64_t seed : {1u, 2u, 3u}) {
      CAPTURE(seed);
      inter::HeteroGraph g = seed == 1 ? tiny_graph() : random_graph(seed);
      std::mt19937_64 rng(seed);
      inter::TensorMap in = random_inputs(forward.decl, g, rng);
      inter::InterpretResult fw = inter::interpret(forward, g, in);
      REQUIRE(fw.ok);
      std::vector<std::string> outputs;
      for (const auto& o : forward.decl.outputs) outputs.push_back(o.name);
      run_and_compare(phases[0], g, in, fw, outputs);
      if (!tc) continue;
      // The training forward's outputs and the fields it saves, against the compacted module's interpreter.
      inter::InterpretResult fwt = inter::interpret(tc->forward, g, in);
      REQUIRE(fwt.ok);
      std::vector<std::string> kept = outputs;
      kept.insert(kept.end(), phases[1].saved.begin(), phases[1].saved.end());  // what it hands the backward
      run_and_compare(phases[1], g, in, fwt, kept);
      // The gradients, against the uncompacted backward (its own saved fields, the same output gradients).
      inter::TensorMap given = in;
      for (const std::string& s : tc->saved) given[s] = fwt.fields.count(s) ? fwt.fields.at(s) : fwt.outputs.at(s);
      inter::TensorMap bin = random_inputs(tc->backward.decl, g, rng, given);
      inter::InterpretResult fwv = inter::interpret(tm->forward, g, in);
      REQUIRE(fwv.ok);
      inter::TensorMap vin = in;
      for (const std::string& s : tm->saved) vin[s] = fwv.fields.count(s) ? fwv.fields.at(s) : fwv.outputs.at(s);
      for (const auto& o : forward.decl.outputs) vin[inter::grad_name(o.name)] = bin.at(inter::grad_name(o.name));
      inter::InterpretResult bw = inter::interpret(tm->backward, g, vin);
      REQUIRE(bw.ok);
      std::vector<std::string> grads;
      for (const auto& o : tc->backward.decl.outputs) grads.push_back(o.name);
      only_saved(bin, tc->saved, phases[1]);
      run_and_compare(phases[2], g, bin, bw, grads);
      CHECK(check_gradient_requests(phases[2], g, bin) > 0);
    }
  }
  CHECK(compacted >= 3);  // rgcn, rgat, hgt at least
}

TEST_CASE("fields and locals read between two writes train: every phase lowers", "[intra][lowering][versions]") {
  for (const char* text : kVersionSpecs) {
    CAPTURE(text);
    CHECK(lower_source("versions.yaml", text).size() == 3);
  }
  for (const char* name : kTestSpecs) {
    CAPTURE(name);
    CHECK(lower_path(std::string(HECTORGEN_SOURCE_DIR) + "/tests/specs/" + name).size() == 3);
  }
}

TEST_CASE("a phase computes a repeated GEMM once: HGT's backward needs k[src] · W_att[etype] twice", "[intra][lowering][merge]") {
  auto phases = lower_path(spec_path("hgt.yaml"));
  const Program& bw = phases.back();
  REQUIRE(bw.phase == "backward");
  std::vector<std::string> products;
  for (const Kernel& k : bw.kernels)
    if (auto* g = std::get_if<GemmInstance>(&k); g && g->x == "k" && g->w == "W_att" && !g->transpose_w) products.push_back(g->y);
  REQUIRE(products.size() == 1);
  // Both readers (d_q's and d_mu's terms) load the one result; the other temporary is gone.
  int loads = 0;
  for (const Kernel& k : bw.kernels)
    if (kernel_reads(k).count(products[0]) && std::holds_alternative<TraversalInstance>(k)) ++loads;
  CHECK(loads >= 1);
  CHECK(bw.find("t$lin_12") == nullptr);
  CHECK(verify_program(bw) == "");
  // No phase of the bundled models keeps two GEMMs of one product.
  for (const Program& p : phases) {
    std::set<std::string> seen;
    for (const Kernel& k : p.kernels)
      if (auto* g = std::get_if<GemmInstance>(&k))
        CHECK(seen.insert(g->x + "|" + g->w + "|" + std::to_string(g->transpose_w) + "|" + std::to_string(static_cast<int>(g->gather)))
                  .second);
  }
}

TEST_CASE("a repeated GEMM is kept when its input changes in between", "[intra][lowering][merge]") {
  Program p;
  auto add = [&](std::string name, Role role, inter::Per per) {
    TensorInfo t;
    t.name = std::move(name);
    t.role = role;
    t.per = per;
    t.shape = {64};
    p.tensors.push_back(t);
  };
  add("x", Role::Temp, inter::Per::Node);
  add("w", Role::Weight, inter::Per::None);
  add("y1", Role::Temp, inter::Per::Node);
  add("y2", Role::Temp, inter::Per::Node);
  add("y3", Role::Temp, inter::Per::Node);
  auto gemm = [](std::string name, std::string x, std::string y) {
    GemmInstance g;
    g.name = std::move(name);
    g.x = std::move(x);
    g.w = "w";
    g.y = std::move(y);
    g.k = g.n = 64;
    return Kernel{g};
  };
  p.kernels = {gemm("g1", "x", "y1"), gemm("g2", "x", "y2"), gemm("g3", "y1", "x"), gemm("g4", "x", "y3")};
  passes::merge_duplicate_gemms(p);
  // g2 repeats g1 and goes (g3 then reads y1 as before); g4 reads x after g3 rewrote it: kept.
  std::vector<std::string> names;
  for (const Kernel& k : p.kernels) names.push_back(kernel_name(k));
  CHECK(names == std::vector<std::string>{"g1", "g3", "g4"});
  CHECK(p.find("y2") == nullptr);
  CHECK(std::get<GemmInstance>(p.kernels[2]).y == "y3");
}

TEST_CASE("a GEMM operand scaled by a per-row scalar expression reads the rows gathered, the scalar as its row scalar",
          "[intra][lowering][row-scalar]") {
  // HGT's backward: d_k += linear_t(d_att / sqrt(d_k) * mu[e.etype] * e.dst.q, W_att[e.etype]) and the same
  // product in d_W_att: the scalar is stored per edge (one float), q is gathered by dst.
  for (const char* dtype : {"fp32", "bf16"}) {
    CAPTURE(dtype);
    const std::string path = spec_path("hgt.yaml");
    std::vector<Program> phases = lower_source(path, replace(read_file(path), "dtype: fp32", std::string("dtype: ") + dtype));
    const Program& bw = phases.back();
    CHECK(verify_program(bw) == "");
    int gemms = 0, wgrads = 0;
    for (const Kernel& k : bw.kernels) {
      if (auto* g = std::get_if<GemmInstance>(&k); g && g->w == "W_att" && g->transpose_w) {
        ++gemms;
        CHECK(g->x == "q");
        CHECK(g->gather == Gather::Dst);
        REQUIRE_FALSE(g->row_scalar.empty());
        CHECK(bw.find(g->row_scalar)->row_numel() == 1);
        CHECK(bw.find(g->row_scalar)->storage == inter::DType::FP32);
      }
      if (auto* w = std::get_if<WeightGradInstance>(&k); w && w->dw == "d$W_att") {
        ++wgrads;
        CHECK((w->x == "k" && w->x_gather == Gather::Src && w->dy == "q" && w->dy_gather == Gather::Dst));
        CHECK_FALSE(w->row_scalar.empty());
      }
    }
    CHECK(gemms == 1);
    CHECK(wgrads == 1);
  }
}

// reorder-linear's weight-weight products, lowered: W[r] · w[r]ᵀ is one GEMM over the edge types per attention half
// (each row its own weight), the edges read their relation's row; ht's transform is gone. The backward sums the
// edges' gradient of each product, s_e · feature, per relation once (a weight gradient over the edges, s_e stored
// per edge) and gets d_w and its share of d_W from etype-row GEMMs; no training kernel adds atomically, no PyTorch
// fallback.
TEST_CASE("RGAT with reorder on: weight-weight products over the edge types, forward and backward", "[intra][lowering][reorder]") {
  const std::string path = std::string(HECTORGEN_SOURCE_DIR) + "/tests/specs/rgat_reorder.yaml";
  std::vector<Program> phases = lower_path(path);
  REQUIRE(phases.size() == 3);
  for (const Program& p : phases) {
    CAPTURE(p.phase);
    CHECK(verify_program(p) == "");
    int edge_gemms = 0, products = 0;
    for (const Kernel& k : p.kernels) {
      CHECK_FALSE(std::holds_alternative<TorchInstance>(k));
      if (p.phase != "forward") CHECK(atomic_writes(k).empty());
      const auto* g = std::get_if<GemmInstance>(&k);
      if (!g) continue;
      if (g->rows == intra::Rows::Edges) ++edge_gemms;
      if (g->rows == intra::Rows::Etypes && g->segments == Segments::Etype && g->transpose_w) {
        ++products;
        CHECK(g->w == "W");
        CHECK((g->x == "w_s" || g->x == "w_t"));
        CHECK(g->k == 64);  // out_dim
        CHECK(g->n == 32);  // in_dim: K values per relation
      }
    }
    CHECK(products == 2);
    // The forward phases: hs's GEMM (the message) only; ht's is gone.
    if (p.phase != "backward") CHECK(edge_gemms == 1);
  }
  const Program& bw = phases[2];
  std::map<std::string, const GemmInstance*> grads;
  int sums = 0;
  for (const Kernel& k : bw.kernels) {
    if (auto* g = std::get_if<GemmInstance>(&k); g && g->rows == intra::Rows::Etypes && !g->transpose_w) {
      CHECK(g->segments == Segments::Etype);
      CHECK(g->accumulate);
      grads[g->y + "/" + g->w] = g;
    }
    // S[t] = Σ feature[src/dst(e)]ᵀ · s_e: a weight gradient over the edges with n = 1, no E x in_dim temporary
    if (auto* w = std::get_if<WeightGradInstance>(&k); w && w->n == 1) {
      ++sums;
      CHECK(w->x == "feature");
      CHECK(w->k == 32);
      CHECK(w->segments == Segments::Etype);
      CHECK(bw.find(w->dy)->row_numel() == 1);
      CHECK(bw.find(w->dw)->per == inter::Per::Etype);
    }
    CHECK_FALSE(std::holds_alternative<SegmentSumInstance>(k));
  }
  REQUIRE(grads.size() == 4);
  // d_w_s[r] += S_s[r] · W[r] (k = in_dim, n = out_dim); d_W[r] += outer(S_s[r], w_s[r]) (in_dim heads of 1 x out_dim)
  const GemmInstance& dws = *grads.at("d$w_s/W");
  CHECK((dws.heads == 1 && dws.k == 32 && dws.n == 64));
  const GemmInstance& dW = *grads.at("d$W/w_s");
  CHECK((dW.heads == 32 && dW.k == 1 && dW.n == 64));
  CHECK(dW.x == dws.x);  // one per-relation sum for both
  CHECK(grads.at("d$W/w_t")->x == grads.at("d$w_t/W")->x);
  CHECK(sums == 2);
}

// schedule-for-memory: two edge-sized temporaries, each produced and consumed by its own pair of GEMMs. Lowered
// as produce A, produce B, consume A, consume B, both are live at once; consuming A before producing B halves the
// peak. Kernels that touch one tensor keep their order, and the scheduled program computes the same values.
TEST_CASE("schedule-for-memory runs a temporary's consumers before the next temporary's producer", "[intra][schedule]") {
  Program p;
  p.model = "m";
  p.phase = "backward";
  using inter::Per;
  p.tensors = {{"x", Role::Input, Per::Edge, {4}, false, ""},     {"w", Role::Weight, Per::Etype, {4, 4}, false, ""},
               {"a", Role::Temp, Per::Edge, {4}, false, ""},      {"b", Role::Temp, Per::Edge, {4}, false, ""},
               {"ya", Role::Output, Per::Edge, {4}, false, ""},   {"yb", Role::Output, Per::Edge, {4}, false, ""}};
  p.layouts = {layout::kSortedCoo};
  p.kernels = {edge_gemm("make_a", "x", "a"), edge_gemm("make_b", "x", "b"), edge_gemm("use_a", "a", "ya"),
               edge_gemm("use_b", "b", "yb")};
  Program scheduled = p;
  passes::schedule_for_memory(scheduled);
  std::vector<std::string> order;
  for (const Kernel& k : scheduled.kernels) order.push_back(kernel_name(k));
  CHECK(order == std::vector<std::string>{"make_a", "use_a", "make_b", "use_b"});
  // Same values: interpret both on a small graph.
  inter::HeteroGraph g = tiny_graph();
  std::mt19937_64 rng(7);
  inter::TensorMap in;
  for (const char* n : {"x", "w"}) {
    const TensorInfo* t = p.find(n);
    std::vector<int64_t> shape = {t->per == Per::Edge ? g.num_edges() : g.num_etypes};
    shape.insert(shape.end(), t->shape.begin(), t->shape.end());
    inter::Tensor64 v = inter::Tensor64::zeros(shape);
    std::uniform_real_distribution<double> u(-1, 1);
    for (double& d : v.data) d = u(rng);
    in[n] = v;
  }
  inter::TensorMap before = in, after = in;
  REQUIRE(intra::interpret(p, g, before).empty());
  REQUIRE(intra::interpret(scheduled, g, after).empty());
  for (const char* y : {"ya", "yb"}) CHECK(after.at(y).data == before.at(y).data);
  // Nothing to gain (each temporary consumed right away already): the order stays.
  Program kept = scheduled;
  passes::schedule_for_memory(kept);
  for (size_t i = 0; i < kept.kernels.size(); ++i) CHECK(kernel_name(kept.kernels[i]) == order[i]);
  // An accumulation into one tensor keeps its order: use_b also adds into ya after use_a.
  Program chained = p;
  std::get<GemmInstance>(chained.kernels[3]).y = "ya";
  std::get<GemmInstance>(chained.kernels[3]).accumulate = true;
  passes::schedule_for_memory(chained);
  std::vector<std::string> chained_order;
  for (const Kernel& k : chained.kernels) chained_order.push_back(kernel_name(k));
  CHECK(std::find(chained_order.begin(), chained_order.end(), "use_a") <
        std::find(chained_order.begin(), chained_order.end(), "use_b"));
}

TEST_CASE("schedule-for-memory lowers the peak of HGT's compact backward", "[intra][schedule]") {
  // tests/gpu/specs/hgt_compact.yaml through the driver's whole pipeline (issue 9: HGT's training peak on
  // wikikg2): at most two [pairs, 64] temporaries are live at once in the backward (the lowering's order had three:
  // the message's gradient, its product with W_msg and the gradient of lin$k).
  const std::vector<Program> phases =
      pipeline_programs(std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/hgt_compact.yaml");
  const Program& bw = phases.at(2);
  REQUIRE(bw.phase == "backward");
  std::map<std::string, std::pair<size_t, size_t>> span;  // pair-sized temporaries: first and last kernel
  for (size_t i = 0; i < bw.kernels.size(); ++i)
    for (const std::set<std::string>& names : {kernel_reads(bw.kernels[i]), kernel_writes(bw.kernels[i])})
      for (const std::string& n : names) {
        const TensorInfo* t = bw.find(n);
        if (!t || t->per != inter::Per::Pair || t->row_numel() < 64 || t->role == Role::Input || t->role == Role::Output) continue;
        auto [it, fresh] = span.try_emplace(n, i, i);
        if (!fresh) it->second.second = i;
      }
  CHECK(span.size() >= 3);
  size_t most = 0;
  for (size_t i = 0; i < bw.kernels.size(); ++i) {
    size_t live = 0;
    for (const auto& [n, s] : span) live += s.first <= i && i <= s.second;
    most = std::max(most, live);
  }
  CHECK(most <= 2);
}

namespace {

bool contains(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

const GemmInstance* gemm_writing(const Program& p, const std::string& tensor) {
  for (const Kernel& k : p.kernels)
    if (auto* g = std::get_if<GemmInstance>(&k); g && g->y == tensor) return g;
  return nullptr;
}

// The same instance but for its name and output: operands, rows, tile and kernel (the same bits).
bool same_instance(const GemmInstance& a, const GemmInstance& b) {
  return a.x == b.x && a.w == b.w && a.rows == b.rows && a.gather == b.gather && a.segments == b.segments &&
         a.scatter == b.scatter && a.accumulate == b.accumulate && a.transpose_w == b.transpose_w &&
         a.row_scalar == b.row_scalar && a.heads == b.heads && a.k == b.k && a.n == b.n && a.dtype == b.dtype &&
         a.tensor_cores == b.tensor_cores && a.tile == b.tile && a.coarsen == b.coarsen && a.launch_bounds == b.launch_bounds;
}

// wikikg2's and mag's counts (bench/datasets.py STATS; unique (source, relation) pairs of the synthetic graphs,
// datasets.unique_src_etype_pairs: wikikg2 10,066,773, mag 870,696).
const passes::GraphCounts kWikikg2{2500604, 16109182, 10066773, 535, 1};
const passes::GraphCounts kMag{1939743, 21111007, 870696, 4, 4};

// A training step's static peak: the larger of its two ops' (passes::training_step_peak).
int64_t training_peak(const std::vector<Program>& phases, const passes::GraphCounts& c) {
  return passes::training_step_peak(phases.at(1), phases.at(2), c);
}

}  // namespace

TEST_CASE("recompute-gemms: HGT's compact backward recomputes lin$k and msg instead of the training forward saving them",
          "[intra][recompute]") {
  const std::string spec = std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/hgt_compact.yaml";
  const std::vector<Program> off = pipeline_programs(spec, "off"), on = pipeline_programs(spec);
  REQUIRE(on.size() == 3);
  // --recompute=off is printed in the IR and parsed back; the default (auto) is not printed.
  CHECK(off[1].decl.options.recompute == inter::Recompute::Off);
  CHECK(on[1].decl.options.recompute == inter::Recompute::Auto);
  // The spec's options.recompute: off (or no) saves them too.
  for (const char* value : {"off", "no"}) {
    const std::string text = replace(read_file(spec), "  materialization: compact\n",
                                     std::string("  materialization: compact\n  recompute: ") + value + "\n");
    const std::vector<Program> phases = lower_source(spec, text);  // (lower_source does not compact: msg is per edge)
    CHECK(contains(phases.at(1).saved, "msg"));
    CHECK_FALSE(gemm_writing(phases.at(2), "msg"));
  }
  // on (or yes) recomputes it, as auto does here.
  for (const char* value : {"on", "yes"}) {
    const std::string text = replace(read_file(spec), "  materialization: compact\n",
                                     std::string("  materialization: compact\n  recompute: ") + value + "\n");
    const std::vector<Program> phases = lower_source(spec, text);
    CHECK(phases.at(1).decl.options.recompute == inter::Recompute::On);
    CHECK_FALSE(contains(phases.at(1).saved, "msg"));
    CHECK(gemm_writing(phases.at(2), "msg"));
  }
  const Program &fwt = on[1], &bw = on[2];
  for (const char* field : {"lin$k", "msg"}) {
    CAPTURE(field);
    CHECK(contains(off[1].saved, field));
    CHECK_FALSE(contains(fwt.saved, field));
    CHECK_FALSE(bw.decl.find_input(field));
    REQUIRE(bw.find(field));
    CHECK(bw.find(field)->role == Role::Temp);
    // The forward's attention kernel still reads it: its GEMM stays. The backward runs a copy of the instance,
    // before the first kernel that reads its result.
    const GemmInstance* forward = gemm_writing(fwt, field);
    const GemmInstance* again = gemm_writing(bw, field);
    REQUIRE(forward);
    REQUIRE(again);
    CHECK(same_instance(*forward, *again));
    CHECK(again->name == "hgt_compact_bw_gemm_" + std::string(field == std::string("msg") ? "msg" : "lin_k") + "_recompute");
    size_t at = 0, first_read = bw.kernels.size();
    for (size_t i = 0; i < bw.kernels.size(); ++i) {
      if (kernel_name(bw.kernels[i]) == again->name) at = i;
      if (kernel_reads(bw.kernels[i]).count(field)) first_read = std::min(first_read, i);
    }
    CHECK(at < first_read);
  }
  // The operands are what the backward is handed anyway: no new saved field.
  for (const std::string& s : fwt.saved) CHECK(contains(off[1].saved, s));
  for (const char* operand : {"k", "v"}) CHECK(contains(fwt.saved, operand));
  // grad_mask: a recompute GEMM runs exactly when a kernel that reads its result runs (a request for W_a's gradient
  // alone skips both).
  std::vector<std::string> results;
  for (const TensorInfo& t : bw.tensors)
    if (t.role == Role::Output) results.push_back(t.name);
  const std::vector<std::set<size_t>> fed = emit::results_fed(bw, results);
  for (size_t i = 0; i < bw.kernels.size(); ++i) {
    const auto* g = std::get_if<GemmInstance>(&bw.kernels[i]);
    if (!g || !g->name.ends_with("_recompute")) continue;
    std::set<size_t> readers;
    for (size_t j = i + 1; j < bw.kernels.size(); ++j)
      if (kernel_reads(bw.kernels[j]).count(g->y)) readers.insert(fed[j].begin(), fed[j].end());
    CHECK(fed[i] == readers);
    CHECK(fed[i].size() < results.size());
  }
  // The static peak of the training step on wikikg2's counts: the backward no longer holds two [pairs, 64] fp32
  // tensors (2.6 GB each) for the whole op.
  const int64_t pair_rows = kWikikg2.pairs * 64 * 4;
  CHECK(passes::peak_bytes(off[2], kWikikg2) - passes::peak_bytes(bw, kWikikg2) >= pair_rows);
  CHECK(training_peak(off, kWikikg2) - training_peak(on, kWikikg2) >= pair_rows);
}

TEST_CASE("recompute-gemms: RGAT's message is recomputed once for its two saved names", "[intra][recompute]") {
  // hs and msg are one tensor (msg aliases hs); ht is the destination's half. Both are [edges, 64] products of the
  // input feature and W: the backward recomputes them, reading msg as hs.
  const std::vector<Program> on = pipeline_programs(spec_path("rgat.yaml"), "on");
  const Program &fwt = on[1], &bw = on[2];
  for (const char* field : {"hs", "msg", "ht"}) {
    CAPTURE(field);
    CHECK_FALSE(contains(fwt.saved, field));
    CHECK_FALSE(bw.decl.find_input(field));
  }
  CHECK_FALSE(bw.find("msg"));
  REQUIRE(gemm_writing(bw, "hs"));
  REQUIRE(gemm_writing(bw, "ht"));
  CHECK(gemm_writing(bw, "hs")->x == "feature");
}

TEST_CASE("recompute-gemms: IR in, IR out", "[intra][recompute][pass]") {
  // The training forward computes y = x · w, saved and read by nothing else of it, and z from a temporary the
  // backward does not have. The backward reads both.
  using inter::Per;
  auto decl = [](const char* name, Per per, std::vector<int64_t> shape) {
    inter::TensorDecl d;
    d.name = name;
    d.per = per;
    d.shape = std::move(shape);
    return d;
  };
  Program fwt;
  fwt.model = "m";
  fwt.phase = "forward_train";
  fwt.decl.name = "m";
  fwt.decl.inputs = {decl("x", Per::Edge, {4})};
  fwt.decl.weights = {decl("w", Per::Etype, {4, 4})};
  fwt.layouts = {layout::kSortedCoo};
  fwt.tensors = {{"x", Role::Input, Per::Edge, {4}, false, ""}, {"w", Role::Weight, Per::Etype, {4, 4}, false, ""},
                 {"y", Role::Field, Per::Edge, {4}, false, ""}, {"t", Role::Temp, Per::Edge, {4}, false, ""},
                 {"z", Role::Field, Per::Edge, {4}, false, ""}};
  fwt.kernels = {edge_gemm("m_fwt_gemm_y", "x", "y"), edge_gemm("m_fwt_gemm_t", "x", "t"),
                 edge_gemm("m_fwt_gemm_z", "t", "z")};
  fwt.saved = {"y", "z"};
  Program bw;
  bw.model = "m";
  bw.phase = "backward";
  bw.decl.name = "m";
  bw.decl.inputs = {decl("x", Per::Edge, {4}), decl("y", Per::Edge, {4}), decl("z", Per::Edge, {4})};
  bw.decl.weights = {decl("w", Per::Etype, {4, 4})};
  bw.decl.outputs = {decl("d$x", Per::Edge, {4})};
  bw.layouts = fwt.layouts;
  bw.tensors = {{"y", Role::Input, Per::Edge, {4}, false, ""},     {"z", Role::Input, Per::Edge, {4}, false, ""},
                {"w", Role::Weight, Per::Etype, {4, 4}, false, ""}, {"d$x", Role::Output, Per::Edge, {4}, false, ""}};
  bw.kernels = {edge_gemm("m_bw_gemm_d_x", "z", "d$x"), edge_gemm("m_bw_gemm_d_x_2", "y", "d$x", true)};
  REQUIRE(verify_program(fwt).empty());
  REQUIRE(verify_program(bw).empty());

  SECTION("off: nothing changes") {
    Program f = fwt, b = bw;
    f.decl.options.recompute = inter::Recompute::Off;
    const std::string before = print_program(f);
    CHECK(passes::recompute_gemms(f, b).empty());
    CHECK(print_program(f) == before);
    CHECK(print_program(b) == print_program(bw));
  }
  SECTION("on: y is recomputed, z stays saved; the results are the same bits") {
    Program f = fwt, b = bw;
    f.decl.options.recompute = inter::Recompute::On;
    CHECK(passes::recompute_gemms(f, b) == std::vector<std::string>{"y"});
    CHECK(verify_program(f) == "");
    CHECK(verify_program(b) == "");
    CHECK(f.saved == std::vector<std::string>{"z"});
    CHECK_FALSE(f.find("y"));  // nothing else of the training forward read it: not computed there
    CHECK_FALSE(gemm_writing(f, "y"));
    CHECK_FALSE(b.decl.find_input("y"));
    CHECK(b.find("y")->role == Role::Temp);
    REQUIRE(b.find("x"));  // the recompute's operand, an input the backward did not read before
    CHECK(b.find("x")->role == Role::Input);
    std::vector<std::string> order;
    for (const Kernel& k : b.kernels) order.push_back(kernel_name(k));
    CHECK(order == std::vector<std::string>{"m_bw_gemm_d_x", "m_bw_gemm_y_recompute", "m_bw_gemm_d_x_2"});
    // Interpreted: the forward's z, then the backward from x, w and z only, against the backward handed y.
    inter::HeteroGraph g = tiny_graph();
    std::mt19937_64 rng(3);
    inter::TensorMap in = {{"x", random_tensor({g.num_edges(), 4}, rng)}, {"w", random_tensor({g.num_etypes, 4, 4}, rng)}};
    inter::TensorMap before = in, after = in;
    REQUIRE(intra::interpret(fwt, g, before).empty());
    REQUIRE(intra::interpret(f, g, after).empty());
    CHECK(after.at("z").data == before.at("z").data);
    inter::TensorMap handed = {{"x", in.at("x")}, {"w", in.at("w")}, {"z", after.at("z")}};
    inter::TensorMap old = handed;
    old["y"] = before.at("y");
    REQUIRE(intra::interpret(bw, g, old).empty());
    REQUIRE(intra::interpret(b, g, handed).empty());
    CHECK(handed.at("d$x").data == old.at("d$x").data);
  }
}

TEST_CASE("recompute-gemms: auto recomputes a saved field only where the step's estimated peak falls",
          "[intra][recompute][pass]") {
  // The training forward saves y1 and y2, both x · w (and reads neither: each GEMM goes with its field). The backward
  // holds x, y1, y2 and d$x for the whole op, and its peak is where the temporary t is live (t = y2 · w, d$x = t · w),
  // then it reads y1 and x. Recomputing y1 moves it out of that peak (a temporary live at its reader only): the step's
  // peak falls from five edge rows to four. Recomputing y2 too would not: y2, recomputed right before the kernel
  // that reads it, is live beside t there, as the saved y2 was.
  using inter::Per;
  auto decl = [](const char* name) {
    inter::TensorDecl d;
    d.name = name;
    d.per = std::string(name) == "w" ? Per::Etype : Per::Edge;
    d.shape = d.per == Per::Etype ? std::vector<int64_t>{4, 4} : std::vector<int64_t>{4};
    return d;
  };
  auto tensor = [](const char* name, Role role) {
    return TensorInfo{name, role, role == Role::Weight ? Per::Etype : Per::Edge,
                      role == Role::Weight ? std::vector<int64_t>{4, 4} : std::vector<int64_t>{4}, false, ""};
  };
  Program fwt;
  fwt.model = "m";
  fwt.phase = "forward_train";
  fwt.decl.name = "m";
  fwt.decl.inputs = {decl("x")};
  fwt.decl.weights = {decl("w")};
  fwt.layouts = {layout::kSortedCoo};
  fwt.tensors = {tensor("x", Role::Input), tensor("w", Role::Weight), tensor("y1", Role::Field), tensor("y2", Role::Field)};
  fwt.kernels = {edge_gemm("m_fwt_gemm_y1", "x", "y1"), edge_gemm("m_fwt_gemm_y2", "x", "y2")};
  fwt.saved = {"y1", "y2"};
  Program bw;
  bw.model = "m";
  bw.phase = "backward";
  bw.decl.name = "m";
  bw.decl.inputs = {decl("x"), decl("y1"), decl("y2")};
  bw.decl.weights = {decl("w")};
  bw.decl.outputs = {decl("d$x")};
  bw.layouts = fwt.layouts;
  bw.tensors = {tensor("x", Role::Input), tensor("y1", Role::Input), tensor("y2", Role::Input), tensor("w", Role::Weight),
                tensor("d$x", Role::Output), tensor("t", Role::Temp)};
  bw.kernels = {edge_gemm("m_bw_gemm_t", "y2", "t"), edge_gemm("m_bw_gemm_d_x", "t", "d$x"),
                edge_gemm("m_bw_gemm_d_x_2", "y1", "d$x", true), edge_gemm("m_bw_gemm_d_x_3", "x", "d$x", true)};
  REQUIRE(verify_program(fwt).empty());
  REQUIRE(verify_program(bw).empty());

  const std::vector<passes::RecomputeCandidate> candidates = passes::recompute_candidates(fwt, bw);
  REQUIRE(candidates.size() == 2);
  CHECK(candidates[0].fields == std::vector<std::string>{"y1"});
  CHECK(candidates[1].fields == std::vector<std::string>{"y2"});
  // The estimates the decisions rest on: on typical_graph(2^20), an edge row of 4 floats is 8 * 2^20 * 16 bytes.
  const passes::GraphCounts typical = passes::typical_graph(1 << 20);
  const int64_t row = int64_t{8} * (1 << 20) * 16, weight = 4 * 4 * 4;
  auto peak_with = [&](const std::vector<passes::RecomputeCandidate>& chosen) {
    Program f = fwt, b = bw;
    passes::apply_recompute(f, b, chosen);
    return passes::training_step_peak(f, b, typical);
  };
  CHECK(passes::training_step_peak(fwt, bw, typical) == 5 * row + weight);  // the backward: x, y1, y2, d$x and t
  CHECK(peak_with({candidates[0]}) == 4 * row + weight);
  CHECK(peak_with(candidates) == 4 * row + weight);
  CHECK(peak_with({candidates[1]}) == 5 * row + weight);

  auto run = [&](inter::Recompute mode, Program& f, Program& b) {
    f = fwt;
    b = bw;
    f.decl.options.recompute = mode;
    return passes::recompute_gemms(f, b);
  };
  Program f, b;
  SECTION("auto takes y1, which lowers the peak, and keeps y2 saved, which would not") {
    CHECK(run(inter::Recompute::Auto, f, b) == std::vector<std::string>{"y1"});
    CHECK(f.saved == std::vector<std::string>{"y2"});
    CHECK(b.decl.find_input("y2"));
    CHECK_FALSE(b.decl.find_input("y1"));
    CHECK(gemm_writing(b, "y1"));
    CHECK_FALSE(gemm_writing(b, "y2"));
    CHECK(passes::training_step_peak(f, b, typical) == 4 * row + weight);
    CHECK(verify_program(f) == "");
    CHECK(verify_program(b) == "");
    // Why, in the training forward's notes (printed as comments, parsed back).
    CHECK(f.notes == std::vector<std::string>{
                         fmt::format("recompute-gemms: y1 recomputed by the backward (the step's estimated peak: {} -> {} bytes)",
                                     5 * row + weight, 4 * row + weight),
                         fmt::format("recompute-gemms: y2 saved (recomputing it would not lower the step's estimated peak: "
                                     "{0} -> {0} bytes)", 4 * row + weight)});
    SourceFile file("recompute.intra.ir", print_programs({f, b}));
    Diagnostics diags;
    auto back = parse_programs(file, diags);
    REQUIRE(back);
    CHECK(back->at(0).notes == f.notes);
    CHECK(print_programs(*back) == file.text());
  }
  SECTION("on takes both") {
    CHECK(run(inter::Recompute::On, f, b) == std::vector<std::string>{"y1", "y2"});
    CHECK(f.saved.empty());
    CHECK(gemm_writing(b, "y1"));
    CHECK(gemm_writing(b, "y2"));
    CHECK(f.notes.size() == 2);
  }
  SECTION("off takes none") {
    CHECK(run(inter::Recompute::Off, f, b).empty());
    CHECK(print_program(f) == print_program([&] { Program p = fwt; p.decl.options.recompute = inter::Recompute::Off; return p; }()));
    CHECK(print_program(b) == print_program(bw));
  }
}

TEST_CASE("forward-row-copies and gemm-in-place: RGAT's compact backward holds one pair row of 64 at a time",
          "[intra][pass]") {
  // p["msg"] = p["hs"] in the forward makes d$hs += d$msg in the backward: a pair-sized copy (2.6 GB on wikikg2 in
  // fp32) that was live at the backward's peak beside d$msg and t$sc3; forward-row-copies reads d$msg instead. The
  // input gradient's pair rows d$msg · W^T then go over d$msg, dead after that GEMM (gemm-in-place).
  const std::string spec = std::string(HECTORGEN_SOURCE_DIR) + "/tests/gpu/specs/rgat_compact_reorder.yaml";
  const std::vector<Program> phases = pipeline_programs(spec);
  REQUIRE(phases.size() == 3);
  const Program& bw = phases[2];
  CHECK_FALSE(bw.find("d$hs"));
  CHECK_FALSE(bw.find("t$d$feature$pairs"));
  bool in_place = false;
  for (const Kernel& k : bw.kernels) {
    if (const auto* w = std::get_if<WeightGradInstance>(&k); w && w->x == "feature" && w->rows == Rows::Pairs && w->n == 64)
      CHECK(w->dy == "d$msg");
    if (const auto* g = std::get_if<GemmInstance>(&k); g && g->rows == Rows::Pairs && g->transpose_w)
      in_place = in_place || (g->x == "d$msg" && g->y == "d$msg" && g->tensor_cores);
  }
  CHECK(in_place);
  // On wikikg2's counts the pair tensors add one row of 64 and a few scalars to the backward's estimated peak: three
  // rows before.
  const int64_t pair_row = kWikikg2.pairs * 64 * 4;
  passes::GraphCounts no_pairs = kWikikg2;
  no_pairs.pairs = 0;
  const int64_t pairs_at_peak = passes::peak_bytes(bw, kWikikg2) - passes::peak_bytes(bw, no_pairs);
  CHECK(pairs_at_peak >= pair_row);
  CHECK(pairs_at_peak <= pair_row + 16 * kWikikg2.pairs);
}

TEST_CASE("recompute-gemms: auto leaves RGAT's messages saved and recomputes HGT's, as the estimates on wikikg2 and mag say",
          "[intra][recompute]") {
  // Measured on an H100 (training step, peak): recomputing RGAT's hs never lowered its peak (its forward's attention
  // kernel and its backward's hold it anyway) and cost 15% of the step; recomputing HGT's message lowered its peak by
  // 5 to 35%. The estimate on the graphs' own counts says the same, and auto (deciding on a typical graph) follows it.
  // RGAT's ht (reorder off) is read only by d$w_t's weight gradient: recomputed where that lowers the estimate.
  const std::pair<const char*, passes::GraphCounts> graphs[] = {{"wikikg2", kWikikg2}, {"mag", kMag}};
  for (const char* materialization : {"vanilla", "compact"}) {
    CAPTURE(materialization);
    const std::vector<Program> off = pipeline_programs(spec_path("rgat.yaml"), "off", materialization),
                               on = pipeline_programs(spec_path("rgat.yaml"), "on", materialization),
                               automatic = pipeline_programs(spec_path("rgat.yaml"), "auto", materialization);
    CHECK(contains(off[1].saved, "hs"));
    CHECK(contains(automatic[1].saved, "hs"));
    CHECK_FALSE(gemm_writing(automatic[2], "hs"));
    CHECK_FALSE(contains(on[1].saved, "hs"));
    for (const auto& [graph, counts] : graphs) {
      CAPTURE(graph);
      CHECK(training_peak(on, counts) >= training_peak(automatic, counts));
      CHECK(training_peak(automatic, counts) <= training_peak(off, counts));
    }
    const std::vector<Program> hgt_off = pipeline_programs(spec_path("hgt.yaml"), "off", materialization),
                               hgt = pipeline_programs(spec_path("hgt.yaml"), "auto", materialization);
    const std::vector<std::string> fields = materialization == std::string("compact")
                                                ? std::vector<std::string>{"lin$k", "msg"}
                                                : std::vector<std::string>{"msg"};
    for (const std::string& f : fields) {
      CAPTURE(f);
      CHECK(contains(hgt_off[1].saved, f));
      CHECK_FALSE(contains(hgt[1].saved, f));
      CHECK(gemm_writing(hgt[2], f));
    }
    for (const auto& [graph, counts] : graphs) {
      CAPTURE(graph);
      CHECK(training_peak(hgt, counts) < training_peak(hgt_off, counts));
    }
  }
}

// The static estimates of docs/architecture.md ("Memory plan"): run `hectorgen_tests "[estimate]"`.
TEST_CASE("recompute-gemms: static peaks of HGT and RGAT training on wikikg2's and mag's counts", "[.][estimate]") {
  const std::pair<const char*, passes::GraphCounts> graphs[] = {{"wikikg2", kWikikg2}, {"mag", kMag}};
  std::cout << "static peak (GiB): training forward / backward and the step (passes::training_step_peak), recompute "
               "off -> on -> auto\n";
  for (const char* model : {"hgt.yaml", "rgat.yaml"})
    for (const char* materialization : {"vanilla", "compact"}) {
      std::vector<std::vector<Program>> modes;
      for (const char* mode : {"off", "on", "auto"}) modes.push_back(pipeline_programs(spec_path(model), mode, materialization));
      for (const auto& [graph, counts] : graphs) {
        std::string row = fmt::format("{:9s} {:8s} {:8s}", model, materialization, graph);
        for (size_t m = 0; m < modes.size(); ++m) {
          auto gib = [&](int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); };
          row += fmt::format("{} {:5.1f} / {:5.1f} (step {:5.1f})", m == 0 ? " " : " ->", gib(passes::peak_bytes(modes[m][1], counts)),
                             gib(passes::peak_bytes(modes[m][2], counts)), gib(training_peak(modes[m], counts)));
        }
        std::cout << row << "\n";
      }
    }
}

TEST_CASE("fuse-loops: weight gradients of an input that needs no gradient stay GEMM-template instances",
          "[intra][fuse]") {
  // Without the input's gradient (requires_grad: false) the backward's edge loop that accumulates d$W's outer
  // products has no transposed linear beside it; fusing it into a node loop's edge loop made lowering give up and
  // run the outer products in a PyTorch fallback over [edges, 64, 64].
  for (const char* model : {"rgcn", "rgat", "hgt"}) {
    CAPTURE(model);
    std::string text = read_file(spec_path(fmt::format("{}.yaml", model)));
    const std::string plain = "feature: {per: node, shape: [in_dim]}";
    const size_t at = text.find(plain);
    REQUIRE(at != std::string::npos);
    text.replace(at, plain.size(), "feature: {per: node, shape: [in_dim], requires_grad: false}");
    const auto path = std::filesystem::temp_directory_path() / fmt::format("hg_no_input_grad_{}.yaml", model);
    std::ofstream(path) << text;
    const std::vector<Program> programs = pipeline_programs(path.string());
    std::filesystem::remove(path);
    const Program& bw = programs[2];
    size_t wgrads = 0;
    for (const Kernel& k : bw.kernels) {
      CHECK_FALSE(std::holds_alternative<TorchInstance>(k));
      wgrads += std::holds_alternative<WeightGradInstance>(k);
    }
    CHECK(wgrads >= 1);
  }
}
