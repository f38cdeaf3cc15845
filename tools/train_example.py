#!/usr/bin/env python3
"""Trains a 2-layer node classifier made of hectorgen-generated layers (RGCN, RGAT or HGT) on a synthetic
heterogeneous graph, through the generated backward kernels, and shows the loss going down.

    python3 tools/train_example.py --model rgat [--generated DIR] [--epochs 60] [--graph medium] [--out DIR]

DIR/<model>/ is the generated module (default: generated/); its extension is built with its CMakeLists.txt
when missing. Labels come from a random "teacher" that averages each node's in-neighbours, so the task needs
message passing. Prints a progress bar, the loss every few epochs, final accuracy, and writes
<out>/train_<model>.json and a loss plot <out>/train_<model>.png. Exits 1 if the loss did not go down.
"""
import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gpu_check import VARIANTS, load_generated, layer_class  # noqa: E402
from graphs import preset_graph  # noqa: E402


def progress(iterable, total, desc):
    try:
        from tqdm import tqdm
        return tqdm(iterable, total=total, desc=desc, ncols=90, file=sys.stdout)
    except ImportError:  # a plain text bar
        def bar():
            for i, x in enumerate(iterable):
                done = (i + 1) * 30 // total
                print(f"\r{desc} [{'#' * done}{'.' * (30 - done)}] {i + 1}/{total}", end="", flush=True)
                yield x
            print()
        return bar()


class Classifier(torch.nn.Module):
    """layer(graph) -> LayerNorm -> ReLU -> layer(graph) -> LayerNorm -> ReLU -> linear head."""

    def __init__(self, cls, num_etypes, num_ntypes, width, num_classes, norm=True):
        super().__init__()
        self.use_norm = norm
        self.layer1 = cls(num_etypes, num_ntypes=num_ntypes, device="cuda")
        self.layer2 = cls(num_etypes, num_ntypes=num_ntypes, device="cuda")
        self.norm1 = torch.nn.LayerNorm(width, device="cuda")
        self.norm2 = torch.nn.LayerNorm(width, device="cuda")
        self.head = torch.nn.Linear(width, num_classes, device="cuda")

    def forward(self, g, x):
        n = x.shape[0]
        norm1 = self.norm1 if self.use_norm else (lambda t: t)
        norm2 = self.norm2 if self.use_norm else (lambda t: t)
        h = F.relu(norm1(self.layer1(g, x).reshape(n, -1)))
        h = F.relu(norm2(self.layer2(g, h).reshape(n, -1)))
        return self.head(h)


def teacher_labels(graph, x, num_classes, seed):
    """argmax of (mean of in-neighbour features) @ T for a random T: learnable only through the edges."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = torch.randn(x.shape[1], num_classes, device="cuda", generator=gen)
    deg = torch.zeros(graph.num_nodes, device="cuda").index_add_(0, graph.dst, torch.ones_like(graph.dst, dtype=torch.float))
    agg = torch.zeros_like(x).index_add_(0, graph.dst, x[graph.src]) / deg.clamp(min=1).unsqueeze(1)
    return (agg @ T).argmax(1), deg > 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="rgat", choices=sorted(VARIANTS))
    p.add_argument("--generated", default=str(REPO / "generated"))
    p.add_argument("--graph", default="small", help="graph preset of tests/gpu/graphs.py (small, medium, ...)")
    p.add_argument("--epochs", type=int, default=60)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-norm", action="store_true", help="no LayerNorm between the layers")
    p.add_argument("--out", default=None, help="folder for the JSON log and the loss plot")
    a = p.parse_args(argv)

    torch.manual_seed(a.seed)
    variant = VARIANTS[a.model]
    gen_dir = Path(a.generated)
    mod = load_generated(variant, gen_dir, build=not (gen_dir / variant.name / "build").is_dir())
    if not getattr(mod, "TRAINABLE", False):
        print(f"{a.model}: the generated module has no backward pass (TRAINABLE is False)")
        return 1
    cls = layer_class(mod, variant, variant.name)

    graph = preset_graph(a.graph, seed=a.seed).to("cuda")
    N, R, T = graph.num_nodes, graph.num_etypes, graph.num_ntypes
    g = mod.prepare_graph(graph.src, graph.dst, graph.etype, N, R, ntype=graph.ntype, num_ntypes=T)
    in_dim = 64
    x = torch.randn(N, in_dim, device="cuda")
    y, has_in = teacher_labels(graph, x, a.classes, a.seed + 1)
    perm = torch.randperm(N, device="cuda")
    train = torch.zeros(N, dtype=torch.bool, device="cuda")
    train[perm[: int(0.7 * N)]] = True
    train &= has_in
    test = ~train & has_in

    model = Classifier(cls, R, T, in_dim, a.classes, norm=not a.no_norm)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    print(f"{a.model}: 2-layer classifier on '{a.graph}' ({N} nodes, {graph.num_edges} edges, {R} relations, "
          f"{T} node types), {sum(p.numel() for p in model.parameters())} parameters, {a.classes} classes")
    losses, times = [], []
    for epoch in progress(range(a.epochs), a.epochs, f"{a.model} training"):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(g, x)[train], y[train])
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            print(f"\nepoch {epoch}: loss is {losses[-1]}")
            return 1
    with torch.no_grad():
        pred = model(g, x).argmax(1)
    train_acc = (pred[train] == y[train]).float().mean().item()
    test_acc = (pred[test] == y[test]).float().mean().item()
    step = max(1, a.epochs // 10)
    for e in range(0, a.epochs, step):
        print(f"epoch {e:4d}  loss {losses[e]:.4f}")
    ms = sorted(times[1:] or times)[len(times[1:] or times) // 2] * 1e3
    print(f"epoch {a.epochs - 1:4d}  loss {losses[-1]:.4f}")
    print(f"{a.model}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, train accuracy {train_acc:.3f}, "
          f"test accuracy {test_acc:.3f} (chance {1 / a.classes:.3f}), median step {ms:.2f} ms")
    ok = losses[-1] < 0.7 * losses[0]
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"train_{a.model}.json").write_text(json.dumps(
            {"model": a.model, "graph": a.graph, "losses": losses, "train_acc": train_acc, "test_acc": test_acc,
             "median_step_ms": ms, "device": torch.cuda.get_device_name(), "torch": torch.__version__}, indent=1))
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(5, 3.2), dpi=120)
            ax.plot(losses)
            ax.set_xlabel("epoch")
            ax.set_ylabel("cross-entropy loss")
            ax.set_title(f"{a.model}: 2 generated layers, '{a.graph}' graph")
            fig.tight_layout()
            fig.savefig(out / f"train_{a.model}.png")
        except ImportError:
            pass
    print(f"{a.model}: {'PASS' if ok else 'FAIL'} (loss must fall below 70% of its start)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
