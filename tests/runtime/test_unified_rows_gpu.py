"""GPU tests of generated kernels reading node features through a node-to-row map (rows: indexed; docs/unified_tensor.md).

tests/specs/rgcn_unified_rows.yaml is specs/rgcn.yaml with `feature: {..., placement: unified, rows: indexed}`: the
layer takes a table of any number of rows (in unified memory, or on the GPU) and `feature_rows`, node v's row of
the table (int32 or int64, on the GPU). The test generates it, builds the hectorgen runtime and the extension, and
checks on one GPU, for a map like a sampled mini-batch's (scattered rows, some repeated, most of the table unread):

* the training step (output and weight gradients) on (unified table, rows) is bit-identical to the same step on
  table[rows] as a CUDA tensor, for int32 and int64 maps and for the table on the GPU; the inference forward
  agrees to float32 rounding (its edge rows are added with atomics) and matches a float64 RGCN;
* the errors: a map of the wrong dtype, device or shape, features that require grad, and with
  HECTORGEN_CHECK_ROWS=1 a map entry outside the table.

    python3 tests/runtime/test_unified_rows_gpu.py      (about 3 minutes: the runtime and the extension build)

Environment: HECTORGEN (the compiler; default build/hectorgen, else build/hg_bundle/hectorgen with its libraries),
HECTORGEN_RUNTIME_PREFIX (an installed runtime to reuse), HECTORGEN_CUDA_ARCH (default: this GPU's). Skips
everything without a CUDA GPU.
"""

import os
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

from generated_build import generated_module  # noqa: E402  (after the skip: it imports torch)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = ROOT / "tests" / "specs" / "rgcn_unified_rows.yaml"

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def rgcn():
    """The generated rgcn module of rgcn_unified_rows.yaml, built, and the hectorgen_runtime package it imports."""
    yield from generated_module(SPEC, "rgcn", "rgcn_unified_rows")


N, E, R, DIM, TABLE = 3000, 20000, 4, 64, 50000


@pytest.fixture(scope="module")
def case(rgcn):
    """A mini-batch of N nodes over a table of TABLE rows: the map picks scattered rows, some twice."""
    module, hr = rgcn
    gen = torch.Generator().manual_seed(7)
    src = torch.randint(0, N, (E,), generator=gen)
    dst = torch.randint(0, N, (E,), generator=gen)
    etype = torch.randint(0, R, (E,), generator=gen)
    g = module.prepare_graph(src.cuda(), dst.cuda(), etype.cuda(), N, R)
    torch.manual_seed(1)
    layer = module.Rgcn(R).cuda()
    table = torch.randn(TABLE, DIM, generator=gen)
    rows = torch.randint(0, TABLE, (N,), generator=gen)
    rows[1::97] = rows[0]  # repeated rows, as when sampled nodes share a feature row
    return g, layer, table, hr.to_unified(table), rows, (src, dst, etype)


def reference(layer, x, src, dst, etype):
    """RGCN in float64 on the CPU: h_v = x_v W0 + sum over edges u->v of norm_e x_u W_etype(e)."""
    x = x.double()
    w0, w = layer.W0.detach().double().cpu(), layer.W.detach().double().cpu()
    counts = torch.zeros(N, R, dtype=torch.float64).index_put_((dst, etype), torch.ones(E, dtype=torch.float64),
                                                               accumulate=True)
    norm = 1.0 / counts[dst, etype]
    msg = torch.bmm(x[src].unsqueeze(1), w[etype]).squeeze(1) * norm.unsqueeze(1)
    return x @ w0 + torch.zeros(N, DIM, dtype=torch.float64).index_add_(0, dst, msg)


def test_forward_matches(rgcn, case):
    g, layer, table, table_u, rows, edges = case
    with torch.no_grad():
        expected = layer(g, table[rows].cuda(), torch.arange(N, device="cuda"))  # the identity map on the rows
        torch.testing.assert_close(expected.double().cpu(), reference(layer, table[rows], *edges), rtol=1e-4, atol=1e-4)
        for name, (features, index) in {"unified, int64": (table_u, rows.cuda()),
                                        "unified, int32": (table_u, rows.int().cuda()),
                                        "cuda table": (table.cuda(), rows.cuda())}.items():
            out = layer(g, features, index)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, name=name: f"{name}: differs from the layer on table[rows]: {m}")


def test_training_bit_exact(rgcn, case):
    g, layer, table, table_u, rows, _ = case

    def step(features, index):
        layer.zero_grad()
        out = layer(g, features, index)
        (out * out).sum().backward()
        return out.detach(), layer.W0.grad.clone(), layer.W.grad.clone()

    expected = step(table[rows].cuda(), torch.arange(N, device="cuda"))
    for name, args in {"unified, int64": (table_u, rows.cuda()), "unified, int32": (table_u, rows.int().cuda()),
                       "cuda table": (table.cuda(), rows.cuda())}.items():
        got = step(*args)
        for a, b, what in zip(got, expected, ("output", "dW0", "dW")):
            assert torch.equal(a, b), f"{name}: {what} differs from the training step on table[rows]"


def test_errors(rgcn, case):
    _, hr = rgcn
    g, layer, table, table_u, rows, _ = case
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="feature_rows must be int32 or int64"):
            layer(g, table_u, rows.float().cuda())
        with pytest.raises(RuntimeError, match="feature_rows must be on cuda"):
            layer(g, table_u, rows)  # the map on the CPU
        with pytest.raises(RuntimeError, match=r"feature_rows must have shape \[3000\]"):
            layer(g, table_u, rows[:-1].cuda())
        with pytest.raises(RuntimeError, match=r"input 'feature' must have shape \[50000, 64\]"):
            layer(g, hr.to_unified(table[:, :-1].contiguous()), rows.cuda())  # a row too narrow
    with pytest.raises(ValueError, match="feature is read through feature_rows.*no gradient"):
        layer(g, table.cuda().requires_grad_(), rows.cuda())


@pytest.mark.skipif(os.environ.get("HECTORGEN_CHECK_ROWS") != "1",
                    reason="the range check is on with HECTORGEN_CHECK_ROWS=1 (read once per process)")
def test_range_check(rgcn, case):
    g, layer, _, table_u, rows, _ = case
    bad = rows.clone().cuda()
    bad[5] = TABLE
    with torch.no_grad(), pytest.raises(RuntimeError, match=r"feature_rows holds rows from \d+ to 50000, outside the table's \[0, 50000\)"):
        layer(g, table_u, bad)
    assert layer(g, table_u, rows.cuda()).is_cuda  # a good map still runs


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s", *sys.argv[1:]]))
