"""A plain-PyTorch evaluator of any hectorgen model: the generic reference of the GPU check.

    model = ir_torch.load_model("specs/rgat.yaml")          # a spec (.yaml/.yml/.json) or printed IR (.ir)
    out = ir_torch.evaluate(model, graph, tensors)           # {"h": tensor [N, heads, out_dim]}
    out, grads = ir_torch.forward_backward(model, graph, tensors, {"h": d_h})
                                                             # grads: {"feature": ..., "W": ..., ...}

It reads the model's program itself -- the spec's DSL (functions inlined here) or the text of a printed
inter-operator IR (``hectorgen SPEC --emit=inter-ir``, ``generated/*/*.inter.ir``) -- with Python's ``ast``
module, and evaluates it with torch ops, so it shares no code with the compiler. Each statement of a loop
nest is evaluated for all of the loop's elements at once:

* a loop over ``g.edges()`` works on rows = all E edges (in the graph's edge order), a loop over
  ``g.dst_nodes()``/``g.src_nodes()`` on rows = all N nodes, and ``for e in n.incoming_edges()`` /
  ``n.outgoing_edges()`` again on all E edges, with ``n`` standing for ``dst[e]`` / ``src[e]``;
* node data read through an edge (``e.src.feature``, ``e.dst["q"]``, the outer ``n``) is gathered with
  ``index_select``; ``x["f"] += v`` into a node through an edge is ``index_add`` (``-=`` subtracts), and
  ``n["m"] = max(n["m"], v)`` is ``scatter_reduce(amax, include_self=True)``;
* ``x * W[e.etype]`` / ``linear(x, W[...])`` with a matrix weight multiplies each row by its relation's
  (node type's) matrix, rows grouped by type (never a per-edge copy of the matrices); a per-``none``
  weight is one matmul; a weight slice used element-wise (``mu[e.etype]``) is gathered per row;
* element-wise operators broadcast by shape *prefix* (docs/semantics.md): [H] with [H, D] acts like
  ``a[:, None] * b``.

This gives the same results as hectorgen's sequential float64 interpreter for every program whose result
does not depend on the order of the loop's elements. Programs where it could (a node field aggregated
through ``e.src`` in a node loop that also reads it, a node field read in the edge loop that aggregates into
it, a local of a node loop updated from its edge loop, ...) are rejected with :class:`OrderDependent`
instead of being evaluated differently. Gradients come from torch autograd, so every input and weight that
requires grad gets one.

Built-ins (every one the verifier accepts): exp relu tanh sigmoid sqrt leakyrelu dot outer linear concat
reshape sum linear_t leakyrelu_grad max max_grad; operators + - * / and unary -; ``d_W[e.etype] += v``
into weight-gradient outputs (printed backward IR).
"""
from __future__ import annotations

import ast
import copy
import json
import math
import operator
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

__all__ = [
    "Decl",
    "Model",
    "OrderDependent",
    "Unsupported",
    "load_model",
    "model_from_spec",
    "model_from_ir_text",
    "grad_name",
    "SIGIL",
    "evaluate",
    "forward_backward",
    "grad_names",
    "random_inputs",
    "random_output_grads",
    "graph_inputs",
]

F64 = torch.float64


class Unsupported(ValueError):
    """The program uses a construct this evaluator does not know (a bug here or an invalid program)."""


class OrderDependent(Unsupported):
    """The program's result would depend on the order in which a loop visits its elements."""


# ---------------------------------------------------------------------------------------------------
# The model: declarations and the program (Python ast, functions inlined)
# ---------------------------------------------------------------------------------------------------

@dataclass
class Decl:
    name: str
    role: str                    # input | weight | output
    per: str                     # node | edge | etype | ntype | none
    shape: tuple
    from_graph: str | None = None
    requires_grad: bool = True
    indexed_rows: bool = False   # inputs per node with `rows: indexed`: a table read through <name>_rows (no gradient)

    def full_shape(self, N: int, E: int, R: int, T: int) -> tuple:
        lead = {"node": (N,), "edge": (E,), "etype": (R,), "ntype": (T,), "none": ()}[self.per]
        return lead + tuple(self.shape)

    @property
    def is_weight_grad(self) -> bool:
        """Outputs per etype/ntype/none are weight gradients (accumulated with ``+=`` only)."""
        return self.role == "output" and self.per in ("etype", "ntype", "none")


@dataclass
class Model:
    name: str
    hyper: dict
    inputs: list
    weights: list
    outputs: list
    body: list                   # ast statements (top-level loops), functions inlined
    source: str = ""

    def decl(self, name: str) -> Decl | None:
        for d in self.inputs + self.weights + self.outputs:
            if d.name == name:
                return d
        return None

    def input(self, name):
        return next((d for d in self.inputs if d.name == name), None)

    def weight(self, name):
        return next((d for d in self.weights if d.name == name), None)

    def output(self, name):
        return next((d for d in self.outputs if d.name == name), None)


_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _const(node: ast.AST, hyper: Mapping[str, float]) -> float:
    """A constant expression of numbers, hyper-parameters, + - * /, unary minus and sqrt()."""
    if isinstance(node, ast.Expression):
        return _const(node.body, hyper)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        if node.id not in hyper:
            raise Unsupported(f"'{node.id}' is not a hyper-parameter")
        return float(hyper[node.id])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_const(node.operand, hyper)
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        return _BIN[type(node.op)](_const(node.left, hyper), _const(node.right, hyper))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sqrt" \
            and len(node.args) == 1:
        return math.sqrt(_const(node.args[0], hyper))
    raise Unsupported(f"not a constant expression: {ast.unparse(node)}")


def _const_text(text, hyper) -> float:
    if isinstance(text, bool):
        raise Unsupported(f"not a number: {text!r}")
    if isinstance(text, (int, float)):
        return float(text)
    return _const(ast.parse(str(text).strip(), mode="eval"), hyper)


def _dim(v: float, what: str) -> int:
    if v != int(v) or v < 1:
        raise Unsupported(f"{what}: dimension {v} is not a positive integer")
    return int(v)


class _Inliner(ast.NodeTransformer):
    def __init__(self, bindings):
        self.bindings = bindings

    def visit_Name(self, node):
        if node.id in self.bindings:
            return copy.deepcopy(self.bindings[node.id])
        return node


def _inline(stmts, functions, depth=0) -> list:
    """Replaces every call statement of a user function with its body, arguments substituted."""
    if depth > 64:
        raise Unsupported("function calls nested too deeply (recursion?)")
    out = []
    for s in stmts:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Name) \
                and s.value.func.id in functions:
            f = functions[s.value.func.id]
            params = [a.arg for a in f.args.args]
            if len(params) != len(s.value.args) or s.value.keywords:
                raise Unsupported(f"call of {f.name} with {len(s.value.args)} arguments, it takes {len(params)}")
            body = [_Inliner(dict(zip(params, s.value.args))).visit(copy.deepcopy(b)) for b in f.body]
            out += _inline(body, functions, depth + 1)
        elif isinstance(s, ast.For):
            s = copy.copy(s)
            s.body = _inline(s.body, functions, depth)
            out.append(s)
        else:
            out.append(s)
    return out


def _parse_program(text: str) -> list:
    tree = ast.parse(text)
    functions = {}
    body = []
    for s in tree.body:
        if isinstance(s, ast.FunctionDef):
            functions.setdefault(s.name, s)  # the first definition wins, as in the compiler
        else:
            body.append(s)
    body = _inline(body, functions)
    for s in body:
        if not isinstance(s, ast.For):
            raise Unsupported(f"line {s.lineno}: statements must be inside a loop over the graph")
    _check_order_independent(body)
    return body


def _load_doc(path: Path) -> dict:
    """The spec as a dict: JSON, YAML through PyYAML, or -- where PyYAML is missing (a bare GPU machine) --
    reference_bridge's reader of the spec subset plus the ``program: |`` block scalar."""
    text = path.read_text()
    if path.suffix.lower() == ".json":
        return json.loads(text)
    try:
        import yaml  # PyYAML
    except ImportError:
        from reference_bridge import _mini_yaml
        doc = _mini_yaml(text)
        lines = text.splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"^program:\s*\|[-+]?\s*(#.*)?$", line)
            if m:
                block = []
                for ln in lines[i + 1:]:
                    if ln.strip() and not ln[:1].isspace():
                        break
                    block.append(ln)
                doc["program"] = textwrap.dedent("\n".join(block)) + "\n"
        return doc
    return yaml.safe_load(text)


def model_from_spec(path, hyper_overrides: Mapping[str, Any] | None = None) -> Model:
    """Reads a spec (YAML or JSON): declarations and program."""
    path = Path(path)
    doc = _load_doc(path)
    hyper: dict = {}
    raw = dict(doc.get("hyper") or {})
    raw.update(hyper_overrides or {})
    for k, v in raw.items():
        hyper[k] = _const_text(v, hyper)

    def decls(section, role):
        out = []
        for name, attrs in (doc.get(section) or {}).items():
            attrs = dict(attrs or {})
            shape = tuple(_dim(_const_text(s, hyper), f"{name}") for s in (attrs.get("shape") or []))
            rg = attrs.get("requires_grad", True)
            indexed = attrs.get("rows") == "indexed"
            if attrs.get("from_graph") or indexed:  # an indexed table is never differentiated (the compiler's rule)
                rg = False
            out.append(Decl(str(name), role, str(attrs.get("per", "none")), shape, attrs.get("from_graph"),
                            bool(rg), indexed))
        return out

    program = doc.get("program") or ""
    if isinstance(program, list):
        program = "\n".join(program) + "\n"
    return Model(str(doc.get("model", path.stem)), hyper, decls("inputs", "input"), decls("weights", "weight"),
                 decls("outputs", "output"), _parse_program(program), str(path))


_DECL_RE = re.compile(r"^(input|weight|output)\s+(\w+)\s*:\s*(\w+)\s*\[(.*)\]\s*(.*)$")


# The compiler's derived names carry the sigil '$' (d$h, att$0), which Python's parser does not take: printed IR
# is read with it spelled as SIGIL, a letter no user name contains (grad_name(h) is the name of h's gradient).
SIGIL = "\u01c2"


def grad_name(name: str) -> str:
    """The name of the gradient of ``name`` in printed backward IR, as :func:`model_from_ir_text` reads it."""
    return f"d{SIGIL}{name}"


def model_from_ir_text(text: str, source: str = "<ir>") -> Model:
    """Reads printed inter-operator IR: the header (model, hyper, input, weight, output, option lines),
    then ``program:`` and the loops. Derived names are read with '$' spelled SIGIL."""
    lines = text.replace("$", SIGIL).splitlines()
    name, hyper, decls = None, {}, {"input": [], "weight": [], "output": []}
    for i, line in enumerate(lines):
        s = line.split("#", 1)[0].strip()
        if not s:
            continue
        if s == "program:":
            program = "\n".join(lines[i + 1:]) + "\n"
            break
        kw, _, rest = s.partition(" ")
        if kw == "model":
            name = rest.strip()
        elif kw == "hyper":
            k, _, v = rest.partition("=")
            hyper[k.strip()] = _const_text(v.strip(), hyper)
        elif kw in decls:
            m = _DECL_RE.match(s)
            if not m:
                raise Unsupported(f"{source}:{i + 1}: bad declaration {s!r}")
            dims = [d for d in (x.strip() for x in m.group(4).split(",")) if d]
            shape = tuple(_dim(_const_text(d, hyper), m.group(2)) for d in dims)
            attrs = dict(re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", m.group(5)))
            fg = attrs.get("from_graph", "").strip('"') or None
            indexed = attrs.get("rows", "").strip('"') == "indexed"
            rg = attrs.get("requires_grad", "1") != "0" and not fg and not indexed
            decls[kw].append(Decl(m.group(2), kw, m.group(3), shape, fg, rg, indexed))
        elif kw == "option":
            continue
        else:
            raise Unsupported(f"{source}:{i + 1}: unknown declaration {s!r}")
    else:
        raise Unsupported(f"{source}: no 'program:' line")
    if name is None:
        raise Unsupported(f"{source}: no 'model' line")
    return Model(name, hyper, decls["input"], decls["weight"], decls["output"], _parse_program(program), source)


def load_model(path, hyper_overrides=None) -> Model:
    path = Path(path)
    if path.suffix.lower() == ".ir":
        if hyper_overrides:
            raise ValueError("hyper-parameter overrides need a spec, not printed IR")
        return model_from_ir_text(path.read_text(), str(path))
    return model_from_spec(path, hyper_overrides)


# ---------------------------------------------------------------------------------------------------
# Static check: is the result independent of the order of the loops' elements?
# ---------------------------------------------------------------------------------------------------

def _loop_of(s: ast.For):
    it = s.iter
    if not (isinstance(s.target, ast.Name) and isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute)
            and isinstance(it.func.value, ast.Name) and not it.args):
        raise Unsupported(f"line {s.lineno}: loops are `for x in g.edges()` / `for e in n.incoming_edges()`")
    kinds = {"edges": "edges", "dst_nodes": "nodes", "src_nodes": "nodes", "nodes": "nodes",
             "incoming_edges": "in", "outgoing_edges": "out"}
    kind = kinds.get(it.func.attr)
    if kind is None:
        raise Unsupported(f"line {s.lineno}: unknown iterator {it.func.attr!r}")
    return s.target.id, kind, it.func.value.id


def _is_max_aggregation(s) -> bool:
    return (isinstance(s, ast.Assign) and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Name)
            and s.value.func.id == "max" and len(s.value.args) == 2
            and ast.unparse(s.value.args[0]) == ast.unparse(s.targets[0]))


def _field_access(node):
    """(base ast, field name) for x["f"], else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.value, node.slice.value
    return None


def _check_order_independent(body) -> None:
    for top in body:
        var, kind, _ = _loop_of(top)
        if kind == "edges":
            _check_edge_loop(top, var, {}, None)
        else:
            _check_node_loop(top, var)


def _node_ref(base, edge_var, node_vars, attr_roles):
    """Classifies the base of a field access: ('edge', None), ('node', role) or None. role: 'own' for the
    node loop's own node (n, or e.dst in n.incoming_edges()), 'cross' for another node (e.src there)."""
    if isinstance(base, ast.Name):
        if base.id == edge_var:
            return "edge", None
        if base.id in node_vars:
            return "node", node_vars[base.id]
        return None
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == edge_var:
        return "node", attr_roles.get(base.attr, "cross")
    return None


def _accesses(stmt, edge_var, node_vars, attr_roles):
    """(reads, writes): sets of (kind, role, field) and (kind, role, field, how) of one assignment. The
    target's own value (read by ``+=`` and by a max-aggregation's first operand) is not counted as a read."""
    reads, writes = set(), set()
    target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
    fa = _field_access(target)
    if fa:
        ref = _node_ref(fa[0], edge_var, node_vars, attr_roles)
        if ref:
            # x["f"] += v reads only the row it writes; the kind tells which writes commute
            kind = "max" if _is_max_aggregation(stmt) else \
                "add" if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, (ast.Add, ast.Sub)) else "set"
            writes.add((ref[0], ref[1], fa[1], kind))
    if isinstance(target, ast.Subscript):  # the index of a weight-gradient target (d_W[e.etype])
        roots = [target.slice]
    else:
        roots = []
    roots.append(stmt.value.args[1] if _is_max_aggregation(stmt) else stmt.value)
    for root in roots:
        for node in ast.walk(root):
            fa = _field_access(node)
            if fa:
                ref = _node_ref(fa[0], edge_var, node_vars, attr_roles)
                if ref:
                    reads.add((ref[0], ref[1], fa[1]))
    return reads, writes


def _check_edge_loop(loop, edge_var, attr_roles, outer_var):
    """Within one edge loop: a node field aggregated into must not be read (the max-aggregation's own
    operand excepted). Returns (reads, writes) of the loop."""
    R, W = set(), set()
    for s in loop.body:
        if isinstance(s, ast.For):
            raise Unsupported(f"line {s.lineno}: loops nest two levels deep at most")
        if not isinstance(s, (ast.Assign, ast.AugAssign)):
            continue
        r, w = _accesses(s, edge_var, {outer_var: "own"} if outer_var else {}, attr_roles)
        R |= r
        W |= w
    agg = {f for k, _, f, _ in W if k == "node"}
    bad = sorted(agg & {f for k, _, f in R if k == "node"})
    if bad:
        raise OrderDependent(f"line {loop.lineno}: node field(s) {bad} are read in the edge loop that aggregates "
                             "into them: the result depends on the edge order")
    return R, W


def _check_node_loop(loop, var):
    R, W = set(), set()
    edge_dirs = {}  # edge field -> set of directions ('in'/'out') that access it
    for s in loop.body:
        if isinstance(s, ast.For):
            evar, kind, parent = _loop_of(s)
            if kind not in ("in", "out") or parent != var:
                raise Unsupported(f"line {s.lineno}: only n.incoming_edges()/n.outgoing_edges() nest in a node loop")
            own = "dst" if kind == "in" else "src"
            roles = {own: "own", ("src" if own == "dst" else "dst"): "cross"}
            r, w = _check_edge_loop(s, evar, roles, var)
            for k, _, f, *_ in r | w:
                if k == "edge":
                    edge_dirs.setdefault(f, set()).add(kind)
            R |= r
            W |= w
        elif isinstance(s, (ast.Assign, ast.AugAssign)):
            r, w = _accesses(s, None, {var: "own"}, {})
            R |= r
            W |= w
    w_cross = {f for k, role, f, _ in W if k == "node" and role == "cross"}
    w_own = {f for k, role, f, _ in W if k == "node" and role == "own"}
    r_any = {f for k, _, f in R if k == "node"}
    r_cross = {f for k, role, f in R if k == "node" and role == "cross"}
    # Writes of one field from several nodes' iterations commute only if all are sums (or all maxima).
    hows = {}
    for k, _, f, how in W:
        if k == "node":
            hows.setdefault(f, set()).add(how)
    mixed_writes = {f for f in w_cross & w_own if len(hows[f]) > 1 or "set" in hows[f]}
    bad = sorted((w_cross & r_any) | mixed_writes | (w_own & r_cross))
    if bad:
        raise OrderDependent(f"line {loop.lineno}: node field(s) {bad} are written for one node and read or "
                             "written for another in the same node loop: the result depends on the node order")
    mixed = sorted(f for f, dirs in edge_dirs.items() if len(dirs) > 1)
    if mixed:
        raise OrderDependent(f"line {loop.lineno}: edge field(s) {mixed} are accessed from both incoming and "
                             "outgoing edge loops of one node loop: the result depends on the node order")


# ---------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------

@dataclass
class _Data:
    """A tensor value. rows: its first dimension runs over the current loop's elements."""
    t: torch.Tensor
    rows: bool

    @property
    def elem(self) -> tuple:
        return tuple(self.t.shape[1:]) if self.rows else tuple(self.t.shape)


@dataclass
class _EdgeVar:
    pass


@dataclass
class _NodeVar:
    idx: torch.Tensor | None     # row -> node id; None: the rows are the nodes themselves


@dataclass
class _TypeIdx:
    idx: torch.Tensor            # row -> type id
    etype: bool


@dataclass
class _WSel:
    decl: Decl
    idx: torch.Tensor | None     # row -> slice; None: not selected (or per none)
    selected: bool


@dataclass
class _Str:
    s: str


@dataclass
class _Frame:
    var: str
    kind: str                    # "edge" | "node"
    rows: int
    node_idx: torch.Tensor | None = None   # inner edge loops: the enclosing node of each edge
    locals: dict = field(default_factory=dict)


class _Grouping:
    """Rows grouped by type (stable), to apply a per-type matrix to each group."""

    def __init__(self, idx: torch.Tensor, num: int):
        self.order = torch.argsort(idx, stable=True)
        self.counts = torch.bincount(idx, minlength=num).tolist()
        inv = torch.empty_like(self.order)
        inv[self.order] = torch.arange(self.order.numel(), device=idx.device)
        self.inverse = inv


class _Evaluator:
    def __init__(self, model: Model, graph, tensors: Mapping[str, torch.Tensor], device, dtype):
        self.m = model
        self.device = device
        self.dtype = dtype
        g = graph
        get = (lambda k, d=None: g[k] if k in g else d) if isinstance(g, Mapping) else \
            (lambda k, d=None: getattr(g, k, d))
        self.src = torch.as_tensor(get("src")).to(device, torch.int64)
        self.dst = torch.as_tensor(get("dst")).to(device, torch.int64)
        self.etype = torch.as_tensor(get("etype")).to(device, torch.int64)
        self.N = int(get("num_nodes"))
        self.R = int(get("num_etypes"))
        self.T = int(get("num_ntypes", 1) or 1)
        nt = get("ntype")
        self.ntype = torch.as_tensor(nt).to(device, torch.int64) if nt is not None else \
            torch.zeros(self.N, dtype=torch.int64, device=device)
        self.E = int(self.src.numel())
        self.tensors = {}
        for d in model.inputs + model.weights:
            want = d.full_shape(self.N, self.E, self.R, self.T)
            if d.name in tensors:
                t = torch.as_tensor(tensors[d.name])
                t = t.to(device=device, dtype=self.dtype)  # a no-op when already there
                if tuple(t.shape) != want:
                    raise ValueError(f"tensor {d.name!r} has shape {tuple(t.shape)}, the model wants {want}")
                self.tensors[d.name] = t
            elif d.from_graph == "inv_relation_in_degree":
                self.tensors[d.name] = self._inv_relation_in_degree()
            else:
                raise ValueError(f"missing tensor {d.name!r} ({d.role} per {d.per})")
        self.node_fields: dict = {}
        self.edge_fields: dict = {}
        self.wgrads = {o.name: None for o in model.outputs if o.is_weight_grad}
        self.frames: list = []
        self._groupings: dict = {}

    def _inv_relation_in_degree(self):
        if self.E == 0:
            return torch.zeros(0, dtype=self.dtype, device=self.device)
        key = self.dst * self.R + self.etype
        _, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
        return 1.0 / counts.index_select(0, inverse).to(self.dtype)

    # ---- driver ---------------------------------------------------------------------------------
    def run(self) -> dict:
        for s in self.m.body:
            var, kind, parent = _loop_of(s)
            if parent != "g" or kind in ("in", "out"):
                raise Unsupported(f"line {s.lineno}: top-level loops iterate g.edges() or g.dst_nodes()")
            self.frames = [_Frame(var, "edge" if kind == "edges" else "node", self.E if kind == "edges" else self.N)]
            self.block(s.body)
        out = {}
        for o in self.m.outputs:
            if o.is_weight_grad:
                full = o.full_shape(self.N, self.E, self.R, self.T)
                g = self.wgrads[o.name]
                out[o.name] = torch.zeros(full, dtype=self.dtype, device=self.device) if g is None else g
                continue
            fields = self.node_fields if o.per == "node" else self.edge_fields
            if o.name not in fields:
                raise Unsupported(f"output {o.name!r} was not written")
            t = fields[o.name]
            rows = self.N if o.per == "node" else self.E
            out[o.name] = self._to_shape(t, (rows,) + tuple(o.shape), f"output {o.name!r}")
        self.fields = {**self.node_fields, **self.edge_fields}
        return out

    @staticmethod
    def _to_shape(t, shape, what):
        """A field whose element shape is a prefix of ``shape`` (set from a smaller value) broadcast to it."""
        if tuple(t.shape) == tuple(shape):
            return t
        if len(t.shape) <= len(shape) and tuple(shape[:t.dim()]) == tuple(t.shape):
            return t.reshape(tuple(t.shape) + (1,) * (len(shape) - t.dim())).expand(shape)
        raise Unsupported(f"{what} has shape {tuple(t.shape)}, expected {tuple(shape)}")

    def block(self, body):
        for s in body:
            if isinstance(s, ast.For):
                self.inner_loop(s)
            elif isinstance(s, ast.Assign):
                if len(s.targets) != 1:
                    raise Unsupported(f"line {s.lineno}: one target per assignment")
                self.assign(s.targets[0], None, s.value, s)
            elif isinstance(s, ast.AugAssign):
                self.assign(s.target, type(s.op), s.value, s)
            else:
                raise Unsupported(f"line {s.lineno}: unsupported statement {ast.unparse(s)!r}")

    def inner_loop(self, s):
        var, kind, parent = _loop_of(s)
        outer = self.frames[-1]
        if kind not in ("in", "out") or outer.kind != "node" or parent != outer.var or len(self.frames) != 1:
            raise Unsupported(f"line {s.lineno}: only n.incoming_edges()/n.outgoing_edges() nest, one level, "
                              "in a node loop")
        self.frames.append(_Frame(var, "edge", self.E, node_idx=self.dst if kind == "in" else self.src))
        try:
            self.block(s.body)
        finally:
            self.frames.pop()

    @property
    def frame(self) -> _Frame:
        return self.frames[-1]

    # ---- assignments ----------------------------------------------------------------------------
    def assign(self, target, op, value_ast, stmt):
        fa = _field_access(target)
        if fa and op is None and _is_max_aggregation(stmt):
            base = self.eval(fa[0])
            if isinstance(base, _NodeVar) and base.idx is not None:
                # Many edges into one node each: max(current, v) per node, over its edges.
                return self.max_aggregate(fa[1], base.idx, self.value(value_ast.args[1]))
        value = self.value(value_ast)
        wname = None
        if isinstance(target, ast.Name) and target.id in self.wgrads:
            wname, sel = target.id, None
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                and target.value.id in self.wgrads:
            wname, sel = target.value.id, self.eval(target.slice)
        if wname is not None:
            return self.weight_grad(wname, sel, op, value, stmt)
        if isinstance(target, ast.Name):
            return self.assign_local(target.id, op, value, stmt)
        if not fa:
            raise Unsupported(f"line {stmt.lineno}: cannot assign to {ast.unparse(target)!r}")
        base = self.eval(fa[0])
        name = fa[1]
        if isinstance(base, _EdgeVar):
            if self.frame.kind != "edge":
                raise Unsupported(f"line {stmt.lineno}: edge field written outside its edge loop")
            self.edge_fields[name] = self.update_rows(self.edge_fields.get(name), op, value, self.E, stmt)
            return
        if not isinstance(base, _NodeVar):
            raise Unsupported(f"line {stmt.lineno}: cannot assign to {ast.unparse(target)!r}")
        if base.idx is None:
            self.node_fields[name] = self.update_rows(self.node_fields.get(name), op, value, self.N, stmt)
            return
        # Many rows (edges) into one node each: aggregation.
        if op not in (ast.Add, ast.Sub):
            raise Unsupported(f"line {stmt.lineno}: node field {name!r} is written once per edge; only +=, -= "
                              "and max-aggregation are defined")
        v = self.rows_of(value)
        cur = self.node_fields.get(name)
        if cur is None:  # fields start at zero
            cur = torch.zeros((self.N,) + tuple(v.shape[1:]), dtype=self.dtype, device=self.device)
        cur, v = self.grow(cur, v)
        self.node_fields[name] = cur.index_add(0, base.idx, v, alpha=1 if op is ast.Add else -1)

    def max_aggregate(self, name, idx, value):
        v = self.rows_of(value)
        cur = self.node_fields.get(name)
        if cur is None:  # fields start at zero
            cur = torch.zeros((self.N,) + tuple(v.shape[1:]), dtype=self.dtype, device=self.device)
        cur, v = self.grow(cur, v)
        index = idx.reshape((-1,) + (1,) * (v.dim() - 1)).expand_as(v)
        self.node_fields[name] = cur.scatter_reduce(0, index, v, reduce="amax", include_self=True)

    def rows_of(self, v) -> torch.Tensor:
        d = self.data(v)
        if d.rows:
            return d.t
        return d.t.unsqueeze(0).expand((self.frame.rows,) + tuple(d.t.shape))

    @staticmethod
    def grow(cur: torch.Tensor, v: torch.Tensor):
        """Row tensors whose element shapes are prefix-compatible, broadcast to the larger one."""
        if cur.shape[1:] == v.shape[1:]:
            return cur, v
        a, b = tuple(cur.shape[1:]), tuple(v.shape[1:])
        if b[:len(a)] == a:
            cur = cur.reshape(cur.shape + (1,) * (len(b) - len(a))).expand((cur.shape[0],) + b)
        elif a[:len(b)] == b:
            v = v.reshape(v.shape + (1,) * (len(a) - len(b))).expand((v.shape[0],) + a)
        else:
            raise Unsupported(f"element shapes {a} and {b} do not broadcast")
        return cur, v

    def update_rows(self, cur, op, value, nrows, stmt):
        v = self.rows_of(value)
        if op is None:
            return v
        if cur is None:
            if op not in (ast.Add, ast.Sub):
                raise Unsupported(f"line {stmt.lineno}: field updated before it is assigned")
            cur = torch.zeros((nrows,) + tuple(v.shape[1:]), dtype=self.dtype, device=self.device)
        cur, v = self.grow(cur, v)
        return _BIN[op](cur, v)

    def assign_local(self, name, op, value, stmt):
        if op is None:
            # A local holds a value, never a weight reference: `w = W[e.etype]; x * w` multiplies element-wise.
            self.frame.locals[name] = self.data(value)
            return
        for i in range(len(self.frames) - 1, -1, -1):
            if name in self.frames[i].locals:
                if i != len(self.frames) - 1:
                    raise OrderDependent(f"line {stmt.lineno}: local {name!r} of the node loop is updated in its "
                                         "edge loop: the result depends on the edge order")
                a, b = self.align(self.data(self.frames[i].locals[name]), self.data(value))
                self.frames[i].locals[name] = _Data(_BIN[op](a.t, b.t), a.rows or b.rows)
                return
        raise Unsupported(f"line {stmt.lineno}: local {name!r} updated before it is assigned")

    def weight_grad(self, name, sel, op, value, stmt):
        o = self.m.output(name)
        if op is not ast.Add:
            raise Unsupported(f"line {stmt.lineno}: weight gradient {name!r} is accumulated with += only")
        v = self.rows_of(value)
        full = o.full_shape(self.N, self.E, self.R, self.T)
        cur = self.wgrads[name]
        if cur is None:
            cur = torch.zeros(full, dtype=self.dtype, device=self.device)
        if o.per == "none":
            if sel is not None:
                raise Unsupported(f"line {stmt.lineno}: {name!r} is per none")
            self.wgrads[name] = cur + v.sum(0).reshape(full)
        else:
            if not isinstance(sel, _TypeIdx):
                raise Unsupported(f"line {stmt.lineno}: {name!r} is per {o.per}; index it with a type")
            self.wgrads[name] = cur.index_add(0, sel.idx, v.reshape((v.shape[0],) + full[1:]))

    # ---- expressions ----------------------------------------------------------------------------
    def value(self, node) -> "_Data | _WSel":
        v = self.eval(node)
        if isinstance(v, (_Data, _WSel)):
            return v
        raise Unsupported(f"line {node.lineno}: {ast.unparse(node)!r} is not a tensor value")

    def data(self, v) -> _Data:
        """A tensor value: a weight slice is materialised (gathered per row when selected)."""
        if isinstance(v, _Data):
            return v
        if isinstance(v, _WSel):
            w = self.tensors[v.decl.name]
            if v.decl.per == "none":
                return _Data(w, False)
            if not v.selected:
                raise Unsupported(f"weight {v.decl.name!r} is per {v.decl.per}; select a slice")
            return _Data(w.index_select(0, v.idx), True)
        raise Unsupported(f"expected a tensor value, got {type(v).__name__}")

    def lift(self, v, frame_index: int):
        """A value of an enclosing (node) frame, read in the inner edge loop: gathered per edge."""
        if frame_index == len(self.frames) - 1:
            return v
        idx = self.frame.node_idx
        if isinstance(v, _Data):
            return _Data(v.t.index_select(0, idx), True) if v.rows else v
        if isinstance(v, _WSel) and v.idx is not None:
            return _WSel(v.decl, v.idx.index_select(0, idx), v.selected)
        if isinstance(v, _TypeIdx):
            return _TypeIdx(v.idx.index_select(0, idx), v.etype)
        if isinstance(v, _NodeVar):
            return _NodeVar(idx if v.idx is None else v.idx.index_select(0, idx))
        return v

    def eval(self, node):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                return _Str(node.value)
            if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
                return _Data(torch.tensor(float(node.value), dtype=self.dtype, device=self.device), False)
            raise Unsupported(f"line {node.lineno}: constant {node.value!r}")
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.Attribute):
            return self.attr(node)
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            d = self.data(self.value(node.operand))
            return _Data(-d.t, d.rows)
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            return self.binary(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            return self.call(node)
        raise Unsupported(f"line {getattr(node, 'lineno', '?')}: unsupported expression {ast.unparse(node)!r}")

    def name(self, node):
        n = node.id
        for i in range(len(self.frames) - 1, -1, -1):
            if n in self.frames[i].locals:
                return self.lift(self.frames[i].locals[n], i)
        for i in range(len(self.frames) - 1, -1, -1):
            f = self.frames[i]
            if f.var == n:
                if f.kind == "edge":
                    return _EdgeVar()
                return self.lift(_NodeVar(None), i)
        if n in self.m.hyper:
            return _Data(torch.tensor(float(self.m.hyper[n]), dtype=self.dtype, device=self.device), False)
        w = self.m.weight(n)
        if w is not None:
            return _WSel(w, None, w.per == "none")
        raise Unsupported(f"line {node.lineno}: undefined name {n!r}")

    def attr(self, node):
        base = self.eval(node.value)
        a = node.attr
        if isinstance(base, _EdgeVar):
            if a == "src":
                return _NodeVar(self.src)
            if a == "dst":
                return _NodeVar(self.dst)
            if a == "etype":
                return _TypeIdx(self.etype, True)
            d = self.m.input(a)
            if d is None or d.per != "edge":
                raise Unsupported(f"line {node.lineno}: an edge has no attribute {a!r}")
            return _Data(self.tensors[a], True)
        if isinstance(base, _NodeVar):
            if a == "ntype":
                return _TypeIdx(self.ntype if base.idx is None else self.ntype.index_select(0, base.idx), False)
            d = self.m.input(a)
            if d is None or d.per != "node":
                raise Unsupported(f"line {node.lineno}: a node has no attribute {a!r}")
            t = self.tensors[a]
            return _Data(t if base.idx is None else t.index_select(0, base.idx), True)
        raise Unsupported(f"line {node.lineno}: {ast.unparse(node)!r}")

    def subscript(self, node):
        base = self.eval(node.value)
        if isinstance(base, _WSel):
            if base.selected or base.decl.per == "none":
                raise Unsupported(f"line {node.lineno}: weight {base.decl.name!r} indexed twice or per none")
            ix = self.eval(node.slice)
            if not isinstance(ix, _TypeIdx) or ix.etype != (base.decl.per == "etype"):
                raise Unsupported(f"line {node.lineno}: weight {base.decl.name!r} is per {base.decl.per}")
            return _WSel(base.decl, ix.idx, True)
        fa = _field_access(node)
        if fa is None:
            raise Unsupported(f"line {node.lineno}: {ast.unparse(node)!r} cannot be indexed")
        name = fa[1]
        if isinstance(base, _EdgeVar):
            if name not in self.edge_fields:
                raise Unsupported(f"line {node.lineno}: edge field {name!r} read before it is written")
            return _Data(self.edge_fields[name], True)
        if isinstance(base, _NodeVar):
            if name not in self.node_fields:
                raise Unsupported(f"line {node.lineno}: node field {name!r} read before it is written")
            t = self.node_fields[name]
            return _Data(t if base.idx is None else t.index_select(0, base.idx), True)
        raise Unsupported(f"line {node.lineno}: {ast.unparse(node)!r} cannot be indexed")

    def align(self, a: _Data, b: _Data):
        """Prefix broadcasting of element shapes; rows broadcast against row-less values."""
        ea, eb = a.elem, b.elem
        ta, tb = a.t, b.t
        if ea != eb:
            if eb[:len(ea)] == ea:
                ta = ta.reshape(ta.shape + (1,) * (len(eb) - len(ea)))
            elif ea[:len(eb)] == eb:
                tb = tb.reshape(tb.shape + (1,) * (len(ea) - len(eb)))
            else:
                raise Unsupported(f"shapes {list(ea)} and {list(eb)} do not broadcast (one must be a prefix of "
                                  "the other)")
        if a.rows and not b.rows:
            tb = tb.unsqueeze(0)
        elif b.rows and not a.rows:
            ta = ta.unsqueeze(0)
        return _Data(ta, a.rows), _Data(tb, b.rows)

    def elementwise(self, a, b, fn) -> _Data:
        x, y = self.align(self.data(a), self.data(b))
        return _Data(fn(x.t, y.t), x.rows or y.rows)

    def binary(self, node):
        left = self.value(node.left)
        right = self.value(node.right)
        if isinstance(node.op, ast.Mult) and isinstance(right, _WSel) and len(right.decl.shape) >= 2:
            return self.linear(self.data(left), right, transpose=False, lineno=node.lineno)
        return self.elementwise(left, right, _BIN[type(node.op)])

    # x [.., K] * W [K, N] -> [.., N]; x [H, K] * W [H, K, N] -> [H, N]. transpose: y W^T.
    def linear(self, x: _Data, w: _WSel, transpose: bool, lineno) -> _Data:
        ws = w.decl.shape
        if w.decl.per != "none" and not w.selected:
            raise Unsupported(f"line {lineno}: weight {w.decl.name!r} is per {w.decl.per}; select a slice")
        W = self.tensors[w.decl.name]
        if len(ws) not in (2, 3):
            raise Unsupported(f"line {lineno}: linear needs a 2-D or 3-D weight, {w.decl.name!r} is {list(ws)}")
        k_in = ws[-1] if transpose else ws[-2]
        if len(ws) == 2 and (not x.elem or x.elem[-1] != k_in):
            raise Unsupported(f"line {lineno}: cannot multiply shape {list(x.elem)} by {w.decl.name!r} {list(ws)}")
        if len(ws) == 3 and x.elem != (ws[0], k_in):
            raise Unsupported(f"line {lineno}: cannot multiply shape {list(x.elem)} by {w.decl.name!r} {list(ws)}")

        def apply(xt, Wm):  # Wm: [K, N] or [H, K, N]
            if Wm.dim() == 2:
                return xt @ (Wm.t() if transpose else Wm)
            return torch.einsum("...hn,hkn->...hk", xt, Wm) if transpose else torch.einsum("...hk,hkn->...hn", xt, Wm)

        if w.idx is None:
            return _Data(apply(x.t, W), x.rows)
        xt = x.t if x.rows else x.t.unsqueeze(0).expand((self.frame.rows,) + tuple(x.t.shape))
        num = W.shape[0]
        grp = self._grouping(w.idx, num)
        chunks = torch.split(xt.index_select(0, grp.order), grp.counts)
        ys = [apply(c, W[t]) for t, c in enumerate(chunks)]
        return _Data(torch.cat(ys).index_select(0, grp.inverse), True)

    def _grouping(self, idx, num):
        key = (id(idx), num)
        hit = self._groupings.get(key)
        if hit is None or hit[0] is not idx:
            hit = (idx, _Grouping(idx, num))
            self._groupings[key] = hit
        return hit[1]

    def call(self, node):
        f = node.func.id
        args = node.args

        def arity(lo, hi=None):
            hi = lo if hi is None else hi
            if not lo <= len(args) <= hi:
                raise Unsupported(f"line {node.lineno}: {f!r} takes {lo}..{hi} arguments, got {len(args)}")

        def arg(i) -> _Data:
            return self.data(self.value(args[i]))

        unary = {"exp": torch.exp, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "sqrt": torch.sqrt,
                 "relu": lambda t: torch.where(t > 0, t, torch.zeros_like(t))}
        if f in unary:
            arity(1)
            x = arg(0)
            return _Data(unary[f](x.t), x.rows)
        if f in ("leakyrelu", "leakyrelu_grad"):
            arity(1, 2)
            slope = _const(args[1], self.m.hyper) if len(args) > 1 else 0.01
            x = arg(0)
            if f == "leakyrelu":
                return _Data(torch.where(x.t > 0, x.t, x.t * slope), x.rows)
            return _Data(torch.where(x.t > 0, torch.ones_like(x.t), torch.full_like(x.t, slope)), x.rows)
        if f == "max":
            arity(2)
            return self.elementwise(arg(0), arg(1), torch.maximum)
        if f == "max_grad":
            arity(2)
            return self.elementwise(arg(0), arg(1), lambda a, b: (a >= b).to(self.dtype))
        if f == "sum":
            arity(1)
            x = arg(0)
            if not x.elem:
                raise Unsupported(f"line {node.lineno}: 'sum' of a scalar")
            return _Data(x.t.sum(-1), x.rows)
        if f == "dot":
            arity(2)
            a, b = arg(0), arg(1)
            if a.elem != b.elem or not a.elem:
                raise Unsupported(f"line {node.lineno}: 'dot' of shapes {list(a.elem)} and {list(b.elem)}")
            x, y = self.align(a, b)
            return _Data((x.t * y.t).sum(-1), x.rows or y.rows)
        if f == "outer":
            arity(2)
            a, b = arg(0), arg(1)
            if not a.elem or len(a.elem) != len(b.elem) or a.elem[:-1] != b.elem[:-1]:
                raise Unsupported(f"line {node.lineno}: 'outer' of shapes {list(a.elem)} and {list(b.elem)}")
            x, y = _Data(a.t.unsqueeze(-1), a.rows), _Data(b.t.unsqueeze(-2), b.rows)
            if x.rows and not y.rows:
                y = _Data(y.t.unsqueeze(0), False)
            elif y.rows and not x.rows:
                x = _Data(x.t.unsqueeze(0), False)
            return _Data(x.t * y.t, a.rows or b.rows)
        if f == "concat":
            arity(2, 1 << 30)
            parts = [arg(i) for i in range(len(args))]
            lead = parts[0].elem[:-1]
            for p in parts:
                if not p.elem or p.elem[:-1] != lead or len(p.elem) != len(parts[0].elem):
                    raise Unsupported(f"line {node.lineno}: 'concat' of shapes {[list(q.elem) for q in parts]}")
            if any(p.rows for p in parts):
                ts = [p.t if p.rows else p.t.unsqueeze(0).expand((self.frame.rows,) + tuple(p.t.shape)) for p in parts]
                return _Data(torch.cat(ts, -1), True)
            return _Data(torch.cat([p.t for p in parts], -1), False)
        if f == "reshape":
            arity(2, 1 << 30)
            x = arg(0)
            dims = tuple(_dim(_const(a, self.m.hyper), "reshape") for a in args[1:])
            if math.prod(dims) != math.prod(x.elem):
                raise Unsupported(f"line {node.lineno}: cannot reshape {list(x.elem)} to {list(dims)}")
            return _Data(x.t.reshape(((x.t.shape[0],) if x.rows else ()) + dims), x.rows)
        if f in ("linear", "linear_t"):
            arity(2)
            x = arg(0)
            w = self.eval(args[1])
            if not isinstance(w, _WSel):
                raise Unsupported(f"line {node.lineno}: the second argument of {f!r} must be a weight")
            return self.linear(x, w, transpose=f == "linear_t", lineno=node.lineno)
        raise Unsupported(f"line {node.lineno}: unknown function {f!r}")


def evaluate(model: Model, graph, tensors: Mapping[str, torch.Tensor], device=None, *, fields: dict | None = None,
             dtype: torch.dtype = F64):
    """The model's outputs on ``graph`` for ``tensors`` (inputs and weights by name, any float dtype, converted
    to ``dtype``, float64 by default; inputs declared ``from_graph: inv_relation_in_degree`` may be left out;
    an input with ``rows: indexed`` is its table, read through ``<name>_rows``: :func:`gather_indexed`).
    Autograd flows from the outputs to every tensor that requires grad. ``device``: default the device of the
    graph's ``src``. ``fields``: if a dict, filled with every node and edge field the program wrote."""
    if device is None:
        src = graph["src"] if isinstance(graph, Mapping) else graph.src
        device = torch.as_tensor(src).device
    ev = _Evaluator(model, graph, gather_indexed(model, tensors), device, dtype)
    out = ev.run()
    if fields is not None:
        fields.update(ev.fields)
    return out


def gather_indexed(model: Model, tensors: Mapping[str, torch.Tensor]) -> dict:
    """``tensors`` with each input declared ``rows: indexed`` replaced by its rows per node: node v's row is
    ``table[<name>_rows[v]]`` (the map, integers of any dtype, is dropped). Other tensors pass as they are."""
    out = dict(tensors)
    for d in model.inputs:
        if d.indexed_rows and d.name in out:
            rows = out.pop(d.name + "_rows", None)
            if rows is None:
                raise ValueError(f"input {d.name!r} is read through a node-to-row map: {d.name + '_rows'!r} is missing")
            table = torch.as_tensor(out[d.name])
            out[d.name] = table.index_select(0, torch.as_tensor(rows).to(table.device).long())
    return out


def grad_names(model: Model) -> list:
    """The tensors that get gradients: inputs that require grad (not from_graph), then every weight that does."""
    return [d.name for d in model.inputs if d.requires_grad and not d.from_graph] + \
        [d.name for d in model.weights if d.requires_grad]


def forward_backward(model: Model, graph, tensors: Mapping[str, torch.Tensor],
                     out_grads: Mapping[str, torch.Tensor], device=None, dtype: torch.dtype = F64):
    """(outputs, gradients): the outputs, and the gradient of sum_k <outputs[k], out_grads[k]> with respect to
    every input/weight of :func:`grad_names`, by name (a tensor that does not reach the outputs gets zeros).
    Everything in ``dtype`` (float64 by default)."""
    leaves = {}
    for k, v in tensors.items():
        t = torch.as_tensor(v).detach()
        if device is not None:
            t = t.to(device)
        leaves[k] = t.to(dtype)
    names = [n for n in grad_names(model) if n in leaves]
    for n in names:
        leaves[n].requires_grad_(True)
    with torch.enable_grad():
        out = evaluate(model, graph, leaves, device, dtype=dtype)
        pairs = [(out[k], torch.as_tensor(g).to(out[k].device, dtype)) for k, g in out_grads.items()]
        outs = [o for o, _ in pairs if o.requires_grad]
        gs = [g for o, g in pairs if o.requires_grad]
        inputs = [leaves[n] for n in names]
        grads = torch.autograd.grad(outs, inputs, gs, allow_unused=True) if outs and inputs else [None] * len(inputs)
    res = {n: (g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(names, grads)}
    return {k: v.detach() for k, v in out.items()}, res


def random_inputs(model: Model, graph, seed: int, *, round_to_fp32: bool = True) -> dict:
    """Fresh random inputs and weights for any model, float64 on the CPU, keyed by name (``from_graph``
    inputs left out; an input with ``rows: indexed`` is a table of N // 2 + 3 rows and comes with its random
    node-to-row map ``<name>_rows``, integers stored as float64). Drawn from ``torch.Generator().manual_seed(seed)`` in declaration order, so a seed
    gives the same values everywhere. Scales keep every intermediate O(1) whatever the model:

    * node and edge inputs: N(0, 1);
    * matrix weights ([.., K, M] per slice): Glorot-uniform with fan_in K, fan_out M;
    * vector weights ([D] per slice, e.g. attention vectors): uniform with variance 1/D, so a dot product
      with O(1) data is O(1);
    * scalar weights ([] per slice, e.g. gates, basis coefficients): uniform in [0.5, 1.5].

    ``round_to_fp32``: round every value to float32 once (still returned as float64), so a float32 run on
    the GPU and a float64 reference see exactly the same numbers."""
    N, E, R, T = _graph_dims(graph)
    gen = torch.Generator().manual_seed(int(seed))
    out = {}
    for d in model.inputs + model.weights:
        if d.from_graph:
            continue
        full = d.full_shape(N, E, R, T)
        if d.indexed_rows:  # a table of fewer rows than nodes (rows shared by several nodes, some unused)
            table_rows = N // 2 + 3
            t = torch.randn((table_rows,) + tuple(d.shape), generator=gen, dtype=F64)
            out[d.name + "_rows"] = torch.randint(0, table_rows, (N,), generator=gen).to(F64)
        elif d.role == "input":
            t = torch.randn(full, generator=gen, dtype=F64)
        elif len(d.shape) >= 2:
            a = math.sqrt(6.0 / (d.shape[-2] + d.shape[-1]))
            t = (torch.rand(full, generator=gen, dtype=F64) * 2 - 1) * a
        elif len(d.shape) == 1:
            a = math.sqrt(3.0 / d.shape[0])
            t = (torch.rand(full, generator=gen, dtype=F64) * 2 - 1) * a
        else:
            t = torch.rand(full, generator=gen, dtype=F64) + 0.5
        out[d.name] = t.float().double() if round_to_fp32 else t
    return out


def graph_inputs(model: Model, graph, device=None, dtype: torch.dtype = F64) -> dict:
    """The inputs declared ``from_graph`` (computed once, e.g. to keep them out of a timed region)."""
    if device is None:
        src = graph["src"] if isinstance(graph, Mapping) else graph.src
        device = torch.as_tensor(src).device
    ev = None
    out = {}
    for d in model.inputs:
        if d.from_graph == "inv_relation_in_degree":
            if ev is None:
                ev = _Evaluator(Model(model.name, model.hyper, [], [], [], []), graph, {}, device, dtype)
            out[d.name] = ev._inv_relation_in_degree()
        elif d.from_graph:
            raise Unsupported(f"unknown graph quantity {d.from_graph!r}")
    return out


def random_output_grads(model: Model, graph, seed: int, *, round_to_fp32: bool = True) -> dict:
    """N(0, 1) gradients for every node/edge output, by name (for :func:`forward_backward`)."""
    N, E, R, T = _graph_dims(graph)
    gen = torch.Generator().manual_seed(int(seed) ^ 0x5EED)
    out = {}
    for o in model.outputs:
        if o.is_weight_grad:
            continue
        t = torch.randn(o.full_shape(N, E, R, T), generator=gen, dtype=F64)
        out[o.name] = t.float().double() if round_to_fp32 else t
    return out


def _graph_dims(graph) -> tuple:
    get = (lambda k, d=None: graph[k] if k in graph else d) if isinstance(graph, Mapping) else \
        (lambda k, d=None: getattr(graph, k, d))
    E = int(torch.as_tensor(get("src")).numel())
    return int(get("num_nodes")), E, int(get("num_etypes")), int(get("num_ntypes", 1) or 1)
