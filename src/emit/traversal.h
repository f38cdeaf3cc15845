// The CUDA printer of traversal instances (see traversal.cpp).
#pragma once

#include <set>
#include <string>

#include "ir/intra/intra.h"

namespace hectorgen::emit {

struct TraversalCode {
  std::string kernel, launcher;
  std::set<std::string> helpers;  // device helpers the kernel calls: warp_sum, warp_max
};

TraversalCode emit_traversal(const intra::Program& p, const intra::TraversalInstance& t);

// The definitions of the device helpers `names` (in a fixed order), for the top of the kernels file.
std::string device_helpers(const std::set<std::string>& names);

// A float literal for generated CUDA (`0.2f`, `1.0f`).
std::string float_literal(double v);

}  // namespace hectorgen::emit
