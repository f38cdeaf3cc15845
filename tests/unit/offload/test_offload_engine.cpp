// The offload engine (runtime/src/offload) with plain host buffers: the extent allocator, the host tier's budget,
// the file tier with O_DIRECT where the filesystem allows it and buffered I/O where it does not (tmpfs), several
// threads and I/Os in flight, injected I/O faults, cancellation and cleanup of the offload files.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hectorgen/offload/engine.h"

namespace ho = hectorgen::offload;

namespace {

std::vector<unsigned char> pattern(std::size_t bytes, unsigned seed) {
  std::vector<unsigned char> data(bytes);
  std::mt19937 random(seed);
  for (auto& byte : data) {
    byte = static_cast<unsigned char>(random());
  }
  return data;
}

class VectorSource final : public ho::Source {
 public:
  explicit VectorSource(std::vector<unsigned char> data) : data_(std::move(data)) {}
  std::uint64_t size() const override { return data_.size(); }
  void read(std::uint64_t offset, void* host, std::uint64_t bytes) override {
    std::memcpy(host, data_.data() + offset, bytes);
    reads_ += 1;
  }
  const std::vector<unsigned char>& data() const { return data_; }
  int reads() const { return reads_; }

 private:
  std::vector<unsigned char> data_;
  std::atomic<int> reads_{0};
};

class VectorSink final : public ho::Sink {
 public:
  explicit VectorSink(std::size_t bytes) : data_(bytes, 0xee) {}
  void write(std::uint64_t offset, const void* host, std::uint64_t bytes) override {
    std::memcpy(data_.data() + offset, host, bytes);
  }
  void finish() override { finished_ = true; }
  const std::vector<unsigned char>& data() const { return data_; }
  bool finished() const { return finished_; }

 private:
  std::vector<unsigned char> data_;
  bool finished_ = false;
};

// A source whose prepare() blocks until open() is called: keeps a store thread busy.
class GateSource final : public ho::Source {
 public:
  explicit GateSource(std::uint64_t bytes) : bytes_(bytes) {}
  std::uint64_t size() const override { return bytes_; }
  void prepare() override {
    std::unique_lock lock(mutex_);
    entered_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
  }
  void read(std::uint64_t, void* host, std::uint64_t bytes) override { std::memset(host, 7, bytes); }
  void wait_entered() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return entered_; });
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }

 private:
  std::uint64_t bytes_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool entered_ = false, open_ = false;
};

// A fresh directory under `parent`, removed with its files at the end of the test.
struct TempDir {
  explicit TempDir(const std::string& parent) {
    std::string pattern = parent + "/hectorgen-offload-test-XXXXXX";
    path = mkdtemp(pattern.data()) ? pattern : "";
  }
  ~TempDir() {
    for (const auto& name : names()) {
      unlink((path + "/" + name).c_str());
    }
    rmdir(path.c_str());
  }
  std::vector<std::string> names() const {
    std::vector<std::string> result;
    if (DIR* dir = opendir(path.c_str())) {
      while (dirent* entry = readdir(dir)) {
        if (std::strcmp(entry->d_name, ".") != 0 && std::strcmp(entry->d_name, "..") != 0) {
          result.push_back(entry->d_name);
        }
      }
      closedir(dir);
    }
    return result;
  }
  std::string path;
};

std::shared_ptr<ho::HostMemory> host_memory() { return std::make_shared<ho::AlignedHostMemory>(); }

ho::EngineOptions file_options(const std::string& directory, std::uint64_t bytes) {
  ho::EngineOptions options;
  options.file_directories = {directory};
  options.file_bytes = bytes;
  options.chunk_bytes = 64 << 10;
  options.queue_depth = 4;
  return options;
}

// Stores, loads back and compares `count` tensors of assorted sizes (not multiples of 4096, several chunks).
void round_trip(ho::Engine& engine, ho::Tier tier, int count, unsigned seed) {
  std::vector<std::shared_ptr<VectorSource>> sources;
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < count; ++i) {
    const std::size_t bytes = 1 + (static_cast<std::size_t>(i) * 77777 + seed) % (300 << 10);
    sources.push_back(std::make_shared<VectorSource>(pattern(bytes, seed + i)));
    ids.push_back(engine.store(tier, sources.back()));
  }
  for (int i = 0; i < count; ++i) {
    INFO("entry " << i << ": " << engine.error(ids[i]));
    REQUIRE(engine.wait_store(ids[i]) == ho::State::done);
  }
  std::vector<std::shared_ptr<VectorSink>> sinks;
  for (int i = 0; i < count; ++i) {
    sinks.push_back(std::make_shared<VectorSink>(sources[i]->size()));
    engine.load(ids[i], sinks.back());
  }
  for (int i = 0; i < count; ++i) {
    INFO("entry " << i << ": " << engine.error(ids[i]));
    REQUIRE(engine.wait_load(ids[i]) == ho::State::done);
    REQUIRE(sinks[i]->finished());
    REQUIRE(sinks[i]->data() == sources[i]->data());
    engine.release(ids[i]);
  }
}

}  // namespace

TEST_CASE("extent allocator: aligned first fit, merged on free", "[offload]") {
  ho::ExtentAllocator extents(10 * 4096 + 100, 4096);
  REQUIRE(extents.capacity() == 10 * 4096);
  const auto a = extents.allocate(1);
  const auto b = extents.allocate(4097);
  const auto c = extents.allocate(0);
  REQUIRE((a && b && c));
  CHECK(*a == 0);
  CHECK(*b == 4096);
  CHECK(*c == 3 * 4096);
  CHECK(extents.used() == 4 * 4096);
  CHECK_FALSE(extents.allocate(7 * 4096));
  CHECK(extents.largest_free() == 6 * 4096);
  extents.free(*b);
  CHECK(extents.allocate(2 * 4096) == std::optional<std::uint64_t>(4096));  // the hole is reused
  extents.free(*a);
  extents.free(4096);
  extents.free(*c);
  CHECK(extents.used() == 0);
  CHECK(extents.peak() == 4 * 4096);
  CHECK(extents.largest_free() == 10 * 4096);  // everything merged back into one block
  CHECK_THROWS_AS(extents.free(*c), std::logic_error);
  CHECK_THROWS_AS(ho::ExtentAllocator(4096, 1000), std::invalid_argument);
}

TEST_CASE("host tier: round trip within the budget, full budget fails at once", "[offload]") {
  ho::EngineOptions options;
  options.host_budget_bytes = 3 << 20;
  options.host_arena_bytes = 1 << 20;
  options.store_threads = 2;
  options.load_threads = 2;
  ho::Engine engine(options, host_memory());
  REQUIRE(engine.host_available());
  REQUIRE_FALSE(engine.file_available());
  CHECK(engine.stats().host_capacity == 3 << 20);
  round_trip(engine, ho::Tier::host, 8, 1);
  CHECK(engine.stats().host_used == 0);

  // A tensor larger than an arena, and tensors beyond the budget, are refused at once, with the reason.
  const auto big = engine.store(ho::Tier::host, std::make_shared<VectorSource>(pattern((1 << 20) + 1, 2)));
  CHECK(engine.store_state(big) == ho::State::failed);
  CHECK_THAT(engine.error(big), Catch::Contains("host tier is full"));
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(engine.store(ho::Tier::host, std::make_shared<VectorSource>(pattern(1 << 20, 3))));
  }
  bool accepted = true;
  const auto over = engine.store(ho::Tier::host, std::make_shared<VectorSource>(pattern(10, 4)), &accepted);
  CHECK_FALSE(accepted);
  CHECK(engine.store_state(over) == ho::State::failed);
  for (auto id : ids) {
    CHECK(engine.wait_store(id) == ho::State::done);
  }
  // The file tier was not configured: a clear failure, not a crash.
  const auto to_file = engine.store(ho::Tier::file, std::make_shared<VectorSource>(pattern(10, 5)));
  CHECK(engine.store_state(to_file) == ho::State::failed);
  CHECK_THAT(engine.error(to_file), Catch::Contains("file tier is not available"));
  engine.release(ids[1]);
  bool placed = true;
  const auto fits = engine.store(ho::Tier::host, std::make_shared<VectorSource>(pattern(1 << 20, 6)), &accepted,
                                 &placed);
  CHECK(accepted);
  CHECK_FALSE(placed);  // VectorSource leaves the copy to the engine
  CHECK(engine.wait_store(fits) == ho::State::done);
  CHECK(engine.stats().stores_failed == 3);
}

TEST_CASE("file tier: O_DIRECT on a disk, buffered on tmpfs; several threads and I/Os in flight", "[offload]") {
  for (const std::string parent : {"/tmp", "/dev/shm"}) {
    struct stat info {};
    if (stat(parent.c_str(), &info) != 0) {
      continue;
    }
    TempDir dir(parent);
    REQUIRE(!dir.path.empty());
    SECTION("in " + parent) {
      auto options = file_options(dir.path, 64 << 20);
      options.store_threads = 3;
      options.load_threads = 3;
      ho::Engine engine(options, host_memory());
      INFO(engine.status());
      REQUIRE(engine.file_available());
      CHECK_FALSE(engine.gds());  // no fault hook, but no GPU memory either: libcufile is absent here
      WARN("offload files in " << parent << ": " << (engine.direct_io() ? "O_DIRECT" : "buffered"));
      // Unlinked as soon as opened: nothing in the directory, the path names the rank and the process.
      CHECK(dir.names().empty());
      REQUIRE(engine.file_paths().size() == 1);
      CHECK_THAT(engine.file_paths()[0], Catch::Contains("-p" + std::to_string(getpid()) + "-"));
      round_trip(engine, ho::Tier::file, 60, 7);
      const auto stats = engine.stats();
      CHECK(stats.file_used == 0);
      CHECK(stats.file_peak > 0);
      CHECK(stats.stores_done == 60);
      CHECK(stats.loads_done == 60);
    }
  }
}

TEST_CASE("file tier: several directories fill evenly", "[offload]") {
  TempDir a("/tmp"), b("/tmp");
  ho::EngineOptions options = file_options(a.path, 1 << 20);
  options.file_directories.push_back(b.path);
  ho::Engine engine(options, host_memory());
  REQUIRE(engine.file_paths().size() == 2);
  CHECK(engine.stats().file_capacity == 2 << 20);
  round_trip(engine, ho::Tier::file, 12, 11);  // 12 tensors of up to 300 KiB: more than one file holds
}

TEST_CASE("file tier: full files and failed preallocation are reported, not fatal", "[offload]") {
  TempDir dir("/tmp");
  SECTION("full") {
    ho::Engine engine(file_options(dir.path, 1 << 20), host_memory());
    const auto first = engine.store(ho::Tier::file, std::make_shared<VectorSource>(pattern(900 << 10, 1)));
    const auto second = engine.store(ho::Tier::file, std::make_shared<VectorSource>(pattern(200 << 10, 2)));
    CHECK(engine.wait_store(first) == ho::State::done);
    CHECK(engine.store_state(second) == ho::State::failed);
    CHECK_THAT(engine.error(second), Catch::Contains("offload files are full"));
  }
  SECTION("no room to preallocate") {
    ho::Engine engine(file_options(dir.path, 1ull << 60), host_memory());  // an exabyte: ENOSPC or EFBIG
    CHECK_FALSE(engine.file_available());
    CHECK_THAT(engine.status(), Catch::Contains("cannot preallocate") && Catch::Contains(dir.path));
    CHECK(dir.names().empty());
    const auto id = engine.store(ho::Tier::file, std::make_shared<VectorSource>(pattern(10, 3)));
    CHECK(engine.store_state(id) == ho::State::failed);
  }
  SECTION("missing directory") {
    ho::Engine engine(file_options(dir.path + "/missing", 1 << 20), host_memory());
    CHECK_FALSE(engine.file_available());
    CHECK_THAT(engine.status(), Catch::Contains("cannot create an offload file"));
  }
}

TEST_CASE("file tier: injected I/O errors fail only the affected entries, with the reason", "[offload]") {
  TempDir dir("/tmp");
  auto options = file_options(dir.path, 16 << 20);
  std::atomic<int> writes{0}, reads{0};
  std::atomic<int> write_fault{0}, read_fault{0};
  std::atomic<int> fail_write_number{-1}, fail_read_number{-1};
  options.fault = [&](ho::IoOp op, std::uint64_t, std::size_t) {
    const int number = op == ho::IoOp::write ? writes++ : reads++;
    if (op == ho::IoOp::write && number == fail_write_number) {
      return write_fault.load();
    }
    if (op == ho::IoOp::read && number == fail_read_number) {
      return read_fault.load();
    }
    return 0;
  };
  options.store_threads = 1;
  options.load_threads = 1;
  ho::Engine engine(options, host_memory());
  REQUIRE(engine.file_available());
  CHECK_FALSE(engine.gds());  // a fault hook keeps the POSIX path, where faults can be injected

  const auto write_case = GENERATE(as<std::pair<int, const char*>>{}, std::make_pair(EIO, "Input/output error"),
                                   std::make_pair(ENOSPC, "No space left on device"),
                                   std::make_pair(ho::kShortTransfer, "short transfer"));
  write_fault = write_case.first;
  // Three tensors of 3 chunks each, one thread: write number 4 belongs to the second tensor.
  fail_write_number = writes + 4;
  std::vector<std::shared_ptr<VectorSource>> sources;
  std::vector<std::uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    sources.push_back(std::make_shared<VectorSource>(pattern((160 << 10) + 3, 20 + i)));
    ids.push_back(engine.store(ho::Tier::file, sources.back()));
  }
  CHECK(engine.wait_store(ids[0]) == ho::State::done);
  CHECK(engine.wait_store(ids[1]) == ho::State::failed);
  CHECK(engine.wait_store(ids[2]) == ho::State::done);
  CHECK_THAT(engine.error(ids[1]), Catch::Contains(write_case.second) && Catch::Contains("writing entry"));
  CHECK_THROWS_AS(engine.load(ids[1], std::make_shared<VectorSink>(10)), std::logic_error);

  // A read error on the first chunk of tensor 0: its load fails with the reason; tensor 2 still loads intact.
  read_fault = EIO;
  fail_read_number = reads.load();
  auto sink0 = std::make_shared<VectorSink>(sources[0]->size());
  auto sink2 = std::make_shared<VectorSink>(sources[2]->size());
  engine.load(ids[0], sink0);
  engine.load(ids[2], sink2);
  CHECK(engine.wait_load(ids[0]) == ho::State::failed);
  CHECK_THAT(engine.error(ids[0]), Catch::Contains("reading entry") && Catch::Contains("Input/output error"));
  REQUIRE(engine.wait_load(ids[2]) == ho::State::done);
  CHECK(sink2->data() == sources[2]->data());
  // A short read is a failure too, never partial data.
  read_fault = ho::kShortTransfer;
  fail_read_number = reads.load() + 1;
  auto again = std::make_shared<VectorSink>(sources[2]->size());
  engine.load(ids[2], again);
  CHECK(engine.wait_load(ids[2]) == ho::State::failed);
  CHECK_THAT(engine.error(ids[2]), Catch::Contains("short transfer"));
  for (auto id : ids) {
    engine.release(id);
  }
  engine.drain();
  CHECK(engine.stats().file_used == 0);
}

TEST_CASE("cancel: a queued store never runs, a running one ends cancelled; room is freed", "[offload]") {
  ho::EngineOptions options;
  options.host_budget_bytes = 1 << 20;
  ho::Engine engine(options, host_memory());
  auto gate = std::make_shared<GateSource>(4096);
  const auto running = engine.store(ho::Tier::host, gate);
  auto queued_source = std::make_shared<VectorSource>(pattern(4096, 1));
  const auto queued = engine.store(ho::Tier::host, queued_source);
  gate->wait_entered();
  CHECK(engine.store_state(running) == ho::State::running);
  CHECK(engine.store_state(queued) == ho::State::queued);
  CHECK(engine.cancel_store(queued));
  CHECK(engine.cancel_store(running));
  gate->open();
  CHECK(engine.wait_store(running) == ho::State::cancelled);
  CHECK(engine.wait_store(queued) == ho::State::cancelled);
  CHECK(queued_source->reads() == 0);
  const auto finished = engine.take_finished_stores();
  REQUIRE(finished.size() == 2);
  CHECK(finished[0] == std::make_pair(running, ho::State::cancelled));  // one thread: FIFO order
  CHECK(finished[1] == std::make_pair(queued, ho::State::cancelled));
  CHECK(engine.take_finished_stores().empty());
  CHECK_FALSE(engine.cancel_store(queued));
  engine.drain();
  CHECK(engine.stats().host_used == 0);
  CHECK(engine.stats().stores_cancelled == 2);
}

TEST_CASE("release during a running store frees the room when the store ends", "[offload]") {
  ho::EngineOptions options;
  options.host_budget_bytes = 1 << 20;
  ho::Engine engine(options, host_memory());
  auto gate = std::make_shared<GateSource>(512 << 10);
  const auto id = engine.store(ho::Tier::host, gate);
  gate->wait_entered();
  engine.release(id);
  CHECK(engine.stats().host_used == 512 << 10);  // still being written into
  CHECK(engine.store_state(id) == ho::State::none);
  gate->open();
  engine.drain();
  CHECK(engine.stats().host_used == 0);
  CHECK(engine.stats().entries == 0);
}

TEST_CASE("destroying an engine with queued work cancels it and returns", "[offload]") {
  TempDir dir("/tmp");
  auto gate = std::make_shared<GateSource>(4096);
  {
    auto options = file_options(dir.path, 4 << 20);
    options.host_budget_bytes = 1 << 20;
    ho::Engine engine(options, host_memory());
    engine.store(ho::Tier::host, gate);
    for (int i = 0; i < 10; ++i) {
      engine.store(ho::Tier::file, std::make_shared<VectorSource>(pattern(100 << 10, i)));
    }
    gate->wait_entered();
    gate->open();
  }
  CHECK(dir.names().empty());
}

TEST_CASE("offload files: per-rank names, stale files of dead processes removed at start", "[offload]") {
  TempDir dir("/tmp");
  // A process that is surely dead: a child that has exited and been reaped.
  const pid_t child = fork();
  if (child == 0) {
    _exit(0);
  }
  REQUIRE(child > 0);
  waitpid(child, nullptr, 0);
  const std::string stale = "hectorgen-offload-r0-p" + std::to_string(child) + "-0.bin";
  const std::string live = "hectorgen-offload-r0-p1-0.bin";  // pid 1 is alive
  const std::string other = "notes.bin";
  for (const auto& name : {stale, live, other}) {
    std::ofstream(dir.path + "/" + name) << "x";
  }
  setenv("RANK", "3", 1);
  CHECK(ho::offload_rank() == 3);
  CHECK(ho::offload_rank(5) == 5);
  ho::EngineOptions options = file_options(dir.path, 1 << 20);
  ho::Engine engine(options, host_memory());
  unsetenv("RANK");
  setenv("LOCAL_RANK", "2", 1);
  CHECK(ho::offload_rank() == 2);
  unsetenv("LOCAL_RANK");
  CHECK(ho::offload_rank() == 0);
  REQUIRE(engine.file_available());
  CHECK_THAT(engine.file_paths()[0], Catch::Contains("hectorgen-offload-r3-p"));
  auto names = dir.names();
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{live, other});
}

TEST_CASE("GPUDirect Storage: missing libcufile is reported, not fatal", "[offload]") {
  ho::CuFile cufile;
  if (cufile.available()) {
    WARN("libcufile is installed and its driver opened: nothing to check here");
    return;
  }
  CHECK_FALSE(cufile.reason().empty());
  CHECK(cufile.register_file(0) == nullptr);
}

// Hidden: runs only as the ctest test offload_gds_hang, with a libcufile whose driver open never returns
// (fake_cufile_hang.cpp) on LD_LIBRARY_PATH and HECTORGEN_OFFLOAD_GDS_TIMEOUT_S=1.
TEST_CASE("GPUDirect Storage: a driver open that never returns is given up after the timeout", "[.gds-hang]") {
  const auto start = std::chrono::steady_clock::now();
  ho::CuFile cufile;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_FALSE(cufile.available());
  CHECK(cufile.reason().find("did not return within 1 s") != std::string::npos);
  CHECK(seconds >= 0.9);
  CHECK(seconds < 5.0);
  CHECK(cufile.register_file(0) == nullptr);
}

TEST_CASE("paused stores wait in the queue, in order", "[offload]") {
  ho::EngineOptions options;
  options.host_budget_bytes = 1 << 20;
  ho::Engine engine(options, host_memory());
  engine.pause_stores(true);
  auto source = std::make_shared<VectorSource>(pattern(8192, 1));
  const auto id = engine.store(ho::Tier::host, source);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(engine.store_state(id) == ho::State::queued);
  CHECK(source->reads() == 0);
  engine.pause_stores(false);
  CHECK(engine.wait_store(id) == ho::State::done);
}

namespace {

// Copies into the host block when placed (as the CUDA binding queues its copy); prepare() waits for a gate.
class PlacingSource final : public ho::Source {
 public:
  explicit PlacingSource(std::vector<unsigned char> data) : data_(std::move(data)) {}
  std::uint64_t size() const override { return data_.size(); }
  bool place(void* host) override {
    std::memcpy(host, data_.data(), data_.size());
    return true;
  }
  void prepare() override { gate_.prepare(); }
  void read(std::uint64_t, void*, std::uint64_t) override { FAIL("read() of a placed source"); }
  GateSource& gate() { return gate_; }

 private:
  std::vector<unsigned char> data_;
  GateSource gate_{0};
};

}  // namespace

TEST_CASE("placed stores: a load queued while the store runs waits for it", "[offload]") {
  ho::EngineOptions options;
  options.host_budget_bytes = 1 << 20;
  ho::Engine engine(options, host_memory());
  auto source = std::make_shared<PlacingSource>(pattern(70000, 9));
  bool placed = false;
  const auto id = engine.store(ho::Tier::host, source, nullptr, &placed);
  CHECK(placed);
  source->gate().wait_entered();
  auto sink = std::make_shared<VectorSink>(70000);
  engine.load(id, sink);  // the store is still running
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(sink->finished());
  source->gate().open();
  REQUIRE(engine.wait_load(id) == ho::State::done);
  CHECK(sink->data() == pattern(70000, 9));
}

TEST_CASE("a load queued during a store that fails fails with the store's error", "[offload]") {
  TempDir dir("/tmp");
  auto options = file_options(dir.path, 4 << 20);
  options.fault = [](ho::IoOp op, std::uint64_t, std::size_t) { return op == ho::IoOp::write ? EIO : 0; };
  ho::Engine engine(options, host_memory());
  auto gate = std::make_shared<GateSource>(100 << 10);
  const auto id = engine.store(ho::Tier::file, gate);
  gate->wait_entered();
  engine.load(id, std::make_shared<VectorSink>(100 << 10));
  gate->open();
  CHECK(engine.wait_store(id) == ho::State::failed);
  CHECK(engine.wait_load(id) == ho::State::failed);
  CHECK_THAT(engine.error(id), Catch::Contains("Input/output error"));
  CHECK_THROWS_AS(engine.load(id, std::make_shared<VectorSink>(10)), std::logic_error);
}

TEST_CASE("releasing a queued placed store keeps its block until the copy has been waited for", "[offload]") {
  ho::EngineOptions options;
  options.host_budget_bytes = 1 << 20;
  ho::Engine engine(options, host_memory());
  auto busy = std::make_shared<GateSource>(4096);
  engine.store(ho::Tier::host, busy);  // holds the only store thread
  busy->wait_entered();
  auto placed = std::make_shared<PlacingSource>(pattern(8192, 3));
  const auto id = engine.store(ho::Tier::host, placed);
  engine.release(id);
  CHECK(engine.stats().host_used == 4096 + 8192);  // the copy into its block may still be running
  placed->gate().open();
  busy->open();
  engine.drain();
  CHECK(engine.stats().host_used == 4096);  // the busy entry is still stored; the released one is gone
}
