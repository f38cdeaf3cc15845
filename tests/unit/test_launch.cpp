// Launch limits: schedule checks, the launch configuration of every kernel kind, the verifier on instances that
// violate each limit, and the shape limits of lowered programs.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "emit/emit.h"
#include "helpers.h"
#include "ir/inter/verifier.h"
#include "ir/intra/launch.h"
#include "passes/passes.h"

using namespace hectorgen;
using namespace hectorgen::test;
using intra::Kernel;
using intra::LaunchConfig;
using intra::ScheduleKey;

namespace {

// rows x k -> rows x (heads * n) through a per-edge-type weight, the tensors a GEMM, a weight gradient and a
// segment sum over edges read and write.
intra::Program program(int64_t heads, int64_t k, int64_t n) {
  intra::Program p;
  p.model = "m";
  using inter::Per;
  p.tensors = {{"x", intra::Role::Input, Per::Edge, {heads, k}, false, ""},
               {"w", intra::Role::Weight, Per::Etype, {heads, k, n}, false, ""},
               {"y", intra::Role::Output, Per::Edge, {heads, n}, false, ""},
               {"v", intra::Role::Temp, Per::Edge, {heads, n}, false, ""},
               {"d_w", intra::Role::Output, Per::Etype, {heads, k, n}, false, ""},
               {"d_v", intra::Role::Output, Per::Etype, {heads, n}, false, ""}};
  p.layouts = {intra::layout::kSortedCoo};
  return p;
}

Kernel gemm(int64_t heads, int64_t k, int64_t n, int tile = 16, int coarsen = 1) {
  intra::GemmInstance g;
  g.name = "m_gemm";
  g.x = "x";
  g.w = "w";
  g.y = "y";
  g.rows = intra::Rows::Edges;
  g.segments = intra::Segments::Etype;
  g.heads = heads;
  g.k = k;
  g.n = n;
  g.tile = tile;
  g.coarsen = coarsen;
  return Kernel{g};
}

Kernel wgrad(int64_t heads, int64_t k, int64_t n, intra::WgradKernel kernel = intra::WgradKernel::Simt) {
  intra::WeightGradInstance w;
  w.name = "m_wgrad";
  w.x = "x";
  w.dy = "y";
  w.dw = "d_w";
  w.rows = intra::Rows::Edges;
  w.segments = intra::Segments::Etype;
  w.heads = heads;
  w.k = k;
  w.n = n;
  w.kernel = kernel;
  return Kernel{w};
}

Kernel segsum(int64_t numel) {
  intra::SegmentSumInstance s;
  s.name = "m_segsum";
  s.v = "v";
  s.dw = "d_v";
  s.rows = intra::Rows::Edges;
  s.segments = intra::Segments::Etype;
  s.numel = numel;
  return Kernel{s};
}

// A traversal over the edges whose body loads a row spread over the lanes (a warp per edge), or, with `scalar`,
// held whole by each lane (a thread per edge).
Kernel traversal(int threads, bool scalar = false) {
  intra::TraversalInstance t;
  t.name = "m_edges";
  t.rows = inter::LoopKind::Edges;
  t.row = "e";
  t.threads = threads;
  intra::Def d;
  d.name = "v_x";
  d.type = intra::RegType{{1, 64}, scalar ? intra::LaneLayout::Replicated : intra::LaneLayout::Lanes};
  d.source = intra::Load{"x", "e"};
  t.body.push_back(intra::Instr{d});
  return Kernel{t};
}

std::string verify(const Kernel& k, int64_t heads = 1, int64_t kk = 64, int64_t n = 64) {
  intra::Program p = program(heads, kk, n);
  p.kernels.push_back(k);
  return intra::verify_program(p);
}

bool has_problem(const inter::Schedule& s, ScheduleKey key, const std::string& text) {
  for (const auto& pr : intra::check_schedule(s))
    if (pr.key == key && pr.message.find(text) != std::string::npos) return true;
  return false;
}

// A valid configuration: 256 threads, a grid well inside the limits, no shared memory.
LaunchConfig valid_config() {
  LaunchConfig c;
  c.threads = 256;
  c.x.rows_per_block = 8;
  c.y = intra::GridExtent::constant(4);
  c.z = intra::GridExtent::constant(1);
  return c;
}

}  // namespace

TEST_CASE("every schedule in the supported grid is accepted, with launch bounds up to what fits", "[launch][schedule]") {
  int accepted = 0;
  for (int tile : intra::kGemmTiles)
    for (int coarsen : intra::kGemmCoarsenings)
      for (int threads = 32; threads <= 1024; threads += 32) {
        inter::Schedule s{tile, coarsen, threads, std::nullopt};
        const int64_t block = static_cast<int64_t>(tile) * tile / coarsen;
        if (block > 1024) {
          CHECK(has_problem(s, ScheduleKey::Tile, "more than the 1024"));
          continue;
        }
        CHECK(intra::check_schedule(s).empty());
        const int64_t fit = std::min<int64_t>(32, 2048 / block);
        s.launch_bounds = static_cast<int>(fit);
        CHECK(intra::check_schedule(s).empty());
        s.launch_bounds = static_cast<int>(fit + 1);
        CHECK(has_problem(s, ScheduleKey::LaunchBounds, fit == 32 ? "from 1 to 32" : "at most"));
        ++accepted;
      }
  CHECK(accepted == 10 * 32);  // tile 64 takes coarsening 4 only
}

TEST_CASE("schedule values that can never launch are problems at the value at fault", "[launch][schedule]") {
  CHECK(has_problem({24, 1, 256, std::nullopt}, ScheduleKey::Tile, "must be 8, 16, 32 or 64, got 24"));
  CHECK(has_problem({16, 3, 256, std::nullopt}, ScheduleKey::Coarsen, "must be 1, 2 or 4, got 3"));
  CHECK(has_problem({16, 0, 256, std::nullopt}, ScheduleKey::Coarsen, "got 0"));
  CHECK(has_problem({64, 1, 256, std::nullopt}, ScheduleKey::Tile, "4096 threads"));
  CHECK(has_problem({64, 2, 256, std::nullopt}, ScheduleKey::Tile, "use 'coarsen: 4'"));
  CHECK(has_problem({32, 1, 256, 4}, ScheduleKey::LaunchBounds, "at most 2 such blocks"));
  CHECK(has_problem({16, 1, 256, 0}, ScheduleKey::LaunchBounds, "from 1 to 32"));
  CHECK(has_problem({16, 1, 48, std::nullopt}, ScheduleKey::TraversalThreads, "multiple of 32"));
  CHECK(has_problem({16, 1, 2048, std::nullopt}, ScheduleKey::TraversalThreads, "got 2048"));
  CHECK(has_problem({16, 1, 0, std::nullopt}, ScheduleKey::TraversalThreads, "got 0"));
  for (int batch : {0, 3, 16, -4})
    CHECK(has_problem({16, 1, 256, std::nullopt, batch}, ScheduleKey::TraversalEdgeBatch,
                      fmt::format("must be 1, 2, 4 or 8, got {}", batch)));
  for (int batch : {1, 2, 4, 8}) CHECK(intra::check_schedule({16, 1, 256, std::nullopt, batch}).empty());
}

TEST_CASE("launch configurations of each kernel kind", "[launch]") {
  intra::Program p = program(1, 64, 64);
  SECTION("GEMM: row tiles (one extra per segment, at most the rows) x column tiles x heads") {
    LaunchConfig c = intra::launch_config(p, gemm(2, 64, 100, 32, 4));
    CHECK(c.threads == 256);
    CHECK(c.static_shared_bytes == 2 * 32 * 33 * 4);
    CHECK(c.x.at(1000, 3) == 1000 / 32 + 1 + 3);
    CHECK(c.x.at(2, 3) == 2);  // never more tiles than rows
    CHECK(c.y.fixed == 4);
    CHECK(c.z.fixed == 2);
    CHECK_FALSE(c.fold_yz);
    CHECK(c.x.expr("a.num_edges", "a.num_etypes") ==
          "static_cast<unsigned>(std::min<int64_t>((a.num_edges + 32 - 1) / 32 + a.num_etypes, a.num_edges))");
  }
  SECTION("GEMM: more than 65535 column tiles fold over y and z") {
    LaunchConfig c = intra::launch_config(p, gemm(1, 16, 16777216));
    CHECK(c.fold_yz);
    CHECK(c.y.fixed == 65535);
    CHECK(c.y.fixed * c.z.fixed >= 16777216 / 16);
    CHECK(c.z.fixed <= 65535);
  }
  SECTION("GEMM: more than 65535 heads fold too") {
    LaunchConfig c = intra::launch_config(p, gemm(100000, 4, 4));
    CHECK(c.fold_yz);
    CHECK(c.y.fixed * c.z.fixed >= 100000);
  }
  SECTION("weight gradient: (chunks + segments) x dW tiles x heads over x, as the runtime's split-K launchers") {
    // 64 x 48 per head: one 64 x 64 tile, 2 heads: 2 blocks per chunk, 1024 chunks at most plus one per segment.
    LaunchConfig c = intra::launch_config(p, wgrad(2, 64, 48));
    CHECK(c.threads == 256);
    CHECK(c.static_shared_bytes == 2 * 32 * 68 * 4);
    CHECK(c.x.at(1, 7) == 2 * (1024 + 7));
    CHECK(c.x.largest() == 2147483647);  // the launcher refuses more
    CHECK(c.y.largest() == 1);
    LaunchConfig t = intra::launch_config(p, wgrad(1, 128, 64, intra::WgradKernel::TensorCore));
    CHECK(t.threads == 128);
    CHECK(t.static_shared_bytes == 2 * 2 * 32 * 72 * 4);  // fp32 storage (tf32): a 2-stage ring
    CHECK(t.x.at(1, 1) == 2 * (1024 + 1));
  }
  SECTION("segment sum: row chunks (at least 128 rows, one partial chunk per segment) over x, 32 columns over y") {
    LaunchConfig c = intra::launch_config(p, segsum(64));
    CHECK(c.threads == 256);
    CHECK(c.x.at(1000, 7) == 8 + 7);
    CHECK(c.x.at(3, 7) == 3);  // never more chunks than rows
    CHECK(c.x.largest() == 2147483646);
    CHECK(c.y.fixed == 2);
    CHECK(intra::launch_config(p, segsum(int64_t{1} << 30)).y.fixed == 65535);  // slices past it taken in turns
  }
  SECTION("traversal: one warp per row") {
    LaunchConfig c = intra::launch_config(p, traversal(1024));
    CHECK(c.x.at(100, 1) == 4);
    CHECK(c.x.largest() == (int64_t{2147483646} + 31) / 32);
    CHECK(c.x.expr("a.num_edges", "a.num_etypes") == "static_cast<unsigned>((a.num_edges + 32 - 1) / 32)");
  }
  SECTION("traversal of scalar work: one thread per row") {
    LaunchConfig c = intra::launch_config(p, traversal(256, /*scalar=*/true));
    CHECK(c.x.at(1000, 1) == 4);
    CHECK(c.x.expr("a.num_edges", "a.num_etypes") == "static_cast<unsigned>((a.num_edges + 256 - 1) / 256)");
  }
}

TEST_CASE("the launch-limit check catches each violated limit", "[launch][verifier]") {
  CHECK(intra::check_launch_limits(valid_config()).empty());
  LaunchConfig c = valid_config();
  SECTION("threads per block") {
    c.threads = 1025;
    CHECK(intra::check_launch_limits(c).find("1025 threads per block") != std::string::npos);
    c.threads = 0;
    CHECK(intra::check_launch_limits(c).find("0 threads per block") != std::string::npos);
  }
  SECTION("static shared memory") {
    c.static_shared_bytes = 48 * 1024 + 4;
    CHECK(intra::check_launch_limits(c).find("static shared memory") != std::string::npos);
  }
  SECTION("grid x as a function of the rows") {
    c.x.rows_per_block = 1;
    c.x.per_segment = 1;  // rows + segments exceeds 2^31 - 1 for the largest graph
    CHECK(intra::check_launch_limits(c).find("grid x") != std::string::npos);
    c.x.at_most_rows = true;
    CHECK(intra::check_launch_limits(c).empty());
  }
  SECTION("grid y and z") {
    c.y = intra::GridExtent::constant(65536);
    CHECK(intra::check_launch_limits(c).find("grid y reaches 65536") != std::string::npos);
    c.y = intra::GridExtent{0, 1, 0, 0, false};  // one block per segment, uncapped
    CHECK(intra::check_launch_limits(c).find("grid y") != std::string::npos);
    c.y.cap = 65535;
    CHECK(intra::check_launch_limits(c).empty());
    c.z = intra::GridExtent::constant(0);
    CHECK(intra::check_launch_limits(c).find("grid z is empty") != std::string::npos);
  }
  SECTION("__launch_bounds__: resident blocks, their threads, their shared memory") {
    c.min_blocks_per_sm = 33;
    CHECK(intra::check_launch_limits(c).find("33 resident blocks per multiprocessor") != std::string::npos);
    c.min_blocks_per_sm = 9;  // 9 x 256 threads > 2048
    CHECK(intra::check_launch_limits(c).find("of 256 threads") != std::string::npos);
    c.min_blocks_per_sm = 4;
    c.static_shared_bytes = 41 * 1024;  // 4 x 42 KiB > 164 KiB
    CHECK(intra::check_launch_limits(c).find("42 KiB of shared memory") != std::string::npos);
    c.min_blocks_per_sm = 3;
    CHECK(intra::check_launch_limits(c).empty());
  }
}

TEST_CASE("the intra verifier rejects kernel instances that cannot launch", "[launch][verifier]") {
  // Two heads: the SIMT template (the tensor-core kernel takes one), whose tile and coarsening set the block.
  auto simt = [](const Kernel& k) { return verify(k, 2, 64, 64); };
  CHECK(simt(gemm(2, 64, 64)).empty());
  CHECK(simt(gemm(2, 64, 64, 64, 4)).empty());
  CHECK(simt(gemm(2, 64, 64, 64, 1)).find("m_gemm: 4096 threads per block") != std::string::npos);
  CHECK(simt(gemm(2, 64, 64, 24, 1)).find("tile 24") != std::string::npos);
  CHECK(simt(gemm(2, 64, 64, 16, 3)).find("coarsening 3") != std::string::npos);
  CHECK(simt(gemm(2, 64, 64, 16, 0)).find("0 threads per block") != std::string::npos);
  Kernel bounded = gemm(2, 64, 64, 32, 1);
  std::get<intra::GemmInstance>(bounded).launch_bounds = 3;
  CHECK(simt(bounded).find("3 resident blocks of 1024 threads") != std::string::npos);
  // One head of 64 x 64: the tensor-core kernel, which the instance must name (every dtype, fp32 as 3xTF32).
  CHECK(verify(gemm(1, 64, 64)).find("m_gemm: kernel=simt, but the instance fits the tensor-core kernel") !=
        std::string::npos);
  Kernel tc = gemm(1, 64, 64);
  std::get<intra::GemmInstance>(tc).tensor_cores = true;
  CHECK(verify(tc).empty());
  CHECK(verify(wgrad(1, 64, 64)).empty());
  CHECK(verify(wgrad(1, 64, 64, intra::WgradKernel::TensorCore)).empty());
  CHECK(simt(wgrad(2, 64, 64, intra::WgradKernel::TensorCore)).find("m_wgrad: kernel=tc") != std::string::npos);
  CHECK(verify(segsum(64)).empty());
  CHECK(verify(traversal(256)) == "");
  CHECK(verify(traversal(256, /*scalar=*/true)) == "");
  CHECK(verify(traversal(2048)).find("2048 threads per block") != std::string::npos);
  CHECK(verify(traversal(48)).find("whole number of warps") != std::string::npos);
  // Wide rows and many heads: folded or strided, still launchable.
  CHECK(verify(gemm(1, 16, 16777216), 1, 16, 16777216).empty());
  CHECK(verify(wgrad(1, 16777216, 16), 1, 16777216, 16).empty());
  CHECK(verify(gemm(65536, 2, 2), 65536, 2, 2).empty());
  // Grids derived from shapes beyond 2^31 elements per row (the verifier calls them out before any kernel).
  CHECK(verify(segsum(64), 1, 65536, 65536).find("elements per row") != std::string::npos);
  CHECK(intra::verify_launch(program(1, 1, 1), segsum(int64_t{1} << 31)).empty());  // column slices strided over y
  CHECK(intra::verify_launch(program(1, 1, 1), wgrad(int64_t{1} << 16, int64_t{1} << 13, int64_t{1} << 13))
            .find("m_wgrad: grid x reaches 2147483648 blocks for one segment") != std::string::npos);
  CHECK(intra::verify_launch(program(1, 1, 1), gemm(int64_t{1} << 24, 1, int64_t{1} << 24)).find("grid z") !=
        std::string::npos);
}

namespace {

std::string lower_forward(const std::string& text, intra::Program* out = nullptr) {
  auto c = compile_text("spec.yaml", text);
  INFO(c->rendered());
  REQUIRE(c->module);
  inter::Module fused = passes::fuse_loops(*c->module);
  Diagnostics d;
  REQUIRE(inter::verify(fused, d));
  auto p = passes::lower(fused, d, "forward");  // checks the shape limits
  std::ostringstream s;
  d.render(s);
  if (!p) return s.str();
  CHECK(intra::verify_program(*p).empty());
  if (out) *out = *p;
  return s.str();
}

}  // namespace

TEST_CASE("shape limits: wide GEMM rows fold, traversal rows above 16384 elements are positioned errors", "[launch][shapes]") {
  const std::string rgat = read_file(spec_path("rgat.yaml"));
  CHECK(lower_forward(rgat).empty());
  CHECK(lower_forward(replace(rgat, "out_dim: 64", "out_dim: 16384")).empty());
  std::string err = lower_forward(replace(rgat, "out_dim: 64", "out_dim: 16385"));
  CHECK(err.find("error: 'hs' has rows of 16385 elements") != std::string::npos);
  CHECK(err.find("[row-too-wide]") != std::string::npos);
  CHECK(err.find("spec.yaml:17:") != std::string::npos);  // h: {per: node, shape: [heads, out_dim]}, at out_dim

  const std::string wide =
      "model: wide\n"
      "hyper: {in_dim: 16, out_dim: 16777216}\n"
      "inputs:\n"
      "  feature: {per: node, shape: [in_dim]}\n"
      "weights:\n"
      "  W0: {per: none, shape: [in_dim, out_dim]}\n"
      "outputs:\n"
      "  h: {per: node, shape: [out_dim]}\n"
      "program: |\n"
      "  for n in g.dst_nodes():\n"
      "      n[\"h\"] = n.feature * W0\n";
  intra::Program p;
  CHECK(lower_forward(wide, &p).empty());
  std::string cu = emit::emit_kernels_cu({p}, emit::EmitContext{"spec", "test"});
  CHECK(cu.find("constexpr int64_t kColTiles = 1048576;") != std::string::npos);
  CHECK(cu.find("const dim3 grid(static_cast<unsigned>((a.num_nodes + 16 - 1) / 16), 65535, 17);") != std::string::npos);
}
