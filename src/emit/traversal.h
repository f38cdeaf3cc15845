// The traversal-instance code generator (see traversal.cpp).
#pragma once

#include <set>
#include <string>

#include "ir/intra/intra.h"

namespace hectorgen::emit {

struct TraversalCode {
  std::string kernel, launcher;
  bool uses_warp_sum = false;
  std::set<std::string> written;  // tensors this kernel stores
};

// `written_before`: tensors earlier kernels of the phase stored (accumulations load them instead of 0).
TraversalCode emit_traversal(const intra::Program& p, const intra::TraversalSource& t,
                             const std::set<std::string>& written_before);

// A float literal for generated CUDA (`0.2f`, `1.0f`).
std::string float_literal(double v);

}  // namespace hectorgen::emit
