"""The GPU check's harness without a GPU: gpu_check.py --device cpu, where each "generated module" is a
stand-in computed by the PyTorch model of the spec (gpu_check.FakeModule). Checks that a correct module
passes, that a forward-only spec and a spec that does not generate are reported as such, that each kind of
defect (an unwritten row after poisoning, a wrong gradient, nondeterministic weight gradients, a forward-only
module that runs while parameters require grad) makes its row FAIL, and the sanitizer-log attribution.
Needs torch, PyYAML and the hectorgen binary ($HECTORGEN or build/hectorgen)."""
from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("yaml")

import gpu_check  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("HECTORGEN", REPO / "build" / "hectorgen"))
needs_bin = pytest.mark.skipif(not os.access(BIN, os.X_OK), reason=f"{BIN} not built (set $HECTORGEN)")
SCRIPT = str(REPO / "tests" / "gpu" / "gpu_check.py")
# A spec hectorgen rejects (model weight_row), for the harness's "generation failed" paths.
UNSUPPORTED = "tests/diagnostics/fail_weight_row_input.yaml"
# A forward-only spec: rgat_concat_outer (same model name, weights and shapes) with its attention passed through
# leakyrelu_grad, an operator without a derivative rule.
_UNTRAINABLE_DIR = Path(tempfile.mkdtemp(prefix="hectorgen-dry-"))
atexit.register(shutil.rmtree, _UNTRAINABLE_DIR, True)
UNTRAINABLE = _UNTRAINABLE_DIR / "rgat_concat_outer.yaml"
UNTRAINABLE.write_text((REPO / "tests" / "specs" / "rgat_concat_outer.yaml").read_text().replace("leakyrelu(", "leakyrelu_grad("))


def run(args, env_extra=None, check=False):
    env = {**os.environ, **(env_extra or {})}
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=600)
    if check:
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """rgcn (trainable), rgat_concat_outer (UNTRAINABLE: no backward, leakyrelu_grad), weight_row (does not
    generate: tests/diagnostics/fail_weight_row_input.yaml)."""
    root = tmp_path_factory.mktemp("dry")
    gen = root / "gen" / "generated"
    p = run(["--prepare", "rgcn", str(UNTRAINABLE), UNSUPPORTED, "--device", "cpu",
             "--hectorgen", str(BIN), "--generated", str(gen), "--out", str(root / "out")])
    return root, gen, p


def rows_by_check(out_dir):
    data = json.loads((out_dir / "gpu_check.json").read_text())
    return data, {(r["model"], r["graph"], r["check"]): r for r in data["rows"]}


@needs_bin
def test_dry_run_statuses(prepared):
    root, gen, prep = prepared
    assert prep.returncode == 1  # weight_row does not generate
    assert "forward-only (no backward)" in prep.stdout and "GENERATION FAILED" in prep.stdout
    status = json.loads((gen.parent / "generation.json").read_text())
    assert status["rgcn"]["ok"] and status["rgcn"]["no_backward"] is None
    assert "leakyrelu_grad" in status["rgat_concat_outer"]["no_backward"]
    assert not status["weight_row"]["ok"]
    out = root / "out"
    p = run(["rgcn", str(UNTRAINABLE), UNSUPPORTED, "--device", "cpu", "--hectorgen", str(BIN),
             "--generated", str(gen), "--out", str(out), "--graphs", "tiny,mini", "--timing-iters", "2",
             "--timing-warmup", "1", "--seed", "123"])
    assert p.returncode == 1, p.stdout[-3000:]
    data, rows = rows_by_check(out)
    ok = {k: r["ok"] for k, r in rows.items()}
    for check in ("oracles: torch-ref64 vs interp64 (forward)", "oracles: torch-ref64 vs interp64 (gradients)",
                  "oracles: hand-written rgcn ref vs torch-ref64", "forward vs interp64", "functional vs interp64",
                  "bad inputs raise", "poisoned re-run vs interp64", "rows w/o in-edges", "worst row",
                  "grad feature vs interp64", "grad W0 vs interp64", "grad W vs interp64",
                  "weight grads bit-identical (2nd backward, poisoned)", "poisoned backward vs interp64"):
        assert ok[("rgcn", "tiny", check)], check
    assert ok[("rgcn", "mini", "forward vs torch-ref64")] and ok[("rgcn", "mini", "grad W vs torch-ref64")]
    assert ok[("rgat_concat_outer", "tiny", "no backward: requires_grad raises")]
    assert not any(k[0] == "rgat_concat_outer" and k[2].startswith("grad ") for k in rows)
    assert not ok[("weight_row", "tiny", "generate/build/import")]
    assert {t["model"] for t in data["timings"]} == {"rgcn", "rgat_concat_outer"}
    s = run(["--summary", "--out", str(out)])
    assert s.returncode == 1
    table = s.stdout.split("===== summary =====")[1]
    lines = {ln.split()[0]: ln for ln in table.strip().splitlines()[1:-1]}
    assert lines["rgcn"].split()[1] == "PASS"
    assert lines["rgat_concat_outer"].split()[1] == "FWD-ONLY" and "leakyrelu_grad" in lines["rgat_concat_outer"]
    assert lines["weight_row"].split()[1] == "FAIL" and "generation failed" in lines["weight_row"]
    assert (out / "summary.txt").read_text().strip() == table.strip()


@needs_bin
@pytest.mark.parametrize("bug,spec,check", [
    ("forward", "rgcn", "poisoned re-run vs interp64"),
    ("grad", "rgcn", "grad W0 vs interp64"),
    ("nondet", "rgcn", "weight grads bit-identical (2nd backward, poisoned)"),
    ("no-raise", str(UNTRAINABLE), "no backward: requires_grad raises"),
])
def test_defects_are_caught(prepared, tmp_path, bug, spec, check):
    _, gen, _ = prepared
    p = run([spec, "--device", "cpu", "--hectorgen", str(BIN), "--generated", str(gen), "--out", str(tmp_path),
             "--graphs", "tiny", "--timing-iters", "0"], {"HG_FAKE_BUG": bug})
    assert p.returncode == 1
    _, rows = rows_by_check(tmp_path)
    name = gpu_check.model_name(REPO / spec) if spec.endswith(".yaml") else spec
    failed = sorted(k[2] for k, r in rows.items() if not r["ok"])
    assert (name, "tiny", check) in rows and not rows[(name, "tiny", check)]["ok"], failed
    if bug == "forward":
        assert not rows[(name, "tiny", "worst row")]["ok"]
        assert rows[(name, "tiny", "forward vs interp64")]["ok"]  # only the poisoned re-run reads the NaN row
    if bug in ("grad", "nondet"):
        assert all(r["ok"] for k, r in rows.items() if k[2].startswith(("forward", "poisoned re-run")))


def test_sanitizer_log_attribution(tmp_path):
    log = tmp_path / "memcheck.log"
    log.write_text("\n".join([
        "========= COMPUTE-SANITIZER",
        "sanitizer-run BEGIN rgcn",
        "sanitizer-run rgcn tiny: forward + backward, rel err 1.0e-07 OK",
        "sanitizer-run END rgcn OK",
        "sanitizer-run BEGIN rgat",
        "========= Invalid __global__ read of size 4 bytes",
        "=========     at rgat_fw_edges_att+0x1d0",
        "=========     Address 0x7f00 is out of bounds",
        "sanitizer-run END rgat OK",
        "sanitizer-run BEGIN hgt",
        "sanitizer-run hgt tiny: ERROR RuntimeError: boom",
        "sanitizer-run END hgt FAIL",
        "sanitizer-run BEGIN simplehgn",
        "sanitizer-run END simplehgn SKIP (not generated)",
        "sanitizer-run BEGIN gcn_shared",
        "========= ERROR SUMMARY: 1 error",
    ]) + "\n")
    res = gpu_check.parse_sanitizer_log(log)
    assert res["rgcn"] == (True, "clean")
    assert not res["rgat"][0] and "1 report(s): Invalid __global__ read" in res["rgat"][1]
    assert not res["hgt"][0] and "run failed" in res["hgt"][1]
    assert res["gcn_shared"] == (False, "did not finish (crash or timeout)")
    assert res["simplehgn"] == (None, "skipped (not generated)")
    assert res["__summary__"][1] == "ERROR SUMMARY: 1 error"
    assert gpu_check.parse_sanitizer_log(tmp_path / "missing.log") == {}
    data = {"rows": [{"model": m, "graph": "tiny", "check": "forward vs interp64", "err": 1e-7, "tol": 1e-5,
                      "ok": True, "kind": "forward"} for m in ("rgcn", "rgat")],
            "specs": {"rgcn": {"trainable": True}, "rgat": {"trainable": True}}, "meta": {}}
    text, all_pass = gpu_check.summarize(data, res, {"rgcn": (True, "clean"), "rgat": (True, "clean")})
    lines = {ln.split()[0]: ln for ln in text.splitlines()[1:-1]}
    assert lines["rgcn"].split()[1] == "PASS" and lines["rgat"].split()[1] == "FAIL"
    assert "memcheck: 1 report(s)" in lines["rgat"] and not all_pass


@needs_bin
def test_sanitizer_run_markers(prepared, tmp_path):
    """--sanitizer-run (the command compute-sanitizer wraps) brackets each spec with markers."""
    _, gen, _ = prepared
    p = run(["--sanitizer-run", "rgcn", UNSUPPORTED, "--device", "cpu", "--generated", str(gen)])
    log = tmp_path / "san.log"
    log.write_text(p.stdout)
    res = gpu_check.parse_sanitizer_log(log)
    assert res["rgcn"] == (True, "clean"), p.stdout[-2000:]
    assert res["weight_row"][0] is None
    assert "forward + backward" in p.stdout and p.returncode == 0


@needs_bin
def test_adapter_fits_the_generated_modules(prepared):
    """The real generated Python modules (imported without their extension): the Adapter finds the layer
    class, and its parameters take the weights of ir_torch.random_inputs (names and shapes of the spec)."""
    import importlib

    import ir_torch
    from graphs import tiny_graph

    _, gen, _ = prepared
    g = tiny_graph()
    gpu_check.add_to_sys_path(gen / "rgcn")  # the hectorgen_runtime package the modules import
    for name in ("rgcn", "rgat_concat_outer"):
        sys.path.insert(0, str(gen / name))
        try:
            mod = importlib.import_module(name)
        finally:
            sys.path.remove(str(gen / name))
        spec = {"rgcn": "specs/rgcn.yaml", "rgat_concat_outer": str(UNTRAINABLE)}[name]
        model = ir_torch.load_model(REPO / spec)
        ad = gpu_check.Adapter(mod, model, "cpu", bool(mod.TRAINABLE))
        assert ad.cls.__name__ == name.capitalize() and ad.input_names == ["feature"]
        w = {k: t.float() for k, t in ir_torch.random_inputs(model, g, 1).items() if k in ad.weight_names}
        layer = ad.layer(g, w)
        for k in ad.weight_names:
            assert torch.equal(getattr(layer, k).detach(), w[k]), k
        assert bool(mod.TRAINABLE) == (name == "rgcn")


def test_default_spec_list():
    variants, notes = gpu_check.discover()
    names = [v.name for v in variants]
    assert len(names) == len(set(names))
    for n in ("rgcn", "rgat", "hgt", "rgat4", "rgat_concat", "rgcn_t32c4", "hgt_c2", "simplehgn", "rgcn_basis",
              "rgat_concat_outer", "gcn_shared", "split_loops"):
        assert n in names, n
    assert any("specs/rgcn.json" in n for n in notes)
    assert {v.name: v.family for v in variants}["rgat4"] == "rgat"
    assert {v.name: v.family for v in variants}["simplehgn"] is None
    with pytest.raises(gpu_check.SetupError):
        gpu_check.discover(["no_such_model"])
