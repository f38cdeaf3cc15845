"""Tests of the graph preprocessing runtime (runtime/).

Without torch everything is skipped. With torch but no CUDA GPU, the pure-PyTorch reference (the oracle) is
checked against a hand-computed graph and structural invariants. With a GPU, the CUDA extension is JIT-built on
first use (runtime/python/build_ext.py can prebuild it) and every layout is compared bit for bit with the
reference on random graphs, for determinism, argument checking and the current-stream contract.

The package tested is runtime/python/hectorgen_runtime of this checkout, or the one under $HECTORGEN_RUNTIME_PYTHON
(e.g. build/runtime/python of a CMake build, or an install's site-packages: then its compiled _C is used).

Run with pytest, or as a script (CTest `runtime_preprocess`): `python3 tests/runtime/test_preprocess.py`, which
exits 77 (skipped) without torch or pytest.
"""

import importlib.util
import os
import pathlib
import sys

if __name__ == "__main__":
    _missing = [name for name in ("pytest", "torch") if importlib.util.find_spec(name) is None]
    if _missing:
        print(f"runtime_preprocess: SKIPPED: needs python3 with {' and '.join(_missing)}")
        sys.exit(77)

import pytest  # noqa: E402

torch = pytest.importorskip("torch")

sys.path.insert(0, os.environ.get("HECTORGEN_RUNTIME_PYTHON")
                or str(pathlib.Path(__file__).resolve().parents[2] / "runtime" / "python"))
import hectorgen_runtime as hr  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ALL_LAYOUTS = list(hr.LAYOUTS)
NO_NTYPE_LAYOUTS = [layout for layout in ALL_LAYOUTS if layout != "ntype_ptr"]
# The layouts a layout joins, asked for with it.
JOINS = {"csr_by_dst_pairs": ["csr_by_dst", "compact_src_etype"],
         "in_col_inv_relation_in_degree": ["csr_by_dst", "inv_relation_in_degree"]}

# ---------------------------------------------------------------------------------------------------------------
# Helpers


def sorted_ntype(num_nodes, num_ntypes, generator):
    return torch.sort(torch.randint(0, num_ntypes, (num_nodes,), generator=generator)).values


def random_graph(num_nodes, num_edges, num_etypes, seed, used_etypes=None, max_node=None):
    """A random typed COO graph on the CPU (int64). used_etypes restricts the relations that occur (so others are
    empty); max_node restricts endpoints to [0, max_node) (so the rest of the nodes are isolated)."""
    g = torch.Generator().manual_seed(seed)
    high = num_nodes if max_node is None else max_node
    src = torch.randint(0, max(high, 1), (num_edges,), generator=g)
    dst = torch.randint(0, max(high, 1), (num_edges,), generator=g)
    if used_etypes is None:
        etype = torch.randint(0, num_etypes, (num_edges,), generator=g)
    else:
        choices = torch.tensor(sorted(used_etypes))
        etype = choices[torch.randint(0, len(choices), (num_edges,), generator=g)]
    ntype = sorted_ntype(num_nodes, 3, g)
    return src, dst, etype, ntype


def key_dtype(key):
    if key in ("inv_relation_in_degree", "in_col_inv_relation_in_degree"):
        return torch.float32
    return torch.bool if key.endswith("_relation_compacted") else torch.int32


def unique_pair_counts(node, etype, num_etypes):
    """Unique (node, etype) pairs of each relation, counted with a Python set (independent of both paths)."""
    counts = [0] * num_etypes
    for pair in set(zip(node.tolist(), etype.tolist())):
        counts[pair[1]] += 1
    return counts


def check_invariants(out, src, dst, etype, num_nodes, num_etypes, compacted=None):
    """Structural properties that any correct result has, independent of how it was computed (CPU tensors).
    compacted: the relations that must be compacted, {"src": [bool] * R, "dst": [bool] * R} (default: all)."""
    num_edges = src.numel()
    src, dst, etype = src.long(), dst.long(), etype.long()
    for key, value in out.items():
        assert value.dtype == key_dtype(key), key
    perm = out["perm"].long()
    assert torch.equal(torch.sort(perm).values, torch.arange(num_edges))
    s_src, s_dst, s_etype = out["sorted_src"].long(), out["sorted_dst"].long(), out["sorted_etype"].long()
    assert torch.equal(s_src, src[perm]) and torch.equal(s_dst, dst[perm]) and torch.equal(s_etype, etype[perm])
    assert bool((s_etype[1:] >= s_etype[:-1]).all())
    etype_ptr = out["etype_ptr"].long()
    assert etype_ptr.numel() == num_etypes + 1 and int(etype_ptr[0]) == 0 and int(etype_ptr[-1]) == num_edges
    for r in range(min(num_etypes, 64)):
        assert bool((s_etype[etype_ptr[r] : etype_ptr[r + 1]] == r).all())
    # Inside one relation: ordered by destination, and among equal destinations the caller's order is kept.
    same = s_etype[1:] == s_etype[:-1]
    key = s_dst * (num_edges + 1) + perm
    assert bool((key[1:][same] > key[:-1][same]).all())

    for prefix, row, col, col_key in (("in_", s_dst, s_src, "col_src"), ("out_", s_src, s_dst, "col_dst")):
        row_ptr, eid = out[prefix + "row_ptr"].long(), out[prefix + "col_eid"].long()
        assert row_ptr.numel() == num_nodes + 1 and int(row_ptr[-1]) == num_edges
        assert torch.equal(torch.sort(eid).values, torch.arange(num_edges))
        rows = torch.repeat_interleave(torch.arange(num_nodes), row_ptr[1:] - row_ptr[:-1])
        assert torch.equal(row[eid], rows)
        assert torch.equal(out[prefix + col_key].long(), col[eid])
        assert torch.equal(out[prefix + "col_etype"].long(), s_etype[eid])
        # Inside a row: ordered by (etype, position).
        same_row = rows[1:] == rows[:-1]
        key = s_etype[eid] * (num_edges + 1) + eid
        assert bool((key[1:][same_row] > key[:-1][same_row]).all())

    if "in_col_unique_src" in out:  # csr_by_dst_pairs: each incoming-edge position's pair
        assert torch.equal(out["in_col_unique_src"].long(), out["edge_to_unique_src"].long()[out["in_col_eid"].long()])
    if "in_col_inv_relation_in_degree" in out:  # each incoming-edge position's 1 / relation in-degree
        assert torch.equal(out["in_col_inv_relation_in_degree"],
                           out["inv_relation_in_degree"][out["in_col_eid"].long()])

    for name, node in (("src", s_src), ("dst", s_dst)):
        unique, ptr = out["unique_" + name].long(), out["unique_" + name + "_etype_ptr"].long()
        to_unique = out["edge_to_unique_" + name].long()
        num_unique = unique.numel()
        assert int(ptr[0]) == 0 and int(ptr[-1]) == num_unique
        unique_etype = torch.repeat_interleave(torch.arange(num_etypes), ptr[1:] - ptr[:-1])
        assert torch.equal(unique[to_unique], node) and torch.equal(unique_etype[to_unique], s_etype)
        assert torch.equal(torch.unique(to_unique), torch.arange(num_unique))  # every row is used

        # Per relation: the true unique pair counts, the expected decision, and the rows it implies.
        expected_compacted = [True] * num_etypes if compacted is None else list(compacted[name])
        pairs = unique_pair_counts(node, s_etype, num_etypes)
        edges = torch.bincount(s_etype, minlength=num_etypes).tolist()
        assert out["unique_" + name + "_relation_pairs"].tolist() == pairs
        assert out[name + "_relation_compacted"].tolist() == expected_compacted
        rows = [p if c else e for p, e, c in zip(pairs, edges, expected_compacted)]
        assert torch.diff(ptr).tolist() == rows

        # Pair -> edges: every edge once, grouped by its pair row, ascending positions inside a pair.
        edge_ptr, edge_eid = out["unique_" + name + "_edge_ptr"].long(), out["unique_" + name + "_edge_eid"].long()
        assert edge_ptr.numel() == num_unique + 1 and int(edge_ptr[0]) == 0 and int(edge_ptr[-1]) == num_edges
        assert bool((edge_ptr[1:] > edge_ptr[:-1]).all())  # no empty pair
        assert torch.equal(torch.sort(edge_eid).values, torch.arange(num_edges))
        edge_rows = torch.repeat_interleave(torch.arange(num_unique), edge_ptr[1:] - edge_ptr[:-1])
        assert torch.equal(to_unique[edge_eid], edge_rows)
        same_pair = edge_rows[1:] == edge_rows[:-1]
        assert bool((edge_eid[1:][same_pair] > edge_eid[:-1][same_pair]).all())
        # Rows strictly increasing by (etype, node, first edge of the row if its relation is uncompacted): the pairs
        # of a compacted relation are unique, an uncompacted one has one row per edge ordered by (node, p).
        row_compacted = torch.tensor(expected_compacted, dtype=torch.bool)[unique_etype]
        first_edge = edge_eid[edge_ptr[:-1]] if num_unique else edge_ptr[:0]
        assert bool((torch.diff(edge_ptr)[~row_compacted] == 1).all())
        row_key = (unique_etype * max(num_nodes, 1) + unique) * (num_edges + 1) + torch.where(row_compacted, 0,
                                                                                              first_edge + 1)
        assert bool((row_key[1:] > row_key[:-1]).all())
        if name == "dst":  # edges are ordered by (etype, dst): a (dst, etype) pair's edges are adjacent already
            assert torch.equal(edge_eid, torch.arange(num_edges))

        # Node -> pairs: every pair once, grouped by its node, ascending rows (so ascending etypes; strictly where every
        # relation is compacted, as rows of one relation are then unique per node).
        node_ptr, node_pair = out["unique_" + name + "_node_ptr"].long(), out["unique_" + name + "_node_pair"].long()
        assert node_ptr.numel() == num_nodes + 1 and int(node_ptr[0]) == 0 and int(node_ptr[-1]) == num_unique
        assert torch.equal(torch.sort(node_pair).values, torch.arange(num_unique))
        node_rows = torch.repeat_interleave(torch.arange(num_nodes), node_ptr[1:] - node_ptr[:-1])
        assert torch.equal(unique[node_pair], node_rows)
        same_node = node_rows[1:] == node_rows[:-1]
        assert bool((node_pair[1:][same_node] > node_pair[:-1][same_node]).all())
        node_etype = unique_etype[node_pair]
        if all(expected_compacted):
            assert bool((node_etype[1:][same_node] > node_etype[:-1][same_node]).all())
        assert bool((node_etype[1:][same_node] >= node_etype[:-1][same_node]).all())

        # What the backward does with them: gather-only segment sums equal the scattered (index_add) sums.
        edge_grad = torch.arange(num_edges, dtype=torch.int64) * 7 % 11 - 5
        pair_grad = torch.zeros(num_unique, dtype=torch.int64).index_add_(0, to_unique, edge_grad)
        assert torch.equal(segment_sum(edge_grad[edge_eid], edge_ptr), pair_grad)
        node_grad = torch.zeros(num_nodes, dtype=torch.int64).index_add_(0, unique, pair_grad)
        assert torch.equal(segment_sum(pair_grad[node_pair], node_ptr), node_grad)
        assert torch.equal(node_grad, torch.zeros(num_nodes, dtype=torch.int64).index_add_(0, node, edge_grad))

    inv = out["inv_relation_in_degree"]
    for p in range(0, num_edges, max(num_edges // 50, 1)):
        count = int(((s_dst == s_dst[p]) & (s_etype == s_etype[p])).sum())
        assert float(inv[p]) == float(torch.tensor(1.0 / count, dtype=torch.float32))


def segment_sum(values, ptr):
    """Sums of values[ptr[i]:ptr[i+1]] (rows) for each segment i, by a cumulative sum (no scatter)."""
    prefix = torch.zeros((values.shape[0] + 1, *values.shape[1:]), dtype=values.dtype)
    prefix[1:] = torch.cumsum(values, 0)
    return prefix[ptr[1:]] - prefix[ptr[:-1]]


def assert_same(actual, expected, context=""):
    """Same keys, dtypes, shapes and values, bit for bit."""
    assert sorted(actual) == sorted(expected), context
    for key in expected:
        a, e = actual[key].cpu(), expected[key].cpu()
        assert a.dtype == e.dtype, f"{context} {key}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"{context} {key}: shape {tuple(a.shape)} != {tuple(e.shape)}"
        if a.dtype == torch.float32:  # bitwise
            a, e = a.view(torch.int32), e.view(torch.int32)
        if not torch.equal(a, e):
            bad = (a != e).nonzero().flatten()[:5].tolist()
            raise AssertionError(f"{context} {key}: differs at {bad}: {a[bad].tolist()} != {e[bad].tolist()}")


# ---------------------------------------------------------------------------------------------------------------
# The reference (oracle), on the CPU

# A 7-edge graph on 4 nodes with 3 relations (relation 2 empty, node 3 without in-edges, edges 2 and 6 share
# (src, etype)), with every layout computed by hand.
HAND_SRC = [0, 1, 2, 0, 1, 3, 0]
HAND_DST = [1, 2, 1, 1, 0, 1, 2]
HAND_ETYPE = [1, 0, 1, 0, 1, 1, 1]
HAND_EXPECTED = {
    "perm": [3, 1, 4, 0, 2, 5, 6],
    "sorted_src": [0, 1, 1, 0, 2, 3, 0],
    "sorted_dst": [1, 2, 0, 1, 1, 1, 2],
    "sorted_etype": [0, 0, 1, 1, 1, 1, 1],
    "etype_ptr": [0, 2, 7, 7],
    "in_row_ptr": [0, 1, 5, 7, 7],
    "in_col_src": [1, 0, 0, 2, 3, 1, 0],
    "in_col_eid": [2, 0, 3, 4, 5, 1, 6],
    "in_col_etype": [1, 0, 1, 1, 1, 0, 1],
    "out_row_ptr": [0, 3, 5, 6, 7],
    "out_col_dst": [1, 1, 2, 2, 0, 1, 1],
    "out_col_eid": [0, 3, 6, 1, 2, 4, 5],
    "out_col_etype": [0, 1, 1, 0, 1, 1, 1],
    # (src, etype) pairs: rows 0 (0, r0), 1 (1, r0), 2 (0, r1), 3 (1, r1), 4 (2, r1), 5 (3, r1)
    "unique_src": [0, 1, 0, 1, 2, 3],
    "unique_src_etype_ptr": [0, 2, 6, 6],
    "edge_to_unique_src": [0, 1, 3, 2, 4, 5, 2],
    "unique_src_edge_ptr": [0, 1, 2, 4, 5, 6, 7],  # row 2 has two edges (positions 3 and 6)
    "unique_src_edge_eid": [0, 1, 3, 6, 2, 4, 5],
    "unique_src_node_ptr": [0, 2, 4, 5, 6],  # nodes 0 and 1 have a pair in each relation
    "unique_src_node_pair": [0, 2, 1, 3, 4, 5],
    "unique_src_relation_pairs": [2, 4, 0],  # r0: 2 pairs of 2 edges, r1: 4 of 5 (src 0 twice), r2: no edges
    "src_relation_compacted": [True, True, True],
    # (dst, etype) pairs: rows 0 (1, r0), 1 (2, r0), 2 (0, r1), 3 (1, r1), 4 (2, r1)
    "unique_dst": [1, 2, 0, 1, 2],
    "unique_dst_etype_ptr": [0, 2, 5, 5],
    "edge_to_unique_dst": [0, 1, 2, 3, 3, 3, 4],
    "unique_dst_edge_ptr": [0, 1, 2, 3, 6, 7],
    "unique_dst_edge_eid": [0, 1, 2, 3, 4, 5, 6],  # the identity: edges are ordered by (etype, dst)
    "unique_dst_node_ptr": [0, 1, 3, 5, 5],  # node 3 has no incoming edges
    "unique_dst_node_pair": [2, 0, 3, 1, 4],
    "unique_dst_relation_pairs": [2, 3, 0],
    "dst_relation_compacted": [True, True, True],
    "inv_relation_in_degree": [1.0, 1.0, 1.0, 1 / 3, 1 / 3, 1 / 3, 1.0],
    "in_col_unique_src": [3, 0, 2, 4, 5, 1, 2],  # edge_to_unique_src at in_col_eid [2, 0, 3, 4, 5, 1, 6]
    "in_col_inv_relation_in_degree": [1.0, 1.0, 1 / 3, 1 / 3, 1 / 3, 1.0, 1.0],  # inv_relation_in_degree there
    "ntype_ptr": [0, 2, 2, 4],
    "ntype": [0, 0, 2, 2],
}
# Row-tile offsets of etype_ptr [0, 2, 7, 7], unique_src_etype_ptr [0, 2, 6, 6], unique_dst_etype_ptr [0, 2, 5, 5]
# and ntype_ptr [0, 2, 2, 4] for some tiles.
HAND_TILES = {
    1: {"etype_tile_ptr": [0, 2, 7, 7], "unique_src_tile_ptr": [0, 2, 6, 6], "unique_dst_tile_ptr": [0, 2, 5, 5],
        "ntype_tile_ptr": [0, 2, 2, 4]},
    2: {"etype_tile_ptr": [0, 1, 4, 4], "unique_src_tile_ptr": [0, 1, 3, 3], "unique_dst_tile_ptr": [0, 1, 3, 3],
        "ntype_tile_ptr": [0, 1, 1, 2]},
    4: {"etype_tile_ptr": [0, 1, 3, 3], "unique_src_tile_ptr": [0, 1, 2, 2], "unique_dst_tile_ptr": [0, 1, 2, 2],
        "ntype_tile_ptr": [0, 1, 1, 2]},
    16: {"etype_tile_ptr": [0, 1, 2, 2], "unique_src_tile_ptr": [0, 1, 2, 2], "unique_dst_tile_ptr": [0, 1, 2, 2],
         "ntype_tile_ptr": [0, 1, 1, 2]},
}
TILED_LAYOUTS = ["etype_sorted_coo", "compact_src_etype", "compact_dst_etype", "ntype_ptr"]
HAND_NTYPE = [0, 0, 2, 2]


def hand_graph(device="cpu", dtype=torch.int64):
    return tuple(torch.tensor(v, dtype=dtype, device=device) for v in (HAND_SRC, HAND_DST, HAND_ETYPE, HAND_NTYPE))


def hand_expected():
    return {key: torch.tensor(v, dtype=key_dtype(key)) for key, v in HAND_EXPECTED.items()}


def test_reference_matches_hand_computed_layouts():
    src, dst, etype, ntype = hand_graph()
    out = hr.reference_preprocess(src, dst, etype, 4, 3, ntype, ALL_LAYOUTS, num_ntypes=3)
    assert_same(out, hand_expected(), "reference")


@pytest.mark.parametrize("case", ["tiny", "duplicates", "empty_relations", "isolated", "no_edges", "one_relation"])
def test_reference_invariants(case):
    params = {
        "tiny": dict(num_nodes=5, num_edges=9, num_etypes=3, seed=1),
        "duplicates": dict(num_nodes=4, num_edges=200, num_etypes=2, seed=2),
        "empty_relations": dict(num_nodes=30, num_edges=150, num_etypes=8, seed=3, used_etypes={1, 4, 7}),
        "isolated": dict(num_nodes=300, num_edges=20, num_etypes=3, seed=4, max_node=40),
        "no_edges": dict(num_nodes=6, num_edges=0, num_etypes=2, seed=5),
        "one_relation": dict(num_nodes=40, num_edges=300, num_etypes=1, seed=6),
    }[case]
    src, dst, etype, _ = random_graph(**params)
    out = hr.reference_preprocess(src, dst, etype, params["num_nodes"], params["num_etypes"], None, NO_NTYPE_LAYOUTS)
    check_invariants(out, src, dst, etype, params["num_nodes"], params["num_etypes"])


@pytest.mark.parametrize("tile", sorted(HAND_TILES))
def test_reference_tile_offsets(tile):
    src, dst, etype, ntype = hand_graph()
    out = hr.reference_preprocess(src, dst, etype, 4, 3, ntype, TILED_LAYOUTS, 3, gemm_tile=tile)
    assert sorted(key for key in out if key.endswith("_tile_ptr")) == sorted(HAND_TILES[tile])
    for key, expected in HAND_TILES[tile].items():
        assert out[key].dtype == torch.int32 and out[key].tolist() == expected, key
    assert not any(key.endswith("_tile_ptr") for key in hr.reference_preprocess(src, dst, etype, 4, 3, ntype))


def test_compact_graph_on_cpu():
    src, dst, etype, ntype = hand_graph()
    layouts = ["compact_src_etype", "compact_dst_etype"]
    graph = hr.Graph.from_coo(src, dst, etype, 4, 3, None, layouts=layouts, gemm_tile=2)
    assert graph.layouts == frozenset(layouts) and graph.gemm_tile == 2
    assert graph.num_unique_src == 6 and graph.num_unique_dst == 5
    assert isinstance(graph.num_unique_src, int) and isinstance(graph.num_unique_dst, int)
    keys = ["unique_src_tile_ptr", "unique_src_edge_ptr", "unique_src_edge_eid", "unique_src_node_ptr",
            "unique_src_node_pair", "unique_dst_tile_ptr", "unique_dst_node_pair"]
    assert [a.tolist() for a in graph.arrays(keys, gemm_tile=2)] == [
        HAND_TILES[2][key] if key.endswith("_tile_ptr") else HAND_EXPECTED[key] for key in keys
    ]
    with pytest.raises(ValueError, match="GEMM row tile 2, not 16"):
        graph.arrays(["unique_src_tile_ptr"], gemm_tile=16)
    untiled = hr.Graph.from_coo(src, dst, etype, 4, 3, None, layouts=["compact_src_etype"])
    with pytest.raises(ValueError, match="'compact_src_etype' with a gemm_tile"):
        untiled.array("unique_src_tile_ptr")
    with pytest.raises(ValueError, match="without the layout 'compact_dst_etype'"):
        untiled.array("unique_dst_node_ptr")
    assert untiled.num_unique_dst is None


def test_reference_rejects_invalid_input():
    src, dst, etype, ntype = hand_graph()
    with pytest.raises(ValueError, match="src out of range"):
        hr.reference_preprocess(src, dst, etype, 3, 3)
    with pytest.raises(ValueError, match="etype out of range"):
        hr.reference_preprocess(src, dst, etype, 4, 1)
    with pytest.raises(ValueError, match="not sorted"):
        hr.reference_preprocess(src, dst, etype, 4, 3, ntype.flip(0), ["ntype_ptr"])
    with pytest.raises(ValueError, match="unknown layout"):
        hr.reference_preprocess(src, dst, etype, 4, 3, None, ["csr"])
    with pytest.raises(ValueError, match="gemm_tile"):
        hr.reference_preprocess(src, dst, etype, 4, 3, None, ["etype_sorted_coo"], gemm_tile=-1)


def test_python_api_on_cpu_uses_the_reference():
    src, dst, etype, ntype = hand_graph()
    out = hr.preprocess(src, dst, etype, 4, 3, ntype)  # default layouts: all, ntype_ptr since ntype is given
    assert_same(out, hand_expected(), "preprocess(cpu)")
    graph = hr.Graph.from_coo(src, dst, etype, 4, 3, ntype, layouts=["csr_by_dst", "ntype_ptr"])
    assert graph.num_edges == 7 and graph.num_ntypes == 3 and graph.perm is None
    assert sorted(graph.tensors()) == sorted(hr.LAYOUT_KEYS["csr_by_dst"] + hr.LAYOUT_KEYS["ntype_ptr"])


def test_a_joining_layout_needs_the_layouts_it_joins():
    src, dst, etype, _ = hand_graph()
    for layouts in (["csr_by_dst_pairs"], ["csr_by_dst_pairs", "csr_by_dst"], ["csr_by_dst_pairs", "compact_src_etype"]):
        with pytest.raises(ValueError, match="joins 'csr_by_dst' and 'compact_src_etype'"):
            hr.reference_preprocess(src, dst, etype, 4, 3, None, layouts)
    out = hr.reference_preprocess(src, dst, etype, 4, 3, None, ["csr_by_dst_pairs"] + JOINS["csr_by_dst_pairs"])
    assert out["in_col_unique_src"].tolist() == HAND_EXPECTED["in_col_unique_src"]
    twin = "in_col_inv_relation_in_degree"
    for layouts in ([twin], [twin, "csr_by_dst"], [twin, "inv_relation_in_degree"]):
        with pytest.raises(ValueError, match="joins 'csr_by_dst' and 'inv_relation_in_degree'"):
            hr.reference_preprocess(src, dst, etype, 4, 3, None, layouts)
    out = hr.reference_preprocess(src, dst, etype, 4, 3, None, [twin] + JOINS[twin])
    assert torch.equal(out[twin], torch.tensor(HAND_EXPECTED[twin], dtype=torch.float32))


def test_graph_dataclass_covers_every_key():
    fields = {f.name for f in hr.Graph.__dataclass_fields__.values()}
    keys = {key for keys in hr.LAYOUT_KEYS.values() for key in keys} | set(hr.TILE_KEYS.values())
    assert keys <= fields


def test_layout_keys_keep_their_order():
    # Generated modules and saved graphs name these keys; later additions go after them.
    assert hr.LAYOUTS[:7] == ("etype_sorted_coo", "csr_by_dst", "csr_by_src", "compact_src_etype",
                              "compact_dst_etype", "inv_relation_in_degree", "ntype_ptr")
    for name in ("src", "dst"):
        assert hr.LAYOUT_KEYS[f"compact_{name}_etype"][:3] == (f"unique_{name}", f"unique_{name}_etype_ptr",
                                                               f"edge_to_unique_{name}")


# ---------------------------------------------------------------------------------------------------------------
# Per-relation compaction (compact_relations), on the CPU

COMPACT_LAYOUTS = ["compact_src_etype", "compact_dst_etype"]
COMPACT_KEYS = [key for layout in COMPACT_LAYOUTS for key in hr.LAYOUT_KEYS[layout]]

# The hand graph with relation 1 uncompacted (mask [True, False, True]). Its src pairs: r0 rows 0 (0, r0), 1 (1, r0)
# as before; r1 one row per edge, ordered by (src, p): rows 2 (0, p3), 3 (0, p6), 4 (1, p2), 5 (2, p4), 6 (3, p5).
# Its dst pairs: r1 positions 2..6 have dst 0, 1, 1, 1, 2, already ordered by (dst, p): rows 2..6 = positions 2..6.
HAND_MASK = [True, False, True]
HAND_EXPECTED_MASKED = {
    "unique_src": [0, 1, 0, 0, 1, 2, 3],
    "unique_src_etype_ptr": [0, 2, 7, 7],
    "edge_to_unique_src": [0, 1, 4, 2, 5, 6, 3],
    "unique_src_edge_ptr": [0, 1, 2, 3, 4, 5, 6, 7],
    "unique_src_edge_eid": [0, 1, 3, 6, 2, 4, 5],
    "unique_src_node_ptr": [0, 3, 5, 6, 7],  # node 0: rows 0 (r0), 2 and 3 (r1, its two edges)
    "unique_src_node_pair": [0, 2, 3, 1, 4, 5, 6],
    "unique_src_relation_pairs": [2, 4, 0],  # the statistics do not depend on the choice
    "src_relation_compacted": HAND_MASK,
    "unique_dst": [1, 2, 0, 1, 1, 1, 2],
    "unique_dst_etype_ptr": [0, 2, 7, 7],
    "edge_to_unique_dst": [0, 1, 2, 3, 4, 5, 6],
    "unique_dst_edge_ptr": [0, 1, 2, 3, 4, 5, 6, 7],
    "unique_dst_edge_eid": [0, 1, 2, 3, 4, 5, 6],
    "unique_dst_node_ptr": [0, 1, 5, 7, 7],
    "unique_dst_node_pair": [2, 0, 3, 4, 5, 1, 6],
    "unique_dst_relation_pairs": [2, 3, 0],
    "dst_relation_compacted": HAND_MASK,
}


def hand_expected_masked():
    return {key: torch.tensor(v, dtype=key_dtype(key)) for key, v in HAND_EXPECTED_MASKED.items()}


def test_reference_mask_matches_hand_computed_layouts():
    src, dst, etype, _ = hand_graph()
    for mask in (HAND_MASK, torch.tensor(HAND_MASK), tuple(HAND_MASK)):
        out = hr.reference_preprocess(src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_relations=mask)
        assert_same(out, hand_expected_masked(), f"mask {type(mask).__name__}")
    tiled = hr.reference_preprocess(src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, gemm_tile=2,
                                    compact_relations=HAND_MASK)
    # Pair rows per relation [2, 5, 0] -> tiles of 2 rows [1, 3, 0].
    assert tiled["unique_src_tile_ptr"].tolist() == [0, 1, 4, 4]
    assert tiled["unique_dst_tile_ptr"].tolist() == [0, 1, 4, 4]


@pytest.mark.parametrize("policy", [None, 1.0, 2.5, float("inf"), [True, True, True]], ids=str)
def test_reference_policies_that_compact_everything_give_the_layouts_of_1_2(policy):
    src, dst, etype, ntype = hand_graph()
    out = hr.reference_preprocess(src, dst, etype, 4, 3, ntype, ALL_LAYOUTS, num_ntypes=3, compact_relations=policy)
    assert_same(out, hand_expected(), f"compact_relations={policy}")


# theta -> (src decision, dst decision) on the hand graph: src ratios r0 2/2, r1 4/5, r2 no edges; dst ratios r0 2/2,
# r1 3/5. 4/5 and 0.8 are the same double, so theta = 0.8 compacts r1 (<=); the largest double below it does not.
HAND_THRESHOLDS = {
    0.0: ([False, False, True], [False, False, True]),  # only the relation without edges
    0.6: ([False, False, True], [False, True, True]),
    0.8: ([False, True, True], [False, True, True]),
    0.7999999999999999: ([False, False, True], [False, True, True]),
    0.99: ([False, True, True], [False, True, True]),
    1.0: ([True, True, True], [True, True, True]),
}


@pytest.mark.parametrize("theta", sorted(HAND_THRESHOLDS))
def test_reference_threshold_decides_per_relation(theta):
    src, dst, etype, _ = hand_graph()
    out = hr.reference_preprocess(src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_relations=theta)
    src_choice, dst_choice = HAND_THRESHOLDS[theta]
    assert out["src_relation_compacted"].tolist() == src_choice
    assert out["dst_relation_compacted"].tolist() == dst_choice
    # The other layouts from a run with every relation compacted (not csr_by_dst_pairs: it depends on the choice).
    check_invariants(dict(out, **{k: v for k, v in hr.reference_preprocess(src, dst, etype, 4, 3).items()
                                  if k not in out and k not in hr.LAYOUT_KEYS["csr_by_dst_pairs"]}),
                     src, dst, etype, 4, 3, compacted={"src": src_choice, "dst": dst_choice})
    # A threshold is its decision: the mask of the decision gives the same arrays for that endpoint.
    for name, choice in (("src", src_choice), ("dst", dst_choice)):
        masked = hr.reference_preprocess(src, dst, etype, 4, 3, None, [f"compact_{name}_etype"],
                                         compact_relations=choice)
        assert_same(masked, {k: out[k] for k in hr.LAYOUT_KEYS[f"compact_{name}_etype"]}, f"theta={theta} {name}")


def test_reference_relation_with_unique_pairs_is_the_same_either_way():
    # Relation 0 of the hand graph has only unique pairs: compacting it or not gives the same rows; only its flag
    # differs.
    src, dst, etype, _ = hand_graph()
    compacted = hr.reference_preprocess(src, dst, etype, 4, 3, None, COMPACT_LAYOUTS)
    apart = hr.reference_preprocess(src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_relations=[False, True, True])
    assert apart["src_relation_compacted"].tolist() == [False, True, True]
    for key in COMPACT_KEYS:
        if not key.endswith("_relation_compacted"):
            assert torch.equal(apart[key], compacted[key]), key


@pytest.mark.parametrize("policy", [0.0, 0.5, [False, False], [True, False]], ids=str)
def test_reference_without_edges(policy):
    empty = torch.zeros(0, dtype=torch.int64)
    out = hr.reference_preprocess(empty, empty, empty, 6, 2, None, COMPACT_LAYOUTS, compact_relations=policy)
    expected = policy if isinstance(policy, list) else [True, True]  # relations without edges count as compacted
    for name in ("src", "dst"):
        assert out[f"{name}_relation_compacted"].tolist() == expected
        assert out[f"unique_{name}_relation_pairs"].tolist() == [0, 0]
        assert out[f"unique_{name}_etype_ptr"].tolist() == [0, 0, 0]
        assert out[f"unique_{name}"].numel() == 0 and out[f"unique_{name}_edge_ptr"].tolist() == [0]
    g = hr.Graph.from_coo(empty, empty, empty, 6, 2, layouts=COMPACT_LAYOUTS, compact_relations=policy)
    assert g.relation_edges == (0, 0) and g.relation_unique_src == (0, 0) and g.compacted_relations == tuple(expected)


def skewed_graph(num_nodes, edges_per_relation, num_etypes, seed):
    """A graph whose relations repeat their pairs more and more: relation r draws its src from [0, 64 >> r) and its
    dst from [0, 64 >> (R - 2 - r)) (so unique pairs / edges goes from about 0.7 down on one side and up on the
    other); the last relation has no edges, and nodes from 64 on none at all."""
    g = torch.Generator().manual_seed(seed)
    src, dst, etype = [], [], []
    for r in range(num_etypes - 1):
        src.append(torch.randint(0, max(64 >> r, 1), (edges_per_relation,), generator=g))
        dst.append(torch.randint(0, max(64 >> (num_etypes - 2 - r), 1), (edges_per_relation,), generator=g))
        etype.append(torch.full((edges_per_relation,), r))
    order = torch.randperm(edges_per_relation * (num_etypes - 1), generator=g)  # any caller order
    return torch.cat(src)[order], torch.cat(dst)[order], torch.cat(etype)[order]


# name: (num_nodes, edges per relation, num_etypes)
POLICY_GRAPHS = {"skewed": (64, 60, 7), "skewed_isolated": (500, 60, 7), "skewed_few_relations": (64, 50, 4)}


def random_mask(num_etypes, seed):
    return (torch.randint(0, 2, (num_etypes,), generator=torch.Generator().manual_seed(seed)) == 1).tolist()


@pytest.mark.parametrize("policy", ["theta_0", "theta_0.2", "theta_0.5", "mask_a", "mask_b"])
@pytest.mark.parametrize("graph", list(POLICY_GRAPHS))
def test_reference_mixed_policies_keep_every_invariant(graph, policy):
    num_nodes, edges_per_relation, num_etypes = POLICY_GRAPHS[graph]
    src, dst, etype = skewed_graph(num_nodes, edges_per_relation, num_etypes, seed=len(graph))
    compact = (float(policy[6:]) if policy.startswith("theta") else random_mask(num_etypes, ord(policy[-1])))
    out = hr.reference_preprocess(src, dst, etype, num_nodes, num_etypes, None, NO_NTYPE_LAYOUTS,
                                  compact_relations=compact)
    # The expected decision, computed here from Python-set pair counts and Python float division.
    _, _, s_etype = (out[k].long() for k in ("sorted_src", "sorted_dst", "sorted_etype"))
    edges = torch.bincount(s_etype, minlength=num_etypes).tolist()
    expected = {}
    for name in ("src", "dst"):
        pairs = unique_pair_counts(out["sorted_" + name].long(), s_etype, num_etypes)
        expected[name] = (compact if isinstance(compact, list)
                          else [e == 0 or p / e <= compact for p, e in zip(pairs, edges)])
    for name in ("src", "dst"):  # every case mixes compacted and uncompacted relations
        assert True in expected[name] and False in expected[name], (name, expected[name])
    check_invariants(out, src, dst, etype, num_nodes, num_etypes, compacted=expected)
    # Everything outside the compact layouts (and csr_by_dst_pairs, their pair rows in CSR order) is independent of
    # the choice.
    everything = hr.reference_preprocess(src, dst, etype, num_nodes, num_etypes, None, NO_NTYPE_LAYOUTS)
    for key, value in everything.items():
        if key not in COMPACT_KEYS + list(hr.LAYOUT_KEYS["csr_by_dst_pairs"]):
            assert torch.equal(out[key], value), key


@pytest.mark.parametrize("policy", [None, 0.0, 0.5, "mask"], ids=str)
def test_gathering_through_the_mapping_reproduces_per_edge_values(policy):
    num_nodes, num_edges, num_etypes = 30, 500, 5
    src, dst, etype, _ = random_graph(num_nodes, num_edges, num_etypes, seed=21)
    compact = random_mask(num_etypes, 3) if policy == "mask" else policy
    out = hr.reference_preprocess(src, dst, etype, num_nodes, num_etypes, None, ["etype_sorted_coo"] + COMPACT_LAYOUTS,
                                  compact_relations=compact)
    s_etype = out["sorted_etype"].long()
    table = torch.randn(num_etypes, num_nodes, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    for name in ("src", "dst"):
        node = out["sorted_" + name].long()
        unique, ptr = out["unique_" + name].long(), out["unique_" + name + "_etype_ptr"].long()
        row_etype = torch.repeat_interleave(torch.arange(num_etypes), torch.diff(ptr))
        # A value of (node, relation) computed once per pair row, read by every edge through edge_to_unique.
        per_pair = table[row_etype, unique]
        per_edge = per_pair[out["edge_to_unique_" + name].long()]
        assert torch.equal(per_edge, table[s_etype, node])  # bitwise: a gather copies
        # The pair -> edges CSR sums an edge gradient into the pair rows exactly as a scatter does.
        grad = torch.arange(num_edges, dtype=torch.int64) % 13
        edge_ptr, edge_eid = out["unique_" + name + "_edge_ptr"].long(), out["unique_" + name + "_edge_eid"].long()
        scattered = torch.zeros(unique.numel(), dtype=torch.int64).index_add_(0, out["edge_to_unique_" + name].long(),
                                                                             grad)
        assert torch.equal(segment_sum(grad[edge_eid], edge_ptr), scattered)
        # In an uncompacted relation, any per-edge value round-trips through its rows (a bijection).
        compacted = out[name + "_relation_compacted"]
        own = ~compacted[s_etype]
        rows = out["edge_to_unique_" + name].long()[own]
        assert rows.unique().numel() == rows.numel()
        stored = torch.zeros(unique.numel(), dtype=torch.float64)
        stored[rows] = torch.arange(num_edges, dtype=torch.float64)[own]
        assert torch.equal(stored[rows], torch.arange(num_edges, dtype=torch.float64)[own])


@pytest.mark.parametrize("policy", [None, 0.0, 0.3, "mask"], ids=str)
def test_compact_program_on_a_mixed_mapping_equals_the_per_edge_program(policy):
    """What a compact module computes, in plain PyTorch on integer-valued float64 (so every sum is exact): per
    relation a GEMM over its pair rows (unique_src_etype_ptr segments), edges reading their row (edge_to_unique_src),
    and the backward's gather-only sums (pair -> edges, node -> pairs). Any mix of compacted and uncompacted
    relations must give the per-edge program's results exactly."""
    num_nodes, edges_per_relation, num_etypes = POLICY_GRAPHS["skewed"]
    src, dst, etype = skewed_graph(num_nodes, edges_per_relation, num_etypes, seed=3)
    compact = random_mask(num_etypes, 11) if policy == "mask" else policy
    out = hr.reference_preprocess(src, dst, etype, num_nodes, num_etypes, None,
                                  ["etype_sorted_coo", "compact_src_etype"], compact_relations=compact)
    chosen = out["src_relation_compacted"].tolist()
    assert all(chosen) if policy is None else (True in chosen and False in chosen)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-4, 5, (num_nodes, 6), generator=g).double()
    w = torch.randint(-3, 4, (num_etypes, 6, 5), generator=g).double()
    s_src, s_etype = out["sorted_src"].long(), out["sorted_etype"].long()
    num_edges = s_src.numel()
    d_msg = torch.randint(-5, 6, (num_edges, 5), generator=g).double()  # the gradient of the per-edge messages

    # Per edge: msg[p] = x[src[p]] @ W[etype[p]]; dx[v] = sum over the edges from v of d_msg[p] @ W[etype[p]]^T.
    msg = torch.einsum("ef,efo->eo", x[s_src], w[s_etype])
    dx = torch.zeros_like(x).index_add_(0, s_src, torch.einsum("eo,efo->ef", d_msg, w[s_etype]))

    # Compact: one GEMM per relation over its pair rows, edges gather; backward by gathers only.
    pair_ptr, unique = out["unique_src_etype_ptr"].long(), out["unique_src"].long()
    pair_msg = torch.cat([x[unique[pair_ptr[r]:pair_ptr[r + 1]]] @ w[r] for r in range(num_etypes)])
    assert torch.equal(pair_msg[out["edge_to_unique_src"].long()], msg)
    edge_ptr, edge_eid = out["unique_src_edge_ptr"].long(), out["unique_src_edge_eid"].long()
    d_pair = segment_sum(d_msg[edge_eid], edge_ptr)
    pair_etype = torch.repeat_interleave(torch.arange(num_etypes), torch.diff(pair_ptr))
    d_pair_x = torch.einsum("ko,kfo->kf", d_pair, w[pair_etype])
    node_ptr, node_pair = out["unique_src_node_ptr"].long(), out["unique_src_node_pair"].long()
    assert torch.equal(segment_sum(d_pair_x[node_pair], node_ptr), dx)


@pytest.mark.parametrize("bad, message", [
    (-0.5, "must be a number >= 0"),
    (float("nan"), "must be a number >= 0"),
    (True, "3 bools"),
    ([True, False], "3 bools"),
    ([1, 0, 1], "3 bools"),
    ("all", "3 bools"),
    (torch.tensor([1, 0, 1]), "torch.int64 tensor of shape \\[3\\]"),
    (torch.ones(1, 3, dtype=torch.bool), "torch.bool tensor of shape \\[1, 3\\]"),
], ids=repr)
def test_compact_relations_is_checked(bad, message):
    src, dst, etype, _ = hand_graph()
    with pytest.raises(ValueError, match=message):
        hr.reference_preprocess(src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_relations=bad)
    with pytest.raises(ValueError, match=message):
        hr.preprocess(src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_relations=bad)
    with pytest.raises(ValueError, match="^mymodel.prepare_graph: compact_relations"):
        hr.prepare_graph(src, dst, etype, 4, 3, layouts=COMPACT_LAYOUTS, backend="reference",
                         caller="mymodel.prepare_graph", compact_relations=bad)


def test_graph_per_relation_statistics_are_host_tuples():
    src, dst, etype, _ = hand_graph()
    g = hr.prepare_graph(src, dst, etype, 4, 3, layouts=COMPACT_LAYOUTS, backend="reference", compact_relations=0.8)
    assert g.relation_edges == (2, 5, 0)
    assert g.relation_unique_src == (2, 4, 0) and g.compacted_relations == (False, True, True)
    assert g.relation_unique_dst == (2, 3, 0) and g.compacted_dst_relations == (False, True, True)
    for values in (g.relation_edges, g.relation_unique_src, g.relation_unique_dst):
        assert isinstance(values, tuple) and all(type(v) is int for v in values)
    assert all(type(v) is bool for v in g.compacted_relations + g.compacted_dst_relations)
    # Rows of the pair domain: 2 + 4 for the compacted src relations... r0 is uncompacted but its pairs are unique.
    assert g.num_unique_src == 6 and g.num_unique_dst == 5
    masked = hr.Graph.from_coo(src, dst, etype, 4, 3, layouts=["compact_src_etype"], compact_relations=HAND_MASK)
    assert masked.compacted_relations == tuple(HAND_MASK) and masked.num_unique_src == 7
    assert masked.relation_edges == (2, 5, 0)  # from the pair -> edges CSR when etype_ptr is not built
    assert masked.relation_unique_dst is None and masked.compacted_dst_relations is None
    assert masked.to("cpu").compacted_relations == tuple(HAND_MASK)
    plain = hr.Graph.from_coo(src, dst, etype, 4, 3, layouts=["etype_sorted_coo", "csr_by_dst"])
    assert plain.relation_edges is None and plain.compacted_relations is None  # no compact layout: no read-back


# ---------------------------------------------------------------------------------------------------------------
# The CUDA extension against the reference


@pytest.fixture(scope="module")
def ext():
    return hr.load_extension()


# name: (num_nodes, num_edges, num_etypes, extra random_graph arguments)
CASES = {
    "tiny": (5, 7, 3, {}),
    "empty_relations": (50, 400, 10, {"used_etypes": {1, 4, 9}}),
    "isolated_nodes": (1000, 60, 4, {"max_node": 100}),
    "no_edges": (20, 0, 3, {}),
    "no_nodes_no_edges": (0, 0, 1, {}),
    "one_relation": (300, 5000, 1, {}),
    "dense_duplicates": (8, 3000, 3, {}),
    "many_empty_relations": (100, 10, 100_000, {}),
    "medium": (20_000, 300_000, 37, {}),
    "wide_keys": (2**21, 100_000, 4096, {}),  # num_etypes * num_nodes > 2^32: 64-bit composite sort keys
}


def run_cuda(ext, src, dst, etype, num_nodes, num_etypes, ntype, layouts=ALL_LAYOUTS, **kwargs):
    return ext.preprocess(src, dst, etype, num_nodes, num_etypes, ntype, layouts, **kwargs)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_matches_reference(ext, case, dtype):
    num_nodes, num_edges, num_etypes, extra = CASES[case]
    src, dst, etype, ntype = random_graph(num_nodes, num_edges, num_etypes, seed=sum(map(ord, case)), **extra)
    expected = hr.reference_preprocess(src, dst, etype, num_nodes, num_etypes, ntype, ALL_LAYOUTS, num_ntypes=3,
                                       gemm_tile=16)
    cuda = [t.to(device="cuda", dtype=dtype) for t in (src, dst, etype, ntype)]
    actual = run_cuda(ext, *cuda[:3], num_nodes, num_etypes, cuda[3], num_ntypes=3, gemm_tile=16)
    assert all(t.is_cuda for t in actual.values())
    assert_same(actual, expected, case)
    if num_edges <= 5000:
        check_invariants({k: v.cpu() for k, v in actual.items()}, src, dst, etype, num_nodes, num_etypes)


@needs_cuda
def test_cuda_matches_hand_computed_layouts(ext):
    src, dst, etype, ntype = hand_graph("cuda", torch.int32)
    assert_same(run_cuda(ext, src, dst, etype, 4, 3, ntype), hand_expected(), "cuda")


@needs_cuda
@pytest.mark.parametrize("tile", sorted(HAND_TILES))
def test_cuda_tile_offsets(ext, tile):
    src, dst, etype, ntype = hand_graph("cuda")
    out = run_cuda(ext, src, dst, etype, 4, 3, ntype, TILED_LAYOUTS, gemm_tile=tile)
    assert sorted(key for key in out if key.endswith("_tile_ptr")) == sorted(HAND_TILES[tile])
    for key, expected in HAND_TILES[tile].items():
        assert out[key].dtype == torch.int32 and out[key].tolist() == expected, key
    assert not any(key.endswith("_tile_ptr") for key in run_cuda(ext, src, dst, etype, 4, 3, ntype, TILED_LAYOUTS))


@needs_cuda
def test_extension_matches_the_package_version(ext):
    assert ext.version() == hr.__version__


@needs_cuda
def test_prepare_graph_on_cuda(ext):
    src, dst, etype, ntype = hand_graph("cuda")
    g = hr.prepare_graph(src, dst, etype, 4, 3, layouts=["etype_sorted_coo", "csr_by_dst", "ntype_ptr"], ntype=ntype,
                         num_ntypes=3, gemm_tile=2, backend="cuda")
    assert g.gemm_tile == 2 and g.num_ntypes == 3 and g.num_edges == 7
    arrays = g.arrays(["sorted_src", "etype_tile_ptr", "in_row_ptr", "ntype", "ntype_tile_ptr"], gemm_tile=2)
    assert all(a.is_cuda and a.dtype == torch.int32 for a in arrays)
    assert [a.tolist() for a in arrays] == [HAND_EXPECTED["sorted_src"], HAND_TILES[2]["etype_tile_ptr"],
                                            HAND_EXPECTED["in_row_ptr"], HAND_EXPECTED["ntype"],
                                            HAND_TILES[2]["ntype_tile_ptr"]]


@needs_cuda
def test_cuda_is_deterministic(ext):
    src, dst, etype, ntype = (t.cuda() for t in random_graph(5000, 200_000, 13, seed=7))
    first = run_cuda(ext, src, dst, etype, 5000, 13, ntype)
    for _ in range(2):
        assert_same(run_cuda(ext, src, dst, etype, 5000, 13, ntype), first, "rerun")


@needs_cuda
@pytest.mark.parametrize("layout", ALL_LAYOUTS)
def test_cuda_builds_exactly_the_requested_layout(ext, layout):
    src, dst, etype, ntype = hand_graph("cuda")
    layouts = [layout] + JOINS.get(layout, [])
    out = run_cuda(ext, src, dst, etype, 4, 3, ntype, layouts)
    assert sorted(out) == sorted(key for name in layouts for key in hr.LAYOUT_KEYS[name])
    assert_same(out, {k: v for k, v in hand_expected().items() if k in out}, layout)


@needs_cuda
def test_cuda_derives_num_ntypes_and_skips_validation_on_request(ext):
    src, dst, etype, ntype = hand_graph("cuda")
    derived = run_cuda(ext, src, dst, etype, 4, 3, ntype, ["ntype_ptr"])  # num_ntypes = max + 1 = 3
    assert derived["ntype_ptr"].tolist() == HAND_EXPECTED["ntype_ptr"]
    unchecked = run_cuda(ext, src, dst, etype, 4, 3, ntype, validate=False)
    assert_same(unchecked, hand_expected(), "validate=False")


@needs_cuda
def test_cuda_uses_the_current_stream(ext):
    src, dst, etype, ntype = (t.cuda() for t in random_graph(3000, 100_000, 7, seed=11))
    expected = run_cuda(ext, src, dst, etype, 3000, 7, ntype)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        actual = run_cuda(ext, src, dst, etype, 3000, 7, ntype)
    torch.cuda.current_stream().wait_stream(stream)
    assert_same(actual, expected, "side stream")


@needs_cuda
def test_python_api_on_cuda(ext):
    src, dst, etype, ntype = hand_graph("cuda")
    graph = hr.Graph.from_coo(src, dst, etype, 4, 3, ntype, backend="cuda")
    assert_same(graph.tensors(), hand_expected(), "Graph.from_coo")
    assert graph.num_unique_src == 6 and graph.num_unique_dst == 5 and graph.num_ntypes == 3
    assert isinstance(graph.num_unique_src, int)


@needs_cuda
def test_cuda_reports_invalid_graphs(ext):
    src, dst, etype, ntype = hand_graph("cuda")
    with pytest.raises(RuntimeError, match="src index out of range"):
        run_cuda(ext, src, dst, etype, 3, 3, None, ["csr_by_dst"])  # node 3 is a src
    with pytest.raises(RuntimeError, match="etype out of range"):
        run_cuda(ext, src, dst, etype, 4, 1, None, ["etype_sorted_coo"])
    with pytest.raises(RuntimeError, match="dst index out of range"):
        run_cuda(ext, src, dst - 1, etype, 4, 3, None, ["etype_sorted_coo"])
    big = src.clone()
    big[0] = 2**31 + 1  # does not fit int32: must be reported, not wrapped around
    with pytest.raises(RuntimeError, match="src index out of range"):
        run_cuda(ext, big, dst, etype, 4, 3, None, ["etype_sorted_coo"])
    with pytest.raises(RuntimeError, match="not sorted by ntype"):
        run_cuda(ext, src, dst, etype, 4, 3, ntype.flip(0), ["ntype_ptr"])
    with pytest.raises(RuntimeError, match="ntype out of range"):
        run_cuda(ext, src, dst, etype, 4, 3, ntype, ["ntype_ptr"], num_ntypes=2)


@needs_cuda
def test_cuda_checks_arguments(ext):
    src, dst, etype, ntype = hand_graph("cuda")
    with pytest.raises(RuntimeError, match="unknown layout 'csr'"):
        run_cuda(ext, src, dst, etype, 4, 3, None, ["csr"])
    with pytest.raises(RuntimeError, match="joins 'csr_by_dst' and 'compact_src_etype'"):
        run_cuda(ext, src, dst, etype, 4, 3, None, ["csr_by_dst_pairs", "csr_by_dst"])
    with pytest.raises(RuntimeError, match="joins 'csr_by_dst' and 'inv_relation_in_degree'"):
        run_cuda(ext, src, dst, etype, 4, 3, None, ["in_col_inv_relation_in_degree", "csr_by_dst"])
    with pytest.raises(RuntimeError, match="src must be a CUDA tensor"):
        run_cuda(ext, src.cpu(), dst, etype, 4, 3, None)
    with pytest.raises(RuntimeError, match="etype must be int32 or int64"):
        run_cuda(ext, src, dst, etype.float(), 4, 3, None)
    with pytest.raises(RuntimeError, match="dst has 6 entries, expected 7"):
        run_cuda(ext, src, dst[:6], etype, 4, 3, None)
    with pytest.raises(RuntimeError, match="must be 1-D"):
        run_cuda(ext, src, dst.view(7, 1), etype, 4, 3, None)
    with pytest.raises(RuntimeError, match="must be contiguous"):
        run_cuda(ext, src, torch.stack([dst, dst], 1)[:, 0], etype, 4, 3, None)
    with pytest.raises(RuntimeError, match="needs the ntype tensor"):
        run_cuda(ext, src, dst, etype, 4, 3, None, ["ntype_ptr"])
    with pytest.raises(RuntimeError, match="num_nodes must be in"):
        run_cuda(ext, src, dst, etype, 2**31, 3, None)
    with pytest.raises(RuntimeError, match="num_etypes must be in"):
        run_cuda(ext, src, dst, etype, 4, 0, None)
    with pytest.raises(RuntimeError, match="gemm_tile must be in"):
        run_cuda(ext, src, dst, etype, 4, 3, None, ["etype_sorted_coo"], gemm_tile=-1)


# ---------------------------------------------------------------------------------------------------------------
# Per-relation compaction on the GPU: bit for bit the reference


def policy_argument(policy, num_etypes, seed):
    if policy == "mask":
        return random_mask(num_etypes, seed)
    return None if policy == "none" else float(policy[6:])


@needs_cuda
@pytest.mark.parametrize("policy", ["theta_0", "theta_0.5", "theta_1", "mask"])
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_policies_match_reference(ext, case, policy):
    num_nodes, num_edges, num_etypes, extra = CASES[case]
    src, dst, etype, _ = random_graph(num_nodes, num_edges, num_etypes, seed=sum(map(ord, case)), **extra)
    compact = policy_argument(policy, num_etypes, seed=len(case))
    expected = hr.reference_preprocess(src, dst, etype, num_nodes, num_etypes, None, NO_NTYPE_LAYOUTS, gemm_tile=16,
                                       compact_relations=compact)
    actual = hr.preprocess(src.cuda(), dst.cuda(), etype.cuda(), num_nodes, num_etypes, None, NO_NTYPE_LAYOUTS,
                           backend="cuda", gemm_tile=16, compact_relations=compact)
    assert_same(actual, expected, f"{case} {policy}")


@needs_cuda
@pytest.mark.parametrize("policy", ["none", "theta_0", "theta_0.2", "theta_0.5", "mask"])
@pytest.mark.parametrize("graph", list(POLICY_GRAPHS))
def test_cuda_mixed_policies_match_reference(ext, graph, policy):
    num_nodes, edges_per_relation, num_etypes = POLICY_GRAPHS[graph]
    src, dst, etype = skewed_graph(num_nodes, edges_per_relation, num_etypes, seed=len(graph))
    compact = policy_argument(policy, num_etypes, seed=7)
    expected = hr.reference_preprocess(src, dst, etype, num_nodes, num_etypes, None, NO_NTYPE_LAYOUTS, gemm_tile=4,
                                       compact_relations=compact)
    for dtype in (torch.int32, torch.int64):
        cuda = [t.to(device="cuda", dtype=dtype) for t in (src, dst, etype)]
        actual = run_cuda(ext, *cuda, num_nodes, num_etypes, None, NO_NTYPE_LAYOUTS, gemm_tile=4,
                          compact_threshold=compact if isinstance(compact, float) else -1.0,
                          compact_mask=torch.tensor(compact) if isinstance(compact, list) else None)
        assert_same(actual, expected, f"{graph} {policy} {dtype}")


@needs_cuda
def test_cuda_mask_matches_hand_computed_layouts(ext):
    src, dst, etype, _ = hand_graph("cuda", torch.int32)
    for mask in (torch.tensor(HAND_MASK), torch.tensor(HAND_MASK, device="cuda")):  # a CPU mask is copied over
        out = run_cuda(ext, src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_mask=mask)
        assert all(t.is_cuda for t in out.values())
        assert_same(out, hand_expected_masked(), f"mask on {mask.device}")
    for theta, (src_choice, dst_choice) in HAND_THRESHOLDS.items():
        out = run_cuda(ext, src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_threshold=theta)
        assert out["src_relation_compacted"].tolist() == src_choice, theta
        assert out["dst_relation_compacted"].tolist() == dst_choice, theta


@needs_cuda
def test_cuda_policy_without_edges(ext):
    empty = torch.zeros(0, dtype=torch.int32, device="cuda")
    for compact, expected in ((0.0, [True, True]), ([False, True], [False, True])):
        out = hr.preprocess(empty, empty, empty, 6, 2, None, COMPACT_LAYOUTS, backend="cuda", compact_relations=compact)
        assert out["src_relation_compacted"].tolist() == expected and out["dst_relation_compacted"].tolist() == expected
        assert out["unique_src_relation_pairs"].tolist() == [0, 0] and out["unique_src_etype_ptr"].tolist() == [0, 0, 0]


@needs_cuda
def test_prepare_graph_on_cuda_with_a_policy(ext):
    src, dst, etype, ntype = hand_graph("cuda")
    g = hr.prepare_graph(src, dst, etype, 4, 3, layouts=COMPACT_LAYOUTS, backend="cuda", compact_relations=0.8)
    assert g.relation_edges == (2, 5, 0) and g.relation_unique_src == (2, 4, 0)
    assert g.compacted_relations == (False, True, True) and g.compacted_dst_relations == (False, True, True)
    masked = hr.prepare_graph(src, dst, etype, 4, 3, layouts=COMPACT_LAYOUTS, backend="cuda",
                              compact_relations=torch.tensor(HAND_MASK, device="cuda"))
    assert masked.num_unique_src == 7 and masked.compacted_relations == tuple(HAND_MASK)
    assert_same(masked.tensors(), hand_expected_masked(), "prepare_graph(mask)")


@needs_cuda
def test_cuda_checks_compact_arguments(ext):
    src, dst, etype, _ = hand_graph("cuda")
    with pytest.raises(RuntimeError, match="not both"):
        run_cuda(ext, src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_threshold=0.5,
                 compact_mask=torch.ones(3, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="got NaN"):
        run_cuda(ext, src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_threshold=float("nan"))
    with pytest.raises(RuntimeError, match="compact_mask must be a bool tensor"):
        run_cuda(ext, src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_mask=torch.ones(3, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"compact_mask must have shape \[3\]"):
        run_cuda(ext, src, dst, etype, 4, 3, None, COMPACT_LAYOUTS, compact_mask=torch.ones(4, dtype=torch.bool))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
