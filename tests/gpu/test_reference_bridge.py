"""Checks of reference_bridge: the float64 CPU interpreter (through `hectorgen --reference`) agrees with
the plain-PyTorch references, and the spec reader / hyper-parameter override behave. CPU only.
Skipped without torch or without a built hectorgen binary ($HECTORGEN or build/hectorgen)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import reference_bridge as rb  # noqa: E402
from compare import fresh_inputs, rel_err  # noqa: E402
from graphs import synthetic_graph, tiny_graph  # noqa: E402
from reference_models import hgt_ref, rgat_ref, rgcn_ref  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("HECTORGEN", REPO / "build" / "hectorgen"))
needs_bin = pytest.mark.skipif(not os.access(BIN, os.X_OK), reason=f"{BIN} not built")
F64 = torch.float64
SPECS = {"rgcn": "specs/rgcn.yaml", "rgat": "specs/rgat.yaml", "rgat4": "tests/gpu/specs/rgat4.yaml",
         "hgt": "specs/hgt.yaml"}
HGT_NAMES = ("feature", "W_k", "W_q", "W_v", "W_att", "W_msg", "mu", "W_a")


def _family(name):
    return "rgat" if name.startswith("rgat") else name


def _torch_ref(fam, g, inp, heads, slope=0.2):
    if fam == "rgcn":
        return rgcn_ref(g, inp["feature"], inp["W0"], inp["W"])
    if fam == "rgat":
        return rgat_ref(g, inp["feature"], inp["W"], inp["w_s"], inp["w_t"], heads, slope)
    return hgt_ref(g, *[inp[k] for k in HGT_NAMES], heads=heads)


def test_spec_reader():
    s = rb.load_spec(REPO / "specs/hgt.yaml", {"heads": 4})
    assert s.model == "hgt" and s.hyper["d_k"] == 16 and isinstance(s.hyper["d_k"], int)
    assert s.decl("W_att").shape == (4, 16, 16) and s.decl("W_att").per == "etype"
    assert s.decl("h").full_shape(5, 7, 2, 3) == (5, 64)
    r = rb.load_spec(REPO / "specs/rgcn.yaml")
    assert r.decl("norm").from_graph == "inv_relation_in_degree" and r.decl("W0").full_shape(5, 7, 2, 3) == (64, 64)
    a = rb.load_spec(REPO / SPECS["rgat4"])
    assert a.model == "rgat4" and a.decl("W").shape == (64, 64) and a.decl("h").shape == (4, 16)


@pytest.mark.parametrize("path", sorted(SPECS.values()))
def test_mini_yaml_matches_pyyaml(path):
    yaml = pytest.importorskip("yaml")
    text = (REPO / path).read_text()
    mini, full = rb._mini_yaml(text), yaml.safe_load(text)
    for key in ("model", "hyper", "inputs", "weights", "outputs"):
        assert mini[key] == full[key], key


def test_spec_with_hyper_edits_only_hyper(tmp_path):
    src = REPO / "specs/rgat.yaml"
    out = rb.spec_with_hyper(src, {"heads": 2, "out_dim": 8}, tmp_path / "x.yaml")
    a, b = src.read_text().splitlines(), out.read_text().splitlines()
    changed = [(x, y) for x, y in zip(a, b) if x != y]
    assert len(a) == len(b) and sorted(y.strip() for _, y in changed) == ["heads: 2", "out_dim: 8"]


@needs_bin
@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("graph", ["tiny", "small_random"])
def test_interpreter_matches_torch_reference(name, graph):
    g = tiny_graph() if graph == "tiny" else synthetic_graph(40, 3, 200, 5, seed=1)
    spec = rb.load_spec(REPO / SPECS[name])
    h = spec.hyper
    inp = fresh_inputs(_family(name), g, (h["in_dim"], h["out_dim"]), heads=h.get("heads", 1), seed=3,
                       dtype=torch.float32)  # float32 values: the bridge converts them exactly
    tensors = {k: v for k, v in inp.items() if k != "norm"}  # the interpreter derives norm itself
    out = rb.cpu_reference(BIN, REPO / SPECS[name], g, tensors)
    ref = _torch_ref(_family(name), g, {k: v.to(F64) for k, v in inp.items()}, h.get("heads", 1))
    assert out["h"].dtype == F64 and tuple(out["h"].shape) == tuple(ref.shape)
    assert rel_err(out["h"], ref) < 1e-12


@needs_bin
def test_hyper_overrides_and_errors(tmp_path):
    g = synthetic_graph(30, 2, 120, 3, seed=4)
    inp = fresh_inputs("hgt", g, (8, 16), heads=4, seed=5, dtype=F64)
    out = rb.cpu_reference(BIN, REPO / "specs/hgt.yaml", g, inp, {"in_dim": 8, "out_dim": 16, "heads": 4},
                           keep_dir=tmp_path / "ref")
    assert rel_err(out["h"], _torch_ref("hgt", g, inp, 4)) < 1e-12
    assert (tmp_path / "ref" / "meta.json").is_file() and (tmp_path / "ref" / "out" / "h.f64").is_file()
    with pytest.raises(ValueError, match="feature.*spec wants"):
        rb.cpu_reference(BIN, REPO / "specs/hgt.yaml", g, inp)  # dims 64 expected, 8/16 given
    with pytest.raises(ValueError, match="missing tensor 'mu'"):
        rb.cpu_reference(BIN, REPO / "specs/hgt.yaml", g, {k: v for k, v in inp.items() if k != "mu"},
                         {"in_dim": 8, "out_dim": 16, "heads": 4})
