"""Bridge from Python to hectorgen's float64 CPU reference interpreter.

    out = cpu_reference("build/hectorgen", "specs/rgat.yaml", graph, {"feature": x, "W": W, ...})
    out["h"]            # float64 CPU tensor, shape [N, heads, out_dim]

writes the graph and the tensors into a temporary directory in the format of
src/driver/reference_io.h (``meta.json`` plus one raw little-endian float64 file per
tensor), runs ``hectorgen SPEC --reference DIR`` and reads ``DIR/out/`` back.

Tensor shapes follow the spec (docs/semantics.md): per-node tensors [N, *shape],
per-edge [E, *shape] in the graph's ORIGINAL edge order (the order of ``graph.src``),
per-etype weights [R, *shape], per-ntype [T, *shape], per-none [*shape]. Inputs marked
``from_graph`` in the spec (RGCN's ``norm``) may be left out: the interpreter then
derives them from the graph itself, which keeps the oracle independent of the code
under test. Tensors the spec does not declare are ignored.

The module also holds a small spec reader (:func:`load_spec`) used by gpu_check.py:
hyper-parameters (expressions such as ``out_dim / heads`` evaluated), and the
inputs / weights / outputs with their ``per`` domain and concrete shapes. It uses
PyYAML when it is installed and a minimal reader for the subset of YAML the specs
use otherwise; ``.json`` specs are read with :mod:`json`.
"""
from __future__ import annotations

import ast
import json
import math
import operator
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch

__all__ = [
    "ReferenceError",
    "TensorDecl",
    "SpecInfo",
    "load_spec",
    "spec_with_hyper",
    "write_reference_dir",
    "read_reference_outputs",
    "read_reference_gradients",
    "run_reference_dir",
    "cpu_reference",
    "cpu_reference_grads",
]


class ReferenceError(RuntimeError):
    """The reference interpreter failed (bad input, missing tensor, interpreter error)."""


# ---------------------------------------------------------------------------------------------
# Spec reading
# ---------------------------------------------------------------------------------------------

@dataclass
class TensorDecl:
    """One declared tensor. ``shape`` is the per-element shape with hyper-parameters resolved."""

    name: str
    role: str                    # "input", "weight" or "output"
    per: str                     # "node", "edge", "etype", "ntype" or "none"
    shape: tuple
    from_graph: str | None = None
    raw: dict = field(default_factory=dict)

    def full_shape(self, num_nodes: int, num_edges: int, num_etypes: int, num_ntypes: int) -> tuple:
        lead = {"node": (num_nodes,), "edge": (num_edges,), "etype": (num_etypes,),
                "ntype": (num_ntypes,), "none": ()}
        if self.per not in lead:
            raise ValueError(f"tensor {self.name!r}: unknown domain per={self.per!r}")
        return lead[self.per] + tuple(self.shape)


@dataclass
class SpecInfo:
    path: Path
    model: str
    hyper: dict
    inputs: list
    weights: list
    outputs: list
    doc: dict

    def decls(self):
        return list(self.inputs) + list(self.weights) + list(self.outputs)

    def decl(self, name: str) -> TensorDecl:
        for d in self.decls():
            if d.name == name:
                return d
        raise KeyError(name)


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}


def _eval_expr(expr: Any, env: Mapping[str, Any]):
    """Value of a hyper-parameter or shape entry: a number, or an arithmetic expression over
    earlier hyper-parameters. An exact float result of a division is returned as an int."""
    if isinstance(expr, bool):
        return expr
    if isinstance(expr, (int, float)):
        return expr
    text = str(expr).strip()

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise ValueError(f"unknown hyper-parameter {node.id!r} in {text!r}")
            return env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        raise ValueError(f"unsupported expression {text!r}")

    try:
        value = ev(ast.parse(text, mode="eval"))
    except SyntaxError:
        return text  # a plain string value (not used in shapes)
    if isinstance(value, float) and value.is_integer() and ("/" in text or "*" in text):
        value = int(value)
    return value


# --- a minimal YAML reader for the spec subset (used only when PyYAML is missing) ----------

def _parse_scalar(s: str):
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    low = s.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("null", "~", ""):
        return None
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return s


def _parse_flow(s: str, i: int = 0):
    """Parses a YAML flow value (``{k: v, ...}``, ``[a, b]`` or a scalar) starting at s[i]."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] == "{":
        out, i = {}, i + 1
        while True:
            while i < len(s) and s[i] in " ,":
                i += 1
            if i >= len(s):
                raise ValueError(f"unterminated flow mapping: {s!r}")
            if s[i] == "}":
                return out, i + 1
            j = s.index(":", i)
            key = _parse_scalar(s[i:j])
            val, i = _parse_flow(s, j + 1)
            out[key] = val
    if i < len(s) and s[i] == "[":
        out, i = [], i + 1
        while True:
            while i < len(s) and s[i] in " ,":
                i += 1
            if i >= len(s):
                raise ValueError(f"unterminated flow sequence: {s!r}")
            if s[i] == "]":
                return out, i + 1
            val, i = _parse_flow(s, i)
            out.append(val)
    j, depth = i, 0
    while j < len(s):
        c = s[j]
        if c in "[{":
            depth += 1
        elif c in "]}":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        j += 1
    return _parse_scalar(s[i:j]), j


def _strip_comment(line: str) -> str:
    # Specs put no '#' inside quoted scalars of the sections read here.
    m = re.search(r"(^|\s)#", line)
    return line[: m.start()].rstrip() if m else line.rstrip()


def _mini_yaml(text: str) -> dict:
    """Top-level ``key: scalar``, ``key: |`` blocks (skipped) and one nested level of
    ``name: value`` entries (value a scalar or a flow collection). Deeper levels are ignored."""
    doc: dict = {}
    current = None
    block_indent = None
    for raw in text.splitlines():
        if block_indent is not None:
            if raw.strip() == "" or len(raw) - len(raw.lstrip()) > 0:
                continue
            block_indent = None
        line = _strip_comment(raw)
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, rest = line.strip().partition(":")
        if not sep:
            continue
        rest = rest.strip()
        if indent == 0:
            if rest in ("|", "|-", ">", ">-"):
                doc[key] = None
                block_indent = 0
                current = None
            elif rest == "":
                doc[key] = {}
                current = doc[key]
            else:
                doc[key] = _parse_flow(rest)[0]
                current = None
        elif current is not None and indent > 0:
            # Only the first nested level: remember its indentation on first use.
            lvl = current.setdefault("__indent__", indent)
            if indent == lvl:
                current[key] = _parse_flow(rest)[0] if rest else {}
    for v in doc.values():
        if isinstance(v, dict):
            v.pop("__indent__", None)
    return doc


def _load_doc(path: Path) -> dict:
    text = path.read_text()
    if path.suffix.lower() == ".json":
        return json.loads(text)
    try:
        import yaml  # type: ignore
    except ImportError:
        return _mini_yaml(text)
    return yaml.safe_load(text)


def _as_mapping(section) -> list:
    """Spec sections are mappings name -> attributes; accept a list of {name: ...} too."""
    if section is None:
        return []
    if isinstance(section, Mapping):
        return list(section.items())
    items = []
    for entry in section:
        if isinstance(entry, Mapping) and "name" in entry:
            items.append((entry["name"], entry))
        elif isinstance(entry, Mapping):
            items.extend(entry.items())
    return items


def load_spec(spec_path, hyper_overrides: Mapping[str, Any] | None = None) -> SpecInfo:
    """Reads a spec: model name, hyper-parameters (evaluated, overrides applied before the
    derived ones are computed) and the tensor declarations with concrete shapes."""
    path = Path(spec_path)
    doc = _load_doc(path)
    hyper_raw = dict(doc.get("hyper") or {})
    for k, v in (hyper_overrides or {}).items():
        hyper_raw[k] = v
    hyper: dict = {}
    for k, v in hyper_raw.items():
        hyper[k] = _eval_expr(v, hyper)

    def decls(section: str, role: str) -> list:
        out = []
        for name, attrs in _as_mapping(doc.get(section)):
            attrs = dict(attrs or {})
            shape = tuple(int(_eval_expr(s, hyper)) for s in (attrs.get("shape") or []))
            out.append(TensorDecl(name=str(name), role=role, per=str(attrs.get("per", "none")),
                                  shape=shape, from_graph=attrs.get("from_graph"), raw=attrs))
        return out

    return SpecInfo(path=path, model=str(doc.get("model", path.stem)), hyper=hyper,
                    inputs=decls("inputs", "input"), weights=decls("weights", "weight"),
                    outputs=decls("outputs", "output"), doc=doc)


def _yaml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def spec_with_hyper(spec_path, hyper_overrides: Mapping[str, Any], out_path) -> Path:
    """Writes a copy of the spec with some hyper-parameters replaced (or added) to ``out_path``.

    YAML specs are edited as text, inside the ``hyper:`` block only, so the program and every
    other line stay byte-identical; JSON specs are rewritten with :mod:`json`.
    """
    src, dst = Path(spec_path), Path(out_path)
    text = src.read_text()
    if src.suffix.lower() == ".json":
        doc = json.loads(text)
        doc.setdefault("hyper", {}).update(dict(hyper_overrides))
        dst.write_text(json.dumps(doc, indent=2) + "\n")
        return dst
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if re.match(r"^hyper:\s*(#.*)?$", ln.rstrip("\n"))), None)
    if start is None:
        raise ValueError(f"{src}: no block-style 'hyper:' section to edit")
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][:1] in " \t" or lines[end].lstrip().startswith("#")):
        end += 1
    indent = "  "
    todo = dict(hyper_overrides)
    for i in range(start + 1, end):
        m = re.match(r"^(\s+)([A-Za-z_][A-Za-z0-9_]*)(\s*:\s*)([^#\n]*?)(\s*#.*)?(\n?)$", lines[i])
        if not m:
            continue
        indent = m.group(1)
        if m.group(2) in todo:
            lines[i] = f"{m.group(1)}{m.group(2)}{m.group(3)}{_yaml_value(todo.pop(m.group(2)))}{m.group(5) or ''}{m.group(6)}"
    for k, v in todo.items():  # keys not in the spec yet: add them first (derived ones may use them)
        lines.insert(start + 1, f"{indent}{k}: {_yaml_value(v)}\n")
    dst.write_text("".join(lines))
    return dst


# ---------------------------------------------------------------------------------------------
# The reference directory format (src/driver/reference_io.h)
# ---------------------------------------------------------------------------------------------

def _g(graph, key, default=None):
    if isinstance(graph, Mapping):
        return graph[key] if key in graph else default
    if hasattr(graph, "keys") and key not in graph.keys():
        return default
    return getattr(graph, key, default)


def _index_list(t) -> list:
    return [int(v) for v in torch.as_tensor(t).detach().to("cpu", torch.int64).reshape(-1).tolist()]


def _f64_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu", torch.float64).contiguous().reshape(-1)
    if sys.byteorder != "little":
        raise NotImplementedError("the reference format is little-endian; big-endian hosts are not supported")
    try:
        return t.numpy().tobytes()
    except (RuntimeError, ImportError, TypeError):  # torch built without numpy support
        import array
        return array.array("d", t.tolist()).tobytes()


def _graph_dims(graph) -> tuple:
    src = torch.as_tensor(_g(graph, "src"))
    N = int(_g(graph, "num_nodes"))
    R = int(_g(graph, "num_etypes"))
    T = int(_g(graph, "num_ntypes", 1) or 1)
    return N, int(src.numel()), R, T


def write_reference_dir(dir_path, spec: SpecInfo, graph, tensors: Mapping[str, torch.Tensor],
                        output_grads: Mapping[str, torch.Tensor] | None = None) -> dict:
    """Writes ``meta.json`` and one ``<name>.f64`` per declared input/weight present in
    ``tensors`` (float64, row-major); an input with ``rows: indexed`` is a table of any number of rows,
    written with its node-to-row map ``<name>_rows`` (which ``tensors`` must hold too). Raises ValueError on a missing tensor or a shape whose
    element count does not match the spec (a same-size tensor is reshaped). ``output_grads``
    (output name -> gradient) asks the interpreter for the backward pass too (written as
    ``d_<name>.f64`` under the ``output_grads`` key). Returns the meta."""
    d = Path(dir_path)
    d.mkdir(parents=True, exist_ok=True)
    N, E, R, T = _graph_dims(graph)
    ntype = _g(graph, "ntype")
    meta: dict = {
        "num_nodes": N,
        "num_ntypes": T,
        "num_etypes": R,
        "src": _index_list(_g(graph, "src")),
        "dst": _index_list(_g(graph, "dst")),
        "etype": _index_list(_g(graph, "etype")),
        "ntype": _index_list(ntype) if ntype is not None else [0] * N,
        "tensors": {},
    }
    for decl in list(spec.inputs) + list(spec.weights):
        if decl.name not in tensors:
            if decl.from_graph:
                continue  # the interpreter derives it from the graph
            raise ValueError(f"cpu_reference: missing tensor {decl.name!r} ({decl.role} of {spec.model})")
        t = torch.as_tensor(tensors[decl.name])
        want = decl.full_shape(N, E, R, T)
        if decl.raw.get("rows") == "indexed":  # a table of any number of rows, read through <name>_rows
            rows_name = decl.name + "_rows"
            if rows_name not in tensors:
                raise ValueError(f"cpu_reference: missing tensor {rows_name!r} (the node-to-row map of {decl.name!r})")
            rows = torch.as_tensor(tensors[rows_name]).reshape(N)
            (d / f"{rows_name}.f64").write_bytes(_f64_bytes(rows))
            meta["tensors"][rows_name] = {"shape": [N], "file": f"{rows_name}.f64"}
            want = (t.shape[0],) + tuple(decl.shape)
        if tuple(t.shape) != want:
            if t.numel() != math.prod(want):
                raise ValueError(f"cpu_reference: tensor {decl.name!r} has shape {tuple(t.shape)}, "
                                 f"the spec wants {want} (per {decl.per})")
            t = t.reshape(want)
        fname = f"{decl.name}.f64"
        (d / fname).write_bytes(_f64_bytes(t))
        meta["tensors"][decl.name] = {"shape": list(want), "file": fname}
    if output_grads is not None:
        meta["output_grads"] = {}
        for name, g in output_grads.items():
            decl = next((o for o in spec.outputs if o.name == name), None)
            if decl is None:
                raise ValueError(f"cpu_reference: {name!r} is not an output of {spec.model}")
            want = decl.full_shape(N, E, R, T)
            g = torch.as_tensor(g)
            if g.numel() != math.prod(want):
                raise ValueError(f"cpu_reference: gradient of {name!r} has shape {tuple(g.shape)}, want {want}")
            fname = f"d_{name}.f64"
            (d / fname).write_bytes(_f64_bytes(g.reshape(want)))
            meta["output_grads"][name] = {"shape": list(want), "file": fname}
    (d / "meta.json").write_text(json.dumps(meta) + "\n")
    return meta


def read_reference_outputs(dir_path, section: str = "outputs") -> dict:
    """Reads ``DIR/out/meta.json`` and its .f64 files: name -> float64 CPU tensor."""
    out_dir = Path(dir_path) / "out"
    meta = json.loads((out_dir / "meta.json").read_text())
    result = {}
    for name, info in (meta.get(section) or {}).items():
        shape = [int(s) for s in info["shape"]]
        data = (out_dir / info["file"]).read_bytes()
        n = math.prod(shape)
        if len(data) != 8 * n:
            raise ReferenceError(f"output {name!r}: {len(data)} bytes, expected {8 * n} for shape {shape}")
        t = torch.frombuffer(bytearray(data), dtype=torch.float64) if n else torch.zeros(0, dtype=torch.float64)
        result[name] = t.reshape(shape).clone()
    return result


def read_reference_gradients(dir_path) -> dict:
    """The gradients the interpreter's backward pass wrote: input/weight name -> float64 CPU tensor."""
    return read_reference_outputs(dir_path, "gradients")


def run_reference_dir(hectorgen_bin, spec_path, dir_path, timeout: float = 600) -> None:
    """Runs ``hectorgen SPEC --reference DIR``; raises ReferenceError with its stderr on failure."""
    cmd = [str(hectorgen_bin), str(spec_path), "--reference", str(dir_path)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise ReferenceError(f"cannot run {hectorgen_bin!r}: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise ReferenceError(f"{' '.join(cmd)} timed out after {timeout} s") from e
    if p.returncode != 0:
        raise ReferenceError(f"{' '.join(cmd)} exited with {p.returncode}:\n{p.stderr.strip()}")


def cpu_reference(hectorgen_bin, spec_path, graph, tensors: Mapping[str, torch.Tensor],
                  hyper_overrides: Mapping[str, Any] | None = None, *,
                  keep_dir=None, timeout: float = 600) -> dict:
    """Outputs of ``spec_path``'s model computed by hectorgen's float64 CPU interpreter.

    ``graph``: a :class:`graphs.HeteroGraph` or a dict with num_nodes, num_etypes,
    num_ntypes (default 1), src, dst, etype and ntype (default all 0); tensors may live
    on any device. ``tensors``: inputs and weights by spec name, any float dtype/device
    (converted to float64 on the CPU). ``hyper_overrides``: hyper-parameters to replace
    in a temporary copy of the spec (e.g. ``{"heads": 4, "out_dim": 16}``); shapes are
    then checked against the overridden values. ``keep_dir``: write the exchange files
    there and keep them (default: a temporary directory, removed afterwards).

    Returns ``{output name: float64 CPU tensor}`` with the shapes of docs/semantics.md.
    """
    spec_path = Path(spec_path)
    tmp = None
    if keep_dir is None:
        tmp = tempfile.mkdtemp(prefix="hg_ref_")
        work = Path(tmp)
    else:
        work = Path(keep_dir)
        work.mkdir(parents=True, exist_ok=True)
        if (work / "out").exists():
            shutil.rmtree(work / "out")
    try:
        if hyper_overrides:
            spec_used = spec_with_hyper(spec_path, hyper_overrides, work / ("spec" + spec_path.suffix))
        else:
            spec_used = spec_path
        spec = load_spec(spec_used)
        write_reference_dir(work, spec, graph, tensors)
        run_reference_dir(hectorgen_bin, spec_used, work, timeout=timeout)
        return read_reference_outputs(work)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def cpu_reference_grads(hectorgen_bin, spec_path, graph, tensors: Mapping[str, torch.Tensor],
                        output_grads: Mapping[str, torch.Tensor], *, keep_dir=None, timeout: float = 600):
    """``(outputs, gradients)`` from hectorgen's float64 interpreter: the forward, then the backward
    program of its autodiff on the training forward's saved fields and ``output_grads`` (output name ->
    gradient; a missing output counts as zero). ``gradients`` holds one float64 CPU tensor per input
    that requires grad (not ``from_graph``) and per weight, by name. A model without a backward pass
    raises :class:`ReferenceError` ("no backward pass: ...")."""
    spec_path = Path(spec_path)
    tmp = None
    if keep_dir is None:
        tmp = tempfile.mkdtemp(prefix="hg_ref_")
        work = Path(tmp)
    else:
        work = Path(keep_dir)
        work.mkdir(parents=True, exist_ok=True)
        if (work / "out").exists():
            shutil.rmtree(work / "out")
    try:
        spec = load_spec(spec_path)
        write_reference_dir(work, spec, graph, tensors, output_grads=output_grads)
        run_reference_dir(hectorgen_bin, spec_path, work, timeout=timeout)
        return read_reference_outputs(work), read_reference_gradients(work)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":  # tiny smoke test: python3 tests/gpu/reference_bridge.py build/hectorgen [SPEC...]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compare import fresh_inputs, rel_err  # noqa: E402
    from graphs import tiny_graph  # noqa: E402
    from reference_models import hgt_ref, rgat_ref, rgcn_ref  # noqa: E402

    binary = sys.argv[1] if len(sys.argv) > 1 else "build/hectorgen"
    specs = sys.argv[2:] or ["specs/rgcn.yaml", "specs/rgat.yaml", "specs/hgt.yaml"]
    g = tiny_graph()
    for sp in specs:
        info = load_spec(sp)
        fam = "rgcn" if "norm" in [d.name for d in info.inputs] else ("hgt" if "W_k" in
                                                                         [d.name for d in info.weights] else "rgat")
        H = int(info.hyper.get("heads", 1))
        inp = fresh_inputs(fam, g, (info.hyper["in_dim"], info.hyper["out_dim"]), heads=H, seed=1,
                           dtype=torch.float64)
        ref = cpu_reference(binary, sp, g, {k: v for k, v in inp.items() if k != "norm"})
        if fam == "rgcn":
            t = rgcn_ref(g, inp["feature"], inp["W0"], inp["W"])
        elif fam == "rgat":
            t = rgat_ref(g, inp["feature"], inp["W"], inp["w_s"], inp["w_t"], H,
                         float(info.hyper.get("negative_slope", 0.2)))
        else:
            t = hgt_ref(g, *[inp[k] for k in ("feature", "W_k", "W_q", "W_v", "W_att", "W_msg", "mu", "W_a")],
                        heads=H)
        print(f"{sp}: h {tuple(ref['h'].shape)} rel err vs torch reference {rel_err(t, ref['h']):.2e}")
