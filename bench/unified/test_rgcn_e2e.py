"""CPU tests of the RGCN end-to-end benchmark's pieces (bench/unified/rgcn_e2e.py): the typed sampler
(minibatch.sample_batch with edge types), the blocks as graphs, the two-layer model's wiring (on a plain-PyTorch
stand-in for the generated layers), the loss comparison, the arguments, and, given hectorgen, the generation of both
layers.

Run with pytest, or as a script (CTest `bench_unified_rgcn_cpu`): `python3 bench/unified/test_rgcn_e2e.py
[HECTORGEN]` (default $HECTORGEN, else build/hectorgen; the generation test skips without one), which exits 77
(skipped) without torch or pytest.
"""

import importlib.util
import os
import pathlib
import sys
import types

if __name__ == "__main__":
    _missing = [name for name in ("pytest", "torch") if importlib.util.find_spec(name) is None]
    if _missing:
        print(f"bench_unified_rgcn_cpu: SKIPPED: needs python3 with {' and '.join(_missing)}")
        sys.exit(77)

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import minibatch  # noqa: E402
import rgcn_e2e  # noqa: E402

R = 3


def typed_graph(nodes=400, degree=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    row_ptr, col = minibatch.random_csr(nodes, degree, gen, "cpu")
    return row_ptr, col, torch.randint(0, R, (col.numel(),), generator=gen)


def sample(seeds=(5, 1, 77, 300), fanouts=(25, 10), seed=2):
    row_ptr, col, etype = typed_graph()
    batch = minibatch.sample_batch(row_ptr, col, torch.tensor(seeds), list(fanouts),
                                   torch.Generator().manual_seed(seed), etype)
    return (row_ptr, col, etype), batch


def test_typed_sample_keeps_each_edges_type():
    (row_ptr, col, etype), (ids, blocks, num_hop1) = sample()
    targets = [ids[:4], ids[:num_hop1]]  # block 0: seeds <- hop-1 nodes; block 1: hop-1 nodes <- input nodes
    for (local, kinds), dst, fanout in zip(blocks, targets, (25, 10)):
        assert local.shape == kinds.shape == (dst.numel(), fanout)
        for target, neighbours, edge_types in zip(dst.tolist(), ids[local].tolist(), kinds.tolist()):
            begin, end = int(row_ptr[target]), int(row_ptr[target + 1])
            edges = set(zip(col[begin:end].tolist(), etype[begin:end].tolist()))
            assert set(zip(neighbours, edge_types)) <= edges  # (neighbour, type) is one of the target's in-edges
    assert int(blocks[0][0].max()) < num_hop1 and int(blocks[1][0].max()) < ids.numel()


def test_typed_sample_is_the_untyped_sample_plus_types():
    (row_ptr, col, _), (ids, blocks, num_hop1) = sample()
    plain_ids, plain_blocks, plain_hop1 = minibatch.sample_batch(row_ptr, col, torch.tensor([5, 1, 77, 300]),
                                                                 [25, 10], torch.Generator().manual_seed(2))
    assert torch.equal(ids, plain_ids) and num_hop1 == plain_hop1
    assert all(torch.equal(local, plain) for (local, _), plain in zip(blocks, plain_blocks))


def test_block_edges():
    local = torch.tensor([[4, 2], [0, 4], [1, 1]])
    kinds = torch.tensor([[0, 1], [2, 2], [1, 1]])
    src, dst, etype = rgcn_e2e.block_edges(local, kinds)
    assert src.tolist() == [4, 2, 0, 4, 1, 1]
    assert dst.tolist() == [0, 0, 1, 1, 2, 2]
    assert etype.tolist() == [0, 1, 2, 2, 1, 1]


# A plain-PyTorch stand-in for a generated RGCN module: prepare_graph and the layer class (named as the generator names
# it: Rgcn_e2e_inner for model rgcn_e2e_inner) with the generated signatures
# (layer(g, feature, feature_rows) for the indexed inner layer, layer(g, feature) for the outer one).


def stand_in(in_dim, out_dim, indexed, model):
    def prepare_graph(src, dst, etype, num_nodes, num_etypes):
        assert int(dst.max()) < num_nodes and int(src.max()) < num_nodes
        counts = torch.zeros(num_nodes, num_etypes).index_put_((dst, etype), torch.ones(dst.numel()), accumulate=True)
        return types.SimpleNamespace(src=src, dst=dst, etype=etype, norm=1.0 / counts[dst, etype],
                                     num_nodes=num_nodes, num_edges=src.numel())

    class Rgcn(torch.nn.Module):
        def __init__(self, num_etypes):
            super().__init__()
            self.W0 = torch.nn.Parameter(torch.randn(in_dim, out_dim) / in_dim ** 0.5)
            self.W = torch.nn.Parameter(torch.randn(num_etypes, in_dim, out_dim) / in_dim ** 0.5)

        def forward(self, g, feature, *rows):
            assert bool(rows) == indexed
            x = feature[rows[0].long()] if indexed else feature
            assert x.shape[0] == g.num_nodes
            msg = torch.bmm(x[g.src].unsqueeze(1), self.W[g.etype]).squeeze(1) * g.norm[:, None]
            return x @ self.W0 + torch.zeros(g.num_nodes, self.W0.shape[1]).index_add(0, g.dst, msg)

    return types.SimpleNamespace(prepare_graph=prepare_graph, **{model[0].upper() + model[1:]: Rgcn})


def test_model_reads_the_sampled_neighbourhood_through_the_row_map():
    torch.manual_seed(0)
    _, typed = sample()
    ids, blocks, num_hop1 = typed
    inner = stand_in(8, 16, indexed=True, model=rgcn_e2e.INNER)
    outer = stand_in(16, 4, indexed=False, model=rgcn_e2e.OUTER)
    batch = rgcn_e2e.prepare_batch(typed, inner, outer, R)
    assert batch.graphs[0].num_nodes == num_hop1 and batch.graphs[1].num_nodes == ids.numel()
    model = rgcn_e2e.Rgcn(inner, outer, R)
    table = torch.randn(400, 8)
    logits = model(table, ids, batch)  # unified mode: the table and the sampled rows
    assert logits.shape == (num_hop1, 4)
    staged = model(table[ids], torch.arange(ids.numel(), dtype=torch.int32), batch)  # the gather modes
    assert torch.equal(logits, staged)
    # Seed 0's output reads exactly the table rows of its sampled two-hop neighbourhood.
    (local1, _), (local2, _) = blocks
    hop1 = {0} | set(local1[0].tolist())
    reached = {int(ids[r]) for r in hop1 | {int(r) for h in hop1 for r in local2[h]}}
    unread = sorted(set(ids.tolist()) - reached)
    assert unread  # the other seeds reach rows that seed 0 does not
    for row, changes in ((sorted(reached)[-1], True), (unread[0], False)):
        moved = table.clone()
        moved[row] += 10.0
        assert (not torch.allclose(model(moved, ids, batch)[0], logits[0])) == changes, row


def test_compare_losses():
    a = torch.tensor([3.5, 3.25, 3.0])
    assert rgcn_e2e.compare_losses({"pytorch": a, "unified": a.clone()}) == {
        "reference_mode": "pytorch", "bit_identical": True, "max_abs_difference": 0.0, "within_tolerance": True}
    near = rgcn_e2e.compare_losses({"pytorch": a, "unified": a + torch.tensor([0.0, 0.0, 2e-6])})
    assert not near["bit_identical"] and near["within_tolerance"] and 1e-6 < near["max_abs_difference"] < 3e-6
    far = rgcn_e2e.compare_losses({"pytorch": a, "unified": a, "gather": a + 0.01})
    assert not far["within_tolerance"] and abs(far["max_abs_difference"] - 0.01) < 1e-6


def test_arguments():
    args = rgcn_e2e.parse_args([])
    assert (args.nodes, args.batches, args.fanouts, args.modes) == (10_000_000, 200, [25, 10], list(rgcn_e2e.MODES))
    quick = rgcn_e2e.parse_args(["--quick", "--batches", "5"])
    assert (quick.nodes, quick.batches) == (200_000, 5)  # --quick sizes only what is not given
    for bad in (["--modes", "pytorch,direct"], ["--fanouts", "25"], ["--fanouts", "25,x"], ["--fanouts", "25,0"],
                ["--relations", "0"], ["--nodes", "1000"]):  # 1000 nodes: too few for 200 batches of 1024 seeds
        with pytest.raises(SystemExit):
            rgcn_e2e.parse_args(bad)


def hectorgen():
    path = os.environ.get("HECTORGEN") or str(rgcn_e2e.ROOT / "build" / "hectorgen")
    return path if os.access(path, os.X_OK) else None


@pytest.mark.skipif(hectorgen() is None, reason="needs hectorgen ($HECTORGEN or build/hectorgen)")
def test_layers_generate(tmp_path):
    spec = rgcn_e2e.layer_spec(rgcn_e2e.INNER, 64, 128, "vanilla", "tf32")
    folder = rgcn_e2e.generate(hectorgen(), spec, rgcn_e2e.INNER_FLAGS, tmp_path)
    code = (folder / f"{rgcn_e2e.INNER}.py").read_text()
    assert 'HYPER = {"in_dim": 64, "out_dim": 128}' in code
    assert "def forward(g, feature, feature_rows, W0, W):" in code  # the inner layer reads through a row map
    assert f"torch.ops.hectorgen_{rgcn_e2e.INNER}.forward_train" in code
    assert "\nclass Rgcn_e2e_inner(torch.nn.Module):" in code  # the class rgcn_e2e.layer_class looks up
    assert rgcn_e2e.layer_class(types.SimpleNamespace(Rgcn_e2e_inner=int), rgcn_e2e.INNER) is int
    assert "Tensor cores (tf32" in (folder / f"{rgcn_e2e.INNER}_kernels.cu").read_text()
    (folder / "build").mkdir()  # stands for a built extension: an unchanged output must keep it
    assert rgcn_e2e.generate(hectorgen(), spec, rgcn_e2e.INNER_FLAGS, tmp_path) == folder
    assert (folder / "build").is_dir()
    outer = rgcn_e2e.generate(hectorgen(), rgcn_e2e.layer_spec(rgcn_e2e.OUTER, 128, 4, "compact", "fp32"), (), tmp_path)
    code = (outer / f"{rgcn_e2e.OUTER}.py").read_text()
    assert 'HYPER = {"in_dim": 128, "out_dim": 4}' in code and "def forward(g, feature, W0, W):" in code
    assert not (tmp_path / f"{rgcn_e2e.INNER}.new").exists()
    changed = rgcn_e2e.layer_spec(rgcn_e2e.INNER, 64, 128, "vanilla", "fp32")
    rgcn_e2e.generate(hectorgen(), changed, rgcn_e2e.INNER_FLAGS, tmp_path)
    assert not (folder / "build").exists()  # a changed output replaces the folder


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.environ["HECTORGEN"] = sys.argv.pop(1)
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
