#include "hectorgen/offload/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace hectorgen::offload {
namespace {

constexpr const char* kPrefix = "hectorgen-offload-";

std::string errno_text(int error) { return std::strerror(error); }

int parse_int(const char* text, int fallback) {
  if (text == nullptr || *text == '\0') {
    return fallback;
  }
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return (*end == '\0' && value >= 0 && value < (1L << 30)) ? static_cast<int>(value) : fallback;
}

// One aligned write and read back at offset 0: some filesystems accept O_DIRECT at open and refuse the I/O.
bool direct_io_works(int fd) {
  void* buffer = nullptr;
  if (posix_memalign(&buffer, FileStore::kAlignment, FileStore::kAlignment) != 0) {
    return false;
  }
  std::memset(buffer, 0x5a, FileStore::kAlignment);
  const bool ok = pwrite(fd, buffer, FileStore::kAlignment, 0) == static_cast<ssize_t>(FileStore::kAlignment) &&
                  pread(fd, buffer, FileStore::kAlignment, 0) == static_cast<ssize_t>(FileStore::kAlignment);
  std::free(buffer);
  return ok;
}

long io_setup(unsigned depth, aio_context_t* context) { return syscall(SYS_io_setup, depth, context); }
long io_destroy(aio_context_t context) { return syscall(SYS_io_destroy, context); }
long io_submit(aio_context_t context, long count, iocb** requests) {
  return syscall(SYS_io_submit, context, count, requests);
}
long io_getevents(aio_context_t context, long min, long max, io_event* events) {
  return syscall(SYS_io_getevents, context, min, max, events, nullptr);
}

struct Request {
  iocb control{};
  std::uint64_t tag = 0;
  std::size_t requested = 0;
};

std::atomic<int> file_serial{0};

}  // namespace

int offload_rank(int option) {
  if (option >= 0) {
    return option;
  }
  return parse_int(std::getenv("RANK"), parse_int(std::getenv("LOCAL_RANK"), 0));
}

int remove_stale_offload_files(const std::string& directory) {
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) {
    return 0;
  }
  int removed = 0;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    // hectorgen-offload-r<rank>-p<pid>-<serial>.bin
    if (name.rfind(kPrefix, 0) != 0 || name.size() < 4 || name.compare(name.size() - 4, 4, ".bin") != 0) {
      continue;
    }
    const auto p = name.find("-p", std::strlen(kPrefix));
    if (p == std::string::npos) {
      continue;
    }
    const int pid = parse_int(name.substr(p + 2, name.find('-', p + 2) - (p + 2)).c_str(), -1);
    if (pid <= 0 || pid == getpid() || kill(pid, 0) == 0 || errno != ESRCH) {
      continue;  // ours, or a process that is still alive (or not ours to judge)
    }
    if (unlink((directory + "/" + name).c_str()) == 0) {
      ++removed;
    }
  }
  closedir(dir);
  return removed;
}

FileStore::FileStore(FileStoreOptions options) : options_(std::move(options)) {
  if (options_.directories.empty()) {
    throw std::runtime_error("offload: the file tier needs at least one directory");
  }
  const int rank = offload_rank(options_.rank);
  for (const std::string& directory : options_.directories) {
    removed_stale_ += remove_stale_offload_files(directory);
    const std::string path = directory + "/" + kPrefix + "r" + std::to_string(rank) + "-p" +
                             std::to_string(getpid()) + "-" + std::to_string(file_serial++) + ".bin";
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    File file;
    file.fd = options_.direct_io ? open(path.c_str(), flags | O_DIRECT, 0600) : -1;
    file.direct = file.fd >= 0;
    if (file.fd < 0) {
      file.fd = open(path.c_str(), flags, 0600);
    }
    if (file.fd < 0) {
      const int error = errno;
      for (File& opened : files_) {
        close(opened.fd);
      }
      throw std::runtime_error("offload: cannot create an offload file in " + directory + " (" + errno_text(error) +
                               ")");
    }
    unlink(path.c_str());  // from now on only the descriptor names it: nothing is left behind, whatever happens
    int error = 0;
    if (options_.bytes_per_file > 0) {
      if (fallocate(file.fd, 0, 0, static_cast<off_t>(options_.bytes_per_file)) != 0) {
        error = errno;
        if (error == EOPNOTSUPP) {
          error = posix_fallocate(file.fd, 0, static_cast<off_t>(options_.bytes_per_file));
        }
      }
    }
    if (error == 0 && file.direct && !direct_io_works(file.fd)) {
      // O_DIRECT accepted at open but not for I/O: the same (unlinked) file without it.
      const int flags_now = fcntl(file.fd, F_GETFL);
      file.direct = !(flags_now >= 0 && fcntl(file.fd, F_SETFL, flags_now & ~O_DIRECT) == 0);
      if (file.direct) {
        error = EINVAL;
      }
    }
    if (error != 0) {
      close(file.fd);
      for (File& opened : files_) {
        close(opened.fd);
      }
      throw std::runtime_error("offload: cannot preallocate " + std::to_string(options_.bytes_per_file) +
                               " bytes for the offload file in " + directory + " (" + errno_text(error) + ")");
    }
    file.extents = ExtentAllocator(options_.bytes_per_file, kAlignment);
    files_.push_back(std::move(file));
    paths_.push_back(path);
  }
}

FileStore::~FileStore() {
  for (File& file : files_) {
    close(file.fd);
  }
}

std::optional<FileStore::Extent> FileStore::allocate(std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  // The file with the most free room, so that several SSDs fill evenly.
  int best = -1;
  for (int i = 0; i < static_cast<int>(files_.size()); ++i) {
    const auto& extents = files_[i].extents;
    if (best < 0 || extents.capacity() - extents.used() >
                        files_[best].extents.capacity() - files_[best].extents.used()) {
      best = i;
    }
  }
  for (int attempt = 0; attempt < static_cast<int>(files_.size()); ++attempt) {
    const int i = (best + attempt) % static_cast<int>(files_.size());
    if (auto offset = files_[i].extents.allocate(bytes)) {
      std::uint64_t used = 0;
      for (const File& file : files_) {
        used += file.extents.used();
      }
      peak_ = std::max(peak_, used);
      return Extent{i, *offset, bytes};
    }
  }
  return std::nullopt;
}

void FileStore::free(const Extent& extent) {
  std::lock_guard lock(mutex_);
  files_.at(extent.file).extents.free(extent.offset);
}

bool FileStore::direct() const {
  return std::all_of(files_.begin(), files_.end(), [](const File& file) { return file.direct; });
}

std::uint64_t FileStore::capacity() const {
  std::uint64_t total = 0;
  for (const File& file : files_) {
    total += file.extents.capacity();
  }
  return total;
}

std::uint64_t FileStore::used() const {
  std::lock_guard lock(mutex_);
  std::uint64_t total = 0;
  for (const File& file : files_) {
    total += file.extents.used();
  }
  return total;
}

std::uint64_t FileStore::peak() const {
  std::lock_guard lock(mutex_);
  return peak_;
}

// ---- IoQueue --------------------------------------------------------------------------------------------------

IoQueue::IoQueue(int depth, FaultHook fault) : depth_(std::max(1, depth)), fault_(std::move(fault)) {
  aio_context_t context = 0;
  if (io_setup(static_cast<unsigned>(depth_), &context) == 0) {
    context_ = context;
  }
}

IoQueue::~IoQueue() {
  while (in_flight_ > 0) {
    wait();
  }
  if (context_ != 0) {
    io_destroy(context_);
  }
}

void IoQueue::submit(IoOp op, int fd, void* buffer, std::size_t bytes, std::uint64_t offset, std::uint64_t tag) {
  if (in_flight_ >= depth_) {
    throw std::logic_error("offload: IoQueue::submit with a full queue");
  }
  const int fault = fault_ ? fault_(op, offset, bytes) : 0;
  if (fault > 0) {
    done_.push_back({tag, -static_cast<std::int64_t>(fault), bytes});
    ++in_flight_;
    return;
  }
  const std::size_t length = fault == kShortTransfer ? bytes / 2 : bytes;
  if (context_ != 0 && fault == 0) {
    auto request = std::make_unique<Request>();
    request->tag = tag;
    request->requested = bytes;
    request->control.aio_data = reinterpret_cast<std::uint64_t>(request.get());
    request->control.aio_lio_opcode = op == IoOp::write ? IOCB_CMD_PWRITE : IOCB_CMD_PREAD;
    request->control.aio_fildes = static_cast<std::uint32_t>(fd);
    request->control.aio_buf = reinterpret_cast<std::uint64_t>(buffer);
    request->control.aio_nbytes = length;
    request->control.aio_offset = static_cast<std::int64_t>(offset);
    iocb* list[1] = {&request->control};
    long submitted;
    do {
      submitted = io_submit(context_, 1, list);
    } while (submitted < 0 && errno == EINTR);
    if (submitted == 1) {
      request.release();
      ++in_flight_;
      return;
    }
    if (submitted < 0 && errno != EAGAIN && errno != ENOSYS && errno != EINVAL) {
      done_.push_back({tag, -static_cast<std::int64_t>(errno), bytes});
      ++in_flight_;
      return;
    }
    // The kernel refused AIO for this file: the synchronous path below.
  }
  std::size_t moved = 0;
  std::int64_t result = 0;
  while (moved < length) {
    auto* bytes_at = static_cast<char*>(buffer) + moved;
    const ssize_t n = op == IoOp::write ? pwrite(fd, bytes_at, length - moved, static_cast<off_t>(offset + moved))
                                        : pread(fd, bytes_at, length - moved, static_cast<off_t>(offset + moved));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      result = n < 0 ? -static_cast<std::int64_t>(errno) : 0;
      break;
    }
    moved += static_cast<std::size_t>(n);
  }
  done_.push_back({tag, result < 0 ? result : static_cast<std::int64_t>(moved), bytes});
  ++in_flight_;
}

std::vector<IoQueue::Completion> IoQueue::wait() {
  std::vector<Completion> completions;
  completions.swap(done_);
  const int asynchronous = in_flight_ - static_cast<int>(completions.size());
  if (completions.empty() && asynchronous > 0) {
    std::vector<io_event> events(static_cast<std::size_t>(asynchronous));
    long got;
    do {
      got = io_getevents(context_, 1, asynchronous, events.data());
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
      throw std::runtime_error("offload: io_getevents failed (" + errno_text(errno) + ")");
    }
    for (long i = 0; i < got; ++i) {
      std::unique_ptr<Request> request(reinterpret_cast<Request*>(events[i].data));
      completions.push_back({request->tag, static_cast<std::int64_t>(events[i].res), request->requested});
    }
  }
  in_flight_ -= static_cast<int>(completions.size());
  return completions;
}

}  // namespace hectorgen::offload
