// merge-duplicate-gemms (see passes.h): a pass over the intra-operator IR, run right after lowering.
//
// The autodiff pass differentiates each use of a product on its own, so one phase can compute the same
// GEMM twice: HGT's backward needs k[src] · W_att[etype] for d_q and again for d_mu, each an E x 64
// temporary (2.7 GB in bf16 on mag). A later GEMM that repeats an earlier one on inputs nobody wrote in
// between is dropped, and its readers read the earlier result.
#include <algorithm>
#include <functional>
#include <set>
#include <string>

#include "passes/passes.h"

namespace hectorgen::passes {

using namespace intra;

namespace {

// Everything but the name, the output and the source text.
bool same_product(const GemmInstance& a, const GemmInstance& b) {
  return a.x == b.x && a.w == b.w && a.edge_rows == b.edge_rows && a.etype_rows == b.etype_rows && a.gather == b.gather &&
         a.segments == b.segments && a.scatter == b.scatter && a.accumulate == b.accumulate && a.transpose_w == b.transpose_w &&
         a.row_scalar == b.row_scalar && a.heads == b.heads && a.k == b.k && a.n == b.n && a.dtype == b.dtype;
}

// A plain GEMM into a temporary that only it writes: its result is a pure function of its inputs.
bool pure(const Program& p, const GemmInstance& g) {
  const TensorInfo* y = p.find(g.y);
  if (!y || y->role != Role::Temp || g.accumulate || g.scatter != Gather::None) return false;
  int writers = 0;
  for (const Kernel& k : p.kernels) writers += kernel_writes(k).count(g.y) ? 1 : 0;
  return writers == 1;
}

// Makes every read of `from` read `to` (GEMM, weight-gradient and segment-sum operands, traversal loads).
void redirect_reads(Kernel& k, const std::string& from, const std::string& to) {
  auto swap = [&](std::string& name) {
    if (name == from) name = to;
  };
  if (auto* g = std::get_if<GemmInstance>(&k)) {
    swap(g->x);
    swap(g->row_scalar);
  } else if (auto* w = std::get_if<WeightGradInstance>(&k)) {
    swap(w->x);
    swap(w->dy);
    swap(w->row_scalar);
  } else if (auto* s = std::get_if<SegmentSumInstance>(&k)) {
    swap(s->v);
  } else if (auto* t = std::get_if<TraversalInstance>(&k)) {
    std::function<void(std::vector<Instr>&)> walk = [&](std::vector<Instr>& body) {
      for (Instr& in : body) {
        if (auto* d = std::get_if<Def>(&in.v))
          if (auto* l = std::get_if<Load>(&d->source)) swap(l->tensor);
        if (auto* l = std::get_if<EdgeLoop>(&in.v)) walk(l->body);
      }
    };
    walk(t->body);
  }
}

}  // namespace

void merge_duplicate_gemms(Program& p) {
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const auto* first = std::get_if<GemmInstance>(&p.kernels[i]);
    if (!first || !pure(p, *first)) continue;
    std::set<std::string> inputs = {first->x, first->w};
    if (!first->row_scalar.empty()) inputs.insert(first->row_scalar);
    for (size_t j = i + 1; j < p.kernels.size(); ++j) {
      const auto* again = std::get_if<GemmInstance>(&p.kernels[j]);
      if (again && same_product(*first, *again) && pure(p, *again) && p.find(again->y)->storage == p.find(first->y)->storage) {
        // Torch fallbacks name what they read in their own statement: leave a product they read alone.
        const std::string dropped = again->y, kept = first->y;
        bool torch_reads = std::any_of(p.kernels.begin() + static_cast<long>(j), p.kernels.end(), [&](const Kernel& k) {
          return std::holds_alternative<TorchInstance>(k) && kernel_reads(k).count(dropped);
        });
        if (torch_reads) continue;
        p.kernels.erase(p.kernels.begin() + static_cast<long>(j));
        for (size_t k = j; k < p.kernels.size(); ++k) redirect_reads(p.kernels[k], dropped, kept);
        for (auto& [field, tensor] : p.aliases)
          if (tensor == dropped) tensor = kept;
        std::erase_if(p.tensors, [&](const TensorInfo& t) { return t.name == dropped; });
        --j;
        continue;
      }
      // Stop at the first kernel that changes what the product reads.
      const std::set<std::string> writes = kernel_writes(p.kernels[j]);
      if (std::any_of(inputs.begin(), inputs.end(), [&](const std::string& t) { return writes.count(t) > 0; })) break;
    }
  }
}

}  // namespace hectorgen::passes
