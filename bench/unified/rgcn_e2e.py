#!/usr/bin/env python3
"""End-to-end mini-batch RGCN training on hectorgen-generated layers, node features in host memory (issue 10, item 5,
second half). Run it through rgcn_e2e.sh, which finds hectorgen and builds the hectorgen runtime first.

A synthetic heterogeneous graph (CSR on the GPU, `--relations` edge types drawn uniformly) whose float32 features
(`--nodes` x `--dim`, 20.5 GB by default) live in pinned host memory; a 2-layer RGCN (dim -> hidden -> classes, ReLU
between) trained with mini-batches of `--batch` seed nodes and fan-outs `--fanouts` (25,10) sampled on the GPU by
minibatch.py with each sampled edge's type kept. Both layers are modules that hectorgen generates from specs/rgcn.json
(the dimensions and `--dtype`, default tf32, replaced): the inner one with `--unified-inputs=feature
--indexed-inputs=feature`, so it takes a table and `feature_rows` (node v of the mini-batch reads table row
feature_rows[v]; docs/unified_tensor.md), the outer one plain. The inner layer's graph has every input node (the
sampled hop-2 nodes and the hop-1 nodes, which come first) and the edges hop-2 -> hop-1; the outer layer's has the
hop-1 nodes (the seeds first) and the edges hop-1 -> seeds. Each epoch's features reach the inner layer by
  pytorch   PyTorch's CPU-gather path: the sampled node ids to the CPU, index_select into pinned staging, one copy;
            the layer reads that CUDA tensor (through the identity map)
  unified   none: the layer reads the unified table through feature_rows = the sampled node ids, its GEMMs
            gathering the rows over PCIe (no intermediate copy)
  gather    hectorgen_runtime's gather (features[ids] on the unified tensor), then the layer as in pytorch
  prefetch  the same, the next mini-batch's features gathered on a side stream while this one trains
Same seeds, samples, graphs and initial weights in every mode, and the same kernels reading the same values, so the
losses must agree: every batch's loss is compared at the end (bit for bit, else within 1e-4: exit status 1 if not).
The epoch times, their ratios and the losses are printed and written (rgcn_e2e.{json,log}) into --out (default $OUT,
else bench/unified/results).

    bench/unified/rgcn_e2e.sh                  # 10M nodes x 512 (20.5 GB), 8 relations, 200 batches
    bench/unified/rgcn_e2e.sh --quick          # 200K nodes, 20 batches
"""

import argparse
import importlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "unified"))
from minibatch import random_csr, random_unified_features, sample_batch  # noqa: E402  (the graph and the GPU sampler)

MODES = ("pytorch", "unified", "gather", "prefetch")
SIZES = {"nodes": (10_000_000, 200_000), "batches": (200, 20)}  # (default, --quick)
INNER, OUTER = "rgcn_e2e_inner", "rgcn_e2e_outer"  # the generated modules (distinct names: distinct torch ops)
INNER_FLAGS = ("--unified-inputs=feature", "--indexed-inputs=feature")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"a small run: {SIZES['nodes'][1]} nodes, {SIZES['batches'][1]} batches "
                             "(unless given)")
    parser.add_argument("--nodes", type=int, help=f"default {SIZES['nodes'][0]}")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--relations", type=int, default=8)
    parser.add_argument("--degree", type=int, default=15, help="mean in-degree of the random graph")
    parser.add_argument("--classes", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--fanouts", default="25,10")
    parser.add_argument("--batches", type=int, help=f"mini-batches per epoch (the training nodes); default "
                                                    f"{SIZES['batches'][0]}")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--materialization", default="vanilla", choices=("vanilla", "compact"),
                        help="options.materialization of both generated layers")
    parser.add_argument("--dtype", default="tf32", choices=("tf32", "fp32"),
                        help="options.dtype of both generated layers (features and weights stay float32): tf32 runs "
                             "the GEMMs whose dimensions are multiples of 64 on tensor cores, in 64 x 64 tiles; fp32 "
                             "runs every GEMM in 16 x 16 SIMT tiles, which read each input row once per 16 output "
                             "columns (over PCIe in the unified mode)")
    parser.add_argument("--hectorgen", default=str(ROOT / "build" / "hectorgen"))
    parser.add_argument("--work", default=str(ROOT / "build" / "bench" / "rgcn_e2e"),
                        help="where the layers are generated and built (kept: an unchanged module is not rebuilt)")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "unified" / "results"))
    args = parser.parse_args(argv)
    for name, (default, quick) in SIZES.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else default)
    args.modes = args.modes.split(",")
    unknown = set(args.modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    try:
        args.fanouts = [int(f) for f in args.fanouts.split(",")]
    except ValueError:
        parser.error(f"--fanouts takes two integers, got {args.fanouts!r}")
    if len(args.fanouts) != 2 or min(args.fanouts) < 1:
        parser.error("--fanouts takes two positive fan-outs (outer layer, inner layer), e.g. 25,10")
    for name in ("nodes", "dim", "relations", "degree", "classes", "hidden", "batch", "batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    if args.batch * args.batches > args.nodes:
        parser.error(f"{args.batches} batches of {args.batch} seeds need {args.batch * args.batches} training nodes, "
                     f"more than --nodes {args.nodes}")
    return args


# ---------------------------------------------------------------------------------------------------------------
# The generated layers


def layer_spec(name: str, in_dim: int, out_dim: int, materialization: str, dtype: str) -> dict:
    """specs/rgcn.json as the module `name`, for in_dim -> out_dim features."""
    spec = json.loads((ROOT / "specs" / "rgcn.json").read_text())
    spec["model"] = name
    spec["description"] = f"specs/rgcn.json for bench/unified/rgcn_e2e.py: {in_dim} -> {out_dim} features"
    spec["hyper"] = {"in_dim": in_dim, "out_dim": out_dim}
    spec["options"]["materialization"] = materialization
    spec["options"]["dtype"] = dtype
    return spec


def _files(folder: pathlib.Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def generate(hectorgen: str, spec: dict, flags, work: pathlib.Path) -> pathlib.Path:
    """Writes the module of `spec` into work/<model>; an output identical to the one there keeps that folder and
    its build (no rebuild)."""
    name = spec["model"]
    work.mkdir(parents=True, exist_ok=True)
    spec_path = work / f"{name}.json"
    spec_path.write_text(json.dumps(spec, indent=1) + "\n")
    out, new = work / name, work / f"{name}.new"
    shutil.rmtree(new, ignore_errors=True)
    result = subprocess.run([hectorgen, str(spec_path), "-o", str(new), *flags], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"hectorgen {spec_path.name} {' '.join(flags)} failed ({result.returncode}):\n"
                           f"{result.stderr[-3000:]}")
    if out.is_dir() and _files(out) == _files(new):
        shutil.rmtree(new)
    else:
        shutil.rmtree(out, ignore_errors=True)
        new.rename(out)
    return out


def build_layers(args, log):
    """Generates and builds both layers (in parallel), imports them: (inner module, outer module)."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    import gpu_check  # noqa: E402  (the one place that knows how generated modules are built)

    work = pathlib.Path(args.work)
    layers = [(layer_spec(INNER, args.dim, args.hidden, args.materialization, args.dtype), INNER_FLAGS),
              (layer_spec(OUTER, args.hidden, args.classes, args.materialization, args.dtype), ())]
    folders = [generate(args.hectorgen, spec, flags, work) for spec, flags in layers]
    names = ", ".join(f"{folder.name} ({spec['hyper']['in_dim']} -> {spec['hyper']['out_dim']})"
                      for folder, (spec, _) in zip(folders, layers))
    log(f"generated {names} in {work}")
    jobs = max(2, (os.cpu_count() or 4) // len(folders))
    began = time.perf_counter()
    with ThreadPoolExecutor(len(folders)) as pool:
        list(pool.map(lambda folder: gpu_check.build_extension(folder, jobs=jobs), folders))
    log(f"built in {time.perf_counter() - began:.0f} s")
    modules = []
    for folder in folders:
        sys.path.insert(0, str(folder))
        module = importlib.import_module(folder.name)
        module.load_extension(str(folder / "build"))
        modules.append(module)
    return modules


# ---------------------------------------------------------------------------------------------------------------
# Mini-batches and the model


def block_edges(local, types):
    """A sampled block as COO edges (src, dst, etype): target i <- local[i, j], of type types[i, j]."""
    targets, fanout = local.shape
    dst = torch.arange(targets, device=local.device).repeat_interleave(fanout)
    return local.reshape(-1), dst, types.reshape(-1)


@dataclass
class Batch:
    ids: torch.Tensor  # the input nodes' table rows, hop-1 nodes first (seeds first among them)
    graphs: tuple      # (outer: seeds <- hop-1 nodes, inner: hop-1 nodes <- hop-2 nodes), prepared
    num_hop1: int


def prepare_batch(sample, inner, outer, relations: int) -> Batch:
    """The two blocks of a typed sample as graphs of the generated layers: the inner layer's nodes are the input
    nodes (every one of which it reads), the outer layer's the hop-1 nodes."""
    ids, ((local1, types1), (local2, types2)), num_hop1 = sample
    return Batch(ids, (outer.prepare_graph(*block_edges(local1, types1), num_hop1, relations),
                       inner.prepare_graph(*block_edges(local2, types2), ids.numel(), relations)), num_hop1)


def layer_class(module, model: str):
    """The torch.nn.Module class of a generated module: its model name with the first letter capitalised."""
    return getattr(module, model[0].upper() + model[1:])


class Rgcn(torch.nn.Module):
    """Two generated RGCN layers with a ReLU between them; the inner one reads table[rows]."""

    def __init__(self, inner, outer, relations: int):
        super().__init__()
        self.inner = layer_class(inner, INNER)(relations)
        self.outer = layer_class(outer, OUTER)(relations)

    def forward(self, table, rows, batch: Batch):
        outer_graph, inner_graph = batch.graphs
        h = F.relu(self.inner(inner_graph, table, rows)[: batch.num_hop1])
        return self.outer(outer_graph, h)  # [hop-1 nodes, classes]; the seeds' rows first


TOLERANCE = 1e-4


def compare_losses(losses: dict) -> dict:
    """Every mode's per-batch losses against the first mode's: whether they are bit-identical, the largest
    difference, and whether every mode is within TOLERANCE (absolute and relative, torch.isclose) of the first."""
    modes = list(losses)
    reference = losses[modes[0]]
    others = [losses[m] for m in modes[1:]]
    return {"reference_mode": modes[0],
            "bit_identical": all(torch.equal(other, reference) for other in others),
            "max_abs_difference": max((float((other - reference).abs().max()) for other in others), default=0.0),
            "within_tolerance": all(bool(torch.isclose(other, reference, rtol=TOLERANCE, atol=TOLERANCE).all())
                                    for other in others)}


# ---------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("rgcn_e2e: needs a CUDA GPU", file=sys.stderr)
        return 2
    try:
        import hectorgen_runtime as hr  # the installed runtime (rgcn_e2e.sh): the generated modules build against it
    except ImportError as error:
        print(f"rgcn_e2e: no hectorgen_runtime ({error}); run bench/unified/rgcn_e2e.sh, which builds it",
              file=sys.stderr)
        return 2
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = (out_dir / "rgcn_e2e.log").open("w")

    def log(*parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    device = torch.device("cuda")
    began = time.perf_counter()
    feature_bytes = args.nodes * args.dim * 4
    log(f"rgcn_e2e: {torch.cuda.get_device_name()} | {args.nodes} nodes x {args.dim} float32 = "
        f"{feature_bytes / 1e9:.1f} GB of features in host memory | {args.relations} relations | RGCN {args.dim} -> "
        f"{args.hidden} -> {args.classes} ({args.dtype}, {args.materialization}) | batch {args.batch}, fan-outs "
        f"{args.fanouts}, {args.batches} batches per epoch | modes {args.modes}")
    inner, outer = build_layers(args, log)
    hr.load_extension()

    generator = torch.Generator(device=device).manual_seed(0)
    row_ptr, col = random_csr(args.nodes, args.degree, generator, device)
    etype = torch.randint(0, args.relations, (col.numel(),), device=device, generator=generator)
    labels = torch.randint(0, args.classes, (args.nodes,), device=device, generator=generator)
    train = torch.randperm(args.nodes, device=device, generator=generator)[: args.batches * args.batch]
    log(f"graph: {col.numel()} edges of {args.relations} types on the GPU ({time.perf_counter() - began:.1f} s)")

    features = random_unified_features(args.nodes, args.dim, generator, device)
    log(f"features: {feature_bytes / 1e9:.1f} GB unified (pinned, mapped) ({time.perf_counter() - began:.1f} s)")

    # Samples and their graphs are made once and replayed in every mode: the modes differ only in how features arrive.
    sample_generator = torch.Generator(device=device).manual_seed(1)
    batches = [prepare_batch(sample_batch(row_ptr, col, train[b * args.batch:(b + 1) * args.batch], args.fanouts,
                                          sample_generator, etype), inner, outer, args.relations)
               for b in range(args.batches)]
    del row_ptr, col, etype
    rows = sum(b.ids.numel() for b in batches) / args.batches
    edges = sum(b.graphs[1].num_edges for b in batches) / args.batches
    log(f"samples: {rows:.0f} input rows ({rows * args.dim * 4 / 1e6:.0f} MB) and {edges:.0f} inner-layer edges "
        f"per batch on average, graphs prepared ({time.perf_counter() - began:.1f} s)")
    largest = max(b.ids.numel() for b in batches)
    stage = torch.empty(largest, args.dim).pin_memory()
    identity = torch.arange(largest, device=device, dtype=torch.int32)
    plain = features.plain()

    def fetch_pytorch(batch):
        ids_cpu = batch.ids.cpu()
        staged = stage[: ids_cpu.numel()]
        torch.index_select(plain, 0, ids_cpu, out=staged)
        return staged.to(device, non_blocking=True), identity[: ids_cpu.numel()]

    def fetch_unified(batch):
        return features, batch.ids

    def fetch_gather(batch):
        return features[batch.ids], identity[: batch.ids.numel()]

    fetchers = {"pytorch": fetch_pytorch, "unified": fetch_unified, "gather": fetch_gather,
                "prefetch": fetch_gather}  # prefetch: only the warm-up step fetches; the epoch gathers ahead
    torch.manual_seed(2)
    model = Rgcn(inner, outer, args.relations).to(device)
    initial = {name: value.clone() for name, value in model.state_dict().items()}

    def train_step(optimiser, inputs, batch, seeds):
        logits = model(*inputs, batch)[: seeds.numel()]
        loss = F.cross_entropy(logits, labels[seeds])
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        return loss.detach()

    def fresh_optimiser():
        """The initial weights again and a new optimiser: every mode trains from the same state."""
        model.load_state_dict(initial)
        return torch.optim.Adam(model.parameters(), lr=1e-3)

    results, losses = {}, {}
    side = torch.cuda.Stream()
    progress = max(1, args.batches // 4)
    for mode in args.modes:
        # warm-up: one step (kernels, calibration, allocator), not timed
        train_step(fresh_optimiser(), fetchers[mode](batches[0]), batches[0], train[: args.batch])
        torch.cuda.synchronize()
        optimiser = fresh_optimiser()
        start = time.perf_counter()
        mode_losses = []
        if mode == "prefetch":
            with torch.cuda.stream(side):
                upcoming = hr.gather(features, batches[0].ids, check=False)
            for b, batch in enumerate(batches):
                torch.cuda.current_stream().wait_stream(side)
                x = upcoming
                x.record_stream(torch.cuda.current_stream())
                if b + 1 < args.batches:
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        upcoming = hr.gather(features, batches[b + 1].ids, check=False)
                seeds = train[b * args.batch:(b + 1) * args.batch]
                mode_losses.append(train_step(optimiser, (x, identity[: x.shape[0]]), batch, seeds))
                if (b + 1) % progress == 0:
                    log(f"  {mode}: batch {b + 1}/{args.batches}, loss {mode_losses[-1].item():.4f}")
            hr.check_gather_errors()
        else:
            for b, batch in enumerate(batches):
                seeds = train[b * args.batch:(b + 1) * args.batch]
                mode_losses.append(train_step(optimiser, fetchers[mode](batch), batch, seeds))
                if (b + 1) % progress == 0:
                    log(f"  {mode}: batch {b + 1}/{args.batches}, loss {mode_losses[-1].item():.4f}")
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        losses[mode] = torch.stack(mode_losses).cpu()
        final = float(losses[mode][-1])
        results[mode] = {"epoch_s": seconds, "final_loss": final}
        log(f"{mode}: epoch {seconds:.2f} s ({seconds / args.batches * 1e3:.1f} ms per batch), final loss {final:.6f}")

    if "pytorch" in results:
        for mode in results:
            if mode != "pytorch":
                ratio = results["pytorch"]["epoch_s"] / results[mode]["epoch_s"]
                results[mode]["speedup_vs_pytorch"] = ratio
                log(f"{mode} vs pytorch: speed-up {ratio:.2f}x")
    agreement = compare_losses(losses)
    summary = {"device": torch.cuda.get_device_name(), "args": vars(args), "feature_bytes": feature_bytes,
               "input_rows_per_batch": rows, "inner_edges_per_batch": edges, "results": results,
               "losses": agreement}
    (out_dir / "rgcn_e2e.json").write_text(json.dumps(summary, indent=1) + "\n")
    verdict = ("bit-identical" if agreement["bit_identical"] else
               f"equal within {TOLERANCE:g}" if agreement["within_tolerance"] else f"NOT equal within {TOLERANCE:g}")
    log(f"losses of every batch: {verdict} across modes (largest difference from {agreement['reference_mode']}'s: "
        f"{agreement['max_abs_difference']:.3g})")
    log(f"rgcn_e2e: done in {time.perf_counter() - began:.0f} s")
    if not agreement["within_tolerance"]:
        log("rgcn_e2e: FAILED: the modes trained differently")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
