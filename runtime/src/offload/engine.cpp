#include "hectorgen/offload/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace hectorgen::offload {

struct Engine::Entry {
  std::uint64_t id = 0;
  Tier tier = Tier::host;
  std::uint64_t bytes = 0;
  // The room: a block of a host arena, or an extent of a file.
  int arena = -1;
  std::uint64_t host_offset = 0;
  void* host = nullptr;
  bool placed = false;  // the source copies into the host block itself (Source::place)
  bool has_extent = false;
  FileStore::Extent extent;
  std::shared_ptr<Source> source;
  std::shared_ptr<Sink> sink;
  State store = State::none;
  State load = State::none;
  std::atomic<bool> cancel{false};
  bool running = false;
  bool released = false;
  std::string error;
};

namespace {

constexpr std::uint64_t kAlign = FileStore::kAlignment;

std::uint64_t round_up(std::uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

const char* to_string(State state) {
  switch (state) {
    case State::none: return "none";
    case State::queued: return "queued";
    case State::running: return "running";
    case State::done: return "done";
    case State::failed: return "failed";
    case State::cancelled: return "cancelled";
  }
  return "?";
}

const char* to_string(Tier tier) { return tier == Tier::host ? "host" : "file"; }

void* AlignedHostMemory::allocate(std::uint64_t bytes) {
  void* pointer = nullptr;
  return posix_memalign(&pointer, kAlign, std::max<std::uint64_t>(bytes, 1)) == 0 ? pointer : nullptr;
}

void AlignedHostMemory::deallocate(void* pointer, std::uint64_t) { std::free(pointer); }

Engine::Engine(EngineOptions options, std::shared_ptr<HostMemory> memory)
    : options_(std::move(options)), memory_(std::move(memory)) {
  if (!memory_) {
    throw std::invalid_argument("offload: the engine needs a HostMemory");
  }
  if (options_.chunk_bytes == 0 || options_.chunk_bytes % kAlign != 0) {
    throw std::invalid_argument("offload: chunk_bytes must be a positive multiple of 4096, got " +
                                std::to_string(options_.chunk_bytes));
  }
  options_.store_threads = std::max(1, options_.store_threads);
  options_.load_threads = std::max(1, options_.load_threads);
  options_.queue_depth = std::max(1, options_.queue_depth);
  const std::uint64_t arena_bytes = round_up(std::max<std::uint64_t>(options_.host_arena_bytes, kAlign));
  for (std::uint64_t left = options_.host_budget_bytes; left > 0;) {
    const std::uint64_t bytes = std::min(arena_bytes, round_up(left));
    void* base = memory_->allocate(bytes);
    if (base == nullptr) {
      status_ += "host tier: could only allocate " + std::to_string(options_.host_budget_bytes - left) + " of " +
                 std::to_string(options_.host_budget_bytes) + " bytes of pinned memory; ";
      break;
    }
    arenas_.push_back({base, ExtentAllocator(bytes, kAlign)});
    left -= std::min(left, bytes);
  }
  if (!options_.file_directories.empty()) {
    try {
      FileStoreOptions file_options;
      file_options.directories = options_.file_directories;
      file_options.bytes_per_file = options_.file_bytes;
      file_options.direct_io = options_.direct_io;
      file_options.rank = options_.rank;
      file_options.fault = options_.fault;
      files_ = std::make_unique<FileStore>(std::move(file_options));
    } catch (const std::exception& error) {
      status_ += std::string("file tier unavailable: ") + error.what() + "; ";
    }
  }
  if (files_ && options_.gds && files_->direct() && !options_.fault) {
    cufile_ = std::make_unique<CuFile>();
    for (std::size_t i = 0; cufile_->available() && i < files_->paths().size(); ++i) {
      void* handle = cufile_->register_file(files_->fd(static_cast<int>(i)));
      if (handle == nullptr) {
        for (void* registered : gds_handles_) {
          cufile_->deregister_file(registered);
        }
        gds_handles_.clear();
        break;
      }
      gds_handles_.push_back(handle);
    }
    if (gds_handles_.empty()) {
      status_ += "GPUDirect Storage not used: " + cufile_->reason() + "; ";
    }
  }
  for (int i = 0; i < options_.store_threads; ++i) {
    threads_.emplace_back([this] { worker(true); });
  }
  for (int i = 0; i < options_.load_threads; ++i) {
    threads_.emplace_back([this] { worker(false); });
  }
}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (auto& entry : store_queue_) {
      entry->cancel = true;
    }
  }
  work_ready_.notify_all();
  for (std::thread& thread : threads_) {
    thread.join();
  }
  for (void* handle : gds_handles_) {
    cufile_->deregister_file(handle);
  }
  for (Arena& arena : arenas_) {
    memory_->deallocate(arena.base, arena.extents.capacity());
  }
}

const std::vector<std::string>& Engine::file_paths() const {
  static const std::vector<std::string> none;
  return files_ ? files_->paths() : none;
}

std::shared_ptr<Engine::Entry> Engine::find(std::uint64_t id) const {
  const auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second;
}

void Engine::free_room(Entry& entry) {
  if (entry.arena >= 0) {
    arenas_[entry.arena].extents.free(entry.host_offset);
    entry.arena = -1;
    entry.host = nullptr;
  }
  if (entry.has_extent) {
    files_->free(entry.extent);
    entry.has_extent = false;
  }
}

std::uint64_t Engine::store(Tier tier, std::shared_ptr<Source> source, bool* accepted, bool* placed) {
  // Sources and sinks are never destroyed under mutex_: their destructors may need other locks (Python's).
  std::shared_ptr<Source> unused;
  auto entry = std::make_shared<Entry>();
  entry->tier = tier;
  entry->bytes = source->size();
  entry->source = std::move(source);
  std::lock_guard lock(mutex_);
  entry->id = next_id_++;
  entries_.emplace(entry->id, entry);
  if (tier == Tier::host) {
    for (std::size_t i = 0; i < arenas_.size() && entry->arena < 0; ++i) {
      if (auto offset = arenas_[i].extents.allocate(entry->bytes)) {
        entry->arena = static_cast<int>(i);
        entry->host_offset = *offset;
        entry->host = static_cast<char*>(arenas_[i].base) + *offset;
      }
    }
    if (entry->arena < 0) {
      entry->error = arenas_.empty() ? "the host tier is not available (no pinned memory budget)"
                                     : "the host tier is full (" + std::to_string(entry->bytes) + " bytes requested)";
    }
  } else if (files_ == nullptr) {
    entry->error = "the file tier is not available (" + status_ + ")";
  } else if (auto extent = files_->allocate(entry->bytes)) {
    entry->has_extent = true;
    entry->extent = *extent;
  } else {
    entry->error = "the offload files are full (" + std::to_string(entry->bytes) + " bytes requested, " +
                   std::to_string(files_->capacity() - files_->used()) + " free)";
  }
  if (!entry->error.empty()) {
    entry->store = State::failed;
    unused = std::move(entry->source);
    ++stats_.stores_failed;
    if (accepted != nullptr) {
      *accepted = false;
    }
    if (placed != nullptr) {
      *placed = false;
    }
    return entry->id;
  }
  if (accepted != nullptr) {
    *accepted = true;
  }
  if (entry->tier == Tier::host) {
    entry->placed = entry->source->place(entry->host);
  }
  if (placed != nullptr) {
    *placed = entry->placed;
  }
  entry->store = State::queued;
  store_queue_.push_back(entry);
  work_ready_.notify_all();
  return entry->id;
}

bool Engine::cancel_store(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  auto entry = find(id);
  if (!entry || (entry->store != State::queued && entry->store != State::running)) {
    return false;
  }
  entry->cancel = true;
  return true;
}

State Engine::store_state(std::uint64_t id) const {
  std::lock_guard lock(mutex_);
  auto entry = find(id);
  return entry ? entry->store : State::none;
}

State Engine::wait_store(std::uint64_t id) {
  std::unique_lock lock(mutex_);
  auto entry = find(id);
  if (!entry) {
    return State::none;
  }
  job_done_.wait(lock, [&] { return entry->store != State::queued && entry->store != State::running; });
  return entry->store;
}

void Engine::load(std::uint64_t id, std::shared_ptr<Sink> sink) {
  std::lock_guard lock(mutex_);
  auto entry = find(id);
  if (!entry || (entry->store != State::done && entry->store != State::queued && entry->store != State::running)) {
    throw std::logic_error("offload: loading entry " + std::to_string(id) + ", whose store is " +
                           (entry ? to_string(entry->store) : "unknown"));
  }
  if (entry->load == State::queued || entry->load == State::running) {
    throw std::logic_error("offload: entry " + std::to_string(id) + " is already being loaded");
  }
  entry->sink = std::move(sink);
  entry->load = State::queued;
  load_queue_.push_back(entry);
  work_ready_.notify_all();
}

State Engine::load_state(std::uint64_t id) const {
  std::lock_guard lock(mutex_);
  auto entry = find(id);
  return entry ? entry->load : State::none;
}

State Engine::wait_load(std::uint64_t id) {
  std::unique_lock lock(mutex_);
  auto entry = find(id);
  if (!entry) {
    return State::none;
  }
  job_done_.wait(lock, [&] { return entry->load != State::queued && entry->load != State::running; });
  return entry->load;
}

void Engine::release(std::uint64_t id) {
  std::lock_guard lock(mutex_);
  auto entry = find(id);
  if (!entry) {
    return;
  }
  entries_.erase(id);
  entry->released = true;
  entry->cancel = true;
  // A placed copy may still be writing into the host block until its store job has waited for it.
  const bool copy_pending = entry->placed && entry->store == State::queued;
  if (!entry->running && !copy_pending) {
    free_room(*entry);
  }
}

std::string Engine::error(std::uint64_t id) const {
  std::lock_guard lock(mutex_);
  auto entry = find(id);
  return entry ? entry->error : "unknown offload entry " + std::to_string(id);
}

std::vector<std::pair<std::uint64_t, State>> Engine::take_finished_stores() {
  std::lock_guard lock(mutex_);
  std::vector<std::pair<std::uint64_t, State>> finished;
  finished.swap(finished_stores_);
  return finished;
}

void Engine::pause_stores(bool paused) {
  {
    std::lock_guard lock(mutex_);
    stores_paused_ = paused;
  }
  work_ready_.notify_all();
}

void Engine::drain() {
  std::unique_lock lock(mutex_);
  job_done_.wait(lock, [&] { return store_queue_.empty() && load_queue_.empty() && running_ == 0; });
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  EngineStats stats = stats_;
  for (const Arena& arena : arenas_) {
    stats.host_capacity += arena.extents.capacity();
    stats.host_used += arena.extents.used();
    stats.host_peak += arena.extents.peak();  // an upper bound when there are several arenas
  }
  if (files_) {
    stats.file_capacity = files_->capacity();
    stats.file_used = files_->used();
    stats.file_peak = files_->peak();
  }
  stats.entries = entries_.size();
  return stats;
}

void Engine::worker(bool stores) {
  IoQueue io(options_.queue_depth, options_.fault);
  std::vector<void*> bounce;  // allocated on the first file job
  auto& queue = stores ? store_queue_ : load_queue_;
  for (;;) {
    std::shared_ptr<Entry> entry;
    std::shared_ptr<Source> done_source;  // destroyed after the lock is released
    std::shared_ptr<Sink> done_sink;
    {
      std::unique_lock lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || (!queue.empty() && !(stores && stores_paused_)); });
      if (queue.empty()) {
        break;  // stopping, and nothing left to do
      }
      entry = queue.front();
      queue.pop_front();
      State& state = stores ? entry->store : entry->load;
      if (stores && entry->cancel && !entry->placed) {  // a placed copy is waited for, then dropped
        state = State::cancelled;
        ++stats_.stores_cancelled;
        if (!entry->released) {
          finished_stores_.emplace_back(entry->id, state);
        }
        done_source = std::move(entry->source);
        free_room(*entry);
        job_done_.notify_all();
        continue;
      }
      if (!stores) {
        // A load queued while its store was still running waits for the store.
        job_done_.wait(lock, [&] { return entry->store != State::queued && entry->store != State::running; });
        if (entry->store != State::done && entry->error.empty()) {
          entry->error = std::string("its store was ") + to_string(entry->store);
        }
        if (entry->store != State::done || entry->released) {
          state = entry->released ? State::cancelled : State::failed;  // cancelled: nobody waits for it any more
          stats_.loads_failed += state == State::failed;
          done_sink = std::move(entry->sink);
          job_done_.notify_all();
          continue;
        }
      }
      state = State::running;
      entry->running = true;
      ++running_;
    }
    const auto start = std::chrono::steady_clock::now();
    std::string error;
    if (entry->tier == Tier::file && bounce.empty() && gds_handles_.empty()) {
      for (int i = 0; i < options_.queue_depth; ++i) {
        void* buffer = memory_->allocate(options_.chunk_bytes);
        if (buffer == nullptr) {
          error = "cannot allocate the pinned bounce buffers of the file tier";
          break;
        }
        bounce.push_back(buffer);
      }
    }
    if (error.empty()) {
      try {
        if (stores) {
          run_store(*entry, io, bounce);
        } else {
          run_load(*entry, io, bounce);
        }
      } catch (const std::exception& exception) {
        entry->error = exception.what();
      }
    } else {
      entry->error = error;
    }
    const double seconds = seconds_since(start);
    {
      std::lock_guard lock(mutex_);
      entry->running = false;
      --running_;
      if (stores) {
        done_source = std::move(entry->source);  // the caller's data is no longer needed by the engine
        stats_.store_seconds += seconds;
        if (!entry->error.empty()) {
          entry->store = State::failed;
          ++stats_.stores_failed;
        } else if (entry->cancel) {
          entry->store = State::cancelled;
          ++stats_.stores_cancelled;
        } else {
          entry->store = State::done;
          ++stats_.stores_done;
          stats_.stored_bytes += entry->bytes;
        }
        if (entry->store != State::done) {
          free_room(*entry);
        }
        if (!entry->released) {
          finished_stores_.emplace_back(entry->id, entry->store);
        }
      } else {
        done_sink = std::move(entry->sink);
        stats_.load_seconds += seconds;
        if (!entry->error.empty()) {
          entry->load = State::failed;
          ++stats_.loads_failed;
        } else {
          entry->load = State::done;
          ++stats_.loads_done;
          stats_.loaded_bytes += entry->bytes;
        }
      }
      if (entry->released) {
        free_room(*entry);
      }
    }
    job_done_.notify_all();
  }
  for (void* buffer : bounce) {
    memory_->deallocate(buffer, options_.chunk_bytes);
  }
}

std::string Engine::io_error(const Entry& entry, IoOp op, std::int64_t result, std::size_t requested) const {
  const std::string what = op == IoOp::write ? "writing" : "reading";
  const std::string file = files_->paths().at(entry.extent.file) + " (unlinked)";
  if (result < 0) {
    return what + " entry " + std::to_string(entry.id) + " (" + std::to_string(entry.bytes) + " bytes) " +
           (op == IoOp::write ? "to " : "from ") + file + ": " + std::strerror(static_cast<int>(-result));
  }
  return what + " entry " + std::to_string(entry.id) + " (" + std::to_string(entry.bytes) + " bytes) " +
         (op == IoOp::write ? "to " : "from ") + file + ": short transfer, " + std::to_string(result) + " of " +
         std::to_string(requested) + " bytes";
}

void Engine::run_store(Entry& entry, IoQueue& io, std::vector<void*>& bounce) {
  entry.source->prepare();
  if (entry.tier == Tier::host) {
    if (!entry.placed) {
      entry.source->read(0, entry.host, entry.bytes);
    }
    return;
  }
  const int fd = files_->fd(entry.extent.file);
  if (!gds_handles_.empty() && entry.source->device_pointer() != nullptr) {
    const ssize_t written = cufile_->write(gds_handles_[entry.extent.file], entry.source->device_pointer(),
                                           entry.bytes, static_cast<off_t>(entry.extent.offset));
    if (written != static_cast<ssize_t>(entry.bytes)) {
      entry.error = io_error(entry, IoOp::write, written < 0 ? -EIO : written, entry.bytes);
    }
    return;
  }
  const std::uint64_t chunk = options_.chunk_bytes;
  std::vector<int> free_slots;
  for (int i = static_cast<int>(bounce.size()) - 1; i >= 0; --i) {
    free_slots.push_back(i);
  }
  std::uint64_t offset = 0;
  while (offset < entry.bytes || io.in_flight() > 0) {
    while (offset < entry.bytes && !free_slots.empty() && entry.error.empty() && !entry.cancel) {
      const int slot = free_slots.back();
      free_slots.pop_back();
      const std::uint64_t bytes = std::min(chunk, entry.bytes - offset);
      const std::uint64_t padded = round_up(bytes);
      entry.source->read(offset, bounce[slot], bytes);
      std::memset(static_cast<char*>(bounce[slot]) + bytes, 0, padded - bytes);
      io.submit(IoOp::write, fd, bounce[slot], padded, entry.extent.offset + offset, static_cast<std::uint64_t>(slot));
      offset += bytes;
    }
    if (io.in_flight() == 0) {
      break;  // cancelled or failed, nothing left in flight
    }
    for (const IoQueue::Completion& done : io.wait()) {
      free_slots.push_back(static_cast<int>(done.tag));
      if (done.result != static_cast<std::int64_t>(done.requested) && entry.error.empty()) {
        entry.error = io_error(entry, IoOp::write, done.result, done.requested);
      }
    }
  }
}

void Engine::run_load(Entry& entry, IoQueue& io, std::vector<void*>& bounce) {
  if (entry.tier == Tier::host) {
    entry.sink->write(0, entry.host, entry.bytes);
    entry.sink->finish();
    return;
  }
  const int fd = files_->fd(entry.extent.file);
  if (!gds_handles_.empty() && entry.sink->device_pointer() != nullptr) {
    const ssize_t read = cufile_->read(gds_handles_[entry.extent.file], entry.sink->device_pointer(), entry.bytes,
                                       static_cast<off_t>(entry.extent.offset));
    if (read != static_cast<ssize_t>(entry.bytes)) {
      entry.error = io_error(entry, IoOp::read, read < 0 ? -EIO : read, entry.bytes);
    }
    entry.sink->finish();
    return;
  }
  const std::uint64_t chunk = options_.chunk_bytes;
  std::vector<std::uint64_t> slot_offset(bounce.size());
  std::vector<int> free_slots;
  for (int i = static_cast<int>(bounce.size()) - 1; i >= 0; --i) {
    free_slots.push_back(i);
  }
  std::uint64_t offset = 0;
  while (offset < entry.bytes || io.in_flight() > 0) {
    while (offset < entry.bytes && !free_slots.empty() && entry.error.empty()) {
      const int slot = free_slots.back();
      free_slots.pop_back();
      const std::uint64_t bytes = std::min(chunk, entry.bytes - offset);
      slot_offset[slot] = offset;
      io.submit(IoOp::read, fd, bounce[slot], round_up(bytes), entry.extent.offset + offset,
                static_cast<std::uint64_t>(slot));
      offset += bytes;
    }
    if (io.in_flight() == 0) {
      break;
    }
    for (const IoQueue::Completion& done : io.wait()) {
      const int slot = static_cast<int>(done.tag);
      free_slots.push_back(slot);
      if (done.result != static_cast<std::int64_t>(done.requested)) {
        if (entry.error.empty()) {
          entry.error = io_error(entry, IoOp::read, done.result, done.requested);
        }
      } else if (entry.error.empty()) {
        const std::uint64_t bytes = std::min(chunk, entry.bytes - slot_offset[slot]);
        entry.sink->write(slot_offset[slot], bounce[slot], bytes);
      }
    }
  }
  entry.sink->finish();
}

}  // namespace hectorgen::offload
