// Python bindings of the graph preprocessing runtime (built as hectorgen_runtime._C, see runtime/python).
// Generated C++ modules call hectorgen::runtime::preprocess directly and do not need this file.

#include <torch/extension.h>

#include "graph_preprocess_torch.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "hectorgen graph preprocessing runtime (CUDA)";
  m.def("preprocess", &hectorgen::runtime::preprocess,
        "Builds the requested graph layouts on the GPU; returns a dict of named int32/float32 tensors.",
        pybind11::arg("src"), pybind11::arg("dst"), pybind11::arg("etype"), pybind11::arg("num_nodes"),
        pybind11::arg("num_etypes"), pybind11::arg("ntype"), pybind11::arg("layouts"),
        pybind11::arg("num_ntypes") = -1, pybind11::arg("validate") = true);
  m.def("layout_names", &hectorgen::runtime::layout_names, "Layout names accepted by preprocess().");
}
