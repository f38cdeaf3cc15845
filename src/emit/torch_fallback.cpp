// The lowest lowering level: a statement the two templates cannot express runs as vectorised ATen calls
// over all rows of its loop (edges in edge-type-sorted order, or nodes), placed in the host function
// between kernel launches. Node data read through an edge is gathered with index_select; aggregation
// into nodes uses index_add_. In bf16/fp16 models, 16-bit tensors are read as float (the ATen calls compute in
// float, as the kernels do) and the result is rounded to the target's type when it is stored.
#include <fmt/format.h>

#include <set>
#include <stdexcept>

#include "emit/emit.h"
#include "emit/printer.h"
#include "ir/inter/ops.h"
#include "ir/inter/printer.h"

namespace hectorgen::emit {

using namespace inter;

namespace {

struct TV {
  std::string code;
  std::vector<int64_t> shape;  // per row: the expression's type, or the row shape of the tensor it reads
  bool rows = true;            // has the leading row dimension (false: weights without index, constants)
};

std::string dims(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += ", " + std::to_string(d);
  return s;
}

class TorchEmitter {
 public:
  TorchEmitter(const intra::Program& p, const intra::TorchInstance& t) : p_(p), t_(t) {}

  std::string run() {
    const Stmt& L = *t_.loop;
    top_ = &L;
    const Stmt* s = L.body.front().get();
    if (s->kind == StmtKind::For) {
      inner_ = s;
      s = s->body.front().get();
    }
    edge_rows_ = is_edge_loop(L.loop) || inner_;
    std::string body = assign(*s);
    CodeWriter w;
    CodeWriter::Indent i(w);
    w.line(fmt::format("{{  // {}: PyTorch fallback over all {}", t_.name, edge_rows_ ? "edges" : "nodes"));
    {
      CodeWriter::Indent j(w);
      w.block(print_stmt(t_.loop, "//   "));
      for (const std::string& idx : indices_) w.line(fmt::format("const at::Tensor {0}_l = {0}.to(at::kLong);", idx));
      w.block(body);
    }
    w.line("}");
    return w.str();
  }

 private:
  std::string assign(const Stmt& s) {
    TV v = expr(s.value);
    const Expr& t = *s.target;
    std::string tensor, index;
    std::vector<int64_t> shape;
    if (t.kind == ExprKind::Name) {
      tensor = t_.materialized.at(t.name);
    } else {
      std::string field = t.args[1]->name;
      tensor = field_tensor(field);
      const ExprP& base = t.args[0];
      bool own_row = base->kind == ExprKind::Name && (edge_rows_ ? is_edge_var(base->name) : true);
      if (!own_row) index = gather_index(base);  // aggregation into nodes
    }
    shape = find(tensor).shape;
    std::string value = expand(v, shape);
    if (!index.empty()) {
      if (s.op != AssignOp::Add && s.op != AssignOp::Sub)
        throw std::logic_error("torch fallback: only += / -= aggregate into nodes");
      if (is_16bit(tensor)) value = fmt::format("({}).to({}.scalar_type())", value, tensor);  // index_add_ wants one dtype
      return fmt::format("{}.index_add_(0, {}, {}{});", tensor, index, s.op == AssignOp::Sub ? "-" : "", value);
    }
    switch (s.op) {
      case AssignOp::Set: return fmt::format("{}.copy_({});", tensor, value);
      case AssignOp::Add: return fmt::format("{}.add_({});", tensor, value);
      case AssignOp::Sub: return fmt::format("{}.sub_({});", tensor, value);
      case AssignOp::Mul: return fmt::format("{}.mul_({});", tensor, value);
      case AssignOp::Div: return fmt::format("{}.div_({});", tensor, value);
    }
    return "";
  }

  // A value as a full [rows, *shape] tensor.
  std::string expand(const TV& v, const std::vector<int64_t>& shape) {
    std::string c = v.code;
    if (!v.rows && v.shape.empty())
      return fmt::format("at::full({{{}{}}}, {}, {})", rows(), dims(shape), c, mixed() ? "options.dtype(at::kFloat)" : "options");
    TV b = align(v, shape.size());
    return fmt::format("{}.expand({{{}{}}})", b.code, rows(), dims(shape));
  }

  std::string rows() const { return edge_rows_ ? "num_edges" : "num_nodes"; }

  // Adds trailing unit dimensions (prefix broadcasting) and a leading one for row-less values.
  TV align(const TV& v, size_t rank) {
    TV r = v;
    if (!r.rows) r.code = "(" + r.code + ").unsqueeze(0)";
    for (size_t i = v.shape.size(); i < rank; ++i) r.code = "(" + r.code + ").unsqueeze(-1)";
    r.rows = true;
    return r;
  }

  TV expr(const ExprP& e) {
    switch (e->kind) {
      case ExprKind::Number: return TV{fmt::format("{}", e->number) + (e->is_integer ? ".0" : ""), {}, false};
      case ExprKind::String: throw std::logic_error("torch fallback: string value");
      case ExprKind::Name: {
        if (auto it = t_.materialized.find(e->name); it != t_.materialized.end())
          return TV{as_float(it->second, it->second), find(it->second).shape, true};
        if (const HyperParam* h = p_.decl.find_hyper(e->name)) return TV{fmt::format("{}", h->value), {}, false};
        if (const TensorDecl* w = p_.decl.find_weight(e->name)) return TV{as_float(w->name, w->name), w->shape, false};
        throw std::logic_error("torch fallback: unknown name " + e->name);
      }
      case ExprKind::Attr: {
        const TensorDecl* in = p_.decl.find_input(e->name);
        if (in->per == Per::Edge) return TV{as_float(in->name, in->name), in->shape, true};
        return TV{as_float(in->name, gathered(in->name, e->args[0])), in->shape, true};
      }
      case ExprKind::Index: {
        const ExprP& base = e->args[0];
        if (base->kind == ExprKind::Name && p_.decl.find_weight(base->name)) {
          const TensorDecl* w = p_.decl.find_weight(base->name);
          const ExprP& sel = e->args[1];
          std::string idx;
          if (sel->name == "etype") idx = use("etype");
          else {
            if (!has_array("ntype")) throw std::runtime_error("torch fallback: per-node-type weights need the ntype layout");
            idx = edge_rows_ ? fmt::format("{}.index_select(0, {})", use("ntype"), gather_index(sel->args[0])) : use("ntype");
          }
          return TV{as_float(w->name, fmt::format("{}.index_select(0, {})", w->name, idx)), w->shape, true};
        }
        std::string tensor = field_tensor(e->args[1]->name);
        const intra::TensorInfo& ti = find(tensor);
        if (ti.per == Per::Edge) return TV{as_float(tensor, tensor), ti.shape, true};
        return TV{as_float(tensor, gathered(tensor, base)), ti.shape, true};
      }
      case ExprKind::Neg:
      case ExprKind::Binary:
      case ExprKind::Call: return apply(e);
    }
    throw std::logic_error("torch fallback: unknown expression");
  }

  // An operator, spelled as its row in the operator table says.
  TV apply(const ExprP& e) {
    const OpInfo& op = op_info(e->fn);
    if (!op.templates.torch) throw std::runtime_error(fmt::format("the PyTorch fallback does not support '{}'", op.name));
    const std::vector<int64_t>& shape = e->type.shape;
    std::vector<TV> args;
    for (const ExprP& a : e->args) args.push_back(expr(a));
    bool rows = false;
    for (size_t i = 0; i < args.size(); ++i) {
      if (op.param(i).kind == ParamKind::Constant) continue;
      TV& a = args[i];
      switch (op.aten_args) {
        case AtenArgs::AsIs: break;
        case AtenArgs::Broadcast: break;
        case AtenArgs::Rows: a = full(a); break;
        case AtenArgs::RowsAligned: a = align(full(a), shape.size()); break;
      }
      rows = rows || a.rows;
    }
    if (op.aten_args == AtenArgs::Broadcast && rows)  // prefix broadcasting against row values: align ranks
      for (size_t i = 0; i < args.size(); ++i)
        if (!args[i].shape.empty() || args[i].rows) args[i] = align(args[i], shape.size());
    std::vector<std::string> code, tensors;
    for (size_t i = 0; i < args.size(); ++i) {
      code.push_back(args[i].code);
      if (op.param(i).kind != ParamKind::Constant) tensors.push_back(args[i].code);
    }
    for (size_t i = args.size(); i < op.params.size(); ++i) code.push_back(fmt::format("{}", *op.params[i].default_value));
    std::string all;
    for (const std::string& t : tensors) all += (all.empty() ? "" : ", ") + t;
    return TV{spell(op.aten, code, all, this->rows(), dims(shape)), shape, rows};
  }

  // A value with its row dimension materialised (for ops that need aligned operands).
  TV full(const TV& v) {
    if (v.rows) return v;
    return TV{expand(v, v.shape), v.shape, true};
  }

  // Node data read through `base` (a node loop variable, or e.src / e.dst), one row per loop row.
  std::string gathered(const std::string& tensor, const ExprP& base) {
    if (!edge_rows_) return tensor;
    return fmt::format("{}.index_select(0, {})", tensor, gather_index(base));
  }

  std::string gather_index(const ExprP& base) {
    if (base->kind == ExprKind::Name) {  // the node loop variable inside an inner loop
      return use(inner_ && inner_->loop == LoopKind::OutgoingEdges ? "src" : "dst");
    }
    if (base->name == "pair") return use("edge_pair");  // e.pair: the edge's (source, edge type) pair row
    return use(base->name);  // "src" / "dst"
  }

  bool is_16bit(const std::string& tensor) const {
    const intra::TensorInfo* t = p_.find(tensor);
    return t && t->storage != DType::FP32;
  }
  bool mixed() const { return intra::model_storage(p_.decl.options.dtype) != DType::FP32; }
  // `code` (rows of `tensor`) as float: ATen computes in float what the model stores in 16 bits.
  std::string as_float(const std::string& tensor, const std::string& code) const {
    return is_16bit(tensor) ? code + ".to(at::kFloat)" : code;
  }

  std::string use(const std::string& array) {
    indices_.insert(array);
    return array + "_l";
  }
  bool has_array(const std::string& a) const {
    for (const auto& g : graph_arrays(p_))
      if (g == a) return true;
    return false;
  }
  bool is_edge_var(const std::string& n) const {
    return (inner_ && inner_->var == n) || (is_edge_loop(top_->loop) && top_->var == n);
  }
  std::string field_tensor(const std::string& f) const {
    auto it = t_.field_tensor.find(f);
    return it == t_.field_tensor.end() ? f : it->second;
  }
  const intra::TensorInfo& find(const std::string& n) const {
    const intra::TensorInfo* t = p_.find(n);
    if (!t) throw std::logic_error("torch fallback: unknown tensor " + n);
    return *t;
  }

  const intra::Program& p_;
  const intra::TorchInstance& t_;
  const Stmt* top_ = nullptr;
  const Stmt* inner_ = nullptr;
  bool edge_rows_ = false;
  std::set<std::string> indices_;
};

}  // namespace

std::string emit_torch_block(const intra::Program& p, const intra::TorchInstance& t) { return TorchEmitter(p, t).run(); }

}  // namespace hectorgen::emit
