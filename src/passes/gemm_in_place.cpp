// gemm-in-place (see passes.h): a pass over the intra-operator IR, the last of lowering.
//
// (RGAT's unoptimised backward: d$ht · W^T and d$hs · W^T, each followed by the weight gradient reading the same
// gradient; the GEMM moves after that reader and stores over its input.)
//
// The backward's input gradients through a relation's weight are GEMMs from one pair- or edge-sized gradient to
// another of the same row size (HGT: t$d$v$pairs = d$msg · W_msg^T, t$d$k$pairs = d$lin$k · W_att^T; RGAT:
// t$d$feature$pairs = d$msg · W^T), after which the gradient is dead. Writing the product over its operand holds one
// such tensor at that point instead of two, at the backward's peak on the large graphs (2.6 GB each on wikikg2's
// pairs in fp32).
#include <algorithm>
#include <optional>
#include <set>
#include <string>

#include "passes/passes.h"

namespace hectorgen::passes {

using namespace intra;

namespace {

// The tensor-core kernel's block covers 64 output columns of its rows (tc::SegmentGemm: kBN = 64) and reads all K
// of them before its epilogue stores: with N = 64 one block owns whole rows, so storing over its own input rows is
// safe. Blocks of the SIMT template split a row's columns and would overwrite what another still reads.
constexpr int64_t kInPlaceColumns = 64;

// Where kernel `at` can store over its input: nullopt if nowhere; else `at` itself, or the last later reader of its
// input when the kernels up to that one only read it (they neither read the GEMM's output nor write what it reads or
// writes; e.g. RGAT's weight gradient reading the same d$ht): the GEMM then moves right after them.
std::optional<size_t> in_place_position(const Program& p, size_t at, const std::set<std::string>& returned) {
  const auto* g = std::get_if<GemmInstance>(&p.kernels[at]);
  if (!g || !g->tensor_cores || g->accumulate || g->gather != Gather::None || g->scatter != Gather::None ||
      g->heads != 1 || g->k != g->n || g->n != kInPlaceColumns || g->x == g->y)
    return std::nullopt;
  const TensorInfo *x = p.find(g->x), *y = p.find(g->y);
  if (!x || !y || (x->role != Role::Temp && x->role != Role::Field) || y->role != Role::Temp) return std::nullopt;
  if (returned.count(x->name) || returned.count(y->name) || x->per != y->per || x->storage != y->storage ||
      x->row_numel() != y->row_numel() || read_by_torch(p, x->name) || read_by_torch(p, y->name))
    return std::nullopt;
  for (size_t k = 0; k < p.kernels.size(); ++k)
    if (k != at && kernel_writes(p.kernels[k]).count(y->name)) return std::nullopt;  // y: this GEMM's alone
  size_t last = at;
  for (size_t k = at + 1; k < p.kernels.size(); ++k)
    if (kernel_reads(p.kernels[k]).count(x->name)) last = k;
  const std::set<std::string> reads = kernel_reads(p.kernels[at]), writes = kernel_writes(p.kernels[at]);
  for (size_t k = at + 1; k <= last; ++k) {
    if (std::holds_alternative<TorchInstance>(p.kernels[k])) return std::nullopt;
    const std::set<std::string> kr = kernel_reads(p.kernels[k]), kw = kernel_writes(p.kernels[k]);
    if (kr.count(y->name) || std::any_of(kw.begin(), kw.end(), [&](const std::string& t) {
          return reads.count(t) > 0 || writes.count(t) > 0;
        }))
      return std::nullopt;
  }
  return last;
}

}  // namespace

void gemm_in_place(Program& p) {
  const std::set<std::string> returned = returned_tensors(p);
  for (size_t i = 0; i < p.kernels.size();) {
    const std::optional<size_t> at = in_place_position(p, i, returned);
    if (!at) {
      ++i;
      continue;
    }
    if (*at != i) {  // run it right after the input's last reader; the kernel now at i is looked at next
      Kernel moved = std::move(p.kernels[i]);
      p.kernels.erase(p.kernels.begin() + static_cast<long>(i));
      p.kernels.insert(p.kernels.begin() + static_cast<long>(*at), std::move(moved));
    }
    auto& g = std::get<GemmInstance>(p.kernels[*at]);
    const std::string x = g.x, y = g.y;
    g.y = x;  // now x == y: not a candidate again
    for (size_t k = *at + 1; k < p.kernels.size(); ++k) redirect_reads(p.kernels[k], y, x);
    for (auto& [field, tensor] : p.aliases)
      if (tensor == y) tensor = x;
    std::erase_if(p.tensors, [&](const TensorInfo& t) { return t.name == y; });
    if (*at == i) ++i;
  }
}

}  // namespace hectorgen::passes
