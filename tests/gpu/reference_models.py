"""Plain-PyTorch reference implementations of the bundled RGNN layers.

Written directly from docs/semantics.md with basic torch ops (index_select,
index_add, matmul/einsum); no PyG, no fused kernels. They work for any floating
dtype and any device, and are differentiable with torch autograd, so they serve as
the reference for both the forward outputs and the gradients of the generated code.

``graph`` is a :class:`graphs.HeteroGraph` or any dict with the keys ``num_nodes``,
``num_etypes``, ``src``, ``dst``, ``etype`` and (for HGT) ``ntype``, ``num_ntypes``.
Index tensors are moved to the device of the features when needed.

Per-edge products with per-relation weights (``x[src[e]] @ W[etype[e]]``) are
computed relation by relation (edges grouped with a stable sort), never by
materialising ``W[etype]`` per edge, which would take E*in*out elements.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = [
    "inv_relation_in_degree",
    "edge_softmax",
    "rgcn_ref",
    "rgat_ref",
    "hgt_ref",
]


def _field(graph, key):
    """``graph.key`` for a dataclass-like graph, ``graph[key]`` for a dict."""
    if isinstance(graph, dict):
        return graph[key]
    return getattr(graph, key)


def _index(graph, key, device) -> torch.Tensor:
    t = _field(graph, key)
    t = torch.as_tensor(t)
    return t.to(device=device, dtype=torch.int64)


def _grouped_apply(x: torch.Tensor, types: torch.Tensor, num_types: int,
                   fn: Callable[[torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
    """Row-wise ``y[i] = fn(x[i:i+1], types[i])``, evaluated one type at a time.

    Rows are grouped by type with a stable sort, ``fn(rows_of_type_t, t)`` is applied
    to each group (possibly empty), and the results are put back in the original row
    order. Differentiable in ``x`` and in whatever ``fn`` closes over.
    """
    order = torch.argsort(types, stable=True)
    counts = torch.bincount(types, minlength=num_types).tolist()
    if len(counts) > num_types:
        raise ValueError(f"type id out of range: {len(counts) - 1} >= {num_types}")
    chunks = torch.split(x.index_select(0, order), counts)
    y_sorted = torch.cat([fn(c, t) for t, c in enumerate(chunks)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return y_sorted.index_select(0, inverse)


def inv_relation_in_degree(graph, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """RGCN edge normaliser (docs/semantics.md, RGCN; specs/rgcn.yaml ``norm``).

        norm[e] = 1 / |{e' : dst[e'] == dst[e] and etype[e'] == etype[e]}|

    i.e. 1/c_{v,r}, counting parallel edges. Shape [E], on the graph's device.
    """
    dst = torch.as_tensor(_field(graph, "dst")).to(torch.int64)
    etype = torch.as_tensor(_field(graph, "etype")).to(dst.device, torch.int64)
    if dst.numel() == 0:
        return torch.zeros(0, dtype=dtype, device=dst.device)
    key = dst * int(_field(graph, "num_etypes")) + etype
    _, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
    return 1.0 / counts.index_select(0, inverse).to(dtype)


def edge_softmax(dst: torch.Tensor, logits: torch.Tensor, num_nodes: int,
                 shift_max: bool = False) -> torch.Tensor:
    """Softmax of per-edge ``logits`` [E, ...] over the incoming edges of each destination.

        att[e] = exp(a[e]) / sum_{e': dst[e'] == dst[e]} exp(a[e'])

    As in docs/semantics.md there is no max shift by default. ``shift_max=True``
    subtracts the per-destination maximum first (same value mathematically, safe from
    overflow; the shift is detached, which leaves the gradient unchanged).
    """
    if shift_max and logits.numel():
        idx = dst.view(-1, *([1] * (logits.dim() - 1))).expand_as(logits)
        mx = torch.full((num_nodes,) + tuple(logits.shape[1:]), float("-inf"),
                        dtype=logits.dtype, device=logits.device)
        mx = mx.scatter_reduce(0, idx, logits.detach(), reduce="amax", include_self=True)
        logits = logits - mx.index_select(0, dst)
    ex = torch.exp(logits)
    denom = torch.zeros((num_nodes,) + tuple(logits.shape[1:]), dtype=ex.dtype, device=ex.device)
    denom = denom.index_add(0, dst, ex)
    return ex / denom.index_select(0, dst)


def rgcn_ref(graph, x: torch.Tensor, W0: torch.Tensor, W: torch.Tensor,
             norm: torch.Tensor | None = None) -> torch.Tensor:
    """RGCN layer (docs/semantics.md, RGCN; specs/rgcn.yaml; Hector eq. 3.1).

        h[v] = x[v] @ W0 + sum_{e: dst[e]==v} norm[e] * (x[src[e]] @ W[etype[e]])

    Shapes: x [N, in], W0 [in, out], W [R, in, out], norm [E] (default:
    :func:`inv_relation_in_degree`) -> h [N, out]. No bias, no activation.
    """
    dev = x.device
    src, dst, etype = (_index(graph, k, dev) for k in ("src", "dst", "etype"))
    R = int(_field(graph, "num_etypes"))
    if W.shape[0] != R:
        raise ValueError(f"W has {W.shape[0]} relations, graph has {R}")
    if norm is None:
        norm = inv_relation_in_degree(graph, dtype=x.dtype)
    norm = norm.to(device=dev, dtype=x.dtype)
    msg = _grouped_apply(x.index_select(0, src), etype, R, lambda c, r: c @ W[r])  # [E, out]
    h = x @ W0
    return h.index_add(0, dst, norm.unsqueeze(-1) * msg)


def rgat_ref(graph, x: torch.Tensor, W: torch.Tensor, w_s: torch.Tensor, w_t: torch.Tensor,
             heads: int = 1, negative_slope: float = 0.2, *, shift_max: bool = False,
             return_attention: bool = False):
    """RGAT layer, H heads (docs/semantics.md, RGAT; specs/rgat.yaml; Hector Listing 3.1).

        hs[e]  = (x[src[e]] @ W[etype[e]]).view(H, D)
        ht[e]  = (x[dst[e]] @ W[etype[e]]).view(H, D)
        a[e]   = leaky_relu(sum_D(hs[e] * w_s[etype[e]]) + sum_D(ht[e] * w_t[etype[e]]), slope)  # [H]
        att[e] = exp(a[e]) / sum_{e': dst[e']==dst[e]} exp(a[e'])   # per head, over all relations
        h[v]   = sum_{e: dst[e]==v} att[e][:, None] * hs[e]          # 0 without in-edges

    Shapes: x [N, in], W [R, in, H*D], w_s, w_t [R, H, D] -> h [N, H, D].
    With ``return_attention=True`` returns ``(h, att)`` with att [E, H].
    """
    dev = x.device
    src, dst, etype = (_index(graph, k, dev) for k in ("src", "dst", "etype"))
    N, R, E = x.shape[0], int(_field(graph, "num_etypes")), src.numel()
    H = int(heads)
    if W.shape[-1] % H:
        raise ValueError(f"W's last dim {W.shape[-1]} is not a multiple of heads={H}")
    D = W.shape[-1] // H
    if tuple(w_s.shape) != (R, H, D) or tuple(w_t.shape) != (R, H, D):
        raise ValueError(f"w_s/w_t must have shape {(R, H, D)}")
    hs = _grouped_apply(x.index_select(0, src), etype, R, lambda c, r: c @ W[r]).view(E, H, D)
    ht = _grouped_apply(x.index_select(0, dst), etype, R, lambda c, r: c @ W[r]).view(E, H, D)
    logits = (hs * w_s.index_select(0, etype)).sum(-1) + (ht * w_t.index_select(0, etype)).sum(-1)
    a = F.leaky_relu(logits, negative_slope)  # [E, H]
    att = edge_softmax(dst, a, N, shift_max=shift_max)
    h = torch.zeros((N, H, D), dtype=hs.dtype, device=dev).index_add(0, dst, att.unsqueeze(-1) * hs)
    return (h, att) if return_attention else h


def hgt_ref(graph, x: torch.Tensor, W_k: torch.Tensor, W_q: torch.Tensor, W_v: torch.Tensor,
            W_att: torch.Tensor, W_msg: torch.Tensor, mu: torch.Tensor, W_a: torch.Tensor,
            heads: int = 1, *, shift_max: bool = False, return_attention: bool = False):
    """HGT layer, H heads, d = d_k (docs/semantics.md, HGT; specs/hgt.yaml; Hector Fig. 3.2).

        k[n] = (x[n] @ W_k[ntype[n]]).view(H, d);  q, v likewise with W_q, W_v
        att_raw[e] = sum_d((k[src[e]] (per-head @) W_att[etype[e]]) * q[dst[e]]) * mu[etype[e]] / sqrt(d)
        msg[e]     = v[src[e]] (per-head @) W_msg[etype[e]]
        att        = edge_softmax(att_raw)   # per destination node, per head, over all relations
        agg[v]     = sum_{e: dst[e]==v} att[e][:, None] * msg[e]           # [H, d]
        h[v]       = agg[v].reshape(H*d) @ W_a[ntype[v]]

    where "per-head @" is einsum('hk,hkm->hm'). Shapes: x [N, in], W_k/W_q/W_v [T, in, H*d],
    W_att/W_msg [R, H, d, d], mu [R, H], W_a [T, H*d, out] -> h [N, out].
    No GELU, skip connection or bias (unlike PyG's HGTConv).
    With ``return_attention=True`` returns ``(h, att)`` with att [E, H].
    """
    dev = x.device
    src, dst, etype, ntype = (_index(graph, k, dev) for k in ("src", "dst", "etype", "ntype"))
    N = x.shape[0]
    R, T = int(_field(graph, "num_etypes")), int(_field(graph, "num_ntypes"))
    H = int(heads)
    if W_k.shape[-1] % H:
        raise ValueError(f"W_k's last dim {W_k.shape[-1]} is not a multiple of heads={H}")
    d = W_k.shape[-1] // H
    if tuple(W_att.shape) != (R, H, d, d) or tuple(W_msg.shape) != (R, H, d, d):
        raise ValueError(f"W_att/W_msg must have shape {(R, H, d, d)}")
    if tuple(mu.shape) != (R, H):
        raise ValueError(f"mu must have shape {(R, H)}")
    if W_a.shape[0] != T or W_a.shape[1] != H * d:
        raise ValueError(f"W_a must have shape ({T}, {H * d}, out)")

    def per_ntype(Wt):
        return _grouped_apply(x, ntype, T, lambda c, t: c @ Wt[t]).view(N, H, d)

    k, q, v = per_ntype(W_k), per_ntype(W_q), per_ntype(W_v)
    k_rel = _grouped_apply(k.index_select(0, src), etype, R,
                           lambda c, r: torch.einsum("ehk,hkm->ehm", c, W_att[r]))  # [E, H, d]
    att_raw = (k_rel * q.index_select(0, dst)).sum(-1) * mu.index_select(0, etype) / math.sqrt(d)
    msg = _grouped_apply(v.index_select(0, src), etype, R,
                         lambda c, r: torch.einsum("ehk,hkm->ehm", c, W_msg[r]))  # [E, H, d]
    att = edge_softmax(dst, att_raw, N, shift_max=shift_max)
    agg = torch.zeros((N, H, d), dtype=msg.dtype, device=dev).index_add(0, dst, att.unsqueeze(-1) * msg)
    h = _grouped_apply(agg.reshape(N, H * d), ntype, T, lambda c, t: c @ W_a[t])
    return (h, att) if return_attention else h
