// gemm-in-place (see passes.h): a pass over the intra-operator IR, the last of lowering.
//
// The backward's input gradients through a relation's weight are GEMMs from one pair- or edge-sized gradient to
// another of the same row size (HGT: t$d$v$pairs = d$msg · W_msg^T, t$d$k$pairs = d$lin$k · W_att^T; RGAT:
// t$d$feature$pairs = d$msg · W^T), after which the gradient is dead. Writing the product over its operand holds one
// such tensor at that point instead of two, at the backward's peak on the large graphs (2.6 GB each on wikikg2's
// pairs in fp32).
#include <algorithm>
#include <string>

#include "passes/passes.h"

namespace hectorgen::passes {

using namespace intra;

namespace {

// The tensor-core kernel's block covers 64 output columns of its rows (tc::SegmentGemm: kBN = 64) and reads all K
// of them before its epilogue stores: with N = 64 one block owns whole rows, so storing over its own input rows is
// safe. Blocks of the SIMT template split a row's columns and would overwrite what another still reads.
constexpr int64_t kInPlaceColumns = 64;

bool in_place_candidate(const Program& p, size_t at, const std::set<std::string>& returned) {
  const auto* g = std::get_if<GemmInstance>(&p.kernels[at]);
  if (!g || !g->tensor_cores || g->accumulate || g->gather != Gather::None || g->scatter != Gather::None ||
      g->heads != 1 || g->k != g->n || g->n != kInPlaceColumns || g->x == g->y)
    return false;
  const TensorInfo *x = p.find(g->x), *y = p.find(g->y);
  if (!x || !y || (x->role != Role::Temp && x->role != Role::Field) || y->role != Role::Temp) return false;
  if (returned.count(x->name) || returned.count(y->name) || x->per != y->per || x->storage != y->storage ||
      x->row_numel() != y->row_numel() || read_by_torch(p, x->name) || read_by_torch(p, y->name))
    return false;
  // x is dead after this GEMM; y is written by it alone.
  for (size_t k = 0; k < p.kernels.size(); ++k) {
    if (k != at && kernel_writes(p.kernels[k]).count(y->name)) return false;
    if (k > at && kernel_reads(p.kernels[k]).count(x->name)) return false;
  }
  return true;
}

}  // namespace

void gemm_in_place(Program& p) {
  const std::set<std::string> returned = returned_tensors(p);
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    if (!in_place_candidate(p, i, returned)) continue;
    auto& g = std::get<GemmInstance>(p.kernels[i]);
    const std::string x = g.x, y = g.y;
    g.y = x;
    for (size_t k = i + 1; k < p.kernels.size(); ++k) redirect_reads(p.kernels[k], y, x);
    for (auto& [field, tensor] : p.aliases)
      if (tensor == y) tensor = x;
    std::erase_if(p.tensors, [&](const TensorInfo& t) { return t.name == y; });
  }
}

}  // namespace hectorgen::passes
