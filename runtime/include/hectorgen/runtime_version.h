// Version of the hectorgen runtime: the one place it is written down. The CMake package (runtime/CMakeLists.txt),
// the Python package (runtime/python/setup.py, hectorgen_runtime.VERSION; a test checks they agree) and the
// hectorgen compiler (which records it in every generated module) all read it from here.
//
// Semantic versioning of the contract between generated code and the runtime (layout names and result keys,
// hectorgen_runtime.prepare_graph / Graph, the C++ API of hectorgen/graph.h and the libtorch binding):
//   MAJOR  incompatible change: code generated for another major version must be regenerated;
//   MINOR  additions only: code generated for MAJOR.m runs on every runtime MAJOR.n with n >= m;
//   PATCH  fixes that change no interface.
// Generated modules check this at import (Python), at compile time (the static_assert in <model>_host.cpp) and at
// configure time (find_package(hectorgen_runtime MAJOR.MINOR) in their CMakeLists.txt).
#pragma once

#define HECTORGEN_RUNTIME_VERSION_MAJOR 1
#define HECTORGEN_RUNTIME_VERSION_MINOR 7
#define HECTORGEN_RUNTIME_VERSION_PATCH 0
#define HECTORGEN_RUNTIME_VERSION_STRING "1.7.0"
