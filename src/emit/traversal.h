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

// The lines (indented for a kernel body) that open a kernel's grid-stride loop over its rows, `row` the row
// variable, one warp a row or, with `row_lanes` 16 or 8, a group of that many lanes a row whose warp's rows run in
// step (`row_live`: false for a row past the last, which repeats the last row). Declares lane, first_row and
// row_stride (and row_group); the caller closes the loop. Traversals and gather sums share it.
std::string row_loop_open(int row_lanes, const std::string& row);

// Lane `src` of the row's lanes' `v` (__shfl_sync, with the group's width below 32 lanes).
std::string row_shuffle(int row_lanes, const std::string& v, const std::string& src);

// A float literal for generated CUDA (`0.2f`, `1.0f`).
std::string float_literal(double v);

}  // namespace hectorgen::emit
