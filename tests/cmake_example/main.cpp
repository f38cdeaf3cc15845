// Compiles against the header hectorgen generated from specs/rgcn.yaml and links its kernel library, which brings
// the hectorgen runtime (graph preprocessing) along.
#include "rgcn_kernels.h"

#include <cstdio>
#include <cstring>

#include "hectorgen/graph.h"
#include "hectorgen/runtime_version.h"

static_assert(HECTORGEN_RUNTIME_VERSION_MAJOR >= 1, "the hectorgen runtime is versioned from 1.0 on");

int main() {
  // A host function of the runtime library: linking it proves the library, not only its headers, came along.
  const char* message = hectorgen::runtime::graph_error_string(hectorgen::runtime::kSrcOutOfRange);
  if (message == nullptr || std::strstr(message, "src") == nullptr) {
    std::puts("unexpected graph_error_string");
    return 1;
  }
  std::printf("ok (hectorgen runtime %s)\n", HECTORGEN_RUNTIME_VERSION_STRING);
  return 0;
}
