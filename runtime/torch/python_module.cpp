// Python bindings of the graph preprocessing runtime (built as hectorgen_runtime._C, see runtime/python).
// Generated modules prepare graphs through the Python package (hectorgen_runtime.prepare_graph), which calls this.

#include <torch/extension.h>

#include "hectorgen/graph_preprocess_torch.h"

namespace hectorgen::runtime {
void bind_unified(pybind11::module_& m);  // unified_python.cpp
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hectorgen graph preprocessing runtime (CUDA)";
  m.def("preprocess", &hectorgen::runtime::preprocess,
        "Builds the requested graph layouts on the GPU; returns a dict of named int32/float32 tensors.",
        pybind11::arg("src"), pybind11::arg("dst"), pybind11::arg("etype"), pybind11::arg("num_nodes"),
        pybind11::arg("num_etypes"), pybind11::arg("ntype"), pybind11::arg("layouts"),
        pybind11::arg("num_ntypes") = -1, pybind11::arg("validate") = true, pybind11::arg("gemm_tile") = 0,
        pybind11::arg("compact_threshold") = -1.0, pybind11::arg("compact_mask") = pybind11::none());
  m.def("layout_names", &hectorgen::runtime::layout_names, "Layout names accepted by preprocess().");
  m.def("version", &hectorgen::runtime::version, "Version of the compiled runtime (hectorgen/runtime_version.h).");
  hectorgen::runtime::bind_unified(m);
}
