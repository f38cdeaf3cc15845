// Python bindings of unified tensors (hectorgen/unified_torch.h), registered into hectorgen_runtime._C by
// python_module.cpp. The Python API is hectorgen_runtime.unified; its exception classes are raised from here.

#include <torch/extension.h>

#include "hectorgen/unified.h"
#include "hectorgen/unified_torch.h"

namespace hectorgen::runtime {
namespace {

namespace py = pybind11;

// Runs `fn`, turning the unified runtime's C++ exceptions into hectorgen_runtime.unified's Python exceptions.
template <class Fn>
auto translating(Fn&& fn) {
  try {
    return fn();
  } catch (const hectorgen::unified::NotPinnable& error) {
    PyErr_SetString(py::module_::import("hectorgen_runtime.unified").attr("NotPinnableError").ptr(), error.what());
    throw py::error_already_set();
  } catch (const hectorgen::unified::PinnedMemoryExhausted& error) {
    PyErr_SetString(py::module_::import("hectorgen_runtime.unified").attr("PinnedMemoryError").ptr(), error.what());
    throw py::error_already_set();
  }
}

}  // namespace

void bind_unified(py::module_& m) {
  m.def("unified_empty", [](const std::vector<int64_t>& sizes, at::ScalarType dtype) {
    return translating([&] { return unified_empty(sizes, dtype); });
  }, "A contiguous CPU tensor on pinned, GPU-mapped memory from the unified pool.",
        py::arg("sizes"), py::arg("dtype"));
  m.def("unified_pin", [](const at::Tensor& t) { return translating([&] { return unified_pin(t); }); },
        "Maps the CPU tensor's storage for the GPU in place (undone when the storage dies); True if this call did.",
        py::arg("t"));
  m.def("unified_is_mapped", &unified_is_mapped, "Whether the CPU tensor's bytes are GPU-mapped host memory.",
        py::arg("t"));
  m.def("unified_cuda_view", &unified_cuda_view, "A CUDA tensor aliasing a GPU-mapped CPU tensor (zero-copy).",
        py::arg("t"), py::arg("device"));
  m.def("unified_gather", &unified_gather, "Zero-copy gather kernel: out[positions[i]] = table[index[i]].",
        py::arg("table"), py::arg("index"), py::arg("positions"), py::arg("out"), py::arg("error"));
  m.def("unified_gather_cpu", [](const at::Tensor& table, const at::Tensor& index, const at::Tensor& out,
                                 int64_t chunk_bytes) {
    return translating([&] {
      const py::gil_scoped_release no_gil;  // CPU threads copy; other Python threads may run meanwhile
      return unified_gather_cpu(table, index, out, chunk_bytes);
    });
  }, "Pipelined CPU gather + DMA into a CUDA tensor; returns -1 or the first position of a bad index.",
        py::arg("table"), py::arg("index"), py::arg("out"), py::arg("chunk_bytes"));
  m.def("unified_gather_plan", &unified_gather_plan, "How the gather kernel reads this table into out.",
        py::arg("table"), py::arg("out"));
  m.def("unified_pool_stats", &unified_pool_stats, "The unified pool's counters.");
  m.def("unified_trim_pool", &unified_trim_pool, "Frees the pool's unused chunks; returns the bytes released.");
  m.def("unified_set_pool_limit", &unified_set_pool_limit, "At most this many bytes in use (0: no limit).",
        py::arg("bytes"));
}

}  // namespace hectorgen::runtime
