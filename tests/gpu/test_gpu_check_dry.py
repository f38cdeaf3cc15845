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


# ---------------------------------------------------------------------------------------------
# dtype variants (--dtypes) and the CUDA-graph / host-sync checks
# ---------------------------------------------------------------------------------------------

import dtypes  # noqa: E402
import yaml  # noqa: E402


def test_dtype_table():
    """The tolerances of issue 8 (relative error vs float64, outputs and gradients alike) and the storage types."""
    t = dtypes.DTYPES
    assert list(t) == ["fp32", "tf32", "bf16", "fp16"]
    assert (t["fp32"].tol, t["tf32"].tol, t["bf16"].tol, t["fp16"].tol) == (1e-5, 2e-3, 2e-2, 2e-2)
    assert [t[d].torch_dtype for d in t] == [torch.float32, torch.float32, torch.bfloat16, torch.float16]
    # rounding unit over float32's: 2^13 for 10 mantissa bits (tf32, fp16), 2^16 for bf16's 7
    assert (t["fp32"].noise_scale, t["tf32"].noise_scale, t["bf16"].noise_scale) == (1.0, 8192.0, 65536.0)
    assert t["fp16"].noise_scale == t["tf32"].noise_scale
    for d in t.values():  # a tolerance is never tighter than the precision's own rounding unit
        assert d.tol > 2.0 ** -(d.mantissa_bits + 1)
    assert dtypes.parse_dtypes("tf32,bf16,fp16") == ["tf32", "bf16", "fp16"]
    assert dtypes.parse_dtypes(" BF16 , bf16,fp32") == ["bf16", "fp32"]
    assert dtypes.parse_dtypes("all") == ["fp32", "tf32", "bf16", "fp16"]
    assert dtypes.parse_dtypes("") == ["fp32"]
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        dtypes.parse_dtypes("bf16,fp8")
    assert dtypes.variant_name("rgcn", "bf16") == "rgcn_bf16"


@pytest.mark.parametrize("spec", dtypes.DEFAULT_DTYPE_SPECS)
@pytest.mark.parametrize("dtype", ["fp32", "tf32", "bf16", "fp16"])
def test_rewrite_spec(spec, dtype):
    """Only the model name and options.dtype change; the rest of the spec (program included) is the same YAML."""
    text = (REPO / spec).read_text()
    orig = yaml.safe_load(text)
    name = dtypes.variant_name(orig["model"], dtype)
    new = yaml.safe_load(dtypes.rewrite_spec(text, model=orig["model"], rename=name, dtype=dtype))
    assert new["model"] == name and new["options"]["dtype"] == dtype
    for d in (orig, new):
        d.pop("model")
        d["options"].pop("dtype")
    assert new == orig


def test_rewrite_spec_adds_and_refuses():
    base = "model: m\nhyper:\n  in_dim: 4\n"
    prog = "program: |\n  for n in g.dst_nodes():\n      n['h'] = n.feature\n"
    # no dtype line under options: one is added with the section's indentation
    t = dtypes.rewrite_spec(base + "options:\n    reorder: off\n" + prog, dtype="bf16")
    assert yaml.safe_load(t)["options"] == {"dtype": "bf16", "reorder": False} and "    dtype: bf16\n" in t
    # no options section: one before program:, the program block untouched
    t = dtypes.rewrite_spec(base + prog, model="m", rename="m_fp16", dtype="fp16")
    d = yaml.safe_load(t)
    assert d["options"] == {"dtype": "fp16"} and d["model"] == "m_fp16" and d["program"] == yaml.safe_load(prog)["program"]
    # a dtype line inside the program text is not an option
    t = dtypes.rewrite_spec(base + "options:\n  dtype: fp32\n" + "program: |\n  # dtype: fp32\n", dtype="tf32")
    assert yaml.safe_load(t)["options"]["dtype"] == "tf32" and "  # dtype: fp32\n" in t
    with pytest.raises(ValueError, match="matched 0 times"):
        dtypes.rewrite_spec(base, model="other", rename="x")
    with pytest.raises(ValueError, match="flow-style"):
        dtypes.rewrite_spec(base + "options: {dtype: fp32}\n", dtype="bf16")
    with pytest.raises(ValueError, match="unknown dtype"):
        dtypes.rewrite_spec(base, dtype="int8")
    with pytest.raises(ValueError, match="matched 0 times"):
        dtypes.rewrite_spec(base, edits=((r"no such text", "y"),))


def test_dtype_variants(tmp_path):
    """Default: the five specs of a dtype run times the dtypes; the rewritten specs are written once."""
    vs, _ = gpu_check.dtype_variants(None, ["tf32", "bf16"], tmp_path)
    assert [v.name for v in vs] == [f"{m}_{d}" for m in ("rgcn", "rgat", "hgt", "gcn_shared", "simplehgn")
                                    for d in ("tf32", "bf16")]
    v = vs[3]
    assert (v.base, v.dtype, v.source, v.ref_spec, v.base_name) == ("rgat", "bf16", "specs/rgat.yaml",
                                                                  "specs/rgat.yaml", "rgat")
    assert Path(v.spec) == tmp_path / "dtype_specs" / "rgat_bf16.yaml" and v.family == "rgat"
    assert yaml.safe_load(Path(v.spec).read_text())["options"]["dtype"] == "bf16"
    assert gpu_check.model_name(v.spec) == "rgat_bf16"
    mtime = Path(v.spec).stat().st_mtime_ns
    vs2, _ = gpu_check.dtype_variants(["rgat", "tests/specs/gcn_shared.yaml"], ["bf16"], tmp_path)
    assert [x.name for x in vs2] == ["rgat_bf16", "gcn_shared_bf16"] and Path(v.spec).stat().st_mtime_ns == mtime
    plain = gpu_check.discover(["rgat"])[0][0]
    assert (plain.dtype, plain.ref_spec, plain.base_name) == (None, "specs/rgat.yaml", "rgat")
    with pytest.raises(gpu_check.SetupError):
        gpu_check.dtype_variants(["no_such_model"], ["bf16"], tmp_path)


@pytest.fixture(scope="module")
def dtype_prepared(tmp_path_factory):
    """rgcn and rgat generated as bf16 and tf32 variants."""
    root = tmp_path_factory.mktemp("dtype")
    gen = root / "gen" / "generated"
    p = run(["--prepare", "rgcn", "rgat", "--dtypes", "bf16,tf32", "--device", "cpu", "--hectorgen", str(BIN),
             "--generated", str(gen), "--out", str(root / "out")])
    return root, gen, p


def dtype_table(stdout):
    """{(spec, dtype, phase): (err, tol, result)} from the table a dtype run prints last."""
    lines = stdout.split("\nspec  dtype  phase")[-1].strip().splitlines()[1:-1]
    res = {}
    for ln in lines:
        c = ln.split()
        res[(c[0], c[1], c[2])] = (c[3], c[4], c[5])
    return res


@needs_bin
def test_dtype_dry_run(dtype_prepared):
    """A module that implements the dtype (the stand-in: DTYPE, storage-dtype tensors, float32 arithmetic) passes
    every phase on both graphs; rows carry the dtype's tolerance; the summary table has a line per phase."""
    root, gen, prep = dtype_prepared
    assert prep.returncode == 0, prep.stdout[-3000:] + prep.stderr[-3000:]
    status = json.loads((gen.parent / "generation.json").read_text())
    assert sorted(status) == ["rgat_bf16", "rgat_tf32", "rgcn_bf16", "rgcn_tf32"] and all(
        s["ok"] for s in status.values())
    assert "dtype: bf16" in (gen.parent / "dtype_specs" / "rgat_bf16.yaml").read_text()
    out = root / "out"
    p = run(["rgat", "--dtypes", "bf16,tf32", "--device", "cpu", "--hectorgen", str(BIN), "--generated",
             str(gen), "--out", str(out), "--graphs", "tiny,mini", "--seed", "11", "--check-jobs", "2",
             "--capture", "rgat"])
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    data, rows = rows_by_check(out)
    assert data["meta"]["dtypes"] == ["bf16", "tf32"]
    for (m, g, c), r in rows.items():
        if c.startswith(("forward", "grad ")):
            assert r["tol"] == {"rgat_bf16": 2e-2, "rgat_tf32": 2e-3}[m]
    assert rows[("rgat_bf16", "mini", "grad w_t vs interp64")]["phase"] == "backward"
    assert rows[("rgat_bf16", "mini", "forward_train vs interp64")]["phase"] == "forward_train"
    assert 1e-4 < rows[("rgat_bf16", "mini", "forward vs interp64")]["err"] < 2e-2  # bf16 rounding is measured
    table = dtype_table(p.stdout)
    for d in ("bf16", "tf32"):
        for ph in ("setup", "oracle", "forward", "forward_train", "backward", "sync", "capture"):
            assert table[("rgat", d, ph)][2] == "PASS", (d, ph)
    assert len(table) == 14
    s = run(["--summary", "--out", str(out)])
    assert s.returncode == 0 and dtype_table(s.stdout) == table


@needs_bin
def test_dtype_tolerance_and_missing_dtype(dtype_prepared, tmp_path):
    """A 0.5% error in a weight gradient is within bf16's tolerance but not tf32's; a module generated without
    dtype support (no DTYPE) is one FAIL line per variant, and the run goes on. Without --capture rgcn: no sync
    and capture lines."""
    _, gen, _ = dtype_prepared
    args = ["rgcn", "--dtypes", "bf16,tf32", "--device", "cpu", "--hectorgen", str(BIN), "--generated", str(gen),
            "--graphs", "tiny", "--capture", "none", "--check-jobs", "2"]
    p = run(args + ["--out", str(tmp_path / "a")], {"HG_FAKE_BUG": "grad=1.005"})
    assert p.returncode == 1
    table = dtype_table(p.stdout)
    assert table[("rgcn", "bf16", "backward")][2] == "PASS" and table[("rgcn", "bf16", "forward")][2] == "PASS"
    assert table[("rgcn", "tf32", "backward")][2] == "FAIL" and table[("rgcn", "tf32", "forward")][2] == "PASS"
    p = run(args + ["--out", str(tmp_path / "b")], {"HG_FAKE_BUG": "no-dtype"})
    assert p.returncode == 1
    table = dtype_table(p.stdout)
    assert table == {("rgcn", "bf16", "setup"): ("inf", "2e-02", "FAIL"),
                     ("rgcn", "tf32", "setup"): ("inf", "2e-03", "FAIL")}
    assert "exports no DTYPE" in p.stdout and "0/2 (spec, dtype) variants PASS" in p.stdout


@needs_bin
@pytest.mark.parametrize("bug,failing", [
    ("sync", {"no host sync: forward", "no host sync: training step",
              "CUDA graph: forward captured, replayed vs eager", "CUDA graph: training step captured, replayed vs eager"}),
    ("stale", {"CUDA graph: forward captured, replayed vs eager",
               "CUDA graph: training step captured, replayed vs eager"}),
])
def test_capture_defects_are_caught(prepared, tmp_path, bug, failing):
    """The fp32 run's host-sync and CUDA-graph rows (on the last graph): a module that synchronises with the host
    fails them, and so does a graph whose replay does not recompute; every other check still passes."""
    _, gen, _ = prepared
    p = run(["rgcn", "--device", "cpu", "--hectorgen", str(BIN), "--generated", str(gen), "--out", str(tmp_path),
             "--graphs", "tiny", "--timing-iters", "0"], {"HG_FAKE_BUG": bug})
    assert p.returncode == 1
    _, rows = rows_by_check(tmp_path)
    assert {k[2] for k, r in rows.items() if not r["ok"]} == failing
    assert all(rows[("rgcn", "tiny", c)]["kind"] == "capture" for c in failing)


def test_summarize_dtypes():
    def r(spec, dtype, phase, err, tol, graph="tiny", check="c"):
        return {"model": f"{spec}_{dtype}", "graph": graph, "check": check, "err": err, "tol": tol,
                "ok": err <= tol, "spec": spec, "dtype": dtype, "phase": phase, "kind": "forward", "note": ""}
    data = {"meta": {"dtypes": ["bf16"], "graphs": ["tiny", "mini"]},
            "specs": {"a_bf16": {"base": "a", "dtype": "bf16", "trainable": True},
                      "b_bf16": {"base": "b", "dtype": "bf16", "trainable": False, "no_backward": "why"},
                      "c_bf16": {"base": "c", "dtype": "bf16", "trainable": None}},
            "rows": [r("a", "bf16", "forward", 1e-3, 2e-2), r("a", "bf16", "forward", 5e-3, 2e-2, "mini"),
                     r("a", "bf16", "backward", 0.0, 0.0, check="bits"),
                     r("a", "bf16", "backward", 1e-2, 2e-2, check="grad x"),
                     r("b", "bf16", "forward", 1e-3, 2e-2)]}
    text, ok = gpu_check.summarize_dtypes(data)
    lines = {tuple(ln.split()[:3]): ln.split() for ln in text.splitlines()[1:-1]}
    assert lines[("a", "bf16", "forward")][3:6] == ["5.00e-03", "2e-02", "PASS"]
    assert lines[("a", "bf16", "backward")][3:6] == ["1.00e-02", "2e-02", "PASS"]  # the worst relative to its tol
    assert lines[("b", "bf16", "backward")][5] == "FWD-ONLY" and lines[("c", "bf16", "setup")][5] == "FAIL"
    assert not ok and text.splitlines()[-1].startswith("1/3 (spec, dtype) variants PASS")
    data["rows"].append(r("a", "bf16", "backward", float("inf"), 2e-2, check="grad y"))
    text, _ = gpu_check.summarize_dtypes(data)
    assert "inf" in text and "tiny:grad y" in text


def test_summarize_dtypes_with_sanitizers():
    """Given the sanitizer logs, each variant gets a memcheck and a racecheck line; a report, or a variant missing
    from a log, fails the variant."""
    def r(spec, phase):
        return {"model": f"{spec}_bf16", "graph": "tiny", "check": "c", "err": 1e-3, "tol": 2e-2, "ok": True,
                "spec": spec, "dtype": "bf16", "phase": phase, "kind": "forward", "note": ""}
    data = {"meta": {"dtypes": ["bf16"], "graphs": ["tiny"]},
            "specs": {f"{x}_bf16": {"base": x, "dtype": "bf16", "trainable": True} for x in "abc"},
            "rows": [r(x, ph) for x in "abc" for ph in ("forward", "backward")]}
    mem = {"a_bf16": (True, "clean"), "b_bf16": (False, "1 report(s): Invalid __shared__ write"),
           "__summary__": (True, "ERROR SUMMARY: 1 error")}
    race = {"a_bf16": (True, "clean"), "b_bf16": (True, "clean"), "c_bf16": (True, "clean")}
    text, ok = gpu_check.summarize_dtypes(data, mem, race)
    lines = {tuple(ln.split()[:3]): ln for ln in text.splitlines()[1:-1]}
    assert "PASS" in lines[("a", "bf16", "memcheck")] and "PASS" in lines[("a", "bf16", "racecheck")]
    assert "FAIL" in lines[("b", "bf16", "memcheck")] and "Invalid __shared__ write" in lines[("b", "bf16", "memcheck")]
    assert "not in the sanitizer log" in lines[("c", "bf16", "memcheck")]
    assert not ok and text.splitlines()[-1].startswith("1/3 (spec, dtype) variants PASS")
    text, ok = gpu_check.summarize_dtypes(data)  # no logs: no sanitizer lines
    assert "memcheck" not in text and ok


@needs_bin
def test_sanitizer_run_of_dtype_variants(dtype_prepared, tmp_path):
    """--sanitizer-run --dtypes: each variant runs on values stored in its dtype, judged at its tolerance."""
    _, gen, _ = dtype_prepared
    p = run(["--sanitizer-run", "rgcn", "--dtypes", "bf16,tf32", "--device", "cpu", "--generated", str(gen)])
    log = tmp_path / "san.log"
    log.write_text(p.stdout)
    res = gpu_check.parse_sanitizer_log(log)
    assert res["rgcn_bf16"] == (True, "clean") and res["rgcn_tf32"] == (True, "clean"), p.stdout[-2000:]
    assert "(tol 2e-02) OK" in p.stdout and "(tol 2e-03) OK" in p.stdout and p.returncode == 0


@needs_bin
def test_plain_run_refuses_a_spec_of_another_dtype(tmp_path):
    """A spec whose own options.dtype is bf16 would get float32 values from the plain run: refused, with the
    dtype run named."""
    spec = tmp_path / "rgcn_bf16_own.yaml"
    spec.write_text(gpu_check.rewrite_spec((REPO / "specs" / "rgcn.yaml").read_text(), dtype="bf16"))
    p = run([str(spec), "--device", "cpu", "--hectorgen", str(BIN), "--generated", str(tmp_path / "gen"),
             "--out", str(tmp_path / "out")])
    assert p.returncode == 2 and "options.dtype is bf16" in p.stderr and "--dtypes bf16" in p.stderr, p.stderr


@needs_bin
def test_generated_dtype_module_is_recognised(dtype_prepared):
    """The real generated module of a dtype variant (imported without its extension): the Adapter finds its layer
    class (<Model>_<dtype>); its DTYPE must be the storage dtype, and a module without one (a hectorgen that
    ignores options.dtype) is refused with a message that says so, for every dtype but fp32."""
    import importlib

    import ir_torch

    _, gen, _ = dtype_prepared
    gpu_check.add_to_sys_path(gen / "rgcn_bf16")
    vs = {v.name: v for v in gpu_check.dtype_variants(["rgcn"], ["bf16", "tf32"], gen.parent)[0]}
    for name, want in (("rgcn_bf16", torch.bfloat16), ("rgcn_tf32", torch.float32)):
        sys.path.insert(0, str(gen / name))
        try:
            mod = importlib.import_module(name)
        finally:
            sys.path.remove(str(gen / name))
        model = ir_torch.load_model(REPO / vs[name].ref_spec)
        ad = gpu_check.Adapter(mod, model, "cpu", bool(mod.TRAINABLE), vs[name])
        assert ad.cls.__name__.lower() == name and ad.weight_names == ["W0", "W"]
        if hasattr(mod, "DTYPE"):
            assert gpu_check.module_storage(mod, vs[name]) == want
        else:
            with pytest.raises(gpu_check.SetupError, match="exports no DTYPE"):
                gpu_check.module_storage(mod, vs[name])
    fp32 = gpu_check.Variant("rgcn_fp32", "x", dtype="fp32", base="rgcn", source="specs/rgcn.yaml")
    assert gpu_check.module_storage(type("M", (), {})(), fp32) == torch.float32
    with pytest.raises(gpu_check.SetupError, match="DTYPE is torch.float16"):
        gpu_check.module_storage(type("M", (), {"DTYPE": torch.float16})(), vs["rgcn_bf16"])


def test_compact_relations_from_env(monkeypatch):
    monkeypatch.delenv("HG_COMPACT_RELATIONS", raising=False)
    assert gpu_check.compact_relations_from_env(3) is None
    monkeypatch.setenv("HG_COMPACT_RELATIONS", "0")
    assert gpu_check.compact_relations_from_env(3) == 0.0
    monkeypatch.setenv("HG_COMPACT_RELATIONS", "alternate")
    assert gpu_check.compact_relations_from_env(5) == [True, False, True, False, True]
    monkeypatch.setenv("HG_COMPACT_RELATIONS", "some")
    with pytest.raises(gpu_check.SetupError, match="HG_COMPACT_RELATIONS"):
        gpu_check.compact_relations_from_env(3)


def test_auto_modules_are_checked_once_per_program(monkeypatch):
    """A materialization: auto module gives two programs to check, each forced at prepare_graph (with
    HG_COMPACT_RELATIONS passed through the module's own prepare_graph); other modules one, prepared as they are."""
    calls = []

    class AutoModule:
        MATERIALIZATION = "auto"
        PROGRAMS = ("vanilla", "compact")
        GRAPH_LAYOUTS = ("compact_src_etype", "etype_sorted_coo")
        GEMM_TILE = 16

        @staticmethod
        def prepare_graph(*args, **kwargs):
            calls.append(kwargs)
            return "graph"

    class Plain:
        GRAPH_LAYOUTS = ("etype_sorted_coo",)

        @staticmethod
        def prepare_graph(*args, **kwargs):
            calls.append(kwargs)
            return "graph"

    assert gpu_check.auto_programs(AutoModule) == ["vanilla", "compact"]
    assert gpu_check.auto_programs(Plain) == [None]
    g = type("G", (), dict(src=None, dst=None, etype=None, num_nodes=4, num_etypes=3, ntype=None, num_ntypes=1))()
    ad = object.__new__(gpu_check.Adapter)
    ad.mod, ad.materialization = AutoModule, "compact"
    monkeypatch.delenv("HG_COMPACT_RELATIONS", raising=False)
    assert ad.prepare(g) == "graph"
    assert calls[-1]["materialization"] == "compact" and "compact_relations" not in calls[-1]
    monkeypatch.setenv("HG_COMPACT_RELATIONS", "alternate")
    ad.prepare(g)
    assert calls[-1] == {"ntype": None, "num_ntypes": 1, "materialization": "compact",
                         "compact_relations": [True, False, True]}
    ad.mod, ad.materialization = Plain, None
    ad.prepare(g)
    assert calls[-1] == {"ntype": None, "num_ntypes": 1}
