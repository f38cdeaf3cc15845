// Compiles against the header hectorgen generated from specs/rgcn.yaml and links its kernel library.
#include "rgcn_kernels.h"

#include <cstdio>

int main() {
  std::puts("ok");
  return 0;
}
