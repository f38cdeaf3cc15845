// drop-dead-stores (see passes.h): a pass over the intra-operator IR, after the whole program is lowered (a
// traversal instance cannot know, when it is lowered, which of its stores later kernels read).
#include <functional>
#include <map>
#include <set>
#include <stdexcept>

#include "passes/passes.h"

namespace hectorgen::passes {

using namespace intra;

namespace {

// Tensors the program hands back: its outputs and the fields saved for the backward (through their aliases).
std::set<std::string> returned(const Program& p) {
  std::set<std::string> out;
  for (const TensorInfo& t : p.tensors)
    if (t.role == Role::Output) out.insert(t.name);
  for (const std::string& s : p.saved) {
    auto it = p.aliases.find(s);
    out.insert(it == p.aliases.end() ? s : it->second);
  }
  return out;
}

template <class F>
void each(std::vector<Instr>& body, const F& f) {
  for (Instr& in : body) {
    f(in);
    if (auto* l = std::get_if<EdgeLoop>(&in.v)) each(l->body, f);
  }
}

template <class F>
void erase_if(std::vector<Instr>& body, const F& dead) {
  std::erase_if(body, dead);
  for (Instr& in : body)
    if (auto* l = std::get_if<EdgeLoop>(&in.v)) erase_if(l->body, dead);
}

// Removes definitions, updates and indices nothing reads (a register only updated is not read).
void drop_unread(TraversalInstance& t) {
  for (bool changed = true; changed;) {
    changed = false;
    std::set<std::string> read;
    each(t.body, [&](Instr& in) {
      if (auto* d = std::get_if<Def>(&in.v)) {
        if (auto* l = std::get_if<Load>(&d->source)) read.insert(l->row);
        if (auto* e = std::get_if<Eval>(&d->source))
          for (const std::string& r : regs_of(e->value)) read.insert(r);
        if (auto* r = std::get_if<Reduce>(&d->source))
          for (const std::string& x : regs_of(r->value)) read.insert(x);
      }
      if (auto* u = std::get_if<Update>(&in.v))
        for (const std::string& r : regs_of(u->value))
          if (r != u->name) read.insert(r);
      if (auto* s = std::get_if<Store>(&in.v)) read.insert({s->reg, s->row});
      if (auto* x = std::get_if<IndexDef>(&in.v)) read.insert(x->of);
      if (auto* l = std::get_if<EdgeLoop>(&in.v)) read.insert(l->node);
    });
    erase_if(t.body, [&](const Instr& in) {
      const std::string* name = nullptr;
      if (auto* d = std::get_if<Def>(&in.v)) name = &d->name;
      if (auto* u = std::get_if<Update>(&in.v)) name = &u->name;
      if (auto* x = std::get_if<IndexDef>(&in.v)) name = &x->name;
      bool dead = name && !read.count(*name);
      changed = changed || dead;
      return dead;
    });
  }
}

// Lane 0 loads a replicated row alone only where it also stores it in the same block (see lower_traversal).
void relane(std::vector<Instr>& body) {
  std::set<std::string> stored;
  for (const Instr& in : body)
    if (auto* s = std::get_if<Store>(&in.v); s && s->lanes == StoreLanes::Lane0) stored.insert(s->tensor);
  for (Instr& in : body) {
    if (auto* d = std::get_if<Def>(&in.v))
      if (auto* l = std::get_if<Load>(&d->source); l && l->lane0 && !stored.count(l->tensor)) l->lane0 = false;
    if (auto* l = std::get_if<EdgeLoop>(&in.v)) relane(l->body);
  }
}

// The stores of `t` a later instruction of the kernel reads: a load of the tensor after the store in program
// order, or anywhere in the store's own edge loop (a later iteration), unless both name the iteration's own
// edge (each iteration has another).
std::set<const Store*> read_in_kernel(const TraversalInstance& t) {
  struct Access {
    size_t at;
    int loop;  // the innermost loop's number, 0 outside loops
    std::string row;
  };
  std::map<std::string, std::vector<Access>> loads;
  std::vector<std::pair<const Store*, Access>> stores;
  std::map<int, std::string> edge_of;  // loop number -> its edge variable
  size_t at = 0;
  int loops = 0;
  std::function<void(const std::vector<Instr>&, int)> walk = [&](const std::vector<Instr>& body, int loop) {
    for (const Instr& in : body) {
      ++at;
      if (auto* d = std::get_if<Def>(&in.v))
        if (auto* l = std::get_if<Load>(&d->source)) loads[l->tensor].push_back({at, loop, l->row});
      if (auto* s = std::get_if<Store>(&in.v)) stores.push_back({s, {at, loop, s->row}});
      if (auto* l = std::get_if<EdgeLoop>(&in.v)) {
        edge_of[++loops] = l->var;
        walk(l->body, loops);
      }
    }
  };
  walk(t.body, 0);
  std::set<const Store*> out;
  for (const auto& [s, a] : stores)
    for (const Access& l : loads[s->tensor]) {
      bool own_edge = a.loop && l.row == edge_of[a.loop] && a.row == edge_of[a.loop];
      if (l.at > a.at || (a.loop && l.loop == a.loop && !own_edge)) out.insert(s);
    }
  return out;
}

}  // namespace

void drop_dead_stores(Program& p) {
  const std::set<std::string> kept = returned(p);
  for (size_t i = 0; i < p.kernels.size(); ++i) {
    auto* t = std::get_if<TraversalInstance>(&p.kernels[i]);
    if (!t) continue;
    std::set<std::string> read_later;
    for (size_t j = i + 1; j < p.kernels.size(); ++j)
      for (const std::string& r : kernel_reads(p.kernels[j])) read_later.insert(r);
    const std::set<const Store*> read_here = read_in_kernel(*t);
    bool changed = false;
    erase_if(t->body, [&](const Instr& in) {
      auto* s = std::get_if<Store>(&in.v);
      if (!s) return false;
      const TensorInfo* ti = p.find(s->tensor);
      bool dead = ti && (ti->role == Role::Field || ti->role == Role::Temp) && !kept.count(s->tensor) &&
                  !read_later.count(s->tensor) && !read_here.count(s);
      changed = changed || dead;
      return dead;
    });
    if (!changed) continue;
    drop_unread(*t);
    relane(t->body);
    erase_if(t->body, [](const Instr& in) { return std::holds_alternative<Sync>(in.v); });
    insert_warp_syncs(*t);
    if (std::string e = verify_traversal(p, *t); !e.empty())
      throw std::logic_error("drop_dead_stores: the instance does not verify: " + e);
  }
}

}  // namespace hectorgen::passes
