// Host-side sizes of the grouped kernels' per-call bookkeeping (hectorgen/segments.cuh has the kernels): grid
// and workspace bounds computed from row and segment counts alone, so host code sizes its workspaces without
// reading anything back from the GPU. Plain C++17: generated host code (.cpp) includes it.
#pragma once

#include <algorithm>
#include <cstdint>

namespace hectorgen {

// Upper bound of the tile count, for grids sized without reading tile_ptr back: each segment adds at most one
// partial tile to ceil(rows / tile_rows).
inline int64_t max_segment_tiles(int64_t num_rows, int num_segments, int tile_rows) {
  return (num_rows + tile_rows - 1) / tile_rows + num_segments;
}

// The weight gradient's fixed split-K partition: chunk_rows depends only on the row count and the number of
// blocks per chunk (dW tiles x heads), never on the GPU, so gradients are bit-identical across runs and
// devices. A multiple of 32 rows, at least 128, aiming at about kWgradTargetBlocks blocks (several waves of an
// H100's 132 SMs).
constexpr int64_t kWgradTargetBlocks = 2048;
constexpr int64_t kMaxGridX = 2147483647;  // blocks along grid x (2^31 - 1)
inline int wgrad_chunk_rows(int64_t num_rows, int blocks_per_chunk) {
  const int64_t target_chunks = std::max<int64_t>(1, kWgradTargetBlocks / std::max(1, blocks_per_chunk));
  const int64_t rows = (num_rows + target_chunks - 1) / target_chunks;
  return static_cast<int>(std::max<int64_t>(128, (rows + 31) / 32 * 32));
}

// Chunk size of a segment sum of `numel` columns: wgrad_chunk_rows with one block per 32 columns.
inline int segment_sum_chunk_rows(int64_t num_rows, int64_t numel) {
  return wgrad_chunk_rows(num_rows, static_cast<int>((numel + 31) / 32));
}

// Upper bound of the chunk count, for the grid and the partials' workspace.
// (Its product with the blocks per chunk must stay within kMaxGridX, grid x's limit: the launchers check.)
inline int64_t wgrad_max_chunks(int64_t num_rows, int num_segments, int chunk_rows) {
  return max_segment_tiles(num_rows, num_segments, chunk_rows);
}

}  // namespace hectorgen
