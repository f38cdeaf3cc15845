// Graph preprocessing on the GPU: etype-sorted COO, CSR by dst/src, compact materialization mapping (with its
// per-relation choice) and its inverses, inverse relation in-degree and node type segments. See hectorgen/graph.h for
// the layouts and the shared conventions.
//
// Every layout is built from three primitives:
//   * a stable CUB radix sort of (key, position) pairs, restricted to the key bits that can be non-zero;
//   * segment offsets as binary searches (lower_bound) over sorted keys: one thread per segment, so empty
//     segments cost nothing extra, results are exact and no atomics or host round trips are needed;
//   * run numbering over sorted keys: head flags followed by an exclusive scan.

#include "hectorgen/graph.h"

#include <cub/cub.cuh>

#include <climits>
#include <cstdint>

namespace hectorgen::runtime {
namespace {

#define HG_RETURN_IF_ERROR(expr)            \
  do {                                      \
    const cudaError_t hg_status_ = (expr);  \
    if (hg_status_ != cudaSuccess) {        \
      return hg_status_;                    \
    }                                       \
  } while (0)

constexpr int kBlockSize = 256;

// Launches `kernel` with one thread per item. An empty launch is skipped: a zero-sized grid is a launch error.
template <typename... KernelArgs, typename... Args>
cudaError_t launch(void (*kernel)(KernelArgs...), int64_t items, cudaStream_t stream, Args... args) {
  if (items <= 0) {
    return cudaSuccess;
  }
  const auto blocks = static_cast<unsigned>((items + kBlockSize - 1) / kBlockSize);
  kernel<<<blocks, kBlockSize, 0, stream>>>(args...);
  return cudaGetLastError();
}

__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

// A temporary device allocation, released (stream-ordered) when it goes out of scope.
class DeviceBuffer {
 public:
  DeviceBuffer(const DeviceAllocator* allocator, cudaStream_t stream)
      : allocator_(allocator != nullptr && allocator->allocate != nullptr && allocator->deallocate != nullptr
                       ? allocator
                       : nullptr),
        stream_(stream) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  // Allocates room for `count` elements of T (at least one byte, so that CUB never mistakes the pointer for a
  // size query).
  template <typename T>
  cudaError_t allocate(int64_t count) {
    release();
    const std::size_t bytes = count > 0 ? static_cast<std::size_t>(count) * sizeof(T) : 1;
    const cudaError_t status = allocator_ != nullptr
                                   ? allocator_->allocate(allocator_->context, &ptr_, bytes, stream_)
                                   : cudaMallocAsync(&ptr_, bytes, stream_);
    if (status != cudaSuccess) {
      ptr_ = nullptr;
    }
    return status;
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void release() {
    if (ptr_ == nullptr) {
      return;
    }
    if (allocator_ != nullptr) {
      allocator_->deallocate(allocator_->context, ptr_, stream_);
    } else {
      // A failing stream-ordered free means the context is already broken; that sticky error is reported by the
      // next checked call, so there is nothing useful to do with it in a destructor.
      (void)cudaFreeAsync(ptr_, stream_);
    }
    ptr_ = nullptr;
  }

  const DeviceAllocator* allocator_;
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

// Number of low key bits the radix sort must look at for keys in [0, max_key]. At least one, so that CUB always
// performs a (trivial) pass and writes its outputs.
int radix_bits(uint64_t max_key) {
  int bits = 0;
  while (max_key != 0) {
    ++bits;
    max_key >>= 1;
  }
  return bits > 0 ? bits : 1;
}

bool valid_count(int32_t count) { return count >= 0 && count < INT32_MAX; }

cudaError_t check_graph_counts(int32_t num_nodes, int32_t num_edges, int32_t num_etypes) {
  const bool ok = valid_count(num_nodes) && valid_count(num_edges) && num_etypes >= 1 && num_etypes < INT32_MAX;
  return ok ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t zero_fill(int32_t* data, int64_t count, cudaStream_t stream) {
  return cudaMemsetAsync(data, 0, static_cast<std::size_t>(count) * sizeof(int32_t), stream);
}

// ---------------------------------------------------------------------------------------------------------------
// Kernels

__global__ void narrow_indices_kernel(const int64_t* in, int32_t* out, int32_t count, int64_t bound) {
  const int64_t i = thread_index();
  if (i < count) {
    const int64_t value = in[i];
    out[i] = (value >= 0 && value < bound) ? static_cast<int32_t>(value) : -1;
  }
}

__global__ void validate_coo_kernel(const int32_t* src, const int32_t* dst, const int32_t* etype, int32_t count,
                                    int32_t num_nodes, int32_t num_etypes, uint32_t* error_word) {
  const int64_t i = thread_index();
  if (i >= count) {
    return;
  }
  uint32_t bits = 0;
  if (src[i] < 0 || src[i] >= num_nodes) bits |= kSrcOutOfRange;
  if (dst[i] < 0 || dst[i] >= num_nodes) bits |= kDstOutOfRange;
  if (etype[i] < 0 || etype[i] >= num_etypes) bits |= kEtypeOutOfRange;
  if (bits != 0) {
    atomicOr(error_word, bits);
  }
}

__global__ void check_ntype_kernel(const int32_t* ntype, int32_t count, int32_t num_ntypes, uint32_t* error_word) {
  const int64_t i = thread_index();
  if (i >= count) {
    return;
  }
  uint32_t bits = 0;
  if (ntype[i] < 0 || ntype[i] >= num_ntypes) bits |= kNtypeOutOfRange;
  if (i > 0 && ntype[i - 1] > ntype[i]) bits |= kNtypeNotSorted;
  if (bits != 0) {
    atomicOr(error_word, bits);
  }
}

__global__ void iota_kernel(int32_t* out, int32_t count) {
  const int64_t i = thread_index();
  if (i < count) {
    out[i] = static_cast<int32_t>(i);
  }
}

// out[i] = values[index[i]].
__global__ void gather_kernel(const int32_t* index, const int32_t* values, int32_t* out, int32_t count) {
  const int64_t i = thread_index();
  if (i < count) out[i] = values[index[i]];
}

__global__ void gather_endpoints_kernel(const int32_t* perm, const int32_t* src, const int32_t* dst,
                                        int32_t* sorted_src, int32_t* sorted_dst, int32_t count) {
  const int64_t i = thread_index();
  if (i < count) {
    const int32_t e = perm[i];
    sorted_src[i] = src[e];
    sorted_dst[i] = dst[e];
  }
}

// First index in sorted[0, count) whose key is not less than `value`.
template <typename Key>
__device__ int32_t lower_bound(const Key* sorted, int32_t count, Key value) {
  int32_t lo = 0;
  int32_t hi = count;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < value) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// offsets[s] = number of keys smaller than s, for s in [0, num_segments]: the CSR-style offsets of sorted keys.
template <typename Key>
__global__ void segment_offsets_kernel(const Key* sorted, int32_t count, int32_t num_segments, int32_t* offsets) {
  const int64_t s = thread_index();
  if (s <= num_segments) {
    offsets[s] = lower_bound(sorted, count, static_cast<Key>(s));
  }
}

// CSR columns from the row-sorted edge positions: the other endpoint and the etype of each edge.
__global__ void gather_csr_columns_kernel(const int32_t* col_eid, const int32_t* other_endpoint,
                                          const int32_t* etype, int32_t* col_idx, int32_t* col_etype,
                                          int32_t count) {
  const int64_t i = thread_index();
  if (i < count) {
    const int32_t p = col_eid[i];
    col_idx[i] = other_endpoint[p];
    col_etype[i] = etype[p];
  }
}

// key = etype * num_nodes + node: sorting by it orders edges by (etype, node).
template <typename Key>
__global__ void etype_node_keys_kernel(const int32_t* etype, const int32_t* node, int32_t count, int32_t num_nodes,
                                       Key* keys) {
  const int64_t i = thread_index();
  if (i < count) {
    keys[i] = static_cast<Key>(static_cast<uint32_t>(etype[i])) * static_cast<Key>(num_nodes) +
              static_cast<Key>(static_cast<uint32_t>(node[i]));
  }
}

// heads[i] = 1 where a run of equal keys starts, for i in [0, count]; heads[count] = 0 so that an exclusive scan
// over count + 1 entries also yields the number of runs.
template <typename Key>
__global__ void run_heads_kernel(const Key* sorted, int32_t count, int32_t* heads) {
  const int64_t i = thread_index();
  if (i <= count) {
    heads[i] = (i < count && (i == 0 || sorted[i] != sorted[i - 1])) ? 1 : 0;
  }
}

// After the scan, runs_before[i] is the number of runs starting before sorted index i, so sorted index i belongs to
// run runs_before[i + 1] - 1 and starts it iff runs_before[i] != runs_before[i + 1].
__global__ void compact_scatter_kernel(const int32_t* order, const int32_t* runs_before, const int32_t* node,
                                       int32_t count, int32_t* unique_node, int32_t* edge_to_unique) {
  const int64_t i = thread_index();
  if (i < count) {
    const int32_t run = runs_before[i + 1] - 1;
    const int32_t p = order[i];
    edge_to_unique[p] = run;
    if (runs_before[i] != runs_before[i + 1]) {
      unique_node[run] = node[p];
    }
  }
}

// unique_etype_ptr[r] = number of runs (unique (etype, node) pairs) with etype < r, i.e. runs_before at the first
// sorted key of relation r.
template <typename Key>
__global__ void unique_etype_ptr_kernel(const Key* sorted, const int32_t* runs_before, int32_t count,
                                        int32_t num_etypes, int32_t num_nodes, int32_t* unique_etype_ptr) {
  const int64_t r = thread_index();
  if (r <= num_etypes) {
    // r == num_etypes is handled apart: its first key num_etypes * num_nodes may not fit Key.
    const int32_t first = r < num_etypes
                              ? lower_bound(sorted, count, static_cast<Key>(r) * static_cast<Key>(num_nodes))
                              : count;
    unique_etype_ptr[r] = runs_before[first];
  }
}

// Per relation r: the unique (etype, node) pairs it has (the runs of the grouping in which every relation is
// compacted) and whether `policy` compacts it. compacted[r] is written for every r; unique_pairs[r] when given.
template <typename Key>
__global__ void relation_choice_kernel(const Key* sorted, const int32_t* runs_before, int32_t count,
                                       int32_t num_etypes, int32_t num_nodes, CompactPolicy policy,
                                       int32_t* unique_pairs, uint8_t* compacted) {
  const int64_t r = thread_index();
  if (r >= num_etypes) {
    return;
  }
  // Relation r's edges are sorted indices [first, last); (r + 1) * N fits Key for r + 1 < num_etypes.
  const int32_t first = lower_bound(sorted, count, static_cast<Key>(r) * static_cast<Key>(num_nodes));
  const int32_t last =
      r + 1 < num_etypes ? lower_bound(sorted, count, static_cast<Key>(r + 1) * static_cast<Key>(num_nodes)) : count;
  const int32_t pairs = count > 0 ? runs_before[last] - runs_before[first] : 0;
  bool compact = true;
  switch (policy.kind) {
    case CompactPolicy::Kind::kAll: compact = true; break;
    case CompactPolicy::Kind::kThreshold: compact = compacts_relation(policy.threshold, pairs, last - first); break;
    case CompactPolicy::Kind::kMask: compact = policy.mask[r] != 0; break;
  }
  if (unique_pairs != nullptr) {
    unique_pairs[r] = pairs;
  }
  compacted[r] = compact ? 1 : 0;
}

// Run heads of the chosen grouping: as run_heads_kernel, and every edge of an uncompacted relation starts a run of
// its own (so its pairs are ordered by (node, position), the sort order). An etype out of range (invalid input)
// counts as compacted rather than being read out of bounds.
template <typename Key>
__global__ void chosen_run_heads_kernel(const Key* sorted, const int32_t* order, const int32_t* etype,
                                        const uint8_t* compacted, int32_t count, int32_t num_etypes,
                                        int32_t* heads) {
  const int64_t i = thread_index();
  if (i > count) {
    return;
  }
  if (i == count) {
    heads[i] = 0;
    return;
  }
  const int32_t r = etype[order[i]];
  const bool own_run = r >= 0 && r < num_etypes && compacted[r] == 0;
  heads[i] = (i == 0 || sorted[i] != sorted[i - 1] || own_run) ? 1 : 0;
}

// run_start[k] = sorted index where run k starts, for k in [0, runs]; run_start[runs] = count.
__global__ void run_starts_kernel(const int32_t* runs_before, int32_t count, int32_t* run_start) {
  const int64_t i = thread_index();
  if (i < count) {
    if (runs_before[i] != runs_before[i + 1]) {
      run_start[runs_before[i]] = static_cast<int32_t>(i);
    }
    if (i == count - 1) {
      run_start[runs_before[count]] = count;
    }
  }
}

__global__ void inv_run_length_kernel(const int32_t* order, const int32_t* runs_before, const int32_t* run_start,
                                      int32_t count, float* inv_length) {
  const int64_t i = thread_index();
  if (i < count) {
    const int32_t run = runs_before[i + 1] - 1;
    const int32_t length = run_start[run + 1] - run_start[run];
    // Correctly rounded (independent of -use_fast_math), so the result matches 1.0f / float(length) anywhere.
    inv_length[order[i]] = __fdiv_rn(1.0f, __int2float_rn(length));
  }
}

// keys[k] = the node of pair k for the pairs k < U = *num_pairs, else num_nodes (after every node), for k in
// [0, capacity): sorting them stably lists the pairs by (node, row) with the padding last, without reading U back.
__global__ void pair_node_keys_kernel(const int32_t* unique_node, const int32_t* num_pairs, int32_t capacity,
                                      int32_t num_nodes, uint32_t* keys) {
  const int64_t k = thread_index();
  if (k < capacity) {
    keys[k] = k < *num_pairs ? static_cast<uint32_t>(unique_node[k]) : static_cast<uint32_t>(num_nodes);
  }
}

// tiles[s] = number of `tile`-row tiles of segment s for s < num_segments, tiles[num_segments] = 0: an exclusive scan
// over the num_segments + 1 entries turns it into the tile offsets.
__global__ void segment_tiles_kernel(const int32_t* segment_ptr, int32_t num_segments, int32_t tile, int32_t* tiles) {
  const int64_t s = thread_index();
  if (s < num_segments) {
    const int32_t rows = segment_ptr[s + 1] - segment_ptr[s];
    tiles[s] = rows / tile + (rows % tile != 0 ? 1 : 0);  // ceil without overflow near INT32_MAX
  } else if (s == num_segments) {
    tiles[s] = 0;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// CUB wrappers (size query, temporary allocation, run)

template <typename Key>
cudaError_t stable_sort_pairs(const Key* keys_in, Key* keys_out, const int32_t* values_in, int32_t* values_out,
                              int32_t count, int end_bit, cudaStream_t stream, const DeviceAllocator* allocator) {
  std::size_t temp_bytes = 0;
  HG_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out, values_in, values_out,
                                                     count, 0, end_bit, stream));
  DeviceBuffer temp(allocator, stream);
  HG_RETURN_IF_ERROR(temp.allocate<unsigned char>(static_cast<int64_t>(temp_bytes)));
  return cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in, keys_out, values_in, values_out,
                                         count, 0, end_bit, stream);
}

cudaError_t exclusive_sum_in_place(int32_t* data, int32_t count, cudaStream_t stream,
                                   const DeviceAllocator* allocator) {
  std::size_t temp_bytes = 0;
  HG_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, data, count, stream));
  DeviceBuffer temp(allocator, stream);
  HG_RETURN_IF_ERROR(temp.allocate<unsigned char>(static_cast<int64_t>(temp_bytes)));
  return cub::DeviceScan::ExclusiveSum(temp.as<void>(), temp_bytes, data, count, stream);
}

// Edge positions permuted into `row` order, stably: the result lists positions by (row, position). On an
// etype-sorted graph that is (row, etype, position). Writes the sorted rows to sorted_rows and positions to order.
cudaError_t stable_order_by_row(const int32_t* row, int32_t count, int32_t num_rows, uint32_t* sorted_rows,
                                int32_t* order, cudaStream_t stream, const DeviceAllocator* allocator) {
  DeviceBuffer positions(allocator, stream);
  HG_RETURN_IF_ERROR(positions.allocate<int32_t>(count));
  HG_RETURN_IF_ERROR(launch(iota_kernel, count, stream, positions.as<int32_t>(), count));
  const int end_bit = radix_bits(num_rows > 0 ? static_cast<uint64_t>(num_rows) - 1 : 0);
  return stable_sort_pairs(reinterpret_cast<const uint32_t*>(row), sorted_rows, positions.as<int32_t>(), order,
                           count, end_bit, stream, allocator);
}

// ---------------------------------------------------------------------------------------------------------------
// Grouping edges by (etype, node)

// The edges of an etype-sorted graph grouped into runs of equal (etype, node):
//   order[i]        etype-sorted position of the i-th edge in (etype, node, position) order   [E]
//   sorted_keys[i]  its key etype * N + node                                                   [E]
//   runs_before[i]  number of runs starting before sorted index i; runs_before[E] = #runs      [E+1]
struct EdgeRuns {
  EdgeRuns(const DeviceAllocator* allocator, cudaStream_t stream)
      : order(allocator, stream), sorted_keys(allocator, stream), runs_before(allocator, stream) {}
  DeviceBuffer order;
  DeviceBuffer sorted_keys;
  DeviceBuffer runs_before;
};

template <typename Key>
cudaError_t group_by_etype_and_node(const SortedCooView& graph, const int32_t* node, EdgeRuns& runs,
                                    cudaStream_t stream, const DeviceAllocator* allocator) {
  const int32_t count = graph.num_edges;
  HG_RETURN_IF_ERROR(runs.order.allocate<int32_t>(count));
  HG_RETURN_IF_ERROR(runs.sorted_keys.allocate<Key>(count));
  HG_RETURN_IF_ERROR(runs.runs_before.allocate<int32_t>(static_cast<int64_t>(count) + 1));
  {
    // Sort (key, position); the key and position inputs are only needed until the sort is done.
    DeviceBuffer keys(allocator, stream);
    DeviceBuffer positions(allocator, stream);
    HG_RETURN_IF_ERROR(keys.allocate<Key>(count));
    HG_RETURN_IF_ERROR(positions.allocate<int32_t>(count));
    HG_RETURN_IF_ERROR(launch(etype_node_keys_kernel<Key>, count, stream, graph.etype, node, count,
                              graph.num_nodes, keys.as<Key>()));
    HG_RETURN_IF_ERROR(launch(iota_kernel, count, stream, positions.as<int32_t>(), count));
    const uint64_t max_key = static_cast<uint64_t>(graph.num_etypes) * static_cast<uint64_t>(graph.num_nodes);
    HG_RETURN_IF_ERROR(stable_sort_pairs(keys.as<Key>(), runs.sorted_keys.as<Key>(),
                                         positions.as<int32_t>(), runs.order.as<int32_t>(), count,
                                         radix_bits(max_key > 0 ? max_key - 1 : 0), stream, allocator));
  }
  int32_t* runs_before = runs.runs_before.as<int32_t>();
  HG_RETURN_IF_ERROR(launch(run_heads_kernel<Key>, static_cast<int64_t>(count) + 1, stream,
                            runs.sorted_keys.as<Key>(), count, runs_before));
  return exclusive_sum_in_place(runs_before, count + 1, stream, allocator);
}

// Composite keys fit 32 bits on most graphs (e.g. 2.5M nodes x 535 relations); 64-bit keys double the sort traffic.
bool fits_32bit_keys(const SortedCooView& graph) {
  return static_cast<uint64_t>(graph.num_etypes) * static_cast<uint64_t>(graph.num_nodes) <=
         static_cast<uint64_t>(UINT32_MAX) + 1;
}

// Node -> pairs CSR of the pairs unique_node[0, U), where U = *num_pairs lives on the device: a stable sort of the
// pair rows by node (padded to `capacity` >= U rows with key num_nodes), then node offsets by binary search.
cudaError_t build_node_pair_csr(const int32_t* unique_node, const int32_t* num_pairs, int32_t capacity,
                                int32_t num_nodes, int32_t* node_pair_ptr, int32_t* node_pair, cudaStream_t stream,
                                const DeviceAllocator* allocator) {
  DeviceBuffer sorted_keys(allocator, stream);
  HG_RETURN_IF_ERROR(sorted_keys.allocate<uint32_t>(capacity));
  {
    DeviceBuffer keys(allocator, stream), rows(allocator, stream);
    HG_RETURN_IF_ERROR(keys.allocate<uint32_t>(capacity));
    HG_RETURN_IF_ERROR(rows.allocate<int32_t>(capacity));
    HG_RETURN_IF_ERROR(launch(pair_node_keys_kernel, capacity, stream, unique_node, num_pairs, capacity, num_nodes,
                              keys.as<uint32_t>()));
    HG_RETURN_IF_ERROR(launch(iota_kernel, capacity, stream, rows.as<int32_t>(), capacity));
    HG_RETURN_IF_ERROR(stable_sort_pairs(keys.as<uint32_t>(), sorted_keys.as<uint32_t>(), rows.as<int32_t>(),
                                         node_pair, capacity, radix_bits(static_cast<uint64_t>(num_nodes)), stream,
                                         allocator));
  }
  // node_pair_ptr[N] = number of keys below N = U: the padding is not counted.
  return launch(segment_offsets_kernel<uint32_t>, static_cast<int64_t>(num_nodes) + 1, stream,
                sorted_keys.as<uint32_t>(), capacity, num_nodes, node_pair_ptr);
}

// The per-relation statistics and decision (relation_choice_kernel over the grouping `runs`, in which every relation
// is compacted) and, for a policy that may leave relations uncompacted, the runs of the chosen grouping in place.
template <typename Key>
cudaError_t apply_compact_policy(const SortedCooView& graph, const CompactPolicy& policy, const CompactChoice& choice,
                                 EdgeRuns& runs, cudaStream_t stream, const DeviceAllocator* allocator) {
  const bool all = policy.kind == CompactPolicy::Kind::kAll;
  if (all && choice.unique_pairs == nullptr && choice.compacted == nullptr) {
    return cudaSuccess;
  }
  const int32_t count = graph.num_edges;
  DeviceBuffer decided(allocator, stream);
  uint8_t* compacted = choice.compacted;
  if (compacted == nullptr) {
    HG_RETURN_IF_ERROR(decided.allocate<uint8_t>(graph.num_etypes));
    compacted = decided.as<uint8_t>();
  }
  int32_t* runs_before = runs.runs_before.as<int32_t>();
  HG_RETURN_IF_ERROR(launch(relation_choice_kernel<Key>, graph.num_etypes, stream, runs.sorted_keys.as<Key>(),
                            runs_before, count, graph.num_etypes, graph.num_nodes, policy, choice.unique_pairs,
                            compacted));
  if (all || count == 0) {
    return cudaSuccess;
  }
  HG_RETURN_IF_ERROR(launch(chosen_run_heads_kernel<Key>, static_cast<int64_t>(count) + 1, stream,
                            runs.sorted_keys.as<Key>(), runs.order.as<int32_t>(), graph.etype, compacted, count,
                            graph.num_etypes, runs_before));
  return exclusive_sum_in_place(runs_before, count + 1, stream, allocator);
}

template <typename Key>
cudaError_t build_compact_mapping_impl(const SortedCooView& graph, const int32_t* node, const CompactPolicy& policy,
                                       const CompactMapping& out, const CompactChoice& choice, cudaStream_t stream,
                                       const DeviceAllocator* allocator) {
  const int32_t count = graph.num_edges;
  {
    EdgeRuns runs(allocator, stream);  // released before the node sort below
    HG_RETURN_IF_ERROR(group_by_etype_and_node<Key>(graph, node, runs, stream, allocator));
    HG_RETURN_IF_ERROR(apply_compact_policy<Key>(graph, policy, choice, runs, stream, allocator));
    const int32_t* runs_before = runs.runs_before.as<int32_t>();
    HG_RETURN_IF_ERROR(launch(compact_scatter_kernel, count, stream, runs.order.as<int32_t>(), runs_before,
                              node, count, out.unique_node, out.edge_to_unique));
    HG_RETURN_IF_ERROR(launch(unique_etype_ptr_kernel<Key>, static_cast<int64_t>(graph.num_etypes) + 1, stream,
                              runs.sorted_keys.as<Key>(), runs_before, count, graph.num_etypes, graph.num_nodes,
                              out.unique_etype_ptr));
    // Pair -> edges: the runs are the pairs, in row order, and `order` lists each run's edges by position.
    if (out.pair_edge_ptr != nullptr) {
      HG_RETURN_IF_ERROR(launch(run_starts_kernel, count, stream, runs_before, count, out.pair_edge_ptr));
      HG_RETURN_IF_ERROR(cudaMemcpyAsync(out.pair_edge_eid, runs.order.as<int32_t>(),
                                         static_cast<std::size_t>(count) * sizeof(int32_t),
                                         cudaMemcpyDeviceToDevice, stream));
    }
  }
  if (out.node_pair_ptr == nullptr) {
    return cudaSuccess;
  }
  // U = unique_etype_ptr[R], read on the device.
  return build_node_pair_csr(out.unique_node, out.unique_etype_ptr + graph.num_etypes, count, graph.num_nodes,
                             out.node_pair_ptr, out.node_pair, stream, allocator);
}

template <typename Key>
cudaError_t build_inv_relation_in_degree_impl(const SortedCooView& graph, float* inv_relation_in_degree,
                                              cudaStream_t stream, const DeviceAllocator* allocator) {
  const int32_t count = graph.num_edges;
  EdgeRuns runs(allocator, stream);
  HG_RETURN_IF_ERROR(group_by_etype_and_node<Key>(graph, graph.dst, runs, stream, allocator));
  const int32_t* runs_before = runs.runs_before.as<int32_t>();
  DeviceBuffer run_start(allocator, stream);
  HG_RETURN_IF_ERROR(run_start.allocate<int32_t>(static_cast<int64_t>(count) + 1));
  HG_RETURN_IF_ERROR(launch(run_starts_kernel, count, stream, runs_before, count, run_start.as<int32_t>()));
  return launch(inv_run_length_kernel, count, stream, runs.order.as<int32_t>(), runs_before,
                run_start.as<int32_t>(), count, inv_relation_in_degree);
}

// CSR over `row` (dst or src) with `other` as the column endpoint.
cudaError_t build_csr(const SortedCooView& graph, const int32_t* row, const int32_t* other, const Csr& out,
                      cudaStream_t stream, const DeviceAllocator* allocator) {
  HG_RETURN_IF_ERROR(check_graph_counts(graph.num_nodes, graph.num_edges, graph.num_etypes));
  const int32_t count = graph.num_edges;
  if (count == 0) {
    return zero_fill(out.row_ptr, static_cast<int64_t>(graph.num_nodes) + 1, stream);
  }
  DeviceBuffer sorted_rows(allocator, stream);
  HG_RETURN_IF_ERROR(sorted_rows.allocate<uint32_t>(count));
  HG_RETURN_IF_ERROR(
      stable_order_by_row(row, count, graph.num_nodes, sorted_rows.as<uint32_t>(), out.col_eid, stream, allocator));
  HG_RETURN_IF_ERROR(launch(gather_csr_columns_kernel, count, stream, out.col_eid, other, graph.etype, out.col_idx,
                            out.col_etype, count));
  return launch(segment_offsets_kernel<uint32_t>, static_cast<int64_t>(graph.num_nodes) + 1, stream,
                sorted_rows.as<uint32_t>(), count, graph.num_nodes, out.row_ptr);
}

}  // namespace

// -------------------------------------------------------------------------------------------------------------------
// Public API

const char* graph_error_string(uint32_t bit) {
  switch (bit) {
    case kSrcOutOfRange: return "src index out of range [0, num_nodes)";
    case kDstOutOfRange: return "dst index out of range [0, num_nodes)";
    case kEtypeOutOfRange: return "etype out of range [0, num_etypes)";
    case kNtypeOutOfRange: return "ntype out of range [0, num_ntypes)";
    case kNtypeNotSorted: return "nodes are not sorted by ntype (ntype must be non-decreasing)";
    default: return "unknown error bit";
  }
}

cudaError_t narrow_indices_to_int32(const int64_t* in, int32_t* out, int32_t count, int64_t bound,
                                    cudaStream_t stream) {
  if (!valid_count(count)) {
    return cudaErrorInvalidValue;
  }
  return launch(narrow_indices_kernel, count, stream, in, out, count, bound);
}

cudaError_t validate_coo(const int32_t* src, const int32_t* dst, const int32_t* etype, int32_t num_edges,
                         int32_t num_nodes, int32_t num_etypes, uint32_t* error_word, cudaStream_t stream) {
  HG_RETURN_IF_ERROR(check_graph_counts(num_nodes, num_edges, num_etypes));
  return launch(validate_coo_kernel, num_edges, stream, src, dst, etype, num_edges, num_nodes, num_etypes,
                error_word);
}

cudaError_t sort_edges_by_etype(const int32_t* src, const int32_t* dst, const int32_t* etype, int32_t num_nodes,
                                int32_t num_edges, int32_t num_etypes, const EtypeSortedCoo& out, cudaStream_t stream,
                                const DeviceAllocator* allocator) {
  HG_RETURN_IF_ERROR(check_graph_counts(num_nodes, num_edges, num_etypes));
  if (num_edges == 0) {
    return zero_fill(out.etype_ptr, static_cast<int64_t>(num_etypes) + 1, stream);
  }
  // Two stable radix sorts: by destination, then by etype, so the edges are ordered by (etype, dst, caller's
  // position). A node's incoming edges of one relation are then adjacent: the traversals over a destination's
  // edges read neighbouring edge rows, and the edge kernels read destination rows in order.
  DeviceBuffer by_dst(allocator, stream), dst_keys(allocator, stream), etype_by_dst(allocator, stream);
  HG_RETURN_IF_ERROR(by_dst.allocate<int32_t>(num_edges));
  HG_RETURN_IF_ERROR(dst_keys.allocate<uint32_t>(num_edges));
  HG_RETURN_IF_ERROR(etype_by_dst.allocate<uint32_t>(num_edges));
  HG_RETURN_IF_ERROR(
      stable_order_by_row(dst, num_edges, num_nodes, dst_keys.as<uint32_t>(), by_dst.as<int32_t>(), stream, allocator));
  HG_RETURN_IF_ERROR(launch(gather_kernel, num_edges, stream, by_dst.as<int32_t>(), etype,
                            reinterpret_cast<int32_t*>(etype_by_dst.as<uint32_t>()), num_edges));
  const int end_bit = radix_bits(static_cast<uint64_t>(num_etypes) - 1);
  HG_RETURN_IF_ERROR(stable_sort_pairs(etype_by_dst.as<uint32_t>(), reinterpret_cast<uint32_t*>(out.etype),
                                       by_dst.as<int32_t>(), out.perm, num_edges, end_bit, stream, allocator));
  HG_RETURN_IF_ERROR(
      launch(gather_endpoints_kernel, num_edges, stream, out.perm, src, dst, out.src, out.dst, num_edges));
  return launch(segment_offsets_kernel<uint32_t>, static_cast<int64_t>(num_etypes) + 1, stream,
                reinterpret_cast<const uint32_t*>(out.etype), num_edges, num_etypes, out.etype_ptr);
}

cudaError_t build_csr_by_dst(const SortedCooView& graph, const Csr& out, cudaStream_t stream,
                             const DeviceAllocator* allocator) {
  return build_csr(graph, graph.dst, graph.src, out, stream, allocator);
}

cudaError_t build_csr_by_src(const SortedCooView& graph, const Csr& out, cudaStream_t stream,
                             const DeviceAllocator* allocator) {
  return build_csr(graph, graph.src, graph.dst, out, stream, allocator);
}

cudaError_t build_compact_mapping(const SortedCooView& graph, Endpoint endpoint, const CompactMapping& out,
                                  cudaStream_t stream, const DeviceAllocator* allocator) {
  return build_compact_mapping(graph, endpoint, CompactPolicy::all(), out, CompactChoice{}, stream, allocator);
}

cudaError_t build_compact_mapping(const SortedCooView& graph, Endpoint endpoint, const CompactPolicy& policy,
                                  const CompactMapping& out, const CompactChoice& choice, cudaStream_t stream,
                                  const DeviceAllocator* allocator) {
  HG_RETURN_IF_ERROR(check_graph_counts(graph.num_nodes, graph.num_edges, graph.num_etypes));
  if (!policy.valid()) {
    return cudaErrorInvalidValue;
  }
  if (graph.num_edges == 0) {  // no pairs: every offset is 0 (the [E]-sized buffers may be nullptr)
    if (choice.unique_pairs != nullptr || choice.compacted != nullptr) {
      // Every relation is empty: no pairs, and compacted unless a mask says otherwise.
      DeviceBuffer decided(allocator, stream);
      uint8_t* compacted = choice.compacted;
      if (compacted == nullptr) {
        HG_RETURN_IF_ERROR(decided.allocate<uint8_t>(graph.num_etypes));
        compacted = decided.as<uint8_t>();
      }
      HG_RETURN_IF_ERROR(launch(relation_choice_kernel<uint32_t>, graph.num_etypes, stream, nullptr, nullptr, 0,
                                graph.num_etypes, graph.num_nodes, policy, choice.unique_pairs, compacted));
    }
    if (out.pair_edge_ptr != nullptr) {
      HG_RETURN_IF_ERROR(zero_fill(out.pair_edge_ptr, 1, stream));
    }
    if (out.node_pair_ptr != nullptr) {
      HG_RETURN_IF_ERROR(zero_fill(out.node_pair_ptr, static_cast<int64_t>(graph.num_nodes) + 1, stream));
    }
    return zero_fill(out.unique_etype_ptr, static_cast<int64_t>(graph.num_etypes) + 1, stream);
  }
  if ((out.pair_edge_ptr == nullptr) != (out.pair_edge_eid == nullptr) ||
      (out.node_pair_ptr == nullptr) != (out.node_pair == nullptr)) {
    return cudaErrorInvalidValue;  // an inverse is built whole or not at all
  }
  const int32_t* node = endpoint == Endpoint::kSrc ? graph.src : graph.dst;
  return fits_32bit_keys(graph)
             ? build_compact_mapping_impl<uint32_t>(graph, node, policy, out, choice, stream, allocator)
             : build_compact_mapping_impl<uint64_t>(graph, node, policy, out, choice, stream, allocator);
}

cudaError_t build_inv_relation_in_degree(const SortedCooView& graph, float* inv_relation_in_degree,
                                         cudaStream_t stream, const DeviceAllocator* allocator) {
  HG_RETURN_IF_ERROR(check_graph_counts(graph.num_nodes, graph.num_edges, graph.num_etypes));
  if (graph.num_edges == 0) {
    return cudaSuccess;
  }
  return fits_32bit_keys(graph)
             ? build_inv_relation_in_degree_impl<uint32_t>(graph, inv_relation_in_degree, stream, allocator)
             : build_inv_relation_in_degree_impl<uint64_t>(graph, inv_relation_in_degree, stream, allocator);
}

cudaError_t build_ntype_ptr(const int32_t* ntype, int32_t num_nodes, int32_t num_ntypes, int32_t* ntype_ptr,
                            uint32_t* error_word, cudaStream_t stream) {
  if (!valid_count(num_nodes) || num_ntypes < 1 || num_ntypes == INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  if (error_word != nullptr) {
    HG_RETURN_IF_ERROR(launch(check_ntype_kernel, num_nodes, stream, ntype, num_nodes, num_ntypes, error_word));
  }
  return launch(segment_offsets_kernel<int32_t>, static_cast<int64_t>(num_ntypes) + 1, stream, ntype, num_nodes,
                num_ntypes, ntype_ptr);
}

cudaError_t build_tile_ptr(const int32_t* segment_ptr, int32_t num_segments, int32_t tile, int32_t* tile_ptr,
                           cudaStream_t stream, const DeviceAllocator* allocator) {
  if (!valid_count(num_segments) || tile < 1) {
    return cudaErrorInvalidValue;
  }
  HG_RETURN_IF_ERROR(launch(segment_tiles_kernel, static_cast<int64_t>(num_segments) + 1, stream, segment_ptr,
                            num_segments, tile, tile_ptr));
  // The total is at most the number of rows (< INT32_MAX), so no partial sum overflows.
  return exclusive_sum_in_place(tile_ptr, num_segments + 1, stream, allocator);
}

}  // namespace hectorgen::runtime
