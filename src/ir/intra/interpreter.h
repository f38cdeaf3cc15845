// A float64 interpreter of the intra-operator IR: runs a program's kernels in order on a graph, each as its
// instance says (a GEMM's gather, weight selection, scale and scatter; a traversal instance's loads,
// values, reductions and stores; a PyTorch instance's statement row by row, as its ATen calls compute it), with registers holding whole values (lanes and syncs do not change what a
// race-free kernel computes). Checked against the inter-operator IR's interpreter, it shows that lowering
// keeps the model's meaning, without a GPU.
#pragma once

#include <string>

#include "ir/inter/interpreter.h"
#include "ir/intra/intra.h"

namespace hectorgen::intra {

// Runs `p` on `g`. `tensors` holds the inputs and weights by name (inputs computed from the graph are added
// when absent); every other tensor of the program is allocated, zeroed when the program asks for it and NaN
// otherwise (a read before any write shows). Returns an error ("" on success); PyTorch instances are not
// interpreted (an error names them).
std::string interpret(const Program& p, const inter::HeteroGraph& g, inter::TensorMap& tensors);

}  // namespace hectorgen::intra
