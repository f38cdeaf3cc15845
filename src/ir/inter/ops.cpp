// The operator table (see ops.h): one row per operator.
#include "ir/inter/ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace hectorgen::inter {

int64_t Value64::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

TypeError error(SourceLoc loc, const char* kind, std::string message) { return TypeError{loc, kind, std::move(message)}; }

// ---- type rules ------------------------------------------------------------------------------------------
// The argument's type (element-wise functions of one tensor).
TypeResult same_as_first(const OpArgs& a) { return a.types[0]; }

// Element-wise over two tensors, broadcast by prefix.
TypeResult broadcast2(const OpArgs& a) {
  Type t = join(a.types[0], a.types[1]);
  auto s = broadcast(a.types[0].shape, a.types[1].shape);
  if (!s)
    return error(a.loc, "shape-mismatch", fmt::format("shapes {} and {} do not broadcast (one must be a prefix of the other)",
                                                      shape_str(a.types[0].shape), shape_str(a.types[1].shape)));
  t.shape = *s;
  return t;
}

TypeResult sum_rule(const OpArgs& a) {
  Type t = a.types[0];
  if (t.shape.empty()) return error(a.loc, "shape-mismatch", "'sum' reduces the last axis; got a scalar");
  t.shape.pop_back();
  return t;
}

TypeResult vectors(const OpArgs& a) {
  const Type &x = a.types[0], &y = a.types[1];
  if (x.shape.empty() || y.shape.empty())
    return error(a.loc, "shape-mismatch",
                 fmt::format("'{}' needs vectors, got shapes {} and {}", a.op.name, shape_str(x.shape), shape_str(y.shape)));
  return join(x, y);
}

TypeResult dot_rule(const OpArgs& a) {
  TypeResult r = vectors(a);
  Type* t = std::get_if<Type>(&r);
  if (!t) return r;
  const Type &x = a.types[0], &y = a.types[1];
  if (x.shape != y.shape)
    return error(a.loc, "shape-mismatch", fmt::format("'dot' needs equal shapes, got {} and {}", shape_str(x.shape), shape_str(y.shape)));
  t->shape.assign(x.shape.begin(), x.shape.end() - 1);
  return r;
}

TypeResult outer_rule(const OpArgs& a) {
  TypeResult r = vectors(a);
  Type* t = std::get_if<Type>(&r);
  if (!t) return r;
  const Type &x = a.types[0], &y = a.types[1];
  if (x.shape.size() != y.shape.size() || !std::equal(x.shape.begin(), x.shape.end() - 1, y.shape.begin()))
    return error(a.loc, "shape-mismatch",
                 fmt::format("'outer' needs equal leading dimensions, got {} and {}", shape_str(x.shape), shape_str(y.shape)));
  t->shape = x.shape;
  t->shape.push_back(y.shape.back());
  return r;
}

// matvec(m [.., M, N], v [.., N]) -> [.., M];  vecmat(v [.., M], m [.., M, N]) -> [.., N]
TypeResult matvec_rule(const OpArgs& a) {
  bool vm = a.op.op == Op::VecMat;
  const Type &m = a.types[vm ? 1 : 0], &v = a.types[vm ? 0 : 1];
  bool ok = m.shape.size() >= 2 && v.shape.size() + 1 == m.shape.size() &&
            std::equal(v.shape.begin(), v.shape.end() - 1, m.shape.begin()) &&
            v.shape.back() == m.shape[m.shape.size() - (vm ? 2 : 1)];
  if (!ok)
    return error(a.loc, "shape-mismatch",
                 fmt::format("'{}' needs a vector [.., {}] and a matrix [.., M, N] with equal leading dimensions, got {} and {}",
                             a.op.name, vm ? "M" : "N", shape_str(a.types[0].shape), shape_str(a.types[1].shape)));
  Type t = join(a.types[0], a.types[1]);
  t.shape = v.shape;
  t.shape.back() = m.shape[m.shape.size() - (vm ? 1 : 2)];
  return t;
}

TypeResult concat_rule(const OpArgs& a) {
  Type acc;
  for (size_t i = 0; i < a.types.size(); ++i) {
    const Type& t = a.types[i];
    if (t.shape.empty())
      return error(a.args[i]->loc, "shape-mismatch", "'concat' joins vectors along their last dimension; got a scalar");
    if (i == 0) {
      acc = t;
      continue;
    }
    if (acc.shape.size() != t.shape.size() || !std::equal(acc.shape.begin(), acc.shape.end() - 1, t.shape.begin()))
      return error(a.args[i]->loc, "shape-mismatch",
                   fmt::format("'concat' needs equal leading dimensions, got {} and {}", shape_str(acc.shape), shape_str(t.shape)));
    Type j = join(acc, t);
    j.shape = acc.shape;
    j.shape.back() += t.shape.back();
    acc = j;
  }
  return acc;
}

// slice(x, start, length): elements start .. start + length - 1 of the last axis.
TypeResult slice_rule(const OpArgs& a) {
  Type t = a.types[0];
  if (t.shape.empty()) return error(a.args[0]->loc, "shape-mismatch", "'slice' takes part of a vector's last dimension; got a scalar");
  int64_t bounds[2];
  for (size_t i = 1; i < 3; ++i) {
    const std::optional<double>& v = a.types[i].value;
    if (!v || *v < (i == 1 ? 0 : 1) || static_cast<double>(static_cast<int64_t>(*v)) != *v)
      return error(a.args[i]->loc, "bad-shape",
                   i == 1 ? "the start of 'slice' must be a non-negative integer constant"
                          : "the length of 'slice' must be a positive integer constant");
    bounds[i - 1] = static_cast<int64_t>(*v);
  }
  if (bounds[0] + bounds[1] > t.shape.back())
    return error(a.loc, "shape-mismatch", fmt::format("slice({}, {}) is out of a last dimension of {}", bounds[0], bounds[1],
                                                      t.shape.back()));
  t.shape.back() = bounds[1];
  t.value.reset();
  return t;
}

TypeResult reshape_rule(const OpArgs& a) {
  const Type& x = a.types[0];
  Type t = x;
  t.shape.clear();
  int64_t n = numel(x.shape), m = 1;
  for (size_t i = 1; i < a.types.size(); ++i) {
    const std::optional<double>& v = a.types[i].value;
    if (!v || *v < 1 || static_cast<double>(static_cast<int64_t>(*v)) != *v)
      return error(a.args[i]->loc, "bad-shape", "reshape dimensions must be positive integer constants");
    t.shape.push_back(static_cast<int64_t>(*v));
    m *= t.shape.back();
  }
  if (n != m)
    return error(a.loc, "shape-mismatch", fmt::format("cannot reshape {} ({} elements) to {} ({} elements)", shape_str(x.shape), n,
                                                      shape_str(t.shape), m));
  return t;
}

// expand(x, d0, d1, ...): x broadcast by prefix to [d0, d1, ...] (x's shape a prefix of it).
TypeResult expand_rule(const OpArgs& a) {
  const Type& x = a.types[0];
  Type t = x;
  t.shape.clear();
  for (size_t i = 1; i < a.types.size(); ++i) {
    const std::optional<double>& v = a.types[i].value;
    if (!v || *v < 1 || static_cast<double>(static_cast<int64_t>(*v)) != *v)
      return error(a.args[i]->loc, "bad-shape", "expand dimensions must be positive integer constants");
    t.shape.push_back(static_cast<int64_t>(*v));
  }
  if (!is_prefix(x.shape, t.shape))
    return error(a.loc, "shape-mismatch", fmt::format("cannot expand {} to {} (the shape must be a prefix of the new one)",
                                                      shape_str(x.shape), shape_str(t.shape)));
  return t;
}

// x [.., K] * W [K, N] -> [.., N];  x [H, K] * W [H, K, N] -> [H, N]
TypeResult linear_rule(const OpArgs& a) {
  const Type &x = a.types[0], &w = a.types[1];
  const std::vector<int64_t>& ws = w.shape;
  Type t = join(x, w);
  if (t.domain < Domain::Node && x.domain < Domain::Node)
    return error(a.loc, "type-mismatch", "a linear transform needs node or edge data as its input");
  if (ws.size() == 2 && !x.shape.empty() && x.shape.back() == ws[0]) {
    t.shape = x.shape;
    t.shape.back() = ws[1];
    return t;
  }
  if (ws.size() == 3 && x.shape.size() == 2 && x.shape[0] == ws[0] && x.shape[1] == ws[1]) {
    t.shape = {ws[0], ws[2]};
    return t;
  }
  return error(a.loc, "shape-mismatch",
               fmt::format("cannot multiply a value of shape {} by weight '{}' of shape {} (expected [.., K] x [K, N] or "
                           "[H, K] x [H, K, N])",
                           shape_str(x.shape), w.weight, shape_str(ws)));
}

// y [.., N] * W^T with W [K, N] -> [.., K];  y [H, N] with W [H, K, N] -> [H, K]
TypeResult linear_t_rule(const OpArgs& a) {
  const Type &y = a.types[0], &w = a.types[1];
  const std::vector<int64_t>& ws = w.shape;
  Type t = join(y, w);
  if (ws.size() == 2 && !y.shape.empty() && y.shape.back() == ws[1]) {
    t.shape = y.shape;
    t.shape.back() = ws[0];
    return t;
  }
  if (ws.size() == 3 && y.shape.size() == 2 && y.shape[0] == ws[0] && y.shape[1] == ws[2]) {
    t.shape = {ws[0], ws[1]};
    return t;
  }
  return error(a.loc, "shape-mismatch", fmt::format("cannot multiply a value of shape {} by the transpose of '{}' of shape {}",
                                                    shape_str(y.shape), w.weight, shape_str(ws)));
}

// ---- float64 evaluation ------------------------------------------------------------------------------------
Value64 broadcast_to(const Value64& a, const std::vector<int64_t>& shape) {
  if (a.shape == shape) return a;
  int64_t n = numel(shape), inner = n / static_cast<int64_t>(a.data.size());
  Value64 out{shape, std::vector<double>(static_cast<size_t>(n))};
  for (int64_t i = 0; i < n; ++i) out.data[i] = a.data[i / inner];
  return out;
}

template <class F>
Value64 map1(Value64 x, F f) {
  for (double& v : x.data) v = f(v);
  return x;
}

template <class F>
Value64 map2(const Value64& a, const Value64& b, F f) {
  const Value64& big = a.data.size() >= b.data.size() ? a : b;
  Value64 x = broadcast_to(a, big.shape), y = broadcast_to(b, big.shape);
  Value64 out{big.shape, std::vector<double>(x.data.size())};
  for (size_t i = 0; i < x.data.size(); ++i) out.data[i] = f(x.data[i], y.data[i]);
  return out;
}

using Args = std::vector<Value64>;

Value64 eval_sum(const Args& a, const Type&) {
  const Value64& x = a[0];
  int64_t D = x.shape.back(), rows = numel(x.shape) / D;
  Value64 out{std::vector<int64_t>(x.shape.begin(), x.shape.end() - 1), std::vector<double>(static_cast<size_t>(rows), 0.0)};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < D; ++k) out.data[r] += x.data[r * D + k];
  return out;
}

Value64 eval_dot(const Args& a, const Type&) {
  const Value64 &x = a[0], &y = a[1];
  int64_t D = x.shape.back(), rows = numel(x.shape) / D;
  Value64 out{std::vector<int64_t>(x.shape.begin(), x.shape.end() - 1), std::vector<double>(static_cast<size_t>(rows), 0.0)};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < D; ++k) out.data[r] += x.data[r * D + k] * y.data[r * D + k];
  return out;
}

Value64 eval_outer(const Args& a, const Type&) {
  const Value64 &x = a[0], &y = a[1];
  int64_t M = x.shape.back(), N = y.shape.back(), rows = numel(x.shape) / M;
  Value64 out{x.shape, std::vector<double>(static_cast<size_t>(rows * M * N))};
  out.shape.push_back(N);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) out.data[(r * M + i) * N + j] = x.data[r * M + i] * y.data[r * N + j];
  return out;
}

// out[r, j] = sum_i v[r, i] * M_r[i, j], or sum_i v[r, i] * M_r[j, i] when `transposed`, where M_r is the r-th
// matrix of m when `per_row` (m: [rows, A, B]) and m itself otherwise (m: [A, B]). The float64 product behind
// linear, linear_t, matvec and vecmat; the result has v's shape with the last dimension replaced.
Value64 rows_times_matrix(const Value64& v, const Value64& m, bool per_row, bool transposed) {
  const int64_t A = m.shape[m.shape.size() - 2], B = m.shape.back();
  const int64_t in = transposed ? B : A, out_width = transposed ? A : B, rows = numel(v.shape) / in;
  Value64 out{v.shape, std::vector<double>(static_cast<size_t>(rows * out_width), 0.0)};
  out.shape.back() = out_width;
  for (int64_t r = 0; r < rows; ++r) {
    const double* M = m.data.data() + (per_row ? r * A * B : 0);
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = 0; j < out_width; ++j)
        out.data[r * out_width + j] += v.data[r * in + i] * (transposed ? M[j * B + i] : M[i * B + j]);
  }
  return out;
}

// y[r, i] = sum_j m[r, i, j] v[r, j]
Value64 eval_matvec(const Args& a, const Type&) { return rows_times_matrix(a[1], a[0], true, true); }

// y[r, j] = sum_i v[r, i] m[r, i, j]
Value64 eval_vecmat(const Args& a, const Type&) { return rows_times_matrix(a[0], a[1], true, false); }

Value64 eval_concat(const Args& parts, const Type&) {
  int64_t rows = numel(parts[0].shape) / parts[0].shape.back(), width = 0;
  for (const Value64& p : parts) width += p.shape.back();
  Value64 out{parts[0].shape, {}};
  out.shape.back() = width;
  for (int64_t r = 0; r < rows; ++r)
    for (const Value64& p : parts) {
      int64_t w = p.shape.back();
      out.data.insert(out.data.end(), p.data.begin() + r * w, p.data.begin() + (r + 1) * w);
    }
  return out;
}

Value64 eval_slice(const Args& a, const Type& result) {
  const Value64& x = a[0];
  int64_t width = x.shape.back(), start = static_cast<int64_t>(a[1].data[0]), length = result.shape.back();
  Value64 out{result.shape, {}};
  for (int64_t r = 0; r < numel(x.shape) / width; ++r)
    out.data.insert(out.data.end(), x.data.begin() + r * width + start, x.data.begin() + r * width + start + length);
  return out;
}

Value64 eval_reshape(const Args& a, const Type& result) { return Value64{result.shape, a[0].data}; }

Value64 eval_expand(const Args& a, const Type& result) { return broadcast_to(a[0], result.shape); }

// x * W: a shared W [K, N] for every row, or W [H, K, N] with one matrix per head row.
Value64 eval_linear(const Args& a, const Type&) { return rows_times_matrix(a[0], a[1], a[1].shape.size() == 3, false); }

// linear_t(y, W) = y * W^T, with W as for linear.
Value64 eval_linear_t(const Args& a, const Type&) { return rows_times_matrix(a[0], a[1], a[1].shape.size() == 3, true); }

// ---- derivatives ---------------------------------------------------------------------------------------------
ExprP num(double v) { return typed::number(v, false); }
ExprP mul(ExprP a, ExprP b) { return typed::apply(Op::Mul, {std::move(a), std::move(b)}); }
ExprP div(ExprP a, ExprP b) { return typed::apply(Op::Div, {std::move(a), std::move(b)}); }
ExprP sub(ExprP a, ExprP b) { return typed::apply(Op::Sub, {std::move(a), std::move(b)}); }
ExprP neg(ExprP a) { return typed::apply(Op::Neg, {std::move(a)}); }
ExprP fn(Op op, std::vector<ExprP> args) { return typed::apply(op, std::move(args)); }

std::vector<ExprP> grad_add(const GradArgs& g) { return {g.adjoint, g.adjoint}; }
std::vector<ExprP> grad_sub(const GradArgs& g) { return {g.adjoint, neg(g.adjoint)}; }
std::vector<ExprP> grad_mul(const GradArgs& g) {
  const ExprP &a = g.call.args[0], &b = g.call.args[1];
  return {mul(g.adjoint, g.saved(b)), mul(g.adjoint, g.saved(a))};
}
std::vector<ExprP> grad_div(const GradArgs& g) {
  const ExprP &a = g.call.args[0], &b = g.call.args[1];
  return {div(g.adjoint, g.saved(b)), neg(div(mul(g.adjoint, g.saved(a)), mul(g.saved(b), g.saved(b))))};
}
std::vector<ExprP> grad_neg(const GradArgs& g) { return {neg(g.adjoint)}; }
std::vector<ExprP> grad_exp(const GradArgs& g) { return {mul(g.adjoint, fn(Op::Exp, {g.saved(g.call.args[0])}))}; }
std::vector<ExprP> grad_relu(const GradArgs& g) {
  return {mul(g.adjoint, fn(Op::LeakyReluGrad, {g.saved(g.call.args[0]), num(0.0)}))};
}
std::vector<ExprP> grad_leakyrelu(const GradArgs& g) {
  ExprP slope = g.call.args.size() > 1 ? g.call.args[1] : num(*op_info(Op::LeakyRelu).params[1].default_value);
  // With a slope >= 0 the result has the sign of the argument: the derivative reads the stored result (RGAT's
  // attention score, one value per edge) instead of recomputing the argument (a dot product over the
  // destination's feature row per edge).
  if (std::optional<double> a = g.constant(slope); a && *a >= 0)
    if (ExprP y = g.result()) return {mul(g.adjoint, fn(Op::LeakyReluGrad, {y, slope})), nullptr};
  return {mul(g.adjoint, fn(Op::LeakyReluGrad, {g.saved(g.call.args[0]), slope})), nullptr};
}
std::vector<ExprP> grad_tanh(const GradArgs& g) {
  ExprP t = fn(Op::Tanh, {g.saved(g.call.args[0])});
  return {mul(g.adjoint, sub(num(1.0), mul(t, t)))};
}
std::vector<ExprP> grad_sigmoid(const GradArgs& g) {
  ExprP s = fn(Op::Sigmoid, {g.saved(g.call.args[0])});
  return {mul(g.adjoint, mul(s, sub(num(1.0), s)))};
}
std::vector<ExprP> grad_sqrt(const GradArgs& g) {
  return {div(mul(g.adjoint, num(0.5)), fn(Op::Sqrt, {g.saved(g.call.args[0])}))};
}
std::vector<ExprP> grad_max(const GradArgs& g) {
  const ExprP &a = g.call.args[0], &b = g.call.args[1];
  return {mul(g.adjoint, fn(Op::MaxGrad, {g.saved(a), g.saved(b)})),
          mul(g.adjoint, sub(num(1.0), fn(Op::MaxGrad, {g.saved(a), g.saved(b)})))};
}
// The adjoint of every summed element: the result's, broadcast back over the last axis.
std::vector<ExprP> grad_sum(const GradArgs& g) {
  std::vector<ExprP> args{g.adjoint};
  for (int64_t d : value_type(g.call.args[0]->type).shape) args.push_back(typed::number(static_cast<double>(d), true));
  return {fn(Op::Expand, std::move(args))};
}
// The adjoint of x sums the broadcast copies (autodiff sums an adjoint over the axes its operand was
// broadcast along).
std::vector<ExprP> grad_expand(const GradArgs& g) {
  std::vector<ExprP> out(g.call.args.size());
  out[0] = g.adjoint;
  return out;
}
// Each part's adjoint is its slice of the result's.
std::vector<ExprP> grad_concat(const GradArgs& g) {
  std::vector<ExprP> out;
  int64_t start = 0;
  for (const ExprP& part : g.call.args) {
    int64_t width = value_type(part->type).shape.back();
    out.push_back(fn(Op::Slice, {g.adjoint, typed::number(static_cast<double>(start), true),
                                 typed::number(static_cast<double>(width), true)}));
    start += width;
  }
  return out;
}
// The adjoint of x: the result's adjoint where the slice took it, zero elsewhere.
std::vector<ExprP> grad_slice(const GradArgs& g) {
  const std::vector<int64_t>& shape = value_type(g.call.args[0]->type).shape;
  int64_t start = static_cast<int64_t>(g.call.args[1]->type.value.value_or(0.0)), length = value_type(g.call.type).shape.back();
  auto zeros = [&](int64_t width) {
    std::vector<ExprP> args{num(0.0)};
    for (size_t i = 0; i + 1 < shape.size(); ++i) args.push_back(typed::number(static_cast<double>(shape[i]), true));
    args.push_back(typed::number(static_cast<double>(width), true));
    return fn(Op::Expand, std::move(args));
  };
  std::vector<ExprP> parts;
  if (start > 0) parts.push_back(zeros(start));
  parts.push_back(g.adjoint);
  if (start + length < shape.back()) parts.push_back(zeros(shape.back() - start - length));
  return {parts.size() == 1 ? g.adjoint : fn(Op::Concat, std::move(parts)), nullptr, nullptr};
}
std::vector<ExprP> grad_dot(const GradArgs& g) {
  const ExprP &a = g.call.args[0], &b = g.call.args[1];
  return {mul(g.adjoint, g.saved(b)), mul(g.adjoint, g.saved(a))};
}
// y = outer(a, b), y[i, j] = a[i] b[j]:  da = matvec(dy, b);  db = vecmat(a, dy).
std::vector<ExprP> grad_outer(const GradArgs& g) {
  const ExprP &a = g.call.args[0], &b = g.call.args[1];
  return {fn(Op::MatVec, {g.adjoint, g.saved(b)}), fn(Op::VecMat, {g.saved(a), g.adjoint})};
}
// y = matvec(m, v):  dm = outer(dy, v);  dv = vecmat(dy, m).
std::vector<ExprP> grad_matvec(const GradArgs& g) {
  const ExprP &m = g.call.args[0], &v = g.call.args[1];
  return {fn(Op::Outer, {g.adjoint, g.saved(v)}), fn(Op::VecMat, {g.adjoint, g.saved(m)})};
}
// y = vecmat(v, m):  dv = matvec(m, dy);  dm = outer(v, dy).
std::vector<ExprP> grad_vecmat(const GradArgs& g) {
  const ExprP &v = g.call.args[0], &m = g.call.args[1];
  return {fn(Op::MatVec, {g.saved(m), g.adjoint}), fn(Op::Outer, {g.saved(v), g.adjoint})};
}
std::vector<ExprP> grad_reshape(const GradArgs& g) {
  std::vector<ExprP> out(g.call.args.size());
  const std::vector<int64_t>& shape = value_type(g.call.args[0]->type).shape;
  if (shape.empty()) {
    out[0] = g.adjoint;
    return out;
  }
  std::vector<ExprP> args{g.adjoint};
  for (int64_t d : shape) args.push_back(typed::number(static_cast<double>(d), true));
  out[0] = fn(Op::Reshape, std::move(args));
  return out;
}
// y = x * W:  dx = dy * W^T;  dW = outer(x, dy).
std::vector<ExprP> grad_linear(const GradArgs& g) {
  const ExprP &x = g.call.args[0], &w = g.call.args[1];
  if (w->type.shape.size() == 2 && value_type(x->type).shape.size() > 1)
    throw UnsupportedGradient(x->loc, "autodiff: a 2-D weight applied to each head of a value is not supported yet");
  return {fn(Op::LinearT, {g.adjoint, w}), fn(Op::Outer, {g.saved(x), g.adjoint})};
}

// y = x * W^T (W [K, M], x [M], y [K]):  dx = dy * W;  dW = outer(dy, x). The reordered dot's weight product
// (passes::reorder_linear) is this with x a weight row: both gradients are weight gradients.
std::vector<ExprP> grad_linear_t(const GradArgs& g) {
  const ExprP &x = g.call.args[0], &w = g.call.args[1];
  if (w->type.shape.size() != 2 || value_type(x->type).shape.size() != 1)
    throw UnsupportedGradient(x->loc, "autodiff: linear_t is differentiated for a vector and a 2-D weight only");
  return {fn(Op::Linear, {g.adjoint, w}), fn(Op::Outer, {g.adjoint, g.saved(x)})};
}

// ---- the table -----------------------------------------------------------------------------------------------
Param tensor(const char* role) { return Param{ParamKind::Tensor, role, std::nullopt, "", ""}; }
Param weight(const char* role) { return Param{ParamKind::Weight, role, std::nullopt, "", ""}; }
Param slope() {
  return Param{ParamKind::Constant, "the slope", 0.01, "not-constant",
               "the slope of 'leakyrelu' must be a constant (a number or a hyper-parameter)"};
}
Param dimension(const char* error) { return Param{ParamKind::Constant, "a dimension", std::nullopt, "bad-shape", error}; }

const std::vector<Param> kOne = {tensor("the argument")};
const std::vector<Param> kTwo = {tensor("the first argument"), tensor("the second argument")};
const std::vector<Param> kOperands = {tensor("the left operand"), tensor("the right operand")};
constexpr Templates kAnywhere{false, true, true};  // traversal and PyTorch fallback
constexpr Templates kTorchOnly{false, false, true};
constexpr Templates kGemmOnly{true, false, false};

std::vector<OpInfo> make_table() {
  std::vector<OpInfo> t;
  auto row = [&](OpInfo r) { t.push_back(std::move(r)); };
  auto arith = [&](Op op, const char* name, EvalFn eval, GradFn grad, const char* cuda, const char* aten) {
    row({op, name, Syntax::Infix, kOperands, false, broadcast2, true, eval, grad, kAnywhere, Form::Map, cuda, aten, AtenArgs::Broadcast});
  };
  arith(Op::Add, "+", [](const Args& a, const Type&) { return map2(a[0], a[1], [](double x, double y) { return x + y; }); },
        grad_add, "{0} + {1}", "({0} + {1})");
  arith(Op::Sub, "-", [](const Args& a, const Type&) { return map2(a[0], a[1], [](double x, double y) { return x - y; }); },
        grad_sub, "{0} - {1}", "({0} - {1})");
  arith(Op::Mul, "*", [](const Args& a, const Type&) { return map2(a[0], a[1], [](double x, double y) { return x * y; }); },
        grad_mul, "{0} * {1}", "({0} * {1})");
  arith(Op::Div, "/", [](const Args& a, const Type&) { return map2(a[0], a[1], [](double x, double y) { return x / y; }); },
        grad_div, "{0} / {1}", "({0} / {1})");
  row({Op::Neg, "-", Syntax::Prefix, {tensor("the operand")}, false, same_as_first, true,
       [](const Args& a, const Type&) { return map1(a[0], [](double x) { return -x; }); }, grad_neg, kAnywhere, Form::Map,
       "-{0}", "(-{0})", AtenArgs::AsIs});

  auto unary = [&](Op op, const char* name, EvalFn eval, GradFn grad, const char* cuda, const char* aten, bool folds = false) {
    row({op, name, Syntax::Call, kOne, false, same_as_first, folds, eval, grad, kAnywhere, Form::Map, cuda, aten, AtenArgs::AsIs});
  };
  unary(Op::Exp, "exp", [](const Args& a, const Type&) { return map1(a[0], [](double v) { return std::exp(v); }); }, grad_exp,
        "expf({0})", "at::exp({0})");
  unary(Op::Relu, "relu", [](const Args& a, const Type&) { return map1(a[0], [](double v) { return v > 0 ? v : 0.0; }); },
        grad_relu, "fmaxf({0}, 0.f)", "at::relu({0})");
  unary(Op::Tanh, "tanh", [](const Args& a, const Type&) { return map1(a[0], [](double v) { return std::tanh(v); }); }, grad_tanh,
        "tanhf({0})", "at::tanh({0})");
  unary(Op::Sigmoid, "sigmoid",
        [](const Args& a, const Type&) { return map1(a[0], [](double v) { return 1.0 / (1.0 + std::exp(-v)); }); }, grad_sigmoid,
        "1.f / (1.f + expf(-{0}))", "at::sigmoid({0})");
  unary(Op::Sqrt, "sqrt", [](const Args& a, const Type&) { return map1(a[0], [](double v) { return std::sqrt(v); }); }, grad_sqrt,
        "sqrtf({0})", "at::sqrt({0})", /*folds=*/true);
  row({Op::LeakyRelu, "leakyrelu", Syntax::Call, {tensor("the argument"), slope()}, false, same_as_first, false,
       [](const Args& a, const Type&) {
         double s = a[1].data[0];
         return map1(a[0], [s](double v) { return v > 0 ? v : s * v; });
       },
       grad_leakyrelu, kAnywhere, Form::Map, "{0} > 0.f ? {0} : {1} * {0}", "at::leaky_relu({0}, {1})", AtenArgs::AsIs});
  // The derivative of leakyrelu: 1 where x > 0, else the slope.
  row({Op::LeakyReluGrad, "leakyrelu_grad", Syntax::Call, {tensor("the argument"), slope()}, false, same_as_first, false,
       [](const Args& a, const Type&) {
         double s = a[1].data[0];
         return map1(a[0], [s](double v) { return v > 0 ? 1.0 : s; });
       },
       nullptr, kAnywhere, Form::Map, "({0} > 0.f ? 1.f : {1})", "at::where({0} > 0, 1.0, {1})", AtenArgs::AsIs});
  row({Op::Max, "max", Syntax::Call, kTwo, false, broadcast2, false,
       [](const Args& a, const Type&) { return map2(a[0], a[1], [](double x, double y) { return std::max(x, y); }); }, grad_max,
       kAnywhere, Form::Map, "fmaxf({0}, {1})", "at::maximum({0}, {1})", AtenArgs::RowsAligned});
  // The derivative of max(a, b) with respect to a: 1 where a >= b, else 0.
  row({Op::MaxGrad, "max_grad", Syntax::Call, kTwo, false, broadcast2, false,
       [](const Args& a, const Type&) { return map2(a[0], a[1], [](double x, double y) { return x >= y ? 1.0 : 0.0; }); }, nullptr,
       kAnywhere, Form::Map, "({0} >= {1} ? 1.f : 0.f)", "({0} >= {1}).to(at::kFloat)", AtenArgs::RowsAligned});

  row({Op::Sum, "sum", Syntax::Call, kOne, false, sum_rule, false, eval_sum, grad_sum, kAnywhere, Form::ReduceLast, "", "{0}.sum(-1)",
       AtenArgs::Rows});
  row({Op::Dot, "dot", Syntax::Call, kTwo, false, dot_rule, false, eval_dot, grad_dot, kAnywhere, Form::ReduceLast, "",
       "({0} * {1}).sum(-1)", AtenArgs::Rows});
  row({Op::Outer, "outer", Syntax::Call, kTwo, false, outer_rule, false, eval_outer, grad_outer, kTorchOnly, Form::None, "",
       "({0}.unsqueeze(-1) * {1}.unsqueeze(-2))", AtenArgs::Rows});
  // A matrix times a vector per row, and a vector times a matrix (the derivatives of outer).
  row({Op::MatVec, "matvec", Syntax::Call, {tensor("the matrix"), tensor("the vector")}, false, matvec_rule, false, eval_matvec,
       grad_matvec, kTorchOnly, Form::None, "", "({0} * {1}.unsqueeze(-2)).sum(-1)", AtenArgs::Rows});
  row({Op::VecMat, "vecmat", Syntax::Call, {tensor("the vector"), tensor("the matrix")}, false, matvec_rule, false, eval_vecmat,
       grad_vecmat, kTorchOnly, Form::None, "", "({0}.unsqueeze(-1) * {1}).sum(-2)", AtenArgs::Rows});
  row({Op::Concat, "concat", Syntax::Call, {tensor("an argument"), tensor("an argument")}, true, concat_rule, false, eval_concat,
       grad_concat, kTorchOnly, Form::None, "", "at::cat({{*}}, -1)", AtenArgs::Rows});
  row({Op::Slice, "slice", Syntax::Call,
       {tensor("the input"), dimension("the start of 'slice' must be a non-negative integer constant"),
        dimension("the length of 'slice' must be a positive integer constant")},
       false, slice_rule, false, eval_slice, grad_slice, kTorchOnly, Form::None, "",
       "{0}.narrow(-1, static_cast<int64_t>({1}), static_cast<int64_t>({2}))", AtenArgs::Rows});
  row({Op::Reshape, "reshape", Syntax::Call,
       {tensor("the input"), dimension("reshape dimensions must be positive integer constants")}, true, reshape_rule, false,
       eval_reshape, grad_reshape, kAnywhere, Form::View, "", "{0}.reshape({{rows}{dims}})", AtenArgs::Rows});
  // Prefix broadcasting made explicit (the derivative of sum; zero gradients of a given shape).
  row({Op::Expand, "expand", Syntax::Call, {tensor("the input"), dimension("expand dimensions must be positive integer constants")},
       true, expand_rule, false, eval_expand, grad_expand, kAnywhere, Form::Map, "{0}", "{0}.expand({{rows}{dims}})",
       AtenArgs::RowsAligned});

  row({Op::Linear, "linear", Syntax::Call, {tensor("the input"), weight("the second argument")}, false, linear_rule, false, eval_linear,
       grad_linear, kGemmOnly, Form::None, "", "", AtenArgs::AsIs});
  // y times W transposed (the input gradient of a linear transform).
  row({Op::LinearT, "linear_t", Syntax::Call, {tensor("the input"), weight("the second argument")}, false, linear_t_rule, false,
       eval_linear_t, grad_linear_t, kGemmOnly, Form::None, "", "", AtenArgs::AsIs});
  return t;
}

}  // namespace

size_t OpInfo::min_args() const {
  size_t n = 0;
  for (const Param& p : params)
    if (!p.default_value) ++n;
  return n;
}

size_t OpInfo::max_args() const { return variadic ? SIZE_MAX : params.size(); }

const Param& OpInfo::param(size_t i) const { return i < params.size() ? params[i] : params.back(); }

const std::vector<OpInfo>& all_ops() {
  static const std::vector<OpInfo> table = make_table();
  return table;
}

const OpInfo& op_info(Op op) {
  const auto& t = all_ops();
  size_t i = static_cast<size_t>(op);
  if (i == 0 || i > t.size() || t[i - 1].op != op) throw std::logic_error("op_info: not an operator");
  return t[i - 1];
}

std::optional<Op> call_op(std::string_view name) {
  for (const OpInfo& r : all_ops())
    if (r.syntax == Syntax::Call && name == r.name) return r.op;
  return std::nullopt;
}

const std::vector<std::string>& call_op_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const OpInfo& r : all_ops())
      if (r.syntax == Syntax::Call) v.push_back(r.name);
    std::sort(v.begin(), v.end());
    return v;
  }();
  return names;
}

Op binary_op(BinOp op) {
  switch (op) {
    case BinOp::Add: return Op::Add;
    case BinOp::Sub: return Op::Sub;
    case BinOp::Mul: return Op::Mul;
    case BinOp::Div: return Op::Div;
  }
  return Op::None;
}

std::string spell(std::string_view pattern, const std::vector<std::string>& args, const std::string& all,
                  const std::string& rows, const std::string& dims) {
  std::string out;
  for (size_t i = 0; i < pattern.size();) {
    std::string_view rest = pattern.substr(i);
    if (rest.size() >= 3 && rest[0] == '{' && rest[1] >= '0' && rest[1] <= '9' && rest[2] == '}') {
      size_t k = static_cast<size_t>(rest[1] - '0');
      if (k >= args.size()) throw std::logic_error(fmt::format("spell: no argument {} for '{}'", k, pattern));
      out += args[k];
      i += 3;
    } else if (rest.substr(0, 3) == "{*}") {
      out += all;
      i += 3;
    } else if (rest.substr(0, 6) == "{rows}") {
      out += rows;
      i += 6;
    } else if (rest.substr(0, 6) == "{dims}") {
      out += dims;
      i += 6;
    } else {
      out += pattern[i++];
    }
  }
  return out;
}

}  // namespace hectorgen::inter
