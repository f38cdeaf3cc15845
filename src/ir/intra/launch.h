// Launch geometry of the kernel instances and the device limits it must respect on every target (sm_80, sm_90).
//
// Each kernel instance has one launch configuration: threads per block, a grid whose sizes are functions of
// the graph (rows: its nodes or edges; segments: its edge or node types), static shared memory and the GEMM's
// __launch_bounds__ minimum of resident blocks. The CUDA emitter prints the launchers from it; the intra
// verifier (verify_launch) checks it for the largest graph the runtime accepts, so that an emitter bug is an
// internal error, never a kernel that cannot launch; and the two checks below turn what a spec can get wrong
// (its schedule, its shapes) into positioned diagnostics.
//
//   kernel      threads            grid x                               grid y                 grid z
//   GEMM        tile^2 / coarsen   row tiles (+1 per segment, <= rows)  column tiles (*)       heads (*)
//   wgrad (**)  128 (tc), 256      (chunks + segments) x dW tiles x heads  1                   1
//   segsum      256                row chunks (+1 per segment)          min(dW elements / 32, 65535)  1
//   traversal   schedule threads   rows / warps per block               1                      1
//   (*) numbered linearly over y and z when either exceeds 65535; segments past 65535 are taken in turns by
//       the blocks of y (a block-stride loop in the kernel).
//   (**) the partial-sums kernel of the split-K weight gradient (hectorgen/simt_wgrad.cuh, tc_gemm.cuh): chunks of
//       hectorgen::wgrad_chunk_rows rows, about 2048 / (dW tiles x heads) of them, plus one partial chunk per
//       segment; the runtime computes this grid itself and refuses one past 2^31 - 1 blocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "diag/diagnostics.h"
#include "ir/intra/intra.h"

namespace hectorgen::intra {

// Limits shared by sm_80 and sm_90 (CUDA C++ Programming Guide, "Technical Specifications per Compute
// Capability"); where the two differ, the smaller.
namespace limits {
inline constexpr int64_t kThreadsPerBlock = 1024;
inline constexpr int64_t kGridX = 2147483647;  // 2^31 - 1
inline constexpr int64_t kGridYZ = 65535;
inline constexpr int64_t kStaticSharedBytes = 48 * 1024;  // per block; more needs dynamic shared memory
inline constexpr int64_t kThreadsPerSm = 2048;
inline constexpr int64_t kBlocksPerSm = 32;
inline constexpr int64_t kSharedBytesPerSm = 164 * 1024;        // sm_80 (sm_90: 228 KiB)
inline constexpr int64_t kSharedBytesReservedPerBlock = 1024;  // taken by the system for each resident block
inline constexpr int64_t kWarp = 32;
// The runtime's graph contract (runtime/include/hectorgen/graph.h): node, edge and type counts below INT32_MAX.
inline constexpr int64_t kMaxRows = 2147483646;
inline constexpr int64_t kMaxSegments = 2147483646;
// Elements of one row or weight slice: below 2^31, so that rows x elements stays far inside int64 index math,
// and every grid dimension derived from a shape (dW elements, dW tiles, column tiles x heads) fits.
inline constexpr int64_t kRowElements = 2147483647;
// A traversal holds each row it works on in registers, spread over the 32 lanes of a warp: 16384 elements
// are 512 registers per lane, already spilled to local memory; wider rows make nvcc's compile time explode
// (a 16M-element row does not compile within hours) and soon exceed the 512 KiB of local memory per thread.
inline constexpr int64_t kTraversalRowElements = 16384;
}  // namespace limits

// One grid dimension as a function of the graph:
//   min(cap, fixed + per_segment * segments + ceil(rows / rows_per_block)), and at most `rows` if at_most_rows
// (a count of row tiles over segments never exceeds the rows). Zero fields are absent terms; cap 0: no cap.
struct GridExtent {
  int64_t fixed = 0;
  int64_t per_segment = 0;
  int64_t rows_per_block = 0;
  int64_t cap = 0;
  bool at_most_rows = false;

  static GridExtent constant(int64_t n) { return GridExtent{n, 0, 0, 0, false}; }
  int64_t at(int64_t rows, int64_t segments) const;
  // The largest value over every graph the runtime accepts (each term grows with rows and segments).
  int64_t largest() const { return at(limits::kMaxRows, limits::kMaxSegments); }
  bool is_constant() const { return per_segment == 0 && rows_per_block == 0; }
  // The C++ expression a launcher passes to dim3, given its expressions for the rows and the segments.
  std::string expr(const std::string& rows, const std::string& segments) const;
};

struct LaunchConfig {
  int64_t threads = 0;
  GridExtent x, y, z;
  int64_t static_shared_bytes = 0;
  int min_blocks_per_sm = 0;  // the second __launch_bounds__ argument; 0: none
  // GEMM: column tiles and heads are numbered linearly over grid y and z (one of them exceeds 65535).
  bool fold_yz = false;
};

// The launch configuration of a kernel instance (Gemm, WeightGrad, SegmentSum, Traversal; not Torch).
LaunchConfig launch_config(const Program& p, const Kernel& k);

// Checks a launch configuration against the limits above for every graph the runtime accepts: threads and static
// shared memory per block, each grid dimension, and what __launch_bounds__ asks of a multiprocessor (resident
// blocks, their threads and their shared memory). Returns the violated limit, empty if none.
std::string check_launch_limits(const LaunchConfig& c);

// check_launch_limits on a kernel's configuration, and what its template assumes of it (whole warps for a
// traversal, a supported tile and coarsening, a grid covering every tile); returns the problem prefixed with
// the kernel's name, empty if the kernel can always be launched. Part of verify_program.
std::string verify_launch(const Program& p, const Kernel& k);

// ---- gather sums: how a row spreads over a warp ---------------------------------------------------------------
// The layout of a gather sum that splits its row's entries over groups of lanes (gather_sum_split.cu.in): runs of
// `run` consecutive elements (the largest power of two up to the schedule's vector that divides the row), as few
// lanes a group as hold a row in one run each (at most 32), and 32 / group_lanes groups. With `few_entries` (a
// node's pairs: a few per row, where a row of a pair's edges has many, compaction being chosen where pairs are
// few) a row of 32 elements or more keeps a single group, whose runs span the warp: the groups' butterfly would
// cost more than the extra entries in flight save (H200, HGT's bw_sum_d_v on mag: 0.59 ms in 2-byte loads a lane,
// 0.70 ms in 4 groups of 8).
struct SplitLayout {
  int run = 1, group_lanes = 32, runs_per_lane = 1;
};
SplitLayout split_layout(int64_t numel, int vector, bool few_entries);

// The rows variant of a gather sum (gather_sum_rows.cu.in, <name>_rows): each of a warp's `row_groups` groups of
// lanes takes a row of its own. The launcher runs it when the rows average fewer than `below` entries (entries <
// below * rows); below 0: the kernel has none (rows over fewer than 32 lanes, edge batches, one group a warp, or
// group_rows_below 0). The CUDA emitter renders and launches it, the cost model counts its rows (emit/cost.h).
struct GatherSumRows {
  int below = 0;
  int row_groups = 1;
};
GatherSumRows gather_sum_rows(const GatherSumInstance& s);

// ---- what a spec can get wrong -----------------------------------------------------------------------------
enum class ScheduleKey { Tile, Coarsen, LaunchBounds, TraversalThreads, TraversalEdgeBatch, TraversalRowLanes, TraversalVector, TraversalPositionIndices, GatherSumRowLanes, GatherSumGroupRowsBelow };
struct ScheduleProblem {
  ScheduleKey key;  // the value to point at
  std::string message;
};
// The message of a schedule.gather_sum.group_rows_below outside auto and 0 to 1024.
std::string group_rows_below_problem(int value);
inline constexpr int kGemmTiles[] = {8, 16, 32, 64};
inline constexpr int kGemmCoarsenings[] = {1, 2, 4};

// Every value and combination of `s` that would give a kernel no device can launch (tiles outside the
// supported set, coarsening that does not divide the tile, blocks of more than 1024 threads, traversal
// blocks of partial warps, __launch_bounds__ that cannot fit a multiprocessor). Empty if `s` is valid.
std::vector<ScheduleProblem> check_schedule(const inter::Schedule& s);

// Shape-dependent limits of a lowered program (a row or weight slice of 2^31 elements or more; a traversal
// over rows wider than limits::kTraversalRowElements, found in the loop nests its traversal instances were
// lowered from), as errors at the statement or declaration at fault. Returns false if it reported an error.
bool check_shape_limits(const Program& p, const std::vector<TraversalSource>& traversals, Diagnostics& diags);

}  // namespace hectorgen::intra
