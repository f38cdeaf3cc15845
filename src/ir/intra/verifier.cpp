// Verifier of traversal instances and the launch limits of every kernel (see intra.h).
#include <fmt/format.h>

#include <functional>
#include <map>
#include <set>

#include "ir/intra/intra.h"

namespace hectorgen::intra {

namespace {

bool is_node_rows(inter::LoopKind k) { return k == inter::LoopKind::DstNodes || k == inter::LoopKind::SrcNodes; }

// What a name in scope is.
enum class NameKind { EdgeVar, NodeVar, PairVar, Position, EtypeIndex, NtypeIndex, NodeIndex, PairIndex, Register };

struct Binding {
  NameKind kind;
  const Def* def = nullptr;  // registers
  bool owned = false;        // row variables: a row this warp owns (the row itself, the row node's edges)
};

class TraversalVerifier {
 public:
  TraversalVerifier(const Program& p, const TraversalInstance& t) : p_(p), t_(t) {}

  std::string run() {
    const bool pairs = t_.rows == inter::LoopKind::SrcPairs;
    if (t_.rows != inter::LoopKind::Edges && !is_node_rows(t_.rows) && !pairs)
      return fail("the row loop must be over edges, dst_nodes, src_nodes or src_etype_pairs");
    if (t_.rows == inter::LoopKind::Edges && !p_.layouts.count(layout::kSortedCoo))
      return fail(fmt::format("an edge row loop walks the layout '{}', which the program does not have", layout::kSortedCoo));
    if (pairs && !p_.layouts.count(layout::kCompactSrc))
      return fail(fmt::format("a pair row loop walks the layout '{}', which the program does not have", layout::kCompactSrc));
    collect_stores(t_.body);
    scopes_.emplace_back();
    const NameKind row = t_.rows == inter::LoopKind::Edges ? NameKind::EdgeVar : pairs ? NameKind::PairVar : NameKind::NodeVar;
    if (!declare(t_.row, Binding{row, nullptr, true})) return error_;
    if (!block(t_.body)) return error_;
    if (auto h = find_warp_hazard(t_))
      return fail(fmt::format("lanes race on '{}': '{}' and then '{}' with no sync between them", h->tensor, h->first, h->second));
    return {};
  }

 private:
  std::string fail(const std::string& msg) {
    if (error_.empty()) error_ = fmt::format("{}: {}", t_.name, msg);
    return error_;
  }

  bool bad(const std::string& msg) {
    fail(msg);
    return false;
  }

  void collect_stores(const std::vector<Instr>& body) {
    for (const Instr& in : body) {
      if (auto* s = std::get_if<Store>(&in.v)) (s->atomic ? atomic_ : stored_).insert(s->tensor);
      if (auto* l = std::get_if<EdgeLoop>(&in.v)) collect_stores(l->body);
    }
  }

  const Binding* lookup(const std::string& n) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(n); f != it->end()) return &f->second;
    return nullptr;
  }

  bool declare(const std::string& n, Binding b) {
    if (lookup(n)) return bad(fmt::format("'{}' is defined twice", n));
    if (p_.find(n)) return bad(fmt::format("'{}' is also a tensor (a kernel parameter)", n));
    if (is_kernel_reserved(n)) return bad(fmt::format("'{}' is reserved in kernels (the printer's own names, C++ and CUDA)", n));
    scopes_.back().emplace(n, b);
    return true;
  }

  bool need_layout(const char* l, const std::string& what) {
    if (p_.layouts.count(l)) return true;
    fail(fmt::format("{} needs the graph layout '{}', which the program does not have", what, l));
    return false;
  }

  // The row of a load or store of `tensor`.
  bool check_row(const TensorInfo& t, const std::string& row, bool store, bool atomic) {
    using inter::Per;
    if (t.per == Per::None) {
      if (row != "0") return bad(fmt::format("'{}' has no rows: it is indexed by 0, not '{}'", t.name, row));
      if (store) return bad(fmt::format("'{}' is a weight without rows: a traversal does not store it", t.name));
      return true;
    }
    const Binding* b = lookup(row);
    if (!b) return bad(fmt::format("row '{}' of '{}' is not defined", row, t.name));
    bool ok = false;
    const char* want = "";
    switch (t.per) {
      case Per::Node: ok = b->kind == NameKind::NodeVar || b->kind == NameKind::NodeIndex; want = "a node"; break;
      case Per::Edge:
        if (by_in_position(t)) {  // a twin in CSR order (in_position_twin): a position of a node's incoming edges
          ok = b->kind == NameKind::Position && positions_.at(row) == inter::LoopKind::IncomingEdges;
          want = "a position of a node's incoming edges";
        } else {
          ok = b->kind == NameKind::EdgeVar;
          want = "an edge";
        }
        break;
      case Per::Etype: ok = b->kind == NameKind::EtypeIndex; want = "an edge type (index = etype[e])"; break;
      case Per::Ntype: ok = b->kind == NameKind::NtypeIndex; want = "a node type (index = ntype[n])"; break;
      case Per::Pair: ok = b->kind == NameKind::PairVar || b->kind == NameKind::PairIndex; want = "a pair (index = edge_pair[e])"; break;
      case Per::None: break;
    }
    if (!ok) return bad(fmt::format("'{}' is indexed by {}, not by '{}'", t.name, want, row));
    // Rows other warps own: atomics only, and never a tensor this kernel also accesses plainly.
    if (atomic) {
      if (stored_.count(t.name))
        return bad(fmt::format("'{}' is both stored and atomically updated in one kernel", t.name));
      return true;
    }
    if (atomic_.count(t.name))
      return bad(fmt::format("'{}' is atomically updated by other warps while this kernel {} it", t.name, store ? "stores" : "loads"));
    if (stored_.count(t.name) && !b->owned)
      return bad(fmt::format("'{}' is stored by this kernel but {} through row '{}', which other warps own", t.name,
                               store ? "stored" : "loaded", row));
    return true;
  }

  // The element count of `v` (its largest operand's), unchecked.
  int64_t numel(const ValueP& v) const {
    if (v->kind == Value::Kind::Reg) {
      const Binding* b = lookup(v->reg);
      return b && b->kind == NameKind::Register ? b->def->type.numel() : 1;
    }
    int64_t n = 1;
    for (const ValueP& a : v->args) n = std::max(n, numel(a));
    return n;
  }

  // The element count of `v`, checking every operand against the instruction's iteration type `it`:
  // an operand with as many elements shares the layout; a smaller one broadcasts (its count divides).
  std::optional<int64_t> value(const ValueP& v, const RegType& it) {
    switch (v->kind) {
      case Value::Kind::Const: return 1;
      case Value::Kind::Reg: {
        const Binding* b = lookup(v->reg);
        if (!b || b->kind != NameKind::Register) {
          fail(fmt::format("register '{}' is read before it is defined", v->reg));
          return std::nullopt;
        }
        const RegType& rt = b->def->type;
        if (it.numel() % rt.numel()) {
          fail(fmt::format("'{}' has {} elements, which do not broadcast to {}", v->reg, rt.numel(), it.numel()));
          return std::nullopt;
        }
        if (rt.numel() == it.numel() && rt.layout != it.layout) {
          fail(fmt::format("'{}' is laid out {} where the instruction computes {}", v->reg, to_string(rt.layout), to_string(it.layout)));
          return std::nullopt;
        }
        return rt.numel();
      }
      case Value::Kind::Op: break;
    }
    if (!is_elementwise(v->op)) {
      fail(fmt::format("'{}' is not an element-wise operator", inter::op_info(v->op).name));
      return std::nullopt;
    }
    const inter::OpInfo& info = inter::op_info(v->op);
    if (v->args.size() < info.min_args() || v->args.size() > info.max_args()) {
      fail(fmt::format("'{}' takes {} to {} operands, got {}", info.name, info.min_args(), info.max_args(), v->args.size()));
      return std::nullopt;
    }
    for (size_t k = 0; k < v->args.size(); ++k)
      if (info.param(k).kind == inter::ParamKind::Constant && v->args[k]->kind != Value::Kind::Const) {
        fail(fmt::format("{} of '{}' must be a constant in '{}'", info.param(k).role, info.name, print_value(v)));
        return std::nullopt;
      }
    int64_t n = 1;
    std::vector<int64_t> counts;
    for (size_t k = 0; k < v->args.size(); ++k) {
      if (info.param(k).kind == inter::ParamKind::Constant) continue;  // a parameter, not an operand
      auto c = value(v->args[k], it);
      if (!c) return std::nullopt;
      counts.push_back(*c);
      n = std::max(n, *c);
    }
    for (int64_t c : counts)
      if (n % c) {
        fail(fmt::format("operands of '{}' with {} and {} elements do not broadcast", print_value(v), c, n));
        return std::nullopt;
      }
    return n;
  }

  bool def(const Def& d) {
    if (d.type.numel() < 1) return bad(fmt::format("'{}' has no elements", d.name));
    if (auto* l = std::get_if<Load>(&d.source)) {
      const TensorInfo* t = p_.find(l->tensor);
      if (!t) return bad(fmt::format("load of unknown tensor '{}'", l->tensor));
      if (!check_row(*t, l->row, false, false)) return false;
      if (t->row_numel() != d.type.numel())
        return bad(fmt::format("'{}' has {} elements, rows of '{}' have {}", d.name, d.type.numel(), t->name, t->row_numel()));
      if (l->lane0 && d.type.layout != LaneLayout::Replicated)
        return bad(fmt::format("'{}' is spread over the lanes: each lane loads its elements, not lane 0", d.name));
    } else if (auto* e = std::get_if<Eval>(&d.source)) {
      if (!value(e->value, d.type)) return false;
    } else {
      const Reduce& r = std::get<Reduce>(d.source);
      if (r.axis < 1) return bad(fmt::format("'{}' reduces an axis of {} elements", d.name, r.axis));
      int64_t n = numel(r.value);
      if (n != d.type.numel() * r.axis)
        return bad(fmt::format("'{}' reduces {} elements by {} into {}: the counts do not match", d.name, n, r.axis, d.type.numel()));
      if (!value(r.value, RegType{{n}, r.warp ? LaneLayout::Lanes : LaneLayout::Replicated})) return false;
      if (d.type.layout == LaneLayout::Lanes && !r.warp)
        return bad(fmt::format("'{}' is spread over the lanes but reduced within each lane", d.name));
    }
    Binding b{NameKind::Register, &d, false};
    return declare(d.name, b);
  }

  bool block(const std::vector<Instr>& body) {
    for (const Instr& in : body) {
      bool ok = std::visit(
          [&](const auto& x) -> bool {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, Comment> || std::is_same_v<T, Sync>) {
              return true;
            } else if constexpr (std::is_same_v<T, IndexDef>) {
              return index(x);
            } else if constexpr (std::is_same_v<T, Def>) {
              return def(x);
            } else if constexpr (std::is_same_v<T, Update>) {
              const Binding* b = lookup(x.name);
              if (!b || b->kind != NameKind::Register) return bad(fmt::format("update of undefined register '{}'", x.name));
              if (!b->def->is_mutable) return bad(fmt::format("'{}' is a let: it cannot be updated", x.name));
              return value(x.value, b->def->type).has_value();
            } else if constexpr (std::is_same_v<T, Store>) {
              return store(x);
            } else {
              return loop(x);
            }
          },
          in.v);
      if (!ok) return false;
    }
    return true;
  }

  bool index(const IndexDef& x) {
    const Binding* of = lookup(x.of);
    if (!of) return bad(fmt::format("index '{}' reads {}[{}] before '{}' is defined", x.name, to_string(x.array), x.of, x.of));
    NameKind kind = NameKind::NodeIndex;
    bool ok = false;
    // A read by the position in a node's incoming or outgoing edges (in_src, in_etype, in_pair; out_dst, out_etype).
    auto at_position = [&](inter::LoopKind loop) { return of->kind == NameKind::Position && positions_.at(x.of) == loop; };
    switch (x.array) {
      case GraphArray::Src:
      case GraphArray::Dst:
      case GraphArray::Etype:
        ok = of->kind == NameKind::EdgeVar && need_layout(layout::kSortedCoo, fmt::format("index '{}'", x.name));
        if (x.array == GraphArray::Etype) kind = NameKind::EtypeIndex;
        break;
      case GraphArray::InSrc: ok = at_position(inter::LoopKind::IncomingEdges); break;
      case GraphArray::OutDst: ok = at_position(inter::LoopKind::OutgoingEdges); break;
      case GraphArray::Ntype:
        ok = (of->kind == NameKind::NodeVar || of->kind == NameKind::NodeIndex) &&
             need_layout(layout::kNtypePtr, fmt::format("index '{}'", x.name));
        kind = NameKind::NtypeIndex;
        break;
      case GraphArray::PairSrc:
      case GraphArray::PairEtype:
        ok = (of->kind == NameKind::PairVar || of->kind == NameKind::PairIndex) &&
             need_layout(layout::kCompactSrc, fmt::format("index '{}'", x.name));
        if (x.array == GraphArray::PairEtype) kind = NameKind::EtypeIndex;
        break;
      case GraphArray::EdgePair:
        ok = of->kind == NameKind::EdgeVar && need_layout(layout::kCompactSrc, fmt::format("index '{}'", x.name));
        kind = NameKind::PairIndex;
        break;
      case GraphArray::InEtype:
      case GraphArray::OutEtype:
        ok = at_position(x.array == GraphArray::InEtype ? inter::LoopKind::IncomingEdges : inter::LoopKind::OutgoingEdges);
        kind = NameKind::EtypeIndex;
        break;
      case GraphArray::InPair:
        ok = at_position(inter::LoopKind::IncomingEdges) &&
             need_layout(layout::kCsrByDstPairs, fmt::format("index '{}'", x.name));
        kind = NameKind::PairIndex;
        break;
    }
    if (!ok) {
      if (!error_.empty()) return false;
      return bad(fmt::format("index '{}': {}[] cannot be indexed by '{}'", x.name, to_string(x.array), x.of));
    }
    return declare(x.name, Binding{kind, nullptr, false});
  }

  bool store(const Store& s) {
    const TensorInfo* t = p_.find(s.tensor);
    if (!t) return bad(fmt::format("store to unknown tensor '{}'", s.tensor));
    if (t->role == Role::Input || t->role == Role::Weight)
      return bad(fmt::format("store to '{}', {}", s.tensor, t->role == Role::Input ? "an input" : "a weight"));
    const Binding* b = lookup(s.reg);
    if (!b || b->kind != NameKind::Register) return bad(fmt::format("store of undefined register '{}'", s.reg));
    const RegType& rt = b->def->type;
    if (rt.numel() != t->row_numel())
      return bad(fmt::format("store of '{}' ({} elements) into rows of '{}' ({} elements)", s.reg, rt.numel(), t->name, t->row_numel()));
    if ((s.lanes == StoreLanes::Partitioned) != (rt.layout == LaneLayout::Lanes))
      return bad(fmt::format("'{}' is {}: it is stored by {}", s.reg, to_string(rt.layout), rt.layout == LaneLayout::Lanes ? "lanes" : "lane0"));
    return check_row(*t, s.row, true, s.atomic);
  }

  bool loop(const EdgeLoop& l) {
    const Binding* node = lookup(l.node);
    if (!is_node_rows(t_.rows) || !node || node->kind != NameKind::NodeVar || l.node != t_.row)
      return bad(fmt::format("edge loop over '{}': inner loops walk the edges of the row node", l.node));
    if (l.kind != inter::LoopKind::IncomingEdges && l.kind != inter::LoopKind::OutgoingEdges)
      return bad("an inner loop is over incoming or outgoing edges");
    if (!need_layout(l.kind == inter::LoopKind::IncomingEdges ? layout::kCsrByDst : layout::kCsrBySrc, fmt::format("loop over '{}'", l.var)))
      return false;
    if (l.split)
      if (std::string why = split_blocker(l); !why.empty()) return bad(fmt::format("the lanes cannot split the loop over '{}': {}", l.var, why));
    scopes_.emplace_back();
    bool ok = declare(l.pos, Binding{NameKind::Position, nullptr, false}) && declare(l.var, Binding{NameKind::EdgeVar, nullptr, true});
    positions_[l.pos] = l.kind;
    ok = ok && block(l.body);
    scopes_.pop_back();
    return ok;
  }

  const Program& p_;
  const TraversalInstance& t_;
  std::vector<std::map<std::string, Binding>> scopes_;
  std::map<std::string, inter::LoopKind> positions_;
  std::set<std::string> stored_, atomic_;
  std::string error_;
};

}  // namespace

std::string verify_traversal(const Program& p, const TraversalInstance& t) { return TraversalVerifier(p, t).run(); }

}  // namespace hectorgen::intra
