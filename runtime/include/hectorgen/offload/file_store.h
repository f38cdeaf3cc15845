// The SSD tier of the offload engine: one file per directory and process, created with O_EXCL, unlinked right after
// it is opened (a crash leaves nothing behind; stale files of dead processes from a crash between open and unlink
// are removed at start), preallocated with fallocate and sub-allocated in 4 KiB-aligned extents. O_DIRECT where the
// filesystem allows it (probed with one aligned write and read), buffered I/O otherwise (tmpfs).
//
// IoQueue keeps several reads or writes in flight from one thread through Linux native AIO (io_submit), and runs
// them one at a time with pread/pwrite where AIO is unavailable. A FaultHook can make any I/O fail (tests, drills).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hectorgen/offload/extents.h"

namespace hectorgen::offload {

enum class IoOp { write, read };

// Returns 0 to let the I/O run, an errno value to fail it with that error, or kShortTransfer to make it transfer
// half of its bytes. Called from the I/O threads.
using FaultHook = std::function<int(IoOp op, std::uint64_t file_offset, std::size_t bytes)>;
inline constexpr int kShortTransfer = -1;

// The rank this process names its files with: the option when >= 0, else $RANK, else $LOCAL_RANK, else 0.
int offload_rank(int option = -1);

struct FileStoreOptions {
  std::vector<std::string> directories;  // one file in each (several SSDs: several directories)
  std::uint64_t bytes_per_file = 0;      // preallocated size of each file
  bool direct_io = true;                 // try O_DIRECT
  int rank = -1;                         // see offload_rank
  FaultHook fault;
};

class FileStore {
 public:
  static constexpr std::uint64_t kAlignment = 4096;

  struct Extent {
    int file = -1;
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;  // the requested bytes (the extent itself is rounded up to kAlignment)
  };

  // Creates, unlinks and preallocates the files. Throws std::runtime_error naming the directory and the reason
  // when one cannot be created or preallocated (missing directory, no space, no permission).
  explicit FileStore(FileStoreOptions options);
  ~FileStore();
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  // Thread-safe. Nothing when no file has a free extent that large.
  std::optional<Extent> allocate(std::uint64_t bytes);
  void free(const Extent& extent);

  int fd(int file) const { return files_[file].fd; }
  bool direct() const;  // every file uses O_DIRECT
  const std::vector<std::string>& paths() const { return paths_; }  // the (already unlinked) paths, for messages
  std::uint64_t capacity() const;
  std::uint64_t used() const;
  std::uint64_t peak() const;
  const FaultHook& fault() const { return options_.fault; }
  int removed_stale_files() const { return removed_stale_; }

 private:
  struct File {
    int fd = -1;
    bool direct = false;
    ExtentAllocator extents{0, kAlignment};
  };
  FileStoreOptions options_;
  std::vector<File> files_;
  std::vector<std::string> paths_;
  mutable std::mutex mutex_;
  std::uint64_t peak_ = 0;
  int removed_stale_ = 0;
};

// Removes the offload files that processes no longer alive left in `directory`; returns how many.
int remove_stale_offload_files(const std::string& directory);

// Several I/Os in flight from one thread. Buffers, offsets and lengths must be multiples of FileStore::kAlignment
// for O_DIRECT files.
class IoQueue {
 public:
  struct Completion {
    std::uint64_t tag;
    std::int64_t result;  // bytes transferred, or -errno
    std::size_t requested;
  };

  IoQueue(int depth, FaultHook fault);
  ~IoQueue();
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;

  int depth() const { return depth_; }
  int in_flight() const { return in_flight_; }
  bool asynchronous() const { return context_ != 0; }
  // Queues one I/O; the caller keeps at most depth() in flight (wait() first when full).
  void submit(IoOp op, int fd, void* buffer, std::size_t bytes, std::uint64_t offset, std::uint64_t tag);
  // Waits for at least one completion (none when nothing is in flight).
  std::vector<Completion> wait();

 private:
  int depth_;
  FaultHook fault_;
  unsigned long context_ = 0;  // aio_context_t; 0: synchronous fallback
  int in_flight_ = 0;
  std::vector<Completion> done_;  // completions of the synchronous fallback and of injected faults
};

}  // namespace hectorgen::offload
