"""The strongest plain-PyTorch RGCN, RGAT and HGT layers a careful user writes, with the semantics of the bundled
specs (specs/{rgcn,rgat,hgt}.yaml, one head): the benchmark's hand-written baselines, in any float dtype.

    dg = DeviceGraph(graph, "cuda")                 # once per graph: indices on the device, per-relation sizes
    layer = HandLayer("rgat", dg, torch.bfloat16)   # parameters named and shaped as the spec's weights
    out = layer(x)                                  # [N, 64] ([N, 1, 64] for RGAT), float32

What makes them strong (and what ../shared/anchors/handwritten.py, the layers they replace, already did):
* Per-relation matrices are applied to the relation-sorted edge rows as one segment GEMM, in the fastest of three
  forms, chosen per graph and dtype by timing them once on the device (``layout="auto"``):
  ``grouped``: torch._grouped_mm, one CUTLASS launch; torch 2.11 has that kernel for bfloat16 only (on sm_90 and
  later); other dtypes fall back to a loop of mm with a host sync, so they do not use it;
  ``loop``: one mm per non-empty relation (few, large relations: mag, am), the weight slices taken by one unbind so
  the backward stacks their gradients once instead of zero-filling an [R, K, M] gradient per relation;
  ``chunks``: each relation's rows cut into chunks of C rows, the last one padded, and one torch.bmm over all
  chunks (many small relations: fb15k, wikikg2). Padding rows read node 0 and write to a spare node row N that
  is dropped, so the per-edge work never unpads.
* Attention vectors are folded into the weights (dot(x W_r, w) = x . (W_r w)): RGAT's source score is one extra
  GEMM column, its destination score an 8-column GEMM; HGT's prior mu / sqrt(d_k) scales W_att. Gradients stay
  segment GEMMs: no backward scatters E rows into R rows.
* Edge softmax with a per-destination maximum computed without gradient (the shift cancels), normalised per
  node after aggregation (sum_e exp_e m_e / sum_e exp_e), aggregation in float32 whatever the storage dtype.
* HGT's three node projections K, Q, V are one segment GEMM over the node types.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

NEG_SLOPE = 0.2   # specs/rgat.yaml negative_slope
PAD_COLS = 8      # extra GEMM columns (RGAT's folded attention), keeping rows 16-byte aligned in bf16


class Segments:
    """Rows grouped in contiguous segments (relations or node types), and how to multiply each segment by its own
    matrix: ``mm(rows, W)`` with W [S, K, M]."""

    def __init__(self, ptr: list, kind: str, device, chunk: int = 0):
        self.ptr = [int(p) for p in ptr]
        self.kind = kind
        self.nonempty = [(s, a, b) for s, (a, b) in enumerate(zip(self.ptr[:-1], self.ptr[1:])) if b > a]
        self.offs = torch.tensor(self.ptr[1:], device=device, dtype=torch.int32)
        self.chunk = chunk
        if kind == "chunks":
            seg, rows = [], []
            for s, a, b in self.nonempty:
                n = -(-(b - a) // chunk)
                seg += [s] * n
                rows.append(n * chunk)
            self.chunk_seg = torch.tensor(seg, device=device, dtype=torch.int64)
            self.num_chunks = len(seg)
        elif kind not in ("loop", "grouped"):
            raise ValueError(f"unknown segment GEMM kind {kind!r}")

    def mm(self, rows: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        if self.kind == "grouped":
            return torch._grouped_mm(rows, W, offs=self.offs)
        if self.kind == "chunks":
            K, M = W.shape[-2:]
            out = torch.bmm(rows.view(self.num_chunks, self.chunk, K), W.index_select(0, self.chunk_seg))
            return out.view(self.num_chunks * self.chunk, M)
        Ws = W.unbind(0)   # one backward op for all slices (W[s] would zero-fill an [S, K, M] gradient per slice)
        parts = [rows[a:b] @ Ws[s] for s, a, b in self.nonempty]
        return torch.cat(parts) if len(parts) > 1 else parts[0]


def best_chunk(ptr: list) -> int:
    """The chunk size (rows) with the fewest padded rows plus a per-chunk overhead worth 32 rows."""
    sizes = [b - a for a, b in zip(ptr[:-1], ptr[1:]) if b > a]
    cost = {c: sum(-(-n // c) * (c + 32) for n in sizes) for c in (32, 64, 128, 256, 512, 1024)}
    return min(cost, key=lambda c: (cost[c], -c))


class EdgeLayout:
    """The per-edge rows a layer works on: the relation-sorted edges, or (kind "chunks") those edges with each
    relation padded to whole chunks. ``src``/``dst_gather`` are safe to gather with (padding reads node 0),
    ``dst`` is the scatter target (padding goes to node N), ``norm`` is 1/c_{v,r} (0 on padding), ``pad`` marks
    padding rows (None without)."""

    def __init__(self, dg: "DeviceGraph", kind: str):
        dev = dg.device
        self.kind = kind
        if kind != "chunks":
            self.seg = Segments(dg.eptr, kind, dev)
            self.src, self.dst_gather, self.dst, self.norm = dg.src, dg.dst, dg.dst, dg.norm
            self.pad = None
            self.num_out = dg.num_nodes
            return
        chunk = best_chunk(dg.eptr)
        self.seg = Segments(dg.eptr, "chunks", dev, chunk)
        pos = []  # padded position of every edge
        start = 0
        for s, a, b in self.seg.nonempty:
            pos.append(torch.arange(start, start + b - a, device=dev))
            start += -(-(b - a) // chunk) * chunk
        pos = torch.cat(pos)
        rows = start
        E = dg.src.numel()
        fill = lambda t, v: torch.full((rows,), v, dtype=t.dtype, device=dev).index_copy_(0, pos, t)  # noqa: E731
        self.src = fill(dg.src, 0)
        self.dst_gather = fill(dg.dst, 0)
        self.dst = fill(dg.dst, dg.num_nodes)
        self.norm = fill(dg.norm, 0.0)
        self.pad = torch.ones(rows, dtype=torch.bool, device=dev).index_fill_(0, pos, False)
        self.num_out = dg.num_nodes + 1
        self.padding = rows - E


class DeviceGraph:
    """A benchmark graph (datasets.py) on a device, with what every hand-written layer needs, built once."""

    def __init__(self, g: dict, device, norm_dtype=torch.float32):
        self.device = torch.device(device)
        self.num_nodes, self.num_etypes, self.num_ntypes = g["num_nodes"], g["num_etypes"], g["num_ntypes"]
        self.src, self.dst = g["src"].to(self.device), g["dst"].to(self.device)
        self.etype, self.ntype = g["etype"].to(self.device), g["ntype"].to(self.device)
        self.eptr, self.nptr = g["eptr"].tolist(), g["nptr"].tolist()
        # 1 / c_{v,r}: one over the number of edges of the edge's relation entering its destination
        key = self.dst * self.num_etypes + self.etype
        _, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
        self.norm = (1.0 / counts.to(norm_dtype))[inverse]   # float64 for the tests' float64 reference
        self._layouts = {}
        self._choice = {}
        self.segmm_ms = {}   # dtype -> {kind: ms} of choose()'s timings
        self.segmm_errors = {}   # (dtype, kind) -> why choose() could not time it

    def layout(self, kind: str) -> EdgeLayout:
        if kind not in self._layouts:
            self._layouts[kind] = EdgeLayout(self, kind)
        return self._layouts[kind]

    def node_segments(self, kind: str) -> Segments:
        key = ("nodes", "grouped" if kind == "grouped" else "loop")
        if key not in self._layouts:
            self._layouts[key] = Segments(self.nptr, key[1], self.device)
        return self._layouts[key]

    def candidates(self, dtype) -> list:
        kinds = ["loop", "chunks"]
        if dtype == torch.bfloat16 and self.device.type == "cuda" and hasattr(torch, "_grouped_mm") \
                and torch.cuda.get_device_capability(self.device) >= (9, 0):
            kinds.insert(0, "grouped")
        return kinds

    def choose(self, dtype, dim: int = 64) -> str:
        """The fastest segment GEMM form for this graph and dtype: timed once on a CUDA device (the per-edge GEMM
        of a 64-wide layer, forward and backward), a rule elsewhere (chunks when relations are many)."""
        if dtype in self._choice:
            return self._choice[dtype]
        kinds = self.candidates(dtype)
        if self.device.type != "cuda":
            best = "chunks" if self.num_etypes > 16 else "loop"
        else:
            x = torch.randn(self.num_nodes, dim, device=self.device, dtype=dtype)
            W = torch.randn(self.num_etypes, dim, dim, device=self.device, dtype=dtype, requires_grad=True)
            times = {}
            for k in kinds:
                lay = self.layout(k)

                def step():
                    y = lay.seg.mm(x[lay.src], W)
                    y.backward(torch.ones_like(y))
                try:
                    times[k] = _median_ms(step, reps=3)
                except Exception as e:  # noqa: BLE001  (OOM, or a form this torch cannot run: not a candidate)
                    self.segmm_errors[(dtype, k)] = f"{type(e).__name__}: {str(e)[:120]}"
                    W.grad = None
                    torch.cuda.empty_cache()
            best = min(times, key=times.get) if times else kinds[-1]
            self.segmm_ms[dtype] = times
            del x, W
            keep = set(self._choice.values()) | {best}
            for k in [k for k in self._layouts if isinstance(k, str) and k not in keep]:
                del self._layouts[k]   # the index arrays of the forms not chosen: out of every later case's memory
        self._choice[dtype] = best
        return best


def _median_ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


def _glorot(shape, fan_in, fan_out, dtype, device, gen=None):
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1).mul_(a).to(device=device, dtype=dtype)


def spec_shapes(model: str, R: int, T: int, D: int = 64) -> dict:
    """The spec's weights (one head): name -> full shape."""
    if model == "rgcn":
        return {"W0": (D, D), "W": (R, D, D)}
    if model == "rgat":
        return {"W": (R, D, D), "w_s": (R, 1, D), "w_t": (R, 1, D)}
    if model == "hgt":
        return {"W_k": (T, D, D), "W_q": (T, D, D), "W_v": (T, D, D), "W_att": (R, 1, D, D),
                "W_msg": (R, 1, D, D), "mu": (R, 1), "W_a": (T, D, D)}
    raise ValueError(f"unknown model {model!r}")


def edge_softmax_aggregate(score, msg, lay: EdgeLayout, num_nodes: int, acc=torch.float32):
    """sum over incoming edges of softmax(score) * msg, per destination, in ``acc`` (float32 unless the layer is
    float64): the maximum shift without gradient, the normalisation once per node."""
    score = score.to(acc)
    if lay.pad is not None:
        score = score.masked_fill(lay.pad, float("-inf"))
    with torch.no_grad():
        smax = torch.full((lay.num_out,), -1e30, device=score.device, dtype=acc)
        smax = smax.scatter_reduce_(0, lay.dst, score, "amax")
    ex = torch.exp(score - smax[lay.dst])
    den = torch.zeros(lay.num_out, device=score.device, dtype=acc).index_add_(0, lay.dst, ex)
    num = torch.zeros(lay.num_out, msg.shape[-1], device=score.device, dtype=acc)
    num = num.index_add_(0, lay.dst, ex.unsqueeze(1) * msg.to(acc))
    return (num / den.clamp_min(1e-30).unsqueeze(1))[:num_nodes]


class HandLayer(torch.nn.Module):
    """One hand-written layer of ``model`` (rgcn, rgat, hgt) on a DeviceGraph, parameters in ``dtype`` named and
    shaped like the spec's weights (Glorot initialised, mu = 1). Returns float32 (the aggregation precision;
    float64 for a float64 layer, the tests' reference)."""

    def __init__(self, model: str, dg: DeviceGraph, dtype=torch.float32, layout: str = "auto", dim: int = 64,
                 seed: int = 0, weights: dict | None = None):
        super().__init__()
        self.model, self.dg, self.dtype, self.dim = model, dg, dtype, dim
        self.acc = torch.float64 if dtype == torch.float64 else torch.float32
        self.kind = dg.choose(dtype, dim) if layout == "auto" else layout
        self.lay = dg.layout(self.kind)
        self.nseg = dg.node_segments(self.kind)
        gen = torch.Generator().manual_seed(seed)
        for name, shape in spec_shapes(model, dg.num_etypes, dg.num_ntypes, dim).items():
            if weights is not None:   # shared, not copied (a stand-in module's own parameters)
                setattr(self, name, weights[name])
                continue
            if name == "mu":
                t = torch.ones(shape, dtype=dtype, device=dg.device)
            elif len(shape) >= 2 and shape[-2] > 1:
                t = _glorot(shape, shape[-2], shape[-1], dtype, dg.device, gen)
            else:
                t = _glorot(shape, shape[-1], 1, dtype, dg.device, gen)
            setattr(self, name, torch.nn.Parameter(t))

    def load(self, tensors: dict) -> "HandLayer":
        """Copies weights by spec name (e.g. a generated layer's parameters), converting dtype and device."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(tensors[name].reshape(p.shape).to(p.dtype))
        return self

    def forward(self, x):
        x = x.to(self.dtype)
        return getattr(self, "_" + self.model)(x)

    def _rgcn(self, x):
        lay = self.lay
        m = lay.seg.mm(x[lay.src], self.W)
        out = x @ self.W0
        if lay.pad is not None:   # a spare row for the padding
            out = torch.cat([out, out.new_zeros(1, self.dim)])
        # in place on a fresh tensor (the mm's output, or its float32 copy): no N x D clone
        out = out.to(self.acc).index_add_(0, lay.dst, m.to(self.acc) * lay.norm.to(self.acc).unsqueeze(1))
        return out[:self.dg.num_nodes]

    def _rgat(self, x):
        lay, D = self.lay, self.dim
        W = self.W
        a_s = torch.einsum("rio,ro->ri", W, self.w_s[:, 0]).unsqueeze(-1)   # x . (W_r w_s) = (x W_r) . w_s
        a_t = torch.einsum("rio,ro->ri", W, self.w_t[:, 0]).unsqueeze(-1)
        pad = W.new_zeros(W.shape[0], D, PAD_COLS - 1)
        hs = lay.seg.mm(x[lay.src], torch.cat([W, a_s, pad], -1))                  # [E', D + 8]
        ht = lay.seg.mm(x[lay.dst_gather], torch.cat([a_t, pad], -1))[:, 0]         # [E']
        score = F.leaky_relu(hs[:, D].to(self.acc) + ht.to(self.acc), NEG_SLOPE)
        out = edge_softmax_aggregate(score, hs[:, :D], lay, self.dg.num_nodes, self.acc)
        return out.unsqueeze(1)

    def _hgt(self, x):
        lay, D, nseg = self.lay, self.dim, self.nseg
        kqv = nseg.mm(x, torch.cat([self.W_k, self.W_q, self.W_v], -1))            # [N, 3D], one node GEMM
        k, q, v = kqv[:, :D], kqv[:, D:2 * D], kqv[:, 2 * D:]
        W_att = self.W_att[:, 0] * (self.mu / math.sqrt(D)).unsqueeze(-1)           # prior folded into W_att
        katt = lay.seg.mm(k.index_select(0, lay.src), W_att)
        score = (katt * q.index_select(0, lay.dst_gather)).sum(-1, dtype=self.acc)   # products in the storage dtype, sum in acc
        msg = lay.seg.mm(v.index_select(0, lay.src), self.W_msg[:, 0])
        agg = edge_softmax_aggregate(score, msg, lay, self.dg.num_nodes, self.acc)
        return nseg.mm(agg.to(self.dtype), self.W_a).to(self.acc)
