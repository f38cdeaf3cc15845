"""Checks of the test-graph generators (graphs.py) and the comparison helpers (compare.py)."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from compare import (  # noqa: E402
    all_passed, default_tolerance, format_table, fresh_inputs, make_row, poison_, rel_err)
from graphs import PRESETS, graph_by_name, preset_graph, synthetic_graph, tiny_graph  # noqa: E402


def test_tiny_graph_shape():
    g = tiny_graph()
    g.validate()
    assert (g.num_nodes, g.num_edges, g.num_etypes, g.num_ntypes) == (5, 7, 2, 2)
    assert g.ntype.tolist() == [0, 1, 1, 1, 1]
    indeg = torch.bincount(g.dst, minlength=5)
    assert int(indeg[0]) == 0  # a node without incoming edges
    pairs = list(zip(g.src.tolist(), g.dst.tolist(), g.etype.tolist()))
    assert any(pairs.count(p) == 2 for p in pairs)  # parallel edges of one relation
    assert g.etype.tolist() != sorted(g.etype.tolist())
    assert g.dst.tolist() != sorted(g.dst.tolist())
    assert graph_by_name("tiny").src.tolist() == g.src.tolist()


def test_synthetic_deterministic_and_seeded():
    a = synthetic_graph(300, 3, 2000, 6, seed=5)
    b = synthetic_graph(300, 3, 2000, 6, seed=5)
    c = synthetic_graph(300, 3, 2000, 6, seed=6)
    for k in ("src", "dst", "etype", "ntype", "nptr"):
        assert torch.equal(getattr(a, k), getattr(b, k)), k
    assert a.rel_types == b.rel_types
    assert not torch.equal(a.src, c.src)


def test_synthetic_invariants():
    g = synthetic_graph(500, 4, 5000, 10, seed=1)
    g.validate()  # sorted ntype, nptr, per-relation type pairs, index ranges
    assert (g.num_nodes, g.num_edges, g.num_etypes, g.num_ntypes) == (500, 5000, 10, 4)
    for t in (g.src, g.dst, g.etype, g.ntype):
        assert t.dtype == torch.int64
    assert bool((torch.bincount(g.etype, minlength=10) > 0).all())
    assert bool((torch.bincount(g.ntype, minlength=4) > 0).all())
    # edges are shuffled, not grouped by relation or destination
    assert not bool((g.etype[1:] >= g.etype[:-1]).all())
    assert not bool((g.dst[1:] >= g.dst[:-1]).all())
    # power-law sources: the busiest source sends far more than the average
    out_deg = torch.bincount(g.src, minlength=g.num_nodes)
    assert int(out_deg.max()) > 5 * g.num_edges / g.num_nodes
    # dict-style access
    assert g["num_edges"] == 5000 and torch.equal(g["src"], g.src)


def test_small_preset():
    g = preset_graph("small")
    n, nt, e, et = PRESETS["small"]
    assert (g.num_nodes, g.num_ntypes, g.num_edges, g.num_etypes) == (n, nt, e, et)
    g.validate()


def test_rel_err():
    ref = torch.tensor([3.0, 4.0])
    assert rel_err(ref, ref) == 0.0
    assert math.isclose(rel_err(torch.tensor([3.0, 5.0]), ref), 0.2)
    assert rel_err(torch.tensor([float("nan"), 4.0]), ref) == math.inf
    assert rel_err(torch.tensor([float("inf"), 4.0]), ref) == math.inf
    assert rel_err(torch.zeros(2), torch.zeros(2)) == 0.0
    assert rel_err(torch.ones(2), torch.zeros(2)) > 1e300
    assert rel_err(ref.half(), ref.double()) == 0.0
    with pytest.raises(ValueError):
        rel_err(torch.zeros(2), torch.zeros(2, 1))


def test_poison():
    t = torch.zeros(3, requires_grad=True)
    assert poison_(t) is t and bool(torch.isnan(t).all())
    i = poison_(torch.zeros(2, dtype=torch.int32))
    assert i.tolist() == [torch.iinfo(torch.int32).min] * 2


@pytest.mark.parametrize("heads", [1, 2])
def test_fresh_inputs_shapes(heads):
    g = synthetic_graph(60, 3, 300, 5, seed=2)
    N, E, R, T, H = g.num_nodes, g.num_edges, g.num_etypes, g.num_ntypes, heads
    inp = fresh_inputs("rgcn", g, (6, 4), heads=H, seed=0)
    assert {k: tuple(v.shape) for k, v in inp.items()} == {
        "feature": (N, 6), "norm": (E,), "W0": (6, 4), "W": (R, 6, 4)}
    inp = fresh_inputs("rgat", g, (6, 4), heads=H, seed=0)
    assert {k: tuple(v.shape) for k, v in inp.items()} == {
        "feature": (N, 6), "W": (R, 6, H * 4), "w_s": (R, H, 4), "w_t": (R, H, 4)}
    inp = fresh_inputs("hgt", g, (6, 4), heads=H, seed=0, dtype=torch.float64, requires_grad=True)
    d = 4 // H
    assert {k: tuple(v.shape) for k, v in inp.items()} == {
        "feature": (N, 6), "W_k": (T, 6, H * d), "W_q": (T, 6, H * d), "W_v": (T, 6, H * d),
        "W_att": (R, H, d, d), "W_msg": (R, H, d, d), "mu": (R, H), "W_a": (T, H * d, 4)}
    assert all(v.dtype == torch.float64 and v.requires_grad and v.is_leaf for v in inp.values())
    # same seed, same values, whatever the dtype
    again = fresh_inputs("hgt", g, (6, 4), heads=H, seed=0, dtype=torch.float32)
    assert rel_err(again["W_att"], inp["W_att"]) < 1e-7
    with pytest.raises(ValueError):
        fresh_inputs("hgt", g, (6, 5), heads=2)
    with pytest.raises(ValueError):
        fresh_inputs("gcn", g, 4)


def test_format_table():
    rows = [make_row("rgcn", "tiny", "forward", 1e-7, 1e-5),
            ("hgt", "medium", "grad W_att", float("nan"), 1e-4),
            {"model": "rgat", "graph": "small", "check": "forward", "err": math.inf, "tol": 1e-4}]
    s = format_table(rows)
    lines = s.splitlines()
    assert lines[0].split()[:3] == ["model", "graph", "check"]
    assert "PASS" in lines[2] and "FAIL" in lines[3] and "FAIL" in lines[4]
    assert "nan" in lines[3] and "inf" in lines[4]
    assert lines[-1] == "1/3 checks PASS, 2 FAIL"
    # the result column starts at the same offset on every row
    assert len({ln.index("PASS") if "PASS" in ln else ln.index("FAIL") for ln in lines[2:5]}) == 1
    assert not all_passed(rows) and all_passed(rows[:1])
    assert default_tolerance(torch.float32) < default_tolerance(torch.bfloat16)
