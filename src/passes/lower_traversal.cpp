// Lowering of a traversal stage (an inter-IR loop nest) to a traversal instance (see passes.h and
// ir/intra/traversal.h). Names are chosen in two steps: while building, every variable the instance
// introduces gets a unique placeholder `base$N`; at the end they are renamed in program order to `base`,
// `base_2`, ... so that no name shadows a visible one, a tensor (kernel parameter) or a name the CUDA
// printer declares.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "ir/inter/names.h"
#include "ir/inter/ops.h"
#include "ir/inter/typing.h"
#include "ir/inter/printer.h"
#include "passes/passes.h"

namespace hectorgen::passes {

using namespace inter;
using intra::Def;
using intra::EdgeLoop;
using intra::GraphArray;
using intra::IndexDef;
using intra::Instr;
using intra::LaneLayout;
using intra::RegType;
using intra::Store;
using intra::StoreLanes;
using intra::TensorInfo;
using intra::Update;
using intra::Value;
using intra::ValueP;

namespace {

// An element-wise value that is not in a register yet: consumers inline it.
struct Val {
  ValueP v;
  std::vector<int64_t> shape;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct Reg {
  std::string name;
  RegType type;
  bool is_mutable = false;
  bool is_load = false;
};

// One block of the instance under construction: the row body or an inner loop's body.
struct Block {
  Block* parent = nullptr;
  std::string edge;  // the edge variable whose block this is (edge rows, inner loops), else ""
  std::vector<Instr> indexes, loads, body;
  std::map<std::string, std::string> index_of;  // "array[of]" -> index name
  std::map<std::string, Reg> loaded;            // "tensor[row]" -> register (read-only rows)
  std::map<std::string, std::pair<Reg, std::vector<int64_t>>> locals;  // DSL local -> register, shape
  std::map<std::string, Reg> fields;            // the edge's (or, row block of node rows, the node's) fields
  std::vector<std::pair<std::string, std::string>> stores;  // (tensor, register) stored at the block's end
  struct Cached {
    std::string key;
    std::set<std::string> regs;
    Val val;
  };
  std::vector<Cached> reductions;
};

// The base of a placeholder, as an identifier: the IR names it comes from may be derived (d$att: v_d_att).
std::string base_of(const std::string& placeholder) { return plain_spelling(placeholder.substr(0, placeholder.rfind('$'))); }

class TraversalLowering {
 public:
  TraversalLowering(const intra::Program& p, const intra::TraversalSource& s, const std::set<std::string>& written_before)
      : p_(p), src_(s), written_before_(written_before) {}

  intra::TraversalInstance run() {
    const Stmt& L = *src_.loop;
    pair_rows_ = L.loop == LoopKind::SrcPairs;  // a pair's own fields are kept like an edge's
    node_rows_ = !is_edge_loop(L.loop) && !pair_rows_;
    collect_writes(L.body);
    intra::TraversalInstance t;
    t.name = src_.name;
    t.rows = L.loop;
    t.threads = src_.threads;
    t.edge_batch = src_.edge_batch;
    t.vector = src_.vector == 0 ? intra::kDefaultVector : src_.vector;
    Block row;
    row_ = &row;
    row_var_ = fresh(L.var);
    t.row = row_var_;
    vars_[L.var].push_back(row_var_);
    if (!node_rows_) {
      row.edge = row_var_;
      edge_blocks_[row_var_] = &row;
      count_field_writes(L.body, L.var, row);
    }
    for (const StmtP& s : L.body) stmt(*s, row);
    finish(row);
    t.body = assemble(row);
    rename(t);
    intra::split_edge_loops(t);
    intra::choose_row_lanes(t, src_.row_lanes, intra::storage_bytes(intra::model_storage(p_.decl.options.dtype)));
    intra::insert_warp_syncs(t);
    return t;  // verified by the caller once the program has the layouts the instance reads (lower.cpp)
  }

 private:
  // ---- names -------------------------------------------------------------------------------------
  std::string fresh(const std::string& base) { return fmt::format("{}${}", base, next_++); }

  // A DSL variable's current placeholder (loop variables of sibling loops share a DSL name).
  std::string var(const std::string& dsl) const {
    auto it = vars_.find(dsl);
    if (it == vars_.end() || it->second.empty()) throw std::logic_error("lower_traversal: unknown variable " + dsl);
    return it->second.back();
  }

  // A register name for a DSL local: the local's name, unless that names a tensor.
  std::string local_base(const std::string& local) const {
    std::string b = plain_spelling(local.substr(std::min(local.find_first_not_of("_$"), local.size())));
    if (b.empty()) b = "tmp";
    if (p_.find(b)) b = "v_" + b;
    return b;
  }

  // ---- pre-scans ---------------------------------------------------------------------------------
  std::string field_tensor(const std::string& f) const {
    auto it = src_.field_tensor.find(f);
    return it == src_.field_tensor.end() ? f : it->second;
  }

  const TensorInfo& tensor(const std::string& n) const {
    const TensorInfo* t = p_.find(n);
    if (!t) throw std::logic_error("lower_traversal: unknown tensor " + n);
    return *t;
  }

  // Tensors this kernel stores: what it reads of them is loaded where it is read (not hoisted, not shared).
  void collect_writes(const std::vector<StmtP>& body) {
    for (const StmtP& s : body) {
      if (s->kind == StmtKind::For) {
        collect_writes(s->body);
        continue;
      }
      if (s->kind != StmtKind::Assign) throw std::logic_error("lower_traversal: unexpected statement");
      const Expr& t = *s->target;
      if (t.kind == ExprKind::Index && t.args[1]->kind == ExprKind::String) written_.insert(field_tensor(t.args[1]->name));
      if (t.kind == ExprKind::Name) {
        if (auto it = src_.materialized.find(t.name); it != src_.materialized.end()) written_.insert(it->second);
        ++local_writes_[t.name];
        if (s->op != AssignOp::Set) local_writes_[t.name] += 2;
      }
    }
  }

  // How often each field of edge `e` is assigned in the block (decides let or var).
  void count_field_writes(const std::vector<StmtP>& body, const std::string& e, Block& b) {
    for (const StmtP& s : body) {
      if (s->kind != StmtKind::Assign) continue;
      const Expr& t = *s->target;
      if (t.kind == ExprKind::Index && t.args[0]->kind == ExprKind::Name && t.args[0]->name == e &&
          t.args[1]->kind == ExprKind::String)
        ++field_writes_[b.edge][field_tensor(t.args[1]->name)];
    }
  }

  bool has_content(const std::string& tensor) const { return written_before_.count(tensor) || stored_.count(tensor); }

  // ---- blocks ------------------------------------------------------------------------------------
  void emit(Block& b, Instr in) { b.body.push_back(std::move(in)); }

  // A new register defined at the end of `where` (a block's body or its hoisted loads).
  Reg define(std::vector<Instr>& where, const std::string& base, std::vector<int64_t> shape, intra::Source source,
             bool is_mutable) {
    Reg r{fresh(base), RegType{std::move(shape), LaneLayout::Replicated}, is_mutable, std::holds_alternative<intra::Load>(source)};
    r.type.layout = intra::layout_for(r.type.numel());
    where.push_back(Instr{Def{r.name, is_mutable, r.type, std::move(source)}});
    regs_[r.name] = r;
    return r;
  }

  Val val(const Reg& r) const { return Val{Value::reg_ref(r.name), r.type.shape}; }
  // A register read with another shape of as many elements (a reshaped local, a field's register).
  static Val val(const Reg& r, const std::vector<int64_t>& shape) { return Val{Value::reg_ref(r.name), shape}; }

  // The index `array[of]`, defined once in block `b`.
  std::string index(Block& b, GraphArray array, const std::string& of, const std::string& base) {
    std::string key = fmt::format("{}[{}]", intra::to_string(array), of);
    if (auto it = b.index_of.find(key); it != b.index_of.end()) return it->second;
    std::string name = fresh(base);
    b.indexes.push_back(Instr{IndexDef{name, array, of}});
    b.index_of[key] = name;
    return name;
  }

  std::vector<Instr> assemble(Block& b) {
    std::vector<Instr> out = std::move(b.indexes);
    for (Instr& in : b.loads) out.push_back(std::move(in));
    for (Instr& in : b.body) out.push_back(std::move(in));
    return out;
  }

  // Stores what the block kept in registers, in the order of the first writes.
  void finish(Block& b) {
    for (const auto& [tensor_name, reg] : b.stores) {
      const TensorInfo& ti = tensor(tensor_name);
      const Reg& r = regs_.at(reg);
      std::string row = store_row(b, ti);
      emit(b, Instr{Store{tensor_name, row, reg, r.type.layout == LaneLayout::Lanes ? StoreLanes::Partitioned : StoreLanes::Lane0, false}});
      stored_.insert(tensor_name);
    }
  }

  void mark_store(Block& b, const std::string& tensor_name, const Reg& r) {
    for (const auto& [t, _] : b.stores)
      if (t == tensor_name) return;
    b.stores.push_back({tensor_name, r.name});
  }

  // The row of block `b` a tensor kept in its registers is stored to.
  std::string store_row(Block& b, const TensorInfo& t) {
    if (t.per == Per::Edge || (t.per == Per::Pair && pair_rows_)) return b.edge;
    if (t.per == Per::Pair) throw std::logic_error("lower_traversal: a pair row stored outside pair rows");
    if (b.edge.empty()) return row_var_;  // the row node
    return endpoint(b, "src").row;        // a node value computed per edge: its source's row
  }

  // ---- rows ---------------------------------------------------------------------------------------
  struct RowRef {
    std::string row;          // placeholder of the row variable or index
    Block* block = nullptr;   // where the row is defined (read-only loads of it go there)
    bool row_node = false;    // the node of node rows
    Block* edge_block = nullptr;  // the edge's block, when the row is the current edge
  };

  const Stmt* loop_of(const std::string& dsl_edge) const {
    for (const StmtP& s : src_.loop->body)
      if (s->kind == StmtKind::For && s->var == dsl_edge) return s.get();
    return nullptr;
  }

  Block& block_of_edge(const std::string& placeholder) {
    auto it = edge_blocks_.find(placeholder);
    if (it == edge_blocks_.end()) throw std::logic_error("lower_traversal: edge outside its loop");
    return *it->second;
  }

  // e.src / e.dst / e.pair of the edge whose block is `b` (p.src of pair rows).
  RowRef endpoint(Block& b, const std::string& which) {
    if (which == "pair") {  // the edge's (source, edge type) pair: by CSR position in a node's incoming edges
      if (node_rows_ && src_.position_indices && inner_kind_.at(b.edge) == LoopKind::IncomingEdges)
        return RowRef{index(b, GraphArray::InPair, positions_.at(b.edge), base_of(b.edge) + "_pair"), &b, false, nullptr};
      return RowRef{index(b, GraphArray::EdgePair, b.edge, base_of(b.edge) + "_pair"), &b, false, nullptr};
    }
    if (pair_rows_) return RowRef{index(b, GraphArray::PairSrc, b.edge, base_of(b.edge) + "_src"), &b, false, nullptr};
    if (node_rows_) {
      bool incoming = inner_kind_.at(b.edge) == LoopKind::IncomingEdges;
      if ((incoming && which == "dst") || (!incoming && which == "src")) return RowRef{row_var_, row_, true, nullptr};
      std::string pos = positions_.at(b.edge);
      return RowRef{index(b, incoming ? GraphArray::InSrc : GraphArray::OutDst, pos, base_of(b.edge) + "_" + which), &b, false, nullptr};
    }
    return RowRef{index(b, which == "src" ? GraphArray::Src : GraphArray::Dst, b.edge, base_of(b.edge) + "_" + which), &b, false, nullptr};
  }

  // The relation of the edge (or pair) whose block is `b`: by CSR position in a node's edge loop (in_etype /
  // out_etype, read in CSR order instead of etype[e] at a scattered edge id).
  RowRef edge_etype(Block& b) {
    if (pair_rows_) return RowRef{index(b, GraphArray::PairEtype, b.edge, base_of(b.edge) + "_etype"), &b, false, nullptr};
    if (node_rows_ && src_.position_indices) {
      const bool incoming = inner_kind_.at(b.edge) == LoopKind::IncomingEdges;
      return RowRef{index(b, incoming ? GraphArray::InEtype : GraphArray::OutEtype, positions_.at(b.edge), base_of(b.edge) + "_etype"),
                    &b, false, nullptr};
    }
    return RowRef{index(b, GraphArray::Etype, b.edge, base_of(b.edge) + "_etype"), &b, false, nullptr};
  }

  // The row a node or edge reference (`n`, `e`, `e.src`, `e.dst`) names.
  RowRef row_ref(const ExprP& base) {
    if (base->kind == ExprKind::Name) {
      std::string v = var(base->name);
      if (v == row_var_) return node_rows_ ? RowRef{v, row_, true, nullptr} : RowRef{v, row_, false, row_};
      Block& eb = block_of_edge(v);
      return RowRef{v, &eb, false, &eb};
    }
    if (base->kind == ExprKind::Attr && base->args[0]->kind == ExprKind::Name) {
      Block& eb = block_of_edge(var(base->args[0]->name));
      return endpoint(eb, base->name);
    }
    throw std::logic_error("lower_traversal: unsupported row " + print_expr(base));
  }

  // The twin in CSR order (intra::in_position_twin) of graph-derived input `in` when row `r` is the current edge of
  // a node's incoming-edge loop that reads by position, else null.
  const TensorInfo* in_position_twin(const TensorDecl& in, const RowRef& r) const {
    if (!node_rows_ || !src_.position_indices || !r.edge_block || r.row != r.edge_block->edge) return nullptr;
    if (inner_kind_.at(r.edge_block->edge) != LoopKind::IncomingEdges) return nullptr;
    const TensorInfo* twin = p_.find(intra::in_position_twin(in.name));
    return twin && intra::by_in_position(*twin) ? twin : nullptr;
  }

  // ---- loads --------------------------------------------------------------------------------------
  // A row of `tensor`: loaded once at the top of the block that defines the row when this kernel does not
  // store the tensor; else where it is read.
  Reg load(Block& here, const std::string& tensor_name, const RowRef& r, const std::string& base) {
    const TensorInfo& t = tensor(tensor_name);
    if (written_.count(tensor_name)) return define(here.body, base, t.shape, intra::Load{tensor_name, r.row}, false);
    Block& home = *r.block;
    std::string key = fmt::format("{}[{}]", tensor_name, r.row);
    if (auto it = home.loaded.find(key); it != home.loaded.end()) return it->second;
    Reg reg = define(home.loads, base, t.shape, intra::Load{tensor_name, r.row}, false);
    home.loaded[key] = reg;
    return reg;
  }

  // The row of a weight selected by `sel` (e.etype, n.ntype, e.src.ntype), or "0" without selector.
  RowRef weight_row(const ExprP& sel) {
    const ExprP& of = sel->args[0];
    if (sel->name == "etype") {
      return edge_etype(block_of_edge(var(of->name)));
    }
    RowRef node = row_ref(of);
    Block& home = *node.block;
    return RowRef{index(home, GraphArray::Ntype, node.row, base_of(node.row) + "_ntype"), &home, false, nullptr};
  }

  // ---- registers of the row's fields ---------------------------------------------------------------
  // The register holding the node's field `tensor_name` (node rows): created at its first access, before
  // the statement (or the inner loop) that makes it, from the value it is set to or what the tensor holds.
  Reg node_field(const std::string& field, const std::string& tensor_name, const Val* set_to) {
    if (auto it = row_->fields.find(tensor_name); it != row_->fields.end()) return it->second;
    const TensorInfo& t = tensor(tensor_name);
    intra::Source init = set_to ? intra::Source{intra::Eval{set_to->v}} : initial(tensor_name, RowRef{row_var_, row_, true, nullptr});
    Reg r = define(row_->body, "v_" + field, t.shape, init, true);
    row_->fields[tensor_name] = r;
    return r;
  }

  // The value a first write `x op= v` leaves when x starts empty (zero) or unknown (nothing).
  static std::optional<Val> first_value(AssignOp op, const Val& v, bool has_content) {
    if (op == AssignOp::Set) return v;
    if (has_content) return std::nullopt;
    if (op == AssignOp::Add) return v;
    if (op == AssignOp::Sub) return Val{Value::apply(Op::Neg, {v.v}), v.shape};
    return std::nullopt;
  }

  // What an accumulator starts from: the tensor's row when it holds data, else zero.
  intra::Source initial(const std::string& tensor_name, const RowRef& row) {
    if (has_content(tensor_name)) return stored_back(tensor_name, row.row);
    return intra::Eval{Value::constant(0)};
  }

  // The load of a row a register keeps and stores back: a replicated one is stored by lane 0, so lane 0
  // alone loads it too (and shuffles it to the other lanes): no other lane touches the row, no sync.
  intra::Load stored_back(const std::string& tensor_name, const std::string& row) const {
    return intra::Load{tensor_name, row, intra::layout_for(tensor(tensor_name).row_numel()) == LaneLayout::Replicated};
  }

  // ---- expressions --------------------------------------------------------------------------------
  Val expr(const ExprP& e, Block& b) {
    switch (e->kind) {
      case ExprKind::Number: return Val{Value::constant(e->number), {}};
      case ExprKind::String: throw std::logic_error("lower_traversal: string value");
      case ExprKind::Name: return name(e, b);
      case ExprKind::Attr: {
        const TensorDecl* in = p_.decl.find_input(e->name);
        if (!in) throw std::logic_error("lower_traversal: unknown attribute " + e->name);
        RowRef r = row_ref(e->args[0]);
        if (const TensorInfo* twin = in_position_twin(*in, r)) {  // e.norm by CSR position: in$norm[i_e]
          Block& eb = *r.edge_block;
          return val(load(b, twin->name, RowRef{positions_.at(eb.edge), &eb, false, nullptr}, value_name(e)));
        }
        return val(load(b, in->name, r, value_name(e)));
      }
      case ExprKind::Index: return index_expr(e, b);
      case ExprKind::Neg:
      case ExprKind::Binary:
      case ExprKind::Call: return apply(e, b);
    }
    throw std::logic_error("lower_traversal: unknown expression");
  }

  Val name(const ExprP& e, Block& b) {
    for (Block* x = &b; x; x = x->parent)
      if (auto it = x->locals.find(e->name); it != x->locals.end()) return val(it->second.first, it->second.second);
    if (auto it = src_.materialized.find(e->name); it != src_.materialized.end()) {
      const TensorInfo& t = tensor(it->second);
      return val(load(b, t.name, materialized_row(b, t), local_base(e->name)));
    }
    if (e->type.value) return Val{Value::constant(*e->type.value), {}};  // a hyper-parameter
    if (const TensorDecl* w = p_.decl.find_weight(e->name); w && w->per == Per::None)
      return val(load(b, w->name, RowRef{"0", row_, false, nullptr}, "v_" + w->name));
    throw std::logic_error("lower_traversal: unknown name " + e->name);
  }

  // The row of a materialised local's tensor: the node (node rows) or the edge, or a node value computed
  // per edge (its source's row), or a value computed once per edge type (the edge's type).
  RowRef materialized_row(Block& b, const TensorInfo& t) {
    if (t.per == Per::Pair) {
      if (pair_rows_) return RowRef{row_var_, row_, false, row_};
      Block* eb = &b;
      while (eb && eb->edge.empty()) eb = eb->parent;
      if (!eb) throw std::logic_error("lower_traversal: a pair value outside an edge loop");
      return endpoint(*eb, "pair");
    }
    if (t.per == Per::Etype) {
      Block* eb = &b;
      while (eb && eb->edge.empty()) eb = eb->parent;
      if (!eb) throw std::logic_error("lower_traversal: a per-edge-type value outside an edge loop");
      return edge_etype(*eb);
    }
    if (t.per == Per::Node) {
      if (node_rows_) return RowRef{row_var_, row_, true, nullptr};
      return endpoint(b.edge.empty() ? *row_ : b, "src");
    }
    Block* eb = &b;
    while (eb && eb->edge.empty()) eb = eb->parent;
    if (!eb) throw std::logic_error("lower_traversal: an edge value outside an edge loop");
    return RowRef{eb->edge, eb, false, eb};
  }

  Val index_expr(const ExprP& e, Block& b) {
    const ExprP& base = e->args[0];
    if (base->kind == ExprKind::Name && p_.decl.find_weight(base->name)) {
      const TensorDecl* w = p_.decl.find_weight(base->name);
      return val(load(b, w->name, weight_row(e->args[1]), "v_" + w->name));
    }
    if (e->args[1]->kind != ExprKind::String) throw std::logic_error("lower_traversal: unsupported index " + print_expr(e));
    const std::string& field = e->args[1]->name;
    std::string tn = field_tensor(field);
    RowRef r = row_ref(base);
    const std::vector<int64_t>& shape = tensor(tn).shape;
    if (r.row_node && written_.count(tn)) return val(node_field(field, tn, nullptr), shape);
    if (r.row_node)
      if (auto it = row_->fields.find(tn); it != row_->fields.end()) return val(it->second, shape);
    if (r.edge_block) {
      Block& eb = *r.edge_block;
      if (auto it = eb.fields.find(tn); it != eb.fields.end()) return val(it->second, shape);
      if (written_.count(tn)) {
        // Read before this iteration writes it: the register then holds the field for the iteration.
        bool assigned = field_writes_[eb.edge].count(tn) > 0;
        Reg reg = define(b.body, "v_" + field, tensor(tn).shape, assigned ? intra::Source{stored_back(tn, r.row)} : intra::Load{tn, r.row}, assigned);
        eb.fields[tn] = reg;
        return val(reg);
      }
    }
    return val(load(b, tn, r, value_name(e)));
  }

  // A register name for a read: v_<name>, with the endpoint when read through e.src / e.dst.
  std::string value_name(const ExprP& e) const {
    const ExprP& base = e->args[0];
    std::string n = e->kind == ExprKind::Attr ? e->name : e->args[1]->kind == ExprKind::String ? e->args[1]->name : base->name;
    bool endpoint = base->kind == ExprKind::Attr && base->args[0]->kind == ExprKind::Name;
    if (endpoint && !(node_rows_ && is_row_node_endpoint(base))) return fmt::format("v_{}_{}", base->name, n);
    return "v_" + n;
  }
  bool is_row_node_endpoint(const ExprP& base) const {
    const Stmt* l = loop_of(base->args[0]->name);
    return l && ((l->loop == LoopKind::IncomingEdges && base->name == "dst") || (l->loop == LoopKind::OutgoingEdges && base->name == "src"));
  }

  // An operator, as its row in the operator table says the traversal template computes it; shapes are the
  // typed IR's.
  Val apply(const ExprP& e, Block& b) {
    const OpInfo& op = op_info(e->fn);
    const std::vector<int64_t>& shape = e->type.shape;
    switch (op.form) {
      case Form::View: return Val{expr(e->args[0], b).v, shape};  // same elements (the lane layout depends on their count)
      case Form::ReduceLast: {
        // The product of the tensor arguments, summed over the last axis of the first.
        ValueP product;
        for (size_t i = 0; i < e->args.size(); ++i) {
          if (op.param(i).kind == ParamKind::Constant) continue;
          ValueP a = expr(e->args[i], b).v;
          product = product ? Value::apply(binary_op(BinOp::Mul), {product, a}) : a;
        }
        const std::vector<int64_t>& in = value_type(e->args[0]->type).shape;
        return reduce(product, shape, in.empty() ? 1 : in.back(), b, op.name, e);
      }
      case Form::Map: return map(e, op, b);
      case Form::None: break;
    }
    throw std::runtime_error(fmt::format("the code generator does not support '{}' inside a traversal yet", op.name));
  }

  // An element-wise operator: its tensor arguments as values (one its CUDA spelling repeats, when compound,
  // in a register first), constant parameters as constants (left-out ones: their defaults); folded when
  // the table says constant arguments give a constant (sqrt(d_k) is a number).
  Val map(const ExprP& e, const OpInfo& op, Block& b) {
    size_t n = std::max(op.params.size(), e->args.size());
    std::vector<ValueP> args(n);
    for (size_t i = 0; i < n; ++i) {
      if (i < e->args.size() && op.param(i).kind != ParamKind::Constant) {
        Val a = expr(e->args[i], b);
        if (a.v->kind == Value::Kind::Op && repeats(op.cuda, i)) a = val(define(b.body, std::string(op.name) + "_in", a.shape, intra::Eval{a.v}, false), a.shape);
        args[i] = a.v;
      } else {
        args[i] = Value::constant(i < e->args.size() ? *e->args[i]->type.value : *op.param(i).default_value);
      }
    }
    bool constant = op.folds && std::all_of(args.begin(), args.end(), [](const ValueP& a) { return a->kind == Value::Kind::Const; });
    if (constant) {
      std::vector<double> xs;
      for (const ValueP& a : args) xs.push_back(a->number);
      return Val{Value::constant(intra::evaluate(e->fn, xs)), e->type.shape};
    }
    return Val{Value::apply(e->fn, std::move(args)), e->type.shape};
  }

  // True when the spelling uses argument i more than once.
  static bool repeats(std::string_view pattern, size_t i) {
    std::string hole = "{" + std::to_string(i) + "}";
    size_t first = pattern.find(hole);
    return first != std::string_view::npos && pattern.find(hole, first + 1) != std::string_view::npos;
  }

  // `x` (a value of shape + [axis]) summed over its last axis: a register (a warp reduction when x is spread
  // over the lanes), computed once per value and block.
  Val reduce(const ValueP& xv, const std::vector<int64_t>& shape, int64_t axis, Block& b, const char* what, const ExprP& e) {
    Val x{xv, shape};
    x.shape.push_back(axis);
    if (axis == 1) return Val{x.v, shape};  // nothing to reduce
    std::string key = fmt::format("{}/{}", intra::print_value(x.v), axis);
    for (Block* s = &b; s; s = s->parent)
      for (const Block::Cached& c : s->reductions)
        if (c.key == key) return c.val;
    std::vector<std::string> leaves;
    std::function<void(const ExprP&)> names = [&](const ExprP& a) {
      std::string n;
      if (a->kind == ExprKind::Name && !a->type.value) n = plain_spelling(a->name.substr(std::min(a->name.find_first_not_of("_$"), a->name.size())));
      else if (a->kind == ExprKind::Attr) n = a->name;
      else if (a->kind == ExprKind::Index) n = a->args[1]->kind == ExprKind::String ? a->args[1]->name : a->args[0]->name;
      if (!n.empty()) {
        if (std::find(leaves.begin(), leaves.end(), n) == leaves.end()) leaves.push_back(n);
        return;
      }
      for (const ExprP& c : a->args) names(c);
    };
    for (const ExprP& a : e->args) names(a);
    std::string base = what;
    for (size_t i = 0; i < leaves.size() && i < 3; ++i) base += "_" + leaves[i];
    bool warp = intra::layout_for(x.numel()) == LaneLayout::Lanes;
    Reg r = define(b.body, base, shape, intra::Reduce{intra::ReduceOp::Sum, warp, x.v, axis}, false);
    Val out = val(r);
    b.reductions.push_back(Block::Cached{key, {}, out});
    for (const std::string& reg : intra::regs_of(x.v)) b.reductions.back().regs.insert(reg);
    return out;
  }

  // A register changed: reductions over it are stale.
  void changed(const std::string& reg) {
    for (Block* s : open_blocks_)
      s->reductions.erase(std::remove_if(s->reductions.begin(), s->reductions.end(),
                                         [&](const Block::Cached& c) { return c.regs.count(reg) > 0; }),
                          s->reductions.end());
  }

  // ---- statements ----------------------------------------------------------------------------------
  void stmt(const Stmt& s, Block& b) {
    open_blocks_.push_back(&b);
    if (s.kind == StmtKind::For) {
      inner_loop(s, b);
    } else {
      emit(b, Instr{intra::Comment{fmt::format("{} {} {}", print_expr(s.target), to_string(s.op), print_expr(s.value))}});
      statement_first_ = next_;
      assign(s, b);
    }
    open_blocks_.pop_back();
  }

  void inner_loop(const Stmt& s, Block& b) {
    Block body;
    body.parent = &b;
    body.edge = fresh(s.var);
    std::string pos = fresh("i_" + s.var);
    vars_[s.var].push_back(body.edge);
    edge_blocks_[body.edge] = &body;
    inner_kind_[body.edge] = s.loop;
    positions_[body.edge] = pos;
    count_field_writes(s.body, s.var, body);
    for (const StmtP& x : s.body) stmt(*x, body);
    finish(body);
    emit(b, Instr{EdgeLoop{body.edge, pos, s.loop, row_var_, assemble(body)}});
    edge_blocks_.erase(body.edge);
    vars_[s.var].pop_back();
  }

  // A value as a register of `shape`: the register itself when it is one of that size, else a new one.
  Reg as_register(Block& b, const Val& v, const std::vector<int64_t>& shape, const std::string& base) {
    if (v.v->kind == Value::Kind::Reg) {
      const Reg& r = regs_.at(v.v->reg);
      if (r.type.numel() == Val{nullptr, shape}.numel()) return r;
    }
    return define(b.body, base, shape, intra::Eval{v.v}, false);
  }

  void update(Block& b, const Reg& r, AssignOp op, const Val& v) {
    emit(b, Instr{Update{r.name, op, v.v}});
    changed(r.name);
  }

  void assign(const Stmt& s, Block& b) {
    Val v = expr(s.value, b);
    const Expr& t = *s.target;
    if (t.kind == ExprKind::Name) return assign_local(s, b, v);
    if (t.kind != ExprKind::Index || t.args[1]->kind != ExprKind::String)
      throw std::logic_error("lower_traversal: unsupported target " + print_expr(s.target));
    const std::string& field = t.args[1]->name;
    std::string tn = field_tensor(field);
    const TensorInfo& ti = tensor(tn);
    RowRef r = row_ref(t.args[0]);
    if (r.row_node) {  // the row node's field: a register for the whole row
      // Its first write at the row's level starts it at the value (what `+=` adds to an empty row).
      std::optional<Val> start;
      if (&b == row_ && !row_->fields.count(tn)) start = first_value(s.op, v, has_content(tn));
      Reg reg = node_field(field, tn, start ? &*start : nullptr);
      if (!start) update(b, reg, s.op, v);
      mark_store(*row_, tn, reg);
      return;
    }
    if (r.edge_block) {  // the edge's own field: a register for the iteration
      Block& eb = *r.edge_block;
      auto it = eb.fields.find(tn);
      if (it == eb.fields.end()) {
        bool more = field_writes_[eb.edge][tn] > 1;
        if (std::optional<Val> start = first_value(s.op, v, has_content(tn))) {
          // Written once: the value's own register when it is one (no copy), else one named after the field.
          Reg reg = !more && plain_let(*start, ti.shape) ? regs_.at(start->v->reg)
                                                         : define(b.body, "v_" + field, ti.shape, intra::Eval{start->v}, more);
          if (!more && start->v->kind == Value::Kind::Reg && made_by_this_statement(reg.name)) renamed_base_[reg.name] = "v_" + field;
          eb.fields[tn] = reg;
          mark_store(eb, tn, reg);
          return;
        }
        Reg reg = define(b.body, "v_" + field, ti.shape, initial(tn, r), true);
        it = eb.fields.emplace(tn, reg).first;
      }
      update(b, it->second, s.op, v);
      mark_store(eb, tn, it->second);
      return;
    }
    // Another node's row (e.src / e.dst that is not the row node): atomically added.
    if (s.op != AssignOp::Add && s.op != AssignOp::Sub)
      throw std::logic_error("lower_traversal: only += and -= reach rows other warps own: " + print_expr(s.target));
    Val add = s.op == AssignOp::Sub ? Val{Value::apply(Op::Neg, {v.v}), v.shape} : v;
    Reg reg = as_register(b, add, ti.shape, "to_" + field);
    emit(b, Instr{Store{tn, r.row, reg.name, reg.type.layout == LaneLayout::Lanes ? StoreLanes::Partitioned : StoreLanes::Lane0, true}});
  }

  void assign_local(const Stmt& s, Block& b, const Val& v) {
    const std::string& local = s.target->name;
    for (Block* x = &b; x; x = x->parent)
      if (auto it = x->locals.find(local); it != x->locals.end()) {
        update(b, it->second.first, s.op, v);
        return;
      }
    if (s.op != AssignOp::Set) throw std::logic_error("lower_traversal: update of unknown local " + local);
    bool is_mutable = local_writes_[local] > 1;
    std::vector<int64_t> shape = v.shape;
    if (auto it = src_.materialized.find(local); it != src_.materialized.end()) shape = tensor(it->second).shape;
    Reg reg;
    if (!is_mutable && plain_let(v, shape)) {
      // The value is a register already: the local names it (no copy); a register this statement made
      // (a reduction, a load) takes the local's name.
      reg = regs_.at(v.v->reg);
      if (made_by_this_statement(reg.name)) renamed_base_[reg.name] = local_base(local);
    } else {
      reg = define(b.body, local_base(local), shape, intra::Eval{v.v}, is_mutable);
    }
    b.locals[local] = {reg, shape};
    if (auto it = src_.materialized.find(local); it != src_.materialized.end()) mark_store(b, it->second, reg);
  }

  // True when `v` is an immutable register of as many elements as `shape`.
  bool plain_let(const Val& v, const std::vector<int64_t>& shape) const {
    if (v.v->kind != Value::Kind::Reg) return false;
    const Reg& r = regs_.at(v.v->reg);
    return !r.is_mutable && r.type.numel() == Val{nullptr, shape}.numel();
  }

  // True for the values (not loads) the statement being lowered computed into registers: they take the
  // name of what the statement assigns.
  bool made_by_this_statement(const std::string& reg) const {
    return !regs_.at(reg).is_load && std::stoi(reg.substr(reg.rfind('$') + 1)) >= statement_first_;
  }

  // ---- final names ----------------------------------------------------------------------------------
  void rename(intra::TraversalInstance& t) {
    std::vector<std::set<std::string>> scopes(1);
    t.row = bind(t.row, scopes);
    rename_body(t.body, scopes);
  }

  std::string bind(const std::string& placeholder, std::vector<std::set<std::string>>& scopes) {
    std::string base = base_of(placeholder);
    if (auto it = renamed_base_.find(placeholder); it != renamed_base_.end()) base = plain_spelling(it->second);
    auto taken = [&](const std::string& n) {
      if (p_.find(n) || intra::is_kernel_reserved(n)) return true;
      for (const auto& s : scopes)
        if (s.count(n)) return true;
      return false;
    };
    std::string name = base;
    for (int i = 2; taken(name); ++i) name = fmt::format("{}_{}", base, i);
    scopes.back().insert(name);
    final_[placeholder] = name;
    return name;
  }

  std::string ref(const std::string& placeholder) const {
    if (placeholder == "0") return placeholder;
    auto it = final_.find(placeholder);
    if (it == final_.end()) throw std::logic_error("lower_traversal: unbound " + placeholder);
    return it->second;
  }

  ValueP ref(const ValueP& v) const {
    if (v->kind == Value::Kind::Reg) return Value::reg_ref(ref(v->reg));
    if (v->kind == Value::Kind::Const) return v;
    std::vector<ValueP> args;
    for (const ValueP& a : v->args) args.push_back(ref(a));
    return Value::apply(v->op, std::move(args));
  }

  void rename_body(std::vector<Instr>& body, std::vector<std::set<std::string>>& scopes) {
    for (Instr& in : body) {
      std::visit(
          [&](auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, IndexDef>) {
              x.of = ref(x.of);
              x.name = bind(x.name, scopes);
            } else if constexpr (std::is_same_v<T, Def>) {
              if (auto* l = std::get_if<intra::Load>(&x.source)) l->row = ref(l->row);
              if (auto* e = std::get_if<intra::Eval>(&x.source)) e->value = ref(e->value);
              if (auto* r = std::get_if<intra::Reduce>(&x.source)) r->value = ref(r->value);
              x.name = bind(x.name, scopes);
            } else if constexpr (std::is_same_v<T, Update>) {
              x.name = ref(x.name);
              x.value = ref(x.value);
            } else if constexpr (std::is_same_v<T, Store>) {
              x.row = ref(x.row);
              x.reg = ref(x.reg);
            } else if constexpr (std::is_same_v<T, EdgeLoop>) {
              x.node = ref(x.node);
              scopes.emplace_back();
              x.pos = bind(x.pos, scopes);
              x.var = bind(x.var, scopes);
              rename_body(x.body, scopes);
              scopes.pop_back();
            }
          },
          in.v);
    }
  }

  const intra::Program& p_;
  const intra::TraversalSource& src_;
  const std::set<std::string>& written_before_;
  bool node_rows_ = false;
  bool pair_rows_ = false;  // rows are the (source, edge type) pairs
  Block* row_ = nullptr;
  std::string row_var_;
  int next_ = 0;
  int statement_first_ = 0;  // the first placeholder number of the statement being lowered
  std::map<std::string, std::vector<std::string>> vars_;  // DSL variable -> placeholders (innermost last)
  std::map<std::string, Block*> edge_blocks_;
  std::map<std::string, LoopKind> inner_kind_;
  std::map<std::string, std::string> positions_;
  std::map<std::string, Reg> regs_;
  std::set<std::string> written_, stored_;
  std::map<std::string, int> local_writes_;
  std::map<std::string, std::map<std::string, int>> field_writes_;  // edge placeholder -> tensor -> writes
  std::vector<Block*> open_blocks_;
  std::map<std::string, std::string> renamed_base_, final_;
};

}  // namespace

intra::TraversalInstance lower_traversal(const intra::Program& p, const intra::TraversalSource& src,
                                         const std::set<std::string>& written_before) {
  return TraversalLowering(p, src, written_before).run();
}

}  // namespace hectorgen::passes
