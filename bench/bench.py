#!/usr/bin/env python3
"""The benchmark: hectorgen's generated layers against the strongest baselines, one process, on one GPU.

    bench/run.sh [--part K/N] [--datasets aifb,am] [--models rgcn,hgt] [--variants fp32,bf16] ...   (the command)
    python3 bench/bench.py --prepare --gen-dir DIR --hectorgen BIN --models ... --variants ...     (generate, build)
    python3 bench/bench.py --gen-dir DIR --out OUT [--part K/N] ...                                 (measure)
    python3 bench/bench.py --plan 4                                                                  (the parts)

Cases: datasets x models x {infer, train} x systems (systems.py: hectorgen variants, then hand-written
baselines, then PyG). The systems of one (dataset, model, mode) are timed together, interleaved (Runner.interleaved):
each is set up (not timed) and warmed up, then --rounds rounds each run a block of CUDA-event timed calls of every
system, in an order rotated per round; a system gets up to --max-iters calls, as many as fit in --case-budget
seconds, and its median over all rounds is reported with the quartiles and the spread of its round medians.
--sequential times the systems one after the other instead (each alone: warm-up, then its calls). Peak memory
(torch.cuda.max_memory_allocated, reset around each system's own setup and calls, less what the other systems
hold) includes the dataset's features and graph; OOM and errors become cells and the run goes on. Every case is one
JSON line in OUT/results-<part>.jsonl (after a "meta" line: GPU, driver, torch, measured bandwidth, seeds, timing),
printed as its (dataset, model, mode) finishes; the part ends with the short table of report.py.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

import datasets  # noqa: E402
import handwritten as hw  # noqa: E402
import report  # noqa: E402
import roofline  # noqa: E402
import systems  # noqa: E402

T0 = time.time()
# Rough seconds per dataset for every model, mode and default system on an H100 (graph generation included):
# the weights with which --part balances the datasets over the parts.
COST_S = {"aifb": 15, "mutag": 15, "bgs": 25, "fb15k": 40, "biokg": 60, "am": 150, "wikikg2": 200, "mag": 200}


def log(msg: str) -> None:
    print(f"[bench {time.time() - T0:6.1f}s] {msg}", flush=True)


def plan(names: list, parts: int) -> list:
    """Datasets over ``parts`` parts, longest first onto the least loaded part (deterministic)."""
    load = [0.0] * parts
    out = [[] for _ in range(parts)]
    for n in sorted(names, key=lambda n: (-COST_S.get(n, 100), n)):
        i = min(range(parts), key=lambda k: (load[k], k))
        load[i] += COST_S.get(n, 100)
        out[i].append(n)
    order = {n: i for i, n in enumerate(names)}
    return [sorted(p, key=order.get) for p in out]


# ---------------------------------------------------------------------------------------------------------------
# Preparation: generate and build the hectorgen variants


def prepare(a) -> int:
    gen_dir = Path(a.gen_dir)
    gen_dir.mkdir(parents=True, exist_ok=True)
    status = {}
    todo = []
    for v in [systems.VARIANTS[k] for k in a.variants]:
        for m in a.models:
            name = v.module(m)
            if name in status:   # a variant running another's module (module_of)
                continue
            try:
                status[name] = {"ok": True, "msg": systems.generate(m, v, gen_dir, a.hectorgen or None)}
                todo.append((m, v))
            except Exception as e:  # noqa: BLE001
                status[name] = {"ok": False, "msg": str(e)}
            log(f"[generate] {status[name]['msg'] if status[name]['ok'] else 'FAILED ' + status[name]['msg']}")
    jobs = max(2, (os.cpu_count() or 4) // max(1, len(todo)))

    def one(mv):
        m, v = mv
        t = time.time()
        try:
            systems.build(m, v, gen_dir, timeout=a.build_timeout, jobs=jobs)
            return v.module(m), True, f"built in {time.time() - t:.0f} s"
        except Exception as e:  # noqa: BLE001
            return v.module(m), False, str(e)
    with ThreadPoolExecutor(max_workers=max(1, len(todo))) as ex:
        for name, ok, msg in ex.map(one, todo):
            status[name] = {"ok": ok, "msg": msg if ok else f"build failed: {msg}"}
            log(f"[build] {name}: {'OK ' + msg if ok else 'FAILED ' + msg[-1500:]}")
    (gen_dir / "prepare.json").write_text(json.dumps(status, indent=1))
    return 0 if all(s["ok"] for s in status.values()) else 1


# ---------------------------------------------------------------------------------------------------------------
# Measurement


DEVICE = "cuda"   # --device cpu: a dry run of the whole harness (stand-in modules, wall-clock times, no memory)


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class _WallEvent:
    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, end) -> float:
        return (end.t - self.t) * 1e3


def event():
    return torch.cuda.Event(enable_timing=True) if DEVICE == "cuda" else _WallEvent()


def memory(kind: str) -> float:
    """MiB: "allocated" now, "peak" since the last reset ("reset" resets); 0 without CUDA."""
    if DEVICE != "cuda":
        return 0.0
    if kind == "reset":
        torch.cuda.reset_peak_memory_stats()
        return 0.0
    return (torch.cuda.memory_allocated() if kind == "allocated" else torch.cuda.max_memory_allocated()) / 2**20


def empty_cache(collect: bool = False):
    """Returns cached blocks to the device; ``collect``: first break reference cycles (after an exception, whose
    traceback holds the frames of the failed case)."""
    if collect:
        gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def measure_copy_bandwidth(gib: float = 1.0) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read plus bytes written), median of 10 copies."""
    n = int(gib * 2**30) // 4
    a = torch.randn(n, device=DEVICE)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ts = []
    for _ in range(10):
        e0, e1 = event(), event()
        e0.record()
        b.copy_(a)
        e1.record()
        sync()
        ts.append(e0.elapsed_time(e1))
    ms = sorted(ts)[len(ts) // 2]
    del a, b
    empty_cache()
    return 2 * n * 4 / (ms / 1e3)


def warm_up(fn, budget_s: float) -> tuple:
    """Two untimed calls (one if the first is slow): (seconds of the first call, seconds spent)."""
    t = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t
    if first < budget_s / 4:
        fn()
        sync()
    return first, time.perf_counter() - t


def iterations(first: float, spent: float, budget_s: float, min_iters: int, max_iters: int) -> int:
    """How many timed calls of a system whose first call took `first` seconds: as many as fit in ~60% of the budget
    after its warm-up, at least min_iters when they fit, at most max_iters."""
    n = int((0.6 * budget_s - spent) / max(first, 1e-5))
    return max(min(n, max_iters), min_iters if first * min_iters < budget_s else 1)


@contextlib.contextmanager
def gc_paused():
    """Python's garbage collector stays off while timing (as in timeit), for every system alike: a collection
    in the middle of a call of a few hundred microseconds showed up as a 13 ms outlier."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def timed_calls(fn, n: int, back_to_back: int = 1) -> list:
    """CUDA-event milliseconds of n calls, each from an idle device (synchronised after it). With back_to_back = k,
    each sample is k calls enqueued one after the other between the two events, divided by k: the host enqueues a
    call while the device runs the one before, as in a training loop that does not wait for each step, so a
    host-bound call costs max(host, device) instead of its host time plus the device's (--back-to-back)."""
    ts = []
    for _ in range(n):
        e0, e1 = event(), event()
        e0.record()
        for _ in range(back_to_back):
            fn()
        e1.record()
        sync()
        ts.append(e0.elapsed_time(e1) / back_to_back)
    return ts


def median(xs: list) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def time_fn(fn, budget_s: float, min_iters: int, max_iters: int, back_to_back: int = 1) -> dict:
    """Warm-up, then CUDA-event times of calls (timed_calls), as many samples as `iterations` allows: the median,
    min and max."""
    first, spent = warm_up(fn, budget_s)
    n = iterations(first * back_to_back, spent, budget_s, min_iters, max_iters)
    with gc_paused():
        ts = sorted(timed_calls(fn, n, back_to_back))
    return {"ms": median(ts), "ms_min": ts[0], "ms_max": ts[-1], "iters": n, "first_ms": first * 1e3}


def blocks(n: int, rounds: int) -> list:
    """n timed calls spread over `rounds` rounds as evenly as possible (the first rounds take the remainder; rounds
    beyond n get none)."""
    return [n // rounds + (1 if r < n % rounds else 0) for r in range(rounds)]


def sample_stats(rounds: list) -> dict:
    """A system's timing fields from its samples per round (lists of ms; empty for a round it sat out): the median,
    min, max and quartiles of all samples, and the spread between rounds (min and max of the round medians)."""
    ts = sorted(t for r in rounds for t in r)
    q = lambda f: ts[min(len(ts) - 1, int(f * len(ts)))]  # noqa: E731
    medians = [median(r) for r in rounds if r]
    return {"ms": median(ts), "ms_min": ts[0], "ms_max": ts[-1], "ms_q1": q(0.25), "ms_q3": q(0.75),
            "iters": len(ts), "rounds": len(medians), "round_ms_min": min(medians), "round_ms_max": max(medians)}


def _profiled(fn, train: bool, calls: int, activities: list, self_ms) -> list:
    """[name, ms per call, count per call] of what the torch profiler recorded over `calls` calls of fn (after one
    untimed call), by self_ms(event) (ms over all calls; 0 leaves the event out), largest first."""
    from torch.profiler import profile
    with torch.no_grad() if not train else contextlib.nullcontext():
        fn()
        sync()
        with profile(activities=activities) as prof:
            for _ in range(calls):
                fn()
            sync()
    rows = [[ev.key[:90], ms / calls, ev.count / calls] for ev in prof.key_averages() if (ms := self_ms(ev)) > 0]
    rows.sort(key=lambda r: -r[1])
    return rows


def _with_total(rows: list, label: str, top: int) -> list:
    """The rows' sum as a first row named `label`, then the `top` rows, rounded."""
    total = [label, sum(r[1] for r in rows), sum(r[2] for r in rows)]
    return [[n, round(ms, 4), round(c, 2)] for n, ms, c in [total] + rows[:top]]


def profile_top(fn, train: bool, calls: int = 3, top: int = 14) -> list:
    """The kernels that take the time of one call, by the torch profiler: [name, ms per call, launches per call]
    of all kernels together, then of the `top` kernels by CUDA time (--profile; the case's timing is taken before, without the profiler)."""
    from torch.profiler import ProfilerActivity
    if DEVICE == "cuda":
        rows = _profiled(fn, train, calls, [ProfilerActivity.CUDA], lambda ev: getattr(
            ev, "self_device_time_total", getattr(ev, "self_cuda_time_total", 0)) / 1e3)
    else:
        rows = _profiled(fn, train, calls, [ProfilerActivity.CPU], lambda ev: ev.self_cpu_time_total / 1e3)
    return _with_total(rows, "(all kernels: GPU busy time per call; the rest of the measured time is host-bound idling)",
                       top)


_PROFILER_OWN = ("Activity Buffer Request",)   # the profiler's own work, not the call's


def host_profile_top(fn, train: bool, calls: int = 5, top: int = 16) -> list:
    """Where the host's time of one call goes, by the torch profiler's CPU activity: [name, ms per call, calls per
    call] of all recorded ops together (their self CPU time), then of the `top` ops by self CPU time (--profile).
    The profiler adds its own overhead to every op: the shares matter, not the sum."""
    from torch.profiler import ProfilerActivity
    # With the CUDA activity the CUDA runtime's calls (cudaLaunchKernel, cudaMemcpyAsync, a synchronisation) are rows
    # of their own, out of the ops' self time.
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    rows = _profiled(fn, train, calls, activities,
                     lambda ev: 0 if ev.key in _PROFILER_OWN else ev.self_cpu_time_total / 1e3)
    return _with_total(rows, "(all ops: host time per call, with the profiler's overhead)", top)


def host_ms(fn, train: bool, calls: int = 21) -> float:
    """The host's time to enqueue one call (median over `calls`, each started on an idle device and not waited
    for): what a call costs the CPU. Where it exceeds the kernels' busy time (profile_top), the case is host-bound;
    the gap between the synchronised time and the busy time is mostly the enqueueing before the first kernel."""
    ts = []
    with torch.no_grad() if not train else contextlib.nullcontext():
        for _ in range(calls):
            sync()
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        sync()
    return median(ts)


def rel_err(got, ref) -> float:
    got, ref = got.double().reshape(ref.shape), ref.double()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


@contextlib.contextmanager
def precision(system):
    """TF32 allowed in cuBLAS and cuDNN while `system` runs if it asks for it (fp32 baselines); off otherwise and
    afterwards."""
    tf32 = bool(system is not None and system.tf32)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def grad_mode(train: bool):
    return contextlib.nullcontext() if train else torch.no_grad()


class _Entry:
    """A system of an interleaved case: its record, callable and layer, what it keeps allocated between calls
    (MiB), its own peak, its timed calls per round (plan) and their samples (ms per round it ran)."""

    def __init__(self, system, rec):
        self.system, self.rec = system, rec
        self.fn = self.layer = self.error = None
        self.resident = self.peak = 0.0
        self.plan, self.samples = [], []

    def release(self):
        self.fn = self.layer = None


class Runner:
    def __init__(self, a, out_path: Path):
        self.a = a
        self.out = open(out_path, "a")
        self.deadline = T0 + a.budget_s
        self.dead = None     # set when the CUDA context is lost

    def emit(self, rec: dict) -> None:
        self.out.write(json.dumps(rec) + "\n")
        self.out.flush()

    def loss_ms(self, ctx) -> dict:
        """The training step's loss alone (systems.loss_of, forward and backward) on a leaf of the layer output's
        shape, per output dtype: the part of every training step that is the same for every system."""
        out = {}
        dtypes = [("fp32", torch.float32), ("bf16", torch.bfloat16)]
        if any(systems.VARIANTS[k].dtype == "fp16" for k in self.a.variants):
            dtypes.append(("fp16", torch.float16))
        for name, dtype in dtypes:
            leaf = torch.randn(ctx.label.numel(), systems.DIM, device=ctx.x.device).to(dtype).requires_grad_()
            out[name] = round(time_fn(_loss_step(leaf, ctx.label), 2.0, self.a.min_iters, self.a.max_iters,
                                        self.a.back_to_back)["ms"], 4)
            del leaf
        return out

    def new_record(self, ctx, model, mode, system) -> dict:
        g = ctx.g
        rec = dict(type="case", dataset=g["name"], model=model, mode=mode, system=system.name, kind=system.kind,
                   klass=system.klass, dtype=system.dtype, status="skip", note="", ms=None, peak_mib=None)
        N, E, R, T = g["num_nodes"], g["src"].numel(), g["num_etypes"], g["num_ntypes"]
        rec["floor_ms"] = roofline.floor_ms(model, mode, N, E, R, T, system.dtype, self.bandwidth)
        return rec

    def skipped(self, rec, ctx, model, train, system, budget) -> bool:
        """Whether the case of `system` is not run (its record says why): a lost CUDA context, the part's time
        budget (`budget`: the seconds the case needs), or the system's own reason."""
        if self.dead:
            rec["note"] = f"skip: CUDA context lost ({self.dead})"
        elif time.time() + min(budget, 20) > self.deadline:
            rec["note"] = "skip: part time budget spent (run it in a part of its own: --datasets)"
        else:
            reason = system.skip_reason(ctx, model, train, self.a.case_budget)
            if not reason:
                return False
            rec["status"] = "ERR" if reason.startswith("ERR") else "skip"
            rec["note"] = reason
        return True

    def describe(self, rec, ctx, model, train, system) -> None:
        """The fields a system adds to its record once it is set up (an auto module's choice and estimates, the
        graph preparation time)."""
        rec["note"] = system.case_note(model)
        rec.update(system.case_info(ctx, model, train))
        if system.kind == "hectorgen":
            rec["prepare_graph_ms"] = system.prepare_ms(ctx, model)

    def extras(self, rec, ctx, model, train, system, fn, layer) -> None:
        """After timing: the error check of a generated layer's inference output, and the profile (--profile)."""
        if system.kind == "hectorgen" and not train and self.a.check:
            rec["err"], rec["err_ref"] = self.check(ctx, model, layer, fn)
        if self.a.profile:
            try:
                rec["profile"] = profile_top(fn, train)
            except Exception as e:  # noqa: BLE001  (the timing stands; the profile is extra)
                rec["profile"] = [[f"profile failed: {type(e).__name__}: {str(e)[:120]}", 0.0, 0]]
            rec["host_ms"] = round(host_ms(fn, train), 4)
            log(f"    {rec['host_ms']:9.3f} ms  host: enqueueing one call (median, device idle at its start)")
            for name, ms, count in rec["profile"]:
                log(f"    {ms:9.3f} ms  x{count:<5g} {name}")
            try:
                rec["host_profile"] = host_profile_top(fn, train)
            except Exception as e:  # noqa: BLE001
                rec["host_profile"] = [[f"host profile failed: {type(e).__name__}: {str(e)[:120]}", 0.0, 0]]
            for name, ms, count in rec["host_profile"]:
                log(f"    {ms:9.3f} ms  x{count:<5g} host: {name}")

    @staticmethod
    def failed(rec, e: BaseException) -> None:
        """An exception of a case becomes its cell: OOM, or ERR with the message."""
        if isinstance(e, torch.OutOfMemoryError):
            rec.update(status="OOM", note="OOM: " + str(e).splitlines()[0][:160])
        else:
            rec.update(status="ERR", note=f"ERR {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
            traceback.print_exc()

    def settle(self, what: str, collect: bool) -> None:
        """Waits for the device and returns cached memory; a failure here means the CUDA context is lost."""
        try:
            sync()
            empty_cache(collect=collect)
        except Exception as e:  # noqa: BLE001
            self.dead = f"after {what}: {type(e).__name__}"

    def case(self, ctx, ds_rec, model, mode, system) -> dict:
        """One system's case timed alone (--sequential, or a system that ran out of memory beside the others):
        setup, warm-up, then its timed calls one after the other."""
        rec = self.new_record(ctx, model, mode, system)
        train = mode == "train"
        budget = self.a.case_budget
        if self.skipped(rec, ctx, model, train, system, budget):
            return rec
        fn = None
        try:
            with precision(system):
                system.presetup(ctx, model, train)   # autotuning and graph preparation run with the case's TF32 setting
                sync()
                empty_cache()
                memory("reset")
                rec["base_mib"] = memory("allocated")
                t = time.perf_counter()
                fn = system.setup(ctx, model, train)
                sync()
                rec["setup_ms"] = (time.perf_counter() - t) * 1e3
                with grad_mode(train):
                    res = time_fn(fn, budget, self.a.min_iters, self.a.max_iters, self.a.back_to_back)
                rec.update(res, status="ok", peak_mib=memory("peak"), timing="sequential")
                self.describe(rec, ctx, model, train, system)
                self.extras(rec, ctx, model, train, system, fn, getattr(system, "last_layer", None))
        except Exception as e:  # noqa: BLE001
            self.failed(rec, e)
        finally:
            fn = None
            if hasattr(system, "last_layer"):
                system.last_layer = None
        self.settle(f"{ctx.g['name']}/{model}/{mode}/{system.name}", collect=rec["status"] != "ok")
        return rec

    def interleaved(self, ctx, model, mode, group: list) -> list:
        """The records of every system of one (dataset, model, mode) case, timed in rounds: each system is set up
        and warmed up, then each round runs a block of timed calls of every system, in an order rotated by one
        system per round, so that a drift of the machine (clocks, host load) spreads over all systems instead of
        favouring the last ones. A system gets the timed calls it would get alone (`iterations` with
        --case-budget: a case of k systems takes about k budgets), spread evenly over --rounds rounds; the median
        is over all its samples, with quartiles and the spread of its round medians. Peak memory is each system's
        own: the peak stats are reset around each of its blocks (and its setup), and what the other systems hold
        (their setup's residue) is subtracted. A system that runs out of memory beside the others is timed alone
        afterwards."""
        train = mode == "train"
        budget = self.a.case_budget
        where = f"{ctx.g['name']}/{model}/{mode}"
        recs = [self.new_record(ctx, model, mode, s) for s in group]
        entries, alone = [], []
        systems.drop_prepared_graphs(ctx)
        self.settle(where, collect=True)
        base = memory("allocated")
        for s, rec in zip(group, recs):
            if self.skipped(rec, ctx, model, train, s, budget * len(group)):
                continue
            e = _Entry(s, rec)
            try:
                with precision(s):
                    held = sum(x.resident for x in entries)
                    before = memory("allocated")
                    s.presetup(ctx, model, train)
                    sync()
                    memory("reset")
                    t = time.perf_counter()
                    e.fn = s.setup(ctx, model, train)
                    sync()
                    rec["setup_ms"] = (time.perf_counter() - t) * 1e3
                    e.layer = getattr(s, "last_layer", None)
                    self.describe(rec, ctx, model, train, s)
                    with grad_mode(train):
                        first, spent = warm_up(e.fn, budget)
                    e.peak = memory("peak") - held
                    e.resident = memory("allocated") - before
                e.plan = blocks(iterations(first * self.a.back_to_back, spent, budget, self.a.min_iters, self.a.max_iters),
                                self.a.rounds)
                rec.update(base_mib=base, first_ms=first * 1e3)
                entries.append(e)
            except torch.OutOfMemoryError:
                alone.append(s)
                e.release()
            except Exception as ex:  # noqa: BLE001
                self.failed(rec, ex)
                e.release()
            finally:
                if hasattr(s, "last_layer"):
                    s.last_layer = None
            if e not in entries:   # what the failed setup allocated goes before the next system's is measured
                empty_cache(collect=True)
        if entries:
            log(f"{where}: timed calls interleaved over up to {self.a.rounds} rounds: "
                f"{', '.join(f'{x.system.name} {sum(x.plan)}' for x in entries)}")
        with gc_paused():
            for e in entries:   # an untimed call of each: the first ones' warm-up ran before the others' setup
                self.run_block(e, entries, train, 0)
            for r in range(self.a.rounds):
                if time.time() > self.deadline:
                    log(f"{where}: part time budget spent after {r} rounds")
                    break
                k = r % len(entries) if entries else 0
                for e in entries[k:] + entries[:k]:
                    if e.plan[r] and e.fn:
                        e.samples.append(self.run_block(e, entries, train, e.plan[r]))
        for e in entries:
            rec = e.rec
            if e.error is not None and isinstance(e.error, torch.OutOfMemoryError):
                alone.append(e.system)
            elif e.error is not None:
                self.failed(rec, e.error)
            elif e.samples:
                rec.update(sample_stats(e.samples), status="ok", peak_mib=e.peak, timing="interleaved")
                try:
                    with precision(e.system):
                        self.extras(rec, ctx, model, train, e.system, e.fn, e.layer)
                except Exception as ex:  # noqa: BLE001
                    self.failed(rec, ex)
            else:
                rec["note"] = "skip: part time budget spent (run it in a part of its own: --datasets)"
            e.release()
        entries = None
        self.settle(where, collect=True)
        for s in alone:
            i = group.index(s)
            recs[i] = self.case(ctx, None, model, mode, s)
            recs[i]["note"] = ("timed alone: out of memory beside the other systems of the case; " +
                               recs[i]["note"]).rstrip("; ")
        return recs

    def run_block(self, e, entries, train, n: int) -> list:
        """n timed calls of one system (n = 0: one untimed call), its own peak memory updated; an exception stops
        the system (e.error) and frees what it holds."""
        if e.fn is None:
            return []
        try:
            with precision(e.system), grad_mode(train):
                held = sum(x.resident for x in entries if x is not e and x.fn is not None)
                memory("reset")
                if n:
                    ts = timed_calls(e.fn, n, self.a.back_to_back)
                else:
                    e.fn()
                    sync()
                    ts = []
                e.peak = max(e.peak, memory("peak") - held)
            return ts
        except Exception as ex:  # noqa: BLE001
            e.error = ex
            e.release()
            empty_cache(collect=True)
            return []

    def check(self, ctx, model, layer, fn):
        """Relative error of the generated layer's inference output against the hand-written fp32 layer with the
        same weights (TF32 off): a guard that every timed variant computes the spec's function."""
        try:
            with torch.no_grad(), precision(None):
                out = fn().float()
                ref = hw.HandLayer(model, ctx.dg, torch.float32, layout=ctx.dg.choose(torch.float32))
                ref.load(dict(layer.named_parameters()))
                expect = ref(ctx.x)
                return rel_err(out, expect), "hand_fp32"
        except torch.OutOfMemoryError:
            return None, "check skipped: OOM"
        except Exception as e:  # noqa: BLE001
            return None, f"check failed: {type(e).__name__}: {str(e)[:120]}"

    def dataset(self, name: str, models: list, hg_systems: list, base_systems: list) -> None:
        a = self.a
        if self.dead or time.time() + 20 > self.deadline:
            for m in models:
                for mode in a.modes:
                    for s in hg_systems + base_systems:
                        if s.supports(m):
                            self.emit(dict(type="case", dataset=name, model=m, mode=mode, system=s.name,
                                           kind=s.kind, klass=s.klass, dtype=s.dtype, status="skip", ms=None,
                                           note="skip: part time budget spent (run it in a part of its own)"))
            log(f"== {name}: skipped (time budget)")
            return
        t = time.perf_counter()
        g = datasets.load(name, a.seed, a.skew, a.type_skew, scale=a.scale)
        gen_s = time.perf_counter() - t
        N, E = g["num_nodes"], g["src"].numel()
        drec = dict(type="dataset", dataset=g["name"], N=N, E=E, R=g["num_etypes"], T=g["num_ntypes"],
                    seed=g.get("seed"), skew=g.get("skew"), type_skew=g.get("type_skew"),
                    source=g.get("source"), load_s=gen_s, fingerprint=datasets.fingerprint(g),
                    pairs=datasets.unique_src_etype_pairs(g))
        log(f"== {g['name']}: N={N} E={E} R={g['num_etypes']} T={g['num_ntypes']} (loaded in {gen_s:.1f} s, "
            f"graph {drec['fingerprint']})")
        gen = torch.Generator().manual_seed(a.seed)
        dg = hw.DeviceGraph(g, DEVICE)
        ctx = systems.Context(g=g, dg=dg, x=torch.randn(N, systems.DIM, generator=gen).to(DEVICE),
                              label=torch.randint(0, systems.DIM, (N,), generator=gen).to(DEVICE))
        if "train" in a.modes:
            drec["loss_ms"] = self.loss_ms(ctx)
            log(f"== {g['name']}: the loss alone (forward + backward from an [N, 64] leaf): " +
                ", ".join(f"{k} {v:.3f} ms" for k, v in drec["loss_ms"].items()))
        self.emit(drec)
        for model in models:
            for mode in a.modes:
                group = [s for s in hg_systems + base_systems if s.supports(model)]
                if a.sequential:
                    recs = [self.case(ctx, drec, model, mode, s) for s in group]
                else:
                    recs = self.interleaved(ctx, model, mode, group)
                for s, rec in zip(group, recs):
                    rec.update(N=N, E=E, R=g["num_etypes"], T=g["num_ntypes"])
                    self.emit(rec)
                    val = f"{rec['ms']:10.3f} ms" if rec["status"] == "ok" else f"{rec['status']:>10s}   "
                    if rec.get("rounds"):
                        val += f" (rounds {rec['round_ms_min']:.3f}..{rec['round_ms_max']:.3f})"
                    peak = f"peak {rec['peak_mib']:9.1f} MiB" if rec.get("peak_mib") else " " * 19
                    extra = f" err {rec['err']:.1e}" if rec.get("err") is not None else ""
                    log(f"{g['name']:8s} {model:4s} {mode:5s} {s.name:22s} {val} {peak}{extra} {rec['note']}")
            ctx.cache.clear()
        del ctx, dg, g
        empty_cache(collect=True)


def _loss_step(out, label):
    def step():
        out.grad = None
        systems.loss_of(out, label).backward()
    return step


def meta_record(a, bandwidth: float) -> dict:
    if DEVICE == "cuda":
        p = torch.cuda.get_device_properties(0)
        gpu, sms, mem = p.name, p.multi_processor_count, p.total_memory / 2**30
    else:
        gpu, sms, mem = f"CPU dry run ({platform.processor() or platform.machine()})", 0, 0.0
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001
        drv = "?"
    try:
        import torch_geometric
        pyg = torch_geometric.__version__
    except Exception as e:  # noqa: BLE001
        pyg = f"not importable ({type(e).__name__})"
    # The generator's commit, recorded by `tools/gpu_check.sh --bundle` (the GPU machine's copy of the
    # repository may carry stale git metadata); else the repository's.
    bundle_commit = HERE.parent / "build" / "hg_bundle" / "COMMIT"
    try:
        commit = bundle_commit.read_text().strip() if bundle_commit.exists() else subprocess.run(
            ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
            timeout=20).stdout.strip() or "?"
    except Exception:  # noqa: BLE001
        commit = "?"
    return dict(type="meta", part=a.part, gpu=gpu, sms=sms, gpu_mem_gib=mem, driver=drv, torch=torch.__version__,
                cuda=torch.version.cuda,
                pyg=pyg, python=platform.python_version(), date=_dt.datetime.now(_dt.timezone.utc).isoformat(
                    timespec="seconds"), commit=commit, seed=a.seed, skew=a.skew, type_skew=a.type_skew,
                bandwidth_gbs=round(bandwidth / 1e9, 1), case_budget_s=a.case_budget, max_iters=a.max_iters,
                timing="sequential" if a.sequential else "interleaved", rounds=None if a.sequential else a.rounds,
                back_to_back=a.back_to_back,
                datasets=a.datasets, models=a.models, variants=a.variants, baselines=a.baselines, modes=a.modes)


def load_variants(a) -> list:
    """A HectorgenSystem per selected variant; a module that failed to generate, build or import becomes an ERR
    cell of its cases (with the reason), never a crash."""
    gen_dir = Path(a.gen_dir)
    prep = json.loads((gen_dir / "prepare.json").read_text()) if (gen_dir / "prepare.json").is_file() else {}
    out = []
    for key in a.variants:
        v = systems.VARIANTS[key]
        mods = {}
        for m in a.models:
            name = v.module(m)
            if DEVICE != "cuda":
                standin = systems.StandInModule(m)
                mods[m] = (standin, standin.Layer)
                continue
            if name in prep and not prep[name]["ok"]:
                mods[m] = RuntimeError(prep[name]["msg"].splitlines()[0][:300])
                continue
            try:
                mods[m] = systems.load(m, v, gen_dir)
            except Exception as e:  # noqa: BLE001
                mods[m] = RuntimeError(f"import of {name} failed: {type(e).__name__}: {str(e)[:200]}")
            log(f"[variant] {v.label} {m}: {mods[m] if isinstance(mods[m], BaseException) else 'loaded'}")
        out.append(systems.HectorgenSystem(mods, v))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    lst = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--datasets", type=lst, default=list(datasets.STATS),
                   help="names (synthetic) or name=path (real files, datasets.load); default all 8")
    p.add_argument("--models", type=lst, default=list(systems.MODELS))
    p.add_argument("--modes", type=lst, default=["infer", "train"])
    p.add_argument("--variants", type=lst, default=["fp32"], help=f"hectorgen variants: {', '.join(systems.VARIANTS)}")
    p.add_argument("--baselines", type=lst, default=list(systems.DEFAULT_BASELINES))
    p.add_argument("--part", default="1/1", help="K/N: the K-th of N parts of the datasets (--plan N shows them)")
    p.add_argument("--plan", type=int, default=0, help="print the datasets of each of N parts and exit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skew", type=float, default=1.5,
                   help="Pareto shape of the source offsets (larger: sources on fewer nodes)")
    p.add_argument("--type-skew", type=float, default=1.1, help="Zipf exponent of node-type and relation sizes")
    p.add_argument("--case-budget", type=float, default=20.0,
                   help="seconds per case (soft): warm-up plus timed calls in ~60%% of it")
    p.add_argument("--budget-s", type=float, default=540.0, help="no case starts after this many seconds")
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--max-iters", type=int, default=20, help="timed calls per system and case, at most")
    p.add_argument("--rounds", type=int, default=10,
                   help="the systems of a case are timed interleaved, in this many rounds (Runner.interleaved)")
    p.add_argument("--back-to-back", type=int, default=1, metavar="K",
                   help="each timed sample is K calls enqueued back to back between two CUDA events, divided by K "
                        "(default 1: single calls, each from an idle device); K > 1 measures what a loop that does "
                        "not wait for each call gets on host-bound cases (the host's work overlaps the device's)")
    p.add_argument("--sequential", action="store_true",
                   help="time the systems of a case one after the other instead (the timing before 2026-11-27)")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the error check of the variants")
    p.add_argument("--profile", action="store_true",
                   help="after timing a case, list the kernels that take its time (torch profiler; JSON key profile) "
                        "and the host's time to enqueue one call (JSON keys host_ms, host_profile: the ops by self CPU time)")
    p.add_argument("--gen-dir", default=str(HERE.parent / "build" / "bench" / "gen"))
    p.add_argument("--hectorgen", default="")
    p.add_argument("--build-timeout", type=float, default=400.0)
    p.add_argument("--prepare", action="store_true", help="generate and build the variants, then exit")
    p.add_argument("--out", default=os.environ.get("OUT", str(HERE.parent / "out" / "bench")))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: a dry run of the harness (stand-in modules; tests/bench/test_bench.py)")
    p.add_argument("--scale", type=float, default=1.0, help="shrink the synthetic graphs (dry runs)")
    a = p.parse_args(argv)
    if a.back_to_back < 1:
        p.error(f"--back-to-back must be at least 1, got {a.back_to_back}")
    for k in a.variants:
        if k not in systems.VARIANTS:
            p.error(f"unknown variant {k!r} (known: {', '.join(systems.VARIANTS)})")
    for m in a.models:
        if m not in systems.MODELS:
            p.error(f"unknown model {m!r} (known: {', '.join(systems.MODELS)})")
    for m in a.modes:
        if m not in ("infer", "train"):
            p.error(f"unknown mode {m!r} (infer, train)")
    try:
        k, n = (int(x) for x in a.part.split("/"))
        assert 1 <= k <= n
    except Exception:  # noqa: BLE001
        p.error(f"--part must be K/N with 1 <= K <= N, got {a.part!r}")
    a.part_k, a.part_n = k, n
    if a.rounds < 1:
        p.error(f"--rounds must be at least 1, got {a.rounds}")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.plan:
        for i, ds in enumerate(plan(a.datasets, a.plan), 1):
            print(f"part {i}/{a.plan}: {','.join(ds)} (~{sum(COST_S.get(d, 100) for d in ds)} s + setup)")
        return 0
    if a.prepare:
        return prepare(a)
    global DEVICE
    DEVICE = a.device
    gc.freeze()   # the imported modules' objects: later collections scan only what the cases create
    if DEVICE == "cpu":
        torch.set_num_threads(1)   # a dry run's tiny tensors: more threads only contend (and crawl on a busy machine)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("bench: no CUDA device (the benchmark needs one; --device cpu is a dry run of the harness)",
              file=sys.stderr)
        return 2
    names = plan(a.datasets, a.part_n)[a.part_k - 1]
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / f"results-{a.part_k}of{a.part_n}.jsonl"
    out_path.unlink(missing_ok=True)
    baseline_systems = systems.baselines(a.baselines)
    hg = load_variants(a)
    bw = measure_copy_bandwidth(1.0 if DEVICE == "cuda" else 0.01)
    r = Runner(a, out_path)
    r.bandwidth = bw
    meta = meta_record(a, bw)
    meta["part_datasets"] = names
    r.emit(meta)
    log(f"{meta['gpu']}, driver {meta['driver']}, torch {meta['torch']}, PyG {meta['pyg']}; copy bandwidth "
        f"{bw / 1e9:.0f} GB/s; part {a.part}: {','.join(names)}; results: {out_path}")
    for name in names:
        r.dataset(name, a.models, hg, baseline_systems)
    r.out.close()
    log(f"done: {out_path}")
    recs = report.read([out_path])
    print(report.text_table(recs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
