// drop-dead-stores (see passes.h): a pass over the intra-operator IR, after the whole program is lowered (a
// traversal instance cannot know, when it is lowered, which of its stores later kernels read).
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <stdexcept>

#include "passes/passes.h"

namespace hectorgen::passes {

using namespace intra;

namespace {

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

// The registers and indices one instruction reads (not those of the loop body it holds; an update does not
// read the register it updates).
void reads_of(const Instr& in, std::set<std::string>& read) {
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
}

// True when an instruction of body[from...] (loop bodies included) reads `name`.
bool read_after(const std::vector<Instr>& body, size_t from, const std::string& name) {
  for (size_t i = from; i < body.size(); ++i) {
    std::set<std::string> read;
    reads_of(body[i], read);
    if (read.count(name)) return true;
    if (auto* l = std::get_if<EdgeLoop>(&body[i].v); l && read_after(l->body, 0, name)) return true;
  }
  return false;
}

// Removes definitions, updates and indices nothing reads (a register only updated is not read). A definition
// is read only after it, in its own block: sibling loops may define registers of the same name.
void drop_unread(TraversalInstance& t) {
  for (bool changed = true; changed;) {
    changed = false;
    std::set<std::string> read;
    each(t.body, [&](Instr& in) { reads_of(in, read); });
    std::function<void(std::vector<Instr>&)> sweep = [&](std::vector<Instr>& body) {
      for (size_t i = 0; i < body.size();) {
        const Instr& in = body[i];
        bool dead = false;
        if (auto* d = std::get_if<Def>(&in.v)) dead = !read_after(body, i + 1, d->name);
        if (auto* x = std::get_if<IndexDef>(&in.v)) dead = !read_after(body, i + 1, x->name);
        if (auto* u = std::get_if<Update>(&in.v)) dead = !read.count(u->name);
        if (dead && std::holds_alternative<Def>(in.v)) {  // its updates go with it (they follow it in its block)
          const std::string name = std::get<Def>(in.v).name;
          std::function<void(std::vector<Instr>&)> drop = [&](std::vector<Instr>& b) {
            std::erase_if(b, [&](const Instr& x) { auto* u = std::get_if<Update>(&x.v); return u && u->name == name; });
            for (Instr& x : b)
              if (auto* l = std::get_if<EdgeLoop>(&x.v)) drop(l->body);
          };
          std::vector<Instr> rest(std::make_move_iterator(body.begin() + static_cast<std::ptrdiff_t>(i) + 1),
                                  std::make_move_iterator(body.end()));
          drop(rest);
          body.resize(i + 1);
          std::move(rest.begin(), rest.end(), std::back_inserter(body));
        }
        if (dead) {
          body.erase(body.begin() + static_cast<std::ptrdiff_t>(i));
          changed = true;
          continue;
        }
        if (auto* l = std::get_if<EdgeLoop>(&body[i].v)) sweep(l->body);
        ++i;
      }
    };
    sweep(t.body);
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
  const std::set<std::string> kept = returned_tensors(p);
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
    split_edge_loops(*t);
    if (!row_lanes_blocker(*t).empty()) t->row_lanes = 32;  // (dropping stores only removes blockers)
    insert_warp_syncs(*t);
    if (std::string e = verify_traversal(p, *t); !e.empty())
      throw std::logic_error("drop_dead_stores: the instance does not verify: " + e);
  }
  // A traversal without a store left computes for nobody.
  std::erase_if(p.kernels, [](const Kernel& k) {
    const auto* t = std::get_if<TraversalInstance>(&k);
    if (!t) return false;
    bool stores = false;
    intra::for_each_instr(t->body, [&](const Instr& in) { stores = stores || std::holds_alternative<Store>(in.v); });
    return !stores;
  });
}

}  // namespace hectorgen::passes
