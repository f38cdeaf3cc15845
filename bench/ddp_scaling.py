#!/usr/bin/env python3
"""Data-parallel scaling of training on generated layers: tools/ddp_train.py under torchrun on 1, 2, 4 (8) GPUs.

    python3 bench/ddp_scaling.py --run [--graphs mag,wikikg2] [--models rgat] [--gpus 1,2,4] [--modes khop]
                                 [--shards stride,cost] [--steps 30] [--warmup 5] [--batch 16384] [--sync-debug-run]
                                 --generated DIR --out FILE.jsonl [--budget-s 420]
    python3 bench/ddp_scaling.py --report A.jsonl [B.jsonl ...]   ->  bench/ddp_scaling.md, bench/ddp_scaling.png

--run launches, per graph, model, mode and GPU count, ``torchrun --standalone --nproc_per_node=N
tools/ddp_train.py`` over NCCL (NVLink multicast kept off: NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1, forced in the children's environment), every run appending its per-step records and its
summary to FILE (tools/ddp_train.py's own per-phase timing of every rank included). The global batch (--batch
labelled nodes) is the same for every GPU count (strong scaling): N
GPUs split it, so the speed-up is T(1 GPU) / T(N GPUs) per step and the efficiency speed-up / N. The graphs are
generated (and cached, bench/datasets.py) once before the first launch. A run that would start after --budget-s
seconds is skipped and says so. --shards: how a batch is split (tools/ddp_train.py --shard; "cost" runs only on 2
or more GPUs, one GPU being the same either way). --sync-debug-run adds, per graph and model, a 2-GPU run (1 GPU
where there is one) that counts the host synchronisations per phase (--sync-debug; tagged "syncdebug", not in the
scaling table).

Modes (docs/distributed.md): khop (default) runs each rank on the exact 2-hop in-neighbourhood subgraph of its own
nodes, so a rank's work shrinks with its shard; full runs every rank over the whole graph (replicated full-graph
training: the step cannot get faster with more GPUs, only the all-reduce is added; measured for reference).

--report reads the summaries (kind "summary") of any number of such files and writes the table (step time, labelled
nodes per second, speed-up, efficiency, per graph, model, mode and shard), the per-phase breakdown (fastest and
slowest rank per phase; docs/distributed.md explains how to read it), the host synchronisations per phase of the
--sync-debug runs, and a plot of throughput and efficiency.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def lst(s: str) -> list:
    return [x for x in s.split(",") if x]


def log(msg: str) -> None:
    print(f"[ddp_scaling] {msg}", flush=True)


def run(a) -> int:
    import torch
    sys.path.insert(0, str(HERE))
    import datasets

    have = torch.cuda.device_count() if a.device == "cuda" else max(a.gpus)
    gpus = [n for n in a.gpus if n <= have]
    if not gpus:
        log(f"no GPU count of {a.gpus} fits the {have} GPU(s) here")
        return 1
    if len(gpus) < len(a.gpus):
        log(f"{have} GPU(s) here: skipping {[n for n in a.gpus if n > have]}")
    t0 = time.time()
    for g in a.graphs:
        t = time.time()
        datasets.synthetic(g, seed=a.seed, scale=a.scale)   # generated and cached once, before any rank wants it
        log(f"graph {g}: ready in {time.time() - t:.1f} s (cache {datasets.cache_dir()})")
    env = dict(os.environ, **NO_MULTICAST, PYTHONUNBUFFERED="1")
    # (graph, model, mode, shard, GPUs, extra arguments, tag): the first shard's runs first (with 1 GPU), then the
    # other shards' (2 GPUs and more), then the --sync-debug runs, so that a short budget cuts the extras
    jobs = [(g, m, mode, sh, n, [], "scaling") for i, sh in enumerate(a.shards) for g in a.graphs
            for m in a.models for mode in a.modes for n in gpus if i == 0 or n > 1]
    if a.sync_debug_run:
        n = max(k for k in gpus if k <= 2)   # 2 GPUs where there are: DDP's own synchronisations count too
        jobs += [(g, m, a.modes[0], a.shards[0], n, ["--sync-debug", "--steps", "10"], "syncdebug")
                 for g in a.graphs for m in a.models]
    failed = 0
    for g, m, mode, sh, n, extra, tag in jobs:
        what = f"{g} {m} {mode} shard {sh} on {n} GPU(s){' ' + tag if tag != 'scaling' else ''}"
        left = a.budget_s - (time.time() - t0)
        if left < a.min_run_s:
            log(f"SKIP {what}: {left:.0f} s left of --budget-s {a.budget_s:.0f}")
            failed += 1
            continue
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
               str(REPO / "tools" / "ddp_train.py"), "--graph", g, "--model", m, "--mode", mode, "--shard", sh,
               "--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch),
               "--generated", a.generated, "--out", a.out, "--tag", tag, "--seed", str(a.seed),
               "--scale", str(a.scale), *extra]
        if a.bucket_mb is not None:
            cmd += ["--bucket-mb", str(a.bucket_mb)]
        cmd += ["--backend", "nccl"] if a.device == "cuda" else ["--device", "cpu", "--backend", "gloo"]
        log(f"{what}: {' '.join(cmd[2:])}")
        t = time.time()
        try:
            rc = subprocess.run(cmd, env=env, timeout=min(left, a.run_timeout_s)).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        log(f"{what}: rc {rc} in {time.time() - t:.0f} s")
        failed += rc != 0
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------------------


PHASES = ("select", "khop", "prepare", "forward", "loss", "backward", "allreduce", "optimizer")   # ddp_train.PHASES


def load_summaries(paths, tag=None) -> list:
    """The summaries of the files, --check runs left out; with ``tag``, those of that tag only, else all but the
    --sync-debug runs. Each file is one run (one machine): its records carry the file's stem as ``run``."""
    rows = []
    for p in paths:
        for line in Path(p).read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if r.get("kind") != "summary" or r.get("check"):
                    continue
                if (r.get("tag") == tag) if tag is not None else not r.get("sync_debug"):
                    rows.append(dict(r, run=Path(p).stem))
    return rows


def table(rows: list) -> list:
    """One entry per (graph, model, mode, run, shard, GPUs), the last record of each, with speed-up and efficiency
    against the 1-GPU record of the same graph, model, mode and run (with one GPU the shard makes no difference; None
    without one). Runs on different machines are never compared with each other, even with the same GPU type."""
    last = {}
    for r in rows:
        system = (r.get("gpu") or "cpu", r.get("run", ""))
        last[(r["graph"], r["model"], r["mode"], system, r.get("shard", "stride"), r["world_size"])] = r
    out = []
    for key in sorted(last, key=lambda k: (k[0], k[1], k[2], str(k[3]), k[5], k[4] != "stride", k[4])):
        r = last[key]
        base = last.get(key[:4] + ("stride", 1)) or next(
            (v for k, v in last.items() if k[:4] == key[:4] and k[5] == 1), None)
        speedup = base["median_step_ms"] / r["median_step_ms"] if base else None
        out.append(dict(graph=key[0], model=key[1], mode=key[2], gpu=key[3][0], run=key[3][1], shard=key[4],
                        gpus=key[5],
                        batch=r["batch"], step_ms=r["median_step_ms"], mean_ms=r.get("mean_step_ms"),
                        nodes_s=r["throughput_nodes_s"], speedup=speedup,
                        efficiency=speedup / key[5] if speedup else None, loss=(r["loss_first"], r["loss_last"]),
                        nodes=r["num_nodes"], edges=r["num_edges"], torch=r.get("torch"), ddp=r.get("ddp") or {},
                        phases=r.get("phases"), prefetch=r.get("prefetch"), timed=r.get("timed_steps"),
                        subgraph_edges=r.get("subgraph_edges"), imbalance=r.get("edge_imbalance")))
    return out


def _span(lo: float, hi: float) -> str:
    """fastest–slowest rank, one number when they agree to 0.01 ms."""
    return f"{hi:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}"


def phase_rows(entries: list) -> list:
    """The per-phase breakdown's table rows (entries with a per-phase timing)."""
    lines = ["| run | graph | model | shard | GPUs | " + " | ".join(PHASES) + " | step mean / median | subgraph edges "
             "per rank, min–max (max / mean) |", "|---|---|---|---|---:|" + "---:|" * len(PHASES) + "---:|---:|"]
    for e in entries:
        if not e["phases"]:
            continue
        cells = [_span(e["phases"][k]["gpu_min"], e["phases"][k]["gpu_max"]) if k in e["phases"] else "-"
                 for k in PHASES]
        se = e["subgraph_edges"] or [0]
        edges = "-" if not max(se) else (f"{min(se):,.0f}–{max(se):,.0f} ({e['imbalance']:.2f})" if len(se) > 1
                                         else f"{se[0]:,.0f}")
        lines.append(f"| {e['run']} | {e['graph']} | {e['model']} | {e['shard']}{' +prefetch' if e['prefetch'] else ''} | "
                     f"{e['gpus']} | " + " | ".join(cells) +
                     f" | {e['mean_ms']:.2f} / {e['step_ms']:.2f} | {edges} |")
    return lines


def sync_rows(rows: list) -> list:
    """Host synchronisations per step and phase of the --sync-debug runs."""
    lines = ["| run | graph | model | mode | GPUs | " + " | ".join(PHASES) + " |",
             "|---|---|---|---|---:|" + "---:|" * len(PHASES)]
    for r in rows:
        if r.get("phases") and r.get("gpu"):   # (CPU runs have nothing to count)
            lines.append(f"| {r['run']} | {r['graph']} | {r['model']} | {r['mode']} | {r['world_size']} | " +
                         " | ".join(f"{max(r['phases'][k]['syncs']):g}" for k in PHASES) + " |")
    return lines


def markdown(entries: list, sources: list, syncs: list = ()) -> str:
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    lines = ["# Data-parallel scaling (DDP over NCCL)", "",
             "Made by `python3 bench/ddp_scaling.py --report " + " ".join(Path(s).name for s in sources) + "` from "
             "runs of `bench/ddp_run.sh` (tools/ddp_train.py under torchrun, one process per GPU; "
             "docs/distributed.md). Strong scaling: the global batch of labelled nodes is the same for every GPU "
             "count; step time is the median (and mean) over the steps after the warm-up, as the slowest rank saw "
             "it; throughput is labelled nodes per second at the median; speed-up is against 1 GPU of the same run "
             "(a run: one input file, one machine); "
             "efficiency is speed-up / GPUs. Shard: how a batch is split over the ranks (stride: every N-th node; "
             "cost: balanced by 2-hop in-neighbourhood size).", "",
             "All-reduce: DDP's own measurement of one sampled step, the time its bucket all-reduces took "
             "and, in parentheses, how much of it overlapped the backward's computation (it includes the wait for "
             "the slowest rank: see the breakdown below).", "",
             "| graph | model | mode | shard | GPU (run) | GPUs | global batch | step (ms) median / mean | "
             "labelled nodes/s | speed-up | efficiency | all-reduce ms (overlapped) | loss first → last |",
             "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for e in entries:
        lines.append(f"| {e['graph']} ({e['nodes']:,} nodes, {e['edges']:,} edges) | {e['model']} | {e['mode']} | "
                     f"{e['shard']} | {e['gpu']} ({e['run']}) | {e['gpus']} | {e['batch']} | {e['step_ms']:.2f} / "
                     f"{f(e['mean_ms'], '.2f')} | {e['nodes_s']:,.0f} | "
                     f"{f(e['speedup'], '.2f')} | {f(e['efficiency'], '.0%')} | "
                     f"{f(e['ddp'].get('allreduce_ms'), '.2f')} ({f(e['ddp'].get('overlap_ms'), '.2f')}) | "
                     f"{e['loss'][0]:.3f} → {e['loss'][1]:.3f} |")
    if any(e["phases"] for e in entries):
        lines += ["", "## Where a step goes", "",
                  "Per phase, ms per step on the GPU's timeline (CUDA events on each rank, mean over the timed steps), "
                  "fastest–slowest rank (one number when they agree). select: the rank's nodes of the batch, "
                  "copied to the GPU; khop: its 2-hop in-neighbourhood; prepare: prepare_graph of that subgraph "
                  "(+prefetch: these three run on a side stream during the previous step, off the critical path "
                  "unless they take longer than it); forward, loss, backward (until the last gradient bucket is "
                  "ready); allreduce: from then until the reduction is done, i.e. the NCCL transfer plus the wait for "
                  "the slowest rank; optimizer. A phase's time includes the time its stream waited for the host. "
                  "The last column is the mean subgraph size per rank; max / mean > 1 is load imbalance.", ""]
        lines += phase_rows(entries)
    if syncs:
        lines += ["", "## Host synchronisations per step", "",
                  "From the `--sync-debug` runs (torch.cuda.set_sync_debug_mode(\"warn\"), counted per phase; "
                  "synchronisations inside compiled extensions that bypass torch are not seen).", ""]
        lines += sync_rows(syncs)
    return "\n".join(lines) + "\n"


def plot(entries: list, path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series = {}
    for e in entries:
        series.setdefault((e["run"], e["graph"], e["model"], e["mode"], e["shard"]), []).append(e)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    for (run, g, m, mode, sh), es in sorted(series.items()):
        es = sorted(es, key=lambda e: e["gpus"])
        if sh != "stride":   # its 1-GPU point is the stride series' one
            base = series.get((run, g, m, mode, "stride"), [])
            es = sorted([e for e in base if e["gpus"] == 1] + es, key=lambda e: e["gpus"])
        label = f"{g} {m} {mode} {sh}, {run.removeprefix('ddp_scaling-')}"
        n = [e["gpus"] for e in es]
        line = ax1.plot(n, [e["nodes_s"] for e in es], marker="o", ls="-" if sh == "stride" else "--",
                        label=label)[0]
        if es[0]["gpus"] == 1:
            ax1.plot(n, [es[0]["nodes_s"] * k for k in n], ls=":", color=line.get_color(), lw=0.8)
        ax2.plot(n, [e["efficiency"] if e["efficiency"] is not None else float("nan") for e in es], marker="o",
                 ls=line.get_linestyle(), color=line.get_color(), label=label)
    gpus = sorted({e["gpus"] for e in entries})
    for ax in (ax1, ax2):
        ax.set_xlabel("GPUs")
        ax.set_xticks(gpus)
        ax.grid(alpha=0.3)
    ax1.set_ylabel("labelled nodes / s (dotted: linear)")
    ax1.set_yscale("log")
    ax2.set_ylabel("parallel efficiency")
    ax2.set_ylim(0, 1.15)
    ax1.legend(fontsize=6, ncol=2)
    kinds = sorted({e["gpu"] or "cpu" for e in entries})
    fig.suptitle(f"DDP training on generated layers, strong scaling ({', '.join(kinds)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    return True


def report(a) -> int:
    rows = load_summaries(a.report)
    if not rows:
        log(f"no summaries in {a.report}")
        return 1
    entries = table(rows)
    md = markdown(entries, a.report, load_summaries(a.report, tag="syncdebug"))
    Path(a.md).write_text(md)
    print(md)
    log(f"wrote {a.md}" + (f" and {a.png}" if plot(entries, Path(a.png)) else " (no matplotlib: no plot)"))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="store_true", help="launch the runs")
    p.add_argument("--report", nargs="+", metavar="JSONL", help="write the table and plot from these files")
    p.add_argument("--graphs", type=lst, default=["mag", "wikikg2"])
    p.add_argument("--models", type=lst, default=["rgat"])
    p.add_argument("--modes", type=lst, default=["khop"])
    p.add_argument("--gpus", type=lambda s: [int(x) for x in lst(s)], default=[1, 2, 4])
    p.add_argument("--shards", type=lst, default=["stride"], help="stride, cost (tools/ddp_train.py --shard)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    p.add_argument("--sync-debug-run", action="store_true",
                   help="a 1-GPU run per graph and model counting host synchronisations per phase")
    p.add_argument("--batch", type=int, default=16384, help="global batch of labelled nodes (all GPU counts)")
    p.add_argument("--bucket-mb", type=float, default=None, help="DDP bucket size (default: tools/ddp_train.py's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a dry run of the runner (processes instead of GPUs, gloo, the stand-in layers)")
    p.add_argument("--scale", type=float, default=1.0, help="shrink the graphs (dry runs)")
    p.add_argument("--generated", default=str(REPO / "build" / "bench" / "gen"))
    p.add_argument("--out", default=str(REPO / "out" / "ddp" / "ddp_scaling.jsonl"))
    p.add_argument("--budget-s", type=float, default=420.0, help="no run starts after this many seconds")
    p.add_argument("--min-run-s", type=float, default=25.0, help="a run needs at least this much budget left")
    p.add_argument("--run-timeout-s", type=float, default=150.0)
    p.add_argument("--md", default=str(HERE / "ddp_scaling.md"))
    p.add_argument("--png", default=str(HERE / "ddp_scaling.png"))
    a = p.parse_args(argv)
    if a.run == bool(a.report):
        p.error("give --run or --report FILES")
    if a.run:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        return run(a)
    return report(a)


if __name__ == "__main__":
    sys.exit(main())
