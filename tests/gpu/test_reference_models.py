"""Checks of the PyTorch reference models against independent per-edge/per-node loops.

The loop versions below transcribe the programs of specs/*.yaml (and the formulas
of docs/semantics.md) one node or edge at a time, in float64, sharing no code with
reference_models.py. Skipped when torch is not installed.
"""
from __future__ import annotations

import math
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")

from compare import fresh_inputs, rel_err  # noqa: E402
from graphs import HeteroGraph, synthetic_graph, tiny_graph  # noqa: E402
from reference_models import (  # noqa: E402
    edge_softmax, hgt_ref, inv_relation_in_degree, rgat_ref, rgcn_ref)

F64 = torch.float64


# ---------------------------------------------------------------------------
# Independent slow references (one node / one edge at a time).
# ---------------------------------------------------------------------------

def _lists(g):
    return g.src.tolist(), g.dst.tolist(), g.etype.tolist(), g.ntype.tolist()


def _incoming(g):
    """incoming[v] = list of edge ids with dst == v, in edge order."""
    _, dst, _, _ = _lists(g)
    inc = [[] for _ in range(g.num_nodes)]
    for e, v in enumerate(dst):
        inc[v].append(e)
    return inc


def loop_norm(g):
    _, dst, et, _ = _lists(g)
    count = defaultdict(int)
    for v, r in zip(dst, et):
        count[(v, r)] += 1
    return torch.tensor([1.0 / count[(v, r)] for v, r in zip(dst, et)], dtype=F64)


def loop_rgcn(g, x, W0, W, norm):
    src, _, et, _ = _lists(g)
    inc = _incoming(g)
    rows = []
    for v in range(g.num_nodes):
        h = x[v] @ W0
        for e in inc[v]:
            h = h + norm[e] * (x[src[e]] @ W[et[e]])
        rows.append(h)
    return torch.stack(rows)


def _leaky(z, slope):
    return torch.where(z > 0, z, z * slope)


def _loop_edge_softmax(g, att):
    """The spec's edge_softmax: exp, per-destination sum, divide (no max shift)."""
    _, dst, _, _ = _lists(g)
    att = [torch.exp(a) for a in att]
    att_sum = [0.0] * g.num_nodes
    for e, v in enumerate(dst):
        att_sum[v] = att_sum[v] + att[e]
    return [att[e] / att_sum[dst[e]] for e in range(len(att))]


def loop_rgat(g, x, W, w_s, w_t, heads, slope):
    src, dst, et, _ = _lists(g)
    D = W.shape[-1] // heads
    msg, att = [], []
    for e in range(g.num_edges):
        r = et[e]
        hs = (x[src[e]] @ W[r]).reshape(heads, D)
        ht = (x[dst[e]] @ W[r]).reshape(heads, D)
        msg.append(hs)
        att.append(_leaky((hs * w_s[r]).sum(-1) + (ht * w_t[r]).sum(-1), slope))
    att = _loop_edge_softmax(g, att)
    inc = _incoming(g)
    rows = []
    for v in range(g.num_nodes):
        h = torch.zeros(heads, D, dtype=x.dtype)
        for e in inc[v]:
            h = h + att[e][:, None] * msg[e]
        rows.append(h)
    return torch.stack(rows), torch.stack(att) if att else torch.zeros(0, heads, dtype=x.dtype)


def loop_hgt(g, x, W_k, W_q, W_v, W_att, W_msg, mu, W_a, heads):
    src, dst, et, nt = _lists(g)
    d = W_k.shape[-1] // heads
    k, q, v = {}, {}, {}
    for n in range(g.num_nodes):
        k[n] = (x[n] @ W_k[nt[n]]).reshape(heads, d)
        q[n] = (x[n] @ W_q[nt[n]]).reshape(heads, d)
        v[n] = (x[n] @ W_v[nt[n]]).reshape(heads, d)
    att, msg = [], []
    for e in range(g.num_edges):
        r, s, t = et[e], src[e], dst[e]
        a_e, m_e = [], []
        for hh in range(heads):
            kr = k[s][hh] @ W_att[r, hh]                    # row vector times [d, d]
            a_e.append((kr * q[t][hh]).sum() * mu[r, hh] / math.sqrt(d))
            m_e.append(v[s][hh] @ W_msg[r, hh])
        att.append(torch.stack(a_e))
        msg.append(torch.stack(m_e))
    att = _loop_edge_softmax(g, att)
    inc = _incoming(g)
    rows = []
    for n in range(g.num_nodes):
        agg = torch.zeros(heads, d, dtype=x.dtype)
        for e in inc[n]:
            agg = agg + att[e][:, None] * msg[e]
        rows.append(agg.reshape(heads * d) @ W_a[nt[n]])
    return torch.stack(rows), torch.stack(att) if att else torch.zeros(0, heads, dtype=x.dtype)


# ---------------------------------------------------------------------------
# Graphs used here.
# ---------------------------------------------------------------------------

GRAPHS = {
    "tiny": tiny_graph,
    "small_random": lambda: synthetic_graph(40, 3, 200, 5, seed=1),
    "one_ntype": lambda: synthetic_graph(30, 1, 120, 3, seed=2),
}


@pytest.fixture(params=list(GRAPHS), scope="module")
def graph(request) -> HeteroGraph:
    return GRAPHS[request.param]()


TOL = 1e-12  # both sides in float64; only summation order differs


# ---------------------------------------------------------------------------
# Tests.
# ---------------------------------------------------------------------------

def test_norm_tiny_by_hand():
    g = tiny_graph()
    # edges: (4,2,r1) (0,1,r0) (2,3,r1) (4,2,r1) (3,1,r1) (0,2,r0) (1,4,r1)
    expected = torch.tensor([0.5, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0], dtype=F64)
    assert torch.equal(inv_relation_in_degree(g, dtype=F64), expected)


def test_norm_matches_loop(graph):
    assert torch.equal(inv_relation_in_degree(graph, dtype=F64), loop_norm(graph))


def test_rgcn_matches_loop(graph):
    inp = fresh_inputs("rgcn", graph, (6, 5), seed=3, dtype=F64)
    got = rgcn_ref(graph, inp["feature"], inp["W0"], inp["W"], inp["norm"])
    ref = loop_rgcn(graph, inp["feature"], inp["W0"], inp["W"], loop_norm(graph))
    assert got.shape == (graph.num_nodes, 5)
    assert rel_err(got, ref) < TOL
    # norm=None computes the same normaliser.
    assert rel_err(rgcn_ref(graph, inp["feature"], inp["W0"], inp["W"]), ref) < TOL


@pytest.mark.parametrize("heads", [1, 2, 3])
def test_rgat_matches_loop(graph, heads):
    inp = fresh_inputs("rgat", graph, (6, 4), heads=heads, seed=4, dtype=F64)
    got, att = rgat_ref(graph, inp["feature"], inp["W"], inp["w_s"], inp["w_t"], heads, 0.2,
                        return_attention=True)
    ref, ref_att = loop_rgat(graph, inp["feature"], inp["W"], inp["w_s"], inp["w_t"], heads, 0.2)
    assert got.shape == (graph.num_nodes, heads, 4)
    assert rel_err(got, ref) < TOL
    assert rel_err(att, ref_att) < TOL


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_hgt_matches_loop(graph, heads):
    inp = fresh_inputs("hgt", graph, (6, 8), heads=heads, seed=5, dtype=F64)
    args = [inp[k] for k in ("feature", "W_k", "W_q", "W_v", "W_att", "W_msg", "mu", "W_a")]
    got, att = hgt_ref(graph, *args, heads=heads, return_attention=True)
    ref, ref_att = loop_hgt(graph, *args, heads=heads)
    assert got.shape == (graph.num_nodes, 8)
    assert rel_err(got, ref) < TOL
    assert rel_err(att, ref_att) < TOL


def _attention_sums(g, att):
    s = torch.zeros(g.num_nodes, att.shape[1], dtype=att.dtype).index_add(0, g.dst, att)
    has_in = torch.bincount(g.dst, minlength=g.num_nodes) > 0
    return s, has_in


@pytest.mark.parametrize("heads", [1, 4])
def test_rgat_attention_sums_to_one(graph, heads):
    inp = fresh_inputs("rgat", graph, (6, 4), heads=heads, seed=6, dtype=F64)
    _, att = rgat_ref(graph, inp["feature"], inp["W"], inp["w_s"], inp["w_t"], heads, 0.2,
                      return_attention=True)
    assert att.shape == (graph.num_edges, heads)
    assert bool((att > 0).all())
    s, has_in = _attention_sums(graph, att)
    assert torch.allclose(s[has_in], torch.ones_like(s[has_in]), rtol=0, atol=1e-12)
    assert bool((s[~has_in] == 0).all())


@pytest.mark.parametrize("heads", [1, 2])
def test_hgt_attention_sums_to_one(graph, heads):
    inp = fresh_inputs("hgt", graph, (6, 4), heads=heads, seed=7, dtype=F64)
    args = [inp[k] for k in ("feature", "W_k", "W_q", "W_v", "W_att", "W_msg", "mu", "W_a")]
    _, att = hgt_ref(graph, *args, heads=heads, return_attention=True)
    s, has_in = _attention_sums(graph, att)
    assert torch.allclose(s[has_in], torch.ones_like(s[has_in]), rtol=0, atol=1e-12)


def test_rgcn_one_relation_is_mean_aggregation():
    base = synthetic_graph(50, 2, 250, 1, seed=8)
    x = torch.randn(base.num_nodes, 5, dtype=F64, generator=torch.Generator().manual_seed(0))
    W0 = torch.zeros(5, 5, dtype=F64)
    W = torch.eye(5, dtype=F64).unsqueeze(0)
    h = rgcn_ref(base, x, W0, W)  # default norm = 1 / in-degree
    src, dst = base.src.tolist(), base.dst.tolist()
    for v in range(base.num_nodes):
        nbrs = [src[e] for e in range(base.num_edges) if dst[e] == v]  # with multiplicity
        expect = x[nbrs].mean(0) if nbrs else torch.zeros(5, dtype=F64)
        assert torch.allclose(h[v], expect, rtol=0, atol=1e-12), v


def test_nodes_without_in_edges_tiny():
    g = tiny_graph()  # node 0 receives no edge
    inp = fresh_inputs("rgcn", g, 4, seed=9, dtype=F64)
    h = rgcn_ref(g, inp["feature"], inp["W0"], inp["W"], inp["norm"])
    # (allclose: a single row times W0 may round differently from the batched x @ W0)
    assert torch.allclose(h[0], inp["feature"][0] @ inp["W0"], rtol=1e-14, atol=1e-14)
    inp = fresh_inputs("rgat", g, 4, heads=2, seed=9, dtype=F64)
    h = rgat_ref(g, inp["feature"], inp["W"], inp["w_s"], inp["w_t"], 2, 0.2)
    assert bool((h[0] == 0).all()) and bool((h[1:] != 0).any())
    inp = fresh_inputs("hgt", g, 4, heads=2, seed=9, dtype=F64)
    args = [inp[k] for k in ("feature", "W_k", "W_q", "W_v", "W_att", "W_msg", "mu", "W_a")]
    h = hgt_ref(g, *args, heads=2)
    assert bool((h[0] == 0).all()) and bool((h[1:] != 0).any())


def test_edge_softmax_shift_max_is_equivalent():
    g = synthetic_graph(40, 3, 200, 5, seed=10)
    logits = torch.randn(g.num_edges, 3, dtype=F64, generator=torch.Generator().manual_seed(1)) * 5
    a = edge_softmax(g.dst, logits, g.num_nodes)
    b = edge_softmax(g.dst, logits, g.num_nodes, shift_max=True)
    assert rel_err(b, a) < 1e-13


def test_float32_close_to_float64():
    g = synthetic_graph(40, 3, 200, 5, seed=11)
    for model, heads in (("rgcn", 1), ("rgat", 2), ("hgt", 2)):
        outs = {}
        for dt in (torch.float32, F64):
            inp = fresh_inputs(model, g, 8, heads=heads, seed=12, dtype=dt)
            outs[dt] = _run(model, g, inp, heads)
        assert outs[torch.float32].dtype == torch.float32
        assert rel_err(outs[torch.float32], outs[F64]) < 1e-5, model


def _run(model, g, inp, heads):
    if model == "rgcn":
        return rgcn_ref(g, inp["feature"], inp["W0"], inp["W"], inp["norm"])
    if model == "rgat":
        return rgat_ref(g, inp["feature"], inp["W"], inp["w_s"], inp["w_t"], heads, 0.2)
    return hgt_ref(g, *[inp[k] for k in ("feature", "W_k", "W_q", "W_v", "W_att", "W_msg", "mu", "W_a")],
                   heads=heads)


_GRAD_NAMES = {
    "rgcn": ("feature", "W0", "W"),
    "rgat": ("feature", "W", "w_s", "w_t"),
    "hgt": ("feature", "W_k", "W_q", "W_v", "W_att", "W_msg", "mu", "W_a"),
}


@pytest.mark.parametrize("model", ["rgcn", "rgat", "hgt"])
def test_gradcheck_tiny(model):
    """Autograd through the references agrees with finite differences."""
    g = tiny_graph()
    heads = 1 if model == "rgcn" else 2
    inp = fresh_inputs(model, g, (3, 2), heads=heads, seed=13, dtype=F64, requires_grad=True)
    names = _GRAD_NAMES[model]

    def f(*tensors):
        d = dict(inp)
        d.update(zip(names, tensors))
        return _run(model, g, d, heads)

    assert torch.autograd.gradcheck(f, tuple(inp[n] for n in names))


@pytest.mark.parametrize("model", ["rgcn", "rgat", "hgt"])
def test_gradients_match_loop(model):
    """Gradients of the vectorised reference equal those of the loop version."""
    g = synthetic_graph(25, 2, 80, 3, seed=14)
    heads = 2
    names = _GRAD_NAMES[model]
    grads = []
    for impl in ("ref", "loop"):
        inp = fresh_inputs(model, g, (4, 4), heads=heads, seed=15, dtype=F64, requires_grad=True)
        if impl == "ref":
            out = _run(model, g, inp, heads)
        elif model == "rgcn":
            out = loop_rgcn(g, inp["feature"], inp["W0"], inp["W"], loop_norm(g))
        elif model == "rgat":
            out = loop_rgat(g, inp["feature"], inp["W"], inp["w_s"], inp["w_t"], heads, 0.2)[0]
        else:
            out = loop_hgt(g, *[inp[k] for k in names], heads=heads)[0]
        upstream = torch.randn(out.shape, dtype=F64, generator=torch.Generator().manual_seed(16))
        grads.append(torch.autograd.grad(out, [inp[n] for n in names], upstream))
    for n, a, b in zip(names, *grads):
        assert rel_err(a, b) < TOL, n


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    """The references run on the GPU (index tensors moved automatically)."""
    from graphs import preset_graph
    g = preset_graph("small")
    for model, heads in (("rgcn", 1), ("rgat", 4), ("hgt", 4)):
        cpu = _run(model, g, fresh_inputs(model, g, 16, heads=heads, seed=17, dtype=F64), heads)
        gpu = _run(model, g, fresh_inputs(model, g, 16, heads=heads, seed=17, dtype=torch.float32,
                                          device="cuda"), heads)
        assert gpu.is_cuda
        assert rel_err(gpu, cpu) < 1e-4, model
