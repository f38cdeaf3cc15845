"""Helpers for comparing generated-kernel outputs against the PyTorch references.

* :func:`rel_err` - relative error in float64, non-finite values count as ``inf``.
* :func:`poison_` - fill an output buffer with NaN before a kernel writes it, so a
  kernel that skips an element is caught.
* :func:`fresh_inputs` - random inputs and weights with the shapes of
  docs/semantics.md, keyed by the spec names.
* :func:`format_table` / :func:`print_table` - aligned PASS/FAIL report.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import torch

from reference_models import inv_relation_in_degree

__all__ = [
    "rel_err",
    "EPS_RATIO",
    "floored_rel_err",
    "poison_",
    "model_dims",
    "fresh_inputs",
    "default_tolerance",
    "make_row",
    "format_table",
    "print_table",
    "all_passed",
]

_TINY = torch.finfo(torch.float64).tiny


def rel_err(got, ref) -> float:
    """``||got - ref|| / max(||ref||, tiny)`` (Frobenius norms), computed in float64.

    Returns ``inf`` if either side holds a NaN or an Inf, so a poisoned or overflowed
    result always fails. Shapes must match exactly (no broadcasting); the tensors
    may live on different devices (``got`` is moved to ``ref``'s device).
    """
    ref = torch.as_tensor(ref).detach()
    got = torch.as_tensor(got).detach()
    if tuple(got.shape) != tuple(ref.shape):
        raise ValueError(f"shape mismatch: got {tuple(got.shape)}, ref {tuple(ref.shape)}")
    r = ref.to(torch.float64)
    g = got.to(device=r.device, dtype=torch.float64)
    if not bool(torch.isfinite(g).all()) or not bool(torch.isfinite(r).all()):
        return math.inf
    num = float(torch.linalg.vector_norm(g - r))
    den = max(float(torch.linalg.vector_norm(r)), _TINY)
    return num / den


# float64's rounding unit over float32's: scales a float32 rounding-noise estimate to float64.
EPS_RATIO = torch.finfo(torch.float64).eps / torch.finfo(torch.float32).eps


def floored_rel_err(got, ref, tol: float, noise: float = 0.0, factor: float = 16.0) -> tuple:
    """``(err, floored)``: ``||got - ref|| / max(||ref||, factor * noise / tol)``, in float64.

    ``noise`` is the rounding noise of the reference itself at the precision under test (e.g.
    ``||ref_fp32 - ref_fp64||``: the same computation in plain PyTorch float32). A gradient that
    cancels to (almost) zero -- the gradient of an attention vector applied to the destination,
    which a softmax cancels -- has a relative error of O(1) in any finite precision; with the
    floor, a result within ``factor`` times the reference's own float32 noise passes ``tol``,
    while a result that is merely relatively close must still be within ``tol``. ``floored``
    tells whether the floor was the larger denominator. NaN/inf give ``(inf, False)``.
    """
    ref = torch.as_tensor(ref).detach()
    got = torch.as_tensor(got).detach()
    if tuple(got.shape) != tuple(ref.shape):
        raise ValueError(f"shape mismatch: got {tuple(got.shape)}, ref {tuple(ref.shape)}")
    r = ref.to(torch.float64)
    g = got.to(device=r.device, dtype=torch.float64)
    if not bool(torch.isfinite(g).all()) or not bool(torch.isfinite(r).all()):
        return math.inf, False
    num = float(torch.linalg.vector_norm(g - r))
    norm = float(torch.linalg.vector_norm(r))
    floor = factor * float(noise) / tol if tol > 0 else 0.0
    den = max(norm, floor, _TINY)
    return num / den, floor > norm


@torch.no_grad()
def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill ``t`` in place with NaN (integer tensors: with their most negative value).

    Works on leaf tensors that require grad too. Returns ``t``.
    """
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).min)
    return t


def model_dims(dims) -> tuple[int, int]:
    """``(in_dim, out_dim)`` from an int (in = out), a pair, or a mapping with those keys."""
    if isinstance(dims, Mapping):
        return int(dims["in_dim"]), int(dims["out_dim"])
    if isinstance(dims, int):
        return dims, dims
    in_dim, out_dim = dims
    return int(in_dim), int(out_dim)


def _glorot(gen: torch.Generator, shape: Sequence[int], fan_in: int, fan_out: int) -> torch.Tensor:
    """Uniform(-a, a) with a = sqrt(6 / (fan_in + fan_out)), in float64 on the CPU."""
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return (torch.rand(tuple(shape), generator=gen, dtype=torch.float64) * 2.0 - 1.0) * a


def fresh_inputs(model: str, graph, dims, heads: int = 1, seed: int = 0,
                 dtype: torch.dtype = torch.float32, device="cpu", *,
                 requires_grad: bool = False, mu_ones: bool = False) -> dict[str, torch.Tensor]:
    """Random inputs and weights for one layer, keyed by the names of specs/<model>.yaml.

    ``model``: "rgcn", "rgat" or "hgt". ``dims``: see :func:`model_dims`; ``out_dim`` is
    the spec's ``out_dim`` (per head for RGAT, total for HGT, where d_k = out_dim / heads).

    Returned keys and shapes (N nodes, E edges, R relations, T node types, H heads):

    * rgcn: feature [N, in], norm [E], W0 [in, out], W [R, in, out]
    * rgat: feature [N, in], W [R, in, H*out], w_s [R, H, out], w_t [R, H, out]
    * hgt:  feature [N, in], W_k/W_q/W_v [T, in, H*d], W_att/W_msg [R, H, d, d],
      mu [R, H], W_a [T, H*d, out]

    Values are drawn in float64 on the CPU from ``torch.Generator().manual_seed(seed)``
    and only then cast/moved, so the same seed gives the same values on every device
    and (up to rounding) in every dtype. Features are N(0, 1); weight matrices are
    Glorot-uniform; the attention vectors w_s, w_t and the per-head matrices W_att,
    W_msg are LeCun-uniform (variance 1/fan_in, fan_in = the reduced length). So every
    intermediate stays O(1): projections have variance <= ~1 and attention logits a
    standard deviation of about 1 (attention weights then differ visibly between
    edges, yet exp() is far from overflow even without a max shift).
    ``mu`` is uniform in [0.5, 1.5] (``mu_ones=True``: ones, the spec's init; random
    values are the default because all-ones would hide a kernel that forgets mu).
    ``norm`` is :func:`reference_models.inv_relation_in_degree`, never requires grad.
    With ``requires_grad=True`` every other tensor is a leaf that requires grad.
    """
    model = model.lower()
    in_dim, out_dim = model_dims(dims)
    H = int(heads)
    N = int(graph["num_nodes"] if isinstance(graph, Mapping) else graph.num_nodes)
    R = int(graph["num_etypes"] if isinstance(graph, Mapping) else graph.num_etypes)
    T = int(graph["num_ntypes"] if isinstance(graph, Mapping) else graph.num_ntypes)
    gen = torch.Generator().manual_seed(int(seed))
    out: dict[str, torch.Tensor] = {}
    out["feature"] = torch.randn((N, in_dim), generator=gen, dtype=torch.float64)

    def unif(shape, fan_in):
        # Uniform(-a, a) with variance a^2/3 = 1/fan_in: a sum of fan_in products with
        # unit-variance terms has unit variance.
        a = math.sqrt(3.0 / fan_in)
        return (torch.rand(tuple(shape), generator=gen, dtype=torch.float64) * 2.0 - 1.0) * a

    if model == "rgcn":
        out["W0"] = _glorot(gen, (in_dim, out_dim), in_dim, out_dim)
        out["W"] = _glorot(gen, (R, in_dim, out_dim), in_dim, out_dim)
    elif model == "rgat":
        out["W"] = _glorot(gen, (R, in_dim, H * out_dim), in_dim, H * out_dim)
        out["w_s"] = unif((R, H, out_dim), out_dim)
        out["w_t"] = unif((R, H, out_dim), out_dim)
    elif model == "hgt":
        if out_dim % H:
            raise ValueError(f"HGT needs out_dim ({out_dim}) divisible by heads ({H})")
        d = out_dim // H
        for name in ("W_k", "W_q", "W_v"):
            out[name] = _glorot(gen, (T, in_dim, H * d), in_dim, H * d)
        out["W_att"] = unif((R, H, d, d), d)
        out["W_msg"] = unif((R, H, d, d), d)
        out["mu"] = (torch.ones((R, H), dtype=torch.float64) if mu_ones
                     else torch.rand((R, H), generator=gen, dtype=torch.float64) + 0.5)
        out["W_a"] = _glorot(gen, (T, H * d, out_dim), H * d, out_dim)
    else:
        raise ValueError(f"unknown model {model!r} (expected rgcn, rgat or hgt)")

    res = {}
    for k, v in out.items():
        res[k] = v.to(device=device, dtype=dtype).requires_grad_(requires_grad)
        if k == "feature" and model == "rgcn":
            res["norm"] = inv_relation_in_degree(graph, dtype=torch.float64).to(device=device, dtype=dtype)
    return res


def default_tolerance(dtype: torch.dtype) -> float:
    """A relative-error bound for comparing a kernel in ``dtype`` with a float64 reference.

    Loose enough for reordered sums over a few hundred terms, tight enough to catch a
    missing or doubled term.
    """
    return {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 5e-3,
            torch.bfloat16: 3e-2}.get(dtype, 1e-4)


_COLUMNS = ("model", "graph", "check", "max rel err", "tolerance", "result")


def make_row(model: str, graph: str, check: str, err: float, tol: float) -> dict:
    """One table row; ``result`` is PASS iff ``err <= tol`` (NaN and inf fail)."""
    ok = bool(err <= tol)  # False for NaN
    return {"model": model, "graph": graph, "check": check, "err": float(err),
            "tol": float(tol), "ok": ok}


def _as_row(r) -> dict:
    if isinstance(r, Mapping):
        row = dict(r)
        row.setdefault("ok", bool(row["err"] <= row["tol"]))
        return row
    model, graph, check, err, tol, *rest = r
    row = make_row(model, graph, check, err, tol)
    if rest:
        row["ok"] = bool(rest[0])
    return row


def _fmt_err(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    return f"{x:.3e}"


def format_table(rows: Iterable) -> str:
    """An aligned text table: model, graph, check, max rel err, tolerance, PASS/FAIL.

    ``rows``: dicts as made by :func:`make_row` (keys model, graph, check, err, tol,
    optional ok) or tuples ``(model, graph, check, err, tol[, ok])``. Returns the
    table as a string ending with a summary line ("k/n checks PASS[, m FAIL]");
    :func:`print_table` prints it.
    """
    rows = [_as_row(r) for r in rows]
    body = [(str(r["model"]), str(r["graph"]), str(r["check"]), _fmt_err(r["err"]),
             f"{r['tol']:.1e}", "PASS" if r["ok"] else "FAIL") for r in rows]
    widths = [max([len(c)] + [len(b[i]) for b in body]) for i, c in enumerate(_COLUMNS)]
    right = {3, 4}  # numbers right-aligned

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(_COLUMNS), "  ".join("-" * w for w in widths)]
    out += [line(b) for b in body]
    n_fail = sum(not r["ok"] for r in rows)
    out.append(f"{len(rows) - n_fail}/{len(rows)} checks PASS" + (f", {n_fail} FAIL" if n_fail else ""))
    return "\n".join(out)


def print_table(rows: Iterable) -> bool:
    """Print :func:`format_table` and return True iff every row passed."""
    rows = [_as_row(r) for r in rows]
    print(format_table(rows))
    return all_passed(rows)


def all_passed(rows: Iterable) -> bool:
    return all(_as_row(r)["ok"] for r in rows)
