#!/usr/bin/env python3
"""Activation offloading benchmark (issue 11, item 4): a GPT-like stack of transformer layers in bf16 (the anchor's,
../shared/anchors/offload.py) trained one step at a time with the activations

  keep        in GPU memory                          recompute    per-layer checkpointing
  save_on_cpu torch.autograd.graph.save_on_cpu(pin_memory=True)
  ours-host   hectorgen TensorCache, every layer to pinned host memory
  ours-ssd    every layer to the file tier (O_DIRECT files on --file-dir), as much as the disk absorbs
  ours-adaptive[-ssd]  per layer keep / offload / recompute as plan_placement picks it from a profiled step: the
              lowest predicted activation peak within 5% of keep's step (the plan and its reasons go to the log)
  ours-adaptive-lowmem the same, allowed as much extra step time as recompute took (ROK plot)
  ours-sync   (ROK plot) every layer to host memory, each store waited for at once, each tensor loaded when
              backward needs it: the lowest peak (save_on_cpu's schedule over the engine)
  ours@<baseline>      (ROK plot) the fastest plan within the baseline's measured peak at that batch, as its budget
  ours-host:inflight=G (part "inflight") ours-host with G GiB of stores in flight at most (the cache's default: 2):
              what a larger allowance buys in step time and costs in peak on the anchor's stack

For each configuration: step time (median of --steps), activation peak (peak reserved GPU memory above what the
weights and gradients hold; peak allocated beside it), bytes moved per step, and the physics floor: the measured
PCIe and disk bandwidths, the forward time, and what they allow (the bytes that can leave during the forward pass,
the step time of moving everything). Then the ROK plot (activation peak vs throughput) across batch sizes, and a
gradient check: every mode bit-identical to keep (on a smaller stack, with deterministic kernels).

    python3 bench/offload/offload_bench.py            # everything, ~5 minutes on an H100; results under $OUT
    python3 bench/offload/offload_bench.py --quick    # a small stack, to try the script (also on CPU-less GPUs)

Writes to --out (default $OUT or bench/offload/results): offload_results.jsonl (one line per measurement),
offload_results.md (the tables), offload_rok.png (with matplotlib) and offload_bench.log.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS for the gradient check

try:
    import torch
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint
except ImportError:  # --report re-renders a run's tables and plot anywhere, without torch
    torch = nn = checkpoint = None

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "runtime" / "python"))
if torch is not None:
    from hectorgen_runtime import offload, offload_plan  # noqa: E402

GiB = 2**30
LOG = None
# The ROK plot's budgets: ours planned for each baseline's measured peak may take as much extra step time as it
# needs (the plan is the fastest one within the budget).
BUDGET_OVERHEAD = 10.0
# Reading the ROK plot: a point is within a budget when its peak is at most the budget plus PEAK_TOLERANCE of it
# plus PEAK_SLACK_GIB (reserved memory comes in the caching allocator's segments, 20 MiB for mid-size tensors), and
# ours is on the frontier when its throughput is at least 1 - THROUGHPUT_TOLERANCE of the best baseline's (the
# spread of a median of a few steps).
PEAK_TOLERANCE = 0.02
PEAK_SLACK_GIB = 20 / 1024
# measure() takes more steps than --steps until --min-seconds are timed, up to this many.
MAX_STEPS = 25
# --profile-hooks: cProfile the profiled step with every layer offloaded, into the log.
PROFILE_HOOKS = False
THROUGHPUT_TOLERANCE = 0.02
ROK_BASELINES = ["keep", "recompute", "save_on_cpu"]


def log(message: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {message}"
    print(line, flush=True)
    if LOG is not None:
        LOG.write(line + "\n")
        LOG.flush()


# ---------------------------------------------------------------------------------------------------------------
# The model


def make_layers(hidden: int, layers: int) -> nn.ModuleList:
    torch.manual_seed(0)
    return nn.ModuleList([
        nn.TransformerEncoderLayer(hidden, hidden // 128, 4 * hidden, dropout=0.0, batch_first=True, norm_first=True,
                                   activation="gelu", device="cuda", dtype=torch.bfloat16)
        for _ in range(layers)])


def preallocate_gradients(layers: nn.ModuleList, x: torch.Tensor) -> None:
    """Allocates every gradient before the first step, when the caching allocator holds only the weights: the
    gradients then sit in segments of their own, a step's activations in others, and after a step empty_cache hands
    all of the latter back. Otherwise the first step's gradients land in segments it also filled with activations,
    those segments stay reserved, and a later mode's peak (reserved memory above the weights and gradients) depends
    on what the modes before it left there (recompute measured 0.00 GiB at batch 2). Steps accumulate into them."""
    for p in layers.parameters():
        p.grad = torch.zeros_like(p)
    x.grad = torch.zeros_like(x)


def model_flops(hidden: int, layers: int, seq: int, batch: int) -> float:
    return 2 * 3 * layers * batch * seq * (12 * hidden * hidden + 2 * seq * hidden)  # forward + backward


class Runner:
    """Steps of one configuration in one mode."""

    def __init__(self, layers: nn.ModuleList, x: torch.Tensor, mode: str, cache=None):
        self.layers, self.x, self.mode, self.cache = layers, x, mode, cache

    def forward(self):
        h = self.x
        for layer in self.layers:
            h = checkpoint(layer, h, use_reentrant=False) if self.mode == "recompute" else layer(h)
        return h.float().pow(2).mean()

    def step(self):
        if self.mode == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                loss = self.forward()
        elif self.cache is not None:
            with self.cache:
                loss = self.forward()
        else:
            loss = self.forward()
        loss.backward()


# ---------------------------------------------------------------------------------------------------------------
# Bandwidths


def pcie_bandwidth(gib: float = 1.0) -> dict:
    n = int(gib * GiB)
    device = torch.empty(n, dtype=torch.uint8, device="cuda")
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    result = {}
    for name, dst, src in (("d2h", host, device), ("h2d", device, host)):
        best = math.inf
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t)
        result[name] = n / best
    return result


def engine_file_bandwidth(engine, gib: float) -> dict:
    """Write and read bandwidth of the file tier as the engine does it (bounce buffers, O_DIRECT, AIO)."""
    chunk = 256 << 20
    tensors = [torch.full((chunk,), i, dtype=torch.uint8, device="cuda") for i in range(max(1, int(gib * GiB) // chunk))]
    torch.cuda.synchronize()
    t = time.perf_counter()
    ids = [engine.store(tensor, "file", False)[0] for tensor in tensors]
    states = [engine.wait_store(i) for i in ids]
    write = time.perf_counter() - t
    if any(state != "done" for state in states):
        return {"error": engine.error(ids[states.index(next(s for s in states if s != 'done'))])}
    back = [torch.empty_like(tensor) for tensor in tensors]
    t = time.perf_counter()
    for i, dst in zip(ids, back):
        engine.load(i, dst)
    states = [engine.wait_load(i) for i in ids]
    read = time.perf_counter() - t
    ok = all(state == "done" for state in states) and all(torch.equal(a, b) for a, b in zip(tensors, back))
    for i in ids:
        engine.release(i)
    engine.take_finished_stores()
    total = chunk * len(tensors)
    return {"write": total / write, "read": total / read, "verified": ok}


# ---------------------------------------------------------------------------------------------------------------
# Measurements


def step_seconds(runner: Runner) -> float:
    """Wall-clock seconds of one step, the GPU idle before and done after."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    runner.step()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def measure(runner: Runner, steps: int, min_seconds: float = 0.0) -> dict:
    """Step time (median), activation peak and bytes moved of `steps` steps after a warm-up, or of as many more
    (at most MAX_STEPS) as fill `min_seconds`: a 40 ms step spread by 15% over three steps (ours@keep, the same plan as
    keep, measured 16% slower at batch 1)."""
    runner.step()  # warm-up
    torch.cuda.synchronize()
    if runner.cache is not None:
        runner.cache.wait_io()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_allocated, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    engine_before = runner.cache.engine_stats() if runner.cache is not None else None
    times = []
    while len(times) < steps or (sum(times) < min_seconds and len(times) < MAX_STEPS):
        times.append(step_seconds(runner))
        if runner.cache is not None:
            runner.cache.wait_io()
            if runner.cache.live_records():
                log(f"   WARNING: {runner.cache.live_records()} records left after a step")
    result = {
        "step_ms": statistics.median(times) * 1e3,
        "step_ms_all": [round(t * 1e3, 2) for t in times],
        "steps": len(times),
        "peak_reserved_gib": (torch.cuda.max_memory_reserved() - base_reserved) / GiB,
        "peak_allocated_gib": (torch.cuda.max_memory_allocated() - base_allocated) / GiB,
    }
    if runner.cache is not None:
        after = runner.cache.engine_stats()
        result["stored_gib_per_step"] = (after["stored_bytes"] - engine_before["stored_bytes"]) / len(times) / GiB
        result["loaded_gib_per_step"] = (after["loaded_bytes"] - engine_before["loaded_bytes"]) / len(times) / GiB
        result["cache_stats"] = dict(runner.cache.stats)
    return result


def forward_seconds(runner: Runner) -> float:
    ts = []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = runner.forward()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
        del loss
    return statistics.median(ts)


def timed_steps(runner: Runner, steps: int = 3) -> float:
    """Median seconds of `steps` steps after one untimed step."""
    runner.step()
    times = [step_seconds(runner) for _ in range(steps)]
    if runner.cache is not None:
        runner.cache.wait_io()
    return statistics.median(times)


def profile_scopes(layers: nn.ModuleList, x: torch.Tensor, engine, bandwidth: dict) -> tuple:
    """The profiled step, and what offloading costs beyond the transfers. With every layer kept (twice, the second
    timed): forward time per layer (CUDA events), the bytes and tensors each layer saves, what a recomputed layer
    keeps (its input, the size of x). Then the cache's own work per offloaded tensor, the larger of (a) its time in
    its hooks (pack, unpack, release; waits for the link excluded) over one step with every layer offloaded and
    (b) the step time that offloading the first layer alone adds to keeping everything (median of 3 steps each,
    with the plan's waits and prefetch, the layer's tensors under the link's bandwidth), per tensor of that layer:
    (b) also holds what the hooks do not see (the CPU waiting for stores and loads where the GPU outruns it, at
    small batches). Each layer's offload_seconds charges it for its tensors. Returns the profiles and the bytes the
    loss saves after the layers (resident at the end of the forward)."""
    cache = offload.TensorCache(layers, placement={layer: "keep" for layer in layers}, engine=engine)
    events = {}
    hooks = []
    for layer in layers:
        hooks.append(layer.register_forward_pre_hook(
            lambda m, a: events.setdefault(m, [torch.cuda.Event(enable_timing=True),
                                               torch.cuda.Event(enable_timing=True)])[0].record()))
        hooks.append(layer.register_forward_hook(lambda m, a, o: events[m][1].record()))
    for _ in range(2):
        events.clear()
        Runner(layers, x, "ours", cache).step()
    torch.cuda.synchronize()
    for hook in hooks:
        hook.remove()
    kept_seconds = timed_steps(Runner(layers, x, "ours", cache))
    cache.remove()
    profiles = [offload.ScopeProfile(layer, events[layer][0].elapsed_time(events[layer][1]) / 1e3,
                                     cache.last_scope_bytes.get(layer, 0), input_bytes=x.numel() * x.element_size())
                for layer in layers]
    tensors = [cache.last_scope_tensors.get(layer, 0) for layer in layers]

    offloaded = offload.TensorCache(layers, tier="host", engine=engine)
    if PROFILE_HOOKS:
        import cProfile
        import io
        import pstats
        profiler = cProfile.Profile()
        profiler.enable()
    Runner(layers, x, "ours", offloaded).step()
    torch.cuda.synchronize()
    if PROFILE_HOOKS:
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        log("   cProfile of a step with every layer offloaded (--profile-hooks), by own time:\n" + text.getvalue())
    offloaded.wait_io()
    offloaded.remove()
    per_tensor = offloaded.stats["hook_ns"] / 1e9 / max(1, offloaded.stats["records"])
    if tensors[0] and len(layers) > 1:
        first = offload.plan_placement(profiles, bandwidth["d2h"], bandwidth["h2d"],
                                       fixed={layer: "host" if j == 0 else "keep" for j, layer in enumerate(layers)})
        one = offload.TensorCache(layers, placement=first, engine=engine)
        added = timed_steps(Runner(layers, x, "ours", one)) - kept_seconds
        one.remove()
        log(f"   profile: forward {sum(p.forward_seconds for p in profiles) * 1e3:.1f} ms, step {kept_seconds * 1e3:.1f} "
            f"ms; the cache's own work per offloaded tensor {per_tensor * 1e6:.0f} us in its hooks, "
            f"{added / tensors[0] * 1e6:.0f} us in step time (the first layer offloaded: {added * 1e3:+.2f} ms)")
        per_tensor = max(per_tensor, added / tensors[0])
    for profile, count in zip(profiles, tensors):
        profile.offload_seconds = per_tensor * count
    return profiles, cache.last_tail_bytes


def planner_budget(profiles: list, tail_bytes: int, budget_gib: float, rows: dict) -> int:
    """A measured activation peak (reserved GiB above the weights, as the rows report it) in the planner's units
    (bytes of saved activations): linear through two placements measured both ways, keep everywhere and recompute
    everywhere (so that keep's and recompute's own peaks map to their plans' peaks exactly)."""
    n = len(profiles)
    plan_keep = offload_plan.simulate(profiles, ["keep"] * n, 0, 1.0, 1.0, tail_bytes=tail_bytes).peak
    plan_recompute = offload_plan.simulate(profiles, ["recompute"] * n, 0, 1.0, 1.0, tail_bytes=tail_bytes).peak
    keep, recompute = rows["keep"]["peak_reserved_gib"], rows.get("recompute", {}).get("peak_reserved_gib")
    if recompute is None or keep <= recompute or plan_keep <= plan_recompute:
        return max(0, int(plan_keep + (budget_gib - keep) * GiB))
    slope = (plan_keep - plan_recompute) / (keep - recompute)
    return max(0, int(plan_recompute + (budget_gib - recompute) * slope))


def measured_recompute(profiles: list, rows: dict) -> None:
    """What recomputing a layer costs, from the recompute and keep steps measured before (each layer's share of
    the difference; recomputation saves nothing, so it is cheaper than the profiled forward). Left to the planner's
    default (the layer's forward) when missing or implausible (under half the forward: noise)."""
    keep, recompute = rows.get("keep", {}).get("step_ms"), rows.get("recompute", {}).get("step_ms")
    if keep is None or recompute is None:
        return
    per_layer = (recompute - keep) / 1e3 / len(profiles)
    for profile in profiles:
        if per_layer >= 0.5 * profile.forward_seconds:
            profile.recompute_seconds = min(per_layer, profile.forward_seconds)


def run_config(name, hidden, layers_n, seq, batch, modes, args, engine, bandwidth, results, out):
    log(f"== {name}: H={hidden} L={layers_n} S={seq} B={batch} ({', '.join(modes)})")
    layers = make_layers(hidden, layers_n)
    x = torch.randn(batch, seq, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    preallocate_gradients(layers, x)
    torch.cuda.empty_cache()
    flops = model_flops(hidden, layers_n, seq, batch)
    base = {"config": name, "hidden": hidden, "layers": layers_n, "seq": seq, "batch": batch}
    keep_runner = Runner(layers, x, "keep")
    keep_runner.step()
    fwd = forward_seconds(keep_runner)
    profiles = None
    rows = {}
    budgets = []  # the peaks that ours@<baseline> planned for, to skip a duplicate
    for mode in modes:
        cache = None
        plan_row = None
        budget_of = mode[len("ours@"):] if mode.startswith("ours@") else None
        if budget_of is not None:
            peak = rows.get(budget_of, {}).get("peak_reserved_gib")
            if peak is None or any(abs(peak - other) < 0.005 for other in budgets):
                continue
            budgets.append(peak)
        try:
            if mode.startswith("ours"):
                if mode.startswith("ours-adaptive") or mode.startswith("ours@"):
                    tier = "file" if mode.endswith("ssd") else "host"
                    if profiles is None:
                        profiles, tail = profile_scopes(layers, x, engine, bandwidth)
                        measured_recompute(profiles, rows)
                    write = bandwidth["disk_write"] if tier == "file" else bandwidth["d2h"]
                    if write <= 0:
                        raise RuntimeError("no measured bandwidth for this tier (is the file tier available?)")
                    read = bandwidth["disk_read"] if tier == "file" else bandwidth["h2d"]
                    keep_ms = rows.get("keep", {}).get("step_ms")
                    # Backward per forward, so that the plan's keep step is the measured one.
                    profiled = sum(p.forward_seconds for p in profiles)
                    factor = max(0.5, (keep_ms / 1e3 - profiled) / profiled) if keep_ms else 2.0
                    overhead, budget = args.max_overhead, None
                    if mode.endswith("lowmem") and "step_ms" in rows.get("recompute", {}) and keep_ms:
                        overhead = max(overhead, rows["recompute"]["step_ms"] / keep_ms - 1)
                    if budget_of is not None:
                        overhead = BUDGET_OVERHEAD
                        budget = planner_budget(profiles, tail, rows[budget_of]["peak_reserved_gib"], rows)
                    t = time.perf_counter()
                    plan = offload.plan_placement(profiles, write, read, tier=tier, backward_factor=factor,
                                                  max_overhead=overhead, memory_budget_bytes=budget, tail_bytes=tail)
                    plan_row = plan.summary()
                    for_budget = "" if budget_of is None else (
                        f" for {budget_of}'s peak, {rows[budget_of]['peak_reserved_gib']:.2f} GiB ({budget / GiB:.2f} "
                        f"GiB of saved activations)")
                    log(f"   {mode}: {sum(v != 'keep' for v in plan.values())} of {layers_n} layers not kept"
                        f"{for_budget} (planned in {time.perf_counter() - t:.1f} s; profiled forward "
                        f"{profiled * 1e3:.1f} ms, keep's {fwd * 1e3:.1f} ms; backward/forward {factor:.2f}; the "
                        f"cache's own work per offloaded layer "
                        f"{statistics.mean(p.offload_seconds for p in profiles) * 1e3:.2f} ms)")
                    for line in plan.explain():
                        log(f"     {line}")
                    inflight = args.inflight_gib * GiB if args.inflight_gib else plan.max_inflight_bytes
                    cache = offload.TensorCache(layers, placement=plan, engine=engine, max_inflight_bytes=inflight)
                elif mode == "ours-sync":
                    # The lowest peak: every store waited for as it is queued, every tensor loaded when backward
                    # unpacks it (save_on_cpu's schedule, over the engine's pinned pool instead of a pinned
                    # allocation and copy per tensor).
                    cache = offload.TensorCache(layers, tier="host", engine=engine, max_inflight_bytes=0,
                                                prefetch_scopes=-1)
                elif mode.startswith("ours-host:inflight="):
                    # ours-host with another allowance of stores in flight: the forward waits for the link once
                    # that many bytes are queued; the tensors still queued when backward needs them are forwarded.
                    allowance = float(mode.split("=", 1)[1]) * GiB
                    cache = offload.TensorCache(layers, tier="host", engine=engine, when_busy="wait",
                                                max_inflight_bytes=int(allowance))
                else:
                    # ours-ssd offloads what the disk absorbs while the step runs and keeps the rest (the disk is
                    # 25x slower than PCIe: waiting for it would stretch the forward pass to disk speed).
                    cache = offload.TensorCache(layers, tier="file" if mode == "ours-ssd" else "host", engine=engine,
                                                when_busy="keep" if mode == "ours-ssd" else "wait")
            runner = Runner(layers, x, "keep" if mode.startswith("ours") else mode, cache)
            row = measure(runner, args.steps, args.min_seconds)
        except torch.OutOfMemoryError:
            row = {"oom": True}
        except Exception as error:  # noqa: BLE001 - one broken mode must not end the run: it is reported
            log(f"   {mode}: FAILED: {type(error).__name__}: {error}")
            row = {"error": f"{type(error).__name__}: {error}"}
        finally:
            if cache is not None:
                cache.remove()
        torch.cuda.empty_cache()
        row.update(base, mode=mode, forward_ms=fwd * 1e3)
        if plan_row is not None:
            row["plan"] = plan_row
        if "step_ms" in row:
            row["tflops"] = flops / (row["step_ms"] / 1e3) / 1e12
            row["tokens_per_s"] = batch * seq / (row["step_ms"] / 1e3)
        rows[mode] = row
        results.append(row)
        out.write(json.dumps(row) + "\n")
        out.flush()
        if row.get("oom") or row.get("error"):
            log(f"   {mode:18s} {'OOM' if row.get('oom') else 'error'}")
        else:
            extra = ""
            if "stored_gib_per_step" in row:
                extra = f" stored {row['stored_gib_per_step']:.2f} GiB/step loaded {row['loaded_gib_per_step']:.2f}"
            if plan_row is not None:
                extra += (f" (plan {'/'.join(p[0] for p in plan_row['placement'])}: peak "
                          f"-{plan_row['keep_peak_gib'] - plan_row['peak_gib']:.2f} GiB, step "
                          f"{plan_row['overhead_ms']:+.1f} ms; waited {row['cache_stats']['waited_due']} stores, "
                          f"forwarded {row['cache_stats']['forwarded']})")
            log(f"   {mode:18s} step {row['step_ms']:8.1f} ms  peak {row['peak_reserved_gib']:6.2f} GiB reserved "
                f"({row['peak_allocated_gib']:6.2f} allocated){extra}")
    # The physics floor.
    offered = None
    for row in rows.values():
        if "cache_stats" in row and row["cache_stats"].get("offered_bytes"):
            offered = row["cache_stats"]["offered_bytes"] / (row["steps"] + 1) / GiB
            break
    keep = rows.get("keep", {})
    if offered is not None and "step_ms" in keep:
        floor = {
            "config": name, "mode": "floor", "batch": batch, "hidden": hidden, "offloadable_gib": offered,
            "forward_ms": fwd * 1e3, "d2h_gbs": bandwidth["d2h"] / 1e9, "h2d_gbs": bandwidth["h2d"] / 1e9,
            "disk_write_gbs": bandwidth.get("disk_write", 0) / 1e9, "disk_read_gbs": bandwidth.get("disk_read", 0) / 1e9,
            # What can leave during the forward pass, and the lowest peak that allows at no cost in time.
            "host_out_during_forward_gib": min(offered, bandwidth["d2h"] * fwd / GiB),
            "ssd_out_during_forward_gib": min(offered, bandwidth.get("disk_write", 0) * fwd / GiB),
            # Offloading everything: each direction must move all of it within the step (PCIe is full duplex).
            "host_transfer_floor_ms": max(keep["step_ms"], offered * GiB / min(bandwidth["d2h"], bandwidth["h2d"]) * 1e3),
            "ssd_transfer_floor_ms": max(keep["step_ms"], offered * GiB / max(1.0, min(
                bandwidth.get("disk_write", 0), bandwidth.get("disk_read", 0))) * 1e3),
        }
        floor["keep_peak_gib"] = keep["peak_reserved_gib"]
        adaptive = rows.get("ours-adaptive", {}).get("plan")
        if adaptive is not None:
            floor["plan_placement"] = adaptive["placement"]
            floor["plan_peak_reduction_gib"] = adaptive["keep_peak_gib"] - adaptive["peak_gib"]
            floor["plan_overhead_ms"] = adaptive["overhead_ms"]
        floor["host_peak_floor_gib"] = keep["peak_reserved_gib"] - floor["host_out_during_forward_gib"]
        results.append(floor)
        out.write(json.dumps(floor) + "\n")
        log(f"   floor: {offered:.2f} GiB offloadable, forward {fwd * 1e3:.1f} ms; PCIe {bandwidth['d2h'] / 1e9:.1f} "
            f"GB/s out -> {floor['host_out_during_forward_gib']:.2f} GiB can leave during forward; moving everything "
            f"takes >= {floor['host_transfer_floor_ms']:.0f} ms (host), {floor['ssd_transfer_floor_ms']:.0f} ms (ssd)")
    del layers, x, keep_runner
    torch.cuda.empty_cache()
    return rows


def gradient_check(args, engine, bandwidth, results, out) -> None:
    """Every mode's gradients against keep's, bit for bit, on a smaller stack with deterministic kernels (math
    attention, deterministic algorithms); keep is first checked against itself."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    hidden, layers_n, seq, batch = (1024, 4, 512, 2) if args.quick else (2048, 4, 1024, 2)
    log(f"== gradient check: H={hidden} L={layers_n} S={seq} B={batch}, math attention, deterministic algorithms")
    torch.use_deterministic_algorithms(True, warn_only=True)
    layers = make_layers(hidden, layers_n)
    x = torch.randn(batch, seq, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def grads(mode, cache=None):
        layers.zero_grad(set_to_none=True)
        x.grad = None
        with sdpa_kernel([SDPBackend.MATH]):
            Runner(layers, x, mode, cache).step()
        torch.cuda.synchronize()
        return [x.grad.clone()] + [p.grad.clone() for p in layers.parameters()]

    reference = grads("keep")
    # A plan as ours-adaptive makes one (its waits and prefetch depth), with layer 1 recomputed by hand.
    with sdpa_kernel([SDPBackend.MATH]):
        profiles, tail = profile_scopes(layers, x, engine, bandwidth)
    plan = offload.plan_placement(profiles, bandwidth["d2h"], bandwidth["h2d"], fixed={layers[1]: "recompute"},
                                  tail_bytes=tail)
    log(f"   planned: {' / '.join(plan[layer] for layer in layers)}")
    modes = {"keep (again)": ("keep", None), "recompute": ("recompute", None), "save_on_cpu": ("save_on_cpu", None),
             "ours-host": ("keep", dict(tier="host")), "ours-ssd": ("keep", dict(tier="file")),
             "ours-sync": ("keep", dict(tier="host", max_inflight_bytes=0, prefetch_scopes=-1)),
             "ours-mixed": ("keep", dict(tier="host", placement={layers[1]: "file", layers[3]: "keep"})),
             "ours-planned": ("keep", dict(placement=plan))}
    for name, (mode, options) in modes.items():
        cache = offload.TensorCache(layers, engine=engine, **options) if options is not None else None
        got = grads(mode, cache)
        if cache is not None:
            cache.wait_io()
            cache.remove()
        identical = all(torch.equal(a, b) for a, b in zip(reference, got))
        worst = max((a.float() - b.float()).abs().max().item() for a, b in zip(reference, got))
        row = {"mode": "gradients", "variant": name, "identical": identical, "max_abs_diff": worst}
        results.append(row)
        out.write(json.dumps(row) + "\n")
        log(f"   {name:14s} {'bit-identical' if identical else f'DIFFERENT (max |diff| {worst:.3g})'}")
    torch.use_deterministic_algorithms(False)
    del layers, x
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
# Report


def _frontier(points):
    """The points (peak, throughput) that no point with a lower or equal peak beats, by peak."""
    best, line = -math.inf, []
    for peak, throughput in sorted(points, key=lambda p: (p[0], -p[1])):
        if throughput > best:
            best = throughput
            line.append((peak, throughput))
    return line


def _within(rows: list, budget: float) -> list:
    """The rows whose peak is within `budget` (GiB, with the tolerances above)."""
    return [r for r in rows if r["peak_reserved_gib"] <= budget + abs(budget) * PEAK_TOLERANCE + PEAK_SLACK_GIB]


def _best_within(rows: list, budget: float):
    """The row of highest throughput whose peak is within `budget`, or None."""
    inside = _within(rows, budget)
    return max(inside, key=lambda r: r["tokens_per_s"]) if inside else None


def same_program(row: dict):
    """The baseline whose program an ours run is: a plan that keeps every layer ("keep") or recomputes every layer
    ("recompute") installs no hooks (offload.py), so the step runs the very code of that baseline; None otherwise."""
    placement = set((row.get("plan") or {}).get("placement") or ())
    return next(iter(placement)) if placement in ({"keep"}, {"recompute"}) else None


def twins(ours: list, baseline: dict) -> list:
    """The ours runs that are `baseline`'s program at its batch (same_program)."""
    return [r for r in ours if r["batch"] == baseline["batch"] and same_program(r) == baseline["mode"]]


def frontier_lines(rok: list, markdown: bool = False) -> list:
    """Per memory budget (each baseline run's peak): the best baseline and the best of ours within it, at any
    batch size, and whether ours is on or beyond the baseline frontier there: at least 98% of its throughput, or
    an ours run within the budget that is the same program as that baseline point (same batch; two timings of one
    program differ by up to ~10% at batch 1, where the step is bound by the CPU launching kernels)."""
    rok = [r for r in rok if "tokens_per_s" in r]
    baselines = [r for r in rok if r["mode"] in ROK_BASELINES]
    ours = [r for r in rok if r["mode"].startswith("ours")]
    sources = {}  # budget (GiB, as printed) -> the baseline runs with that peak
    for r in sorted(baselines, key=lambda r: (r["peak_reserved_gib"], r["batch"], r["mode"])):
        sources.setdefault(f"{r['peak_reserved_gib']:.2f}", []).append(r)
    lines = [] if markdown else ["== ROK frontier: per budget, the best baseline and ours within it"]
    met = 0
    for name, runs in sources.items():
        budget = max(r["peak_reserved_gib"] for r in runs)
        base, mine = _best_within(baselines, budget), _best_within(ours, budget)
        ratio = mine["tokens_per_s"] / base["tokens_per_s"] if mine else 0.0
        on = ratio >= 1 - THROUGHPUT_TOLERANCE
        twin = None if on else next(iter(_within(twins(ours, base), budget)), None)
        if twin is not None:
            on, mine = True, twin
            ratio = mine["tokens_per_s"] / base["tokens_per_s"]
        met += on
        from_runs = ", ".join(f"{r['mode']} B={r['batch']}" for r in runs)
        mine_name = f"{mine['mode']} B={mine['batch']}" if mine else "none"
        if twin is not None:
            mine_name += f" (the same program as {base['mode']})"
        mine_tps = f"{mine['tokens_per_s']:.0f}" if mine else "-"
        if markdown:
            lines.append(f"| {name} ({from_runs}) | {base['mode']} B={base['batch']} | {base['tokens_per_s']:.0f} | "
                         f"{mine_name} | {mine_tps} | {ratio:.3f} | {'yes' if on else 'NO'} |")
        else:
            lines.append(f"   budget {name:>6s} GiB ({from_runs}): baseline {base['mode']} B={base['batch']} "
                         f"{base['tokens_per_s']:.0f} tok/s, ours {mine_name} {mine_tps} tok/s ({ratio:.3f}x): "
                         f"{'on/beyond the frontier' if on else 'BELOW the frontier'}")
    summary = f"ours on or beyond the frontier at {met} of {len(sources)} budgets"
    lines += ["", summary] if markdown else ["   " + summary]
    return lines


def write_report(results, meta, path_md, path_png) -> None:
    """The tables (path_md) and the ROK plot (path_png, with matplotlib) of a run: its rows and its meta line (GPU,
    torch, bandwidths, the file tier)."""
    bandwidth = meta["bandwidth"]
    lines = ["# Activation offloading benchmark", "",
             f"{meta['device']}, torch {meta['torch']}; PCIe d2h {bandwidth['d2h'] / 1e9:.1f} GB/s, "
             f"h2d {bandwidth['h2d'] / 1e9:.1f} GB/s; file tier ({', '.join(meta.get('file_paths') or ['none'])}, "
             f"{'O_DIRECT' if meta['direct_io'] else 'buffered'}, GDS {'on' if meta['gds'] else 'off'}): write "
             f"{bandwidth.get('disk_write', 0) / 1e9:.2f} GB/s, read {bandwidth.get('disk_read', 0) / 1e9:.2f} GB/s. "
             f"Peak = peak reserved GPU memory above the weights and gradients (allocated in parentheses).", ""]
    for config in dict.fromkeys(r["config"] for r in results if "config" in r and r.get("mode") != "floor"):
        rows = [r for r in results if r.get("config") == config and r.get("mode") not in ("floor",)]
        rows = [r for r in rows if not config.startswith("rok")]
        if not rows:
            continue
        keep = next((r for r in rows if r["mode"] == "keep" and "step_ms" in r), None)
        cpu = next((r for r in rows if r["mode"] == "save_on_cpu" and "step_ms" in r), None)
        r0 = rows[0]
        floor = next((r for r in results if r.get("config") == config and r.get("mode") == "floor"), None)

        def host_tier(r):
            """An ours run that moved its tensors through PCIe (not the file tier)."""
            return bool(r.get("cache_stats", {}).get("offered_bytes")) and not r["mode"].endswith("ssd")

        def in_order(r):
            """The in-order floor of a mode's step (ms) from its stored and loaded bytes (host tier), or ''."""
            if not (floor and keep and r.get("stored_gib_per_step") and r.get("loaded_gib_per_step") is not None):
                return ""
            fwd = floor["forward_ms"]
            ms = max(fwd, r["stored_gib_per_step"] * GiB / (floor["d2h_gbs"] * 1e9) * 1e3) + \
                max(keep["step_ms"] - fwd, r["loaded_gib_per_step"] * GiB / (floor["h2d_gbs"] * 1e9) * 1e3)
            return f"{ms:.0f} ({r['step_ms'] / ms:.2f}x)"
        lines += [f"## {config}: H={r0['hidden']} L={r0['layers']} S={r0['seq']} B={r0['batch']} bf16", "",
                  "| mode | step ms | vs keep | vs save_on_cpu | peak GiB | vs keep | stored GiB/step | loaded GiB/step "
                  "| in-order floor ms (step / it) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            if r.get("oom") or r.get("error"):
                lines.append(f"| {r['mode']} | {'OOM' if r.get('oom') else 'error: ' + r['error'][:80]} | | | | | | | |")
                continue
            vs_keep = f"{r['step_ms'] / keep['step_ms']:.2f}x" if keep else ""
            vs_cpu = f"{cpu['step_ms'] / r['step_ms']:.2f}x faster" if cpu else ""
            peak_vs = f"{(1 - r['peak_reserved_gib'] / keep['peak_reserved_gib']) * 100:+.0f}% lower" \
                if keep and keep["peak_reserved_gib"] > 0 else ""
            lines.append(f"| {r['mode']} | {r['step_ms']:.1f} | {vs_keep} | {vs_cpu} | {r['peak_reserved_gib']:.2f} "
                         f"({r['peak_allocated_gib']:.2f}) | {peak_vs} | {r.get('stored_gib_per_step', 0):.2f} | "
                         f"{r.get('loaded_gib_per_step', 0):.2f} | {in_order(r) if host_tier(r) else ''} |")
        if floor:
            lines += ["", f"Floor: {floor['offloadable_gib']:.2f} GiB offloadable per step, forward "
                          f"{floor['forward_ms']:.1f} ms. During the forward pass PCIe can move "
                          f"{floor['host_out_during_forward_gib']:.2f} GiB out (lowest peak at no cost: "
                          f"{floor['host_peak_floor_gib']:.2f} GiB of keep's {floor['keep_peak_gib']:.2f}), the disk "
                          f"{floor['ssd_out_during_forward_gib']:.2f} GiB. Moving everything out and back takes at "
                          f"least {floor['host_transfer_floor_ms']:.0f} ms a step through PCIe, "
                          f"{floor['ssd_transfer_floor_ms']:.0f} ms through the disk (max with the keep step)."]
            lines[-1] += (" In-order floor (column): the backward needs the forward's last stores first, so its "
                          "loads start when every store is done; with the bytes a mode stored and loaded, its step "
                          "takes at least max(forward, stored / d2h) + max(keep's backward, loaded / h2d).")
            if "plan_placement" in floor:
                lines += ["", f"Plan of ours-adaptive: {' / '.join(floor['plan_placement'])} (per layer); predicted "
                              f"{floor['plan_peak_reduction_gib']:.2f} GiB off the activation peak at "
                              f"{floor['plan_overhead_ms']:+.1f} ms a step (the log has its reasons per layer)."]
        lines.append("")
    grads = [r for r in results if r.get("mode") == "gradients"]
    if grads:
        lines += ["## Gradients against keep (bit for bit)", "", "| mode | result |", "|---|---|"]
        for r in grads:
            lines.append(f"| {r['variant']} | {'bit-identical' if r['identical'] else 'different, max |diff| ' + format(r['max_abs_diff'], '.3g')} |")
        lines.append("")
    rok = [r for r in results if str(r.get("config", "")).startswith("rok") and "step_ms" in r]
    if rok:
        lines += ["## ROK: activation peak vs throughput across batch sizes", "",
                  "ours@X: ours planned with X's measured peak (same batch) as its memory budget.", "",
                  "| batch | mode | peak GiB | tokens/s | TFLOP/s | plan |", "|---:|---|---:|---:|---:|---|"]
        for r in sorted(rok, key=lambda r: (r["batch"], r["mode"])):
            plan = "/".join(r["plan"]["placement"]) if "plan" in r else ""
            lines.append(f"| {r['batch']} | {r['mode']} | {r['peak_reserved_gib']:.2f} | {r['tokens_per_s']:.0f} | "
                         f"{r['tflops']:.1f} | {plan} |")
        lines += ["", "### Ours against the frontier of keep / recompute / save_on_cpu, per memory budget", "",
                  f"Every baseline point's peak is a budget; within it (peak <= budget + {PEAK_TOLERANCE:.0%} + "
                  f"{PEAK_SLACK_GIB * 1024:.0f} MiB, the allocator's segment), the "
                  f"best baseline throughput at any batch size against ours' best. On the frontier: ours >= "
                  f"{1 - THROUGHPUT_TOLERANCE:.0%} of the baseline's, or an ours run within the budget whose plan "
                  f"keeps (or recomputes) every layer at the baseline point's batch: the cache then installs no hooks "
                  f"and the step is that baseline's program (its two timings, taken a minute apart, differ by up to "
                  f"~10% at batch 1, where launching kernels bounds the step).", "",
                  "| budget GiB (from) | best baseline within | tokens/s | best ours within | tokens/s | ours/baseline "
                  "| on the frontier |", "|---|---|---:|---|---:|---:|---|"]
        lines += frontier_lines(rok, markdown=True)
        lines.append("")
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(10.5, 4.8))
            for mode in ROK_BASELINES:
                pts = sorted((r["peak_reserved_gib"], r["tokens_per_s"], r["batch"]) for r in rok if r["mode"] == mode)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", alpha=0.8, label=mode)
                    for p in pts:
                        ax.annotate(f"B={p[2]}", (p[0], p[1]), fontsize=7, textcoords="offset points", xytext=(3, 3))
            ours = [r for r in rok if r["mode"].startswith("ours")]
            ax.scatter([r["peak_reserved_gib"] for r in ours], [r["tokens_per_s"] for r in ours], s=14, color="black",
                       alpha=0.45, zorder=3, label="ours (every run)")
            # A baseline point that an ours run reproduces (a plan of keep or recompute everywhere runs that very
            # program) is ours as well: ringed, and on ours' line at its measured throughput.
            reproduced = [b for b in rok if b["mode"] in ROK_BASELINES and twins(ours, b)]
            if reproduced:
                ax.scatter([b["peak_reserved_gib"] for b in reproduced], [b["tokens_per_s"] for b in reproduced], s=90,
                           facecolors="none", edgecolors="black", linewidths=1.2, zorder=5,
                           label="ours: the same program (a plan of keep or recompute everywhere)")
            line = _frontier([(r["peak_reserved_gib"], r["tokens_per_s"]) for r in ours + reproduced])
            if line:
                xs, ys = [line[0][0]], [line[0][1]]
                for peak, throughput in line[1:]:  # a step line: a budget gets the best point left of it
                    xs += [peak, peak]
                    ys += [ys[-1], throughput]
                xs.append(max(r["peak_reserved_gib"] for r in rok))
                ys.append(ys[-1])
                ax.plot(xs, ys, color="black", linewidth=2.2, zorder=4, label="ours: best within the budget")
            ax.set_xscale("log")
            ax.set_xlabel("activation peak = memory budget (GiB, reserved above weights and gradients; log)")
            ax.set_ylabel("throughput (tokens/s)")
            ax.set_title(f"ROK: H={rok[0]['hidden']} L={rok[0]['layers']} S={rok[0]['seq']} bf16")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
            fig.tight_layout()
            fig.savefig(path_png, dpi=130)
            lines.append(f"![ROK]({path_png.name})")
        except ImportError:
            lines.append("(no matplotlib: no plot)")
    path_md.write_text("\n".join(lines) + "\n")


def report_only(path: pathlib.Path) -> int:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    meta = next((row for row in rows if row.get("mode") == "meta"), None)
    if meta is None:
        print(f"offload_bench: {path} has no meta line (not an offload_results.jsonl?)", file=sys.stderr)
        return 1
    results = [row for row in rows if row.get("mode") != "meta"]
    rok = [r for r in results if str(r.get("config", "")).startswith("rok")]
    for line in frontier_lines(rok) if rok else []:
        print(line)
    write_report(results, meta, path.parent / "offload_results.md", path.parent / "offload_rok.png")
    print(f"wrote {path.parent / 'offload_results.md'}")
    return 0


def main() -> int:
    global LOG
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "offload" / "results"))
    parser.add_argument("--file-dir", default=os.environ.get("HECTORGEN_OFFLOAD_DIR", "/tmp"),
                        help="where the file tier's file goes (a disk, not tmpfs)")
    parser.add_argument("--host-budget-gib", type=float, default=32)
    parser.add_argument("--file-gib", type=float, default=40)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode, at least")
    parser.add_argument("--min-seconds", type=float, default=1.5,
                        help="more timed steps (up to %d) until this many seconds per mode" % MAX_STEPS)
    parser.add_argument("--inflight-gib", type=float, default=0,
                        help="max_inflight_bytes of the adaptive modes (default: the plan's, which waits for its "
                             "stores where it predicts them done; ours-host/ours-ssd use the cache's 2 GiB)")
    parser.add_argument("--max-overhead", type=float, default=0.05,
                        help="step time the adaptive plan may add, as a fraction of keep's (target: 5%%)")
    parser.add_argument("--quick", action="store_true", help="small stacks only, to try the script")
    parser.add_argument("--report", metavar="JSONL",
                        help="no run: rewrite the tables and the plot of a run from its offload_results.jsonl (next to "
                             "it; no GPU or torch needed), e.g. after a change to how they are read")
    parser.add_argument("--profile-hooks", action="store_true",
                        help="cProfile a step with every layer offloaded (where the cache's own time goes)")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: main,large,rok,grads,inflight")
    args = parser.parse_args()
    if args.report:
        return report_only(pathlib.Path(args.report))
    global PROFILE_HOOKS
    PROFILE_HOOKS = args.profile_hooks
    if torch is None or not torch.cuda.is_available():
        print("offload_bench: needs torch and a CUDA GPU (--report needs neither)", file=sys.stderr)
        return 2
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    LOG = open(out_dir / "offload_bench.log", "w")
    skip = set(filter(None, args.skip.split(",")))
    started = time.perf_counter()
    log(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, out {out_dir}")
    t = time.perf_counter()
    offload.load_offload_extension()
    log(f"offload extension ready ({time.perf_counter() - t:.0f} s)")
    budget = int((4 if args.quick else args.host_budget_gib) * GiB)
    t = time.perf_counter()
    engine = offload.make_engine(host_budget_bytes=budget, directories=[args.file_dir],
                                 file_bytes=int((4 if args.quick else args.file_gib) * GiB), store_threads=1,
                                 load_threads=2)
    log(f"engine: {budget / GiB:.0f} GiB pinned ({time.perf_counter() - t:.1f} s), files {engine.file_paths} "
        f"({'O_DIRECT' if engine.direct_io else 'buffered'}, GDS {'on' if engine.gds else 'off'}) {engine.status}")
    bandwidth = pcie_bandwidth()
    disk = engine_file_bandwidth(engine, 1.0 if args.quick else 4.0) if engine.file_available else {}
    bandwidth["disk_write"], bandwidth["disk_read"] = disk.get("write", 0.0), disk.get("read", 0.0)
    log(f"bandwidth: PCIe d2h {bandwidth['d2h'] / 1e9:.1f} GB/s h2d {bandwidth['h2d'] / 1e9:.1f} GB/s; file tier "
        f"write {bandwidth['disk_write'] / 1e9:.2f} GB/s read {bandwidth['disk_read'] / 1e9:.2f} GB/s {disk}")
    results = []
    modes = ["keep", "recompute", "save_on_cpu", "ours-host", "ours-ssd", "ours-adaptive", "ours-adaptive-ssd"]
    with open(out_dir / "offload_results.jsonl", "w") as out:
        meta = {"mode": "meta", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "bandwidth": bandwidth, "direct_io": engine.direct_io, "gds": engine.gds,
                "file_paths": list(engine.file_paths), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        out.write(json.dumps(meta) + "\n")
        if "grads" not in skip:
            gradient_check(args, engine, bandwidth, results, out)
        # The parts: "main" the anchor's stack (or --quick's small one), "large" the 8192-wide one; each skips alone.
        if args.quick:
            configs = [("main", ("small", 1024, 4, 1024, 2))]
        else:
            configs = [("main", ("gpt-h4096", 4096, 8, 2048, 4)), ("large", ("gpt-h8192", 8192, 4, 2048, 4))]
        for part, config in configs:
            if part not in skip:
                run_config(*config, modes, args, engine, bandwidth, results, out)
        if "inflight" not in skip:  # ours-host's allowance of stores in flight on the anchor's stack
            name, hidden, layers_n, seq, batch = configs[0][1]
            allowances = (0.25, 0.5, 1) if args.quick else (1, 2, 4, 6)
            run_config(f"inflight-{name}", hidden, layers_n, seq, batch,
                       ["keep"] + [f"ours-host:inflight={g:g}" for g in allowances], args, engine, bandwidth, results, out)
        if "rok" not in skip:
            hidden, layers_n, seq = (1024, 4, 1024) if args.quick else (4096, 8, 2048)
            for batch in ((1, 2) if args.quick else (1, 2, 4, 8)):
                run_config(f"rok-b{batch}", hidden, layers_n, seq, batch,
                           ROK_BASELINES + ["ours-host", "ours-sync", "ours-adaptive", "ours-adaptive-lowmem"]
                           + [f"ours@{baseline}" for baseline in ROK_BASELINES],
                           args, engine, bandwidth, results, out)
            for line in frontier_lines([r for r in results if str(r.get("config", "")).startswith("rok")]):
                log(line)
    write_report(results, meta, out_dir / "offload_results.md", out_dir / "offload_rok.png")
    log(f"done in {time.perf_counter() - started:.0f} s: {out_dir / 'offload_results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
