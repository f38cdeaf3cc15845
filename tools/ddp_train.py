#!/usr/bin/env python3
"""Data-parallel training (torch.distributed, DistributedDataParallel) of a 2-layer node classifier made of
hectorgen-generated layers (RGAT, HGT or RGCN) on a synthetic heterogeneous graph.

    torchrun --standalone --nproc_per_node=N tools/ddp_train.py --model rgat [--graph medium] [--steps 50]
    python3 tools/ddp_train.py --model rgat ...          one process: the same global batches, no process group
    torchrun --standalone --nproc_per_node=2 tools/ddp_train.py --backend gloo --check    (2 processes, one GPU)

Every rank holds the whole graph, its features and labels (built from --seed alone, identically everywhere). Step s
draws a global batch of --batch labelled nodes (slices of a seeded permutation of the training nodes, reshuffled per
epoch, its remainder dropped) and rank r takes every world-th node of it, from position r (``shard``). The loss of a
rank is the sum of its nodes' cross-entropies divided by the GLOBAL batch size, and DDP's all-reduce SUMS the
gradients (a comm hook, instead of DDP's mean): the gradient is that of the mean loss over the global batch, whatever
the world size, so N processes compute what one process computes over the same global batch.

--mode full: every rank runs both layers over the whole graph and takes the loss at its own nodes (the replicated
full-graph setting: more ranks give a larger global batch per step, not a faster step). --mode khop: every rank runs
the layers on the exact 2-hop in-neighbourhood subgraph of its own nodes (every in-edge of its nodes and of their
in-neighbours), which gives its nodes the outputs the full graph gives them, so the step shrinks with the shard.

Generated layers: DIR/<model>/ (--generated, default generated/), built with its CMakeLists.txt when missing (by rank
0 first, the others wait). --layer standin (the default with --device cpu) uses bench/systems.py's plain-PyTorch
layer with the spec's parameters instead: the CPU tests run the whole script with it.

--check: trains --steps steps three times and exits 1 unless (a) the N-process weights equal those of one process
over the same global batches (run by rank 0 alone) within fp32 tolerance (max |a - b| / max |b| per parameter <=
--tol), (b) a second N-process run with the same seed is bit-identical, (c) all ranks hold identical weights and
(d) every parameter received a gradient at every step. The check uses SGD (Adam's first steps move every weight by
about lr whatever its gradient's size, which turns rounding into lr-sized differences). HG_DDP_BUG=1 makes the
comm hook skip the all-reduce of one parameter (the first layer's first weight): the check must then fail.

Timing: nothing synchronises inside a step. Every rank times every phase of every step (PHASES: select, khop,
prepare, forward, loss, backward, allreduce, optimizer) with the host's clock and CUDA events (StepClock), reads the
events once after the last step and rank 0 gathers them: the summary says, per phase, the fastest and the slowest
rank (mean over the timed steps, the first --warmup steps left out). "allreduce" is the time from the moment the
last gradient bucket is ready on this rank to the end of its reduction: the NCCL transfer plus the wait for the
slowest rank. A step's time is the interval between the starts of consecutive steps on the GPU's timeline (host
clock on the CPU), the slowest rank's. --prefetch (khop mode on GPUs) builds the next step's subgraph (select, khop,
prepare) on a side stream while the GPU runs the current step, so their host synchronisations wait for that stream
alone. --shard cost deals the batch to the ranks by the size of their 2-hop in-neighbourhoods (balanced_shard)
instead of every world-th node. --sync-debug counts per phase the host synchronisations torch reports
(torch.cuda.set_sync_debug_mode("warn")).

The runtime under DDP: --offload host|file puts a hectorgen tensor cache over both generated layers (one per rank:
its own pinned pool, and for files its own folder and file, removed at the end); --features unified (khop mode)
gathers each subgraph's features over PCIe from this rank's own unified (pinned, GPU-mapped) copy. --check then also
requires the weights to equal, bit for bit, those of the same run with the activations kept and the features in GPU
memory, and the caches to be clean (docs/distributed.md, "Runtime under DDP").

Output: progress lines on rank 0; --out FILE gets JSON lines (one per step: loss, step time as the slowest rank saw
it, every rank's step time, subgraph size and phase times; then one summary: mean and median step time, throughput in
labelled nodes per second, the per-phase breakdown, the weights' digest, the check).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import os
import re
import statistics
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
for _p in (REPO / "tests" / "gpu", REPO / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
if str(REPO / "runtime" / "python") not in sys.path:   # last: an installed runtime (with its compiled _C) wins
    sys.path.append(str(REPO / "runtime" / "python"))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic cuBLAS (before CUDA starts)
# NVLink multicast off unless asked for (it can take a shared host's GPUs out of service: docs/distributed.md)
for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

try:
    from hectorgen_runtime.distributed import rank_info  # noqa: E402
except ImportError:   # an installed runtime older than its distributed module: the module alone, from the source tree
    import importlib.util  # noqa: E402
    _spec = importlib.util.spec_from_file_location(
        "hectorgen_runtime_distributed", REPO / "runtime" / "python" / "hectorgen_runtime" / "distributed.py")
    _distributed = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_distributed)
    rank_info = _distributed.rank_info

IN_DIM = 64
BUG_ENV = "HG_DDP_BUG"


# ---------------------------------------------------------------------------------------------------------------
# Data: the graph, features, labels, batches and shards


class Graph:
    """A typed graph on the CPU: int64 src, dst, etype [E] (edges sorted by relation), ntype [N] (nodes sorted by
    type), and its sizes."""

    def __init__(self, name, src, dst, etype, ntype, num_etypes, num_ntypes):
        if etype.numel() > 1 and not bool((etype[1:] >= etype[:-1]).all()):
            order = torch.sort(etype, stable=True).indices
            src, dst, etype = src[order], dst[order], etype[order]
        self.name = name
        self.src, self.dst, self.etype = src.contiguous(), dst.contiguous(), etype.contiguous()
        self.ntype = ntype.contiguous()
        self.num_nodes, self.num_edges = int(ntype.numel()), int(src.numel())
        self.num_etypes, self.num_ntypes = int(num_etypes), int(num_ntypes)


def load_graph(name: str, seed: int, scale: float = 1.0) -> Graph:
    """A preset of tests/gpu/graphs.py (tiny, mini, small, medium, aifb, ...) or a dataset of bench/datasets.py
    (mag, wikikg2, am, ...: the thesis's statistics, cached on disk), built from ``seed`` alone."""
    import graphs
    import datasets
    if name == "tiny" or name in graphs.PRESETS:
        g = graphs.graph_by_name(name, seed)
        return Graph(name, g.src, g.dst, g.etype, g.ntype, g.num_etypes, g.num_ntypes)
    if name in datasets.STATS:
        g = datasets.synthetic(name, seed=seed, scale=scale)
        return Graph(name, g["src"], g["dst"], g["etype"], g["ntype"], g["num_etypes"], g["num_ntypes"])
    raise SystemExit(f"ddp_train: unknown graph {name!r}: one of tiny, {', '.join(graphs.PRESETS)}, "
                     f"{', '.join(datasets.STATS)}")


def features_and_labels(g: Graph, classes: int, seed: int):
    """x [N, 64] float32 and labels [N] drawn on the CPU from ``seed`` (the same bits on every rank and device), and
    the labelled nodes (in-degree > 0). A label is the argmax of the mean over in-neighbours of x @ T for a random T
    (a "teacher" only message passing can imitate), computed in float64 on the projected features."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(g.num_nodes, IN_DIM, generator=gen)
    T = torch.randn(IN_DIM, classes, generator=gen, dtype=torch.float64)
    xt = x.double() @ T
    agg = torch.zeros(g.num_nodes, classes, dtype=torch.float64).index_add_(0, g.dst, xt[g.src])
    deg = torch.bincount(g.dst, minlength=g.num_nodes)
    y = (agg / deg.clamp(min=1).unsqueeze(1)).argmax(1)
    return x, y, (deg > 0).nonzero().squeeze(1)


def split(labelled: torch.Tensor, seed: int, train_fraction: float = 0.7):
    """(train, test) node ids: a seeded split of the labelled nodes."""
    perm = labelled[torch.randperm(labelled.numel(), generator=torch.Generator().manual_seed(seed + 17))]
    n = max(1, int(train_fraction * perm.numel()))
    return perm[:n], perm[n:]


@functools.lru_cache(maxsize=2)
def epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The seeded order of ``n`` training nodes in epoch ``epoch``, drawn once per epoch (a permutation of millions
    of nodes takes tens of ms of host time: not once per step)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def global_batch(train: torch.Tensor, step: int, batch: int, seed: int) -> torch.Tensor:
    """The node ids of step ``step``'s global batch: consecutive slices of ``batch`` nodes of a seeded permutation of
    ``train``, reshuffled every epoch; the remainder of an epoch is dropped (every batch has the same size, so no
    rank ever gets an empty shard). With fewer training nodes than ``batch``, every batch is all of them."""
    batch = min(batch, train.numel())
    per_epoch = train.numel() // batch
    epoch, k = divmod(step, per_epoch)
    return train[epoch_permutation(train.numel(), seed, epoch)[k * batch:(k + 1) * batch]]


def shard(batch: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s part of a global batch: every ``world``-th node from position ``rank``. The shards are
    disjoint, their union is the batch, their sizes differ by at most one."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in 0..{world - 1}")
    return batch[rank::world]


def khop_cost(src, dst, num_nodes: int) -> torch.Tensor:
    """[num_nodes] int64: an estimate of the edges of each node's 2-hop in-neighbourhood, its in-degree plus its
    in-neighbours' in-degrees (shared neighbours counted once per path)."""
    deg = torch.bincount(dst, minlength=num_nodes)
    return deg + torch.zeros(num_nodes, dtype=torch.int64).index_add_(0, dst, deg[src])


def balanced_shard(batch: torch.Tensor, cost: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s part of a global batch, balanced by ``cost`` (per node id, e.g. khop_cost): the batch's nodes
    in decreasing order of cost (ties by position) are dealt to the ranks like cards in a snake, 0, 1, .., w-1,
    w-1, .., 0, 0, 1, .., so every rank gets one node of every w consecutive costs; the shard keeps batch order.
    Disjoint, covering, sizes within one, the same on every rank."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in 0..{world - 1}")
    order = torch.sort(cost[batch], descending=True, stable=True).indices
    i = torch.arange(batch.numel())
    col = i % world
    owner = torch.where((i // world) % 2 == 0, col, world - 1 - col)
    return batch[order[owner == rank].sort().values]


def khop_in_subgraph(src, dst, num_nodes: int, seeds, hops: int = 2):
    """The subgraph a ``hops``-layer message-passing model needs for exact outputs at ``seeds``: every in-edge of
    the nodes within hops - 1 in-steps of the seeds. Returns (nodes: sorted old ids, edge ids in their original
    order, old id -> position among ``nodes``, -1 outside). Two host synchronisations (the two sizes), whatever
    ``hops``: a hop marks the sources of the selected edges with a scatter that sends the other edges to spare
    slots past the nodes (1024 of them, by destination: no single hot address) instead of compacting them."""
    spare = 1024
    inside = torch.zeros(num_nodes + spare, dtype=torch.bool, device=src.device)
    inside[seeds] = True
    for h in range(hops):
        emask = inside[dst]
        if h + 1 < hops:
            inside[torch.where(emask, src, num_nodes + dst % spare)] = True
    eids = emask.nonzero().squeeze(1)
    keep = inside[:num_nodes].clone()
    keep[src[eids]] = True
    nodes = keep.nonzero().squeeze(1)
    new_id = torch.full((num_nodes,), -1, dtype=torch.int64, device=src.device)
    new_id[nodes] = torch.arange(nodes.numel(), device=src.device)
    return nodes, eids, new_id


# ---------------------------------------------------------------------------------------------------------------
# Timing

PHASES = ("select", "khop", "prepare", "forward", "loss", "backward", "allreduce", "optimizer")


class StepClock:
    """Where one rank's training steps go, phase by phase (PHASES), without synchronising inside a step: the host's
    perf_counter at every phase boundary and, on a GPU, a CUDA event recorded there on the current stream (the side
    stream for prefetched phases); the events are read once, after the last step (``result``). A phase's GPU time
    is the time between its boundary events on the GPU's timeline: its kernels, plus any time the stream waited for
    the host or for another stream. The backward phase is split at the moment the last gradient bucket became ready
    (``bucket_ready``, called by the DDP comm hook): "backward" before it, "allreduce" after it (the reduction of the
    last bucket: the transfer plus the wait for the slowest rank). With ``count_syncs`` the host synchronisations
    torch reports (torch.cuda.set_sync_debug_mode("warn")) are counted per phase."""

    def __init__(self, device: torch.device, count_syncs: bool = False):
        self.cuda = device.type == "cuda"
        self.count_syncs = count_syncs and self.cuda
        self.records = {}     # step -> {phase: [host start, host end, start event, end event, syncs]}
        self.marks = {}       # step -> (host time, main-stream event) at the start of the step
        self.sizes = {}       # step -> (subgraph nodes, subgraph edges)
        self.ready = None     # (host time, event) of the last bucket that became ready in the current backward
        self._caught = None

    def _event(self):
        if not self.cuda:
            return None
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    @contextlib.contextmanager
    def watch_syncs(self):
        """Collects torch's synchronisation warnings while the steps run (count_syncs only)."""
        if not self.count_syncs:
            yield
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
            self._caught = caught
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(previous)
                self._caught = None

    def _syncs(self) -> int:
        return 0 if self._caught is None else sum("synchroniz" in str(w.message) for w in self._caught)

    def mark(self, step: int):
        self.marks[step] = (time.perf_counter(), self._event())

    @contextlib.contextmanager
    def phase(self, step: int, name: str):
        n0, e0, t0 = self._syncs(), self._event(), time.perf_counter()
        yield
        t1, e1 = time.perf_counter(), self._event()
        self.records.setdefault(step, {})[name] = [t0, t1, e0, e1, self._syncs() - n0]

    def bucket_ready(self):
        self.ready = (time.perf_counter(), self._event())

    def split_backward(self, step: int):
        """Splits the step's backward phase where its last gradient bucket became ready (DDP runs only)."""
        rec = self.records[step]
        if self.ready is not None and "backward" in rec:
            t0, t1, e0, e1, syncs = rec["backward"]
            t_ready, e_ready = self.ready
            rec["backward"] = [t0, t_ready, e0, e_ready, syncs]
            rec["allreduce"] = [t_ready, t1, e_ready, e1, 0]
        self.ready = None

    def result(self, steps: int) -> dict:
        """Per step (synchronises once): "phases" [steps, len(PHASES), 3] host ms, GPU ms (host ms on the CPU) and
        host synchronisations; "step_ms" [steps] between the starts of consecutive steps (GPU timeline on a GPU);
        "sizes" [steps, 2] subgraph nodes and edges (0 in full mode). float64 tensors."""
        if self.cuda:
            torch.cuda.synchronize()
        phases = torch.zeros(steps, len(PHASES), 3, dtype=torch.float64)
        for s, rec in self.records.items():
            for name, (t0, t1, e0, e1, syncs) in rec.items():
                k = PHASES.index(name)
                phases[s, k, 0] = (t1 - t0) * 1e3
                phases[s, k, 1] = e0.elapsed_time(e1) if self.cuda else (t1 - t0) * 1e3
                phases[s, k, 2] = syncs
        step_ms = torch.zeros(steps, dtype=torch.float64)
        for s in range(steps):
            (h0, e0), (h1, e1) = self.marks[s], self.marks[s + 1]
            step_ms[s] = e0.elapsed_time(e1) if self.cuda else (h1 - h0) * 1e3
        sizes = torch.tensor([self.sizes.get(s, (0, 0)) for s in range(steps)], dtype=torch.float64)
        return {"phases": phases, "step_ms": step_ms, "sizes": sizes.reshape(steps, 2)}


# ---------------------------------------------------------------------------------------------------------------
# The model


class Classifier(torch.nn.Module):
    """layer(graph) -> LayerNorm -> GELU -> layer(graph) -> LayerNorm -> GELU -> linear head.

    GELU, not ReLU: a node without in-edges gets an exactly zero layer output, so LayerNorm hands it its bias, which
    starts at exactly 0; a ReLU there sits on its kink, and after one step the sign of a bias component -- set by
    rounding noise when its gradient is tiny -- switches the gradient of every such node on or off. Any two
    computations that round differently (N processes vs 1) then drift apart by far more than fp32 tolerance. A
    smooth activation keeps the difference at rounding level."""

    def __init__(self, cls, num_etypes, num_ntypes, width, num_classes, device):
        super().__init__()
        self.layer1 = cls(num_etypes, num_ntypes=num_ntypes, device=device)
        self.layer2 = cls(num_etypes, num_ntypes=num_ntypes, device=device)
        self.norm1 = torch.nn.LayerNorm(width, device=device)
        self.norm2 = torch.nn.LayerNorm(width, device=device)
        self.head = torch.nn.Linear(width, num_classes, device=device)

    def forward(self, g, x):
        n = x.shape[0]
        h = F.gelu(self.norm1(self.layer1(g, x).reshape(n, -1)))
        h = F.gelu(self.norm2(self.layer2(g, h).reshape(n, -1)))
        return self.head(h)


def load_layer(a, info):
    """(module, layer class): the generated module (rank 0 builds it if needed, the others wait) or the stand-in."""
    if a.layer == "standin":
        import systems
        mod = systems.StandInModule(a.model)
        return mod, mod.Layer
    import gpu_check
    variant = gpu_check.Variant(a.model, f"specs/{a.model}.yaml")
    gen_dir = Path(a.generated)
    mod = gpu_check.load_generated(variant, gen_dir, build=not (gen_dir / a.model / "build").is_dir())
    if not getattr(mod, "TRAINABLE", False):
        raise SystemExit(f"ddp_train: {a.model}: the generated module has no backward pass (TRAINABLE is False)")
    return mod, gpu_check.layer_class(mod, variant)


# ---------------------------------------------------------------------------------------------------------------
# DDP


class HookState:
    """The comm hook's state: the parameter whose all-reduce HG_DDP_BUG=1 skips (None: none) and the StepClock told
    when a bucket is ready (None: none)."""

    def __init__(self, skip=None, clock=None):
        self.skip, self.clock = skip, clock


def allreduce_sum_hook(state: HookState, bucket):
    """DDP comm hook: all-reduce SUM of the bucket (DDP's default divides by the world size; the loss is already
    divided by the global batch). With state.skip set, that parameter's slice keeps this rank's own gradient."""
    if state.clock is not None:
        state.clock.bucket_ready()
    buf = bucket.buffer()
    keep = None
    if state.skip is not None:
        offset = 0
        for p in bucket.parameters():
            if p is state.skip:
                keep = (offset, buf[offset:offset + p.numel()].clone())
            offset += p.numel()
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def done(f):
        out = f.value()[0]
        if keep is not None:
            out[keep[0]:keep[0] + keep[1].numel()].copy_(keep[1])
        return out
    return fut.then(done)


def bucket_mb(model, a) -> float:
    """DDP's bucket size: --bucket-mb, else the bytes of one generated layer's parameters. All of a generated layer's
    weight gradients become ready when its backward returns; with DDP's default (25 MB) every parameter of these
    models shares one bucket, which can only be reduced after the whole backward (nothing overlaps). A bucket of one
    layer's size puts the head, norms and second layer in buckets of their own that are reduced while the first
    layer's backward runs."""
    if a.bucket_mb is not None:
        return a.bucket_mb
    return sum(p.numel() * p.element_size() for p in model.layer1.parameters()) / 2**20


def wrap_ddp(model, a, device, clock=None):
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(model, device_ids=[device] if device.type == "cuda" else None, bucket_cap_mb=bucket_mb(model, a),
              broadcast_buffers=False, find_unused_parameters=False, static_graph=a.static_graph)
    skip = model.layer1.get_parameter(next(n for n, _ in model.layer1.named_parameters())) \
        if os.environ.get(BUG_ENV, "") not in ("", "0") else None
    ddp.register_comm_hook(HookState(skip, clock), allreduce_sum_hook)
    return ddp


# ---------------------------------------------------------------------------------------------------------------
# Training


@dataclasses.dataclass
class StepInputs:
    """A step's inputs on one rank: the prepared (sub)graph, its features, the positions of the rank's nodes in the
    model's output, the nodes (for the labels) and, when built on a side stream, the event that ends their work."""
    graph: object
    x: torch.Tensor
    at: torch.Tensor
    nodes: torch.Tensor
    ready: object = None

    def tensors(self):
        g = [getattr(self.graph, f.name) for f in dataclasses.fields(self.graph)] \
            if dataclasses.is_dataclass(self.graph) else list(vars(self.graph).values())
        return [t for t in (*g, self.x, self.at, self.nodes) if isinstance(t, torch.Tensor) and t.is_cuda]


class Trainer:
    """Everything a run needs on one rank: the prepared graph, features, labels, the layer class."""

    def __init__(self, a, info, device, mod, cls, graph: Graph):
        self.a, self.info, self.device, self.mod, self.cls, self.graph = a, info, device, mod, cls, graph
        self.ddp_stats = {}
        x, y, labelled = features_and_labels(graph, a.classes, a.seed)
        self.x_host, self._x_device, self.x_unified = x, None, None
        if a.features == "unified":
            import hectorgen_runtime
            self.x_unified = hectorgen_runtime.unified(x)   # this rank's own copy, pinned in place and mapped
        self.train_nodes, self.test_nodes = split(labelled, a.seed)
        self.batch = min(a.batch, self.train_nodes.numel())   # the global batch size (global_batch)
        if self.batch < info.world_size:
            raise SystemExit(f"ddp_train: a global batch of {self.batch} nodes (--batch "
                             f"{a.batch}, {self.train_nodes.numel()} training nodes) is smaller than the world size "
                             f"{info.world_size}")
        self.y = y.to(device)
        self.src, self.dst = graph.src.to(device), graph.dst.to(device)
        self.etype, self.ntype = graph.etype.to(device), graph.ntype.to(device)
        self.full = self.prepare(self.src, self.dst, self.etype, graph.num_nodes, self.ntype) \
            if a.mode == "full" else None
        self.cost = khop_cost(graph.src, graph.dst, graph.num_nodes) if a.shard == "cost" else None

    @property
    def x(self) -> torch.Tensor:
        """The features in GPU memory (made on first use: --features unified needs them only for --check)."""
        if self._x_device is None:
            self._x_device = self.x_host.to(self.device)
        return self._x_device

    def features(self, keep, features: str) -> torch.Tensor:
        """The features of the nodes ``keep`` (a CUDA index) in GPU memory: an index into the GPU copy, or
        (--features unified) a zero-copy gather from the unified tensor; the same bits either way. Nothing waits:
        an index out of range zero-fills its row and is reported by the next check_gather_errors()."""
        if features == "unified":
            import hectorgen_runtime
            return hectorgen_runtime.gather(self.x_unified, keep, path="zero_copy", check=False)
        return self.x[keep]

    def tensor_cache(self, model, where: str, rank: int):
        """A hectorgen tensor cache over the model's two generated layers, offloading what they save for backward
        to ``where`` ("host": pinned host memory; "file": files in this rank's own folder of --offload-dir), and
        that folder (None for "host")."""
        from hectorgen_runtime.offload import TensorCache
        from hectorgen_runtime.distributed import rank_scoped_path
        folder = None
        if where == "file":
            base = self.a.offload_dir or os.environ.get("HECTORGEN_OFFLOAD_DIR") or os.environ.get("TMPDIR") or "/tmp"
            folder = Path(rank_scoped_path(str(Path(base) / "hectorgen-ddp-offload"), kind="offload"))
            folder.mkdir(parents=True, exist_ok=True)
            options = {"directories": [str(folder)], "file_bytes": int(self.a.offload_gib * 2**30)}
        else:
            options = {"host_budget_bytes": int(self.a.offload_gib * 2**30)}
        cache = TensorCache([model.layer1, model.layer2], parameters_of=[model], tier=where, rank=rank,
                            cpu_tensors=self.device.type == "cpu", min_bytes=int(self.a.offload_min_kib * 1024),
                            prefetch_scopes=self.a.offload_prefetch, **options)
        return cache, folder

    def prepare(self, src, dst, etype, n, ntype):
        return self.mod.prepare_graph(src, dst, etype, n, self.graph.num_etypes, ntype=ntype,
                                      num_ntypes=self.graph.num_ntypes)

    def shard_of(self, batch, rank: int, world: int):
        return shard(batch, rank, world) if self.cost is None else balanced_shard(batch, self.cost, rank, world)

    def subgraph(self, nodes):
        """khop mode: (the nodes of ``nodes``' 2-hop in-neighbourhood, its edge ids, old id -> new id)."""
        return khop_in_subgraph(self.src, self.dst, self.graph.num_nodes, nodes, hops=2)

    def prepare_subgraph(self, keep, eids, new_id):
        return self.prepare(new_id[self.src[eids]], new_id[self.dst[eids]], self.etype[eids], int(keep.numel()),
                            self.ntype[keep])

    def step_inputs(self, nodes):
        """(prepared graph, features, positions of ``nodes`` in the model's output) for one step."""
        if self.a.mode == "full":
            return self.full, self.x, nodes
        keep, eids, new_id = self.subgraph(nodes)
        return self.prepare_subgraph(keep, eids, new_id), self.features(keep, self.a.features), new_id[nodes]

    def stage(self, step: int, world: int, rank: int, clock: StepClock, stream=None,
              features: str = "device") -> "StepInputs":
        """Step ``step``'s inputs on this rank, timed by ``clock`` (phases select, khop, prepare), queued on
        ``stream`` (None: the current stream). With a stream, the step's stream must wait for ``ready`` and the
        tensors are marked as used by the current stream (the caching allocator then keeps them until its work
        is done)."""
        main = torch.cuda.current_stream(self.device) if stream is not None else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            with clock.phase(step, "select"):
                mine = self.shard_of(global_batch(self.train_nodes, step, self.a.batch, self.a.seed), rank, world)
                nodes = mine.contiguous().pin_memory().to(self.device, non_blocking=True) if clock.cuda else mine
            if self.a.mode == "full":
                inputs = StepInputs(self.full, self.x, nodes, nodes)
            else:
                with clock.phase(step, "khop"):
                    keep, eids, new_id = self.subgraph(nodes)
                with clock.phase(step, "prepare"):
                    g = self.prepare_subgraph(keep, eids, new_id)
                    inputs = StepInputs(g, self.features(keep, features), new_id[nodes], nodes)
                clock.sizes[step] = (int(keep.numel()), int(eids.numel()))
            if stream is not None:
                inputs.ready = stream.record_event()
                for t in inputs.tensors():
                    t.record_stream(main)
        return inputs

    def new_model(self):
        torch.manual_seed(self.a.seed)
        g = self.graph
        return Classifier(self.cls, g.num_etypes, g.num_ntypes, IN_DIM, self.a.classes, self.device)

    def run(self, world: int, rank: int, optimizer: str, ddp: bool, clock: StepClock = None, offload: str = "keep",
            features: str = "device"):
        """Trains a fresh model for --steps steps as rank ``rank`` of ``world``, timed by ``clock`` (a new one
        without), with the layers' saved tensors kept or offloaded (``offload``: keep, host, file) and the features
        read from GPU memory or a unified tensor (``features``); returns (model, per-step local losses, the names of
        parameters that missed a gradient at some step, the wall time of the steps after the warm-up in s).
        self.last_run then holds the run's peak GPU memory and, when offloading, the tensor cache's report."""
        a = self.a
        clock = clock or StepClock(self.device)
        model = self.new_model()
        net = wrap_ddp(model, a, self.device, clock) if ddp else model
        cache, folder = self.tensor_cache(model, offload, rank) if offload != "keep" else (None, None)
        if self.device.type == "cuda":
            sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            base_bytes = torch.cuda.memory_allocated(self.device)
        if optimizer == "sgd":
            opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=a.lr)
        side = torch.cuda.Stream(self.device) if a.prefetch and clock.cuda and a.mode == "khop" else None
        losses, missing = [], set()
        warmup = min(a.warmup, a.steps - 1)
        t_timed = time.perf_counter()
        with clock.watch_syncs():
            nxt = self.stage(0, world, rank, clock, side, features) if side is not None else None
            for step in range(a.steps):
                if step == warmup:
                    sync(self.device)   # once: the wall time of the timed steps starts here
                    t_timed = time.perf_counter()
                clock.mark(step)
                if side is None:
                    inputs = self.stage(step, world, rank, clock, features=features)
                else:
                    inputs = nxt
                    torch.cuda.current_stream(self.device).wait_event(inputs.ready)
                with clock.phase(step, "forward"):
                    opt.zero_grad(set_to_none=True)
                    with cache if cache is not None else contextlib.nullcontext():
                        logits = net(inputs.graph, inputs.x)[inputs.at]
                with clock.phase(step, "loss"):
                    loss = F.cross_entropy(logits, self.y[inputs.nodes], reduction="sum") / self.batch
                with clock.phase(step, "backward"):
                    loss.backward()
                clock.split_backward(step)
                missing |= {n for n, p in model.named_parameters() if p.grad is None}
                with clock.phase(step, "optimizer"):
                    opt.step()
                losses.append(loss.detach())
                del inputs, logits, loss
                if side is not None and step + 1 < a.steps:
                    nxt = self.stage(step + 1, world, rank, clock, side, features)   # while the GPU runs this step
            clock.mark(a.steps)
        sync(self.device)
        wall = time.perf_counter() - t_timed
        if features == "unified":
            import hectorgen_runtime
            hectorgen_runtime.check_gather_errors(self.device)
        self.ddp_stats = ddp_stats(net) if ddp else {}
        self.last_run = {"offload": offload, "features": features}
        if self.device.type == "cuda":
            self.last_run.update(peak_bytes=int(torch.cuda.max_memory_allocated(self.device)),
                                 peak_above_start_bytes=int(torch.cuda.max_memory_allocated(self.device) - base_bytes))
        if cache is not None:
            self.last_run["cache"] = close_cache(cache, folder)
        return model, torch.stack(losses).double(), sorted(missing), wall

    @torch.no_grad()
    def accuracy(self, model) -> float:
        nodes = self.test_nodes.to(self.device)
        if nodes.numel() == 0:
            return float("nan")
        if self.a.mode == "full":
            pred = model(self.full, self.x)[nodes].argmax(1)
        else:
            g, x, at = self.step_inputs(nodes)
            pred = model(g, x)[at].argmax(1)
        return (pred == self.y[nodes]).double().mean().item()


def ddp_stats(ddp) -> dict:
    """DDP's own measurements of its last sampled step (DDP samples the first steps, then one in 100): the gradient
    buckets (bytes, in reduction order) and the backward's compute time, all-reduce time and the time the two
    overlapped, in ms."""
    try:
        d = ddp._get_ddp_logging_data()
        ms = lambda k: round(d[k] / 1e6, 3) if k in d else None  # noqa: E731
        return {"bucket_bytes": [int(b) for b in re.findall(r"\d+", str(d.get("rebuilt_bucket_sizes") or
                                                                          d.get("bucket_sizes", "")))],
                "backward_compute_ms": ms("avg_backward_compute_time"), "allreduce_ms": ms("avg_backward_comm_time"),
                "overlap_ms": ms("avg_backward_compute_comm_overlap_time")}
    except Exception:  # noqa: BLE001  (a private API: a change in it only loses these numbers)
        return {}


def close_cache(cache, folder) -> dict:
    """Ends a run's tensor cache: waits for its I/O, takes its report (what it stored, forwarded, kept; the engine's
    bytes and files; records and engine entries still alive, 0 when nothing leaked over the steps), removes its hooks,
    closes the engine and removes this rank's offload folder (only this rank's). "files_left": what was in the
    folder when the engine had closed (the engine unlinks its files as it opens them: nothing, even after a
    crash)."""
    cache.wait_io()
    engine = cache.engine_stats()
    report = {"tier": cache.tier, "stats": dict(cache.stats), "live_records": cache.live_records(),
              "engine_entries": int(engine["entries"]), "stored_bytes": int(engine["stored_bytes"]),
              "loaded_bytes": int(engine["loaded_bytes"]), "host_peak": int(engine["host_peak"]),
              "file_peak": int(engine["file_peak"]), "files": list(cache.engine.file_paths),
              "folder": str(folder) if folder is not None else None}
    cache.remove()
    cache.engine = None
    del cache
    if folder is not None:
        report["files_left"] = sorted(p.name for p in folder.iterdir())
        if not report["files_left"]:
            folder.rmdir()
    return report


def memory_report(last_run: dict, info, device) -> dict:
    """A run's memory, every rank's (gathered to all): peak GPU memory, and with offloading, the tensor caches'
    reports and whether they were clean -- every rank's files its own (named for its rank, in its own folder, no
    path shared), nothing left in the folders or the engines, nothing tracked after the last step, and something
    actually offloaded."""
    runs = [last_run]
    if info.distributed:
        runs = [None] * info.world_size
        dist.all_gather_object(runs, last_run)
    out = {}
    if device.type == "cuda":
        out["peak_gib"] = [round(r["peak_bytes"] / 2**30, 3) for r in runs]
        out["peak_above_start_gib"] = [round(r["peak_above_start_bytes"] / 2**30, 3) for r in runs]
    caches = [r.get("cache") for r in runs]
    if not any(caches):
        return out
    out["tensor_cache"] = caches
    problems = []
    for rank, c in enumerate(caches):
        if c["live_records"] or c["engine_entries"]:
            problems.append(f"rank {rank} still tracks {c['live_records']} records, {c['engine_entries']} engine "
                            f"entries")
        if c["stats"]["offloaded_bytes"] == 0:
            problems.append(f"rank {rank} offloaded nothing")
        if c.get("files_left"):
            problems.append(f"rank {rank} left {c['files_left']} in {c['folder']}")
        if c["tier"] == "file":
            if not c["files"]:
                problems.append(f"rank {rank} has no offload file")
            foreign = [f for f in c["files"] if f"-r{rank}-" not in Path(f).name or Path(f).parent != Path(c["folder"])]
            if foreign:
                problems.append(f"rank {rank}'s files are not named for it or not in its folder: {foreign}")
    paths = [f for c in caches for f in c["files"]]
    folders = [c["folder"] for c in caches if c["folder"] is not None]
    if len(set(paths)) != len(paths) or len(set(folders)) != len(folders):
        problems.append(f"ranks share offload files or folders: {paths}")
    out["offload_clean"] = not problems
    gib = sum(c["stats"]["offloaded_bytes"] for c in caches) / 2**30
    out["offload_clean_why"] = "; ".join(problems) if problems else (
        f"clean: {len(caches)} rank(s) offloaded {gib:.2f} GiB in all"
        + (f", each to its own files ({', '.join(sorted(paths))}), all removed" if paths else "")
        + ", nothing tracked after the last step")
    return out


def memory_lines(memory: dict) -> list:
    """The printed memory summary: lines of text."""
    lines = []
    if "peak_gib" in memory:
        lines.append(f"peak GPU memory per rank: {', '.join(f'{v:.2f}' for v in memory['peak_gib'])} GiB (above the "
                     f"graph, features and model: {', '.join(f'{v:.2f}' for v in memory['peak_above_start_gib'])} "
                     f"GiB)")
    for rank, c in enumerate(memory.get("tensor_cache", [])):
        st = c["stats"]
        lines.append(f"tensor cache rank {rank} ({c['tier']}): offloaded {st['offloaded_bytes'] / 2**30:.2f} GiB of "
                     f"{st['offered_bytes'] / 2**30:.2f} GiB offered, stored {st['stored_host'] + st['stored_file']}, "
                     f"forwarded {st['forwarded']}, prefetched {st['prefetched']}, kept small {st['kept_small']}, "
                     f"failed stores {st['store_failed']}; engine peak {max(c['host_peak'], c['file_peak']) / 2**30:.2f}"
                     f" GiB")
    if "offload_clean_why" in memory:
        lines.append(f"tensor cache: {memory['offload_clean_why']}")
    return lines


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def flat_weights(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def digest(weights: dict) -> str:
    h = hashlib.sha256()
    for n in sorted(weights):
        h.update(n.encode())
        h.update(weights[n].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def compare(got: dict, ref: dict) -> dict:
    """Per parameter max |got - ref| and max |got - ref| / max |ref|; the worst of each."""
    rows = {}
    for n in ref:
        d = (got[n].double() - ref[n].double()).abs().max().item()
        rows[n] = (d, d / max(ref[n].double().abs().max().item(), 1e-30))
    worst_abs = max(rows.items(), key=lambda kv: kv[1][0])
    worst_rel = max(rows.items(), key=lambda kv: kv[1][1])
    return {"max_abs": worst_abs[1][0], "max_abs_param": worst_abs[0], "max_rel": worst_rel[1][1],
            "max_rel_param": worst_rel[0]}


def max_over_ranks(t: torch.Tensor, info) -> torch.Tensor:
    if info.distributed:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def sum_over_ranks(t: torch.Tensor, info) -> torch.Tensor:
    if info.distributed:
        t = t.clone()
        dist.all_reduce(t)
    return t


def rank_spread(weights: dict, info) -> float:
    """The largest difference between this rank's weights and rank 0's (0.0 when every rank agrees bit for bit),
    the same number on every rank."""
    if not info.distributed:
        return 0.0
    worst = torch.zeros(1, dtype=torch.float64, device=next(iter(weights.values())).device)
    for n in sorted(weights):
        mine = weights[n].contiguous()
        r0 = mine.clone()
        dist.broadcast(r0, 0)
        worst = torch.maximum(worst, (mine.double() - r0.double()).abs().max().reshape(1))
    return float(max_over_ranks(worst, info).item())


def gather_ranks(t: torch.Tensor, info, device) -> torch.Tensor:
    """[world, *t.shape] on the CPU: every rank's ``t`` (float64), in rank order."""
    if not info.distributed:
        return t.unsqueeze(0)
    t = t.to(device if dist.get_backend() == "nccl" else "cpu").contiguous()
    parts = [torch.empty_like(t) for _ in range(info.world_size)]
    dist.all_gather(parts, t)
    return torch.stack(parts).cpu()


def timing_summary(phases, step_ms, sizes, wall_s, warmup: int) -> dict:
    """The timing of a run from every rank's StepClock.result (stacked by gather_ranks): phases [W, S, P, 3] (host
    ms, GPU ms, synchronisations), step_ms [W, S], sizes [W, S, 2] (subgraph nodes, edges), wall_s [W] (the timed
    steps' wall time), the first ``warmup`` steps left out of every mean. A step takes as long as its slowest rank.
    Per phase: every rank's mean over the timed steps, and the fastest and slowest rank."""
    world, steps = step_ms.shape
    w = min(warmup, steps - 1)
    slowest = step_ms.max(0).values
    timed = slowest[w:].tolist()
    out = {"warmup": w, "timed_steps": steps - w,
           "median_step_ms": statistics.median(timed), "mean_step_ms": statistics.fmean(timed),
           "wall_step_ms": float(wall_s.max()) * 1e3 / (steps - w),
           "step_ms_spread": [min(timed), max(timed)]}
    mean = phases[:, w:].mean(1)                        # [W, P, 3]
    out["phases"] = {}
    for k, name in enumerate(PHASES):
        gpu, host, syncs = mean[:, k, 1], mean[:, k, 0], mean[:, k, 2]
        out["phases"][name] = {"gpu_ms": [round(v, 4) for v in gpu.tolist()],
                               "host_ms": [round(v, 4) for v in host.tolist()],
                               "syncs": [round(v, 2) for v in syncs.tolist()],
                               "slowest_rank": int(gpu.argmax()), "fastest_rank": int(gpu.argmin()),
                               "gpu_max": float(gpu.max()), "gpu_min": float(gpu.min()),
                               "host_max": float(host.max()), "host_min": float(host.min())}
    edges = sizes[:, w:, 1].mean(1)
    out["subgraph_edges"] = [round(v, 1) for v in edges.tolist()]
    out["subgraph_nodes"] = [round(v, 1) for v in sizes[:, w:, 0].mean(1).tolist()]
    out["edge_imbalance"] = float(edges.max() / edges.mean()) if float(edges.mean()) > 0 else 1.0
    out["per_step"] = [{"step_ms": float(slowest[s]), "rank_step_ms": [round(v, 4) for v in step_ms[:, s].tolist()],
                        "edges": [int(v) for v in sizes[:, s, 1].tolist()],
                        "phase_ms_max": {name: round(float(phases[:, s, k, 1].max()), 4)
                                         for k, name in enumerate(PHASES)}}
                       for s in range(steps)]
    return out


def phase_table(timing: dict, gpu: bool) -> list:
    """The printed per-phase breakdown: lines of text."""
    clock = "GPU timeline" if gpu else "host clock"
    lines = [f"per phase, ms per step (mean of steps {timing['warmup'] + 1}-{timing['warmup'] + timing['timed_steps']}"
             f", {clock}), fastest .. slowest rank; host time; host syncs per step:"]
    for name, p in timing["phases"].items():
        lines.append(f"  {name:<10} {p['gpu_min']:8.2f} .. {p['gpu_max']:8.2f} (rank {p['slowest_rank']})   host "
                     f"{p['host_min']:8.2f} .. {p['host_max']:8.2f}   syncs {max(p['syncs']):.1f}")
    lines.append(f"  step: mean {timing['mean_step_ms']:.2f} ms, median {timing['median_step_ms']:.2f} ms, range "
                 f"{timing['step_ms_spread'][0]:.2f} .. {timing['step_ms_spread'][1]:.2f} ms, wall clock "
                 f"{timing['wall_step_ms']:.2f} ms per step; subgraph edges per rank "
                 f"{', '.join(f'{e:,.0f}' for e in timing['subgraph_edges'])} "
                 f"(max / mean {timing['edge_imbalance']:.2f})")
    return lines


# ---------------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="See docs/distributed.md.")
    p.add_argument("--model", default="rgat", help="rgat, hgt or rgcn (a bundled spec with a backward pass)")
    p.add_argument("--layer", default=None, choices=["generated", "standin"],
                   help="the generated layer (default on GPUs) or bench/systems.py's plain-PyTorch stand-in (default "
                        "on the CPU)")
    p.add_argument("--generated", default=str(REPO / "generated"), help="folder of the generated modules")
    p.add_argument("--graph", default="small", help="tests/gpu/graphs.py preset or bench/datasets.py dataset")
    p.add_argument("--scale", type=float, default=1.0, help="shrink a bench/datasets.py graph (tests)")
    p.add_argument("--mode", default="full", choices=["full", "khop"])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=1024, help="labelled nodes per step, over all ranks")
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--optimizer", default=None, choices=["adam", "sgd"], help="default adam; sgd with --check")
    p.add_argument("--lr", type=float, default=None, help="default 0.005 (adam), 0.05 (sgd)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, choices=["cuda", "cpu"], help="default cuda when available")
    p.add_argument("--backend", default=None, choices=["nccl", "gloo"], help="default nccl on GPUs, else gloo")
    p.add_argument("--bucket-mb", type=float, default=None,
                   help="DDP gradient bucket size (bucket_cap_mb); default: the parameter bytes of one generated layer, "
                        "so the second layer's gradients are reduced while the first layer's backward runs")
    p.add_argument("--static-graph", action="store_true", help="DDP(static_graph=True) (same results)")
    p.add_argument("--warmup", type=int, default=3, help="steps left out of the timing (at most --steps - 1)")
    p.add_argument("--shard", default="stride", choices=["stride", "cost"],
                   help="stride: every world-th node of the batch; cost: balanced by 2-hop in-neighbourhood size")
    p.add_argument("--prefetch", default=True, action=argparse.BooleanOptionalAction,
                   help="khop mode on GPUs: build the next step's subgraph on a side stream (default on)")
    p.add_argument("--sync-debug", action="store_true",
                   help="count host synchronisations per phase (torch.cuda.set_sync_debug_mode('warn'))")
    p.add_argument("--offload", default="keep", choices=["keep", "host", "file"],
                   help="activations the generated layers save for backward: kept on the GPU, or offloaded by the "
                        "hectorgen tensor cache to pinned host memory or to files (one per rank, --offload-dir)")
    p.add_argument("--offload-dir", default=None,
                   help="--offload file: the directory of the rank folders (default $HECTORGEN_OFFLOAD_DIR or $TMPDIR)")
    p.add_argument("--offload-gib", type=float, default=16.0,
                   help="--offload: the tensor cache's pinned host budget (host) or file size (file) per rank, GiB")
    p.add_argument("--offload-min-kib", type=float, default=1024.0,
                   help="--offload: smaller saved tensors are kept (the tensor cache's min_bytes), KiB")
    p.add_argument("--offload-prefetch", type=int, default=0,
                   help="--offload: when the backward enters a layer, also load the saved tensors of this many layers "
                        "before it (0: a layer's tensors come back when its backward starts; 1 loads both layers of "
                        "this model at once, which keeps the peak where it is without offloading)")
    p.add_argument("--features", default="device", choices=["device", "unified"],
                   help="khop mode: node features in GPU memory, or in a unified tensor (pinned, GPU-mapped host "
                        "memory, one copy per rank) whose rows each step's subgraph gathers over PCIe")
    p.add_argument("--check", action="store_true", help="the correctness check (exit 1 on failure)")
    p.add_argument("--tol", type=float, default=1e-5, help="--check: max |a - b| / max |b| per parameter")
    p.add_argument("--out", default=None, help="append JSON lines here (rank 0)")
    p.add_argument("--tag", default="", help="a free label copied into the JSON records")
    a = p.parse_args(argv)
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.layer is None:
        a.layer = "generated" if a.device == "cuda" else "standin"
    if a.backend is None:
        a.backend = "nccl" if a.device == "cuda" else "gloo"
    if a.backend == "nccl" and a.device != "cuda":
        p.error("--backend nccl needs --device cuda")
    if a.optimizer is None:
        a.optimizer = "sgd" if a.check else "adam"
    if a.lr is None:
        a.lr = 0.05 if a.optimizer == "sgd" else 0.005
    if a.features == "unified" and (a.mode != "khop" or a.device != "cuda"):
        p.error("--features unified needs --mode khop and --device cuda (full mode reads every feature every step)")
    if a.steps < 1 or a.batch < 1 or a.warmup < 0:
        p.error("--steps and --batch must be positive, --warmup not negative")
    return a


def setup_device(a, info) -> torch.device:
    if a.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("ddp_train: --device cuda but torch sees no GPU")
    index = info.local_rank % torch.cuda.device_count()
    if a.backend == "nccl" and info.local_rank >= torch.cuda.device_count():
        raise SystemExit(f"ddp_train: NCCL needs one GPU per process: local rank {info.local_rank} of a host with "
                         f"{torch.cuda.device_count()} GPU(s); use --backend gloo to share GPUs")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def main(argv=None) -> int:
    a = parse_args(argv)
    info = rank_info()
    device = setup_device(a, info)
    if info.distributed and not dist.is_initialized():
        dist.init_process_group(a.backend, timeout=datetime.timedelta(minutes=10),
                                device_id=device if a.backend == "nccl" else None)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.check:
        torch.use_deterministic_algorithms(True, warn_only=True)
    lead = info.rank == 0
    procs = f"{info.world_size} process{'es' if info.world_size > 1 else ''}"

    def log(msg):
        if lead:
            print(f"[ddp_train {a.model} {info.world_size}x] {msg}", flush=True)

    # Rank 0 first: it builds the extension, JIT-builds the runtime and writes the graph cache; the others then
    # find them ready (no two processes build or write the same files).
    trainer = None
    for turn in ([0, 1] if info.distributed else [0]):
        if (info.rank == 0) == (turn == 0):
            t0 = time.perf_counter()
            mod, cls = load_layer(a, info)
            graph = load_graph(a.graph, a.seed, a.scale)
            trainer = Trainer(a, info, device, mod, cls, graph)
            setup_s = time.perf_counter() - t0
        if info.distributed:
            dist.barrier()
    g = trainer.graph
    log(f"{a.layer} {a.model} on '{g.name}' ({g.num_nodes} nodes, {g.num_edges} edges, {g.num_etypes} relations, "
        f"{g.num_ntypes} node types), mode {a.mode}, {procs} over "
        f"{a.backend if info.distributed else 'none'} on {device} "
        f"({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), global batch {trainer.batch}, "
        f"{len(trainer.train_nodes)} training nodes, {a.optimizer} lr {a.lr}, setup {setup_s:.1f} s")

    clock = StepClock(device, count_syncs=a.sync_debug)
    model, losses, missing, wall = trainer.run(info.world_size, info.rank, a.optimizer, info.distributed, clock,
                                               offload=a.offload, features=a.features)
    memory = memory_report(trainer.last_run, info, device)
    losses = sum_over_ranks(losses.to(device), info).cpu()       # the global mean loss of every step
    t = clock.result(a.steps)
    warmup = min(a.warmup, a.steps - 1)
    timing = timing_summary(gather_ranks(t["phases"], info, device), gather_ranks(t["step_ms"], info, device),
                            gather_ranks(t["sizes"], info, device),
                            gather_ranks(torch.tensor([wall], dtype=torch.float64), info, device)[:, 0], warmup)
    weights = flat_weights(model)
    result = {"kind": "summary", "tag": a.tag, "model": a.model, "layer": a.layer, "graph": g.name,
              "num_nodes": g.num_nodes, "num_edges": g.num_edges, "mode": a.mode, "world_size": info.world_size,
              "backend": a.backend if info.distributed else None, "device": str(device),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
              "torch": torch.__version__, "batch": trainer.batch, "steps": a.steps, "optimizer": a.optimizer, "lr": a.lr,
              "seed": a.seed, "bucket_mb": bucket_mb(model, a), "static_graph": a.static_graph, "shard": a.shard,
              "prefetch": bool(a.prefetch and device.type == "cuda" and a.mode == "khop"), "sync_debug": a.sync_debug,
              "loss_first": losses[0].item(), "loss_last": losses[-1].item(), "digest": digest(weights),
              "missing_grads": missing, "ddp": trainer.ddp_stats, "offload": a.offload, "features": a.features,
              **memory}
    result.update({k: v for k, v in timing.items() if k not in ("per_step",)})
    result["throughput_nodes_s"] = trainer.batch / (result["median_step_ms"] / 1e3)
    every = max(1, a.steps // 10)
    for s in range(a.steps):
        if s % every == 0 or s == a.steps - 1:
            log(f"step {s + 1:4d}/{a.steps}  loss {losses[s].item():.4f}  {timing['per_step'][s]['step_ms']:8.2f} ms"
                f"{'  (warm-up)' if s < warmup else ''}")
    if trainer.ddp_stats:
        log(f"DDP: buckets {trainer.ddp_stats['bucket_bytes']} bytes; backward {trainer.ddp_stats['backward_compute_ms']}"
            f" ms, all-reduce {trainer.ddp_stats['allreduce_ms']} ms, overlapped {trainer.ddp_stats['overlap_ms']} ms "
            f"(DDP's own sample of one step)")
    for line in phase_table(timing, gpu=device.type == "cuda"):
        log(line)
    for line in memory_lines(memory):
        log(line)
    ok = not missing
    if missing:
        log(f"FAIL: parameters without a gradient: {', '.join(missing)}")

    if a.check:
        spread = rank_spread(weights, info)
        model2, _, missing2, _ = trainer.run(info.world_size, info.rank, a.optimizer, info.distributed,
                                             offload=a.offload, features=a.features)
        memory2 = memory_report(trainer.last_run, info, device)
        plain = a.offload != "keep" or a.features != "device"
        if plain:   # the same run with the activations kept and the features in GPU memory: the same bits
            model3, _, missing3, _ = trainer.run(info.world_size, info.rank, a.optimizer, info.distributed)
            result["plain_peak_gib"] = memory_report(trainer.last_run, info, device).get("peak_gib")
            plain_equal = all(torch.equal(weights[n], p.detach()) for n, p in model3.named_parameters())
            plain_equal = bool(max_over_ranks(torch.tensor([0.0 if plain_equal else 1.0], device=device),
                                              info).item() == 0)
            missing2 = sorted(set(missing2) | set(missing3))
        rerun_equal = all(torch.equal(weights[n], p.detach()) for n, p in model2.named_parameters())
        rerun_equal = bool(max_over_ranks(torch.tensor([0.0 if rerun_equal else 1.0], device=device), info).item() == 0)
        verdict = torch.zeros(1, device=device)
        ref = {}
        if lead:
            model1, _, missing1, _ = trainer.run(1, 0, a.optimizer, ddp=False)
            ref = compare(weights, flat_weights(model1))
            missing = sorted(set(missing) | set(missing2) | set(missing1))
            checks = {"vs_one_process": ref["max_rel"] <= a.tol, "rerun_bit_identical": rerun_equal,
                      "ranks_identical": spread == 0.0, "every_parameter_has_a_gradient": not missing}
            if plain:
                checks["same_bits_as_kept_device_features"] = plain_equal
            if a.offload != "keep":
                checks["offload_clean"] = memory["offload_clean"] and memory2["offload_clean"]
            verdict[0] = 0.0 if all(checks.values()) else 1.0
            result.update(check=checks, tol=a.tol, bug=os.environ.get(BUG_ENV, ""), rank_spread=spread, **ref)
            log(f"check: {procs} vs 1 process after {a.steps} steps: max abs diff "
                f"{ref['max_abs']:.3e} ({ref['max_abs_param']}), max rel diff {ref['max_rel']:.3e} "
                f"({ref['max_rel_param']}; tolerance {a.tol:g})")
            log(f"check: rerun bit-identical: {rerun_equal}; ranks identical: {spread == 0.0} (spread {spread:.3e}); "
                f"every parameter has a gradient: {not missing}")
            if plain:
                log(f"check: offload {a.offload}, features {a.features}: the same bits as with the activations kept "
                    f"and the features in device memory: {plain_equal}")
                if result["plain_peak_gib"]:
                    log(f"check: peak GPU memory per rank {', '.join(f'{v:.2f}' for v in memory['peak_gib'])} GiB, "
                        f"with the activations kept and the features in GPU memory "
                        f"{', '.join(f'{v:.2f}' for v in result['plain_peak_gib'])} GiB")
            if a.offload != "keep":
                log(f"check: tensor cache per rank: {memory['offload_clean_why']}")
        if info.distributed:
            dist.broadcast(verdict, 0)
        ok = ok and verdict.item() == 0

    result["test_acc"] = trainer.accuracy(model) if lead else None
    result["ok"] = ok
    if lead:
        log(f"loss {result['loss_first']:.4f} -> {result['loss_last']:.4f}, test accuracy {result['test_acc']:.3f}, "
            f"step {result['mean_step_ms']:.2f} ms mean, {result['median_step_ms']:.2f} ms median (steps {warmup + 1}-"
            f"{a.steps}), {result['throughput_nodes_s']:.0f} labelled nodes/s, "
            f"weights {result['digest']}")
    if lead and a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        with open(a.out, "a") as f:
            for s in range(a.steps):
                f.write(json.dumps({"kind": "step", "tag": a.tag, "model": a.model, "graph": g.name, "mode": a.mode,
                                    "world_size": info.world_size, "step": s, "loss": losses[s].item(),
                                    "warmup": s < warmup, **timing["per_step"][s]}) + "\n")
            f.write(json.dumps(result) + "\n")
    if a.check:
        bug = f", {BUG_ENV}={os.environ[BUG_ENV]}" if os.environ.get(BUG_ENV) else ""
        c = result.get("check", {})
        log(f"{'PASS' if ok else 'FAIL'}: DDP check {a.model} ({procs}, "
            f"{a.backend if info.distributed else 'no'} backend, {device.type}, {a.mode}"
            f"{'' if a.offload == 'keep' else ', offload ' + a.offload}"
            f"{'' if a.features == 'device' else ', unified features'}{bug}): vs 1 process max rel "
            f"diff {result.get('max_rel', float('nan')):.1e} (tol {a.tol:g}), rerun bit-identical "
            f"{c.get('rerun_bit_identical')}, ranks identical {c.get('ranks_identical')}, all gradients {not missing}"
            + "".join(f", {k.replace('_', ' ')} {v}" for k, v in c.items()
                      if k in ("same_bits_as_kept_device_features", "offload_clean")))
    if info.distributed:
        dist.barrier()   # no rank tears its connections down while another still works (gloo aborts on that)
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
