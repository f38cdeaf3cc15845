#!/usr/bin/env python3
"""Benchmark results (bench.py's JSON lines, any number of parts) -> bench/results.md and PNG plots.

    python3 bench/report.py results-*.jsonl [--out bench/results.md] [--plots bench] [--optimisations RUN.jsonl ...]

Per case (dataset, model, mode) and hectorgen variant: its median time, peak memory, the best baseline of its
precision class (fp32 class: fp32 baselines run with TF32 allowed; bf16 class: bf16 baselines) and the speed-up
over it, the HBM floor (roofline.py) and the ratio to it, the error check; then the geometric mean of the
speed-ups per variant, model and mode over the datasets where both ran. A later line for the same case and
system replaces an earlier one (re-run a case in a later part to fix it); a hectorgen case is compared with the
baselines of its own file (the same process) where that file ran any of its class, so that a later file re-running
some variants with a baseline beside them leaves the comparisons of the earlier files alone. With --optimisations, the tables of
compaction, reordering and auto over unoptimised (speed-ups, peak memory, auto's picks) come from those files, a run
of every fixed choice beside auto, instead of from the main run.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import OrderedDict
from pathlib import Path

MODES = ("infer", "train")
MODEL_NAMES = {"rgcn": "RGCN", "rgat": "RGAT", "hgt": "HGT"}


def read(paths) -> dict:
    """{"meta": [meta records], "datasets": {name: record}, "cases": {(ds, model, mode, system): record},
    "baselines": every baseline record}; each case record gets "_file", the index of its file in ``paths``."""
    out = {"meta": [], "datasets": OrderedDict(), "cases": OrderedDict(), "baselines": []}
    for file_index, p in enumerate(paths):
        for i, line in enumerate(Path(p).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{p}:{i}: not JSON ({e}): a truncated file? (re-run that part)")
            t = r.get("type")
            if t == "meta":
                out["meta"].append(r)
            elif t == "dataset":  # a later record of a dataset wins, keeping an earlier one's loss timing
                loss = (out["datasets"].get(r["dataset"]) or {}).get("loss_ms")
                out["datasets"][r["dataset"]] = {"loss_ms": loss, **r} if loss and not r.get("loss_ms") else r
            elif t == "case":
                r["_file"] = file_index
                out["cases"][(r["dataset"], r["model"], r["mode"], r["system"])] = r
                if r.get("kind") == "baseline":
                    out["baselines"].append(r)
    return out


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def best_baseline(recs, ds, model, mode, klass, file_index=None):
    """The fastest baseline of ``klass`` that ran in this case, or None: among those of file ``file_index`` (the
    same process as the case) where it has any, else among the latest record of each baseline."""
    def ok(r):
        return (r["dataset"], r["model"], r["mode"]) == (ds, model, mode) and r["klass"] == klass and r["status"] == "ok"
    cands = [r for r in recs.get("baselines", ()) if ok(r) and r.get("_file") == file_index]
    if not cands:
        cands = [r for r in recs["cases"].values() if r["kind"] == "baseline" and ok(r)]
    return min(cands, key=lambda r: r["ms"]) if cands else None


def comparisons(recs) -> list:
    """One row per hectorgen case: the record, its best baseline, speed-up and floor ratio."""
    rows = []
    for (ds, model, mode, system), r in recs["cases"].items():
        if r["kind"] != "hectorgen":
            continue
        b = best_baseline(recs, ds, model, mode, r["klass"], r.get("_file"))
        ok = r["status"] == "ok"
        rows.append(dict(rec=r, base=b, speedup=(b["ms"] / r["ms"]) if ok and b else None,
                         floor_ratio=(r["ms"] / r["floor_ms"]) if ok and r.get("floor_ms") else None))
    return rows


def geomeans(rows) -> dict:
    """{(system, model, mode): (geomean speed-up, count, min, max)}."""
    acc = OrderedDict()
    for row in rows:
        r = row["rec"]
        acc.setdefault((r["system"], r["model"], r["mode"]), []).append(row["speedup"])
    out = OrderedDict()
    for k, v in acc.items():
        got = [x for x in v if x]
        out[k] = (geomean(got), len(got), min(got) if got else None, max(got) if got else None, len(v))
    return out


def _ms(r):
    if r is None:
        return "-"
    return f"{r['ms']:.3f}" if r["status"] == "ok" else r["status"]


def _x(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}x"


def text_table(recs) -> str:
    """The short table printed at the end of a run."""
    rows = comparisons(recs)
    lines = [f"{'dataset':8s} {'model':5s} {'mode':5s} {'system':16s} {'ms':>10s} {'best baseline':>24s} "
             f"{'speed-up':>8s} {'x floor':>8s} {'peak MiB':>9s}"]
    for row in rows:
        r, b = row["rec"], row["base"]
        bl = f"{b['system']} {b['ms']:.3f}" if b else "none ran"
        peak = f"{r['peak_mib']:.0f}" if r.get("peak_mib") else "-"
        lines.append(f"{r['dataset']:8s} {r['model']:5s} {r['mode']:5s} {r['system']:16s} {_ms(r):>10s} "
                     f"{bl:>24s} {_x(row['speedup']):>8s} {_x(row['floor_ratio'], 1):>8s} {peak:>9s}")
    lines.append("geomean speed-up over the best baseline of the same precision class:")
    for (s, m, md), (gm, n, lo, hi, tot) in geomeans(rows).items():
        lines.append(f"  {s:16s} {m:5s} {md:5s} {_x(gm)} over {n}/{tot} datasets"
                     + (f" (min {lo:.2f}x, max {hi:.2f}x)" if n else ""))
    bad = [r for r in recs["cases"].values() if r["status"] in ("OOM", "ERR")]
    lines.append(f"{len(recs['cases'])} cells: {sum(r['status'] == 'ok' for r in recs['cases'].values())} ok, "
                 f"{sum(r['status'] == 'OOM' for r in bad)} OOM, {sum(r['status'] == 'ERR' for r in bad)} ERR, "
                 f"{sum(r['status'] == 'skip' for r in recs['cases'].values())} skipped")
    return "\n".join(lines)


def _fmt_n(n):
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}K" if n >= 1e3 else str(n)


def train_over_infer(recs) -> list:
    """Markdown lines: per hectorgen variant and model, a training step's time over the inference pass's of the
    same dataset (issue 8's target: at most 3x), their geometric mean and the largest, with its dataset."""
    ratios, layer = OrderedDict(), OrderedDict()
    for (ds, model, mode, system), r in recs["cases"].items():
        if mode != "train" or r.get("kind") != "hectorgen" or r.get("status") != "ok":
            continue
        inf = recs["cases"].get((ds, model, "infer", system))
        if inf and inf.get("status") == "ok" and inf.get("ms"):
            ratios.setdefault((system, model), []).append((r["ms"] / inf["ms"], ds))
            loss = (recs["datasets"].get(ds) or {}).get("loss_ms") or {}
            loss_ms = loss.get(r.get("dtype"), loss.get("fp32" if r.get("dtype") in ("fp32", "tf32") else "bf16"))
            if loss_ms is not None:
                layer.setdefault((system, model), []).append((max(r["ms"] - loss_ms, 1e-6) / inf["ms"], ds))
    if not ratios:
        return []
    md = ["## Training step over inference (same case)", "",
          "The step includes the loss (the same for every system); the last columns subtract the loss alone, "
          "timed per dataset on a leaf of the output's shape and dtype (the dataset records' `loss_ms`).", "",
          "| variant | model | step / inference: geomean | max (dataset) | (step - loss) / inference: geomean | "
          "max (dataset) |", "| --- | --- | --- | --- | --- | --- |"]
    order = lambda kv: (kv[0][0], list(MODEL_NAMES).index(kv[0][1]) if kv[0][1] in MODEL_NAMES else 99)  # noqa: E731
    for key, xs in sorted(ratios.items(), key=order):
        worst = max(xs)
        cells = [f"{geomean([x for x, _ in xs]):.2f}x", f"{worst[0]:.2f}x ({worst[1]})"]
        ys = layer.get(key)
        cells += [f"{geomean([y for y, _ in ys]):.2f}x", f"{max(ys)[0]:.2f}x ({max(ys)[1]})"] if ys else ["-", "-"]
        md.append(f"| {key[0]} | {MODEL_NAMES.get(key[1], key[1])} | " + " | ".join(cells) + " |")
    md.append("")
    return md


def auto_choices(recs) -> list:
    """Markdown lines: per case of an auto variant (hectorgen_<dtype>_auto: materialization and reorder auto), the
    program it picked, its time, the fixed choices' times where they ran (hectorgen_<dtype>, _compact, _reorder,
    _compact_reorder), and its time over the best of them (issue 9's target: within 5%)."""
    autos = sorted({s for (_, _, _, s), r in recs["cases"].items() if r.get("materialization")})
    if not autos:
        return []
    ok = lambda r: r is not None and r.get("status") == "ok" and r.get("ms")  # noqa: E731
    suffixes = ("", "_compact", "_reorder", "_compact_reorder")
    md = ["## auto: the program picked per case", "",
          "auto / best fixed = the auto variant's time over the fastest fixed choice of its dtype that ran "
          "(vanilla, compact, reorder, compact + reorder; <= 1.05: within 5%). Estimates: the module's cost model "
          "(ms, vanilla / compact program); of an `_auto_timed` variant, the times choose_by_timing measured before "
          "the case (ms per call).", "",
          "| variant | dataset | model | mode | picked | auto ms | vanilla ms | compact ms | reorder ms | C+R ms | "
          "auto / best fixed | estimates |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for auto in autos:
        base = auto[: auto.index("_auto")]   # hectorgen_<dtype>: the fixed choices' prefix
        for (d, m, mode, s), r in recs["cases"].items():
            if s != auto or not ok(r):
                continue
            fixed = [recs["cases"].get((d, m, mode, base + x)) for x in suffixes]
            times = [f"{x['ms']:.3f}" if ok(x) else "-" for x in fixed]
            best = min((x["ms"] for x in fixed if ok(x)), default=None)
            ratio = f"{r['ms'] / best:.2f}" if best else "-"
            est = r.get("timed_ms") or r.get("estimated_ms") or {}
            estimates = " / ".join("-" if est.get(k) is None else f"{est[k]:.3f}" for k in ("vanilla", "compact"))
            md.append(f"| {auto} | {d} | {m} | {mode} | {r['materialization']} | {r['ms']:.3f} | "
                      f"{' | '.join(times)} | {ratio} | {estimates} |")
    md.append("")
    return md


def timing(meta) -> str:
    """How the parts timed the systems of a case (bench.py: interleaved in rounds, or one after the other; files
    from before 2026-11-27 have no timing field and were sequential)."""
    kinds = sorted({("sequential" if m.get("timing", "sequential") == "sequential" else
                     f"interleaved over {m.get('rounds')} rounds")
                    + (f", samples of {m['back_to_back']} calls back to back" if m.get("back_to_back", 1) > 1 else "")
                    for m in meta})
    return ", ".join(kinds)


def optimisation_pairs(recs) -> list:
    """(optimised system, unoptimised system): every hectorgen variant `<dtype>_<opt>[_<opt>...]` (e.g. bf16_compact,
    bf16_compact_reorder) whose plain `<dtype>` variant ran too (bench/systems.py VARIANTS)."""
    systems = {s for (_, _, _, s), r in recs["cases"].items() if r.get("kind") == "hectorgen"}
    pairs = []
    for s in sorted(systems):
        parts = s.split("_")  # hectorgen, dtype, optimisations...: compare with the plain dtype variant
        base = "_".join(parts[:2])
        if len(parts) > 2 and base in systems:
            pairs.append((s, base))
    return pairs


def optimisations(recs) -> list:
    """Markdown lines: per optimised variant, model and mode, its speed-up over the unoptimised variant of the same
    dtype on each dataset (as the thesis's "Effects of Compact Materialization and Linear Operator Reordering"
    table) and the geometric mean; then the training step's peak memory, unoptimised and optimised."""
    pairs = optimisation_pairs(recs)
    if not pairs:
        return []
    datasets = list(OrderedDict.fromkeys(d for (d, _, _, _) in recs["cases"]))
    md = ["## Optimisations over the unoptimised variant of the same dtype", "",
          "Speed-up = unoptimised time / optimised time, same process and graphs (> 1: the optimisation helps).", "",
          "| variant | model | mode | " + " | ".join(datasets) + " | geomean |",
          "| --- | --- | --- | " + " | ".join("---" for _ in datasets) + " | --- |"]
    ok = lambda r: r is not None and r.get("status") == "ok" and r.get("ms")  # noqa: E731
    for opt, base in pairs:
        for m in MODEL_NAMES:
            for mode in MODES:
                cells, xs = [], []
                for d in datasets:
                    a, b = recs["cases"].get((d, m, mode, base)), recs["cases"].get((d, m, mode, opt))
                    if ok(a) and ok(b):
                        xs.append(a["ms"] / b["ms"])
                        cells.append(f"{xs[-1]:.2f}")
                    else:
                        cells.append("-")
                if xs:
                    md.append(f"| {opt} | {MODEL_NAMES[m]} | {mode} | " + " | ".join(cells) +
                              f" | **{geomean(xs):.2f}x** |")
    md += ["", "Training step peak memory (GiB: unoptimised -> optimised, ratio). Bound: edges / unique (source, relation)"
           " pairs, the most compaction can lower a peak (compaction shrinks the per-edge tensors to that many rows and "
           "leaves the node tensors, weights and graph as they are; reordering can remove per-edge tensors instead):", "",
           "| variant | model | " + " | ".join(datasets) + " |", "| --- | --- | " + " | ".join("---" for _ in datasets) + " |"]
    bounds = [recs["datasets"].get(d, {}) for d in datasets]
    if any(b.get("pairs") for b in bounds):
        md.append("| bound | - | " + " | ".join(f"{b['E'] / b['pairs']:.2f}x" if b.get("pairs") else "-" for b in bounds)
                  + " |")
    for opt, base in pairs:
        for m in MODEL_NAMES:
            cells = []
            for d in datasets:
                a, b = recs["cases"].get((d, m, "train", base)), recs["cases"].get((d, m, "train", opt))
                if ok(a) and ok(b) and a.get("peak_mib") and b.get("peak_mib"):
                    cells.append(f"{a['peak_mib'] / 1024:.1f} -> {b['peak_mib'] / 1024:.1f} "
                                 f"({a['peak_mib'] / b['peak_mib']:.2f}x)")
                else:
                    cells.append("-")
            if any(c != "-" for c in cells):
                md.append(f"| {opt} | {MODEL_NAMES[m]} | " + " | ".join(cells) + " |")
    md.append("")
    return md


def meta_lines(meta) -> list:
    """Markdown lines: the GPU, versions, dates, commits, graphs and timing of the runs (their meta records)."""
    if not meta:
        return []
    m0 = meta[0]
    uniq = lambda k: ", ".join(sorted({str(m.get(k)) for m in meta}))  # noqa: E731
    return [f"- GPU: {uniq('gpu')} ({m0.get('sms')} SMs, {m0.get('gpu_mem_gib', 0):.0f} GiB), driver "
            f"{uniq('driver')}", f"- torch {uniq('torch')} (CUDA {uniq('cuda')}), PyG {uniq('pyg')}, "
            f"Python {uniq('python')}", f"- date: {uniq('date')}; commit {uniq('commit')}; parts "
            f"{uniq('part')}", f"- graphs: seed {uniq('seed')}, skew {uniq('skew')} (Pareto shape of "
            f"the source offsets), type skew {uniq('type_skew')} (Zipf exponent of type sizes)",
            f"- measured copy bandwidth (read + write): {uniq('bandwidth_gbs')} GB/s; case budget "
            f"{uniq('case_budget_s')} s, at most {uniq('max_iters')} timed calls (median of CUDA-event times "
            f"after warm-up); timing: {timing(meta)}", ""]


def markdown(recs, plots: list, opt: dict | None = None) -> str:
    """results.md; `opt`: the records of a separate run of the optimised variants (--optimisations), whose tables
    of optimisations and auto choices replace those of `recs`."""
    meta = recs["meta"]
    rows = comparisons(recs)
    md = ["# Benchmark: hectorgen vs the strongest baselines", ""]
    md.append("Generated by `bench/report.py` from the JSON lines of `bench/run.sh` (see bench/README.md); "
              "do not edit by hand.")
    md.append("")
    md += meta_lines(meta)
    md += ["One layer, 64 -> 64, one head. Inference: one forward pass without autograd. Training step: forward, "
           "cross-entropy on random labels (bench/README.md, \"Loss\"), backward to every weight (the input features need no gradient). "
           "Peak memory: `torch.cuda.max_memory_allocated()` from the case's setup on, including the dataset's "
           "features and graph. Speed-up: best baseline of the same precision class / hectorgen (fp32 and tf32 "
           "variants against fp32 baselines run with TF32 allowed; bf16 and fp16 variants against bf16 "
           "baselines). x floor: measured time / HBM floor (bench/roofline.py: the bytes a fused implementation "
           "must move at the measured bandwidth). err: relative error of the inference output against the "
           "hand-written fp32 layer with the same weights.", ""]
    md += ["## Geometric mean of the speed-ups over the datasets", ""]
    gms = geomeans(rows)
    systems = sorted({k[0] for k in gms})
    md.append("| variant | model | inference | training step |")
    md.append("| --- | --- | --- | --- |")
    for s in systems:
        for m in MODEL_NAMES:
            cells = []
            for mode in MODES:
                g = gms.get((s, m, mode))
                cells.append("-" if not g or g[0] is None else f"**{g[0]:.2f}x** ({g[1]}/{g[4]} datasets, "
                             f"min {g[2]:.2f}x, max {g[3]:.2f}x)")
            if any(c != "-" for c in cells) or any((s, m, md_) in gms for md_ in MODES):
                md.append(f"| {s} | {MODEL_NAMES[m]} | {cells[0]} | {cells[1]} |")
    md.append("")
    md += train_over_infer(recs)
    if opt:
        md += ["## Compact materialization, reordering and auto (their own run)", "",
               "The tables below come from a run of every fixed choice beside the auto variant (bench/README.md, "
               "\"materialization: auto\"); each case's systems ran in one process, interleaved:", ""]
        md += meta_lines(opt["meta"])
    src = opt or recs
    md += optimisations(src)
    md += auto_choices(src)
    if recs["datasets"]:
        md += ["## Datasets", "", "Compaction ratio: unique (source, relation) pairs / edges, the rows compact "
               "materialization keeps of every per-edge tensor it compacts; its inverse bounds how much lower a "
               "compacted per-edge peak can be.", "",
               "| dataset | nodes | node types | edges | relations | compaction ratio | source | generated/loaded in "
               "| graph hash |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for d in recs["datasets"].values():
            ratio = f"{d['pairs'] / d['E']:.3f}" if d.get("pairs") and d["E"] else "-"
            md.append(f"| {d['dataset']} | {_fmt_n(d['N'])} | {d['T']} | {_fmt_n(d['E'])} | {d['R']} | {ratio} | "
                      f"{d.get('source')} | {d.get('load_s', 0):.1f} s | {d.get('fingerprint')} |")
        md.append("")
    md += ["## hectorgen per case", "", "| dataset | model | mode | variant | ms | peak MiB | best baseline (ms, "
           "peak MiB) | speed-up | floor ms | x floor | err | note |", "| --- | --- | --- | --- | --- | --- | --- | "
           "--- | --- | --- | --- | --- |"]
    for row in rows:
        r, b = row["rec"], row["base"]
        bl = f"{b['system']} ({b['ms']:.3f}, {b['peak_mib']:.0f})" if b else "none ran"
        err = f"{r['err']:.1e}" if r.get("err") is not None else r.get("err_ref", "-") or "-"
        system = r["system"] + (f" ({r['materialization']})" if r.get("materialization") else "")
        md.append(f"| {r['dataset']} | {r['model']} | {r['mode']} | {system} | {_ms(r)} | "
                  f"{r['peak_mib']:.0f} | " if r.get("peak_mib") else
                  f"| {r['dataset']} | {r['model']} | {r['mode']} | {system} | {_ms(r)} | - | ")
        md[-1] += (f"{bl} | {_x(row['speedup'])} | {r.get('floor_ms') or 0:.3f} | {_x(row['floor_ratio'], 1)} | "
                   f"{err} | {_note(r)} |")
    md.append("")
    md += ["## Every system per case (ms; OOM, ERR or skip)", ""]
    allsys = list(OrderedDict.fromkeys(k[3] for k in recs["cases"]))
    md.append("| dataset | model | mode | " + " | ".join(allsys) + " |")
    md.append("| --- | --- | --- | " + " | ".join("---" for _ in allsys) + " |")
    seen = list(OrderedDict.fromkeys(k[:3] for k in recs["cases"]))
    for key in seen:
        cells = [_ms(recs["cases"].get(key + (s,))) for s in allsys]
        md.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    notes = [(k, r["note"]) for k, r in recs["cases"].items() if r["status"] != "ok" and r.get("note")]
    if notes:
        md += ["", "Why cells did not run:", ""]
        for k, n in notes:
            md.append(f"- {'/'.join(k)}: {n}")
    if plots:
        md += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    md.append("")
    return "\n".join(md)


def _note(r) -> str:
    return (r.get("note") or "").replace("|", "/")[:160]


def plot_optimisations(recs, out_dir: Path, plt) -> list:
    """optimisations.png: each optimised variant's speed-up over its unoptimised variant, per model, mode and
    dataset (the table of optimisations())."""
    pairs = optimisation_pairs(recs)
    if not pairs:
        return []
    datasets = list(OrderedDict.fromkeys(k[0] for k in recs["cases"]))
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), dpi=110, squeeze=False)
    for i, mode in enumerate(MODES):
        for j, m in enumerate(MODEL_NAMES):
            ax = axes[i][j]
            w = 0.8 / len(pairs)
            for k, (opt, base) in enumerate(pairs):
                ys = []
                for d in datasets:
                    a, b = recs["cases"].get((d, m, mode, base)), recs["cases"].get((d, m, mode, opt))
                    good = a and b and a.get("status") == "ok" and b.get("status") == "ok" and b.get("ms")
                    ys.append(a["ms"] / b["ms"] if good else float("nan"))
                ax.bar([x + k * w for x in range(len(datasets))], ys, w, label=f"{opt.replace('hectorgen_', '')} / "
                       f"{base.replace('hectorgen_', '')}")
            ax.axhline(1, color="k", lw=0.8)
            ax.axhline(1.5, color="g", lw=0.8, ls="--")
            ax.set_title(f"{MODEL_NAMES[m]} {'inference' if mode == 'infer' else 'training step'}", fontsize=9)
            ax.set_xticks([x + 0.4 - w / 2 for x in range(len(datasets))])
            ax.set_xticklabels(datasets, rotation=45, fontsize=7)
            if j == 0:
                ax.set_ylabel("speed-up over unoptimised")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Optimisations: speed-up over the unoptimised variant of the same dtype (dashed: 1.5x)", fontsize=10)
    fig.tight_layout()
    p = out_dir / "optimisations.png"
    fig.savefig(p)
    plt.close(fig)
    return [p]


def plot(recs, out_dir: Path, opt: dict | None = None) -> list:
    """PNG plots (matplotlib with the Agg backend); [] when matplotlib is missing. optimisations.png from `opt` if
    given."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = comparisons(recs)
    files = []
    datasets = list(OrderedDict.fromkeys(k[0] for k in recs["cases"]))
    variants = sorted({r["rec"]["system"] for r in rows})
    files += plot_optimisations(opt or recs, out_dir, plt)
    if not any(r["speedup"] for r in rows):  # no baseline ran: only the optimisation plot
        return files
    # 1. speed-up over the best baseline, per model and mode
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), dpi=110, squeeze=False)
    for i, mode in enumerate(MODES):
        for j, m in enumerate(MODEL_NAMES):
            ax = axes[i][j]
            w = 0.8 / max(1, len(variants))
            for k, v in enumerate(variants):
                ys = []
                for d in datasets:
                    row = next((r for r in rows if (r["rec"]["dataset"], r["rec"]["model"], r["rec"]["mode"],
                                                    r["rec"]["system"]) == (d, m, mode, v)), None)
                    ys.append(row["speedup"] if row and row["speedup"] else float("nan"))
                ax.bar([x + k * w for x in range(len(datasets))], ys, w, label=v)
            ax.axhline(1, color="k", lw=0.8)
            ax.axhline(3, color="g", lw=0.8, ls="--")
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
            ax.set_title(f"{MODEL_NAMES[m]} {'inference' if mode == 'infer' else 'training step'}", fontsize=9)
            ax.set_xticks([x + 0.4 - w / 2 for x in range(len(datasets))])
            ax.set_xticklabels(datasets, rotation=45, fontsize=7)
            if j == 0:
                ax.set_ylabel("speed-up over best baseline")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("hectorgen vs the best baseline of its precision class (dashed: the 3x target)", fontsize=10)
    fig.tight_layout()
    p = out_dir / "speedup.png"
    fig.savefig(p)
    plt.close(fig)
    files.append(p)
    # 2. time of every system, per model and mode
    allsys = list(OrderedDict.fromkeys(k[3] for k in recs["cases"]))
    fig, axes = plt.subplots(2, 3, figsize=(14, 7), dpi=110, squeeze=False)
    for i, mode in enumerate(MODES):
        for j, m in enumerate(MODEL_NAMES):
            ax = axes[i][j]
            present = [s for s in allsys if any(k[1:] == (m, mode, s) for k in recs["cases"])]
            w = 0.85 / max(1, len(present))
            for k, s in enumerate(present):
                ys = []
                for d in datasets:
                    r = recs["cases"].get((d, m, mode, s))
                    ys.append(r["ms"] if r and r["status"] == "ok" else float("nan"))
                ax.bar([x + k * w for x in range(len(datasets))], ys, w, label=s)
            ax.set_yscale("log")
            ax.set_title(f"{MODEL_NAMES[m]} {'inference' if mode == 'infer' else 'training step'}", fontsize=9)
            ax.set_xticks([x + 0.42 - w / 2 for x in range(len(datasets))])
            ax.set_xticklabels(datasets, rotation=45, fontsize=7)
            if j == 0:
                ax.set_ylabel("ms (log; missing bar: OOM/ERR/skip)")
            if i == 0 and j == 0:
                ax.legend(fontsize=6)
    fig.tight_layout()
    p = out_dir / "times.png"
    fig.savefig(p)
    plt.close(fig)
    files.append(p)
    # 3. distance to the HBM floor
    fig, ax = plt.subplots(figsize=(8, 4), dpi=110)
    labels, vals = [], []
    for row in rows:
        if row["floor_ratio"]:
            r = row["rec"]
            labels.append(f"{r['dataset']}/{r['model']}/{r['mode']}/{r['system'].replace('hectorgen_', '')}")
            vals.append(row["floor_ratio"])
    ax.bar(range(len(vals)), vals)
    ax.axhline(2, color="g", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xticks(range(len(vals)))
    ax.set_xticklabels(labels, rotation=90, fontsize=5)
    ax.set_ylabel("measured / HBM floor")
    ax.set_title("hectorgen: time over the HBM floor (dashed: 2x)", fontsize=9)
    fig.tight_layout()
    p = out_dir / "floor.png"
    fig.savefig(p)
    plt.close(fig)
    files.append(p)
    return files


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="JSON-lines files from bench.py (every part)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results.md"))
    p.add_argument("--plots", default=None, help="folder for the PNGs (default: next to --out)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--optimisations", nargs="+", default=None, metavar="JSONL",
                   help="a separate run of the fixed choices beside the auto variant (later files win): the tables "
                        "of optimisations and auto choices, and optimisations.png, from it")
    a = p.parse_args(argv)
    recs = read(a.results)
    opt = read(a.optimisations) if a.optimisations else None
    out = Path(a.out)
    plots = [] if a.no_plots else plot(recs, Path(a.plots) if a.plots else out.parent, opt)
    out.write_text(markdown(recs, plots, opt))
    print(text_table(recs))
    print(f"wrote {out}" + (f" and {', '.join(str(x) for x in plots)}" if plots else " (no plots: matplotlib "
                                                                                         "missing or --no-plots)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
