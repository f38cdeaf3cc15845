// libtorch binding of the graph preprocessing runtime; see graph_preprocess_torch.h.

#include "hectorgen/graph_preprocess_torch.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <sstream>

#include "hectorgen/graph.h"
#include "hectorgen/runtime_version.h"

namespace hectorgen::runtime {
namespace {

// Largest N or E: offsets arrays have count + 1 entries and their values must fit int32.
constexpr int64_t kMaxCount = INT32_MAX - 1;

// Error messages format numbers with std::to_string: streaming integers into TORCH_CHECK's ostringstream
// from this extension crashed (SIGSEGV in ostream::operator<<(long)) with torch 2.11 + GCC 13 on the GPU
// machines, while strings, devices and dtypes stream fine.
std::string num(int64_t v) { return std::to_string(v); }
std::string shape(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

#define HG_CUDA_CHECK(expr, what)                                                                  \
  do {                                                                                             \
    const cudaError_t hg_status_ = (expr);                                                         \
    TORCH_CHECK(hg_status_ == cudaSuccess, "hectorgen preprocess: ", what, " failed: ",            \
                cudaGetErrorName(hg_status_), " (", cudaGetErrorString(hg_status_), ")");          \
  } while (0)

enum LayoutBit : unsigned {
  kEtypeSortedCoo = 1u << 0,
  kCsrByDst = 1u << 1,
  kCsrBySrc = 1u << 2,
  kCompactSrcEtype = 1u << 3,
  kCompactDstEtype = 1u << 4,
  kInvRelationInDegree = 1u << 5,
  kNtypePtr = 1u << 6,
  kCsrByDstPairs = 1u << 7,
  kInColInvRelationInDegree = 1u << 8,
};

struct LayoutEntry {
  const char* name;
  LayoutBit bit;
};

constexpr LayoutEntry kLayouts[] = {
    {"etype_sorted_coo", kEtypeSortedCoo},
    {"csr_by_dst", kCsrByDst},
    {"csr_by_src", kCsrBySrc},
    {"compact_src_etype", kCompactSrcEtype},
    {"compact_dst_etype", kCompactDstEtype},
    {"inv_relation_in_degree", kInvRelationInDegree},
    {"ntype_ptr", kNtypePtr},
    {"csr_by_dst_pairs", kCsrByDstPairs},
    {"in_col_inv_relation_in_degree", kInColInvRelationInDegree},
};

// Every layout except ntype_ptr is defined on the etype-sorted COO.
constexpr unsigned kNeedsSortedCoo = kEtypeSortedCoo | kCsrByDst | kCsrBySrc | kCompactSrcEtype | kCompactDstEtype |
                                     kInvRelationInDegree | kCsrByDstPairs | kInColInvRelationInDegree;

unsigned parse_layouts(const std::vector<std::string>& layouts) {
  unsigned bits = 0;
  for (const std::string& name : layouts) {
    unsigned bit = 0;
    for (const LayoutEntry& entry : kLayouts) {
      if (name == entry.name) {
        bit = entry.bit;
      }
    }
    if (bit == 0) {
      std::ostringstream known;
      for (const LayoutEntry& entry : kLayouts) {
        known << (&entry == kLayouts ? "" : ", ") << entry.name;
      }
      TORCH_CHECK(false, "hectorgen preprocess: unknown layout '", name, "'; known layouts: ", known.str());
    }
    bits |= bit;
  }
  TORCH_CHECK((bits & kCsrByDstPairs) == 0 || (bits & (kCsrByDst | kCompactSrcEtype)) == (kCsrByDst | kCompactSrcEtype),
              "hectorgen preprocess: layout 'csr_by_dst_pairs' joins 'csr_by_dst' and 'compact_src_etype': ask for "
              "both with it");
  TORCH_CHECK((bits & kInColInvRelationInDegree) == 0 ||
                  (bits & (kCsrByDst | kInvRelationInDegree)) == (kCsrByDst | kInvRelationInDegree),
              "hectorgen preprocess: layout 'in_col_inv_relation_in_degree' joins 'csr_by_dst' and "
              "'inv_relation_in_degree': ask for both with it");
  return bits;
}

// Temporaries of the core functions come from PyTorch's caching allocator, ordered on the given stream.
cudaError_t torch_allocate(void* /*context*/, void** ptr, std::size_t bytes, cudaStream_t stream) {
  try {
    *ptr = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, stream);
    return cudaSuccess;
  } catch (...) {  // the core API is exception-free; an allocation failure becomes an error code
    *ptr = nullptr;
    return cudaErrorMemoryAllocation;
  }
}

void torch_deallocate(void* /*context*/, void* ptr, cudaStream_t /*stream*/) {
  try {
    c10::cuda::CUDACachingAllocator::raw_delete(ptr);
  } catch (...) {  // must not throw through the core; a failure here leaks one cached block at worst
  }
}

void check_index_tensor(const at::Tensor& t, const char* name, const at::Device& device, int64_t length) {
  TORCH_CHECK(t.is_cuda(), "hectorgen preprocess: ", name, " must be a CUDA tensor, got one on ", t.device());
  TORCH_CHECK(t.device() == device, "hectorgen preprocess: ", name, " is on ", t.device(),
              " but src is on ", device, "; all inputs must be on one device");
  TORCH_CHECK(t.dim() == 1, "hectorgen preprocess: ", name, " must be 1-D, got shape ", shape(t.sizes()));
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, "hectorgen preprocess: ", name,
              " must be int32 or int64, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "hectorgen preprocess: ", name, " must be contiguous (call .contiguous())");
  TORCH_CHECK(t.numel() == length, "hectorgen preprocess: ", name, " has ", num(t.numel()), " entries, expected ",
              num(length));
}

int32_t* i32(const at::Tensor& t) { return t.data_ptr<int32_t>(); }

// The int32 view of an index tensor: int32 input is used as is; int64 input is narrowed on the device, with
// entries outside [0, bound) turned into -1 so that validation reports them.
at::Tensor as_int32(const at::Tensor& t, int64_t bound, cudaStream_t stream) {
  if (t.scalar_type() == at::kInt) {
    return t;
  }
  at::Tensor out = at::empty({t.numel()}, t.options().dtype(at::kInt));
  HG_CUDA_CHECK(narrow_indices_to_int32(t.data_ptr<int64_t>(), i32(out), static_cast<int32_t>(t.numel()), bound,
                                        stream),
                "narrow_indices_to_int32");
  return out;
}

at::Tensor new_int32(int64_t length, const at::TensorOptions& options) {
  return at::empty({length}, options.dtype(at::kInt));
}

std::string describe_errors(uint32_t word) {
  std::ostringstream message;
  for (uint32_t bit = 1; bit != 0; bit <<= 1) {
    if ((word & bit) != 0) {
      message << "\n  - " << graph_error_string(bit);
    }
  }
  return message.str();
}

// A compact mapping of one endpoint, still holding its capacity-E buffers of U (+1) valid entries.
struct PendingCompact {
  std::string prefix;  // "unique_src" or "unique_dst"
  at::Tensor unique_node_capacity;
  at::Tensor pair_edge_ptr_capacity;
  at::Tensor node_pair_capacity;
  at::Tensor unique_etype_ptr;
};

}  // namespace

const char* version() { return HECTORGEN_RUNTIME_VERSION_STRING; }

const std::vector<std::string>& layout_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> result;
    for (const LayoutEntry& entry : kLayouts) {
      result.emplace_back(entry.name);
    }
    return result;
  }();
  return names;
}

std::map<std::string, at::Tensor> preprocess(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& etype,
                                             int64_t num_nodes, int64_t num_etypes,
                                             const std::optional<at::Tensor>& ntype,
                                             const std::vector<std::string>& layouts, int64_t num_ntypes,
                                             bool validate, int64_t gemm_tile, double compact_threshold,
                                             const std::optional<at::Tensor>& compact_mask) {
  const unsigned wanted = parse_layouts(layouts);

  // Argument checks.
  const int64_t num_edges = src.numel();
  TORCH_CHECK(0 <= num_nodes && num_nodes <= kMaxCount, "hectorgen preprocess: num_nodes must be in [0, ",
              num(kMaxCount), "] (int32 indices), got ", num(num_nodes));
  TORCH_CHECK(num_edges <= kMaxCount, "hectorgen preprocess: the number of edges must be at most ", num(kMaxCount),
              " (int32 indices), got ", num(num_edges));
  TORCH_CHECK(1 <= num_etypes && num_etypes <= kMaxCount, "hectorgen preprocess: num_etypes must be in [1, ",
              num(kMaxCount), "], got ", num(num_etypes));
  TORCH_CHECK(0 <= gemm_tile && gemm_tile <= kMaxCount, "hectorgen preprocess: gemm_tile must be in [0, ",
              num(kMaxCount), "] (0: no tile offsets), got ", num(gemm_tile));
  const at::Device device = src.device();
  check_index_tensor(src, "src", device, num_edges);
  check_index_tensor(dst, "dst", device, num_edges);
  check_index_tensor(etype, "etype", device, num_edges);
  if ((wanted & kNtypePtr) != 0) {
    TORCH_CHECK(ntype.has_value(), "hectorgen preprocess: layout 'ntype_ptr' needs the ntype tensor");
    check_index_tensor(*ntype, "ntype", device, num_nodes);
    TORCH_CHECK(num_ntypes == -1 || (1 <= num_ntypes && num_ntypes <= kMaxCount),
                "hectorgen preprocess: num_ntypes must be -1 (derive) or in [1, ", num(kMaxCount), "], got ",
                num(num_ntypes));
  }

  TORCH_CHECK(!std::isnan(compact_threshold),
              "hectorgen preprocess: compact_threshold must be a number >= 0, or < 0 for none; got NaN");
  TORCH_CHECK(!(compact_mask.has_value() && compact_threshold >= 0),
              "hectorgen preprocess: give compact_threshold or compact_mask, not both");
  if (compact_mask.has_value()) {
    const at::Tensor& mask = *compact_mask;
    TORCH_CHECK(mask.scalar_type() == at::kBool, "hectorgen preprocess: compact_mask must be a bool tensor, got ",
                mask.scalar_type());
    TORCH_CHECK(mask.dim() == 1 && mask.numel() == num_etypes, "hectorgen preprocess: compact_mask must have shape [",
                num(num_etypes), "] (one entry per relation), got ", shape(mask.sizes()));
    TORCH_CHECK(!mask.is_cuda() || mask.device() == device, "hectorgen preprocess: compact_mask is on ",
                mask.device(), " but src is on ", device);
  }

  const c10::cuda::CUDAGuard device_guard(device);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(device.index()).stream();
  const DeviceAllocator allocator{nullptr, &torch_allocate, &torch_deallocate};
  const at::TensorOptions options = src.options();
  const auto n = static_cast<int32_t>(num_nodes);
  const auto e = static_cast<int32_t>(num_edges);
  const auto r = static_cast<int32_t>(num_etypes);

  // Which relations the compact layouts compact; a CPU mask is copied to the device (the queued work reads it).
  at::Tensor device_mask;
  CompactPolicy policy = CompactPolicy::all();
  if (compact_mask.has_value()) {
    device_mask = compact_mask->to(device).contiguous();
    policy = CompactPolicy::relations(reinterpret_cast<const uint8_t*>(device_mask.data_ptr<bool>()));
  } else if (compact_threshold >= 0) {
    policy = CompactPolicy::ratio_at_most(compact_threshold);
  }

  std::map<std::string, at::Tensor> result;
  std::vector<PendingCompact> pending;
  const at::Tensor error_word = at::zeros({1}, options.dtype(at::kInt));
  auto* error_bits = reinterpret_cast<uint32_t*>(i32(error_word));
  // GEMM row-tile offsets [S+1] of segment offsets [S+1].
  auto tile_ptr = [&](const at::Tensor& segment_ptr, int64_t num_segments, const char* what) {
    const at::Tensor tiles = new_int32(num_segments + 1, options);
    HG_CUDA_CHECK(build_tile_ptr(i32(segment_ptr), static_cast<int32_t>(num_segments),
                                 static_cast<int32_t>(gemm_tile), i32(tiles), stream, &allocator),
                  what);
    return tiles;
  };

  if ((wanted & kNeedsSortedCoo) != 0) {
    const at::Tensor src32 = as_int32(src, num_nodes, stream);
    const at::Tensor dst32 = as_int32(dst, num_nodes, stream);
    const at::Tensor etype32 = as_int32(etype, num_etypes, stream);
    if (validate) {
      HG_CUDA_CHECK(validate_coo(i32(src32), i32(dst32), i32(etype32), e, n, r, error_bits, stream), "validate_coo");
    }

    const at::Tensor perm = new_int32(e, options);
    const at::Tensor sorted_src = new_int32(e, options);
    const at::Tensor sorted_dst = new_int32(e, options);
    const at::Tensor sorted_etype = new_int32(e, options);
    const at::Tensor etype_ptr = new_int32(num_etypes + 1, options);
    HG_CUDA_CHECK(sort_edges_by_etype(i32(src32), i32(dst32), i32(etype32), n, e, r,
                                      EtypeSortedCoo{i32(perm), i32(sorted_src), i32(sorted_dst), i32(sorted_etype),
                                                     i32(etype_ptr)},
                                      stream, &allocator),
                  "sort_edges_by_etype");
    if ((wanted & kEtypeSortedCoo) != 0) {
      result["perm"] = perm;
      result["sorted_src"] = sorted_src;
      result["sorted_dst"] = sorted_dst;
      result["sorted_etype"] = sorted_etype;
      result["etype_ptr"] = etype_ptr;
      if (gemm_tile > 0) {
        result["etype_tile_ptr"] = tile_ptr(etype_ptr, num_etypes, "build_tile_ptr (etype)");
      }
    }

    SortedCooView graph;
    graph.num_nodes = n;
    graph.num_edges = e;
    graph.num_etypes = r;
    graph.src = i32(sorted_src);
    graph.dst = i32(sorted_dst);
    graph.etype = i32(sorted_etype);

    // CSR by dst (incoming edges) and by src (outgoing edges).
    for (const bool by_dst : {true, false}) {
      if ((wanted & (by_dst ? kCsrByDst : kCsrBySrc)) == 0) {
        continue;
      }
      const std::string prefix = by_dst ? "in_" : "out_";
      const at::Tensor row_ptr = new_int32(num_nodes + 1, options);
      const at::Tensor col_idx = new_int32(e, options);
      const at::Tensor col_eid = new_int32(e, options);
      const at::Tensor col_etype = new_int32(e, options);
      const Csr csr{i32(row_ptr), i32(col_idx), i32(col_eid), i32(col_etype)};
      HG_CUDA_CHECK(by_dst ? build_csr_by_dst(graph, csr, stream, &allocator)
                           : build_csr_by_src(graph, csr, stream, &allocator),
                    by_dst ? "build_csr_by_dst" : "build_csr_by_src");
      result[prefix + "row_ptr"] = row_ptr;
      result[prefix + (by_dst ? "col_src" : "col_dst")] = col_idx;
      result[prefix + "col_eid"] = col_eid;
      result[prefix + "col_etype"] = col_etype;
    }

    // Compact materialization mappings with their inverses; the arrays of U (+1) entries are trimmed after the
    // read-back of U below.
    for (const bool by_src : {true, false}) {
      if ((wanted & (by_src ? kCompactSrcEtype : kCompactDstEtype)) == 0) {
        continue;
      }
      const std::string side = by_src ? "src" : "dst";
      const std::string prefix = "unique_" + side;
      const at::Tensor unique_node = new_int32(e, options);
      const at::Tensor unique_etype_ptr = new_int32(num_etypes + 1, options);
      const at::Tensor edge_to_unique = new_int32(e, options);
      const at::Tensor pair_edge_ptr = new_int32(num_edges + 1, options);
      const at::Tensor pair_edge_eid = new_int32(e, options);
      const at::Tensor node_pair_ptr = new_int32(num_nodes + 1, options);
      const at::Tensor node_pair = new_int32(e, options);
      CompactMapping mapping{i32(unique_node), i32(unique_etype_ptr), i32(edge_to_unique)};
      mapping.pair_edge_ptr = i32(pair_edge_ptr);
      mapping.pair_edge_eid = i32(pair_edge_eid);
      mapping.node_pair_ptr = i32(node_pair_ptr);
      mapping.node_pair = i32(node_pair);
      const at::Tensor relation_pairs = new_int32(num_etypes, options);
      const at::Tensor relation_compacted = at::empty({num_etypes}, options.dtype(at::kBool));
      const CompactChoice choice{i32(relation_pairs),
                                 reinterpret_cast<uint8_t*>(relation_compacted.data_ptr<bool>())};
      HG_CUDA_CHECK(build_compact_mapping(graph, by_src ? Endpoint::kSrc : Endpoint::kDst, policy, mapping, choice,
                                          stream, &allocator),
                    "build_compact_mapping");
      result[prefix + "_relation_pairs"] = relation_pairs;
      result[side + "_relation_compacted"] = relation_compacted;
      result[prefix + "_etype_ptr"] = unique_etype_ptr;
      result["edge_to_" + prefix] = edge_to_unique;
      result[prefix + "_edge_eid"] = pair_edge_eid;
      result[prefix + "_node_ptr"] = node_pair_ptr;
      if (gemm_tile > 0) {
        result[prefix + "_tile_ptr"] = tile_ptr(unique_etype_ptr, num_etypes, "build_tile_ptr (compact)");
      }
      pending.push_back({prefix, unique_node, pair_edge_ptr, node_pair, unique_etype_ptr});
    }

    // The pair of each incoming-edge CSR position: one gather, so that node kernels read it in CSR order.
    if ((wanted & kCsrByDstPairs) != 0) {
      result["in_col_unique_src"] = result.at("edge_to_unique_src").index_select(0, result.at("in_col_eid"));
    }

    if ((wanted & kInvRelationInDegree) != 0) {
      const at::Tensor inv_relation_in_degree = at::empty({num_edges}, options.dtype(at::kFloat));
      HG_CUDA_CHECK(build_inv_relation_in_degree(graph, inv_relation_in_degree.data_ptr<float>(), stream, &allocator),
                    "build_inv_relation_in_degree");
      result["inv_relation_in_degree"] = inv_relation_in_degree;
    }

    // The same in CSR order: one gather, so that node kernels read a node's in-edges' norms in CSR order.
    if ((wanted & kInColInvRelationInDegree) != 0) {
      result["in_col_inv_relation_in_degree"] =
          result.at("inv_relation_in_degree").index_select(0, result.at("in_col_eid"));
    }
  }

  // Node type segments are queued last: deriving num_ntypes may synchronise.
  if ((wanted & kNtypePtr) != 0) {
    const at::Tensor ntype32 = as_int32(*ntype, INT32_MAX, stream);
    if (num_ntypes == -1) {
      // One host synchronisation. Out-of-range entries (negative here) are reported by validation.
      num_ntypes = num_nodes > 0 ? std::max<int64_t>(ntype32.max().item<int32_t>() + int64_t{1}, 1) : 1;
      TORCH_CHECK(num_ntypes <= kMaxCount, "hectorgen preprocess: derived num_ntypes ", num(num_ntypes), " is too large");
    }
    const at::Tensor ntype_ptr = new_int32(num_ntypes + 1, options);
    HG_CUDA_CHECK(build_ntype_ptr(i32(ntype32), n, static_cast<int32_t>(num_ntypes), i32(ntype_ptr),
                                  validate ? error_bits : nullptr, stream),
                  "build_ntype_ptr");
    result["ntype_ptr"] = ntype_ptr;
    result["ntype"] = ntype32.is_same(*ntype) ? ntype32.clone() : ntype32;  // the graph owns its tensors
    if (gemm_tile > 0) {
      result["ntype_tile_ptr"] = tile_ptr(ntype_ptr, num_ntypes, "build_tile_ptr (ntype)");
    }
  }

  if (validate) {
    const auto word = static_cast<uint32_t>(error_word.item<int32_t>());  // host sync
    TORCH_CHECK(word == 0, "hectorgen preprocess: invalid graph:", describe_errors(word));
  }
  for (const PendingCompact& compact : pending) {
    const int64_t num_unique = compact.unique_etype_ptr[num_etypes].item<int32_t>();  // host sync
    result[compact.prefix] = compact.unique_node_capacity.narrow(0, 0, num_unique).clone();
    result[compact.prefix + "_edge_ptr"] = compact.pair_edge_ptr_capacity.narrow(0, 0, num_unique + 1).clone();
    result[compact.prefix + "_node_pair"] = compact.node_pair_capacity.narrow(0, 0, num_unique).clone();
  }
  return result;
}

}  // namespace hectorgen::runtime
