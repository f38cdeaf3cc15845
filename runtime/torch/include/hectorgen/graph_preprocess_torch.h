// libtorch binding of the graph preprocessing runtime (hectorgen/graph.h): builds the layouts that a generated
// module needs from a typed COO graph given as CUDA tensors, on the current CUDA stream, with temporaries and
// results allocated through PyTorch's caching allocator.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace hectorgen::runtime {

// Layout names accepted by preprocess(), and the result keys each one produces (all int32 except
// inv_relation_in_degree, which is float32). Positions p refer to the etype-sorted edge order.
//
//   "etype_sorted_coo"        perm [E], sorted_src [E], sorted_dst [E], sorted_etype [E], etype_ptr [R+1]
//   "csr_by_dst"              in_row_ptr [N+1], in_col_src [E], in_col_eid [E], in_col_etype [E]
//   "csr_by_src"              out_row_ptr [N+1], out_col_dst [E], out_col_eid [E], out_col_etype [E]
//   "compact_src_etype"       unique_src [U], unique_src_etype_ptr [R+1], edge_to_unique_src [E],
//                             unique_src_edge_ptr [U+1], unique_src_edge_eid [E] (pair -> edges CSR),
//                             unique_src_node_ptr [N+1], unique_src_node_pair [U] (node -> pairs CSR),
//                             unique_src_relation_pairs [R] (unique (src, r) pairs of each relation, whether or not
//                             it is compacted), src_relation_compacted [R] (bool: which relations are compacted)
//   "compact_dst_etype"       unique_dst [U'], unique_dst_etype_ptr [R+1], edge_to_unique_dst [E],
//                             unique_dst_edge_ptr [U'+1], unique_dst_edge_eid [E],
//                             unique_dst_node_ptr [N+1], unique_dst_node_pair [U'],
//                             unique_dst_relation_pairs [R], dst_relation_compacted [R] (bool)
//   "csr_by_dst_pairs"        in_col_unique_src [E]: the pair row of CSR position i, edge_to_unique_src[in_col_eid[i]]
//                             (needs "csr_by_dst" and "compact_src_etype" in the same call)
//   "inv_relation_in_degree"  inv_relation_in_degree [E] (float32)
//   "in_col_inv_relation_in_degree"
//                             in_col_inv_relation_in_degree [E] (float32): inv_relation_in_degree of CSR position i,
//                             inv_relation_in_degree[in_col_eid[i]] (needs "csr_by_dst" and "inv_relation_in_degree")
//   "ntype_ptr"               ntype_ptr [T+1], ntype [N] (the node types as int32; needs ntype)
// With gemm_tile > 0, also the GEMM row-tile offsets of the segments (hectorgen/graph.h, build_tile_ptr):
//   "etype_sorted_coo"        etype_tile_ptr [R+1]
//   "compact_src_etype"       unique_src_tile_ptr [R+1] (tiles of the pair rows of each relation)
//   "compact_dst_etype"       unique_dst_tile_ptr [R+1]
//   "ntype_ptr"               ntype_tile_ptr [T+1]
const std::vector<std::string>& layout_names();

// Builds exactly the requested `layouts` and returns them by key (see above).
//   src, dst, etype  1-D contiguous CUDA tensors of length E on one device, int32 or int64; E < 2^31 - 1.
//   num_nodes        N, 0 <= N < 2^31 - 1;  num_etypes: R, 1 <= R < 2^31 - 1.
//   ntype            std::nullopt, or a 1-D contiguous int32/int64 CUDA tensor of length N with nodes sorted by
//                    type; only used by "ntype_ptr".
//   num_ntypes       T; -1 derives it as max(ntype) + 1 (one host synchronisation).
//   validate         check index ranges and ntype order on the device and raise on violations (one host
//                    synchronisation at the end). Without it, invalid input gives unspecified values.
//   gemm_tile        rows per tile of the generated GEMM kernels: > 0 adds the tile offsets (see above), 0 not.
//   compact_threshold, compact_mask
//                    which relations the compact layouts compact (hectorgen/compact_policy.h); the others get one
//                    pair row per edge. Neither (threshold < 0, no mask): every relation, as before runtime 1.3.
//                    threshold >= 0: relation r iff it has no edges or unique_pairs_r / edges_r <= threshold.
//                    mask: a bool tensor [R] (CPU or the graph's device): exactly the relations marked true.
//                    Not both. The decision is made on the device, without a synchronisation.
// Host synchronisations: only the `validate` read-back, the num_ntypes derivation, and one read-back of the
// number of unique pairs per requested compact layout (to size the [U] and [U+1] arrays). All are issued after
// every kernel has been queued. Errors are raised as c10::Error (TORCH_CHECK).
std::map<std::string, at::Tensor> preprocess(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& etype,
                                             int64_t num_nodes, int64_t num_etypes,
                                             const std::optional<at::Tensor>& ntype,
                                             const std::vector<std::string>& layouts, int64_t num_ntypes = -1,
                                             bool validate = true, int64_t gemm_tile = 0,
                                             double compact_threshold = -1.0,
                                             const std::optional<at::Tensor>& compact_mask = std::nullopt);

// HECTORGEN_RUNTIME_VERSION_STRING of the compiled library (hectorgen/runtime_version.h), e.g. "1.0.0".
const char* version();

}  // namespace hectorgen::runtime
