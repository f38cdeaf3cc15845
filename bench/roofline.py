"""The HBM floor of a case: the bytes a fully fused implementation must move through device memory, and the time
that takes at the measured copy bandwidth. No implementation runs much faster; measured / floor is the gap.

Counted for one 64-wide layer with one head, element size s bytes (4 for fp32/tf32, 2 for bf16/fp16), int32
indices; every edge reads its source row from HBM (rows of am, mag or wikikg2 do not fit in L2), every node row
is read once and every output written once:

  inference  E * (8 + D*s)          two indices an edge (source; relation or destination) and the source row
             + 2 * N * D * s        the node's own row (RGCN's self term, RGAT's / HGT's destination side) + output
             + weights * s          RGCN (R+1) D^2, RGAT R (D^2 + 2D), HGT 4 T D^2 + R (2 D^2 + 1)
  training   the forward, plus E * 4 (RGAT/HGT: one saved attention value an edge, written and read: E * 8),
             and a backward that reads the graph, the source rows and the output gradient again and writes
             float32 weight gradients: E * (8 + D*s) + N * D * s + weights * 4

These are lower bounds by construction (no L2 reuse assumed for node rows it could get, none counted for edges).
"""
from __future__ import annotations

D = 64
ELEM = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}


def weight_elems(model: str, R: int, T: int) -> int:
    if model == "rgcn":
        return (R + 1) * D * D
    if model == "rgat":
        return R * (D * D + 2 * D)
    if model == "hgt":
        return 4 * T * D * D + R * (2 * D * D + 1)
    raise ValueError(model)


def floor_bytes(model: str, mode: str, N: int, E: int, R: int, T: int, dtype: str) -> int:
    s = ELEM[dtype]
    w = weight_elems(model, R, T)
    fwd = E * (8 + D * s) + 2 * N * D * s + w * s
    if mode == "infer":
        return fwd
    saved = E * 8 if model in ("rgat", "hgt") else 0
    bwd = E * (8 + D * s) + N * D * s + w * 4
    return fwd + saved + bwd


def floor_ms(model, mode, N, E, R, T, dtype, bandwidth_bytes_per_s: float) -> float:
    return floor_bytes(model, mode, N, E, R, T, dtype) / bandwidth_bytes_per_s * 1e3
