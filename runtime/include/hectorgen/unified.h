// Unified tensors' memory and gather (issue 10; docs/unified_tensor.md): host memory that the GPU reads directly
// over PCIe (zero-copy), and the kernel that gathers rows of such a table into GPU memory.
//
//   memory    allocate()/deallocate(): pinned, GPU-mapped host memory from a process-wide pool
//             (hectorgen/unified_pool.h over cudaHostAlloc(Mapped | Portable)): a few large chunks, sub-allocated.
//             pin()/unpin(): maps an existing host range in place (cudaHostRegister(Mapped | Portable)).
//             device_address(): the GPU address of a mapped host range, or nullptr when the range is not mapped
//             (the registry holds the pool's chunks and the ranges pinned here or pinned before).
//   lifetime  record_use() notes that work queued on a stream reads a pool block; a block freed while such work
//             may still run returns to the pool only once that work has completed.
//   gather    launch_gather(): out[positions[i]] = table[index[i]] for rows of row_bytes bytes, reading each row's
//             128-byte lines whole (16-byte loads, every load instruction of a lane group inside one aligned line),
//             index range checked on the GPU (an error word; bad rows are zero-filled, never left as garbage).
//
// Errors: memory functions throw PinnedMemoryExhausted (unified_pool.h), NotPinnable or std::runtime_error (a
// CUDA error, with its name); launch_gather returns the CUDA error of the launch and throws nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include <cuda_runtime_api.h>

#include "hectorgen/unified_pool.h"

namespace hectorgen::unified {

// pin() cannot map this memory in place (the CUDA error says why: not page-backed anonymous memory, a read-only
// or file mapping, the locked-memory limit, ...). Copying into the pool (allocate) is the way out.
class NotPinnable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// ---- memory ---------------------------------------------------------------------------------------------------

void* allocate(std::size_t bytes);
void deallocate(void* pointer);
PoolStats pool_stats();
std::size_t trim_pool();                  // frees unused chunks; returns the bytes released
void set_pool_limit(std::size_t bytes);  // 0: no limit

enum class PinResult {
  kPinned,         // registered here (cudaHostRegister): unpin() once the memory is no longer used
  kAdopted,        // pinned and mapped by someone else (cudaHostAlloc, torch's pin_memory), entered in the registry:
                   // unpin() (which then only forgets the range) before that memory is freed
  kAlreadyMapped,  // inside a range the registry holds (the pool's, or pinned before): nothing to undo
};
// Maps [host, host + bytes) for the GPU in place. Throws NotPinnable.
PinResult pin(void* host, std::size_t bytes);
// Undoes pin() of the range starting at `host`, after the work recorded for it (record_use) has completed.
void unpin(void* host);

// The device address of host byte `host` when the whole range [host, host + bytes) is GPU-mapped, else nullptr.
void* device_address(const void* host, std::size_t bytes);

// Work queued on `stream` reads the memory at `host` (a pool block or a pinned range): freeing or unpinning it
// waits for that work.
void record_use(const void* host, cudaStream_t stream);

// ---- gather ---------------------------------------------------------------------------------------------------

struct GatherArgs {
  const void* table = nullptr;           // device address of row 0 (device_address of a unified table)
  std::int64_t num_rows = 0;
  std::int64_t row_bytes = 0;            // > 0
  const void* index = nullptr;           // device array of `count` row numbers, int32 or int64
  bool index_is_int64 = true;
  const std::int64_t* positions = nullptr;  // nullptr: row i goes to out row i; else to out row positions[i]
  std::int64_t count = 0;
  void* out = nullptr;                   // device-accessible, count * row_bytes bytes
  // A device word: the lowest output row whose index was out of [0, num_rows) is atomicMin'ed into it; the caller
  // sets it to UINT64_MAX before the launch and reads it after.
  unsigned long long* error = nullptr;
};

// How launch_gather will read and write (for the benchmark's report and the tests).
struct GatherPlan {
  int lanes_per_row = 32;  // 8, 16 or 32 lanes share a row
  int store_bytes = 16;    // 16: rows realign in registers; smaller: through shared memory with stores this wide
  int blocks = 0;
};
GatherPlan plan_gather(const GatherArgs& args, int device);

// Queues the gather on `stream` (count == 0 queues nothing). Returns cudaErrorInvalidValue for bad arguments.
cudaError_t launch_gather(const GatherArgs& args, cudaStream_t stream);

}  // namespace hectorgen::unified
