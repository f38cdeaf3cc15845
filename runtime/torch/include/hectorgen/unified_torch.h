// libtorch binding of unified tensors (hectorgen/unified.h): CPU tensors whose storage is pinned, GPU-mapped host
// memory, their zero-copy CUDA aliases, and the gathers that bring their rows to the GPU. The Python API
// (hectorgen_runtime.unified) checks arguments and raises the documented exceptions; the checks here are a
// backstop (c10::Error).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hectorgen::runtime {

// A CPU tensor of `sizes` and `dtype`, contiguous, on memory from the unified pool (returned when the storage dies).
at::Tensor unified_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype);

// Maps the whole storage of the CPU tensor `t` for the GPU in place (cudaHostRegister), unless it already is; the
// mapping is undone when the storage dies. Returns true when this call pinned it. Throws unified::NotPinnable.
bool unified_pin(const at::Tensor& t);

// Whether every byte of the CPU tensor `t` is GPU-mapped host memory (the pool's, or pinned).
bool unified_is_mapped(const at::Tensor& t);

// A CUDA tensor on `device` aliasing the GPU-mapped CPU tensor `t` (same sizes, strides and bytes; no copy). It
// keeps t's storage alive; GPU work on it reads and writes host memory over PCIe.
at::Tensor unified_cuda_view(const at::Tensor& t, int64_t device);

// Zero-copy gather on the current stream of out's device: out[positions[i]] = table[index[i]] (out[i] without
// positions). table: contiguous GPU-mapped CPU tensor [N, ...]; index: 1-D int32/int64 CUDA; positions: int64
// CUDA or none; out: contiguous [count, ...] of table's dtype, CUDA or GPU-mapped CPU. error: int64 CUDA [1] into
// which the lowest out row with an index outside [0, N) is min'ed (as an unsigned word; -1 = none); those rows
// are zero-filled.
void unified_gather(const at::Tensor& table, const at::Tensor& index, const std::optional<at::Tensor>& positions,
                    const at::Tensor& out, const at::Tensor& error);

// CPU gather + DMA, pipelined: the rows of table[index] are copied by the CPU threads into pinned staging chunks of
// about chunk_bytes, each chunk copied to `out` (CUDA, contiguous) on the current stream while the next is gathered.
// index: 1-D int32/int64 CPU. Returns once the data is on the GPU: -1, or the lowest position whose index is
// outside [0, N) (those rows are zero-filled).
int64_t unified_gather_cpu(const at::Tensor& table, const at::Tensor& index, const at::Tensor& out,
                           int64_t chunk_bytes);

// How the zero-copy gather reads a table with rows of row_bytes at `table` into `out` (lanes per row, store
// width, blocks), for reports.
std::map<std::string, int64_t> unified_gather_plan(const at::Tensor& table, const at::Tensor& out);

// The pool: reserved_bytes, in_use_bytes, chunks, source_allocations, source_releases, largest_free_block.
std::map<std::string, int64_t> unified_pool_stats();
int64_t unified_trim_pool();
void unified_set_pool_limit(int64_t bytes);

}  // namespace hectorgen::runtime
