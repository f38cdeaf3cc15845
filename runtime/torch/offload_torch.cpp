// Python binding of the offload engine (hectorgen/offload/engine.h) over PyTorch tensors, built as the extension
// hectorgen_runtime._offload (runtime/python/hectorgen_runtime/offload.py loads or JIT-builds it).
//
// Only device-generic c10 APIs are used (c10::Stream, c10::Event, StreamGuard and Tensor::copy_), so this file
// compiles without the CUDA toolkit and serves CUDA tensors and, in the CPU tensor mode, CPU tensors alike:
//   * store: the caller's current stream is recorded in an event when the store is queued; an engine thread makes its
//     own copy stream wait for that event, copies device -> host (pinned) on it and synchronizes that stream. For the
//     host tier the copy can instead be queued at once on the caller's thread (asynchronous=True), on a copy stream
//     that waits for the event; the engine thread then only waits for the copy. Either way the store is done once
//     the bytes are in host memory, and only then may the caller drop the tensor;
//   * load: an engine thread copies host -> device on its copy stream and synchronizes it before the load is done, so
//     the caller may use the tensor on any stream once wait_load returns.
// Host arenas and bounce buffers are pinned tensors allocated once (CUDA), or aligned host memory (CPU mode).

#include <torch/extension.h>

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "hectorgen/offload/engine.h"
#include "hectorgen/runtime_version.h"

namespace ho = hectorgen::offload;

namespace {

// Pinned host memory from PyTorch's host allocator, kept alive by the tensors that own it.
class PinnedHostMemory final : public ho::HostMemory {
 public:
  void* allocate(std::uint64_t bytes) override {
    try {
      at::Tensor block = at::empty({static_cast<std::int64_t>(bytes)},
                                   at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      void* pointer = block.data_ptr();
      if (reinterpret_cast<std::uintptr_t>(pointer) % ho::FileStore::kAlignment != 0) {
        return nullptr;
      }
      std::lock_guard lock(mutex_);
      blocks_.emplace(pointer, std::move(block));
      return pointer;
    } catch (const c10::Error&) {
      return nullptr;
    }
  }
  void deallocate(void* pointer, std::uint64_t) override {
    std::lock_guard lock(mutex_);
    blocks_.erase(pointer);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, at::Tensor> blocks_;
};

// One copy stream per engine thread and device.
c10::Stream copy_stream(const c10::Device& device) {
  thread_local std::unordered_map<int, c10::Stream> streams;
  auto it = streams.find(device.index());
  if (it == streams.end()) {
    c10::impl::VirtualGuardImpl guard(device.type());
    it = streams.emplace(device.index(), guard.getStreamFromGlobalPool(device, /*isHighPriority=*/false)).first;
  }
  return it->second;
}

at::Tensor host_bytes(const void* host, std::uint64_t bytes) {
  return at::from_blob(const_cast<void*>(host), {static_cast<std::int64_t>(bytes)},
                       at::TensorOptions().dtype(at::kByte));
}

// The bytes of a contiguous uint8 tensor (a whole storage, see offload.py).
void check_bytes(const at::Tensor& tensor, const char* what) {
  TORCH_CHECK(tensor.scalar_type() == at::kByte && tensor.dim() == 1 && tensor.is_contiguous(),
              "offload: ", what, " must be a contiguous 1-D uint8 tensor, got ", tensor.scalar_type(), " of shape ",
              tensor.sizes());
}

class TensorSource final : public ho::Source {
 public:
  // asynchronous: for the host tier, queue the device-to-host copy on the caller's thread (place), so that it starts
  // as soon as the GPU has produced the data rather than when an engine thread gets to it.
  TensorSource(at::Tensor bytes, bool asynchronous)
      : bytes_(std::move(bytes)), asynchronous_(asynchronous && bytes_.device().is_cuda()) {
    if (!bytes_.device().is_cpu()) {
      c10::impl::VirtualGuardImpl guard(bytes_.device().type());
      ready_.emplace(bytes_.device().type());
      ready_->record(guard.getStream(bytes_.device()));
    }
  }
  std::uint64_t size() const override { return static_cast<std::uint64_t>(bytes_.numel()); }
  void read(std::uint64_t offset, void* host, std::uint64_t bytes) override {
    if (bytes_.device().is_cpu()) {
      std::memcpy(host, static_cast<const char*>(bytes_.data_ptr()) + offset, bytes);
      return;
    }
    const c10::Stream stream = copy_stream(bytes_.device());
    if (!waited_) {
      ready_->block(stream);  // the producer's kernels first
      waited_ = true;
    }
    c10::StreamGuard guard(stream);
    host_bytes(host, bytes).copy_(bytes_.narrow(0, static_cast<std::int64_t>(offset), static_cast<std::int64_t>(bytes)),
                                  /*non_blocking=*/true);
    stream.synchronize();
  }
  const void* device_pointer() const override {
    return bytes_.defined() && bytes_.device().is_cuda() ? bytes_.data_ptr() : nullptr;
  }
  bool place(void* host) override {
    if (!asynchronous_) {
      return false;
    }
    const c10::Stream stream = copy_stream(bytes_.device());
    ready_->block(stream);
    {
      c10::StreamGuard guard(stream);
      host_bytes(host, static_cast<std::uint64_t>(bytes_.numel())).copy_(bytes_, /*non_blocking=*/true);
    }
    copied_.emplace(bytes_.device().type());
    copied_->record(stream);
    return true;  // bytes_ stays referenced until the store job has waited for the copy
  }
  void prepare() override {
    if (copied_) {
      copied_->synchronize();
    } else if (ready_ && bytes_.device().is_cuda()) {
      ready_->synchronize();  // GPUDirect Storage reads the memory outside any stream
    }
  }

 private:
  at::Tensor bytes_;
  bool asynchronous_;
  std::optional<c10::Event> ready_;
  std::optional<c10::Event> copied_;
  bool waited_ = false;
};

class TensorSink final : public ho::Sink {
 public:
  explicit TensorSink(at::Tensor bytes) : bytes_(std::move(bytes)) {
    if (!bytes_.device().is_cpu()) {
      // The destination was allocated on the caller's stream: copies wait for what that stream queued before.
      c10::impl::VirtualGuardImpl guard(bytes_.device().type());
      allocated_.emplace(bytes_.device().type());
      allocated_->record(guard.getStream(bytes_.device()));
    }
  }
  void write(std::uint64_t offset, const void* host, std::uint64_t bytes) override {
    if (bytes_.device().is_cpu()) {
      std::memcpy(static_cast<char*>(bytes_.data_ptr()) + offset, host, bytes);
      return;
    }
    const c10::Stream stream = copy_stream(bytes_.device());
    if (!waited_) {
      allocated_->block(stream);
      waited_ = true;
    }
    c10::StreamGuard guard(stream);
    bytes_.narrow(0, static_cast<std::int64_t>(offset), static_cast<std::int64_t>(bytes))
        .copy_(host_bytes(host, bytes), /*non_blocking=*/true);
  }
  void finish() override {
    if (!bytes_.device().is_cpu()) {
      copy_stream(bytes_.device()).synchronize();  // the bounce buffer or arena may be reused after this
    }
  }
  void* device_pointer() override {
    if (!bytes_.device().is_cuda()) {
      return nullptr;
    }
    allocated_->synchronize();
    return bytes_.data_ptr();
  }

 private:
  at::Tensor bytes_;
  std::optional<c10::Event> allocated_;
  bool waited_ = false;
};

// Programmable faults for tests: the next `count` I/Os of one kind (after `skip` of them) fail with `error`.
struct FaultPlan {
  std::mutex mutex;
  int op = -1;  // 0 write, 1 read, -1 none
  int error = 0;
  int skip = 0;
  int count = 0;
  int operator()(ho::IoOp io, std::uint64_t, std::size_t) {
    std::lock_guard lock(mutex);
    if (count <= 0 || op != static_cast<int>(io)) {
      return 0;
    }
    if (skip > 0) {
      --skip;
      return 0;
    }
    --count;
    return error;
  }
};

ho::Tier parse_tier(const std::string& tier) {
  if (tier == "host") {
    return ho::Tier::host;
  }
  if (tier == "file") {
    return ho::Tier::file;
  }
  throw std::invalid_argument("offload: unknown tier '" + tier + "' (host or file)");
}

class PyEngine {
 public:
  PyEngine(std::uint64_t host_budget_bytes, std::uint64_t host_arena_bytes, std::vector<std::string> directories,
           std::uint64_t file_bytes, bool pinned, bool direct_io, bool gds, int store_threads, int load_threads,
           std::uint64_t chunk_bytes, int queue_depth, int rank, bool fault_injection) {
    ho::EngineOptions options;
    options.host_budget_bytes = host_budget_bytes;
    options.host_arena_bytes = host_arena_bytes;
    options.file_directories = std::move(directories);
    options.file_bytes = file_bytes;
    options.direct_io = direct_io;
    options.gds = gds;
    options.store_threads = store_threads;
    options.load_threads = load_threads;
    options.chunk_bytes = chunk_bytes;
    options.queue_depth = queue_depth;
    options.rank = rank;
    if (fault_injection) {
      faults_ = std::make_shared<FaultPlan>();
      options.fault = [plan = faults_](ho::IoOp op, std::uint64_t offset, std::size_t bytes) {
        return (*plan)(op, offset, bytes);
      };
    }
    std::shared_ptr<ho::HostMemory> memory;
    if (pinned) {
      memory = std::make_shared<PinnedHostMemory>();
    } else {
      memory = std::make_shared<ho::AlignedHostMemory>();
    }
    engine_ = std::make_unique<ho::Engine>(std::move(options), std::move(memory));
  }

  // asynchronous (host tier, CUDA tensors): the copy is queued now on a copy stream. Returns (id, accepted, placed):
  // accepted is false when the tier was full or unavailable (nothing queued); placed says that the copy was queued.
  std::tuple<std::uint64_t, bool, bool> store(const at::Tensor& bytes, const std::string& tier, bool asynchronous) {
    check_bytes(bytes, "the tensor to store");
    bool accepted = false;
    bool placed = false;
    const std::uint64_t id =
        engine_->store(parse_tier(tier), std::make_shared<TensorSource>(bytes, asynchronous), &accepted, &placed);
    return {id, accepted, placed};
  }
  void load(std::uint64_t id, const at::Tensor& into) {
    check_bytes(into, "the load destination");
    engine_->load(id, std::make_shared<TensorSink>(into));
  }
  void inject_fault(const std::string& op, int error, int count, int skip) {
    TORCH_CHECK(faults_ != nullptr, "offload: this engine was made without fault_injection=True");
    TORCH_CHECK(op == "write" || op == "read", "offload: fault op must be 'write' or 'read', got ", op);
    std::lock_guard lock(faults_->mutex);
    faults_->op = op == "write" ? 0 : 1;
    faults_->error = error;
    faults_->count = count;
    faults_->skip = skip;
  }
  // The engine's threads may need the GIL to drop their last tensor references: let them finish without it.
  ~PyEngine() {
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release release;
      engine_.reset();
    }
  }
  PyEngine(const PyEngine&) = delete;
  PyEngine& operator=(const PyEngine&) = delete;

  ho::Engine& engine() { return *engine_; }

 private:
  std::shared_ptr<FaultPlan> faults_;
  std::unique_ptr<ho::Engine> engine_;
};

std::string state_name(ho::State state) { return ho::to_string(state); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.doc() = "hectorgen activation offload engine (runtime/include/hectorgen/offload/engine.h)";
  m.def("version", [] { return std::string(HECTORGEN_RUNTIME_VERSION_STRING); },
        "Version of the compiled runtime (hectorgen/runtime_version.h).");
  py::class_<PyEngine>(m, "Engine")
      .def(py::init<std::uint64_t, std::uint64_t, std::vector<std::string>, std::uint64_t, bool, bool, bool, int, int,
                    std::uint64_t, int, int, bool>(),
           py::arg("host_budget_bytes") = 0, py::arg("host_arena_bytes") = 1ull << 30,
           py::arg("directories") = std::vector<std::string>{}, py::arg("file_bytes") = 0, py::arg("pinned") = true,
           py::arg("direct_io") = true, py::arg("gds") = true, py::arg("store_threads") = 1,
           py::arg("load_threads") = 1, py::arg("chunk_bytes") = 8ull << 20, py::arg("queue_depth") = 4,
           py::arg("rank") = -1, py::arg("fault_injection") = false, py::call_guard<py::gil_scoped_release>())
      .def("store", &PyEngine::store, py::arg("bytes"), py::arg("tier"), py::arg("asynchronous") = false,
           py::call_guard<py::gil_scoped_release>(),
           "Queues storing a contiguous uint8 tensor to 'host' or 'file'; returns (id, accepted, placed): not "
           "accepted when the tier is full or unavailable (error(id) says why). asynchronous (host tier, CUDA): the "
           "device-to-host copy is queued on a copy stream now (placed). Keep the tensor until the store is done.")
      .def("load", &PyEngine::load, py::arg("id"), py::arg("into"), py::call_guard<py::gil_scoped_release>(),
           "Queues loading a stored entry into a contiguous uint8 tensor of its size.")
      .def("cancel_store", [](PyEngine& self, std::uint64_t id) { return self.engine().cancel_store(id); },
           py::call_guard<py::gil_scoped_release>())
      .def("store_state", [](PyEngine& self, std::uint64_t id) { return state_name(self.engine().store_state(id)); },
           py::call_guard<py::gil_scoped_release>())
      .def("load_state", [](PyEngine& self, std::uint64_t id) { return state_name(self.engine().load_state(id)); },
           py::call_guard<py::gil_scoped_release>())
      .def("wait_store", [](PyEngine& self, std::uint64_t id) { return state_name(self.engine().wait_store(id)); },
           py::call_guard<py::gil_scoped_release>())
      .def("wait_load", [](PyEngine& self, std::uint64_t id) { return state_name(self.engine().wait_load(id)); },
           py::call_guard<py::gil_scoped_release>())
      .def("release", [](PyEngine& self, std::uint64_t id) { self.engine().release(id); },
           py::call_guard<py::gil_scoped_release>())
      .def("error", [](PyEngine& self, std::uint64_t id) { return self.engine().error(id); },
           py::call_guard<py::gil_scoped_release>())
      .def("pause_stores", [](PyEngine& self, bool paused) { self.engine().pause_stores(paused); },
           py::arg("paused"), py::call_guard<py::gil_scoped_release>())
      .def("drain", [](PyEngine& self) { self.engine().drain(); }, py::call_guard<py::gil_scoped_release>())
      .def("take_finished_stores",
           [](PyEngine& self) {
             std::vector<std::pair<std::uint64_t, std::string>> finished;
             for (const auto& [id, state] : self.engine().take_finished_stores()) {
               finished.emplace_back(id, state_name(state));
             }
             return finished;
           },
           py::call_guard<py::gil_scoped_release>())
      .def("inject_fault", &PyEngine::inject_fault, py::arg("op"), py::arg("error"), py::arg("count") = 1,
           py::arg("skip") = 0, "Makes the next `count` file writes or reads (after `skip`) fail with errno `error`.")
      .def("stats",
           [](PyEngine& self) {
             const ho::EngineStats s = self.engine().stats();
             py::dict d;
             d["stored_bytes"] = s.stored_bytes;
             d["loaded_bytes"] = s.loaded_bytes;
             d["stores_done"] = s.stores_done;
             d["stores_failed"] = s.stores_failed;
             d["stores_cancelled"] = s.stores_cancelled;
             d["loads_done"] = s.loads_done;
             d["loads_failed"] = s.loads_failed;
             d["store_seconds"] = s.store_seconds;
             d["load_seconds"] = s.load_seconds;
             d["host_capacity"] = s.host_capacity;
             d["host_used"] = s.host_used;
             d["host_peak"] = s.host_peak;
             d["file_capacity"] = s.file_capacity;
             d["file_used"] = s.file_used;
             d["file_peak"] = s.file_peak;
             d["entries"] = s.entries;
             return d;
           })
      .def_property_readonly("host_available", [](PyEngine& self) { return self.engine().host_available(); })
      .def_property_readonly("file_available", [](PyEngine& self) { return self.engine().file_available(); })
      .def_property_readonly("direct_io", [](PyEngine& self) { return self.engine().direct_io(); })
      .def_property_readonly("gds", [](PyEngine& self) { return self.engine().gds(); })
      .def_property_readonly("status", [](PyEngine& self) { return self.engine().status(); })
      .def_property_readonly("file_paths", [](PyEngine& self) { return self.engine().file_paths(); });
}
