#include "ir/inter/interpreter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <stdexcept>
#include <variant>

#include "ir/inter/ops.h"
#include "ir/inter/typing.h"
#include "ir/inter/verifier.h"

namespace hectorgen::inter {

int64_t Tensor64::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor64 Tensor64::zeros(std::vector<int64_t> shape) {
  Tensor64 t;
  t.shape = std::move(shape);
  t.data.assign(static_cast<size_t>(t.numel()), 0.0);
  return t;
}

int64_t num_src_etype_pairs(const HeteroGraph& g) {
  std::set<std::pair<int, int64_t>> pairs;
  for (int64_t e = 0; e < g.num_edges(); ++e) pairs.emplace(g.etype[e], g.src[e]);
  return static_cast<int64_t>(pairs.size());
}

std::vector<int64_t> full_shape(const TensorDecl& t, const HeteroGraph& g) {
  std::vector<int64_t> s;
  switch (t.per) {
    case Per::Node: s.push_back(g.num_nodes); break;
    case Per::Edge: s.push_back(g.num_edges()); break;
    case Per::Etype: s.push_back(g.num_etypes); break;
    case Per::Ntype: s.push_back(g.num_ntypes); break;
    case Per::None: break;
    case Per::Pair: s.push_back(num_src_etype_pairs(g)); break;
  }
  s.insert(s.end(), t.shape.begin(), t.shape.end());
  return s;
}

Tensor64 inv_relation_in_degree(const HeteroGraph& g) {
  std::map<std::pair<int64_t, int>, int64_t> count;
  for (int64_t e = 0; e < g.num_edges(); ++e) ++count[{g.dst[e], g.etype[e]}];
  Tensor64 t = Tensor64::zeros({g.num_edges()});
  for (int64_t e = 0; e < g.num_edges(); ++e) t.data[e] = 1.0 / static_cast<double>(count[{g.dst[e], g.etype[e]}]);
  return t;
}

namespace {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using V = Value64;  // a value per element: shape + data

struct EdgeIdx { int64_t e; };
struct NodeIdx { int64_t n; };
struct PairIdx { int64_t p; };
struct TypeIdxV { int t; };
struct WeightV { const TensorDecl* decl; int64_t slice; };  // slice -1: per none
struct StrV { std::string s; };
using Val = std::variant<V, EdgeIdx, NodeIdx, PairIdx, TypeIdxV, WeightV, StrV>;

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

class Interpreter {
 public:
  Interpreter(const Module& m, const HeteroGraph& g, const TensorMap& t) : m_(m), g_(g), t_(t) {}

  InterpretResult run() {
    InterpretResult r;
    try {
      check_inputs();
      build_adjacency();
      for (const TensorDecl& o : m_.decl.outputs)
        if (o.per != Per::Node && o.per != Per::Edge) weight_grads_[o.name] = Tensor64::zeros(full_shape(o, g_));
      // Every field starts at zero: `+=` into a field accumulates from 0, and a node without incoming
      // edges keeps 0 in what its edges would have aggregated.
      for (const auto& [name, f] : m_.node_fields) node_fields_[name] = Tensor64::zeros(rows(g_.num_nodes, f.shape));
      for (const auto& [name, f] : m_.edge_fields) edge_fields_[name] = Tensor64::zeros(rows(g_.num_edges(), f.shape));
      for (const auto& [name, f] : m_.pair_fields) pair_fields_[name] = Tensor64::zeros(rows(num_pairs(), f.shape));
      for (const StmtP& s : m_.body) top_loop(*s);
      for (const TensorDecl& o : m_.decl.outputs) {
        if (weight_grads_.count(o.name)) {
          r.outputs[o.name] = weight_grads_.at(o.name);
          continue;
        }
        auto& fields = o.per == Per::Edge ? edge_fields_ : node_fields_;
        auto it = fields.find(o.name);
        if (it == fields.end()) throw Error(fmt::format("output '{}' was not written", o.name));
        r.outputs[o.name] = it->second;
      }
      for (auto& [k, v] : node_fields_) r.fields[k] = v;
      for (auto& [k, v] : edge_fields_) r.fields[k] = v;
      for (auto& [k, v] : pair_fields_) r.fields[k] = v;
      r.ok = true;
    } catch (const Error& e) {
      r.error = e.what();
    }
    return r;
  }

 private:
  void check_inputs() {
    if (static_cast<int64_t>(g_.ntype.size()) != g_.num_nodes) throw Error("graph: ntype must have num_nodes entries");
    if (g_.dst.size() != g_.src.size() || g_.etype.size() != g_.src.size())
      throw Error("graph: src, dst and etype must have the same length");
    for (int64_t e = 0; e < g_.num_edges(); ++e) {
      if (g_.src[e] < 0 || g_.src[e] >= g_.num_nodes || g_.dst[e] < 0 || g_.dst[e] >= g_.num_nodes)
        throw Error(fmt::format("graph: edge {} has an endpoint out of range", e));
      if (g_.etype[e] < 0 || g_.etype[e] >= g_.num_etypes) throw Error(fmt::format("graph: edge {} has a bad type", e));
    }
    for (int t : g_.ntype)
      if (t < 0 || t >= g_.num_ntypes) throw Error("graph: node type out of range");
    auto need = [&](const TensorDecl& d) {
      auto it = t_.find(d.name);
      if (it == t_.end()) {
        if (d.from_graph == "inv_relation_in_degree") {
          derived_[d.name] = inv_relation_in_degree(g_);
          if (!d.shape.empty()) throw Error(fmt::format("'{}' from the graph must be a scalar per edge", d.name));
          return;
        }
        throw Error(fmt::format("missing tensor '{}'", d.name));
      }
      if (d.indexed_rows) {
        gather_indexed(d, it->second);
        return;
      }
      auto want = full_shape(d, g_);
      if (it->second.shape != want)
        throw Error(fmt::format("tensor '{}' has shape {}, expected {}", d.name, shape_str(it->second.shape), shape_str(want)));
      if (static_cast<int64_t>(it->second.data.size()) != numel(want))
        throw Error(fmt::format("tensor '{}' has {} values, expected {}", d.name, it->second.data.size(), numel(want)));
    };
    for (const auto& d : m_.decl.inputs) need(d);
    for (const auto& d : m_.decl.weights) need(d);
  }

  // rows: indexed: `table` has any number of rows and `<name>_rows` (one integer per node) says which is node v's;
  // the program then reads table[<name>_rows[v]] as row v of the input.
  void gather_indexed(const TensorDecl& d, const Tensor64& table) {
    const std::string map_name = d.name + "_rows";
    auto m = t_.find(map_name);
    if (m == t_.end()) throw Error(fmt::format("missing tensor '{}' (the node-to-row map of '{}')", map_name, d.name));
    if (m->second.shape != std::vector<int64_t>{g_.num_nodes} || static_cast<int64_t>(m->second.data.size()) != g_.num_nodes)
      throw Error(fmt::format("tensor '{}' has shape {}, expected [{}]", map_name, shape_str(m->second.shape), g_.num_nodes));
    std::vector<int64_t> want = full_shape(d, g_);
    if (table.shape.empty() || std::vector<int64_t>(table.shape.begin() + 1, table.shape.end()) !=
                                   std::vector<int64_t>(want.begin() + 1, want.end())) {
      std::string dims;
      for (size_t i = 1; i < want.size(); ++i) dims += fmt::format(", {}", want[i]);
      throw Error(fmt::format("tensor '{}' has shape {}, expected [rows{}] (any number of rows)", d.name,
                              shape_str(table.shape), dims));
    }
    const int64_t table_rows = table.shape[0], row = numel(std::vector<int64_t>(want.begin() + 1, want.end()));
    if (static_cast<int64_t>(table.data.size()) != table_rows * row)
      throw Error(fmt::format("tensor '{}' has {} values, expected {}", d.name, table.data.size(), table_rows * row));
    Tensor64 gathered = Tensor64::zeros(want);
    for (int64_t v = 0; v < g_.num_nodes; ++v) {
      const double r = m->second.data[v];
      if (r != std::floor(r) || r < 0 || r >= static_cast<double>(table_rows))
        throw Error(fmt::format("'{}'[{}] = {} is not a row of '{}' (it has {})", map_name, v, r, d.name, table_rows));
      std::copy_n(table.data.begin() + static_cast<int64_t>(r) * row, row, gathered.data.begin() + v * row);
    }
    derived_[d.name] = std::move(gathered);
  }

  static std::vector<int64_t> rows(int64_t n, const std::vector<int64_t>& shape) {
    std::vector<int64_t> s{n};
    s.insert(s.end(), shape.begin(), shape.end());
    return s;
  }

  const Tensor64& tensor(const std::string& name) const {
    if (auto it = derived_.find(name); it != derived_.end()) return it->second;
    return t_.at(name);
  }

  // Incoming and outgoing edges per node, and the unique (source, edge type) pairs ordered by (etype, source),
  // as the runtime numbers them (runtime/include/hectorgen/graph.h), with each edge's pair.
  void build_adjacency() {
    incoming_.assign(static_cast<size_t>(g_.num_nodes), {});
    outgoing_.assign(static_cast<size_t>(g_.num_nodes), {});
    std::map<std::pair<int, int64_t>, int64_t> pairs;  // (etype, src) -> pair row
    for (int64_t e = 0; e < g_.num_edges(); ++e) {
      incoming_[g_.dst[e]].push_back(e);
      outgoing_[g_.src[e]].push_back(e);
      pairs.emplace(std::pair{g_.etype[e], g_.src[e]}, 0);
    }
    for (auto& [key, row] : pairs) {
      row = static_cast<int64_t>(pair_src_.size());
      pair_src_.push_back(key.second);
      pair_etype_.push_back(key.first);
    }
    edge_pair_.resize(static_cast<size_t>(g_.num_edges()));
    for (int64_t e = 0; e < g_.num_edges(); ++e) edge_pair_[e] = pairs.at({g_.etype[e], g_.src[e]});
  }
  int64_t num_pairs() const { return static_cast<int64_t>(pair_src_.size()); }

  // ---- statements -----------------------------------------------------------------------------
  enum class Elem { Node, Edge, Pair };
  struct Binding { std::string var; Elem elem; int64_t idx; };
  struct Env {
    std::vector<Binding> loops;
    std::vector<std::map<std::string, V>> scopes;
  };

  void top_loop(const Stmt& s) {
    Env env;
    if (is_edge_loop(s.loop)) {
      for (int64_t e = 0; e < g_.num_edges(); ++e) iterate(s, env, Elem::Edge, e);
    } else if (s.loop == LoopKind::SrcPairs) {
      for (int64_t p = 0; p < num_pairs(); ++p) iterate(s, env, Elem::Pair, p);
    } else {
      for (int64_t n = 0; n < g_.num_nodes; ++n) iterate(s, env, Elem::Node, n);
    }
  }

  void iterate(const Stmt& loop, Env& env, Elem elem, int64_t idx) {
    env.loops.push_back({loop.var, elem, idx});
    env.scopes.emplace_back();
    for (const StmtP& s : loop.body) exec(*s, env);
    env.scopes.pop_back();
    env.loops.pop_back();
  }

  void exec(const Stmt& s, Env& env) {
    if (s.kind == StmtKind::For) {
      int64_t n = lookup_loop(env, s.parent).idx;
      for (int64_t e : (s.loop == LoopKind::IncomingEdges ? incoming_ : outgoing_)[n]) iterate(s, env, Elem::Edge, e);
      return;
    }
    if (s.kind != StmtKind::Assign) throw Error("unexpected call statement (run the inliner first)");
    V value = as_v(eval(s.value, env));
    const Expr& t = *s.target;
    const std::string& wg_name = t.kind == ExprKind::Name ? t.name : t.kind == ExprKind::Index && t.args[0]->kind == ExprKind::Name ? t.args[0]->name : "";
    if (auto wg = weight_grads_.find(wg_name); wg != weight_grads_.end()) {
      int64_t slice = t.kind == ExprKind::Index ? std::get<TypeIdxV>(eval(t.args[1], env)).t : 0;
      int64_t n = static_cast<int64_t>(value.data.size());
      for (int64_t i = 0; i < n; ++i) wg->second.data[slice * n + i] += value.data[i];
      return;
    }
    if (t.kind == ExprKind::Name) {
      if (s.op == AssignOp::Set) {
        env.scopes.back()[t.name] = value;
        return;
      }
      for (auto it = env.scopes.rbegin(); it != env.scopes.rend(); ++it)
        if (auto f = it->find(t.name); f != it->end()) {
          f->second = combine(f->second, value, s.op);
          return;
        }
      throw Error(fmt::format("local '{}' updated before assignment", t.name));
    }
    Val base = eval(t.args[0], env);
    const std::string& field = t.args[1]->name;
    auto [fields, info, idx] = field_home(base);
    auto it = fields->find(field);
    const std::vector<int64_t>& fshape = info->at(field).shape;
    if (it == fields->end()) {
      std::vector<int64_t> shape{fields == &edge_fields_ ? g_.num_edges() : fields == &pair_fields_ ? num_pairs() : g_.num_nodes};
      shape.insert(shape.end(), fshape.begin(), fshape.end());
      it = fields->emplace(field, Tensor64::zeros(shape)).first;
    }
    int64_t n = numel(fshape);
    double* row = it->second.data.data() + idx * n;
    V current{fshape, std::vector<double>(row, row + n)};
    V result = s.op == AssignOp::Set ? broadcast_to(value, fshape) : combine(current, value, s.op);
    if (result.shape != fshape) result = broadcast_to(result, fshape);
    std::copy(result.data.begin(), result.data.end(), row);
  }

  // The fields an element reference (an edge, node or pair) holds, their declared rows, and its row.
  struct Home {
    TensorMap* fields;
    const FieldTable* info;
    int64_t row;
  };
  Home field_home(const Val& base) {
    if (auto* e = std::get_if<EdgeIdx>(&base)) return {&edge_fields_, &m_.edge_fields, e->e};
    if (auto* p = std::get_if<PairIdx>(&base)) return {&pair_fields_, &m_.pair_fields, p->p};
    return {&node_fields_, &m_.node_fields, std::get<NodeIdx>(base).n};
  }

  // `a op= b`: the operator's evaluation from the table.
  static V combine(const V& a, const V& b, AssignOp op) {
    Op o = op == AssignOp::Add ? Op::Add : op == AssignOp::Sub ? Op::Sub : op == AssignOp::Mul ? Op::Mul : Op::Div;
    if (op == AssignOp::Set) return b;
    return op_info(o).eval({a, b}, Type{});
  }

  // Prefix broadcasting of a value to a field's row shape.
  static V broadcast_to(const V& a, const std::vector<int64_t>& shape) {
    if (a.shape == shape) return a;
    int64_t n = numel(shape), inner = n / static_cast<int64_t>(a.data.size());
    V out{shape, std::vector<double>(static_cast<size_t>(n))};
    for (int64_t i = 0; i < n; ++i) out.data[i] = a.data[i / inner];
    return out;
  }

  const Binding& lookup_loop(const Env& env, const std::string& var) const {
    for (const Binding& b : env.loops)
      if (b.var == var) return b;
    throw Error(fmt::format("unknown loop variable '{}'", var));
  }

  // ---- expressions ----------------------------------------------------------------------------
  V as_v(const Val& v) const {
    if (auto* x = std::get_if<V>(&v)) return *x;
    if (auto* w = std::get_if<WeightV>(&v)) {
      const Tensor64& t = tensor(w->decl->name);
      int64_t n = numel(w->decl->shape);
      int64_t off = w->slice < 0 ? 0 : w->slice * n;
      return V{w->decl->shape, std::vector<double>(t.data.begin() + off, t.data.begin() + off + n)};
    }
    throw Error("expected a tensor value");
  }

  V node_input(const TensorDecl& d, int64_t n) const {
    const Tensor64& t = tensor(d.name);
    int64_t k = numel(d.shape);
    return V{d.shape, std::vector<double>(t.data.begin() + n * k, t.data.begin() + (n + 1) * k)};
  }

  Val eval(const ExprP& e, Env& env) {
    switch (e->kind) {
      case ExprKind::Number: return V::scalar(e->number);
      case ExprKind::String: return StrV{e->name};
      case ExprKind::Name: {
        for (auto it = env.scopes.rbegin(); it != env.scopes.rend(); ++it)
          if (auto f = it->find(e->name); f != it->end()) return f->second;
        for (const Binding& b : env.loops)
          if (b.var == e->name)
            return b.elem == Elem::Edge ? Val{EdgeIdx{b.idx}} : b.elem == Elem::Pair ? Val{PairIdx{b.idx}} : Val{NodeIdx{b.idx}};
        if (const HyperParam* h = m_.decl.find_hyper(e->name)) return V::scalar(h->value);
        if (const TensorDecl* w = m_.decl.find_weight(e->name)) return WeightV{w, -1};
        throw Error(fmt::format("undefined name '{}'", e->name));
      }
      case ExprKind::Attr: {
        Val base = eval(e->args[0], env);
        const std::string& a = e->name;
        if (auto* er = std::get_if<EdgeIdx>(&base)) {
          if (a == "src") return NodeIdx{g_.src[er->e]};
          if (a == "dst") return NodeIdx{g_.dst[er->e]};
          if (a == "etype") return TypeIdxV{g_.etype[er->e]};
          if (a == "pair") return PairIdx{edge_pair_[er->e]};
          return node_input(*m_.decl.find_input(a), er->e);  // edge input: same row layout
        }
        if (auto* pr = std::get_if<PairIdx>(&base)) {
          if (a == "src") return NodeIdx{pair_src_[pr->p]};
          if (a == "etype") return TypeIdxV{pair_etype_[pr->p]};
          return node_input(*m_.decl.find_input(a), pr->p);  // an input per pair: same row layout
        }
        auto& nr = std::get<NodeIdx>(base);
        if (a == "ntype") return TypeIdxV{g_.ntype[nr.n]};
        return node_input(*m_.decl.find_input(a), nr.n);
      }
      case ExprKind::Index: {
        Val base = eval(e->args[0], env);
        if (auto* w = std::get_if<WeightV>(&base)) {
          Val idx = eval(e->args[1], env);
          return WeightV{w->decl, std::get<TypeIdxV>(idx).t};
        }
        [[maybe_unused]] auto [fields, info, idx] = field_home(base);
        auto it = fields->find(e->args[1]->name);
        if (it == fields->end()) throw Error(fmt::format("field '{}' read before written", e->args[1]->name));
        std::vector<int64_t> shape(it->second.shape.begin() + 1, it->second.shape.end());
        int64_t n = numel(shape);
        return V{shape, std::vector<double>(it->second.data.begin() + idx * n, it->second.data.begin() + (idx + 1) * n)};
      }
      case ExprKind::Neg:
      case ExprKind::Binary:
      case ExprKind::Call: return apply(e, env);
    }
    throw Error("unknown expression");
  }

  // An operator: its arguments evaluated (a left-out parameter as its default), then the table's evaluation.
  V apply(const ExprP& e, Env& env) {
    const OpInfo& op = op_info(e->fn);
    std::vector<V> args;
    for (const ExprP& a : e->args) args.push_back(as_v(eval(a, env)));
    for (size_t i = args.size(); i < op.params.size(); ++i) args.push_back(V::scalar(*op.params[i].default_value));
    return op.eval(args, e->type);
  }

  const Module& m_;
  const HeteroGraph& g_;
  const TensorMap& t_;
  TensorMap derived_;
  TensorMap node_fields_, edge_fields_, pair_fields_;
  TensorMap weight_grads_;
  std::vector<std::vector<int64_t>> incoming_, outgoing_;
  std::vector<int64_t> pair_src_, edge_pair_;
  std::vector<int> pair_etype_;
};

}  // namespace

InterpretResult interpret(const Module& m, const HeteroGraph& g, const TensorMap& tensors) {
  if (is_typed(m)) return Interpreter(m, g, tensors).run();
  Diagnostics diags;
  std::optional<Module> typed = typecheck(m, diags);
  if (!typed) {
    InterpretResult r;
    r.error = "the module does not verify";
    return r;
  }
  return Interpreter(*typed, g, tensors).run();
}

}  // namespace hectorgen::inter
