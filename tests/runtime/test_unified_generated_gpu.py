"""GPU tests of generated kernels reading unified tensors (issue 10 item 3; docs/unified_tensor.md).

tests/specs/rgcn_unified.yaml is specs/rgcn.yaml with `feature: {..., placement: unified}`. The test generates it,
builds the hectorgen runtime and the extension, and checks on one GPU:

* the forward and the training step (weight gradients) with the features in unified memory (`to_unified`, a
  table pinned in place with `unified`, a `pin_memory()` tensor, a row slice of a larger unified table, the
  `cuda_view()`) are bit-identical to the same layer on a CUDA copy of the features, and match a float64 PyTorch
  RGCN;
* the host code refuses a plain (unpinned) CPU tensor, a wrong dtype and a wrong shape with clear errors.

    python3 tests/runtime/test_unified_generated_gpu.py      (about 3 minutes: the runtime and the extension build)

Environment: HECTORGEN (the compiler; default build/hectorgen, else build/hg_bundle/hectorgen with its libraries),
HECTORGEN_RUNTIME_PREFIX (an installed runtime to reuse), HECTORGEN_CUDA_ARCH (default: this GPU's). Skips
everything without a CUDA GPU.
"""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

from generated_build import generated_module  # noqa: E402  (after the skip: it imports torch)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPEC = ROOT / "tests" / "specs" / "rgcn_unified.yaml"

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def rgcn():
    """The generated rgcn module of rgcn_unified.yaml, built, and the hectorgen_runtime package it imports."""
    yield from generated_module(SPEC, "rgcn", "rgcn_unified")


N, E, R, DIM = 3000, 20000, 4, 64


@pytest.fixture(scope="module")
def case(rgcn):
    module, _ = rgcn
    gen = torch.Generator().manual_seed(7)
    src = torch.randint(0, N, (E,), generator=gen)
    dst = torch.randint(0, N, (E,), generator=gen)
    etype = torch.randint(0, R, (E,), generator=gen)
    g = module.prepare_graph(src.cuda(), dst.cuda(), etype.cuda(), N, R)
    torch.manual_seed(1)
    layer = module.Rgcn(R).cuda()
    x = torch.randn(N, DIM, generator=gen)
    return g, layer, x, (src, dst, etype)


def reference(layer, x, src, dst, etype):
    """RGCN in float64 on the CPU: h_v = x_v W0 + sum over edges u->v of norm_e x_u W_etype(e)."""
    x = x.double()
    w0, w = layer.W0.detach().double().cpu(), layer.W.detach().double().cpu()
    counts = torch.zeros(N, R, dtype=torch.float64).index_put_((dst, etype), torch.ones(E, dtype=torch.float64),
                                                               accumulate=True)
    norm = 1.0 / counts[dst, etype]
    msg = torch.bmm(x[src].unsqueeze(1), w[etype]).squeeze(1) * norm.unsqueeze(1)
    return x @ w0 + torch.zeros(N, DIM, dtype=torch.float64).index_add_(0, dst, msg)


def unified_forms(hr, x):
    """The ways of handing the layer features in host memory, each with the data it holds."""
    table = hr.to_unified(torch.cat([torch.randn(5, DIM), x, torch.randn(7, DIM)]))
    return {
        "to_unified": hr.to_unified(x),
        "pinned in place": hr.unified(x.clone()),
        "pin_memory": x.pin_memory(),
        "row slice of a larger table": table[5:5 + N],
        "cuda_view": hr.to_unified(x).cuda_view(),
    }


def test_forward_matches(rgcn, case):
    """The inference forward of the fp32 rgcn scatters its edge rows with atomics (store=atomic in the intra IR), so
    two runs sum in different orders: equal to float32 rounding, not bit for bit (test_training_bit_exact covers the
    deterministic training forward)."""
    _, hr = rgcn
    g, layer, x, edges = case
    with torch.no_grad():
        expected = layer(g, x.cuda())
        torch.testing.assert_close(expected.double().cpu(), reference(layer, x, *edges), rtol=1e-4, atol=1e-4)
        for name, features in unified_forms(hr, x).items():
            assert features.device.type == ("cuda" if name == "cuda_view" else "cpu"), name
            out = layer(g, features)
            assert out.is_cuda
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, name=name: f"{name}: differs from the layer on a CUDA copy: {m}")


def test_training_bit_exact(rgcn, case):
    _, hr = rgcn
    g, layer, x, _ = case

    def step(features):
        layer.zero_grad()
        out = layer(g, features)
        (out * out).sum().backward()
        return out.detach(), layer.W0.grad.clone(), layer.W.grad.clone()

    expected = step(x.cuda())
    got = step(hr.to_unified(x))
    for a, b, what in zip(got, expected, ("output", "dW0", "dW")):
        assert torch.equal(a, b), f"{what} differs from the training step on a CUDA copy"


def test_errors(rgcn, case):
    _, hr = rgcn
    g, layer, x, _ = case
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="not pinned and mapped.*to_unified"):
            layer(g, x.clone())  # plain pageable CPU memory: the GPU cannot read it
        with pytest.raises(RuntimeError, match="must be Float"):
            layer(g, hr.to_unified(x.double()))
        with pytest.raises(RuntimeError, match=r"must have shape \[3000, 64\]"):
            layer(g, hr.to_unified(x[:-1]))
        if torch.cuda.device_count() > 1:
            with pytest.raises(RuntimeError, match="must be a unified tensor"):
                layer(g, x.to("cuda:1"))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s", *sys.argv[1:]]))
