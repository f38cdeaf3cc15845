// recompute-gemms (see passes.h): rematerialization of cheap GEMM results in the backward.
//
// The training forward hands the backward every field a derivative reads, and a field per edge or per (source,
// relation) pair is the bulk of what a training step holds between its two ops: HGT's compact forward saves lin$k and
// msg, two [pairs, 64] products (5.2 GB on wikikg2) of node rows it saves anyway (k, v) and the relation's weights.
// The backward can run those two GEMMs again for a fraction of its time instead.
//
// It runs on the lowered programs, not in autodiff: what it decides about are kernel instances and the op's
// arguments (which instance computes a saved field, with which tile and kernel; which tensors the backward is handed),
// and the backward must run the very instance the training forward ran, so that the recomputed rows are the saved
// rows bit for bit; a copy of the instance guarantees that, re-lowering a statement of the inter IR would not.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "passes/passes.h"

namespace hectorgen::passes {

using namespace intra;

namespace {

// The tensor of `p` that holds field `f`: its alias, else the field itself.
std::string holder(const Program& p, const std::string& field) {
  auto it = p.aliases.find(field);
  return it == p.aliases.end() ? field : it->second;
}

size_t writers(const Program& p, const std::string& tensor) {
  return std::count_if(p.kernels.begin(), p.kernels.end(), [&](const Kernel& k) { return kernel_writes(k).count(tensor) > 0; });
}

bool written_after(const Program& p, size_t at, const std::string& tensor) {
  return std::any_of(p.kernels.begin() + static_cast<long>(at) + 1, p.kernels.end(),
                     [&](const Kernel& k) { return kernel_writes(k).count(tensor) > 0; });
}

bool read_by_another(const Program& p, size_t at, const std::string& tensor) {
  for (size_t k = 0; k < p.kernels.size(); ++k)
    if (k != at && kernel_reads(p.kernels[k]).count(tensor)) return true;
  return false;
}

// The backward's name for its copy of the training forward's GEMM `name` (<model>_fwt_gemm_<what>):
// <model>_bw_gemm_<what>_recompute, numbered when the backward has a kernel of that name.
std::string recompute_name(const Program& bw, const std::string& name) {
  std::string what = name;
  for (const std::string& prefix : {bw.model + "_fwt_gemm_", bw.model + "_fwt_"})
    if (what.rfind(prefix, 0) == 0) {
      what = what.substr(prefix.size());
      break;
    }
  std::set<std::string> taken;
  for (const Kernel& k : bw.kernels) taken.insert(kernel_name(k));
  std::string out = fmt::format("{}_bw_gemm_{}_recompute", bw.model, what);
  for (int n = 2; taken.count(out); ++n) out = fmt::format("{}_bw_gemm_{}_recompute_{}", bw.model, what, n);
  return out;
}

// Adds `t` to `p`'s tensors after the last one of its role or of a role listed before it (inputs, weights, outputs,
// then fields and temporaries).
void add_tensor(Program& p, const TensorInfo& t) {
  auto after = std::find_if(p.tensors.begin(), p.tensors.end(),
                            [&](const TensorInfo& x) { return static_cast<int>(x.role) > static_cast<int>(t.role); });
  p.tensors.insert(after, t);
}

// A saved field the backward recomputes: the training forward's GEMM at `at` computes `tensor`, which holds `fields`
// (in saved order; several when fields alias one tensor, as RGAT's msg and hs).
struct Recomputed {
  size_t at = 0;
  std::string tensor;
  std::vector<std::string> fields;
};

}  // namespace

std::vector<std::string> recompute_gemms(Program& fwt, Program& bw) {
  if (fwt.decl.options.recompute == inter::Recompute::Off) return {};
  const std::vector<std::string> saved = fwt.saved;
  // What the backward is handed anyway, by the training forward's tensor names: inputs and weights under their own
  // names, saved fields under the field's (the first that a tensor holds).
  std::map<std::string, std::string> in_backward;
  for (const TensorInfo& t : fwt.tensors)
    if ((t.role == Role::Input && bw.decl.find_input(t.name)) || (t.role == Role::Weight && bw.decl.find_weight(t.name)))
      in_backward[t.name] = t.name;
  std::map<std::string, std::vector<std::string>> fields_of;  // holder -> the saved fields it holds
  for (const std::string& f : fwt.saved) {
    if (!bw.decl.find_input(f)) continue;
    fields_of[holder(fwt, f)].push_back(f);
    in_backward.emplace(holder(fwt, f), f);
  }
  auto same_storage = [&](const std::string& tensor) {  // the backward reads it as the forward stores it
    const TensorInfo* b = bw.find(in_backward.at(tensor));
    return !b || b->storage == fwt.find(tensor)->storage;
  };

  std::vector<Recomputed> chosen;
  std::set<std::string> dropped;  // chosen holders: no longer handed to the backward
  for (size_t i = 0; i < fwt.kernels.size(); ++i) {
    const auto* g = std::get_if<GemmInstance>(&fwt.kernels[i]);
    if (!g || g->accumulate || g->scatter != Gather::None || !fields_of.count(g->y)) continue;
    const TensorInfo* y = fwt.find(g->y);
    if (!y || y->role == Role::Output || (y->per != inter::Per::Edge && y->per != inter::Per::Pair) || writers(fwt, g->y) != 1)
      continue;
    // Operands the backward has, holding what the GEMM read (nothing writes them later in either op).
    std::vector<std::string> operands = {g->x, g->w};
    if (!g->row_scalar.empty()) operands.push_back(g->row_scalar);
    const bool available = std::all_of(operands.begin(), operands.end(), [&](const std::string& o) {
      return in_backward.count(o) && !dropped.count(o) && !written_after(fwt, i, o) && writers(bw, in_backward.at(o)) == 0 &&
             same_storage(o);
    });
    // The fields it holds: read by the backward (else saving them is another matter), never written there, and not
    // read by a PyTorch fallback (it reads a field of the backward through the op's inputs, by the field's name).
    const std::vector<std::string>& fields = fields_of.at(g->y);
    bool read = false, movable = true;
    for (size_t f = 0; f < fields.size(); ++f) {
      read = read || std::any_of(bw.kernels.begin(), bw.kernels.end(), [&](const Kernel& k) { return kernel_reads(k).count(fields[f]); });
      movable = movable && writers(bw, fields[f]) == 0 && !read_by_torch(bw, fields[f]);
    }
    if (!available || !read || !movable) continue;
    chosen.push_back({i, g->y, fields});
    dropped.insert(g->y);
  }

  std::vector<std::string> recomputed;
  for (const Recomputed& r : chosen) {
    const GemmInstance& g = std::get<GemmInstance>(fwt.kernels[r.at]);
    const std::string& y = r.fields.front();
    // The backward: the fields are one temporary, computed by the same instance right before its first reader.
    for (size_t f = 1; f < r.fields.size(); ++f) {
      for (Kernel& k : bw.kernels) redirect_reads(k, r.fields[f], y);
      for (auto& [field, tensor] : bw.aliases)
        if (tensor == r.fields[f]) tensor = y;
    }
    auto is_field = [&](const std::string& name) { return std::find(r.fields.begin(), r.fields.end(), name) != r.fields.end(); };
    std::erase_if(bw.decl.inputs, [&](const inter::TensorDecl& t) { return is_field(t.name); });
    std::erase_if(bw.tensors, [&](const TensorInfo& t) { return is_field(t.name); });
    TensorInfo temp = *fwt.find(r.tensor);
    temp.name = y;
    temp.role = Role::Temp;
    temp.zero_init = false;
    add_tensor(bw, temp);
    GemmInstance again = g;
    again.name = recompute_name(bw, g.name);
    again.y = y;
    for (std::string* operand : {&again.x, &again.w, &again.row_scalar}) {
      if (operand->empty()) continue;
      const std::string name = in_backward.at(*operand);
      if (!bw.find(name)) {  // an input or a saved field no other kernel of the backward reads
        TensorInfo t = *fwt.find(*operand);
        t.name = name;
        t.role = fwt.find(*operand)->role == Role::Weight ? Role::Weight : Role::Input;
        t.zero_init = false;
        add_tensor(bw, t);
      }
      *operand = name;
    }
    auto first_reader = std::find_if(bw.kernels.begin(), bw.kernels.end(), [&](const Kernel& k) { return kernel_reads(k).count(y) > 0; });
    bw.kernels.insert(first_reader, Kernel{again});
    recomputed.insert(recomputed.end(), r.fields.begin(), r.fields.end());
  }
  // The training forward: the fields are not saved, and a GEMM nothing else of it reads is gone (from the last, so
  // the indices of the others hold).
  for (auto r = chosen.rbegin(); r != chosen.rend(); ++r) {
    std::erase_if(fwt.saved, [&](const std::string& f) {
      return std::find(r->fields.begin(), r->fields.end(), f) != r->fields.end();
    });
    if (read_by_another(fwt, r->at, r->tensor)) continue;
    fwt.kernels.erase(fwt.kernels.begin() + static_cast<long>(r->at));
    std::erase_if(fwt.tensors, [&](const TensorInfo& t) { return t.name == r->tensor; });
    std::erase_if(fwt.aliases, [&](const auto& alias) { return alias.second == r->tensor; });
  }
  if (!chosen.empty()) {
    // Both ops hold other tensors now: the kernel order that keeps the fewest live is another one.
    schedule_for_memory(fwt);
    schedule_for_memory(bw);
  }
  std::sort(recomputed.begin(), recomputed.end(), [&](const std::string& a, const std::string& b) {
    return std::find(saved.begin(), saved.end(), a) < std::find(saved.begin(), saved.end(), b);
  });
  return recomputed;
}

}  // namespace hectorgen::passes
