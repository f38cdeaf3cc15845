#!/usr/bin/env python3
"""End-to-end mini-batch GraphSAGE training with node features in host memory (issue 10, item 5, first half).

A synthetic graph (CSR on the GPU) whose float32 features (`--nodes` x `--dim`, 20.5 GB by default) live in
pinned host memory; a 2-layer GraphSAGE (mean aggregation) trained with mini-batches of `--batch` seed nodes and
neighbour fan-outs `--fanouts` (25,10), sampled on the GPU by minibatch.py (the GPU machines have no pyg-lib or
torch-sparse). Each epoch's mini-batches are fetched by
  pytorch   PyTorch's CPU-gather path: the sampled node ids to the CPU, index_select into pinned staging, one copy;
  unified   hectorgen_runtime: features[ids] on a GPU-affine unified tensor (gather, path chosen automatically);
  prefetch  the same, the next mini-batch's features gathered on a side stream while this one trains.
Same seeds, samples and initial weights in every mode; the epoch times and their ratios are printed and written
(sage_e2e.{json,log}) into --out (default $OUT, else bench/unified/results).

    python3 bench/unified/sage_e2e.py                                   # 10M nodes x 512 (20.5 GB), 200 batches
    python3 bench/unified/sage_e2e.py --nodes 1000000 --batches 20      # a quick look
"""

import argparse
import json
import os
import pathlib
import sys
import time

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "runtime" / "python"))
import hectorgen_runtime as hr  # noqa: E402

sys.path.insert(0, str(ROOT / "bench" / "unified"))
from minibatch import random_csr, random_unified_features, sample_batch  # noqa: E402  (the graph and the GPU sampler)

MODES = ("pytorch", "unified", "prefetch")


# ---------------------------------------------------------------------------------------------------------------
# Model


class Sage(torch.nn.Module):
    def __init__(self, dim_in: int, hidden: int, classes: int):
        super().__init__()
        self.self1 = torch.nn.Linear(dim_in, hidden)
        self.neigh1 = torch.nn.Linear(dim_in, hidden, bias=False)
        self.self2 = torch.nn.Linear(hidden, classes)
        self.neigh2 = torch.nn.Linear(hidden, classes, bias=False)

    def forward(self, x, blocks, num_hop1: int, num_seeds: int):
        local1, local2 = blocks
        # inner layer: hop-1 nodes from their sampled neighbours (rows of x)
        h = self.self1(x[:num_hop1]) + self.neigh1(x[local2].mean(1))
        h = F.relu(h)
        # outer layer: seeds from their hop-1 neighbours (rows of h)
        return self.self2(h[:num_seeds]) + self.neigh2(h[local1].mean(1))


# ---------------------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--degree", type=int, default=15, help="mean in-degree of the random graph")
    parser.add_argument("--classes", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--fanouts", default="25,10")
    parser.add_argument("--batches", type=int, default=200, help="mini-batches per epoch (the training nodes)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "unified" / "results"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sage_e2e: needs a CUDA GPU", file=sys.stderr)
        return 2
    modes = args.modes.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; known: {', '.join(MODES)}")
    fanouts = [int(f) for f in args.fanouts.split(",")]
    if len(fanouts) != 2:
        parser.error("--fanouts takes two fan-outs (outer layer, inner layer), e.g. 25,10")
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = (out_dir / "sage_e2e.log").open("w")

    def log(*parts):
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    device = torch.device("cuda")
    began = time.perf_counter()
    feature_bytes = args.nodes * args.dim * 4
    log(f"sage_e2e: {torch.cuda.get_device_name()} | {args.nodes} nodes x {args.dim} float32 = "
        f"{feature_bytes / 1e9:.1f} GB of features in host memory | batch {args.batch}, fan-outs {fanouts}, "
        f"{args.batches} batches per epoch | modes {modes}")
    hr.load_extension()
    generator = torch.Generator(device=device).manual_seed(0)
    row_ptr, col = random_csr(args.nodes, args.degree, generator, device)
    labels = torch.randint(0, args.classes, (args.nodes,), device=device, generator=generator)
    train = torch.randperm(args.nodes, device=device, generator=generator)[: args.batches * args.batch]
    log(f"graph: {col.numel()} edges on the GPU ({time.perf_counter() - began:.1f} s)")

    features = random_unified_features(args.nodes, args.dim, generator, device)
    log(f"features: {feature_bytes / 1e9:.1f} GB unified (pinned, mapped) ({time.perf_counter() - began:.1f} s)")

    # Samples are drawn once and replayed in every mode: the modes differ only in how features arrive.
    sample_generator = torch.Generator(device=device).manual_seed(1)
    samples = [sample_batch(row_ptr, col, train[b * args.batch:(b + 1) * args.batch], fanouts, sample_generator)
               for b in range(args.batches)]
    rows = sum(s[0].numel() for s in samples)
    log(f"samples: {rows / args.batches:.0f} input rows per batch on average "
        f"({rows * args.dim * 4 / args.batches / 1e6:.0f} MB) ({time.perf_counter() - began:.1f} s)")
    largest = max(s[0].numel() for s in samples)
    stage = torch.empty(largest, args.dim).pin_memory()
    plain = features.plain()

    def fetch_pytorch(ids):
        ids_cpu = ids.cpu()
        staged = stage[: ids_cpu.numel()]
        torch.index_select(plain, 0, ids_cpu, out=staged)
        return staged.to(device, non_blocking=True)

    def fetch_unified(ids):
        return features[ids]

    initial = Sage(args.dim, args.hidden, args.classes).to(device).state_dict()
    results = {}
    side = torch.cuda.Stream()
    for mode in modes:
        model = Sage(args.dim, args.hidden, args.classes).to(device)
        model.load_state_dict(initial)
        optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
        fetch = fetch_pytorch if mode == "pytorch" else fetch_unified

        def train_step(x, sample, seeds):
            ids, blocks, num_hop1 = sample
            logits = model(x, blocks, num_hop1, seeds.numel())
            loss = F.cross_entropy(logits, labels[seeds])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            return loss

        # warm-up: one batch (kernels, calibration, allocator), not timed
        train_step(fetch(samples[0][0]), samples[0], train[: args.batch])
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = None
        if mode == "prefetch":
            with torch.cuda.stream(side):
                upcoming = hr.gather(features, samples[0][0], check=False)
            for b in range(args.batches):
                torch.cuda.current_stream().wait_stream(side)
                x = upcoming
                x.record_stream(torch.cuda.current_stream())
                if b + 1 < args.batches:
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        upcoming = hr.gather(features, samples[b + 1][0], check=False)
                loss = train_step(x, samples[b], train[b * args.batch:(b + 1) * args.batch])
                if (b + 1) % 50 == 0:
                    log(f"  {mode}: batch {b + 1}/{args.batches}, loss {loss.item():.3f}")
            hr.check_gather_errors()
        else:
            for b in range(args.batches):
                x = fetch(samples[b][0])
                loss = train_step(x, samples[b], train[b * args.batch:(b + 1) * args.batch])
                if (b + 1) % 50 == 0:
                    log(f"  {mode}: batch {b + 1}/{args.batches}, loss {loss.item():.3f}")
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        results[mode] = {"epoch_s": seconds, "final_loss": float(loss)}
        log(f"{mode}: epoch {seconds:.2f} s ({seconds / args.batches * 1e3:.1f} ms per batch), "
            f"final loss {float(loss):.4f}")

    if "pytorch" in results:
        for mode in results:
            if mode != "pytorch":
                log(f"{mode} vs pytorch: {results['pytorch']['epoch_s'] / results[mode]['epoch_s']:.2f}x faster")
    summary = {"device": torch.cuda.get_device_name(), "args": vars(args), "feature_bytes": feature_bytes,
               "input_rows_per_batch": rows / args.batches, "results": results}
    (out_dir / "sage_e2e.json").write_text(json.dumps(summary, indent=1) + "\n")
    log(f"sage_e2e: done in {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
