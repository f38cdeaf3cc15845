// libtorch binding of unified tensors; see unified_torch.h.

#include "hectorgen/unified_torch.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "hectorgen/unified.h"

namespace hectorgen::runtime {
namespace {

namespace hu = hectorgen::unified;

// Numbers in messages through std::to_string (see graph_preprocess_torch.cpp: streaming integers into TORCH_CHECK
// crashed with torch 2.11 + GCC 13 on the GPU machines).
std::string num(int64_t v) { return std::to_string(v); }

#define HG_UNIFIED_CUDA_CHECK(expr, what)                                                          \
  do {                                                                                             \
    const cudaError_t hg_status_ = (expr);                                                         \
    TORCH_CHECK(hg_status_ == cudaSuccess, "hectorgen unified: ", what, " failed: ",               \
                cudaGetErrorName(hg_status_), " (", cudaGetErrorString(hg_status_), ")");          \
  } while (0)

// Bytes from t's first element to one past its last (0 for an empty tensor).
int64_t extent_bytes(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return (last + 1) * static_cast<int64_t>(t.element_size());
}

int64_t row_bytes_of(const at::Tensor& t) {
  return t.size(0) == 0 ? t.numel() * t.element_size() : t.numel() / t.size(0) * t.element_size();
}

// Restores a pinned storage's original allocation when the storage dies, after unpinning it.
struct PinnedContext {
  c10::DataPtr original;
  void* base;
};

void delete_pinned(void* context) {
  auto* pinned = static_cast<PinnedContext*>(context);
  hu::unpin(pinned->base);
  delete pinned;  // releases the original allocation
}

void check_table(const at::Tensor& table) {
  TORCH_CHECK(table.device().is_cpu(), "hectorgen unified: the table must be a unified (CPU) tensor, got ",
              table.device());
  TORCH_CHECK(table.dim() >= 1 && table.is_contiguous(), "hectorgen unified: the table must be contiguous with >= 1 "
              "dimension");
}

}  // namespace

at::Tensor unified_empty(const std::vector<int64_t>& sizes, at::ScalarType dtype) {
  int64_t numel = 1;
  for (int64_t size : sizes) {
    TORCH_CHECK(size >= 0, "hectorgen unified: negative size ", num(size));
    numel *= size;
  }
  const auto bytes = static_cast<std::size_t>(numel) * c10::elementSize(dtype);
  void* memory = hu::allocate(bytes);
  return at::for_blob(memory, sizes)
      .deleter([](void* pointer) { hu::deallocate(pointer); })
      .options(at::TensorOptions().dtype(dtype).device(at::kCPU))
      .make_tensor();
}

bool unified_pin(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "hectorgen unified: only CPU tensors can be pinned in place, got ", t.device());
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const std::size_t bytes = storage->nbytes();
  if (bytes == 0) return false;
  void* base = storage->mutable_data();
  const hu::PinResult pinned = hu::pin(base, bytes);
  if (pinned == hu::PinResult::kAlreadyMapped) return false;
  // The storage now owns a DataPtr whose context holds the original one: when the storage dies, the range is
  // unpinned (or, pinned by someone else, forgotten by the registry) first, then the original allocation is
  // released as it would have been.
  c10::DataPtr original = storage->set_data_ptr(c10::DataPtr(base, c10::Device(c10::kCPU)));
  auto* context = new PinnedContext{std::move(original), base};
  storage->set_data_ptr_noswap(c10::DataPtr(base, context, &delete_pinned, c10::Device(c10::kCPU)));
  return pinned == hu::PinResult::kPinned;
}

bool unified_is_mapped(const at::Tensor& t) {
  if (!t.device().is_cpu()) return false;
  const int64_t bytes = extent_bytes(t);
  return bytes == 0 ? hu::device_address(t.storage().data(), 1) != nullptr
                    : hu::device_address(t.data_ptr(), static_cast<std::size_t>(bytes)) != nullptr;
}

at::Tensor unified_cuda_view(const at::Tensor& t, int64_t device) {
  TORCH_CHECK(t.device().is_cpu(), "hectorgen unified: cuda_view of a non-CPU tensor (", t.device(), ")");
  const int64_t bytes = std::max<int64_t>(extent_bytes(t), 1);
  const void* host = t.numel() == 0 ? t.storage().data() : t.data_ptr();
  void* address = hu::device_address(host, static_cast<std::size_t>(bytes));
  TORCH_CHECK(address != nullptr, "hectorgen unified: the tensor's memory is not GPU-mapped (not a unified tensor)");
  const c10::Device cuda(c10::kCUDA, static_cast<c10::DeviceIndex>(device));
  c10::Storage owner = t.storage();  // keeps the host memory alive as long as the alias
  return at::for_blob(address, t.sizes())
      .strides(t.strides())
      .deleter([owner, host, cuda](void*) {
        // Work queued on the alias may still read the memory: freeing the storage must wait for it.
        hu::record_use(host, at::cuda::getCurrentCUDAStream(cuda.index()).stream());
      })
      .target_device(cuda)
      .options(at::TensorOptions().dtype(t.scalar_type()).device(cuda))
      .make_tensor();
}

void unified_gather(const at::Tensor& table, const at::Tensor& index, const std::optional<at::Tensor>& positions,
                    const at::Tensor& out, const at::Tensor& error) {
  check_table(table);
  TORCH_CHECK(index.is_cuda() && index.dim() == 1 && index.is_contiguous() &&
                  (index.scalar_type() == at::kLong || index.scalar_type() == at::kInt),
              "hectorgen unified: the index must be a contiguous 1-D int32/int64 CUDA tensor");
  TORCH_CHECK(error.is_cuda() && error.numel() == 1 && error.scalar_type() == at::kLong,
              "hectorgen unified: the error word must be an int64 CUDA tensor of one element");
  const int64_t count = index.numel();
  const int64_t row_bytes = row_bytes_of(table);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == table.scalar_type() && out.dim() == table.dim() &&
                  out.size(0) == count && out.numel() * out.element_size() == count * row_bytes,
              "hectorgen unified: out must be contiguous with table's dtype and row shape and ", num(count), " rows");
  const c10::cuda::CUDAGuard guard(index.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(index.device().index()).stream();
  hu::GatherArgs args;
  args.num_rows = table.size(0);
  args.row_bytes = row_bytes;
  args.count = count;
  args.index = index.data_ptr();
  args.index_is_int64 = index.scalar_type() == at::kLong;
  args.error = reinterpret_cast<unsigned long long*>(error.data_ptr<int64_t>());
  if (positions) {
    TORCH_CHECK(positions->is_cuda() && positions->scalar_type() == at::kLong && positions->numel() == count &&
                    positions->is_contiguous(),
                "hectorgen unified: positions must be a contiguous int64 CUDA tensor like the index");
    args.positions = positions->data_ptr<int64_t>();
  }
  if (count == 0 || row_bytes == 0) return;
  args.table = hu::device_address(table.data_ptr(), static_cast<std::size_t>(table.numel() * table.element_size()));
  TORCH_CHECK(args.table != nullptr, "hectorgen unified: the table's memory is not GPU-mapped (not a unified tensor)");
  if (out.is_cuda()) {
    args.out = out.data_ptr();
  } else {
    args.out = hu::device_address(out.data_ptr(), static_cast<std::size_t>(count * row_bytes));
    TORCH_CHECK(args.out != nullptr, "hectorgen unified: out must be a CUDA tensor or a unified tensor");
  }
  HG_UNIFIED_CUDA_CHECK(hu::launch_gather(args, stream), "the gather kernel's launch");
  hu::record_use(table.data_ptr(), stream);
  if (!out.is_cuda()) hu::record_use(out.data_ptr(), stream);
}

int64_t unified_gather_cpu(const at::Tensor& table, const at::Tensor& index, const at::Tensor& out,
                           int64_t chunk_bytes) {
  check_table(table);
  TORCH_CHECK(index.device().is_cpu() && index.dim() == 1 && index.is_contiguous() &&
                  (index.scalar_type() == at::kLong || index.scalar_type() == at::kInt),
              "hectorgen unified: the CPU gather's index must be a contiguous 1-D int32/int64 CPU tensor");
  const int64_t count = index.numel();
  const int64_t row_bytes = row_bytes_of(table);
  TORCH_CHECK(out.is_cuda() && out.is_contiguous() && out.numel() * out.element_size() == count * row_bytes,
              "hectorgen unified: the CPU gather's out must be a contiguous CUDA tensor of ", num(count), " rows");
  if (count == 0 || row_bytes == 0) return -1;
  const c10::cuda::CUDAGuard guard(out.device());
  const int64_t num_rows = table.size(0);
  std::atomic<int64_t> first_bad{count};  // the lowest position of an index outside [0, num_rows)
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream(out.device().index()).stream();
  const int64_t rows_per_chunk = std::max<int64_t>(1, std::min(count, chunk_bytes / row_bytes));
  const auto chunk_size = static_cast<std::size_t>(rows_per_chunk * row_bytes);

  // Two staging chunks from the pool: the CPU fills one while the copy engine drains the other.
  struct Staging {
    void* memory = nullptr;
    cudaEvent_t drained = nullptr;
    bool pending = false;
  } staging[2];
  auto release = [&]() {
    for (Staging& s : staging) {
      if (s.drained != nullptr) {
        if (s.pending) cudaEventSynchronize(s.drained);
        cudaEventDestroy(s.drained);
      }
      if (s.memory != nullptr) hu::deallocate(s.memory);
    }
  };
  try {
    for (Staging& s : staging) {
      s.memory = hu::allocate(chunk_size);
      HG_UNIFIED_CUDA_CHECK(cudaEventCreateWithFlags(&s.drained, cudaEventDisableTiming), "cudaEventCreate");
    }
    const auto* source = static_cast<const unsigned char*>(table.data_ptr());
    auto* destination = static_cast<unsigned char*>(out.data_ptr());
    const bool wide = index.scalar_type() == at::kLong;
    const void* rows = index.data_ptr();
    // Rows per parallel task: about 64 KiB of copying, so that small rows do not drown in scheduling.
    const int64_t grain = std::max<int64_t>(1, (int64_t{64} << 10) / row_bytes);
    int64_t chunk = 0;
    for (int64_t first = 0; first < count; first += rows_per_chunk, ++chunk) {
      Staging& s = staging[chunk & 1];
      if (s.pending) HG_UNIFIED_CUDA_CHECK(cudaEventSynchronize(s.drained), "waiting for a staging copy");
      const int64_t n = std::min(rows_per_chunk, count - first);
      auto* stage = static_cast<unsigned char*>(s.memory);
      at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          const int64_t row = wide ? static_cast<const int64_t*>(rows)[first + r]
                                   : static_cast<const int32_t*>(rows)[first + r];
          if (row < 0 || row >= num_rows) {
            std::memset(stage + r * row_bytes, 0, static_cast<std::size_t>(row_bytes));
            int64_t seen = first_bad.load();
            while (first + r < seen && !first_bad.compare_exchange_weak(seen, first + r)) {
            }
            continue;
          }
          std::memcpy(stage + r * row_bytes, source + row * row_bytes, static_cast<std::size_t>(row_bytes));
        }
      });
      HG_UNIFIED_CUDA_CHECK(cudaMemcpyAsync(destination + first * row_bytes, stage,
                                            static_cast<std::size_t>(n * row_bytes), cudaMemcpyHostToDevice, stream),
                            "the staging copy");
      HG_UNIFIED_CUDA_CHECK(cudaEventRecord(s.drained, stream), "cudaEventRecord");
      s.pending = true;
    }
  } catch (...) {
    release();
    throw;
  }
  release();
  return first_bad.load() == count ? -1 : first_bad.load();
}

std::map<std::string, int64_t> unified_gather_plan(const at::Tensor& table, const at::Tensor& out) {
  check_table(table);
  hu::GatherArgs args;
  args.table = hu::device_address(table.data_ptr(), 1);
  args.row_bytes = row_bytes_of(table);
  args.count = out.size(0);
  args.out = out.data_ptr();
  const int device = out.is_cuda() ? out.device().index() : 0;
  const hu::GatherPlan plan = hu::plan_gather(args, device);
  return {{"lanes_per_row", plan.lanes_per_row}, {"store_bytes", plan.store_bytes}, {"blocks", plan.blocks}};
}

std::map<std::string, int64_t> unified_pool_stats() {
  const hu::PoolStats s = hu::pool_stats();
  return {{"reserved_bytes", static_cast<int64_t>(s.reserved_bytes)},
          {"in_use_bytes", static_cast<int64_t>(s.in_use_bytes)},
          {"chunks", static_cast<int64_t>(s.chunks)},
          {"source_allocations", static_cast<int64_t>(s.source_allocations)},
          {"source_releases", static_cast<int64_t>(s.source_releases)},
          {"largest_free_block", static_cast<int64_t>(s.largest_free_block)}};
}

int64_t unified_trim_pool() { return static_cast<int64_t>(hu::trim_pool()); }

void unified_set_pool_limit(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "hectorgen unified: the pool limit must be >= 0 (0: none), got ", num(bytes));
  hu::set_pool_limit(static_cast<std::size_t>(bytes));
}

}  // namespace hectorgen::runtime
