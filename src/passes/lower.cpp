// Lowering from the inter-operator IR to GEMM and traversal instances (see passes.h and ir/intra/intra.h).
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <set>
#include <tuple>

#include "ir/inter/names.h"
#include "ir/inter/ops.h"
#include "ir/inter/printer.h"
#include "ir/inter/typing.h"
#include "ir/intra/launch.h"
#include "passes/passes.h"
#include "passes/rewrite.h"

namespace hectorgen::passes {

using namespace inter;
using intra::GemmInstance;
using intra::Kernel;
using intra::Role;
using intra::TensorInfo;

namespace {

bool is_op(const ExprP& e, Op op) {
  return (e->kind == ExprKind::Call || e->kind == ExprKind::Binary || e->kind == ExprKind::Neg) && e->fn == op;
}

// Strips reshape(): it does not move data.
const ExprP& strip_reshape(const ExprP& e) { return is_op(e, Op::Reshape) ? strip_reshape(e->args[0]) : e; }

// x * W and linear(x, W) alike.
bool is_linear(const ExprP& e) { return is_op(e, Op::Linear); }

void collect_names(const ExprP& e, std::set<std::string>& out) {
  if (e->kind == ExprKind::Name) out.insert(e->name);
  for (const ExprP& a : e->args) collect_names(a, out);
}

void collect_names(const StmtP& s, std::set<std::string>& out) {
  if (s->target) collect_names(s->target, out);
  if (s->value) collect_names(s->value, out);
  if (s->kind == StmtKind::For) out.insert(s->parent);
  for (const StmtP& b : s->body) collect_names(b, out);
}

// A field access: base is a loop variable or e.src / e.dst; key a string.
struct FieldRef {
  std::string field;
  bool on_edge = false;   // the loop element's own field (an edge's, or a pair loop's pair's)
  std::string node_role;  // "", "src", "dst" (node fields: via the loop node or an edge endpoint)
  bool via_pair = false;  // a field of the edge's (source, edge type) pair: e.pair["f"]
};

std::optional<FieldRef> field_ref(const ExprP& e, const std::set<std::string>& edge_vars) {
  if (e->kind != ExprKind::Index || e->args[1]->kind != ExprKind::String) return std::nullopt;
  const ExprP& base = e->args[0];
  if (base->kind == ExprKind::Name) return FieldRef{e->args[1]->name, edge_vars.count(base->name) > 0, ""};
  if (base->kind == ExprKind::Attr && (base->name == "src" || base->name == "dst"))
    return FieldRef{e->args[1]->name, false, base->name};
  if (base->kind == ExprKind::Attr && base->name == "pair") return FieldRef{e->args[1]->name, false, "", true};
  return std::nullopt;
}

class Lowering {
 public:
  Lowering(const Module& m, Diagnostics& d, std::string phase)
      : m_(m), ctx_(TypeContext::of(m)), d_(d), phase_(std::move(phase)) {
    prefix_ = m.decl.name + "_" + (phase_ == "forward" ? "fw" : phase_ == "forward_train" ? "fwt" : "bw");
    // Training is bit-reproducible: no atomic scatters (per-edge temporaries + node-centric sums instead).
    // 16-bit models too (docs/dtype_plan.md): an atomic scatter would need an fp32 copy of its target, while the
    // per-edge rows and the node-centric sum keep every tensor in the storage type, summed in fp32 registers.
    deterministic_ = phase_ != "forward" || intra::model_storage(m.decl.options.dtype) != DType::FP32;
  }

  std::optional<intra::Program> run() {
    p_.model = m_.decl.name;
    p_.phase = phase_;
    p_.decl = m_.decl;
    for (const TensorDecl& t : m_.decl.inputs) add_tensor({t.name, Role::Input, t.per, t.shape, false, t.from_graph});
    for (const TensorDecl& t : m_.decl.weights) add_tensor({t.name, Role::Weight, t.per, t.shape, false, ""});
    for (const TensorDecl& t : m_.decl.outputs) add_tensor({t.name, Role::Output, t.per, t.shape, false, ""});
    for (const auto& [name, f] : m_.node_fields)
      if (!p_.find(name)) add_tensor({name, Role::Field, Per::Node, f.shape, false, ""});
    for (const auto& [name, f] : m_.edge_fields)
      if (!p_.find(name)) add_tensor({name, Role::Field, Per::Edge, f.shape, false, ""});
    for (const auto& [name, f] : m_.pair_fields)
      if (!p_.find(name)) add_tensor({name, Role::Field, Per::Pair, f.shape, false, ""});
    count_writes(m_.body);
    p_.layouts.insert(intra::layout::kSortedCoo);
    // Compact materialization: the unique (source, edge type) pairs, each edge's pair and the pair CSRs.
    bool pairs = !m_.pair_fields.empty();
    for (const TensorDecl& t : m_.decl.inputs) pairs = pairs || t.per == Per::Pair;
    for (const StmtP& s : m_.body) pairs = pairs || (s->kind == StmtKind::For && s->loop == LoopKind::SrcPairs);
    if (pairs) p_.layouts.insert(intra::layout::kCompactSrc);
    for (const TensorDecl& t : m_.decl.inputs)
      if (!t.from_graph.empty()) p_.layouts.insert(t.from_graph);
    add_in_position_twins();
    for (const StmtP& s : m_.body) lower_loop(s);
    if (d_.has_errors()) return std::nullopt;
    // An output no kernel writes (a weight gradient nothing accumulates into) is zero, not garbage.
    for (TensorInfo& t : p_.tensors)
      if (t.role == Role::Output && !written_.count(t.name)) t.zero_init = true;
    // Drop fields that became aliases of temporaries.
    std::vector<TensorInfo> kept;
    for (TensorInfo& t : p_.tensors)
      if (!aliased_.count(t.name)) kept.push_back(t);
    p_.tensors = kept;
    p_.aliases = alias_;
    // Shapes the kernels cannot handle, at the declaration or statement at fault.
    if (!intra::check_shape_limits(p_, traversal_sources_, d_)) return std::nullopt;
    return std::move(p_);
  }

 private:
  // ---- bookkeeping ----------------------------------------------------------------------------
  // A graph-derived edge input that node traversals read by CSR position (schedule.traversal.position_indices) gets
  // its twin in CSR order (intra::in_position_twin: in$norm), an input of every phase and program alike: a module
  // passes one list of graph-derived arguments to all of its ops. drop_unread_twins removes it from the module if no
  // kernel reads it.
  void add_in_position_twins() {
    if (m_.decl.options.schedule.traversal_position_indices != 1) return;
    for (const TensorDecl& t : m_.decl.inputs) {
      const std::string q = intra::in_position_quantity(t.from_graph);
      if (q.empty() || t.per != Per::Edge) continue;
      TensorDecl twin = t;
      twin.name = intra::in_position_twin(t.name);
      twin.from_graph = q;
      twin.requires_grad = false;
      p_.decl.inputs.push_back(twin);
      add_tensor({twin.name, Role::Input, Per::Edge, twin.shape, false, q});
      p_.layouts.insert(q);  // with csr_by_dst, which the node kernels that read the twin walk (drop_unread_twins)
    }
  }

  void add_tensor(TensorInfo t) {
    used_names_.insert(t.name);
    p_.tensors.push_back(std::move(t));
  }
  TensorInfo& tensor(const std::string& n) {
    for (TensorInfo& t : p_.tensors)
      if (t.name == n) return t;
    throw std::logic_error("lowering: unknown tensor " + n);
  }
  std::string field_tensor(const std::string& f) const {
    auto it = alias_.find(f);
    return it == alias_.end() ? f : it->second;
  }
  void count_writes(const std::vector<StmtP>& body) {
    for (const StmtP& s : body) {
      if (s->kind == StmtKind::For) count_writes(s->body);
      if (s->kind == StmtKind::Assign && s->target->kind == ExprKind::Index && s->target->args[1]->kind == ExprKind::String)
        ++writes_[s->target->args[1]->name];
    }
  }
  // The first write of a field decides whether its tensor must start at zero.
  void note_write(const std::string& tensor_name, bool accumulates) {
    if (written_.insert(tensor_name).second && accumulates) tensor(tensor_name).zero_init = true;
  }
  // Lowering's names are derived (ir/inter/names.h): t$hs is the tensor of the local hs, $sc0 a local.
  // `fresh` makes a tensor name no other tensor has; `unique` a kernel name (rgat_fw_gemm_hs, ..._2), an
  // identifier already: '$' spelled '_'.
  std::string fresh(const std::string& base) {
    std::string n = fresh_name(base, [&](const std::string& x) { return used_names_.count(x) > 0; });
    used_names_.insert(n);
    return n;
  }
  std::string temp_tensor(const std::string& local) {
    return fresh(local.front() == kSigil ? "t" + local : derived_name("t", local));
  }
  std::string unique(const std::string& base) {
    const std::string spelled = plain_spelling(base);
    std::string n = spelled;
    for (int i = 2; kernel_names_.count(n); ++i) n = fmt::format("{}_{}", spelled, i);
    kernel_names_.insert(n);
    return n;
  }
  // What a kernel computes, for its name: the tensor without its t$.
  static std::string shown(const std::string& tensor) {
    return tensor.rfind(derived_name("t", ""), 0) == 0 ? tensor.substr(2) : tensor;
  }

  // ---- the open traversal stage of the current loop -----------------------------------------------
  struct Stage {
    std::vector<StmtP> top;              // top-level statements (inner loops rebuilt)
    std::set<std::string> reads, writes;  // tensors
    std::set<std::string> reg_locals;     // locals computed in registers by this stage
    bool empty() const { return top.empty(); }
  };

  struct LoopCtx {
    const Stmt* loop;
    bool node_loop;
    bool pair_loop;  // over the (source, edge type) pairs: its element is treated like an edge (own fields, e.src)
    std::set<std::string> edge_vars;
    std::map<std::string, std::string> materialized;  // local -> tensor, for this loop
    size_t position = 0;                               // index of the top-level statement being lowered
  };

  // The rows of a loop (or of its inner edge loop): what an instance over them runs over.
  static intra::Rows rows_of(const LoopCtx& ctx, const Stmt* inner) {
    if (inner) return intra::Rows::Edges;
    if (ctx.pair_loop) return intra::Rows::Pairs;
    return ctx.node_loop ? intra::Rows::Nodes : intra::Rows::Edges;
  }
  // The rows of a tensor stored once per row of `r`.
  static Per per_row(intra::Rows r) {
    return r == intra::Rows::Pairs ? Per::Pair : r == intra::Rows::Nodes ? Per::Node : Per::Edge;
  }

  void lower_loop(const StmtP& L) {
    const bool pair_loop = L->loop == LoopKind::SrcPairs;
    LoopCtx ctx{L.get(), !is_edge_loop(L->loop) && !pair_loop, pair_loop, {}, {}, 0};
    if (!ctx.node_loop) ctx.edge_vars.insert(L->var);
    Stage stage;
    for (size_t i = 0; i < L->body.size(); ++i) {
      ctx.position = i;
      const StmtP& s = L->body[i];
      if (s->kind == StmtKind::For) {
        ctx.edge_vars.insert(s->var);
        std::vector<StmtP> inner;
        for (const StmtP& t : s->body)
          if (StmtP r = lower_stmt(t, ctx, stage, s.get(), &inner)) inner.push_back(r);
        if (!inner.empty()) stage.top.push_back(Stmt::for_loop(s->var, s->loop, s->parent, inner, s->loc));
        ctx.edge_vars.erase(s->var);
      } else if (StmtP r = lower_stmt(s, ctx, stage, nullptr, nullptr)) {
        stage.top.push_back(r);
      }
    }
    ctx.position = L->body.size();
    flush(ctx, stage);
    emit_gather_sums(ctx);
  }

  // The spec's schedule.traversal entries, as every traversal stage takes them.
  void schedule_traversal(intra::TraversalSource& t) const {
    const inter::Schedule& s = m_.decl.options.schedule;
    t.threads = s.traversal_threads;
    t.edge_batch = s.traversal_edge_batch;
    t.row_lanes = s.traversal_row_lanes;
    t.vector = s.traversal_vector;
    t.position_indices = s.traversal_position_indices == 1;
  }

  // Emits the open stage as one traversal instance.
  void flush(LoopCtx& ctx, Stage& stage) {
    if (stage.empty()) return;
    const Stmt& L = *ctx.loop;
    intra::TraversalSource t;
    t.loop = Stmt::for_loop(L.var, L.loop, L.parent, stage.top, L.loc);
    schedule_traversal(t);
    // Locals of this stage that later statements of the loop use must be stored.
    std::set<std::string> later;
    for (size_t i = ctx.position; i < L.body.size(); ++i) collect_names(L.body[i], later);
    for (const std::string& local : stage.reg_locals) {
      if (!later.count(local) && !force_materialize_.count(local)) continue;
      std::string tn = temp_tensor(local);
      const Type& ty = local_types_.at(local);
      const Per per = ctx.pair_loop ? Per::Pair : ctx.node_loop && !edge_locals_.count(local) ? Per::Node : Per::Edge;
      add_tensor({tn, Role::Temp, per, ty.shape, false, ""});
      ctx.materialized[local] = tn;
      stage.writes.insert(tn);
      written_.insert(tn);
    }
    t.materialized = ctx.materialized;
    t.field_tensor = alias_;
    for (const std::string& w : stage.writes) note_write(w, false);
    std::string first = first_target(stage.top);
    t.name = unique(fmt::format("{}_{}_{}", prefix_, ctx.pair_loop ? "pairs" : ctx.node_loop ? "nodes" : "edges",
                                first.empty() ? "loop" : first));
    for (const StmtP& s : stage.top)
      if (s->kind == StmtKind::For) p_.layouts.insert(s->loop == LoopKind::OutgoingEdges ? intra::layout::kCsrBySrc : intra::layout::kCsrByDst);
    push_traversal(t);
    stage = Stage{};
    for (auto& ss : pending_segment_sums_) {
      ss.v = ctx.materialized.at(ss.v);
      p_.kernels.push_back(ss);
    }
    pending_segment_sums_.clear();
    for (Kernel& k : pending_after_stage_) {
      if (auto* wg = std::get_if<intra::WeightGradInstance>(&k); wg && ctx.materialized.count(wg->dy))
        wg->dy = ctx.materialized.at(wg->dy);  // the per-edge scalar the stage stored
      p_.kernels.push_back(std::move(k));
    }
    pending_after_stage_.clear();
    emit_gather_sums(ctx);
  }

  // Node-centric sums of per-edge temporaries, in CSR order: the deterministic replacement of scatters.
  void emit_gather_sums(const LoopCtx& ctx) {
    for (GatherSum& gs : pending_gather_sums_) {
      std::string edges = gs.is_local ? ctx.materialized.at(gs.edges) : gs.edges;
      if (gs.csr) {
        intra::GatherSumInstance sum;
        sum.x = edges;
        sum.y = gs.field;
        sum.csr = *gs.csr;
        sum.x_gather = gs.x_gather;
        sum.scale = gs.scale_is_local ? ctx.materialized.at(gs.scale) : gs.scale;
        // Adds to what an earlier kernel wrote into the field (stage bookkeeping marks it written already).
        for (const Kernel& k : p_.kernels) sum.accumulate = sum.accumulate || intra::kernel_writes(k).count(gs.field) > 0;
        sum.numel = tensor(gs.field).row_numel();
        sum.edge_batch = m_.decl.options.schedule.traversal_edge_batch;
        // auto: a warp a row (with rows of 8 lanes in the traversals and gather sums alike, variant bf16_auto_rl8,
        // the H100 ran training steps up to 0.6x as fast: bench/README.md, "Vector runs").
        sum.row_lanes = m_.decl.options.schedule.gather_sum_row_lanes == 0 ? 32 : m_.decl.options.schedule.gather_sum_row_lanes;
        sum.group_rows_below = m_.decl.options.schedule.gather_sum_group_rows_below;
        const int vector = m_.decl.options.schedule.traversal_vector;
        sum.vector = vector == 0 ? intra::kDefaultVector : vector;
        sum.name = unique(fmt::format("{}_sum_{}", prefix_, gs.field));
        sum.source = gs.source;
        note_write(gs.field, false);
        p_.kernels.push_back(sum);
        continue;
      }
      intra::TraversalSource t;
      std::string local = "$scatter";
      // for n in g.dst_nodes(): for e in n.incoming_edges(): n[field] += $scatter   (or src / outgoing)
      //                                                      n[field] += $scatter * row   (scaled_node_sum)
      const std::string edge_var = gs.row ? gs.edge_var : "e", node_var = edge_var == "n" ? "v" : "n";
      ExprP value;
      if (!edges.empty() || !gs.scale.empty()) {
        const std::string& per_edge = edges.empty() ? (gs.scale_is_local ? ctx.materialized.at(gs.scale) : gs.scale) : edges;
        Type scatter = Type::tensor(Domain::Edge, tensor(per_edge).shape);
        scatter.dep_edge = true;
        value = typed::name(local, scatter);
        t.materialized[local] = per_edge;
      }
      if (gs.row) {
        for (const auto& [l, tn] : ctx.materialized) t.materialized.try_emplace(l, tn);
        value = value ? typed::apply(Op::Mul, {value, gs.row}) : gs.row;  // scaled_node_sum checked the shape
      }
      ExprP target = typed::with_type(Expr::index(typed::name(node_var, Type::node_var()), typed::string(gs.field)),
                                      Type::tensor(Domain::Node, tensor(gs.field).shape));
      StmtP body = Stmt::assign(target, AssignOp::Add, value);
      StmtP inner = Stmt::for_loop(edge_var, gs.via_src ? LoopKind::OutgoingEdges : LoopKind::IncomingEdges, node_var, {body});
      t.loop = Stmt::for_loop(node_var, gs.via_src ? LoopKind::SrcNodes : LoopKind::DstNodes, "g", {inner});
      t.field_tensor = alias_;
      schedule_traversal(t);
      t.name = unique(fmt::format("{}_sum_{}", prefix_, gs.field));
      p_.layouts.insert(gs.via_src ? intra::layout::kCsrBySrc : intra::layout::kCsrByDst);
      note_write(gs.field, true);
      push_traversal(t);
    }
    pending_gather_sums_.clear();
  }

  // Lowers a traversal stage to its instance, given what the kernels before it stored.
  void push_traversal(const intra::TraversalSource& t) {
    std::set<std::string> before;
    for (const TensorInfo& ti : p_.tensors)
      if (ti.role == Role::Input || ti.role == Role::Weight) before.insert(ti.name);
    for (const Kernel& k : p_.kernels)
      for (const std::string& w : intra::kernel_writes(k)) before.insert(w);
    intra::TraversalInstance instance = lower_traversal(p_, t, before);
    for (const std::string& l : intra::read_layouts(instance)) p_.layouts.insert(l);  // in_pair: csr_by_dst_pairs
    if (std::string e = intra::verify_traversal(p_, instance); !e.empty())
      throw std::logic_error("lower_traversal: the instance does not verify: " + e + "\n" + intra::print_traversal(instance));
    p_.kernels.push_back(std::move(instance));
    traversal_sources_.push_back(t);
  }

  static std::string first_target(const std::vector<StmtP>& body) {
    for (const StmtP& s : body) {
      if (s->kind == StmtKind::For) {
        std::string f = first_target(s->body);
        if (!f.empty()) return f;
      }
      if (s->kind == StmtKind::Assign && s->target->kind == ExprKind::Index && s->target->args[1]->kind == ExprKind::String)
        return s->target->args[1]->name;
    }
    return "";
  }

  // ---- statements -------------------------------------------------------------------------------
  // Lowers one statement: may emit GEMMs, returns what remains for the traversal (or null).
  StmtP lower_stmt(const StmtP& s, LoopCtx& ctx, Stage& stage, const Stmt* inner, std::vector<StmtP>* inner_body) {
    if (s->kind != StmtKind::Assign) {
      d_.error(s->loc, "unsupported", "the code generator supports only assignments inside loops");
      return nullptr;
    }
    bool can_flush = !inner || inner_body->empty();
    // (1) n["f"] += [scalar *] (x * W[e.etype]) [* scalar] inside an incoming-edge loop: one GEMM that
    //     scales each row and scatters it atomically into the destination node.
    if (inner && inner->loop == LoopKind::IncomingEdges && s->op == AssignOp::Add) {
      if (fused_scatter_gemm(*s, ctx, stage, can_flush)) return nullptr;
    }
    // (2) target = [reshape](x * W): the GEMM writes the target directly.
    const ExprP& rhs = strip_reshape(s->value);
    if (s->op == AssignOp::Set && is_etype_product(rhs, ctx) && s->target->kind == ExprKind::Name && rhs == s->value) {
      // A local holding a product computed per edge type: the edges read its rows through etype[e].
      ctx.materialized[s->target->name] = etype_product(rhs, s);
      local_types_[s->target->name] = s->target->type;
      return nullptr;
    }
    if (s->op == AssignOp::Set && is_linear(rhs) && !is_etype_product(rhs, ctx)) {
      const Expr& t = *s->target;
      if (t.kind == ExprKind::Name) {
        std::string tn = temp_tensor(t.name);
        const Type& ty = s->target->type;
        local_types_[t.name] = ty;
        add_tensor({tn, Role::Temp, per_row(rows_of(ctx, inner)), ty.shape, false, ""});
        if (emit_gemm(rhs, tn, ctx, stage, inner, can_flush, s)) {
          ctx.materialized[t.name] = tn;
          return nullptr;
        }
      } else if (auto f = field_ref(s->target, ctx.edge_vars); f && f->node_role.empty()) {
        if (emit_gemm(rhs, field_tensor(f->field), ctx, stage, inner, can_flush, s)) return nullptr;
      }
    }
    // (3') e["f"] = e["g"] (a plain copy of another field of the same element, written once): alias.
    if (s->op == AssignOp::Set && is_field_of_own_element(s->value, ctx) && is_field_of_own_element(s->target, ctx)) {
      auto f = field_ref(s->target, ctx.edge_vars);
      auto src = field_ref(s->value, ctx.edge_vars);
      if (f && src && f->on_edge == src->on_edge && writes_[f->field] == 1 && tensor(f->field).role == Role::Field &&
          !stage.writes.count(field_tensor(src->field)) && !stage.reads.count(f->field)) {
        alias_[f->field] = field_tensor(src->field);
        aliased_.insert(f->field);
        return nullptr;
      }
    }
    // Backward patterns: gradients of products computed per edge type, input gradients through transposed
    // weights, and weight gradients.
    if (s->op == AssignOp::Add) {
      bool handled = false;
      StmtP def = weight_weight_grad(s, ctx, stage, inner, can_flush, handled);
      if (handled) return def;  // the per-edge value its gradients sum, or nothing
    }
    if (s->op == AssignOp::Add && etype_product_grad(s, ctx, stage, inner, can_flush)) return nullptr;
    if (s->op == AssignOp::Add) {
      if (lower_linear_t(s, ctx, stage, inner, can_flush)) return nullptr;
      if (weight_grad_target(*s->target)) {
        if (lower_weight_grad(s, ctx, stage, inner, can_flush)) return nullptr;
        return segment_sum(s, ctx, stage, inner, inner_body);
      }
    }
    // (3) e["f"] = local, where the local is a GEMM result and f is written nowhere else: alias, no copy.
    if (s->op == AssignOp::Set && s->value->kind == ExprKind::Name && ctx.materialized.count(s->value->name)) {
      if (auto f = field_ref(s->target, ctx.edge_vars); f && f->node_role.empty() && writes_[f->field] == 1 &&
                                                     tensor(f->field).role == Role::Field && !stage.reads.count(f->field)) {
        alias_[f->field] = ctx.materialized.at(s->value->name);
        aliased_.insert(f->field);
        return nullptr;
      }
    }
    // (4) Everything else stays in the traversal; linear sub-expressions become GEMMs into temporaries.
    ExprP value = extract_linears(s->value, ctx, stage, inner, can_flush, s);
    if (!value) return nullptr;
    StmtP out = Stmt::assign(s->target, s->op, value, s->loc);
    // (4') Training: a traversal statement adding into another node's field stores its value per edge; a
    //      node-centric sum adds the values up after the loop (no atomics). Sums into the rows of compact
    //      materialization (an edge's pair, a pair's source) always take this form, in every phase: the gather
    //      sums over the pair CSRs.
    auto target_ref = field_ref(s->target, ctx.edge_vars);
    const bool pair_sum = target_ref && (target_ref->via_pair || (ctx.pair_loop && !target_ref->node_role.empty()));
    if ((deterministic_ || pair_sum) && (s->op == AssignOp::Add || s->op == AssignOp::Sub)) {
      auto f = target_ref;
      bool other_node = f && !f->on_edge && !f->via_pair &&
                        (!f->node_role.empty() && !(inner && ((inner->loop == LoopKind::IncomingEdges && f->node_role == "dst") ||
                                                               (inner->loop == LoopKind::OutgoingEdges && f->node_role == "src"))));
      // The loop node's own aggregate over its inner edge loop stays in registers, except for what only the
      // PyTorch fallback computes: its index_add_ is atomic, so it too becomes per-edge values and a node sum.
      bool own_node_fallback = f && !f->on_edge && inner && !other_node && !intra::traversal_supports(value);
      if (other_node || own_node_fallback || pair_sum) {
        bool via_src = other_node ? f->node_role == "src" : !pair_sum && inner->loop == LoopKind::OutgoingEdges;
        std::optional<intra::GatherCsr> csr;
        if (pair_sum) csr = f->via_pair ? intra::GatherCsr::PairEdges : intra::GatherCsr::NodePairs;
        // A pair's sum of `scale * row` (a row of the edge's destination or the edge's own, times a per-edge scalar):
        // the gather sum reads the rows itself and scales them; only the scalar is stored per edge.
        if (csr == intra::GatherCsr::PairEdges && s->op == AssignOp::Add)
          if (std::optional<StmtP> r = scaled_pair_sum(value, field_tensor(f->field), ctx, stage, inner, s)) return *r;
        // A node's sum of `scale * row` (a row per edge type, per pair or of the other endpoint): the same, over the
        // node's edges.
        if (!csr && other_node && s->op == AssignOp::Add)
          if (std::optional<StmtP> r = scaled_node_sum(value, field_tensor(f->field), via_src, ctx, stage, inner, s))
            return *r;
        std::string local = fmt::format("{}sc{}", kSigil, wg_count_++);
        if (inner) edge_locals_.insert(local);  // stored per edge of the inner loop
        Type ty = s->target->type;
        ty.shape = tensor(field_tensor(f->field)).shape;
        local_types_[local] = ty;
        force_materialize_.insert(local);
        ExprP v = s->op == AssignOp::Sub ? typed::apply(Op::Neg, {value}) : value;
        StmtP def = Stmt::assign(typed::name(local, value_type(v->type), s->loc), AssignOp::Set, v, s->loc);
        if (!intra::traversal_supports(v)) {
          // What the traversal template cannot compute (slice, concat): PyTorch calls store the per-edge
          // values, then the sum adds them up.
          edge_locals_.erase(local);
          torch_fallback(def, def.get(), ctx, stage, inner, inner_body);
          if (!ctx.materialized.count(local)) return nullptr;  // the fallback refused it (a diagnostic says why)
          pending_gather_sums_.push_back({field_tensor(f->field), local, via_src, true, csr, {}, "", false, statement_text(s)});
          emit_gather_sums(ctx);
          return nullptr;
        }
        record_access(def, ctx, stage);
        stage.reg_locals.insert(local);
        stage.writes.insert(field_tensor(f->field));
        pending_gather_sums_.push_back({field_tensor(f->field), local, via_src, true, csr, {}, "", false, statement_text(s)});
        return def;
      }
    }
    // (5) What the traversal template cannot express falls back to PyTorch calls.
    if (!intra::traversal_supports(value)) {
      torch_fallback(out, s.get(), ctx, stage, inner, inner_body);
      return nullptr;
    }
    record_access(out, ctx, stage);
    if (s->target->kind == ExprKind::Name && s->op == AssignOp::Set) {
      stage.reg_locals.insert(s->target->name);
      local_types_[s->target->name] = s->target->type;
    }
    return out;
  }

  // The first operator of `e` that has no PyTorch template (a GEMM-only one used where no GEMM computes it).
  static const Expr* without_torch_template(const ExprP& e) {
    if (!e) return nullptr;
    if ((e->kind == ExprKind::Call || e->kind == ExprKind::Binary || e->kind == ExprKind::Neg) && e->fn != Op{} &&
        !op_info(e->fn).templates.torch)
      return e.get();
    for (const ExprP& a : e->args)
      if (const Expr* r = without_torch_template(a)) return r;
    return nullptr;
  }
  static bool contains_op(const ExprP& e, Op op) {
    if (!e) return false;
    if (e->fn == op && (e->kind == ExprKind::Call || e->kind == ExprKind::Binary)) return true;
    for (const ExprP& a : e->args)
      if (contains_op(a, op)) return true;
    return false;
  }

  // Emits one statement as a PyTorch instance, after the statements before it.
  void torch_fallback(const StmtP& s, const Stmt* original, LoopCtx& ctx, Stage& stage, const Stmt* inner, std::vector<StmtP>* inner_body) {
    if (ctx.pair_loop || writes_pair(s)) {
      d_.error(s->loc, "unsupported",
               fmt::format("'{}' needs the PyTorch fallback, which does not run over or write (source, edge type) pair "
                           "rows; use materialization: vanilla", print_expr(s->value)));
      return;
    }
    if (const Expr* e = without_torch_template(s->value)) {
      // E.g. a linear_t(w, W) that is no weight-weight product over the edge types (is_weight_weight_product).
      d_.error(e->loc, "unsupported",
               fmt::format("the code generator cannot compute '{}' here (no GEMM or traversal instance, no PyTorch "
                           "call){}", print_expr(std::make_shared<Expr>(*e)),
                           !contains_op(s->value, Op::LinearT)
                               ? ""
                               : "; a weight-weight product is computed as linear_t(w[e.etype], W[e.etype]) in an edge "
                                 "loop, both weights per edge type (W a matrix)"));
      return;
    }
    if (inner && !inner_body->empty()) {
      // The inner loop is split here: its statements so far run over every edge first (their node aggregates
      // are stored, their locals materialised), this statement next, the rest in a loop of their own. Nothing
      // after the split reads a node aggregate of the loop (the verifier's read-while-aggregating rule).
      stage.top.push_back(Stmt::for_loop(inner->var, inner->loop, inner->parent, *inner_body, inner->loc));
      inner_body->clear();
    }
    flush(ctx, stage);  // stores the locals this statement reads
    const Stmt& L = *ctx.loop;
    StmtP body = inner ? Stmt::for_loop(inner->var, inner->loop, inner->parent, {s}, inner->loc) : s;
    intra::TorchInstance t;
    t.loop = Stmt::for_loop(L.var, L.loop, L.parent, {body}, L.loc);
    const Expr& target = *s->target;
    std::string written;
    if (target.kind == ExprKind::Name) {
      written = temp_tensor(target.name);
      const Type& ty = original->target->type;
      local_types_[target.name] = ty;
      add_tensor({written, Role::Temp, per_row(rows_of(ctx, inner)), ty.shape, false, ""});
      ctx.materialized[target.name] = written;
    } else if (auto f = field_ref(s->target, ctx.edge_vars)) {
      written = field_tensor(f->field);
      // The ATen calls add into the tensor (add_, index_add_): a `+=` that writes it first starts from zero, the
      // edge's own field too. (Backward gradient fields are all written with `+=`: allocated uninitialised, they
      // gave rgat_concat wrong gradients on the GPU.)
      note_write(written, s->op != AssignOp::Set);
    }
    written_.insert(written);
    t.target = written;
    t.materialized = ctx.materialized;
    t.field_tensor = alias_;
    t.name = unique(fmt::format("{}_torch_{}", prefix_, shown(written)));
    p_.kernels.push_back(t);
  }

  // e.pair["f"] += scale * row, with `row` a full row of the edge's destination (the loop node of an incoming-edge
  // loop, or e.dst) or of the edge itself that this loop nest does not write, and `scale` the product of the other
  // factors (one value each): a gather sum over the pair's edges reads the rows and scales them, so the per-edge
  // products (E rows) are never stored; a scale that is not a plain per-edge value is computed per edge here.
  // Returns the statement left for the traversal (null: nothing), or nullopt when the value has another shape.
  // The factors of a product a * b * ... (elementwise Mul nodes), in order.
  static std::vector<ExprP> mul_factors(const ExprP& value) {
    std::vector<ExprP> factors;
    std::function<void(const ExprP&)> flatten = [&](const ExprP& e) {
      if (e->kind == ExprKind::Binary && e->op == BinOp::Mul && e->fn == Op::Mul) {
        flatten(e->args[0]);
        flatten(e->args[1]);
      } else {
        factors.push_back(e);
      }
    };
    flatten(value);
    return factors;
  }
  static int64_t elems(const ExprP& e) {
    int64_t n = 1;
    for (int64_t d : value_type(e->type).shape) n *= d;
    return n;
  }

  // The scale of a scaled sum: the product of `factors` other than the row's, as the tensor the sum reads: a plain
  // per-edge value this loop nest does not write is read as it is, anything else is a local computed per edge by
  // the open stage (its definition is returned). Empty when there is no other factor; nullopt when the traversal
  // template cannot compute it.
  std::optional<std::pair<std::string, StmtP>> sum_scale(const std::vector<ExprP>& factors, size_t row_at,
                                                         LoopCtx& ctx, Stage& stage, const Stmt* inner,
                                                         const StmtP& s, bool& is_local) {
    ExprP scale;
    for (size_t i = 0; i < factors.size(); ++i)
      if (i != row_at) scale = scale ? typed::apply(Op::Mul, {scale, factors[i]}, s->loc) : factors[i];
    is_local = false;
    if (!scale) return std::pair<std::string, StmtP>{"", nullptr};
    auto fr = field_ref(scale, ctx.edge_vars);
    const TensorDecl* in = scale->kind == ExprKind::Attr ? m_.decl.find_input(scale->name) : nullptr;
    if (in && in->per == Per::Edge && scale->args[0]->kind == ExprKind::Name && ctx.edge_vars.count(scale->args[0]->name))
      return std::pair<std::string, StmtP>{in->name, nullptr};
    if (fr && fr->on_edge && !written_after(*ctx.loop, s.get(), fr->field) && tensor(field_tensor(fr->field)).per == Per::Edge)
      return std::pair<std::string, StmtP>{field_tensor(fr->field), nullptr};
    if (!intra::traversal_supports(scale)) return std::nullopt;
    is_local = true;
    return stored_local("sc", scale, ctx, stage, inner, s->loc);
  }

  // n[f] += scale * row over the edges of a node other than the loop's own (e.dst["f"] += ... in an edge loop), with
  // `row` readable again by the node-centric sum that runs after the loop: a value computed once per edge type
  // before the loop (a weight-weight product of linear operator reordering), a pair's input or a field of the edge's
  // pair this loop nest does not write (compact materialization), or an input row of the edge's other endpoint.
  // Only the scale is stored per edge; the sum traversal multiplies it by the row it reads, so the E per-edge
  // products are never stored. Returns the statement left for the traversal, or nullopt for any other value.
  std::optional<StmtP> scaled_node_sum(const ExprP& value, const std::string& field, bool via_src, LoopCtx& ctx,
                                       Stage& stage, const Stmt* inner, const StmtP& s) {
    const int64_t numel = tensor(field).row_numel();
    if (numel <= 1 || ctx.node_loop == !inner) return std::nullopt;
    const std::string edge_var = inner ? inner->var : ctx.loop->var;
    std::vector<ExprP> factors = mul_factors(value);
    std::set<std::string> loop_written;
    written_fields(ctx.loop->body, loop_written);
    std::optional<size_t> row_at;
    for (size_t i = 0; i < factors.size(); ++i) {
      if (elems(factors[i]) == 1) continue;
      if (row_at || elems(factors[i]) != numel) return std::nullopt;
      const ExprP& x = factors[i];
      bool readable = false;
      if (x->kind == ExprKind::Name) {  // a value per edge type, computed before the loop
        auto it = ctx.materialized.find(x->name);
        readable = it != ctx.materialized.end() && tensor(it->second).per == Per::Etype;
      } else if (x->kind == ExprKind::Attr && x->args[0]->kind == ExprKind::Attr &&
                 x->args[0]->args[0]->kind == ExprKind::Name && x->args[0]->args[0]->name == edge_var) {
        // e.pair.x (a pair input) or e.src.x / e.dst.x (an input row of the endpoint the sum does not add into)
        const std::string& via = x->args[0]->name;
        const TensorDecl* in = m_.decl.find_input(x->name);
        readable = in && ((via == "pair" && in->per == Per::Pair) ||
                          (via == (via_src ? "dst" : "src") && in->per == Per::Node));
      } else if (auto fr = field_ref(x, ctx.edge_vars); fr && fr->via_pair && x->args[0]->args[0]->kind == ExprKind::Name &&
                                                       x->args[0]->args[0]->name == edge_var) {
        readable = !loop_written.count(fr->field) && tensor(field_tensor(fr->field)).per == Per::Pair;
      }
      if (!readable) return std::nullopt;
      row_at = i;
    }
    if (!row_at) return std::nullopt;
    // The sum computes scale * row: it must have the field's shape as it is (no reshape).
    ExprP product = factors[*row_at];
    for (size_t i = 0; i < factors.size(); ++i)
      if (i != *row_at) product = typed::apply(Op::Mul, {factors[i], product}, s->loc);
    if (value_type(product->type).shape != tensor(field).shape) return std::nullopt;
    bool scale_is_local = false;
    std::optional<std::pair<std::string, StmtP>> scale = sum_scale(factors, *row_at, ctx, stage, inner, s, scale_is_local);
    if (!scale) return std::nullopt;
    GatherSum gs{field, "", via_src, false, std::nullopt, intra::Gather::None, scale->first, scale_is_local,
                 statement_text(s), factors[*row_at], edge_var};
    stage.writes.insert(field);
    pending_gather_sums_.push_back(gs);
    return scale->second;
  }

  std::optional<StmtP> scaled_pair_sum(const ExprP& value, const std::string& field, LoopCtx& ctx, Stage& stage,
                                       const Stmt* inner, const StmtP& s) {
    std::vector<ExprP> factors = mul_factors(value);
    const int64_t numel = tensor(field).row_numel();
    if (numel <= 1) return std::nullopt;
    std::optional<size_t> row_at;
    std::string row_tensor;
    intra::Gather gather = intra::Gather::None;
    for (size_t i = 0; i < factors.size(); ++i) {
      if (elems(factors[i]) == 1) continue;
      if (row_at || elems(factors[i]) != numel) return std::nullopt;
      const ExprP& x = strip_reshape(factors[i]);
      const ExprP base = x->kind == ExprKind::Attr || x->kind == ExprKind::Index ? x->args[0] : nullptr;
      if (!base) return std::nullopt;
      // The edge's destination: e.dst, or the loop node of a node's incoming edges.
      const bool dst = (base->kind == ExprKind::Attr && base->name == "dst") ||
                       (base->kind == ExprKind::Name && !ctx.edge_vars.count(base->name) && inner &&
                        inner->loop == LoopKind::IncomingEdges);
      const bool own = base->kind == ExprKind::Name && ctx.edge_vars.count(base->name);
      if (!dst && !own) return std::nullopt;
      if (x->kind == ExprKind::Attr) {
        const TensorDecl* in = m_.decl.find_input(x->name);
        if (!in || in->per != (dst ? Per::Node : Per::Edge)) return std::nullopt;
        row_tensor = in->name;
      } else {
        auto fr = field_ref(x, ctx.edge_vars);
        if (!fr || fr->via_pair || written_after(*ctx.loop, s.get(), fr->field)) return std::nullopt;
        row_tensor = field_tensor(fr->field);
        if (tensor(row_tensor).per != (dst ? Per::Node : Per::Edge)) return std::nullopt;
      }
      row_at = i;
      gather = dst ? intra::Gather::Dst : intra::Gather::None;
    }
    if (!row_at || tensor(row_tensor).row_numel() != numel) return std::nullopt;
    bool scale_is_local = false;
    std::optional<std::pair<std::string, StmtP>> scale = sum_scale(factors, *row_at, ctx, stage, inner, s, scale_is_local);
    if (!scale) return std::nullopt;
    GatherSum gs{field, row_tensor, false, false, intra::GatherCsr::PairEdges, gather, scale->first, scale_is_local,
                 statement_text(s)};
    stage.writes.insert(field);
    pending_gather_sums_.push_back(gs);
    return scale->second;
  }

  static std::string statement_text(const StmtP& s) {
    return print_expr(s->target) + " " + to_string(s->op) + " " + print_expr(s->value);
  }

  // A local `$<tag>N` the open stage computes per row (per edge inside an inner loop) and stores for the kernels
  // after it: recorded in the stage and materialised when it is flushed. Returns the local and its definition.
  std::pair<std::string, StmtP> stored_local(const char* tag, const ExprP& value, LoopCtx& ctx, Stage& stage,
                                             const Stmt* inner, SourceLoc loc) {
    std::string local = fmt::format("{}{}{}", kSigil, tag, wg_count_++);
    if (inner) edge_locals_.insert(local);
    Type ty;
    ty.domain = Domain::Edge;
    ty.shape = value_type(value->type).shape;
    local_types_[local] = ty;
    force_materialize_.insert(local);
    StmtP def = Stmt::assign(typed::name(local, value_type(value->type), loc), AssignOp::Set, value, loc);
    record_access(def, ctx, stage);
    stage.reg_locals.insert(local);
    return {local, def};
  }

  // Whether a statement of the loop nest after `after` (in program order) writes field `f`: the gather sums run once
  // the loop's stage is stored, so they read what the statements up to `after` left, if nothing changes it later.
  static bool written_after(const Stmt& loop, const Stmt* after, const std::string& f) {
    bool seen = false;
    std::function<bool(const Stmt&)> walk = [&](const Stmt& l) {
      for (const StmtP& s : l.body) {
        if (s->kind == StmtKind::For) {
          if (walk(*s)) return true;
          continue;
        }
        if (s.get() == after) seen = true;
        else if (seen && s->kind == StmtKind::Assign && s->target->kind == ExprKind::Index &&
                 s->target->args[1]->kind == ExprKind::String && s->target->args[1]->name == f)
          return true;
      }
      return false;
    };
    return walk(loop) || !seen;  // not found: be safe
  }

  // Whether a statement writes a field through an edge's pair (e.pair["f"] += ...).
  static bool writes_pair(const StmtP& s) {
    const Expr& t = *s->target;
    return t.kind == ExprKind::Index && t.args[0]->kind == ExprKind::Attr && t.args[0]->name == "pair";
  }

  bool is_field_of_own_element(const ExprP& e, const LoopCtx& ctx) {
    auto f = field_ref(e, ctx.edge_vars);
    if (!f || !f->node_role.empty()) return false;
    return true;
  }

  // A per-row scalar factor: an edge (or, in node loops, node) input or field of shape [].
  std::string row_scalar_tensor(const ExprP& e, const LoopCtx& ctx, bool edge_rows) {
    if (e->kind == ExprKind::Attr && e->args[0]->kind == ExprKind::Name) {
      const TensorDecl* in = m_.decl.find_input(e->name);
      bool own = edge_rows ? ctx.edge_vars.count(e->args[0]->name) > 0 : !ctx.edge_vars.count(e->args[0]->name);
      if (in && own && in->shape.empty() && in->per == (edge_rows ? Per::Edge : Per::Node)) return in->name;
    }
    if (auto f = field_ref(e, ctx.edge_vars); f && f->node_role.empty() && f->on_edge == edge_rows &&
                                           tensor(field_tensor(f->field)).shape.empty())
      return field_tensor(f->field);
    return "";
  }

  // Splits `a * s` / `s * a` into (a, s) when s is a per-row scalar.
  std::pair<ExprP, std::string> split_scalar(const ExprP& e, const LoopCtx& ctx, bool edge_rows) {
    const ExprP& x = strip_reshape(e);
    if (x->kind == ExprKind::Binary && x->op == BinOp::Mul) {
      if (std::string s = row_scalar_tensor(x->args[1], ctx, edge_rows); !s.empty()) return {x->args[0], s};
      if (std::string s = row_scalar_tensor(x->args[0], ctx, edge_rows); !s.empty()) return {x->args[1], s};
    }
    return {e, ""};
  }

  // split_scalar, and also `s * a` where s is a per-row scalar *expression* (e.g. HGT's backward
  // `d_att / sqrt(d_k) * mu[e.etype] * e.dst.q`) and `a` a plain row read the GEMM can gather: s is computed
  // per row into a one-element temporary, the GEMM's row scalar, instead of materialising every scaled row.
  std::pair<ExprP, std::string> split_scalar_computed(const ExprP& e, LoopCtx& ctx, Stage& stage, const Stmt* inner,
                                                      const StmtP& s, bool edge_rows) {
    auto split = split_scalar(e, ctx, edge_rows);
    if (!split.second.empty() || inner) return split;
    const ExprP& x = strip_reshape(e);
    if (x->kind != ExprKind::Binary || x->op != BinOp::Mul) return split;
    for (int k : {0, 1}) {
      const ExprP& factor = x->args[static_cast<size_t>(k)];
      const ExprP& row = x->args[static_cast<size_t>(1 - k)];
      int64_t numel = 1;
      for (int64_t d : value_type(factor->type).shape) numel *= d;
      if (numel != 1 || !gemm_input(row, ctx, edge_rows) || !intra::traversal_supports(factor)) continue;
      ExprP scalar = materialize_operand(factor, ctx, stage, inner, s);
      if (!scalar || scalar->kind != ExprKind::Name || !ctx.materialized.count(scalar->name)) return split;
      return {row, ctx.materialized.at(scalar->name)};
    }
    return split;
  }

  // Where a GEMM over the loop's rows writes `target`: (tensor, scatter) or nullopt.
  std::optional<std::pair<std::string, intra::Gather>> gemm_target(const ExprP& target, const LoopCtx& ctx, const Stmt* inner) {
    auto f = field_ref(target, ctx.edge_vars);
    if (!f) return std::nullopt;
    std::string tn = field_tensor(f->field);
    bool edge_rows = inner || !ctx.node_loop;
    if (f->on_edge) return edge_rows ? std::optional(std::pair{tn, intra::Gather::None}) : std::nullopt;
    if (!edge_rows) return f->node_role.empty() ? std::optional(std::pair{tn, intra::Gather::None}) : std::nullopt;
    if (!f->node_role.empty()) return std::pair{tn, f->node_role == "src" ? intra::Gather::Src : intra::Gather::Dst};
    // the loop node inside an inner loop: the edge's destination (incoming) or source (outgoing)
    return std::pair{tn, inner && inner->loop == LoopKind::OutgoingEdges ? intra::Gather::Src : intra::Gather::Dst};
  }

  // target += linear_t(Y [* s], W[sel]): a GEMM with the weight transposed.
  bool lower_linear_t(const StmtP& s, LoopCtx& ctx, Stage& stage, const Stmt* inner, bool can_flush) {
    const ExprP& v = strip_reshape(s->value);
    if (!is_op(v, Op::LinearT)) return false;
    bool edge_rows = inner || !ctx.node_loop;
    auto target = gemm_target(s->target, ctx, inner);
    if (!target) return false;
    auto [y, scalar] = split_scalar_computed(v->args[0], ctx, stage, inner, s, edge_rows);
    if (!gemm_input(y, ctx, edge_rows)) {
      y = materialize_operand(y, ctx, stage, inner, s);
      if (!y) return false;
    }
    std::optional<Input> in = gemm_input(y, ctx, edge_rows);
    if (!in) return false;
    const ExprP& w = v->args[1];
    const ExprP& wn = w->kind == ExprKind::Index ? w->args[0] : w;
    const TensorDecl* wd = m_.decl.find_weight(wn->name);
    GemmInstance g;
    g.x = in->tensor;
    g.w = wd->name;
    g.y = target->first;
    g.rows = rows_of(ctx, inner);
    g.gather = in->gather;
    g.scatter = target->second;
    g.accumulate = true;
    g.transpose_w = true;
    g.row_scalar = scalar;
    if (!segments_for(wd, w, ctx, edge_rows, g.segments)) return false;
    if (wd->shape.size() == 3) {
      g.heads = wd->shape[0];
      g.k = wd->shape[2];
      g.n = wd->shape[1];
    } else {
      g.k = wd->shape[1];
      g.n = wd->shape[0];
      g.heads = 1;
    }
    if (tensor(g.x).row_numel() != g.heads * g.k || tensor(g.y).row_numel() != g.heads * g.n) return false;
    return push_gemm(g, s, ctx, stage, can_flush);
  }

  bool segments_for(const TensorDecl* wd, const ExprP& w, const LoopCtx& ctx, bool edge_rows, intra::Segments& out) {
    out = intra::Segments::None;
    if (wd->per == Per::Etype) {
      if (!edge_rows) return false;
      out = intra::Segments::Etype;
    } else if (wd->per == Per::Ntype) {
      const ExprP& sel = w->args[1];
      bool loop_node = sel->args[0]->kind == ExprKind::Name && !ctx.edge_vars.count(sel->args[0]->name);
      if (edge_rows || !loop_node) return false;
      out = intra::Segments::Ntype;
      p_.layouts.insert(intra::layout::kNtypePtr);
    }
    return true;
  }

  bool push_gemm(GemmInstance& g, const StmtP& s, LoopCtx& ctx, Stage& stage, bool can_flush) {
    const auto& sched = m_.decl.options.schedule;
    g.dtype = m_.decl.options.dtype;
    g.tile = sched.gemm_tile;
    g.coarsen = sched.gemm_coarsen;
    g.launch_bounds = sched.launch_bounds;
    g.source = print_expr(s->target) + " " + to_string(s->op) + " " + print_expr(s->value);
    std::set<std::string> reads{g.x, g.w, g.y};
    if (!g.row_scalar.empty()) reads.insert(g.row_scalar);
    if (hazard(stage, reads, g.y)) {
      if (!can_flush) return false;
      flush(ctx, stage);
    }
    if ((deterministic_ || g.rows == intra::Rows::Pairs) && g.scatter != intra::Gather::None) {
      // The GEMM stores one row per edge (per pair); a node-centric sum (after this loop's stage) adds them up.
      const bool pairs = g.rows == intra::Rows::Pairs;
      std::string tn = fresh(derived_name("t", derived_name(g.y, pairs ? "pairs" : "edges")));
      add_tensor({tn, Role::Temp, per_row(g.rows), tensor(g.y).shape, false, ""});
      std::optional<intra::GatherCsr> csr;
      if (pairs) csr = intra::GatherCsr::NodePairs;
      pending_gather_sums_.push_back({g.y, tn, g.scatter == intra::Gather::Src, false, csr, {}, "", false, g.source});
      stage.writes.insert(g.y);  // later readers of the node field wait for the sum
      g.y = tn;
      g.scatter = intra::Gather::None;
      g.accumulate = false;
    }
    note_write(g.y, g.accumulate || g.scatter != intra::Gather::None);
    g.name = unique(fmt::format("{}_gemm_{}", prefix_, shown(g.y)));
    p_.kernels.push_back(g);
    return true;
  }

  const TensorDecl* weight_grad_target(const Expr& t) const {
    const std::string& n = t.kind == ExprKind::Name ? t.name : t.kind == ExprKind::Index && t.args[0]->kind == ExprKind::Name ? t.args[0]->name : "";
    const TensorDecl* o = m_.decl.find_output(n);
    return o && o->per != Per::Node && o->per != Per::Edge ? o : nullptr;
  }

  intra::Segments weight_grad_segments(const TensorDecl* o) {
    if (o->per == Per::Etype) return intra::Segments::Etype;
    if (o->per == Per::Ntype) {
      p_.layouts.insert(intra::layout::kNtypePtr);
      return intra::Segments::Ntype;
    }
    return intra::Segments::None;
  }

  // d_W[sel] += outer(X, DY [* s]): a grouped weight-gradient GEMM.
  bool lower_weight_grad(const StmtP& s, LoopCtx& ctx, Stage& stage, const Stmt* inner, bool can_flush) {
    const TensorDecl* o = weight_grad_target(*s->target);
    const ExprP& v = s->value;
    if (!is_op(v, Op::Outer) || o->shape.size() < 2) return false;
    bool edge_rows = inner || !ctx.node_loop;
    if ((o->per == Per::Etype) != edge_rows && o->per != Per::None) return false;
    if (o->per == Per::Ntype && edge_rows) return false;
    ExprP x_expr = v->args[0];
    auto [dy_expr, scalar] = split_scalar_computed(v->args[1], ctx, stage, inner, s, edge_rows);
    // Operands that are not plain row reads are computed by the traversal into temporaries first.
    if (!gemm_input(x_expr, ctx, edge_rows)) x_expr = materialize_operand(x_expr, ctx, stage, inner, s);
    if (!gemm_input(dy_expr, ctx, edge_rows)) dy_expr = materialize_operand(dy_expr, ctx, stage, inner, s);
    if (!x_expr || !dy_expr) return false;
    auto x = gemm_input(x_expr, ctx, edge_rows);
    auto dy = gemm_input(dy_expr, ctx, edge_rows);
    if (!x || !dy) return false;
    intra::WeightGradInstance w;
    w.x = x->tensor;
    w.x_gather = x->gather;
    w.dy = dy->tensor;
    w.dy_gather = dy->gather;
    w.row_scalar = scalar;
    w.dw = o->name;
    w.rows = rows_of(ctx, inner);
    w.segments = weight_grad_segments(o);
    if (o->shape.size() == 3) {
      w.heads = o->shape[0];
      w.k = o->shape[1];
      w.n = o->shape[2];
    } else {
      w.k = o->shape[0];
      w.n = o->shape[1];
    }
    if (tensor(w.x).row_numel() != w.heads * w.k || tensor(w.dy).row_numel() != w.heads * w.n) return false;
    w.dtype = m_.decl.options.dtype;
    w.kernel = intra::choose_wgrad_kernel(w);
    w.source = print_expr(s->target) + " += " + print_expr(s->value);
    std::set<std::string> reads{w.x, w.dy};
    if (!scalar.empty()) reads.insert(scalar);
    if (hazard(stage, reads, w.dw)) {
      if (!can_flush) return false;
      flush(ctx, stage);
    }
    // The first kernel writing dW overwrites it (no zeroing needed); later ones add into it.
    w.accumulate = written_.count(w.dw) > 0;
    note_write(w.dw, w.accumulate);
    w.name = unique(fmt::format("{}_wgrad_{}", prefix_, o->name));
    if (w.segments == intra::Segments::Etype) p_.layouts.insert(intra::layout::kSortedCoo);
    p_.kernels.push_back(w);
    return true;
  }

  // Computes `e` per row in the open traversal stage, stores it, and closes the stage; returns a read of it.
  ExprP materialize_operand(const ExprP& e, LoopCtx& ctx, Stage& stage, const Stmt* inner, const StmtP& s) {
    if (inner) return nullptr;
    std::string local = fmt::format("{}op{}", kSigil, wg_count_++);
    Type ty;
    ty.domain = ctx.node_loop ? Domain::Node : Domain::Edge;
    ty.shape = value_type(e->type).shape;
    local_types_[local] = ty;
    force_materialize_.insert(local);
    ExprP value = extract_linears(e, ctx, stage, inner, true, s);
    if (!value) return nullptr;
    StmtP def = Stmt::assign(typed::name(local, value_type(value->type), e->loc), AssignOp::Set, value, e->loc);
    if (!intra::traversal_supports(value)) {
      torch_fallback(def, def.get(), ctx, stage, inner, nullptr);  // e.g. concat: stored by PyTorch calls
      return typed::name(local, value_type(e->type), e->loc);
    }
    record_access(def, ctx, stage);
    stage.reg_locals.insert(local);
    stage.top.push_back(def);
    flush(ctx, stage);
    return typed::name(local, value_type(e->type), e->loc);
  }

  // d_W[sel] += v (any per-row value): the traversal stores v per row; a segment sum reduces it.
  StmtP segment_sum(const StmtP& s, LoopCtx& ctx, Stage& stage, const Stmt* inner, std::vector<StmtP>* inner_body) {
    const TensorDecl* o = weight_grad_target(*s->target);
    if (inner && o->per == Per::Ntype) {
      // The rows of an inner loop are edges; a per-node-type gradient would need the node's type per edge.
      d_.error(s->loc, "unsupported",
               "a per-node-type weight gradient accumulated inside an inner edge loop is not supported yet; "
               "accumulate it in the node loop");
      return nullptr;
    }
    if (o->per == Per::Etype) {
      // d_W[e.etype] += s_e · x_e: only s_e is stored per edge; a weight gradient with n = 1 sums x's rows.
      std::string sum;
      if (StmtP def = deferred_scaled_sum(s->value, ctx, stage, inner, true, s, sum, o)) return def;
    }
    std::string local = fmt::format("{}wg{}", kSigil, wg_count_++);
    Type ty = s->target->type;
    local_types_[local] = ty;
    force_materialize_.insert(local);
    // Inside an inner edge loop the value is stored per edge (edges are numbered in edge-type order, so the
    // segment sum reduces each type's edges in a fixed order: no atomics, bit-reproducible).
    if (inner) edge_locals_.insert(local);
    intra::SegmentSumInstance ss;
    ss.v = local;  // resolved to the materialised tensor at flush
    ss.dw = o->name;
    ss.rows = rows_of(ctx, inner);
    ss.segments = weight_grad_segments(o);
    ss.numel = 1;
    for (int64_t d : o->shape) ss.numel *= d;
    note_write(o->name, /*accumulates=*/true);
    ss.name = unique(fmt::format("{}_segsum_{}", prefix_, o->name));
    ss.source = print_expr(s->target) + " += " + print_expr(s->value);
    ExprP value = extract_linears(s->value, ctx, stage, inner, true, s);
    if (!value) return nullptr;
    StmtP out = Stmt::assign(typed::name(local, value_type(value->type), s->loc), AssignOp::Set, value, s->loc);
    if (!intra::traversal_supports(value)) {
      // What the traversal template cannot compute (slice, concat): PyTorch calls store v per row first.
      if (inner) edge_locals_.erase(local);  // the fallback stores it per edge itself
      torch_fallback(out, out.get(), ctx, stage, inner, inner_body);
      if (!ctx.materialized.count(local)) return nullptr;  // the fallback refused it (a diagnostic says why)
      ss.v = ctx.materialized.at(local);
      p_.kernels.push_back(ss);
      return nullptr;
    }
    pending_segment_sums_.push_back(ss);
    record_access(out, ctx, stage);
    stage.reg_locals.insert(local);
    return out;
  }

  // The tensors an expression reads (fields, materialised locals, inputs, weights).
  std::set<std::string> expr_reads(const ExprP& e, const LoopCtx& ctx) const {
    std::set<std::string> out;
    std::function<void(const ExprP&)> walk = [&](const ExprP& x) {
      if (auto f = field_ref(x, ctx.edge_vars)) out.insert(field_tensor(f->field));
      if (x->kind == ExprKind::Name) {
        if (auto it = ctx.materialized.find(x->name); it != ctx.materialized.end()) out.insert(it->second);
        if (m_.decl.find_weight(x->name)) out.insert(x->name);
      }
      if (x->kind == ExprKind::Attr && m_.decl.find_input(x->name)) out.insert(x->name);
      for (const ExprP& a : x->args) walk(a);
    };
    walk(e);
    return out;
  }

  void record_access(const StmtP& s, const LoopCtx& ctx, Stage& stage) {
    std::function<void(const ExprP&)> reads = [&](const ExprP& e) {
      if (auto f = field_ref(e, ctx.edge_vars)) stage.reads.insert(field_tensor(f->field));
      if (e->kind == ExprKind::Name) {
        if (auto it = ctx.materialized.find(e->name); it != ctx.materialized.end()) stage.reads.insert(it->second);
        if (m_.decl.find_weight(e->name)) stage.reads.insert(e->name);
      }
      if (e->kind == ExprKind::Attr && m_.decl.find_input(e->name)) stage.reads.insert(e->name);
      for (const ExprP& a : e->args) reads(a);
    };
    reads(s->value);
    if (auto f = field_ref(s->target, ctx.edge_vars)) {
      std::string tn = field_tensor(f->field);
      if (s->op != AssignOp::Set) stage.reads.insert(tn);
      stage.writes.insert(tn);
      // An edge loop scattering into a node field accumulates from zero.
      bool scatter = !f->node_role.empty();
      if (scatter) note_write(tn, true);
    }
  }

  ExprP extract_linears(const ExprP& e, LoopCtx& ctx, Stage& stage, const Stmt* inner, bool can_flush, const StmtP& s) {
    if (is_etype_product(e, ctx)) {
      std::string tn = etype_product(e, s);
      std::string local = kSigil + tn;
      ctx.materialized[local] = tn;
      local_types_[local] = value_type(e->type);
      return typed::name(local, value_type(e->type), e->loc);
    }
    if (is_linear(e)) {
      std::string tn = fresh(derived_name("t", fmt::format("lin_{}", p_.kernels.size())));
      Type ty = value_type(e->type);
      add_tensor({tn, Role::Temp, per_row(rows_of(ctx, inner)), ty.shape, false, ""});
      if (!emit_gemm(e, tn, ctx, stage, inner, can_flush, s)) return nullptr;
      std::string local = tn.substr(1);  // $lin_3
      ctx.materialized[local] = tn;
      local_types_[local] = ty;
      return typed::name(local, ty, e->loc);
    }
    if (e->args.empty()) return e;
    std::vector<ExprP> args;
    for (const ExprP& a : e->args) {
      ExprP r = extract_linears(a, ctx, stage, inner, can_flush, s);
      if (!r) return nullptr;
      args.push_back(r);
    }
    return typed::rebuild(e, std::move(args), ctx_);
  }

  // The GEMM's input rows: which tensor, gathered how. Null when the input is not a plain row read.
  struct Input {
    std::string tensor;
    intra::Gather gather = intra::Gather::None;
    std::vector<int64_t> shape;
  };

  std::optional<Input> gemm_input(const ExprP& x0, const LoopCtx& ctx, bool edge_rows) {
    const ExprP& x = strip_reshape(x0);
    auto node_gather = [&](const ExprP& base) -> std::optional<intra::Gather> {
      if (base->kind == ExprKind::Name && !ctx.edge_vars.count(base->name)) {
        if (!edge_rows) return intra::Gather::None;
        return intra::Gather::Dst;  // the loop node of an incoming-edge loop is each edge's destination
      }
      if (base->kind == ExprKind::Attr && edge_rows) return base->name == "src" ? intra::Gather::Src : intra::Gather::Dst;
      return std::nullopt;
    };
    if (x->kind == ExprKind::Attr) {
      const TensorDecl* in = m_.decl.find_input(x->name);
      if (!in) return std::nullopt;
      // (a pair loop's rows are the pairs: p.x of a per-pair input is the row itself)
      if (in->per == Per::Edge || (in->per == Per::Pair && ctx.pair_loop)) return Input{in->name, intra::Gather::None, in->shape};
      auto g = node_gather(x->args[0]);
      if (!g) return std::nullopt;
      return Input{in->name, *g, in->shape};
    }
    if (auto f = field_ref(x, ctx.edge_vars)) {
      std::string tn = field_tensor(f->field);
      if (f->on_edge) return Input{tn, intra::Gather::None, tensor(tn).shape};
      auto g = node_gather(x->args[0]);
      if (!g) return std::nullopt;
      return Input{tn, *g, tensor(tn).shape};
    }
    if (x->kind == ExprKind::Name) {
      auto it = ctx.materialized.find(x->name);
      if (it != ctx.materialized.end()) return Input{it->second, intra::Gather::None, tensor(it->second).shape};
    }
    return std::nullopt;
  }

  bool hazard(const Stage& stage, const std::set<std::string>& reads, const std::string& write) {
    for (const auto& r : reads)
      if (stage.writes.count(r)) return true;
    return stage.writes.count(write) || stage.reads.count(write);
  }

  // Emits `y = x * W` (or the scatter form) as a GEMM instance. Returns false after reporting when the
  // input cannot be read as rows.
  bool emit_gemm(const ExprP& lin, const std::string& y, LoopCtx& ctx, Stage& stage, const Stmt* inner,
                 bool can_flush, const StmtP& s, const std::string& scalar = "", bool scatter = false) {
    const ExprP& x = lin->args[0];  // x * W and linear(x, W) alike
    const ExprP& w = lin->args[1];
    bool edge_rows = inner || !ctx.node_loop;
    std::optional<Input> in = gemm_input(x, ctx, edge_rows);
    if (!in && x->kind == ExprKind::Index && x->args[0]->kind == ExprKind::Name && m_.decl.find_weight(x->args[0]->name)) {
      d_.error(x->loc, "unsupported",
               "a weight row as the input of a linear transform is supported as V[e.etype] (V per etype) in an edge "
               "loop, projected by a shared weight (per: none)");
      return false;
    }
    if (!in) {
      d_.error(x->loc, "unsupported",
               "the code generator needs the input of a linear transform to be a node or edge tensor read "
               "(an input, a field, or a local computed by a linear transform); assign it to a field first");
      return false;
    }
    const ExprP& wn = w->kind == ExprKind::Index ? w->args[0] : w;
    const TensorDecl* wd = m_.decl.find_weight(wn->name);
    GemmInstance g;
    g.x = in->tensor;
    g.w = wd->name;
    g.y = y;
    g.rows = rows_of(ctx, inner);
    g.gather = in->gather;
    g.scatter = scatter ? intra::Gather::Dst : intra::Gather::None;
    g.row_scalar = scalar;
    if (!segments_for(wd, w, ctx, edge_rows, g.segments)) {
      d_.error(w->loc, "unsupported",
               wd->per == Per::Etype
                   ? "a per-edge-type weight needs an edge loop"
                   : "the code generator supports per-node-type weights only in node loops, indexed by the loop node "
                     "(compute the projection in a node loop and read the field through e.src / e.dst)");
      return false;
    }
    int64_t in_numel = 1;
    for (int64_t d : in->shape) in_numel *= d;
    if (wd->shape.size() == 3) {
      g.heads = wd->shape[0];
      g.k = wd->shape[1];
      g.n = wd->shape[2];
    } else {
      g.k = wd->shape[0];
      g.n = wd->shape[1];
      g.heads = in_numel / g.k;  // the same weight applied to each of the row's sub-vectors
    }
    if (push_gemm(g, s, ctx, stage, can_flush)) return true;
    d_.error(s->loc, "unsupported", "this linear transform depends on a value computed earlier in the same "
                                    "inner edge loop; split the loop");
    return false;
  }

  // ---- products that depend only on the edge type ---------------------------------------------------
  // linear(V[e.etype], W) in an edge loop, V a per-edge-type weight (a weight row as the transform's input)
  // and W shared: every edge of a type has the same row. It is computed once per edge type (a GEMM over the
  // edge types, X = V) and the edges read their type's row; its gradients go through the per-type sum of the
  // edges' gradients (etype_product_grad).

  // V's declaration when `x` is V[e.etype] for an edge variable e of the loop, else null.
  const TensorDecl* etype_row(const ExprP& x, const LoopCtx& ctx) const {
    if (x->kind != ExprKind::Index || x->args[0]->kind != ExprKind::Name) return nullptr;
    const TensorDecl* v = m_.decl.find_weight(x->args[0]->name);
    const ExprP& sel = x->args[1];
    if (!v || v->per != Per::Etype || sel->kind != ExprKind::Attr || sel->name != "etype") return nullptr;
    if (sel->args[0]->kind != ExprKind::Name || !ctx.edge_vars.count(sel->args[0]->name)) return nullptr;
    return v;
  }
  // The shared weight W of `x * W` / linear_t(y, W) (a matrix), else null.
  const TensorDecl* shared_matrix(const ExprP& w) const {
    if (w->kind != ExprKind::Name) return nullptr;
    const TensorDecl* d = m_.decl.find_weight(w->name);
    return d && d->per == Per::None && d->shape.size() == 2 ? d : nullptr;
  }
  // W's declaration when `w` is W[e.etype] with W a per-edge-type matrix, else null.
  const TensorDecl* etype_matrix(const ExprP& w, const LoopCtx& ctx) const {
    const TensorDecl* d = etype_row(w, ctx);
    return d && d->shape.size() == 2 ? d : nullptr;
  }
  // linear_t(w[e.etype], W[e.etype]) = W[r] · w[r] (reorder-linear's weight-weight product; w may be a reshaped
  // view): both operands per edge type, W a matrix whose columns match w's elements.
  bool is_weight_weight_product(const ExprP& e, const LoopCtx& ctx) const {
    if (!is_op(e, Op::LinearT)) return false;
    const TensorDecl* v = etype_row(strip_reshape(e->args[0]), ctx);
    const TensorDecl* w = etype_matrix(e->args[1], ctx);
    if (!v || !w) return false;
    int64_t numel = 1;
    for (int64_t d : v->shape) numel *= d;
    return numel == w->shape[1];
  }
  bool is_etype_product(const ExprP& e, const LoopCtx& ctx) const {
    return (is_linear(e) && etype_row(e->args[0], ctx) && shared_matrix(e->args[1])) || is_weight_weight_product(e, ctx);
  }

  // t[r] = V[r] · W over the edge types, once per product and phase; returns t (a row per edge type).
  // The weight-weight product linear_t(w[e.etype], W[e.etype]) is the same GEMM with each row's own weight
  // (segments=etype: row r is segment r) transposed: t[r] = w[r] · W[r]^T, K values per relation, recomputed
  // every phase (the weights train).
  std::string etype_product(const ExprP& lin, const StmtP& s) {
    const bool ww = is_op(lin, Op::LinearT);
    const ExprP& row = strip_reshape(lin->args[0]);
    const ExprP& wsel = lin->args[1];
    const std::string w_name = wsel->kind == ExprKind::Index ? wsel->args[0]->name : wsel->name;
    std::string key = print_expr(row->args[0]) + (ww ? " ^T* " : " * ") + w_name;
    if (auto it = etype_products_.find(key); it != etype_products_.end()) return it->second;
    const TensorDecl* v = m_.decl.find_weight(row->args[0]->name);
    const TensorDecl* w = m_.decl.find_weight(w_name);
    std::string tn = fresh(derived_name("t", derived_name(v->name, w->name)));  // t$rel_emb$W_r
    add_tensor({tn, Role::Temp, Per::Etype, value_type(lin->type).shape, false, ""});
    GemmInstance g;
    g.x = v->name;
    g.w = w->name;
    g.y = tn;
    g.rows = intra::Rows::Etypes;
    if (ww) {
      g.segments = intra::Segments::Etype;
      g.transpose_w = true;
      g.k = w->shape[1];
      g.n = w->shape[0];
      g.heads = 1;
    } else {
      g.k = w->shape[0];
      g.n = w->shape[1];
      g.heads = tensor(v->name).row_numel() / g.k;  // the same weight applied to each of the row's sub-vectors
    }
    note_write(tn, false);
    const auto& sched = m_.decl.options.schedule;
    g.dtype = m_.decl.options.dtype;
    g.tile = sched.gemm_tile;
    g.coarsen = sched.gemm_coarsen;
    g.launch_bounds = sched.launch_bounds;
    g.source = print_expr(s->target) + " " + to_string(s->op) + " " + print_expr(s->value);
    g.name = unique(fmt::format("{}_gemm_{}", prefix_, tn.substr(2)));
    p_.kernels.push_back(g);  // reads weights only: it may run before anything else of the loop
    etype_products_[key] = tn;
    return tn;
  }

  // The backward of a product computed per edge type. With Y the edges' gradient of linear(V[e.etype], W)
  // and S[t] the sum of Y over the edges of type t (a deterministic segment sum):
  //   d_V[e.etype] += linear_t(Y, W)   becomes  d_V[t] += S[t] · W^T      (a GEMM over the edge types)
  //   d_W += outer(V[e.etype], Y)      becomes  d_W += sum_t V[t]^T · S[t]  (a weight gradient over them)
  bool etype_product_grad(const StmtP& s, LoopCtx& ctx, Stage& stage, const Stmt* inner, bool can_flush) {
    const TensorDecl* o = weight_grad_target(*s->target);
    if (!o || ctx.pair_loop || !(inner || !ctx.node_loop)) return false;
    const ExprP& v = s->value;
    const TensorDecl* w = nullptr;  // the shared weight (d_V) or the weight row's V (d_W)
    ExprP y;
    bool input_grad = is_op(v, Op::LinearT);
    if (input_grad) {
      const Expr& t = *s->target;
      bool by_etype = o->per == Per::Etype && t.kind == ExprKind::Index && t.args[1]->kind == ExprKind::Attr &&
                      t.args[1]->name == "etype" && t.args[1]->args[0]->kind == ExprKind::Name &&
                      ctx.edge_vars.count(t.args[1]->args[0]->name);
      w = shared_matrix(v->args[1]);
      if (!by_etype || !w) return false;
      y = v->args[0];
    } else if (is_op(v, Op::Outer) && o->per == Per::None && o->shape.size() == 2) {
      w = etype_row(v->args[0], ctx);
      if (!w) return false;
      y = v->args[1];
    } else {
      return false;
    }
    std::string sum = etype_sum(y, ctx, stage, inner, can_flush, s);
    if (sum.empty()) return false;
    const TensorInfo& st = tensor(sum);
    std::string source = print_expr(s->target) + " " + to_string(s->op) + " " + print_expr(s->value);
    if (input_grad) {
      GemmInstance g;
      g.x = sum;
      g.w = w->name;
      g.y = o->name;
      g.rows = intra::Rows::Etypes;
      g.accumulate = true;
      g.transpose_w = true;
      g.k = w->shape[1];
      g.n = w->shape[0];
      g.heads = st.row_numel() / g.k;
      if (st.row_numel() != g.heads * g.k || tensor(o->name).row_numel() != g.heads * g.n) return false;
      return push_gemm(g, s, ctx, stage, can_flush);
    }
    intra::WeightGradInstance wg;
    wg.x = w->name;
    wg.dy = sum;
    wg.dw = o->name;
    wg.rows = intra::Rows::Etypes;
    wg.k = o->shape[0];
    wg.n = o->shape[1];
    if (tensor(wg.x).row_numel() != wg.k || st.row_numel() != wg.n) return false;
    wg.dtype = m_.decl.options.dtype;
    wg.kernel = intra::choose_wgrad_kernel(wg);
    wg.source = source;
    if (hazard(stage, {wg.x, wg.dy}, wg.dw)) {
      if (!can_flush) return false;
      flush(ctx, stage);
    }
    wg.accumulate = written_.count(wg.dw) > 0;
    note_write(wg.dw, wg.accumulate);
    wg.name = unique(fmt::format("{}_wgrad_{}", prefix_, o->name));
    p_.kernels.push_back(wg);
    return true;
  }

  // The backward of the weight-weight product P[r] = linear_t(w[r], W[r]) = W[r] · w[r]. autodiff gives, per
  // edge, with Y the edge's gradient of P[e.etype] (K values):
  //   d_w[e.etype] += [reshape] linear(Y, W[e.etype])      d_W[e.etype] += outer(Y, [reshape] w[e.etype])
  // Both are linear in Y, and both weights are the edge type's: with S[t] the sum of Y over the edges of type t
  // (etype_sum, deterministic), they are etype-row GEMMs with each row's own weight (segments=etype):
  //   d_w[t] += S[t] · W[t]                                (k = K, n = D)
  //   d_W[t] += S[t]ᵀ · w[t], i.e. outer(S[t], w[t])        (K heads of k = 1, n = D: head i is row i of d_W[t])
  // R rows each instead of E: no per-edge d_w rows, no per-edge copy of w, no atomics.
  // Returns the statement the traversal runs for it (Y per edge, stored for the segment sum), or null; `handled`
  // says whether the statement was lowered so.
  StmtP weight_weight_grad(const StmtP& s, LoopCtx& ctx, Stage& stage, const Stmt* inner, bool can_flush, bool& handled) {
    handled = false;
    const TensorDecl* o = weight_grad_target(*s->target);
    if (!o || !(inner || !ctx.node_loop)) return nullptr;
    const Expr& t = *s->target;
    bool by_etype = o->per == Per::Etype && t.kind == ExprKind::Index && t.args[1]->kind == ExprKind::Attr &&
                    t.args[1]->name == "etype" && t.args[1]->args[0]->kind == ExprKind::Name &&
                    ctx.edge_vars.count(t.args[1]->args[0]->name);
    if (!by_etype) return nullptr;
    const ExprP& v = strip_reshape(s->value);
    const TensorDecl* w = nullptr;  // d_w: the matrix W; d_W: the vector w
    ExprP y;
    bool vector_grad = is_linear(v);
    if (vector_grad) {
      w = etype_matrix(v->args[1], ctx);
      if (!w || w->shape[1] != tensor(o->name).row_numel()) return nullptr;
      y = v->args[0];
    } else if (is_op(v, Op::Outer) && s->value == v && o->shape.size() == 2) {
      w = etype_row(strip_reshape(v->args[1]), ctx);
      if (!w || tensor(w->name).row_numel() != o->shape[1]) return nullptr;
      y = v->args[0];
    } else {
      return nullptr;
    }
    int64_t y_numel = 1;
    for (int64_t d : value_type(y->type).shape) y_numel *= d;
    if (y_numel != (vector_grad ? w->shape[0] : o->shape[0])) return nullptr;
    // d_w and d_W sum the same Y (autodiff spells it out for each): computed and summed once, while nothing Y
    // reads is written in between.
    const std::string key = print_expr(y);
    const std::set<std::string> reads = expr_reads(y, ctx);
    std::string sum;
    bool deferred = false;
    if (auto it = ww_sums_.find(key); it != ww_sums_.end() && it->second.loop == ctx.loop) {
      bool fresh_sum = true;
      for (size_t k = it->second.kernels; k < p_.kernels.size(); ++k)
        for (const std::string& w : intra::kernel_writes(p_.kernels[k])) fresh_sum = fresh_sum && !reads.count(w);
      for (const std::string& w : stage.writes) fresh_sum = fresh_sum && !reads.count(w);
      if (fresh_sum) {
        sum = it->second.sum;
        deferred = pending_sum(sum);  // S's kernel waits for the open stage: so must its readers
      }
    }
    std::optional<Input> plain = gemm_input(y, ctx, true);
    StmtP def;
    if (sum.empty() && !(plain && plain->gather == intra::Gather::None)) {
      // Y = s_e · x (RGAT: the attention gradient times e.src.feature): only s_e is stored per edge, and S is a
      // weight gradient over the edges, S[t] = Σ x[G(e)]ᵀ · s_e (k = x's width, n = 1): no E x K temporary.
      def = deferred_scaled_sum(y, ctx, stage, inner, can_flush, s, sum);
      deferred = def != nullptr;
      bool cacheable = true;
      for (const std::string& w : stage.writes) cacheable = cacheable && !reads.count(w);
      if (deferred && cacheable) ww_sums_[key] = {sum, p_.kernels.size(), ctx.loop};
    }
    if (sum.empty() && !(plain && plain->gather == intra::Gather::None)) {
      // Y is computed per edge in the open traversal stage and stored; its segment sum and the GEMMs run after the
      // stage's kernel (flush), so the loop is not cut here: the statements after it share the traversal.
      def = deferred_etype_sum(y, ctx, stage, inner, can_flush, s, sum);
      deferred = def != nullptr;
      bool cacheable = true;  // nothing the stage wrote before Y is read by Y (see the freshness check above)
      for (const std::string& w : stage.writes) cacheable = cacheable && !reads.count(w);
      if (deferred && cacheable) ww_sums_[key] = {sum, p_.kernels.size(), ctx.loop};
    }
    if (sum.empty()) {
      sum = etype_sum(y, ctx, stage, inner, can_flush, s);
      if (sum.empty()) return nullptr;
      ww_sums_[key] = {sum, p_.kernels.size(), ctx.loop};
    }
    GemmInstance g;
    g.x = sum;
    g.w = w->name;
    g.y = o->name;
    g.rows = intra::Rows::Etypes;
    g.segments = intra::Segments::Etype;
    g.accumulate = true;
    if (vector_grad) {
      g.k = w->shape[0];
      g.n = w->shape[1];
      g.heads = 1;
    } else {
      g.k = 1;
      g.n = o->shape[1];
      g.heads = o->shape[0];
    }
    if (deferred) {
      // After the stage's kernel and S's segment sum (flush): it reads S and weights only, and writes a gradient
      // no traversal reads.
      const auto& sched = m_.decl.options.schedule;
      g.dtype = m_.decl.options.dtype;
      g.tile = sched.gemm_tile;
      g.coarsen = sched.gemm_coarsen;
      g.launch_bounds = sched.launch_bounds;
      g.source = print_expr(s->target) + " " + to_string(s->op) + " " + print_expr(s->value);
      note_write(g.y, true);
      g.name = unique(fmt::format("{}_gemm_{}", prefix_, shown(g.y)));
      pending_after_stage_.push_back(g);
      handled = true;
      return def;
    }
    handled = push_gemm(g, s, ctx, stage, can_flush);
    return nullptr;
  }

  // Whether the kernel computing `sum` waits for the open stage's kernel (flush).
  bool pending_sum(const std::string& sum) const {
    for (const intra::SegmentSumInstance& ss : pending_segment_sums_)
      if (ss.dw == sum) return true;
    for (const Kernel& k : pending_after_stage_)
      if (intra::kernel_writes(k).count(sum)) return true;
    return false;
  }

  // S[t] = the sum over the edges e of type t of s_e · x_e, for y = s · x (either order) with s a per-edge scalar
  // expression and x a row of an input the weight-gradient kernel can gather (e.src.feature): the open stage
  // computes s per edge (the statement returned) and stores it; after the stage's kernel, a weight gradient over the
  // edges in per-type segments, S[t] = Σ x[G(e)]ᵀ · s_e, k = x's width and n = 1 (deterministic split-K). Sets `sum`
  // to S; null when y has no such form. (x is read after the stage: an input, which no kernel of the phase writes.)
  // S is a new per-type temporary, or with `target` (a per-edge-type weight's gradient of x's size) that gradient,
  // added to: d_W[e.etype] += s_e · x_e without a row of s_e · x_e stored per edge for a segment sum.
  StmtP deferred_scaled_sum(const ExprP& y, LoopCtx& ctx, Stage& stage, const Stmt* inner, bool can_flush, const StmtP& s,
                            std::string& sum, const TensorDecl* target = nullptr) {
    if (ctx.node_loop && !inner) return nullptr;
    const ExprP& e = strip_reshape(y);
    if (e->kind != ExprKind::Binary || e->op != BinOp::Mul) return nullptr;
    for (size_t k : {size_t{0}, size_t{1}}) {
      const ExprP& factor = e->args[k];
      const ExprP& row = e->args[1 - k];
      int64_t numel = 1;
      for (int64_t d : value_type(factor->type).shape) numel *= d;
      std::optional<Input> in = gemm_input(row, ctx, true);
      if (numel != 1 || !in || tensor(in->tensor).role != Role::Input) continue;
      int64_t target_numel = 1;
      if (target)
        for (int64_t d : target->shape) target_numel *= d;
      // (into a gradient: rows of 32 elements or more, which the kernel's lanes span; a scalar per row stays a
      // segment sum, which spreads the rows over the lanes)
      const int64_t x_numel = tensor(in->tensor).row_numel();
      if (target ? x_numel != target_numel || x_numel < 32 : value_type(row->type).shape.size() != 1) continue;
      ExprP value = extract_linears(factor, ctx, stage, inner, can_flush, s);
      if (!value || !intra::traversal_supports(value)) return nullptr;
      auto [local, def] = stored_local("op", value, ctx, stage, inner, y->loc);
      intra::WeightGradInstance wg;
      wg.x = in->tensor;
      wg.x_gather = in->gather;
      wg.dy = local;  // resolved to the materialised tensor at flush
      if (target) {
        wg.dw = target->name;
      } else {
        wg.dw = fresh(derived_name("t" + local, "per_etype"));  // t$op1$per_etype
        add_tensor({wg.dw, Role::Temp, Per::Etype, value_type(y->type).shape, false, ""});
      }
      wg.rows = rows_of(ctx, inner);  // the edges, or a pair loop's pairs (each with its edge type)
      wg.segments = intra::Segments::Etype;
      // A temporary's only write; a gradient is added to, as the segment sum it replaces (zeroed before its first
      // write, whatever order the kernels of the stage run in).
      wg.accumulate = target != nullptr;
      wg.heads = 1;
      wg.k = tensor(in->tensor).row_numel();
      wg.n = 1;
      wg.dtype = m_.decl.options.dtype;
      wg.kernel = intra::choose_wgrad_kernel(wg);
      wg.source = target ? print_expr(s->target) + " += " + print_expr(s->value)
                         : fmt::format("{}[t] = sum over the {} of type t of {}", wg.dw, ctx.pair_loop ? "pairs" : "edges e",
                                       print_expr(y));
      note_write(wg.dw, wg.accumulate);
      wg.name = unique(fmt::format("{}_wgrad_{}", prefix_, target ? wg.dw : wg.dw.substr(2)));
      p_.layouts.insert(intra::layout::kSortedCoo);
      pending_after_stage_.push_back(wg);
      sum = wg.dw;
      return def;
    }
    return nullptr;
  }

  // S[t] = the sum over the edges of type t of `y`, computed per edge by the open stage (the statement returned:
  // at the top of an edge loop or in a node loop's inner edge loop) into a temporary; the segment sum runs after the
  // stage's kernel. Sets `sum` to S; null when the traversal cannot compute y.
  StmtP deferred_etype_sum(const ExprP& y, LoopCtx& ctx, Stage& stage, const Stmt* inner, bool can_flush, const StmtP& s,
                           std::string& sum) {
    if (ctx.node_loop && !inner) return nullptr;
    ExprP value = extract_linears(y, ctx, stage, inner, can_flush, s);
    if (!value || !intra::traversal_supports(value)) return nullptr;
    // Stored per edge of an inner loop too (edges are numbered in type order).
    auto [local, def] = stored_local("op", value, ctx, stage, inner, y->loc);
    const std::vector<int64_t> shape = local_types_.at(local).shape;
    intra::SegmentSumInstance ss;
    ss.v = local;  // resolved to the materialised tensor at flush
    ss.dw = fresh(derived_name("t" + local, "per_etype"));  // t$op1$per_etype
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    add_tensor({ss.dw, Role::Temp, Per::Etype, shape, false, ""});
    ss.rows = rows_of(ctx, inner);  // the edges, or a pair loop's pairs
    ss.segments = intra::Segments::Etype;
    ss.numel = numel;
    ss.source = fmt::format("{}[t] = sum over the edges e of type t of {}", ss.dw, print_expr(y));
    note_write(ss.dw, /*accumulates=*/true);
    ss.name = unique(fmt::format("{}_segsum_{}", prefix_, ss.dw.substr(2)));
    p_.layouts.insert(intra::layout::kSortedCoo);
    pending_segment_sums_.push_back(ss);
    sum = ss.dw;
    return def;
  }

  // S[t] = the sum of the per-edge value `y` over the edges of type t (a segment sum into a temporary with a
  // row per edge type), shared by the gradients that need it while y's tensor is not written again. Returns
  // S, or "" when y cannot be read as edge rows here.
  std::string etype_sum(ExprP y, LoopCtx& ctx, Stage& stage, const Stmt* inner, bool can_flush, const StmtP& s) {
    std::optional<Input> in = gemm_input(y, ctx, true);
    if (!in || in->gather != intra::Gather::None) {
      y = materialize_operand(y, ctx, stage, inner, s);
      if (!y) return "";
      in = gemm_input(y, ctx, true);
      if (!in || in->gather != intra::Gather::None) return "";
    }
    if (tensor(in->tensor).per != Per::Edge) return "";
    if (stage.writes.count(in->tensor)) {
      if (!can_flush) return "";
      flush(ctx, stage);
    }
    if (auto it = etype_sums_.find(in->tensor); it != etype_sums_.end()) {
      bool rewritten = false;
      for (size_t k = it->second.second + 1; k < p_.kernels.size(); ++k)
        rewritten = rewritten || intra::kernel_writes(p_.kernels[k]).count(in->tensor) > 0;
      if (!rewritten) return it->second.first;
    }
    intra::SegmentSumInstance ss;
    ss.v = in->tensor;
    ss.dw = fresh(derived_name(in->tensor, "per_etype"));  // t$d$r$per_etype
    add_tensor({ss.dw, Role::Temp, Per::Etype, tensor(in->tensor).shape, false, ""});
    ss.rows = intra::Rows::Edges;
    ss.segments = intra::Segments::Etype;
    ss.numel = tensor(in->tensor).row_numel();
    ss.source = fmt::format("{}[t] = sum over the edges e of type t of {}", ss.dw, print_expr(y));
    note_write(ss.dw, /*accumulates=*/true);
    ss.name = unique(fmt::format("{}_segsum_{}", prefix_, ss.dw.rfind("t$", 0) == 0 ? ss.dw.substr(2) : ss.dw));
    p_.layouts.insert(intra::layout::kSortedCoo);
    p_.kernels.push_back(ss);
    etype_sums_[in->tensor] = {ss.dw, p_.kernels.size() - 1};
    return ss.dw;
  }

  // n["f"] += [s *] lin [* s]  in `for e in n.incoming_edges()`, s a per-edge scalar input or field.
  bool fused_scatter_gemm(const Stmt& s, LoopCtx& ctx, Stage& stage, bool can_flush) {
    auto target = field_ref(s.target, ctx.edge_vars);
    if (!target || target->on_edge || !target->node_role.empty()) return false;
    ExprP lin, scalar;
    const ExprP& v = s.value;
    if (is_linear(v)) {
      lin = v;
    } else if (is_op(v, Op::Mul)) {
      if (is_linear(v->args[1])) { scalar = v->args[0]; lin = v->args[1]; }
      else if (is_linear(v->args[0])) { lin = v->args[0]; scalar = v->args[1]; }
    }
    if (!lin) return false;
    std::string scalar_tensor;
    if (scalar) {
      if (scalar->kind == ExprKind::Attr && ctx.edge_vars.count(scalar->args[0]->kind == ExprKind::Name ? scalar->args[0]->name : "")) {
        const TensorDecl* in = m_.decl.find_input(scalar->name);
        if (!in || in->per != Per::Edge || !in->shape.empty()) return false;
        scalar_tensor = in->name;
      } else if (auto f = field_ref(scalar, ctx.edge_vars); f && f->on_edge && tensor(field_tensor(f->field)).shape.empty()) {
        scalar_tensor = field_tensor(f->field);
      } else {
        return false;
      }
    }
    // The scatter GEMM needs the linear's output shape to be the field's.
    if (value_type(lin->type).shape != tensor(field_tensor(target->field)).shape) return false;
    if (!gemm_input(lin->args[0], ctx, true)) return false;
    StmtP sp = std::make_shared<Stmt>(s);
    return emit_gemm(lin, field_tensor(target->field), ctx, stage, ctx.loop, can_flush, sp, scalar_tensor, true);
  }

  const Module& m_;
  TypeContext ctx_;
  Diagnostics& d_;
  std::string phase_, prefix_;
  bool deterministic_ = false;
  struct GatherSum {
    std::string field;   // node tensor accumulated into
    std::string edges;   // edge temporary (tensor), or a local to be materialised
    bool via_src = false;  // sum over outgoing edges (scatter to src) rather than incoming (dst)
    bool is_local = false;
    // Set for the sums of compact materialization: a gather sum over this CSR (edges into their pair, pairs into
    // their source) instead of a node-centric traversal.
    std::optional<intra::GatherCsr> csr;
    intra::Gather x_gather = intra::Gather::None;  // `edges` is a row per node, read through each edge's dst
    std::string scale;                             // per-edge scale (a tensor, or a local materialised by then)
    bool scale_is_local = false;
    std::string source;  // the statement it implements
    // Node-centric sums of scale * row (scaled_node_sum): the row, read by the sum itself through the edge variable
    // `edge_var`; `edges` is then empty.
    ExprP row = nullptr;
    std::string edge_var = {};
  };
  std::vector<GatherSum> pending_gather_sums_;
  intra::Program p_;
  std::map<std::string, int> writes_;
  std::set<std::string> written_;
  std::set<std::string> used_names_;   // tensors
  std::set<std::string> kernel_names_;
  std::map<std::string, std::string> alias_;  // field -> tensor
  std::set<std::string> aliased_;
  std::map<std::string, Type> local_types_;
  std::set<std::string> force_materialize_;
  std::set<std::string> edge_locals_;  // locals of a node loop's inner edge loops, materialised per edge
  std::vector<intra::SegmentSumInstance> pending_segment_sums_;
  std::vector<intra::TraversalSource> traversal_sources_;  // of the traversal instances, for check_shape_limits
  int wg_count_ = 0;
  std::map<std::string, std::string> etype_products_;                   // V * W -> its per-edge-type tensor
  std::map<std::string, std::pair<std::string, size_t>> etype_sums_;    // edge tensor -> (per-type sum, kernel)
  struct WeightWeightSum {
    std::string sum;     // the per-edge-type sum of Y
    size_t kernels = 0;  // the kernel count after it
    const Stmt* loop = nullptr;
  };
  std::vector<Kernel> pending_after_stage_;  // GEMMs reading a deferred segment sum: after it, at flush
  std::map<std::string, WeightWeightSum> ww_sums_;  // printed Y -> its per-type sum (weight_weight_grad)
};

// Rows with fewer elements than this (per-row scalars and short vectors: attention scores, the softmax's max and
// sum, normalisation factors, and their gradients) stay fp32 when they are fields or temporaries.
constexpr int64_t kNarrowRow = 32;

// Sets TensorInfo::storage by the rule of docs/dtype_plan.md: fp32 and tf32 models store fp32 everywhere; a bf16
// or fp16 model stores its inputs, weights, outputs, fields and temporaries in its type, except fields and
// temporaries with narrow rows (see kNarrowRow) and tensors added into atomically, which stay fp32. The
// arithmetic (registers, accumulators) is fp32 in every case.
void assign_storage(intra::Program& p) {
  const DType model = intra::model_storage(p.decl.options.dtype);
  std::set<std::string> atomic, row_scalars;
  for (const Kernel& k : p.kernels) {
    for (const std::string& t : intra::atomic_writes(k)) atomic.insert(t);
    if (auto* g = std::get_if<GemmInstance>(&k); g && !g->row_scalar.empty()) row_scalars.insert(g->row_scalar);
    if (auto* w = std::get_if<intra::WeightGradInstance>(&k); w && !w->row_scalar.empty()) row_scalars.insert(w->row_scalar);
  }
  for (TensorInfo& t : p.tensors) {
    bool interface = t.role == Role::Input || t.role == Role::Weight || t.role == Role::Output;
    t.storage = model;
    if (!interface && (t.row_numel() < kNarrowRow || atomic.count(t.name))) t.storage = DType::FP32;
    // Per-row scalars of GEMMs and weight gradients (norm) multiply the fp32 accumulator: fp32, inputs too (the
    // tensor-core kernels of hectorgen/tc_gemm.cuh read them as float).
    if (row_scalars.count(t.name)) t.storage = DType::FP32;
    // Inputs the runtime computes from the graph (inv_relation_in_degree) are float32 whatever the model's dtype.
    if (!t.from_graph.empty()) t.storage = DType::FP32;
    // fp16's 5-bit exponent: the backward's per-edge and per-node gradient temporaries (attention gradients of
    // high-degree nodes are ~1e-5) would fall into its subnormals and lose their digits (rgat: 3-8% relative
    // error on a 1500-edge graph; bf16, with fp32's range, stays under 0.3%). They are stored in fp32.
    if (model == DType::FP16 && p.phase == "backward" && !interface) t.storage = DType::FP32;
    // 16-bit models are lowered without atomics (deterministic_); an atomic into an argument or result would be
    // refused by the verifier, never silently rounded.
  }
}

// The kernel of each GEMM instance, once its tensors' shapes and storage types are final.
// (A weight gradient whose operands the tensor-core kernel cannot read as stored runs on CUDA cores, which convert.)
void choose_gemm_kernels(intra::Program& p) {
  for (intra::Kernel& k : p.kernels) {
    if (auto* g = std::get_if<GemmInstance>(&k)) g->tensor_cores = intra::gemm_kernel_choice(p, *g).tensor_cores;
    if (auto* w = std::get_if<intra::WeightGradInstance>(&k)) {
      w->kernel = intra::choose_wgrad_kernel(*w);
      if (!intra::wgrad_tc_reads(w->dtype, p.find(w->x)->storage, p.find(w->dy)->storage)) w->kernel = intra::WgradKernel::Simt;
    }
  }
}

}  // namespace

std::optional<intra::Program> lower(const Module& m, Diagnostics& diags, const std::string& phase,
                                    const std::vector<std::string>& saved) {
  try {
    auto p = Lowering(m, diags, phase).run();
    if (!p) return p;
    p->saved = saved;
    merge_duplicate_gemms(*p);
    merge_duplicate_traversals(*p);
    merge_duplicate_stores(*p);
    forward_row_copies(*p);
    drop_dead_stores(*p);
    assign_storage(*p);
    choose_gemm_kernels(*p);
    schedule_for_memory(*p);
    gemm_in_place(*p);
    return p;
  } catch (const std::logic_error& e) {
    // A traversal kernel the verifier rejects (e.g. a node field both stored and atomically updated by one
    // kernel) is a loop nest the templates cannot run safely yet: refuse it rather than emit a race.
    std::string what = e.what();
    diags.error({}, "unsupported", "the " + phase + " pass needs a kernel the traversal template cannot run safely: " +
                                       what.substr(0, what.find('\n')));
    return std::nullopt;
  }
}

void drop_unread_twins(const std::vector<std::vector<intra::Program>*>& module) {
  std::set<std::string> twins, read;
  for (const std::vector<intra::Program>* programs : module)
    for (const intra::Program& p : *programs) {
      for (const TensorInfo& t : p.tensors)
        if (intra::by_in_position(t)) twins.insert(t.name);
      for (const intra::Kernel& k : p.kernels)
        for (const std::string& r : intra::kernel_reads(k)) read.insert(r);
    }
  for (const std::string& twin : twins) {
    if (read.count(twin)) continue;
    for (std::vector<intra::Program>* programs : module)
      for (intra::Program& p : *programs) {
        auto t = std::find_if(p.tensors.begin(), p.tensors.end(), [&](const TensorInfo& x) { return x.name == twin; });
        if (t == p.tensors.end()) continue;
        p.layouts.erase(t->from_graph);
        p.tensors.erase(t);
        std::erase_if(p.decl.inputs, [&](const TensorDecl& d) { return d.name == twin; });
      }
  }
}

void share_gemm_tiles(const std::vector<std::vector<intra::Program>*>& module) {
  bool any = false;
  for (const std::vector<intra::Program>* programs : module)
    for (const intra::Program& p : *programs)
      for (const intra::Kernel& k : p.kernels)
        if (auto* g = std::get_if<GemmInstance>(&k); g && intra::reads_tile_offsets(*g)) {
          if (!g->tensor_cores) return;
          any = true;
        }
  if (!any) return;
  for (std::vector<intra::Program>* programs : module)
    for (intra::Program& p : *programs) {
      p.graph_tile = intra::kTcTileRows;
      for (intra::Kernel& k : p.kernels)
        if (auto* g = std::get_if<GemmInstance>(&k); g && intra::reads_tile_offsets(*g)) g->graph_tiles = true;
    }
}

void unify_storage(std::vector<intra::Program>& phases) {
  if (phases.size() == 3) {  // the backward reads the saved fields as forward_train stored them
    const intra::Program& forward_train = phases[1];
    for (const std::string& field : forward_train.saved) {
      auto alias = forward_train.aliases.find(field);
      const TensorInfo* saved = forward_train.find(alias == forward_train.aliases.end() ? field : alias->second);
      for (TensorInfo& t : phases[2].tensors)
        if (saved && t.name == field && t.role == Role::Input) t.storage = saved->storage;
    }
  }
  // The module passes one tensor per input to every phase: fp32 in one phase (a row scalar there), fp32 in all.
  std::set<std::string> fp32_inputs;
  for (const intra::Program& p : phases)
    for (const TensorInfo& t : p.tensors)
      if (t.role == Role::Input && t.storage == DType::FP32) fp32_inputs.insert(t.name);
  for (intra::Program& p : phases)
    for (TensorInfo& t : p.tensors)
      if (t.role == Role::Input && fp32_inputs.count(t.name)) t.storage = DType::FP32;
  for (intra::Program& p : phases) choose_gemm_kernels(p);  // storage types may have changed
}

}  // namespace hectorgen::passes
