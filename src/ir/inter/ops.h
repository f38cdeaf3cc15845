// The operator table: every operator of the inter-operator IR declared once, as one row.
//
// A row says how the operator is written (a DSL function, an infix or a prefix operator) and with which
// parameters, its type rule (domain, shape, dtype of the result; positioned errors), its float64 evaluation
// (the interpreter), its derivative (autodiff), which templates can compute it (GEMM, traversal, PyTorch
// fallback) and how the traversal template and the PyTorch fallback spell it. Every consumer reads the
// table; nobody compares operator names.
//
// Adding an operator is one enum value below and one row in make_table() (ops.cpp), plus its tests: the
// tests that iterate the table (test_ops.cpp: consistency, evaluation, one good and one bad typing case;
// test_autodiff.cpp: the derivative against finite differences, or "no derivative" reported) fail until the
// new row is covered. A row without a derivative says so (grad = nullptr: outer, the *_grad helpers for now).
// slice is a row with constant parameters (like reshape) and its own evaluation and spellings; a dtype cast is a row whose type rule sets Type::dtype
// (with a parameter kind for the dtype's name).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ir/inter/ir.h"
#include "ir/inter/typing.h"

namespace hectorgen::inter {

enum class Op : uint8_t {
  None,  // not an operator: a call of a user-defined function (inlined before type inference)
  // arithmetic: Binary and Neg nodes
  Add, Sub, Mul, Div, Neg,
  // element-wise functions
  Exp, Relu, Tanh, Sigmoid, Sqrt, LeakyRelu, LeakyReluGrad, Max, MaxGrad,
  // reductions and shape operators
  Sum, Dot, Outer, MatVec, VecMat, Concat, Slice, Reshape, Expand,
  // linear transforms (x * W is Linear once typed)
  Linear, LinearT,
  Count  // not an operator: the number of enum values
};

enum class Syntax : uint8_t { Call, Infix, Prefix };

enum class ParamKind : uint8_t {
  Tensor,    // a value (a weight slice used as a value included)
  Weight,    // a weight reference: W[e.etype], W0
  Constant,  // a compile-time constant: a number, a hyper-parameter, arithmetic of those
};

struct Param {
  ParamKind kind = ParamKind::Tensor;
  const char* role = "";                // in diagnostics: "<role> of '<op>'", e.g. "the first argument"
  std::optional<double> default_value;  // a trailing parameter that may be left out
  const char* error_kind = "";          // Constant: the diagnostic when the argument is not a constant
  const char* error = "";
};

// Which templates can compute the operator.
struct Templates {
  bool gemm = false;       // a GEMM instance (linear transforms)
  bool traversal = false;  // inside a traversal instance (a warp per row)
  bool torch = false;      // as ATen calls (the PyTorch fallback)
};

// How the traversal template computes the operator.
enum class Form : uint8_t {
  None,        // not in traversals
  Map,         // element by element, broadcast by prefix: OpInfo::cuda with {i} = argument i
  ReduceLast,  // the sum over the last axis of the product of the tensor arguments (a warp reduction)
  View,        // the same elements in another shape
};

// How the PyTorch fallback prepares the arguments before spelling OpInfo::aten.
enum class AtenArgs : uint8_t {
  AsIs,         // as they are (values without rows broadcast in ATen)
  Broadcast,    // prefix broadcasting: when a row operand is involved, align ranks with trailing unsqueezes
  Rows,         // with their row dimension materialised
  RowsAligned,  // with their row dimension materialised and ranks aligned to the result's
};

// A float64 value per element (the interpreter's): shape and row-major data.
struct Value64 {
  std::vector<int64_t> shape;
  std::vector<double> data;
  int64_t numel() const;
  static Value64 scalar(double v) { return Value64{{}, {v}}; }
};

struct OpInfo;

// Type rule: the arguments as checked by their parameters (Tensor: value types, Weight: weight
// references, Constant: constants with their values), the result type or a positioned error.
struct OpArgs {
  const OpInfo& op;
  SourceLoc loc;                   // the operator's position (errors about the whole call)
  const std::vector<ExprP>& args;  // the argument nodes (errors about one argument)
  const std::vector<Type>& types;
};
using TypeRule = TypeResult (*)(const OpArgs&);

// Evaluation: every argument evaluated (tensors, weight slices, constants as scalars; a left-out
// parameter as its default), and the result's type (for its shape).
using EvalFn = Value64 (*)(const std::vector<Value64>& args, const Type& result);

// Derivative: the adjoint of each argument (null: none), given the typed forward node, the adjoint of its
// result (typed) and `saved`, which gives a forward operand's value in the backward program. Autodiff sums
// an adjoint over the axes its operand was broadcast along.
// `result`: the call's own value in the backward (the saved field its statement stores, when the call is that
// statement's whole value), or null: a rule that can read its result instead of recomputing from its operands
// (leakyrelu) does so. `constant`: the value of a constant argument (a number or a hyper-parameter), or none.
struct GradArgs {
  const Expr& call;
  const ExprP& adjoint;
  const std::function<ExprP(const ExprP&)>& saved;
  const std::function<ExprP()>& result;
  const std::function<std::optional<double>(const ExprP&)>& constant;
};
using GradFn = std::vector<ExprP> (*)(const GradArgs&);

// Thrown by a derivative rule for a case it does not cover.
struct UnsupportedGradient : std::runtime_error {
  SourceLoc loc;
  UnsupportedGradient(SourceLoc l, const std::string& m) : std::runtime_error(m), loc(l) {}
};

struct OpInfo {
  Op op = Op::None;
  const char* name = "";  // as written: "exp", "+", "-" (Neg)
  Syntax syntax = Syntax::Call;
  std::vector<Param> params;
  bool variadic = false;  // the last parameter repeats (concat: 2 or more arguments; reshape, expand: dimensions)
  TypeRule type = nullptr;
  bool folds = false;  // constant arguments give a constant (arithmetic and sqrt, as in declarations)
  EvalFn eval = nullptr;
  GradFn grad = nullptr;  // null: no derivative, and autodiff says so
  Templates templates;
  Form form = Form::None;
  const char* cuda = "";  // Form::Map: the CUDA expression of one element
  // The ATen expression: {i} = argument i, {*} = the tensor arguments joined by ", ", {rows} = the row
  // count, {dims} = ", d0, d1, ..." of the result's shape.
  const char* aten = "";
  AtenArgs aten_args = AtenArgs::AsIs;

  size_t min_args() const;
  size_t max_args() const;  // SIZE_MAX when variadic
  const Param& param(size_t i) const;  // the parameter of argument i (variadic: the last one repeats)
};

// The row of an operator (Op::None and Op::Count have none: std::logic_error).
const OpInfo& op_info(Op op);
// All rows, in enum order.
const std::vector<OpInfo>& all_ops();
// A built-in function by its DSL name.
std::optional<Op> call_op(std::string_view name);
// The DSL names of the built-in functions, sorted (for "did you mean").
const std::vector<std::string>& call_op_names();
Op binary_op(BinOp op);

// Substitutes {0}..{9}, {*}, {rows}, {dims} in an OpInfo::cuda / aten pattern.
std::string spell(std::string_view pattern, const std::vector<std::string>& args, const std::string& all = "",
                  const std::string& rows = "", const std::string& dims = "");

}  // namespace hectorgen::inter
