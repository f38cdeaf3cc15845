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
//
// Recomputing pays only where it lowers the step's peak: the kernel at the peak of RGAT's backward reads hs and ht,
// so a recomputed copy is live there as the saved one was, and recomputing them cost 15% of the step for no memory
// (measured on an H100); HGT's backward holds lin$k and msg for the whole op beside its own [pairs, 64] gradients,
// and recomputing them lowered the step's peak by 5 to 35%. `recompute: auto` decides by the estimated peak.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
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

// What the backward is handed anyway, by the training forward's tensor names: inputs and weights under their own
// names, saved fields under the field's (the first that a tensor holds).
std::map<std::string, std::string> handed_to_backward(const Program& fwt, const Program& bw) {
  std::map<std::string, std::string> in_backward;
  for (const TensorInfo& t : fwt.tensors)
    if ((t.role == Role::Input && bw.decl.find_input(t.name)) || (t.role == Role::Weight && bw.decl.find_weight(t.name)))
      in_backward[t.name] = t.name;
  for (const std::string& f : fwt.saved)
    if (bw.decl.find_input(f)) in_backward.emplace(holder(fwt, f), f);
  return in_backward;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The graph recompute-gemms decides on: a million nodes (mag has 1.9, wikikg2 2.5), so that the rows per node, edge
// and pair weigh as they do on the graphs a training step runs on, and the weights next to nothing. One shape is
// enough: a candidate trades a saved [rows, n] tensor held for the whole backward for the same tensor held from its
// recompute to its last reader, and whether that lowers the step's peak depends on which kernel holds the most, not on
// the ratio of edges to pairs (the estimate on mag's and wikikg2's counts decides the same for RGAT and HGT:
// tests/unit/test_intra_lowering.cpp, "[estimate]").
const GraphCounts kDecisionGraph = typical_graph(int64_t{1} << 20);

}  // namespace

std::vector<RecomputeCandidate> recompute_candidates(const Program& fwt, const Program& bw) {
  const std::map<std::string, std::string> in_backward = handed_to_backward(fwt, bw);
  std::map<std::string, std::vector<std::string>> fields_of;  // holder -> the saved fields it holds
  for (const std::string& f : fwt.saved)
    if (bw.decl.find_input(f)) fields_of[holder(fwt, f)].push_back(f);
  auto same_storage = [&](const std::string& tensor) {  // the backward reads it as the forward stores it
    const TensorInfo* b = bw.find(in_backward.at(tensor));
    return !b || b->storage == fwt.find(tensor)->storage;
  };

  std::vector<RecomputeCandidate> candidates;
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
      return in_backward.count(o) && !written_after(fwt, i, o) && writers(bw, in_backward.at(o)) == 0 && same_storage(o);
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
    candidates.push_back({i, g->y, fields, operands});
  }
  return candidates;
}

void apply_recompute(Program& fwt, Program& bw, const std::vector<RecomputeCandidate>& chosen) {
  if (chosen.empty()) return;
  const std::map<std::string, std::string> in_backward = handed_to_backward(fwt, bw);
  for (const RecomputeCandidate& r : chosen) {
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
  }
  // The training forward: the fields are not saved, and a GEMM nothing else of it reads is gone (from the last, so
  // the indices of the others hold).
  std::vector<const RecomputeCandidate*> by_kernel;
  for (const RecomputeCandidate& r : chosen) by_kernel.push_back(&r);
  std::sort(by_kernel.begin(), by_kernel.end(), [](const auto* a, const auto* b) { return a->at > b->at; });
  for (const RecomputeCandidate* r : by_kernel) {
    std::erase_if(fwt.saved, [&](const std::string& f) {
      return std::find(r->fields.begin(), r->fields.end(), f) != r->fields.end();
    });
    if (read_by_another(fwt, r->at, r->tensor)) continue;
    fwt.kernels.erase(fwt.kernels.begin() + static_cast<long>(r->at));
    std::erase_if(fwt.tensors, [&](const TensorInfo& t) { return t.name == r->tensor; });
    std::erase_if(fwt.aliases, [&](const auto& alias) { return alias.second == r->tensor; });
  }
  // Both ops hold other tensors now: the kernel order that keeps the fewest live is another one.
  schedule_for_memory(fwt);
  schedule_for_memory(bw);
}

int64_t training_step_peak(const Program& fwt, const Program& bw, const GraphCounts& counts) {
  // peak_bytes counts each input of the backward for the whole op; a tensor the forward returns under several saved
  // names is one allocation: its other names do not count.
  int64_t shared = 0;
  std::set<std::string> holders;
  for (const std::string& f : fwt.saved) {
    const TensorInfo* t = bw.find(f);
    if (t && t->role == Role::Input && !holders.insert(holder(fwt, f)).second) shared += tensor_bytes(*t, counts);
  }
  return std::max(peak_bytes(fwt, counts), peak_bytes(bw, counts) - shared);
}

std::vector<std::string> recompute_gemms(Program& fwt, Program& bw) {
  const inter::Recompute mode = fwt.decl.options.recompute;
  if (mode == inter::Recompute::Off) return {};
  const std::vector<std::string> saved = fwt.saved;
  const std::vector<RecomputeCandidate> candidates = recompute_candidates(fwt, bw);
  // On: every candidate whose operands stay saved, in candidate order. Auto: greedy, best first: of the candidates
  // not taken yet, each is tried on top of those taken so far (on copies of the programs as lowered); the one whose
  // estimate falls most is taken, until none makes it fall at all. (In candidate order, RGAT's hs, whose recompute
  // lowers the peak only until ht's does more, was taken first and kept for nothing.) No minimum fraction: a
  // candidate moves a whole [rows, n] tensor in or out of the peak, so a fall is never a rounding matter, and a tie
  // keeps the field saved (no extra GEMM).
  std::vector<RecomputeCandidate> chosen;
  std::vector<std::string> notes;
  auto blocker = [&](const RecomputeCandidate& c) -> std::string {
    for (const std::string& o : c.operands)
      if (std::any_of(chosen.begin(), chosen.end(), [&](const RecomputeCandidate& r) { return r.tensor == o; })) return o;
    return "";
  };
  if (mode == inter::Recompute::On) {
    for (const RecomputeCandidate& c : candidates) {
      if (const std::string o = blocker(c); !o.empty()) {
        notes.push_back(fmt::format("recompute-gemms: {} saved (its operand {} is recomputed)", joined(c.fields), o));
        continue;
      }
      chosen.push_back(c);
      notes.push_back(fmt::format("recompute-gemms: {} recomputed by the backward (recompute: on)", joined(c.fields)));
    }
  } else {
    int64_t peak = training_step_peak(fwt, bw, kDecisionGraph);
    std::vector<const RecomputeCandidate*> left;
    for (const RecomputeCandidate& c : candidates) left.push_back(&c);
    std::map<const RecomputeCandidate*, int64_t> last;  // each candidate's estimate when last tried
    for (;;) {
      const RecomputeCandidate* best = nullptr;
      int64_t best_after = peak;
      for (const RecomputeCandidate* c : left) {
        if (!blocker(*c).empty()) continue;
        std::vector<RecomputeCandidate> tried = chosen;
        tried.push_back(*c);
        Program f = fwt, b = bw;
        apply_recompute(f, b, tried);
        const int64_t after = training_step_peak(f, b, kDecisionGraph);
        last[c] = after;
        if (after < best_after) best = c, best_after = after;
      }
      if (!best) break;
      notes.push_back(fmt::format("recompute-gemms: {} recomputed by the backward (the step's estimated peak: {} -> {} bytes)",
                                  joined(best->fields), peak, best_after));
      chosen.push_back(*best);
      std::erase(left, best);
      peak = best_after;
    }
    for (const RecomputeCandidate* c : left) {
      if (const std::string o = blocker(*c); !o.empty())
        notes.push_back(fmt::format("recompute-gemms: {} saved (its operand {} is recomputed)", joined(c->fields), o));
      else
        notes.push_back(fmt::format("recompute-gemms: {} saved (recomputing {} would not lower the step's estimated peak: "
                                    "{} -> {} bytes)", joined(c->fields), c->fields.size() > 1 ? "them" : "it", peak,
                                    last.at(c)));
    }
  }
  apply_recompute(fwt, bw, chosen);
  fwt.notes.insert(fwt.notes.end(), notes.begin(), notes.end());

  std::vector<std::string> recomputed;
  for (const RecomputeCandidate& r : chosen) recomputed.insert(recomputed.end(), r.fields.begin(), r.fields.end());
  std::sort(recomputed.begin(), recomputed.end(), [&](const std::string& a, const std::string& b) {
    return std::find(saved.begin(), saved.end(), a) < std::find(saved.begin(), saved.end(), b);
  });
  return recomputed;
}

}  // namespace hectorgen::passes
