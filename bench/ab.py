#!/usr/bin/env python3
"""One schedule against another, measured in the same run: per case, the time of variant B over variant A's.

    bench/ab.py RESULTS.jsonl... --pair BEFORE:AFTER [--pair BEFORE:AFTER ...] --out FILE.md [--title TEXT]

RESULTS are JSON-lines files of bench.py (run.sh) holding both variants of each pair (e.g. bf16_auto_rl32 and
bf16_auto: the warp-per-row traversals and auto's row lanes, timed interleaved in one process). Writes FILE.md (the
GPU, torch, commit and date of the run; a table per case: both times, the speed-up BEFORE / AFTER, AFTER's ratio to
the HBM floor; the geomean speed-up per model and mode) and FILE.png beside it (speed-up per case, one panel per
pair), then prints the geomeans. Cases where either variant did not run ok are listed, not compared.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path


def read(paths):
    meta, cases = None, {}
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("type") == "meta":
                meta = meta or r
            elif r.get("type") == "case":
                cases[(r["dataset"], r["model"], r["mode"], r["system"])] = r
    if meta is None:
        raise SystemExit("ab.py: no meta record in " + ", ".join(map(str, paths)))
    return meta, cases


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def compare(meta, cases, before, after):
    """Rows (dataset, model, mode, before ms, after ms, speed-up, after / floor) and the cases left out."""
    rows, missing = [], []
    for ds in meta["datasets"]:
        for model in meta["models"]:
            for mode in meta["modes"]:
                a = cases.get((ds, model, mode, f"hectorgen_{before}"))
                b = cases.get((ds, model, mode, f"hectorgen_{after}"))
                if not a or not b or a["status"] != "ok" or b["status"] != "ok":
                    missing.append(f"{ds}/{model}/{mode}")
                    continue
                floor = b.get("floor_ms")
                rows.append((ds, model, mode, a["ms"], b["ms"], a["ms"] / b["ms"], b["ms"] / floor if floor else None))
    return rows, missing


def markdown(meta, pairs, title):
    out = [f"# {title}", "",
           f"- {meta['gpu']}, driver {meta['driver']}, torch {meta['torch']}, commit {meta['commit']}, {meta['date']}",
           f"- synthetic graphs, seed {meta['seed']}; medians of CUDA-event times, variants interleaved in one process "
           f"(bench/run.sh, --case-budget {meta['case_budget_s']} --max-iters {meta['max_iters']})", ""]
    for (before, after), (rows, missing) in pairs:
        out += [f"## {after} over {before}", "",
                f"| dataset | model | mode | {before} ms | {after} ms | speed-up | {after} / floor |",
                "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
        for ds, model, mode, a, b, s, f in rows:
            out.append(f"| {ds} | {model} | {mode} | {a:.3f} | {b:.3f} | {s:.2f}x | {f'{f:.1f}x' if f else '-'} |")
        out += ["", "| model | mode | geomean speed-up | min | max |", "| --- | --- | ---: | ---: | ---: |"]
        for model in meta["models"]:
            for mode in meta["modes"]:
                s = [r[5] for r in rows if r[1] == model and r[2] == mode]
                if s:
                    out.append(f"| {model} | {mode} | {geomean(s):.2f}x | {min(s):.2f}x | {max(s):.2f}x |")
        if missing:
            out += ["", "Not compared (a variant did not run ok): " + ", ".join(missing)]
        out.append("")
    return "\n".join(out)


def plot(pairs, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(len(pairs), 1, figsize=(13, 3.2 * len(pairs)), squeeze=False)
    for ax, ((before, after), (rows, _)) in zip(axes[:, 0], pairs):
        labels = [f"{ds}\n{model} {mode}" for ds, model, mode, *_ in rows]
        speed = [r[5] for r in rows]
        colours = ["tab:green" if s >= 1 else "tab:red" for s in speed]
        ax.bar(range(len(rows)), speed, color=colours)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, fontsize=5, rotation=90)
        ax.set_ylabel("speed-up")
        ax.set_title(f"{after} over {before} (above 1: {after} faster)", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+")
    p.add_argument("--pair", action="append", required=True, metavar="BEFORE:AFTER",
                   help="variant keys as in bench/systems.py, e.g. bf16_auto_rl32:bf16_auto")
    p.add_argument("--out", required=True, help="the markdown file (the PNG goes beside it)")
    p.add_argument("--title", default="A/B of two schedules")
    a = p.parse_args(argv)
    meta, cases = read(a.results)
    pairs = []
    for spec in a.pair:
        if spec.count(":") != 1:
            p.error(f"--pair {spec}: expected BEFORE:AFTER")
        before, after = spec.split(":")
        pairs.append(((before, after), compare(meta, cases, before, after)))
    out = Path(a.out)
    png = plot(pairs, out.with_suffix(".png"), a.title)
    text = markdown(meta, pairs, a.title)
    if png:
        text += f"\n![speed-up per case]({png.name})\n"
    out.write_text(text)
    for (before, after), (rows, _) in pairs:
        for model in meta["models"]:
            for mode in meta["modes"]:
                s = [r[5] for r in rows if r[1] == model and r[2] == mode]
                if s:
                    print(f"{after} over {before}: {model} {mode} geomean {geomean(s):.2f}x (min {min(s):.2f}x, max {max(s):.2f}x)")
    print(f"wrote {out}" + (f" and {png}" if png else " (no plot: matplotlib missing)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
