// The I/O engine of activation offloading: stores byte ranges (tensors) to pinned host memory or to files on an SSD
// and loads them back, on its own threads, while the caller computes.
//
//   * Host tier: a byte budget of pinned memory, allocated once in arenas (HostMemory) and sub-allocated per tensor.
//   * File tier: FileStore (one preallocated, unlinked file per directory; O_DIRECT where possible). Data goes through
//     aligned pinned bounce buffers, a ring of queue_depth chunks per thread, so the device-to-host copy of one chunk
//     overlaps the disk I/O of the others (IoQueue keeps them in flight); or straight between GPU memory and the file
//     with GPUDirect Storage (CuFile) when libcufile works and the caller gives device pointers.
//   * One thread pool stores and one loads, each in first-in-first-out order.
//
// Device memory stays behind two small interfaces, Source and Sink, so the engine is plain C++ and POSIX (the
// libtorch binding implements them with CUDA streams; tests with host buffers).
//
// Failure is never silent: a store that cannot be placed (tier full or unavailable) fails at once, one that hits an
// I/O error or a short transfer fails when it ends (the caller still holds the data and keeps it); a load that fails
// reports why (the caller raises). error(id) says what happened.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "hectorgen/offload/cufile.h"
#include "hectorgen/offload/extents.h"
#include "hectorgen/offload/file_store.h"

namespace hectorgen::offload {

// Where the host arenas and bounce buffers come from: pinned memory with CUDA, plain aligned memory without.
class HostMemory {
 public:
  virtual ~HostMemory() = default;
  // `bytes` of memory aligned to 4096, or nullptr when it cannot be had.
  virtual void* allocate(std::uint64_t bytes) = 0;
  virtual void deallocate(void* pointer, std::uint64_t bytes) = 0;
};

// Page-aligned ordinary host memory.
class AlignedHostMemory final : public HostMemory {
 public:
  void* allocate(std::uint64_t bytes) override;
  void deallocate(void* pointer, std::uint64_t bytes) override;
};

// The bytes to store. read() is called from an engine thread and returns once the bytes are in host memory.
class Source {
 public:
  virtual ~Source() = default;
  virtual std::uint64_t size() const = 0;
  // Host tier only, called by Engine::store on the caller's thread with the host block the data goes to: a source
  // that queues its own copy there (e.g. an asynchronous device-to-host copy on a copy stream, so that the caller can
  // free the device memory at once) returns true, and the engine then only calls prepare(), which must return once
  // the copy is complete. Returning false (the default) makes the engine call read() on its thread.
  virtual bool place(void* /*host*/) { return false; }
  // Called once on the engine thread before any read (e.g. to wait for the kernel that produced the data).
  virtual void prepare() {}
  virtual void read(std::uint64_t offset, void* host, std::uint64_t bytes) = 0;
  // Device memory that GPUDirect Storage may write to the file directly; nullptr to go through host memory.
  virtual const void* device_pointer() const { return nullptr; }
};

// Where loaded bytes go. write() is called from an engine thread and returns once the bytes are in place.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void write(std::uint64_t offset, const void* host, std::uint64_t bytes) = 0;
  // Called once on the engine thread after the last write (e.g. to wait for the copies).
  virtual void finish() {}
  virtual void* device_pointer() { return nullptr; }
};

enum class Tier : std::uint8_t { host, file };
enum class State : std::uint8_t { none, queued, running, done, failed, cancelled };
const char* to_string(State state);
const char* to_string(Tier tier);

struct EngineOptions {
  std::uint64_t host_budget_bytes = 0;          // pinned host memory for the host tier (0: no host tier)
  std::uint64_t host_arena_bytes = 1ull << 30;  // allocated in arenas of this size; a tensor fits in one arena
  std::vector<std::string> file_directories;    // the file tier's directories (none: no file tier)
  std::uint64_t file_bytes = 0;                 // preallocated size of each directory's file
  bool direct_io = true;                        // O_DIRECT where the filesystem allows it
  bool gds = true;                              // GPUDirect Storage where libcufile works
  int store_threads = 1;
  int load_threads = 1;
  std::uint64_t chunk_bytes = 8ull << 20;  // bounce buffer size (a multiple of 4096)
  int queue_depth = 4;                     // file I/Os in flight per thread
  int rank = -1;                           // names the files; -1: $RANK, $LOCAL_RANK or 0
  FaultHook fault;                         // makes file I/O fail (tests)
};

struct EngineStats {
  std::uint64_t stored_bytes = 0, loaded_bytes = 0;
  std::uint64_t stores_done = 0, stores_failed = 0, stores_cancelled = 0, loads_done = 0, loads_failed = 0;
  double store_seconds = 0, load_seconds = 0;  // summed time of the store and load jobs
  std::uint64_t host_capacity = 0, host_used = 0, host_peak = 0;
  std::uint64_t file_capacity = 0, file_used = 0, file_peak = 0;
  std::uint64_t entries = 0;  // stored or in flight, not released
};

class Engine {
 public:
  Engine(EngineOptions options, std::shared_ptr<HostMemory> memory);
  ~Engine();  // cancels queued stores, waits for running jobs, frees everything
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues storing `source` to `tier` and returns the entry's id. Room is reserved now: when the tier is full or
  // unavailable the entry has already failed (error() says why), nothing is queued and *accepted is set to false.
  // *placed says whether the source placed its own copy (Source::place).
  std::uint64_t store(Tier tier, std::shared_ptr<Source> source, bool* accepted = nullptr, bool* placed = nullptr);
  // Cancels a store that is queued or running (its room is freed; a placed copy is waited for first); true if it
  // had not finished.
  bool cancel_store(std::uint64_t id);
  State store_state(std::uint64_t id) const;
  State wait_store(std::uint64_t id);
  // Queues loading an entry into `sink`. Its store must not have failed or been cancelled; a load queued while the
  // store is still running waits for it on the load thread. Loading again is allowed.
  void load(std::uint64_t id, std::shared_ptr<Sink> sink);
  State load_state(std::uint64_t id) const;
  State wait_load(std::uint64_t id);
  // Forgets the entry and frees its room (once its running job ends). Unknown ids are ignored.
  void release(std::uint64_t id);
  std::string error(std::uint64_t id) const;
  // The stores that ended (done, failed or cancelled) since the last call, in the order they ended: the caller
  // drops its copy of the data of the done ones.
  std::vector<std::pair<std::uint64_t, State>> take_finished_stores();
  // While paused, queued stores wait (running ones finish): a scheduler hint (e.g. keep the link free for loads), and
  // how tests hold stores in flight.
  void pause_stores(bool paused);
  // Waits until no job is queued or running (not while stores are paused with some queued).
  void drain();

  EngineStats stats() const;
  bool host_available() const { return !arenas_.empty(); }
  bool file_available() const { return files_ != nullptr; }
  const std::string& status() const { return status_; }  // what is not available, and why
  bool direct_io() const { return files_ != nullptr && files_->direct(); }
  bool gds() const { return !gds_handles_.empty(); }
  const std::vector<std::string>& file_paths() const;

 private:
  struct Entry;
  struct Arena {
    void* base = nullptr;
    ExtentAllocator extents;
  };
  std::shared_ptr<Entry> find(std::uint64_t id) const;  // under mutex_
  void free_room(Entry& entry);                          // under mutex_
  void worker(bool stores);
  void run_store(Entry& entry, IoQueue& io, std::vector<void*>& bounce);
  void run_load(Entry& entry, IoQueue& io, std::vector<void*>& bounce);
  std::string io_error(const Entry& entry, IoOp op, std::int64_t result, std::size_t requested) const;

  EngineOptions options_;
  std::shared_ptr<HostMemory> memory_;
  std::vector<Arena> arenas_;
  std::unique_ptr<FileStore> files_;
  std::unique_ptr<CuFile> cufile_;
  std::vector<void*> gds_handles_;  // per file, when GDS is used
  std::string status_;

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable job_done_;
  std::deque<std::shared_ptr<Entry>> store_queue_, load_queue_;
  std::unordered_map<std::uint64_t, std::shared_ptr<Entry>> entries_;
  std::vector<std::pair<std::uint64_t, State>> finished_stores_;
  std::uint64_t next_id_ = 1;
  int running_ = 0;
  bool stopping_ = false;
  bool stores_paused_ = false;
  EngineStats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace hectorgen::offload
