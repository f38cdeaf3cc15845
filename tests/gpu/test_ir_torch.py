"""CPU checks of the generic plain-PyTorch reference (ir_torch.py) against hectorgen's float64 interpreter.

For every bundled spec (specs/), GPU-check variant (tests/gpu/specs/), item-8 model class (tests/specs/) and
evaluator test case (tests/gpu/ir_cases/), on the tiny graph and a random small graph, with fresh random
inputs every run (the seed is printed; HG_TEST_SEED=<n> repeats a run):

* forward: ir_torch == `hectorgen SPEC --reference` to 1e-12 (relative, floored at the float32 rounding
  noise of the same computation scaled to float64, see compare.floored_rel_err);
* gradients: torch autograd through ir_torch == the interpreter running autodiff's backward program on
  the same output gradients (`--reference` with "output_grads"); a model without a backward pass is
  skipped with the compiler's reason; known autodiff bugs are strict xfails (they fail once fixed);
* ir_torch's own gradients == central finite differences of its forward (a check of the oracle itself);
* the printed forward IR after fuse-loops (`--emit=inter-ir`) evaluates to the same outputs as the spec,
  and the printed backward IR of models that save nothing evaluates to the autograd gradients;
* programs whose result depends on the loop order are rejected (OrderDependent), never evaluated.

CI: run by CTest (tests/gpu/run_cpu_tests.sh) when torch, pytest and PyYAML are importable, else skipped.
Needs the hectorgen binary: $HECTORGEN, else build/hectorgen (tests that need it are skipped without it).
"""
from __future__ import annotations

import os
import random
import subprocess
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("yaml")

import ir_torch  # noqa: E402
import reference_bridge as rb  # noqa: E402
from compare import EPS_RATIO, floored_rel_err  # noqa: E402
from graphs import synthetic_graph, tiny_graph  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("HECTORGEN", REPO / "build" / "hectorgen"))
needs_bin = pytest.mark.skipif(not os.access(BIN, os.X_OK), reason=f"{BIN} not built (set $HECTORGEN)")
SEED = int(os.environ.get("HG_TEST_SEED", random.SystemRandom().randrange(1 << 30)))
TOL64 = 1e-12

SPECS = sorted(str(p.relative_to(REPO)) for pat in ("specs/*.yaml", "specs/*.json", "tests/gpu/specs/*.yaml",
                                                     "tests/specs/*.yaml") for p in REPO.glob(pat))
CASES = sorted(str(p.relative_to(REPO)) for p in REPO.glob("tests/gpu/ir_cases/*.yaml"))

# Gradients of the interpreter's backward that are wrong today (autodiff bugs), with the reason. Strict:
# once autodiff is fixed the test XPASSes and fails, so the entry is removed.
# (outgoing_heads.yaml and ad_output_updated.yaml were here: outputs updated after their aggregation or read
# later lost gradient. Fixed: every value of a field is a version of its own, and an output read after its last
# write adds that gradient to the incoming one.)
AUTODIFF_BUGS: dict[str, str] = {}


def known_bugs(paths):
    return [pytest.param(p, marks=pytest.mark.xfail(reason=AUTODIFF_BUGS[p], strict=True)) if p in AUTODIFF_BUGS
            else p for p in paths]


def graphs():
    """The tiny graph and a random small one (Zipf type sizes, hubs, parallel edges, isolated nodes)."""
    return [tiny_graph(), synthetic_graph(40, 3, 300, 4, seed=SEED % 1000, name="small40")]


def _noise32(model, graph, inputs, out_grads=None):
    """Per tensor: ||float32 result - float64 result|| of ir_torch itself, scaled to float64."""
    if out_grads is None:
        o64 = ir_torch.evaluate(model, graph, inputs)
        o32 = ir_torch.evaluate(model, graph, inputs, dtype=torch.float32)
        return {k: float(torch.linalg.vector_norm(o32[k].double() - o64[k])) * EPS_RATIO for k in o64}
    _, g64 = ir_torch.forward_backward(model, graph, inputs, out_grads)
    _, g32 = ir_torch.forward_backward(model, graph, inputs, out_grads, dtype=torch.float32)
    return {k: float(torch.linalg.vector_norm(g32[k].double() - g64[k])) * EPS_RATIO for k in g64}


def _assert_close(got: dict, ref: dict, noise: dict, what: str, tol=TOL64):
    assert sorted(got) == sorted(ref), f"{what}: tensors {sorted(got)} vs {sorted(ref)}"
    bad = []
    for k in ref:
        err, _ = floored_rel_err(got[k], ref[k], tol, noise.get(k, 0.0))
        if not err <= tol:
            bad.append(f"{k}: {err:.3e}")
    assert not bad, f"{what} (seed {SEED}): {', '.join(bad)} > {tol:.0e}"


@needs_bin
@pytest.mark.parametrize("path", SPECS + CASES)
def test_forward_matches_interpreter(path):
    model = ir_torch.load_model(REPO / path)
    for i, g in enumerate(graphs()):
        inputs = ir_torch.random_inputs(model, g, SEED + i)
        ref = rb.cpu_reference(BIN, REPO / path, g, inputs)
        got = ir_torch.evaluate(model, g, inputs)
        _assert_close(got, ref, _noise32(model, g, inputs), f"{path} on {g.name}: forward")


@needs_bin
@pytest.mark.parametrize("path", known_bugs(SPECS + CASES))
def test_gradients_match_interpreter(path):
    model = ir_torch.load_model(REPO / path)
    for i, g in enumerate(graphs()):
        inputs = ir_torch.random_inputs(model, g, SEED + i)
        d_out = ir_torch.random_output_grads(model, g, SEED + i)
        try:
            ref_out, ref_grads = rb.cpu_reference_grads(BIN, REPO / path, g, inputs, d_out)
        except rb.ReferenceError as e:
            if "no backward pass" in str(e):
                pytest.skip(str(e).strip().splitlines()[-1])
            raise
        out, grads = ir_torch.forward_backward(model, g, inputs, d_out)
        _assert_close(out, ref_out, _noise32(model, g, inputs), f"{path} on {g.name}: forward")
        _assert_close(grads, ref_grads, _noise32(model, g, inputs, d_out), f"{path} on {g.name}: gradients")


@pytest.mark.parametrize("path", SPECS + CASES)
def test_gradients_match_finite_differences(path):
    """<grad, v> == (L(x + hv) - L(x - hv)) / 2h for a random direction v over every input and weight."""
    model = ir_torch.load_model(REPO / path)
    g = tiny_graph()
    inputs = ir_torch.random_inputs(model, g, SEED)
    d_out = ir_torch.random_output_grads(model, g, SEED)
    _, grads = ir_torch.forward_backward(model, g, inputs, d_out)
    gen = torch.Generator().manual_seed(SEED)
    v = {k: torch.randn(inputs[k].shape, generator=gen, dtype=torch.float64) for k in grads}

    def loss(h):
        x = {k: t + h * v[k] if k in v else t for k, t in inputs.items()}
        out = ir_torch.evaluate(model, g, x)
        return sum(float((out[k] * d_out[k]).sum()) for k in d_out)

    h = 1e-6
    fd = (loss(h) - loss(-h)) / (2 * h)
    analytic = sum(float((grads[k] * v[k]).sum()) for k in grads)
    scale = max(abs(analytic), sum(float(grads[k].abs().mul(v[k].abs()).sum()) for k in grads) * 1e-3, 1e-12)
    assert abs(fd - analytic) <= 1e-6 * scale, f"{path} (seed {SEED}): finite differences {fd} vs autograd {analytic}"


def _emit_ir(path, tmp_path) -> Path:
    out = tmp_path / "ir"
    p = subprocess.run([str(BIN), str(REPO / path), "--emit=inter-ir", "-o", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out


def _skip_pair_loops(ir_path: Path) -> None:
    """ir_torch evaluates the DSL's loops; compact materialization's printed IR has the compiler's pair loops
    (`g.src_etype_pairs()`, `e.pair[...]`), which the float64 interpreter checks instead (the unit tests [compact]:
    outputs and gradients before and after the pass, and the lowered kernels) and the GPU check runs."""
    if "src_etype_pairs()" in ir_path.read_text():
        pytest.skip("pair loops of compact materialization: checked by the interpreter tests and the GPU check")


@needs_bin
@pytest.mark.parametrize("path", SPECS + CASES)
def test_printed_forward_ir_matches_spec(path, tmp_path):
    """The forward IR after fuse-loops (what the kernels are generated from) computes what the spec does."""
    model = ir_torch.load_model(REPO / path)
    ir_path = _emit_ir(path, tmp_path) / f"{model.name}.inter.ir"
    _skip_pair_loops(ir_path)
    ir = ir_torch.load_model(ir_path)
    for i, g in enumerate(graphs()):
        inputs = ir_torch.random_inputs(model, g, SEED + i)
        _assert_close(ir_torch.evaluate(ir, g, inputs), ir_torch.evaluate(model, g, inputs),
                      _noise32(model, g, inputs), f"{path} on {g.name}: printed IR vs spec")


@needs_bin
@pytest.mark.parametrize("path", known_bugs(SPECS + CASES))
def test_printed_backward_ir_matches_autograd(path, tmp_path):
    """For models whose backward saves nothing: the printed backward IR (weight-gradient outputs, linear_t,
    outer, sum) evaluates to torch autograd's gradients. Others need the training forward's saved fields."""
    model = ir_torch.load_model(REPO / path)
    bw_path = _emit_ir(path, tmp_path) / f"{model.name}.backward.inter.ir"
    if not bw_path.exists():
        pytest.skip("no backward pass")
    _skip_pair_loops(bw_path)
    bw = ir_torch.load_model(bw_path)
    known = {d.name for d in model.inputs} | {ir_torch.grad_name(o.name) for o in model.outputs}
    saved = [d.name for d in bw.inputs if d.name not in known]
    if saved:
        pytest.skip(f"the backward reads saved forward fields {saved}")
    grad_of = {ir_torch.grad_name(n): n for n in ir_torch.grad_names(model)}
    assert sorted(o.name for o in bw.outputs) == sorted(grad_of), "backward outputs"
    g = graphs()[1]
    inputs = ir_torch.random_inputs(model, g, SEED)
    d_out = ir_torch.random_output_grads(model, g, SEED)
    _, grads = ir_torch.forward_backward(model, g, inputs, d_out)
    got = ir_torch.evaluate(bw, g, {**inputs, **{ir_torch.grad_name(k): t for k, t in d_out.items()}})
    _assert_close({grad_of[k]: t for k, t in got.items()}, grads, _noise32(model, g, inputs, d_out),
                  f"{path}: printed backward IR vs autograd")


ORDER_DEPENDENT = {
    "cross-node aggregation read in the same node loop": """
        for n in g.dst_nodes():
            for e in n.incoming_edges():
                e.src["s"] += n.x
            n["y"] = n["s"] * 2.0
    """,
    "own field read through e.src in the node loop that sets it": """
        for n in g.dst_nodes():
            n["s"] = n.x
            for e in n.incoming_edges():
                n["y"] += e.src["s"]
    """,
    "node field read in the edge loop that aggregates it": """
        for e in g.edges():
            t = e.dst["s"]
            e.dst["s"] += e.src.x + t
    """,
    "edge field shared by incoming and outgoing loops of one node loop": """
        for n in g.dst_nodes():
            for e in n.incoming_edges():
                e["m"] = n.x
            for e in n.outgoing_edges():
                n["y"] += e["m"]
    """,
    "a node-loop local updated in its edge loop": """
        for n in g.dst_nodes():
            t = n.x
            for e in n.incoming_edges():
                t += e.src.x
                n["y"] += t
    """,
}


def _model_text(program: str, extra_out: str = "") -> str:
    body = textwrap.indent(textwrap.dedent(program).strip("\n"), "")
    return ("model t\nhyper d = 3\ninput x: node[d]\noutput y: node[d]\n" + extra_out + "program:\n" + body + "\n")


@pytest.mark.parametrize("name", sorted(ORDER_DEPENDENT))
def test_order_dependent_programs_are_rejected(name):
    with pytest.raises(ir_torch.OrderDependent):
        m = ir_torch.model_from_ir_text(_model_text(ORDER_DEPENDENT[name]))
        ir_torch.evaluate(m, tiny_graph(), {"x": torch.randn(5, 3, dtype=torch.float64)})


def test_order_independent_scatters_are_accepted():
    """Sums into the same node from several loops commute; they are evaluated, not rejected."""
    m = ir_torch.model_from_ir_text(_model_text("""
        for n in g.dst_nodes():
            n["y"] += n.x
            for e in n.incoming_edges():
                e.src["y"] += e.dst.x
    """))
    g = tiny_graph()
    x = torch.randn(5, 3, dtype=torch.float64)
    y = ir_torch.evaluate(m, g, {"x": x})["y"]
    want = x.clone()
    for s, d in zip(g.src.tolist(), g.dst.tolist()):
        want[s] += x[d]
    assert torch.allclose(y, want, rtol=0, atol=1e-14)


def test_random_inputs_are_fresh_and_fp32_exact():
    m = ir_torch.load_model(REPO / "specs/hgt.yaml")
    g = tiny_graph()
    a, b = ir_torch.random_inputs(m, g, 1), ir_torch.random_inputs(m, g, 2)
    assert sorted(a) == ["W_a", "W_att", "W_k", "W_msg", "W_q", "W_v", "feature", "mu"]
    assert all(not torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(t, t.float().double()) for t in a.values())
    assert a["W_att"].shape == (2, 1, 64, 64) and a["W_k"].shape == (2, 64, 64)


@pytest.mark.parametrize("path", SPECS + CASES)
def test_spec_reader_without_pyyaml(path, monkeypatch):
    """A GPU machine may lack PyYAML: the fallback reader gives the same model."""
    a = ir_torch.load_model(REPO / path)
    monkeypatch.setitem(__import__("sys").modules, "yaml", None)  # `import yaml` raises ImportError
    b = ir_torch.load_model(REPO / path)
    import ast
    assert [ast.dump(s) for s in a.body] == [ast.dump(s) for s in b.body]
    assert (a.name, a.hyper, a.inputs, a.weights, a.outputs) == (b.name, b.hyper, b.inputs, b.weights, b.outputs)
