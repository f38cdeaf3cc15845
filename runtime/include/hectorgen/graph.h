// Graph preprocessing runtime: builds, on the GPU, the graph layouts that generated hectorgen kernels read.
//
// The input is a typed COO graph (docs/semantics.md): N nodes, E edges (src[e], dst[e], etype[e]) with
// etype in [0, R), and optionally a node type per node. All layouts are defined relative to the
// *etype-sorted edge order*: edge position p in [0, E) of the stably etype-sorted COO. Generated kernels
// store per-edge data in that order, and `perm` maps it back to the caller's edge ids.
//
//   etype-sorted COO    perm [E]                 caller edge id at sorted position p
//                       src, dst, etype [E]      endpoints and type at position p (etype non-decreasing)
//                       etype_ptr [R+1]          relation r occupies positions [etype_ptr[r], etype_ptr[r+1])
//   CSR by destination  row_ptr [N+1]            incoming edges of node v: [row_ptr[v], row_ptr[v+1])
//   (incoming edges)    col_idx [E]              src of each edge; a row is ordered by (etype, p)
//                       col_eid [E]              p, the edge's position in the etype-sorted order
//                       col_etype [E]            etype of each edge
//   CSR by source       same arrays with row = src and col_idx = dst (outgoing edges)
//   compact mapping     unique_node [U]          the unique (node, etype) pairs ordered by (etype, node), where
//   (Hector's compact   unique_etype_ptr [R+1]   node is the src (or the dst) of an edge; relation r owns rows
//    materialization)   edge_to_unique [E]       [unique_etype_ptr[r], unique_etype_ptr[r+1]); row of edge p.
//                                                An uncompacted relation (CompactPolicy) has one pair per edge,
//                                                ordered by (node, p): its edge -> pair map is a bijection
//   its inverses, for   pair_edge_ptr [U+1]      edges of pair k: pair_edge_eid[pair_edge_ptr[k], pair_edge_ptr[k+1])
//   gather-only sums    pair_edge_eid [E]        edge positions p grouped by pair (pairs in row order, each
//   in the backward                              pair's edges by p): {p : edge_to_unique[p] == k} in order
//                       node_pair_ptr [N+1]      pairs of node v: node_pair[node_pair_ptr[v], node_pair_ptr[v+1])
//                       node_pair [U]            pair rows grouped by node (nodes ascending, a node's pairs by
//                                                etype): {k : unique_node[k] == v} in order
//   inverse relation    inv_relation_in_degree   [E] float: 1 / |{e : dst[e] == dst[p], etype[e] == etype[p]}|,
//   in-degree                                    RGCN's 1/c_{v,r}
//   node type segments  ntype_ptr [T+1]          nodes of type t: [ntype_ptr[t], ntype_ptr[t+1])
//   segment tiles       tile_ptr [S+1]           for the segments of etype_ptr, unique_etype_ptr or ntype_ptr and a
//                                                GEMM row tile: segment s owns tiles [tile_ptr[s], tile_ptr[s+1])
//
// Conventions shared by every function below:
//   * All pointers are device pointers; all indices are int32. Counts must satisfy
//     0 <= num_nodes < INT32_MAX, 0 <= num_edges < INT32_MAX (so that "count + 1" offsets fit), num_etypes >= 1;
//     anything else returns cudaErrorInvalidValue before any work is queued.
//   * Work is queued on `stream`; nothing synchronises with the host. The functions return the first CUDA
//     error seen while queueing (a later asynchronous fault surfaces at the caller's next synchronisation).
//   * No exceptions are thrown. Temporaries come from `allocator` (stream-ordered); nullptr means
//     cudaMallocAsync / cudaFreeAsync on `stream`. Every temporary is released before the function returns
//     (stream-ordered, so it stays valid for the queued work).
//   * Results are deterministic: identical inputs give bit-identical outputs (integer-only algorithms: stable
//     radix sorts, scans and binary searches; no atomics on results).
//   * Inputs with out-of-range indices (see validate_coo) give unspecified output values, but never out-of-bounds
//     memory accesses. Arrays with zero elements may be passed as nullptr.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "hectorgen/compact_policy.h"  // CompactPolicy, CompactChoice

namespace hectorgen::runtime {

// ---------------------------------------------------------------------------------------------------------------
// Temporaries and errors

// A stream-ordered device allocator for temporaries, e.g. a framework's caching allocator.
// `allocate` returns cudaSuccess and a pointer to at least `bytes` bytes usable by work queued on `stream`, or an
// error (it must not throw). `deallocate` releases a pointer from `allocate`; work already queued on `stream` may
// still use it, so the allocator must order the reuse after that work (as cudaFreeAsync does).
struct DeviceAllocator {
  void* context = nullptr;
  cudaError_t (*allocate)(void* context, void** ptr, std::size_t bytes, cudaStream_t stream) = nullptr;
  void (*deallocate)(void* context, void* ptr, cudaStream_t stream) = nullptr;
};

// Bits of the device-side error word written by validate_coo and build_ntype_ptr. The word is a single uint32_t
// in device memory that the caller zeroes; kernels OR bits into it. Reading it needs a host synchronisation, so
// the caller decides when (e.g. once after all preprocessing).
enum GraphErrorBits : uint32_t {
  kGraphOk = 0,
  kSrcOutOfRange = 1u << 0,    // some src[e] not in [0, num_nodes)
  kDstOutOfRange = 1u << 1,    // some dst[e] not in [0, num_nodes)
  kEtypeOutOfRange = 1u << 2,  // some etype[e] not in [0, num_etypes)
  kNtypeOutOfRange = 1u << 3,  // some ntype[n] not in [0, num_ntypes)
  kNtypeNotSorted = 1u << 4,   // ntype is not non-decreasing over node ids
};

// Human-readable description of one error bit ("src index out of range", ...); "unknown error bit" otherwise.
const char* graph_error_string(uint32_t bit);

// ---------------------------------------------------------------------------------------------------------------
// Input conversion and validation

// out[i] = in[i] if 0 <= in[i] < bound, else -1 (so that a following validate_coo flags it). Lets callers accept
// int64 indices without a host round trip; `bound` is num_nodes or num_etypes.
cudaError_t narrow_indices_to_int32(const int64_t* in, int32_t* out, int32_t count, int64_t bound,
                                    cudaStream_t stream);

// ORs kSrcOutOfRange / kDstOutOfRange / kEtypeOutOfRange into *error_word for out-of-range entries.
cudaError_t validate_coo(const int32_t* src, const int32_t* dst, const int32_t* etype, int32_t num_edges,
                         int32_t num_nodes, int32_t num_etypes, uint32_t* error_word, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------------
// Etype-sorted COO

// Output buffers of sort_edges_by_etype (lengths in brackets).
struct EtypeSortedCoo {
  int32_t* perm = nullptr;       // [E]   caller edge id of each sorted position
  int32_t* src = nullptr;        // [E]
  int32_t* dst = nullptr;        // [E]
  int32_t* etype = nullptr;      // [E]   non-decreasing
  int32_t* etype_ptr = nullptr;  // [R+1] etype_ptr[0] = 0, etype_ptr[R] = E
};

// Stable radix sorts of the edges by (etype, dst) (ties keep the caller's edge order), then the relation segment
// offsets (binary searches over the sorted types; no atomics, no host sync). Within a relation the edges are
// ordered by destination: a node's incoming edges of one relation are adjacent.
cudaError_t sort_edges_by_etype(const int32_t* src, const int32_t* dst, const int32_t* etype, int32_t num_nodes,
                                int32_t num_edges, int32_t num_etypes, const EtypeSortedCoo& out, cudaStream_t stream,
                                const DeviceAllocator* allocator = nullptr);

// Read-only view of an etype-sorted COO (the output of sort_edges_by_etype); the input of every builder below.
struct SortedCooView {
  int32_t num_nodes = 0;
  int32_t num_edges = 0;
  int32_t num_etypes = 1;
  const int32_t* src = nullptr;    // [E]
  const int32_t* dst = nullptr;    // [E]
  const int32_t* etype = nullptr;  // [E] non-decreasing (precondition, not checked)
};

// ---------------------------------------------------------------------------------------------------------------
// CSR

// Output buffers of the CSR builders.
struct Csr {
  int32_t* row_ptr = nullptr;    // [N+1]
  int32_t* col_idx = nullptr;    // [E] the other endpoint: src for CSR by dst, dst for CSR by src
  int32_t* col_eid = nullptr;    // [E] position of the edge in the etype-sorted order
  int32_t* col_etype = nullptr;  // [E]
};

// CSR by destination (incoming edges). Inside a row, edges are ordered by (etype, etype-sorted position).
cudaError_t build_csr_by_dst(const SortedCooView& graph, const Csr& out, cudaStream_t stream,
                             const DeviceAllocator* allocator = nullptr);

// CSR by source (outgoing edges). Inside a row, edges are ordered by (etype, etype-sorted position).
cudaError_t build_csr_by_src(const SortedCooView& graph, const Csr& out, cudaStream_t stream,
                             const DeviceAllocator* allocator = nullptr);

// ---------------------------------------------------------------------------------------------------------------
// Compact materialization

enum class Endpoint { kSrc, kDst };

// Output buffers of build_compact_mapping. The first three are required; each inverse mapping below them is
// optional: both of its buffers, or neither (nullptr: not built; one without the other is cudaErrorInvalidValue, except
// without edges, where the [E]-sized buffers may be nullptr as always).
struct CompactMapping {
  // [capacity E] unique nodes of the (node, etype) pairs, ordered by (etype, node). Only the first U entries are
  // written, where U = unique_etype_ptr[R] (U <= E). U lives in device memory: a caller that wants a tight [U]
  // array must read it back (one host synchronisation) and copy the prefix.
  int32_t* unique_node = nullptr;
  int32_t* unique_etype_ptr = nullptr;  // [R+1] pairs of relation r: rows [ptr[r], ptr[r+1])
  int32_t* edge_to_unique = nullptr;    // [E] compact row of each etype-sorted edge

  // Pair -> edges, the inverse of edge_to_unique as a CSR: pair k's edges are pair_edge_eid[pair_edge_ptr[k] ..
  // pair_edge_ptr[k+1]), ascending positions p. Sums an edge gradient into pair rows by gathers only.
  int32_t* pair_edge_ptr = nullptr;  // [capacity E+1] only the first U+1 entries are written; ptr[U] = E
  int32_t* pair_edge_eid = nullptr;  // [E] a permutation of [0, E)
  // Node -> pairs, the inverse of unique_node as a CSR: node v's pairs are node_pair[node_pair_ptr[v] ..
  // node_pair_ptr[v+1]), ascending rows (so ascending etypes). Sums pair rows into node rows by gathers only.
  int32_t* node_pair_ptr = nullptr;  // [N+1] node_pair_ptr[N] = U
  int32_t* node_pair = nullptr;      // [capacity E] only the first U entries are written: a permutation of [0, U)
};

// Hector's compact materialization mapping: one row per (endpoint node, etype) pair that occurs, e.g.
// Endpoint::kSrc for data that depends only on (src, etype) such as x[src] @ W[etype]; and, when their buffers are
// given, its inverses. For Endpoint::kDst, pair_edge_eid is the identity: the etype-sorted order is (etype, dst), so a
// (dst, etype) pair's edges are already adjacent (pair_edge_ptr still gives their ranges).
// The inverses add a copy of E positions and, for node_pair, one more stable radix sort of E keys (the U pair
// nodes, padded to E with N since U is not known on the host).
cudaError_t build_compact_mapping(const SortedCooView& graph, Endpoint endpoint, const CompactMapping& out,
                                  cudaStream_t stream, const DeviceAllocator* allocator = nullptr);

// The same mapping with a per-relation choice (hectorgen/compact_policy.h): the relations that `policy` compacts get
// one row per unique (node, etype) pair as above; the others get one row per edge, ordered by (node, p), so every
// array keeps its meaning and kernels written for the compact layout work for any mix. CompactPolicy::all() gives
// exactly the mapping of the overload above. The decision runs on the device, one thread per relation, from the
// per-relation unique pair counts of the grouping that the mapping sorts anyway (no host synchronisation); a policy
// other than all() costs one more head-flag pass and scan over E. `choice` receives, where its buffers are given, the
// unique pair count of every relation (whether or not it was compacted) and the decision. An invalid policy
// (CompactPolicy::valid) is cudaErrorInvalidValue.
cudaError_t build_compact_mapping(const SortedCooView& graph, Endpoint endpoint, const CompactPolicy& policy,
                                  const CompactMapping& out, const CompactChoice& choice, cudaStream_t stream,
                                  const DeviceAllocator* allocator = nullptr);

// ---------------------------------------------------------------------------------------------------------------
// Normalisation and node types

// inv_relation_in_degree[p] = 1 / (number of edges with the same (dst, etype) as edge p), correctly rounded fp32.
cudaError_t build_inv_relation_in_degree(const SortedCooView& graph, float* inv_relation_in_degree,
                                         cudaStream_t stream, const DeviceAllocator* allocator = nullptr);

// ntype_ptr [T+1] for nodes sorted by type: nodes of type t are [ntype_ptr[t], ntype_ptr[t+1]). Verifies on the
// device that ntype is non-decreasing and in [0, num_ntypes), ORing kNtypeNotSorted / kNtypeOutOfRange into
// *error_word (may be nullptr to skip the check). Requires num_ntypes >= 1.
cudaError_t build_ntype_ptr(const int32_t* ntype, int32_t num_nodes, int32_t num_ntypes, int32_t* ntype_ptr,
                            uint32_t* error_word, cudaStream_t stream);

// ---------------------------------------------------------------------------------------------------------------
// GEMM row tiles

// tile_ptr [S+1] for segments given by offsets segment_ptr [S+1] (etype_ptr, ntype_ptr, ...): segment s is cut into
// ceil((segment_ptr[s+1] - segment_ptr[s]) / tile) tiles of `tile` rows, and owns tiles [tile_ptr[s], tile_ptr[s+1]).
// Generated GEMM kernels launch tile_ptr[S] row tiles and find a tile's segment by binary search. Requires
// num_segments >= 0, tile >= 1 and non-decreasing offsets (unchecked).
cudaError_t build_tile_ptr(const int32_t* segment_ptr, int32_t num_segments, int32_t tile, int32_t* tile_ptr,
                           cudaStream_t stream, const DeviceAllocator* allocator = nullptr);

}  // namespace hectorgen::runtime
