"""The dtypes a spec can be generated for (``options: dtype``), their tolerances in the GPU check, and the spec
rewriting that makes a dtype variant of a spec. Used by tests/gpu/gpu_check.py (``--dtypes``) and bench/systems.py.

Tolerances (issue 8, item 3): the generated result in a dtype vs the float64 interpreter, outputs and gradients
alike, relative error

    ||got - ref|| / max(||ref||, factor * noise / tol)          (compare.floored_rel_err)

where ``noise`` is the rounding noise of the same computation at the tested precision: ``||ref32 - ref64||`` of the
plain-PyTorch model of the spec in float32 on the same (rounded) values, scaled by the ratio of the dtype's
rounding unit to float32's (``DtypeInfo.noise_scale``). The floor only matters for a result much smaller than the
terms it sums (a gradient that a softmax cancels to almost zero: the gradient of an attention vector applied to
the destination is exactly 0 on some graphs), whose relative error is O(1) in any finite precision; such a result
passes when it is within ``factor`` times the rounding noise of its own computation at that precision.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DtypeInfo", "DTYPES", "DEFAULT_DTYPE_SPECS", "parse_dtypes", "rewrite_spec", "variant_name"]


@dataclass(frozen=True)
class DtypeInfo:
    name: str            # the spec's options.dtype
    storage: str         # torch dtype name of inputs, weights and outputs ("float32", "bfloat16", "float16")
    tol: float           # relative error vs float64, outputs and gradients
    mantissa_bits: int   # explicit mantissa bits of the arithmetic: the rounding unit is 2^-(bits + 1)
    noise_factor: float  # how many times the precision's own rounding noise a cancelling result may be off

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.storage)

    @property
    def noise_scale(self) -> float:
        """The rounding unit of this precision over float32's: scales float32 rounding noise to this precision."""
        return 2.0 ** (23 - self.mantissa_bits)


DTYPES = {
    # fp32: the tolerance of issue 8 for outputs and gradients (the plain fp32 check keeps 1e-5 / 1e-4).
    "fp32": DtypeInfo("fp32", "float32", 1e-5, 23, 16.0),
    # tf32 stores float32; the tensor-core products round their operands to 10 mantissa bits.
    "tf32": DtypeInfo("tf32", "float32", 2e-3, 10, 2.0),
    "bf16": DtypeInfo("bf16", "bfloat16", 2e-2, 7, 2.0),
    "fp16": DtypeInfo("fp16", "float16", 2e-2, 10, 2.0),
}

# The specs of a dtype run (tools/gpu_check.sh --dtypes ...) unless others are named: the three models of the
# benchmark and two test specs with other GEMM shapes (a shared weight; a weight row as a GEMM input).
DEFAULT_DTYPE_SPECS = ("specs/rgcn.yaml", "specs/rgat.yaml", "specs/hgt.yaml", "tests/specs/gcn_shared.yaml",
                       "tests/specs/simplehgn.yaml")


def parse_dtypes(text) -> list:
    """"tf32,bf16" -> ["tf32", "bf16"] (order kept, duplicates dropped); "all" -> every dtype; "" -> ["fp32"].
    An unknown name raises ValueError naming the known ones."""
    items = [t.strip().lower() for t in (text or "").split(",") if t.strip()]
    if not items:
        return ["fp32"]
    out = []
    for t in items:
        names = list(DTYPES) if t == "all" else [t]
        for n in names:
            if n not in DTYPES:
                raise ValueError(f"unknown dtype {t!r} (known: {', '.join(DTYPES)}, or all)")
            if n not in out:
                out.append(n)
    return out


def variant_name(model: str, dtype: str) -> str:
    """The module name of a dtype variant: <model>_<dtype>."""
    return f"{model}_{dtype}"


def rewrite_spec(text: str, *, model: str | None = None, rename: str | None = None, dtype: str | None = None,
                 edits=(), where: str = "spec") -> str:
    """A spec's YAML text with the model renamed (``model`` -> ``rename``), ``options.dtype`` set to ``dtype``
    and further ``edits`` ((regex, replacement) pairs) applied. Each rename and edit must match exactly once
    (ValueError otherwise, naming ``where``). A spec without a ``dtype:`` line under ``options:`` gets one (and an
    ``options:`` section before ``program:`` if it has none)."""
    subs = []
    if rename is not None:
        if model is None:
            raise ValueError("rewrite_spec: rename needs the spec's model name")
        subs.append((rf"(?m)^model:\s*{re.escape(model)}\s*$", f"model: {rename}"))
    subs += list(edits)
    if dtype is not None:
        if dtype not in DTYPES:
            raise ValueError(f"{where}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
        text = _set_option(text, "dtype", dtype, where)
    for pattern, repl in subs:
        text, n = re.subn(pattern, repl, text)
        if n != 1:
            raise ValueError(f"{where}: the edit {pattern!r} matched {n} times")
    return text


def _set_option(text: str, key: str, value: str, where: str) -> str:
    """Sets ``options.<key>: value`` in a block-style YAML spec (the top-level options: section)."""
    lines = text.splitlines(keepends=True)
    opt = next((i for i, ln in enumerate(lines) if re.match(r"options:\s*(#.*)?$", ln.rstrip("\n"))), None)
    if opt is None:
        if re.search(r"(?m)^options:", text):
            raise ValueError(f"{where}: cannot set options.{key} in a flow-style options: section")
        prog = next((i for i, ln in enumerate(lines) if re.match(r"program:", ln)), len(lines))
        if lines and not lines[-1].endswith("\n") and prog == len(lines):
            lines[-1] += "\n"
        lines[prog:prog] = ["options:\n", f"  {key}: {value}\n"]
        return "".join(lines)
    end = opt + 1
    while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
        end += 1
    body = lines[opt + 1:end]
    indents = [len(ln) - len(ln.lstrip()) for ln in body if ln.strip() and not ln.lstrip().startswith("#")]
    indent = min(indents) if indents else 2
    pat = re.compile(rf"^ {{{indent}}}{re.escape(key)}:\s*[^\s#]*\s*(#.*)?$")
    hits = [i for i in range(opt + 1, end) if pat.match(lines[i].rstrip("\n"))]
    if len(hits) > 1:
        raise ValueError(f"{where}: options.{key} appears {len(hits)} times")
    new = " " * indent + f"{key}: {value}\n"
    if hits:
        lines[hits[0]] = new
    else:
        lines.insert(opt + 1, new)
    return "".join(lines)
