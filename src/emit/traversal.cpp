// Emission of traversal instances: one warp per row (edge or node), vectors of 32 or more elements spread
// over the lanes, smaller ones replicated; dot/sum as warp reductions; node fields of a node-centric loop
// kept in registers for the whole iteration (partial aggregation without atomics).
#include "emit/traversal.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>

#include "emit/emit.h"
#include "emit/names.h"
#include "emit/printer.h"
#include "ir/inter/printer.h"
#include "ir/inter/verifier.h"

namespace hectorgen::emit {

using namespace inter;
using intra::Program;
using intra::TensorInfo;
using intra::TraversalInstance;

std::string float_literal(double v) {
  std::string s = fmt::format("{}", static_cast<float>(v));
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s + "f";
}

namespace {

// A value in registers. Vectors of 32 or more elements are distributed over the warp's lanes (lane l
// holds elements l, l + 32, ...); smaller ones are replicated in every lane. Constants are literals.
struct CVal {
  std::string var;      // C array name, or empty for a literal
  std::string literal;  // when var is empty
  std::vector<int64_t> shape;
  bool fresh = true;  // a temporary nobody else refers to (may be adopted without a copy)
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  bool dist() const { return numel() >= 32; }
  int64_t slots() const { return dist() ? (numel() + 31) / 32 : numel(); }
};

class TraversalEmitter {
 public:
  TraversalEmitter(const Program& p, const TraversalInstance& t, const std::set<std::string>& written_before)
      : p_(p), t_(t), written_before_(written_before) {
    // The kernel's own temporaries (v0, f_att, e_src, i_e) avoid its parameters and loop variables.
    for (const TensorInfo& x : p_.tensors) names_.take(x.name);
    std::function<void(const StmtP&)> loops = [&](const StmtP& s) {
      if (s->kind != StmtKind::For) return;
      names_.take(s->var);
      for (const StmtP& b : s->body) loops(b);
    };
    loops(t_.loop);
  }

  using Result = TraversalCode;

  Result run() {
    const Stmt& L = *t_.loop;
    node_loop_ = !is_edge_loop(L.loop);
    CodeWriter body;
    w_ = &body;
    {
      CodeWriter::Indent i1(body);
      CodeWriter::Indent i2(body);
      if (node_loop_) node_loop(L);
      else edge_loop(L);
    }
    // Signature: graph arrays, then tensors, in a fixed order.
    std::vector<std::string> params, args;
    params.push_back("int64_t num_rows");
    args.push_back(node_loop_ ? "a.num_nodes" : "a.num_edges");
    for (const std::string& g : graph_arrays(p_))
      if (graph_used_.count(g)) {
        params.push_back(fmt::format("const int32_t* __restrict__ {}", g));
        args.push_back("a." + g);
      }
    for (const TensorInfo& t : p_.tensors) {
      if (!tensors_used_.count(t.name)) continue;
      bool written = tensors_written_.count(t.name) > 0;
      params.push_back(fmt::format("{}float* __restrict__ {}", written ? "" : "const ", t.name));
      args.push_back("a." + t.name);
    }
    Result r;
    r.uses_warp_sum = uses_warp_sum_;
    r.written = tensors_written_;
    CodeWriter k;
    k.line(fmt::format("// {}: traversal instance, one warp per {}", t_.name, node_loop_ ? "node" : "edge"));
    k.block(print_stmt(t_.loop, "//   "));
    k.line(fmt::format("__global__ void __launch_bounds__({}) {}(", t_.threads, t_.name));
    for (size_t i = 0; i < params.size(); ++i)
      k.line(fmt::format("    {}{}", params[i], i + 1 < params.size() ? "," : ") {"));
    k.line("  const int lane = threadIdx.x & 31;");
    k.line("  const int64_t first_row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;");
    k.line("  const int64_t row_stride = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;");
    k.line(fmt::format("  for (int64_t {} = first_row; {} < num_rows; {} += row_stride) {{", L.var, L.var, L.var));
    r.kernel = k.str() + body.str() + "  }\n}\n";
    std::string arglist;
    for (size_t i = 0; i < args.size(); ++i) arglist += (i ? ", " : "") + args[i];
    int warps = t_.threads / 32;
    r.launcher = fmt::format(
        "  if ({rows} > 0) {{  // {name}\n"
        "    const unsigned blocks = static_cast<unsigned>(({rows} + {warps} - 1) / {warps});\n"
        "    {name}<<<blocks, {threads}, 0, stream>>>({args});\n"
        "    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;\n"
        "  }}\n",
        fmt::arg("rows", node_loop_ ? "a.num_nodes" : "a.num_edges"), fmt::arg("name", t_.name),
        fmt::arg("warps", warps), fmt::arg("threads", t_.threads), fmt::arg("args", arglist));
    return r;
  }

 private:
  // ---- loop structure ---------------------------------------------------------------------------
  void edge_loop(const Stmt& L) {
    edge_vars_.push_back(L.var);
    endpoints(L.var, "src[" + L.var + "]", "dst[" + L.var + "]", &L);
    scopes_.emplace_back();
    for (const StmtP& s : L.body) stmt(*s);
    scopes_.pop_back();
    edge_regs_.clear();
    edge_vars_.pop_back();
  }

  void node_loop(const Stmt& L) {
    node_var_ = L.var;
    if (mentions_attr(L, L.var, "ntype")) {
      graph_used_.insert("ntype");
      line(fmt::format("const int {} = ntype[{}];", endpoint(L.var, "ntype"), L.var));
    }
    // Node fields of this node written here live in registers for the whole iteration (partial
    // aggregation without atomics); they are stored once at the end.
    std::vector<std::string> order;
    collect_node_writes(L.body, order);
    scopes_.emplace_back();
    for (const std::string& f : order) {
      const TensorInfo& t = tensor(field_tensor(f));
      CVal v = declare(t.shape, "f_" + f);
      v.fresh = false;
      node_regs_[f] = v;
      if (first_access_is_set(L.body, f) == 1) continue;
      if (written_before_.count(t.name) || t.zero_init) load_row(v, t.name, L.var);
      else fill(v, "0.f");
    }
    for (const StmtP& s : L.body) stmt(*s);
    for (const std::string& f : order) store_row(node_regs_.at(f), field_tensor(f), L.var, false);
    scopes_.pop_back();
  }

  void inner_loop(const Stmt& s) {
    bool incoming = s.loop == LoopKind::IncomingEdges;
    std::string ptr = incoming ? "in_ptr" : "out_ptr", eid = incoming ? "in_eid" : "out_eid",
                other = incoming ? "in_src" : "out_dst";
    graph_used_.insert(ptr);
    graph_used_.insert(eid);
    std::string i = endpoint(s.var, "index");  // i_e: one per edge variable (its loops are siblings)
    line(fmt::format("for (int32_t {i} = {p}[{n}]; {i} < {p}[{n} + 1]; ++{i}) {{", fmt::arg("i", i), fmt::arg("p", ptr),
                     fmt::arg("n", s.parent)));
    {
      CodeWriter::Indent in(*w_);
      line(fmt::format("const int64_t {} = {}[{}];", s.var, eid, i));
      edge_vars_.push_back(s.var);
      std::string other_idx = fmt::format("{}[{}]", other, i);
      if (incoming) endpoints(s.var, other_idx, s.parent, &s, other);
      else endpoints(s.var, s.parent, other_idx, &s, other);
      scopes_.emplace_back();
      for (const StmtP& b : s.body) stmt(*b);
      scopes_.pop_back();
      edge_regs_.clear();
      edge_vars_.pop_back();
    }
    line("}");
  }

  // Declares e_src / e_dst / e_etype for an edge variable when the body uses them.
  void endpoints(const std::string& e, const std::string& src, const std::string& dst, const Stmt* loop,
                 const std::string& csr_other = "") {
    auto need = [&](const char* a) { return mentions_attr(*loop, e, a); };
    auto declare_node = [&](const char* which, const std::string& expr) {
      if (expr == node_var_) return;  // the loop node itself: row_expr() names it directly
      {
        std::string arr = expr.substr(0, expr.find('['));
        graph_used_.insert(arr == csr_other ? csr_other : arr);
      }
      line(fmt::format("const int64_t {} = {};", endpoint(e, which), expr));
    };
    if (need("src")) declare_node("src", src);
    if (need("dst")) declare_node("dst", dst);
    if (need("etype")) {
      graph_used_.insert("etype");
      line(fmt::format("const int {} = etype[{}];", endpoint(e, "etype"), e));
    }
  }

  static bool mentions_attr(const Stmt& s, const std::string& var, const char* attr) {
    std::function<bool(const ExprP&)> in_expr = [&](const ExprP& e) -> bool {
      if (e->kind == ExprKind::Attr && e->name == attr && e->args[0]->kind == ExprKind::Name && e->args[0]->name == var)
        return true;
      if (e->kind == ExprKind::Attr && (e->name == "src" || e->name == "dst") && std::string(attr) != "etype" &&
          e->args[0]->kind == ExprKind::Name && e->args[0]->name == var && std::string(attr) == e->name)
        return true;
      for (const ExprP& a : e->args)
        if (in_expr(a)) return true;
      return false;
    };
    for (const StmtP& b : s.body) {
      if (b->target && in_expr(b->target)) return true;
      if (b->value && in_expr(b->value)) return true;
      if (b->kind == StmtKind::For && mentions_attr(*b, var, attr)) return true;
    }
    return false;
  }

  void collect_node_writes(const std::vector<StmtP>& body, std::vector<std::string>& order) {
    for (const StmtP& s : body) {
      if (s->kind == StmtKind::For) {
        collect_node_writes(s->body, order);
        continue;
      }
      if (auto f = loop_node_field(s->target); f && std::find(order.begin(), order.end(), *f) == order.end())
        order.push_back(*f);
    }
  }

  // 1: first access of node field f (of the loop node) is a plain assignment; 0 otherwise; -1 none.
  int first_access_is_set(const std::vector<StmtP>& body, const std::string& f) {
    for (const StmtP& s : body) {
      if (s->kind == StmtKind::For) {
        int r = first_access_is_set(s->body, f);
        if (r >= 0) return r;
        continue;
      }
      if (reads_node_field(s->value, f)) return 0;
      if (auto t = loop_node_field(s->target); t && *t == f) return s->op == AssignOp::Set ? 1 : 0;
    }
    return -1;
  }

  bool reads_node_field(const ExprP& e, const std::string& f) {
    if (auto t = loop_node_field(e); t && *t == f) return true;
    for (const ExprP& a : e->args)
      if (reads_node_field(a, f)) return true;
    return false;
  }

  // n["f"] of the loop node, or e.dst["f"] / e.src["f"] naming it inside an incoming/outgoing loop.
  std::optional<std::string> loop_node_field(const ExprP& e) const {
    if (!node_loop_ || e->kind != ExprKind::Index || e->args[1]->kind != ExprKind::String) return std::nullopt;
    const ExprP& b = e->args[0];
    if (b->kind == ExprKind::Name && b->name == node_var_) return e->args[1]->name;
    if (b->kind == ExprKind::Attr && b->args[0]->kind == ExprKind::Name) {
      const Stmt* inner = inner_loop_of(b->args[0]->name);
      if (inner && ((inner->loop == LoopKind::IncomingEdges && b->name == "dst") ||
                    (inner->loop == LoopKind::OutgoingEdges && b->name == "src")))
        return e->args[1]->name;
    }
    return std::nullopt;
  }
  const Stmt* inner_loop_of(const std::string& var) const {
    for (const StmtP& s : t_.loop->body)
      if (s->kind == StmtKind::For && s->var == var) return s.get();
    return nullptr;
  }

  // ---- statements -------------------------------------------------------------------------------
  void stmt(const Stmt& s) {
    if (s.kind == StmtKind::For) return inner_loop(s);
    if (s.kind != StmtKind::Assign) throw std::logic_error("traversal: unexpected statement");
    line(fmt::format("// {} {} {}", print_expr(s.target), to_string(s.op), print_expr(s.value)));
    CVal value = expr(s.value);
    const Expr& t = *s.target;
    if (t.kind == ExprKind::Name) {
      if (s.op == AssignOp::Set) {
        CVal v = value.fresh && !value.var.empty() ? value : copy(value, value.shape);
        v.fresh = false;
        scopes_.back()[t.name] = v;
        if (auto it = t_.materialized.find(t.name); it != t_.materialized.end())
          store_row(v, it->second, row_of(tensor(it->second)), false);
        return;
      }
      CVal* cur = find_local(t.name);
      if (!cur) throw std::logic_error("traversal: update of unknown local " + t.name);
      update(*cur, value, s.op);
      return;
    }
    const std::string field = t.args[1]->name;
    if (auto f = loop_node_field(s.target)) {
      CVal& reg = node_regs_.at(*f);
      if (s.op == AssignOp::Set) assign_into(reg, value);
      else update(reg, value, s.op);
      return;
    }
    const ExprP& base = t.args[0];
    std::string tn = field_tensor(field);
    const TensorInfo& ti = tensor(tn);
    if (base->kind == ExprKind::Name && is_edge_var(base->name)) {
      // Edge field of the current edge: kept in a register for later reads in this iteration, stored now.
      auto it = edge_regs_.find(field);
      if (it == edge_regs_.end()) {
        CVal v = declare(ti.shape);
        v.fresh = false;
        if (s.op != AssignOp::Set) {
          // Accumulate onto what earlier kernels, or earlier loops of this kernel, stored.
          if (written_before_.count(tn) || tensors_written_.count(tn) || ti.zero_init) load_row(v, tn, base->name);
          else fill(v, "0.f");
        }
        it = edge_regs_.emplace(field, v).first;
      }
      if (s.op == AssignOp::Set) assign_into(it->second, value);
      else update(it->second, value, s.op);
      store_row(it->second, tn, base->name, false);
      return;
    }
    // e.src["f"] += v / e.dst["f"] += v: scatter into another node's row.
    std::string row = endpoint(base->args[0]->name, base->name);
    CVal v = value.shape == ti.shape ? value : copy(value, ti.shape);
    if (s.op == AssignOp::Sub) v = unary(v, [](const std::string& x) { return "-" + x; });
    store_row(v, tn, row, true);
  }

  void update(CVal& cur, const CVal& v, AssignOp op) {
    const char* o = op == AssignOp::Add ? "+=" : op == AssignOp::Sub ? "-=" : op == AssignOp::Mul ? "*=" : "/=";
    loop_over(cur, [&](const std::string& j) { return fmt::format("{}[{}] {} {};", cur.var, j, o, elem(v, cur, j)); });
  }

  void assign_into(CVal& cur, const CVal& v) {
    loop_over(cur, [&](const std::string& j) { return fmt::format("{}[{}] = {};", cur.var, j, elem(v, cur, j)); });
  }

  // ---- expressions ------------------------------------------------------------------------------
  CVal expr(const ExprP& e) {
    switch (e->kind) {
      case ExprKind::Number: return literal(float_literal(e->number));
      case ExprKind::String: throw std::logic_error("traversal: string value");
      case ExprKind::Name: {
        if (CVal* v = find_local(e->name)) return *v;
        if (auto it = t_.materialized.find(e->name); it != t_.materialized.end()) {
          const TensorInfo& ti = tensor(it->second);
          CVal v = declare(ti.shape);
          load_row(v, ti.name, row_of(ti));
          return v;
        }
        if (const HyperParam* h = p_.decl.find_hyper(e->name)) return literal(float_literal(h->value));
        if (const TensorDecl* w = p_.decl.find_weight(e->name); w && w->per == Per::None) {
          CVal v = declare(w->shape);  // a shared weight used element-wise (no linear transform)
          load_row(v, w->name, "0");
          return v;
        }
        throw std::logic_error("traversal: unknown name " + e->name);
      }
      case ExprKind::Attr: {
        const TensorDecl* in = p_.decl.find_input(e->name);
        if (!in) throw std::logic_error("traversal: unknown attribute " + e->name);
        CVal v = declare(in->shape);
        load_row(v, in->name, row_expr(e->args[0]));
        return v;
      }
      case ExprKind::Index: {
        const ExprP& base = e->args[0];
        if (base->kind == ExprKind::Name && p_.decl.find_weight(base->name)) {
          const TensorDecl* wd = p_.decl.find_weight(base->name);
          const ExprP& sel = e->args[1];  // X.etype / X.ntype
          std::string type_var = sel->args[0]->kind == ExprKind::Name ? endpoint(sel->args[0]->name, sel->name) : "";
          if (sel->args[0]->kind == ExprKind::Attr) {  // e.src.ntype: look the node's type up
            graph_used_.insert("ntype");
            type_var = "ntype[" + row_expr(sel->args[0]) + "]";
          } else if (sel->name == "ntype" && node_loop_ && sel->args[0]->name == node_var_) {
            type_var = endpoint(node_var_, "ntype");
          }
          CVal v = declare(wd->shape);
          load_row(v, wd->name, type_var);
          return v;
        }
        const std::string& field = e->args[1]->name;
        if (auto f = loop_node_field(e)) {
          if (auto it = node_regs_.find(*f); it != node_regs_.end()) return it->second;
        }
        if (base->kind == ExprKind::Name && is_edge_var(base->name)) {
          if (auto it = edge_regs_.find(field); it != edge_regs_.end()) return it->second;
        }
        const TensorInfo& ti = tensor(field_tensor(field));
        CVal v = declare(ti.shape);
        load_row(v, ti.name, row_expr(base));
        return v;
      }
      case ExprKind::Neg: return unary(expr(e->args[0]), [](const std::string& x) { return "-" + x; });
      case ExprKind::Binary: {
        CVal a = expr(e->args[0]), b = expr(e->args[1]);
        const char* op = to_string(e->op);
        return binary(a, b, [op](const std::string& x, const std::string& y) { return fmt::format("{} {} {}", x, op, y); });
      }
      case ExprKind::Call: return call(e);
    }
    throw std::logic_error("traversal: unknown expression");
  }

  CVal call(const ExprP& e) {
    const std::string& f = e->name;
    if (f == "reshape") {
      CVal x = expr(e->args[0]);
      std::vector<int64_t> shape;
      for (size_t i = 1; i < e->args.size(); ++i) {
        const ExprP& d = e->args[i];
        double v = d->kind == ExprKind::Number ? d->number : p_.decl.find_hyper(d->name) ? p_.decl.find_hyper(d->name)->value : constant(d);
        shape.push_back(static_cast<int64_t>(v));
      }
      x.shape = shape;  // same elements, same layout (the layout depends on the element count only)
      return x;
    }
    if (f == "exp") return unary(expr(e->args[0]), [](const std::string& x) { return "expf(" + x + ")"; });
    if (f == "sqrt") return unary(expr(e->args[0]), [](const std::string& x) { return "sqrtf(" + x + ")"; });
    if (f == "tanh") return unary(expr(e->args[0]), [](const std::string& x) { return "tanhf(" + x + ")"; });
    if (f == "relu") return unary(expr(e->args[0]), [](const std::string& x) { return "fmaxf(" + x + ", 0.f)"; });
    if (f == "sigmoid")
      return unary(expr(e->args[0]), [](const std::string& x) { return "1.f / (1.f + expf(-" + x + "))"; });
    if (f == "leakyrelu") {
      std::string slope = e->args.size() > 1 ? float_literal(constant(e->args[1])) : "0.01f";
      CVal x = expr(e->args[0]);
      CVal out = declare(x.shape);
      loop_over(out, [&](const std::string& j) {
        std::string v = elem(x, out, j);
        return fmt::format("{}[{}] = {} > 0.f ? {} : {} * {};", out.var, j, v, v, slope, v);
      });
      return out;
    }
    if (f == "dot") return dot(expr(e->args[0]), expr(e->args[1]), e);
    if (f == "sum") return dot(expr(e->args[0]), literal("1.f"), e);
    if (f == "max")
      return binary(expr(e->args[0]), expr(e->args[1]), [](const std::string& x, const std::string& y) { return "fmaxf(" + x + ", " + y + ")"; });
    if (f == "max_grad")
      return binary(expr(e->args[0]), expr(e->args[1]),
                    [](const std::string& x, const std::string& y) { return "(" + x + " >= " + y + " ? 1.f : 0.f)"; });
    if (f == "leakyrelu_grad") {
      std::string slope = e->args.size() > 1 ? float_literal(constant(e->args[1])) : "0.01f";
      return unary(expr(e->args[0]), [slope](const std::string& x) { return "(" + x + " > 0.f ? 1.f : " + slope + ")"; });
    }
    throw std::runtime_error(fmt::format("the code generator does not support '{}' inside a traversal yet", f));
  }

  double constant(const ExprP& e) {
    if (e->kind == ExprKind::Number) return e->number;
    if (e->kind == ExprKind::Name && p_.decl.find_hyper(e->name)) return p_.decl.find_hyper(e->name)->value;
    if (e->kind == ExprKind::Neg) return -constant(e->args[0]);
    if (e->kind == ExprKind::Call && e->name == "sqrt") return std::sqrt(constant(e->args[0]));
    if (e->kind == ExprKind::Binary) {
      double a = constant(e->args[0]), b = constant(e->args[1]);
      switch (e->op) {
        case BinOp::Add: return a + b;
        case BinOp::Sub: return a - b;
        case BinOp::Mul: return a * b;
        case BinOp::Div: return a / b;
      }
    }
    throw std::logic_error("traversal: not a constant");
  }

  // Reduces the last axis of a * b (b may be a literal, for sum()).
  CVal dot(const CVal& a, const CVal& b, const ExprP& e) {
    int64_t d = a.shape.back();
    std::vector<int64_t> shape(a.shape.begin(), a.shape.end() - 1);
    CVal out = declare(shape);
    if (out.dist()) return dot_distributed(a, b, out, d);
    if (!a.dist()) {
      line(fmt::format("for (int m = 0; m < {}; ++m) {{", out.numel()));
      line(fmt::format("  {}[m] = 0.f;", out.var));
      line(fmt::format("  for (int k = 0; k < {}; ++k) {}[m] += {} * {};", d, out.var, elem_at(a, "m * " + std::to_string(d) + " + k"),
                       elem_at(b, "m * " + std::to_string(d) + " + k")));
      line("}");
      return out;
    }
    (void)e;
    uses_warp_sum_ = true;
    int64_t n = a.numel();
    line("#pragma unroll");
    line(fmt::format("for (int m = 0; m < {}; ++m) {{  // one warp-wide sum per output element", out.numel()));
    line("  float partial = 0.f;");
    line("#pragma unroll");
    line(fmt::format("  for (int j = 0; j < {}; ++j) {{", a.slots()));
    line("    const int idx = lane + 32 * j;");
    line(fmt::format("    if ({}idx / {} == m) partial += {} * {};", n % 32 ? fmt::format("idx < {} && ", n) : "", d,
                     elem(a, a, "j"), elem(b, a, "j")));
    line("  }");
    line(fmt::format("  {}[m] = warp_sum(partial);", out.var));
    line("}");
    return out;
  }

  // dot() with 32 or more outputs: the output is distributed too (output m in slot m / 32 of lane m % 32).
  // Output m reduces input elements [m * d, (m + 1) * d), which lie in slots m * d / 32 .. ((m + 1) * d - 1) / 32.
  CVal dot_distributed(const CVal& a, const CVal& b, const CVal& out, int64_t d) {
    if (d == 1) {  // nothing to reduce: the same layout, element by element
      loop_over(out, [&](const std::string& j) { return fmt::format("{}[{}] = {} * {};", out.var, j, elem(a, out, j), elem(b, out, j)); });
      return out;
    }
    uses_warp_sum_ = true;
    fill(out, "0.f");
    line("#pragma unroll");
    line(fmt::format("for (int m = 0; m < {}; ++m) {{  // one warp-wide sum per output element, kept by lane m % 32", out.numel()));
    line("  float partial = 0.f;");
    line("#pragma unroll");
    line(fmt::format("  for (int j = m * {} / 32; j <= (m * {} + {}) / 32; ++j) {{", d, d, d - 1));
    line(fmt::format("    if ((lane + 32 * j) / {} == m) partial += {} * {};", d, elem(a, a, "j"), elem(b, a, "j")));
    line("  }");
    line("  const float total = warp_sum(partial);");
    line(fmt::format("  if (lane == m % 32) {}[m / 32] = total;", out.var));
    line("}");
    return out;
  }

  CVal unary(const CVal& x, const std::function<std::string(const std::string&)>& f) {
    if (x.var.empty()) return literal("(" + f(x.literal) + ")", x.shape);
    CVal out = declare(x.shape);
    loop_over(out, [&](const std::string& j) { return fmt::format("{}[{}] = {};", out.var, j, f(elem(x, out, j))); });
    return out;
  }

  CVal binary(const CVal& a, const CVal& b, const std::function<std::string(const std::string&, const std::string&)>& f) {
    std::vector<int64_t> shape = a.numel() >= b.numel() ? a.shape : b.shape;
    if (a.var.empty() && b.var.empty()) return literal("(" + f(a.literal, b.literal) + ")", shape);
    CVal out = declare(shape);
    loop_over(out, [&](const std::string& j) {
      return fmt::format("{}[{}] = {};", out.var, j, f(elem(a, out, j), elem(b, out, j)));
    });
    return out;
  }

  CVal copy(const CVal& v, const std::vector<int64_t>& shape) {
    CVal out = declare(shape);
    loop_over(out, [&](const std::string& j) { return fmt::format("{}[{}] = {};", out.var, j, elem(v, out, j)); });
    return out;
  }

  void fill(const CVal& v, const std::string& value) {
    loop_over(v, [&](const std::string& j) { return fmt::format("{}[{}] = {};", v.var, j, value); });
  }

  // Element j (slot index in `target`'s layout) of `v`, broadcast by prefix to target's shape.
  std::string elem(const CVal& v, const CVal& target, const std::string& j) {
    if (v.var.empty()) return v.literal;
    int64_t inner = target.numel() / v.numel();
    if (v.numel() == target.numel()) return fmt::format("{}[{}]", v.var, j);
    if (v.numel() == 1) return v.var + "[0]";
    std::string flat = target.dist() ? fmt::format("(lane + 32 * {})", j) : j;
    if (target.dist() && inner % 32 == 0) flat = fmt::format("(32 * {})", j);
    std::string idx = fmt::format("{} / {}", flat, inner);
    if (!v.dist()) return fmt::format("{}[{}]", v.var, idx);
    return fmt::format("__shfl_sync(0xffffffffu, {}[({}) / 32], ({}) % 32)", v.var, idx, idx);
  }

  // Element at flat index `flat` of a replicated value.
  std::string elem_at(const CVal& v, const std::string& flat) {
    if (v.var.empty()) return v.literal;
    if (v.numel() == 1) return v.var + "[0]";
    return fmt::format("{}[{}]", v.var, flat);
  }

  void loop_over(const CVal& v, const std::function<std::string(const std::string&)>& body) {
    if (v.slots() == 1) {
      line(body("0"));
      return;
    }
    line("#pragma unroll");
    line(fmt::format("for (int j = 0; j < {}; ++j) {}", v.slots(), body("j")));
  }

  CVal declare(const std::vector<int64_t>& shape, const std::string& name = "") {
    CVal v;
    v.shape = shape;
    v.var = names_.fresh(name.empty() ? fmt::format("v{}", next_++) : name);
    line(fmt::format("float {}[{}];", v.var, v.slots()));
    return v;
  }
  static CVal literal(const std::string& text, std::vector<int64_t> shape = {}) {
    CVal v;
    v.literal = text;
    v.shape = std::move(shape);
    return v;
  }

  // ---- memory -------------------------------------------------------------------------------------
  void load_row(const CVal& v, const std::string& tensor_name, const std::string& row) {
    tensors_used_.insert(tensor_name);
    int64_t n = v.numel();
    std::string base = n == 1 ? fmt::format("{}[{}]", tensor_name, row) : fmt::format("{}[{} * {} + ", tensor_name, row, n);
    if (n == 1) {
      line(fmt::format("{}[0] = {};", v.var, base));
    } else if (!v.dist()) {
      line(fmt::format("for (int k = 0; k < {}; ++k) {}[k] = {}k];", n, v.var, base));
    } else {
      line("#pragma unroll");
      if (n % 32 == 0)
        line(fmt::format("for (int j = 0; j < {}; ++j) {}[j] = {}lane + 32 * j];", v.slots(), v.var, base));
      else
        line(fmt::format("for (int j = 0; j < {}; ++j) {}[j] = lane + 32 * j < {} ? {}lane + 32 * j] : 0.f;", v.slots(),
                         v.var, n, base));
    }
  }

  void store_row(const CVal& v0, const std::string& tensor_name, const std::string& row, bool atomic) {
    tensors_used_.insert(tensor_name);
    tensors_written_.insert(tensor_name);
    const TensorInfo& ti = tensor(tensor_name);
    CVal v = v0;
    if (v.var.empty() || v.numel() != ti.row_numel()) v = copy(v0, ti.shape);
    int64_t n = v.numel();
    auto put = [&](const std::string& idx, const std::string& val) {
      std::string addr = n == 1 ? fmt::format("{}[{}]", tensor_name, row) : fmt::format("{}[{} * {} + {}]", tensor_name, row, n, idx);
      return atomic ? fmt::format("atomicAdd(&{}, {});", addr, val) : fmt::format("{} = {};", addr, val);
    };
    if (!v.dist()) {
      if (n == 1) line(fmt::format("if (lane == 0) {}", put("0", v.var + "[0]")));
      else line(fmt::format("if (lane == 0) for (int k = 0; k < {}; ++k) {}", n, put("k", v.var + "[k]")));
      return;
    }
    line("#pragma unroll");
    std::string guard = n % 32 ? fmt::format("if (lane + 32 * j < {}) ", n) : "";
    line(fmt::format("for (int j = 0; j < {}; ++j) {}{}", v.slots(), guard, put("lane + 32 * j", v.var + "[j]")));
  }

  // The row index variable for a node/edge reference expression.
  std::string row_expr(const ExprP& base) {
    if (base->kind == ExprKind::Name) return base->name;  // loop variable (edge or node)
    // e.src / e.dst
    const std::string& e = base->args[0]->name;
    if (const Stmt* inner = node_loop_ ? inner_loop_of(e) : nullptr) {
      if ((inner->loop == LoopKind::IncomingEdges && base->name == "dst") ||
          (inner->loop == LoopKind::OutgoingEdges && base->name == "src"))
        return node_var_;
    }
    return endpoint(e, base->name);
  }

  // The variable holding an edge's endpoint or type, or a node's type (e_src, e_etype, n_ntype), or the
  // CSR position of an inner loop's edge (i_e).
  const std::string& endpoint(const std::string& var, const std::string& which) {
    auto key = std::make_pair(var, which);
    auto it = endpoints_.find(key);
    if (it == endpoints_.end())
      it = endpoints_.emplace(key, names_.fresh(which == "index" ? "i_" + var : var + "_" + which)).first;
    return it->second;
  }

  std::string row_of(const TensorInfo& t) {
    if (t.per == Per::Node) return node_loop_ ? node_var_ : endpoint(edge_vars_.back(), "src");
    return edge_vars_.back();
  }

  bool is_edge_var(const std::string& n) const { return std::find(edge_vars_.begin(), edge_vars_.end(), n) != edge_vars_.end(); }
  CVal* find_local(const std::string& n) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(n); f != it->end()) return &f->second;
    return nullptr;
  }
  std::string field_tensor(const std::string& f) const {
    auto it = t_.field_tensor.find(f);
    return it == t_.field_tensor.end() ? f : it->second;
  }
  const TensorInfo& tensor(const std::string& n) const {
    const TensorInfo* t = p_.find(n);
    if (!t) throw std::logic_error("traversal: unknown tensor " + n);
    return *t;
  }
  void line(const std::string& s) { w_->line(s); }

  const Program& p_;
  const TraversalInstance& t_;
  const std::set<std::string>& written_before_;
  CodeWriter* w_ = nullptr;
  bool node_loop_ = false;
  std::string node_var_;
  std::vector<std::string> edge_vars_;
  std::vector<std::map<std::string, CVal>> scopes_;
  std::map<std::string, CVal> node_regs_, edge_regs_;
  std::set<std::string> graph_used_, tensors_used_, tensors_written_;
  bool uses_warp_sum_ = false;
  int next_ = 0;
  NameScope names_{cpp_reserved()};
  std::map<std::pair<std::string, std::string>, std::string> endpoints_;
};

}  // namespace

TraversalCode emit_traversal(const Program& p, const TraversalInstance& t, const std::set<std::string>& written_before) {
  return TraversalEmitter(p, t, written_before).run();
}

}  // namespace hectorgen::emit
