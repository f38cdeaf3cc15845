#!/usr/bin/env python3
"""Fits the tuning table of materialization: auto (templates/tuning/materialization.json) to measured times.

    python3 bench/calibrate_auto.py results-*.jsonl

Input: a benchmark run with a `<dtype>_auto` variant beside `<dtype>_reorder` and `<dtype>_compact_reorder` (or, from
runs before the auto variant reordered, `<dtype>` and `<dtype>_compact`; bench/README.md). Each
auto case records the cost model's terms of both programs on its graph and mode (`cost_terms`: kernel launches and
bytes moved); the fixed variants' measured times of the same case are what each program costs. Per GPU
architecture, launch_us and bandwidth_gbs are fitted by least squares on the relative error of

    measured seconds = launches * launch_us * 1e-6 + bytes / (bandwidth_gbs * 1e9)

over every (case, program) pair, and the choices are re-counted: how often the cheaper estimate is the faster
program, with the table the modules were generated with and with the fitted one. theta is not fitted here (it
needs runs with compact_relations masks per relation). Paste the printed rows into the table and regenerate.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402  (reads results files)


def observations(recs) -> dict:
    """{arch: [(launches, bytes, measured seconds, case key, program)]} from the auto cases whose fixed variants ran."""
    ok = lambda r: r is not None and r.get("status") == "ok" and r.get("ms")  # noqa: E731
    out = defaultdict(list)
    for (d, m, mode, system), r in recs["cases"].items():
        if not (ok(r) and r.get("cost_terms") and system.endswith("_auto")):
            continue
        base = system[: -len("_auto")]
        # The auto variant reorders where it pays (reorder: auto): its programs are timed as the fixed variants with
        # reordering when those ran, else as the plain ones.
        reordered = (d, m, mode, base + "_reorder") in recs["cases"]
        suffix = "_reorder" if reordered else ""
        for program, fixed in (("vanilla", base + suffix), ("compact", base + "_compact" + suffix)):
            f = recs["cases"].get((d, m, mode, fixed))
            terms = r["cost_terms"].get(program)
            if ok(f) and terms:
                out[r.get("arch", "default")].append((terms[0], terms[1], f["ms"] * 1e-3, (d, m, mode, system), program))
    return out


def fit(obs) -> tuple:
    """(launch_us, bandwidth_gbs) minimising sum(((a * launches + b * bytes) / t - 1)^2) with a, b >= 0."""
    rows = [(n / t, byt / t) for n, byt, t, *_ in obs]
    saa = sum(x * x for x, _ in rows)
    sbb = sum(y * y for _, y in rows)
    sab = sum(x * y for x, y in rows)
    sa = sum(x for x, _ in rows)
    sb = sum(y for _, y in rows)
    det = saa * sbb - sab * sab
    a = b = None
    if det > 0:
        a, b = (sa * sbb - sb * sab) / det, (sb * saa - sa * sab) / det
    if a is None or a < 0 or b is None or b <= 0:  # one term explains the data: fit it alone (a >= 0, b > 0)
        a, b = 0.0, sb / sbb if sbb > 0 else 0.0
    if b <= 0:
        raise ValueError("the fit found no bandwidth term: are the byte counts all zero?")
    return a * 1e6, 1.0 / b / 1e9


def picks_right(obs, launch_us: float, bandwidth_gbs: float) -> tuple:
    """(cases where the cheaper estimate is the faster program, cases with both programs measured)."""
    by_case = defaultdict(dict)
    for n, byt, t, key, program in obs:
        by_case[key][program] = (n * launch_us * 1e-6 + byt / (bandwidth_gbs * 1e9), t)
    right = total = 0
    for progs in by_case.values():
        if len(progs) != 2:
            continue
        total += 1
        est = min(progs, key=lambda p: (progs[p][0], p != "vanilla"))
        right += progs[est][1] <= min(v[1] for v in progs.values())
    return right, total


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="bench.py JSON lines (any number of parts)")
    p.add_argument("--table", default=str(Path(__file__).resolve().parents[1] / "templates" / "tuning" /
                                          "materialization.json"), help="the tuning table to compare with")
    a = p.parse_args(argv)
    table = json.loads(Path(a.table).read_text())["architectures"]
    obs = observations(report.read(a.results))
    if not obs:
        print("no auto case with both fixed variants measured (run --variants <dtype>,<dtype>_compact,<dtype>_auto)")
        return 1
    for arch, o in sorted(obs.items()):
        launch_us, bandwidth_gbs = fit(o)
        row = table.get(arch, table["default"])
        before = picks_right(o, row["launch_us"], row["bandwidth_gbs"])
        after = picks_right(o, launch_us, bandwidth_gbs)
        rel = [abs((n * launch_us * 1e-6 + byt / (bandwidth_gbs * 1e9)) / t - 1) for n, byt, t, *_ in o]
        print(f"{arch}: {len(o)} measured programs; fitted launch_us {launch_us:.2f}, bandwidth_gbs {bandwidth_gbs:.0f} "
              f"(median relative error {sorted(rel)[len(rel) // 2]:.2f}); the faster program picked in {after[0]}/"
              f"{after[1]} cases (table's values: {before[0]}/{before[1]})")
        print(f'    "{arch}": {{"launch_us": {launch_us:.1f}, "bandwidth_gbs": {bandwidth_gbs:.0f}, '
              f'"theta": {row["theta"]}}},')
        if not math.isfinite(launch_us + bandwidth_gbs):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
