#include "ir/intra/interpreter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>

#include "ir/inter/ops.h"

namespace hectorgen::intra {

namespace {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Interpreter {
 public:
  Interpreter(const Program& p, const inter::HeteroGraph& g, inter::TensorMap& t) : p_(p), g_(g), t_(t) {
    // The unique (source, edge type) pairs ordered by (etype, source), as the runtime numbers them.
    std::map<std::pair<int, int64_t>, int64_t> pairs;
    for (int64_t e = 0; e < g.num_edges(); ++e) pairs.emplace(std::pair{g.etype[e], g.src[e]}, 0);
    for (auto& [key, row] : pairs) {
      row = static_cast<int64_t>(pair_src_.size());
      pair_src_.push_back(key.second);
      pair_etype_.push_back(key.first);
    }
    for (int64_t e = 0; e < g.num_edges(); ++e) edge_pair_.push_back(pairs.at({g.etype[e], g.src[e]}));
  }

  void run() {
    allocate();
    for (const Kernel& k : p_.kernels) std::visit([&](const auto& x) { kernel(x); }, k);
  }

 private:
  // ---- tensors ------------------------------------------------------------------------------------
  int64_t rows(inter::Per per) const {
    switch (per) {
      case inter::Per::Node: return g_.num_nodes;
      case inter::Per::Edge: return g_.num_edges();
      case inter::Per::Etype: return g_.num_etypes;
      case inter::Per::Ntype: return g_.num_ntypes;
      case inter::Per::None: return 1;
      case inter::Per::Pair: return static_cast<int64_t>(pair_src_.size());
    }
    return 1;
  }

  void allocate() {
    for (const TensorInfo& t : p_.tensors) {
      int64_t size = rows(t.per) * t.row_numel();
      auto it = t_.find(t.name);
      if (it != t_.end() && is_indexed(t.name)) {  // a table of any number of rows, and its map
        check_row_map(t, it->second);
        continue;
      }
      if (it != t_.end()) {
        if (it->second.numel() != size) throw Error(fmt::format("tensor '{}' has {} elements, the program needs {}", t.name, it->second.numel(), size));
        continue;
      }
      // A CSR position is its edge here (block()): the twin in CSR order holds the same values by position.
      if (t.role == Role::Input && (t.from_graph == layout::kInvRelInDegree || t.from_graph == layout::kInColInvRelInDegree)) {
        t_[t.name] = inter::inv_relation_in_degree(g_);
        continue;
      }
      if (t.role == Role::Input || t.role == Role::Weight) throw Error(fmt::format("missing input or weight '{}'", t.name));
      inter::Tensor64 x;
      x.shape = {rows(t.per)};
      x.shape.insert(x.shape.end(), t.shape.begin(), t.shape.end());
      x.data.assign(static_cast<size_t>(size), t.zero_init ? 0.0 : std::numeric_limits<double>::quiet_NaN());
      t_[t.name] = std::move(x);
    }
  }

  bool is_indexed(const std::string& name) const {
    const inter::TensorDecl* d = p_.decl.find_input(name);
    return d && d->indexed_rows;
  }

  // rows: indexed: `table` holds whole rows of `t`, and <name>_rows one row number of it per node.
  void check_row_map(const TensorInfo& t, const inter::Tensor64& table) const {
    if (t.row_numel() == 0 || table.numel() % t.row_numel() != 0)
      throw Error(fmt::format("tensor '{}' has {} elements, not whole rows of {}", t.name, table.numel(), t.row_numel()));
    auto m = t_.find(t.name + "_rows");
    if (m == t_.end()) throw Error(fmt::format("missing the node-to-row map '{}_rows'", t.name));
    if (m->second.numel() != g_.num_nodes)
      throw Error(fmt::format("'{}_rows' has {} elements, the graph {} nodes", t.name, m->second.numel(), g_.num_nodes));
    const double table_rows = static_cast<double>(table.numel() / t.row_numel());
    for (double r : m->second.data)
      if (r != std::floor(r) || r < 0 || r >= table_rows) throw Error(fmt::format("'{}_rows' holds {}, not a row of the table", t.name, r));
  }

  // The row of X that row r of a GEMM or weight-gradient instance reads: its gather, through X's map if X is indexed
  // (the list the host code composes: X_rows[src[r]], ...).
  int64_t x_row(const std::string& x, Rows rows, Gather g, int64_t r) const {
    const int64_t v = gathered(rows, g, r);
    if (!is_indexed(x)) return v;
    return static_cast<int64_t>(t_.at(x + "_rows").data[static_cast<size_t>(v)]);
  }

  const TensorInfo& info(const std::string& n) const {
    const TensorInfo* t = p_.find(n);
    if (!t) throw Error("unknown tensor " + n);
    return *t;
  }
  double* row(const std::string& tensor, int64_t r) {
    const TensorInfo& ti = info(tensor);
    inter::Tensor64& t = t_.at(tensor);
    const int64_t n = is_indexed(tensor) ? t.numel() / ti.row_numel() : rows(ti.per);  // an indexed table: its own rows
    if (r < 0 || r >= n) throw Error(fmt::format("row {} of '{}' is out of range", r, tensor));
    return t.data.data() + r * ti.row_numel();
  }

  int64_t num_rows(Rows r) const {
    switch (r) {
      case Rows::Nodes: return g_.num_nodes;
      case Rows::Edges: return g_.num_edges();
      case Rows::Etypes: return g_.num_etypes;
      case Rows::Pairs: return static_cast<int64_t>(pair_src_.size());
    }
    return 0;
  }
  int64_t gathered(Rows rows, Gather g, int64_t r) const {
    if (rows == Rows::Pairs && g == Gather::Src) return pair_src_[static_cast<size_t>(r)];
    if (rows == Rows::Pairs && g == Gather::Dst) throw Error("a pair has no destination");
    if (g == Gather::Src) return g_.src[static_cast<size_t>(r)];
    if (g == Gather::Dst) return g_.dst[static_cast<size_t>(r)];
    return r;
  }
  int64_t segment(Segments s, Rows rows, int64_t r) const {
    if (s == Segments::Etype) {
      if (rows == Rows::Etypes) return r;  // rows=etypes with segments: row r is edge type r, its own W[r]
      return rows == Rows::Pairs ? pair_etype_[static_cast<size_t>(r)] : g_.etype[static_cast<size_t>(r)];
    }
    if (s == Segments::Ntype) {
      if (rows != Rows::Nodes) throw Error("node-type segments over rows other than nodes");
      return g_.ntype[static_cast<size_t>(r)];
    }
    return 0;
  }

  // ---- template instances -------------------------------------------------------------------------
  void kernel(const GemmInstance& k) {
    const TensorInfo& w = info(k.w);
    bool per_head = w.shape.size() == 3;
    int64_t n_rows = num_rows(k.rows);
    for (int64_t r = 0; r < n_rows; ++r) {
      const double* x = row(k.x, x_row(k.x, k.rows, k.gather, r));
      const double* slice = row(k.w, k.segments == Segments::None ? 0 : segment(k.segments, k.rows, r));
      double* y = row(k.y, gathered(k.rows, k.scatter, r));
      double scale = k.row_scalar.empty() ? 1.0 : row(k.row_scalar, r)[0];
      // The whole row first: a GEMM in place (gemm_in_place: y is x) reads its row before writing it.
      std::vector<double> v(static_cast<size_t>(k.heads * k.n));
      for (int64_t h = 0; h < k.heads; ++h) {
        const double* wh = slice + (per_head ? h * k.k * k.n : 0);
        for (int64_t c = 0; c < k.n; ++c) {
          double acc = 0;
          for (int64_t i = 0; i < k.k; ++i) acc += x[h * k.k + i] * (k.transpose_w ? wh[c * k.k + i] : wh[i * k.n + c]);
          v[static_cast<size_t>(h * k.n + c)] = acc * scale;
        }
      }
      for (size_t j = 0; j < v.size(); ++j) y[j] = k.scatter != Gather::None || k.accumulate ? y[j] + v[j] : v[j];
    }
  }

  void kernel(const WeightGradInstance& k) {
    int64_t n_rows = num_rows(k.rows);
    if (!k.accumulate) {  // dW = ...: every slice is overwritten, those of empty segments with zeros
      std::vector<double>& dw = t_.at(k.dw).data;
      std::fill(dw.begin(), dw.end(), 0.0);
    }
    for (int64_t r = 0; r < n_rows; ++r) {
      const double* x = row(k.x, x_row(k.x, k.rows, k.x_gather, r));
      const double* dy = row(k.dy, gathered(k.rows, k.dy_gather, r));
      double scale = k.row_scalar.empty() ? 1.0 : row(k.row_scalar, r)[0];
      double* dw = row(k.dw, k.segments == Segments::None ? 0 : segment(k.segments, k.rows, r));
      for (int64_t h = 0; h < k.heads; ++h)
        for (int64_t i = 0; i < k.k; ++i)
          for (int64_t c = 0; c < k.n; ++c) dw[(h * k.k + i) * k.n + c] += x[h * k.k + i] * dy[h * k.n + c] * scale;
    }
  }

  void kernel(const SegmentSumInstance& k) {
    int64_t n_rows = num_rows(k.rows);
    for (int64_t r = 0; r < n_rows; ++r) {
      const double* v = row(k.v, r);
      double* dw = row(k.dw, k.segments == Segments::None ? 0 : segment(k.segments, k.rows, r));
      for (int64_t j = 0; j < k.numel; ++j) dw[j] += v[j];
    }
  }

  void kernel(const GatherSumInstance& k) {
    const bool pairs = k.csr == GatherCsr::PairEdges;
    const int64_t n_rows = pairs ? static_cast<int64_t>(pair_src_.size()) : g_.num_nodes;
    std::vector<std::vector<int64_t>> members(static_cast<size_t>(n_rows));  // CSR order: ascending
    if (pairs)
      for (int64_t e = 0; e < g_.num_edges(); ++e) members[static_cast<size_t>(edge_pair_[static_cast<size_t>(e)])].push_back(e);
    else
      for (size_t q = 0; q < pair_src_.size(); ++q) members[static_cast<size_t>(pair_src_[q])].push_back(static_cast<int64_t>(q));
    for (int64_t r = 0; r < n_rows; ++r) {
      double* y = row(k.y, r);
      if (!k.accumulate) std::fill(y, y + k.numel, 0.0);
      for (int64_t i : members[static_cast<size_t>(r)]) {
        const double* x = row(k.x, k.x_gather == Gather::Dst ? g_.dst[static_cast<size_t>(i)] : i);
        const double scale = k.scale.empty() ? 1.0 : row(k.scale, i)[0];
        for (int64_t j = 0; j < k.numel; ++j) y[j] += scale * x[j];
      }
    }
  }

  // ---- PyTorch instances: the statement per row, in float64, as emit/torch_fallback.cpp's ATen calls compute it
  // over all rows at once (a node loop's inner edge loop: every edge, the loop node its destination or source).
  struct TorchRow {
    const TorchInstance* k = nullptr;
    int64_t edge = -1;  // the row's edge (edge rows), else -1
    int64_t node = -1;  // the loop node (node loops), else -1
    std::string edge_var, node_var;
  };

  void kernel(const TorchInstance& k) {
    const inter::Stmt& L = *k.loop;
    const inter::Stmt* s = L.body.front().get();
    const inter::Stmt* inner = nullptr;
    if (s->kind == inter::StmtKind::For) {
      inner = s;
      s = s->body.front().get();
    }
    bool edge_rows = inter::is_edge_loop(L.loop) || inner;
    int64_t n_rows = edge_rows ? g_.num_edges() : g_.num_nodes;
    for (int64_t r = 0; r < n_rows; ++r) {
      TorchRow row;
      row.k = &k;
      if (inter::is_edge_loop(L.loop)) {
        row.edge = r;
        row.edge_var = L.var;
      } else if (inner) {
        row.edge = r;
        row.edge_var = inner->var;
        row.node = (inner->loop == inter::LoopKind::OutgoingEdges ? g_.src : g_.dst)[static_cast<size_t>(r)];
        row.node_var = L.var;
      } else {
        row.node = r;
        row.node_var = L.var;
      }
      torch_assign(*s, row);
    }
  }

  void torch_assign(const inter::Stmt& s, const TorchRow& r) {
    inter::Value64 v = torch_expr(s.value, r);
    const inter::Expr& t = *s.target;
    std::string tensor;
    int64_t at = 0;
    if (t.kind == inter::ExprKind::Name) {
      tensor = r.k->materialized.at(t.name);
      at = info(tensor).per == inter::Per::Edge ? r.edge : r.node;
    } else {
      tensor = torch_field_tensor(*r.k, t.args[1]->name);
      at = torch_row_of(t.args[0], r);
    }
    double* out = row(tensor, at);
    int64_t n = info(tensor).row_numel(), size = static_cast<int64_t>(v.data.size());
    if (size == 0 || n % size) throw Error(fmt::format("{}: a value of {} elements into rows of {}", r.k->name, size, n));
    for (int64_t i = 0; i < n; ++i) {
      double x = v.data[static_cast<size_t>(i / (n / size))];
      switch (s.op) {
        case inter::AssignOp::Set: out[i] = x; break;
        case inter::AssignOp::Add: out[i] += x; break;
        case inter::AssignOp::Sub: out[i] -= x; break;
        case inter::AssignOp::Mul: out[i] *= x; break;
        case inter::AssignOp::Div: out[i] /= x; break;
      }
    }
  }

  static std::string torch_field_tensor(const TorchInstance& k, const std::string& f) {
    auto it = k.field_tensor.find(f);
    return it == k.field_tensor.end() ? f : it->second;
  }

  // The row `base` (an edge or node variable, e.src, e.dst) denotes.
  int64_t torch_row_of(const inter::ExprP& base, const TorchRow& r) const {
    if (base->kind == inter::ExprKind::Name) {
      if (base->name == r.edge_var) return r.edge;
      if (base->name == r.node_var) return r.node;
      throw Error(fmt::format("{}: unknown row variable {}", r.k->name, base->name));
    }
    if (base->kind == inter::ExprKind::Attr && base->name == "pair" && r.edge >= 0) return edge_pair_[static_cast<size_t>(r.edge)];
    if (base->kind == inter::ExprKind::Attr && (base->name == "src" || base->name == "dst") && r.edge >= 0)
      return (base->name == "src" ? g_.src : g_.dst)[static_cast<size_t>(r.edge)];
    throw Error(fmt::format("{}: not a row", r.k->name));
  }

  inter::Value64 tensor_row(const std::string& tensor, int64_t at) {
    const TensorInfo& ti = info(tensor);
    const double* x = row(tensor, at);
    return inter::Value64{ti.shape, std::vector<double>(x, x + ti.row_numel())};
  }

  inter::Value64 torch_expr(const inter::ExprP& e, const TorchRow& r) {
    using inter::ExprKind;
    switch (e->kind) {
      case ExprKind::Number: return inter::Value64::scalar(e->number);
      case ExprKind::String: throw Error(r.k->name + ": a string value");
      case ExprKind::Name: {
        if (auto it = r.k->materialized.find(e->name); it != r.k->materialized.end())
          return tensor_row(it->second, info(it->second).per == inter::Per::Edge ? r.edge : r.node);
        if (e->type.value) return inter::Value64::scalar(*e->type.value);  // a hyper-parameter
        if (const inter::TensorDecl* w = p_.decl.find_weight(e->name)) return tensor_row(w->name, 0);
        throw Error(r.k->name + ": unknown name " + e->name);
      }
      case ExprKind::Attr: {
        const inter::TensorDecl* in = p_.decl.find_input(e->name);
        if (!in) throw Error(r.k->name + ": unknown input " + e->name);
        return tensor_row(in->name, in->per == inter::Per::Edge ? r.edge : torch_row_of(e->args[0], r));
      }
      case ExprKind::Index: {
        const inter::ExprP& base = e->args[0];
        if (base->kind == ExprKind::Name && p_.decl.find_weight(base->name)) {
          const inter::ExprP& sel = e->args[1];  // e.etype or n.ntype
          int64_t type = sel->name == "etype" ? g_.etype[static_cast<size_t>(r.edge)]
                                              : g_.ntype[static_cast<size_t>(torch_row_of(sel->args[0], r))];
          return tensor_row(base->name, type);
        }
        return tensor_row(torch_field_tensor(*r.k, e->args[1]->name), torch_row_of(base, r));
      }
      case ExprKind::Neg:
      case ExprKind::Binary:
      case ExprKind::Call: {
        std::vector<inter::Value64> args;
        for (const inter::ExprP& a : e->args) args.push_back(torch_expr(a, r));
        return inter::op_info(e->fn).eval(args, e->type);
      }
    }
    throw Error(r.k->name + ": unknown expression");
  }

  // ---- traversal instances --------------------------------------------------------------------------
  struct Env {
    std::map<std::string, std::vector<double>> regs;
    std::map<std::string, int64_t> ints;
  };

  void kernel(const TraversalInstance& t) {
    int64_t n_rows = t.rows == inter::LoopKind::Edges      ? g_.num_edges()
                     : t.rows == inter::LoopKind::SrcPairs ? static_cast<int64_t>(pair_src_.size())
                                                           : g_.num_nodes;
    for (int64_t r = 0; r < n_rows; ++r) {
      Env env;
      env.ints[t.row] = r;
      block(t.body, env);
    }
  }

  int64_t integer(const Env& env, const std::string& n) const {
    if (n == "0") return 0;
    auto it = env.ints.find(n);
    if (it == env.ints.end()) throw Error("unknown row " + n);
    return it->second;
  }

  void block(const std::vector<Instr>& body, Env& env) {
    for (const Instr& in : body) {
      if (auto* x = std::get_if<IndexDef>(&in.v)) {
        auto e = static_cast<size_t>(integer(env, x->of));
        switch (x->array) {
          case GraphArray::Src:
          case GraphArray::InSrc: env.ints[x->name] = g_.src[e]; break;  // a CSR position is its edge here
          case GraphArray::Dst:
          case GraphArray::OutDst: env.ints[x->name] = g_.dst[e]; break;
          case GraphArray::Etype:
          case GraphArray::InEtype:
          case GraphArray::OutEtype: env.ints[x->name] = g_.etype[e]; break;
          case GraphArray::Ntype: env.ints[x->name] = g_.ntype[e]; break;
          case GraphArray::PairSrc: env.ints[x->name] = pair_src_[e]; break;
          case GraphArray::PairEtype: env.ints[x->name] = pair_etype_[e]; break;
          case GraphArray::EdgePair:
          case GraphArray::InPair: env.ints[x->name] = edge_pair_[e]; break;
        }
      } else if (auto* d = std::get_if<Def>(&in.v)) {
        env.regs[d->name] = source(*d, env);
      } else if (auto* u = std::get_if<Update>(&in.v)) {
        std::vector<double>& r = env.regs.at(u->name);
        auto n = static_cast<int64_t>(r.size());
        std::vector<double> v(r.size());
        for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(u->value, env, i, n);
        for (size_t i = 0; i < r.size(); ++i) {
          switch (u->op) {
            case inter::AssignOp::Set: r[i] = v[i]; break;
            case inter::AssignOp::Add: r[i] += v[i]; break;
            case inter::AssignOp::Sub: r[i] -= v[i]; break;
            case inter::AssignOp::Mul: r[i] *= v[i]; break;
            case inter::AssignOp::Div: r[i] /= v[i]; break;
          }
        }
      } else if (auto* s = std::get_if<Store>(&in.v)) {
        const std::vector<double>& r = env.regs.at(s->reg);
        double* out = row(s->tensor, integer(env, s->row));
        for (size_t i = 0; i < r.size(); ++i) out[i] = s->atomic ? out[i] + r[i] : r[i];
      } else if (auto* l = std::get_if<EdgeLoop>(&in.v)) {
        bool incoming = l->kind == inter::LoopKind::IncomingEdges;
        int64_t node = integer(env, l->node);
        for (int64_t e = 0; e < g_.num_edges(); ++e) {
          if ((incoming ? g_.dst : g_.src)[static_cast<size_t>(e)] != node) continue;
          Env inner = env;
          inner.ints[l->pos] = e;
          inner.ints[l->var] = e;
          block(l->body, inner);
          for (auto& [name, v] : env.regs) v = inner.regs.at(name);  // updates of outer registers
        }
      }
    }
  }

  std::vector<double> source(const Def& d, const Env& env) {
    auto n = d.type.numel();
    std::vector<double> out(static_cast<size_t>(n));
    if (auto* l = std::get_if<Load>(&d.source)) {
      const double* r = row(l->tensor, integer(env, l->row));
      out.assign(r, r + n);
    } else if (auto* e = std::get_if<Eval>(&d.source)) {
      for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = value(e->value, env, i, n);
    } else {
      const Reduce& r = std::get<Reduce>(d.source);
      for (int64_t m = 0; m < n; ++m) {
        double acc = r.op == ReduceOp::Sum ? 0.0 : -HUGE_VAL;
        for (int64_t k = 0; k < r.axis; ++k) {
          double v = value(r.value, env, m * r.axis + k, n * r.axis);
          acc = r.op == ReduceOp::Sum ? acc + v : std::max(acc, v);
        }
        out[static_cast<size_t>(m)] = acc;
      }
    }
    return out;
  }

  // Element i of `v` in an instruction over n elements (operands broadcast by prefix).
  double value(const ValueP& v, const Env& env, int64_t i, int64_t n) const {
    switch (v->kind) {
      case Value::Kind::Const: return v->number;
      case Value::Kind::Reg: {
        const std::vector<double>& r = env.regs.at(v->reg);
        auto size = static_cast<int64_t>(r.size());
        return r[static_cast<size_t>(i / (n / size))];
      }
      case Value::Kind::Op: break;
    }
    std::vector<double> args;
    for (const ValueP& a : v->args) args.push_back(value(a, env, i, n));
    return evaluate(v->op, args);
  }

  const Program& p_;
  const inter::HeteroGraph& g_;
  inter::TensorMap& t_;
  std::vector<int64_t> pair_src_, edge_pair_;  // each pair's source, each edge's pair
  std::vector<int> pair_etype_;
};

}  // namespace

std::string interpret(const Program& p, const inter::HeteroGraph& g, inter::TensorMap& tensors) {
  try {
    Interpreter(p, g, tensors).run();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace hectorgen::intra
