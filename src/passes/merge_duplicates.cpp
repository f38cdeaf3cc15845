// merge-duplicate-gemms, merge-duplicate-traversals, merge-duplicate-stores and forward-row-copies (see passes.h):
// passes over the intra-operator IR, run right after lowering.
//
// The autodiff pass differentiates each use of a product on its own, so one phase can compute the same
// GEMM twice: HGT's backward needs k[src] · W_att[etype] for d_q and again for d_mu, each an E x 64
// temporary (2.7 GB in bf16 on mag), and the same per-edge scale for two GEMMs. A later kernel that repeats
// an earlier one on inputs nobody wrote in between is dropped, and its readers read the earlier result.
#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <functional>
#include <set>
#include <string>

#include "passes/passes.h"

namespace hectorgen::passes {

using namespace intra;

namespace {

// Everything but the name, the output and the source text.
bool same_product(const GemmInstance& a, const GemmInstance& b) {
  return a.x == b.x && a.w == b.w && a.rows == b.rows && a.gather == b.gather &&
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

}  // namespace

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
  } else if (auto* s = std::get_if<GatherSumInstance>(&k)) {
    swap(s->x);
    swap(s->scale);
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

namespace {

// `dropped` is gone: the kernels from `from` on, and the fields aliased to it, read `kept` instead.
void replace_tensor(Program& p, size_t from, const std::string& dropped, const std::string& kept) {
  for (size_t k = from; k < p.kernels.size(); ++k) redirect_reads(p.kernels[k], dropped, kept);
  for (auto& [field, tensor] : p.aliases)
    if (tensor == dropped) tensor = kept;
  std::erase_if(p.tensors, [&](const TensorInfo& t) { return t.name == dropped; });
}

// The temporaries a kernel writes, when all its writes are plain writes of temporaries only it writes; else
// nullopt (the kernel's result is then not a pure function of what it reads).
std::optional<std::vector<std::string>> private_temps(const Program& p, size_t at) {
  std::vector<std::string> out;
  if (!atomic_writes(p.kernels[at]).empty()) return std::nullopt;
  for (const std::string& w : kernel_writes(p.kernels[at])) {
    const TensorInfo* t = p.find(w);
    if (!t || t->role != Role::Temp) return std::nullopt;
    for (size_t k = 0; k < p.kernels.size(); ++k)
      if (k != at && kernel_writes(p.kernels[k]).count(w)) return std::nullopt;
    out.push_back(w);
  }
  return out;
}

// A traversal's text with its own names made canonical: comments dropped, the kernel name blank, the names it
// defines (registers, indices, row and loop variables) and the temporaries in `own` (which it writes) numbered
// in order of first appearance; everything else (operators, tensors it reads, keywords) stays as it is. Two
// instances with the same canonical text compute the same values from the same tensors.
std::string canonical(const TraversalInstance& t, const std::set<std::string>& own) {
  TraversalInstance copy = t;
  copy.name = "";
  std::set<std::string> renamed = own;
  renamed.insert(t.row);
  std::function<void(std::vector<Instr>&)> strip = [&](std::vector<Instr>& body) {
    std::erase_if(body, [](const Instr& in) { return std::holds_alternative<Comment>(in.v); });
    for (Instr& in : body) {
      if (auto* d = std::get_if<Def>(&in.v)) renamed.insert(d->name);
      if (auto* x = std::get_if<IndexDef>(&in.v)) renamed.insert(x->name);
      if (auto* l = std::get_if<EdgeLoop>(&in.v)) {
        renamed.insert({l->var, l->pos});
        strip(l->body);
      }
    }
  };
  strip(copy.body);
  const std::string text = print_traversal(copy);
  std::map<std::string, std::string> numbered;
  std::string out;
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$'; };
  for (size_t i = 0; i < text.size();) {
    if (!ident(text[i])) {
      out += text[i++];
      continue;
    }
    size_t j = i;
    while (j < text.size() && ident(text[j])) ++j;
    std::string word = text.substr(i, j - i);
    if (renamed.count(word)) word = numbered.emplace(word, "#" + std::to_string(numbered.size())).first->second;
    out += word;
    i = j;
  }
  return out;
}

}  // namespace

void merge_duplicate_traversals(Program& p) {
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    if (!std::holds_alternative<TraversalInstance>(p.kernels[i])) continue;
    std::optional<std::vector<std::string>> first_temps = private_temps(p, i);
    if (!first_temps || first_temps->empty()) continue;
    const std::set<std::string> reads = kernel_reads(p.kernels[i]);
    const std::set<std::string> own(first_temps->begin(), first_temps->end());
    const std::string key = canonical(std::get<TraversalInstance>(p.kernels[i]), own);
    for (size_t j = i + 1; j < p.kernels.size(); ++j) {
      if (std::holds_alternative<TraversalInstance>(p.kernels[j]) && kernel_reads(p.kernels[j]) == reads) {
        std::optional<std::vector<std::string>> temps = private_temps(p, j);
        const auto& again = std::get<TraversalInstance>(p.kernels[j]);
        if (temps && temps->size() == first_temps->size() &&
            canonical(again, std::set<std::string>(temps->begin(), temps->end())) == key) {
          // The same text numbers the stored temporaries in the same order: pair them by their numbers.
          std::map<std::string, std::string> kept_for;
          auto order = [&](const TraversalInstance& t, const std::vector<std::string>& ts) {
            std::vector<std::string> seen;
            intra::for_each_instr(t.body, [&](const Instr& in) {
              if (auto* st = std::get_if<Store>(&in.v))
                if (std::find(ts.begin(), ts.end(), st->tensor) != ts.end() &&
                    std::find(seen.begin(), seen.end(), st->tensor) == seen.end())
                  seen.push_back(st->tensor);
            });
            return seen;
          };
          const std::vector<std::string> a = order(std::get<TraversalInstance>(p.kernels[i]), *first_temps), b = order(again, *temps);
          if (a.size() == b.size()) {
            for (size_t k = 0; k < a.size(); ++k) kept_for[b[k]] = a[k];
            p.kernels.erase(p.kernels.begin() + static_cast<long>(j));
            for (const auto& [dropped, kept] : kept_for) replace_tensor(p, j, dropped, kept);
            --j;
            continue;
          }
        }
      }
      const std::set<std::string> writes = kernel_writes(p.kernels[j]);
      if (std::any_of(reads.begin(), reads.end(), [&](const std::string& t) { return writes.count(t) > 0; })) break;
    }
  }
}

void merge_duplicate_stores(Program& p) {
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    auto* t = std::get_if<TraversalInstance>(&p.kernels[i]);
    if (!t) continue;
    const std::optional<std::vector<std::string>> temps = private_temps(p, i);
    // Straight-line bodies only: without updates or loops a register's text names one value.
    const bool straight = std::none_of(t->body.begin(), t->body.end(), [](const Instr& in) {
      return std::holds_alternative<Update>(in.v) || std::holds_alternative<EdgeLoop>(in.v);
    });
    if (!temps || !straight) continue;
    // The registers computed from the same expression over the same registers (their text equal).
    std::map<std::string, std::string> first_of;  // register -> the first register with its value
    std::map<std::string, std::pair<std::string, int64_t>> seen;  // value text -> (register, elements)
    for (const Instr& in : t->body) {
      const auto* d = std::get_if<Def>(&in.v);
      const auto* e = d && !d->is_mutable ? std::get_if<Eval>(&d->source) : nullptr;
      if (!e) continue;
      // An operand that repeats an earlier register would read as it: such a value is left as it is.
      const std::vector<std::string> operands = regs_of(e->value);
      if (std::any_of(operands.begin(), operands.end(), [&](const std::string& r) { return first_of.count(r) > 0; })) continue;
      auto [it, fresh] = seen.try_emplace(print_value(e->value), d->name, d->type.numel());
      if (!fresh && it->second.second == d->type.numel() && it->second.first != d->name) first_of[d->name] = it->second.first;
    }
    if (first_of.empty()) continue;
    // A temporary that stores the same register as an earlier store of the same rows and type goes; its readers
    // read the earlier one.
    std::map<std::string, std::string> kept_for;  // dropped temporary -> kept one
    std::map<std::string, const Store*> stored;   // first register -> its first store
    for (const Instr& in : t->body) {
      const auto* st = std::get_if<Store>(&in.v);
      if (!st || st->atomic) continue;
      auto f = first_of.find(st->reg);
      const std::string reg = f == first_of.end() ? st->reg : f->second;
      auto [it, fresh] = stored.try_emplace(reg, st);
      if (fresh) continue;
      const Store& kept = *it->second;
      const TensorInfo *a = p.find(kept.tensor), *b = p.find(st->tensor);
      const bool temp = std::find(temps->begin(), temps->end(), st->tensor) != temps->end();
      if (temp && !read_by_torch(p, st->tensor, i + 1) && a && b && kept.row == st->row && kept.lanes == st->lanes && a->storage == b->storage && a->per == b->per &&
          a->row_numel() == b->row_numel())
        kept_for[st->tensor] = kept.tensor;
    }
    if (kept_for.empty()) continue;
    std::erase_if(t->body, [&](const Instr& in) {
      const auto* st = std::get_if<Store>(&in.v);
      return st && kept_for.count(st->tensor);
    });
    for (const auto& [dropped, kept] : kept_for) replace_tensor(p, i + 1, dropped, kept);
    // The repeated registers nothing reads any more go, with the comment that introduced each (a straight-line
    // body reads registers in its values and its stores).
    std::set<std::string> read;
    auto reads_of = [&](const ValueP& v) {
      for (const std::string& r : regs_of(v)) read.insert(r);
    };
    for (const Instr& in : t->body) {
      if (const auto* st = std::get_if<Store>(&in.v)) read.insert(st->reg);
      if (const auto* d = std::get_if<Def>(&in.v)) {
        if (const auto* e = std::get_if<Eval>(&d->source)) reads_of(e->value);
        else if (const auto* r = std::get_if<Reduce>(&d->source)) reads_of(r->value);
      }
    }
    for (const auto& [reg, first] : first_of) {
      if (read.count(reg)) continue;
      auto def = std::find_if(t->body.begin(), t->body.end(), [&](const Instr& in) {
        const auto* d = std::get_if<Def>(&in.v);
        return d && d->name == reg;
      });
      const bool commented = def != t->body.begin() && std::holds_alternative<Comment>(std::prev(def)->v);
      t->body.erase(commented ? std::prev(def) : def, std::next(def));
    }
  }
}

void forward_row_copies(Program& p) {
  auto rows_match = [](inter::LoopKind rows, inter::Per per) {
    switch (rows) {
      case inter::LoopKind::SrcPairs: return per == inter::Per::Pair;
      case inter::LoopKind::Edges: return per == inter::Per::Edge;
      case inter::LoopKind::DstNodes:
      case inter::LoopKind::SrcNodes: return per == inter::Per::Node;
      default: return false;
    }
  };
  const std::set<std::string> returned = returned_tensors(p);
  std::set<std::string> copies;
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    auto* t = std::get_if<TraversalInstance>(&p.kernels[i]);
    if (!t) continue;
    // The registers of the row loop that hold a row of another tensor as loaded: register -> that tensor.
    std::map<std::string, std::string> loaded;
    for (const Instr& in : t->body)
      if (const auto* d = std::get_if<Def>(&in.v); d && !d->is_mutable)
        if (const auto* l = std::get_if<Load>(&d->source); l && l->row == t->row) loaded[d->name] = l->tensor;
    const std::set<std::string> reads = kernel_reads(p.kernels[i]);
    const std::set<std::string> writes = kernel_writes(p.kernels[i]);
    std::map<std::string, std::string> copy_of;  // dropped tensor -> the tensor it copied
    for (const Instr& in : t->body) {
      const auto* st = std::get_if<Store>(&in.v);
      if (!st || st->atomic || st->row != t->row) continue;
      auto src = loaded.find(st->reg);
      if (src == loaded.end()) continue;
      const TensorInfo *to = p.find(src->second), *dropped = p.find(st->tensor);
      if (!to || !dropped || (dropped->role != Role::Temp && dropped->role != Role::Field)) continue;
      if (returned.count(dropped->name)) continue;  // the op hands it out (saved, or a saved field's tensor)
      if (dropped->per != to->per || dropped->row_numel() != to->row_numel() || !rows_match(t->rows, dropped->per)) continue;
      if (reads.count(dropped->name) || writes.count(to->name) || read_by_torch(p, dropped->name, i + 1)) continue;
      // The only store of `dropped` anywhere, and nothing writes the copied tensor from here on.
      int stores = 0;
      intra::for_each_instr(t->body, [&](const Instr& x) {
        if (const auto* s2 = std::get_if<Store>(&x.v); s2 && s2->tensor == dropped->name) ++stores;
      });
      bool alone = stores == 1;
      for (size_t k = 0; k < p.kernels.size() && alone; ++k)
        alone = k == i || !kernel_writes(p.kernels[k]).count(dropped->name);
      for (size_t k = i + 1; k < p.kernels.size() && alone; ++k) alone = !kernel_writes(p.kernels[k]).count(to->name);
      if (alone) copy_of[dropped->name] = to->name;
    }
    for (const auto& [dropped, kept] : copy_of) {
      for (size_t k = i + 1; k < p.kernels.size(); ++k) redirect_reads(p.kernels[k], dropped, kept);
      for (auto& [field, tensor] : p.aliases)
        if (tensor == dropped) tensor = kept;
      copies.insert(dropped);
    }
  }
  if (copies.empty()) return;
  // Nothing reads the copies now: drop-dead-stores removes their stores (and the loads only they used, and a
  // traversal that only copied), then the tensors go.
  drop_dead_stores(p);
  std::erase_if(p.tensors, [&](const TensorInfo& t) {
    return copies.count(t.name) && std::none_of(p.kernels.begin(), p.kernels.end(), [&](const Kernel& k) {
             return kernel_writes(k).count(t.name) || kernel_reads(k).count(t.name);
           });
  });
}

void merge_duplicate_gemms(Program& p) {
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    const auto* first = std::get_if<GemmInstance>(&p.kernels[i]);
    if (!first || !pure(p, *first)) continue;
    std::set<std::string> inputs = {first->x, first->w};
    if (!first->row_scalar.empty()) inputs.insert(first->row_scalar);
    for (size_t j = i + 1; j < p.kernels.size(); ++j) {
      const auto* again = std::get_if<GemmInstance>(&p.kernels[j]);
      if (again && same_product(*first, *again) && pure(p, *again) && p.find(again->y)->storage == p.find(first->y)->storage) {
        const std::string dropped = again->y, kept = first->y;
        if (read_by_torch(p, dropped, j)) continue;  // leave a product a fallback reads alone
        p.kernels.erase(p.kernels.begin() + static_cast<long>(j));
        replace_tensor(p, j, dropped, kept);
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
