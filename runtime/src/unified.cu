// Unified tensors' memory (a pool of pinned, GPU-mapped host memory; in-place pinning; the registry of mapped
// ranges) and the zero-copy gather kernel. See hectorgen/unified.h and docs/unified_tensor.md.

#include "hectorgen/unified.h"

#include "hectorgen/unified_gather.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace hectorgen::unified {
namespace {

std::string cuda_error(const char* what, cudaError_t status) {
  return std::string(what) + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}

// ---- registry of GPU-mapped host ranges -------------------------------------------------------------------------

enum class RangeKind { kPoolChunk, kPinnedHere, kMappedElsewhere };

struct Range {
  std::size_t bytes = 0;
  char* device = nullptr;
  RangeKind kind = RangeKind::kPoolChunk;
  std::map<cudaStream_t, cudaEvent_t> uses;  // the last recorded use on each stream
};

class Registry {
 public:
  void add(const void* host, std::size_t bytes, void* device, RangeKind kind) {
    std::lock_guard<std::mutex> lock(mutex_);
    Range& range = ranges_[address(host)];
    range.bytes = bytes;
    range.device = static_cast<char*>(device);
    range.kind = kind;
  }

  // Removes the range that starts at `host` after its recorded uses have completed; returns its kind, or
  // kMappedElsewhere when there is none.
  RangeKind remove(const void* host) {
    std::vector<cudaEvent_t> events;
    RangeKind kind = RangeKind::kMappedElsewhere;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = ranges_.find(address(host));
      if (it == ranges_.end()) return kind;
      kind = it->second.kind;
      for (auto& [stream, event] : it->second.uses) events.push_back(event);
      ranges_.erase(it);
    }
    for (cudaEvent_t event : events) {
      cudaEventSynchronize(event);
      cudaEventDestroy(event);
    }
    return kind;
  }

  // The range holding all of [host, host + bytes), as (begin, range) under the lock, or nullptr.
  template <class Fn>
  auto with_range(const void* host, std::size_t bytes, Fn&& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::uintptr_t begin = address(host);
    auto it = ranges_.upper_bound(begin);
    Range* found = nullptr;
    std::uintptr_t found_begin = 0;
    if (it != ranges_.begin()) {
      --it;
      if (begin >= it->first && begin + bytes <= it->first + it->second.bytes) {
        found = &it->second;
        found_begin = it->first;
      }
    }
    return fn(found_begin, found);
  }

  // Waits for the recorded uses of the range holding `host` (none: returns at once).
  void wait_for_uses(const void* host) {
    std::vector<cudaEvent_t> events;
    with_range(host, 1, [&](std::uintptr_t, Range* range) {
      if (range != nullptr) {
        for (auto& [stream, event] : range->uses) events.push_back(event);
      }
      return 0;
    });
    // Events are destroyed only in remove(), which a concurrent user of the same memory cannot race with.
    for (cudaEvent_t event : events) cudaEventSynchronize(event);
  }

 private:
  static std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

  std::mutex mutex_;
  std::map<std::uintptr_t, Range> ranges_;
};

// Process-wide and never destroyed: tensors may be released after static destructors have run.
Registry& registry() {
  static Registry* instance = new Registry();
  return *instance;
}

// The pool's source: pinned, mapped, portable (visible to every GPU) chunks, entered in the registry.
struct CudaHostSource {
  void* allocate(std::size_t bytes) {
    void* host = nullptr;
    if (const cudaError_t status = cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
        status != cudaSuccess) {
      cudaGetLastError();  // clear the (non-sticky) error so that later calls do not see it
      failure = cuda_error("cudaHostAlloc", status);
      return nullptr;
    }
    void* device = nullptr;
    if (const cudaError_t status = cudaHostGetDevicePointer(&device, host, 0); status != cudaSuccess) {
      cudaGetLastError();
      cudaFreeHost(host);
      failure = cuda_error("cudaHostGetDevicePointer", status);
      return nullptr;
    }
    registry().add(host, bytes, device, RangeKind::kPoolChunk);
    return host;
  }
  std::string last_failure() const { return failure; }
  void release(void* host, std::size_t) {
    registry().remove(host);
    cudaFreeHost(host);
  }

  std::string failure;  // the pool calls allocate under its lock
};

using Pool = HostPool<CudaHostSource>;

Pool& pool() {
  static Pool* instance = new Pool(CudaHostSource{});
  return *instance;
}

}  // namespace

// ---- memory ---------------------------------------------------------------------------------------------------

void* allocate(std::size_t bytes) { return pool().allocate(bytes); }

void deallocate(void* pointer) {
  if (pointer == nullptr) return;
  // GPU work recorded on this block's chunk may still read it: wait for it before the block can be reused.
  registry().wait_for_uses(pointer);
  pool().deallocate(pointer);
}

PoolStats pool_stats() { return pool().stats(); }
std::size_t trim_pool() { return pool().trim(); }
void set_pool_limit(std::size_t bytes) { pool().set_limit(bytes); }

PinResult pin(void* host, std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (device_address(host, bytes) != nullptr) return PinResult::kAlreadyMapped;
  // Pinned by someone else (torch's pin_memory, cudaHostAlloc elsewhere): use its mapping when it covers the range.
  cudaPointerAttributes first{}, last{};
  if (cudaPointerGetAttributes(&first, host) == cudaSuccess && first.type == cudaMemoryTypeHost &&
      first.devicePointer != nullptr &&
      cudaPointerGetAttributes(&last, static_cast<char*>(host) + bytes - 1) == cudaSuccess &&
      last.type == cudaMemoryTypeHost &&
      static_cast<char*>(last.devicePointer) == static_cast<char*>(first.devicePointer) + (bytes - 1)) {
    registry().add(host, bytes, first.devicePointer, RangeKind::kMappedElsewhere);
    return PinResult::kAdopted;
  }
  cudaGetLastError();
  const cudaError_t status = cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw NotPinnable(cuda_error(("pinning " + std::to_string(bytes) + " bytes of host memory in place "
                                  "(cudaHostRegister)").c_str(), status));
  }
  void* device = nullptr;
  const cudaError_t mapped = cudaHostGetDevicePointer(&device, host, 0);
  if (mapped != cudaSuccess) {
    cudaGetLastError();
    cudaHostUnregister(host);
    throw NotPinnable(cuda_error("mapping pinned host memory for the GPU (cudaHostGetDevicePointer)", mapped));
  }
  registry().add(host, bytes, device, RangeKind::kPinnedHere);
  return PinResult::kPinned;
}

void unpin(void* host) {
  if (registry().remove(host) == RangeKind::kPinnedHere) cudaHostUnregister(host);
}

void* device_address(const void* host, std::size_t bytes) {
  return registry().with_range(host, std::max<std::size_t>(bytes, 1), [&](std::uintptr_t begin, Range* range) {
    return range == nullptr ? static_cast<void*>(nullptr)
                            : static_cast<void*>(range->device + (reinterpret_cast<std::uintptr_t>(host) - begin));
  });
}

void record_use(const void* host, cudaStream_t stream) {
  registry().with_range(host, 1, [&](std::uintptr_t, Range* range) {
    if (range == nullptr) return 0;
    cudaEvent_t& event = range->uses[stream];
    if (event == nullptr && cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      range->uses.erase(stream);
      cudaStreamSynchronize(stream);  // no event to wait on later: wait now
      return 0;
    }
    cudaEventRecord(event, stream);
    return 0;
  });
}

// ---- gather ---------------------------------------------------------------------------------------------------

namespace {

namespace gm = gather_math;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = gm::kUnroll;

template <int kBytes>
struct Word;
template <>
struct Word<16> { using type = uint4; };
template <>
struct Word<8> { using type = uint2; };
template <>
struct Word<4> { using type = unsigned; };
template <>
struct Word<2> { using type = unsigned short; };
template <>
struct Word<1> { using type = unsigned char; };

// One group of kLanes lanes gathers one row at a time; a warp holds 32 / kLanes groups. The address arithmetic is
// hectorgen/unified_gather.h's (which says how rows are read in whole lines and stored): kStore 16 stores the loaded
// sectors directly; narrower rows are realigned through shared memory.
template <int kLanes, int kStore, typename Index>
__global__ void __launch_bounds__(kThreads) gather_rows(GatherArgs args) {
  using StoreWord = typename Word<kStore>::type;
  constexpr int kGroups = 32 / kLanes;
  constexpr std::int64_t kStep = gm::step_bytes<kLanes>();
  __shared__ uint4 stage[kStore == 16 ? 1 : kWarps * 32 * kUnroll];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int group = lane / kLanes;
  const int sub = lane % kLanes;
  const unsigned mask = kLanes == 32 ? 0xffffffffu : ((1u << kLanes) - 1u) << (group * kLanes);
  uint4* my_stage = stage + (kStore == 16 ? 0 : (warp * 32 + group * kLanes) * kUnroll);
  const unsigned char* my_stage_bytes = reinterpret_cast<const unsigned char*>(my_stage);

  const Index* index = static_cast<const Index*>(args.index);
  const std::uintptr_t table = reinterpret_cast<std::uintptr_t>(args.table);
  const std::int64_t row_bytes = args.row_bytes;
  const std::int64_t stride = std::int64_t{gridDim.x} * kWarps * kGroups;
  for (std::int64_t i = (std::int64_t{blockIdx.x} * kWarps + warp) * kGroups + group; i < args.count; i += stride) {
    const std::int64_t row = static_cast<std::int64_t>(index[i]);
    const std::int64_t out_row = args.positions == nullptr ? i : args.positions[i];
    unsigned char* dst = static_cast<unsigned char*>(args.out) + out_row * row_bytes;
    if (row < 0 || row >= args.num_rows) {
      if (sub == 0) atomicMin(args.error, static_cast<unsigned long long>(out_row));
      for (std::int64_t b = std::int64_t{sub} * kStore; b < row_bytes; b += std::int64_t{kLanes} * kStore) {
        *reinterpret_cast<StoreWord*>(dst + b) = StoreWord{};
      }
      continue;
    }
    const gm::RowSpan span =
        gm::row_span(table + static_cast<std::uintptr_t>(row) * static_cast<std::uintptr_t>(row_bytes), row_bytes);
    for (std::int64_t base = 0; base < span.end; base += kStep) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const std::int64_t at = gm::sector<kLanes>(base, u, sub);
        v[u] = make_uint4(0, 0, 0, 0);
        if (gm::overlaps(at, span)) v[u] = *reinterpret_cast<const uint4*>(span.line + at);
      }
      if constexpr (kStore == 16) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const std::int64_t at = gm::sector<kLanes>(base, u, sub);
          if (gm::inside(at, span)) *reinterpret_cast<uint4*>(dst + (at - span.head)) = v[u];
        }
      } else {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) my_stage[u * kLanes + sub] = v[u];
        __syncwarp(mask);
        std::int64_t lo = 0, hi = 0;
        gm::step_range<kLanes>(base, span, lo, hi);
        for (std::int64_t b = lo + std::int64_t{sub} * kStore; b < hi; b += std::int64_t{kLanes} * kStore) {
          *reinterpret_cast<StoreWord*>(dst + (b - span.head)) =
              *reinterpret_cast<const StoreWord*>(my_stage_bytes + (b - base));
        }
        __syncwarp(mask);
      }
    }
  }
}

int multiprocessors(int device) {
  static std::mutex mutex;
  static std::map<int, int> cached;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cached.find(device);
  if (it != cached.end()) return it->second;
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0) {
    cudaGetLastError();
    count = 132;
  }
  cached[device] = count;
  return count;
}

template <int kLanes, int kStore>
void launch(const GatherArgs& args, int blocks, cudaStream_t stream) {
  if (args.index_is_int64) {
    gather_rows<kLanes, kStore, std::int64_t><<<blocks, kThreads, 0, stream>>>(args);
  } else {
    gather_rows<kLanes, kStore, std::int32_t><<<blocks, kThreads, 0, stream>>>(args);
  }
}

template <int kLanes>
void launch_lanes(const GatherArgs& args, int store, int blocks, cudaStream_t stream) {
  switch (store) {
    case 16: launch<kLanes, 16>(args, blocks, stream); break;
    case 8: launch<kLanes, 8>(args, blocks, stream); break;
    case 4: launch<kLanes, 4>(args, blocks, stream); break;
    case 2: launch<kLanes, 2>(args, blocks, stream); break;
    default: launch<kLanes, 1>(args, blocks, stream); break;
  }
}

}  // namespace

GatherPlan plan_gather(const GatherArgs& args, int device) {
  GatherPlan plan;
  plan.lanes_per_row = gm::lanes_per_row(args.row_bytes);
  plan.store_bytes = gm::widest_store(reinterpret_cast<std::uintptr_t>(args.table),
                                      static_cast<std::uintptr_t>(args.row_bytes),
                                      reinterpret_cast<std::uintptr_t>(args.out));
  const std::int64_t rows_per_block = std::int64_t{kWarps} * (32 / plan.lanes_per_row);
  const std::int64_t wanted = (args.count + rows_per_block - 1) / rows_per_block;
  // Enough resident blocks to keep many requests in flight (8 blocks of 256 threads fill an SM), no more.
  const std::int64_t resident = std::int64_t{multiprocessors(device)} * 8;
  plan.blocks = static_cast<int>(std::max<std::int64_t>(1, std::min(wanted, resident)));
  return plan;
}

cudaError_t launch_gather(const GatherArgs& args, cudaStream_t stream) {
  if (args.count < 0 || args.row_bytes <= 0 || args.num_rows < 0 || args.error == nullptr) return cudaErrorInvalidValue;
  if (args.count == 0) return cudaSuccess;
  if (args.table == nullptr || args.index == nullptr || args.out == nullptr) return cudaErrorInvalidValue;
  int device = 0;
  if (cudaError_t status = cudaGetDevice(&device); status != cudaSuccess) return status;
  const GatherPlan plan = plan_gather(args, device);
  switch (plan.lanes_per_row) {
    case 8: launch_lanes<8>(args, plan.store_bytes, plan.blocks, stream); break;
    case 16: launch_lanes<16>(args, plan.store_bytes, plan.blocks, stream); break;
    default: launch_lanes<32>(args, plan.store_bytes, plan.blocks, stream); break;
  }
  return cudaGetLastError();
}

}  // namespace hectorgen::unified
