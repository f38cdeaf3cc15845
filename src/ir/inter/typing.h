// Type inference of the inter-operator IR, node by node: the type of a node from its children's types.
//
// The verifier (verifier.h: typecheck) walks a whole module once, in program order, checks what the code
// generator needs (legality) and stores every node's type with these rules. Passes then keep types valid
// without re-running it: the Mutator (mutator.h) re-infers a rebuilt node locally from its children, and
// the builders below (namespace typed) make new nodes typed. A node's type never depends on its parents;
// it depends on its children's types and on the module (declarations and field table, TypeContext), except
// for names: a local's or a loop variable's type comes from its binding (the verifier's scopes, the
// Mutator's environment).
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ir/inter/ir.h"

namespace hectorgen::inter {

struct TypeError {
  SourceLoc loc;
  std::string kind;  // diagnostic kind, e.g. "shape-mismatch"
  std::string message;
};
using TypeResult = std::variant<Type, TypeError>;

// What local inference may look up: the declarations and the fields written so far.
struct TypeContext {
  const ModelDecl* decl = nullptr;
  const FieldTable* node_fields = nullptr;
  const FieldTable* edge_fields = nullptr;
  const FieldTable* pair_fields = nullptr;
  static TypeContext of(const Module& m) { return {&m.decl, &m.node_fields, &m.edge_fields, &m.pair_fields}; }
};

// ---- rules shared by the verifier, the operator table and local inference ----------------------------
// Domain and dependencies of a value computed from a and b (shape left empty).
Type join(const Type& a, const Type& b);
bool is_prefix(const std::vector<int64_t>& a, const std::vector<int64_t>& b);
// Prefix broadcasting: the longer shape when one is a prefix of the other.
std::optional<std::vector<int64_t>> broadcast(const std::vector<int64_t>& a, const std::vector<int64_t>& b);
// The value a reference denotes: a weight (slice) as its tensor; tensors unchanged; other kinds: Untyped.
Type value_type(const Type& t);
// The type of data read through a node reference: per node where the node is the loop's, gathered per edge
// (depending on the source or destination) where it is an edge's endpoint.
Type node_data(const Type& node);
// The type of data read through a pair reference (a pair loop's pair or `e.pair`): one value per (source, edge
// type) pair, an edge value depending on the source and the edge type only.
Type pair_data();
// A weight, as the reference its name denotes (unselected).
Type weight_ref(const TensorDecl& w);
// Weight gradients: outputs declared per etype / ntype / none.
const TensorDecl* weight_grad_output(const ModelDecl& decl, const std::string& name);

// ---- local inference (children typed) ----------------------------------------------------------------
// base.attr: e.src, e.dst, e.etype, n.ntype, inputs (e.norm, n.feature).
TypeResult type_attr(const Type& base, const std::string& attr, SourceLoc loc, const TypeContext& ctx);
// base[index] as a value: a weight slice W[e.etype] or a field read e["att"]. A field read has the field's
// shape at its point of the program: `previous` (the node's type before a rewrite) keeps it, otherwise the
// context's field table gives it.
TypeResult type_index(const Type& base, const Expr& index, SourceLoc loc, const TypeContext& ctx,
                      const Type* previous = nullptr);
// An operator applied to typed arguments: checks the parameters (tensor values, weights, constants) and
// applies the table's type rule (ops.h); folds constants.
TypeResult type_op(Op op, const std::vector<ExprP>& args, SourceLoc loc);
// The operator of `lhs * rhs`: Linear when rhs is a weight of rank >= 2, else Mul.
Op resolve_mul(const Type& lhs, const Type& rhs);

// The type of `e` from its children's types. Names keep their type (bindings are the caller's business).
// Throws std::logic_error on an ill-typed node: passes build well-typed IR, so that is a compiler bug.
Type infer(const Expr& e, const TypeContext& ctx, const Type* previous = nullptr);

// The type a statement `target op= value` stores (the type of its target node). `local`: the current type
// of the local a `+=`-style update changes; `previous`: the stored type before a rewrite (keeps a field's
// shape at this point of the program, like a field read).
Type stored_type(const Expr& target, AssignOp op, const Type& value, const TypeContext& ctx,
                 const Type* local = nullptr, const Type* previous = nullptr);

// Records a write of `value` into field `name` in a table built in program order (the verifier's rule: a
// new field takes the value's shape; an accumulation may grow a field first set from a smaller prefix
// shape, when `may_grow`). Returns false when the shapes do not fit (the verifier reports that).
bool record_field_write(FieldTable& table, const std::string& name, bool on_edges, bool accumulates, bool may_grow,
                        const std::vector<int64_t>& value_shape);

// ---- typed builders ----------------------------------------------------------------------------------
// New nodes with their types. They throw std::logic_error on ill-typed combinations (compiler bugs).
namespace typed {
ExprP number(double v, bool is_integer = false, SourceLoc loc = {});
ExprP string(std::string s, SourceLoc loc = {});
ExprP name(std::string n, Type t, SourceLoc loc = {});
// Op's node as the table spells it: a Call (exp(x)), a Binary (a + b; `x * W` for Linear when W is a
// matrix weight reference... see apply_mul) or a Neg.
ExprP apply(Op op, std::vector<ExprP> args, SourceLoc loc = {});
ExprP attr(ExprP base, std::string attribute, const TypeContext& ctx, SourceLoc loc = {});
ExprP index(ExprP base, ExprP idx, const TypeContext& ctx, SourceLoc loc = {});
ExprP field(ExprP base, std::string field, const TypeContext& ctx, SourceLoc loc = {});
// `e` with type `t` (the same node when it has it already).
ExprP with_type(const ExprP& e, Type t);
// `e` with children `args`: the same node when they are the same, else a copy with its type re-inferred.
ExprP rebuild(const ExprP& e, std::vector<ExprP> args, const TypeContext& ctx);
// `target op= value` with the target typed as what it stores (stored_type).
StmtP assign(ExprP target, AssignOp op, ExprP value, const TypeContext& ctx, const Type* local = nullptr,
             const Type* previous = nullptr, SourceLoc loc = {});
}  // namespace typed

// True when every expression of the module carries a type.
bool is_typed(const Module& m);

}  // namespace hectorgen::inter
