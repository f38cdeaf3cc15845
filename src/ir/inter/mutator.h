// Walking and rewriting the typed inter-operator IR, Halide style (IRVisitor / IRMutator): one virtual
// method per node kind, whose default visits the children.
//
// The Mutator rebuilds a node only when one of its children changed, so unchanged subtrees are shared
// (pointer identity), and keeps types valid: a rebuilt node gets its type re-inferred locally from its
// children's types (typing.h: infer), an assignment's target gets the type of what it now stores, and names
// follow their bindings -- loop variables and locals are bound in scopes as the walk enters loops and
// assignments, and a name whose binding's type changed (say, the edge loop became a node's incoming-edge
// loop) is retyped, which re-types everything above it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ir/inter/ir.h"
#include "ir/inter/typing.h"

namespace hectorgen::inter {

class Visitor {
 public:
  virtual ~Visitor() = default;
  // Dispatches on the node kind (override to see every expression, then call Visitor::visit).
  virtual void visit(const ExprP& e);
  void visit(const StmtP& s);
  void visit(const std::vector<StmtP>& body);

 protected:
  virtual void visit_number(const ExprP&) {}
  virtual void visit_string(const ExprP&) {}
  virtual void visit_name(const ExprP&) {}
  virtual void visit_attr(const ExprP& e) { visit_children(e); }
  virtual void visit_index(const ExprP& e) { visit_children(e); }
  virtual void visit_call(const ExprP& e) { visit_children(e); }
  virtual void visit_binary(const ExprP& e) { visit_children(e); }
  virtual void visit_neg(const ExprP& e) { visit_children(e); }
  virtual void visit_for(const StmtP& s) { visit(s->body); }
  virtual void visit_assign(const StmtP& s);  // the target, then the value
  virtual void visit_call_stmt(const StmtP& s) { visit(s->value); }
  void visit_children(const ExprP& e);
};

class Mutator {
 public:
  explicit Mutator(TypeContext ctx) : ctx_(ctx) {}
  virtual ~Mutator() = default;

  ExprP mutate(const ExprP& e);
  StmtP mutate(const StmtP& s);  // null: the statement is dropped
  // The same vector (operator==) when no statement changed.
  std::vector<StmtP> mutate(const std::vector<StmtP>& body);

 protected:
  virtual ExprP visit_number(const ExprP& e) { return e; }
  virtual ExprP visit_string(const ExprP& e) { return e; }
  virtual ExprP visit_name(const ExprP& e);  // retyped when its binding's type differs
  virtual ExprP visit_attr(const ExprP& e) { return mutate_children(e); }
  virtual ExprP visit_index(const ExprP& e) { return mutate_children(e); }
  virtual ExprP visit_call(const ExprP& e) { return mutate_children(e); }
  virtual ExprP visit_binary(const ExprP& e) { return mutate_children(e); }
  virtual ExprP visit_neg(const ExprP& e) { return mutate_children(e); }
  // Binds the loop variable (by the loop's kind) in a new scope around the body.
  virtual StmtP visit_for(const StmtP& s);
  // Mutates the value and the target (mutate_target), types the target as what it stores, binds locals.
  virtual StmtP visit_assign(const StmtP& s);
  virtual StmtP visit_call_stmt(const StmtP& s);
  // An assignment's target: its children mutated (base and index of a field or weight-gradient write); a
  // local's name as it is. Its own type is set by visit_assign.
  virtual ExprP mutate_target(const ExprP& t);

  // `e` with its children mutated: `e` itself when none changed, else rebuilt with its type re-inferred.
  ExprP mutate_children(const ExprP& e);

  const TypeContext& context() const { return ctx_; }
  void set_context(TypeContext ctx) { ctx_ = ctx; }
  // Bindings in scope (innermost first): loop variables and locals with their current types.
  const Type* binding(const std::string& name) const;
  void bind(const std::string& name, Type t);    // in the innermost scope
  void rebind(const std::string& name, Type t);  // where it is bound (else the innermost scope)
  void push_scope() { scopes_.emplace_back(); }
  void pop_scope() { scopes_.pop_back(); }

 private:
  TypeContext ctx_;
  std::vector<std::map<std::string, Type>> scopes_;
};

}  // namespace hectorgen::inter
