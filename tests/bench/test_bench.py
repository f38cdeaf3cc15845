#!/usr/bin/env python3
"""CPU test of the benchmark harness (bench/): CTest "bench_cpu", no GPU, no pytest, no torch_geometric.

    python3 tests/bench/test_bench.py [HECTORGEN]

1. datasets: the generator's statistics, determinism and cache; the loaders on the tiny files of tests/bench/data
   (N-Triples, TSV triples, OGB raw CSV in both layouts, plain and gzipped) and their errors.
2. hand-written layers (bench/handwritten.py) in float64, every segment-GEMM form, forward and weight gradients
   against the generic PyTorch model of the spec (tests/gpu/ir_torch.py) and, given HECTORGEN, against hectorgen's
   float64 interpreter on the tiny graph; bfloat16 against float64 within bf16 precision.
3. hectorgen variants: the spec edits; given HECTORGEN, that each edited spec generates.
4. bench.py --device cpu: the whole run (stand-in modules for the generated layers), JSON lines, OOM/ERR cells;
   the interleaved timing (rounds, rotation, statistics) and --sequential.
5. report.py on a results file with known numbers: best baseline per precision class, speed-ups, geomeans,
   results.md; PNG plots when matplotlib is installed (skipped otherwise).
Exit 0 if every section passes (a section that needs what is missing says SKIP), 1 otherwise.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DATA = HERE / "data"
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))

try:
    import torch
    torch.set_num_threads(1)   # tiny tensors: threads only contend with a busy machine
except ImportError:
    print("bench_cpu: SKIPPED: needs python3 with torch")
    sys.exit(77)

import datasets  # noqa: E402
import handwritten as hw  # noqa: E402

HECTORGEN = sys.argv[1] if len(sys.argv) > 1 and os.access(sys.argv[1], os.X_OK) else None
TMP = Path(tempfile.mkdtemp(prefix="hg_bench_test_"))
os.environ["HG_BENCH_CACHE"] = str(TMP / "cache")


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def rel(a, b):
    a, b = a.double().reshape(b.shape), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


# ---------------------------------------------------------------------------------------------------------------

def test_generator():
    for name in ("aifb", "mutag", "fb15k"):
        g = datasets.synthetic(name, seed=0)
        datasets.validate(g)
        n, t, e, r = datasets.STATS[name]
        check((g["num_nodes"], g["num_ntypes"], g["src"].numel(), g["num_etypes"]) == (n, t, e, r),
              f"{name}: sizes {g['num_nodes'], g['num_ntypes'], g['src'].numel(), g['num_etypes']}")
        again = datasets.synthetic(name, seed=0)           # from the cache
        fresh = datasets.synthetic(name, seed=0, cache=False)
        check(datasets.fingerprint(g) == datasets.fingerprint(again) == datasets.fingerprint(fresh),
              f"{name}: not deterministic")
        check(datasets.fingerprint(datasets.synthetic(name, seed=1)) != datasets.fingerprint(g), "seed ignored")
    cached = list((TMP / "cache").glob("*.pt"))
    check(len(cached) == 6, f"cache files: {cached}")
    for name in ("am", "wikikg2", "mag", "biokg", "bgs"):   # the big ones, shrunk: types kept
        g = datasets.synthetic(name, scale=0.002, cache=False)
        datasets.validate(g)
        check(g["num_ntypes"] == datasets.STATS[name][1] and g["num_etypes"] == datasets.STATS[name][3], name)
    # skew: a larger Pareto shape puts the sources on fewer nodes
    uniq = [datasets.unique_src_etype_pairs(datasets.generate(2000, 2, 50000, 4, seed=3, skew=s)) for s in (0.7, 3)]
    check(uniq[1] < uniq[0] / 2, f"skew has no effect: {uniq}")
    t = time.perf_counter()
    datasets.generate(1_000_000, 4, 2_000_000, 8, seed=0)
    dt = time.perf_counter() - t
    check(dt < 10, f"generating 2M edges took {dt:.1f} s (not vectorised?)")


def test_loaders():
    g = datasets.load_ntriples(DATA / "rdf_tiny.nt", "rdf_tiny")
    datasets.validate(g)
    check(g["ntype_names"] == ["_Literal", "_Untyped", "http://ex.org/Paper", "http://ex.org/Person"], g["ntype_names"])
    check(g["src"].tolist() == [1, 2, 3, 4, 3] and g["dst"].tolist() == [3, 0, 2, 2, 4]
          and g["etype"].tolist() == [0, 1, 2, 2, 3], f"rdf edges {g['src'].tolist()} {g['dst'].tolist()}")
    check(g["rel_types"] == [(1, 3), (2, 0), (3, 2), (3, 3)] and g["num_nodes"] == 5, g["rel_types"])
    check(g["relation_names"][2] == "http://ex.org/Person|http://ex.org/author|http://ex.org/Paper",
          g["relation_names"])

    g = datasets.load_tsv_triples([DATA / "fb15k_tiny" / "train.txt", DATA / "fb15k_tiny" / "valid.txt"], "fb")
    datasets.validate(g)
    check((g["src"].tolist(), g["dst"].tolist(), g["etype"].tolist()) == ([0, 2, 1], [1, 0, 2], [0, 0, 1]),
          f"tsv {g['src'].tolist()} {g['dst'].tolist()} {g['etype'].tolist()}")

    for gz in (False, True):
        root = TMP / f"ogb{int(gz)}"
        shutil.copytree(DATA, root)
        if gz:
            for f in root.rglob("*.csv"):
                f.with_suffix(".csv.gz").write_bytes(gzip.compress(f.read_bytes()))
                f.unlink()
        g = datasets.load_ogb(root / "ogbn_mag_tiny")
        datasets.validate(g)
        check(g["num_nodes"] == 5 and g["ntype_names"] == ["author", "paper"], g)
        check((g["src"].tolist(), g["dst"].tolist(), g["etype"].tolist()) == ([0, 1, 0, 4], [3, 4, 2, 2],
                                                                              [0, 0, 0, 1]), f"ogb hetero gz={gz}")
        check(g["rel_types"] == [(0, 1), (1, 1)], g["rel_types"])
        g = datasets.load_ogb(root / "ogbl_wikikg2_tiny" / "raw", "wikikg2_tiny")
        datasets.validate(g)
        check((g["num_nodes"], g["src"].tolist(), g["dst"].tolist(), g["etype"].tolist()) ==
              (5, [1, 3, 0, 2], [2, 1, 1, 0], [0, 0, 1, 1]), f"ogb homogeneous gz={gz}")
    g = datasets.load(f"kg={DATA / 'fb15k_tiny' / 'train.txt'}")
    check(g["name"] == "kg" and g["src"].numel() == 2, "load name=path")
    # errors name the file and line
    bad = TMP / "bad.nt"
    bad.write_text("<a> <b> <c> .\n<a> <b> oops .\n")
    try:
        datasets.load_ntriples(bad)
        raise AssertionError("a malformed N-Triples line was accepted")
    except ValueError as e:
        check(f"{bad}:2" in str(e), str(e))
    bad = TMP / "bad.txt"
    bad.write_text("a\tb\n")
    try:
        datasets.load_tsv_triples(bad)
        raise AssertionError("a two-field triple was accepted")
    except ValueError as e:
        check(f"{bad}:1" in str(e), str(e))


def test_hand_vs_spec():
    import ir_torch
    g = datasets.generate(80, 3, 600, 9, seed=4, name="small")
    dg = hw.DeviceGraph(g, "cpu", torch.float64)
    for model in ("rgcn", "rgat", "hgt"):
        m = ir_torch.load_model(REPO / "specs" / f"{model}.yaml")
        t = ir_torch.random_inputs(m, g, seed=11)
        og = ir_torch.random_output_grads(m, g, seed=11)
        ref_out, ref_grads = ir_torch.forward_backward(m, g, t, og)
        ref = ref_out["h"]
        for kind, dt, tol in (("loop", torch.float64, 1e-12), ("chunks", torch.float64, 1e-12),
                              ("grouped", torch.float32, 1e-5), ("loop", torch.bfloat16, 3e-2)):
            layer = hw.HandLayer(model, dg, dt, layout=kind).load(t)
            out = layer(t["feature"])
            check(tuple(out.shape) == tuple(ref.shape), f"{model}: shape {tuple(out.shape)} vs {tuple(ref.shape)}")
            (out.double() * og["h"].reshape(out.shape)).sum().backward()
            e = rel(out.detach(), ref)
            check(e < tol, f"{model} {kind} {dt}: forward rel err {e:.1e} > {tol}")
            for name, p in layer.named_parameters():
                ge = rel(p.grad, ref_grads[name])
                check(ge < tol * 10, f"{model} {kind} {dt}: grad {name} rel err {ge:.1e}")
    # padding of the chunked form: rows of a relation cut into whole chunks
    lay = dg.layout("chunks")
    check(lay.pad is not None and int((~lay.pad).sum()) == g["src"].numel(), "chunk padding")
    check(hw.best_chunk([0, 5, 5, 1000]) in (32, 64, 128, 256, 512, 1024), "best_chunk")


def test_hand_vs_interpreter():
    if not HECTORGEN:
        return "SKIP (no hectorgen binary given)"
    import graphs
    import ir_torch
    import reference_bridge as rb
    tg = graphs.tiny_graph()
    order = torch.argsort(tg.etype, stable=True)
    g = dict(num_nodes=tg.num_nodes, num_ntypes=tg.num_ntypes, num_etypes=tg.num_etypes, ntype=tg.ntype,
             nptr=tg.nptr, src=tg.src[order], dst=tg.dst[order], etype=tg.etype[order],
             eptr=torch.cat([torch.zeros(1, dtype=torch.int64),
                             torch.cumsum(torch.bincount(tg.etype, minlength=tg.num_etypes), 0)]),
             rel_types=list(tg.rel_types))
    dg = hw.DeviceGraph(g, "cpu", torch.float64)
    for model in ("rgcn", "rgat", "hgt"):
        spec = REPO / "specs" / f"{model}.yaml"
        m = ir_torch.load_model(spec)
        t = ir_torch.random_inputs(m, tg, seed=5)
        og = ir_torch.random_output_grads(m, tg, seed=5)
        outs, grads = rb.cpu_reference_grads(HECTORGEN, spec, tg, t, og)
        for kind in ("loop", "chunks"):
            layer = hw.HandLayer(model, dg, torch.float64, layout=kind).load(t)
            out = layer(t["feature"])
            (out * og["h"].reshape(out.shape)).sum().backward()
            e = rel(out.detach(), outs["h"])
            check(e < 1e-12, f"{model} {kind}: forward vs interpreter {e:.1e}")
            for name, p in layer.named_parameters():
                ge = rel(p.grad, grads[name])
                check(ge < 1e-11, f"{model} {kind}: grad {name} vs interpreter {ge:.1e}")


def test_variants():
    import systems
    for model in systems.MODELS:
        for key, v in systems.VARIANTS.items():
            text = systems.variant_spec_text(model, v)
            check(f"\nmodel: {v.module(model)}\n" in "\n" + text, f"{model}/{key}: module not renamed")
            check(f"  dtype: {v.dtype}\n" in text, f"{model}/{key}: dtype not set")
            for section, entries in (("traversal", v.traversal), ("gather_sum", v.gather_sum)):
                line = systems.schedule_line(section, entries)
                check((line in text) == bool(entries), f"{model}/{key}: {section} schedule {entries} not as set")
                check(text.count("\n  schedule:\n") <= 1, f"{model}/{key}: two schedule blocks")
    for knob in ("edge_batch", "row_lanes"):
        check(any(knob in dict(v.traversal) for v in systems.VARIANTS.values()), f"no variant measures {knob}")
    check(any("group_rows_below" in dict(v.gather_sum) for v in systems.VARIANTS.values()),
          "no variant measures group_rows_below")
    bad = systems.Variant("x", "fp32", "fp32", edits=((r"no such text", "y"),))
    try:
        systems.variant_spec_text("rgcn", bad)
        raise AssertionError("an edit that matches nothing was accepted")
    except ValueError:
        pass
    if not HECTORGEN:
        return "SKIP generation (no hectorgen binary given)"
    gen = TMP / "gen"
    for model in systems.MODELS:
        msg = systems.generate(model, systems.VARIANTS["fp32"], gen, HECTORGEN)
        check((gen / model / f"{model}.py").is_file(), msg)
        check(systems.generate(model, systems.VARIANTS["fp32"], gen, HECTORGEN).endswith("unchanged"),
              "an identical regeneration must keep the module (and its build)")
        ours = sorted(p.name for p in (gen / model).iterdir())
        check(ours == sorted(p.name for p in (REPO / "generated" / model).iterdir()), f"{model}: files {ours}")
        for key in ("tf32", "bf16", "bf16_auto_eb4", "bf16_auto_gs_split"):
            try:
                msg = systems.generate(model, systems.VARIANTS[key], gen, HECTORGEN)
                check((gen / f"{model}_{key}" / f"{model}_{key}.py").is_file(), msg)
            except RuntimeError as e:   # a dtype the compiler does not support yet: a positioned diagnostic
                check("dtype" in str(e) and "error" in str(e), f"{model}/{key}: {e}")


def test_dry_run():
    import bench
    out = TMP / "dry"
    args = ["--device", "cpu", "--scale", "0.002", "--datasets", "aifb,mutag", "--out", str(out),
            "--case-budget", "0.05", "--max-iters", "2", "--min-iters", "1",
            "--baselines", "hand_fp32,hand_bf16,pyg_RGCNConv,pyg_HGTConv"]
    rc = bench.main(args)
    check(rc == 0, f"bench.main rc {rc}")
    lines = [json.loads(x) for x in (out / "results-1of1.jsonl").read_text().splitlines()]
    check(lines[0]["type"] == "meta" and lines[0]["gpu"].startswith("CPU dry run"), lines[0])
    cases = [r for r in lines if r["type"] == "case"]
    check(len([r for r in lines if r["type"] == "dataset"]) == 2, "dataset records")
    # 2 datasets x 3 models x 2 modes x (hectorgen + 2 hand) + 2 x 2 x (RGCNConv for rgcn, HGTConv for hgt)
    check(len(cases) == 2 * 3 * 2 * 3 + 2 * 2 * 2, f"{len(cases)} cases")
    try:
        import torch_geometric  # noqa: F401
        pyg = True
    except Exception:  # noqa: BLE001
        pyg = False
    for r in cases:
        if r["system"].startswith("pyg_") and not pyg:
            check(r["status"] == "skip" and "torch_geometric" in r["note"], r)
        elif r["system"].startswith("pyg_") and r["status"] == "skip":   # its estimate exceeds the tiny budget
            check("estimated" in r["note"], r)
        else:
            check(r["status"] == "ok" and r["ms"] > 0 and r["iters"] >= 1, r)
        if r["kind"] == "hectorgen" and r["mode"] == "infer":
            check(r["err"] is not None and r["err"] < 1e-5, f"stand-in error check {r.get('err')}")
        check(r["floor_ms"] > 0 and r["N"] > 0, r)
    check(any("segment GEMM" in r["note"] for r in cases if r["system"] == "hand_fp32"), "hand note")
    check(lines[0]["timing"] == "interleaved" and lines[0]["rounds"] == 10, "interleaved by default")
    for r in cases:
        if r["status"] == "ok":   # up to 2 timed calls (--max-iters 2), one in each of the first rounds
            check(r["timing"] == "interleaved" and r["iters"] in (1, 2) and r["rounds"] == r["iters"], r)
            check(r["ms_min"] <= r["round_ms_min"] <= r["round_ms_max"] <= r["ms_max"], r)
    # OOM and errors become cells, and the run goes on
    import systems

    class Failing(systems.System):
        def __init__(self, exc):
            self.exc, self.name = exc, f"failing_{type(exc).__name__}"

        def setup(self, ctx, model, train):
            raise self.exc
    a = bench.parse_args(args)
    bench.DEVICE = "cpu"
    r = bench.Runner(a, TMP / "oom.jsonl")
    r.bandwidth = 1e11
    g = datasets.synthetic("aifb", scale=0.002)
    ctx = systems.Context(g=g, dg=hw.DeviceGraph(g, "cpu"), x=torch.randn(g["num_nodes"], 64),
                          label=torch.randint(0, 64, (g["num_nodes"],)))
    got = [r.case(ctx, {}, "rgcn", "train", s)["status"] for s in
           (Failing(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")),
            Failing(RuntimeError("boom")), systems.HandSystem("fp32"))]
    check(got == ["OOM", "ERR", "ok"], got)
    # interleaved, an out-of-memory system is timed alone afterwards (and is an OOM cell if it fails again)
    group = (Failing(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")),
             Failing(RuntimeError("boom")), systems.HandSystem("fp32"))
    recs = r.interleaved(ctx, "rgcn", "train", list(group))
    check([x["status"] for x in recs] == ["OOM", "ERR", "ok"], recs)
    check(recs[0]["note"].startswith("timed alone: out of memory beside"), recs[0]["note"])
    bench.DEVICE = "cuda"
    seq = bench.main(args[:-1] + ["hand_fp32", "--datasets", "aifb", "--models", "rgcn", "--sequential", "--profile",
                                  "--out", str(TMP / "seq")])
    check(seq == 0, "--sequential rc")
    lines = [json.loads(x) for x in (TMP / "seq" / "results-1of1.jsonl").read_text().splitlines()]
    check(lines[0]["timing"] == "sequential", lines[0])
    cases = [x for x in lines if x["type"] == "case"]
    check(cases and all(x["timing"] == "sequential" and x["iters"] in (1, 2) for x in cases), lines)
    # --profile: the top ops (the CPU's here) and the host's time to enqueue a call
    check(all(x["profile"] and x["host_ms"] > 0 for x in cases if x["status"] == "ok"), cases)
    bench.DEVICE = "cpu"
    ms = bench.host_ms(lambda: time.sleep(0.002), train=False, calls=5)
    check(2.0 <= ms < 100.0, f"host_ms of a 2 ms call: {ms}")
    return out / "results-1of1.jsonl"


def test_interleaved():
    """Rounds rotate the systems, each gets its calls spread over the rounds, and the statistics cover them all."""
    import bench
    import systems
    check(bench.blocks(7, 3) == [3, 2, 2] and bench.blocks(2, 4) == [1, 1, 0, 0], "blocks")
    st = bench.sample_stats([[3.0, 1.0], [], [2.0, 10.0], [4.0]])
    check(st["ms"] == 3.0 and st["ms_min"] == 1.0 and st["ms_max"] == 10.0 and st["iters"] == 5, st)
    check((st["rounds"], st["round_ms_min"], st["round_ms_max"]) == (3, 3.0, 10.0), st)   # upper medians
    check((st["ms_q1"], st["ms_q3"]) == (2.0, 4.0), st)

    calls = []

    class Logged(systems.System):
        """A system whose calls append its name to `calls`; `slow` makes each call take that many seconds."""

        def __init__(self, name, slow=0.0):
            self.name, self.slow = name, slow

        def setup(self, ctx, model, train):
            def fn():
                calls.append(self.name)
                time.sleep(self.slow)
            return fn

    bench.DEVICE = "cpu"
    try:
        a = bench.parse_args(["--device", "cpu", "--case-budget", "1", "--max-iters", "6", "--min-iters", "1",
                              "--rounds", "3", "--no-check"])
        r = bench.Runner(a, TMP / "interleaved.jsonl")
        r.bandwidth = 1e11
        g = datasets.synthetic("aifb", scale=0.002)
        ctx = systems.Context(g=g, dg=hw.DeviceGraph(g, "cpu"), x=torch.randn(g["num_nodes"], 64),
                              label=torch.randint(0, 64, (g["num_nodes"],)))
        # slow: 0.08 s a call, so its budget (60% of 1 s less its warm-up) fits about 5 calls, fewer than 6
        group = [Logged("a"), Logged("b"), Logged("slow", 0.08)]
        recs = r.interleaved(ctx, "rgcn", "infer", group)
    finally:
        bench.DEVICE = "cuda"
    check([x["status"] for x in recs] == ["ok"] * 3, recs)
    n_slow = recs[2]["iters"]
    check([x["iters"] for x in recs[:2]] == [6, 6] and 1 <= n_slow < 6, recs)
    check(recs[2]["ms"] >= 80 and recs[0]["ms"] < 40, recs)
    # two warm-up calls each while set up, one untimed call each, then the rounds, rotated by one system per round
    check(calls[:6] == ["a", "a", "b", "b", "slow", "slow"] and calls[6:9] == ["a", "b", "slow"], calls)
    plan = {"a": [2, 2, 2], "b": [2, 2, 2], "slow": bench.blocks(n_slow, 3)}
    names = ["a", "b", "slow"]
    expect = [x for k in range(3) for x in names[k:] + names[:k] for _ in range(plan[x][k])]
    check(calls[9:] == expect, f"{calls[9:]} != {expect}")

    # --back-to-back 3: a sample is 3 calls enqueued between its two events, its time divided by 3
    bench.DEVICE = "cpu"
    try:
        ran = []
        ts = bench.timed_calls(lambda: (ran.append(1), time.sleep(0.01)), 4, back_to_back=3)
        check(len(ts) == 4 and len(ran) == 12 and all(8 <= t < 30 for t in ts), f"{ts}, {len(ran)} calls")
        a = bench.parse_args(["--device", "cpu", "--case-budget", "1", "--max-iters", "2", "--min-iters", "1",
                              "--rounds", "2", "--no-check", "--back-to-back", "3"])
        calls.clear()
        r = bench.Runner(a, TMP / "back_to_back.jsonl")
        r.bandwidth = 1e11
        recs = r.interleaved(ctx, "rgcn", "infer", [Logged("a")])
    finally:
        bench.DEVICE = "cuda"
    # two warm-up calls, one untimed call, then 2 samples of 3 calls each
    check(recs[0]["status"] == "ok" and recs[0]["iters"] == 2 and len(calls) == 3 + 2 * 3, (recs, calls))


def _case(ds, model, mode, system, kind, klass, ms, status="ok", **kw):
    return dict(type="case", dataset=ds, model=model, mode=mode, system=system, kind=kind, klass=klass,
                dtype=kw.pop("dtype", "fp32"), status=status, ms=ms if status == "ok" else None,
                peak_mib=100.0 if status == "ok" else None, floor_ms=kw.pop("floor_ms", 0.5), note=kw.pop("note", ""),
                **kw)


def test_report(dry_results=None):
    import report
    fake = TMP / "fake.jsonl"
    recs = [dict(type="meta", part="1/2", gpu="NVIDIA H100 80GB HBM3", sms=132, gpu_mem_gib=79.2, driver="580",
                 torch="2.11.0", cuda="13.0", pyg="2.8.0", python="3.12", date="2026-11-23T17:00:00+00:00",
                 commit="abc", seed=0, skew=1.5, type_skew=1.1, bandwidth_gbs=3000.0, case_budget_s=30,
                 max_iters=20),
            dict(type="dataset", dataset="aifb", N=7262, E=48810, R=104, T=7, source="synthetic", load_s=0.1,
                 fingerprint="f00"),
            _case("aifb", "rgcn", "infer", "hectorgen_fp32", "hectorgen", "fp32", 1.0, err=1e-7),
            _case("aifb", "rgcn", "infer", "hectorgen_bf16", "hectorgen", "bf16", 0.5, dtype="bf16"),
            _case("aifb", "rgcn", "infer", "hand_fp32", "baseline", "fp32", 4.0),
            _case("aifb", "rgcn", "infer", "pyg_RGCNConv", "baseline", "fp32", 2.0),
            _case("aifb", "rgcn", "infer", "hand_bf16", "baseline", "bf16", 0.25, dtype="bf16"),
            _case("aifb", "rgcn", "train", "hectorgen_fp32", "hectorgen", "fp32", 3.0),
            _case("aifb", "rgcn", "train", "hand_fp32", "baseline", "fp32", None, status="OOM", note="OOM: x"),
            _case("aifb", "rgcn", "train", "pyg_RGCNConv", "baseline", "fp32", 24.0)]
    fake.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    # A second part: another dataset, a baseline re-run alone, and a variant re-run beside a baseline.
    part2 = TMP / "fake2.jsonl"
    part2.write_text("\n".join(json.dumps(r) for r in [
        dict(recs[0], part="2/2"),
        _case("mutag", "rgcn", "infer", "hectorgen_fp32", "hectorgen", "fp32", 1.0),
        _case("mutag", "rgcn", "infer", "hand_fp32", "baseline", "fp32", 8.0),
        _case("aifb", "rgcn", "infer", "pyg_RGCNConv", "baseline", "fp32", 1.5),
        _case("aifb", "rgcn", "infer", "hectorgen_bf16", "hectorgen", "bf16", 0.4, dtype="bf16"),
        _case("aifb", "rgcn", "infer", "hand_bf16", "baseline", "bf16", 0.3, dtype="bf16")]) + "\n")
    data = report.read([fake, part2])
    rows = {(r["rec"]["dataset"], r["rec"]["mode"], r["rec"]["system"]): r for r in report.comparisons(data)}
    check(rows[("aifb", "infer", "hectorgen_fp32")]["base"]["system"] == "pyg_RGCNConv", "best fp32 baseline")
    # The first part's case against the baselines of its own process (pyg 2.0), not the later re-run's 1.5 ...
    check(math.isclose(rows[("aifb", "infer", "hectorgen_fp32")]["speedup"], 2.0), "speed-up (own file's baseline)")
    # ... and the variant re-run in the second part against the baseline timed beside it (0.3, not 0.25).
    check(math.isclose(rows[("aifb", "infer", "hectorgen_bf16")]["speedup"], 0.75), "re-run against its own file")
    check(rows[("aifb", "infer", "hectorgen_bf16")]["base"]["klass"] == "bf16", "bf16 against bf16 only")
    check(math.isclose(rows[("aifb", "train", "hectorgen_fp32")]["speedup"], 8.0), "OOM baseline skipped")
    check(math.isclose(rows[("aifb", "infer", "hectorgen_fp32")]["floor_ratio"], 2.0), "floor ratio")
    gm = report.geomeans(report.comparisons(data))
    check(math.isclose(gm[("hectorgen_fp32", "rgcn", "infer")][0], math.sqrt(2.0 * 8.0)), "geomean")
    md_path = TMP / "results.md"
    rc = report.main([str(fake), str(part2), "--out", str(md_path)])
    check(rc == 0, "report rc")
    md = md_path.read_text()
    for want in ("NVIDIA H100 80GB HBM3", "driver 580", "torch 2.11.0", "seed 0", "**4.00x** (2/2 datasets",
                 "| aifb | rgcn | train | hectorgen_fp32 | 3.000 |", "OOM", "3000.0 GB/s"):
        check(want in md, f"results.md lacks {want!r}")
    try:
        import matplotlib  # noqa: F401
        pngs = sorted(p.name for p in TMP.glob("*.png"))
        check(pngs == ["floor.png", "speedup.png", "times.png"], pngs)
        check("![speedup](speedup.png)" in md, "plots not linked")
        note = ""
    except ImportError:
        note = "SKIP plots (no matplotlib)"
    if dry_results:
        report.main([str(dry_results), "--out", str(TMP / "dry.md"), "--no-plots"])
        check("hectorgen_fp32" in (TMP / "dry.md").read_text(), "report of the dry run")
    return note


def test_auto_report():
    """materialization: auto cases: the per-case table names the picked program, the auto table compares it with
    the best fixed variant, and auto counts as an optimisation of the plain dtype variant."""
    import report
    fake = TMP / "auto.jsonl"
    recs = [dict(type="meta", part="1/1", gpu="NVIDIA H100 80GB HBM3", sms=132, gpu_mem_gib=79.2, driver="580",
                 torch="2.11.0", cuda="13.0", pyg="2.8.0", python="3.12", date="2026-11-27T10:00:00+00:00",
                 commit="abc", seed=0, skew=1.5, type_skew=1.1, bandwidth_gbs=3000.0, case_budget_s=30,
                 max_iters=20),
            _case("mag", "rgat", "train", "hectorgen_tf32", "hectorgen", "fp32", 30.0, dtype="tf32"),
            _case("mag", "rgat", "train", "hectorgen_tf32_compact", "hectorgen", "fp32", 20.0, dtype="tf32"),
            _case("mag", "rgat", "train", "hectorgen_tf32_auto", "hectorgen", "fp32", 20.5, dtype="tf32",
                  materialization="compact", estimated_ms={"vanilla": 25.0, "compact": 15.0}),
            _case("aifb", "rgat", "train", "hectorgen_tf32", "hectorgen", "fp32", 1.0, dtype="tf32"),
            _case("aifb", "rgat", "train", "hectorgen_tf32_compact", "hectorgen", "fp32", 1.2, dtype="tf32"),
            _case("aifb", "rgat", "train", "hectorgen_tf32_auto", "hectorgen", "fp32", 1.0, dtype="tf32",
                  materialization="vanilla", estimated_ms={"vanilla": 0.2, "compact": 0.3}),
            # the program chosen by timing: compared with the same fixed choices, its measured times shown
            _case("aifb", "rgat", "train", "hectorgen_tf32_auto_timed", "hectorgen", "fp32", 1.1, dtype="tf32",
                  materialization="compact", estimated_ms={"vanilla": 0.2, "compact": 0.3},
                  timed_ms={"vanilla": 0.9, "compact": 0.8})]
    fake.write_text("".join(json.dumps(r) + "\n" for r in recs))
    md_path = TMP / "auto.md"
    check(report.main([str(fake), "--out", str(md_path), "--no-plots"]) == 0, "report rc")
    md = md_path.read_text()
    for want in ("## auto: the program picked per case",
                 "| hectorgen_tf32_auto | mag | rgat | train | compact | 20.500 | 30.000 | 20.000 | - | - | 1.02 | 25.000 / 15.000 |",
                 "| hectorgen_tf32_auto | aifb | rgat | train | vanilla | 1.000 | 1.000 | 1.200 | - | - | 1.00 | 0.200 / 0.300 |",
                 "| hectorgen_tf32_auto_timed | aifb | rgat | train | compact | 1.100 | 1.000 | 1.200 | - | - | 1.10 | 0.900 / 0.800 |",
                 "hectorgen_tf32_auto (compact)", "| hectorgen_tf32_auto | RGAT | train |"):
        check(want in md, f"auto report lacks {want!r}")
    # --optimisations: the tables of optimisations and auto choices come from that run alone (its own meta line), the
    # main run's auto case only counts against the baselines; the memory table bounds compaction by edges / pairs.
    main_run = TMP / "main.jsonl"
    main_recs = [dict(recs[0], commit="main1"), _case("mag", "rgat", "train", "hectorgen_tf32", "hectorgen", "fp32", 40.0,
                                                      dtype="tf32"),
                 _case("mag", "rgat", "train", "hectorgen_tf32_auto", "hectorgen", "fp32", 10.0, dtype="tf32",
                       materialization="compact", estimated_ms={"vanilla": 25.0, "compact": 15.0})]
    main_run.write_text("".join(json.dumps(r) + "\n" for r in main_recs))
    ds = dict(type="dataset", dataset="mag", N=1000, E=4000, R=4, T=4, pairs=1000)
    fake.write_text(fake.read_text() + json.dumps(ds) + "\n")
    check(report.main([str(main_run), "--optimisations", str(fake), "--out", str(md_path), "--no-plots"]) == 0,
          "report --optimisations rc")
    md = md_path.read_text()
    opt = md[md.index("## Compact materialization, reordering and auto (their own run)"):]
    for want in ("commit abc", "| hectorgen_tf32_auto | mag | rgat | train | compact | 20.500 | 30.000 | 20.000 |",
                 "| hectorgen_tf32_auto | RGAT | train | 1.46 | 1.00 |", "| bound | - | 4.00x | - |"):
        check(want in opt, f"--optimisations report lacks {want!r}")
    check("commit main1" in md[:md.index("## Compact materialization")] and "| 4.00 |" not in opt,
          "the main run's meta before, none of its times in the optimisation tables")


def test_calibrate_auto():
    """calibrate_auto.py recovers the launch time, bandwidth and costs per gather row and search round that produced
    the fixed variants' times, counts the choices the fitted table gets right, and recomputes the terms of older runs
    (launches and bytes only) from a module's cost model."""
    import calibrate_auto
    import report
    launch_s, per_byte, per_row, per_step = 4e-6, 1 / 2.5e12, 0.5e-9, 0.25e-9
    recs = [dict(type="meta", part="1/1")]
    # "b": compact moves 4x fewer bytes but has many more gather rows, "e": it searches each row's edge type; both
    # times it is slower, which the bytes alone miss
    for ds, terms in (("a", {"vanilla": (10, 1e6, 0, 0), "compact": (14, 5e5, 0, 0)}),
                      ("b", {"vanilla": (10, 4e9, 1e6, 0), "compact": (14, 1e9, 6e7, 0)}),
                      ("c", {"vanilla": (30, 2e8, 1e5, 0), "compact": (40, 3e8, 1e5, 0)}),
                      ("d", {"vanilla": (20, 8e9, 2e7, 0), "compact": (20, 2e9, 2e7, 1e6)}),
                      ("e", {"vanilla": (10, 2e9, 0, 0), "compact": (10, 1e9, 0, 4e7)})):
        times = {p: (n * launch_s + b * per_byte + r * per_row + st * per_step) * 1e3
                 for p, (n, b, r, st) in terms.items()}
        recs += [_case(ds, "rgat", "train", "hectorgen_tf32", "hectorgen", "fp32", times["vanilla"], dtype="tf32"),
                 _case(ds, "rgat", "train", "hectorgen_tf32_compact", "hectorgen", "fp32", times["compact"], dtype="tf32"),
                 _case(ds, "rgat", "train", "hectorgen_tf32_auto", "hectorgen", "fp32", min(times.values()),
                       dtype="tf32", materialization="vanilla", cost_terms=terms, arch="sm_90")]
    path = TMP / "calibrate.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    obs = calibrate_auto.observations(report.read([path]))
    check(sorted(obs) == ["sm_90"] and len(obs["sm_90"]) == 10, f"observations {obs}")
    fitted = dict(zip(calibrate_auto.PARAMS, calibrate_auto.fit(obs["sm_90"])))
    for key, want in (("launch_us", 4.0), ("bandwidth_gbs", 2500), ("gather_row_ns", 0.5), ("search_round_ns", 0.25)):
        check(math.isclose(fitted[key], want, rel_tol=1e-6), f"fit {fitted}")
    check(calibrate_auto.picks_right(obs["sm_90"], fitted) == (5, 5), "choices of the fit")
    # without the gather rows' cost, "b" goes to compact (4x fewer bytes) although it is slower; likewise "e"
    # without the searches'
    check(calibrate_auto.picks_right(obs["sm_90"], dict(fitted, gather_row_ns=0.0)) == (4, 5), "no gather rows")
    check(calibrate_auto.picks_right(obs["sm_90"], dict(fitted, search_round_ns=0.0)) == (4, 5), "no searches")
    # a table whose launches cost nothing picks compact on "a", where vanilla's fewer launches win
    check(calibrate_auto.picks_right(obs["sm_90"], dict(fitted, launch_us=0.0)) == (4, 5), "launch-free table")
    check(calibrate_auto.main([str(path), "--cases"]) == 0, "calibrate_auto rc")

    # A run before gather rows were recorded: (launches, bytes); the module's COST_MODEL gives the rows, and the
    # compact bytes the pair count (P = 300 here).
    mod = TMP / "gen" / "rgat_tf32_auto"
    mod.mkdir(parents=True)
    (mod / "rgat_tf32_auto.py").write_text(
        "X = 1\nCOST_MODEL = {\n"
        "    \"vanilla\": {\"forward\": (4, (0, 8, 100, 0, 64, 0), (0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0))},\n"
        "    \"compact\": {\"forward\": (5, (0, 8, 20, 50, 64, 0), (0, 1, 0, 2, 0, 0), (0, 0, 0, 1, 0, 0))},\n}\nY = 2\n")
    N, E, R, T, P = 1000, 5000, 16, 1, 300
    old_terms = {"vanilla": [4, 8 * N + 100 * E + 64 * R], "compact": [5, 8 * N + 20 * E + 50 * P + 64 * R]}
    counts = dict(N=N, E=E, R=R, T=T)
    old = [dict(type="meta", part="1/1"),
           _case("x", "rgat", "infer", "hectorgen_tf32", "hectorgen", "fp32", 1.0, dtype="tf32", **counts),
           _case("x", "rgat", "infer", "hectorgen_tf32_compact", "hectorgen", "fp32", 2.0, dtype="tf32", **counts),
           _case("x", "rgat", "infer", "hectorgen_tf32_auto", "hectorgen", "fp32", 2.0, dtype="tf32",
                 materialization="compact", cost_terms=old_terms, arch="sm_90", **counts),
           _case("y", "rgat", "infer", "hectorgen_tf32", "hectorgen", "fp32", 1.0, dtype="tf32", **counts),
           _case("y", "rgat", "infer", "hectorgen_tf32_compact", "hectorgen", "fp32", 2.0, dtype="tf32", **counts),
           _case("y", "rgat", "infer", "hectorgen_tf32_auto", "hectorgen", "fp32", 2.0, dtype="tf32",
                 materialization="compact", arch="sm_90", cost_terms={"vanilla": [4, 1.0], "compact": [5, 1.0]},
                 **counts)]
    path = TMP / "calibrate_old.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    skipped = []
    obs = calibrate_auto.observations(report.read([path]), TMP / "gen", skipped)["sm_90"]
    got = sorted((o[6], *o[:4]) for o in obs)
    # the search rows: P, one round of the warp's 32-way search each over R = 16 relations
    check(calibrate_auto.search_rounds(R) == 1, "rounds of 16 relations")
    want = [("compact", 5, old_terms["compact"][1], N + 2 * P, P * 1), ("vanilla", 4, old_terms["vanilla"][1], 0, 0)]
    check(got == want, f"recomputed terms {got} != {want}")
    check(skipped == [(("y", "rgat", "infer", "hectorgen_tf32_auto"), "module's terms differ")], skipped)

    # A training case from before the gradients were recorded: its terms counted the kernels only the feature's
    # gradient needs, which the benchmark's step (weights only) skipped; recomputed without them (BACKWARD_PARTS).
    mod = TMP / "gen" / "rgcn_bf16_auto"
    mod.mkdir(parents=True)
    z = "(0, 0, 0, 0, 0, 0)"
    (mod / "rgcn_bf16_auto.py").write_text(
        "ARGUMENTS = (\"feature\", \"W\", )  # forward()'s tensor arguments\nWEIGHTS = (\"W\", )\nCOST_MODEL = {\n"
        f"    \"vanilla\": {{\"forward_train\": (2, (0, 0, 100, 0, 0, 0), {z}, {z}),\n"
        f"                \"backward\": (6, (0, 10, 300, 0, 0, 0), {z}, {z})}},\n"
        f"    \"compact\": {{\"forward_train\": (3, (0, 0, 20, 50, 0, 0), {z}, {z}),\n"
        f"                \"backward\": (7, (0, 10, 40, 100, 0, 0), (0, 1, 0, 1, 0, 0), {z})}},\n}}\n"
        "BACKWARD_PARTS = {\n"
        f"    \"vanilla\": (\n        ((\"feature\", ), 3, (0, 10, 200, 0, 0, 0), {z}, {z}),\n    ),\n"
        f"    \"compact\": (\n        ((\"feature\", ), 4, (0, 10, 0, 60, 0, 0), (0, 1, 0, 0, 0, 0), {z}),\n    ),\n}}\n")
    every = {"vanilla": [8, 10 * N + 400 * E, 0, 0], "compact": [10, 10 * N + 60 * E + 150 * P, N + P, 0]}
    train = [dict(type="meta", part="1/1"),
             _case("x", "rgcn", "train", "hectorgen_bf16", "hectorgen", "bf16", 1.0, dtype="bf16", **counts),
             _case("x", "rgcn", "train", "hectorgen_bf16_compact", "hectorgen", "bf16", 2.0, dtype="bf16", **counts),
             _case("x", "rgcn", "train", "hectorgen_bf16_auto", "hectorgen", "bf16", 2.0, dtype="bf16",
                   materialization="vanilla", cost_terms=every, arch="sm_90", **counts)]
    path = TMP / "calibrate_train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in train))
    got = sorted((o[6], *o[:4]) for o in calibrate_auto.observations(report.read([path]), TMP / "gen")["sm_90"])
    want = [("compact", 6, 60 * E + 90 * P, P, 0), ("vanilla", 5, 200 * E, 0, 0)]
    check(got == want, f"training terms without the feature's kernels {got} != {want}")
    # recorded with its gradients (the terms are what ran): taken as they are
    train[-1] = dict(train[-1], grads=["W"], cost_terms={"vanilla": [5, 200 * E, 0, 0], "compact": [6, 1.0, P, 0]})
    path.write_text("".join(json.dumps(r) + "\n" for r in train))
    got = sorted((o[6], *o[:4]) for o in calibrate_auto.observations(report.read([path]), TMP / "gen")["sm_90"])
    check(got == [("compact", 6, 1.0, P, 0), ("vanilla", 5, 200 * E, 0, 0)], f"recorded training terms {got}")
    # A module whose gather sums have a rows variant (COST_MODEL's fifth term, since 2026-12-02): a pair's sum runs
    # it below 20 edges a pair (E / P = 16.7 here: a row is 1 / 4 of a gather row), a node's below 4 pairs (skipped:
    # only the feature's gradient needs it)
    text = (mod / "rgcn_bf16_auto.py").read_text()
    for plain, grouped in ((f"(0, 1, 0, 1, 0, 0), {z})", f"{z}, {z}, ((3, 2, 20, 4), (1, 3, 4, 4), ))"),
                           (f"(0, 1, 0, 0, 0, 0), {z})", f"{z}, {z}, ((1, 3, 4, 4), ))")):
        check(text.count(plain) == 1, f"the test module has no {plain}")
        text = text.replace(plain, grouped)
    (mod / "rgcn_bf16_auto.py").write_text(text)
    train[-1] = dict(train[-1], cost_terms=every)
    del train[-1]["grads"]
    path.write_text("".join(json.dumps(r) + "\n" for r in train))
    got = sorted((o[6], *o[:4]) for o in calibrate_auto.observations(report.read([path]), TMP / "gen")["sm_90"])
    want = [("compact", 6, 60 * E + 90 * P, P / 4, 0), ("vanilla", 5, 200 * E, 0, 0)]
    check(got == want, f"training terms with grouped gather rows {got} != {want}")


def test_ab():
    """bench/ab.py: per-case speed-ups of one variant over another from one run, geomeans, the missing cases."""
    import ab
    meta = {"type": "meta", "gpu": "G", "driver": "d", "torch": "t", "commit": "c", "date": "now", "seed": 0,
            "case_budget_s": 1.0, "max_iters": 10, "datasets": ["x", "y"], "models": ["rgcn"], "modes": ["infer"]}
    recs = [meta]
    for ds, a, b, status in (("x", 2.0, 1.0, "ok"), ("y", 3.0, 4.0, "OOM")):
        recs.append({"type": "case", "dataset": ds, "model": "rgcn", "mode": "infer", "system": "hectorgen_old",
                     "status": "ok", "ms": a, "floor_ms": 0.5})
        recs.append({"type": "case", "dataset": ds, "model": "rgcn", "mode": "infer", "system": "hectorgen_new",
                     "status": status, "ms": b, "floor_ms": 0.5})
    src = TMP / "ab.jsonl"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    out = TMP / "ab.md"
    check(ab.main([str(src), "--pair", "old:new", "--out", str(out)]) == 0, "ab.py failed")
    text = out.read_text()
    check("| x | rgcn | infer | 2.000 | 1.000 | 2.00x | 2.0x |" in text, "ab.py: the case row is wrong:\n" + text)
    check("| rgcn | infer | 2.00x | 2.00x | 2.00x |" in text, "ab.py: the geomean row is wrong")
    check("Not compared (a variant did not run ok): y/rgcn/infer" in text, "ab.py: the OOM case is not listed")


def test_backward_report():
    """bench/backward/report.py: training steps before/after, speed-ups, step / inference with and without the loss."""
    import subprocess
    paths = []
    for tag, step in (("before", 6.0), ("after", 4.0)):
        recs = [{"type": "meta", "gpu": "G", "torch": "t", "commit": tag, "date": "2026-01-01T00:00:00"},
                {"type": "dataset", "dataset": "x", "loss_ms": {"bf16": 1.0, "fp32": 0.5}}]
        for mode, ms in (("infer", 1.0), ("train", step)):
            recs.append({"type": "case", "dataset": "x", "model": "rgat", "mode": mode, "system": "hectorgen_bf16_auto",
                         "klass": "bf16", "status": "ok", "ms": ms})
        path = TMP / f"backward_{tag}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
        paths.append(str(path))
    out = TMP / "backward.md"
    subprocess.run([sys.executable, str(REPO / "bench" / "backward" / "report.py"), *paths, "--out", str(out)], check=True)
    text = out.read_text()
    check("| x | rgat | hectorgen_bf16_auto | 6.000 | 4.000 | **1.50x** | 5.00 | 3.00 | 4.00 |" in text,
          "backward/report.py: the case row is wrong:\n" + text)
    check("- rgat: geomean 1.50x over 1 dataset" in text, "backward/report.py: the geomean line is wrong")


def main() -> int:
    t0 = time.time()
    failed = 0
    dry = None
    for fn in (test_generator, test_loaders, test_hand_vs_spec, test_hand_vs_interpreter, test_variants,
               test_dry_run, test_interleaved, test_report, test_auto_report, test_calibrate_auto, test_ab,
               test_backward_report):
        t = time.time()
        try:
            res = fn(dry) if fn is test_report else fn()
            if fn is test_dry_run:
                dry, res = res, None
            print(f"{fn.__name__:26s} PASS{' ' + res if isinstance(res, str) else ''} ({time.time() - t:.1f} s)",
                  flush=True)
        except Exception:  # noqa: BLE001
            failed += 1
            print(f"{fn.__name__:26s} FAIL ({time.time() - t:.1f} s)", flush=True)
            traceback.print_exc()
    shutil.rmtree(TMP, ignore_errors=True)
    print(f"bench_cpu: {'FAIL' if failed else 'PASS'} ({failed} failed) in {time.time() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
