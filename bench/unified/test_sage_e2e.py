"""CPU tests of the end-to-end benchmark's pieces: the random CSR graph, the neighbour sampler and the relabelling
(bench/unified/minibatch.py) and the GraphSAGE model (sage_e2e.py), which run on the GPU in the benchmark and on any
device here.

Run with pytest, or as a script (CTest `bench_unified_cpu`): `python3 bench/unified/test_sage_e2e.py`, which exits
77 (skipped) without torch or pytest.
"""

import importlib.util
import pathlib
import sys

if __name__ == "__main__":
    _missing = [name for name in ("pytest", "torch") if importlib.util.find_spec(name) is None]
    if _missing:
        print(f"bench_unified_cpu: SKIPPED: needs python3 with {' and '.join(_missing)}")
        sys.exit(77)

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import minibatch  # noqa: E402
import sage_e2e  # noqa: E402


def graph(nodes=500, degree=6, seed=0):
    return minibatch.random_csr(nodes, degree, torch.Generator().manual_seed(seed), "cpu")


def test_random_csr_is_well_formed():
    row_ptr, col = graph()
    degree = row_ptr[1:] - row_ptr[:-1]
    assert row_ptr[0] == 0 and int(row_ptr[-1]) == col.numel()
    assert int(degree.min()) >= 1 and int(degree.max()) <= 11
    assert int(col.min()) >= 0 and int(col.max()) < 500


def test_sampled_neighbours_are_in_neighbours():
    row_ptr, col = graph()
    nodes = torch.tensor([0, 17, 499, 17])
    sampled = minibatch.sample_neighbours(row_ptr, col, nodes, 25, torch.Generator().manual_seed(1))
    assert sampled.shape == (4, 25)
    for node, row in zip(nodes.tolist(), sampled.tolist()):
        neighbours = set(col[row_ptr[node]:row_ptr[node + 1]].tolist())
        assert set(row) <= neighbours


def test_relabel_keeps_targets_first_and_maps_neighbours():
    targets = torch.tensor([9, 4, 7])
    neighbours = torch.tensor([[4, 100, 100], [9, 3, 7], [200, 3, 4]])
    nodes, local = minibatch.relabel(targets, neighbours)
    assert nodes[:3].tolist() == [9, 4, 7]
    assert sorted(nodes.tolist()) == [3, 4, 7, 9, 100, 200]  # each node once
    assert torch.equal(nodes[local], neighbours)


def test_two_hop_batch_and_model():
    row_ptr, col = graph()
    seeds = torch.tensor([1, 2, 3, 4, 5])
    ids, (local1, local2), num_hop1 = minibatch.sample_batch(row_ptr, col, seeds, [25, 10],
                                                            torch.Generator().manual_seed(2))
    assert torch.equal(ids[:5], seeds)
    assert local1.shape == (5, 25) and int(local1.max()) < num_hop1
    assert local2.shape == (num_hop1, 10) and int(local2.max()) < ids.numel()
    model = sage_e2e.Sage(8, 16, 3)
    x = torch.randn(ids.numel(), 8)
    logits = model(x, (local1, local2), num_hop1, seeds.numel())
    assert logits.shape == (5, 3)
    # Seed 1's output reads exactly the rows of its sampled two-hop neighbourhood.
    hop1 = {1} | set(local1[1].tolist())
    rows = hop1 | {int(r) for h in hop1 for r in local2[h]}
    outside = [r for r in range(ids.numel()) if r not in rows]
    assert outside  # five seeds with 25 and 10 neighbours each reach more rows than seed 1 alone
    for row, changes in ((sorted(rows)[-1], True), (outside[0], False)):
        x2 = x.clone()
        x2[row] += 10.0
        changed = not torch.allclose(model(x2, (local1, local2), num_hop1, 5)[1], logits[1])
        assert changed == changes, row


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
